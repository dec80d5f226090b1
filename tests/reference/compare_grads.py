#!/usr/bin/python3
"""Compare an implementation's gradients against the reference (qwen3_ref.py grad).

  compare_grads.py REF.safetensors OURS.safetensors [--rtol 1e-3]
  compare_grads.py REF.safetensors --self-test [--rtol ...]

For every tensor in REF: it must be in OURS with the same shape and finite
values, and

    ||ours - ref||_2 / max(||ref||_2, 1e-12) <= rtol,

except tensors whose reference norm is below 1e-10 * (largest reference norm),
e.g. experts that no token visited: for those, ||ours||_2 must be below the same
bound. OURS must have no tensor that REF lacks. Prints the worst relative error
per kind of tensor (embed, attn q/k/v/o, q_norm/k_norm, layernorms, router,
experts gate/up/down, dense mlp, final norm, lm_head) and overall; exit 0 when
everything passes, 1 otherwise. LoRA adapter gradients (`qwen3_ref.py grad
--adapter`, PEFT names base_model.model.<module>.lora_A.weight / .lora_B.weight)
are compared the same way and grouped as "lora_A <kind>" / "lora_B <kind>" by
their module's kind (e.g. "lora_A attn q", "lora_B experts down", "lora_A lm_head").

--self-test checks the comparer on REF alone: an unmodified copy must pass, and
copies with one tensor scaled by 1% (or 10*rtol if larger), one tensor
missing, and one extra tensor must each be detected. Exit 0 only then.
"""

import argparse
import os
import re
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from qwen3_ref import read_safetensors  # noqa: E402  (the reference's own reader)

MAX_DETAILS = 10
ZERO_REL = 1e-10  # "zero" tensors: ref norm below this times the largest ref norm

# (kind, pattern) in print order; the first full match wins.
KINDS = [
    ("embed", r"model\.embed_tokens\.weight"),
    ("attn q", r"model\.layers\.\d+\.self_attn\.q_proj\.(weight|bias)"),
    ("attn k", r"model\.layers\.\d+\.self_attn\.k_proj\.(weight|bias)"),
    ("attn v", r"model\.layers\.\d+\.self_attn\.v_proj\.(weight|bias)"),
    ("attn o", r"model\.layers\.\d+\.self_attn\.o_proj\.(weight|bias)"),
    ("q_norm/k_norm", r"model\.layers\.\d+\.self_attn\.[qk]_norm\.weight"),
    ("layernorms", r"model\.layers\.\d+\.(input_layernorm|post_attention_layernorm)\.weight"),
    ("router", r"model\.layers\.\d+\.(mlp|block_sparse_moe)\.gate\.weight"),
    ("experts gate", r"model\.layers\.\d+\.(mlp\.experts\.\d+\.gate_proj|block_sparse_moe\.experts\.\d+\.w1)\.weight"),
    ("experts up", r"model\.layers\.\d+\.(mlp\.experts\.\d+\.up_proj|block_sparse_moe\.experts\.\d+\.w3)\.weight"),
    ("experts down", r"model\.layers\.\d+\.(mlp\.experts\.\d+\.down_proj|block_sparse_moe\.experts\.\d+\.w2)\.weight"),
    ("shared experts", r"model\.layers\.\d+\.mlp\.shared_experts\.(gate|up|down)_proj\.weight"),
    ("dense mlp", r"model\.layers\.\d+\.mlp\.(gate|up|down)_proj\.weight"),
    ("final norm", r"model\.norm\.weight"),
    ("lm_head", r"lm_head\.weight"),
]
# Linear kinds a LoRA adapter can sit on: "lora_A <kind>", "lora_B <kind>".
LORA_BASE_KINDS = ["attn q", "attn k", "attn v", "attn o", "router", "experts gate",
                   "experts up", "experts down", "shared experts", "dense mlp", "lm_head"]
LORA_KINDS = [f"lora_{ab} {k}" for k in LORA_BASE_KINDS for ab in "AB"]
LORA_RE = r"base_model\.model\.(.+)\.lora_([AB])\.weight"
KIND_WIDTH = 20


def kind_of(name):
    m = re.fullmatch(LORA_RE, name)
    if m:
        base = kind_of(m.group(1) + ".weight")
        return f"lora_{m.group(2)} {base}" if base in LORA_BASE_KINDS else f"lora_{m.group(2)} other"
    for kind, pat in KINDS:
        if re.fullmatch(pat, name):
            return kind
    return "other"


