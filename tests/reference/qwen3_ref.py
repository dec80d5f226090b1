#!/usr/bin/python3
"""Independent PyTorch reference for Hugging Face Qwen3-MoE / Qwen3 (dense).

Written from the equations of HF `modeling_qwen3_moe.py` / `modeling_qwen3.py`
(not from the C code it is meant to check), using only torch + numpy + stdlib
(no `safetensors`/`transformers` packages), so the safetensors format is
written and read by hand.

Subcommands:

  make-model --out DIR --seed N --dtype f32|bf16 [--shards K] [--set key=value ...]
      Write DIR/config.json and random weights with HF tensor names, either as
      a single model.safetensors or as K shards plus model.safetensors.index.json.

  forward --model DIR --input IN.jsonl --output OUT.jsonl [--replay]
          [--adapter ADIR [--no-lora]]
      For every input line {"tokens": [...]} write
      {"tokens", "logprobs", "experts", "router_probs"} (see `run_forward`).
      router_probs are always the router's own sorted top-(k+1) probabilities.

  grad --model DIR --input IN.jsonl --output GRADS.safetensors [--replay]
       [--loss-out LOSS.json] [--adapter ADIR [--no-lora]] [--base-grads FILE]
      Input lines {"tokens": [...], "coef": [c_0, ..., c_{n-1}]} (c_0 ignored,
      may be null). loss = sum over lines and t >= 1 of c_t * log p(token t |
      tokens < t), computed in float64 by autograd through the same model
      function as `forward`. Writes d loss / d W for every parameter, HF names,
      dtype F32, shape of the weight; with tie_word_embeddings the shared
      "model.embed_tokens.weight" gets the summed gradient (no lm_head.weight).
      Experts no token was routed to get zeros. LOSS.json:
      {"loss": float, "logprobs": [[null, lp_1, ...] per line]}.
      With --adapter the base weights are frozen and GRADS holds only the LoRA
      tensors' gradients (PEFT names, F32, their shapes); --base-grads FILE also
      writes the base weights' gradients (HF names, as without an adapter).

  adamw-steps --model DIR --input IN.jsonl --steps N --lr LR --weight-decay WD
              --betas B1,B2 --eps EPS [--clip MAXNORM] --output PARAMS.safetensors
              [--replay] [--adapter ADIR]
      N optimizer steps on the `grad` loss (same input every step), float64:
      zero grads, backward, torch.nn.utils.clip_grad_norm_(trainable, MAXNORM)
      when MAXNORM > 0, then torch.optim.AdamW(trainable, lr, betas, eps,
      weight_decay).step() (decay on every trainable tensor, no exclusions).
      Trainable: every used base parameter (tied: only model.embed_tokens.weight),
      or with --adapter only the LoRA A/B tensors (base frozen). A tensor with no
      gradient (an expert no token was routed to) gets a zero gradient, so AdamW
      still decays it and counts the step. Writes the trainable tensors' final
      values (F32; HF names, or PEFT names with --adapter: the same tensors and
      names `grad` writes). Prints per step the loss and the global gradient
      L2 norm before clipping.

  make-adapter --model DIR --out ADIR --rank R --alpha A [--rslora]
               --targets q_proj,k_proj,...,lm_head --seed N [--b-std S]
      Write a PEFT LoRA adapter (adapter_config.json + adapter_model.safetensors,
      F32) for DIR's config: A ~ U(-1/sqrt(in), 1/sqrt(in)) (PEFT's init), B ~
      N(0, S) (default 0.05; PEFT would use zeros, a test needs a non-trivial B).

  merge --model DIR --adapter ADIR --out MDIR
      W += scale * B @ A for every adapted Linear (float64), written as a full F32
      model (config.json + model.safetensors). A tied model with an lm_head
      adapter is written untied (tie_word_embeddings false, lm_head.weight =
      embedding + delta), so the merged model computes the adapter's function.

  --adapter ADIR (forward, grad): apply a PEFT LoRA adapter (see "LoRA adapters"
  below for the conventions); --no-lora ignores it (output as without it).

  selfcheck-grad [--seed N]
      Autograd vs central finite differences (h = 1e-6, rel err < 1e-6) on a
      tiny float64 model (1 dense + 1 MoE layer, hidden 16, 4 experts top-2,
      vocab 11, 5 tokens): embed, q_proj, k_norm, router, an expert down_proj,
      lm_head; norm_topk_prob true/false, with/without replay, plus tied
      embeddings; and two LoRA cases (adapter r 3 on every target incl. experts
      and lm_head, base frozen; alpha/r, and rslora on a tied model with replay):
      lora_A/lora_B entries of q/v/o_proj, dense gate_proj, an expert up/down_proj,
      lm_head, plus B = 0 is the base exactly and the float64 merge matches the
      adapter to 1e-12. Exit 0 on success; takes about two seconds.

Router replay (--replay): an input line may carry "experts": [[[k ids] per MoE
layer] per token] (MoE-layer ordinal; dense layers not counted). Its MoE layers
then route each token to exactly those distinct ids instead of the router's
top-k; the gate weights are the router's own softmax probabilities at those
ids, renormalised to sum 1 when norm_topk_prob (as HF weights its top-k). The
output "experts" echoes the replayed ids. Lines without "experts" use the
router's own routing; without --replay the field is ignored.
"""

import argparse
import copy
import json
import math
import os
import re
import struct
import sys

import numpy as np
import torch

# ---------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------

BASE_CONFIG = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "vocab_size": 97,
    "hidden_size": 64,
    "intermediate_size": 96,
    "moe_intermediate_size": 32,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [0],
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
    "max_position_embeddings": 4096,
    "attention_bias": False,
    "use_sliding_window": False,
    "rope_scaling": None,
}

# Keys that only mean something for Qwen3-MoE; dropped for a dense qwen3 config
# unless the user explicitly --set them.
MOE_KEYS = ("moe_intermediate_size", "num_experts", "num_experts_per_tok",
            "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers")


def head_dim_of(cfg):
    # HF: head_dim defaults to hidden_size // num_attention_heads when absent.
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


def is_moe_model(cfg):
    return cfg.get("model_type") == "qwen3_moe"


def is_moe_layer(cfg, i):
    """HF Qwen3MoeDecoderLayer: sparse block iff this predicate holds."""
    if not is_moe_model(cfg):
        return False
    return (i not in cfg.get("mlp_only_layers", [])
            and cfg.get("num_experts", 0) > 0
            and (i + 1) % cfg.get("decoder_sparse_step", 1) == 0)


# ---------------------------------------------------------------------------
# safetensors (hand-written writer / reader)
# ---------------------------------------------------------------------------

# safetensors dtype tag -> (bytes per element, numpy little-endian raw dtype)
ST_DTYPES = {"F32": (4, "<f4"), "BF16": (2, "<u2"), "F16": (2, "<f2"), "F64": (8, "<f8")}


def tensor_bytes(t, st_dtype):
    """Raw little-endian bytes of a CPU tensor in the given safetensors dtype."""
    if st_dtype == "F32":
        return t.to(torch.float32).contiguous().numpy().astype("<f4").tobytes()
    if st_dtype == "BF16":
        # torch rounds fp32 -> bf16 to nearest-even; store the raw 16-bit pattern.
        bits = t.to(torch.bfloat16).contiguous().view(torch.int16).numpy()
        return bits.astype("<i2").tobytes()
    raise ValueError(f"unsupported dtype {st_dtype}")


