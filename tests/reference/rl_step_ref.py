#!/usr/bin/python3
"""Independent float64 PyTorch oracle for one RL training step of `trill train`.

Written from the formulas of docs/algorithms.md (and the papers they cite); the C code
was read only to settle conventions the formulas leave open, listed in CONVENTIONS below.
The model is tests/reference/qwen3_ref.py (float64 forward with router replay and PEFT
LoRA, autograd), the optimizer is torch.optim.AdamW and the clipping
torch.nn.utils.clip_grad_norm_.

One step, on a recorded rollout batch (rl_batch_pack bytes, see rollouts.py) and the
state of a checkpoint (PEFT adapter, optimizer moments and step count):

  1. rewards; with algo.kl_mode=reward and kl_coef > 0 each sequence's reward loses
     kl_coef * sum over its response tokens of k(old, ref)   (old: the policy at the
     checkpoint, ref: the same model without LoRA)
  2. GRPO group advantages (unbiased std, + eps; std_norm=false: Dr. GRPO, no division)
  3. dynamic sampling: groups whose rewards (before a KL penalty) are all equal are dropped
  4. old log-probs (the checkpoint's policy), TIS weights min(pi_old/mu, C) and MIS masks
     (token / sequence product / geometric mean outside [low, high])
  5. algo.minibatches disjoint consecutive parts of the kept sequences; for each: the
     policy loss (ppo, gspo, cispo, reinforce, aipo) with its aggregation (token-mean,
     seq-mean-token-sum, seq-mean-token-mean) + the KL loss term, autograd gradient
     w.r.t. the LoRA tensors, global-norm clipping, the learning rate of the schedule
     (linear warm-up, then constant / linear / cosine), one AdamW step (decoupled weight
     decay) -- the next minibatch's log-probs are taken at the updated weights.

Subcommands:

  suite --trill BIN -- COMMON...
      Run from the folder of tests/rl/fixture.sh after the recordings rec (and rec_wd)
      were made: designs every case's batch from rec/rollouts/step-00000003.bin, runs
      trill on it (resume from the step-2 checkpoint, rollouts.replay), computes the
      step here and compares adapter, update and metrics. Exit 1 on any mismatch or
      trill failure.

  step --model DIR --ckpt CKPT --batch FILE --config CONFIG.yaml [--run RUN]
      One step, printed as JSON (metrics); with --run, compared with RUN's step
      checkpoint and metrics.jsonl.

CONVENTIONS taken from the C code where the formulas leave them open:
  - advantage eps = 1e-6, added to the unbiased std (src/rl/run/controller.c calls
    rl_group_advantages with 1e-6);
  - the schedule index is the number of optimizer steps already taken (the AdamW step
    count in optimizer.json), the run's total is steps * algo.minibatches, the warm-up
    gives peak * (index + 1) / warmup_steps (so its first step is not 0);
  - clipping uses the pre-clip norm, torch's coefficient max_norm / (norm + 1e-6), before
    the schedule's learning rate and the AdamW step; metrics' grad_norm is the pre-clip
    norm of the last minibatch, loss/pg_loss/kl_loss the mean over minibatches;
  - betas and eps are torch's defaults (0.9, 0.999, 1e-8), as optimizer.json records;
  - the rollout's last token of each sequence (expert id 0xFFFF) routes itself.
"""

import argparse
import json
import math
import os
import struct
import subprocess
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import qwen3_ref as Q  # noqa: E402
import rollouts  # noqa: E402

DT = torch.float64
REPLAY_NONE = 0xFFFF
ADV_EPS = 1e-6
# The suite resumes from the recordings' step-2 checkpoint and trains on the recorded step-3
# batch: after two steps every LoRA tensor has nonzero Adam moments (after one, A's are 0:
# dL/dA is proportional to B, which starts at 0), so every factor of the update matters.
CKPT_STEP, STEP = 2, 3

# ---------------------------------------------------------------------------
# The recorded batch (src/rl/data/rollout.c: rl_batch_pack)
# ---------------------------------------------------------------------------

def read_batch(path):
    b = rollouts.read(path)
    b["behav"] = b.pop("behav_logp")
    return b


def write_batch(path, b):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    rollouts.write(path, dict(b, behav_logp=b["behav"]))


def copy_batch(b):
    return {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in b.items()}


def resp_slice(b, s):
    """Batch positions of sequence s's response tokens."""
    return slice(int(b["offsets"][s] + b["prompt_len"][s]), int(b["offsets"][s + 1]))


# ---------------------------------------------------------------------------
# Configuration (the resolved config.yaml trill writes, or the same with overrides)
# ---------------------------------------------------------------------------

def parse_scalar(text):
    t = text.strip()
    try:
        import yaml
        return yaml.safe_load(t) if t else None
    except ImportError:
        pass
    if t in ("true", "false"):
        return t == "true"
    if t.startswith("[") and t.endswith("]"):
        return [parse_scalar(x) for x in t[1:-1].split(",") if x.strip()]
    if t.startswith('"') and t.endswith('"'):
        return json.loads(t)
    try:
        return int(t)
    except ValueError:
        try:
            return float(t)
        except ValueError:
            return t


def read_config(path):
    with open(path) as f:
        text = f.read()
    try:
        import yaml
        return yaml.safe_load(text)
    except ImportError:
        pass
    # The flat two-space-indented YAML of trill_run_config_write.
    root, stack = {}, [(-1, None)]
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        ind = len(line) - len(line.lstrip())
        key, _, val = line.strip().partition(":")
        while stack[-1][0] >= ind:
            stack.pop()
        parent = root if stack[-1][1] is None else stack[-1][1]
        if val.strip() == "":
            parent[key] = {}
            stack.append((ind, parent[key]))
        else:
            parent[key] = parse_scalar(val)
    return root


def set_dotted(cfg, dotted, text):
    keys = dotted.split(".")
    d = cfg
    for k in keys[:-1]:
        d = d[k]
    if keys[-1] not in d:
        raise SystemExit(f"unknown config key {dotted}")
    d[keys[-1]] = parse_scalar(text)


def num(x):
    return float(x)  # PyYAML reads "1e-05" (no dot) as a string


