#!/usr/bin/python3
r"""Independent PyTorch reference for Hugging Face Qwen3-Next (Qwen3NextForCausalLM, model_type
"qwen3_next") and Qwen3.5-MoE (Qwen3_5MoeForConditionalGeneration, "qwen3_5_moe", and
Qwen3_5MoeForCausalLM, "qwen3_5_moe_text"; see "Qwen3.5-MoE" below).

Written from the equations of HF `models/qwen3_next/modeling_qwen3_next.py` and
`configuration_qwen3_next.py` (Qwen3.5: `models/qwen3_5_moe/modular_qwen3_5_moe.py`,
`configuration_qwen3_5_moe.py`, `models/qwen3_5/modular_qwen3_5.py`'s Qwen3_5GatedDeltaNet) (not
from the C code it checks), using only torch + numpy + stdlib
(safetensors read and written by hand). Subcommands, options, files and records are qwen3_ref.py's,
whose generic parts it imports (RMSNorm, RoPE, LoRA, the forward / grad / adamw-steps /
make-adapter / merge commands, the finite-difference check): compare.py and compare_grads.py work
unchanged.

  make-model --out DIR --seed N --dtype f32|bf16 [--shards K] [--std S] [--mtp]
             [--arch qwen3_next|qwen3_5_moe|qwen3_5_moe_text] [--set key=value ...]
      DIR/config.json (BASE_CONFIG + --set; a VALUE is JSON, else a string; `--set KEY=` with
      nothing after "=" leaves KEY out: HF's default) and random weights under HF's tensor names,
      exactly the tensors the config implies, the routed experts per expert
      (model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight, as the released checkpoints):
      the zero-centred norms' weights (input_layernorm, post_attention_layernorm, q_norm, k_norm,
      model.norm) N(0, 0.1); the gated norm's (linear_attn.norm) 1 + N(0, 0.1); A_log
      log(U(1, 8)); dt_bias N(-3, 1) (at S 0.1 the value heads' median decay exp(g) spreads over
      about 0.5..0.94: short and long memory; N(0, 0.5) would make it ~0.07, the state forgotten
      within a token or two); conv1d N(0, 0.4); routers (mlp.gate) N(0, 0.2); every other tensor
      (embedding, projections, experts, shared expert and its gate, lm_head, biases) N(0, S).
      f32: all F32; bf16: all BF16. --mtp: also five multi-token-prediction tensors
      (mtp.fc.weight [H, 2H], mtp.pre_fc_norm_embedding / pre_fc_norm_hidden / norm /
      layers.0.input_layernorm .weight [H]; drawn after the rest, so the model's tensors are the
      same as without --mtp), which every reader ignores. Prints the range of the decay g, of
      exp(g) and of beta over the linear layers on a 64-token probe.
      --arch qwen3_5_moe / qwen3_5_moe_text: Q35_TEXT_BASE (BASE_CONFIG's sizes, every layer MoE,
      rope_parameters {rope_type default, rope_theta 1e4, partial_rotary_factor 0.25,
      mrope_section [11, 11, 10], mrope_interleaved true}) + --set, as the whole config.json
      (qwen3_5_moe_text, architectures Qwen3_5MoeForCausalLM) or as its text_config (model_type
      qwen3_5_moe_text) beside architectures [Qwen3_5MoeForConditionalGeneration], model_type
      qwen3_5_moe, a small vision_config, the vision token ids, torch_dtype and
      tie_word_embeddings (text_config's value; `--set top.KEY=VALUE` sets, `top.KEY=` removes, a
      top-level key). Tensors as drawn above under the Qwen3.5 names (below), the routed experts
      stacked (gate_up_proj and down_proj N(0, S)); qwen3_5_moe also one vision tower tensor,
      model.visual.patch_embed.proj.weight [16, 3, 2, 2, 2] N(0, S), drawn apart, which every
      reader skips.

  replay-config --model DIR --out DIR2
      DIR2/config.json: a qwen3_next config with DIR's routing shape (vocab, layers, MoE layers,
      experts, top-k), for gen_train_inputs.py --replay-model, which knows no Qwen3.5 type.

  forward --model DIR --input IN.jsonl --output OUT.jsonl [--replay] [--adapter ADIR [--no-lora]]
      Per line {"tokens": [...]}: {"tokens", "logprobs" (entry 0 null), "experts",
      "router_probs"}, as qwen3_ref: experts[t][m]: MoE layer m's (MoE-layer ordinal, dense
      layers not counted) k ids by router probability descending, lower id first on exact ties
      (replayed ids as given); router_probs[t][m]: the router's own sorted top-(k+1)
      probabilities, replay or not.

  grad --model DIR --input IN.jsonl --output GRADS.safetensors [--replay] [--loss-out LOSS.json]
       [--adapter ADIR [--no-lora]] [--base-grads FILE]
      As qwen3_ref: lines {"tokens", "coef": [null, c_1, ...]}; loss = sum over lines and t >= 1 of
      c_t * log p(token t | tokens < t), float64 autograd through the forward's function; d loss /
      d W for every parameter under HF's names (A_log, dt_bias, conv1d, every norm, the routers,
      the shared expert and its gate included), F32; experts no token was routed to: zeros; tied:
      the embedding gets the summed gradient, no lm_head.weight. With --adapter the base is frozen
      and GRADS holds the lora_A / lora_B gradients (PEFT names); --base-grads FILE also writes the
      base's. LOSS.json: {"loss", "logprobs"}.

  adamw-steps --model DIR --input IN.jsonl --steps N --lr LR --weight-decay WD --betas B1,B2
              --eps EPS [--clip MAXNORM] --output PARAMS.safetensors [--replay] [--adapter ADIR]
      As qwen3_ref: N torch.optim.AdamW steps (float64) on the grad loss, over the tensors grad
      writes, under its names.

  make-adapter --model DIR --out ADIR --rank R --alpha A [--rslora] --targets T,... --seed N
               [--b-std S]
      A PEFT LoRA adapter (qwen3_ref's: adapter_config.json + adapter_model.safetensors, F32; A
      U(-1/sqrt(in), 1/sqrt(in)), B ~ N(0, S), default 0.05). Targets (PEFT's suffix matching on
      the nn.Linear modules): q_proj [2*nh*hd, H] (query and gate together), k_proj, v_proj,
      o_proj (full-attention layers); in_proj_qkvz, in_proj_ba, out_proj (linear layers);
      gate_proj, up_proj, down_proj (the dense MLP's, every routed expert's
      mlp.experts.E.*_proj and the shared expert's mlp.shared_expert.*_proj); shared_expert_gate
      [1, H]; lm_head. The router mlp.gate (Qwen3NextTopKRouter, no nn.Linear) and conv1d are
      never targets. Biases are not adapted.
      Qwen3.5 only: --peft-params: gate_proj / up_proj (either or both) mean the stacked parameter
      mlp.experts.gate_up_proj and down_proj mlp.experts.down_proj (every layer's routed experts;
      the shared expert's projections then not adapted), written as PEFT writes them
      (adapter_config.json "target_parameters", a lora.ParamWrapper each: lora_A [r*E, in] (A
      U(-1/sqrt(in), 1/sqrt(in))), lora_B [out, r*E], in / out as below; one A shared by gate and
      up); "target_modules" holds the other targets (or []). --rank-pattern KEY=R /
      --alpha-pattern KEY=A (repeatable): adapter_config.json's rank_pattern / alpha_pattern, the
      tensors drawn at the ranks they give.
    Reading a Qwen3.5 adapter (forward, grad, adamw-steps, merge): the modules target_modules
    selects and the ParamWrappers target_parameters implies, r and lora_alpha per module /
    parameter by rank_pattern / alpha_pattern (PEFT's get_pattern_key: the first key K with
    re.match(rf"(.*\.)?({K})$", name)); strictly the tensors that implies. A ParamWrapper on
    <P>layers.L.mlp.experts.{gate_up_proj [E, 2I, H], down_proj [E, H, I]} ([E, out, in], used as
    linear(x, W[e]), not is_transposed: PEFT swaps in and out, in = H / I, out = 2I / H) adds
    scale * einsum("o r e, e r i -> e o i", B.reshape(out, r, E), A.reshape(E, r, in)): for
    expert e, A_e = A.reshape(E, r, in)[e], B_e = B.reshape(out, r, E)[:, :, e]; gate_proj gets
    scale * B_e[:I] @ A_e, up_proj scale * B_e[I:] @ A_e, down_proj scale * B_e @ A_e. Names:
    with both targeted in a layer, gate_up_proj's base_model.model.<P>layers.L.mlp.experts.
    base_layer.lora_{A,B}.weight (inner: Qwen3NextExperts registers gate_up_proj first) and
    down_proj's ...mlp.experts.lora_{A,B}.weight (outer); with one, ...mlp.experts.lora_{A,B}.weight.
    A routed expert's per-expert module whose stacked parameter a wrapper adapts is no
    target_modules match (HF's model has no such module; the shared expert's gate/up/down_proj
    still match). grad / adamw-steps with such an adapter: its own tensors under its own names.
    qwen3_next: qwen3_ref's reader (no patterns; target_parameters refused).

  merge --model DIR --adapter ADIR --out MDIR
      As qwen3_ref: W += scale * B @ A (scale alpha/r, or alpha/sqrt(r) with use_rslora) for every
      adapted module (Qwen3.5: a ParamWrapper's delta likewise), float64, written as a full F32
      model (config.json + model.safetensors, no mtp tensors); a tied model with an lm_head adapter
      is written untied.

  selfcheck-grad [--seed N]
      Autograd vs central finite differences (h = 1e-6, rel err < 1e-6) on tiny float64 models
      (2 layers, 9 tokens, vocab 13, hidden 16; 2 heads / 1 KV head of 8 with RoPE on 4 dims;
      linear layers of 2 key heads of 4 and 4 value heads of 3 (r = 2), conv kernel 4; 12 experts
      of width 6 top-2, shared expert of width 5): every kind of tensor (embedding; in_proj_qkvz,
      in_proj_ba, conv1d, A_log, dt_bias, the gated norm, out_proj; q/k/v/o_proj and their biases,
      q_norm, k_norm; both layernorms; the router, a routed expert's gate / up / down, the shared
      expert's and its gate, the dense MLP's; final norm; lm_head), over linear-then-full and
      full-then-linear layer orders, with and without replay, a dense (mlp_only_layers) layer,
      tied embeddings, attention_bias, norm_topk_prob false, nv == nk; LoRA (r 3 on every target,
      base frozen) with alpha/r and rslora (B = 0 is the base exactly, the float64 merge is the
      adapter's function to 1e-12). Unrouted experts' gradients must be exactly zero (and some
      expert must go unrouted). Also: HF's chunked form of the gated delta rule
      (torch_chunk_gated_delta_rule's equations, float64, chunks of 64 and of 4) equals the
      recurrence to 1e-12 on random inputs of 150 and 3 steps, and a whole 300-token forward of
      the base model with the chunked form equals the recurrent one to 1e-12; the explicit
      causal conv1d equals F.conv1d with HF's padding; the reader refuses an extra, a missing and a
      misshapen tensor and ignores mtp.* ones.

Model (float64; bf16 weights widened exactly). x = embed_tokens[tokens]; per layer l
  h = input_layernorm(x); x += mixer(h); h = post_attention_layernorm(x); x += mlp(h);
  then logits = lm_head(norm(x)) (tie_word_embeddings: lm_head = embed_tokens).
  Qwen3NextRMSNorm (every decoder norm, q_norm and k_norm too) is zero-centred:
  x / sqrt(mean(x^2) + rms_norm_eps) * (1 + w).
Layer types: config "layer_types" ("linear_attention" / "full_attention"; HF's legacy names
  "mamba" / "attention" read as those), else layer l is full iff (l + 1) % full_attention_interval
  == 0 (default 4).
Full attention (Qwen3NextAttention): q_proj [nh*2*hd, H] viewed [T, nh, 2*hd]: per head the first
  hd = query, the last hd = gate (gate flattened [T, nh*hd], head-major); q_norm / k_norm per head
  over hd; RoPE rotate-half on the first int(hd * partial_rotary_factor) dims of each head
  (inv_freq = 1 / rope_theta^(2i/rd); or YaRN's, qwen3_ref's yarn_inv_freq over those rd
  dims, cos and sin times its attention factor); causal softmax(q k^T / sqrt(hd)) v with
  GQA (query head h reads KV head h // (nh / nkv)); out * sigmoid(gate); o_proj. attention_bias:
  biases on q/k/v/o_proj. head_dim: the config's, 256 when absent (HF's default), hidden_size //
  num_attention_heads when null. partial_rotary_factor: the config's, else rope_parameters', else
  0.25. rope_theta: the config's, else rope_parameters', else 10000.
Gated DeltaNet (Qwen3NextGatedDeltaNet): nk, nv, dk, dv = linear_num_key_heads,
  linear_num_value_heads, linear_key_head_dim, linear_value_head_dim; r = nv / nk.
  in_proj_qkvz(h) viewed [T, nk, 2*dk + 2*r*dv]: per key head [q (dk), k (dk), v (r*dv), z (r*dv)];
  in_proj_ba(h) viewed [T, nk, 2r]: [b (r), a (r)]; v, z, b, a then flattened to value heads in
  (key head, j) order. mixed = cat(q [nk*dk], k [nk*dk], v [nv*dv]); depthwise causal conv over
  time, conv1d.weight [C, 1, K] (K = linear_conv_kernel_dim), no bias, zero left padding:
  out[t, c] = sum_j w[c, 0, j] * mixed[t - K + 1 + j, c]; SiLU; split back into q, k [T, nk, dk],
  v [T, nv, dv]. q, k l2-normalised over dk (x * rsqrt(sum x^2 + 1e-6)); q *= dk^-0.5; q, k
  repeat_interleave r over heads (value head j reads key head j // r). beta = sigmoid(b); g =
  -exp(A_log) * softplus(a + dt_bias). Per value head, S [dk, dv] from 0, for t = 0..T-1:
  S = exp(g_t) S; delta = beta_t (v_t - S^T k_t); S = S + k_t delta^T; o_t = S^T q_t
  (the recurrent form; HF's chunked form computes the same function). Qwen3NextRMSNormGated per
  value head (not zero-centred): o / sqrt(mean(o^2) + rms_norm_eps) * w * silu(z); flattened
  [T, nv*dv]; out_proj.
MLP: layer l is MoE iff l not in mlp_only_layers and num_experts > 0 and (l + 1) %
  decoder_sparse_step == 0, else dense SwiGLU mlp.{gate,up,down}_proj (intermediate_size).
  MoE (Qwen3NextSparseMoeBlock): router probs = softmax(h mlp.gate.weight^T) over E; the top-k
  (num_experts_per_tok) probabilities, renormalised to sum 1 iff norm_topk_prob (default true);
  out = sum_k w_k expert_k(h) + sigmoid(h shared_expert_gate.weight^T) * shared_expert(h); experts
  and the shared expert (shared_expert_intermediate_size) SwiGLU down(silu(gate(h)) * up(h)).
Router replay (--replay): qwen3_ref's: a line's "experts": [[[k ids] per MoE layer] per token]
  replaces the top-k ids; the weights are the router's softmax probabilities at those ids
  (renormalised iff norm_topk_prob), so the router keeps its gradient. A row of negative ids is
  not replayed. Lines without "experts" route themselves.
Checkpoints: exactly the tensors the config implies (names and shapes), any of F32 / BF16 / F16 /
  F64; tensors named mtp.* are ignored (HF's _keys_to_ignore_on_load_unexpected); a tied model may
  carry an unused lm_head.weight. Refused: rope types other than default and yarn,
  hidden_act other than silu, nv not a multiple of nk, an odd or zero rotary dim.

Qwen3.5-MoE (the same model function but for what follows).
  Config: qwen3_5_moe: the language model's fields in text_config (its model_type
  qwen3_5_moe_text), read as one flat config (flat()); tie_word_embeddings the top level's where
  it is set, else text_config's; vision_config and the token ids not read. qwen3_5_moe_text: flat.
  Qwen3_5MoeTextConfig's defaults (Q35_DEFAULTS; head_dim 256, partial_rotary_factor 0.25,
  full_attention_interval 4 as Qwen3-Next's). norm_topk_prob, mlp_only_layers,
  decoder_sparse_step, intermediate_size are no Qwen3.5 fields: ignored if present.
  RoPE: rope_parameters' rope_type default or yarn; mrope_section / mrope_interleaved accepted and
  ignored: with text-only input the three M-RoPE position streams are equal and interleaved
  M-RoPE is plain RoPE (rope_theta's note; selfcheck_mrope).
  Names: <P> = "model.language_model." (qwen3_5_moe) or "model." (qwen3_5_moe_text): <P>embed_tokens,
  <P>layers.L..., <P>norm; lm_head.weight top-level. model.visual.* (the vision tower) and mtp.*
  tensors are skipped (text-only inputs never reach the tower).
  Gated DeltaNet (Qwen3_5GatedDeltaNet): in_proj_qkv [2*nk*dk + nv*dv, H] whose output already is
  mixed = q | k | v (the conv's channel order, key / value heads head-major, no per-key-head
  interleave), in_proj_z [nv*dv, H] (z per value head), in_proj_b [nv, H], in_proj_a [nv, H]; the
  rest as Qwen3-Next's.
  MLP: every layer Qwen3_5MoeSparseMoeBlock; the router (Qwen3VLMoeTextTopKRouter) softmax, top-k,
  always renormalised; shared expert and its sigmoid gate as Qwen3-Next's. Routed experts in the
  checkpoint stacked: <P>layers.L.mlp.experts.gate_up_proj [E, 2I, H] (per expert nn.Linear
  orientation: gate = rows [0, I), up = rows [I, 2I): HF's linear(x, gate_up_proj[e]).chunk(2)),
  .down_proj [E, H, I]; inside, in grad's output, adamw-steps' and adapters they are per expert,
  as trill names them: <P>layers.L.mlp.experts.E.gate_proj.weight [I, H], .up_proj.weight [I, H],
  .down_proj.weight [H, I] (a checkpoint in that layout is refused); merge writes them stacked.
  LoRA targets: q_proj, k_proj, v_proj, o_proj, in_proj_qkv, in_proj_z, in_proj_b, in_proj_a,
  out_proj, gate_proj, up_proj, down_proj (every routed expert per expert, the shared expert's),
  shared_expert_gate, lm_head; PEFT names base_model.model.<module>.lora_{A,B}.weight.
  merge: config.json as read (torch_dtype float32; untied: tie_word_embeddings false at the top
  level if set there and in text_config), no mtp.* / model.visual.* tensors.
  selfcheck-grad also: finite differences on qwen3_5_moe_text models (in_proj_qkv/z/b/a, every
  kind of tensor above, a routed expert's per-expert gate / up / down, LoRA on every Qwen3.5
  target; replay, tied, attention_bias, r 1 / 2 / 4 with dk != dv); the stacked experts through
  HF's own chunk(2) computation = the per-expert layout (log-probs, gradients rearranged); a
  qwen3_5_moe_text model whose in_proj_qkv/z/b/a are a Qwen3-Next model's in_proj_qkvz/ba rows
  permuted computes its log-probs (1e-12), routing and (permuted) gradients; qwen3_5_moe = the
  flat model (forward, gradients, LoRA, merge, tie resolution); the reader; M-RoPE; a
  target_parameters adapter (selfcheck_q35_peft_params: both stacked parameters, r 2 and a
  rank_pattern / alpha_pattern, q_proj / o_proj / in_proj_z / lm_head modules) through its files:
  names and scales as read, extra, missing, swapped and misnamed tensors refused (and on a
  qwen3_next model), gate/up/down_proj also in target_modules read as the shared expert's modules
  only, finite differences on its tensors, the unrouted experts' A / B slices exactly
  zero, and its function = the per-expert module adapter built from it = base + PEFT's einsum
  delta = the merge = trill's saved form (gate_up_proj block-diagonal rank 2r) (1e-12), and under
  qwen3_5_moe's names on the composite model the same log-probs and gradients.
"""