def write_safetensors(path, tensors, st_dtype):
    """tensors: list of (name, tensor). Returns number of data bytes written."""
    header = {"__metadata__": {"format": "pt"}}
    blobs = []
    off = 0
    for name, t in tensors:
        b = tensor_bytes(t, st_dtype)
        header[name] = {"dtype": st_dtype, "shape": list(t.shape),
                        "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * ((-len(h)) % 8)  # pad header to a multiple of 8 (as the Rust writer does)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    return off


def read_safetensors(path):
    """Return {name: float64 torch tensor}. bf16/f16/f32 are widened exactly."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n].decode("utf-8"))
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dt = info["dtype"]
        if dt not in ST_DTYPES:
            raise ValueError(f"{path}: tensor {name} has unsupported dtype {dt}")
        size, npdt = ST_DTYPES[dt]
        b, e = info["data_offsets"]
        shape = info["shape"]
        count = int(np.prod(shape)) if shape else 1
        if e - b != count * size or base + e > len(data):
            raise ValueError(f"{path}: tensor {name} has inconsistent offsets")
        raw = np.frombuffer(data, dtype=npdt, count=count, offset=base + b)
        if dt == "BF16":
            # bf16 is the top half of an fp32: shift into place to widen exactly.
            raw = (raw.astype(np.uint32) << 16).view(np.float32)
        arr = raw.astype(np.float64).reshape(shape)
        out[name] = torch.from_numpy(arr)
    return out


def load_weights(model_dir):
    """Load model.safetensors, or every shard named by model.safetensors.index.json."""
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        weights = {}
        for shard in sorted(set(weight_map.values())):
            part = read_safetensors(os.path.join(model_dir, shard))
            for name, t in part.items():
                if weight_map.get(name) != shard:
                    raise ValueError(f"{name} found in {shard} but index says {weight_map.get(name)}")
                weights[name] = t
        missing = set(weight_map) - set(weights)
        if missing:
            raise ValueError(f"tensors listed in index but absent: {sorted(missing)[:5]}")
        return weights
    return read_safetensors(os.path.join(model_dir, "model.safetensors"))


# ---------------------------------------------------------------------------
# make-model
# ---------------------------------------------------------------------------

def parse_set(items):
    out = {}
    for item in items or []:
        if "=" not in item:
            raise SystemExit(f"--set expects key=value, got {item!r}")
        k, v = item.split("=", 1)
        try:
            out[k] = json.loads(v)
        except json.JSONDecodeError:
            out[k] = v  # plain strings need no JSON quoting
    return out


def build_config(overrides, dtype):
    # deep: no list or dict shared with BASE_CONFIG, which outlives the command (pystep.py)
    cfg = copy.deepcopy({**BASE_CONFIG, **overrides})
    if cfg["model_type"] == "qwen3":
        if "architectures" not in overrides:
            cfg["architectures"] = ["Qwen3ForCausalLM"]
        for k in MOE_KEYS:
            if k not in overrides:
                cfg.pop(k, None)
    elif cfg["model_type"] != "qwen3_moe":
        raise SystemExit(f"unsupported model_type {cfg['model_type']!r}")
    # The dtype of the stored weights is authoritative for torch_dtype.
    cfg["torch_dtype"] = {"f32": "float32", "bf16": "bfloat16"}[dtype]
    if cfg["num_attention_heads"] % cfg["num_key_value_heads"]:
        raise SystemExit("num_attention_heads must be a multiple of num_key_value_heads")
    return cfg


def make_weights(cfg, seed, std=0.02):
    """Random weights, generated in a fixed order so the same seed gives the same
    tensors regardless of dtype or sharding. Returns list of (name, fp32 tensor)."""
    g = torch.Generator().manual_seed(seed)
    H, V = cfg["hidden_size"], cfg["vocab_size"]
    nH, nKV, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], head_dim_of(cfg)
    bias = cfg.get("attention_bias", False)
    out = []

    def normal(name, shape, sd, mean=0.0):
        out.append((name, torch.randn(shape, generator=g, dtype=torch.float32) * sd + mean))

    def lin_w(name, o, i):
        normal(name + ".weight", (o, i), std)

    def norm(name, n):
        # 1 + N(0, 0.1): not all ones, so the weight multiply is exercised.
        normal(name + ".weight", (n,), 0.1, mean=1.0)

    def mlp(prefix, inter):
        lin_w(prefix + ".gate_proj", inter, H)
        lin_w(prefix + ".up_proj", inter, H)
        lin_w(prefix + ".down_proj", H, inter)

    normal("model.embed_tokens.weight", (V, H), std)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}"
        norm(p + ".input_layernorm", H)
        norm(p + ".post_attention_layernorm", H)
        for proj, o in (("q_proj", nH * hd), ("k_proj", nKV * hd), ("v_proj", nKV * hd)):
            lin_w(f"{p}.self_attn.{proj}", o, H)
            if bias:
                normal(f"{p}.self_attn.{proj}.bias", (o,), std)
        lin_w(p + ".self_attn.o_proj", H, nH * hd)
        if bias:
            normal(p + ".self_attn.o_proj.bias", (H,), std)
        norm(p + ".self_attn.q_norm", hd)
        norm(p + ".self_attn.k_norm", hd)
        if is_moe_layer(cfg, i):
            # Larger std for the router so routing is decisive, not near-uniform.
            normal(p + ".mlp.gate.weight", (cfg["num_experts"], H), 0.5)
            for e in range(cfg["num_experts"]):
                mlp(f"{p}.mlp.experts.{e}", cfg["moe_intermediate_size"])
        else:
            mlp(p + ".mlp", cfg["intermediate_size"])
    norm("model.norm", H)
    if not cfg.get("tie_word_embeddings", False):
        normal("lm_head.weight", (V, H), std)
    return out


def split_shards(tensors, k, elem_size):
    """Contiguous split into exactly k non-empty shards, roughly byte-balanced."""
    if k > len(tensors):
        raise SystemExit(f"cannot split {len(tensors)} tensors into {k} shards")
    total = sum(t.numel() * elem_size for _, t in tensors)
    target = total / k
    shards, acc = [[]], 0
    for idx, (name, t) in enumerate(tensors):
        left_tensors, left_shards = len(tensors) - idx, k - len(shards)
        if shards[-1] and left_shards > 0 and (acc >= target or left_tensors <= left_shards):
            shards.append([])
            acc = 0
        shards[-1].append((name, t))
        acc += t.numel() * elem_size
    return shards


def write_model(out, cfg, tensors, dtype, shards):
    """config.json and the tensors (f32 or bf16) as one model.safetensors or as `shards`
    shards plus model.safetensors.index.json. Returns the weight files' names."""
    st_dtype = {"f32": "F32", "bf16": "BF16"}[dtype]
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    # Remove outputs of a previous run with a different layout so loaders are not confused.
    for fn in os.listdir(out):
        if fn.startswith("model") and (fn.endswith(".safetensors") or fn.endswith(".index.json")):
            os.remove(os.path.join(out, fn))
    if shards <= 1:
        write_safetensors(os.path.join(out, "model.safetensors"), tensors, st_dtype)
        return ["model.safetensors"]
    weight_map, total, files = {}, 0, []
    for i, shard in enumerate(split_shards(tensors, shards, ST_DTYPES[st_dtype][0])):
        fn = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        total += write_safetensors(os.path.join(out, fn), shard, st_dtype)
        weight_map.update({name: fn for name, _ in shard})
        files.append(fn)
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
        f.write("\n")
    return files


def cmd_make_model(args):
    cfg = build_config(parse_set(args.set), args.dtype)
    tensors = make_weights(cfg, args.seed, args.std)
    files = write_model(args.out, cfg, tensors, args.dtype, args.shards)
    print(f"wrote {args.out}: {len(tensors)} tensors, {cfg['model_type']}, "
          f"{args.dtype}, files={files}")


# ---------------------------------------------------------------------------
# Forward (float64 compute)
# ---------------------------------------------------------------------------
# Weights are widened exactly (bf16 -> fp32 -> fp64) and every operation runs in
# float64: the output is a ground truth for an fp32 implementation, whose own
# rounding error is then the only thing a comparison measures.

DT = torch.float64


def rms_norm(x, w, eps):
    # HF Qwen3(Moe)RMSNorm: w * x / sqrt(mean(x^2) + eps) over the last dim.
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def apply_rope(x, cos, sin):
    """RoPE on the first cos.shape[-1] dims of each head (rotate_half over those), the rest
    passed through unchanged (HF's partial rotary, e.g. glm_ref.py); all of them usually."""
    rd = cos.shape[-1]
    if rd == x.shape[-1]:
        return x * cos + rotate_half(x) * sin
    rot, rest = x[..., :rd], x[..., rd:]
    return torch.cat((rot * cos + rotate_half(rot) * sin, rest), dim=-1)


def qwen3_layer_windows(cfg):
    """HF Qwen3Config: sliding_window takes effect with use_sliding_window, on the layers
    layer_types calls "sliding_attention" (by default those from max_window_layers, 28, on)."""
    L = cfg["num_hidden_layers"]
    window = cfg.get("sliding_window", 4096) if cfg.get("use_sliding_window") else None
    types = cfg.get("layer_types") or ["sliding_attention" if window is not None and i >= cfg.get("max_window_layers", 28)
                                       else "full_attention" for i in range(L)]
    return [window if window and types[i] == "sliding_attention" else None for i in range(L)]


def yarn_get_mscale(scale, mscale=1.0):
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def rope_scaling_of(cfg):
    """The config's YaRN object (rope_scaling, or v5's rope_parameters with rope_type yarn), or None."""
    for key in ("rope_scaling", "rope_parameters"):
        rs = cfg.get(key)
        if rs and rs.get("rope_type", rs.get("type")) == "yarn":
            return rs
    return None


def yarn_inv_freq(rs, dim, base, max_pos):
    """(inv_freq float32 [dim/2], attention_factor) as transformers' _compute_yarn_parameters
    computes them for `dim` rotated dimensions."""
    f32 = torch.float32
    orig = rs.get("original_max_position_embeddings") or max_pos
    factor = float(rs["factor"])
    mscale, mscale_all = rs.get("mscale"), rs.get("mscale_all_dim")
    attention_factor = rs.get("attention_factor")
    if attention_factor is None:
        attention_factor = (yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all)
                            if mscale and mscale_all else yarn_get_mscale(factor))
    beta_fast, beta_slow = rs.get("beta_fast") or 32, rs.get("beta_slow") or 1

    def corr_dim(rot):
        return dim * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(base))
    low, high = corr_dim(beta_fast), corr_dim(beta_slow)
    if rs.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=f32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).to(f32) / dim)
    extra_factor = 1 - ramp
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extra_factor) + (1.0 / pos_freqs) * extra_factor
    return inv_freq, float(attention_factor)


