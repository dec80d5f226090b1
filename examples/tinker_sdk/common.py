"""What the official-SDK examples share: the demo model's tokenizer through trill serve's tokenize
routes (the SDK's get_tokenizer() needs `transformers`), and held-out evaluation on the demo task."""

import json
import os
import sys
import urllib.request

from tinker import types

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "service"))
from addition import correct  # noqa: E402  (the task, no client code)


def server():
    """TINKER_BASE_URL (default the quick start's server) and TINKER_API_KEY."""
    return os.environ.get("TINKER_BASE_URL", "http://127.0.0.1:8100"), os.environ["TINKER_API_KEY"]


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


def evaluate(sampler, tok, items, k=8):
    params = types.SamplingParams(max_tokens=8, temperature=1.0, seed=7)
    futures = [sampler.sample(types.ModelInput.from_ints(tok.encode(p)), k, params) for p, _ in items]
    hits = [[correct(t, a) for t in tok.texts(f.result().sequences)] for f, (_, a) in zip(futures, items)]
    return sum(sum(h) / k for h in hits) / len(items), sum(any(h) for h in hits) / len(items)