import collections
import copy
import json
import math
import os
import re
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import qwen3_ref as q3  # noqa: E402  (the generic parts: RoPE, LoRA, commands, selfcheck)
# PEFT's target_parameters adapters' common parts, gpt-oss's reference's (the same rules)
import gptoss_ref as go  # noqa: E402  (PEFT's target_parameters adapters on stacked experts: the same rules)
from gptoss_ref import STACKED_TARGETS, ParamLora, lora_r_scale, param_factors, parse_patterns, pattern_value  # noqa: E402,F401

DT = torch.float64
L2NORM_EPS = 1e-6  # HF l2norm's eps (use_qk_l2norm_in_kernel), fixed in the modeling file

BASE_CONFIG = {
    "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next",
    "vocab_size": 97, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4,
    "full_attention_interval": 2,  # layers 1 and 3 full, 0 and 2 linear
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "partial_rotary_factor": 0.25, "rope_theta": 10000.0, "rope_scaling": None,
    "attention_bias": False,
    "linear_num_key_heads": 2, "linear_key_head_dim": 8, "linear_num_value_heads": 4,
    "linear_value_head_dim": 8, "linear_conv_kernel_dim": 4,
    "num_experts": 8, "moe_intermediate_size": 32, "num_experts_per_tok": 2,
    "norm_topk_prob": True, "shared_expert_intermediate_size": 48,
    "decoder_sparse_step": 1, "mlp_only_layers": [],
    "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "hidden_act": "silu",
    "max_position_embeddings": 4096, "bos_token_id": 0, "eos_token_id": 1,
    # In HF's config.json too; they do not change the forward.
    "attention_dropout": 0.0, "output_router_logits": False, "router_aux_loss_coef": 0.001,
    "initializer_range": 0.02, "use_cache": True,
}
# Qwen3NextConfig's defaults, for keys a config.json leaves out.
HF_DEFAULTS = {
    "intermediate_size": 5632, "num_key_value_heads": 2, "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False, "attention_bias": False, "hidden_act": "silu",
    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
    "linear_num_key_heads": 16, "linear_num_value_heads": 32, "decoder_sparse_step": 1,
    "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
    "num_experts_per_tok": 10, "num_experts": 512, "norm_topk_prob": True,
    "full_attention_interval": 4,
}
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "in_proj_qkvz", "in_proj_ba", "out_proj",
                "gate_proj", "up_proj", "down_proj", "shared_expert_gate", "lm_head")
EXPERT_PARTS = ("gate_proj", "up_proj", "down_proj")
LEGACY_LAYER_TYPES = {"mamba": "linear_attention", "attention": "full_attention"}
MTP_NAMES = ("mtp.fc.weight", "mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight",
             "mtp.norm.weight", "mtp.layers.0.input_layernorm.weight")

# Qwen3.5-MoE: "qwen3_5_moe" (Qwen3_5MoeForConditionalGeneration, the language model's fields in
# text_config) and "qwen3_5_moe_text" (Qwen3_5MoeForCausalLM, flat).
Q35_TYPES = ("qwen3_5_moe", "qwen3_5_moe_text")
ARCHS = ("qwen3_next",) + Q35_TYPES
# The language model's fields (text_config of qwen3_5_moe; all of qwen3_5_moe_text's config):
# BASE_CONFIG's sizes, every layer MoE (Qwen3.5 has no dense MLP, mlp_only_layers,
# decoder_sparse_step or norm_topk_prob), RoPE in rope_parameters as the released configs have it.
Q35_TEXT_BASE = {
    "vocab_size": 97, "hidden_size": 64, "num_hidden_layers": 4,
    "full_attention_interval": 2,  # layers 1 and 3 full, 0 and 2 linear
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                        "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10],
                        "mrope_interleaved": True},
    "attention_bias": False,
    "linear_num_key_heads": 2, "linear_key_head_dim": 8, "linear_num_value_heads": 4,
    "linear_value_head_dim": 8, "linear_conv_kernel_dim": 4,
    "num_experts": 8, "moe_intermediate_size": 32, "num_experts_per_tok": 2,
    "shared_expert_intermediate_size": 48,
    "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "hidden_act": "silu",
    "max_position_embeddings": 4096, "bos_token_id": 0, "eos_token_id": 1,
    "attention_dropout": 0.0, "output_router_logits": False, "router_aux_loss_coef": 0.001,
    "initializer_range": 0.02, "use_cache": True,
}
# qwen3_5_moe's top level besides text_config (Qwen3_5MoeConfig's fields), and a small vision tower
# config (the reference never builds the tower: text-only inputs never reach it).
Q35_COMPOSITE_TOP = {
    "image_token_id": 248056, "video_token_id": 248057, "vision_start_token_id": 248053,
    "vision_end_token_id": 248054,
}
Q35_VISION_CONFIG = {
    "model_type": "qwen3_5_moe_vision", "depth": 1, "hidden_size": 16, "intermediate_size": 32,
    "num_heads": 2, "in_channels": 3, "patch_size": 2, "temporal_patch_size": 2,
    "spatial_merge_size": 2, "num_position_embeddings": 16, "hidden_act": "gelu_pytorch_tanh",
    "initializer_range": 0.02, "deepstack_visual_indexes": [],
}
# make-model's one vision tower tensor (Conv3d [embed, in_channels, temporal, patch, patch]),
# which every reader skips
VISUAL_DUMMY = ("model.visual.patch_embed.proj.weight", (16, 3, 2, 2, 2))
# Qwen3_5MoeTextConfig's defaults, for keys a config leaves out
Q35_DEFAULTS = {
    "num_key_value_heads": 2, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
    "attention_bias": False, "hidden_act": "silu", "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_num_key_heads": 16,
    "linear_num_value_heads": 32, "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512, "num_experts_per_tok": 8, "num_experts": 256,
    "full_attention_interval": 4,
}
Q35_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "in_proj_qkv", "in_proj_z",
                    "in_proj_b", "in_proj_a", "out_proj", "gate_proj", "up_proj", "down_proj",
                    "shared_expert_gate", "lm_head")
# flat(): a qwen3_5_moe config read as one flat config (its text_config) carries this key
FLAT_KEY = "_qwen3_5_moe_text_config"


# ---------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------

def is_q35(cfg):
    return cfg.get("model_type") in Q35_TYPES


def get(cfg, key):
    """cfg[key], or Qwen3NextConfig's (Qwen3_5MoeTextConfig's) default when the key is absent (or
    null)."""
    defaults = Q35_DEFAULTS if is_q35(cfg) else HF_DEFAULTS
    v = cfg.get(key)
    return defaults[key] if v is None and key in defaults else v


def flat(cfg):
    """The config the model reads: a qwen3_5_moe config's text_config (model_type kept as
    "qwen3_5_moe", tie_word_embeddings the top level's where it has one, else text_config's),
    marked FLAT_KEY; any other config (or one already flat) as it is."""
    if cfg.get("model_type") != "qwen3_5_moe" or cfg.get(FLAT_KEY):
        return cfg
    tc = cfg.get("text_config")
    if not isinstance(tc, dict):
        raise SystemExit("config: qwen3_5_moe needs a text_config object (the language model's fields)")
    if tc.get("model_type", "qwen3_5_moe_text") != "qwen3_5_moe_text":
        raise SystemExit(f"config: text_config model_type {tc.get('model_type')!r}, expected "
                         "qwen3_5_moe_text")
    view = copy.deepcopy(tc)
    view["model_type"] = "qwen3_5_moe"
    if cfg.get("tie_word_embeddings") is not None:
        view["tie_word_embeddings"] = cfg["tie_word_embeddings"]
    view[FLAT_KEY] = True
    return view


def prefix_of(cfg):
    """The language model's tensor-name prefix: model.language_model. for qwen3_5_moe (inside
    Qwen3_5MoeModel), model. otherwise. lm_head.weight is top-level in both."""
    return "model.language_model." if cfg.get("model_type") == "qwen3_5_moe" else "model."


def head_dim_of(cfg):
    """Qwen3NextConfig: head_dim 256 by default; an explicit null: hidden_size // heads (as the
    rotary embedding's `getattr(config, "head_dim", None) or ...` reads it)."""
    if "head_dim" not in cfg:
        return 256
    return cfg["head_dim"] or cfg["hidden_size"] // cfg["num_attention_heads"]


def rope_params(cfg):
    rp = cfg.get("rope_parameters")
    return rp if isinstance(rp, dict) else {}


def partial_rotary_factor(cfg):
    v = cfg.get("partial_rotary_factor")
    if v is None:
        v = rope_params(cfg).get("partial_rotary_factor")
    return 0.25 if v is None else float(v)


def rotary_dim_of(cfg):
    return int(head_dim_of(cfg) * partial_rotary_factor(cfg))


def rope_theta(cfg):
    """The default RoPE's base. Qwen3.5's rope_parameters also carry mrope_section and
    mrope_interleaved, which text-only input makes moot; verified by reading HF's
    modeling_qwen3_5_moe.py: Qwen3_5MoeTextRotaryEmbedding.forward computes freqs [3, B, T, rd/2] =
    position_ids[s] * inv_freq for the three streams s = t, h, w, and recomposition_frequencies
    starts from stream t's and overwrites frequency j (offset 1 / 2, step 3, below 3 *
    mrope_section[1 / 2]) with stream h's / w's, then cat(freqs, freqs); for text the streams are
    equal (Qwen3_5MoeTextModel.forward: arange(T) expanded over all of them; Qwen3_5MoeModel's
    get_rope_index: a text span's arange expanded over 3), so every overwrite copies an equal value
    and cos / sin are plain rotate-half RoPE's over the first int(head_dim *
    partial_rotary_factor) dims (apply_rotary_pos_emb's partial split). selfcheck_mrope runs that
    recomposition: equal to plain RoPE for equal streams, not for distinct ones."""
    v = cfg.get("rope_theta")
    if v is None:
        v = rope_params(cfg).get("rope_theta")
    return 10000.0 if v is None else float(v)


def layer_types(cfg):
    """config layer_types (legacy names remapped), else full iff (l + 1) % interval == 0."""
    lt = cfg.get("layer_types")
    if lt is not None:
        return [LEGACY_LAYER_TYPES.get(t, t) for t in lt]
    n = get(cfg, "full_attention_interval")
    return ["full_attention" if (i + 1) % n == 0 else "linear_attention"
            for i in range(cfg["num_hidden_layers"])]


def is_moe_layer(cfg, i):
    """HF Qwen3NextDecoderLayer: Qwen3NextSparseMoeBlock iff this holds (gen_train_inputs.py may
    import it, as it imports the other references' predicates). Qwen3_5MoeDecoderLayer: always
    (mlp_only_layers, decoder_sparse_step: no such fields)."""
    if is_q35(flat(cfg)):
        return True
    return (i not in (cfg.get("mlp_only_layers") or [])
            and get(cfg, "num_experts") > 0
            and (i + 1) % get(cfg, "decoder_sparse_step") == 0)


def n_experts(cfg):
    return get(flat(cfg), "num_experts")