def rope_cos_sin(T, hd, theta, cfg=None):
    # HF default rope: inv_freq = 1/theta^(2i/hd); emb = cat(freqs, freqs). hd: the rotated dims.
    # With YaRN (cfg's rope_scaling): its inv_freq, cos and sin times its attention factor.
    rs = rope_scaling_of(cfg) if cfg else None
    if rs:
        inv_freq, af = yarn_inv_freq(rs, hd, theta, cfg["max_position_embeddings"])
        freqs = torch.arange(T).to(torch.float32)[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * af).to(DT)[:, None, :], (emb.sin() * af).to(DT)[:, None, :]
    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=DT) / hd))
    freqs = torch.arange(T, dtype=DT)[:, None] * inv_freq[None, :]  # positions start at 0
    emb = torch.cat((freqs, freqs), dim=-1)  # [T, hd]
    return emb.cos()[:, None, :], emb.sin()[:, None, :]  # broadcast over heads


def linear(x, W, name):
    """x @ W[name.weight]^T (+ W[name.bias] when present, i.e. attention_bias=true)."""
    y = x @ W[name + ".weight"].T
    if name + ".bias" in W:
        y = y + W[name + ".bias"]
    return y


# ---------------------------------------------------------------------------
# LoRA adapters (PEFT layout)
# ---------------------------------------------------------------------------
# Written from PEFT's definitions (peft/tuners/lora): a LoRA Linear computes
#     y = base(x) + scale * B(A(x)),   A: [r, in_features], B: [out_features, r]
# (no bias on A/B), scale = lora_alpha / r, or lora_alpha / sqrt(r) with
# use_rslora. lora_dropout is identity at inference; this reference never applies
# it (the gradient is the gradient of the deterministic, dropout-free loss).
# Module selection (peft.tuners.tuners_utils.check_target_module_exists):
# target_modules a str -> re.fullmatch(target, module_name); a list -> the module
# name equals an entry or ends with "." + entry. The saved state dict names a
# tensor "base_model.model.<module name>.lora_A.weight" / ".lora_B.weight".

PEFT_PREFIX = "base_model.model."
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                "down_proj", "lm_head")


def linear_modules(cfg):
    """Every nn.Linear of the HF model, in state-dict order, as
    (module name, in_features, out_features). The MoE router "mlp.gate" is a Linear
    too (a target "gate" would select it; "gate_proj" never does)."""
    H, V = cfg["hidden_size"], cfg["vocab_size"]
    nH, nKV, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], head_dim_of(cfg)
    out = []
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}"
        out += [(f"{p}.self_attn.q_proj", H, nH * hd), (f"{p}.self_attn.k_proj", H, nKV * hd),
                (f"{p}.self_attn.v_proj", H, nKV * hd), (f"{p}.self_attn.o_proj", nH * hd, H)]

        def mlp(q, inter):
            return [(q + ".gate_proj", H, inter), (q + ".up_proj", H, inter),
                    (q + ".down_proj", inter, H)]
        if is_moe_layer(cfg, i):
            out.append((p + ".mlp.gate", H, cfg["num_experts"]))
            for e in range(cfg["num_experts"]):
                out += mlp(f"{p}.mlp.experts.{e}", cfg["moe_intermediate_size"])
        else:
            out += mlp(p + ".mlp", cfg["intermediate_size"])
    out.append(("lm_head", H, V))  # a module even when its weight is tied to the embedding
    return out


def target_matches(targets, name):
    if isinstance(targets, str):
        return re.fullmatch(targets, name) is not None
    return any(name == t or name.endswith("." + t) for t in targets)


def lora_scale(acfg):
    r, alpha = acfg["r"], acfg["lora_alpha"]
    return alpha / math.sqrt(r) if acfg.get("use_rslora", False) else alpha / r


def lora_names(module):
    return PEFT_PREFIX + module + ".lora_A.weight", PEFT_PREFIX + module + ".lora_B.weight"


def load_adapter(adapter_dir, cfg, modules=None):
    """Read a PEFT LoRA adapter folder for this model config (`modules`: its Linear
    modules as linear_modules lists them, by default this file's Qwen3 ones).
    Returns ({module name: scale}, {PEFT tensor name: float64 tensor}, adapter config)."""
    with open(os.path.join(adapter_dir, "adapter_config.json")) as f:
        acfg = json.load(f)
    if acfg.get("peft_type", "LORA") != "LORA":
        raise SystemExit(f"{adapter_dir}: peft_type {acfg.get('peft_type')!r} is not LORA")
    # Features that change the function and that this reference does not implement.
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
    tensors = read_safetensors(os.path.join(adapter_dir, "adapter_model.safetensors"))
    r, scale = int(acfg["r"]), lora_scale(acfg)
    linears = linear_modules(cfg) if modules is None else modules
    modules, W = {}, {}
    for name, fin, fout in linears:
        if not target_matches(targets, name):
            continue
        an, bn = lora_names(name)
        for n, shape in ((an, (r, fin)), (bn, (fout, r))):
            if n not in tensors:
                raise SystemExit(f"{adapter_dir}: {n} missing (module {name} is targeted)")
            if tuple(tensors[n].shape) != shape:
                raise SystemExit(f"{adapter_dir}: {n} has shape {list(tensors[n].shape)}, "
                                 f"expected {list(shape)}")
            W[n] = tensors.pop(n).to(DT)
        modules[name] = scale
    if tensors:
        raise SystemExit(f"{adapter_dir}: tensors for no targeted module: {sorted(tensors)[:5]}")
    if not modules:
        raise SystemExit(f"{adapter_dir}: target_modules {targets!r} select no module")
    return modules, W, acfg


