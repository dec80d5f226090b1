"""The embedded demo's task for the cookbook examples (trill/demo.h): two-digit addition.
A prompt "47+38=" asks for the sum; a completion is correct when its text before the first
newline, the end-of-sequence token dropped, is exactly the answer ("85")."""

import json
import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "clients", "python"))
import trill_client as tinker  # noqa: E402


def problems(seed, n):
    """n problems (prompt, answer), operands uniform in 0..99."""
    r = random.Random(seed)
    return [(f"{a}+{b}=", str(a + b)) for a, b in ((r.randrange(100), r.randrange(100)) for _ in range(n))]


def held_out(n=200, seed=10_000, path=None):
    """n distinct prompts, never drawn by the training streams' seeds; or the first n of a JSONL
    file of {"prompt", "answer"} (e.g. the demo's own eval.jsonl, to compare with trill train)."""
    if path:
        with open(path) as f:
            return [(x["prompt"], x["answer"]) for x in map(json.loads, f)][:n]
    seen, out, r = set(), [], random.Random(seed)
    while len(out) < n:
        a, b = r.randrange(100), r.randrange(100)
        if (a, b) not in seen:
            seen.add((a, b))
            out.append((f"{a}+{b}=", str(a + b)))
    return out


def connect(url=None, key_file=None):
    """A ServiceClient: TRILL_BASE_URL / TRILL_API_KEY, else the quick start's server and key file."""
    key = os.environ.get("TRILL_API_KEY")
    if not key and key_file and os.path.exists(key_file):
        with open(key_file) as f:
            key = f.read().strip()
    return tinker.ServiceClient(base_url=url, api_key=key)


def texts(tok, sequences):
    """Each sampled sequence's text, its end-of-sequence tokens dropped."""
    eos = set(tok.eos_token_ids)
    return tok.batch_decode([[t for t in s.tokens if t not in eos] for s in sequences])


def correct(text, answer):
    return text.split("\n")[0] == answer


def evaluate(sampler, tok, items, k=8, temperature=1.0, seed=7):
    """Held-out pass@1 (mean fraction of correct samples) and pass@k, k samples a prompt."""
    params = tinker.SamplingParams(max_tokens=8, temperature=temperature, seed=seed)
    futures = [sampler.sample(tinker.ModelInput.from_ints(tok.encode(p)), k, params) for p, _ in items]
    hits = [[correct(t, a) for t in texts(tok, f.result().sequences)] for f, (_, a) in zip(futures, items)]
    return sum(sum(h) / k for h in hits) / len(items), sum(any(h) for h in hits) / len(items)
