#!/usr/bin/python3
"""Compare an implementation's forward output against the reference (qwen3_ref.py).

  compare.py REF.jsonl OURS.jsonl [--atol 1e-4] [--tie 1e-6]
  compare.py REF.jsonl --self-test [--atol ...] [--tie ...]

REF lines:  {"tokens", "logprobs", "experts", "router_probs"}
OURS lines: {"tokens", "logprobs", "experts"}   (router_probs not needed)

Checks: same number of lines and identical tokens; every log-prob within atol
(entry 0 null in both); top-k expert ids equal per token and MoE layer, except:
  * the reference's k-th and (k+1)-th probabilities are within --tie: which
    expert is selected is numerically undecidable, so that (token, layer) is
    skipped (only that one; later layers are still compared);
  * runs of adjacent top-k positions whose probabilities are within --tie are
    compared as sets (their order is undecidable).
Exit 0 when everything passes, 1 otherwise.

--self-test perturbs an in-memory copy of REF (one log-prob by 1e-3, one
expert id replaced, one expert pair swapped) and exits 0 only if the
unmodified copy passes and every perturbation is detected.
"""

import argparse
import copy
import json
import math
import sys

MAX_DETAILS = 10


def load_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


class Result:
    def __init__(self):
        self.seqs = self.tokens = self.lp_count = 0
        self.max_dlp = 0.0
        self.expert_cmps = self.tie_skips = self.set_cmps = 0
        self.mismatches = []  # (kind, message)

    def fail(self, kind, msg):
        self.mismatches.append((kind, msg))

    def kinds(self):
        return {k for k, _ in self.mismatches}

    def summary(self):
        lines = [
            f"sequences: {self.seqs}  tokens: {self.tokens}  logprobs compared: {self.lp_count}",
            f"max |d logprob|: {self.max_dlp:.3e}",
            f"expert comparisons: {self.expert_cmps}  skipped (k/k+1 tie): {self.tie_skips}"
            f"  with tied positions compared as sets: {self.set_cmps}",
            f"mismatches: {len(self.mismatches)}",
        ]
        for kind, msg in self.mismatches[:MAX_DETAILS]:
            lines.append(f"  [{kind}] {msg}")
        if len(self.mismatches) > MAX_DETAILS:
            lines.append(f"  ... {len(self.mismatches) - MAX_DETAILS} more")
        return "\n".join(lines)


def tie_groups(probs, k, tie):
    """Split top-k positions 0..k-1 into runs where adjacent probabilities are
    within `tie` (chained); order inside a run is undecidable."""
    groups, start = [], 0
    for j in range(1, k + 1):
        if j == k or probs[j - 1] - probs[j] > tie:
            groups.append((start, j))
            start = j
    return groups


def compare_experts(res, where, r_ids, o_ids, probs, tie):
    k = len(r_ids)
    if not isinstance(o_ids, list) or len(o_ids) != k:
        res.fail("experts", f"{where}: expected {k} ids, got {o_ids!r}")
        return
    res.expert_cmps += 1
    if len(probs) > k and probs[k - 1] - probs[k] <= tie:
        res.tie_skips += 1
        return
    if len(set(o_ids)) != k:
        res.fail("experts", f"{where}: duplicate expert ids {o_ids}")
        return
    groups = tie_groups(probs, k, tie)
    if any(b - a > 1 for a, b in groups):
        res.set_cmps += 1
    for a, b in groups:
        if sorted(r_ids[a:b]) != sorted(o_ids[a:b]):
            res.fail("experts", f"{where}: ref {r_ids} (p=[{', '.join(f'{p:.9g}' for p in probs)}]) "
                                f"ours {o_ids}")
            return


def compare(ref, ours, atol, tie):
    res = Result()
    if len(ref) != len(ours):
        res.fail("lines", f"ref has {len(ref)} lines, ours has {len(ours)}")
    for s, (r, o) in enumerate(zip(ref, ours)):
        res.seqs += 1
        toks = r["tokens"]
        res.tokens += len(toks)
        if o.get("tokens") != toks:
            res.fail("tokens", f"seq {s}: tokens differ")
            continue
        r_lp, o_lp = r["logprobs"], o.get("logprobs")
        if not isinstance(o_lp, list) or len(o_lp) != len(r_lp):
            res.fail("logprobs", f"seq {s}: expected {len(r_lp)} logprobs")
        else:
            for t, (a, b) in enumerate(zip(r_lp, o_lp)):
                if t == 0:
                    if a is not None or b is not None:
                        res.fail("logprobs", f"seq {s} t 0: first entry must be null in both")
                    continue
                if not isinstance(b, (int, float)) or not math.isfinite(b):
                    res.fail("logprobs", f"seq {s} t {t}: ours {b!r} not a finite number")
                    continue
                d = abs(a - b)
                res.lp_count += 1
                res.max_dlp = max(res.max_dlp, d)
                if d > atol:
                    res.fail("logprobs", f"seq {s} t {t}: ref {a:.8f} ours {b:.8f} |d|={d:.2e}")
        r_ex, o_ex, r_pr = r["experts"], o.get("experts"), r["router_probs"]
        if not isinstance(o_ex, list) or len(o_ex) != len(r_ex):
            res.fail("experts", f"seq {s}: expected experts for {len(r_ex)} tokens")
            continue
        for t in range(len(r_ex)):
            if not isinstance(o_ex[t], list) or len(o_ex[t]) != len(r_ex[t]):
                res.fail("experts", f"seq {s} t {t}: expected {len(r_ex[t])} MoE layers")
                continue
            for m in range(len(r_ex[t])):
                compare_experts(res, f"seq {s} t {t} moe-layer {m}",
                                r_ex[t][m], o_ex[t][m], r_pr[t][m], tie)
    return res


