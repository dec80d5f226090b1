#!/usr/bin/python3
"""Reward-model parity: trill_reward_model (C) against a float64 PyTorch reference.

A reward model is a Hugging Face Qwen3ForSequenceClassification /
Qwen3MoeForSequenceClassification checkpoint with one label: the causal LM's
`model.*` tensors, and `score.weight` [num_labels, hidden] (no bias) instead of
`lm_head.weight`. Written from HF's definition (transformers
GenericForSequenceClassification.forward): logits = score(last_hidden_state),
where last_hidden_state is the output of the final norm; pooled_logits = logits
at each row's rightmost token != config.pad_token_id (argmax of index * mask,
so 0 when every token is pad), or at the last token when the config has no
pad_token_id. num_labels is len(id2label) (PretrainedConfig). The body is
qwen3_ref.py's Model (the same independent reference the LM parity uses); only
its lm_head is swapped for the score head here.

Subcommands:

  make-model --out DIR --seed N --dtype f32|bf16 [--shards K] [--pad-token-id ID]
             [--std S] [--score-std S] [--set key=value ...]
      Write a random classifier checkpoint (config.json with "architectures"
      [...ForSequenceClassification] and id2label {"0": "LABEL_0"}, weights with
      HF names, score.weight) and the character-level tokenizer.json trill init
      writes ("<|endoftext|>" 0, "<unk>" 1, "\\n" 2, printable ASCII c at c - 29).

  score --model DIR --input IN.jsonl --output OUT.jsonl
      For each line {"text": ...} write {"tokens": [...], "score": float64}.

  check --tool PATH/TO/reward_model_tool
      Builds several checkpoints (MoE and dense, f32 and bf16, sharded, tied
      embeddings, GQA, a pad_token_id with texts ending in pad tokens), scores
      the same texts with the reference and with the C tool (all texts in packed
      batches), and requires |c - ref| <= 1e-4 * max(|ref|, 1) for every text.
      Exit 0 when every case passes.
"""

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import qwen3_ref as ref  # noqa: E402

CLASSIFIER = {"qwen3": "Qwen3ForSequenceClassification", "qwen3_moe": "Qwen3MoeForSequenceClassification"}
EOT, UNK = "<|endoftext|>", "<unk>"
TOLERANCE = 1e-4


# ---------------------------------------------------------------------------
# Tokenizer: the character-level WordLevel tokenizer of `trill init`
# ---------------------------------------------------------------------------

def char_vocab():
    vocab = {EOT: 0, UNK: 1, "\n": 2}
    for c in range(32, 127):
        vocab[chr(c)] = 3 + c - 32
    return vocab


def tokenizer_json():
    def added(i, content):
        return {"id": i, "content": content, "single_word": False, "lstrip": False,
                "rstrip": False, "normalized": False, "special": True}
    return {"version": "1.0", "truncation": None, "padding": None,
            "added_tokens": [added(0, EOT), added(1, UNK)], "normalizer": None,
            "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "[\\s\\S]"},
                              "behavior": "Isolated", "invert": False},
            "post_processor": None,
            "model": {"type": "WordLevel", "vocab": char_vocab(), "unk_token": UNK},
            "decoder": {"type": "Fuse"}}


def tokenize(text):
    """HF order: the added tokens are matched first, then one id per character."""
    vocab, ids, i = char_vocab(), [], 0
    while i < len(text):
        for special in (EOT, UNK):
            if text.startswith(special, i):
                ids.append(vocab[special])
                i += len(special)
                break
        else:
            ids.append(vocab.get(text[i], vocab[UNK]))
            i += 1
    return ids


# ---------------------------------------------------------------------------
# Checkpoint
# ---------------------------------------------------------------------------

