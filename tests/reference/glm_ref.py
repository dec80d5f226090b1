#!/usr/bin/python3
"""Independent PyTorch reference for Hugging Face GLM-4.5 (Glm4MoeForCausalLM, model_type
"glm4_moe"; GLM-4.5, GLM-4.5-Air, GLM-4.6 / 4.7 share it).

Written from the equations of HF `models/glm4_moe/modeling_glm4_moe.py` and
`configuration_glm4_moe.py` (not from the C code it checks), using only torch + numpy + stdlib
(safetensors read and written by hand). Subcommands, options, files and records are
qwen3_ref.py's, whose generic parts it imports (safetensors IO, RMSNorm, RoPE, GQA attention with
biases and QK-norm, the model function, LoRA, forward / grad / merge commands, the finite-difference
check), with deepseek_ref.py's sigmoid router (route) and per-tensor-dtype checkpoint writer:
compare.py and compare_grads.py work unchanged.

  make-model --out DIR --seed N --dtype f32|bf16 [--shards K] [--std S] [--set key=value ...]
      DIR/config.json (BASE_CONFIG + --set; a VALUE is JSON, else a string; `--set KEY=` with
      nothing after "=" leaves KEY out) and random weights under HF's tensor names, exactly the
      tensors the config implies: norms 1 + N(0, 0.1), routers N(0, 0.2), every
      e_score_correction_bias 0.05 + N(0, 0.1) (it changes the top-k of some tokens: make-model
      prints how many on a probe), q/k/v biases and every other tensor N(0, S). f32: all F32;
      bf16: all BF16 but the correction biases, F32 (HF keeps them in fp32). One
      model.safetensors, or K shards plus model.safetensors.index.json.

  forward --model DIR --input IN.jsonl --output OUT.jsonl [--replay] [--adapter ADIR [--no-lora]]
      Per line {"tokens": [...]}: {"tokens", "logprobs" (entry 0 null), "experts",
      "router_probs"}. experts[t][m]: MoE layer ordinal m's k ids by selection score
      (sigmoid + correction bias) descending, lower id first on exact ties (replayed ids as
      given); router_probs[t][m]: the router's own top-(k+1) selection scores, descending, replay
      or not (what it ranks by, for compare.py's near-tie handling).

  grad --model DIR --input IN.jsonl --output GRADS.safetensors [--replay] [--loss-out LOSS.json]
       [--adapter ADIR [--no-lora]] [--base-grads FILE]
      Lines {"tokens", "coef": [null, c_1, ...]}; loss = sum over lines and t >= 1 of
      c_t * log p(token t | tokens < t), float64 autograd through the forward's function.
      d loss / d W for every parameter, HF names, F32, the q/k/v biases included (tied: the
      embedding gets the summed gradient, no lm_head.weight; experts no token was routed to:
      zeros). The frozen e_score_correction_bias (a buffer in HF, only in the discrete choice)
      gets NO entry; compare_grads.py fails an OURS that has one (an extra). With --adapter the
      base (biases included) is frozen and GRADS holds the lora_A / lora_B gradients (PEFT
      names); --base-grads FILE also writes the base weights' gradients. LOSS.json: {"loss",
      "logprobs"}.

  adamw-steps --model DIR --input IN.jsonl --steps N --lr LR --weight-decay WD --betas B1,B2
              --eps EPS [--clip MAXNORM] --output PARAMS.safetensors [--replay] [--adapter ADIR]
      As qwen3_ref: N torch.optim.AdamW steps (float64) on the grad loss, over the tensors grad
      writes (never the correction bias).

  make-adapter --model DIR --out ADIR --rank R --alpha A [--rslora] --targets T,... --seed N
               [--b-std S]
      A PEFT LoRA adapter (adapter_config.json + adapter_model.safetensors, F32): A as PEFT's
      init, U(-1/sqrt(in), 1/sqrt(in)); B ~ N(0, S) (default 0.05, non-zero so a test sees
      it). Targets among q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj (dense
      MLP, routed and shared experts alike: PEFT matches the name's last component), lm_head.
      The router mlp.gate is Glm4MoeTopkRouter, no nn.Linear: never a target. Biases are not
      adapted (PEFT bias "none"). Tensors base_model.model.<module>.lora_A.weight [r, in] /
      .lora_B.weight [out, r].

  merge --model DIR --adapter ADIR --out MDIR
      W += scale * B @ A (scale alpha/r, or alpha/sqrt(r) with use_rslora) for every adapted
      Linear, float64, written as a full F32 model with every other tensor (biases, correction
      biases) as it was; a tied model with an lm_head adapter is written untied.

  selfcheck-grad [--seed N]
      Autograd vs central finite differences (h = 1e-6, rel err < 1e-6) on tiny float64 GLMs
      (2 layers, layer 0 dense, layer 1 MoE: hidden 16, 2 heads / 1 KV head of 8, 8 experts
      top-2, shared experts, vocab 11, 5 tokens): embedding, q/k/v/o_proj, the q/k/v biases,
      q_norm / k_norm, both RMSNorms, the router, an expert's gate/up/down, the shared experts,
      the dense MLP, final norm, lm_head; partial_rotary_factor 0.5 / 0.25 / 1.0, use_qk_norm
      on and off, attention_bias on and off, norm_topk_prob true and false, 1 and 2 shared
      experts, with and without replay, tied embeddings; LoRA (r 3 on every target, base
      frozen) with alpha/r, and rslora on a tied model with replay (B = 0 is the base exactly,
      the float64 merge is the adapter's function to 1e-12). Unrouted experts' gradients must
      be exactly zero, the correction bias must have no gradient entry, and it must change
      the routing of some probe token. About two seconds.

Model (float64; bf16 weights widened exactly). x = embed_tokens[tokens]; per layer l
  h = input_layernorm(x); x += o_proj(attn(h)); h = post_attention_layernorm(x);
  x += mlp(h); then logits = lm_head(norm(x)) (lm_head = embed_tokens with
  tie_word_embeddings). RMSNorm w * x / sqrt(mean(x^2) + rms_norm_eps).
Attention (Glm4MoeAttention): q/k/v_proj with biases iff attention_bias, o_proj never; views
  [T, heads, head_dim] (head_dim = config head_dim, else hidden_size // num_attention_heads);
  use_qk_norm: q_norm / k_norm, RMSNorm over head_dim per head, before RoPE. RoPE on the first
  rotary_dim = int(head_dim * partial_rotary_factor) dims of each head (partial_rotary_factor
  default 0.5, HF's): inv_freq = 1 / rope_theta^(arange(0, rotary_dim, 2) / rotary_dim),
  positions 0..T-1, emb = [freqs, freqs], rotate_half over those rotary_dim dims (pairs i,
  i + rotary_dim/2); the other head_dim - rotary_dim dims pass through. Causal softmax(q k^T *
  head_dim^-0.5), query head h reading KV head h // (num_attention_heads / num_key_value_heads).
MLP: layer l < first_k_dense_replace (or n_routed_experts 0): dense SwiGLU
  down(silu(gate(h)) * up(h)) of width intermediate_size. Else Glm4MoeMoE: scores =
  sigmoid(h gate.weight^T) [T, E]; ids = top-k of scores + e_score_correction_bias (n_group 1:
  no group masking); weights = the UNBIASED scores at ids, / (their sum + 1e-20) if
  norm_topk_prob, * routed_scaling_factor; out = sum_k w_k expert_k(h) + shared_experts(h)
  (SwiGLU, experts of width moe_intermediate_size, shared of moe_intermediate_size *
  n_shared_experts, added unweighted; n_shared_experts 0: none, and zero-width shared tensors
  HF would save are accepted and unused).
  n_group / topk_group other than 1 (HF masks dropped groups with 0.0), rope scaling, other
  hidden_act: refused rather than computed otherwise. The MTP layers
  (num_nextn_predict_layers: tensors of layers L, L+1, ...) are not part of the causal LM: if
  present they are ignored, as HF does.
Router replay (--replay): a line's "experts": [[[k ids] per MoE layer] per token] replaces the
  top-k ids; the weights are computed the same way from the model's unbiased scores at those
  ids, so the router keeps its gradient. Lines without "experts" route themselves.
"""