def swiglu_mlp(x, model, p, proj=("gate_proj", "up_proj", "down_proj")):
    # HF Qwen3MoeMLP / Qwen3MLP: down(silu(gate(x)) * up(x)); proj names (gate, up, down).
    gate, up, down = proj
    g = model.lin(x, f"{p}.{gate}")
    u = model.lin(x, f"{p}.{up}")
    return model.lin(torch.nn.functional.silu(g) * u, f"{p}.{down}")


class Model:
    """The model function, shared by `forward` (under torch.no_grad) and `grad`
    (autograd on the float64 weights in self.W).

    What a family with the same layer but other names changes in a subclass
    (mixtral_ref.py): the model types accepted, QK-norm or not, the MoE block's and
    its experts' projection names, and after __init__ moe_layers, n_experts and
    norm_topk; linear_modules() lists the Linears an adapter may target. glm_ref.py also
    sets rotary_dim (partial RoPE), QK_NORM per config, and overrides moe() and
    param_names() (a frozen buffer: in checkpoint_names, which merge writes, not trained)."""
    MODEL_TYPES = ("qwen3", "qwen3_moe")
    QK_NORM = True                                      # q_norm / k_norm before RoPE
    MOE_BLOCK = "mlp"                                   # model.layers.{i}.<MOE_BLOCK>.gate / .experts.{e}
    EXPERT_PROJ = ("gate_proj", "up_proj", "down_proj")  # an expert's (gate, up, down)

    def __init__(self, model_dir=None, cfg=None, weights=None, adapter=None):
        """adapter: None, a PEFT adapter folder, or (modules {name: scale},
        {PEFT tensor name: tensor}) already in memory (selfcheck)."""
        if model_dir is not None:
            with open(os.path.join(model_dir, "config.json")) as f:
                cfg = json.load(f)
            weights = load_weights(model_dir)
        self.cfg = cfg
        if cfg.get("model_type") not in self.MODEL_TYPES:
            raise SystemExit(f"unsupported model_type {cfg.get('model_type')!r}")
        # Fail loudly rather than silently computing something else.
        if cfg.get("rope_scaling") and not rope_scaling_of(cfg):
            raise SystemExit("rope_scaling other than YaRN is not implemented in the reference")
        if cfg.get("hidden_act", "silu") != "silu":
            raise SystemExit("only hidden_act=silu is implemented")
        self.W = {name: t.to(DT) for name, t in weights.items()}
        self.hd = head_dim_of(cfg)
        self.rotary_dim = self.hd  # RoPE on the first rotary_dim dims of each head (a subclass's)
        self.nH = cfg["num_attention_heads"]
        self.nKV = cfg["num_key_value_heads"]
        self.eps = cfg["rms_norm_eps"]
        self.L = cfg["num_hidden_layers"]
        self.layer_windows = qwen3_layer_windows(cfg)  # per layer: a sliding window, or None
        self.moe_layers = [i for i in range(self.L) if is_moe_layer(cfg, i)]
        self.n_experts = cfg.get("num_experts", 0)
        self.norm_topk = cfg.get("norm_topk_prob", False)
        self.tied = bool(cfg.get("tie_word_embeddings", False))
        # LoRA: self.lora = {module name: scale}; its A/B live in self.W under their
        # PEFT names (self.lora_names), so autograd treats them like any weight.
        self.lora, self.lora_names = {}, []
        if adapter is not None:
            if isinstance(adapter, str):
                mods, lw, _ = load_adapter(adapter, cfg, self.linear_modules())
            else:
                mods, lw = adapter
            self.lora = dict(mods)
            for m in self.lora:
                an, bn = lora_names(m)
                self.W[an], self.W[bn] = lw[an].to(DT), lw[bn].to(DT)
                self.lora_names += [an, bn]

    def linear_modules(self):
        return linear_modules(self.cfg)

    @property
    def lm_head(self):
        # Tied: the very same tensor as the embedding, so autograd sums both uses.
        return self.W["model.embed_tokens.weight"] if self.tied else self.W["lm_head.weight"]

    def checkpoint_names(self):
        """Names of the base tensors the model actually uses, in checkpoint order (what
        `merge` writes). With tie_word_embeddings a stray lm_head.weight in the checkpoint
        is unused."""
        lora = set(self.lora_names)
        return [n for n in self.W
                if n not in lora and not (self.tied and n == "lm_head.weight")]

    def param_names(self):
        """The trainable ones among checkpoint_names (the gradient's entries): all of them
        here; a subclass leaves out frozen buffers (glm_ref.py: the router's correction bias)."""
        return self.checkpoint_names()

    def lin(self, x, name):
        """Every Linear of the model: x W^T (+ bias) (+ scale * (x A^T) B^T with LoRA)."""
        if name == "lm_head":
            y = x @ self.lm_head.T
        else:
            y = linear(x, self.W, name)
        if name in self.lora:
            an, bn = lora_names(name)
            y = y + self.lora[name] * ((x @ self.W[an].T) @ self.W[bn].T)
        return y

    def attention(self, x, p, cos, sin):
        W, T, hd, nH, nKV = self.W, x.shape[0], self.hd, self.nH, self.nKV
        q = self.lin(x, p + ".q_proj").view(T, nH, hd)
        k = self.lin(x, p + ".k_proj").view(T, nKV, hd)
        v = self.lin(x, p + ".v_proj").view(T, nKV, hd)
        if self.QK_NORM:  # Qwen3: per-head RMSNorm over head_dim on q and k, *before* RoPE.
            q = rms_norm(q, W[p + ".q_norm.weight"], self.eps)
            k = rms_norm(k, W[p + ".k_norm.weight"], self.eps)
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        # GQA: query head h reads kv head h // (nH / nKV).
        rep = nH // nKV
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        scores = torch.einsum("thd,shd->hts", q, k) / math.sqrt(hd)
        causal = torch.ones(T, T, dtype=torch.bool).triu(1)  # s > t is masked
        window = getattr(self, "window", None)  # HF's sliding_window (Mistral, Mixtral): keys s > t - window
        if window:
            causal |= torch.ones(T, T, dtype=torch.bool).tril(-window)
        scores = scores.masked_fill(causal, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        o = torch.einsum("hts,shd->thd", probs, v).reshape(T, nH * hd)
        return self.lin(o, p + ".o_proj")

    def moe(self, x, p, replay_ids=None):
        """HF Qwen3MoeSparseMoeBlock. Returns (output, expert ids [T, k], top k+1 probs).

        replay_ids [T, k] (router replay): route token t to exactly those experts
        instead of the router's top-k. Either way the gate weights are the router's
        own softmax probabilities at the chosen ids, renormalised to sum 1 when
        norm_topk_prob (HF: softmax -> topk -> optional renorm). The returned probs
        are always the router's own sorted top-(k+1), replay or not."""
        k, E = self.cfg["num_experts_per_tok"], self.n_experts
        probs = torch.softmax(self.lin(x, p + ".gate"), dim=-1)  # [T, E]
        # Stable descending sort: deterministic order (lower id first) on exact ties.
        vals, ids = torch.sort(probs, dim=-1, descending=True, stable=True)
        top_ids = ids[:, :k] if replay_ids is None else replay_ids
        if replay_ids is not None and bool((replay_ids < 0).any()):
            # A row of negative ids is not replayed: that token takes the router's own
            # top-k (a recorded rollout leaves its last token, never forwarded by the
            # generator, for the trainer to route). Only used by rl_step_ref.py.
            unset = (replay_ids < 0).all(-1, keepdim=True)
            if bool(((replay_ids < 0) != unset).any()):
                raise ValueError("replay ids: a row is either all replayed or all negative")
            top_ids = torch.where(unset, ids[:, :k], replay_ids)
        top_w = probs.gather(1, top_ids)  # == vals[:, :k] without replay
        if self.norm_topk:
            top_w = top_w / top_w.sum(-1, keepdim=True)
        out = torch.zeros_like(x)
        for e in torch.unique(top_ids).tolist():
            rows, slot = (top_ids == e).nonzero(as_tuple=True)
            y = swiglu_mlp(x[rows], self, f"{p}.experts.{e}", self.EXPERT_PROJ)
            out = out.index_add(0, rows, top_w[rows, slot][:, None] * y)
        return out, top_ids, vals[:, :min(k + 1, E)].detach()

    def forward(self, tokens, replay=None):
        """Returns (log-softmax [T, V], experts [T][m][k], router_probs [T][m][k+1]).
        replay: None, or a LongTensor [T, n_moe_layers, k] of expert ids (see moe)."""
        T = len(tokens)
        x = self.W["model.embed_tokens.weight"][torch.tensor(tokens, dtype=torch.long)]
        cos, sin = rope_cos_sin(T, self.rotary_dim, float(self.cfg["rope_theta"]), self.cfg)
        experts = [[] for _ in range(T)]
        rprobs = [[] for _ in range(T)]
        for i in range(self.L):
            p = f"model.layers.{i}"
            h = rms_norm(x, self.W[p + ".input_layernorm.weight"], self.eps)
            self.window = self.layer_windows[i]  # the attention's mask (HF: the layer's sliding_window)
            x = x + self.attention(h, p + ".self_attn", cos, sin)
            h = rms_norm(x, self.W[p + ".post_attention_layernorm.weight"], self.eps)
            if i in self.moe_layers:
                m = self.moe_layers.index(i)
                y, ids, pr = self.moe(h, f"{p}.{self.MOE_BLOCK}",
                                      None if replay is None else replay[:, m, :])
                for t in range(T):
                    experts[t].append(ids[t].tolist())
                    rprobs[t].append(pr[t].tolist())
            else:
                y = swiglu_mlp(h, self, p + ".mlp")
            x = x + y
        x = rms_norm(x, self.W["model.norm.weight"], self.eps)
        logits = self.lin(x, "lm_head")
        return torch.log_softmax(logits, dim=-1), experts, rprobs


def parse_tokens(model, rec):
    tokens = [int(t) for t in rec["tokens"]]
    V = model.cfg["vocab_size"]
    if any(not (0 <= t < V) for t in tokens):
        raise SystemExit(f"token id out of range [0, {V})")
    return tokens


def parse_replay(model, rec, T, where):
    """The line's "experts" as a LongTensor [T, n_moe_layers, k], or None when the
    line has none (the router's own routing is used for that line)."""
    ex = rec.get("experts")
    if ex is None:
        return None
    M = len(model.moe_layers)
    k = model.cfg.get("num_experts_per_tok", 0)
    E = model.n_experts
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
    if T == 0 or M == 0:
        return None
    return torch.tensor(ex, dtype=torch.long)


def token_logprobs(logp, tokens):
    """[T-1] tensor: log p(tokens[t] | tokens[<t]) for t = 1..T-1."""
    idx = torch.tensor(tokens[1:], dtype=torch.long)
    return logp[:-1].gather(1, idx[:, None])[:, 0]


def run_forward(model, tokens, replay=None):
    """One output record. logprobs[t] = log p(tokens[t] | tokens[<t]); entry 0 is None.
    With replay, "experts" echoes the replayed ids."""
    if not tokens:
        return {"tokens": [], "logprobs": [], "experts": [], "router_probs": []}
    logp, experts, rprobs = model.forward(tokens, replay)
    lps = [None] + token_logprobs(logp, tokens).tolist()
    return {"tokens": tokens, "logprobs": lps, "experts": experts, "router_probs": rprobs}


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def adapter_arg(args):
    """The adapter folder to use: --adapter unless --no-lora (which ignores it)."""
    return None if args.no_lora else args.adapter


def cmd_forward(args, model_cls=Model):
    model = model_cls(args.model, adapter=adapter_arg(args))
    n = 0
    with open(args.input) as fin, open(args.output, "w") as fout:
        with torch.no_grad():
            for line in fin:
                if not line.strip():
                    continue
                rec = json.loads(line)
                tokens = parse_tokens(model, rec)
                replay = parse_replay(model, rec, len(tokens), f"line {n}") if args.replay else None
                fout.write(json.dumps(run_forward(model, tokens, replay)) + "\n")
                n += 1
    print(f"forward: {n} sequences -> {args.output}")


# ---------------------------------------------------------------------------
# Gradient (float64 autograd through the same Model.forward)
# ---------------------------------------------------------------------------

def parse_coef(rec, T, where):
    coef = rec.get("coef")
    if not isinstance(coef, list) or len(coef) != T:
        raise SystemExit(f"{where}: \"coef\" must have one entry per token ({T})")
    out = []
    for t in range(1, T):
        c = coef[t]
        if isinstance(c, bool) or not isinstance(c, (int, float)) or not math.isfinite(c):
            raise SystemExit(f"{where} t {t}: coef must be a finite number, got {c!r}")
        out.append(float(c))
    return torch.tensor(out, dtype=DT)


def grad_lines(model, lines, replay_flag, names=None):
    """loss = sum over lines and t >= 1 of coef[t] * logprob[t], and its gradient.
    Returns (loss, [logprobs per line], {name: float64 grad}) for the tensors `names`
    (default: every used base parameter); all other tensors are frozen constants."""
    if names is None:
        names = model.param_names()
    saved = dict(model.W)
    for n in names:
        model.W[n] = saved[n].detach().clone().requires_grad_(True)
    try:
        loss, all_lps = 0.0, []
        for j, rec in enumerate(lines):
            tokens = parse_tokens(model, rec)
            T = len(tokens)
            coef = parse_coef(rec, T, f"line {j}")
            replay = parse_replay(model, rec, T, f"line {j}") if replay_flag else None
            if T < 2:
                all_lps.append([None] * T)
                continue
            logp, _, _ = model.forward(tokens, replay)
            lp = token_logprobs(logp, tokens)
            line_loss = (coef * lp).sum()
            line_loss.backward()  # accumulates into .grad line by line
            loss += line_loss.item()
            all_lps.append([None] + lp.tolist())
        grads = {}
        for n in names:
            g = model.W[n].grad
            grads[n] = torch.zeros_like(saved[n]) if g is None else g.detach().clone()
        return loss, all_lps, grads
    finally:
        model.W.update(saved)


def cmd_grad(args, model_cls=Model):
    model = model_cls(args.model, adapter=adapter_arg(args))
    lines = read_jsonl(args.input)
    if model.lora:
        # LoRA training: the base is frozen; --output gets the A/B gradients only.
        names = model.lora_names + (model.param_names() if args.base_grads else [])
        loss, lps, grads = grad_lines(model, lines, args.replay, names)
        write_safetensors(args.output, [(n, grads[n]) for n in model.lora_names], "F32")
        if args.base_grads:
            write_safetensors(args.base_grads, [(n, grads[n]) for n in model.param_names()], "F32")
    else:
        if args.base_grads:
            raise SystemExit("--base-grads needs --adapter (without it --output has them)")
        loss, lps, grads = grad_lines(model, lines, args.replay)
        write_safetensors(args.output, [(n, grads[n]) for n in model.param_names()], "F32")
    if args.loss_out:
        with open(args.loss_out, "w") as f:
            json.dump({"loss": loss, "logprobs": lps}, f)
            f.write("\n")
    print(f"grad: {len(lines)} sequences, loss {loss:.12g}, {len(grads)} tensors"
          f"{' (LoRA)' if model.lora else ''} -> {args.output}")


# ---------------------------------------------------------------------------
# adamw-steps: torch.optim.AdamW on the `grad` loss (float64)
# ---------------------------------------------------------------------------

def parse_betas(text):
    try:
        b = [float(x) for x in text.split(",")]
    except ValueError:
        b = []
    if len(b) != 2:
        raise SystemExit(f"--betas expects B1,B2, got {text!r}")
    return tuple(b)


def cmd_adamw_steps(args, model_cls=Model):
    model = model_cls(args.model, adapter=adapter_arg(args))
    lines = read_jsonl(args.input)
    if args.steps < 0:
        raise SystemExit("--steps must be >= 0")
    names = list(model.lora_names) if model.lora else model.param_names()
    # Trainable tensors become persistent float64 leaves inside model.W.
    for n in names:
        model.W[n] = model.W[n].detach().clone().requires_grad_(True)
    params = [model.W[n] for n in names]
    opt = torch.optim.AdamW(params, lr=args.lr, betas=parse_betas(args.betas),
                            eps=args.eps, weight_decay=args.weight_decay)
    # Inputs parsed once (same input every step).
    parsed = []
    for j, rec in enumerate(lines):
        tokens = parse_tokens(model, rec)
        T = len(tokens)
        coef = parse_coef(rec, T, f"line {j}")
        replay = parse_replay(model, rec, T, f"line {j}") if args.replay else None
        if T >= 2:
            parsed.append((tokens, coef, replay))

    def loss_backward(backward=True):
        loss = 0.0
        for tokens, coef, replay in parsed:
            logp, _, _ = model.forward(tokens, replay)
            line_loss = (coef * token_logprobs(logp, tokens)).sum()
            if backward:
                line_loss.backward()  # accumulates into .grad line by line
            loss += line_loss.item()
        return loss

    for step in range(1, args.steps + 1):
        opt.zero_grad(set_to_none=True)
        loss = loss_backward()
        for p_ in params:  # unrouted experts / unused tensors: a zero gradient
            if p_.grad is None:
                p_.grad = torch.zeros_like(p_)
        gnorm = torch.norm(torch.stack([p_.grad.detach().norm(2) for p_ in params]), 2).item()
        if args.clip and args.clip > 0:
            torch.nn.utils.clip_grad_norm_(params, args.clip)
        opt.step()
        print(f"step {step} loss {loss:.12g} grad_norm {gnorm:.12g}")
    with torch.no_grad():
        final = loss_backward(backward=False)
    write_safetensors(args.output, [(n, model.W[n].detach()) for n in names], "F32")
    print(f"adamw-steps: {args.steps} steps, {len(lines)} sequences, final loss {final:.12g}, "
          f"{len(names)} tensors{' (LoRA)' if model.lora else ''} -> {args.output}")


# ---------------------------------------------------------------------------
# make-adapter / merge
# ---------------------------------------------------------------------------

def parse_targets(text):
    targets = [t.strip() for t in text.split(",") if t.strip()]
    if not targets:
        raise SystemExit("--targets is empty")
    return targets


def make_lora_weights(cfg, targets, r, seed, b_std, modules=None):
    """Random LoRA A/B for every targeted Linear of `modules` (default: linear_modules(cfg)),
    in module order. A as PEFT's
    init (kaiming_uniform_(a=sqrt(5)): U(-1/sqrt(in), 1/sqrt(in))); B ~ N(0, b_std)
    instead of PEFT's zeros, so the adapter changes the function.
    Returns ([module names], [(PEFT name, fp32 tensor)])."""
    g = torch.Generator().manual_seed(seed)
    mods, out = [], []
    for name, fin, fout in linear_modules(cfg) if modules is None else modules:
        if not target_matches(targets, name):
            continue
        an, bn = lora_names(name)
        bound = 1.0 / math.sqrt(fin)
        a = (torch.rand((r, fin), generator=g, dtype=torch.float32) * 2 - 1) * bound
        b = torch.randn((fout, r), generator=g, dtype=torch.float32) * b_std
        mods.append(name)
        out += [(an, a), (bn, b)]
    if not mods:
        raise SystemExit(f"targets {targets!r} select no module of this model")
    return mods, out


def adapter_config(model_dir, r, alpha, rslora, targets):
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM",
            "base_model_name_or_path": os.path.abspath(model_dir),
            "r": r, "lora_alpha": alpha, "use_rslora": rslora,
            "target_modules": targets, "lora_dropout": 0.0, "bias": "none",
            "fan_in_fan_out": False, "inference_mode": True, "init_lora_weights": True,
            "modules_to_save": None, "layers_to_transform": None, "layers_pattern": None,
            "rank_pattern": {}, "alpha_pattern": {}, "use_dora": False}


