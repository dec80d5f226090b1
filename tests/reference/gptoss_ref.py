#!/usr/bin/python3
r"""Independent PyTorch reference for Hugging Face gpt-oss (GptOssForCausalLM, model_type
"gpt_oss").

Written from the equations of HF `models/gpt_oss/modeling_gpt_oss.py` and
`configuration_gpt_oss.py` (not from the C code it checks), using only torch + numpy + stdlib
(safetensors read and written by hand, U8 MXFP4 blocks and scales included). Subcommands,
options, files and records are qwen3_ref.py's, whose generic parts it imports (RMSNorm, RoPE and
its YaRN tables, LoRA, the forward / grad / adamw-steps / make-adapter commands, the
finite-difference check): compare.py and compare_grads.py work unchanged.

  make-model --out DIR --seed N --dtype f32|bf16 [--shards K] [--std S] [--mxfp4]
             [--set key=value ...]
      DIR/config.json (BASE_CONFIG + --set; a VALUE is JSON, else a string; `--set KEY=` with
      nothing after "=" leaves KEY out, e.g. rope_scaling: HF's default YaRN) and random weights
      under HF's tensor names, exactly the tensors the config implies (HF's stacked expert
      layout): norms 1 + N(0, 0.1), routers and their biases N(0, 0.2), sinks N(0, 0.5), every
      other tensor (the q/k/v/o and expert biases included) N(0, S). f32: all F32; bf16: all
      BF16. --mxfp4: quantization_config {"quant_method": "mxfp4"} and the experts' gate_up_proj
      and down_proj stored as <name>_blocks (U8 [E, out, in/32, 16], random bytes) and
      <name>_scales (U8 [E, out, in/32], exponents 127 + round(log2(S / 2.93)) + U{-2..2}, so the
      values' scale is about S); their biases stay dense. Prints how many of a 64-token probe's
      gate / up values the swiglu clamps cut.

  forward --model DIR --input IN.jsonl --output OUT.jsonl [--replay] [--adapter ADIR [--no-lora]]
      Per line {"tokens": [...]}: {"tokens", "logprobs" (entry 0 null), "experts",
      "router_probs"}. experts[t][l]: layer l's k ids by router logit descending, lower id first
      on exact ties (replayed ids as given); router_probs[t][l]: the router's softmax over all
      E experts at its own top-(k+1) ids (ranked as the logits), replay or not.

  grad --model DIR --input IN.jsonl --output GRADS.safetensors [--replay] [--loss-out LOSS.json]
       [--adapter ADIR [--no-lora]] [--base-grads FILE]
      Lines {"tokens", "coef": [null, c_1, ...]}; loss = sum over lines and t >= 1 of
      c_t * log p(token t | tokens < t), float64 autograd through the forward's function.
      d loss / d W for every parameter, F32: HF names for all but the experts (sinks, router
      weight and bias, q/k/v/o biases included); the stacked experts under trill's per-expert
      names, nn.Linear orientation: model.layers.L.mlp.experts.E.gate_proj.weight [I, H]
      (= gate_up_proj[E][:, 0::2]^T), .up_proj.weight [I, H] (gate_up_proj[E][:, 1::2]^T),
      .down_proj.weight [H, I] (down_proj[E]^T), .gate_proj.bias [I], .up_proj.bias [I],
      .down_proj.bias [H] (experts no token was routed to: zeros). Tied: the embedding gets the
      summed gradient, no lm_head.weight. With --adapter the base is frozen and GRADS holds the
      lora_A / lora_B gradients (PEFT names); --base-grads FILE also writes the base's.
      LOSS.json: {"loss", "logprobs"}.

  adamw-steps --model DIR --input IN.jsonl --steps N --lr LR --weight-decay WD --betas B1,B2
              --eps EPS [--clip MAXNORM] --output PARAMS.safetensors [--replay] [--adapter ADIR]
      As qwen3_ref: N torch.optim.AdamW steps (float64) on the grad loss, over the tensors grad
      writes, under its names.

  make-adapter --model DIR --out ADIR --rank R --alpha A [--rslora] --targets T,... --seed N
               [--b-std S]
      A PEFT LoRA adapter (adapter_config.json + adapter_model.safetensors, F32): A as PEFT's
      init, U(-1/sqrt(in), 1/sqrt(in)); B ~ N(0, S) (default 0.05). Targets among q_proj,
      k_proj, v_proj, o_proj, lm_head (PEFT's modules) and gate_proj, up_proj, down_proj:
      trill's per-expert modules model.layers.L.mlp.experts.E.{gate,up,down}_proj (every expert
      of every layer), in nn.Linear orientation: gate / up [I, H] (A [r, H], B [I, r]), down
      [H, I] (A [r, I], B [H, r]). The router (GptOssTopKRouter, no nn.Linear) is never a target.
      Biases are not adapted.
      --peft-params: gate_proj / up_proj (either or both) mean the stacked parameter
      mlp.experts.gate_up_proj and down_proj mlp.experts.down_proj, written as PEFT writes them
      (adapter_config.json "target_parameters", a lora.ParamWrapper each: lora_A [r*E, in] (A
      U(-1/sqrt(in), 1/sqrt(in))), lora_B [out, r*E]; one A shared by gate and up; names below);
      "target_modules" holds the other targets (or []). --rank-pattern KEY=R / --alpha-pattern
      KEY=A (repeatable): adapter_config.json's rank_pattern / alpha_pattern, the tensors drawn at
      the ranks they give.
    Reading an adapter (forward, grad, adamw-steps, merge): the modules target_modules selects
    and the ParamWrappers target_parameters implies, r and lora_alpha per module / parameter by
    rank_pattern / alpha_pattern (PEFT's get_pattern_key: the first key K with
    re.match(rf"(.*\.)?({K})$", name)); strictly the tensors that implies. A ParamWrapper on
    model.layers.L.mlp.experts.{gate_up_proj [E, H, 2I], down_proj [E, I, H]} ([E, in, out],
    used as x @ W) adds scale * einsum("o r e, e r i -> e i o", B.reshape(out, r, E),
    A.reshape(E, r, in)): for expert e, A_e = A.reshape(E, r, in)[e], B_e = B.reshape(out, r,
    E)[:, :, e]; gate_proj gets scale * B_e[0::2] @ A_e, up_proj scale * B_e[1::2] @ A_e,
    down_proj scale * B_e @ A_e. Names: with both targeted in a layer, gate_up_proj's
    base_model.model.model.layers.L.mlp.experts.base_layer.lora_{A,B}.weight (inner) and
    down_proj's ...mlp.experts.lora_{A,B}.weight (outer); with one, ...mlp.experts.lora_{A,B}.weight.
    grad / adamw-steps with such an adapter: its own tensors under its own names.

  merge --model DIR --adapter ADIR --out MDIR
      W += scale * B @ A (scale alpha/r, or alpha/sqrt(r) with use_rslora) for every adapted
      matrix (an expert's gate into gate_up_proj[E][:, 0::2], up into [:, 1::2], down into
      down_proj[E], transposed back; a ParamWrapper's delta likewise), float64, written as a full dense F32 model in HF's layout
      (no quantization_config); a tied model with an lm_head adapter is written untied.

  selfcheck-grad [--seed N]
      Autograd vs central finite differences (h = 1e-6, rel err < 1e-6) on tiny float64
      gpt-oss models (2 layers: 0 sliding with window 2, 1 full; hidden 16, 2 heads / 1 KV head
      of 8, 4 experts of width 6 top-2, vocab 11, 5 tokens): embedding, q/k/v/o_proj and their
      biases, the sinks, both RMSNorms, the routers and their biases, an expert's gate / up /
      down and their biases, final norm, lm_head; swiglu_limit 7 (no clamp binds) and 0.5 (both
      clamps cut: checked on the probe), with and without replay, tied embeddings, attention_bias
      false; LoRA (r 3 on q/k/v/o_proj, every expert's gate/up/down_proj and lm_head, base frozen)
      with alpha/r, and rslora on a tied model with replay (B = 0 is the base exactly, the float64
      merge is the adapter's function to 1e-12). Unrouted experts' gradients (weights and
      biases) must be exactly zero. A target_parameters adapter (selfcheck_peft_params: both
      stacked parameters, r 2 and a rank_pattern / alpha_pattern, q_proj / o_proj / lm_head
      modules) through its files: names and scales as read, extra and misnamed tensors refused,
      finite differences on its tensors, an unrouted expert's A / B slices exactly zero, and its
      function = the per-expert module adapter built from it = base + PEFT's einsum delta = the
      merge (1e-12).

Model (float64; bf16 weights widened exactly, MXFP4 dequantized exactly). x =
  embed_tokens[tokens]; per layer l
  h = input_layernorm(x); x += attn(h); h = post_attention_layernorm(x); x += mlp(h);
  then logits = lm_head(norm(x)). RMSNorm w * x / sqrt(mean(x^2) + rms_norm_eps).
Attention (GptOssAttention): q/k/v/o_proj with biases iff attention_bias (default true); views
  [T, heads, head_dim] (head_dim: config's, 64 when absent (HF's default), hidden_size //
  num_attention_heads when null); no QK-norm; RoPE rotate-half over the whole head with YaRN
  (rope_scaling, or rope_parameters; absent or null: HF's default {"rope_type": "yarn", "factor":
  32, "beta_fast": 32, "beta_slow": 1, "truncate": false, "original_max_position_embeddings":
  4096}) as qwen3_ref's yarn_inv_freq computes it, cos and sin times its attention factor
  (other rope types refused). Logits q k^T * head_dim^-0.5, causal, and on the layers
  layer_types calls "sliding_attention" (default: even layer indices) key j visible from query t
  iff t - sliding_window < j <= t. Sinks: per head a logit sinks[h] appended as one more column;
  softmax over the row; that column dropped (the sink joins only the denominator); probs @ v
  (query head h reading KV head h // (num_attention_heads / num_key_value_heads)); o_proj.
MLP (GptOssMLP, every layer): router logits = h router.weight^T + router.bias [T, E]; ids = top-k
  (num_experts_per_tok) logits; weights = softmax over those k logits; out = sum_k w_k
  expert_k(h). Expert e: gate_up = h @ gate_up_proj[e] + gate_up_proj_bias[e]; gate = gate_up[...,
  0::2] clamped to max swiglu_limit, up = gate_up[..., 1::2] clamped to [-limit, limit]; glu =
  gate * sigmoid(alpha * gate) (alpha = swiglu_alpha, 1.702; HF's modeling file fixes it);
  y = ((up + 1) * glu) @ down_proj[e] + down_proj_bias[e].
Router replay (--replay): a line's "experts": [[[k ids] per layer] per token] replaces the top-k
  ids; the weights are the softmax of the model's logits at those ids, so the router weight and
  bias keep their gradient. Lines without "experts" route themselves.
"""