import copy
import os
import re
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deepseek_ref as ds  # noqa: E402  (the sigmoid router, the per-dtype checkpoint writer)
import qwen3_ref as q3  # noqa: E402  (the generic parts: IO, model function, commands)

BASE_CONFIG = {
    "architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe",
    "vocab_size": 97, "hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 32,
    "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "partial_rotary_factor": 0.5, "attention_bias": True, "use_qk_norm": True,
    "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2,
    "first_k_dense_replace": 1, "routed_scaling_factor": 2.5, "n_group": 1, "topk_group": 1,
    "norm_topk_prob": True, "num_nextn_predict_layers": 0,
    "rms_norm_eps": 1e-5, "rope_theta": 1000000.0, "rope_scaling": None,
    "tie_word_embeddings": False, "hidden_act": "silu", "max_position_embeddings": 4096,
    "bos_token_id": 0, "eos_token_id": 1,
    # In HF's config.json too; they do not change the forward.
    "attention_dropout": 0.0, "initializer_range": 0.02, "use_cache": True,
}
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
                "lm_head")
CORRECTION = "e_score_correction_bias"


def n_experts(cfg):
    return cfg.get("n_routed_experts") or 0


def is_moe_layer(cfg, i):
    """HF Glm4MoeDecoderLayer: the MoE block iff layer_idx >= first_k_dense_replace (and there
    are routed experts)."""
    return n_experts(cfg) > 0 and i >= cfg.get("first_k_dense_replace", 1)


