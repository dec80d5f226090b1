"""The cost of trill serve's transactional state (issue 34): milliseconds of save_state and of
optim_step (which writes the trainer's snapshot) for one rank-R trainer on a preset model,
through real HTTP on loopback, each call submitted alone and waited for.

With a second binary (an older trill, say), both servers run side by side in one run, rounds
alternating, so the ratio is measured under the same load: a save there writes the live folder
file by file; here it writes a temporary folder (every file synced, a manifest with XXH64),
renames it into place and commits it with the request's result in one SQLite transaction.

Usage: python3 bench/service_save.py TRILL [OTHER_TRILL] [--preset small] [--rank 16] [--calls 20] [--rounds 3]
Prints figures (median and spread over rounds); never pass/fail."""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "clients", "python"))
import trill_client as tinker  # noqa: E402


def start(trill, work, model):
    state, port_file = os.path.join(work, "state"), os.path.join(work, "port")
    proc = subprocess.Popen([trill, "serve", "--models", model, "--state", state, "--listen", "127.0.0.1:0", "--port-file", port_file,
                             "--max-seconds", "3600"], stderr=subprocess.DEVNULL)
    t = time.monotonic()
    while not os.path.exists(port_file):
        if proc.poll() is not None or time.monotonic() - t > 120:
            raise RuntimeError(f"{trill} serve did not start")
        time.sleep(0.05)
    with open(port_file) as f, open(os.path.join(state, "default.key")) as k:
        return proc, tinker.ServiceClient(base_url=f"http://127.0.0.1:{int(f.read())}", api_key=k.read().strip())


def timed(calls, fn):
    """Milliseconds of each of `calls` calls of fn(i), each submitted and waited for alone."""
    out = []
    for i in range(calls):
        t = time.perf_counter()
        fn(i)
        out.append(1e3 * (time.perf_counter() - t))
    return out


def one_round(tc, tok, calls):
    datum = [tinker.Datum(model_input=tinker.ModelInput.from_ints(tok.encode("12+34=4")),
                          loss_fn_inputs={"target_tokens": tok.encode("2+34=46")})]
    forward = timed(calls, lambda i: tc.forward(datum, "cross_entropy").result())
    tc.forward_backward(datum, "cross_entropy").result()
    step = timed(calls, lambda i: tc.optim_step(tinker.AdamParams(learning_rate=1e-4)).result())
    save = timed(calls, lambda i: tc.save_state("bench").result())  # the same name: each save replaces the last
    sampler = timed(calls, lambda i: tc.save_weights_for_sampler("bench").result())
    return {"forward (no state written)": statistics.median(forward), "optim_step (+ snapshot)": statistics.median(step),
            "save_state": statistics.median(save), "save_weights_for_sampler": statistics.median(sampler)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trill", nargs="+", help="one binary, or two to compare side by side")
    ap.add_argument("--preset", default="small")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="trill-bench-save-")
    servers = []
    try:
        model = os.path.join(work, "model")
        subprocess.run([args.trill[0], "init", "--out", model, "--preset", args.preset, "--seed", "1"], check=True, capture_output=True)
        for i, trill in enumerate(args.trill):
            os.makedirs(os.path.join(work, str(i)))
            proc, svc = start(os.path.abspath(trill), os.path.join(work, str(i)), model)
            tc = svc.create_lora_training_client(base_model="model", rank=args.rank, seed=1)
            servers.append((trill, proc, tc, tc.get_tokenizer()))
        adapter = sum(os.path.getsize(f) for f in __import__("glob").glob(os.path.join(work, "0", "state", "trainers", "*", "states", "*", "*")))
        results = {trill: [] for trill, *_ in servers}
        for _ in range(args.rounds):
            for trill, _, tc, tok in servers:  # alternating: both see the same machine
                results[trill].append(one_round(tc, tok, args.calls))
        print(f"trill serve, preset {args.preset}, LoRA rank {args.rank} on every module, {args.calls} calls a figure, "
              f"{args.rounds} rounds (median of the rounds' medians, [min, max]); ms per call, submitted and waited for alone")
        for trill, rounds in results.items():
            print(f"  {trill}:")
            for key in rounds[0]:
                xs = [r[key] for r in rounds]
                print(f"    {key:28s} {statistics.median(xs):8.1f} ms  [{min(xs):.1f}, {max(xs):.1f}]")
        if len(servers) == 2:
            a, b = (results[t] for t, *_ in servers)
            for key in a[0]:
                print(f"  ratio {key:28s} {statistics.median([x[key] for x in a]) / statistics.median([x[key] for x in b]):.2f}x "
                      f"({servers[0][0]} / {servers[1][0]})")
        if adapter:
            print(f"  a saved state's files: {adapter / 1e6:.1f} MB")
    finally:
        for _, proc, *_ in servers:
            proc.terminate()
            proc.wait(timeout=60)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