def check_config(cfg):
    """Refuse what this reference does not implement, rather than compute something else."""
    def need(ok, msg):
        if not ok:
            raise SystemExit(f"config: {msg}")

    def pos_int(key):
        v = get(cfg, key)
        need(isinstance(v, int) and not isinstance(v, bool) and v > 0,
             f"{key} must be a positive integer, got {v!r}")
        return v
    need(cfg.get("model_type") in ARCHS, f"unsupported model_type {cfg.get('model_type')!r}")
    need(cfg.get("model_type") != "qwen3_5_moe" or cfg.get(FLAT_KEY),
         "qwen3_5_moe: read through flat() (its text_config)")
    q35 = is_q35(cfg)
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "linear_num_key_heads", "linear_num_value_heads",
                "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim") + (
                    () if q35 else ("decoder_sparse_step", "intermediate_size")):
        pos_int(key)
    need(cfg["num_attention_heads"] % get(cfg, "num_key_value_heads") == 0,
         "num_attention_heads must be a multiple of num_key_value_heads")
    need(get(cfg, "linear_num_value_heads") % get(cfg, "linear_num_key_heads") == 0,
         "linear_num_value_heads must be a multiple of linear_num_key_heads")
    hd = head_dim_of(cfg)
    need(isinstance(hd, int) and hd > 0, f"head_dim {hd!r}")
    rd = rotary_dim_of(cfg)
    need(0 < rd <= hd and rd % 2 == 0,
         f"rotary dim int(head_dim * partial_rotary_factor) = {rd} must be even and in (0, head_dim]")
    prf_rp = rope_params(cfg).get("partial_rotary_factor")
    if cfg.get("partial_rotary_factor") is not None and prf_rp is not None:
        need(float(cfg["partial_rotary_factor"]) == float(prf_rp),
             "partial_rotary_factor differs from rope_parameters' partial_rotary_factor")
    rs = cfg.get("rope_scaling")
    need(not rs or (isinstance(rs, dict) and rs.get("rope_type", rs.get("type")) == "yarn" and "factor" in rs),
         "rope_scaling: null or a YaRN object (rope_type yarn with its factor) only")
    rt = rope_params(cfg).get("rope_type", rope_params(cfg).get("type", "default"))
    need(rt in ("default", "yarn"), f"rope_parameters rope_type {rt!r}: expected default or yarn")
    need(rt == "default" or "factor" in rope_params(cfg), "rope_parameters rope_type yarn without its factor")
    need(not (rs and rt == "yarn"), "YaRN in both rope_scaling and rope_parameters")
    if cfg.get("rope_theta") is not None and rope_params(cfg).get("rope_theta") is not None:
        need(float(cfg["rope_theta"]) == float(rope_params(cfg)["rope_theta"]),
             "rope_theta differs from rope_parameters' rope_theta")
    need(get(cfg, "hidden_act") == "silu", "only hidden_act silu is implemented")
    types = layer_types(cfg)
    need(len(types) == cfg["num_hidden_layers"]
         and all(t in ("linear_attention", "full_attention") for t in types),
         "layer_types must name linear_attention / full_attention for every layer")
    if cfg.get("layer_types") is None:
        pos_int("full_attention_interval")
    E = get(cfg, "num_experts")
    need(isinstance(E, int) and E >= 0, "num_experts must be a non-negative integer")
    if q35:  # Qwen3_5MoeDecoderLayer: every layer a Qwen3_5MoeSparseMoeBlock
        pos_int("num_experts")
    mol = [] if q35 else cfg.get("mlp_only_layers") or []  # Qwen3.5: no such field
    need(isinstance(mol, list) and all(isinstance(i, int) for i in mol),
         "mlp_only_layers must be a list of layer indices")
    if any(is_moe_layer(cfg, i) for i in range(cfg["num_hidden_layers"])):
        pos_int("moe_intermediate_size")
        pos_int("shared_expert_intermediate_size")
        k = pos_int("num_experts_per_tok")
        need(k <= E, "need num_experts_per_tok <= num_experts")


def build_config(overrides, dtype):
    cfg = copy.deepcopy({**BASE_CONFIG, **overrides})
    for k in [k for k, v in overrides.items() if v == ""]:
        del cfg[k]  # `--set KEY=`: KEY absent from config.json (HF's default)
    cfg["torch_dtype"] = {"f32": "float32", "bf16": "bfloat16"}[dtype]
    check_config(cfg)
    return cfg


def build_q35_config(overrides, dtype, arch):
    """make-model's config.json for --arch qwen3_5_moe / qwen3_5_moe_text: Q35_TEXT_BASE + --set
    (`--set KEY=` leaves KEY out), flat for qwen3_5_moe_text; for qwen3_5_moe those are
    text_config's (model_type qwen3_5_moe_text), beside architectures, model_type, vision_config,
    the vision token ids and tie_word_embeddings (text_config's value, absent with it) at the top
    level; `--set top.KEY=VALUE` sets (`top.KEY=` removes) a top-level key afterwards."""
    td = {"f32": "float32", "bf16": "bfloat16"}[dtype]
    text, top = copy.deepcopy(Q35_TEXT_BASE), {}
    for k, v in overrides.items():
        if k.startswith("top."):
            if arch != "qwen3_5_moe":
                raise SystemExit("--set top.KEY: only with --arch qwen3_5_moe")
            top[k[len("top."):]] = v
        else:
            text[k] = copy.deepcopy(v)
    text = {k: v for k, v in text.items() if v != ""}
    if arch == "qwen3_5_moe_text":
        cfg = {"architectures": ["Qwen3_5MoeForCausalLM"], "model_type": "qwen3_5_moe_text",
               **text, "torch_dtype": td}
    else:
        cfg = {"architectures": ["Qwen3_5MoeForConditionalGeneration"],
               "model_type": "qwen3_5_moe",
               "text_config": {"model_type": "qwen3_5_moe_text", **text, "torch_dtype": td},
               "vision_config": dict(copy.deepcopy(Q35_VISION_CONFIG),
                                     out_hidden_size=text.get("hidden_size")),
               **Q35_COMPOSITE_TOP, "torch_dtype": td}
        if "tie_word_embeddings" in text:
            cfg["tie_word_embeddings"] = text["tie_word_embeddings"]
        for k, v in top.items():
            if v == "":
                cfg.pop(k, None)
            else:
                cfg[k] = copy.deepcopy(v)
    check_config(flat(cfg))
    return cfg


# ---------------------------------------------------------------------------
# Tensors
# ---------------------------------------------------------------------------

def tensor_shapes(cfg, stacked=True):
    """Every checkpoint tensor the config implies, (HF name, shape), in checkpoint order. Qwen3.5:
    the prefix's names (prefix_of), in_proj_qkv / in_proj_z / in_proj_b / in_proj_a, the routed
    experts stacked (mlp.experts.gate_up_proj [E, 2I, H], mlp.experts.down_proj [E, H, I]), or with
    stacked=False per expert (the model's own tensors: internal_shapes)."""
    cfg = flat(cfg)
    q35, P = is_q35(cfg), prefix_of(cfg)
    H, V = cfg["hidden_size"], cfg["vocab_size"]
    nh, nkv, hd = cfg["num_attention_heads"], get(cfg, "num_key_value_heads"), head_dim_of(cfg)
    nk, nv = get(cfg, "linear_num_key_heads"), get(cfg, "linear_num_value_heads")
    dk, dv, K = (get(cfg, "linear_key_head_dim"), get(cfg, "linear_value_head_dim"),
                 get(cfg, "linear_conv_kernel_dim"))
    bias = get(cfg, "attention_bias")
    types = layer_types(cfg)
    out = [(P + "embed_tokens.weight", (V, H))]

    def mlp(p, inter):
        return [(p + ".gate_proj.weight", (inter, H)), (p + ".up_proj.weight", (inter, H)),
                (p + ".down_proj.weight", (H, inter))]
    for i in range(cfg["num_hidden_layers"]):
        p = f"{P}layers.{i}"
        out.append((p + ".input_layernorm.weight", (H,)))
        if types[i] == "linear_attention":
            a, conv = p + ".linear_attn", 2 * nk * dk + nv * dv
            if q35:
                out += [(a + ".in_proj_qkv.weight", (conv, H)),
                        (a + ".in_proj_z.weight", (nv * dv, H)),
                        (a + ".in_proj_b.weight", (nv, H)),
                        (a + ".in_proj_a.weight", (nv, H))]
            else:
                out += [(a + ".in_proj_qkvz.weight", (2 * nk * dk + 2 * nv * dv, H)),
                        (a + ".in_proj_ba.weight", (2 * nv, H))]
            out += [(a + ".conv1d.weight", (conv, 1, K)),
                    (a + ".A_log", (nv,)), (a + ".dt_bias", (nv,)),
                    (a + ".norm.weight", (dv,)),
                    (a + ".out_proj.weight", (H, nv * dv))]
        else:
            a = p + ".self_attn"
            for proj, o, fin in (("q_proj", 2 * nh * hd, H), ("k_proj", nkv * hd, H),
                                 ("v_proj", nkv * hd, H), ("o_proj", H, nh * hd)):
                out.append((f"{a}.{proj}.weight", (o, fin)))
                if bias:
                    out.append((f"{a}.{proj}.bias", (o,)))
            out += [(a + ".q_norm.weight", (hd,)), (a + ".k_norm.weight", (hd,))]
        out.append((p + ".post_attention_layernorm.weight", (H,)))
        if is_moe_layer(cfg, i):
            E, inter = get(cfg, "num_experts"), get(cfg, "moe_intermediate_size")
            out.append((p + ".mlp.gate.weight", (E, H)))
            if q35 and stacked:
                out += [(p + ".mlp.experts.gate_up_proj", (E, 2 * inter, H)),
                        (p + ".mlp.experts.down_proj", (E, H, inter))]
            else:
                for e in range(E):
                    out += mlp(f"{p}.mlp.experts.{e}", inter)
            out += mlp(p + ".mlp.shared_expert", get(cfg, "shared_expert_intermediate_size"))
            out.append((p + ".mlp.shared_expert_gate.weight", (1, H)))
        else:
            out += mlp(p + ".mlp", get(cfg, "intermediate_size"))
    out.append((P + "norm.weight", (H,)))
    if not get(cfg, "tie_word_embeddings"):
        out.append(("lm_head.weight", (V, H)))
    return out


def internal_shapes(cfg):
    """The model's own tensors (and the gradient's names): the checkpoint's, the routed experts per
    expert, nn.Linear orientation: <prefix>layers.L.mlp.experts.E.{gate,up}_proj.weight [I, H],
    .down_proj.weight [H, I] (Qwen3-Next's checkpoints have them so already)."""
    return tensor_shapes(cfg, stacked=False)


def to_internal(W, cfg):
    """A Qwen3.5 checkpoint's {name: tensor} (stacked experts) -> the per-expert layout, in
    internal_shapes order: expert e's gate_proj = gate_up_proj[e][:I], up_proj =
    gate_up_proj[e][I:] (HF Qwen3_5MoeExperts: linear(x, gate_up_proj[e]).chunk(2, -1) -> gate,
    up), down_proj = down_proj[e]."""
    out = {}
    for name, _ in tensor_shapes(cfg):
        if name.endswith(".mlp.experts.gate_up_proj"):
            x = name[:-len(".gate_up_proj")]
            gu, d = W[name], W[x + ".down_proj"]
            inter = gu.shape[1] // 2
            for e in range(gu.shape[0]):
                out[f"{x}.{e}.gate_proj.weight"] = gu[e, :inter].contiguous()
                out[f"{x}.{e}.up_proj.weight"] = gu[e, inter:].contiguous()
                out[f"{x}.{e}.down_proj.weight"] = d[e].contiguous()
        elif not name.endswith(".mlp.experts.down_proj"):
            out[name] = W[name]
    return {n: out[n] for n, _ in internal_shapes(cfg)}


def to_hf(W, cfg):
    """The per-expert layout -> a Qwen3.5 checkpoint's (stacked experts), as [(name, tensor)] in
    checkpoint order (to_internal's inverse)."""
    out = []
    E = get(flat(cfg), "num_experts")
    for name, _ in tensor_shapes(cfg):
        if name.endswith(".mlp.experts.gate_up_proj"):
            x = name[:-len(".gate_up_proj")]
            t = torch.stack([torch.cat([W[f"{x}.{e}.gate_proj.weight"], W[f"{x}.{e}.up_proj.weight"]])
                             for e in range(E)])
        elif name.endswith(".mlp.experts.down_proj"):
            x = name[:-len(".down_proj")]
            t = torch.stack([W[f"{x}.{e}.down_proj.weight"] for e in range(E)])
        else:
            t = W[name]
        out.append((name, t.contiguous()))
    return out


def mtp_shapes(cfg):
    """make-model --mtp's dummy multi-token-prediction tensors (ignored by every reader)."""
    H = flat(cfg)["hidden_size"]
    return [(n, (H, 2 * H) if n == "mtp.fc.weight" else (H,)) for n in MTP_NAMES]


def check_exact(have, want, what):
    for n in sorted(set(want) | set(have)):
        if (n in want) != (n in have) or tuple(want.get(n, ())) != tuple(have.get(n, ())):
            raise SystemExit(f"{what}tensor {n}: shape {list(have[n]) if n in have else 'missing'}, "
                             f"expected {list(want[n]) if n in want else 'none (unknown)'}")


def model_tensors(weights, cfg, what="", per_expert_ok=True):
    """The model's tensors of a checkpoint's {name: tensor}: mtp.* dropped (Qwen3.5: model.visual.*
    too, the vision tower: HF's _keys_to_ignore_on_load_unexpected), a tied model's unused
    lm_head.weight dropped; then strictly the tensors (names, shapes) the config implies. Qwen3.5:
    the stacked experts split per expert (to_internal); with per_expert_ok (weights in memory, not
    a checkpoint) the per-expert layout is taken as it is."""
    cfg = flat(cfg)
    q35 = is_q35(cfg)
    w = {n: t for n, t in weights.items()
         if not n.startswith(("mtp.", "model.visual.") if q35 else "mtp.")}
    if get(cfg, "tie_word_embeddings"):
        w.pop("lm_head.weight", None)
    have = {n: tuple(t.shape) for n, t in w.items()}
    if q35 and per_expert_ok and not any(n.endswith(".mlp.experts.gate_up_proj") for n in w):
        check_exact(have, dict(internal_shapes(cfg)), what)
        return w
    check_exact(have, dict(tensor_shapes(cfg)), what)
    return to_internal(w, cfg) if q35 else w


def load_weights(model_dir, cfg):
    try:
        stored = q3.load_weights(model_dir)
    except ValueError as e:
        raise SystemExit(f"checkpoint: {e}")
    return model_tensors(stored, cfg, "checkpoint: ", per_expert_ok=False)


def linear_modules(cfg):
    """Every nn.Linear a LoRA adapter may sit on, in state-dict order, (module name, in, out):
    q/k/v/o_proj, in_proj_qkvz, in_proj_ba (Qwen3.5: in_proj_qkv, in_proj_z, in_proj_b,
    in_proj_a), out_proj, the dense MLP's, every routed expert's (Qwen3.5: per expert, as
    internal_shapes names them) and the shared expert's gate/up/down_proj, shared_expert_gate,
    lm_head (even when tied). Not the router (mlp.gate: a Qwen3NextTopKRouter, no nn.Linear) nor
    conv1d."""
    cfg = flat(cfg)
    out = []
    for n, s in internal_shapes(cfg):
        if (n.endswith(".weight") and len(s) == 2
                and n not in (prefix_of(cfg) + "embed_tokens.weight", "lm_head.weight")
                and not n.endswith(".mlp.gate.weight")):
            out.append((n[:-len(".weight")], s[1], s[0]))
    return out + [("lm_head", cfg["hidden_size"], cfg["vocab_size"])]


