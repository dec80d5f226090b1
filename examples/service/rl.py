"""GRPO on the demo task through trill serve: the loop of `trill train`'s embedded demo, written
against the SDK (`import trill_client as tinker`). Each step samples 32 prompts x 8 completions
from the current policy, scores them, normalises rewards within each prompt's group, and takes
one PPO step on LoRA adapters, replaying the sampler's routed experts (router replay).

Quick start (README):  build/trill serve --models demo --state run/serve &
                       python3 examples/service/rl.py
Same budget as the demo: 300 steps; held-out pass@1 before and after, and the wall time."""

import argparse
import statistics
import time

from addition import connect, evaluate, held_out, problems, texts, correct, tinker


def group_advantages(rewards):
    """(r - mean) / (std + 1e-6), the unbiased std, as trill's GRPO (algo.std_norm)."""
    mean = statistics.fmean(rewards)
    std = statistics.stdev(rewards) if len(rewards) > 1 else 0.0
    return [(r - mean) / (std + 1e-6) for r in rewards]


def rl_step(trainer, sampler, tok, batch, step, args, adam):
    """Samples the batch's prompts, scores them, one PPO step; the new sampler, the rewards, and
    whether an optimizer step was taken."""
    prompts = [tok.encode(p) for p, _ in batch]
    params = tinker.SamplingParams(max_tokens=8, temperature=1.0, seed=args.seed * 1_000_003 + step)
    futures = [sampler.sample(tinker.ModelInput.from_ints(ids), args.samples, params) for ids in prompts]
    data, rewards, n_tokens = [], [], 0
    for ids, (_, answer), future in zip(prompts, batch, futures):
        seqs = future.result().sequences
        r = [1.0 if correct(t, answer) else 0.0 for t in texts(tok, seqs)]
        rewards += r
        n_tokens += sum(len(s.tokens) for s in seqs)
        for s, a in zip(seqs, group_advantages(r)):
            full = ids + s.tokens
            pad = [0.0] * (len(ids) - 1)  # prompt positions: no loss (advantage 0)
            data.append((full, pad + list(s.logprobs), pad + [a] * len(s.tokens), s.routed_experts))
    # token-mean over the step's completions, as the demo's loss: each advantage / tokens
    batch_data = [tinker.Datum(model_input=tinker.ModelInput.from_ints(full[:-1]),
                               loss_fn_inputs={"target_tokens": full[1:], "logprobs": q, "advantages": [x / n_tokens for x in adv],
                                               "routed_experts": experts})
                  for full, q, adv, experts in data if any(adv)]
    if batch_data:  # a step where every group was flat has no gradient
        trainer.forward_backward(batch_data, "ppo", {"clip_low_threshold": 0.8, "clip_high_threshold": 1.28})
        trainer.optim_step(adam)
    new = trainer.save_weights_and_get_sampling_client("policy")
    retire(sampler)
    return new, rewards, bool(batch_data)


def retire(sampler):
    """Deletes a sampler the loop is done with: each counts against the key's --max-samplers (64)
    until deleted. One a server restart lost is gone already."""
    try:
        sampler.delete()
    except tinker.TrillError as e:
        if e.code not in ("not_found", "unreachable"):
            raise


def resume(svc, trainer_id, updates, wait_s=120):
    """After a server restart: the trainer again (back at its last completed optimizer step), a
    sampler of its weights, and 1 if the interrupted step's update was among those, else 0."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            trainer = svc.get_training_client(trainer_id)
            return trainer, trainer.save_weights_and_get_sampling_client("policy"), trainer.get_info().step - updates
        except tinker.TrillError as e:
            if e.code not in ("server_restarted", "unreachable") or time.monotonic() > deadline:
                raise
            time.sleep(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", help="the server (default $TRILL_BASE_URL, else http://127.0.0.1:8100)")
    ap.add_argument("--key-file", default="run/serve/default.key", help="used when $TRILL_API_KEY is unset")
    ap.add_argument("--model", default="demo")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--lr", type=float, default=5e-4, help="the demo's 1e-3 at its LoRA scale 2; the service's alpha 32 gives rank 8 a scale of 4")
    ap.add_argument("--eval-prompts", type=int, default=200)
    ap.add_argument("--eval-file", help="held-out prompts from a JSONL file (the demo's eval.jsonl compares with trill train)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--log-every", type=int, default=10)
    args = ap.parse_args()

    t0 = time.monotonic()
    svc = connect(args.url, args.key_file)
    trainer = svc.create_lora_training_client(base_model=args.model, rank=args.rank, seed=args.seed)
    tok = trainer.get_tokenizer()
    sampler = trainer.save_weights_and_get_sampling_client("policy")
    evals = held_out(args.eval_prompts, path=args.eval_file)
    before = evaluate(sampler, tok, evals)
    print(f"held-out before: pass@1 {before[0]:.3f}, pass@8 {before[1]:.3f}")
    stream = problems(args.seed + 1, args.steps * args.prompts)
    adam = tinker.AdamParams(learning_rate=args.lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0, grad_clip_norm=1.0)
    step, updates = 0, 0  # updates: optimizer steps taken (a step whose groups were all flat takes none)
    while step < args.steps:
        try:
            sampler, rewards, updated = rl_step(trainer, sampler, tok, stream[step * args.prompts:(step + 1) * args.prompts], step, args, adam)
        except tinker.TrillError as e:  # the server restarted: it kept every completed optimizer step
            if e.code not in ("server_restarted", "unreachable"):
                raise
            print(f"step {step + 1}: the server restarted ({e.code}); continuing from its state")
            trainer, sampler, applied = resume(svc, trainer.trainer_id, updates)
            updates += applied
            step += applied  # this step's update survived: go on; else it is run again
            continue
        updates += updated
        step += 1
        if step % args.log_every == 0 or step == args.steps:
            print(f"step {step}/{args.steps}: reward {statistics.fmean(rewards):.3f}, {time.monotonic() - t0:.0f} s")
    after = evaluate(sampler, tok, evals)
    print(f"held-out after: pass@1 {after[0]:.3f}, pass@8 {after[1]:.3f}")
    print(f"pass@1 gain {100 * (after[0] - before[0]):+.1f} points in {args.steps} steps, {time.monotonic() - t0:.0f} s")


if __name__ == "__main__":
    main()
