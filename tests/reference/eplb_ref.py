#!/usr/bin/env python3
"""Cross-checks trill's EPLB (src/infer/eplb.c) against a PyTorch reference on random cases.

The reference below restates DeepSeek's EPLB (github.com/deepseek-ai/EPLB, eplb.py,
`rebalance_experts`) one row at a time with the same torch operations where ties are decided:
float32 loads, `sort(descending=True)` for the packing order, `max(dim=-1)` for replication, the
lightest open pack with the lowest index among equals. The only deliberate choice is the sort:
the C code fixes the stable order (equal weights by index), which torch's CPU sort gives for rows
of at most 16 items; the reference uses stable=True so longer rows compare too.

With --upstream DIR (a folder holding deepseek-ai/EPLB's eplb.py) the C plans are also compared
with eplb.rebalance_experts itself: (a) with torch's sort made stable, on every case, exactly;
(b) as it is, exactly where every sorted row has at most 16 items; on longer rows torch orders equal
weights its own way, and the script checks that each such difference only relabels equal-weight
items: every worker holds the same multiset of float32 per-replica loads as in the C plan.

ctest runs it as `eplb_torch` (release build, label e2e; tests/unit/CMakeLists.txt). Needs a C
compiler and torch (Debian's python3-torch will do):
    /usr/bin/python3 tests/reference/eplb_ref.py [--cases N] [--seed S] [--upstream DIR]
It compiles src/infer/eplb.c and src/base/error.c into a temporary shared library (ctypes).
Exit status 0 only when every plan agrees; 1 on any disagreement or error.
"""
import argparse
import ctypes
import os
import random
import subprocess
import sys
import tempfile

import torch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


# ---------------------------------------------------------------- reference (torch, row by row)

def pack_row(w, n_packs):
    """Items of one float32 row into n_packs packs of equal count: (pack, rank) lists."""
    n = w.numel()
    per = n // n_packs
    if per == 1:  # eplb.py keeps item i in pack i here, unsorted
        return list(range(n)), [0] * n
    order = torch.sort(w, descending=True, stable=True).indices.tolist()
    loads = torch.zeros(n_packs, dtype=torch.float32)
    counts = [0] * n_packs
    pack, rank = [-1] * n, [-1] * n
    for it in order:
        best = None
        for p in range(n_packs):  # lightest open pack, first among equals
            if counts[p] < per and (best is None or loads[p].item() < loads[best].item()):
                best = p
        pack[it], rank[it] = best, counts[best]
        counts[best] += 1
        loads[best] += w[it]  # float32 accumulation, as the tensors in eplb.py
    return pack, rank


def replicate_row(w, n_phy):
    """One float32 row of n_log loads onto n_phy slots: (phy2log, rank, cnt)."""
    n_log = w.numel()
    cnt = torch.ones(n_log, dtype=torch.int64)
    phy2log, rank = list(range(n_log)), [0] * n_log
    for _ in range(n_log, n_phy):
        e = int((w / cnt).max(dim=-1).indices)  # first maximum
        phy2log.append(e)
        rank.append(int(cnt[e]))
        cnt[e] += 1
    return phy2log, rank, cnt.tolist()


def reference(load, P, G, N, W):
    """load: float64 [L][E] tensor. Returns phy2log [L][P], log2phy [L][E][R], logcnt [L][E]."""
    L, E = load.shape
    w = load.float()
    if G % N != 0:  # the global policy
        G = N = 1
    gs, gpn, ppw = E // G, G // N, P // W
    En, Pn, Wn = E // N, P // N, W // N
    phy2log = [[-1] * P for _ in range(L)]
    phyrank = [[-1] * P for _ in range(L)]
    logcnt = [[0] * E for _ in range(L)]
    for l in range(L):
        gsum = w[l].view(G, gs).sum(-1)
        gpack, grank = pack_row(gsum, N)
        m2l = [0] * E
        for g in range(G):
            for j in range(gs):
                m2l[(gpack[g] * gpn + grank[g]) * gs + j] = g * gs + j
        for n in range(N):
            node = m2l[n * En:(n + 1) * En]
            wm = w[l][node]
            p2m, prank, mcnt = replicate_row(wm, Pn)
            for m in range(En):
                logcnt[l][node[m]] = mcnt[m]
            tpp = (wm / torch.tensor(mcnt, dtype=torch.int64))[p2m]
            pk, rk = pack_row(tpp, Wn)
            for p in range(Pn):
                s = n * Pn + pk[p] * ppw + rk[p]
                phy2log[l][s] = node[p2m[p]]
                phyrank[l][s] = prank[p]
    R = max(max(r) for r in logcnt)
    log2phy = [[[-1] * R for _ in range(E)] for _ in range(L)]
    for l in range(L):
        for s in range(P):
            log2phy[l][phy2log[l][s]][phyrank[l][s]] = s
    return phy2log, log2phy, logcnt