def cmd_make_adapter(args, modules_of=linear_modules):
    with open(os.path.join(args.model, "config.json")) as f:
        cfg = json.load(f)
    if args.rank <= 0:
        raise SystemExit("--rank must be positive")
    targets = parse_targets(args.targets)
    mods, tensors = make_lora_weights(cfg, targets, args.rank, args.seed, args.b_std,
                                      modules_of(cfg))
    os.makedirs(args.out, exist_ok=True)
    alpha = int(args.alpha) if float(args.alpha).is_integer() else args.alpha
    acfg = adapter_config(args.model, args.rank, alpha, args.rslora, targets)
    with open(os.path.join(args.out, "adapter_config.json"), "w") as f:
        json.dump(acfg, f, indent=2)
        f.write("\n")
    write_safetensors(os.path.join(args.out, "adapter_model.safetensors"), tensors, "F32")
    print(f"wrote {args.out}: {len(mods)} modules, {len(tensors)} tensors, r={args.rank}, "
          f"alpha={alpha}, rslora={str(args.rslora).lower()}, scale={lora_scale(acfg):.9g}")


def merged_weights(model):
    """Base weights with W += scale * B @ A for every adapted module (float64), in the
    checkpoint's order. Returns (list of (name, tensor), untied): a tied lm_head with
    an adapter is untied (lm_head.weight = embed + delta; the embedding unchanged),
    since merging into the shared tensor would also change the input embedding."""
    W = {n: model.W[n].detach().clone() for n in model.checkpoint_names()}
    untied = model.tied and "lm_head" in model.lora
    if untied:
        W["lm_head.weight"] = W["model.embed_tokens.weight"].clone()
    for m, scale in model.lora.items():
        an, bn = lora_names(m)
        wn = "lm_head.weight" if m == "lm_head" else m + ".weight"
        W[wn] = W[wn] + scale * (model.W[bn] @ model.W[an])
    return list(W.items()), untied


