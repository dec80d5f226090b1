#!/usr/bin/python3
"""PyTorch side of the trill training benchmark: one forward + backward step of an
eager, Hugging Face-style Qwen3-MoE (float32) on random tokens, full or LoRA.

  /usr/bin/python3 bench/torch_train.py --model DIR [--lora|--full] [--rank 16]
      [--batch 8] [--seq 512] [--runs 3] [--threads 2] [--seed 0]

Modules follow transformers' modeling_qwen3_moe.py (eager attention, the sparse MoE
block's per-expert loop with index_add_) and PEFT's LoRA Linear (scale alpha/r,
alpha = 2 * rank, no dropout) on every q/k/v/o/gate_proj/up_proj/down_proj, experts
included. A step is forward + mean next-token cross-entropy + loss.backward(); no
optimizer step, as trill's bench_forward --train times it.
"""
import argparse, json, math, os, resource, statistics, struct, time
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

META = torch.device("meta")  # modules are built without storage; the checkpoint fills them


def read_safetensors(path):
    """Yield (name, float32 tensor) one tensor at a time (F32/BF16/F16 widened)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        for name, info in header.items():
            if name == "__metadata__":
                continue
            b, e = info["data_offsets"]
            f.seek(8 + n + b)
            raw = np.frombuffer(f.read(e - b), dtype={"F32": "<f4", "BF16": "<u2", "F16": "<f2"}[info["dtype"]])
            if info["dtype"] == "BF16":
                raw = (raw.astype(np.uint32) << 16).view(np.float32)
            yield name, torch.from_numpy(raw.astype(np.float32).reshape(info["shape"]))


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.empty(n, device=META)), eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def repeat_kv(x, n):  # [B, nKV, T, hd] -> [B, nKV * n, T, hd]
    B, h, T, d = x.shape
    return x if n == 1 else x[:, :, None].expand(B, h, n, T, d).reshape(B, h * n, T, d)


def linear(i, o, bias=False):
    return nn.Linear(i, o, bias=bias, device=META)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        H, self.hd = c["hidden_size"], c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
        nH, nKV, bias = c["num_attention_heads"], c["num_key_value_heads"], c.get("attention_bias", False)
        self.groups, self.scaling = nH // nKV, self.hd ** -0.5
        self.q_proj, self.k_proj = linear(H, nH * self.hd, bias), linear(H, nKV * self.hd, bias)
        self.v_proj, self.o_proj = linear(H, nKV * self.hd, bias), linear(nH * self.hd, H, bias)
        self.q_norm, self.k_norm = RMSNorm(self.hd, c["rms_norm_eps"]), RMSNorm(self.hd, c["rms_norm_eps"])

    def forward(self, x, cos, sin, mask):
        B, T, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(B, T, -1, self.hd)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(B, T, -1, self.hd)).transpose(1, 2)
        v = self.v_proj(x).view(B, T, -1, self.hd).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = repeat_kv(k, self.groups), repeat_kv(v, self.groups)
        w = torch.matmul(q, k.transpose(2, 3)) * self.scaling + mask
        w = F.softmax(w, dim=-1, dtype=torch.float32)
        return self.o_proj(torch.matmul(w, v).transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self, H, inter):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = linear(H, inter), linear(H, inter), linear(inter, H)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class SparseMoeBlock(nn.Module):  # transformers' Qwen3MoeSparseMoeBlock
    def __init__(self, c):
        super().__init__()
        self.E, self.top_k, self.norm_topk_prob = c["num_experts"], c["num_experts_per_tok"], c.get("norm_topk_prob", False)
        self.gate = linear(c["hidden_size"], self.E)
        self.experts = nn.ModuleList(MLP(c["hidden_size"], c["moe_intermediate_size"]) for _ in range(self.E))

    def forward(self, hidden_states):
        B, T, H = hidden_states.shape
        hidden_states = hidden_states.view(-1, H)
        routing_weights = F.softmax(self.gate(hidden_states), dim=1, dtype=torch.float)
        routing_weights, selected_experts = torch.topk(routing_weights, self.top_k, dim=-1)
        if self.norm_topk_prob:
            routing_weights = routing_weights / routing_weights.sum(dim=-1, keepdim=True)
        final = torch.zeros_like(hidden_states)
        expert_mask = F.one_hot(selected_experts, num_classes=self.E).permute(2, 1, 0)  # [E, k, tokens]
        for e in (expert_mask.sum(dim=(-1, -2)) > 0).nonzero().flatten().tolist():
            idx, top_x = torch.where(expert_mask[e])
            y = self.experts[e](hidden_states[top_x]) * routing_weights[top_x, idx, None]
            final.index_add_(0, top_x, y)
        return final.view(B, T, H)


class DecoderLayer(nn.Module):
    def __init__(self, c, i):
        super().__init__()
        H, eps = c["hidden_size"], c["rms_norm_eps"]
        self.self_attn = Attention(c)
        sparse = (i not in c.get("mlp_only_layers", []) and c.get("num_experts", 0) > 0
                  and (i + 1) % c.get("decoder_sparse_step", 1) == 0)
        self.mlp = SparseMoeBlock(c) if sparse else MLP(H, c["intermediate_size"])
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(H, eps), RMSNorm(H, eps)

    def forward(self, x, cos, sin, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Model(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"], device=META)
        self.layers = nn.ModuleList(DecoderLayer(c, i) for i in range(c["num_hidden_layers"]))
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        hd = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
        self.register_buffer("inv_freq", 1.0 / c.get("rope_theta", 10000.0) ** (torch.arange(0, hd, 2).float() / hd), False)

    def forward(self, ids):
        T = ids.shape[1]
        emb = torch.cat([torch.arange(T).float()[:, None] * self.inv_freq[None]] * 2, dim=-1)
        cos, sin = emb.cos(), emb.sin()
        mask = torch.full((T, T), torch.finfo(torch.float32).min).triu(1)
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        return self.norm(x)


class Qwen3MoeForCausalLM(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.model, self.lm_head = Model(c), linear(c["hidden_size"], c["vocab_size"])

    def forward(self, ids):
        logits = self.lm_head(self.model(ids)).float()
        V = logits.shape[-1]
        return F.cross_entropy(logits[:, :-1].reshape(-1, V), ids[:, 1:].reshape(-1))


def load_model(d):
    with open(os.path.join(d, "config.json")) as f:
        c = json.load(f)
    if c.get("model_type") != "qwen3_moe" or c.get("rope_scaling") or c.get("use_sliding_window"):
        raise SystemExit("only qwen3_moe without rope_scaling / sliding window is supported")
    m = Qwen3MoeForCausalLM(c)
    index = os.path.join(d, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) else ["model.safetensors"]
    for fn in files:
        for name, t in read_safetensors(os.path.join(d, fn)):
            mod, _, attr = name.rpartition(".")
            if name == "lm_head.weight" and c.get("tie_word_embeddings"):
                continue
            setattr(m.get_submodule(mod), attr, nn.Parameter(t))
    if c.get("tie_word_embeddings"):
        m.lm_head.weight = m.model.embed_tokens.weight
    missing = [n for n, p in m.named_parameters() if p.is_meta]
    if missing:
        raise SystemExit(f"tensors missing from the checkpoint: {missing[:5]}")
    return m, c


class LoraLinear(nn.Module):  # PEFT lora.Linear: base(x) + scale * B(A(x)); A kaiming, B zeros
    def __init__(self, base, r, alpha):
        super().__init__()
        self.base_layer, self.scaling = base, alpha / r
        self.lora_A = nn.Linear(base.in_features, r, bias=False)
        self.lora_B = nn.Linear(r, base.out_features, bias=False)
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B.weight)

    def forward(self, x):
        return self.base_layer(x) + self.lora_B(self.lora_A(x)) * self.scaling


def add_lora(model, r):
    model.requires_grad_(False)
    targets = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    for name, mod in list(model.named_modules()):
        if isinstance(mod, nn.Linear) and name.rsplit(".", 1)[-1] in targets:
            parent, _, attr = name.rpartition(".")
            setattr(model.get_submodule(parent), attr, LoraLinear(mod, r, 2.0 * r))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--lora", action="store_true")
    g.add_argument("--full", action="store_true")
    ap.add_argument("--bf16", action="store_true", help="matmuls under torch.autocast('cpu', bfloat16), as trainer.precision bf16")
    for opt, v in (("--rank", 16), ("--batch", 8), ("--seq", 512), ("--runs", 3), ("--threads", 2), ("--seed", 0)):
        ap.add_argument(opt, type=int, default=v)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    mode = "lora" if a.lora else "full"
    model, c = load_model(a.model)
    if a.lora:
        add_lora(model, a.rank)
    model.train()
    ids = torch.randint(0, c["vocab_size"], (a.batch, a.seq), generator=torch.Generator().manual_seed(a.seed))
    n_all = sum(p.numel() for p in model.parameters())
    n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {n_all} parameters, {n_train} trainable"
          + (f" (LoRA rank {a.rank})" if a.lora else ""))
    times = []
    for r in range(-1, a.runs):  # one warm-up
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
            loss = model(ids)
        loss.backward()
        dt = time.perf_counter() - t0
        print(f"{'warm-up' if r < 0 else f'step {r + 1}'}: {dt * 1e3:.0f} ms, loss {loss.item():.4f}", flush=True)
        if r >= 0:
            times.append(dt)
    med = statistics.median(times)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(f"torch train ({mode}, {'bf16 autocast' if a.bf16 else 'fp32'}) {a.batch}x{a.seq}: {a.batch * a.seq / med:.0f} tokens/s, "
          f"median {med * 1e3:.0f} ms, peak RSS {rss:.0f} MB")


if __name__ == "__main__":
    main()