# ---------------------------------------------------------------------------
# LoRA adapters, Qwen3.5: PEFT's modules and PEFT's ParamWrapper on the stacked experts
# ---------------------------------------------------------------------------
# Written from PEFT's definitions (src/peft/tuners/lora/layer.py ParamWrapper: _get_in_out_features,
# update_layer, get_delta_weight; tuners_utils._inject_parameters) and transformers'
# Qwen3_5MoeExperts (= Qwen3NextExperts: gate_up_proj [E, 2I, H] registered before down_proj
# [E, H, I], used as linear(x, W[e]), no is_transposed). A target_parameters entry T selects the
# parameter N (full name, e.g. model.language_model.layers.L.mlp.experts.gate_up_proj) when N == T
# or N ends with "." + T. A 3-D parameter [E, d1, d2] reads as (E, in, out) = (E, d1, d2), and not
# being is_transposed PEFT swaps in and out: in = d2, out = d1 (gate_up_proj: in H, out 2I;
# down_proj: in I, out H); lora_A [r*E, in] (rows expert-major: row e*r + k), lora_B [out, r*E]
# (columns expert-minor: column k*E + e);
#     delta = scale * einsum("o r e, e r i -> e o i", B.reshape(out, r, E), A.reshape(E, r, in))
# is added to the parameter, i.e. per expert e, with A_e = A.reshape(E, r, in)[e] [r, in] and
# B_e = B.reshape(out, r, E)[:, :, e] [out, r], W[e] += scale * B_e @ A_e (nn.Linear orientation,
# as W[e] is). gate_up_proj: the per-expert gate_proj.weight [I, H] (rows [0, I) of W[e]) gets
# scale * B_e[:I] @ A_e, up_proj.weight (rows [I, 2I)) scale * B_e[I:] @ A_e (one A shared by gate
# and up); down_proj: down_proj.weight [H, I] gets scale * B_e @ A_e.
# The wrapper replaces the module owning the parameter, <prefix>layers.L.mlp.experts; with both
# parameters targeted PEFT wraps them in the module's registration order, gate_up_proj first
# (inner) and down_proj around it (outer): gate_up_proj's tensors are
# "base_model.model.<prefix>layers.L.mlp.experts.base_layer.lora_A.weight" / lora_B, down_proj's
# "...mlp.experts.lora_A.weight" / lora_B; with one of them targeted in a layer, it has the names
# without base_layer.
# r and lora_alpha, for a module (its name) and for a parameter (its full name) alike: PEFT's
# get_pattern_key, the first key K of rank_pattern / alpha_pattern with
# re.match(rf"(.*\.)?({K})$", name), else the config's r / lora_alpha; scale alpha / r, or
# alpha / sqrt(r) with use_rslora.
# qwen3_next keeps qwen3_ref's reader (its routed experts are modules; target_parameters refused).



def expert_rows(which, inter):
    """The per-expert modules a wrapper adapts, with the rows of B_e each takes (gate_up_proj[e]'s
    rows: gate [0, I), up [I, 2I))."""
    if which == "gate_up_proj":
        return (("gate_proj", slice(0, inter)), ("up_proj", slice(inter, 2 * inter)))
    return (("down_proj", slice(None)),)


def wrapped_module(cfg, wrappers, name):
    """Whether `name` is a routed expert's per-expert module (<P>layers.L.mlp.experts.E.
    {gate,up,down}_proj) whose stacked parameter (gate_up_proj / down_proj) a ParamWrapper of
    layer L adapts: no module of HF's model (its experts are stacked), so no target_modules match
    (the shared expert's gate/up/down_proj still are; trill reads a file so too)."""
    m = re.fullmatch(re.escape(prefix_of(cfg))
                     + r"layers\.(\d+)\.mlp\.experts\.\d+\.(gate_proj|up_proj|down_proj)", name)
    which = m and ("down_proj" if m.group(2) == "down_proj" else "gate_up_proj")
    return bool(m) and any(w.layer == int(m.group(1)) and w.which == which for w in wrappers)


