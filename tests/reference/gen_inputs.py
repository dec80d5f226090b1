#!/usr/bin/python3
"""Write random token sequences for parity tests.

  gen_inputs.py --vocab V --seed N --lengths 1,5,17,64 --out IN.jsonl

One {"tokens": [...]} line per length, ids uniform in [0, V). Uses Python's
own PRNG so the output depends only on (vocab, seed, lengths).
"""

import argparse
import json
import random


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--lengths", required=True, help="comma-separated sequence lengths")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if args.vocab <= 0:
        ap.error("--vocab must be positive")
    lengths = [int(x) for x in args.lengths.split(",") if x.strip()]
    if any(n < 0 for n in lengths):
        ap.error("lengths must be non-negative")
    rng = random.Random(args.seed)
    with open(args.out, "w") as f:
        for n in lengths:
            f.write(json.dumps({"tokens": [rng.randrange(args.vocab) for _ in range(n)]}) + "\n")
    print(f"wrote {len(lengths)} sequences to {args.out}")


if __name__ == "__main__":
    main()
