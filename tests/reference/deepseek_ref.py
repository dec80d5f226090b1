#!/usr/bin/python3
"""Independent PyTorch reference for Hugging Face DeepseekV3ForCausalLM
(model_type "deepseek_v3" or "kimi_k2": DeepSeek-V3 / Kimi K2).

Written from HF `models/deepseek_v3/modeling_deepseek_v3.py` (commit 00b676f8f048),
the current `modeling_rope_utils._compute_yarn_parameters` and DeepSeek's
`inference/model.py` Gate, not from the C code it checks; torch + numpy + stdlib
only (safetensors and FP8 E4M3 by hand). Subcommands, files and records are
qwen3_ref.py's (whose generic helpers it imports): compare.py and
compare_grads.py work unchanged.

  make-model --out DIR --seed N --dtype f32|bf16|fp8 [--block R,C] [--shards K] [--std S]
             [--set key=value ...] [--fp8-break missing-scale|wrong-shape|wrong-dtype]
      config.json (BASE_CONFIG + --set, values JSON; head_dim and num_key_value_heads
      follow qk_rope_head_dim / num_attention_heads unless set) and random weights,
      exactly the tensors the config implies. f32: all F32; bf16: all BF16; every
      e_score_correction_bias F32 (HF keeps it fp32). fp8, the official DeepSeek-V3
      format: every decoder-layer Linear weight (attention projections, dense /
      routed / shared gate/up/down_proj) F8_E4M3 (OCP E4M3FN) with an F32
      "<prefix>.weight_scale_inv" [ceil(out/R), ceil(in/C)] (--block, default 128,128;
      partial edge blocks allowed): W[i,j] = fp8[i,j] * scale_inv[i//R, j//C]. Per
      block scale_inv = amax|w| / 448 (fp32; 1 for a zero block), fp8 = round to
      nearest even of the fp32 quotient w / scale_inv, saturating at 448. Embedding,
      norms, router gate.weight, lm_head BF16; config gets "quantization_config"
      {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
      "weight_block_size": [R, C]}. --fp8-break (error tests): layer 0's q_a_proj
      (q_proj without q_lora_rank) loses its weight_scale_inv, gets one block row
      too many, or has it as BF16; this reference refuses all three.

  forward --model DIR --input IN.jsonl --output OUT.jsonl [--replay] [--adapter ADIR [--no-lora]]
          [--fp8-as exact|bf16]
      --fp8-as bf16: FP8 weights as a bf16 base holds them (the fp32 product code *
      scale rounded to bf16), not exactly. Per line {"tokens"}: {"tokens", "logprobs" (entry 0 null), "experts",
      "router_probs"}. experts[t][m]: MoE layer ordinal m's k ids by selection score
      (biased, group-masked) descending, lower id first on exact ties; with replay
      the replayed ids as given. router_probs[t][m]: always the router's own top-(k+1)
      selection scores (sigmoid + bias) among eligible experts (in kept groups; only
      k when only k are eligible), descending, so compare.py's near-tie handling
      looks at what the router ranks by. Near ties between *group* scores are not
      flagged (a flip needs two group scores within ~1e-7).

  grad --model DIR --input IN.jsonl --output GRADS.safetensors [--replay] [--loss-out LOSS.json]
       [--adapter ADIR [--no-lora]] [--base-grads FILE]
      As qwen3_ref: loss = sum over lines and t >= 1 of coef[t] * logprob[t]; float64
      autograd; F32 gradients under HF names (tied: summed on the embedding; unrouted
      experts zeros; fp8: of the dequantized weights, under ".weight"). The frozen
      e_score_correction_bias (only in the discrete choice) and weight_scale_inv get
      NO entry; compare_grads.py fails an OURS that has one (an extra). --adapter:
      the lora_A/lora_B gradients only (base frozen); --base-grads as qwen3_ref.

  adamw-steps --model DIR --input IN.jsonl --steps N --lr LR --weight-decay WD --betas B1,B2
              --eps EPS [--clip MAXNORM] --output PARAMS.safetensors [--replay] [--adapter ADIR]
      As qwen3_ref: torch.optim.AdamW on the grad loss over the tensors grad writes.

  make-adapter --model DIR --out ADIR --rank R --alpha A [--rslora] --targets T,... --seed N
               [--b-std S]
      PEFT LoRA adapter as qwen3_ref. Targets among q_a_proj, q_b_proj, q_proj,
      kv_a_proj_with_mqa, kv_b_proj, o_proj, gate_proj, up_proj, down_proj, lm_head
      (PEFT: the module name ends with "." + target, so gate/up/down_proj select
      dense, routed and shared experts). The router mlp.gate is no nn.Linear in HF.

  selfcheck-grad [--seed N]  autograd vs central differences (h 1e-6, rel < 1e-6)
  selfcheck-router           hand-made group / bias / replay / masking cases
  selfcheck-fp8              the E4M3 codec: all 256 codes, RNE and saturation

Model (float64; bf16 / fp8 weights widened / dequantized exactly): per layer
  x += o_proj(MLA(input_layernorm(x))); x += FFN(post_attention_layernorm(x));
  logits = lm_head(norm(x)). RMSNorm w * x / sqrt(mean(x^2) + eps), eps =
  rms_norm_eps, but 1e-6 for q_a_layernorm / kv_a_layernorm (HF's default there).
  MLA: q = q_b_proj(q_a_layernorm(q_a_proj(h))) (or q_proj(h)) -> [T, nh, nope|rope];
  kv_a_proj_with_mqa(h) = [latent | k_rope] (one rope key for all heads);
  kv_b_proj(kv_a_layernorm(latent)) -> [T, nh, k_nope|v]. Queries [q_nope,
  rope(q_rope)], keys [k_nope, rope(k_rope)], causal softmax with scale
  (nope+rope)^-0.5, times mscale^2 if rope_scaling.mscale_all_dim != 0 (mscale =
  get_mscale(factor, mscale_all_dim)); [T, nh*v] -> o_proj. FFN: MoE iff
  n_routed_experts > 0, l >= first_k_dense_replace and l % moe_layer_freq == 0
  (DeepSeek's predicate; HF omits the freq), else SwiGLU down(silu(gate) * up).

RoPE (as HF: float32, then cast to float64), dim = qk_rope_head_dim, base =
  rope_theta, positions 0..T-1. Default: inv_freq = 1 / base^(arange(0, dim, 2,
  int64).float32 / dim). YaRN, transformers main (rope_parameters era; older
  versions took get_mscale(factor) as attention factor whatever mscale, applying
  the scaling twice with the softmax mscale^2, and max_position_embeddings as orig):
  pos = base^(arange(0, dim, 2).float32 / dim); low / high = floor / ceil
  (truncate, default true) of dim ln(orig / (2 pi beta)) / (2 ln base) for beta_fast
  (32) / beta_slow (1), clamped to [0, dim-1], orig = original_max_position_embeddings
  (else max_position_embeddings); ramp = clamp((arange(dim/2).float32 - low) / (high
  - low), 0, 1) (high += 0.001 if equal); inv_freq = ramp / (factor pos) + (1 - ramp)
  / pos. attention_factor = rope_scaling.attention_factor, else get_mscale(factor,
  mscale) / get_mscale(factor, mscale_all_dim) when both nonzero, else
  get_mscale(factor); get_mscale(s, m) = 0.1 m ln s + 1 for s > 1, else 1. angle =
  float32(pos) * inv_freq, emb = [angle, angle], cos = cos(emb) * attention_factor,
  sin likewise, in float32. rope_interleave (default true): HF's
  apply_rotary_pos_emb_interleave permutes the dims to (0, 2, ..., 1, 3, ...) before
  rotate_half (= rotating pairs (2i, 2i+1)); false: plain rotate_half.

Router (noaux_tc): scores = sigmoid(h gate^T), sel = scores + e_score_correction_bias;
  n_group > 1: group score = sum of the 2 best sel in each of the n_group blocks of
  consecutive experts; the topk_group best groups stay (lower index first on exact
  ties), all other experts get sel = -inf (DeepSeek's Gate; HF's 0.0 differs when
  kept experts have sel < 0, selfcheck-router (d)); ids = top-k sel; weights = the
  UNBIASED scores at ids, / (sum + 1e-20) if norm_topk_prob, * routed_scaling_factor;
  out = sum_k w_k expert_k(h) + shared_experts(h) (width moe_intermediate_size *
  n_shared_experts, unweighted; none when 0). Replay (--replay, a line's "experts":
  [[[k ids] per MoE layer ordinal] per token]) replaces ids, even in dropped groups;
  the weights are computed the same way from the model's scores, so the router keeps
  its gradient. Lines without "experts" route themselves.
"""

