#!/usr/bin/python3
"""Write random training-loss inputs for gradient parity tests.

  gen_train_inputs.py --vocab V --seed N --lengths 3,9,40 --out IN.jsonl [--replay-model DIR]

One line per length: {"tokens": [...], "coef": [null, c_1, ..., c_{n-1}]} with
ids uniform in [0, V) and coef[t] (t >= 1) uniform in [-1, 1], except that each
position is masked (coef 0) with probability 0.3. coef[0] is null: the first
token has no log-prob. This is the input of `qwen3_ref.py grad`, whose loss is
sum over lines and t >= 1 of coef[t] * log p(token t | tokens < t).

With --replay-model DIR (a Qwen3-MoE, DeepSeek-V3 / Kimi K2, Mixtral or GLM-4.5 checkpoint), each
line also carries "experts": [[[k distinct ids] per MoE layer] per token], drawn
uniformly at random (in random order), so the replayed routing differs from the
model's own (with k == the expert count every routing is the same set). The MoE
layers, the expert count and num_experts_per_tok are read from DIR/config.json
with the same layer predicate as the reference for its model_type: qwen3_ref.py
(num_experts), deepseek_ref.py for deepseek_v3 / kimi_k2 (n_routed_experts,
first_k_dense_replace, moe_layer_freq), Mixtral's and gpt-oss's (every layer, num_local_experts), or
glm_ref.py for glm4_moe (n_routed_experts, layers from first_k_dense_replace on). For a
dense model, every token gets [].

Uses Python's own PRNG: the output depends only on the arguments (and config);
tokens and coef are the same with and without --replay-model.
"""

import argparse
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deepseek_ref  # noqa: E402  (same layer predicates as the references)
import qwen3_ref  # noqa: E402

MASK_FRACTION = 0.3


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--lengths", required=True, help="comma-separated sequence lengths")
    ap.add_argument("--out", required=True)
    ap.add_argument("--replay-model", metavar="DIR",
                    help="also write random \"experts\" for router replay, per DIR/config.json")
    args = ap.parse_args()
    if args.vocab <= 0:
        ap.error("--vocab must be positive")
    lengths = [int(x) for x in args.lengths.split(",") if x.strip()]
    if any(n < 0 for n in lengths):
        ap.error("lengths must be non-negative")
    moe = None
    if args.replay_model:
        with open(os.path.join(args.replay_model, "config.json")) as f:
            cfg = json.load(f)
        if cfg.get("vocab_size", args.vocab) < args.vocab:
            ap.error(f"--vocab {args.vocab} exceeds the model's vocab_size {cfg['vocab_size']}")
        if deepseek_ref.is_deepseek(cfg):
            is_moe_layer, E = deepseek_ref.is_moe_layer, deepseek_ref.n_experts(cfg)
        elif cfg.get("model_type") == "glm4_moe":
            import glm_ref  # only for a GLM-4.5 checkpoint
            is_moe_layer, E = glm_ref.is_moe_layer, glm_ref.n_experts(cfg)
        elif cfg.get("model_type") == "qwen3_next":
            import qwen3next_ref  # only for a Qwen3-Next checkpoint
            is_moe_layer, E = qwen3next_ref.is_moe_layer, qwen3next_ref.n_experts(cfg)
        elif cfg.get("model_type") in ("mixtral", "gpt_oss"):
            is_moe_layer, E = (lambda c, i: True), cfg.get("num_local_experts", 8)
        else:
            is_moe_layer, E = qwen3_ref.is_moe_layer, cfg.get("num_experts", 0)
        n_moe = sum(is_moe_layer(cfg, i) for i in range(cfg["num_hidden_layers"]))
        k = cfg.get("num_experts_per_tok", 0)
        if n_moe and not (0 < k <= E):
            ap.error(f"bad config: num_experts_per_tok={k}, num_experts={E}")
        moe = (n_moe, E, k)
    rng = random.Random(args.seed)
    # A separate stream for the experts: tokens and coef do not depend on --replay-model.
    rng_ex = random.Random(f"{args.seed}-experts")
    with open(args.out, "w") as f:
        for n in lengths:
            tokens = [rng.randrange(args.vocab) for _ in range(n)]
            coef = [None] + [0.0 if rng.random() < MASK_FRACTION else rng.uniform(-1.0, 1.0)
                             for _ in range(n - 1)] if n else []
            rec = {"tokens": tokens, "coef": coef}
            if moe is not None:
                n_moe, E, k = moe
                rec["experts"] = [[rng_ex.sample(range(E), k) for _ in range(n_moe)]
                                  for _ in range(n)]
            f.write(json.dumps(rec) + "\n")
    print(f"wrote {len(lengths)} sequences to {args.out}"
          + (f" (replay: {moe[0]} MoE layers, top-{moe[2]} of {moe[1]})" if moe else ""))


if __name__ == "__main__":
    main()