def cmd_merge(args, model_cls=Model):
    model = model_cls(args.model, adapter=args.adapter)
    tensors, untied = merged_weights(model)
    cfg = dict(model.cfg)
    cfg["torch_dtype"] = "float32"
    if untied:
        cfg["tie_word_embeddings"] = False
    os.makedirs(args.out, exist_ok=True)
    for fn in os.listdir(args.out):
        if fn.startswith("model") and (fn.endswith(".safetensors") or fn.endswith(".index.json")):
            os.remove(os.path.join(args.out, fn))
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    write_safetensors(os.path.join(args.out, "model.safetensors"), tensors, "F32")
    print(f"merge: {len(model.lora)} adapted modules -> {args.out} ({len(tensors)} tensors, F32"
          f"{', lm_head untied' if untied else ''})")


# ---------------------------------------------------------------------------
# selfcheck-grad: autograd vs central finite differences, float64, tiny model
# ---------------------------------------------------------------------------

SELFCHECK_SET = {"vocab_size": 11, "hidden_size": 16, "intermediate_size": 24,
                 "moe_intermediate_size": 12, "num_hidden_layers": 2,
                 "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
                 "num_experts": 4, "num_experts_per_tok": 2, "mlp_only_layers": [0]}


def selfcheck_lora(base, base_w, targets, seed, lora):
    """The selfcheck's adapter on `base` (a model of base_w): r 3, alpha 6 (scale alpha/r,
    "rslora": alpha/sqrt(r)), random A and B (std 0.3) on every module `targets` selects.
    Returns (the model with it, as base's class; the failures of its consistency checks:
    B = 0 is the base exactly, the adapter changes the forward, and the float64 merge
    W += scale B A computes the adapter's function up to rounding)."""
    cls, cfg = type(base), base.cfg
    r, alpha = 3, 6.0
    scale = lora_scale({"r": r, "lora_alpha": alpha, "use_rslora": lora == "rslora"})
    mods, lt = make_lora_weights(cfg, list(targets), r, seed + 1000, b_std=0.3,
                                 modules=base.linear_modules())
    lt = dict(lt)
    model = cls(cfg=cfg, weights=base_w, adapter=({m: scale for m in mods}, lt))
    zero_b = {n: (t * 0 if n.endswith("lora_B.weight") else t) for n, t in lt.items()}
    zmodel = cls(cfg=cfg, weights=base_w, adapter=({m: scale for m in mods}, zero_b))
    merged, untied = merged_weights(model)
    mcfg = dict(cfg, tie_word_embeddings=False) if untied else cfg
    mmodel = cls(cfg=mcfg, weights=dict(merged))
    probe = list(range(min(7, cfg["vocab_size"])))
    fails = []
    with torch.no_grad():
        la, _, _ = model.forward(probe)
        lb, _, _ = base.forward(probe)
        lz, _, _ = zmodel.forward(probe)
        lm, _, _ = mmodel.forward(probe)
    if not torch.equal(lz, lb):
        fails.append("adapter with B = 0 changes the forward")
    if (la - lb).abs().max() < 1e-3:
        fails.append("adapter has no effect on the forward")
    if (la - lm).abs().max() > 1e-12:
        fails.append(f"merged model differs from adapter: {(la - lm).abs().max():.2e}")
    return model, fails