def partial_rotary_factor(cfg):
    return cfg.get("partial_rotary_factor", 0.5)  # HF Glm4MoeConfig's default


def rotary_dim(cfg):
    return int(q3.head_dim_of(cfg) * partial_rotary_factor(cfg))


def check_config(cfg):
    """Refuse what this reference does not implement, rather than compute something else."""
    def need(ok, msg):
        if not ok:
            raise SystemExit(f"config: {msg}")
    need(cfg.get("model_type") == "glm4_moe", f"unsupported model_type {cfg.get('model_type')!r}")
    need(cfg.get("hidden_act", "silu") == "silu", "only hidden_act silu is implemented")
    need(not cfg.get("rope_scaling") or q3.rope_scaling_of(cfg), "rope_scaling other than YaRN is not implemented")
    rp = cfg.get("rope_parameters") or {}  # transformers v5's form of the same
    need(rp.get("rope_type", "default") == "default" and "rope_theta" in cfg
         and rp.get("rope_theta", cfg["rope_theta"]) == cfg["rope_theta"]
         and rp.get("partial_rotary_factor", partial_rotary_factor(cfg))
         == partial_rotary_factor(cfg),
         "need rope_theta, and rope_parameters (if any) the default RoPE with that theta and "
         "partial_rotary_factor")
    need(cfg["num_attention_heads"] % cfg["num_key_value_heads"] == 0,
         "num_attention_heads must be a multiple of num_key_value_heads")
    rd = rotary_dim(cfg)
    need(2 <= rd <= q3.head_dim_of(cfg) and rd % 2 == 0,
         f"partial_rotary_factor {partial_rotary_factor(cfg)} of head_dim "
         f"{q3.head_dim_of(cfg)} rotates {rd} dims (need an even number >= 2)")
    if n_experts(cfg) > 0:
        need((cfg.get("n_group") or 1) == 1 and (cfg.get("topk_group") or 1) == 1,
             "n_group / topk_group other than 1 are not implemented")
        need(1 <= cfg["num_experts_per_tok"] <= n_experts(cfg),
             "need 1 <= num_experts_per_tok <= n_routed_experts")
        need(cfg.get("n_shared_experts", 0) >= 0, "n_shared_experts must be >= 0")


