"""The cookbook's RL example learns: examples/service/rl.py (the demo's GRPO loop through the SDK)
against `trill serve --models demo` must raise held-out pass@1 by at least MARGIN points in a
few steps, not only print its line.

The demo's warm-started model comes from the cache ($TRILL_CACHE_DIR, else ~/.cache/trill): run
after a test that made it there (tests/rl/demo_learns.sh), or this makes it first (minutes).
The run is deterministic on one machine (seeded sampling, fixed-order sums); across machines the
generator's instruction set changes the draws, hence a margin well under the gain measured: 30
steps of 32 prompts x 8 samples (about 15 s) gained +9.6, +7.8, +10.9, +10.1, +7.9, +11.0, +8.7
points with rl.py's seeds 0-6 (pass@1 30.6% before), so at least 5 are asked (+50 in 300 steps).

Usage: cookbook_learns.py TRILL [--steps N] [--margin POINTS]"""

import argparse
import os
import re
import subprocess
import sys
import tempfile

from svc_fixture import Server, clean_log, slurp

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "..", "examples", "service", "rl.py")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trill")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--eval-prompts", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0, help="rl.py's --seed")
    ap.add_argument("--lr", type=float, default=None, help="rl.py's --lr (its default unless given)")
    ap.add_argument("--margin", type=float, default=5.0, help="points of pass@1 the run must gain at least")
    args = ap.parse_args()
    trill = os.path.abspath(args.trill)
    with tempfile.TemporaryDirectory(prefix="trill-cookbook-") as w:
        state, log = os.path.join(w, "state"), os.path.join(w, "serve.log")
        server = Server(trill, "demo", state, log, max_seconds=600)
        try:
            env = dict(os.environ, TRILL_BASE_URL=server.url, TRILL_API_KEY=slurp(os.path.join(state, "default.key")).strip())
            out = subprocess.run([sys.executable, EXAMPLE, "--steps", str(args.steps), "--prompts", str(args.prompts),
                                  "--eval-prompts", str(args.eval_prompts), "--log-every", str(args.steps), "--seed", str(args.seed),
                                  *(["--lr", str(args.lr)] if args.lr else [])],
                                 env=env, capture_output=True, text=True, timeout=600)
        finally:
            code = server.stop()
        print(out.stdout, end="")
        assert out.returncode == 0, f"rl.py exited {out.returncode}: {out.stderr[-2000:]}"
        assert code == 0, f"trill serve exited {code}: {slurp(log)[-2000:]}"
        clean_log(log)
        figures = {}
        for when in ("before", "after"):
            m = re.search(rf"^held-out {when}: pass@1 (\d+\.\d+), pass@8 (\d+\.\d+)$", out.stdout, re.M)
            assert m, f"no held-out {when} figure in rl.py's output"
            figures[when] = float(m.group(1))
        gain = 100 * (figures["after"] - figures["before"])
        assert gain >= args.margin, (f"the cookbook's RL example gained {gain:+.1f} points of pass@1 in {args.steps} steps "
                                     f"({figures['before']:.3f} -> {figures['after']:.3f}), less than {args.margin}")
        print(f"cookbook RL example: held-out pass@1 {figures['before']:.3f} -> {figures['after']:.3f} ({gain:+.1f} points, "
              f"at least {args.margin}) in {args.steps} steps of {args.prompts} prompts")


if __name__ == "__main__":
    main()