def selfcheck_grads(model, seed, replay, kinds_of, T=5, h=1e-6, tol=1e-6, n_entries=4):
    """Autograd vs central differences on a tiny float64 `model` (with an adapter: the
    gradient w.r.t. its A/B only, base frozen). T distinct random tokens, coef uniform in
    [-1, 1]; with replay, per token and MoE layer k random ids other than the router's own
    set. kinds_of(grads, visited) -> [(kind, tensor name)]: the tensors to check, visited
    the expert ids routed to per MoE layer. Also checked: `forward` computes the same
    log-probs and experts; experts no token was routed to get exactly zero gradients;
    with an adapter the gradients are exactly the LoRA tensors'; a tied model has no
    lm_head.weight gradient. Returns (worst rel err, entries checked, failures, visited,
    the loss's rounding noise on a central difference)."""
    cfg, lora = model.cfg, bool(model.lora)
    rng = np.random.default_rng(seed)
    k, E, M = cfg["num_experts_per_tok"], model.n_experts, len(model.moe_layers)
    # Distinct tokens: with equal tokens attention reads identical values, and the
    # q/k gradients are exactly zero (nothing for a difference quotient to resolve).
    tokens = rng.choice(cfg["vocab_size"], T, replace=False).tolist()
    coef = [None] + rng.uniform(-1, 1, T - 1).tolist()
    rec = {"tokens": tokens, "coef": coef}
    with torch.no_grad():
        own = run_forward(model, tokens)["experts"]
    if replay:
        ex = []
        for t in range(T):
            per_layer = []
            for m in range(M):
                while True:  # distinct ids whose set differs from the router's own choice
                    ids = rng.permutation(E)[:k].tolist()
                    if set(ids) != set(own[t][m]):
                        break
                per_layer.append(ids)
            ex.append(per_layer)
        rec["experts"] = ex
    used = own if not replay else rec["experts"]
    loss, lps, grads = grad_lines(model, [rec], replay, model.lora_names if lora else None)
    noise = 2.0 ** -52 * sum(abs(c * l) for c, l in zip(coef[1:], lps[0][1:])) / h

    def loss_at():
        with torch.no_grad():
            logp, _, _ = model.forward(tokens, parse_replay(model, rec, T, "fd") if replay else None)
            return (parse_coef(rec, T, "fd") * token_logprobs(logp, tokens)).sum().item()

    # Consistency: the gradient path computed the same log-probs as `forward`.
    with torch.no_grad():
        fw = run_forward(model, tokens, parse_replay(model, rec, T, "fw") if replay else None)
    assert fw["logprobs"] == lps[0] and fw["experts"] == used
    assert abs(loss - loss_at()) == 0.0

    visited = [sorted({e for t in range(T) for e in used[t][m]}) for m in range(M)]
    fails, worst, checked = [], 0.0, 0
    if lora and set(grads) != set(model.lora_names):
        fails.append("gradient set is not exactly the LoRA tensors")
    for kind, name in kinds_of(grads, visited):
        w, g = model.W[name], grads[name].reshape(-1)
        flat = w.view(-1)
        # The two largest |grad| entries, then random ones among the large: rounding
        # in the loss evaluation puts ~noise (eps * sum|coef*logprob| / h, ~1e-9) on a
        # central difference, so only entries with |grad| >= 1e7 * noise (and >= 0.1 *
        # max) are taken; rel err < 1e-6 then tests autograd, not the rounding.
        order = torch.argsort(g.abs(), descending=True).tolist()
        floor = max(0.1 * abs(g[order[0]].item()), 1e7 * noise)
        big = [i for i in order if abs(g[i].item()) >= floor] or order[:1]
        rest = big[2:]
        pick = big[:2] + (rng.choice(rest, size=min(n_entries - 2, len(rest)),
                                     replace=False).tolist() if rest else [])
        for i in pick:
            orig = flat[i].item()
            with torch.no_grad():
                flat[i] = orig + h
                lp_ = loss_at()
                flat[i] = orig - h
                lm_ = loss_at()
                flat[i] = orig
            fd = (lp_ - lm_) / (2 * h)
            ad = g[i].item()
            rel = abs(fd - ad) / max(abs(ad), 1e-300)
            worst = max(worst, rel)
            checked += 1
            if rel > tol:
                fails.append(f"{kind} {name}[{i}]: autograd {ad:.12e} fd {fd:.12e} rel {rel:.2e}")
    # Experts nobody routed to get exactly zero gradient.
    for m, layer in enumerate(model.moe_layers):
        for e in range(E):
            if e in visited[m]:
                continue
            for part in model.EXPERT_PROJ:
                mod = f"model.layers.{layer}.{model.MOE_BLOCK}.experts.{e}.{part}"
                for n in (lora_names(mod) if lora else (mod + ".weight",)):
                    if grads[n].abs().max() != 0:
                        fails.append(f"unvisited expert {e} {part} has a non-zero gradient ({n})")
    if model.tied and "lm_head.weight" in grads:
        fails.append("tied model has an lm_head.weight gradient")
    return worst, checked, fails, visited, noise