def self_test(ref, atol, tie):
    """Each perturbation must be detected, and the untouched copy must pass."""
    ok = True
    base = compare(ref, copy.deepcopy(ref), atol, tie)
    print(f"self-test: unmodified copy -> {len(base.mismatches)} mismatches")
    ok &= not base.mismatches

    # 1. One log-prob off by 1e-3 (or 10*atol if atol is that loose).
    lp = copy.deepcopy(ref)
    site = next(((s, t) for s, r in enumerate(lp) for t in range(1, len(r["logprobs"]))), None)
    if site is None:
        print("self-test: no logprob to perturb (all sequences shorter than 2)")
        ok = False
    else:
        s, t = site
        lp[s]["logprobs"][t] += max(1e-3, 10 * atol)
        res = compare(ref, lp, atol, tie)
        hit = res.kinds() == {"logprobs"} and len(res.mismatches) == 1
        print(f"self-test: logprob perturbation at seq {s} t {t} -> "
              f"{'detected' if hit else 'NOT detected'}")
        ok &= hit

    # 2./3. Expert perturbations at a (token, layer) with no ties at all, so the
    # comparison cannot legitimately be skipped or relaxed to a set comparison.
    def untied(r, t, m):
        p = r["router_probs"][t][m]
        return all(p[j] - p[j + 1] > tie for j in range(len(p) - 1))

    site = next(((s, t, m) for s, r in enumerate(ref) for t in range(len(r["experts"]))
                 for m in range(len(r["experts"][t])) if untied(r, t, m)), None)
    if site is None:
        print("self-test: no MoE routing in the reference; expert checks not applicable")
        return ok
    s, t, m = site
    ids = ref[s]["experts"][t][m]
    # Prefer a real expert id that was not selected; only when k == num_experts
    # (every expert selected) fall back to an out-of-range id.
    n_seen = 1 + max(e for r in ref for tok in r["experts"] for lay in tok for e in lay)
    replacement = next(e for e in range(n_seen + 1) if e not in ids)

    ex = copy.deepcopy(ref)
    ex[s]["experts"][t][m][-1] = replacement  # a different expert selected
    res = compare(ref, ex, atol, tie)
    hit = res.kinds() == {"experts"} and len(res.mismatches) == 1
    print(f"self-test: expert id {ids[-1]}->{replacement} at seq {s} t {t} layer {m} -> "
          f"{'detected' if hit else 'NOT detected'}")
    ok &= hit

    if len(ids) >= 2:
        ex = copy.deepcopy(ref)
        e = ex[s]["experts"][t][m]
        e[0], e[1] = e[1], e[0]  # right experts, wrong order
        res = compare(ref, ex, atol, tie)
        hit = res.kinds() == {"experts"} and len(res.mismatches) == 1
        print(f"self-test: expert order swap at seq {s} t {t} layer {m} -> "
              f"{'detected' if hit else 'NOT detected'}")
        ok &= hit
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ref")
    ap.add_argument("ours", nargs="?")
    ap.add_argument("--atol", type=float, default=1e-4, help="absolute log-prob tolerance")
    ap.add_argument("--tie", type=float, default=1e-6,
                    help="router probabilities closer than this count as tied")
    ap.add_argument("--self-test", action="store_true",
                    help="check that perturbed copies of REF are detected")
    args = ap.parse_args()
    ref = load_jsonl(args.ref)
    if args.self_test:
        ok = self_test(ref, args.atol, args.tie)
        print("self-test: PASS" if ok else "self-test: FAIL")
        return 0 if ok else 1
    if args.ours is None:
        ap.error("OURS.jsonl is required unless --self-test is given")
    res = compare(ref, load_jsonl(args.ours), args.atol, args.tie)
    print(res.summary())
    print("PASS" if not res.mismatches else "FAIL")
    return 0 if not res.mismatches else 1


if __name__ == "__main__":
    sys.exit(main())