def q35_read_config(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = flat(json.load(f))
    check_config(cfg)
    if not is_q35(cfg):
        raise SystemExit("make-adapter: --peft-params / --rank-pattern / --alpha-pattern are "
                         "implemented for Qwen3.5 (qwen3_5_moe, qwen3_5_moe_text) only")
    return cfg


# Qwen3.5's stacked experts for gptoss_ref's target_parameters readers and writers: gate_proj /
# up_proj / down_proj in make-adapter's --peft-params mean every layer's routed experts' stacked
# parameters, the shared expert's projections not adapted; the config read flat.
Q35 = go.StackedFamily(
    q35_read_config, tensor_shapes, linear_modules, n_experts, lambda cfg: get(cfg, "moe_intermediate_size"),
    lambda cfg, layer: f"{prefix_of(cfg)}layers.{layer}.mlp.experts",
    params_refused=lambda cfg: None if is_q35(cfg) else
    "only Qwen3.5's stacked experts (qwen3_5_moe, qwen3_5_moe_text) are implemented",
    skip_module=wrapped_module, view=flat)


def param_wrappers(cfg, acfg):
    return go.stacked_param_wrappers(Q35, cfg, acfg)


def load_adapter(adapter_dir, cfg, linears):
    return go.stacked_load_adapter(Q35, adapter_dir, cfg, linears)


def make_adapter_tensors(cfg, acfg, seed, b_std):
    return go.stacked_make_adapter_tensors(Q35, cfg, acfg, seed, b_std)


def cmd_make_adapter(args):
    return go.stacked_cmd_make_adapter(Q35, args)


# ---------------------------------------------------------------------------
# make-model
# ---------------------------------------------------------------------------

def make_weights(cfg, seed, std=0.02, mtp=False):
    """Random weights in tensor_shapes order (the same seed gives the same tensors in any dtype or
    sharding, with or without mtp; Qwen3.5: the routed experts stacked). qwen3_5_moe: then
    VISUAL_DUMMY, N(0, S), drawn apart (the model's tensors are the same without it).
    [(name, fp32 tensor)]."""
    cfg = flat(cfg)
    g = torch.Generator().manual_seed(seed)
    out = []
    for name, shape in tensor_shapes(cfg):
        if name.endswith(".A_log"):
            t = torch.log(1.0 + 7.0 * torch.rand(shape, generator=g, dtype=torch.float32))
            out.append((name, t))
            continue
        r = torch.randn(shape, generator=g, dtype=torch.float32)
        if name.endswith(".linear_attn.norm.weight"):
            t = 1.0 + 0.1 * r           # the gated norm: w * x (not zero-centred)
        elif name.endswith("norm.weight"):
            t = 0.1 * r                 # zero-centred: (1 + w) * x, w not all zeros
        elif name.endswith(".dt_bias"):
            t = -3.0 + 1.0 * r          # per-head median exp(g) ~0.5..0.94: short and long memory
        elif name.endswith(".conv1d.weight"):
            t = 0.4 * r
        elif name.endswith(".mlp.gate.weight"):
            t = 0.2 * r                 # decisive routing, not saturated
        else:
            t = std * r
        out.append((name, t))
    if mtp:
        gm = torch.Generator().manual_seed(seed + 7777)
        for name, shape in mtp_shapes(cfg):
            r = torch.randn(shape, generator=gm, dtype=torch.float32)
            out.append((name, 0.1 * r if name.endswith("norm.weight") else std * r))
    if cfg.get("model_type") == "qwen3_5_moe":
        gv = torch.Generator().manual_seed(seed + 8888)
        r = torch.randn(VISUAL_DUMMY[1], generator=gv, dtype=torch.float32)
        out.append((VISUAL_DUMMY[0], std * r))
    return out


def decay_probe(model, tokens):
    """(g [N], beta [N]) of every linear layer's every token and value head over one forward."""
    model.gdn_stats = []
    with torch.no_grad():
        model.forward(tokens)
    stats, model.gdn_stats = model.gdn_stats, None
    if not stats:
        return None, None
    return torch.cat([s[0].reshape(-1) for s in stats]), torch.cat([s[1].reshape(-1) for s in stats])


def decay_summary(model, tokens):
    g, beta = decay_probe(model, tokens)
    if g is None:
        return "no linear layers"
    dec = g.exp()
    return (f"g in [{g.min():.3g}, {g.max():.3g}] (exp(g) in [{dec.min():.3g}, {dec.max():.3g}], "
            f"median {dec.median():.3g}), beta in [{beta.min():.3g}, {beta.max():.3g}] over "
            f"{g.numel()} (token, layer, value head)")


def cmd_make_model(args):
    if args.arch == "qwen3_next":
        cfg = build_config(q3.parse_set(args.set), args.dtype)
    else:
        cfg = build_q35_config(q3.parse_set(args.set), args.dtype, args.arch)
    tensors = make_weights(cfg, args.seed, args.std, args.mtp)
    files = q3.write_model(args.out, cfg, tensors, args.dtype, args.shards)
    fc = flat(cfg)
    probe = np.random.default_rng(args.seed).integers(0, fc["vocab_size"], 64).tolist()
    model = Qwen3NextModel(cfg=cfg, weights=dict(tensors))
    print(f"wrote {args.out}: {len(tensors)} tensors{' (mtp included)' if args.mtp else ''}, "
          f"{args.arch}, {args.dtype}, files={files}, layers {''.join(t[0] for t in layer_types(fc))} "
          f"(l linear, f full), MoE layers {model.moe_layers}; 64-token probe: "
          f"{decay_summary(model, probe)}")


# ---------------------------------------------------------------------------
# The model function
# ---------------------------------------------------------------------------

def rms_norm0(x, w, eps):
    """Qwen3NextRMSNorm: zero-centred weight, x / sqrt(mean(x^2) + eps) * (1 + w)."""
    return q3.rms_norm(x, 1.0 + w, eps)


def l2norm(x):
    """HF l2norm: x * rsqrt(sum(x^2) + 1e-6) over the last dim."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + L2NORM_EPS)


def causal_conv_silu(x, w):
    """Depthwise causal conv over time, then SiLU. x [T, C], w [C, 1, K] (nn.Conv1d groups=C,
    padding K-1, the first T outputs): out[t, c] = sum_j w[c, 0, j] * x[t - K + 1 + j, c] (zero
    before the sequence)."""
    T, C = x.shape
    K = w.shape[-1]
    xp = torch.cat([torch.zeros(K - 1, C, dtype=x.dtype), x], dim=0)
    y = sum(w[:, 0, j] * xp[j:j + T] for j in range(K))
    return F.silu(y)


def recurrent_gated_delta_rule(q, k, v, g, beta):
    """The gated delta rule, recurrent form. q, k [T, Hv, dk] (q already scaled), v [T, Hv, dv],
    g, beta [T, Hv]. Per head, S [dk, dv] from 0: S = exp(g_t) S; delta = beta_t (v_t - S^T k_t);
    S += k_t delta^T; o_t = S^T q_t. Returns o [T, Hv, dv]."""
    T, Hv, dk = k.shape
    S = torch.zeros(Hv, dk, v.shape[-1], dtype=v.dtype)
    outs = []
    for t in range(T):
        S = S * torch.exp(g[t])[:, None, None]
        kv = torch.einsum("hk,hkv->hv", k[t], S)
        delta = (v[t] - kv) * beta[t][:, None]
        S = S + k[t][:, :, None] * delta[:, None, :]
        outs.append(torch.einsum("hk,hkv->hv", q[t], S))
    return torch.stack(outs) if outs else torch.zeros(0, Hv, v.shape[-1], dtype=v.dtype)


def chunk_gated_delta_rule(q, k, v, g, beta, chunk=64):
    """HF's torch_chunk_gated_delta_rule's equations (float64, no l2norm or scale here: q, k as
    recurrent_gated_delta_rule takes them). Same arguments and result."""
    T, Hv, dk = k.shape
    dv = v.shape[-1]
    pad = (chunk - T % chunk) % chunk

    def heads(x):  # [T, Hv, ...] -> [Hv, N, chunk, ...], zero padded at the end
        x = x.transpose(0, 1)
        x = torch.cat([x, torch.zeros(Hv, pad, *x.shape[2:], dtype=x.dtype)], dim=1)
        return x.reshape(Hv, -1, chunk, *x.shape[2:])
    q, k, v, g, beta = heads(q), heads(k), heads(v), heads(g), heads(beta)
    N = q.shape[1]
    k_beta, v_beta = k * beta[..., None], v * beta[..., None]
    g = g.cumsum(-1)
    diff = (g[..., :, None] - g[..., None, :]).tril()   # tril before exp: no overflow above
    decay = diff.exp().tril()
    upper0 = torch.ones(chunk, chunk, dtype=torch.bool).triu(0)
    attn = -((k_beta @ k.transpose(-1, -2)) * decay).masked_fill(upper0, 0)
    for i in range(1, chunk):
        row = attn[..., i, :i].clone()
        sub = attn[..., :i, :i].clone()
        attn[..., i, :i] = row + (row[..., None] * sub).sum(-2)
    attn = attn + torch.eye(chunk, dtype=attn.dtype)
    value = attn @ v_beta
    k_cumdecay = attn @ (k_beta * g.exp()[..., None])
    S = torch.zeros(Hv, dk, dv, dtype=v.dtype)
    out = torch.zeros(Hv, N, chunk, dv, dtype=v.dtype)
    upper1 = torch.ones(chunk, chunk, dtype=torch.bool).triu(1)
    for i in range(N):
        q_i, k_i, v_i = q[:, i], k[:, i], value[:, i]
        a = (q_i @ k_i.transpose(-1, -2) * decay[:, i]).masked_fill(upper1, 0)
        v_new = v_i - k_cumdecay[:, i] @ S
        inter = (q_i * g[:, i, :, None].exp()) @ S
        out[:, i] = inter + a @ v_new
        S = (S * g[:, i, -1, None, None].exp()
             + (k_i * (g[:, i, -1, None] - g[:, i]).exp()[..., None]).transpose(-1, -2) @ v_new)
    return out.reshape(Hv, N * chunk, dv)[:, :T].transpose(0, 1)


class Qwen3NextModel(go.StackedLora, q3.Model):
    """qwen3_ref's Model (LoRA, lin, parameters, the softmax top-k router and replay) with
    Qwen3-Next's layers: zero-centred norms, gated full attention with partial RoPE, Gated DeltaNet
    linear attention, the MoE block's shared expert and its sigmoid gate. Qwen3.5-MoE (either model
    type): the same with Qwen3_5GatedDeltaNet's four input projections, every layer MoE, the top-k
    always renormalised, the tensors under prefix_of's names (self.cfg: the flat() config), the
    routed experts held per expert (weights may be given in either layout)."""
    MODEL_TYPES = ARCHS
    QK_NORM = True
    MOE_BLOCK = "mlp"
    EXPERT_PROJ = EXPERT_PARTS

    def __init__(self, model_dir=None, cfg=None, weights=None, adapter=None):
        if model_dir is not None:
            with open(os.path.join(model_dir, "config.json")) as f:
                cfg = flat(json.load(f))
            check_config(cfg)
            weights = load_weights(model_dir, cfg)
        cfg = flat(cfg)
        check_config(cfg)
        weights = model_tensors(weights, cfg)
        # adapter: None, a folder, or in memory (modules {name: scale}, {PEFT name: tensor}[,
        # [ParamLora]]); qwen3_ref's Model takes the modules' part. Qwen3.5's folders: this file's
        # load_adapter (rank_pattern / alpha_pattern, target_parameters); qwen3_next's: qwen3_ref's.
        if isinstance(adapter, str) and not is_q35(cfg):
            with open(os.path.join(adapter, "adapter_config.json")) as f:
                if json.load(f).get("target_parameters"):
                    raise SystemExit(f"{adapter}: target_parameters: only Qwen3.5's stacked experts "
                                     "(qwen3_5_moe, qwen3_5_moe_text) are implemented")
            adapter, wrappers, lw = adapter, [], None  # qwen3_ref's Model reads the folder
        else:
            adapter, wrappers, lw = self.split_adapter(adapter, lambda d: load_adapter(d, cfg, linear_modules(cfg)))
        # qwen3_ref's Model reads these keys directly: HF's defaults where the config leaves them out
        filled = dict(cfg)
        for key in ("num_key_value_heads", "rms_norm_eps"):
            filled[key] = get(cfg, key)
        super().__init__(None, filled, weights, adapter)
        self.attach_wrappers(wrappers, lw, get(cfg, "num_experts"),
                             lambda which: expert_rows(which, get(cfg, "moe_intermediate_size")),
                             lambda layer, e, part: f"{prefix_of(cfg)}layers.{layer}.mlp.experts.{e}.{part}")
        self.cfg = cfg
        self.hd = head_dim_of(cfg)
        self.rotary_dim = rotary_dim_of(cfg)
        self.nKV = get(cfg, "num_key_value_heads")
        self.eps = get(cfg, "rms_norm_eps")
        self.tied = bool(get(cfg, "tie_word_embeddings"))
        self.types = layer_types(cfg)
        self.moe_layers = [i for i in range(self.L) if is_moe_layer(cfg, i)]
        self.n_experts = get(cfg, "num_experts")
        self.q35 = is_q35(cfg)
        # Qwen3_5MoeTopKRouter: always renormalised (no norm_topk_prob field)
        self.norm_topk = True if self.q35 else bool(get(cfg, "norm_topk_prob"))
        self.prefix = prefix_of(cfg)
        self.nk, self.nv = get(cfg, "linear_num_key_heads"), get(cfg, "linear_num_value_heads")
        self.dk, self.dv = get(cfg, "linear_key_head_dim"), get(cfg, "linear_value_head_dim")
        self.delta_rule = recurrent_gated_delta_rule  # selfcheck swaps in the chunked form
        self.gdn_stats = None

    def linear_modules(self):
        return linear_modules(self.cfg)

    @property
    def lm_head(self):
        # Tied: the very same tensor as the embedding (under this model type's prefix)
        return self.W[self.prefix + "embed_tokens.weight"] if self.tied else self.W["lm_head.weight"]

    def attention(self, x, p, cos, sin):
        """Qwen3NextAttention: gated, QK-normed (zero-centred), partial RoPE, GQA, causal."""
        W, T, hd, nH, nKV = self.W, x.shape[0], self.hd, self.nH, self.nKV
        qg = self.lin(x, p + ".q_proj").view(T, nH, 2 * hd)
        q, gate = qg[..., :hd], qg[..., hd:].reshape(T, nH * hd)
        k = self.lin(x, p + ".k_proj").view(T, nKV, hd)
        v = self.lin(x, p + ".v_proj").view(T, nKV, hd)
        q = q3.apply_rope(rms_norm0(q, W[p + ".q_norm.weight"], self.eps), cos, sin)
        k = q3.apply_rope(rms_norm0(k, W[p + ".k_norm.weight"], self.eps), cos, sin)
        rep = nH // nKV
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        scores = torch.einsum("thd,shd->hts", q, k) * hd ** -0.5
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        o = torch.einsum("hts,shd->thd", torch.softmax(scores, dim=-1), v).reshape(T, nH * hd)
        return self.lin(o * torch.sigmoid(gate), p + ".o_proj")

    def gdn_inputs(self, x, p):
        """The Gated DeltaNet's projections: (mixed [T, 2*nk*dk + nv*dv] = q | k | v, the conv's
        channel order; z [T, nv, dv]; b, a [T, nv]), value heads in (key head, j) order.
        Qwen3NextGatedDeltaNet: in_proj_qkvz viewed [T, nk, 2dk + 2r dv] (per key head q, k, v, z)
        and in_proj_ba viewed [T, nk, 2r] (per key head b, a), regrouped.
        Qwen3_5GatedDeltaNet: in_proj_qkv's output already is q | k | v, in_proj_z's z per value
        head, in_proj_b / in_proj_a one per value head."""
        T, nk, nv, dk, dv = x.shape[0], self.nk, self.nv, self.dk, self.dv
        if self.q35:
            return (self.lin(x, p + ".in_proj_qkv"), self.lin(x, p + ".in_proj_z").view(T, nv, dv),
                    self.lin(x, p + ".in_proj_b"), self.lin(x, p + ".in_proj_a"))
        r = nv // nk
        qkvz = self.lin(x, p + ".in_proj_qkvz").view(T, nk, 2 * dk + 2 * r * dv)
        q, k, v, z = torch.split(qkvz, [dk, dk, r * dv, r * dv], dim=-1)
        ba = self.lin(x, p + ".in_proj_ba").view(T, nk, 2 * r)
        b, a = ba[..., :r].reshape(T, nv), ba[..., r:].reshape(T, nv)
        z = z.reshape(T, nv, dv)
        mixed = torch.cat([q.reshape(T, nk * dk), k.reshape(T, nk * dk), v.reshape(T, nv * dv)], -1)
        return mixed, z, b, a

    def gated_deltanet(self, x, p):
        """Qwen3NextGatedDeltaNet / Qwen3_5GatedDeltaNet (see the module docstring)."""
        W, T = self.W, x.shape[0]
        nk, nv, dk, dv = self.nk, self.nv, self.dk, self.dv
        r = nv // nk
        mixed, z, b, a = self.gdn_inputs(x, p)
        mixed = causal_conv_silu(mixed, W[p + ".conv1d.weight"])
        q, k, v = torch.split(mixed, [nk * dk, nk * dk, nv * dv], dim=-1)
        q = l2norm(q.reshape(T, nk, dk)) * dk ** -0.5
        k = l2norm(k.reshape(T, nk, dk))
        v = v.reshape(T, nv, dv)
        q, k = q.repeat_interleave(r, dim=1), k.repeat_interleave(r, dim=1)
        beta = torch.sigmoid(b)
        g = -torch.exp(W[p + ".A_log"]) * F.softplus(a + W[p + ".dt_bias"])
        if self.gdn_stats is not None:
            self.gdn_stats.append((g.detach(), beta.detach()))
        o = self.delta_rule(q, k, v, g, beta)                       # [T, nv, dv]
        o = q3.rms_norm(o, W[p + ".norm.weight"], self.eps) * F.silu(z)  # Qwen3NextRMSNormGated
        return self.lin(o.reshape(T, nv * dv), p + ".out_proj")

    def moe(self, x, p, replay_ids=None):
        """Qwen3NextSparseMoeBlock: qwen3_ref's routed experts (softmax, top-k, renormalised iff
        norm_topk_prob, replay) plus sigmoid(shared_expert_gate(x)) * shared_expert(x)."""
        out, ids, probs = super().moe(x, p, replay_ids)
        shared = q3.swiglu_mlp(x, self, p + ".shared_expert")
        return out + torch.sigmoid(self.lin(x, p + ".shared_expert_gate")) * shared, ids, probs

    def forward(self, tokens, replay=None):
        """Returns (log-softmax [T, V], experts [T][m][k], router_probs [T][m][k+1]).
        replay: None, or a LongTensor [T, n_moe_layers, k] of expert ids."""
        T = len(tokens)
        x = self.W[self.prefix + "embed_tokens.weight"][torch.tensor(tokens, dtype=torch.long)]
        # Qwen3.5: HF's interleaved M-RoPE with text-only input is this plain RoPE (see
        # rope_theta's note)
        # YaRN (rope_scaling, or rope_parameters' rope_type yarn): qwen3_ref's, over the rotated
        # dims as HF's _compute_yarn_parameters takes them (head_dim * partial_rotary_factor)
        cos, sin = q3.rope_cos_sin(T, self.rotary_dim, rope_theta(self.cfg),
                                   dict(self.cfg, max_position_embeddings=self.cfg.get("max_position_embeddings", 32768)))
        experts, rprobs = [[] for _ in range(T)], [[] for _ in range(T)]
        for i in range(self.L):
            p = f"{self.prefix}layers.{i}"
            h = rms_norm0(x, self.W[p + ".input_layernorm.weight"], self.eps)
            if self.types[i] == "linear_attention":
                x = x + self.gated_deltanet(h, p + ".linear_attn")
            else:
                x = x + self.attention(h, p + ".self_attn", cos, sin)
            h = rms_norm0(x, self.W[p + ".post_attention_layernorm.weight"], self.eps)
            if i in self.moe_layers:
                m = self.moe_layers.index(i)
                y, ids, pr = self.moe(h, p + ".mlp", None if replay is None else replay[:, m, :])
                for t in range(T):
                    experts[t].append(ids[t].tolist())
                    rprobs[t].append(pr[t].tolist())
            else:
                y = q3.swiglu_mlp(h, self, p + ".mlp")
            x = x + y
        x = rms_norm0(x, self.W[self.prefix + "norm.weight"], self.eps)
        return torch.log_softmax(self.lin(x, "lm_head"), dim=-1), experts, rprobs


# ---------------------------------------------------------------------------
# merge
# ---------------------------------------------------------------------------

def merged_weights(model):
    """qwen3_ref's merged_weights under the model's prefix: W += scale * B @ A for every adapted
    module (float64), in the model's (per-expert) layout, then every Qwen3.5 ParamWrapper's delta
    into the per-expert weights (gate / up += scale * B_e[:I] / B_e[I:] @ A_e, down += scale *
    B_e @ A_e); a tied model with an lm_head adapter is untied (lm_head.weight = embedding +
    delta). Returns ([(name, tensor)], untied)."""
    W = {n: model.W[n].detach().clone() for n in model.checkpoint_names()}
    untied = model.tied and "lm_head" in model.lora
    if untied:
        W["lm_head.weight"] = W[model.prefix + "embed_tokens.weight"].clone()
    for m, scale in model.lora.items():
        an, bn = q3.lora_names(m)
        wn = "lm_head.weight" if m == "lm_head" else m + ".weight"
        W[wn] = W[wn] + scale * (model.W[bn] @ model.W[an])
    with torch.no_grad():  # Qwen3.5's ParamWrappers: gate / up += scale * B_e[:I / I:] @ A_e, down
        for name, specs in model.plin.items():
            for w, e, rows in specs:
                A, B = param_factors(model.W, w, model.n_experts, e, rows)
                W[name + ".weight"] = W[name + ".weight"] + w.scale * (B @ A)
    return list(W.items()), untied


def cmd_merge(args):
    """qwen3_next: qwen3_ref's merge. Qwen3.5: the same, written in the checkpoint's layout (the
    routed experts stacked back, to_hf) with the model's config.json (torch_dtype float32; untied:
    tie_word_embeddings false wherever it is set); no mtp.* or model.visual.* tensors."""
    with open(os.path.join(args.model, "config.json")) as f:
        cfg = json.load(f)
    if cfg.get("model_type") not in Q35_TYPES:
        return q3.cmd_merge(args, Qwen3NextModel)
    model = Qwen3NextModel(args.model, adapter=args.adapter)
    tensors, untied = merged_weights(model)
    text = cfg["text_config"] if cfg.get("model_type") == "qwen3_5_moe" else cfg
    for c in (cfg, text):
        c["torch_dtype"] = "float32"
        if "dtype" in c:
            c["dtype"] = "float32"
        if untied and (c is text or "tie_word_embeddings" in c):
            c["tie_word_embeddings"] = False
    hf = to_hf(dict(tensors), cfg)
    q3.write_model(args.out, cfg, hf, "f32", 1)
    print(f"merge: {len(model.lora)} adapted modules, {len(model.param_lora)} adapted stacked "
          f"parameters -> {args.out} ({len(hf)} tensors, F32{', lm_head untied' if untied else ''})")


# ---------------------------------------------------------------------------
# selfcheck-grad
# ---------------------------------------------------------------------------

SELFCHECK_SET = {"vocab_size": 13, "hidden_size": 16, "intermediate_size": 7,
                 "num_hidden_layers": 2, "layer_types": ["linear_attention", "full_attention"],
                 "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
                 "partial_rotary_factor": 0.5,
                 "linear_num_key_heads": 2, "linear_key_head_dim": 4, "linear_num_value_heads": 4,
                 "linear_value_head_dim": 3, "linear_conv_kernel_dim": 4,
                 "num_experts": 12, "moe_intermediate_size": 6, "num_experts_per_tok": 2,
                 "shared_expert_intermediate_size": 5}
FULL_FIRST = ["full_attention", "linear_attention"]

# (replay, tied, lora, config overrides)
SELFCHECK_CASES = [
    (False, False, None, {}),
    (True, False, None, {"mlp_only_layers": [0]}),
    (True, True, None, {"attention_bias": True, "norm_topk_prob": False, "layer_types": FULL_FIRST}),
    (False, False, None, {"linear_num_value_heads": 2, "mlp_only_layers": [1]}),
    (False, False, "lora", {"attention_bias": True}),
    (True, True, "rslora", {"mlp_only_layers": [0], "layer_types": FULL_FIRST}),
]
T_SELFCHECK = 9
# Qwen3.5 (qwen3_5_moe_text; qwen3_5_moe is checked equal to it, selfcheck_q35_composite):
# SELFCHECK_SET's sizes, RoPE on half of each head through rope_parameters, every layer MoE
Q35_SELFCHECK_SET = dict(
    {k: v for k, v in SELFCHECK_SET.items() if k not in ("intermediate_size", "partial_rotary_factor")},
    rope_parameters=dict(Q35_TEXT_BASE["rope_parameters"], partial_rotary_factor=0.5))
R4 = {"linear_num_key_heads": 1, "linear_key_head_dim": 5}  # 4 value heads per key head, dk != dv
Q35_SELFCHECK_CASES = [
    (False, False, None, {}),
    (True, True, None, {"attention_bias": True, "layer_types": FULL_FIRST}),
    (False, False, None, {"linear_num_value_heads": 2}),
    (False, False, "lora", {"attention_bias": True}),
    (True, True, "rslora", dict(R4, layer_types=FULL_FIRST)),
]


def selfcheck_config(arch, over, tied=False):
    """The selfcheck's tiny config (flat()) of arch with the overrides."""
    if arch == "qwen3_next":
        return build_config(dict(SELFCHECK_SET, tie_word_embeddings=tied, **over), "f32")
    return flat(build_q35_config(dict(Q35_SELFCHECK_SET, tie_word_embeddings=tied, **over), "f32",
                                 arch))