def selfcheck_case(norm_topk, replay, tied, seed, lora=None):
    """lora: None, or "lora" / "rslora": an adapter (selfcheck_lora) on every LORA_TARGETS
    module incl. experts and lm_head; then the gradient is taken w.r.t. the LoRA tensors
    only (base frozen) and those are checked."""
    cfg = build_config(dict(SELFCHECK_SET, norm_topk_prob=norm_topk,
                            tie_word_embeddings=tied), "f32")
    # Large std: sizeable gradients everywhere, so central differences resolve them.
    base_w = dict(make_weights(cfg, seed, std=0.3))
    model = Model(cfg=cfg, weights=base_w)
    lora_fails = []
    if lora:
        model, lora_fails = selfcheck_lora(model, base_w, LORA_TARGETS, seed, lora)
    assert model.moe_layers == [1], model.moe_layers

    def kinds_of(grads, visited):
        if lora:
            top_e = max(visited[0], key=lambda e: grads[lora_names(f"model.layers.1.mlp.experts.{e}.down_proj")[1]].norm())
            kinds = []
            for kind, m in (("q_proj", "model.layers.0.self_attn.q_proj"),
                            ("v_proj", "model.layers.1.self_attn.v_proj"),
                            ("o_proj", "model.layers.1.self_attn.o_proj"),
                            ("dense_gate", "model.layers.0.mlp.gate_proj"),
                            ("expert_up", f"model.layers.1.mlp.experts.{top_e}.up_proj"),
                            ("expert_down", f"model.layers.1.mlp.experts.{top_e}.down_proj"),
                            ("lm_head", "lm_head")):
                an, bn = lora_names(m)
                kinds += [(kind + " lora_A", an), (kind + " lora_B", bn)]
            return kinds
        top_e = max(visited[0], key=lambda e: grads[f"model.layers.1.mlp.experts.{e}.down_proj.weight"].norm())
        return [("embed", "model.embed_tokens.weight"),
                ("q_proj", "model.layers.0.self_attn.q_proj.weight"),
                ("q_proj", "model.layers.1.self_attn.q_proj.weight"),
                ("k_norm", "model.layers.1.self_attn.k_norm.weight"),
                ("router", "model.layers.1.mlp.gate.weight"),
                ("expert_down", f"model.layers.1.mlp.experts.{top_e}.down_proj.weight"),
                ("lm_head", "model.embed_tokens.weight" if tied else "lm_head.weight")]
    worst, checked, fails, visited, noise = selfcheck_grads(model, seed, replay, kinds_of,
                                                            n_entries=3 if lora else 4)
    return worst, checked, lora_fails + fails, visited[0], noise


def cmd_selfcheck_grad(args):
    ok = True
    cases = [(nt, rp, False, None) for nt in (True, False) for rp in (False, True)]
    cases += [(True, True, True, None)]  # tied embeddings: lm_head gradient lands in the embedding
    # LoRA (base frozen, A/B gradients): plain scale alpha/r, and rslora on a tied model.
    cases += [(True, False, False, "lora"), (False, True, True, "rslora")]
    for c, (nt, rp, tied, lora) in enumerate(cases):
        worst, checked, fails, visited, noise = selfcheck_case(nt, rp, tied, seed=args.seed + c,
                                                               lora=lora)
        print(f"selfcheck-grad norm_topk_prob={str(nt).lower():5s} replay={str(rp).lower():5s} "
              f"tied={str(tied).lower():5s} lora={lora or 'none':6s}: {checked} entries, "
              f"worst rel err {worst:.2e} "
              f"(fd rounding ~{noise:.0e} abs), experts visited {visited}  "
              f"{'ok' if not fails else 'FAIL'}")
        for f_ in fails:
            print("  " + f_)
        ok &= not fails
    print("selfcheck-grad: PASS" if ok else "selfcheck-grad: FAIL")
    return 0 if ok else 1


def arg_parser(description):
    """The subcommands and their options (mixtral_ref.py's too, with its own docstring)."""
    ap = argparse.ArgumentParser(description=description,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    mm = sub.add_parser("make-model", help="write config.json + random safetensors weights")
    mm.add_argument("--out", required=True)
    mm.add_argument("--seed", type=int, required=True)
    mm.add_argument("--dtype", choices=["f32", "bf16"], required=True)
    mm.add_argument("--shards", type=int, default=1)
    mm.add_argument("--std", type=float, default=0.02,
                    help="std of linear/embedding weights (larger -> sharper logits)")
    mm.add_argument("--set", action="extend", nargs="+", metavar="KEY=VALUE",
                    help="override a config key; VALUE parsed as JSON, else string")
    fw = sub.add_parser("forward", help="float64 reference forward over a JSONL of token lists")
    fw.add_argument("--model", required=True)
    fw.add_argument("--input", required=True)
    fw.add_argument("--output", required=True)
    fw.add_argument("--replay", action="store_true",
                    help="route by the input lines' \"experts\" (router replay)")
    fw.add_argument("--adapter", metavar="ADIR", help="apply this PEFT LoRA adapter")
    fw.add_argument("--no-lora", action="store_true", help="ignore --adapter")
    gr = sub.add_parser("grad", help="float64 gradient of sum coef[t]*logprob[t] -> safetensors")
    gr.add_argument("--model", required=True)
    gr.add_argument("--input", required=True)
    gr.add_argument("--output", required=True)
    gr.add_argument("--replay", action="store_true",
                    help="route by the input lines' \"experts\" (router replay)")
    gr.add_argument("--loss-out", help="write {\"loss\", \"logprobs\"} JSON here")
    gr.add_argument("--adapter", metavar="ADIR",
                    help="PEFT LoRA adapter: base frozen, --output gets the lora_A/lora_B grads")
    gr.add_argument("--no-lora", action="store_true", help="ignore --adapter")
    gr.add_argument("--base-grads", metavar="FILE",
                    help="with --adapter: also write the (frozen) base weights' gradients")
    aw = sub.add_parser("adamw-steps", help="N float64 torch AdamW steps on the grad loss")
    aw.add_argument("--model", required=True)
    aw.add_argument("--input", required=True)
    aw.add_argument("--output", required=True, help="trainable tensors' final values (F32)")
    aw.add_argument("--replay", action="store_true",
                    help="route by the input lines' \"experts\" (router replay)")
    aw.add_argument("--adapter", metavar="ADIR",
                    help="PEFT LoRA adapter: base frozen, only lora_A/lora_B are trained")
    aw.add_argument("--no-lora", action="store_true", help="ignore --adapter")
    aw.add_argument("--steps", type=int, required=True)
    aw.add_argument("--lr", type=float, required=True)
    aw.add_argument("--weight-decay", type=float, required=True)
    aw.add_argument("--betas", required=True, help="B1,B2")
    aw.add_argument("--eps", type=float, required=True)
    aw.add_argument("--clip", type=float, default=0.0,
                    help="clip_grad_norm_ to this max norm before each step (0: off)")
    ma = sub.add_parser("make-adapter", help="write a random PEFT LoRA adapter for a model")
    ma.add_argument("--model", required=True)
    ma.add_argument("--out", required=True)
    ma.add_argument("--rank", type=int, required=True)
    ma.add_argument("--alpha", type=float, required=True)
    ma.add_argument("--rslora", action="store_true", help="scale = alpha / sqrt(r)")
    ma.add_argument("--targets", required=True,
                    help="comma-separated module-name suffixes, e.g. q_proj,v_proj,lm_head")
    ma.add_argument("--seed", type=int, required=True)
    ma.add_argument("--b-std", type=float, default=0.05, help="std of the random lora_B")
    mg = sub.add_parser("merge", help="W += scale * B @ A; write a full F32 model")
    mg.add_argument("--model", required=True)
    mg.add_argument("--adapter", required=True)
    mg.add_argument("--out", required=True)
    sc = sub.add_parser("selfcheck-grad", help="autograd vs finite differences on a tiny model")
    sc.add_argument("--seed", type=int, default=1)
    return ap


def main(argv=None):
    args = arg_parser(__doc__).parse_args(argv)
    if args.cmd == "make-model":
        return cmd_make_model(args)
    if args.cmd == "forward":
        return cmd_forward(args)
    if args.cmd == "grad":
        return cmd_grad(args)
    if args.cmd == "adamw-steps":
        return cmd_adamw_steps(args)
    if args.cmd == "make-adapter":
        return cmd_make_adapter(args)
    if args.cmd == "merge":
        return cmd_merge(args)
    return cmd_selfcheck_grad(args)


if __name__ == "__main__":
    sys.exit(main())
