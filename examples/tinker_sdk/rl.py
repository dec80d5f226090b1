"""GRPO on the demo task with the official Tinker SDK (`pip install tinker`), pointed at trill serve:
examples/service/rl.py's loop (32 prompts x 8 completions a step, group-normalised rewards, one
PPO step on LoRA adapters) written against `tinker` itself, as a Tinker user writes it. The demo
model's tokenizer is read through trill serve's tokenize route (the SDK's get_tokenizer() loads a
Hugging Face tokenizer with `transformers`, which this example does not need: common.py). No router replay:
the official protocol has no field for the sampler's routed experts.

    build/trill serve --models demo --state run/serve &
    TINKER_BASE_URL=http://127.0.0.1:8100 TINKER_API_KEY=$(cat run/serve/default.key) \
        python3 examples/tinker_sdk/rl.py --steps 50"""

import argparse
import statistics
import time

import tinker
from tinker import types

from common import Tokenizer, evaluate, server
from addition import correct, held_out, problems  # noqa: E402  (examples/service's task; common puts it on the path)


def group_advantages(rewards):
    mean = statistics.fmean(rewards)
    std = statistics.stdev(rewards) if len(rewards) > 1 else 0.0
    return [(r - mean) / (std + 1e-6) for r in rewards]


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
    url, key = server()
    t0 = time.monotonic()
    svc = tinker.ServiceClient(base_url=url, api_key=key)
    trainer = svc.create_lora_training_client(base_model=args.model, rank=args.rank, seed=args.seed)
    tok = Tokenizer(url, key, args.model)
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