# ---------------------------------------------------------------- the C code through ctypes

class Plan(ctypes.Structure):
    _fields_ = [("n_layers", ctypes.c_int), ("n_logical", ctypes.c_int), ("n_physical", ctypes.c_int),
                ("max_replicas", ctypes.c_int), ("phy2log", ctypes.POINTER(ctypes.c_int)),
                ("log2phy", ctypes.POINTER(ctypes.c_int)), ("logcnt", ctypes.POINTER(ctypes.c_int))]


def load_c(tmp):
    so = os.path.join(tmp, "libeplb.so")
    cc = os.environ.get("CC", "cc")
    subprocess.run([cc, "-O2", "-std=gnu11", "-shared", "-fPIC", "-I", os.path.join(ROOT, "include"), "-I", os.path.join(ROOT, "src"),
                    os.path.join(ROOT, "src/infer/eplb.c"), os.path.join(ROOT, "src/base/error.c"),
                    os.path.join(ROOT, "src/base/alloc.c"), "-o", so, "-ljansson", "-lm"], check=True)
    lib = ctypes.CDLL(so)
    lib.trill_eplb_rebalance.argtypes = [ctypes.POINTER(ctypes.c_double)] + [ctypes.c_int] * 6 + [ctypes.POINTER(Plan)]
    lib.trill_eplb_rebalance.restype = ctypes.c_int
    lib.trill_eplb_plan_free.argtypes = [ctypes.POINTER(Plan)]
    lib.trill_error_message.restype = ctypes.c_char_p
    return lib


def run_c(lib, load, P, G, N, W):
    L, E = load.shape
    flat = (ctypes.c_double * (L * E))(*load.flatten().tolist())
    plan = Plan()
    rc = lib.trill_eplb_rebalance(flat, L, E, P, G, N, W, ctypes.byref(plan))
    if rc != 0:
        raise RuntimeError(lib.trill_error_message().decode())
    R = plan.max_replicas
    phy2log = [[plan.phy2log[l * P + s] for s in range(P)] for l in range(L)]
    log2phy = [[[plan.log2phy[(l * E + e) * R + r] for r in range(R)] for e in range(E)] for l in range(L)]
    logcnt = [[plan.logcnt[l * E + e] for e in range(E)] for l in range(L)]
    lib.trill_eplb_plan_free(ctypes.byref(plan))
    return phy2log, log2phy, logcnt


# ---------------------------------------------------------------- random cases

