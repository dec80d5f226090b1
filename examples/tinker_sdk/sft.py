"""Supervised fine-tuning on the demo task with the official Tinker SDK (`pip install tinker`),
pointed at trill serve: examples/service/sft.py's loop (prompt + answer sequences, cross-entropy
on the answer and the end-of-sequence token, one AdamW step a batch) written against `tinker`
itself; the loss before and after, held-out accuracy before and after.

    build/trill serve --models demo --state run/serve &
    TINKER_BASE_URL=http://127.0.0.1:8100 TINKER_API_KEY=$(cat run/serve/default.key) \\
        python3 examples/tinker_sdk/sft.py --steps 50"""

import argparse
import time

import tinker
from tinker import types

from common import Tokenizer, evaluate, server
from addition import held_out, problems  # noqa: E402  (examples/service's task; common puts it on the path)


def datum(p, a, weight):
    """Input: prompt + answer but the last token; targets shifted by one; loss on the answer only."""
    full = p + a
    return types.Datum(model_input=types.ModelInput.from_ints(full[:-1]),
                       loss_fn_inputs={"target_tokens": full[1:], "weights": [0.0] * (len(p) - 1) + [weight] * len(a)})


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="demo")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--eval-prompts", type=int, default=200)
    args = ap.parse_args()
    url, key = server()
    t0 = time.monotonic()
    svc = tinker.ServiceClient(base_url=url, api_key=key)
    trainer = svc.create_lora_training_client(base_model=args.model, rank=args.rank, seed=0)
    tok = Tokenizer(url, key, args.model)
    eos = min(tok.eos)
    evals = held_out(args.eval_prompts)
    before = evaluate(trainer.save_weights_and_get_sampling_client(), tok, evals)
    print(f"held-out before: pass@1 {before[0]:.3f}, pass@8 {before[1]:.3f}", flush=True)
    stream = problems(1, args.steps * args.batch)
    adam = types.AdamParams(learning_rate=args.lr, beta1=0.9, beta2=0.999, eps=1e-8)
    first = last = 0.0
    for step in range(args.steps):
        pairs = [(tok.encode(p), tok.encode(a) + [eos]) for p, a in stream[step * args.batch:(step + 1) * args.batch]]
        n_loss = sum(len(a) for _, a in pairs)  # weights 1 / n_loss: the mean over the answer tokens
        fb = trainer.forward_backward([datum(p, a, 1.0 / n_loss) for p, a in pairs], "cross_entropy")
        trainer.optim_step(adam)  # submitted behind forward_backward: the loop waits for a result only when it prints one
        if step == 0:
            first = fb.result().metrics["loss:sum"]
        if step % 10 == 9 or step == args.steps - 1:
            last = fb.result().metrics["loss:sum"]
            print(f"step {step + 1}/{args.steps}: loss {last:.4f} per answer token, {time.monotonic() - t0:.0f} s", flush=True)
    after = evaluate(trainer.save_weights_and_get_sampling_client(), tok, evals)
    print(f"held-out after: pass@1 {after[0]:.3f}, pass@8 {after[1]:.3f}")
    print(f"loss {first:.4f} -> {last:.4f} per answer token over {args.steps} steps; state {trainer.save_state('sft-final').result().path}; "
          f"{time.monotonic() - t0:.0f} s")


if __name__ == "__main__":
    main()