import argparse
import copy
import json
import math
import os
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from qwen3_ref import (  # noqa: E402  (model-independent helpers)
    DT, adapter_arg, adapter_config, lora_names, lora_scale, parse_betas, parse_coef,
    parse_set, parse_targets, parse_tokens, read_jsonl, rms_norm, rotate_half,
    run_forward, split_shards, swiglu_mlp, target_matches, tensor_bytes, token_logprobs, yarn_get_mscale, yarn_inv_freq)

BASE_CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
    "vocab_size": 97, "hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 32,
    "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 4,
    "n_routed_experts": 16, "n_shared_experts": 1, "num_experts_per_tok": 4,
    "n_group": 4, "topk_group": 2, "routed_scaling_factor": 2.5, "norm_topk_prob": True,
    "scoring_func": "sigmoid", "topk_method": "noaux_tc",
    "first_k_dense_replace": 1, "moe_layer_freq": 1,
    "q_lora_rank": 24, "kv_lora_rank": 16, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
    "v_head_dim": 16, "head_dim": 8,
    "rope_theta": 10000.0, "rope_interleave": True, "max_position_embeddings": 256,
    "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                     "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
    "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "attention_bias": False,
    "attention_dropout": 0.0, "num_nextn_predict_layers": 0, "hidden_act": "silu",
}

MODEL_TYPES = ("deepseek_v3", "kimi_k2")
LORA_TARGETS = ("q_a_proj", "q_b_proj", "q_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj",
                "gate_proj", "up_proj", "down_proj", "lm_head")
SUB_NORM_EPS = 1e-6  # HF: DeepseekV3RMSNorm(q_lora_rank) / (kv_lora_rank), default eps


def is_deepseek(cfg):
    return cfg.get("model_type") in MODEL_TYPES


def n_experts(cfg):
    return cfg.get("n_routed_experts") or 0


def is_moe_layer(cfg, i):
    """DeepSeek-V3: layer i has the routed MoE block iff this holds."""
    return (n_experts(cfg) > 0 and i >= cfg.get("first_k_dense_replace", 0)
            and i % cfg.get("moe_layer_freq", 1) == 0)