def build_config(overrides, dtype):
    cfg = copy.deepcopy({**BASE_CONFIG, **overrides})
    for k in [k for k, v in overrides.items() if v == ""]:
        del cfg[k]  # `--set KEY=`: KEY absent from config.json
    cfg["torch_dtype"] = {"f32": "float32", "bf16": "bfloat16"}[dtype]
    check_config(cfg)
    return cfg


def tensor_shapes(cfg):
    """Every checkpoint tensor the config implies, (HF name, shape), in checkpoint order."""
    H, V, hd = cfg["hidden_size"], cfg["vocab_size"], q3.head_dim_of(cfg)
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    bias, qk_norm = cfg.get("attention_bias", False), cfg.get("use_qk_norm", False)
    E = n_experts(cfg)

    def mlp(p, inter):
        return [(p + ".gate_proj.weight", (inter, H)), (p + ".up_proj.weight", (inter, H)),
                (p + ".down_proj.weight", (H, inter))]
    out = [("model.embed_tokens.weight", (V, H))]
    for i in range(cfg["num_hidden_layers"]):
        p, a = f"model.layers.{i}", f"model.layers.{i}.self_attn"
        out.append((p + ".input_layernorm.weight", (H,)))
        for proj, o in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
            out.append((f"{a}.{proj}.weight", (o, H)))
            if bias:
                out.append((f"{a}.{proj}.bias", (o,)))
        out.append((a + ".o_proj.weight", (H, q)))
        if qk_norm:
            out += [(a + ".q_norm.weight", (hd,)), (a + ".k_norm.weight", (hd,))]
        out.append((p + ".post_attention_layernorm.weight", (H,)))
        if is_moe_layer(cfg, i):
            out += [(p + ".mlp.gate.weight", (E, H)), (f"{p}.mlp.gate.{CORRECTION}", (E,))]
            for e in range(E):
                out += mlp(f"{p}.mlp.experts.{e}", cfg["moe_intermediate_size"])
            if cfg.get("n_shared_experts", 0):
                out += mlp(p + ".mlp.shared_experts",
                           cfg["moe_intermediate_size"] * cfg["n_shared_experts"])
        else:
            out += mlp(p + ".mlp", cfg["intermediate_size"])
    out.append(("model.norm.weight", (H,)))
    if not cfg.get("tie_word_embeddings", False):
        out.append(("lm_head.weight", (V, H)))
    return out


def ignorable(cfg, name, shape):
    """Checkpoint tensors HF loads but the causal LM never uses: the MTP layers (model.layers.L
    and on, num_nextn_predict_layers of them), and the zero-width shared experts HF builds (and
    would save) with n_shared_experts 0."""
    m = re.match(r"model\.layers\.(\d+)\.", name)
    L = cfg["num_hidden_layers"]
    if m and L <= int(m.group(1)) < L + (cfg.get("num_nextn_predict_layers") or 0):
        return True
    return (m is not None and ".mlp.shared_experts." in name and not cfg.get("n_shared_experts")
            and is_moe_layer(cfg, int(m.group(1))) and 0 in tuple(shape))


def linear_modules(cfg):
    """Every nn.Linear of HF's Glm4MoeForCausalLM, (module name, in, out), in order: all 2-D
    weights but the embedding and the router (Glm4MoeTopkRouter is no nn.Linear), plus lm_head
    even when its weight is tied."""
    out = [(n[:-len(".weight")], s[1], s[0]) for n, s in tensor_shapes(cfg)
           if len(s) == 2 and n not in ("model.embed_tokens.weight", "lm_head.weight")
           and not n.endswith(".mlp.gate.weight")]
    return out + [("lm_head", cfg["hidden_size"], cfg["vocab_size"])]


