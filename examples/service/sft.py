"""Supervised fine-tuning on the demo task through trill serve: prompt + answer sequences,
cross-entropy on the answer and the end-of-sequence token only (weights 0 on the prompt), one
AdamW step per batch, held-out accuracy before and after, the state saved at the end.

    build/trill serve --models demo --state run/serve &
    python3 examples/service/sft.py"""

import argparse
import time

from addition import connect, evaluate, held_out, problems, tinker


def datum(p, a, weight):
    """Input: prompt + answer but the last token; targets: the same shifted by one; the loss on the
    answer's tokens (each `weight`), none on the prompt's."""
    full = p + a
    return tinker.Datum(model_input=tinker.ModelInput.from_ints(full[:-1]),
                        loss_fn_inputs={"target_tokens": full[1:], "weights": [0.0] * (len(p) - 1) + [weight] * len(a)})


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url")
    ap.add_argument("--key-file", default="run/serve/default.key")
    ap.add_argument("--model", default="demo")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--eval-prompts", type=int, default=200)
    ap.add_argument("--eval-file", help="held-out prompts from a JSONL file (the demo's eval.jsonl compares with trill train)")
    args = ap.parse_args()

    t0 = time.monotonic()
    svc = connect(args.url, args.key_file)
    trainer = svc.create_lora_training_client(base_model=args.model, rank=args.rank, seed=0)
    tok = trainer.get_tokenizer()
    evals = held_out(args.eval_prompts, path=args.eval_file)
    before = evaluate(trainer.save_weights_and_get_sampling_client("sft-start"), tok, evals)
    print(f"held-out before: pass@1 {before[0]:.3f}, pass@8 {before[1]:.3f}")
    stream = problems(1, args.steps * args.batch)
    adam = tinker.AdamParams(learning_rate=args.lr, beta1=0.9, beta2=0.999, eps=1e-8)
    for step in range(args.steps):
        pairs = [(tok.encode(p), tok.encode(a) + [tok.eos_token_id]) for p, a in stream[step * args.batch:(step + 1) * args.batch]]
        n_loss = sum(len(a) for _, a in pairs)  # weights 1 / n_loss: the mean over the batch's answer tokens, not their sum
        fb = trainer.forward_backward([datum(p, a, 1.0 / n_loss) for p, a in pairs], "cross_entropy")
        trainer.optim_step(adam)  # queued behind forward_backward: one trainer's calls run in order
        if step % 10 == 9 or step == args.steps - 1:
            print(f"step {step + 1}/{args.steps}: loss {fb.result().metrics['loss:sum']:.4f} per answer token, {time.monotonic() - t0:.0f} s")
    after = evaluate(trainer.save_weights_and_get_sampling_client("sft-end"), tok, evals)
    print(f"held-out after: pass@1 {after[0]:.3f}, pass@8 {after[1]:.3f}")
    print(f"state: {trainer.save_state('sft-final').result().path} ({time.monotonic() - t0:.0f} s)")


if __name__ == "__main__":
    main()