class Cfg:
    """The keys the step reads, typed."""

    def __init__(self, c):
        a, co, tr = c["algo"], c["correction"], c["trainer"]
        self.G = int(c["generator"]["n"])
        self.steps = int(c["steps"])
        self.router_replay = bool(c["router_replay"])
        self.loss = a["loss"]
        self.std_norm = bool(a["std_norm"])
        self.clip_low, self.clip_high = num(a["clip_low"]), num(a["clip_high"])
        self.agg = a["aggregation"]
        self.kl_coef = num(a["kl_coef"])
        self.kl_est = a["kl_estimator"]
        self.kl_mode = a["kl_mode"]
        self.dynamic_sampling = bool(a["dynamic_sampling"])
        self.M = int(a["minibatches"])
        self.aipo_rho = num(a["aipo_rho"])
        self.tis = num(co["tis"])
        mis = co["mis"]
        self.mis = mis not in (False, None, "false")
        self.mis_low, self.mis_high = (num(mis[0]), num(mis[1])) if self.mis else (0.0, 0.0)
        self.mis_level = co["mis_level"]
        self.lr, self.min_lr = num(tr["lr"]), num(tr["min_lr"])
        self.weight_decay = num(tr["weight_decay"])
        self.grad_clip = num(tr["grad_clip"])
        self.schedule = tr["schedule"]
        self.warmup = int(tr["warmup_steps"])

    @property
    def kl_loss(self):
        return self.kl_coef > 0 and self.kl_mode == "loss"

    @property
    def kl_reward(self):
        return self.kl_coef > 0 and self.kl_mode == "reward"


# ---------------------------------------------------------------------------
# Formulas (docs/algorithms.md)
# ---------------------------------------------------------------------------

def group_advantages(R, G, std_norm):
    """GRPO: (R - mean) / (std + eps), std unbiased (torch.std); Dr. GRPO: R - mean."""
    R = torch.as_tensor(R, dtype=DT).view(-1, G)
    if G == 1:
        return torch.zeros_like(R).view(-1)
    A = R - R.mean(dim=1, keepdim=True)
    if std_norm:
        A = A / (R.std(dim=1, unbiased=True, keepdim=True) + ADV_EPS)
    return A.reshape(-1)


def kl_value(est, logp, ref):
    """Schulman's estimators of KL(pi || ref) from x = logp - ref."""
    x = logp - ref
    if est == "k1":
        return x
    if est == "k2":
        return 0.5 * x * x
    if est == "k3":
        return torch.exp(torch.clamp(-x, -20.0, 20.0)) - 1.0 + x
    raise SystemExit(f"unknown KL estimator {est}")


def lr_at(cfg, index, total):
    if index < cfg.warmup:
        return cfg.lr * (index + 1) / cfg.warmup
    if cfg.schedule == "constant" or total <= cfg.warmup:
        return cfg.lr
    progress = min((index - cfg.warmup) / (total - cfg.warmup), 1.0)
    if cfg.schedule == "linear":
        return cfg.min_lr + (cfg.lr - cfg.min_lr) * (1 - progress)
    return cfg.min_lr + (cfg.lr - cfg.min_lr) * 0.5 * (1 + math.cos(math.pi * progress))


def corrections(cfg, seqs, old, behav, margins):
    """TIS weights and MIS masks per sequence: ({s: w}, {s: bool mask}).
    margins collects |log statistic - log threshold| of every decision."""
    w, mask = {}, {}
    for s in seqs:
        d = old[s] - behav[s]  # log(pi_old / mu)
        if cfg.tis > 0:
            w[s] = torch.clamp(torch.exp(d), max=cfg.tis)
            margins.setdefault("tis", []).extend((d - math.log(cfg.tis)).abs().tolist())
        else:
            w[s] = torch.ones_like(d)
        m = torch.ones_like(d, dtype=torch.bool)
        if cfg.mis and len(d):
            lo, hi = math.log(cfg.mis_low), math.log(cfg.mis_high)
            if cfg.mis_level == "token":
                stat = d
            elif cfg.mis_level == "sequence":
                stat = d.sum().view(1)
            else:
                stat = d.mean().view(1)
            keep = (stat >= lo) & (stat <= hi)  # inclusive band, in log space
            m = keep.expand_as(d).clone()
            margins.setdefault("mis", []).extend(torch.minimum((stat - lo).abs(), (stat - hi).abs()).tolist())
        mask[s] = m
    return w, mask