def selfcheck_case(replay, tied, seed, lora, over, arch="qwen3_next"):
    cfg = selfcheck_config(arch, over, tied)
    base_w = dict(make_weights(cfg, seed, std=0.3))  # large std: sizeable gradients everywhere
    model = Qwen3NextModel(cfg=cfg, weights=base_w)
    fails = []
    if lora:
        targets = Q35_LORA_TARGETS if is_q35(cfg) else LORA_TARGETS
        model, lora_fails = q3.selfcheck_lora(model, base_w, targets, seed, lora)
        fails += lora_fails
    types = layer_types(cfg)
    lin_l, full_l = types.index("linear_attention"), types.index("full_attention")
    P = prefix_of(cfg)
    la, fa = f"{P}layers.{lin_l}.linear_attn", f"{P}layers.{full_l}.self_attn"
    moe = model.moe_layers
    dense = [i for i in range(cfg["num_hidden_layers"]) if i not in moe]
    in_projs = (("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a") if is_q35(cfg)
                else ("in_proj_qkvz", "in_proj_ba"))

    def kinds_of(grads, visited):
        def expert(m, part):  # the visited expert with the largest down_proj gradient
            layer = moe[m]

            def down(e):
                n = f"{P}layers.{layer}.mlp.experts.{e}.down_proj"
                return grads[q3.lora_names(n)[1] if lora else n + ".weight"].norm()
            return f"{P}layers.{layer}.mlp.experts.{max(visited[m], key=down)}.{part}"
        mods = [(n, f"{la}.{n}") for n in in_projs] + [
                ("out_proj", la + ".out_proj"),
                ("q_proj", fa + ".q_proj"), ("k_proj", fa + ".k_proj"),
                ("v_proj", fa + ".v_proj"), ("o_proj", fa + ".o_proj")]
        for m, layer in enumerate(moe):
            x = f"{P}layers.{layer}.mlp"
            mods += [(f"expert {part} (layer {layer})", expert(m, part)) for part in EXPERT_PARTS]
            mods += [(f"shared {part} (layer {layer})", f"{x}.shared_expert.{part}")
                     for part in EXPERT_PARTS]
            mods.append((f"shared_expert_gate (layer {layer})", f"{x}.shared_expert_gate"))
        for layer in dense:
            mods += [(f"dense {part} (layer {layer})", f"{P}layers.{layer}.mlp.{part}")
                     for part in EXPERT_PARTS]
        if lora:
            return [(f"{kind} lora_{ab}", nm) for kind, m in mods + [("lm_head", "lm_head")]
                    for ab, nm in zip("AB", q3.lora_names(m))]
        kinds = [(kind, m + ".weight") for kind, m in mods]
        kinds += [("embed", P + "embed_tokens.weight"),
                  ("conv1d", la + ".conv1d.weight"), ("A_log", la + ".A_log"),
                  ("dt_bias", la + ".dt_bias"), ("gated norm", la + ".norm.weight"),
                  ("q_norm", fa + ".q_norm.weight"), ("k_norm", fa + ".k_norm.weight"),
                  ("final norm", P + "norm.weight"),
                  ("lm_head", P + "embed_tokens.weight" if tied else "lm_head.weight")]
        for i in range(cfg["num_hidden_layers"]):
            kinds += [(f"input_layernorm {i}", f"{P}layers.{i}.input_layernorm.weight"),
                      (f"post_attention_layernorm {i}",
                       f"{P}layers.{i}.post_attention_layernorm.weight")]
        kinds += [(f"router (layer {layer})", f"{P}layers.{layer}.mlp.gate.weight") for layer in moe]
        if get(cfg, "attention_bias"):
            kinds += [(f"{p} bias", f"{fa}.{p}.bias") for p in ("q_proj", "k_proj", "v_proj", "o_proj")]
        return kinds
    worst, checked, gfails, visited, noise = q3.selfcheck_grads(
        model, seed, replay, kinds_of, T=T_SELFCHECK, n_entries=3)
    unvisited = sum(model.n_experts - len(v) for v in visited)
    return worst, checked, fails + gfails, visited, noise, unvisited, cfg


def selfcheck_chunked(seed):
    """HF's chunked form vs the recurrence on random inputs (T 150 and 3; chunks 64 and 4): the
    worst |difference| relative to the largest |output|. Returns [(what, rel)]."""
    g_ = torch.Generator().manual_seed(seed)
    out = []
    for T in (150, 3):
        Hv, dk, dv = 3, 5, 4
        q = l2norm(torch.randn(T, Hv, dk, generator=g_, dtype=DT)) * dk ** -0.5
        k = l2norm(torch.randn(T, Hv, dk, generator=g_, dtype=DT))
        v = torch.randn(T, Hv, dv, generator=g_, dtype=DT)
        g = -torch.rand(T, Hv, generator=g_, dtype=DT) * 1.5   # exp(g) in (0.22, 1]
        beta = torch.rand(T, Hv, generator=g_, dtype=DT)
        ref = recurrent_gated_delta_rule(q, k, v, g, beta)
        for chunk in (64, 4):
            got = chunk_gated_delta_rule(q, k, v, g, beta, chunk)
            out.append((f"T {T} chunk {chunk}", ((got - ref).abs().max() / ref.abs().max()).item()))
    return out


def selfcheck_model_chunked(seed):
    """The base model (make-model's init, std 0.1) over 300 tokens: log-probs with the chunked
    form (64) vs the recurrent one; the conv vs F.conv1d with HF's padding. Returns (max |d
    logprob|, conv max |d|, decay summary)."""
    cfg = build_config({}, "f32")
    model = Qwen3NextModel(cfg=cfg, weights=dict(make_weights(cfg, seed, std=0.1)))
    tokens = np.random.default_rng(seed).integers(0, cfg["vocab_size"], 300).tolist()
    with torch.no_grad():
        lr, _, _ = model.forward(tokens)
        model.delta_rule = chunk_gated_delta_rule
        lc, _, _ = model.forward(tokens)
        model.delta_rule = recurrent_gated_delta_rule
    summary = decay_summary(model, tokens)
    g_ = torch.Generator().manual_seed(seed)
    x = torch.randn(7, 5, generator=g_, dtype=DT)
    w = torch.randn(5, 1, 4, generator=g_, dtype=DT)
    hf = F.silu(F.conv1d(x.T[None], w, None, padding=3, groups=5)[..., :7])[0].T
    return (lr - lc).abs().max().item(), (causal_conv_silu(x, w) - hf).abs().max().item(), summary


def selfcheck_reader(seed):
    """The reader: a checkpoint with mtp.* tensors loads; an extra, a missing and a misshapen
    tensor are refused. Returns failures."""
    cfg = build_config(dict(SELFCHECK_SET), "f32")
    tensors = make_weights(cfg, seed, std=0.1, mtp=True)
    fails = []
    with tempfile.TemporaryDirectory() as tmp:
        def loads(ts, name):
            d = os.path.join(tmp, name)
            q3.write_model(d, cfg, ts, "f32", 1)
            try:
                Qwen3NextModel(d)
            except SystemExit:
                return False
            return True
        if not loads(tensors, "mtp"):
            fails.append("a checkpoint with mtp.* tensors was refused")
        if loads(tensors + [("model.layers.0.linear_attn.conv1d.bias", torch.zeros(28))], "extra"):
            fails.append("a checkpoint with an extra tensor (conv1d.bias) was not refused")
        if loads([(n, t) for n, t in tensors if not n.endswith(".dt_bias")], "missing"):
            fails.append("a checkpoint without dt_bias was not refused")
        if loads([(n, t[:, :, :3] if n.endswith("conv1d.weight") else t) for n, t in tensors], "shape"):
            fails.append("a checkpoint with a misshapen conv1d.weight was not refused")
    return fails


# ---- Qwen3.5 -----------------------------------------------------------------

def probe_line(cfg, seed, T=23):
    """Random tokens (distinct where the vocabulary allows) and coefficients: one grad line."""
    rng = np.random.default_rng(seed)
    V = cfg["vocab_size"]
    tokens = (rng.permutation(V)[:T] if T <= V else rng.integers(0, V, T)).tolist()
    return {"tokens": tokens, "coef": [None] + rng.uniform(-1, 1, T - 1).tolist()}


def max_rel(a, b):
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-300)).item()


class HFStackedExperts(Qwen3NextModel):
    """The routed experts computed as HF's Qwen3_5MoeExperts does, from the stacked tensors in
    self.stacked (gate, up = linear(x, gate_up_proj[e]).chunk(2, -1); down: linear(h,
    down_proj[e])) rather than from the per-expert weights."""
    stacked = None

    def lin(self, x, name):
        parts = name.rsplit(".", 3)  # [<prefix>layers.L.mlp, "experts", E, part]
        if self.stacked is None or len(parts) != 4 or parts[1] != "experts":
            return super().lin(x, name)
        layer, e, part = parts[0], int(parts[2]), parts[3]
        if part == "down_proj":
            return F.linear(x, self.stacked[layer + ".experts.down_proj"][e])
        gate, up = F.linear(x, self.stacked[layer + ".experts.gate_up_proj"][e]).chunk(2, dim=-1)
        return gate if part == "gate_proj" else up


def selfcheck_stacked(seed):
    """The checkpoint's stacked experts against the per-expert layout: log-probs and the stacked
    tensors' autograd gradients of HF's own computation (HFStackedExperts) = the per-expert
    model's log-probs and per-expert gradients rearranged (gate = gate_up_proj[e][:I], up =
    [I:], down = down_proj[e]); to_hf(to_internal(.)) is the identity. Returns (max |d logprob|,
    max rel grad difference, failures)."""
    cfg = selfcheck_config("qwen3_5_moe_text", {})
    hf = dict(make_weights(cfg, seed, std=0.3))
    rec = probe_line(cfg, seed)
    model = Qwen3NextModel(cfg=cfg, weights=hf)
    _, lps, grads = q3.grad_lines(model, [rec], False)
    ref = HFStackedExperts(cfg=cfg, weights=hf)
    ref.stacked = {n: t.to(DT).requires_grad_(True) for n, t in hf.items() if ".mlp.experts." in n}
    logp, _, _ = ref.forward(rec["tokens"])
    lp = q3.token_logprobs(logp, rec["tokens"])
    (q3.parse_coef(rec, len(rec["tokens"]), "probe") * lp).sum().backward()
    dlp = (lp.detach() - torch.tensor(lps[0][1:], dtype=DT)).abs().max().item()
    worst, fails = 0.0, []
    for n, t in ref.stacked.items():
        x = n[:-len(".gate_up_proj")] if n.endswith(".gate_up_proj") else n[:-len(".down_proj")]
        for e in range(t.shape[0]):
            if n.endswith(".gate_up_proj"):
                mine = torch.cat([grads[f"{x}.{e}.gate_proj.weight"], grads[f"{x}.{e}.up_proj.weight"]])
            else:
                mine = grads[f"{x}.{e}.down_proj.weight"]
            d = (t.grad[e] - mine).abs().max().item()
            worst = max(worst, d / max(t.grad.abs().max().item(), 1e-300))
    back = to_hf(to_internal({n: t for n, t in hf.items()}, cfg), cfg)
    if [n for n, _ in back] != list(hf) or any(not torch.equal(t, hf[n]) for n, t in back):
        fails.append("to_hf(to_internal(checkpoint)) is not the checkpoint")
    if dlp > 1e-12 or worst > 1e-12:
        fails.append(f"stacked vs per-expert: |d logprob| {dlp:.1e}, grads rel {worst:.1e}")
    return dlp, worst, fails


def next_to_q35(W, cfg):
    """A Qwen3-Next model's tensors -> the qwen3_5_moe_text model that computes the same function:
    in_proj_qkvz / in_proj_ba's rows permuted (per key head [q, k, v, z] / [b, a] -> q | k | v,
    z, b, a, every one key head major), the routed experts stacked; the rest as it is. Returns
    (checkpoint tensors, {new name: (old name, row index)}) -- the row indices of each new tensor
    together are a permutation of the old tensor's rows."""
    nk, nv = get(cfg, "linear_num_key_heads"), get(cfg, "linear_num_value_heads")
    dk, dv = get(cfg, "linear_key_head_dim"), get(cfg, "linear_value_head_dim")
    r = nv // nk
    w = 2 * dk + 2 * r * dv  # a key head's rows of in_proj_qkvz

    def rows(per, lo, n):  # per key head h, rows [h*per + lo, h*per + lo + n)
        return [h * per + lo + j for h in range(nk) for j in range(n)]
    perm = {"in_proj_qkvz": [("in_proj_qkv",
                              rows(w, 0, dk) + rows(w, dk, dk) + rows(w, 2 * dk, r * dv)),
                             ("in_proj_z", rows(w, 2 * dk + r * dv, r * dv))],
            "in_proj_ba": [("in_proj_b", rows(2 * r, 0, r)), ("in_proj_a", rows(2 * r, r, r))]}
    out, index = {}, {}
    for name, t in W.items():
        src = name.rsplit(".", 2)
        if len(src) == 3 and src[1] in perm:
            parts = perm[src[1]]
            assert sorted(i for _, idx in parts for i in idx) == list(range(t.shape[0]))
            for new, idx in parts:
                out[f"{src[0]}.{new}.weight"] = t[idx]
                index[f"{src[0]}.{new}.weight"] = (name, idx)
        else:
            out[name] = t
    q35 = dict(cfg, model_type="qwen3_5_moe_text")
    return dict(to_hf(out, q35)), index


def selfcheck_permuted(seed):
    """A qwen3_5_moe_text model built from a Qwen3-Next model by next_to_q35 computes the same
    log-probs (1e-12) and routing, and its gradients are the Qwen3-Next model's, rows permuted
    (every other tensor's, the per-expert ones included, equal by name), over key/value head
    ratios 2 (dk 4 != dv 3), 1 and 4, either layer order. Returns (worst |d logprob|, worst rel
    grad difference, failures)."""
    worst_lp, worst_g, fails = 0.0, 0.0, []
    for c, over in enumerate(({}, {"linear_num_value_heads": 2, "layer_types": FULL_FIRST}, R4)):
        nxt = selfcheck_config("qwen3_next", over)
        W = dict(make_weights(nxt, seed + c, std=0.3))
        a = Qwen3NextModel(cfg=nxt, weights=W)
        q35 = selfcheck_config("qwen3_5_moe_text", over)
        hf, index = next_to_q35(W, q35)
        b = Qwen3NextModel(cfg=q35, weights=hf)
        rec = probe_line(q35, seed + c, T=40)
        with torch.no_grad():
            ra, rb = q3.run_forward(a, rec["tokens"]), q3.run_forward(b, rec["tokens"])
        _, _, ga = q3.grad_lines(a, [rec], False)
        _, _, gb = q3.grad_lines(b, [rec], False)
        d = max(abs(x - y) for x, y in zip(ra["logprobs"][1:], rb["logprobs"][1:]))
        worst_lp = max(worst_lp, d)
        if ra["experts"] != rb["experts"]:
            fails.append(f"case {c}: the routing differs")
        if sorted(gb) != sorted(set(ga) - {n for n, _ in index.values()} | set(index)):
            fails.append(f"case {c}: gradient names differ")
            continue
        for n, g in gb.items():
            old = ga[index[n][0]][index[n][1]] if n in index else ga[n]
            if old.abs().max() > 0:
                worst_g = max(worst_g, max_rel(g, old))
            elif g.abs().max() > 0:
                worst_g = math.inf
    if worst_lp > 1e-12 or worst_g > 1e-12:
        fails.append(f"Qwen3-Next vs permuted Qwen3.5: |d logprob| {worst_lp:.1e}, grads rel "
                     f"{worst_g:.1e}")
    return worst_lp, worst_g, fails


def to_composite(W):
    """A qwen3_5_moe_text model's tensor (or PEFT) names -> qwen3_5_moe's."""
    def ren(n):
        for a, b in (("base_model.model.model.", "base_model.model.model.language_model."),
                     ("model.", "model.language_model.")):
            if n.startswith(a):
                return b + n[len(a):]
        return n
    return {ren(n): t for n, t in W.items()}


