#!/usr/bin/python3
"""The kernels DeepSeek-V3 / Kimi-K2 need, against a float64 PyTorch reference.

The references below are written from Hugging Face transformers' equations
(modeling_deepseek_v3.py, modeling_rope_utils.py), not from the C code:

  attention  eager_attention_forward: softmax(q k^T * scaling + causal mask) v per
             sequence, key/value heads repeated (repeat_kv), the value head size
             differing from the query/key one (MLA: 192 / 128), an explicit scaling
             (qk_head_dim^-0.5 * yarn_get_mscale(factor, mscale_all_dim)^2).
             Gradients by autograd.
  rope       DeepseekV3RotaryEmbedding (angles inv_freq * position in float32, as
             HF forces; cos/sin times attention_scaling) with apply_rotary_pos_emb
             (rotate-half) or apply_rotary_pos_emb_interleave on the rotary part of
             each head (q_rot after q_pass). trill rotates adjacent pairs (2i, 2i+1)
             in place; HF's interleave returns the same values with the rotary dims
             permuted to (0, 2, 4, ..., 1, 3, 5, ...): the check compares through that
             permutation, and also that q.k (all attention sees) is the same either
             way. Gradients by autograd.
  yarn       _compute_yarn_parameters, in float32 like HF (pos_freqs, the ramp and
             the blend are float32 tensors, the correction range Python floats), the
             attention factor from get_mscale.
  router     DeepseekV3TopkRouter.forward / get_topk_indices: sigmoid (or softmax)
             scores, + e_score_correction_bias for the choice, groups scored by the
             sum of their top-2, the topk_group best kept, top-k; weights = the
             unbiased scores gathered, / (sum + eps) when norm_topk_prob, times
             routed_scaling_factor. HF fills the masked groups with 0.0; DeepSeek's
             own inference code and vLLM with -inf, as trill does: cases with a
             non-negative bias (sigmoid scores > 0: both fills choose the same) use
             HF's 0.0, cases with negative biases -inf. The Qwen3 path (softmax,
             one group, / sum, no scaling) is one of the cases.

Inputs are random float32 values; kernel_tool (tests/reference/kernel_tool.c, the
fp32 kernels of trill_core) computes the same cases. Tolerances: relative to the
largest reference value of each output, 1e-5 for attention, rope and the router;
the router's chosen ids exactly (rows whose choice is within 1e-4 of a tie are
redrawn); YaRN's inv_freq within 1 ulp of HF's float32 (torch's pow can miss the
correctly rounded value trill uses by an ulp) and bit for bit once HF's formula is
fed the correctly rounded pos_freqs; the attention factor exactly.

ctest runs it as `kernels_torch` (tests/CMakeLists.txt):
    /usr/bin/python3 tests/reference/kernels_ref.py check --tool build/tests/kernel_tool [--seed S]
Exit status 0 when every case agrees.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

TOL = 1e-5
DT = torch.float64


# ---------------------------------------------------------------------------
# References (float64 unless HF computes in float32)
# ---------------------------------------------------------------------------

def repeat_kv(x, n_rep):
    b, h, s, d = x.shape
    if n_rep == 1:
        return x
    return x[:, :, None, :, :].expand(b, h, n_rep, s, d).reshape(b, h * n_rep, s, d)


def ref_attention(case):
    nh, nkv, hd, hv, scaling = case["nh"], case["nkv"], case["hd_qk"], case["hd_v"], case["scale"]
    offsets = case["offsets"]
    T = offsets[-1]
    q = torch.tensor(case["q"], dtype=DT).view(T, nh, hd).requires_grad_()
    k = torch.tensor(case["k"], dtype=DT).view(T, nkv, hd).requires_grad_()
    v = torch.tensor(case["v"], dtype=DT).view(T, nkv, hv).requires_grad_()
    outs = []
    for s in range(len(offsets) - 1):
        a, b = offsets[s], offsets[s + 1]
        L = b - a
        if L == 0:
            continue
        query = q[a:b].transpose(0, 1)[None]           # [1, nh, L, hd]
        key = repeat_kv(k[a:b].transpose(0, 1)[None], nh // nkv)
        value = repeat_kv(v[a:b].transpose(0, 1)[None], nh // nkv)
        mask = torch.full((L, L), float("-inf"), dtype=DT).triu(1)
        w = torch.matmul(query, key.transpose(2, 3)) * scaling + mask
        w = torch.nn.functional.softmax(w, dim=-1, dtype=DT)
        o = torch.matmul(w, value).transpose(1, 2).reshape(L, nh * hv)
        outs.append(o)
    out = torch.cat(outs) if outs else torch.zeros(0, nh * hv, dtype=DT)
    dout = torch.tensor(case["dout"], dtype=DT).view(T, nh * hv)
    (out * dout).sum().backward()
    return {"out": out.detach().flatten(), "dq": q.grad.flatten(), "dk": k.grad.flatten(), "dv": v.grad.flatten()}


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rope_cos_sin(inv_freq, pos, attention_scaling):
    """DeepseekV3RotaryEmbedding.forward: the angles in float32 (HF disables autocast and
    multiplies float32 tensors); cos and sin of those angles, times the scaling, here in
    float64."""
    inv = torch.tensor(inv_freq, dtype=torch.float32)
    p = torch.tensor(pos, dtype=torch.float32)
    freqs = (inv[None, :, None] @ p[None, None, :]).transpose(1, 2)[0]  # [T, d/2], float32
    emb = torch.cat((freqs, freqs), dim=-1).to(DT)
    return emb.cos() * attention_scaling, emb.sin() * attention_scaling


def interleave_perm(d):
    """HF apply_rotary_pos_emb_interleave's view(d/2, 2).transpose(-1, -2).reshape(d):
    output position j holds input dim perm[j]."""
    return torch.arange(d).view(d // 2, 2).transpose(0, 1).reshape(d)


def ref_rope(case):
    T, nh, stride = len(case["pos"]), case["n_heads"], case["head_stride"]
    off, rd = case["rot_offset"], case["rot_dim"]
    cos, sin = rope_cos_sin(case["inv_freq"], case["pos"], case["cs_scale"])
    cos, sin = cos[:, None, :], sin[:, None, :]  # unsqueeze over heads: x is [T, nh, d]
    x = torch.tensor(case["x"], dtype=DT).view(T, nh, stride).requires_grad_()
    rot = x[..., off:off + rd]
    if case["pairing"] == "half":  # apply_rotary_pos_emb
        y_rot = rot * cos + rotate_half(rot) * sin
        y_trill = y_rot
    else:  # apply_rotary_pos_emb_interleave: permute, then rotate halves
        perm = interleave_perm(rd)
        r = rot.reshape(T, nh, rd // 2, 2).transpose(-1, -2).reshape(T, nh, rd)
        assert torch.equal(r, rot[..., perm])
        y_rot = r * cos + rotate_half(r) * sin      # HF's output: dims in permuted order
        y_trill = y_rot[..., torch.argsort(perm)]   # back to the input's dim order
    y = torch.cat((x[..., :off], y_trill, x[..., off + rd:]), dim=-1)
    dout = torch.tensor(case["dout"], dtype=DT).view(T, nh, stride)
    (y * dout).sum().backward()
    return {"y": y.detach().flatten(), "dx": x.grad.flatten(), "hf_rot": y_rot.detach()}


def hf_yarn(dim, theta, factor, original_max, beta_fast, beta_slow, mscale, mscale_all_dim, truncate,
            pos_freqs=None):
    """_compute_yarn_parameters with its config reads replaced by arguments. pos_freqs, when
    given, replaces HF's `base ** (torch.arange(0, dim, 2).float() / dim)`."""
    def get_mscale(scale, mscale=1):
        if scale <= 1:
            return 1.0
        return 0.1 * mscale * math.log(scale) + 1.0

    if mscale and mscale_all_dim:
        attention_factor = float(get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim))
    else:
        attention_factor = get_mscale(factor)
    beta_fast = beta_fast or 32
    beta_slow = beta_slow or 1

    def find_correction_dim(num_rotations, dim, base, max_position_embeddings):
        return (dim * math.log(max_position_embeddings / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    def find_correction_range(low_rot, high_rot, dim, base, max_position_embeddings, truncate):
        low = find_correction_dim(low_rot, dim, base, max_position_embeddings)
        high = find_correction_dim(high_rot, dim, base, max_position_embeddings)
        if truncate:
            low = math.floor(low)
            high = math.ceil(high)
        return max(low, 0), min(high, dim - 1)

    def linear_ramp_factor(min, max, dim):
        if min == max:
            max += 0.001
        linear_func = (torch.arange(dim, dtype=torch.float32) - min) / (max - min)
        return torch.clamp(linear_func, 0, 1)

    if pos_freqs is None:
        pos_freqs = theta ** (torch.arange(0, dim, 2).to(dtype=torch.float) / dim)
    inv_freq_extrapolation = 1.0 / pos_freqs
    inv_freq_interpolation = 1.0 / (factor * pos_freqs)
    low, high = find_correction_range(beta_fast, beta_slow, dim, theta, original_max, truncate)
    inv_freq_extrapolation_factor = 1 - linear_ramp_factor(low, high, dim // 2).to(dtype=torch.float)
    inv_freq = (inv_freq_interpolation * (1 - inv_freq_extrapolation_factor)
                + inv_freq_extrapolation * inv_freq_extrapolation_factor)
    return inv_freq, attention_factor


def ref_router(case, mask_value):
    T, E, K = case["T"], case["E"], case["K"]
    n_group, topk_group = case["n_group"], case["topk_group"]
    logits = torch.tensor(case["logits"], dtype=DT).view(T, E).requires_grad_()
    scores = logits.sigmoid() if case["score"] == "sigmoid" else logits.softmax(dim=-1)
    bias = torch.zeros(E, dtype=DT) if case["bias"] is None else torch.tensor(case["bias"], dtype=DT)
    with torch.no_grad():  # get_topk_indices
        scores_for_choice = scores.view(-1, E) + bias.unsqueeze(0)
        group_scores = scores_for_choice.view(-1, n_group, E // n_group).topk(2, dim=-1)[0].sum(dim=-1)
        group_idx = torch.topk(group_scores, k=topk_group, dim=-1, sorted=False)[1]
        group_mask = torch.zeros_like(group_scores)
        group_mask.scatter_(1, group_idx, 1)
        score_mask = group_mask.unsqueeze(-1).expand(-1, n_group, E // n_group).reshape(-1, E)
        masked = scores_for_choice.masked_fill(~score_mask.bool(), mask_value)
        topk_indices = torch.topk(masked, k=K, dim=-1, sorted=False)[1]
        # trill lists the ids by descending selection score: the same order here
        order = torch.argsort(masked.gather(1, topk_indices), dim=-1, descending=True)
        topk_indices = topk_indices.gather(1, order)
        # how close the choice came to a tie (groups and experts), for the redraw
        gs = group_scores.sort(dim=-1, descending=True)[0]
        gap_g = (gs[:, topk_group - 1] - gs[:, topk_group]) if topk_group < n_group else torch.full((T,), 1.0, dtype=DT)
        # the chosen experts' order and the K-th against the next: the K + 1 best eligible
        eligible = scores_for_choice.masked_fill(~score_mask.bool(), float("-inf")).sort(dim=-1, descending=True)[0]
        top = eligible[:, :K + 1]
        gap_e = (top[:, :-1] - top[:, 1:]).min(dim=-1)[0] if top.shape[1] > 1 else torch.full((T,), 1.0, dtype=DT)
    topk_weights = scores.gather(1, topk_indices)
    if case["norm"]:
        topk_weights = topk_weights / (topk_weights.sum(dim=-1, keepdim=True) + case["eps"])
    topk_weights = topk_weights * case["scaling"]
    dgates = torch.tensor(case["dgates"], dtype=DT).view(T, K)
    (topk_weights * dgates).sum().backward()
    return {"scores": scores.detach().flatten(), "idx": topk_indices.flatten(), "gates": topk_weights.detach().flatten(),
            "dlogits": logits.grad.flatten(), "gap": torch.minimum(gap_g, gap_e)}


# ---------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------

def f32_list(t):
    return [float(v) for v in t.to(torch.float32).flatten()]


def yarn_mscale(scale, mscale=1.0):
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def attention_cases(g):
    def case(name, nh, nkv, hd, hv, scale, lens):
        offsets = [0]
        for n in lens:
            offsets.append(offsets[-1] + n)
        T = offsets[-1]
        r = lambda n, s: f32_list(torch.rand(n, generator=g, dtype=DT) * 2 * s - s)
        return {"op": "attention", "name": name, "nh": nh, "nkv": nkv, "hd_qk": hd, "hd_v": hv, "scale": scale,
                "offsets": offsets, "q": r(T * nh * hd, 1.5), "k": r(T * nkv * hd, 1.5), "v": r(T * nkv * hv, 1),
                "dout": r(T * nh * hv, 1)}
    m = yarn_mscale(40, 1.0)
    return [
        # DeepSeek-V3 MLA: per-head keys (nkv = nh), qk 128 + 64 = 192, v 128, YaRN factor 40
        case("attention mla 192/128", 4, 4, 192, 128, 192 ** -0.5 * m * m, [70, 1, 0, 130]),
        case("attention qwen3 gqa 64", 8, 2, 64, 64, 1 / math.sqrt(64), [65, 3, 129]),
        case("attention gqa 40/24", 6, 3, 40, 24, 0.3, [1, 64, 100]),
        case("attention v larger 16/48", 4, 1, 16, 48, 0.2, [50, 77]),
    ]


def rope_cases(g):
    cases = []
    specs = [  # name, heads, head stride, offset, rotary dim, pairing, cs_scale, theta
        ("rope mla q adjacent", 3, 192, 128, 64, "adjacent", 1.0, 10000.0),
        ("rope mla q half", 3, 192, 128, 64, "half", 1.0, 10000.0),
        ("rope mla k_rot adjacent yarn", 1, 576, 512, 64, "adjacent", yarn_mscale(40, 0.707) / yarn_mscale(40, 1.0), 10000.0),
        ("rope qwen3 full head", 4, 64, 0, 64, "half", 1.0, 1e6),
        ("rope partial 24 of 40 scaled", 2, 40, 8, 24, "half", 1.3, 50000.0),
        ("rope partial 24 of 40 adjacent scaled", 2, 40, 8, 24, "adjacent", 1.3, 50000.0),
    ]
    for name, nh, stride, off, rd, pairing, cs, theta in specs:
        T = 37
        pos = [int(p) for p in torch.randint(0, 6000, (T,), generator=g)]
        pos[0] = 0
        inv = 1.0 / (theta ** (torch.arange(0, rd, 2, dtype=torch.int64).float() / rd))  # HF default, float32
        n = T * nh * stride
        cases.append({"op": "rope", "name": name, "n_heads": nh, "head_stride": stride, "rot_offset": off, "rot_dim": rd,
                      "pairing": pairing, "cs_scale": cs, "pos": pos, "inv_freq": f32_list(inv),
                      "x": f32_list(torch.randn(n, generator=g, dtype=DT)),
                      "dout": f32_list(torch.randn(n, generator=g, dtype=DT))})
    return cases


def yarn_cases():
    specs = [  # name, dim, theta, factor, original_max, beta_fast, beta_slow, mscale, mscale_all_dim, truncate
        ("yarn deepseek-v3", 64, 10000.0, 40.0, 4096, 32, 1, 1.0, 1.0, True),
        ("yarn kimi-k2", 64, 50000.0, 32.0, 4096, 32, 1, 1.0, 1.0, True),
        ("yarn mscale 0.707", 64, 10000.0, 40.0, 4096, 32, 1, 0.707, 1.0, True),
        ("yarn no mscale", 128, 1e6, 4.0, 32768, 32, 1, 0, 0, True),
        ("yarn untruncated", 64, 150000.0, 32.0, 4096, 32, 1, 0, 0, False),
        ("yarn narrow range", 32, 10000.0, 8.0, 256, 4, 2, 0, 0, True),
        ("yarn range clipped above", 16, 100.0, 2.0, 100000, 64, 1, 0, 0, True),
        ("yarn range below 0", 16, 10000.0, 4.0, 64, 32, 1, 0, 0, True),
        ("yarn all extrapolated", 16, 10000.0, 4.0, 16, 32, 16, 0, 0, True),
        ("yarn equal betas untruncated", 32, 10000.0, 4.0, 4096, 8, 8, 0, 0, False),
    ]
    return [{"op": "yarn", "name": s[0], "dim": s[1], "theta": s[2], "factor": s[3], "original_max_position_embeddings": s[4],
             "beta_fast": s[5], "beta_slow": s[6], "mscale": s[7], "mscale_all_dim": s[8], "truncate": s[9]} for s in specs]


def router_cases(g):
    specs = [  # name, T, E, K, score, bias (None, "pos", "neg"), n_group, topk_group, norm, eps, scaling
        ("router qwen3 softmax norm", 64, 16, 4, "softmax", None, 1, 1, True, 0.0, 1.0),
        ("router qwen3 softmax", 64, 16, 4, "softmax", None, 1, 1, False, 0.0, 1.0),
        ("router deepseek-v3", 48, 256, 8, "sigmoid", "pos", 8, 4, True, 1e-20, 2.5),
        ("router deepseek-v3 negative bias", 48, 256, 8, "sigmoid", "neg", 8, 4, True, 1e-20, 2.5),
        ("router kimi-k2", 32, 384, 8, "sigmoid", "pos", 1, 1, True, 1e-20, 2.827),
        ("router sigmoid groups no norm", 64, 32, 3, "sigmoid", "neg", 4, 2, False, 0.0, 1.5),
        ("router softmax groups", 64, 24, 4, "softmax", "pos", 6, 3, True, 1e-20, 1.0),
    ]
    cases = []
    for name, T, E, K, score, bias, n_group, topk_group, norm, eps, scaling in specs:
        if bias == "pos":
            b = torch.rand(E, generator=g, dtype=DT) * 0.1
        elif bias == "neg":
            b = torch.rand(E, generator=g, dtype=DT) * 1.1 - 2.0  # many selection scores below 0
        c = {"op": "router", "name": name, "T": T, "E": E, "K": K, "score": score,
             "bias": None if bias is None else f32_list(b), "n_group": n_group, "topk_group": topk_group, "norm": norm,
             "eps": eps, "scaling": scaling, "mask": "-inf" if bias == "neg" else "hf",
             "logits": f32_list(torch.randn(T * E, generator=g, dtype=DT) * 2),
             "dgates": f32_list(torch.randn(T * K, generator=g, dtype=DT))}
        for attempt in range(50):  # redraw the rows whose choice is within 1e-4 of a tie
            gap = ref_router(c, router_mask(c))["gap"]
            bad = [t for t in range(T) if not gap[t] > 1e-4]
            if not bad:
                break
            logits = c["logits"]
            for t in bad:
                logits[t * E:(t + 1) * E] = f32_list(torch.randn(E, generator=g, dtype=DT) * 2)
        else:
            raise RuntimeError(f"{name}: could not draw rows away from ties")
        cases.append(c)
    return cases


def router_mask(case):
    return 0.0 if case["mask"] == "hf" else float("-inf")


# ---------------------------------------------------------------------------
# Comparison
# ---------------------------------------------------------------------------

def rel_err(got, ref):
    got = torch.tensor(got, dtype=DT) if not torch.is_tensor(got) else got.to(DT)
    if got.numel() != ref.numel():
        return float("inf")
    if ref.numel() == 0:
        return 0.0
    return float((got - ref).abs().max()) / max(float(ref.abs().max()), 1e-30)


def ulp_diff(a, b):
    """|a - b| in float32 ulps, elementwise (a, b: float32 tensors)."""
    ia = a.view(torch.int32).to(torch.int64)
    ib = b.view(torch.int32).to(torch.int64)
    return (ia - ib).abs()


def compare(case, res):
    """Returns a list of (what, value, limit, ok) lines for one case."""
    op, lines = case["op"], []
    if op == "attention":
        ref = ref_attention(case)
        for key in ("out", "dq", "dk", "dv"):
            e = rel_err(res[key], ref[key])
            lines.append((key, e, TOL, e <= TOL))
    elif op == "rope":
        ref = ref_rope(case)
        for key in ("y", "dx"):
            e = rel_err(res[key], ref[key])
            lines.append((key, e, TOL, e <= TOL))
        if case["pairing"] == "adjacent":
            # attention only sees q.k over the rotary dims: HF's permuted layout and trill's
            # in-place adjacent pairs give the same products (rows t against rows u, head 0)
            T, nh, stride, off, rd = len(case["pos"]), case["n_heads"], case["head_stride"], case["rot_offset"], case["rot_dim"]
            y = torch.tensor(res["y"], dtype=DT).view(T, nh, stride)[:, 0, off:off + rd]
            hf = ref["hf_rot"][:, 0, :]
            e = rel_err(y @ y.T, hf @ hf.T)
            lines.append(("q.k vs interleave", e, TOL, e <= TOL))
    elif op == "yarn":
        args = (case["dim"], case["theta"], case["factor"], case["original_max_position_embeddings"], case["beta_fast"],
                case["beta_slow"], case["mscale"], case["mscale_all_dim"], case["truncate"])
        inv_hf, af = hf_yarn(*args)
        got = torch.tensor(res["inv_freq"], dtype=torch.float32)
        ulps = int(ulp_diff(got, inv_hf).max())
        lines.append(("inv_freq ulps vs HF", ulps, 1, ulps <= 1))
        dim, theta = case["dim"], case["theta"]
        exps = torch.arange(0, dim, 2).to(dtype=torch.float) / dim
        rounded = torch.tensor([float(np.float32(math.pow(float(np.float32(theta)), float(x)))) for x in exps],
                               dtype=torch.float32)
        inv_cr, _ = hf_yarn(*args, pos_freqs=rounded)
        exact = bool(torch.equal(got, inv_cr))
        lines.append(("inv_freq bit-exact (correctly rounded pow)", int(not exact), 0, exact))
        lines.append(("attention_factor", abs(res["attention_factor"] - af), 0, res["attention_factor"] == af))
    elif op == "router":
        ref = ref_router(case, router_mask(case))
        same = res["idx"] == [int(i) for i in ref["idx"]]
        lines.append(("ids", int(not same), 0, same))
        # the inputs must exercise what the case is about: rows whose choice the groups, the
        # bias or (negative biases) HF's 0.0 fill would change
        T, K = case["T"], case["K"]
        rows = lambda ids: [tuple(sorted(int(i) for i in ids[t * K:(t + 1) * K])) for t in range(T)]
        chosen = rows(ref["idx"])
        if case["n_group"] > 1:
            ungrouped = rows(ref_router(dict(case, n_group=1, topk_group=1), 0.0)["idx"])
            n = sum(a != b for a, b in zip(chosen, ungrouped))
            lines.append(("rows the groups change", n, 1, n >= 1))
        if case["bias"] is not None:
            unbiased = rows(ref_router(dict(case, bias=None), router_mask(case))["idx"])
            n = sum(a != b for a, b in zip(chosen, unbiased))
            lines.append(("rows the bias changes", n, 1, n >= 1))
        if case["mask"] == "-inf" and case["n_group"] > 1:
            hf_fill = rows(ref_router(case, 0.0)["idx"])
            n = sum(a != b for a, b in zip(chosen, hf_fill))
            lines.append(("rows HF's 0.0 fill changes", n, 1, n >= 1))
        for key in ("scores", "gates", "dlogits"):
            e = rel_err(res[key], ref[key]) if same or key == "scores" else float("inf")
            lines.append((key, e, TOL, e <= TOL))
    return lines


def cmd_check(args):
    g = torch.Generator().manual_seed(args.seed)
    cases = attention_cases(g) + rope_cases(g) + yarn_cases() + router_cases(g)
    with tempfile.TemporaryDirectory(prefix="trill-kernels-") as tmp:
        inp, out = os.path.join(tmp, "in.jsonl"), os.path.join(tmp, "out.jsonl")
        with open(inp, "w") as f:
            for c in cases:
                f.write(json.dumps(c) + "\n")
        r = subprocess.run([args.tool, inp, out])
        if r.returncode != 0:
            print(f"kernel_tool failed (exit {r.returncode})")
            return 1
        with open(out) as f:
            results = [json.loads(line) for line in f if line.strip()]
    if len(results) != len(cases):
        print(f"kernel_tool answered {len(results)} of {len(cases)} cases")
        return 1
    failed = 0
    for c, res in zip(cases, results):
        assert res["name"] == c["name"]
        lines = compare(c, res)
        ok = all(line[3] for line in lines)
        failed += not ok
        detail = ", ".join(f"{w} {v:.2e}" if isinstance(v, float) else f"{w} {v}" for w, v, _, _ in lines)
        print(f"{'ok  ' if ok else 'FAIL'} {c['name']}: {detail}")
    print(f"{len(cases) - failed} of {len(cases)} cases agree")
    return 1 if failed else 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check", help="compare kernel_tool with the reference on random cases")
    c.add_argument("--tool", required=True)
    c.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(1)
    sys.exit(cmd_check(args))


if __name__ == "__main__":
    main()