def check_config(cfg):
    """Refuse what this reference does not implement, rather than compute something else."""
    def need(ok, msg):
        if not ok:
            raise SystemExit(f"config: {msg}")
    need(is_deepseek(cfg), f"unsupported model_type {cfg.get('model_type')!r}")
    need(cfg.get("hidden_act", "silu") == "silu", "only hidden_act silu is implemented")
    need(not cfg.get("attention_bias", False), "attention_bias is not implemented")
    need(cfg.get("num_key_value_heads", cfg["num_attention_heads"]) == cfg["num_attention_heads"],
         "num_key_value_heads must equal num_attention_heads")
    need(cfg.get("head_dim", cfg["qk_rope_head_dim"]) == cfg["qk_rope_head_dim"],
         "head_dim must equal qk_rope_head_dim")
    need(cfg["qk_rope_head_dim"] % 2 == 0, "qk_rope_head_dim must be even")
    rs = cfg.get("rope_scaling")
    need(not rs or (rs.get("rope_type", rs.get("type")) == "yarn" and rs.get("factor")),
         "rope_scaling must be null or yarn with a factor")
    if n_experts(cfg) > 0:
        E, G = n_experts(cfg), cfg.get("n_group") or 1
        need(cfg.get("scoring_func", "sigmoid") == "sigmoid", "only scoring_func sigmoid")
        need(cfg.get("topk_method", "noaux_tc") == "noaux_tc", "only topk_method noaux_tc")
        need(E % G == 0 and (G == 1 or E // G >= 2), "n_group must divide n_routed_experts "
             "into groups of >= 2")
        tg = cfg.get("topk_group") or 1
        need(G == 1 or tg <= G, "need topk_group <= n_group")
        kept = E if G == 1 else tg * (E // G)
        need(1 <= cfg["num_experts_per_tok"] <= kept, "num_experts_per_tok > kept experts")


# ---------------------------------------------------------------------------
# Tensor table (names and shapes the config implies, in checkpoint order)
# ---------------------------------------------------------------------------

def tensor_shapes(cfg):
    H, V, nh = cfg["hidden_size"], cfg["vocab_size"], cfg["num_attention_heads"]
    dn, dr, dv = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    qr, kvr = cfg.get("q_lora_rank"), cfg["kv_lora_rank"]
    out = [("model.embed_tokens.weight", (V, H))]

    def mlp(q, inter):
        return [(q + ".gate_proj.weight", (inter, H)), (q + ".up_proj.weight", (inter, H)),
                (q + ".down_proj.weight", (H, inter))]
    for i in range(cfg["num_hidden_layers"]):
        p, a = f"model.layers.{i}", f"model.layers.{i}.self_attn"
        out.append((p + ".input_layernorm.weight", (H,)))
        if qr:
            out += [(a + ".q_a_proj.weight", (qr, H)), (a + ".q_a_layernorm.weight", (qr,)),
                    (a + ".q_b_proj.weight", (nh * (dn + dr), qr))]
        else:
            out.append((a + ".q_proj.weight", (nh * (dn + dr), H)))
        out += [(a + ".kv_a_proj_with_mqa.weight", (kvr + dr, H)),
                (a + ".kv_a_layernorm.weight", (kvr,)),
                (a + ".kv_b_proj.weight", (nh * (dn + dv), kvr)),
                (a + ".o_proj.weight", (H, nh * dv)),
                (p + ".post_attention_layernorm.weight", (H,))]
        if is_moe_layer(cfg, i):
            E = n_experts(cfg)
            out += [(p + ".mlp.gate.weight", (E, H)),
                    (p + ".mlp.gate.e_score_correction_bias", (E,))]
            for e in range(E):
                out += mlp(f"{p}.mlp.experts.{e}", cfg["moe_intermediate_size"])
            if cfg.get("n_shared_experts"):
                out += mlp(p + ".mlp.shared_experts",
                           cfg["moe_intermediate_size"] * cfg["n_shared_experts"])
        else:
            out += mlp(p + ".mlp", cfg["intermediate_size"])
    out.append(("model.norm.weight", (H,)))
    if not cfg.get("tie_word_embeddings", False):
        out.append(("lm_head.weight", (V, H)))
    return out


def linear_modules(cfg):
    """Every LoRA-able nn.Linear as (module name, in, out): all 2-D weights but the
    embedding and the router (not an nn.Linear in HF), plus lm_head even when tied."""
    mods = [(n[:-len(".weight")], s[1], s[0]) for n, s in tensor_shapes(cfg)
            if len(s) == 2 and n != "model.embed_tokens.weight"
            and not n.endswith(".mlp.gate.weight") and n != "lm_head.weight"]
    return mods + [("lm_head", cfg["hidden_size"], cfg["vocab_size"])]


def fp8_modules(cfg):
    """The Linear weights the official fp8 checkpoint quantizes: all of the decoder layers'."""
    return {n + ".weight" for n, _, _ in linear_modules(cfg) if n.startswith("model.layers.")}


# ---------------------------------------------------------------------------
# FP8 E4M3 (OCP E4M3FN) codec, by hand
# ---------------------------------------------------------------------------
# Bits S.EEEE.MMM, bias 7: E = 0 -> subnormal M * 2^-9; else (8 + M) * 2^(E - 10);
# S.1111.111 is NaN; no infinities; max finite 0x7E = 448.

def _e4m3_table():
    c = np.arange(256)
    e, m = (c >> 3) & 15, c & 7
    mag = np.where(e == 0, m * 2.0 ** -9, (8 + m) * np.exp2(e - 10.0))
    mag[(e == 15) & (m == 7)] = np.nan
    return np.where(c >= 128, -mag, mag)


E4M3_VALUES = _e4m3_table()          # float64 value of every code
E4M3_POS = E4M3_VALUES[:127]         # codes 0x00..0x7E: the finite non-negatives, increasing


def e4m3_encode(x):
    """float64 array -> uint8 codes: round to nearest, ties to even, saturating at 448."""
    x = np.asarray(x, dtype=np.float64)
    if not np.isfinite(x).all():
        raise ValueError("e4m3_encode: non-finite input")
    a = np.minimum(np.abs(x), 448.0)
    # Spacing of the E4M3 values around a: 2^(floor(log2 a) - 3), 2^-9 in the subnormals.
    ex = np.maximum(np.frexp(a)[1] - 1, -6)
    q = np.exp2(ex - 3.0)
    v = np.rint(a / q) * q  # np.rint: half to even; a / q and the product are exact
    code = np.searchsorted(E4M3_POS, v)
    assert (E4M3_POS[code] == v).all()
    return (code | np.where(np.signbit(x), 0x80, 0)).astype(np.uint8)


def fp8_quantize(w, R, C):
    """fp32 [o, i] -> (uint8 code tensor [o, i], fp32 scale_inv [ceil(o/R), ceil(i/C)])."""
    w = w.to(torch.float32)
    o, i = w.shape
    gr, gc = -(-o // R), -(-i // C)
    padded = torch.zeros(gr * R, gc * C, dtype=torch.float32)
    padded[:o, :i] = w
    amax = padded.abs().view(gr, R, gc, C).amax(dim=(1, 3))
    s = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
    full = s.repeat_interleave(R, 0).repeat_interleave(C, 1)[:o, :i]
    return torch.from_numpy(e4m3_encode((w / full).numpy().astype(np.float64))), s


def fp8_dequantize(values, scale, R, C):
    o, i = values.shape
    return values * scale.repeat_interleave(R, 0).repeat_interleave(C, 1)[:o, :i]


# ---------------------------------------------------------------------------
# safetensors with per-tensor dtypes (F32, BF16, F16, F64, F8_E4M3)
# ---------------------------------------------------------------------------

ST_DTYPES = {"F32": (4, "<f4"), "BF16": (2, "<u2"), "F16": (2, "<f2"), "F64": (8, "<f8"),
             "F8_E4M3": (1, "u1")}


def write_st(path, entries):
    """entries: (name, tensor, dtype); F8_E4M3 tensors are uint8 code tensors."""
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name, t, dt in entries:
        b = t.numpy().tobytes() if dt == "F8_E4M3" else tensor_bytes(t, dt)
        header[name] = {"dtype": dt, "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * ((-len(h)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    return off


def read_st(path):
    """{name: (dtype, float64 tensor)}; F8_E4M3 decoded to its values (scale not applied)."""
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
        if dt == "BF16":
            raw = (raw.astype(np.uint32) << 16).view(np.float32)
        arr = E4M3_VALUES[raw] if dt == "F8_E4M3" else raw.astype(np.float64)
        if dt == "F8_E4M3" and np.isnan(arr).any():
            raise SystemExit(f"{path}: tensor {name} holds the fp8 NaN code")
        out[name] = (dt, torch.from_numpy(arr.reshape(shape)))
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


def block_size(cfg):
    qc = cfg.get("quantization_config")
    if not qc:
        return None
    if qc.get("quant_method") != "fp8" or qc.get("fmt", "e4m3") != "e4m3":
        raise SystemExit(f"quantization_config {qc!r}: only fp8 e4m3 is supported")
    return tuple(qc.get("weight_block_size") or (128, 128))


def load_weights(model_dir, cfg, fp8_as_bf16=False):
    """Strict: exactly the tensors the config implies (+ a weight_scale_inv per F8 weight),
    shapes checked; F8_E4M3 weights returned dequantized (float64, exact), or with fp8_as_bf16
    as a bf16 base keeps them: the fp32 product code * scale rounded to bf16 (nearest even)."""
    stored, expected = read_checkpoint(model_dir), dict(tensor_shapes(cfg))
    block, W = block_size(cfg), {}
    for name, (dt, t) in stored.items():
        if name.endswith(".weight_scale_inv"):
            w = name[:-len("_scale_inv")]
            if w not in stored or stored[w][0] != "F8_E4M3":
                raise SystemExit(f"{name}: a scale for no F8_E4M3 weight")
            continue
        if name not in expected:
            raise SystemExit(f"unexpected tensor {name} (not implied by config.json)")
        if tuple(t.shape) != tuple(expected[name]):
            raise SystemExit(f"{name}: shape {list(t.shape)}, expected {list(expected[name])}")
        if dt == "F8_E4M3":
            if block is None or len(t.shape) != 2:
                raise SystemExit(f"{name}: F8_E4M3 needs a 2-D weight and fp8 quantization_config")
            sn = name + "_scale_inv"
            grid = [-(-t.shape[0] // block[0]), -(-t.shape[1] // block[1])]
            if sn not in stored:
                raise SystemExit(f"{name}: F8_E4M3 without {sn}")
            sdt, s = stored[sn]
            if sdt != "F32" or list(s.shape) != grid:
                raise SystemExit(f"{sn}: {sdt} {list(s.shape)}, expected F32 {grid}")
            t = fp8_dequantize(t, s, *block)
            if fp8_as_bf16:  # code * scale is exact in float64, so .float() is the fp32 product
                t = t.float().to(torch.bfloat16).to(torch.float64)
        W[name] = t
    missing = [n for n in expected if n not in W]
    if missing:
        raise SystemExit(f"checkpoint lacks {missing[:5]}")
    return W


# ---------------------------------------------------------------------------
# make-model
# ---------------------------------------------------------------------------

def build_config(overrides, dtype, block=(128, 128)):
    # deep: no list or dict shared with BASE_CONFIG, which outlives the command (pystep.py)
    cfg = copy.deepcopy({**BASE_CONFIG, **overrides})
    for key, src in (("head_dim", "qk_rope_head_dim"),
                     ("num_key_value_heads", "num_attention_heads")):
        if key not in overrides:
            cfg[key] = cfg[src]
    cfg["torch_dtype"] = {"f32": "float32", "bf16": "bfloat16", "fp8": "bfloat16"}[dtype]
    if dtype == "fp8":
        cfg["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3",
                                      "quant_method": "fp8", "weight_block_size": list(block)}
    check_config(cfg)
    return cfg


def make_weights(cfg, seed, std=0.02):
    """Random fp32 weights in tensor_shapes order (same seed, same values for every dtype)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for name, shape in tensor_shapes(cfg):
        r = torch.randn(shape, generator=g, dtype=torch.float32)
        if name.endswith("norm.weight"):
            t = 1.0 + 0.1 * r            # not all ones: the weight multiply is exercised
        elif name.endswith("e_score_correction_bias"):
            t = 0.05 + 0.1 * r           # moves the selection on some tokens; some negative
        elif name.endswith(".mlp.gate.weight"):
            t = 0.2 * r                  # router logits ~ N(0, 1.6): decisive, not saturated
        else:
            t = std * r
        out.append((name, t))
    return out


def checkpoint_entries(cfg, tensors, dtype, block, fp8_break=None):
    """(name, tensor, safetensors dtype) in checkpoint order for --dtype."""
    quant = fp8_modules(cfg) if dtype == "fp8" else set()
    entries = []
    for name, t in tensors:
        if name in quant:
            codes, s = fp8_quantize(t, *block)
            entries += [(name, codes, "F8_E4M3"), (name + "_scale_inv", s, "F32")]
        elif name.endswith("e_score_correction_bias") or dtype == "f32":
            entries.append((name, t, "F32"))
        else:
            entries.append((name, t, "BF16"))
    if fp8_break:
        if dtype != "fp8":
            raise SystemExit("--fp8-break needs --dtype fp8")
        a = "model.layers.0.self_attn." + ("q_a_proj" if cfg.get("q_lora_rank") else "q_proj")
        j = next(j for j, e in enumerate(entries) if e[0] == a + ".weight_scale_inv")
        s = entries[j][1]
        if fp8_break == "missing-scale":
            del entries[j]
        elif fp8_break == "wrong-shape":
            entries[j] = (entries[j][0], torch.cat([s, s[:1]]), "F32")
        else:
            entries[j] = (entries[j][0], s, "BF16")
    return entries


def parse_block(text):
    rc = text.split(",")
    if len(rc) != 2 or not all(x.strip().isdigit() and int(x) > 0 for x in rc):
        raise SystemExit(f"--block expects R,C (positive integers), got {text!r}")
    return int(rc[0]), int(rc[1])


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
    dts = {n: (t, dt) for n, t, dt in entries}
    weight_map, total, files = {}, 0, []
    parts = split_shards([(n, t) for n, t, _ in entries], shards, 1)
    for i, part in enumerate(parts):
        fn = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        total += write_st(os.path.join(out_dir, fn), [(n, t, dts[n][1]) for n, t in part])
        weight_map.update({n: fn for n, _ in part})
        files.append(fn)
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
        f.write("\n")
    return files


def cmd_make_model(args):
    block = parse_block(args.block)
    cfg = build_config(parse_set(args.set), args.dtype, block)
    entries = checkpoint_entries(cfg, make_weights(cfg, args.seed, args.std), args.dtype, block,
                                 args.fp8_break)
    files = write_model(args.out, cfg, entries, args.shards)
    print(f"wrote {args.out}: {len(entries)} tensors, {cfg['model_type']}, {args.dtype}"
          f"{' block ' + args.block if args.dtype == 'fp8' else ''}"
          f"{' (broken: ' + args.fp8_break + ')' if args.fp8_break else ''}, files={files}")


# ---------------------------------------------------------------------------
# RoPE / YaRN tables
# ---------------------------------------------------------------------------

def rope_inv_freq(cfg):
    """(inv_freq float32 [dim/2], attention_factor) as transformers computes them."""
    dim, base, f32 = cfg["qk_rope_head_dim"], float(cfg["rope_theta"]), torch.float32
    rs = cfg.get("rope_scaling")
    if not rs:
        return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(f32) / dim)), 1.0
    return yarn_inv_freq(rs, dim, base, cfg["max_position_embeddings"])


def rope_cos_sin(cfg, T):
    inv_freq, af = rope_inv_freq(cfg)
    angle = torch.arange(T).to(torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat((angle, angle), dim=-1)
    return (emb.cos() * af).to(DT)[:, None, :], (emb.sin() * af).to(DT)[:, None, :]


def softmax_scale(cfg):
    scale = (cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]) ** -0.5
    rs = cfg.get("rope_scaling")
    if rs and rs.get("mscale_all_dim", 0):
        m = yarn_get_mscale(float(rs["factor"]), rs["mscale_all_dim"])
        scale = scale * m * m
    return scale


def apply_rope(x, cos, sin, interleave):
    if interleave:  # HF apply_rotary_pos_emb_interleave: (0, 2, 4, ..., 1, 3, 5, ...)
        x = x.reshape(*x.shape[:-1], x.shape[-1] // 2, 2).transpose(-1, -2).reshape(x.shape)
    return x * cos + rotate_half(x) * sin


# ---------------------------------------------------------------------------
# Router
# ---------------------------------------------------------------------------

def route(scores, bias, k, n_group, topk_group, norm_topk, rsf, replay_ids=None):
    """DeepSeek-V3 noaux_tc routing of [T, E] sigmoid scores.
    Returns (ids [T, k], weights [T, k], top-(k+1) eligible selection scores)."""
    T, E = scores.shape
    sel = scores.detach() + bias
    n_elig = E
    if n_group > 1:
        grouped = sel.view(T, n_group, E // n_group)
        gscore = grouped.topk(2, dim=-1).values.sum(-1)
        keep = torch.sort(gscore, dim=-1, descending=True, stable=True).indices[:, :topk_group]
        drop = torch.ones(T, n_group, dtype=torch.bool).scatter(1, keep, False)
        sel = grouped.masked_fill(drop[:, :, None], float("-inf")).reshape(T, E)
        n_elig = topk_group * (E // n_group)
    vals, order = torch.sort(sel, dim=-1, descending=True, stable=True)
    ids = order[:, :k] if replay_ids is None else replay_ids
    w = scores.gather(1, ids)
    if norm_topk:
        w = w / (w.sum(-1, keepdim=True) + 1e-20)
    return ids, w * rsf, vals[:, :min(k + 1, n_elig)]


# ---------------------------------------------------------------------------
# LoRA adapters (PEFT layout; conventions as qwen3_ref's "LoRA adapters")
# ---------------------------------------------------------------------------

def load_adapter(adapter_dir, cfg):
    """Returns ({module: scale}, {PEFT tensor name: float64 tensor})."""
    with open(os.path.join(adapter_dir, "adapter_config.json")) as f:
        acfg = json.load(f)
    if acfg.get("peft_type", "LORA") != "LORA":
        raise SystemExit(f"{adapter_dir}: peft_type {acfg.get('peft_type')!r} is not LORA")
    for key, off in (("use_dora", False), ("fan_in_fan_out", False), ("bias", "none")):
        if acfg.get(key, off) not in (off, None):
            raise SystemExit(f"{adapter_dir}: {key}={acfg[key]!r} is not supported")
    for key in ("rank_pattern", "alpha_pattern", "layers_to_transform", "modules_to_save",
                "layer_replication"):
        if acfg.get(key):
            raise SystemExit(f"{adapter_dir}: {key} is not supported")
    targets = acfg.get("target_modules")
    if targets in (None, "all-linear") or not isinstance(targets, (str, list)):
        raise SystemExit(f"{adapter_dir}: target_modules must be a list or a regex string")
    stored = read_st(os.path.join(adapter_dir, "adapter_model.safetensors"))
    tensors = {n: t for n, (_, t) in stored.items()}
    r, scale = int(acfg["r"]), lora_scale(acfg)
    modules, W = {}, {}
    for name, fin, fout in linear_modules(cfg):
        if not target_matches(targets, name):
            continue
        for n, shape in zip(lora_names(name), ((r, fin), (fout, r))):
            if n not in tensors or tuple(tensors[n].shape) != shape:
                raise SystemExit(f"{adapter_dir}: {n} missing or not of shape {list(shape)}")
            W[n] = tensors.pop(n)
        modules[name] = scale
    if tensors:
        raise SystemExit(f"{adapter_dir}: tensors for no targeted module: {sorted(tensors)[:5]}")
    if not modules:
        raise SystemExit(f"{adapter_dir}: target_modules {targets!r} select no module")
    return modules, W


def make_lora_weights(cfg, targets, r, seed, b_std):
    g = torch.Generator().manual_seed(seed)
    mods, out = [], []
    for name, fin, fout in linear_modules(cfg):
        if target_matches(targets, name):
            an, bn = lora_names(name)
            a = (torch.rand((r, fin), generator=g, dtype=torch.float32) * 2 - 1) / math.sqrt(fin)
            b = torch.randn((fout, r), generator=g, dtype=torch.float32) * b_std
            mods.append(name)
            out += [(an, a), (bn, b)]
    if not mods:
        raise SystemExit(f"targets {targets!r} select no module of this model")
    return mods, out


# ---------------------------------------------------------------------------
# The model (float64)
# ---------------------------------------------------------------------------

class Model:
    """Shared by forward (no_grad), grad and adamw-steps (autograd on self.W)."""

    def __init__(self, model_dir=None, cfg=None, weights=None, adapter=None, fp8_as_bf16=False):
        """adapter: None, a PEFT folder, or ({module: scale}, {PEFT name: tensor}).
        fp8_as_bf16: FP8 weights as a bf16 base holds them (load_weights)."""
        if model_dir is not None:
            with open(os.path.join(model_dir, "config.json")) as f:
                cfg = json.load(f)
        check_config(cfg)
        if model_dir is not None:
            weights = load_weights(model_dir, cfg, fp8_as_bf16)
        self.cfg = cfg
        self.W = {n: t.to(DT) for n, t in weights.items()}
        self.L = cfg["num_hidden_layers"]
        self.moe_layers = [i for i in range(self.L) if is_moe_layer(cfg, i)]
        self.tied = bool(cfg.get("tie_word_embeddings", False))
        self.eps = cfg["rms_norm_eps"]
        self.scaling = softmax_scale(cfg)
        self.lora, self.lora_names = {}, []
        if adapter is not None:
            mods, lw = load_adapter(adapter, cfg) if isinstance(adapter, str) else adapter
            self.lora = dict(mods)
            for m in self.lora:
                for n in lora_names(m):
                    self.W[n] = lw[n].to(DT)
                    self.lora_names.append(n)

    def param_names(self):
        """The trainable base tensors: all but LoRA, the frozen router biases, a tied lm_head."""
        skip = set(self.lora_names)
        return [n for n in self.W if n not in skip and not n.endswith("e_score_correction_bias")
                and not (self.tied and n == "lm_head.weight")]

    def lin(self, x, name):
        w = (self.W["model.embed_tokens.weight"] if self.tied else self.W["lm_head.weight"]) \
            if name == "lm_head" else self.W[name + ".weight"]
        y = x @ w.T
        if name in self.lora:
            an, bn = lora_names(name)
            y = y + self.lora[name] * ((x @ self.W[an].T) @ self.W[bn].T)
        return y

    def attention(self, x, p, cos, sin):
        cfg, W, T = self.cfg, self.W, x.shape[0]
        nh, dn, dr, dv = (cfg["num_attention_heads"], cfg["qk_nope_head_dim"],
                          cfg["qk_rope_head_dim"], cfg["v_head_dim"])
        if cfg.get("q_lora_rank"):
            qa = rms_norm(self.lin(x, p + ".q_a_proj"), W[p + ".q_a_layernorm.weight"],
                          SUB_NORM_EPS)
            q = self.lin(qa, p + ".q_b_proj")
        else:
            q = self.lin(x, p + ".q_proj")
        q_nope, q_rope = q.view(T, nh, dn + dr).split([dn, dr], dim=-1)
        c = self.lin(x, p + ".kv_a_proj_with_mqa")
        latent, k_rope = c.split([cfg["kv_lora_rank"], dr], dim=-1)
        latent = rms_norm(latent, W[p + ".kv_a_layernorm.weight"], SUB_NORM_EPS)
        kv = self.lin(latent, p + ".kv_b_proj")
        k_nope, v = kv.view(T, nh, dn + dv).split([dn, dv], dim=-1)
        il = cfg.get("rope_interleave", True)
        q = torch.cat((q_nope, apply_rope(q_rope, cos, sin, il)), dim=-1)
        k_rope = apply_rope(k_rope[:, None, :], cos, sin, il).expand(T, nh, dr)
        k = torch.cat((k_nope, k_rope), dim=-1)
        scores = torch.einsum("thd,shd->hts", q, k) * self.scaling
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        o = torch.einsum("hts,shd->thd", torch.softmax(scores, dim=-1), v).reshape(T, nh * dv)
        return self.lin(o, p + ".o_proj")

    def moe(self, x, p, replay_ids=None):
        cfg = self.cfg
        scores = torch.sigmoid(x @ self.W[p + ".gate.weight"].T)
        ids, w, rp = route(scores, self.W[p + ".gate.e_score_correction_bias"],
                           cfg["num_experts_per_tok"], cfg.get("n_group") or 1,
                           cfg.get("topk_group") or 1, cfg.get("norm_topk_prob", False),
                           cfg.get("routed_scaling_factor", 1.0), replay_ids)
        out = torch.zeros_like(x)
        for e in torch.unique(ids).tolist():
            rows, slot = (ids == e).nonzero(as_tuple=True)
            y = swiglu_mlp(x[rows], self, f"{p}.experts.{e}")
            out = out.index_add(0, rows, w[rows, slot][:, None] * y)
        if cfg.get("n_shared_experts"):
            out = out + swiglu_mlp(x, self, p + ".shared_experts")
        return out, ids, rp

    def forward(self, tokens, replay=None):
        """(log-softmax [T, V], experts [T][m][k], router_probs [T][m][<=k+1]);
        replay: None or LongTensor [T, n_moe_layers, k]."""
        T = len(tokens)
        x = self.W["model.embed_tokens.weight"][torch.tensor(tokens, dtype=torch.long)]
        cos, sin = rope_cos_sin(self.cfg, T)
        experts, rprobs = [[] for _ in range(T)], [[] for _ in range(T)]
        for i in range(self.L):
            p = f"model.layers.{i}"
            x = x + self.attention(rms_norm(x, self.W[p + ".input_layernorm.weight"], self.eps),
                                   p + ".self_attn", cos, sin)
            h = rms_norm(x, self.W[p + ".post_attention_layernorm.weight"], self.eps)
            if i in self.moe_layers:
                m = self.moe_layers.index(i)
                y, ids, rp = self.moe(h, p + ".mlp", None if replay is None else replay[:, m, :])
                for t in range(T):
                    experts[t].append(ids[t].tolist())
                    rprobs[t].append(rp[t].tolist())
            else:
                y = swiglu_mlp(h, self, p + ".mlp")
            x = x + y
        logits = self.lin(rms_norm(x, self.W["model.norm.weight"], self.eps), "lm_head")
        return torch.log_softmax(logits, dim=-1), experts, rprobs


def parse_replay(model, rec, T, where):
    """The line's "experts" as LongTensor [T, n_moe_layers, k], or None without one."""
    ex = rec.get("experts")
    if ex is None:
        return None
    M, k, E = len(model.moe_layers), model.cfg.get("num_experts_per_tok", 0), n_experts(model.cfg)
    if not isinstance(ex, list) or len(ex) != T:
        raise SystemExit(f"{where}: \"experts\" must have one entry per token ({T})")
    for t, per_tok in enumerate(ex):
        if not isinstance(per_tok, list) or len(per_tok) != M:
            raise SystemExit(f"{where} t {t}: \"experts\" needs {M} MoE layers")
        for m, ids in enumerate(per_tok):
            if (not isinstance(ids, list) or len(ids) != k or len(set(ids)) != k
                    or any(not isinstance(e, int) or not (0 <= e < E) for e in ids)):
                raise SystemExit(f"{where} t {t} moe-layer {m}: need {k} distinct "
                                 f"expert ids in [0, {E}), got {ids!r}")
    return None if T == 0 or M == 0 else torch.tensor(ex, dtype=torch.long)


def cmd_forward(args):
    model = Model(args.model, adapter=adapter_arg(args), fp8_as_bf16=args.fp8_as == "bf16")
    recs = read_jsonl(args.input)
    with open(args.output, "w") as fout, torch.no_grad():
        for j, rec in enumerate(recs):
            tokens = parse_tokens(model, rec)
            replay = parse_replay(model, rec, len(tokens), f"line {j}") if args.replay else None
            fout.write(json.dumps(run_forward(model, tokens, replay)) + "\n")
    print(f"forward: {len(recs)} sequences -> {args.output}")


# ---------------------------------------------------------------------------
# grad / adamw-steps
# ---------------------------------------------------------------------------

def parse_lines(model, lines, replay_flag):
    out = []
    for j, rec in enumerate(lines):
        tokens = parse_tokens(model, rec)
        T = len(tokens)
        out.append((tokens, parse_coef(rec, T, f"line {j}"),
                    parse_replay(model, rec, T, f"line {j}") if replay_flag else None))
    return out


def line_losses(model, parsed, backward):
    """sum of coef * logprob over the lines (backward line by line); (loss, logprobs)."""
    loss, lps = 0.0, []
    for tokens, coef, replay in parsed:
        if len(tokens) < 2:
            lps.append([None] * len(tokens))
            continue
        lp = token_logprobs(model.forward(tokens, replay)[0], tokens)
        line = (coef * lp).sum()
        if backward:
            line.backward()
        loss += line.item()
        lps.append([None] + lp.tolist())
    return loss, lps


def grad_lines(model, lines, replay_flag, names=None):
    """(loss, logprobs, {name: float64 grad}) for `names` (default: param_names())."""
    names = model.param_names() if names is None else names
    saved = dict(model.W)
    for n in names:
        model.W[n] = saved[n].detach().clone().requires_grad_(True)
    try:
        loss, lps = line_losses(model, parse_lines(model, lines, replay_flag), True)
        grads = {n: torch.zeros_like(saved[n]) if model.W[n].grad is None
                 else model.W[n].grad.detach().clone() for n in names}
        return loss, lps, grads
    finally:
        model.W.update(saved)


def f32_entries(names, tensors):
    return [(n, tensors[n].detach(), "F32") for n in names]


def cmd_grad(args):
    model = Model(args.model, adapter=adapter_arg(args))
    lines = read_jsonl(args.input)
    if args.base_grads and not model.lora:
        raise SystemExit("--base-grads needs --adapter (without it --output has them)")
    out_names = model.lora_names if model.lora else model.param_names()
    names = out_names + (model.param_names() if args.base_grads else [])
    loss, lps, grads = grad_lines(model, lines, args.replay, names)
    write_st(args.output, f32_entries(out_names, grads))
    if args.base_grads:
        write_st(args.base_grads, f32_entries(model.param_names(), grads))
    if args.loss_out:
        with open(args.loss_out, "w") as f:
            json.dump({"loss": loss, "logprobs": lps}, f)
            f.write("\n")
    print(f"grad: {len(lines)} sequences, loss {loss:.12g}, {len(grads)} tensors"
          f"{' (LoRA)' if model.lora else ''} -> {args.output}")


def cmd_adamw_steps(args):
    model = Model(args.model, adapter=adapter_arg(args))
    if args.steps < 0:
        raise SystemExit("--steps must be >= 0")
    names = list(model.lora_names) if model.lora else model.param_names()
    for n in names:
        model.W[n] = model.W[n].detach().clone().requires_grad_(True)
    params = [model.W[n] for n in names]
    opt = torch.optim.AdamW(params, lr=args.lr, betas=parse_betas(args.betas), eps=args.eps,
                            weight_decay=args.weight_decay)
    lines = read_jsonl(args.input)
    parsed = parse_lines(model, lines, args.replay)
    for step in range(1, args.steps + 1):
        opt.zero_grad(set_to_none=True)
        loss, _ = line_losses(model, parsed, True)
        for p_ in params:  # unrouted experts: a zero gradient (AdamW still decays them)
            if p_.grad is None:
                p_.grad = torch.zeros_like(p_)
        gnorm = torch.norm(torch.stack([p_.grad.norm(2) for p_ in params]), 2).item()
        if args.clip and args.clip > 0:
            torch.nn.utils.clip_grad_norm_(params, args.clip)
        opt.step()
        print(f"step {step} loss {loss:.12g} grad_norm {gnorm:.12g}")
    with torch.no_grad():
        final, _ = line_losses(model, parsed, False)
    write_st(args.output, f32_entries(names, model.W))
    print(f"adamw-steps: {args.steps} steps, {len(lines)} sequences, final loss {final:.12g}, "
          f"{len(names)} tensors{' (LoRA)' if model.lora else ''} -> {args.output}")


# ---------------------------------------------------------------------------
# make-adapter
# ---------------------------------------------------------------------------

def cmd_make_adapter(args):
    with open(os.path.join(args.model, "config.json")) as f:
        cfg = json.load(f)
    check_config(cfg)
    if args.rank <= 0:
        raise SystemExit("--rank must be positive")
    targets = parse_targets(args.targets)
    mods, tensors = make_lora_weights(cfg, targets, args.rank, args.seed, args.b_std)
    alpha = int(args.alpha) if float(args.alpha).is_integer() else args.alpha
    acfg = adapter_config(args.model, args.rank, alpha, args.rslora, targets)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "adapter_config.json"), "w") as f:
        json.dump(acfg, f, indent=2)
        f.write("\n")
    write_st(os.path.join(args.out, "adapter_model.safetensors"),
             [(n, t, "F32") for n, t in tensors])
    print(f"wrote {args.out}: {len(mods)} modules, {len(tensors)} tensors, r={args.rank}, "
          f"alpha={alpha}, rslora={str(args.rslora).lower()}, scale={lora_scale(acfg):.9g}")


# ---------------------------------------------------------------------------
# selfcheck-grad: autograd vs central finite differences, float64, tiny model
# ---------------------------------------------------------------------------

SELFCHECK_SET = {
    "vocab_size": 11, "hidden_size": 16, "intermediate_size": 20, "moe_intermediate_size": 8,
    "num_hidden_layers": 2, "num_attention_heads": 2, "n_routed_experts": 8,
    "num_experts_per_tok": 2, "n_group": 4, "topk_group": 2, "q_lora_rank": 6,
    "kv_lora_rank": 6, "qk_nope_head_dim": 4, "qk_rope_head_dim": 4, "v_head_dim": 6,
    "max_position_embeddings": 32,
    # mscale != mscale_all_dim: the cos/sin attention factor is not 1.
    "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8,
                     "beta_fast": 32, "beta_slow": 1, "mscale": 0.8, "mscale_all_dim": 1.2}}


def selfcheck_case(case, seed, h=1e-6, tol=1e-6):
    """case: dict with norm, replay, tied, q_lora (rank or None), interleave, lora (None,
    "lora", "rslora": r 3 adapter on every target, gradient w.r.t. A/B only)."""
    cfg = build_config(dict(SELFCHECK_SET, norm_topk_prob=case["norm"],
                            tie_word_embeddings=case["tied"], q_lora_rank=case["q_lora"],
                            rope_interleave=case["interleave"]), "f32")
    base_w = dict(make_weights(cfg, seed, std=0.3))
    model, fails = Model(cfg=cfg, weights=base_w), []
    if case["lora"]:
        scale = lora_scale({"r": 3, "lora_alpha": 6.0, "use_rslora": case["lora"] == "rslora"})
        mods, lt = make_lora_weights(cfg, list(LORA_TARGETS), 3, seed + 1000, b_std=0.3)
        lt, base = dict(lt), model
        model = Model(cfg=cfg, weights=base_w, adapter=({m: scale for m in mods}, lt))
        zero_b = {n: t * 0 if n.endswith("lora_B.weight") else t for n, t in lt.items()}
        zmodel = Model(cfg=cfg, weights=base_w, adapter=({m: scale for m in mods}, zero_b))
        with torch.no_grad():
            la, lb, lz = (m_.forward(list(range(7)))[0] for m_ in (model, base, zmodel))
        if not torch.equal(lz, lb) or (la - lb).abs().max() < 1e-3:
            fails.append("adapter with B = 0 is not the base, or the adapter has no effect")
    assert model.moe_layers == [1], model.moe_layers
    rng = np.random.default_rng(seed)
    T, k, E = 6, cfg["num_experts_per_tok"], cfg["n_routed_experts"]
    tokens = rng.choice(cfg["vocab_size"], T, replace=False).tolist()
    rec = {"tokens": tokens, "coef": [None] + rng.uniform(-1, 1, T - 1).tolist()}
    with torch.no_grad():
        own = run_forward(model, tokens)["experts"]
    if case["replay"]:
        rec["experts"] = []
        for t in range(T):
            while True:
                ids = rng.permutation(E)[:k].tolist()
                if set(ids) != set(own[t][0]):
                    break
            rec["experts"].append([ids])
    used = rec["experts"] if case["replay"] else own
    names = model.lora_names if case["lora"] else None
    loss, lps, grads = grad_lines(model, [rec], case["replay"], names)
    noise = 2.0 ** -52 * sum(abs(c * l) for c, l in zip(rec["coef"][1:], lps[0][1:])) / h
    parsed = parse_lines(model, [rec], case["replay"])

    def loss_at():
        with torch.no_grad():
            return line_losses(model, parsed, False)[0]
    with torch.no_grad():
        fw = run_forward(model, tokens, parsed[0][2])
    assert fw["logprobs"] == lps[0] and fw["experts"] == used and loss == loss_at()
    visited = sorted({e for t in range(T) for e in used[t][0]})
    unvisited = [e for e in range(E) if e not in visited]
    a0, a1 = "model.layers.0.self_attn", "model.layers.1.self_attn"
    kvr, dr = cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]
    top_e = max(visited, key=lambda e: sum(e in used[t][0] for t in range(T)))  # most routed
    mods = [("q", f"{a0}.q_a_proj" if case["q_lora"] else f"{a0}.q_proj", None),
            ("kv_a latent rows", f"{a1}.kv_a_proj_with_mqa", (0, kvr)),
            ("kv_a k_rope rows", f"{a1}.kv_a_proj_with_mqa", (kvr, kvr + dr)),
            ("kv_b", f"{a1}.kv_b_proj", None), ("o_proj", f"{a0}.o_proj", None),
            ("expert up", f"model.layers.1.mlp.experts.{top_e}.up_proj", None),
            ("expert down", f"model.layers.1.mlp.experts.{top_e}.down_proj", None),
            ("shared gate", "model.layers.1.mlp.shared_experts.gate_proj", None),
            ("dense down", "model.layers.0.mlp.down_proj", None)]
    if case["q_lora"]:
        mods.append(("q_b", f"{a1}.q_b_proj", None))
    if case["lora"]:
        kinds = [(f"{kind} lora_{ab}", n, rows if ab == "B" else None)
                 for kind, m, rows in mods + [("lm_head", "lm_head", None)]
                 for ab, n in zip("AB", lora_names(m))]
        if set(grads) != set(model.lora_names):
            fails.append("gradient set is not exactly the LoRA tensors")
    else:
        kinds = [(kind, m + ".weight", rows) for kind, m, rows in mods]
        kinds += [("embed", "model.embed_tokens.weight", None),
                  ("router", "model.layers.1.mlp.gate.weight", None),
                  ("input_layernorm", "model.layers.1.input_layernorm.weight", None),
                  ("kv_a_layernorm", f"{a0}.kv_a_layernorm.weight", None),
                  ("lm_head", "model.embed_tokens.weight" if case["tied"] else "lm_head.weight",
                   None)]
        if case["q_lora"]:
            kinds.append(("q_a_layernorm", f"{a1}.q_a_layernorm.weight", None))
        if any(n.endswith("e_score_correction_bias") for n in grads):
            fails.append("e_score_correction_bias has a gradient entry")
        if case["tied"] and "lm_head.weight" in grads:
            fails.append("tied model has an lm_head.weight gradient")
    worst, checked = 0.0, 0
    for kind, name, rows in kinds:
        w, g = model.W[name], grads[name]
        ncol = g.shape[1] if g.dim() == 2 else 1
        order = [i for i in torch.argsort(g.reshape(-1).abs(), descending=True).tolist()
                 if rows is None or rows[0] <= i // ncol < rows[1]]
        gf = g.reshape(-1)
        # Large entries only (|g| >= 1e7 * fd rounding noise and >= 0.1 max), as qwen3_ref.
        floor = max(0.1 * abs(gf[order[0]].item()), 1e7 * noise)
        big = [i for i in order if abs(gf[i].item()) >= floor] or order[:1]
        pick = big[:2] + (rng.choice(big[2:], size=min(1, len(big) - 2), replace=False).tolist()
                          if len(big) > 2 else [])
        flat = w.view(-1)
        for i in pick:
            orig = flat[i].item()
            with torch.no_grad():
                flat[i] = orig + h
                lp_ = loss_at()
                flat[i] = orig - h
                lm_ = loss_at()
                flat[i] = orig
            fd, ad = (lp_ - lm_) / (2 * h), gf[i].item()
            rel = abs(fd - ad) / max(abs(ad), 1e-300)
            worst, checked = max(worst, rel), checked + 1
            if rel > tol:
                fails.append(f"{kind} {name}[{i}]: autograd {ad:.12e} fd {fd:.12e} rel {rel:.2e}")
    for e in unvisited:
        for part in ("gate_proj", "up_proj", "down_proj"):
            m = f"model.layers.1.mlp.experts.{e}.{part}"
            for n in (lora_names(m) if case["lora"] else (m + ".weight",)):
                if grads[n].abs().max() != 0:
                    fails.append(f"unvisited expert {e} has a non-zero gradient ({n})")
    return worst, checked, fails, visited


def cmd_selfcheck_grad(args):
    cases = [dict(norm=True, replay=False, tied=False, q_lora=6, interleave=True, lora=None),
             dict(norm=False, replay=True, tied=False, q_lora=6, interleave=True, lora=None),
             dict(norm=True, replay=True, tied=True, q_lora=None, interleave=False, lora=None),
             dict(norm=True, replay=False, tied=False, q_lora=6, interleave=True, lora="lora"),
             dict(norm=False, replay=True, tied=True, q_lora=None, interleave=True, lora="rslora")]
    ok = True
    for c, case in enumerate(cases):
        worst, checked, fails, visited = selfcheck_case(case, args.seed + c)
        desc = " ".join(f"{k}={str(v).lower()}" for k, v in case.items())
        print(f"selfcheck-grad {desc}: {checked} entries, worst rel err {worst:.2e}, "
              f"experts visited {visited}  {'ok' if not fails else 'FAIL'}")
        for f_ in fails:
            print("  " + f_)
        ok &= not fails
    print("selfcheck-grad: PASS" if ok else "selfcheck-grad: FAIL")
    return 0 if ok else 1


# ---------------------------------------------------------------------------
# selfcheck-router / selfcheck-fp8
# ---------------------------------------------------------------------------

def gate_bruteforce(s, b, k, G, topk_group, norm, rsf):
    """DeepSeek inference/model.py Gate for one token, in plain Python (exact ties aside)."""
    E = len(s)
    sel = [s[e] + b[e] for e in range(E)]
    if G > 1:
        n = E // G
        gs = [sum(sorted(sel[g * n:(g + 1) * n])[-2:]) for g in range(G)]
        keep = sorted(range(G), key=lambda g: -gs[g])[:topk_group]
        sel = [sel[e] if e // n in keep else float("-inf") for e in range(E)]
    ids = sorted(range(E), key=lambda e: -sel[e])[:k]
    w = [s[e] for e in ids]
    tot = sum(w) + 1e-20 if norm else 1.0
    return ids, [x / tot * rsf for x in w]


def cmd_selfcheck_router(args):
    fails = []

    def check(label, got, want):
        ok = all(abs(a - b) <= 1e-15 for a, b in zip(got, want)) and len(got) == len(want)
        print(f"selfcheck-router {label}: got {got}, want {want}  {'ok' if ok else 'FAIL'}")
        if not ok:
            fails.append(label)

    def t(x):
        return torch.tensor([x], dtype=DT)
    rsf = 2.5
    # (a) Expert 0 is the best overall, but its group {0,1} (0.95 + 0.05 = 1.0) loses to
    # {2,3} (1.22) and {4,5} (1.14): not chosen.
    s = [0.95, 0.05, 0.62, 0.60, 0.58, 0.56, 0.50, 0.45]
    ids, w, rp = route(t(s), t([0.0] * 8)[0], 2, 4, 2, True, rsf)
    check("(a) discarded group: ids", ids[0].tolist(), [2, 3])
    check("(a) weights", w[0].tolist(), [0.62 / 1.22 * rsf, 0.60 / 1.22 * rsf])
    check("(a) router_probs (eligible only)", rp[0].tolist(), [0.62, 0.60, 0.58])
    # (b) The bias lifts expert 2 over 0 and 1; its weight is still the unbiased 0.7.
    s, b = [0.9, 0.8, 0.7, 0.1], [0.0, 0.0, 0.25, 0.0]
    ids, w, rp = route(t(s), t(b)[0], 2, 1, 1, True, rsf)
    check("(b) bias moves selection: ids", ids[0].tolist(), [2, 0])
    check("(b) unbiased weights", w[0].tolist(), [0.7 / 1.6 * rsf, 0.9 / 1.6 * rsf])
    check("(b) unbiased selection would be",
          route(t(s), t([0.0] * 4)[0], 2, 1, 1, True, rsf)[0][0].tolist(), [0, 1])
    # (c) Replay forces [3, 1]: weights from the unbiased scores there; not normalised too.
    forced = torch.tensor([[3, 1]])
    ids, w, _ = route(t(s), t(b)[0], 2, 1, 1, True, rsf, forced)
    check("(c) replay ids echoed", ids[0].tolist(), [3, 1])
    check("(c) replay weights", w[0].tolist(), [0.1 / 0.9 * rsf, 0.8 / 0.9 * rsf])
    check("(c) replay weights, norm_topk_prob false",
          route(t(s), t(b)[0], 2, 1, 1, False, rsf, forced)[1][0].tolist(), [0.1 * rsf, 0.8 * rsf])
    # (d) Group {0,1} is kept with selection scores [0.5, -0.2]; every other expert has -0.05.
    # DeepSeek (-inf masking) takes [0, 1]; HF's 0.0 masking would take a discarded expert.
    s = [0.5, 0.1] + [0.1] * 6
    b = torch.tensor([0.0, -0.3] + [-0.15] * 6, dtype=DT)
    ids, w, _ = route(t(s), b, 2, 4, 1, True, rsf)
    sel = (t(s) + b).view(1, 4, 2)
    hf = sel.masked_fill(torch.tensor([[False, True, True, True]])[:, :, None], 0.0).view(1, 8)
    hf_ids = torch.topk(hf, 2, dim=-1).indices[0].tolist()
    check("(d) -inf masking keeps the kept group", ids[0].tolist(), [0, 1])
    print(f"selfcheck-router (d) HF 0.0 masking would choose {sorted(hf_ids)} "
          f"({'differs' if sorted(hf_ids) != [0, 1] else 'SAME: case is not discriminating'})")
    if sorted(hf_ids) == [0, 1]:
        fails.append("(d) not discriminating")
    # (e) The vectorised router against the brute-force Gate on random tokens.
    rng = np.random.default_rng(7)
    bad = 0
    for E, k, G, tg, norm in ((16, 4, 4, 2, True), (16, 4, 1, 1, False), (8, 2, 4, 1, True)):
        sc = torch.from_numpy(rng.uniform(0, 1, (200, E)))
        bias = torch.from_numpy(rng.normal(0.0, 0.2, E))
        ids, w, _ = route(sc, bias, k, G, tg, norm, rsf)
        for r in range(200):
            bi, bw = gate_bruteforce(sc[r].tolist(), bias.tolist(), k, G, tg, norm, rsf)
            if ids[r].tolist() != bi or max(abs(a - c) for a, c in zip(w[r].tolist(), bw)) > 1e-14:
                bad += 1
    print(f"selfcheck-router (e) vectorised vs brute-force Gate, 600 tokens: {bad} mismatches  "
          f"{'ok' if not bad else 'FAIL'}")
    if bad:
        fails.append("(e)")
    print("selfcheck-router: PASS" if not fails else f"selfcheck-router: FAIL {fails}")
    return 0 if not fails else 1


def cmd_selfcheck_fp8(args):
    fails = []
    v = E4M3_VALUES
    known = {0x00: 0.0, 0x01: 2.0 ** -9, 0x07: 7 * 2.0 ** -9, 0x08: 2.0 ** -6, 0x38: 1.0,
             0x40: 2.0, 0x7E: 448.0, 0xFE: -448.0, 0xB8: -1.0, 0x81: -(2.0 ** -9)}
    fails += [f"decode 0x{c:02X} = {v[c]} != {x}" for c, x in known.items() if v[c] != x]
    fails += [f"0x{c:02X} is not NaN" for c in (0x7F, 0xFF) if not np.isnan(v[c])]
    if not (np.signbit(v[0x80]) and v[0x80] == 0):
        fails.append("0x80 is not -0")
    # Independent decode: ldexp of the bit fields, every code.
    for c in range(256):
        e, m = (c >> 3) & 15, c & 7
        want = math.ldexp(m, -9) if e == 0 else math.ldexp(1 + m / 8, e - 7)
        want = -want if c & 0x80 else want
        if not (e == 15 and m == 7) and v[c] != want:
            fails.append(f"decode 0x{c:02X}: {v[c]} != {want}")
    if not (np.diff(v[:127]) > 0).all():
        fails.append("codes 0x00..0x7E not increasing")
    finite = np.array([c for c in range(256) if not np.isnan(v[c])])
    rt = e4m3_encode(v[finite])
    if not (rt == finite).all():
        fails.append(f"encode(decode(c)) != c for {finite[rt != finite][:5]}")
    # RNE and saturation, against a brute-force nearest (ties -> the even code).
    edge = [2.0 ** -10, 3 * 2.0 ** -10, 1.0625, 1.1875, 17.0, 448.0, 456.0, 464.0, 470.0, 1e9,
            2.0 ** -20, -1.0625, 240.0 + 8, 0.0]
    x = np.concatenate([edge, np.random.default_rng(3).uniform(-500, 500, 1500),
                        np.random.default_rng(4).uniform(-0.05, 0.05, 1500)])
    got = e4m3_encode(x)
    for xi, gi in zip(x, got):
        a = min(abs(xi), 448.0)
        d = np.abs(E4M3_POS - a)
        near = np.flatnonzero(d == d.min())
        code = near[0] if len(near) == 1 else next(c for c in near if c % 2 == 0)
        code |= 0x80 if np.signbit(xi) else 0
        if gi != code:
            fails.append(f"encode({xi!r}) = 0x{gi:02X}, want 0x{code:02X}")
    # Quantize -> dequantize with partial edge blocks stays within half a code step.
    w = torch.randn(13, 21, generator=torch.Generator().manual_seed(5)) * 0.3
    codes, s = fp8_quantize(w, 8, 16)
    deq = fp8_dequantize(torch.from_numpy(v[codes.numpy()]), s.to(DT), 8, 16)
    if list(s.shape) != [2, 2] or (deq - w.to(DT)).abs().max() > s.max().item() * 16:
        fails.append("block quantize / dequantize")
    for f_ in fails[:10]:
        print("  " + f_)
    print(f"selfcheck-fp8: 256 codes, {len(x)} encodes: " + ("PASS" if not fails else "FAIL"))
    return 0 if not fails else 1


# ---------------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    mm = sub.add_parser("make-model", help="write config.json + random safetensors weights")
    mm.add_argument("--out", required=True)
    mm.add_argument("--seed", type=int, required=True)
    mm.add_argument("--dtype", choices=["f32", "bf16", "fp8"], required=True)
    mm.add_argument("--block", default="128,128", help="fp8 weight_block_size R,C")
    mm.add_argument("--shards", type=int, default=1)
    mm.add_argument("--std", type=float, default=0.02, help="std of linear/embedding weights")
    mm.add_argument("--set", action="extend", nargs="+", metavar="KEY=VALUE",
                    help="override a config key; VALUE parsed as JSON, else string")
    mm.add_argument("--fp8-break", choices=["missing-scale", "wrong-shape", "wrong-dtype"])
    for name in ("forward", "grad", "adamw-steps"):
        p = sub.add_parser(name)
        p.add_argument("--model", required=True)
        p.add_argument("--input", required=True)
        p.add_argument("--output", required=True)
        p.add_argument("--replay", action="store_true", help="route by the lines' \"experts\"")
        p.add_argument("--adapter", metavar="ADIR", help="apply this PEFT LoRA adapter")
        p.add_argument("--no-lora", action="store_true", help="ignore --adapter")
        if name == "forward":
            p.add_argument("--fp8-as", choices=["exact", "bf16"], default="exact",
                           help="FP8 weights dequantized exactly, or rounded to bf16 as a bf16 base keeps them")
        if name == "grad":
            p.add_argument("--loss-out")
            p.add_argument("--base-grads", metavar="FILE")
        if name == "adamw-steps":
            p.add_argument("--steps", type=int, required=True)
            p.add_argument("--lr", type=float, required=True)
            p.add_argument("--weight-decay", type=float, required=True)
            p.add_argument("--betas", required=True, help="B1,B2")
            p.add_argument("--eps", type=float, required=True)
            p.add_argument("--clip", type=float, default=0.0)
    ma = sub.add_parser("make-adapter")
    ma.add_argument("--model", required=True)
    ma.add_argument("--out", required=True)
    ma.add_argument("--rank", type=int, required=True)
    ma.add_argument("--alpha", type=float, required=True)
    ma.add_argument("--rslora", action="store_true")
    ma.add_argument("--targets", required=True, help="comma-separated, e.g. q_a_proj,kv_b_proj")
    ma.add_argument("--seed", type=int, required=True)
    ma.add_argument("--b-std", type=float, default=0.05)
    sub.add_parser("selfcheck-grad").add_argument("--seed", type=int, default=1)
    sub.add_parser("selfcheck-router")
    sub.add_parser("selfcheck-fp8")
    args = ap.parse_args(argv)
    return {"make-model": cmd_make_model, "forward": cmd_forward, "grad": cmd_grad,
            "adamw-steps": cmd_adamw_steps, "make-adapter": cmd_make_adapter,
            "selfcheck-grad": cmd_selfcheck_grad, "selfcheck-router": cmd_selfcheck_router,
            "selfcheck-fp8": cmd_selfcheck_fp8}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