def random_case(rng):
    N = rng.choice([1, 1, 2, 3, 4])
    W = N * rng.choice([1, 2, 3, 4, 8])
    G = rng.choice([1, 2, 3, 4, 6, 8])
    if rng.random() < 0.5:
        G = N * rng.choice([1, 2, 3])  # hierarchical
    E = G * rng.choice([1, 2, 3, 4, 8])
    P = W * ((E + W - 1) // W + rng.choice([0, 0, 1, 2, 5]))
    L = rng.choice([1, 2, 3])
    kind = rng.choice(["ties", "counts", "zipf", "float", "zeros"])
    if kind == "ties":
        load = [[float(rng.randint(0, 3)) for _ in range(E)] for _ in range(L)]
    elif kind == "counts":
        load = [[float(rng.randint(0, 1000)) for _ in range(E)] for _ in range(L)]
    elif kind == "zipf":
        load = [[float(int(100000 / (1 + rng.randrange(E)) ** 1.2)) for _ in range(E)] for _ in range(L)]
    elif kind == "float":
        load = [[rng.random() * 100 for _ in range(E)] for _ in range(L)]
    else:
        load = [[0.0] * E for _ in range(L)]
    return torch.tensor(load, dtype=torch.float64), P, G, N, W, kind


def longest_sorted_row(E, P, G, N, W):
    if G % N != 0:
        G = N = 1
    rows = []
    if G // N > 1:
        rows.append(G)
    if P // W > 1:
        rows.append(P // N)
    return max(rows, default=0)


README = ([[90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86],
           [20, 107, 104, 64, 19, 197, 187, 157, 172, 86, 16, 27]],
          [[5, 6, 5, 7, 8, 4, 3, 4, 10, 9, 10, 2, 0, 1, 11, 1],
           [7, 10, 6, 8, 6, 11, 8, 9, 2, 4, 5, 1, 5, 0, 3, 1]])


def worker_multisets(load, plan, W):
    """Per layer and worker, the sorted float32 per-replica loads the worker holds."""
    phy2log, _, logcnt = plan
    w = load.float()
    out = []
    for l, row in enumerate(phy2log):
        per = len(row) // W
        q = [(w[l][e] / torch.tensor(logcnt[l][e], dtype=torch.int64)).item() for e in row]
        out.append([sorted(q[k * per:(k + 1) * per]) for k in range(W)])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--upstream", help="folder holding deepseek-ai/EPLB's eplb.py")
    args = ap.parse_args()
    upstream = None
    if args.upstream:
        sys.path.insert(0, args.upstream)
        import eplb as upstream  # noqa: E402

    def run_upstream(load, P, G, N, W, stable):
        sort = torch.Tensor.sort
        if stable:
            torch.Tensor.sort = lambda t, dim=-1, descending=False: sort(t, dim=dim, descending=descending, stable=True)
        try:
            p, l2p, cnt = upstream.rebalance_experts(load, P, G, N, W)
        finally:
            torch.Tensor.sort = sort
        return p.tolist(), l2p.tolist(), cnt.tolist()

    with tempfile.TemporaryDirectory() as tmp:
        lib = load_c(tmp)
        load = torch.tensor(README[0], dtype=torch.float64)
        ref = reference(load, 16, 4, 2, 8)
        got = run_c(lib, load, 16, 4, 2, 8)
        if ref[0] != README[1]:  # not `assert`: python -O would drop it
            print(f"reference disagrees with the README: {ref[0]}")
            return 1
        if got != ref:
            print(f"C disagrees on the README example: {got[0]}")
            return 1

        rng = random.Random(args.seed)
        bad = up_stable = up_short = up_long = up_long_diff = up_long_bad = 0
        for c in range(args.cases):
            load, P, G, N, W, kind = random_case(rng)
            ref = reference(load, P, G, N, W)
            got = run_c(lib, load, P, G, N, W)
            if got != ref:
                bad += 1
                if bad <= 5:
                    print(f"case {c} ({kind}) L,E,P,G,N,W={tuple(load.shape)},{P},{G},{N},{W}\n load={load.tolist()}\n"
                          f" ref={ref[0]}\n got={got[0]}")
            if upstream is None:
                continue
            if run_upstream(load, P, G, N, W, True) != got:
                up_stable += 1
                if up_stable <= 5:
                    print(f"upstream (stable sort) differs, case {c} ({kind})")
            up = run_upstream(load, P, G, N, W, False)
            if longest_sorted_row(load.shape[1], P, G, N, W) <= 16:
                if up != got:
                    up_short += 1
                    if up_short <= 5:
                        print(f"upstream differs on short rows, case {c} ({kind}): up={up[0]} got={got[0]}")
            else:
                up_long += 1
                if up != got:
                    up_long_diff += 1
                    g_eff = 1 if G % N else G
                    if g_eff <= 16 and worker_multisets(load, up, W) != worker_multisets(load, got, W):
                        up_long_bad += 1
                        if up_long_bad <= 5:
                            print(f"upstream differs beyond tie order, case {c} ({kind})")
        print(f"{args.cases} random cases: {bad} differ from the reference")
        if upstream is not None:
            print(f"upstream eplb.py with a stable sort: {up_stable} differ")
            print(f"upstream eplb.py as is: {up_short} differ where sorted rows have <= 16 items; "
                  f"{up_long_diff} of {up_long} longer-row cases differ in tie order, "
                  f"{up_long_bad} of them in any worker's loads")
        return 1 if bad or up_stable or up_short or up_long_bad else 0


if __name__ == "__main__":
    sys.exit(main())