def policy_loss(cfg, seqs, logp, old, behav, ref, adv, w, mask, margins):
    """The minibatch loss (a tensor with autograd through logp), its pg and kl parts and
    the counts behind clip_frac / ratio_mean. Every sequence of `seqs` counts in N."""
    zero = torch.zeros((), dtype=DT)
    N = len(seqs)
    D = sum(int(mask[s].sum()) for s in seqs)
    st = {"clipped": 0, "in": D, "ratio_sum": 0.0, "ratio_n": 0}
    if D == 0:
        return zero, zero, zero, st
    lo, hi = 1.0 - cfg.clip_low, 1.0 + cfg.clip_high
    pg, kl = zero, zero
    for s in seqs:
        m = mask[s]
        n_i = int(m.sum())
        if n_i == 0:
            continue
        if cfg.agg == "token-mean":
            c = 1.0 / D
        elif cfg.agg == "seq-mean-token-sum":
            c = 1.0 / N
        elif cfg.agg == "seq-mean-token-mean":
            c = 1.0 / (N * n_i)
        else:
            raise SystemExit(f"unknown aggregation {cfg.agg}")
        lp, o, b, A, ww = logp[s][m], old[s][m], behav[s][m], float(adv[s]), w[s][m]
        if cfg.loss == "gspo":
            # sequence ratio: geometric mean of the token ratios; the sequence's loss
            # weighted by its aggregation x TIS weight sum (a constant)
            si = torch.exp(torch.clamp((lp - o).mean(), -20.0, 20.0))
            li = torch.maximum(-A * si, -A * torch.clamp(si, lo, hi))
            pg = pg + (c * ww).sum() * li
            v = si.item()
            if v * A > min(max(v, lo), hi) * A:
                st["clipped"] += n_i
            if v != 1.0:
                margins.setdefault("clip", []).extend([abs(math.log(v) - math.log(lo)), abs(math.log(v) - math.log(hi))])
        else:
            r = torch.exp(torch.clamp(lp - o, -20.0, 20.0))
            if cfg.loss == "ppo":
                L = torch.maximum(-A * r, -A * torch.clamp(r, lo, hi))
                st["clipped"] += int((r * A > torch.clamp(r, lo, hi) * A).sum())
                ratio = r
            elif cfg.loss == "cispo":
                cw = torch.clamp(r, lo, hi).detach()
                L = -cw * A * lp
                st["clipped"] += int((cw != r).sum())
                ratio = r
            elif cfg.loss == "reinforce":
                L = -r * A
                ratio = r
            elif cfg.loss == "aipo":
                mu = torch.exp(torch.clamp(lp - b, -20.0, 20.0))  # pi_theta / mu
                L = -torch.clamp(mu, max=cfg.aipo_rho).detach() * A * lp
                st["clipped"] += int((mu > cfg.aipo_rho).sum())
                ww = torch.ones_like(ww)  # its weight is its own off-policy correction
                ratio = mu
                margins.setdefault("aipo", []).extend((torch.log(mu) - math.log(cfg.aipo_rho)).abs().tolist())
            else:
                raise SystemExit(f"unknown loss {cfg.loss}")
            pg = pg + (c * ww * L).sum()
            st["ratio_sum"] += float(ratio.detach().sum())
            st["ratio_n"] += n_i
            if cfg.loss in ("ppo", "cispo"):
                lr_ = torch.log(r.detach())
                off = lr_ != 0  # r == 1 exactly (first minibatch) is inside the band on both sides
                if bool(off.any()):
                    margins.setdefault("clip", []).extend(
                        torch.minimum((lr_[off] - math.log(lo)).abs(), (lr_[off] - math.log(hi)).abs()).tolist())
        if cfg.kl_loss:
            kl = kl + cfg.kl_coef * (c * kl_value(cfg.kl_est, lp, ref[s][m])).sum()
    return pg + kl, pg, kl, st


# ---------------------------------------------------------------------------
# The policy at a checkpoint
# ---------------------------------------------------------------------------

class Policy:
    """qwen3_ref's float64 model with the checkpoint's adapter, its optimizer state and
    the forward over a batch's sequences."""

    def __init__(self, model_dir, ckpt):
        self.model = Q.Model(model_dir, adapter=os.path.join(ckpt, "adapter"))
        m = self.model
        self.names = list(m.lora_names)
        self.theta = {n: m.W[n].detach().clone() for n in self.names}
        self.check_layout(os.path.join(ckpt, "adapter", "adapter_model.safetensors"))
        with open(os.path.join(ckpt, "optimizer.json")) as f:
            oj = json.load(f)
        self.opt_json = oj
        flat = Q.read_safetensors(os.path.join(ckpt, "optimizer.safetensors"))
        total = sum(self.theta[n].numel() for n in self.names)
        if oj["size"] != total or flat["exp_avg"].numel() != total:
            raise SystemExit(f"{ckpt}: optimizer holds {oj['size']} values, the adapter {total}")
        self.exp_avg, self.exp_avg_sq, at = {}, {}, 0
        for n in self.names:  # the trainable vector: the adapter tensors back to back, in order
            k = self.theta[n].numel()
            self.exp_avg[n] = flat["exp_avg"][at:at + k].view(self.theta[n].shape).clone()
            self.exp_avg_sq[n] = flat["exp_avg_sq"][at:at + k].view(self.theta[n].shape).clone()
            at += k
        self.opt_step = int(oj["step"])
        self.betas, self.eps = (float(oj["beta1"]), float(oj["beta2"])), float(oj["eps"])
        self.cache = {}

    def check_layout(self, path):
        """The order of the adapter file's data is the trainable vector's order."""
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        order = sorted((v["data_offsets"][0], k) for k, v in header.items() if k != "__metadata__")
        if [k for _, k in order] != self.names:
            raise SystemExit(f"{path}: tensor order differs from the module order")

    def logps(self, b, seqs, params, replay=True, lora=True):
        """{s: log-probs of s's response tokens}, through autograd when params require it."""
        m = self.model
        saved_W, saved_lora = dict(m.W), m.lora
        try:
            for n in self.names:
                m.W[n] = params[n]
            if not lora:
                m.lora = {}
            out = {}
            for s in seqs:
                o0, o1, P = int(b["offsets"][s]), int(b["offsets"][s + 1]), int(b["prompt_len"][s])
                toks = b["tokens"][o0:o1].tolist()
                rp = None
                if replay and b["n_moe_layers"]:
                    ex = b["experts"][o0:o1].astype(np.int64)
                    ex[ex == REPLAY_NONE] = -1
                    rp = torch.from_numpy(ex)
                logp, _, _ = m.forward(toks, rp)
                out[s] = Q.token_logprobs(logp, toks)[P - 1:]
            return out
        finally:
            m.W.clear()
            m.W.update(saved_W)
            m.lora = saved_lora

    def base(self, b, replay):
        """Shared by every case on this checkpoint: the log-probs at the checkpoint's weights
        with their autograd graph (the first minibatch's forward), and the reference."""
        key = (replay, b["tokens"].tobytes(), b["offsets"].tobytes(), b["prompt_len"].tobytes(), b["experts"].tobytes())
        if key not in self.cache:
            leaves = {n: self.theta[n].clone().requires_grad_(True) for n in self.names}
            seqs = list(range(b["n_seqs"]))
            lp = self.logps(b, seqs, leaves, replay)
            with torch.no_grad():
                ref = self.logps(b, seqs, self.theta, replay, lora=False)
            self.cache[key] = (leaves, lp, ref)
        return self.cache[key]

    def routing_margin(self, b):
        """Smallest gap between the k-th and (k+1)-th router probability of any token (own
        routing at the checkpoint's weights): a margin for router_replay=false."""
        m, gaps = self.model, []
        orig = m.moe

        def spy(x, p, replay_ids=None):
            y, ids, pr = orig(x, p, replay_ids)
            k = m.cfg["num_experts_per_tok"]
            gaps.append(float((pr[:, k - 1] - pr[:, k]).min()))
            return y, ids, pr
        m.moe = spy
        try:
            with torch.no_grad():
                self.logps(b, range(b["n_seqs"]), self.theta, replay=False)
        finally:
            del m.moe
        return min(gaps)