def selfcheck_q35_composite(seed):
    """qwen3_5_moe (the composite config, tensors under model.language_model., a vision tensor and
    mtp.* ones to skip) computes exactly what qwen3_5_moe_text does with the same tensors: log-probs,
    routing, gradients (renamed), and with a LoRA adapter on every target (renamed) its gradients
    and the float64 merge (untied: lm_head adapted on a tied model); tie_word_embeddings from the
    top level where it is set, else text_config's. Returns failures."""
    fails = []
    for tied in (False, True):
        text = selfcheck_config("qwen3_5_moe_text", {}, tied)
        comp_file = build_q35_config(dict(Q35_SELFCHECK_SET, tie_word_embeddings=tied), "f32",
                                     "qwen3_5_moe")
        comp = flat(comp_file)
        Wt = dict(make_weights(text, seed, std=0.3))
        Wc = dict(make_weights(comp_file, seed, std=0.3, mtp=True))  # + mtp.*, model.visual.*
        extra = set(MTP_NAMES) | {VISUAL_DUMMY[0]}
        if ({n: t for n, t in Wc.items() if n not in extra}.keys() != to_composite(Wt).keys()
                or any(not torch.equal(t, Wc[n]) for n, t in to_composite(Wt).items())):
            fails.append(f"tied={tied}: make-model's qwen3_5_moe tensors are not qwen3_5_moe_text's "
                         "renamed")
        rec = probe_line(text, seed, T=17)
        mods, lw = q3.make_lora_weights(text, list(Q35_LORA_TARGETS), 3, seed, 0.3,
                                        linear_modules(text))
        lw = dict(lw)
        for lora in (False, True):
            ad_t = ({m: 2.0 for m in mods}, lw) if lora else None
            ad_c = ({n[len("base_model.model."):-len(".lora_A.weight")]: 2.0
                     for n in to_composite(lw) if n.endswith(".lora_A.weight")},
                    to_composite(lw)) if lora else None
            mt = Qwen3NextModel(cfg=text, weights=Wt, adapter=ad_t)
            mc = Qwen3NextModel(cfg=comp_file, weights=Wc, adapter=ad_c)
            with torch.no_grad():
                rt, rc = q3.run_forward(mt, rec["tokens"]), q3.run_forward(mc, rec["tokens"])
            _, _, gt = q3.grad_lines(mt, [rec], False, mt.lora_names if lora else None)
            _, _, gc = q3.grad_lines(mc, [rec], False, mc.lora_names if lora else None)
            what = f"tied={tied} lora={lora}"
            if rt != rc:
                fails.append(f"{what}: composite forward differs from qwen3_5_moe_text's")
            gt = to_composite(gt)
            if sorted(gt) != sorted(gc) or any(not torch.equal(gt[n], gc[n]) for n in gc):
                fails.append(f"{what}: composite gradients differ from qwen3_5_moe_text's (renamed)")
            if lora:
                merged, untied = merged_weights(mc)
                if untied != tied:
                    fails.append(f"{what}: merge untied {untied}")
                mm = Qwen3NextModel(cfg=dict(comp, tie_word_embeddings=False) if untied else comp,
                                    weights=dict(merged))
                with torch.no_grad():
                    lm = q3.run_forward(mm, rec["tokens"])["logprobs"][1:]
                d = max(abs(x - y) for x, y in zip(lm, rc["logprobs"][1:]))
                if d > 1e-12:
                    fails.append(f"{what}: merged composite differs from the adapter by {d:.1e}")
                mt_merged, _ = merged_weights(mt)
                qt_merged, _ = q3.merged_weights(mt)
                if [n for n, _ in mt_merged] != [n for n, _ in qt_merged] or any(
                        not torch.equal(a, b) for (_, a), (_, b) in zip(mt_merged, qt_merged)):
                    fails.append(f"{what}: merged_weights differs from qwen3_ref's")
    # tie_word_embeddings: the top level's where set, else text_config's
    base = build_q35_config(dict(Q35_SELFCHECK_SET), "f32", "qwen3_5_moe")
    for top, txt, want in ((False, True, False), (None, True, True), (True, False, True),
                           (None, False, False)):
        c = copy.deepcopy(base)
        c["text_config"]["tie_word_embeddings"] = txt
        if top is None:
            c.pop("tie_word_embeddings", None)
        else:
            c["tie_word_embeddings"] = top
        if bool(get(flat(c), "tie_word_embeddings")) != want:
            fails.append(f"tie_word_embeddings top {top} text {txt}: not {want}")
    return fails


def selfcheck_q35_reader(seed):
    """Reading Qwen3.5 checkpoints from files: qwen3_5_moe with model.visual.* and mtp.* tensors,
    sharded, loads and computes what the tensors in memory do; qwen3_5_moe_text with a
    model.visual.* tensor loads; refused: the per-expert layout in a checkpoint, qwen3_5_moe's
    tensors under qwen3_5_moe_text's names, an extra, a missing and a misshapen tensor. Returns
    failures."""
    fails = []
    comp = build_q35_config(dict(Q35_SELFCHECK_SET), "f32", "qwen3_5_moe")
    text = build_q35_config(dict(Q35_SELFCHECK_SET), "f32", "qwen3_5_moe_text")
    tc = make_weights(comp, seed, std=0.1, mtp=True)
    tt = make_weights(text, seed, std=0.1)
    with tempfile.TemporaryDirectory() as tmp:
        def loads(cfg, ts, name, shards=1):
            d = os.path.join(tmp, name)
            q3.write_model(d, cfg, ts, "f32", shards)
            try:
                return Qwen3NextModel(d)
            except SystemExit:
                return None
        m = loads(comp, tc, "comp", shards=3)
        if m is None:
            fails.append("qwen3_5_moe with model.visual.* and mtp.* tensors, 3 shards, refused")
        else:
            tokens = list(range(10))
            with torch.no_grad():
                same = (q3.run_forward(m, tokens)
                        == q3.run_forward(Qwen3NextModel(cfg=comp, weights=dict(tc)), tokens))
            if not same:
                fails.append("qwen3_5_moe read from files differs from its tensors in memory")
        if loads(text, tt + [(VISUAL_DUMMY[0], torch.zeros(VISUAL_DUMMY[1]))], "text_vis") is None:
            fails.append("qwen3_5_moe_text with a model.visual.* tensor refused")
        per_expert = [(n, t.float()) for n, t in to_internal(dict(tt), text).items()]
        if loads(text, per_expert, "per_expert") is not None:
            fails.append("a checkpoint with per-expert routed experts was not refused")
        if loads(comp, tt, "text_names") is not None:
            fails.append("qwen3_5_moe with model.layers.* (not model.language_model.*) names "
                         "not refused")
        if loads(text, tt + [("model.layers.0.linear_attn.in_proj_qkvz.weight", torch.zeros(4, 16))],
                 "extra") is not None:
            fails.append("an extra tensor (in_proj_qkvz) was not refused")
        if loads(text, [(n, t) for n, t in tt if not n.endswith(".in_proj_b.weight")],
                 "missing") is not None:
            fails.append("a checkpoint without in_proj_b was not refused")
        if loads(text, [(n, t[:, :-1] if n.endswith("gate_up_proj") else t) for n, t in tt],
                 "shape") is not None:
            fails.append("a misshapen gate_up_proj was not refused")
    return fails


class PeftParamsCheckModel(Qwen3NextModel):
    """selfcheck_q35_peft_params' model: qwen3_ref's selfcheck_grads zero-checks the per-expert
    module adapters' tensors of unrouted experts over EXPERT_PROJ; a target_parameters adapter has
    none (kinds_of checks the wrappers' expert slices instead), so EXPERT_PROJ reads () outside
    moe(), where qwen3_ref's routed experts take their projection names from it."""
    EXPERT_PROJ = ()

    def moe(self, x, p, replay_ids=None):
        self.EXPERT_PROJ = EXPERT_PARTS
        try:
            return super().moe(x, p, replay_ids)
        finally:
            del self.EXPERT_PROJ


# (rank_pattern, alpha_pattern) of selfcheck_q35_peft_params' adapter (r 2, lora_alpha 6)
Q35_PEFT_PATTERNS = ({"layers.1.mlp.experts.gate_up_proj": 3, "q_proj": 4},
                     {"down_proj": 5, "gate_up_proj": 4})


def selfcheck_q35_peft_params(seed):
    """A PEFT-native Qwen3.5 adapter (qwen3_5_moe_text; target_parameters: a ParamWrapper on both
    stacked expert parameters, r 2 with layer 1's gate_up_proj r 3 by rank_pattern, alphas by
    alpha_pattern; q_proj (r 4 by rank_pattern), o_proj, in_proj_z and lm_head modules) written to
    a folder and read back: the names and r / scale the reader finds; refused: a folder with an
    extra tensor, one with a wrapper's tensor missing, one with gate_up_proj's and down_proj's
    tensors swapped, a one-parameter adapter under the inner (base_layer) names, the adapter on a
    qwen3_next model; read: a one-parameter (down_proj) adapter under PEFT's names; autograd vs
    finite differences on its tensors, the A / B slices of the experts never routed to exactly
    zero; its function equal (1e-12) to the per-expert module adapter built from it (gate: A_e,
    B_e[:I]; up: A_e, B_e[I:]; down: A_e, B_e), to the base + PEFT's einsum delta on the stacked
    parameters with the module adapters, to merge's float64 model (stacked back as merge writes
    it), and to the form trill saves (gate_up_proj block-diagonal rank 2r: A'_e = [A_e; A_e],
    B'_e = [[B_e[:I], 0], [0, B_e[I:]]], rank_pattern 2r / alpha_pattern 2 alpha); the same adapter
    under qwen3_5_moe's names on the composite model computes the same log-probs and gradients.
    Returns (worst rel err, entries checked, unrouted (layer, expert) pairs, failures)."""
    cfg = selfcheck_config("qwen3_5_moe_text", {})
    E, I = get(cfg, "num_experts"), get(cfg, "moe_intermediate_size")
    P = prefix_of(cfg)
    hf = dict(make_weights(cfg, seed, std=0.3))
    fails = []
    acfg = q3.adapter_config("selfcheck", 2, 6, False, ["q_proj", "o_proj", "in_proj_z", "lm_head"])
    acfg["target_parameters"] = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
    acfg["rank_pattern"], acfg["alpha_pattern"] = (dict(d) for d in Q35_PEFT_PATTERNS)
    tensors = make_adapter_tensors(cfg, acfg, seed + 2000, b_std=0.3)

    def write(d, cfg_, tens):
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "adapter_config.json"), "w") as f:
            json.dump(cfg_, f)
        q3.write_safetensors(os.path.join(d, "adapter_model.safetensors"), tens, "F32")
        return d

    def refused(d, cfg_=cfg, weights=hf):
        try:
            Qwen3NextModel(cfg=cfg_, weights=weights, adapter=d)
        except SystemExit:
            return True
        return False
    pa = lambda layer, inner: (q3.PEFT_PREFIX + f"{P}layers.{layer}.mlp.experts"  # noqa: E731
                               + (".base_layer" if inner else ""))
    with tempfile.TemporaryDirectory() as tmp:
        folder = write(os.path.join(tmp, "a"), acfg, tensors)
        model = PeftParamsCheckModel(cfg=cfg, weights=hf, adapter=folder)
        extra = tensors + [(pa(0, False) + ".lora_C.weight", torch.zeros(1))]
        if not refused(write(os.path.join(tmp, "extra"), acfg, extra)):
            fails.append("an adapter with an extra tensor was not refused")
        missing = [(n, t) for n, t in tensors if n != pa(1, True) + ".lora_B.weight"]
        if not refused(write(os.path.join(tmp, "missing"), acfg, missing)):
            fails.append("an adapter without layer 1's gate_up_proj lora_B was not refused")
        swap = {pa(0, True): pa(0, False), pa(0, False): pa(0, True)}
        swapped = [(swap.get(n.rsplit(".", 2)[0], n.rsplit(".", 2)[0]) + "." + n.rsplit(".", 2)[1]
                    + ".weight", t) for n, t in tensors]
        if not refused(write(os.path.join(tmp, "swapped"), acfg, swapped)):
            fails.append("gate_up_proj's and down_proj's tensors swapped (inner / outer names) "
                         "were not refused")
        one = dict(acfg, target_parameters=["mlp.experts.down_proj"], target_modules=[])
        down = [(n, t) for n, t in tensors if ".mlp.experts.lora_" in n]  # down_proj's (outer)
        try:
            m1 = Qwen3NextModel(cfg=cfg, weights=hf, adapter=write(os.path.join(tmp, "one"), one, down))
            if [w.a for w in m1.param_lora] != [pa(i, False) + ".lora_A.weight" for i in range(2)]:
                fails.append(f"one-parameter adapter: names {[w.a for w in m1.param_lora]}")
        except SystemExit as e:
            fails.append(f"a down_proj-only adapter under PEFT's names was refused: {e}")
        inner = [(n, t) for n, t in tensors if ".base_layer." in n and "layers.0." in n]
        one_g = dict(one, target_parameters=[f"{P}layers.0.mlp.experts.gate_up_proj"])
        if not refused(write(os.path.join(tmp, "inner"), one_g, inner)):
            fails.append("a one-parameter adapter under base_layer names was not refused")
        # gate/up/down_proj in target_modules too: the shared expert's modules, not the routed
        # experts' per-expert ones (their stacked parameters are wrapped)
        sh = dict(acfg, target_modules=acfg["target_modules"] + list(EXPERT_PARTS))
        try:
            ms = Qwen3NextModel(cfg=cfg, weights=hf, adapter=write(
                os.path.join(tmp, "shared"), sh, make_adapter_tensors(cfg, sh, seed + 3000, 0.3)))
            want_sh = {f"{P}layers.{i}.mlp.shared_expert.{part}" for i in range(2) for part in EXPERT_PARTS}
            if set(ms.lora) != set(model.lora) | want_sh or len(ms.param_lora) != 4:
                fails.append(f"gate/up/down_proj also in target_modules: modules {sorted(ms.lora)}, "
                             f"{len(ms.param_lora)} wrappers")
        except SystemExit as e:
            fails.append(f"gate/up/down_proj also in target_modules: refused ({e})")
        nxt = selfcheck_config("qwen3_next", {})
        if not refused(folder, nxt, dict(make_weights(nxt, seed, std=0.3))):
            fails.append("a target_parameters adapter on a qwen3_next model was not refused")
        # qwen3_5_moe: the same adapter under model.language_model.* names, on the composite model
        comp = flat(build_q35_config(dict(Q35_SELFCHECK_SET), "f32", "qwen3_5_moe"))
        mc = Qwen3NextModel(cfg=comp, weights=to_composite(hf), adapter=write(
            os.path.join(tmp, "comp"), acfg, list(to_composite(dict(tensors)).items())))
        rec = probe_line(cfg, seed, T=17)
        with torch.no_grad():
            if q3.run_forward(mc, rec["tokens"]) != q3.run_forward(model, rec["tokens"]):
                fails.append("qwen3_5_moe with the adapter under its names: forward differs")
        _, _, gt = q3.grad_lines(model, [rec], False, model.lora_names)
        _, _, gc = q3.grad_lines(mc, [rec], False, mc.lora_names)
        gt = to_composite(gt)
        if sorted(gt) != sorted(gc) or any(not torch.equal(gt[n], gc[n]) for n in gc):
            fails.append("qwen3_5_moe with the adapter under its names: gradients differ")
    want = {(0, "gate_up_proj"): (2, 4 / 2, pa(0, True)), (0, "down_proj"): (2, 5 / 2, pa(0, False)),
            (1, "gate_up_proj"): (3, 4 / 3, pa(1, True)), (1, "down_proj"): (2, 5 / 2, pa(1, False))}
    got = {(w.layer, w.which): (w.r, w.scale, w.a[:-len(".lora_A.weight")]) for w in model.param_lora}
    want_mods = {f"{P}layers.1.self_attn.q_proj": 6 / 4, f"{P}layers.1.self_attn.o_proj": 3.0,
                 f"{P}layers.0.linear_attn.in_proj_z": 3.0, "lm_head": 3.0}
    if got != want or dict(model.lora) != want_mods:
        fails.append(f"adapter read as {got}, modules {dict(model.lora)}; want {want}, {want_mods}")
    if any(w.b != w.a[:-len("lora_A.weight")] + "lora_B.weight" for w in model.param_lora):
        fails.append("a wrapper's lora_B is not named as its lora_A")
    unrouted = [0]

    def kinds_of(grads, visited):
        kinds = [(f"{m} lora_{ab}", n) for m in want_mods for ab, n in zip("AB", q3.lora_names(m))]
        for w in model.param_lora:
            kinds += [(f"layer {w.layer} {w.which} lora_{ab}", n) for ab, n in (("A", w.a), ("B", w.b))]
            for e in set(range(E)) - set(visited[w.layer]):  # unrouted: exactly zero
                unrouted[0] += w.which == "down_proj"
                ga = grads[w.a].reshape(E, w.r, w.fin)[e]
                gb = grads[w.b].reshape(w.fout, w.r, E)[:, :, e]
                if ga.abs().max() != 0 or gb.abs().max() != 0:
                    fails.append(f"unvisited expert {e}: layer {w.layer} {w.which} A/B slice "
                                 "has a non-zero gradient")
        return kinds
    worst, checked, gfails, visited, _ = q3.selfcheck_grads(model, seed, False, kinds_of,
                                                            T=T_SELFCHECK, n_entries=3)
    fails += gfails
    if not unrouted[0]:
        fails.append(f"every expert was routed to ({visited}): the zero check saw nothing")

    # The same function, four other ways. (1) trill's per-expert modules, from the slicing written
    # out here (not param_factors).
    mods = dict(model.lora)
    lw = {n: model.W[n] for m in mods for n in q3.lora_names(m)}
    pmods, plw = dict(mods), dict(lw)
    for w in model.param_lora:
        A3 = model.W[w.a].reshape(E, w.r, w.fin)
        B3 = model.W[w.b].reshape(w.fout, w.r, E)
        for e in range(E):
            A_e, B_e = A3[e], B3[:, :, e]
            parts = ([("gate_proj", B_e[:I]), ("up_proj", B_e[I:])] if w.which == "gate_up_proj"
                     else [("down_proj", B_e)])
            for part, B_m in parts:
                m = f"{P}layers.{w.layer}.mlp.experts.{e}.{part}"
                pmods[m] = w.scale
                an, bn = q3.lora_names(m)
                plw[an], plw[bn] = A_e.clone(), B_m.clone()
    per_expert = Qwen3NextModel(cfg=cfg, weights=hf, adapter=(pmods, plw))
    # (2) PEFT's einsum delta ("e o i": not transposed) added to the stacked parameters; the
    # module adapters kept.
    hfw = {n: t.to(DT) for n, t in hf.items()}
    for w in model.param_lora:
        delta = w.scale * torch.einsum("ore,eri->eoi", model.W[w.b].reshape(w.fout, w.r, E),
                                       model.W[w.a].reshape(E, w.r, w.fin))
        hfw[w.param] = hfw[w.param] + delta
    einsum = Qwen3NextModel(cfg=cfg, weights=hfw, adapter=(mods, lw))
    # (3) merge's float64 model, stacked back as cmd_merge writes it.
    merged_w, untied = merged_weights(model)
    merged = Qwen3NextModel(cfg=dict(cfg, tie_word_embeddings=False) if untied else cfg,
                            weights=dict(to_hf(dict(merged_w), cfg)))
    # (4) the form trill saves: gate_up_proj's wrapper block-diagonal of rank 2r.
    rp, ap = {}, {}
    bd = {n: model.W[n] for n in model.lora_names}
    for w in model.param_lora:
        if w.which != "gate_up_proj":
            continue
        A3 = model.W[w.a].reshape(E, w.r, w.fin)
        B3 = model.W[w.b].reshape(w.fout, w.r, E)
        B2 = torch.zeros(w.fout, 2 * w.r, E, dtype=DT)
        B2[:I, :w.r], B2[I:, w.r:] = B3[:I], B3[I:]
        bd[w.a] = torch.cat([A3, A3], dim=1).reshape(E * 2 * w.r, w.fin)
        bd[w.b] = B2.reshape(w.fout, 2 * w.r * E)
        rp[w.param] = 2 * w.r
        ap[w.param] = 2 * pattern_value(acfg["alpha_pattern"], w.param, acfg["lora_alpha"])
    bcfg = dict(acfg, rank_pattern=dict(rp, q_proj=4), alpha_pattern=dict(ap, down_proj=5))
    with tempfile.TemporaryDirectory() as tmp:
        saved = Qwen3NextModel(cfg=cfg, weights=hf, adapter=write(
            tmp, bcfg, [(n, bd[n].float()) for n in model.lora_names]))
    base_mods = Qwen3NextModel(cfg=cfg, weights=hf, adapter=(mods, lw))
    probe = list(range(cfg["vocab_size"]))
    with torch.no_grad():
        la = model.forward(probe)[0]
        for what, other in (("per-expert module adapter", per_expert),
                            ("base + einsum delta", einsum), ("merged model", merged),
                            ("trill's saved form (block-diagonal 2r)", saved)):
            d = (la - other.forward(probe)[0]).abs().max().item()
            if d > 1e-12:
                fails.append(f"{what} differs from the target_parameters adapter: {d:.2e}")
        d = (la - base_mods.forward(probe)[0]).abs().max().item()
        if d < 1e-3:
            fails.append(f"the ParamWrappers change the forward by only {d:.2e}")
    return worst, checked, unrouted[0], fails