def make_reward_model(out, seed, dtype, shards=1, pad_token_id=None, std=0.1, score_std=1.0, overrides=None):
    overrides = dict(overrides or {})
    overrides.setdefault("vocab_size", 128)  # the tokenizer's 98 ids fit
    cfg = ref.build_config(overrides, dtype)
    cfg["architectures"] = [CLASSIFIER[cfg["model_type"]]]
    cfg["id2label"] = {"0": "LABEL_0"}
    cfg["label2id"] = {"LABEL_0": 0}
    if pad_token_id is not None:
        cfg["pad_token_id"] = pad_token_id
    # the causal LM's body; the score head replaces lm_head (tie_word_embeddings never ties it)
    tensors = [(n, t) for n, t in ref.make_weights(cfg, seed, std) if n != "lm_head.weight"]
    g = torch.Generator().manual_seed(seed + 1000)
    tensors.append(("score.weight", torch.randn((1, cfg["hidden_size"]), generator=g, dtype=torch.float32) * score_std))
    st_dtype = {"f32": "F32", "bf16": "BF16"}[dtype]
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    with open(os.path.join(out, "tokenizer.json"), "w") as f:
        json.dump(tokenizer_json(), f, indent=2)
    if shards <= 1:
        ref.write_safetensors(os.path.join(out, "model.safetensors"), tensors, st_dtype)
    else:
        weight_map, total = {}, 0
        for i, shard in enumerate(ref.split_shards(tensors, shards, ref.ST_DTYPES[st_dtype][0])):
            fn = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
            total += ref.write_safetensors(os.path.join(out, fn), shard, st_dtype)
            weight_map.update({name: fn for name, _ in shard})
        with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    return cfg


# ---------------------------------------------------------------------------
# Reference score (float64)
# ---------------------------------------------------------------------------

class RewardModel(ref.Model):
    """qwen3_ref.Model with the score head in lm_head's place: forward() then leaves the
    final-normed hidden states [T, H] in self.hidden."""

    def __init__(self, model_dir):
        with open(os.path.join(model_dir, "config.json")) as f:
            cfg = json.load(f)
        if cfg.get("architectures") != [CLASSIFIER.get(cfg.get("model_type"))]:
            raise SystemExit(f"{model_dir}: not a Qwen3 sequence classifier: {cfg.get('architectures')}")
        labels = cfg.get("id2label")
        self.num_labels = len(labels) if labels is not None else cfg.get("num_labels", 2)
        self.pad = cfg.get("pad_token_id")
        weights = ref.load_weights(model_dir)
        if tuple(weights["score.weight"].shape) != (self.num_labels, cfg["hidden_size"]):
            raise SystemExit(f"{model_dir}: score.weight has shape {list(weights['score.weight'].shape)}")
        super().__init__(cfg=cfg, weights=weights)
        self.hidden = None

    def lin(self, x, name):
        if name == "lm_head":
            self.hidden = x
            return x @ self.W["score.weight"].T
        return super().lin(x, name)

    def pooled_index(self, tokens):
        if self.pad is None:
            return len(tokens) - 1
        return max((i for i, t in enumerate(tokens) if t != self.pad), default=0)

    def score(self, tokens):
        with torch.no_grad():
            self.forward(tokens)
            return (self.hidden[self.pooled_index(tokens)] @ self.W["score.weight"].T).tolist()


def reference_scores(model_dir, texts):
    rm = RewardModel(model_dir)
    out = []
    for text in texts:
        tokens = tokenize(text)
        if not tokens:
            raise SystemExit("an empty text has no token to score")
        out.append({"tokens": tokens, "score": rm.score(tokens)[0]})
    return out


# ---------------------------------------------------------------------------
# check
# ---------------------------------------------------------------------------

def make_texts(seed):
    rng = random.Random(seed)
    alphabet = [chr(c) for c in range(32, 127)] + ["\n"] * 4

    def rand_text(n):
        return "".join(rng.choice(alphabet) for _ in range(n))
    texts = [rand_text(n) for n in (1, 2, 7, 33, 64, 130, 257)]
    base = "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n"
    texts += [base, base + EOT, base + EOT + EOT, EOT, EOT + EOT + "x" + EOT, "a" + UNK + "b"]
    return texts


def relative_errors(ref_scores, c_scores):
    return [abs(c - r) / max(abs(r), 1.0) for r, c in zip(ref_scores, c_scores)]