def make_weights(cfg, seed, std=0.02):
    """Random fp32 weights in tensor_shapes order (the same seed gives the same tensors in any
    dtype or sharding)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for name, shape in tensor_shapes(cfg):
        r = torch.randn(shape, generator=g, dtype=torch.float32)
        if name.endswith("norm.weight"):
            t = 1.0 + 0.1 * r            # not all ones: the weight multiply is exercised
        elif name.endswith(CORRECTION):
            t = 0.05 + 0.1 * r           # moves the selection on some tokens; some negative
        elif name.endswith(".mlp.gate.weight"):
            t = 0.2 * r                  # router logits ~ N(0, 1.6): decisive, not saturated
        else:
            t = std * r                  # linear weights and the q/k/v biases
        out.append((name, t))
    return out


def bias_changes(model, tokens):
    """(token, MoE layer) pairs whose routed set changes when the correction biases are zeroed,
    and the number of pairs, on `tokens`."""
    with torch.no_grad():
        own = q3.run_forward(model, tokens)["experts"]
        saved = {n: t for n, t in model.W.items() if n.endswith(CORRECTION)}
        try:
            for n, t in saved.items():
                model.W[n] = torch.zeros_like(t)
            plain = q3.run_forward(model, tokens)["experts"]
        finally:
            model.W.update(saved)
    pairs = [(a, b) for t1, t2 in zip(own, plain) for a, b in zip(t1, t2)]
    return sum(set(a) != set(b) for a, b in pairs), len(pairs)


def cmd_make_model(args):
    cfg = build_config(q3.parse_set(args.set), args.dtype)
    tensors = make_weights(cfg, args.seed, args.std)
    files = ds.write_model(args.out, cfg, ds.checkpoint_entries(cfg, tensors, args.dtype, None),
                           args.shards)
    msg = ""
    if any(is_moe_layer(cfg, i) for i in range(cfg["num_hidden_layers"])):
        probe = np.random.default_rng(args.seed).integers(0, cfg["vocab_size"], 64).tolist()
        changed, total = bias_changes(GlmModel(cfg=cfg, weights=dict(tensors)), probe)
        msg = f", correction bias changes {changed}/{total} routings of a 64-token probe"
    print(f"wrote {args.out}: {len(tensors)} tensors, glm4_moe, {args.dtype}, files={files}{msg}")


class GlmModel(q3.Model):
    """qwen3_ref's model function with GLM-4.5's layer: q/k/v biases and QK-norm as the config
    says, RoPE on the first rotary_dim dims of each head, layers from first_k_dense_replace on
    the sigmoid-routed MoE (deepseek_ref.route with one group) plus the shared experts; the
    correction bias is a frozen buffer (in the checkpoint and merge, no gradient)."""
    MODEL_TYPES = ("glm4_moe",)
    MOE_BLOCK = "mlp"
    EXPERT_PROJ = ("gate_proj", "up_proj", "down_proj")

    def __init__(self, model_dir=None, cfg=None, weights=None, adapter=None):
        super().__init__(model_dir, cfg, weights, adapter)
        cfg = self.cfg
        check_config(cfg)
        self.QK_NORM = bool(cfg.get("use_qk_norm", False))
        self.rotary_dim = rotary_dim(cfg)
        self.moe_layers = [i for i in range(self.L) if is_moe_layer(cfg, i)]
        self.n_experts = n_experts(cfg)
        self.norm_topk = bool(cfg.get("norm_topk_prob", True))
        # Exactly the checkpoint tensors the config implies (a tied model may carry an unused
        # lm_head.weight; MTP layers and zero-width shared experts are dropped), with shapes.
        want = dict(tensor_shapes(cfg))
        for n in [n for n, t in self.W.items()
                  if n not in want and n not in self.lora_names and ignorable(cfg, n, t.shape)]:
            del self.W[n]
        have = {n: tuple(t.shape) for n, t in self.W.items() if n not in self.lora_names}
        if self.tied:
            have.pop("lm_head.weight", None)
        for n in sorted(set(want) | set(have)):
            if want.get(n) != have.get(n):
                raise SystemExit(f"tensor {n}: shape {list(have[n]) if n in have else 'missing'}, "
                                 f"expected {list(want[n]) if n in want else 'none (unknown)'}")

    def linear_modules(self):
        return linear_modules(self.cfg)

    def param_names(self):
        return [n for n in self.checkpoint_names() if not n.endswith(CORRECTION)]

    def moe(self, x, p, replay_ids=None):
        """Glm4MoeMoE. Returns (output, expert ids [T, k], top-(k+1) selection scores)."""
        cfg = self.cfg
        scores = torch.sigmoid(x @ self.W[p + ".gate.weight"].T)  # [T, E]
        ids, w, rp = ds.route(scores, self.W[f"{p}.gate.{CORRECTION}"],
                              cfg["num_experts_per_tok"], 1, 1, self.norm_topk,
                              float(cfg.get("routed_scaling_factor", 1.0)), replay_ids)
        out = torch.zeros_like(x)
        for e in torch.unique(ids).tolist():
            rows, slot = (ids == e).nonzero(as_tuple=True)
            y = q3.swiglu_mlp(x[rows], self, f"{p}.experts.{e}", self.EXPERT_PROJ)
            out = out.index_add(0, rows, w[rows, slot][:, None] * y)
        if cfg.get("n_shared_experts", 0):
            out = out + q3.swiglu_mlp(x, self, p + ".shared_experts")
        return out, ids, rp


# ---------------------------------------------------------------------------
# selfcheck-grad
# ---------------------------------------------------------------------------

SELFCHECK_SET = {"vocab_size": 11, "hidden_size": 16, "intermediate_size": 12,
                 "moe_intermediate_size": 6, "num_hidden_layers": 2, "num_attention_heads": 2,
                 "num_key_value_heads": 1, "head_dim": 8, "n_routed_experts": 8,
                 "num_experts_per_tok": 2, "first_k_dense_replace": 1}

# (replay, tied, lora, config overrides)
SELFCHECK_CASES = [
    (False, False, None, {}),
    (True, False, None, {"norm_topk_prob": False, "use_qk_norm": False,
                         "partial_rotary_factor": 0.25}),
    (True, True, None, {"attention_bias": False, "partial_rotary_factor": 1.0,
                        "n_shared_experts": 2}),
    (False, False, "lora", {}),
    (True, True, "rslora", {"use_qk_norm": False, "norm_topk_prob": False}),
]


def selfcheck_case(replay, tied, seed, lora, over):
    cfg = build_config(dict(SELFCHECK_SET, tie_word_embeddings=tied, **over), "f32")
    # Large std: sizeable gradients everywhere, so central differences resolve them.
    base_w = dict(make_weights(cfg, seed, std=0.3))
    model = GlmModel(cfg=cfg, weights=base_w)
    fails = []
    changed, total = bias_changes(model, list(range(cfg["vocab_size"])))
    if not changed:
        fails.append(f"the correction bias changes none of {total} probe routings")
    if lora:
        model, lora_fails = q3.selfcheck_lora(model, base_w, LORA_TARGETS, seed, lora)
        fails += lora_fails
    assert model.moe_layers == [1], model.moe_layers
    a0, a1 = "model.layers.0.self_attn", "model.layers.1.self_attn"

    def kinds_of(grads, visited):
        def expert(proj):  # the visited expert with the largest down_proj gradient
            def down(e):
                m = f"model.layers.1.mlp.experts.{e}.down_proj"
                return grads[q3.lora_names(m)[1] if lora else m + ".weight"].norm()
            return f"model.layers.1.mlp.experts.{max(visited[0], key=down)}.{proj}"
        mods = [("q_proj", f"{a0}.q_proj"), ("k_proj", f"{a1}.k_proj"),
                ("v_proj", f"{a0}.v_proj"), ("o_proj", f"{a1}.o_proj"),
                ("dense gate", "model.layers.0.mlp.gate_proj"),
                ("dense down", "model.layers.0.mlp.down_proj"),
                ("expert gate", expert("gate_proj")), ("expert up", expert("up_proj")),
                ("expert down", expert("down_proj")),
                ("shared up", "model.layers.1.mlp.shared_experts.up_proj"),
                ("shared down", "model.layers.1.mlp.shared_experts.down_proj")]
        if lora:
            return [(f"{kind} lora_{ab}", n) for kind, m in mods + [("lm_head", "lm_head")]
                    for ab, n in zip("AB", q3.lora_names(m))]
        kinds = [(kind, m + ".weight") for kind, m in mods]
        kinds += [("embed", "model.embed_tokens.weight"),
                  ("input_layernorm", "model.layers.1.input_layernorm.weight"),
                  ("post_attention_layernorm", "model.layers.0.post_attention_layernorm.weight"),
                  ("router", "model.layers.1.mlp.gate.weight"),
                  ("final norm", "model.norm.weight"),
                  ("lm_head", "model.embed_tokens.weight" if tied else "lm_head.weight")]
        if cfg["attention_bias"]:
            kinds += [("q bias", f"{a1}.q_proj.bias"), ("k bias", f"{a0}.k_proj.bias"),
                      ("v bias", f"{a1}.v_proj.bias")]
        if cfg["use_qk_norm"]:
            kinds += [("q_norm", f"{a0}.q_norm.weight"), ("k_norm", f"{a1}.k_norm.weight")]
        if any(n.endswith(CORRECTION) for n in grads):
            fails.append("e_score_correction_bias has a gradient entry")
        return kinds
    worst, checked, gfails, visited, noise = q3.selfcheck_grads(model, seed, replay, kinds_of,
                                                                n_entries=3)
    return worst, checked, fails + gfails, visited, noise, (changed, total)


def cmd_selfcheck_grad(args):
    ok = True
    for c, (rp, tied, lora, over) in enumerate(SELFCHECK_CASES):
        worst, checked, fails, visited, noise, (ch, tot) = selfcheck_case(rp, tied, args.seed + c,
                                                                          lora, over)
        desc = " ".join(f"{k}={str(v).lower()}" for k, v in over.items())
        print(f"selfcheck-grad replay={str(rp).lower():5s} tied={str(tied).lower():5s} "
              f"lora={lora or 'none':6s} {desc}: {checked} entries, worst rel err {worst:.2e} "
              f"(fd rounding ~{noise:.0e} abs), experts visited {visited}, correction bias "
              f"changes {ch}/{tot} probe routings  {'ok' if not fails else 'FAIL'}")
        for f_ in fails:
            print("  " + f_)
        ok &= not fails
    print("selfcheck-grad: PASS" if ok else "selfcheck-grad: FAIL")
    return 0 if ok else 1


def main(argv=None):
    args = q3.arg_parser(__doc__).parse_args(argv)
    commands = {
        "make-model": cmd_make_model,
        "forward": lambda a: q3.cmd_forward(a, GlmModel),
        "grad": lambda a: q3.cmd_grad(a, GlmModel),
        "adamw-steps": lambda a: q3.cmd_adamw_steps(a, GlmModel),
        "make-adapter": lambda a: q3.cmd_make_adapter(a, linear_modules),
        "merge": lambda a: q3.cmd_merge(a, GlmModel),
        "selfcheck-grad": cmd_selfcheck_grad,
    }
    return commands[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
