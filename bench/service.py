"""trill serve's figures (issue 21), through real HTTP on loopback with the Python SDK:

1. multi-LoRA batching: generated tokens/s when T tenants (each its own trained adapter) sample
   at once, for T = 1, 4, 16, next to (a) one tenant submitting the same total load (every row on
   one adapter: the batching ceiling) and (b) the same T tenants served one after another (what a
   server without multi-LoRA batching does);
2. request latency p50/p99 (submit to result) of forward_backward and sample at small sizes.

Usage: python3 bench/service.py BUILD_DIR [--preset tiny] [--rounds 3]
Prints figures; never pass/fail. The machine is shared and noisy: each configuration is run
`rounds` times in alternation and the median and spread are printed."""

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


def start_server(trill, work, model):
    port_file = os.path.join(work, "port")
    key = subprocess.run([trill, "serve", "keys", "add", "bench", "--state", os.path.join(work, "state")], check=True,
                         capture_output=True, text=True).stdout.strip()
    proc = subprocess.Popen([trill, "serve", "--models", model, "--state", os.path.join(work, "state"), "--listen", "127.0.0.1:0",
                             "--port-file", port_file, "--max-seconds", "3600", "--max-queued", "4096"],
                            stderr=subprocess.DEVNULL)
    t = time.monotonic()
    while not os.path.exists(port_file):
        if proc.poll() is not None or time.monotonic() - t > 60:
            raise RuntimeError("trill serve did not start")
        time.sleep(0.05)
    with open(port_file) as f:
        return proc, tinker.ServiceClient(base_url=f"http://127.0.0.1:{int(f.read())}", api_key=key)


def tenant(svc, model, seed, tok_text="12+34=46"):
    """A trainer trained one step (so its adapter is not zero) and a sampler on its weights."""
    tc = svc.create_lora_training_client(base_model=model, rank=8, seed=seed)
    tok = tc.get_tokenizer()
    ids = tok.encode(tok_text)
    d = tinker.Datum(model_input=tinker.ModelInput.from_ints(ids[:-1]), loss_fn_inputs={"target_tokens": ids[1:]})
    tc.forward_backward([d], "cross_entropy").result()
    tc.optim_step(tinker.AdamParams(learning_rate=0.05)).result()
    return tc, tc.save_weights_and_get_sampling_client(f"bench{seed}"), tok


def sample_load(samplers, prompt, per_sampler, params):
    """Every sampler submits per_sampler requests at once; generated tokens and seconds."""
    t = time.perf_counter()
    futures = [s.sample(prompt, 4, params) for s in samplers for _ in range(per_sampler)]
    tokens = sum(len(q.tokens) for f in futures for q in f.result(timeout=600).sequences)
    return tokens, time.perf_counter() - t


def sequential(samplers, prompt, per_sampler, params):
    tokens, seconds = 0, 0.0
    for s in samplers:
        n, dt = sample_load([s], prompt, per_sampler, params)
        tokens, seconds = tokens + n, seconds + dt
    return tokens, seconds


def median_spread(xs):
    return statistics.median(xs), min(xs), max(xs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=16, help="sample requests (4 samples each) per configuration")
    args = ap.parse_args()
    trill = os.path.abspath(os.path.join(args.build, "trill"))
    work = tempfile.mkdtemp(prefix="trill-bench-serve-")
    try:
        model = os.path.join(work, "base")
        subprocess.run([trill, "init", "--out", model, "--preset", args.preset, "--seed", "1"], check=True, capture_output=True)
        proc, svc = start_server(trill, work, model)
        try:
            tenants = [tenant(svc, "base", 100 + i) for i in range(16)]
            tok = tenants[0][2]
            prompt = tinker.ModelInput.from_ints(tok.encode("47+38="))
            params = tinker.SamplingParams(max_tokens=32, seed=1)
            print(f"trill serve, preset {args.preset}, {os.cpu_count()} cores; each configuration {args.requests} sample requests x 4 samples x "
                  f"up to 32 tokens, {args.rounds} rounds (median [min, max])")
            sample_load([tenants[0][1]], prompt, 2, params)  # warm the engine
            print("\nmulti-LoRA batching: generated tokens/s")
            print(f"{'tenants':>8} {'at once':>18} {'one adapter, same load':>24} {'one after another':>20} {'at once / one adapter':>22} "
                  f"{'at once / one after another':>28}")
            for T in (1, 4, 16):
                samplers = [t[1] for t in tenants[:T]]
                per = max(1, args.requests // T)
                runs = {"together": [], "single": [], "sequential": []}
                for _ in range(args.rounds):
                    for name, fn in (("together", lambda: sample_load(samplers, prompt, per, params)),
                                     ("single", lambda: sample_load([samplers[0]], prompt, per * T, params)),
                                     ("sequential", lambda: sequential(samplers, prompt, per, params))):
                        n, dt = fn()
                        runs[name].append(n / dt)
                tg, sg, qg = (median_spread(runs[k]) for k in ("together", "single", "sequential"))
                print(f"{T:>8} {tg[0]:>9.0f} [{tg[1]:.0f}, {tg[2]:.0f}] {sg[0]:>14.0f} [{sg[1]:.0f}, {sg[2]:.0f}] "
                      f"{qg[0]:>11.0f} [{qg[1]:.0f}, {qg[2]:.0f}] {tg[0] / sg[0]:>22.2f} {tg[0] / qg[0]:>28.2f}")
            print("\nrequest latency, submit to result, one request at a time (ms)")
            tc, sampler, tok = tenants[0]
            ids = tok.encode("12+34=46")
            datum = tinker.Datum(model_input=tinker.ModelInput.from_ints(ids[:-1]), loss_fn_inputs={"target_tokens": ids[1:]})
            for name, call in (("forward_backward, 1 datum of 7 tokens", lambda: tc.forward_backward([datum], "cross_entropy").result()),
                               ("sample, 1 x 16 tokens", lambda: sampler.sample(prompt, 1, tinker.SamplingParams(max_tokens=16, seed=2)).result())):
                lat = []
                for _ in range(100):
                    t = time.perf_counter()
                    call()
                    lat.append((time.perf_counter() - t) * 1e3)
                lat.sort()
                print(f"  {name:<40} p50 {lat[49]:7.2f}   p99 {lat[98]:7.2f}   (100 requests)")
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