class Result:
    def __init__(self):
        self.failures = []  # (kind, message)
        self.groups = {}    # kind -> [count, zero count, worst rel, worst name]
        self.worst = (0.0, None)
        self.bound = 0.0

    def fail(self, kind, msg):
        self.failures.append((kind, msg))

    def kinds(self):
        return {k for k, _ in self.failures}

    def summary(self, rtol):
        order = [k for k, _ in KINDS] + LORA_KINDS + ["lora_A other", "lora_B other", "other"]
        lines = [f"{'kind':{KIND_WIDTH}s} {'tensors':>7s} {'~zero':>5s}  worst rel err  (tensor)"]
        for kind in order:
            if kind not in self.groups:
                continue
            n, nz, w, name = self.groups[kind]
            lines.append(f"{kind:{KIND_WIDTH}s} {n:7d} {nz:5d}  {w:13.3e}  ({name or '-'})")
        w, name = self.worst
        lines.append(f"overall worst rel err {w:.3e} ({name or '-'}), rtol {rtol:g}, "
                     f"zero bound {self.bound:.3e}")
        lines.append(f"failures: {len(self.failures)}")
        for kind, msg in self.failures[:MAX_DETAILS]:
            lines.append(f"  [{kind}] {msg}")
        if len(self.failures) > MAX_DETAILS:
            lines.append(f"  ... {len(self.failures) - MAX_DETAILS} more")
        return "\n".join(lines)


def compare(ref, ours, rtol):
    res = Result()
    norms = {n: t.norm().item() for n, t in ref.items()}
    res.bound = ZERO_REL * max(norms.values(), default=0.0)
    for name in ours:
        if name not in ref:
            res.fail("extra", f"{name}: in OURS but not in REF")
    for name, r in ref.items():
        kind = kind_of(name)
        g = res.groups.setdefault(kind, [0, 0, 0.0, None])
        g[0] += 1
        o = ours.get(name)
        if o is None:
            res.fail("missing", f"{name}: missing from OURS")
            continue
        if tuple(o.shape) != tuple(r.shape):
            res.fail("shape", f"{name}: shape {list(o.shape)}, expected {list(r.shape)}")
            continue
        if not torch.isfinite(o).all():
            res.fail("nonfinite", f"{name}: non-finite values in OURS")
            continue
        if norms[name] < res.bound:
            g[1] += 1
            on = o.norm().item()
            if not on < res.bound:
                res.fail("zero", f"{name}: ref norm {norms[name]:.3e} is ~0 but ours "
                                 f"{on:.3e} >= {res.bound:.3e}")
            continue
        rel = (o - r).norm().item() / max(norms[name], 1e-12)
        if rel > g[2] or g[3] is None:
            g[2], g[3] = rel, name
        if rel > res.worst[0] or res.worst[1] is None:
            res.worst = (rel, name)
        if not rel <= rtol:
            res.fail("rel", f"{name}: rel err {rel:.3e} > {rtol:g} "
                            f"(|ref| {norms[name]:.3e})")
    return res


def self_test(ref, rtol):
    ok = True
    base = compare(ref, dict(ref), rtol)
    print(f"self-test: unmodified copy -> {len(base.failures)} failures")
    ok &= not base.failures

    # One tensor (the largest, so certainly above the zero bound) scaled by 1%.
    name = max(ref, key=lambda n: ref[n].norm().item())
    scale = max(0.01, 10 * rtol)
    pert = dict(ref)
    pert[name] = ref[name] * (1.0 + scale)
    res = compare(ref, pert, rtol)
    hit = res.kinds() == {"rel"} and len(res.failures) == 1
    print(f"self-test: {name} scaled by {1 + scale:g} -> {'detected' if hit else 'NOT detected'}")
    ok &= hit

    missing = dict(ref)
    del missing[name]
    res = compare(ref, missing, rtol)
    hit = res.kinds() == {"missing"} and len(res.failures) == 1
    print(f"self-test: {name} removed -> {'detected' if hit else 'NOT detected'}")
    ok &= hit

    extra = dict(ref)
    extra["lm_head.extra.weight"] = ref[name]
    res = compare(ref, extra, rtol)
    hit = res.kinds() == {"extra"} and len(res.failures) == 1
    print(f"self-test: extra tensor -> {'detected' if hit else 'NOT detected'}")
    ok &= hit
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ref")
    ap.add_argument("ours", nargs="?")
    ap.add_argument("--rtol", type=float, default=1e-3,
                    help="max relative L2 error per tensor")
    ap.add_argument("--self-test", action="store_true",
                    help="check that perturbed copies of REF are detected")
    args = ap.parse_args()
    ref = read_safetensors(args.ref)
    if args.self_test:
        ok = self_test(ref, args.rtol)
        print("self-test: PASS" if ok else "self-test: FAIL")
        return 0 if ok else 1
    if args.ours is None:
        ap.error("OURS.safetensors is required unless --self-test is given")
    res = compare(ref, read_safetensors(args.ours), args.rtol)
    print(res.summary(args.rtol))
    print("PASS" if not res.failures else "FAIL")
    return 0 if not res.failures else 1


if __name__ == "__main__":
    sys.exit(main())
