#!/usr/bin/python3
"""The generator against a reference forward, on the sequences it sampled.

  gen_compare.py inputs GEN.jsonl OUT.jsonl
      `trill generate --json` lines -> {"tokens": prompt + generated} lines, the input of a
      reference's `forward`.
  gen_compare.py compare GEN.jsonl REF.jsonl [--atol 1e-4] [--min-tokens 60]
      Every generated token's log-prob against the reference's for the same sequence; exit 0
      when the worst |difference| is within --atol over at least --min-tokens tokens.
"""

import argparse
import json
import sys


def read(path):
    return [json.loads(line) for line in open(path) if line.strip()]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    i = sub.add_parser("inputs")
    i.add_argument("gen")
    i.add_argument("out")
    c = sub.add_parser("compare")
    c.add_argument("gen")
    c.add_argument("ref")
    c.add_argument("--atol", type=float, default=1e-4)
    c.add_argument("--min-tokens", type=int, default=60)
    args = ap.parse_args(argv)
    gen = read(args.gen)
    if args.cmd == "inputs":
        with open(args.out, "w") as f:
            for r in gen:
                f.write(json.dumps({"tokens": r["prompt_tokens"] + r["tokens"]}) + "\n")
        return 0
    ref = read(args.ref)
    if len(gen) != len(ref):
        print(f"{len(gen)} generated sequences, {len(ref)} reference lines")
        return 1
    worst = max((abs(a - b) for g, r in zip(gen, ref) for a, b in zip(g["logprobs"], r["logprobs"][len(g["prompt_tokens"]):])), default=0.0)
    n = sum(len(g["tokens"]) for g in gen)
    print(f"generator f32 vs reference: max |d logprob| {worst:.3g} over {n} generated tokens")
    return 0 if worst <= args.atol and n >= args.min_tokens else 1


if __name__ == "__main__":
    sys.exit(main())