def run_case(tool, work, name, texts, **model_args):
    d = os.path.join(work, name)
    make_reward_model(d, **model_args)
    want = [r["score"] for r in reference_scores(d, texts)]
    inp, outp = os.path.join(work, name + ".in.jsonl"), os.path.join(work, name + ".out.jsonl")
    with open(inp, "w") as f:
        for t in texts:
            f.write(json.dumps({"text": t}) + "\n")
    subprocess.run([tool, d, inp, outp], check=True)
    with open(outp) as f:
        got = [json.loads(line)["score"] for line in f if line.strip()]
    if len(got) != len(want):
        print(f"FAIL {name}: {len(got)} scores for {len(want)} texts")
        return False, want
    errs = relative_errors(want, got)
    worst = max(range(len(errs)), key=lambda i: errs[i])
    ok = errs[worst] <= TOLERANCE
    print(f"{'PASS' if ok else 'FAIL'} {name}: {len(texts)} texts, max |d score| / max(|ref|, 1) = {errs[worst]:.3g} "
          f"(text {worst}: ref {want[worst]:.9g}, trill {got[worst]:.9g})")
    return ok, want


def cmd_check(args):
    work = tempfile.mkdtemp(prefix="trill-rm-parity-")
    try:
        texts = make_texts(7)
        cases = [
            ("moe_f32", dict(seed=1, dtype="f32")),
            ("moe_bf16_sharded_pad", dict(seed=2, dtype="bf16", shards=3, pad_token_id=0,
                                          overrides={"norm_topk_prob": False})),
            ("dense_f32_tied", dict(seed=3, dtype="f32", overrides={"model_type": "qwen3", "tie_word_embeddings": True})),
            ("dense_bf16_gqa4_pad", dict(seed=4, dtype="bf16", pad_token_id=0,
                                         overrides={"model_type": "qwen3", "num_attention_heads": 8,
                                                    "num_key_value_heads": 2, "head_dim": 16})),
        ]
        passed = failed = 0
        for name, kw in cases:
            ok, want = run_case(args.tool, work, name, texts, **kw)
            if ok and kw.get("pad_token_id") == 0:
                # the reference itself: trailing pad tokens do not change the score
                b = 7  # base, base + EOT, base + EOT + EOT
                ok = all(abs(want[b + k] - want[b]) <= 1e-12 * max(abs(want[b]), 1.0) for k in (1, 2))
                if not ok:
                    print(f"FAIL {name}: reference scores differ with trailing pad tokens")
            passed, failed = passed + ok, failed + (not ok)
        # the comparison catches a perturbed score
        if max(relative_errors([2.0, -0.5], [2.0, -0.5 + 2e-4])) <= TOLERANCE:
            print("FAIL comparer self-test")
            failed += 1
        print(f"{passed} passed, {failed} failed")
        return 0 if failed == 0 else 1
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept {work}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    mm = sub.add_parser("make-model", help="write a random reward-model checkpoint + tokenizer.json")
    mm.add_argument("--out", required=True)
    mm.add_argument("--seed", type=int, required=True)
    mm.add_argument("--dtype", choices=["f32", "bf16"], required=True)
    mm.add_argument("--shards", type=int, default=1)
    mm.add_argument("--pad-token-id", type=int)
    mm.add_argument("--std", type=float, default=0.1)
    mm.add_argument("--score-std", type=float, default=1.0)
    mm.add_argument("--set", action="extend", nargs="+", metavar="KEY=VALUE")
    sc = sub.add_parser("score", help="float64 reference scores of a JSONL of texts")
    sc.add_argument("--model", required=True)
    sc.add_argument("--input", required=True)
    sc.add_argument("--output", required=True)
    ck = sub.add_parser("check", help="parity of reward_model_tool with the reference")
    ck.add_argument("--tool", required=True)
    ck.add_argument("--keep", action="store_true", help="keep the work folder")
    args = ap.parse_args(argv)
    if args.cmd == "make-model":
        make_reward_model(args.out, args.seed, args.dtype, args.shards, args.pad_token_id, args.std, args.score_std,
                          ref.parse_set(args.set))
        return 0
    if args.cmd == "score":
        texts = [json.loads(line)["text"] for line in open(args.input) if line.strip()]
        with open(args.output, "w") as f:
            for rec in reference_scores(args.model, texts):
                f.write(json.dumps(rec) + "\n")
        return 0
    return cmd_check(args)


if __name__ == "__main__":
    sys.exit(main())