def hf_mrope_cos_sin(pos3, rd, theta, section):
    """HF Qwen3_5MoeTextRotaryEmbedding's cos / sin (float64) for position streams pos3 [3, T]:
    each stream's freqs, then recomposition_frequencies (interleaved M-RoPE)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, rd, 2, dtype=DT) / rd))
    freqs = pos3.to(DT)[:, :, None] * inv_freq  # [3, T, rd/2]
    thw = freqs[0].clone()
    for dim, offset in enumerate((1, 2), start=1):
        idx = slice(offset, section[dim] * 3, 3)
        thw[..., idx] = freqs[dim, ..., idx]
    emb = torch.cat((thw, thw), dim=-1)
    return emb.cos()[:, None, :], emb.sin()[:, None, :]


def selfcheck_mrope():
    """Interleaved M-RoPE (Qwen3.5's released rope: head_dim 256, factor 0.25, mrope_section
    [11, 11, 10]) with the three streams equal (text) is plain RoPE exactly; with distinct streams
    it is not (the check sees the recomposition). Returns (d equal, d distinct)."""
    T, rd, theta = 50, 64, 1e7
    pos = torch.arange(T)
    cos, sin = q3.rope_cos_sin(T, rd, theta)
    c1, s1 = hf_mrope_cos_sin(pos.expand(3, T), rd, theta, [11, 11, 10])
    c2, s2 = hf_mrope_cos_sin(torch.stack([pos, pos // 2, pos % 7]), rd, theta, [11, 11, 10])
    return (max((c1 - cos).abs().max().item(), (s1 - sin).abs().max().item()),
            max((c2 - cos).abs().max().item(), (s2 - sin).abs().max().item()))


def selfcheck_q35(args):
    """The Qwen3.5 part of selfcheck-grad; prints its lines, returns whether all passed."""
    ok, unvisited = True, 0

    def report(line, fails):
        print(f"{line}  {'ok' if not fails else 'FAIL'}")
        for f_ in fails:
            print("  " + f_)
        return not fails
    for c, (rp, tied, lora, over) in enumerate(Q35_SELFCHECK_CASES):
        worst, checked, fails, visited, noise, unv, cfg = selfcheck_case(
            rp, tied, args.seed + 100 + c, lora, over, arch="qwen3_5_moe_text")
        unvisited += unv
        desc = " ".join(f"{k}={json.dumps(v, separators=(',', ':'))}" for k, v in over.items())
        ok &= report(
            f"selfcheck-grad qwen3_5_moe_text replay={str(rp).lower():5s} tied={str(tied).lower():5s} "
            f"lora={lora or 'none':6s} layers {''.join(t[0] for t in layer_types(cfg))} "
            f"r={get(cfg, 'linear_num_value_heads') // get(cfg, 'linear_num_key_heads')} {desc}: "
            f"{checked} entries, worst rel err {worst:.2e} (fd rounding ~{noise:.0e} abs), "
            f"experts visited {visited}", fails)
    ok &= report(f"selfcheck-grad qwen3_5_moe_text: {unvisited} (layer, expert) pairs never routed "
                 "to, their gradients exactly zero",
                 [] if unvisited else ["every expert was routed to: the zero check saw nothing"])
    dlp, dg, fails = selfcheck_stacked(args.seed)
    ok &= report("selfcheck Qwen3.5 stacked experts (HF's gate_up_proj chunk / down_proj) vs per "
                 f"expert: max |d logprob| {dlp:.1e}, gradients max rel {dg:.1e}", fails)
    dlp, dg, fails = selfcheck_permuted(args.seed)
    ok &= report("selfcheck Qwen3-Next in_proj_qkvz/ba rows permuted into Qwen3.5's in_proj_qkv/z/b/a "
                 f"(r 2, 1, 4): max |d logprob| {dlp:.1e}, gradients (permuted back) max rel "
                 f"{dg:.1e}", fails)
    ok &= report("selfcheck qwen3_5_moe (composite) = qwen3_5_moe_text: forward, gradients, LoRA on "
                 "every target, merge, tie_word_embeddings", selfcheck_q35_composite(args.seed))
    ok &= report("selfcheck Qwen3.5 reader (model.visual.*, mtp.* skipped; per-expert, misnamed, "
                 "extra, missing, misshapen refused)", selfcheck_q35_reader(args.seed))
    worst, checked, unr, fails = selfcheck_q35_peft_params(args.seed + 200)
    ok &= report("selfcheck-grad qwen3_5_moe_text target_parameters adapter (PEFT ParamWrapper on "
                 "gate_up_proj and down_proj, r 2 / rank_pattern 3, alpha_pattern; q_proj r 4, "
                 f"o_proj, in_proj_z, lm_head modules): {checked} entries, worst rel err {worst:.2e}, "
                 f"{unr} unrouted (layer, expert) slices exactly zero; read / refused as PEFT names "
                 "them; = per-expert modules, einsum delta, merge, trill's block-diagonal 2r form, "
                 "qwen3_5_moe's names", fails)
    d_eq, d_ne = selfcheck_mrope()
    ok &= report(f"selfcheck interleaved M-RoPE, equal streams vs plain RoPE: {d_eq:.1e} (distinct "
                 f"streams: {d_ne:.2g})", [] if d_eq == 0 and d_ne > 1e-3 else ["M-RoPE check"])
    return ok


def cmd_selfcheck_grad(args):
    ok = True
    unvisited = 0
    for c, (rp, tied, lora, over) in enumerate(SELFCHECK_CASES):
        worst, checked, fails, visited, noise, unv, cfg = selfcheck_case(rp, tied, args.seed + c,
                                                                         lora, over)
        unvisited += unv
        desc = " ".join(f"{k}={json.dumps(v, separators=(',', ':'))}" for k, v in over.items())
        print(f"selfcheck-grad replay={str(rp).lower():5s} tied={str(tied).lower():5s} "
              f"lora={lora or 'none':6s} layers {''.join(t[0] for t in layer_types(cfg))} "
              f"r={get(cfg, 'linear_num_value_heads') // get(cfg, 'linear_num_key_heads')} {desc}: "
              f"{checked} entries, worst rel err {worst:.2e} (fd rounding ~{noise:.0e} abs), "
              f"experts visited {visited}  {'ok' if not fails else 'FAIL'}")
        for f_ in fails:
            print("  " + f_)
        ok &= not fails
    if unvisited == 0:
        print("selfcheck-grad: every expert was routed to in every case: the zero check saw "
              "nothing  FAIL")
        ok = False
    else:
        print(f"selfcheck-grad: {unvisited} (layer, expert) pairs never routed to, their gradients "
              "exactly zero  ok")
    rels = selfcheck_chunked(args.seed)
    ch_ok = all(r <= 1e-12 for _, r in rels)
    print("selfcheck chunked (HF torch_chunk_gated_delta_rule's equations) vs recurrent: "
          + ", ".join(f"{w}: {r:.1e}" for w, r in rels) + f"  {'ok' if ch_ok else 'FAIL'}")
    ok &= ch_ok
    d, dconv, summary = selfcheck_model_chunked(args.seed)
    m_ok = d <= 1e-12 and dconv <= 1e-14
    print(f"selfcheck base model, 300 tokens: chunked vs recurrent max |d logprob| {d:.1e}; "
          f"conv vs F.conv1d {dconv:.1e}; {summary}  {'ok' if m_ok else 'FAIL'}")
    ok &= m_ok
    fails = selfcheck_reader(args.seed)
    print(f"selfcheck reader (mtp.* ignored; extra, missing, misshapen refused): "
          f"{'ok' if not fails else 'FAIL'}")
    for f_ in fails:
        print("  " + f_)
    ok &= not fails
    ok &= selfcheck_q35(args)
    print("selfcheck-grad: PASS" if ok else "selfcheck-grad: FAIL")
    return 0 if ok else 1


def cmd_replay_config(args):
    """DIR2/config.json: a qwen3_next config with the model's routing shape (vocab_size,
    num_hidden_layers, MoE layers, num_experts, num_experts_per_tok), for gen_train_inputs.py
    --replay-model, which reads the MoE layers by model_type and knows no Qwen3.5 type (its
    records depend on nothing else)."""
    with open(os.path.join(args.model, "config.json")) as f:
        cfg = flat(json.load(f))
    check_config(cfg)
    L = cfg["num_hidden_layers"]
    moe = [i for i in range(L) if is_moe_layer(cfg, i)]
    out = {"model_type": "qwen3_next", "vocab_size": cfg["vocab_size"], "num_hidden_layers": L,
           "num_experts": get(cfg, "num_experts"),
           "num_experts_per_tok": get(cfg, "num_experts_per_tok"), "decoder_sparse_step": 1,
           "mlp_only_layers": [i for i in range(L) if i not in moe]}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(out, f, indent=2)
        f.write("\n")
    print(f"replay-config: {args.out}/config.json ({len(moe)} MoE layers, top-"
          f"{out['num_experts_per_tok']} of {out['num_experts']})")


def main(argv=None):
    ap = q3.arg_parser(__doc__)
    sub = next(a for a in ap._actions if a.dest == "cmd")
    sub.choices["make-model"].add_argument(
        "--mtp", action="store_true", help="also write dummy mtp.* tensors (ignored on load)")
    sub.choices["make-model"].add_argument(
        "--arch", choices=ARCHS, default="qwen3_next",
        help="model_type: qwen3_next (default), qwen3_5_moe (composite) or qwen3_5_moe_text")
    ma = sub.choices["make-adapter"]
    ma.add_argument("--peft-params", action="store_true",
                    help="Qwen3.5: gate_proj / up_proj / down_proj as PEFT's target_parameters "
                         "(ParamWrapper on mlp.experts.gate_up_proj / down_proj)")
    ma.add_argument("--rank-pattern", action="append", metavar="KEY=R",
                    help="Qwen3.5: adapter_config.json rank_pattern entry (repeatable)")
    ma.add_argument("--alpha-pattern", action="append", metavar="KEY=ALPHA",
                    help="Qwen3.5: adapter_config.json alpha_pattern entry (repeatable)")
    rc = sub.add_parser("replay-config", help="a qwen3_next config.json with the model's routing "
                        "shape, for gen_train_inputs.py --replay-model")
    rc.add_argument("--model", required=True)
    rc.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    commands = {
        "replay-config": cmd_replay_config,
        "make-model": cmd_make_model,
        "forward": lambda a: q3.cmd_forward(a, Qwen3NextModel),
        "grad": lambda a: q3.cmd_grad(a, Qwen3NextModel),
        "adamw-steps": lambda a: q3.cmd_adamw_steps(a, Qwen3NextModel),
        "make-adapter": cmd_make_adapter,
        "merge": cmd_merge,
        "selfcheck-grad": cmd_selfcheck_grad,
    }
    return commands[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