# ---------------------------------------------------------------------------
# One step
# ---------------------------------------------------------------------------

def rl_step(pol, b, cfg):
    """Returns {"params", "metrics", "margins", "mb_ratios", "adv"}."""
    n, G = b["n_seqs"], cfg.G
    if n % G:
        raise SystemExit("batch is not whole groups")
    margins = {}
    leaves, lp1, ref = pol.base(b, cfg.router_replay)
    old = {s: lp1[s].detach() for s in range(n)}  # pi_old: the checkpoint's weights
    behav = {s: torch.from_numpy(b["behav"][resp_slice(b, s)].astype(np.float64)) for s in range(n)}

    R = torch.from_numpy(b["reward"].astype(np.float64)).clone()
    task = R.clone()  # dynamic sampling judges the task's rewards, before a KL penalty
    if cfg.kl_reward:
        for s in range(n):
            R[s] -= cfg.kl_coef * kl_value(cfg.kl_est, old[s], ref[s]).sum()
    adv = group_advantages(R, G, cfg.std_norm)
    keep, flat_groups = [], 0
    for g in range(n // G):
        r = task[g * G:(g + 1) * G]
        flat = bool((r == r[0]).all())
        flat_groups += flat
        if not flat:
            margins.setdefault("flat", []).append(float(r.max() - r.min()))
            if cfg.std_norm:
                margins.setdefault("std", []).append(float(R[g * G:(g + 1) * G].std()))
        if not (flat and cfg.dynamic_sampling):
            keep += list(range(g * G, (g + 1) * G))

    w, mask = corrections(cfg, keep, old, behav, margins)
    if not cfg.router_replay:  # the trainer routes itself: no router near-tie may decide an expert
        margins["route"] = [pol.routing_margin(b)]

    params = {n_: pol.theta[n_].clone() for n_ in pol.names}
    P = [params[n_] for n_ in pol.names]
    opt = torch.optim.AdamW(P, lr=cfg.lr, betas=pol.betas, eps=pol.eps, weight_decay=cfg.weight_decay)
    for p_, n_ in zip(P, pol.names):
        opt.state[p_] = {"step": torch.tensor(float(pol.opt_step)), "exp_avg": pol.exp_avg[n_].clone(),
                         "exp_avg_sq": pol.exp_avg_sq[n_].clone()}
    total = cfg.steps * cfg.M
    index = pol.opt_step
    sums = {"loss": 0.0, "pg_loss": 0.0, "kl_loss": 0.0}
    clipped = in_tok = 0
    ratio_sum, ratio_n = 0.0, 0
    grad_norm, lr, steps_done, mb_ratios = None, None, 0, []
    nk = len(keep)
    for mb in range(cfg.M):
        seqs = keep[nk * mb // cfg.M: nk * (mb + 1) // cfg.M]
        if not seqs:
            continue
        if mb == 0:
            cur_leaves, logp = leaves, lp1
        else:
            cur_leaves = {n_: params[n_].detach().clone().requires_grad_(True) for n_ in pol.names}
            logp = pol.logps(b, seqs, cur_leaves, cfg.router_replay)
            mb_ratios.append({s: (logp[s].detach() - old[s]) for s in seqs})
        loss, pg, kl, st = policy_loss(cfg, seqs, logp, old, behav, ref, adv, w, mask, margins)
        clipped += st["clipped"]
        in_tok += st["in"]
        ratio_sum += st["ratio_sum"]
        ratio_n += st["ratio_n"]
        sums["loss"] += float(loss)
        sums["pg_loss"] += float(pg)
        sums["kl_loss"] += float(kl)
        if loss.requires_grad:
            gs = torch.autograd.grad(loss, [cur_leaves[n_] for n_ in pol.names], retain_graph=True, allow_unused=True)
        else:
            gs = [None] * len(P)
        for p_, g_ in zip(P, gs):
            p_.grad = torch.zeros_like(p_) if g_ is None else g_.detach().clone()
        grad_norm = float(torch.norm(torch.stack([p_.grad.norm(2) for p_ in P]), 2))
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(P, cfg.grad_clip)
            margins.setdefault("grad_clip", []).append(abs(grad_norm - cfg.grad_clip) / cfg.grad_clip)
        lr = lr_at(cfg, index, total)
        for group in opt.param_groups:
            group["lr"] = lr
        with torch.no_grad():
            opt.step()
        index += 1
        steps_done += 1

    R_kept = sum(len(old[s]) for s in keep)
    metrics = {"trained_seqs": nk, "flat_groups": flat_groups, "reward": float(R.mean())}
    if steps_done:
        metrics.update({k: v / steps_done for k, v in sums.items()})
        metrics.update({"grad_norm": grad_norm, "lr": lr})
    if in_tok:
        metrics["clip_frac"] = clipped / in_tok
    if ratio_n and cfg.loss != "gspo":
        metrics["ratio_mean"] = ratio_sum / ratio_n
    if R_kept:
        allw = torch.cat([w[s] for s in keep])
        d = torch.cat([old[s] - behav[s] for s in keep])
        metrics["tis_mean"] = float(allw.mean())
        metrics["tis_capped_frac"] = float((d >= math.log(cfg.tis)).sum()) / R_kept if cfg.tis > 0 else 0.0
        metrics["mis_masked_frac"] = float(sum(int((~mask[s]).sum()) for s in keep)) / R_kept
        rho = torch.exp(d)
        metrics["mismatch_mean_abs"] = float(d.abs().mean())
        metrics["mismatch_k1"] = float((-d).mean())
        metrics["mismatch_k3"] = float((rho - 1 - d).mean())
        if cfg.kl_coef > 0:
            metrics["kl_ref"] = float(torch.cat([kl_value(cfg.kl_est, old[s], ref[s]) for s in keep]).mean())
    return {"params": {n_: params[n_].detach() for n_ in pol.names}, "metrics": metrics, "margins": margins,
            "mb_ratios": mb_ratios, "adv": adv, "keep": keep, "mask": mask, "old": old}


# ---------------------------------------------------------------------------
# Comparison with trill
# ---------------------------------------------------------------------------

PARAM_TOL = 1e-4    # per adapter tensor: |theta_trill - theta_oracle| / |theta_oracle|
UPDATE_TOL = 5e-4   # the step's update theta2 - theta1, same measure
METRIC_TOL = 1e-4   # loss, grad_norm, lr, ...: relative (with a floor for values near 0)
MARGIN_MIN = {"tis": 1e-3, "mis": 1e-3, "clip": 1e-4, "aipo": 1e-3, "grad_clip": 1e-3, "flat": 1e-3, "std": 1e-3,
              "route": 1e-5}
EXACT = ("trained_seqs", "flat_groups", "clip_frac", "tis_capped_frac", "mis_masked_frac")


def last_metrics(run):
    with open(os.path.join(run, "metrics.jsonl")) as f:
        lines = [json.loads(x) for x in f if x.strip()]
    return lines[-1]


def compare(pol, res, run, step_dir):
    """Worst relative errors of trill's step against the oracle's: (figures, failures)."""
    fails, fig = [], {}
    got = Q.read_safetensors(os.path.join(step_dir, "adapter", "adapter_model.safetensors"))
    if set(got) != set(pol.names):
        return {}, ["adapter tensors differ from the checkpoint's"]
    p_worst, u_num, u_den, p_name = 0.0, 0.0, 0.0, ""
    for n in pol.names:
        o, t, t1 = res["params"][n], got[n], pol.theta[n]
        rel = float((t - o).norm() / max(float(o.norm()), 1e-30))
        if rel > p_worst:
            p_worst, p_name = rel, n
        u_num += float(((t - t1) - (o - t1)).norm()) ** 2
        u_den += float((o - t1).norm()) ** 2
    fig["param"] = p_worst
    fig["update"] = math.sqrt(u_num) / max(math.sqrt(u_den), 1e-30)
    if p_worst > PARAM_TOL:
        fails.append(f"adapter: rel err {p_worst:.2e} > {PARAM_TOL:g} ({p_name})")
    if fig["update"] > UPDATE_TOL:
        fails.append(f"update: rel err {fig['update']:.2e} > {UPDATE_TOL:g}")
    m = last_metrics(run)
    om = res["metrics"]
    worst_m, worst_name = 0.0, ""
    for k, v in om.items():
        if k not in m or m[k] is None:
            fails.append(f"metric {k} missing in metrics.jsonl")
            continue
        if k in EXACT:
            err = abs(m[k] - v)
            if err > 1e-9:
                fails.append(f"metric {k}: trill {m[k]!r}, oracle {v!r}")
            continue
        floor = {"loss": 1e-6, "pg_loss": 1e-6, "kl_loss": 1e-8, "reward": 1e-6, "mismatch_k1": 1e-5,
                 "mismatch_k3": 1e-6, "kl_ref": 1e-8}.get(k, 1e-12)
        err = abs(m[k] - v) / max(abs(v), floor)
        fig[k] = err
        if err > worst_m and k not in ("loss", "grad_norm"):
            worst_m, worst_name = err, k
        if err > METRIC_TOL:
            fails.append(f"metric {k}: trill {m[k]:.10g}, oracle {v:.10g} (rel {err:.2e})")
    fig["metric"], fig["metric_name"] = worst_m, worst_name
    return fig, fails


def check_exercised(cfg, res, variant):
    """The case still exercises what it is about (a changed fixture could make it vacuous)."""
    m, bad = res["metrics"], []

    def need(cond, what):
        if not cond:
            bad.append(f"case does not exercise {what}")
    need(m.get("grad_norm", 0) > 0, "a gradient")
    if cfg.tis > 0 and cfg.loss != "aipo":
        need(m.get("tis_capped_frac", 0) > 0, "TIS capping")
    if cfg.mis:
        need(m.get("mis_masked_frac", 0) > 0, "MIS masking")
    if cfg.loss == "aipo":
        need(m.get("clip_frac", 0) > 0, "AIPO truncation")
    if cfg.M > 1 and cfg.loss in ("ppo", "gspo", "cispo"):
        need(m.get("clip_frac", 0) > 0, "clipping in the second minibatch")
    if cfg.dynamic_sampling:
        need(m["flat_groups"] > 0 and m["trained_seqs"] < len(res["adv"]), "a dropped flat group")
    if cfg.grad_clip > 0 and cfg.grad_clip < 0.5:
        need(m["grad_norm"] > cfg.grad_clip, "gradient clipping")
    if cfg.kl_coef > 0:
        need(m.get("kl_ref", 0) > 0, "a KL to the reference")
    if variant in ("seq", "geo") and cfg.mis:
        need(0 < m.get("mis_masked_frac", 0) < 1, "sequence-level masking")
    return bad


def check_margins(res):
    out, bad = {}, []
    for k, vals in res["margins"].items():
        if not vals:
            continue
        mn = min(vals)
        out[k] = mn
        if mn < MARGIN_MIN[k]:
            bad.append(f"{k} decision within {mn:.1e} of its threshold (needs {MARGIN_MIN[k]:g})")
    return out, bad


# ---------------------------------------------------------------------------
# The suite: case batches, trill runs, comparisons
# ---------------------------------------------------------------------------

def design_rewards(b, flat_group, seed):
    """Well-spread rewards per group (multiples of 1/64, at least 1/8 apart) and optionally
    one flat group (all 0.5)."""
    rng = np.random.default_rng(seed)
    G, n = b["group_size"], b["n_seqs"]
    R = np.zeros(n)
    for g in range(n // G):
        if g == flat_group:
            R[g * G:(g + 1) * G] = 0.5
            continue
        while True:
            v = rng.integers(0, 65, G) / 64.0
            if np.min(np.diff(np.sort(v))) >= 0.125:
                break
        R[g * G:(g + 1) * G] = v
    return R


def design_behav(b, old, variant, seed):
    """Behaviour log-probs mu = old - delta with log(pi_old / mu) = delta chosen far from
    every threshold (TIS cap 2: log 0.69; MIS band [0.5, 5]: log -0.69 / 1.61; AIPO rho 2).
      tok:  per token: inside (|delta| <= 0.5), TIS-capped (0.9..1.4), MIS-high (2..2.5),
            MIS-low (-1.5..-1)
      seq:  per sequence sum of delta: high (2.3), low (-1.4) or inside (-0.3..1), with a
            TIS-capped first token in the inside ones
      geo:  per sequence mean of delta: high (1.9), low (-1.0) or inside (0.3..0.45, so the
            product of an inside one of 6 tokens is above 5: sequence level would mask it)"""
    rng = np.random.default_rng(seed)
    beh = b["behav"].copy()
    for s in range(b["n_seqs"]):
        o = old[s].numpy()
        k = len(o)
        if variant == "tok":
            u = rng.random(k)
            d = np.where(u < 0.15, rng.uniform(0.9, 1.4, k),
                         np.where(u < 0.25, rng.uniform(2.0, 2.5, k),
                                  np.where(u < 0.35, rng.uniform(-1.5, -1.0, k), rng.uniform(-0.5, 0.5, k))))
        elif variant == "seq":
            cls = s % 4
            target = {0: 2.3, 1: -1.4}.get(cls, rng.uniform(-0.3, 1.0))
            if cls >= 2 and k > 1:
                d = np.concatenate([[1.1], np.full(k - 1, (target - 1.1) / (k - 1))])
            else:
                d = target / k + rng.uniform(-0.3, 0.3, k)
                d += (target - d.sum()) / k
        elif variant == "geo":
            cls = s % 4
            mean = {0: 1.9, 1: -1.0}.get(cls, rng.uniform(0.3, 0.45))
            d = mean + rng.uniform(-0.4, 0.4, k)
            d += mean - d.mean()
        else:
            raise SystemExit(variant)
        sl = resp_slice(b, s)
        beh[sl] = (o - d).astype(np.float32)
        if not (beh[sl] < 0).all():
            raise SystemExit("designed behaviour log-prob is not negative")
    return beh


def dup_group(b, g):
    """Group g's samples all become copies of its first (tokens, routing, behaviour log-probs,
    completion): identical samples, whose rewards, penalties and advantages must be equal."""
    G, n = b["group_size"], b["n_seqs"]
    src = g * G
    order = [src if g * G <= s < (g + 1) * G else s for s in range(n)]
    out = copy_batch(b)
    offs, parts = [0], {k: [] for k in ("tokens", "behav", "version", "experts")}
    for s in order:
        sl = slice(int(b["offsets"][s]), int(b["offsets"][s + 1]))
        for k in parts:
            parts[k].append(b[k][sl])
        offs.append(offs[-1] + sl.stop - sl.start)
    for k in parts:
        out[k] = np.concatenate(parts[k])
    out["offsets"] = np.array(offs, dtype=np.int32)
    out["prompt_len"] = b["prompt_len"][order].copy()
    out["completion"] = [b["completion"][s] for s in order]
    return out


def pick_threshold(vals, lo_q, hi_q, min_gap):
    """A value in the widest gap between sorted vals among quantiles [lo_q, hi_q]."""
    v = np.sort(np.asarray(vals))
    if len(v) < 2:
        return None
    i0, i1 = int(lo_q * (len(v) - 1)), max(int(hi_q * (len(v) - 1)), int(lo_q * (len(v) - 1)) + 1)
    best, where = -1.0, None
    for i in range(i0, min(i1, len(v) - 1)):
        gap = v[i + 1] - v[i]
        if gap > best:
            best, where = gap, 0.5 * (v[i] + v[i + 1])
    return where if best >= min_gap else None


def adapt_band(res, cfg_loss):
    """clip_low / clip_high for the minibatch-2 ratios: thresholds in wide gaps, about a
    third of the ratios above / below them (so the clip really acts)."""
    if not res["mb_ratios"]:
        return None
    keep_mask = res["mask"]
    if cfg_loss == "gspo":
        lr_ = [float(d[keep_mask[s]].mean()) for part in res["mb_ratios"] for s, d in part.items()
               if bool(keep_mask[s].any())]
    else:
        lr_ = [x for part in res["mb_ratios"] for s, d in part.items() for x in d[keep_mask[s]].tolist()]
    ups, downs = [x for x in lr_ if x > 0], [x for x in lr_ if x < 0]
    q0, q1 = (0.0, 1.0) if cfg_loss == "gspo" else (0.3, 0.7)  # a few sequence ratios: any gap
    hi = pick_threshold(ups, q0, q1, 4e-4)
    lo = pick_threshold(downs, q0, q1, 4e-4)
    if hi is None or lo is None:
        return None
    return 1.0 - math.exp(lo), math.exp(hi) - 1.0


# name, checkpoint, behaviour variant, rewards (flat | noflat), options, adapt band for, known bug
CASES = [
    ("ppo_token_mean", "rec", "tok", "flat", [], None),
    ("ppo_seq_sum", "rec", "tok", "flat", ["algo.aggregation=seq-mean-token-sum"], None),
    ("ppo_seq_mean", "rec", "tok", "flat", ["algo.aggregation=seq-mean-token-mean"], None),
    ("gspo_seq_mean", "rec", "tok", "flat", ["algo.loss=gspo", "algo.aggregation=seq-mean-token-mean"], None),
    ("gspo_token_mean", "rec", "tok", "flat", ["algo.loss=gspo"], None),
    ("cispo_seq_sum", "rec", "tok", "flat", ["algo.loss=cispo", "algo.aggregation=seq-mean-token-sum"], None),
    ("cispo_token_mean", "rec", "tok", "flat", ["algo.loss=cispo", "correction.mis=false"], None),
    ("reinforce_token_mean", "rec", "tok", "flat", ["algo.loss=reinforce"], None),
    ("reinforce_seq_mean", "rec", "tok", "flat", ["algo.loss=reinforce", "algo.aggregation=seq-mean-token-mean"], None),
    ("aipo_token_mean", "rec", "tok", "flat", ["algo.loss=aipo", "algo.aipo_rho=2", "correction.mis=false"], None),
    ("aipo_seq_sum_mis", "rec", "tok", "flat", ["algo.loss=aipo", "algo.aipo_rho=2",
                                                "algo.aggregation=seq-mean-token-sum"], None),
    ("tis_off_mis_off", "rec", "tok", "flat", ["correction.tis=0", "correction.mis=false"], None),
    ("tis_only", "rec", "tok", "flat", ["correction.mis=false"], None),
    ("mis_token_only", "rec", "tok", "flat", ["correction.tis=0", "algo.aggregation=seq-mean-token-mean"], None),
    ("mis_sequence", "rec", "seq", "flat", ["correction.mis_level=sequence"], None),
    ("mis_geometric", "rec", "geo", "flat", ["correction.mis_level=geometric",
                                             "algo.aggregation=seq-mean-token-mean"], None),
    ("mis_geometric_gspo", "rec", "geo", "flat", ["correction.mis_level=geometric", "algo.loss=gspo"], None),
    ("dr_grpo", "rec", "tok", "flat", ["algo.std_norm=false", "algo.aggregation=seq-mean-token-sum"], None),
    ("dynamic_sampling", "rec", "tok", "flat", ["algo.dynamic_sampling=true"], None),
    ("dynamic_sampling_seq_mean", "rec", "tok", "flat", ["algo.dynamic_sampling=true",
                                                         "algo.aggregation=seq-mean-token-mean"], None),
    ("kl_k1_loss", "rec", "tok", "flat", ["algo.kl_coef=0.5", "algo.kl_estimator=k1"], None),
    ("kl_k2_loss", "rec", "tok", "flat", ["algo.kl_coef=20", "algo.kl_estimator=k2",
                                          "algo.aggregation=seq-mean-token-sum"], None),
    ("kl_k3_loss_gspo", "rec", "tok", "flat", ["algo.kl_coef=20", "algo.kl_estimator=k3", "algo.loss=gspo",
                                               "algo.aggregation=seq-mean-token-mean"], None),
    ("kl_k1_reward", "rec", "tok", "noflat", ["algo.kl_coef=2", "algo.kl_estimator=k1", "algo.kl_mode=reward"], None),
    ("kl_k3_reward", "rec", "tok", "noflat", ["algo.kl_coef=50", "algo.kl_estimator=k3", "algo.kl_mode=reward",
                                              "algo.aggregation=seq-mean-token-mean"], None),
    ("minibatches2_ppo", "rec", "tok", "flat", ["algo.minibatches=2", "trainer.lr=2e-2"], "ppo"),
    ("minibatches2_gspo", "rec", "tok", "flat", ["algo.minibatches=2", "algo.loss=gspo", "trainer.lr=2e-2",
                                                 "algo.aggregation=seq-mean-token-sum"], "gspo"),
    ("minibatches2_cispo_micro", "rec", "tok", "flat", ["algo.minibatches=2", "algo.loss=cispo", "trainer.lr=2e-2",
                                                        "trainer.micro_batch_tokens=30"], "cispo"),
    ("micro16_token_mean", "rec", "tok", "flat", ["trainer.micro_batch_tokens=16"], None),
    ("micro16_seq_mean_kl", "rec", "tok", "flat", ["trainer.micro_batch_tokens=16", "algo.kl_coef=0.5",
                                                   "algo.kl_estimator=k1", "algo.aggregation=seq-mean-token-mean"],
     None),
    ("grad_clip", "rec", "tok", "flat", ["trainer.grad_clip=0.05"], None),
    ("no_clip", "rec", "tok", "flat", ["trainer.grad_clip=0"], None),
    ("warmup_cosine", "rec", "tok", "flat", ["trainer.schedule=cosine", "trainer.warmup_steps=4"], None),
    ("cosine_minibatches2", "rec", "tok", "flat", ["trainer.schedule=cosine", "trainer.min_lr=1e-3",
                                                   "algo.minibatches=2"], None),
    ("linear_min_lr", "rec", "tok", "flat", ["trainer.schedule=linear", "trainer.min_lr=2e-3"], None),
    ("weight_decay", "rec_wd", "tok", "flat", ["trainer.weight_decay=0.5"], None),
    ("weight_decay_minibatches2", "rec_wd", "tok", "flat", ["trainer.weight_decay=0.5", "algo.minibatches=2",
                                                            "algo.aggregation=seq-mean-token-mean"], None),
    ("recompute", "rec", "tok", "flat", ["trainer.recompute=true"], None),
    ("router_replay_off", "rec", "tok", "flat", ["router_replay=false"], None),
    # a resumed run takes this config's weight decay (the checkpoint's moments, not its settings)
    ("weight_decay_on_resume", "rec", "tok", "flat", ["trainer.weight_decay=0.5"], None),
    # identical samples (group 1 = copies of one sequence, flat rewards): the group is flat for
    # dynamic sampling although their KL penalties differ by the packed fp32 forward's rounding
    ("identical_group_kl_reward_ds", "rec", "tok+dup", "flat", ["algo.kl_coef=2", "algo.kl_estimator=k1",
                                                               "algo.kl_mode=reward", "algo.dynamic_sampling=true"],
     None),
]


def run_trill(trill, common, run, ckpt, replay, opts, log):
    cmd = [trill, "train"] + common + ["data.eval=", f"run_dir={run}", f"steps={STEP}", f"resume={ckpt}",
                                       f"rollouts.replay={replay}"] + opts
    env = dict(os.environ, OMP_NUM_THREADS="1")
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120, env=env)
    except subprocess.TimeoutExpired:
        return "timed out after 120 s"
    with open(log, "wb") as f:
        f.write(p.stdout)
    if p.returncode != 0:
        tail = p.stdout.decode(errors="replace").strip().splitlines()[-3:]
        return f"exit status {p.returncode}: " + " | ".join(tail)
    return None


def cmd_suite(args):
    t_start = time.time()
    common = args.common
    model_dir = next((x.split("=", 1)[1] for x in common if x.startswith("model=")), "model")
    rec_batch = read_batch(f"rec/rollouts/step-{STEP:08d}.bin")
    base_cfg = read_config("rec/config.yaml")
    base_cfg["steps"] = STEP
    pols = {name: Policy(model_dir, f"{name}/checkpoints/step-{CKPT_STEP:08d}") for name in ("rec", "rec_wd")}
    for name, pol in pols.items():  # the recordings' optimizer state must make every factor matter
        if pol.opt_step != CKPT_STEP or not all(float(pol.exp_avg_sq[n].abs().max()) > 0 for n in pol.names
                                                if "experts" not in n):
            raise SystemExit(f"{name}: the step-{CKPT_STEP} checkpoint lacks optimizer state in some tensor")
    olds = {name: {s: d.detach() for s, d in pol.base(rec_batch, True)[1].items()} for name, pol in pols.items()}
    cases = CASES
    bad = 0
    print(f"{'case':34s} {'param':>8s} {'update':>8s} {'loss':>8s} {'gnorm':>8s} {'metric':>8s}  "
          f"{'smallest margin from each threshold':s}")
    rows = []
    for ci, (name, ck, variant, rew, opts, adapt) in enumerate(cases):
        pol = pols[ck]
        b = copy_batch(rec_batch)
        b["reward"] = design_rewards(b, 1 if rew == "flat" else -1, seed=11)
        variant, _, tweak = variant.partition("+")
        b["behav"] = design_behav(b, olds[ck], variant, seed=23 + {"tok": 0, "seq": 1, "geo": 2}[variant])
        if tweak == "dup":
            b = dup_group(b, 1)
        b["adv"][:] = 0
        b["keep"][:] = 1
        opts = list(opts)
        cfg_dict = json.loads(json.dumps(base_cfg))
        for o in opts:
            set_dotted(cfg_dict, *o.split("=", 1))
        if adapt:  # clip band in the gaps of the minibatch-2 ratios (the first minibatch's are 1)
            band = adapt_band(rl_step(pol, b, Cfg(cfg_dict)), adapt)
            if band is None:
                print(f"{name:34s} FAIL: no clear clip band for the minibatch-2 ratios (raise trainer.lr)")
                bad += 1
                continue
            opts += [f"algo.clip_low={band[0]:.6g}", f"algo.clip_high={band[1]:.6g}"]
        folder = os.path.join("oracle", name)
        replay = os.path.join(folder, "replay")
        write_batch(os.path.join(replay, f"step-{STEP:08d}.bin"), b)
        run = os.path.join(folder, "run")
        err = run_trill(args.trill, common, run, f"{ck}/checkpoints/step-{CKPT_STEP:08d}", replay, opts,
                        os.path.join(folder, "log"))
        if err:
            print(f"{name:34s} FAIL: trill {err}")
            bad += 1
            continue
        try:
            resolved = read_config(os.path.join(run, "config.yaml"))
            cfg = Cfg(resolved)
            res = rl_step(pol, b, cfg)
            margins, mbad = check_margins(res)
            mbad += check_exercised(cfg, res, variant) if not tweak else []
            fig, fails = compare(pol, res, run, os.path.join(run, "checkpoints", f"step-{STEP:08d}"))
        except (OSError, KeyError, ValueError, IndexError, RuntimeError) as e:
            print(f"{name:34s} FAIL: {type(e).__name__}: {e}")
            bad += 1
            continue
        for o in opts:  # trill read every override as this script did
            k, v = o.split("=", 1)
            want, got_ = parse_scalar(v), resolved
            for part in k.split("."):
                got_ = got_[part]
            try:
                same_num = math.isclose(float(want), float(got_), rel_tol=1e-12) and not isinstance(want, bool)
            except (TypeError, ValueError):
                same_num = False
            if json.dumps(want) != json.dumps(got_) and not same_num:
                mbad.append(f"config.yaml has {k}: {got_!r}, the case asked for {v}")
        fails = mbad + fails
        mtxt = " ".join(f"{k}={v:.1e}" for k, v in sorted(margins.items()))
        print(f"{name:34s} {fig.get('param', float('nan')):8.1e} {fig.get('update', float('nan')):8.1e} "
              f"{fig.get('loss', float('nan')):8.1e} {fig.get('grad_norm', float('nan')):8.1e} "
              f"{fig.get('metric', float('nan')):8.1e}  {mtxt}  {'ok' if not fails else 'FAIL'}")
        for f_ in fails:
            print(f"    {f_}")
        extra = []
        om = res["metrics"]
        extra.append(f"seqs {om['trained_seqs']} flat {om['flat_groups']} clip {om.get('clip_frac', 0):.3f} "
                     f"capped {om.get('tis_capped_frac', 0):.3f} masked {om.get('mis_masked_frac', 0):.3f} "
                     f"gnorm {om.get('grad_norm', 0):.4f} lr {om.get('lr', 0):.4g} {' '.join(opts)}")
        if args.verbose:
            print("    " + extra[0])
        rows.append((name, fig, fails))
        bad += bool(fails)
    print(f"rl_oracle: {len(cases) - bad}/{len(cases)} cases ok, worst adapter rel err "
          f"{max([r[1].get('param', 0) for r in rows] or [0]):.1e}, worst update rel err "
          f"{max([r[1].get('update', 0) for r in rows] or [0]):.1e} ({time.time() - t_start:.1f} s)")
    return 1 if bad else 0


def cmd_step(args):
    pol = Policy(args.model, args.ckpt)
    b = read_batch(args.batch)
    res = rl_step(pol, b, Cfg(read_config(args.config)))
    out = {"metrics": res["metrics"], "margins": check_margins(res)[0]}
    if args.run:
        steps = sorted(os.listdir(os.path.join(args.run, "checkpoints")))
        fig, fails = compare(pol, res, args.run, os.path.join(args.run, "checkpoints", steps[-1]))
        out.update({"figures": fig, "failures": fails})
    print(json.dumps(out, indent=1))
    return 1 if out.get("failures") else 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    su = sub.add_parser("suite")
    su.add_argument("--trill", required=True)
    su.add_argument("--verbose", action="store_true")
    su.add_argument("common", nargs="*")
    sp = sub.add_parser("step")
    sp.add_argument("--model", required=True)
    sp.add_argument("--ckpt", required=True)
    sp.add_argument("--batch", required=True)
    sp.add_argument("--config", required=True)
    sp.add_argument("--run")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    return cmd_suite(args) if args.cmd == "suite" else cmd_step(args)


if __name__ == "__main__":
    sys.exit(main())
