"""GRPO on the demo task with the official Tinker SDK (`pip install tinker`), pointed at trill serve:
examples/service/rl.py's loop (32 prompts x 8 completions a step, group-normalised rewards, one
PPO step on LoRA adapters) written against `tinker` itself, as a Tinker user writes it. The demo
model's tokenizer is read through trill serve's tokenize route (the SDK's get_tokenizer() loads a
Hugging Face tokenizer with `transformers`, which this example does not need). No router replay:
the official protocol has no field for the sampler's routed experts.

    build/trill serve --models demo --state run/serve &
    TINKER_BASE_URL=http://127.0.0.1:8100 TINKER_API_KEY=$(cat run/serve/default.key) \
        python3 examples/tinker_sdk/rl.py --steps 50"""

import argparse
import json
import os
import statistics
import sys
import time
import urllib.request

import tinker
from tinker import types

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "service"))
from addition import correct, held_out, problems  # noqa: E402  (the task, no client code)


class Tokenizer:
    """encode / decode through POST /api/v1/models/MODEL/tokenize and /detokenize."""

    def __init__(self, url, key, model):
        self.url, self.key, self.model = url.rstrip("/"), key, model
        self.eos = set(self._call("GET", "/api/v1/models")["models"][0]["eos_token_ids"])

    def _call(self, method, path, body=None):
        req = urllib.request.Request(self.url + path, method=method, data=json.dumps(body).encode() if body is not None else None,
                                     headers={"X-API-Key": self.key, "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.load(r)

    def encode(self, text):
        return self._call("POST", f"/api/v1/models/{self.model}/tokenize", {"text": text})["tokens"]

    def texts(self, sequences):
        ids = [[t for t in s.tokens if t not in self.eos] for s in sequences]
        return self._call("POST", f"/api/v1/models/{self.model}/detokenize", {"tokens": ids})["texts"] if ids else []


def group_advantages(rewards):
    mean = statistics.fmean(rewards)
    std = statistics.stdev(rewards) if len(rewards) > 1 else 0.0
    return [(r - mean) / (std + 1e-6) for r in rewards]


def evaluate(sampler, tok, items, k=8):
    params = types.SamplingParams(max_tokens=8, temperature=1.0, seed=7)
    futures = [sampler.sample(types.ModelInput.from_ints(tok.encode(p)), k, params) for p, _ in items]
    hits = [[correct(t, a) for t in tok.texts(f.result().sequences)] for f, (_, a) in zip(futures, items)]
    return sum(sum(h) / k for h in hits) / len(items), sum(any(h) for h in hits) / len(items)


def rl_step(trainer, sampler, tok, batch, step, args, adam):
    prompts = [tok.encode(p) for p, _ in batch]
    params = types.SamplingParams(max_tokens=8, temperature=1.0, seed=args.seed * 1_000_003 + step)
    futures = [sampler.sample(types.ModelInput.from_ints(ids), args.samples, params) for ids in prompts]
    data, rewards, n_tokens = [], [], 0
    for ids, (_, answer), future in zip(prompts, batch, futures):
        seqs = future.result().sequences
        r = [1.0 if correct(t, answer) else 0.0 for t in tok.texts(seqs)]
        rewards += r
        n_tokens += sum(len(s.tokens) for s in seqs)
        for s, a in zip(seqs, group_advantages(r)):
            pad = [0.0] * (len(ids) - 1)
            data.append((ids + list(s.tokens), pad + list(s.logprobs), pad + [a] * len(s.tokens)))
    batch_data = [types.Datum(model_input=types.ModelInput.from_ints(full[:-1]),
                              loss_fn_inputs={"target_tokens": full[1:], "logprobs": q, "advantages": [x / n_tokens for x in adv]})
                  for full, q, adv in data if any(adv)]
    if batch_data:
        trainer.forward_backward(batch_data, "ppo", {"clip_low_threshold": 0.8, "clip_high_threshold": 1.28})
        trainer.optim_step(adam)
    return trainer.save_weights_and_get_sampling_client(), rewards


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="demo")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--eval-prompts", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--log-every", type=int, default=10)
    args = ap.parse_args()
    url = os.environ.get("TINKER_BASE_URL", "http://127.0.0.1:8100")
    t0 = time.monotonic()
    svc = tinker.ServiceClient(base_url=url)  # the key: TINKER_API_KEY
    trainer = svc.create_lora_training_client(base_model=args.model, rank=args.rank, seed=args.seed)
    tok = Tokenizer(url, os.environ["TINKER_API_KEY"], args.model)
    sampler = trainer.save_weights_and_get_sampling_client()
    evals = held_out(args.eval_prompts)
    before = evaluate(sampler, tok, evals)
    print(f"held-out before: pass@1 {before[0]:.3f}, pass@8 {before[1]:.3f}", flush=True)
    stream = problems(args.seed + 1, args.steps * args.prompts)
    adam = types.AdamParams(learning_rate=args.lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0, grad_clip_norm=1.0)
    for step in range(args.steps):
        sampler, rewards = rl_step(trainer, sampler, tok, stream[step * args.prompts:(step + 1) * args.prompts], step, args, adam)
        if (step + 1) % args.log_every == 0 or step + 1 == args.steps:
            print(f"step {step + 1}/{args.steps}: reward {statistics.fmean(rewards):.3f}, {time.monotonic() - t0:.0f} s", flush=True)
    after = evaluate(sampler, tok, evals)
    print(f"held-out after: pass@1 {after[0]:.3f}, pass@8 {after[1]:.3f}")
    print(f"pass@1 gain {100 * (after[0] - before[0]):+.1f} points in {args.steps} steps, {time.monotonic() - t0:.0f} s")


if __name__ == "__main__":
    main()