import collections
import copy
import json
import math
import os
import re
import struct
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import qwen3_ref as q3  # noqa: E402  (the generic parts: RoPE/YaRN, LoRA, commands, selfcheck)

DT = torch.float64
BASE_CONFIG = {
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss",
    "vocab_size": 97, "hidden_size": 64, "intermediate_size": 32, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "num_local_experts": 8, "num_experts_per_tok": 2, "sliding_window": 4,
    "attention_bias": True, "swiglu_limit": 7.0,
    "rope_theta": 150000.0,
    "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
                     "truncate": False, "original_max_position_embeddings": 16},
    "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "hidden_act": "silu",
    "max_position_embeddings": 131072, "bos_token_id": 0, "eos_token_id": 1,
    # In HF's config.json too; they do not change the forward.
    "attention_dropout": 0.0, "output_router_logits": False, "router_aux_loss_coef": 0.9,
    "initializer_range": 0.02, "use_cache": True,
}
DEFAULT_YARN = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                "truncate": False, "original_max_position_embeddings": 4096}
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
                "lm_head")
EXPERT_PARTS = ("gate_proj", "up_proj", "down_proj")
STACKED = ("gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias")
PACKED = ("gate_up_proj", "down_proj")  # the MXFP4-quantized ones
FP4_VALUES = [+0.0, +0.5, +1.0, +1.5, +2.0, +3.0, +4.0, +6.0,
              -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


# ---------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------

def head_dim_of(cfg):
    """HF GptOssConfig: head_dim=64 by default; an explicit null derives it."""
    if "head_dim" not in cfg:
        return 64
    return cfg["head_dim"] or cfg["hidden_size"] // cfg["num_attention_heads"]


def layer_types(cfg):
    """HF GptOssConfig: "sliding_attention" on even layer indices, "full_attention" on odd."""
    return cfg.get("layer_types") or ["sliding_attention" if (i + 1) % 2 else "full_attention"
                                      for i in range(cfg["num_hidden_layers"])]


def layer_windows(cfg):
    w = cfg.get("sliding_window")
    return [w if w and t == "sliding_attention" else None for t in layer_types(cfg)]


def rope_of(cfg):
    """(rope dict with rope_type, theta): rope_scaling, else rope_parameters, else (absent or
    null) HF's default YaRN, GptOssConfig's rope_scaling default."""
    rs = cfg.get("rope_scaling")
    if rs is None:
        rs = cfg.get("rope_parameters")
    if rs is None:
        rs = DEFAULT_YARN
    rs = dict(rs)
    rs["rope_type"] = rs.get("rope_type", rs.get("type", "default"))
    theta = cfg.get("rope_theta", rs.get("rope_theta", 150000.0))
    return rs, float(theta)


def is_mxfp4(cfg):
    qc = cfg.get("quantization_config")
    return bool(qc) and qc.get("quant_method") == "mxfp4"


def check_config(cfg):
    """Refuse what this reference does not implement, rather than compute something else."""
    def need(ok, msg):
        if not ok:
            raise SystemExit(f"config: {msg}")
    need(cfg.get("model_type") == "gpt_oss", f"unsupported model_type {cfg.get('model_type')!r}")
    need(cfg["num_attention_heads"] % cfg["num_key_value_heads"] == 0,
         "num_attention_heads must be a multiple of num_key_value_heads")
    need(head_dim_of(cfg) % 2 == 0, "head_dim must be even (RoPE)")
    need(1 <= cfg["num_experts_per_tok"] <= cfg["num_local_experts"],
         "need 1 <= num_experts_per_tok <= num_local_experts")
    types = layer_types(cfg)
    need(len(types) == cfg["num_hidden_layers"]
         and all(t in ("sliding_attention", "full_attention") for t in types),
         "layer_types must name sliding_attention / full_attention for every layer")
    w = cfg.get("sliding_window")
    need(w is None or (isinstance(w, int) and not isinstance(w, bool) and w >= 1),
         "sliding_window must be null or a positive integer")
    rs, theta = rope_of(cfg)
    need(rs["rope_type"] == "yarn", f"rope_type {rs['rope_type']!r} is not implemented (YaRN only)")
    need(rs.get("rope_theta", theta) == theta, "rope_parameters' rope_theta != rope_theta")
    lim = cfg.get("swiglu_limit", 7.0)
    need(isinstance(lim, (int, float)) and lim > 0, "swiglu_limit must be a positive number")
    qc = cfg.get("quantization_config")
    need(not qc or is_mxfp4(cfg), f"quantization_config {qc!r}: only mxfp4 is implemented")
    if is_mxfp4(cfg):
        need(cfg["hidden_size"] % 32 == 0 and cfg["intermediate_size"] % 32 == 0,
             "mxfp4 needs hidden_size and intermediate_size multiples of 32")


def build_config(overrides, dtype, mxfp4=False):
    cfg = copy.deepcopy({**BASE_CONFIG, **overrides})
    for k in [k for k, v in overrides.items() if v == ""]:
        del cfg[k]  # `--set KEY=`: KEY absent from config.json
    cfg["torch_dtype"] = {"f32": "float32", "bf16": "bfloat16"}[dtype]
    if mxfp4:
        cfg["quantization_config"] = {"quant_method": "mxfp4"}
    check_config(cfg)
    return cfg


# ---------------------------------------------------------------------------
# Tensors: HF's checkpoint layout and the per-expert (trill) layout used inside
# ---------------------------------------------------------------------------

def tensor_shapes(cfg, packed=False):
    """Every checkpoint tensor the config implies, (HF name, shape), in checkpoint order; with
    packed the MXFP4 form of gate_up_proj / down_proj (_blocks, _scales)."""
    H, V, I, E = (cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"],
                  cfg["num_local_experts"])
    hd = head_dim_of(cfg)
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    bias = cfg.get("attention_bias", True)
    out = [("model.embed_tokens.weight", (V, H))]
    for i in range(cfg["num_hidden_layers"]):
        p, a, x = f"model.layers.{i}", f"model.layers.{i}.self_attn", f"model.layers.{i}.mlp.experts"
        out.append((p + ".input_layernorm.weight", (H,)))
        for proj, o, fin in (("q_proj", q, H), ("k_proj", kv, H), ("v_proj", kv, H),
                             ("o_proj", H, q)):
            out.append((f"{a}.{proj}.weight", (o, fin)))
            if bias:
                out.append((f"{a}.{proj}.bias", (o,)))
        out += [(a + ".sinks", (cfg["num_attention_heads"],)),
                (p + ".post_attention_layernorm.weight", (H,)),
                (p + ".mlp.router.weight", (E, H)), (p + ".mlp.router.bias", (E,))]
        for name, shape, rows_out, cols_in in (("gate_up_proj", (E, H, 2 * I), 2 * I, H),
                                               ("gate_up_proj_bias", (E, 2 * I), None, None),
                                               ("down_proj", (E, I, H), H, I),
                                               ("down_proj_bias", (E, H), None, None)):
            if packed and rows_out:
                out += [(f"{x}.{name}_blocks", (E, rows_out, cols_in // 32, 16)),
                        (f"{x}.{name}_scales", (E, rows_out, cols_in // 32))]
            else:
                out.append((f"{x}.{name}", shape))
    out.append(("model.norm.weight", (H,)))
    if not cfg.get("tie_word_embeddings", False):
        out.append(("lm_head.weight", (V, H)))
    return out


def expert_names(layer, e):
    m = f"model.layers.{layer}.mlp.experts.{e}"
    return {part: (f"{m}.{part}.weight", f"{m}.{part}.bias") for part in EXPERT_PARTS}


def internal_shapes(cfg):
    """The tensors inside (and the gradient's names): HF's, the stacked experts split per expert
    in nn.Linear orientation (trill's names)."""
    H, I, E = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_local_experts"]
    out = []
    for name, shape in tensor_shapes(cfg):
        if name.endswith(".mlp.experts.gate_up_proj"):
            layer = int(name.split(".")[2])
            for e in range(E):
                n = expert_names(layer, e)
                for part, (o, i) in (("gate_proj", (I, H)), ("up_proj", (I, H)),
                                     ("down_proj", (H, I))):
                    out += [(n[part][0], (o, i)), (n[part][1], (o,))]
        elif not any(name.endswith(".mlp.experts." + s) for s in STACKED):
            out.append((name, shape))
    return out


def to_internal(W, cfg):
    """HF layout {name: tensor} -> the per-expert layout, in internal_shapes order."""
    out = {}
    for name, _ in tensor_shapes(cfg):
        if name.endswith(".mlp.experts.gate_up_proj"):
            x = name[:-len(".gate_up_proj")]
            layer = int(name.split(".")[2])
            gu, gub = W[x + ".gate_up_proj"], W[x + ".gate_up_proj_bias"]
            d, db = W[x + ".down_proj"], W[x + ".down_proj_bias"]
            for e in range(cfg["num_local_experts"]):
                n = expert_names(layer, e)
                out[n["gate_proj"][0]] = gu[e][:, 0::2].T.contiguous()
                out[n["gate_proj"][1]] = gub[e][0::2].contiguous()
                out[n["up_proj"][0]] = gu[e][:, 1::2].T.contiguous()
                out[n["up_proj"][1]] = gub[e][1::2].contiguous()
                out[n["down_proj"][0]] = d[e].T.contiguous()
                out[n["down_proj"][1]] = db[e].clone()
        elif not any(name.endswith(".mlp.experts." + s) for s in STACKED):
            out[name] = W[name]
    return out


def to_hf(W, cfg):
    """The per-expert layout -> HF's stacked layout, as [(name, tensor)] in checkpoint order."""
    E = cfg["num_local_experts"]
    out = []
    for name, _ in tensor_shapes(cfg):
        if any(name.endswith(".mlp.experts." + s) for s in STACKED):
            layer = int(name.split(".")[2])
            n = [expert_names(layer, e) for e in range(E)]
            if name.endswith("gate_up_proj"):
                t = torch.stack([torch.stack([W[n[e]["gate_proj"][0]].T, W[n[e]["up_proj"][0]].T],
                                             -1).reshape(cfg["hidden_size"], -1) for e in range(E)])
            elif name.endswith("gate_up_proj_bias"):
                t = torch.stack([torch.stack([W[n[e]["gate_proj"][1]], W[n[e]["up_proj"][1]]],
                                             -1).reshape(-1) for e in range(E)])
            elif name.endswith("down_proj"):
                t = torch.stack([W[n[e]["down_proj"][0]].T for e in range(E)])
            else:
                t = torch.stack([W[n[e]["down_proj"][1]] for e in range(E)])
            out.append((name, t.contiguous()))
        else:
            out.append((name, W[name]))
    return out


def check_exact(have, want, what):
    for n in sorted(set(want) | set(have)):
        if tuple(want.get(n, ())) != tuple(have.get(n, ())) or (n in want) != (n in have):
            raise SystemExit(f"{what}tensor {n}: shape {list(have[n]) if n in have else 'missing'}, "
                             f"expected {list(want[n]) if n in want else 'none (unknown)'}")


def linear_modules(cfg):
    """Every matrix a LoRA adapter may sit on, (module name, in, out): q/k/v/o_proj, every
    expert's gate/up/down_proj (trill's per-expert modules), lm_head (even when tied)."""
    H, V = cfg["hidden_size"], cfg["vocab_size"]
    out = []
    for n, s in internal_shapes(cfg):
        if (n.endswith(".weight") and len(s) == 2 and n != "model.embed_tokens.weight"
                and n != "lm_head.weight" and not n.endswith(".mlp.router.weight")):
            out.append((n[:-len(".weight")], s[1], s[0]))
    return out + [("lm_head", H, V)]


# ---------------------------------------------------------------------------
# LoRA adapters: PEFT's modules (qwen3_ref's) and PEFT's ParamWrapper on the stacked experts
# ---------------------------------------------------------------------------
# Written from PEFT's definitions (src/peft/tuners/lora/layer.py ParamWrapper,
# tuners_utils._inject_parameters, LoraModel._create_and_replace) and transformers' GptOssExperts
# (is_transposed: the parameters are used as x @ W). A target_parameters entry T selects the
# parameter N (full name) when N == T or N ends with "." + T. The wrapper on a 3-D parameter
# [E, in, out] has lora_A [r*E, in] (rows expert-major: row e*r + k) and lora_B [out, r*E]
# (columns expert-minor: column k*E + e);
#     delta = scale * einsum("o r e, e r i -> e i o", B.reshape(out, r, E), A.reshape(E, r, in))
# is added to the parameter, i.e. per expert e, with A_e = A.reshape(E, r, in)[e] [r, in] and
# B_e = B.reshape(out, r, E)[:, :, e] [out, r], W[e] += scale * (B_e @ A_e)^T. gate_up_proj
# [E, H, 2I]: gate = even columns, up = odd: trill's per-expert gate_proj.weight [I, H] gets
# scale * B_e[0::2] @ A_e, up_proj.weight scale * B_e[1::2] @ A_e (one A shared by gate and up);
# down_proj [E, I, H]: down_proj.weight [H, I] gets scale * B_e @ A_e.
# The wrapper replaces the module owning the parameter, model.layers.L.mlp.experts; with both
# parameters targeted PEFT wraps gate_up_proj first (inner) and down_proj around it (outer):
# gate_up_proj's tensors are "...mlp.experts.base_layer.lora_A.weight" / lora_B, down_proj's
# "...mlp.experts.lora_A.weight" / lora_B; with one of them targeted in a layer, it has the names
# without base_layer.
# r and lora_alpha, for a module (its name) and for a parameter (its full name) alike: PEFT's
# get_pattern_key, the first key K of rank_pattern / alpha_pattern with
# re.match(rf"(.*\.)?({K})$", name), else the config's r / lora_alpha; scale alpha / r, or
# alpha / sqrt(r) with use_rslora.

STACKED_TARGETS = ("gate_up_proj", "down_proj")  # the 3-D expert parameters a wrapper may wrap
ParamLora = collections.namedtuple("ParamLora", "param layer which fin fout r scale a b")


def pattern_value(patterns, name, default):
    r"""PEFT's get_pattern_key: the value of the first key K with re.match(rf"(.*\.)?({K})$",
    name); default when none matches."""
    for key, value in (patterns or {}).items():
        if re.match(rf"(.*\.)?({key})$", name):
            return value
    return default


def lora_r_scale(acfg, name):
    """(r, scale) of the module or parameter `name` under the adapter config's patterns."""
    r = pattern_value(acfg.get("rank_pattern"), name, acfg["r"])
    alpha = pattern_value(acfg.get("alpha_pattern"), name, acfg["lora_alpha"])
    if isinstance(r, bool) or not isinstance(r, int) or r <= 0:
        raise SystemExit(f"adapter: rank {r!r} for {name} is not a positive integer")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        raise SystemExit(f"adapter: lora_alpha {alpha!r} for {name} is not a number")
    return r, q3.lora_scale({"r": r, "lora_alpha": alpha, "use_rslora": acfg.get("use_rslora", False)})


class StackedFamily:
    """What the target_parameters readers and writers below need of a family whose routed experts
    are stacked parameters (gpt-oss here, GPTOSS; Qwen3.5 in qwen3next_ref.py):
      read_config(model_dir): its config.json, checked (SystemExit if the family cannot take a
        target_parameters adapter), as the other functions take it;
      params_refused(cfg): None, or why this config takes no target_parameters;
      shapes(cfg): [(tensor name, shape)]; linear_modules(cfg): [(module, in, out)];
      n_experts(cfg), inter(cfg): E and the experts' width; experts(cfg, layer): the module that
        owns layer's stacked parameters;
      skip_module(cfg, wrappers, name): a target_modules match that a wrapper adapts instead;
      view(cfg): the config as the others read it (each function below takes it so first)."""

    def __init__(self, read_config, shapes, linear_modules, n_experts, inter, experts,
                 params_refused=lambda cfg: None, skip_module=lambda cfg, wrappers, name: False,
                 view=lambda cfg: cfg):
        self.read_config, self.shapes, self.linear_modules = read_config, shapes, linear_modules
        self.n_experts, self.inter, self.experts = n_experts, inter, experts
        self.params_refused, self.skip_module, self.view = params_refused, skip_module, view


def stacked_param_wrappers(fam, cfg, acfg):
    """The ParamWrappers adapter_config's target_parameters implies, [ParamLora] (per layer
    gate_up_proj, then down_proj), with PEFT's tensor names (base_layer for the inner one)."""
    cfg = fam.view(cfg)
    targets = acfg.get("target_parameters")
    if not targets:
        return []
    refused = fam.params_refused(cfg)
    if refused:
        raise SystemExit(f"adapter: target_parameters: {refused}")
    if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
        raise SystemExit("adapter: target_parameters must be a list of parameter names")
    names = [n for n, _ in fam.shapes(cfg)]
    for t in targets:
        hit = [n for n in names if q3.target_matches([t], n)]
        if not hit:
            raise SystemExit(f"adapter: target_parameters entry {t!r} matches no parameter")
        other = [n for n in hit if not any(n.endswith(".mlp.experts." + s) for s in STACKED_TARGETS)]
        if other:
            raise SystemExit(f"adapter: target_parameters entry {t!r} selects {other[0]}: only the "
                             "experts' gate_up_proj / down_proj are implemented")
    H, I = cfg["hidden_size"], fam.inter(cfg)
    out = []
    for layer in range(cfg["num_hidden_layers"]):
        x = fam.experts(cfg, layer)
        here = [(which, fin, fout) for which, fin, fout in (("gate_up_proj", H, 2 * I),
                                                           ("down_proj", I, H))
                if q3.target_matches(targets, f"{x}.{which}")]
        for which, fin, fout in here:
            pref = q3.PEFT_PREFIX + x + (".base_layer" if len(here) == 2 and which == "gate_up_proj" else "")
            r, scale = lora_r_scale(acfg, f"{x}.{which}")
            out.append(ParamLora(f"{x}.{which}", layer, which, fin, fout, r, scale,
                                 pref + ".lora_A.weight", pref + ".lora_B.weight"))
    return out


def param_factors(W, w, n_experts, e, rows):
    """(A_e [r, in], B_e[rows] [len(rows), r]) of wrapper w's expert e, from W's lora_A / lora_B
    (differentiable views)."""
    A = W[w.a].reshape(n_experts, w.r, w.fin)[e]
    B = W[w.b].reshape(w.fout, w.r, n_experts)[:, :, e]
    return A, B[rows]


def expert_rows(which):
    """The per-expert modules a wrapper adapts, with the rows of B_e each takes."""
    if which == "gate_up_proj":
        return (("gate_proj", slice(0, None, 2)), ("up_proj", slice(1, None, 2)))
    return (("down_proj", slice(None)),)


def stacked_load_adapter(fam, adapter_dir, cfg, linears):
    """Read a PEFT LoRA adapter folder: modules (target_modules, among `linears`: the family's
    linear_modules) and ParamWrappers (target_parameters), r / lora_alpha per rank_pattern /
    alpha_pattern. Strict: every tensor the config implies, shapes checked, and no other. Returns
    ({module name: scale}, {PEFT tensor name: float64 tensor}, [ParamLora], adapter config)."""
    cfg = fam.view(cfg)
    with open(os.path.join(adapter_dir, "adapter_config.json")) as f:
        acfg = json.load(f)
    if acfg.get("peft_type", "LORA") != "LORA":
        raise SystemExit(f"{adapter_dir}: peft_type {acfg.get('peft_type')!r} is not LORA")
    for key, off in (("use_dora", False), ("fan_in_fan_out", False), ("bias", "none"),
                     ("lora_bias", False)):
        if acfg.get(key, off) not in (off, None):
            raise SystemExit(f"{adapter_dir}: {key}={acfg[key]!r} is not supported")
    for key in ("layers_to_transform", "modules_to_save", "layer_replication", "exclude_modules"):
        if acfg.get(key):
            raise SystemExit(f"{adapter_dir}: {key} is not supported")
    for key in ("rank_pattern", "alpha_pattern"):
        if acfg.get(key) is not None and not isinstance(acfg[key], dict):
            raise SystemExit(f"{adapter_dir}: {key} must be an object")
    targets = acfg.get("target_modules")
    if targets is None and acfg.get("target_parameters"):
        targets = []
    if targets == "all-linear" or not isinstance(targets, (str, list)):
        raise SystemExit(f"{adapter_dir}: target_modules must be a list or a regex string")
    wrappers = stacked_param_wrappers(fam, cfg, acfg)
    tensors = q3.read_safetensors(os.path.join(adapter_dir, "adapter_model.safetensors"))
    E = fam.n_experts(cfg)
    modules, W = {}, {}

    def take(n, shape, what):
        if n not in tensors:
            raise SystemExit(f"{adapter_dir}: {n} missing ({what} is targeted)")
        if tuple(tensors[n].shape) != shape:
            raise SystemExit(f"{adapter_dir}: {n} has shape {list(tensors[n].shape)}, "
                             f"expected {list(shape)}")
        W[n] = tensors.pop(n).to(DT)
    for name, fin, fout in linears:
        if not q3.target_matches(targets, name) or fam.skip_module(cfg, wrappers, name):
            continue
        r, scale = lora_r_scale(acfg, name)
        an, bn = q3.lora_names(name)
        take(an, (r, fin), f"module {name}")
        take(bn, (fout, r), f"module {name}")
        modules[name] = scale
    for w in wrappers:
        take(w.a, (w.r * E, w.fin), f"parameter {w.param}")
        take(w.b, (w.fout, w.r * E), f"parameter {w.param}")
    if tensors:
        raise SystemExit(f"{adapter_dir}: tensors for no targeted module or parameter: "
                         f"{sorted(tensors)[:5]}")
    if not modules and not wrappers:
        raise SystemExit(f"{adapter_dir}: target_modules {targets!r} select no module "
                         "(and no target_parameters)")
    return modules, W, wrappers, acfg


def parse_patterns(items, what, is_rank):
    out = {}
    for item in items or []:
        key, eq, v = item.rpartition("=")
        try:
            val = float(v)
        except ValueError:
            val = None
        if not eq or not key or val is None or (is_rank and (not val.is_integer() or val <= 0)):
            raise SystemExit(f"--{what} expects KEY={'R (a positive integer)' if is_rank else 'ALPHA'}"
                             f", got {item!r}")
        out[key] = int(val) if val.is_integer() else val
    return out


def stacked_make_adapter_tensors(fam, cfg, acfg, seed, b_std):
    """Random A / B for every module and parameter the adapter config targets (r per the
    patterns): A U(-1/sqrt(in), 1/sqrt(in)) (PEFT's init; a wrapper's lora_A is a Linear(in,
    r*E)), B ~ N(0, b_std). Modules first (linear_modules order), then the wrappers.
    [(PEFT name, fp32 tensor)]."""
    cfg = fam.view(cfg)
    g = torch.Generator().manual_seed(seed)
    E, out = fam.n_experts(cfg), []
    wrappers = stacked_param_wrappers(fam, cfg, acfg)

    def pair(rows, fin, fout, an, bn):
        bound = 1.0 / math.sqrt(fin)
        a = (torch.rand((rows, fin), generator=g, dtype=torch.float32) * 2 - 1) * bound
        b = torch.randn((fout, rows), generator=g, dtype=torch.float32) * b_std
        return [(an, a), (bn, b)]
    for name, fin, fout in fam.linear_modules(cfg):
        if q3.target_matches(acfg["target_modules"], name) and not fam.skip_module(cfg, wrappers, name):
            out += pair(lora_r_scale(acfg, name)[0], fin, fout, *q3.lora_names(name))
    for w in wrappers:
        out += pair(w.r * E, w.fin, w.fout, w.a, w.b)
    if not out:
        raise SystemExit("make-adapter: the targets select no module or parameter of this model")
    return out


def stacked_cmd_make_adapter(fam, args):
    """qwen3_ref's make-adapter, and with --peft-params / --rank-pattern / --alpha-pattern the
    adapters those options describe (gate_proj / up_proj / down_proj then mean the stacked
    parameters mlp.experts.gate_up_proj / down_proj: every layer's routed experts; the other
    targets are modules)."""
    if not (args.peft_params or args.rank_pattern or args.alpha_pattern):
        return q3.cmd_make_adapter(args, fam.linear_modules)
    cfg = fam.read_config(args.model)
    if args.rank <= 0:
        raise SystemExit("--rank must be positive")
    targets = q3.parse_targets(args.targets)
    params = []
    if args.peft_params:
        if {"gate_proj", "up_proj"} & set(targets):
            params.append("mlp.experts.gate_up_proj")
        if "down_proj" in targets:
            params.append("mlp.experts.down_proj")
        targets = [t for t in targets if t not in EXPERT_PARTS]
    alpha = int(args.alpha) if float(args.alpha).is_integer() else args.alpha
    acfg = q3.adapter_config(args.model, args.rank, alpha, args.rslora, targets)
    if args.peft_params:
        acfg["target_parameters"] = params
    acfg["rank_pattern"] = parse_patterns(args.rank_pattern, "rank-pattern", True)
    acfg["alpha_pattern"] = parse_patterns(args.alpha_pattern, "alpha-pattern", False)
    tensors = stacked_make_adapter_tensors(fam, cfg, acfg, args.seed, args.b_std)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "adapter_config.json"), "w") as f:
        json.dump(acfg, f, indent=2)
        f.write("\n")
    q3.write_safetensors(os.path.join(args.out, "adapter_model.safetensors"), tensors, "F32")
    print(f"wrote {args.out}: {len(tensors)} tensors, r={args.rank}, alpha={alpha}, "
          f"rslora={str(args.rslora).lower()}, target_modules={targets}, target_parameters="
          f"{params if args.peft_params else None}, rank_pattern={acfg['rank_pattern']}, "
          f"alpha_pattern={acfg['alpha_pattern']}")


def read_checked_config(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    check_config(cfg)
    return cfg


GPTOSS = StackedFamily(read_checked_config, lambda cfg: tensor_shapes(cfg), lambda cfg: linear_modules(cfg),
                       lambda cfg: cfg["num_local_experts"], lambda cfg: cfg["intermediate_size"],
                       lambda cfg, layer: f"model.layers.{layer}.mlp.experts")


def param_wrappers(cfg, acfg):
    return stacked_param_wrappers(GPTOSS, cfg, acfg)


def load_adapter(adapter_dir, cfg, linears):
    return stacked_load_adapter(GPTOSS, adapter_dir, cfg, linears)


def make_adapter_tensors(cfg, acfg, seed, b_std):
    return stacked_make_adapter_tensors(GPTOSS, cfg, acfg, seed, b_std)


def cmd_make_adapter(args):
    return stacked_cmd_make_adapter(GPTOSS, args)


# ---------------------------------------------------------------------------
# safetensors with per-tensor dtypes (F32, BF16, F16, F64, U8) and MXFP4
# ---------------------------------------------------------------------------

ST_DTYPES = {"F32": (4, "<f4"), "BF16": (2, "<u2"), "F16": (2, "<f2"), "F64": (8, "<f8"),
             "U8": (1, "u1")}


def write_st(path, entries):
    """entries: (name, tensor, dtype); U8 tensors are uint8 tensors."""
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name, t, dt in entries:
        b = t.to(torch.uint8).numpy().tobytes() if dt == "U8" else q3.tensor_bytes(t, dt)
        header[name] = {"dtype": dt, "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * ((-len(h)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    return off


def read_st(path):
    """{name: (dtype, tensor)}: float64 (widened exactly), or uint8 for U8."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n].decode("utf-8"))
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dt, shape, (b, e) = info["dtype"], info["shape"], info["data_offsets"]
        if dt not in ST_DTYPES:
            raise SystemExit(f"{path}: tensor {name} has unsupported dtype {dt}")
        size, npdt = ST_DTYPES[dt]
        count = int(np.prod(shape)) if shape else 1
        if e - b != count * size or 8 + n + e > len(data):
            raise SystemExit(f"{path}: tensor {name} has inconsistent offsets")
        raw = np.frombuffer(data, dtype=npdt, count=count, offset=8 + n + b)
        if dt == "U8":
            out[name] = (dt, torch.from_numpy(raw.copy().reshape(shape)))
            continue
        if dt == "BF16":
            raw = (raw.astype(np.uint32) << 16).view(np.float32)
        out[name] = (dt, torch.from_numpy(raw.astype(np.float64).reshape(shape)))
    return out


def read_checkpoint(model_dir):
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if not os.path.exists(index):
        return read_st(os.path.join(model_dir, "model.safetensors"))
    with open(index) as f:
        weight_map = json.load(f)["weight_map"]
    out = {}
    for shard in sorted(set(weight_map.values())):
        for name, v in read_st(os.path.join(model_dir, shard)).items():
            if weight_map.get(name) != shard:
                raise SystemExit(f"{name} found in {shard} but index says {weight_map.get(name)}")
            out[name] = v
    absent = sorted(set(weight_map) - set(out))
    if absent:
        raise SystemExit(f"tensors listed in index but absent: {absent[:5]}")
    return out


def mxfp4_dequantize(blocks, scales):
    """HF convert_moe_packed_tensors: [E, R, G, 16] bytes (element 2k of a 32-block = low nibble,
    2k+1 = high nibble, FP4_VALUES) times 2^(scale - 127) -> [E, R, G*32], transposed to
    [E, G*32, R] (the stacked x @ W form). Exact in float64."""
    lut = torch.tensor(FP4_VALUES, dtype=DT)
    b = blocks.to(torch.long)
    v = torch.stack([lut[b & 15], lut[b >> 4]], -1).reshape(*b.shape[:-1], 32)
    v = v * torch.pow(torch.tensor(2.0, dtype=DT), scales.to(DT) - 127)[..., None]
    E, R, G = scales.shape
    return v.reshape(E, R, G * 32).transpose(1, 2).contiguous()


def mxfp4_quantize_random(shape_blocks, g, std):
    """Random codes and scales for a packed tensor: bytes U{0..255}, exponents around
    127 + round(log2(std / 2.93)) (2.93: the rms of the FP4 values) +- 2."""
    blocks = torch.randint(0, 256, shape_blocks, generator=g, dtype=torch.int32).to(torch.uint8)
    c = 127 + round(math.log2(std / 2.93))
    scales = (c + torch.randint(-2, 3, shape_blocks[:-1], generator=g, dtype=torch.int32))
    return blocks, scales.clamp(0, 255).to(torch.uint8)


def load_weights(model_dir, cfg):
    """Strict: exactly the tensors the config implies (MXFP4's _blocks/_scales pairs in place of
    gate_up_proj / down_proj under quant_method mxfp4), shapes and dtypes checked; returns the
    dense HF-layout {name: float64 tensor}. A tied model may carry an unused lm_head.weight."""
    stored = read_checkpoint(model_dir)
    mx = is_mxfp4(cfg)
    if cfg.get("tie_word_embeddings", False):
        stored.pop("lm_head.weight", None)
    check_exact({n: tuple(t.shape) for n, (_, t) in stored.items()},
                dict(tensor_shapes(cfg, packed=mx)), "checkpoint: ")
    W = {}
    for name, (dt, t) in stored.items():
        is_packed = name.endswith("_blocks") or name.endswith("_scales")
        if (dt == "U8") != is_packed:
            raise SystemExit(f"checkpoint: tensor {name}: dtype {dt} "
                             f"({'U8 expected' if is_packed else 'U8 is only for MXFP4 blocks/scales'})")
        if name.endswith("_scales"):
            continue
        if name.endswith("_blocks"):
            base = name[:-len("_blocks")]
            W[base] = mxfp4_dequantize(t, stored[base + "_scales"][1])
        else:
            W[name] = t
    return W


def write_model(out_dir, cfg, entries, shards=1):
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    for fn in os.listdir(out_dir):
        if fn.startswith("model") and (fn.endswith(".safetensors") or fn.endswith(".index.json")):
            os.remove(os.path.join(out_dir, fn))
    if shards <= 1:
        write_st(os.path.join(out_dir, "model.safetensors"), entries)
        return ["model.safetensors"]
    dts = {n: dt for n, _, dt in entries}
    weight_map, total, files = {}, 0, []
    for i, part in enumerate(q3.split_shards([(n, t) for n, t, _ in entries], shards, 1)):
        fn = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        total += write_st(os.path.join(out_dir, fn), [(n, t, dts[n]) for n, t in part])
        weight_map.update({n: fn for n, _ in part})
        files.append(fn)
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
        f.write("\n")
    return files


# ---------------------------------------------------------------------------
# make-model
# ---------------------------------------------------------------------------

def make_weights(cfg, seed, std=0.02, mxfp4=False):
    """Random weights in HF's dense layout and tensor_shapes order (the same seed gives the same
    tensors in any dtype or sharding). Returns ([(name, fp32 tensor)], {name: (blocks, scales)}
    for the MXFP4-packed ones, whose dense tensor is their dequantization)."""
    g = torch.Generator().manual_seed(seed)
    out, packed = [], {}
    for name, shape in tensor_shapes(cfg):
        if mxfp4 and any(name.endswith(".mlp.experts." + s) for s in PACKED):
            rows_out, cols_in = shape[2], shape[1]
            blocks, scales = mxfp4_quantize_random((shape[0], rows_out, cols_in // 32, 16), g, std)
            packed[name] = (blocks, scales)
            out.append((name, mxfp4_dequantize(blocks, scales).float()))
            continue
        r = torch.randn(shape, generator=g, dtype=torch.float32)
        if name.endswith("norm.weight"):
            t = 1.0 + 0.1 * r           # not all ones: the weight multiply is exercised
        elif name.endswith(".mlp.router.weight") or name.endswith(".mlp.router.bias"):
            t = 0.2 * r                 # decisive routing, not saturated
        elif name.endswith(".self_attn.sinks"):
            t = 0.5 * r                 # non-zero: a test sees the sink
        else:
            t = std * r                 # linear weights and every other bias
        out.append((name, t))
    return out, packed


def checkpoint_entries(tensors, packed, dtype):
    st = {"f32": "F32", "bf16": "BF16"}[dtype]
    entries = []
    for name, t in tensors:
        if name in packed:
            blocks, scales = packed[name]
            entries += [(name + "_blocks", blocks, "U8"), (name + "_scales", scales, "U8")]
        else:
            entries.append((name, t, st))
    return entries


def clamp_probe(model, tokens):
    """(gate values the clamp cuts, up values it cuts, values) over one forward of tokens."""
    model.clamp_stats = [0, 0, 0]
    with torch.no_grad():
        model.forward(tokens)
    stats, model.clamp_stats = model.clamp_stats, None
    return stats


def cmd_make_model(args):
    cfg = build_config(q3.parse_set(args.set), args.dtype, args.mxfp4)
    tensors, packed = make_weights(cfg, args.seed, args.std, args.mxfp4)
    files = write_model(args.out, cfg, checkpoint_entries(tensors, packed, args.dtype), args.shards)
    probe = np.random.default_rng(args.seed).integers(0, cfg["vocab_size"], 64).tolist()
    gc, uc, n = clamp_probe(GptOssModel(cfg=cfg, weights=dict(tensors)), probe)
    print(f"wrote {args.out}: {len(tensors)} tensors, gpt_oss, {args.dtype}"
          f"{' (experts mxfp4)' if args.mxfp4 else ''}, files={files}, swiglu_limit "
          f"{cfg.get('swiglu_limit', 7.0)} cuts {gc}/{n} gate and {uc}/{n} up values of a 64-token probe")


# ---------------------------------------------------------------------------
# The model function
# ---------------------------------------------------------------------------

class Adapted(dict):
    """The module adapters {module name: scale} (qwen3_ref's Model.lora), true also when only
    ParamWrappers adapt the model: qwen3_ref's commands read `if model.lora` as "an adapter is
    loaded" (the base frozen, the adapter's tensors, model.lora_names, trained)."""

    def __init__(self, mods, wrapped=False):
        super().__init__(mods)
        self.wrapped = wrapped

    def __bool__(self):
        return self.wrapped or len(self) > 0


class StackedLora:
    """For a q3.Model whose stacked routed experts PEFT's ParamWrappers may adapt (GptOssModel,
    qwen3next_ref's Qwen3.5): split_adapter before Model.__init__, attach_wrappers after, lin
    adds them. Needs self.n_experts."""

    @staticmethod
    def split_adapter(adapter, load):
        """adapter: None, a folder (load(folder) -> (modules, tensors, [ParamLora], adapter
        config)), or in memory (modules {name: scale}, {PEFT name: tensor}[, [ParamLora]]).
        Returns (what qwen3_ref's Model takes: None or (modules, tensors)), [ParamLora], tensors."""
        if isinstance(adapter, str):
            mods, lw, wrappers, _ = load(adapter)
            return (mods, lw), wrappers, lw
        if adapter is not None and len(adapter) == 3:
            mods, lw, wrappers = adapter
            return (mods, lw), wrappers, lw
        return adapter, [], None

    def attach_wrappers(self, wrappers, lw, n_experts, rows_of, module_of):
        """The ParamWrappers: their lora_A / lora_B in self.W under the file's names (trained
        and written by grad / adamw-steps like the modules'); self.plin: per-expert module name
        (module_of(layer, expert, part)) -> [(ParamLora, expert, rows of B_e)] (rows_of(which):
        the parts and their rows), added in lin()."""
        self.lora = Adapted(self.lora, wrapped=bool(wrappers))
        self.param_lora, self.plin = list(wrappers), {}
        for w in wrappers:
            self.W[w.a], self.W[w.b] = lw[w.a].to(DT), lw[w.b].to(DT)
            self.lora_names += [w.a, w.b]
            for e in range(n_experts):
                for part, rows in rows_of(w.which):
                    self.plin.setdefault(module_of(w.layer, e, part), []).append((w, e, rows))

    def lin(self, x, name):
        """qwen3_ref's (base, module LoRA), plus every ParamWrapper on this per-expert module:
        scale * (x A_e^T) B_e[rows]^T, i.e. the module's share of W[e] + delta[e]."""
        y = super().lin(x, name)
        for w, e, rows in self.plin.get(name, ()):
            A, B = param_factors(self.W, w, self.n_experts, e, rows)
            y = y + w.scale * ((x @ A.T) @ B.T)
        return y


class GptOssModel(StackedLora, q3.Model):
    """qwen3_ref's Model (LoRA, lin, parameters) with gpt-oss's layer: biased q/k/v/o, attention
    sinks, per-layer sliding windows, YaRN; every layer the biased top-k router (softmax over the
    k logits) and clamped-swiglu experts. Inside, the stacked experts are held per expert
    (model.layers.L.mlp.experts.E.{gate,up,down}_proj.{weight,bias}, nn.Linear orientation);
    weights may be given in either layout."""
    MODEL_TYPES = ("gpt_oss",)
    QK_NORM = False
    MOE_BLOCK = "mlp"
    EXPERT_PROJ = EXPERT_PARTS

    def __init__(self, model_dir=None, cfg=None, weights=None, adapter=None):
        if model_dir is not None:
            with open(os.path.join(model_dir, "config.json")) as f:
                cfg = json.load(f)
            check_config(cfg)
            weights = load_weights(model_dir, cfg)
        check_config(cfg)
        if any(n.endswith(".mlp.experts.gate_up_proj") for n in weights):  # HF layout
            w = dict(weights)
            if cfg.get("tie_word_embeddings", False):
                w.pop("lm_head.weight", None)
            check_exact({n: tuple(t.shape) for n, t in w.items()}, dict(tensor_shapes(cfg)), "")
            weights = to_internal(w, cfg)
        adapter, wrappers, lw = self.split_adapter(adapter, lambda d: load_adapter(d, cfg, linear_modules(cfg)))
        super().__init__(None, cfg, weights, adapter)
        self.attach_wrappers(wrappers, lw, cfg["num_local_experts"], expert_rows,
                             lambda layer, e, part: f"model.layers.{layer}.mlp.experts.{e}.{part}")
        self.hd = head_dim_of(cfg)
        self.rotary_dim = self.hd
        self.layer_windows = layer_windows(cfg)
        self.moe_layers = list(range(self.L))
        self.n_experts = cfg["num_local_experts"]
        self.limit = float(cfg.get("swiglu_limit", 7.0))
        self.alpha = float(cfg.get("swiglu_alpha", 1.702))
        self.clamp_stats = None
        have = {n: tuple(t.shape) for n, t in self.W.items() if n not in self.lora_names}
        if self.tied:
            have.pop("lm_head.weight", None)
        check_exact(have, dict(internal_shapes(cfg)), "")

    def linear_modules(self):
        return linear_modules(self.cfg)

    def rope(self, T):
        rs, theta = rope_of(self.cfg)
        return q3.rope_cos_sin(T, self.hd, theta, {
            "rope_scaling": rs, "max_position_embeddings": self.cfg.get("max_position_embeddings", 131072)})

    def attention(self, x, p, cos, sin, window):
        T, hd, nH, nKV = x.shape[0], self.hd, self.nH, self.nKV
        q = q3.apply_rope(self.lin(x, p + ".q_proj").view(T, nH, hd), cos, sin)
        k = q3.apply_rope(self.lin(x, p + ".k_proj").view(T, nKV, hd), cos, sin)
        v = self.lin(x, p + ".v_proj").view(T, nKV, hd)
        rep = nH // nKV
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        scores = torch.einsum("thd,shd->hts", q, k) * hd ** -0.5
        mask = torch.ones(T, T, dtype=torch.bool).triu(1)          # keys after the query
        if window:
            mask |= torch.ones(T, T, dtype=torch.bool).tril(-window)  # keys j <= t - window
        scores = scores.masked_fill(mask, float("-inf"))
        sink = self.W[p + ".sinks"][:, None, None].expand(nH, T, 1)
        probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
        o = torch.einsum("hts,shd->thd", probs, v).reshape(T, nH * hd)
        return self.lin(o, p + ".o_proj")

    def expert(self, x, m):
        g = self.lin(x, m + ".gate_proj")
        u = self.lin(x, m + ".up_proj")
        if self.clamp_stats is not None:
            self.clamp_stats[0] += int((g > self.limit).sum())
            self.clamp_stats[1] += int((u.abs() > self.limit).sum())
            self.clamp_stats[2] += g.numel()
        g = g.clamp(max=self.limit)
        u = u.clamp(min=-self.limit, max=self.limit)
        glu = g * torch.sigmoid(g * self.alpha)
        return self.lin((u + 1) * glu, m + ".down_proj")

    def moe(self, x, p, replay_ids=None):
        """GptOssMLP. Returns (output, expert ids [T, k], router softmax at its top-(k+1))."""
        k, E = self.cfg["num_experts_per_tok"], self.n_experts
        logits = x @ self.W[p + ".router.weight"].T + self.W[p + ".router.bias"]  # [T, E]
        order = torch.sort(logits.detach(), dim=-1, descending=True, stable=True).indices
        rp = torch.softmax(logits.detach(), dim=-1).gather(1, order[:, :min(k + 1, E)])
        ids = order[:, :k]
        if replay_ids is not None:
            # A row of negative ids is not replayed (rl_step_ref.py's convention, as qwen3_ref).
            unset = (replay_ids < 0).all(-1, keepdim=True)
            if bool(((replay_ids < 0) != unset).any()):
                raise ValueError("replay ids: a row is either all replayed or all negative")
            ids = torch.where(unset, ids, replay_ids)
        w = torch.softmax(logits.gather(1, ids), dim=-1)
        out = torch.zeros_like(x)
        for e in torch.unique(ids).tolist():
            rows, slot = (ids == e).nonzero(as_tuple=True)
            y = self.expert(x[rows], f"{p}.experts.{e}")
            out = out.index_add(0, rows, w[rows, slot][:, None] * y)
        return out, ids, rp

    def forward(self, tokens, replay=None):
        """Returns (log-softmax [T, V], experts [T][l][k], router_probs [T][l][k+1])."""
        T = len(tokens)
        x = self.W["model.embed_tokens.weight"][torch.tensor(tokens, dtype=torch.long)]
        cos, sin = self.rope(T)
        experts, rprobs = [[] for _ in range(T)], [[] for _ in range(T)]
        for i in range(self.L):
            p = f"model.layers.{i}"
            h = q3.rms_norm(x, self.W[p + ".input_layernorm.weight"], self.eps)
            x = x + self.attention(h, p + ".self_attn", cos, sin, self.layer_windows[i])
            h = q3.rms_norm(x, self.W[p + ".post_attention_layernorm.weight"], self.eps)
            y, ids, pr = self.moe(h, p + ".mlp", None if replay is None else replay[:, i, :])
            for t in range(T):
                experts[t].append(ids[t].tolist())
                rprobs[t].append(pr[t].tolist())
            x = x + y
        x = q3.rms_norm(x, self.W["model.norm.weight"], self.eps)
        return torch.log_softmax(self.lin(x, "lm_head"), dim=-1), experts, rprobs


def merged_weights(model):
    """qwen3_ref's merged_weights (W += scale * B @ A per adapted module), then every
    ParamWrapper's delta into the per-expert weights: gate / up += scale * B_e[0::2 / 1::2] @ A_e,
    down += scale * B_e @ A_e (float64)."""
    tensors, untied = q3.merged_weights(model)
    W = dict(tensors)
    with torch.no_grad():
        for name, specs in model.plin.items():
            for w, e, rows in specs:
                A, B = param_factors(model.W, w, model.n_experts, e, rows)
                W[name + ".weight"] = W[name + ".weight"] + w.scale * (B @ A)
    return list(W.items()), untied


def cmd_merge(args):
    model = GptOssModel(args.model, adapter=args.adapter)
    tensors, untied = merged_weights(model)
    cfg = dict(model.cfg)
    cfg["torch_dtype"] = "float32"
    cfg.pop("quantization_config", None)  # written dense
    if untied:
        cfg["tie_word_embeddings"] = False
    hf = to_hf(dict(tensors), cfg)
    write_model(args.out, cfg, [(n, t, "F32") for n, t in hf])
    print(f"merge: {len(model.lora)} adapted modules, {len(model.param_lora)} adapted stacked "
          f"parameters -> {args.out} ({len(hf)} tensors, F32"
          f"{', lm_head untied' if untied else ''})")


# ---------------------------------------------------------------------------
# selfcheck-grad
# ---------------------------------------------------------------------------

SELFCHECK_SET = {"vocab_size": 11, "hidden_size": 16, "intermediate_size": 6,
                 "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
                 "head_dim": 8, "num_local_experts": 4, "num_experts_per_tok": 2,
                 "sliding_window": 2}

# (replay, tied, lora, config overrides)
SELFCHECK_CASES = [
    (False, False, None, {}),
    (True, False, None, {"swiglu_limit": 0.5}),
    (True, True, None, {"attention_bias": False}),
    (False, False, "lora", {"swiglu_limit": 0.5}),
    (True, True, "rslora", {}),
]


def selfcheck_case(replay, tied, seed, lora, over):
    cfg = build_config(dict(SELFCHECK_SET, tie_word_embeddings=tied, **over), "f32")
    hf, _ = make_weights(cfg, seed, std=0.3)  # large std: sizeable gradients everywhere
    base_w = to_internal(dict(hf), cfg)
    model = GptOssModel(cfg=cfg, weights=base_w)
    fails = []
    assert model.layer_windows == [2, None], model.layer_windows
    T = 5
    gc, uc, n = clamp_probe(model, list(range(cfg["vocab_size"])))
    if cfg["swiglu_limit"] < 1 and not (0 < gc < n and 0 < uc < n):
        fails.append(f"swiglu_limit {cfg['swiglu_limit']}: clamps cut {gc}, {uc} of {n} (want some)")
    if lora:
        model, lora_fails = q3.selfcheck_lora(model, base_w, LORA_TARGETS, seed, lora)
        fails += lora_fails
    a0, a1 = "model.layers.0.self_attn", "model.layers.1.self_attn"

    def kinds_of(grads, visited):
        def expert(layer, part):  # the visited expert with the largest down_proj gradient
            def down(e):
                m = f"model.layers.{layer}.mlp.experts.{e}.down_proj"
                return grads[q3.lora_names(m)[1] if lora else m + ".weight"].norm()
            return f"model.layers.{layer}.mlp.experts.{max(visited[layer], key=down)}.{part}"
        mods = [("q_proj", f"{a0}.q_proj"), ("k_proj", f"{a1}.k_proj"),
                ("v_proj", f"{a0}.v_proj"), ("o_proj", f"{a1}.o_proj"),
                ("expert gate", expert(0, "gate_proj")), ("expert up", expert(1, "up_proj")),
                ("expert down", expert(1, "down_proj"))]
        if lora:
            return [(f"{kind} lora_{ab}", nm) for kind, m in mods + [("lm_head", "lm_head")]
                    for ab, nm in zip("AB", q3.lora_names(m))]
        kinds = [(kind, m + ".weight") for kind, m in mods]
        kinds += [("expert gate bias", expert(1, "gate_proj") + ".bias"),
                  ("expert up bias", expert(0, "up_proj") + ".bias"),
                  ("expert down bias", expert(0, "down_proj") + ".bias"),
                  ("embed", "model.embed_tokens.weight"),
                  ("sinks", f"{a0}.sinks"), ("sinks", f"{a1}.sinks"),
                  ("input_layernorm", "model.layers.1.input_layernorm.weight"),
                  ("post_attention_layernorm", "model.layers.0.post_attention_layernorm.weight"),
                  ("router", "model.layers.0.mlp.router.weight"),
                  ("router bias", "model.layers.1.mlp.router.bias"),
                  ("final norm", "model.norm.weight"),
                  ("lm_head", "model.embed_tokens.weight" if tied else "lm_head.weight")]
        if cfg["attention_bias"]:
            kinds += [("q bias", f"{a1}.q_proj.bias"), ("k bias", f"{a0}.k_proj.bias"),
                      ("v bias", f"{a1}.v_proj.bias"), ("o bias", f"{a0}.o_proj.bias")]
        # unrouted experts' biases: exactly zero too (selfcheck_grads checks their weights)
        for layer in range(cfg["num_hidden_layers"]):
            for e in set(range(cfg["num_local_experts"])) - set(visited[layer]):
                for part in EXPERT_PARTS:
                    bn = f"model.layers.{layer}.mlp.experts.{e}.{part}.bias"
                    if bn in grads and grads[bn].abs().max() != 0:
                        fails.append(f"unvisited expert {e} {part} bias has a non-zero gradient")
        return kinds
    worst, checked, gfails, visited, noise = q3.selfcheck_grads(model, seed, replay, kinds_of,
                                                                T=T, n_entries=3)
    return worst, checked, fails + gfails, visited, noise, (gc, uc, n)


PEFT_PARAMS_PATTERNS = ({"layers.1.mlp.experts.gate_up_proj": 3},   # rank_pattern
                        {"down_proj": 5, "gate_up_proj": 4})          # alpha_pattern


def selfcheck_peft_params(seed):
    """A PEFT-native adapter (target_parameters: ParamWrapper on both stacked expert parameters,
    r 2 with layer 1's gate_up_proj r 3 by rank_pattern, alphas by alpha_pattern; q_proj,
    o_proj, lm_head modules) written to a folder and read back: the names and r / scale the
    reader finds; a folder with an extra tensor, and a one-parameter adapter under the inner
    (base_layer) names, refused; a one-parameter adapter under PEFT's names read; autograd vs
    finite differences on its tensors, the slices of A / B of an expert never routed to (its
    router bias -30) exactly zero;
    and its function equal (1e-12) to the per-expert module adapter built from it (gate: A_e,
    B_e[0::2]; up: A_e, B_e[1::2]; down: A_e, B_e), to the base + einsum delta
    (PEFT's formula, HF layout) with the module adapters, and to merge's float64 model.
    Returns (worst rel err, entries checked, failures)."""
    cfg = build_config(dict(SELFCHECK_SET), "f32")
    E = cfg["num_local_experts"]
    hf = dict(make_weights(cfg, seed, std=0.3)[0])
    for i in range(cfg["num_hidden_layers"]):  # the last expert never routed to: its slices' zeros
        b = hf[f"model.layers.{i}.mlp.router.bias"] = hf[f"model.layers.{i}.mlp.router.bias"].clone()
        b[E - 1] = -30.0
    base_w = to_internal(hf, cfg)
    fails = []
    acfg = q3.adapter_config("selfcheck", 2, 6, False, ["q_proj", "o_proj", "lm_head"])
    acfg["target_parameters"] = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
    acfg["rank_pattern"], acfg["alpha_pattern"] = PEFT_PARAMS_PATTERNS
    tensors = make_adapter_tensors(cfg, acfg, seed + 2000, b_std=0.3)

    def write(d, cfg_, tens):
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "adapter_config.json"), "w") as f:
            json.dump(cfg_, f)
        q3.write_safetensors(os.path.join(d, "adapter_model.safetensors"), tens, "F32")
        return d

    def refused(d):
        try:
            GptOssModel(cfg=cfg, weights=base_w, adapter=d)
        except SystemExit:
            return True
        return False
    with tempfile.TemporaryDirectory() as tmp:
        model = GptOssModel(cfg=cfg, weights=base_w,
                            adapter=write(os.path.join(tmp, "a"), acfg, tensors))
        extra = tensors + [("base_model.model.model.layers.0.mlp.experts.lora_C.weight",
                            torch.zeros(1))]
        if not refused(write(os.path.join(tmp, "extra"), acfg, extra)):
            fails.append("an adapter with an extra tensor was not refused")
        one = dict(acfg, target_parameters=["mlp.experts.down_proj"], target_modules=[])
        down = [(n, t) for n, t in tensors if ".mlp.experts.lora_" in n]  # down_proj's (outer)
        try:
            m1 = GptOssModel(cfg=cfg, weights=base_w, adapter=write(os.path.join(tmp, "one"), one, down))
            if [w.a for w in m1.param_lora] != [q3.PEFT_PREFIX + f"model.layers.{i}.mlp.experts.lora_A.weight"
                                                 for i in range(2)]:
                fails.append(f"one-parameter adapter: names {[w.a for w in m1.param_lora]}")
        except SystemExit as e:
            fails.append(f"a down_proj-only adapter under PEFT's names was refused: {e}")
        inner = [(n, t) for n, t in tensors if ".base_layer." in n and "layers.0." in n]
        one_g = dict(one, target_parameters=["model.layers.0.mlp.experts.gate_up_proj"])
        if not refused(write(os.path.join(tmp, "inner"), one_g, inner)):
            fails.append("a one-parameter adapter under base_layer names was not refused")
    want = {(0, "gate_up_proj"): (2, 4 / 2, ".base_layer"), (0, "down_proj"): (2, 5 / 2, ""),
            (1, "gate_up_proj"): (3, 4 / 3, ".base_layer"), (1, "down_proj"): (2, 5 / 2, "")}
    got = {(w.layer, w.which): (w.r, w.scale, ".base_layer" if ".base_layer." in w.a else "")
           for w in model.param_lora}
    if got != want or set(model.lora) != {"lm_head"} | {f"model.layers.{i}.self_attn.{p}"
                                                        for i in range(2) for p in ("q_proj", "o_proj")}:
        fails.append(f"adapter read as {got}, modules {sorted(model.lora)}; want {want}")
    if any(sc != 3.0 for sc in model.lora.values()):
        fails.append(f"module scales {sorted(set(model.lora.values()))}, want 3")

    def kinds_of(grads, visited):
        kinds = [(f"{m} lora_{ab}", n) for m in ("model.layers.0.self_attn.q_proj",
                                                 "model.layers.1.self_attn.o_proj", "lm_head")
                 for ab, n in zip("AB", q3.lora_names(m))]
        for w in model.param_lora:
            kinds += [(f"layer {w.layer} {w.which} lora_A", w.a), (f"layer {w.layer} {w.which} lora_B", w.b)]
            for e in set(range(E)) - set(visited[w.layer]):  # unrouted: exactly zero
                ga = grads[w.a].reshape(E, w.r, w.fin)[e]
                gb = grads[w.b].reshape(w.fout, w.r, E)[:, :, e]
                if ga.abs().max() != 0 or gb.abs().max() != 0:
                    fails.append(f"unvisited expert {e}: layer {w.layer} {w.which} A/B slice "
                                 "has a non-zero gradient")
        return kinds
    # No per-expert module adapters here: qwen3_ref's zero check on their LoRA tensors is skipped
    # (kinds_of checks the wrappers' slices instead).
    model.EXPERT_PROJ = ()
    worst, checked, gfails, visited, _ = q3.selfcheck_grads(model, seed, False, kinds_of, T=5,
                                                            n_entries=3)
    fails += gfails
    if any(E - 1 in v for v in visited):
        fails.append(f"expert {E - 1} was routed to ({visited}): the zero check saw nothing")

    # The same function, three other ways. (1) trill's per-expert modules, from the brief's
    # slicing written out here (not param_factors).
    mods = {m: model.lora[m] for m in model.lora}
    lw = {n: model.W[n] for m in mods for n in q3.lora_names(m)}
    pmods, plw = dict(mods), dict(lw)
    for w in model.param_lora:
        A3 = model.W[w.a].reshape(E, w.r, w.fin)
        B3 = model.W[w.b].reshape(w.fout, w.r, E)
        for e in range(E):
            A_e, B_e = A3[e], B3[:, :, e]
            parts = ([("gate_proj", B_e[0::2]), ("up_proj", B_e[1::2])] if w.which == "gate_up_proj"
                     else [("down_proj", B_e)])
            for part, B_m in parts:
                m = f"model.layers.{w.layer}.mlp.experts.{e}.{part}"
                pmods[m] = w.scale
                an, bn = q3.lora_names(m)
                plw[an], plw[bn] = A_e.clone(), B_m.clone()
    per_expert = GptOssModel(cfg=cfg, weights=base_w, adapter=(pmods, plw))
    # (2) PEFT's einsum delta added to HF's stacked parameters; the module adapters kept.
    hfw = {n: t.to(DT) for n, t in hf.items()}
    for w in model.param_lora:
        delta = w.scale * torch.einsum("ore,eri->eio", model.W[w.b].reshape(w.fout, w.r, E),
                                       model.W[w.a].reshape(E, w.r, w.fin))
        hfw[w.param] = hfw[w.param] + delta
    einsum = GptOssModel(cfg=cfg, weights=hfw, adapter=(mods, lw))
    # (3) merge's float64 model.
    merged = GptOssModel(cfg=cfg, weights=dict(merged_weights(model)[0]))
    base_mods = GptOssModel(cfg=cfg, weights=base_w, adapter=(mods, lw))
    probe = list(range(cfg["vocab_size"]))
    with torch.no_grad():
        la = model.forward(probe)[0]
        for what, other in (("per-expert module adapter", per_expert),
                            ("base + einsum delta", einsum), ("merged model", merged)):
            d = (la - other.forward(probe)[0]).abs().max().item()
            if d > 1e-12:
                fails.append(f"{what} differs from the target_parameters adapter: {d:.2e}")
        d = (la - base_mods.forward(probe)[0]).abs().max().item()
        if d < 1e-3:
            fails.append(f"the ParamWrappers change the forward by only {d:.2e}")
    return worst, checked, fails


def cmd_selfcheck_grad(args):
    ok = True
    for c, (rp, tied, lora, over) in enumerate(SELFCHECK_CASES):
        worst, checked, fails, visited, noise, (gc, uc, n) = selfcheck_case(
            rp, tied, args.seed + c, lora, over)
        desc = " ".join(f"{k}={str(v).lower()}" for k, v in over.items())
        print(f"selfcheck-grad replay={str(rp).lower():5s} tied={str(tied).lower():5s} "
              f"lora={lora or 'none':6s} {desc}: {checked} entries, worst rel err {worst:.2e} "
              f"(fd rounding ~{noise:.0e} abs), experts visited {visited}, clamps cut "
              f"{gc}+{uc}/{n}  {'ok' if not fails else 'FAIL'}")
        for f_ in fails:
            print("  " + f_)
        ok &= not fails
    worst, checked, fails = selfcheck_peft_params(args.seed + len(SELFCHECK_CASES))
    print(f"selfcheck-grad target_parameters adapter (PEFT ParamWrapper on gate_up_proj and "
          f"down_proj, r 2 / rank_pattern 3, alpha_pattern): {checked} entries, worst rel "
          f"err {worst:.2e}; = per-expert modules, einsum delta, merge  {'ok' if not fails else 'FAIL'}")
    for f_ in fails:
        print("  " + f_)
    ok &= not fails
    # MXFP4: the dequantization's nibble order and exponent on a hand-made block.
    blocks = torch.zeros(1, 1, 1, 16, dtype=torch.uint8)
    blocks[0, 0, 0, 0] = 0x2F   # element 0: low nibble 15 (-6.0), element 1: high nibble 2 (+1.0)
    blocks[0, 0, 0, 15] = 0x81  # element 30: +0.5, element 31: -0.0
    d = mxfp4_dequantize(blocks, torch.full((1, 1, 1), 128, dtype=torch.uint8))
    want = torch.zeros(1, 32, 1, dtype=DT)
    want[0, 0, 0], want[0, 1, 0], want[0, 30, 0] = -12.0, 2.0, 1.0
    mx_ok = tuple(d.shape) == (1, 32, 1) and torch.equal(d, want)
    print(f"selfcheck mxfp4 dequantization of a hand-made block: {'ok' if mx_ok else 'FAIL'}")
    ok &= mx_ok
    print("selfcheck-grad: PASS" if ok else "selfcheck-grad: FAIL")
    return 0 if ok else 1


def main(argv=None):
    ap = q3.arg_parser(__doc__)
    # make-model's --mxfp4 (the other options are qwen3_ref's)
    sub = next(a for a in ap._actions if a.dest == "cmd")
    sub.choices["make-model"].add_argument(
        "--mxfp4", action="store_true",
        help="store the experts' gate_up_proj / down_proj as MXFP4 blocks + scales")
    ma = sub.choices["make-adapter"]
    ma.add_argument("--peft-params", action="store_true",
                    help="gate_proj / up_proj / down_proj as PEFT's target_parameters "
                         "(ParamWrapper on mlp.experts.gate_up_proj / down_proj)")
    ma.add_argument("--rank-pattern", action="append", metavar="KEY=R",
                    help="adapter_config.json rank_pattern entry (repeatable)")
    ma.add_argument("--alpha-pattern", action="append", metavar="KEY=ALPHA",
                    help="adapter_config.json alpha_pattern entry (repeatable)")
    args = ap.parse_args(argv)
    commands = {
        "make-model": cmd_make_model,
        "forward": lambda a: q3.cmd_forward(a, GptOssModel),
        "grad": lambda a: q3.cmd_grad(a, GptOssModel),
        "adamw-steps": lambda a: q3.cmd_adamw_steps(a, GptOssModel),
        "make-adapter": cmd_make_adapter,
        "merge": cmd_merge,
        "selfcheck-grad": cmd_selfcheck_grad,
    }
    return commands[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
