"""The Python SDK (clients/python/trill_client) against a small fake of trill serve.

The fake speaks just enough of docs/service.md to check what the SDK sends (bodies, the Bearer
header, long-poll waits) and how it reads the answers (results, errors, pending futures). It
needs no model and no GPU, runs in a few seconds and stops its servers itself:

    python3 tests/service/test_sdk_mock.py
"""

import asyncio
import json
import os
import sys
import threading
import time
import unittest
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from unittest import mock
from urllib.parse import parse_qs, urlsplit

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "clients", "python"))
import trill_client as tinker  # noqa: E402

KEY = "test-key"
MODEL = {"name": "tiny-moe", "architecture": "qwen3_moe", "vocab_size": 512, "n_moe_layers": 2,
         "experts_per_token": 2, "max_lora_rank": 64, "num_experts": 8}  # num_experts: not in the doc
os.environ["no_proxy"] = "127.0.0.1"  # the fake is local whatever proxy the environment names


class FakeServer:
    """trill serve's protocol over canned answers. Each future answers pending once, then its
    outcome; a future made with outcome None stays pending."""

    def __init__(self, listen=True):
        self.lock = threading.Lock()
        self.requests = []  # dicts: method, path, query, auth, body, raw
        self.futures = {}  # request id -> [polls so far, outcome]
        self.ids = 0
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler, bind_and_activate=False)
        self.httpd.fake = self
        self.httpd.server_bind()  # bound but not listening: connections are refused until start()
        self.url = "http://127.0.0.1:%d" % self.httpd.server_address[1]
        self.thread = None
        if listen:
            self.start()

    def start(self):
        self.httpd.server_activate()
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def stop(self):
        if self.thread is not None:
            self.httpd.shutdown()
        self.httpd.server_close()

    def next_id(self, prefix):
        with self.lock:
            self.ids += 1
            return "%s-%d" % (prefix, self.ids)

    def future(self, outcome):
        request_id = self.next_id("r")
        with self.lock:
            self.futures[request_id] = [0, outcome]
        return 200, {"request_id": request_id}

    def sent(self, method, path_end):
        """The bodies of the requests seen so far whose path ends with path_end."""
        with self.lock:
            return [r for r in self.requests if r["method"] == method and r["path"].endswith(path_end)]

    def route(self, method, path, query, body):
        parts = path.split("/")[3:]  # after /api/v1
        if method == "GET" and parts == ["models"]:
            return 200, {"models": [MODEL]}
        if method == "POST" and parts[:1] == ["models"] and parts[2:] == ["tokenize"]:
            special = [0] if body["add_special_tokens"] else []
            return 200, {"tokens": special + [ord(c) for c in body["text"]]}
        if method == "POST" and parts[:1] == ["models"] and parts[2:] == ["detokenize"]:
            return 200, {"text": "".join(chr(t) for t in body["tokens"])}
        if method == "POST" and parts == ["trainers"]:
            if body["base_model"] != MODEL["name"]:
                return 404, {"error": {"code": "not_found", "message": "no model " + body["base_model"]}}
            return 200, {"trainer_id": self.next_id("t"), "base_model": MODEL["name"],
                         "rank": body["rank"], "step": 0}
        if method == "POST" and parts == ["trainers", "from_state"]:
            if body["path"].startswith("trill://missing"):
                return 404, {"error": {"code": "not_found", "message": "no state " + body["path"]}}
            return 200, {"trainer_id": self.next_id("t"), "base_model": MODEL["name"], "rank": 8, "step": 5}
        if method == "GET" and parts[:1] == ["trainers"] and len(parts) == 2:
            return 200, {"trainer_id": parts[1], "base_model": MODEL["name"], "rank": 8, "step": 3,
                         "lora_config": {"rank": 8, "train_mlp": True}}
        if method == "POST" and parts[:1] == ["trainers"] and len(parts) == 3:
            return self.future(self.trainer_outcome(parts[1], parts[2], body))
        if method == "POST" and parts == ["samplers"]:
            return 200, {"sampler_id": self.next_id("s")}
        if method == "POST" and parts[:1] == ["samplers"] and parts[2:] == ["sample"]:
            last = body["prompt"][-1]
            sequences = [{"tokens": [last + 1 + i, 7], "logprobs": [-0.25, -0.5], "stop_reason": "length",
                          "routed_experts": [0, 1] * 4} for i in range(body["num_samples"])]
            return self.future({"status": "done", "result": {"sequences": sequences}})
        if method == "POST" and parts[:1] == ["samplers"] and parts[2:] == ["compute_logprobs"]:
            logprobs = [None] + [-1.5] * (len(body["prompt"]) - 1)
            return self.future({"status": "done", "result": {"logprobs": logprobs}})
        if method == "POST" and parts[:1] == ["models"] and parts[2:] == ["apply_chat_template"]:
            text = "".join(f"<{m['role']}>{m['content']}" for m in body["messages"]) + ("<assistant>" if body["add_generation_prompt"] else "")
            return 200, {"text": text, "tokens": [ord(c) for c in text]}
        if method == "GET" and parts[:1] == ["futures"] and len(parts) == 2:
            return self.poll(parts[1], query)
        return 404, {"error": {"code": "not_found", "message": "no route " + path}}

    def trainer_outcome(self, trainer_id, op, body):
        if op in ("forward", "forward_backward"):
            if body["loss_fn"] == "boom":
                return {"status": "error", "error": {"code": "failed", "message": "loss went boom"}}
            if body["loss_fn"] == "slow":
                return None
            outputs = [{"logprobs": [-0.5 - 0.125 * i for i in range(len(d["model_input"]))]}
                       for d in body["data"]]
            result = {"loss_fn_output_type": "scalar", "loss_fn_outputs": outputs,
                      "metrics": {"loss:sum": 1.5}}
        elif op == "optim_step":
            lr = body["adam_params"]["learning_rate"]
            result = {"metrics": {"step": 1, "grad_norm": 0.25, "learning_rate": lr}}
        elif op == "save_state":
            result = {"path": "trill://%s/%s" % (trainer_id, body["name"])}
        elif op == "save_weights_for_sampler":
            result = {"path": "trill://%s/sampler/%s" % (trainer_id, body["name"])}
        elif op == "load_state":
            result = {"step": 5}
        else:
            return {"status": "error", "error": {"code": "bad_request", "message": "no op " + op}}
        return {"status": "done", "result": result}

    def poll(self, request_id, query):
        wait = int(query["wait"][0])
        if not 0 <= wait <= 60:
            return 400, {"error": {"code": "bad_request", "message": "wait"}}
        with self.lock:
            entry = self.futures.get(request_id)
            if entry is None:
                return 404, {"error": {"code": "not_found", "message": "no future " + request_id}}
            entry[0] += 1
            polls, outcome = entry
        if polls == 1 or outcome is None:
            if outcome is None:
                time.sleep(0.05)  # a bounded stand-in for waiting `wait` seconds
            return 200, {"status": "pending"}
        return 200, outcome


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        self.handle_call("GET")

    def do_POST(self):
        self.handle_call("POST")

    def handle_call(self, method):
        fake = self.server.fake
        url = urlsplit(self.path)
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = json.loads(raw) if raw else None
        with fake.lock:
            fake.requests.append({"method": method, "path": url.path, "query": parse_qs(url.query),
                                  "auth": self.headers.get("Authorization"), "body": body, "raw": raw})
        if self.headers.get("Authorization") != "Bearer " + KEY:
            status, answer = 401, {"error": {"code": "unauthorized", "message": "bad key"}}
        else:
            status, answer = fake.route(method, url.path, parse_qs(url.query), body)
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class FakeArray:
    """Quacks like a 1-D numpy array: Datum must take one without numpy installed."""

    def __init__(self, values, dtype):
        self.values, self.dtype, self.shape = values, dtype, (len(values),)

    def reshape(self, *shape):
        return self

    def tolist(self):
        return list(self.values)


class FakeTensor(FakeArray):
    """Quacks like a torch tensor."""

    def detach(self):
        return self


def make_datum(n=3, first=1):
    tokens = list(range(first, first + n))
    return tinker.Datum(
        model_input=tinker.ModelInput.from_ints(tokens),
        loss_fn_inputs={"target_tokens": tokens[1:] + [tokens[-1] + 1], "weights": [1.0] * n})


class SdkTest(unittest.TestCase):
    def setUp(self):
        self.fake = FakeServer()
        self.addCleanup(self.fake.stop)
        self.client = tinker.ServiceClient(self.fake.url, KEY, timeout=5)

    def test_env_defaults_bearer_and_capabilities(self):
        env = {"TRILL_BASE_URL": self.fake.url, "TRILL_API_KEY": KEY}
        with mock.patch.dict(os.environ, env):
            caps = tinker.ServiceClient().get_server_capabilities()
        model = caps.supported_models[0]
        self.assertEqual((model.model_name, model.max_lora_rank, model.n_moe_layers), ("tiny-moe", 64, 2))
        self.assertEqual(model.num_experts, 8)
        self.assertEqual(self.fake.sent("GET", "/api/v1/models")[0]["auth"], "Bearer test-key")

    def test_http_errors_raise_trill_error(self):
        with self.assertRaises(tinker.TrillError) as caught:
            tinker.ServiceClient(self.fake.url, "wrong-key").get_server_capabilities()
        self.assertEqual((caught.exception.code, caught.exception.status), ("unauthorized", 401))
        with self.assertRaises(tinker.TrillError) as caught:
            self.client.create_lora_training_client("no-such-model")
        self.assertEqual((caught.exception.code, caught.exception.status), ("not_found", 404))
        with self.assertRaises(tinker.TrillError) as caught:
            self.client.create_training_client_from_state("trill://missing/x")
        self.assertEqual(caught.exception.code, "not_found")

    def test_create_trainer_omits_none(self):
        self.client.create_lora_training_client("tiny-moe", rank=8, train_unembed=False)
        self.client.create_lora_training_client("tiny-moe", seed=0)
        first, second = (r["body"] for r in self.fake.sent("POST", "/api/v1/trainers"))
        self.assertEqual(first, {"base_model": "tiny-moe", "rank": 8, "train_mlp": True,
                                 "train_attn": True, "train_unembed": False})
        self.assertEqual((second["seed"], second["rank"]), (0, 32))

    def test_forward_backward_body_and_result(self):
        trainer = self.client.create_lora_training_client("tiny-moe", rank=8)
        self.assertTrue(trainer.trainer_id.startswith("t-"))
        datum = tinker.Datum(
            model_input=tinker.ModelInput.from_ints([1, 2]).append_int(3),
            loss_fn_inputs={
                "target_tokens": FakeTensor([2, 3, 4], "torch.int64"),
                "weights": [0.1 + 0.2, 1.0, 0.0],
                "advantages": FakeArray([0.5, -0.25, 1e-30], "float32"),
                "logprobs": tinker.TensorData([-1.0, -2.0, -3.0], "float32", [3]),
                "routed_experts": [[[0, 1], [1, 0]], [[2, 3], [3, 2]], [[0, 2], [1, 3]]],
            })
        self.assertEqual(datum.loss_fn_inputs["routed_experts"].shape, [3, 2, 2])
        self.assertEqual(datum.loss_fn_inputs["target_tokens"].dtype, "int64")
        self.assertEqual(datum.loss_fn_inputs["advantages"].dtype, "float32")
        future = trainer.forward_backward([datum], "ppo", {"clip_low_threshold": 0.75})
        self.assertTrue(future.request_id.startswith("r-"))
        sent = self.fake.sent("POST", "/forward_backward")[0]
        self.assertEqual(sent["body"], {
            "data": [{"model_input": [1, 2, 3],
                      "loss_fn_inputs": {"target_tokens": [2, 3, 4],
                                         "weights": [0.30000000000000004, 1.0, 0.0],
                                         "advantages": [0.5, -0.25, 1e-30], "logprobs": [-1.0, -2.0, -3.0],
                                         "routed_experts": [0, 1, 1, 0, 2, 3, 3, 2, 0, 2, 1, 3]}}],
            "loss_fn": "ppo", "loss_fn_config": {"clip_low_threshold": 0.75}})
        self.assertIn(b"0.30000000000000004", sent["raw"])  # floats are sent unrounded
        output = future.result(timeout=5)
        self.assertEqual(output.loss_fn_outputs[0]["logprobs"].tolist(), [-0.5, -0.625, -0.75])
        self.assertEqual((output.loss_fn_output_type, output.metrics), ("scalar", {"loss:sum": 1.5}))
        polls = self.fake.sent("GET", "/futures/" + future.request_id)
        self.assertEqual(len(polls), 2)  # pending once, then done
        self.assertTrue(all(0 < int(p["query"]["wait"][0]) <= 30 for p in polls))
        self.assertIs(future.result(), output)  # kept: no third poll
        self.assertEqual(len(self.fake.sent("GET", "/futures/" + future.request_id)), 2)
        trainer.forward([make_datum()], "cross_entropy").result(timeout=5)
        self.assertNotIn("loss_fn_config", self.fake.sent("POST", "/forward")[0]["body"])

    def test_error_future_and_timeout(self):
        trainer = self.client.create_lora_training_client("tiny-moe")
        future = trainer.forward_backward([make_datum()], "boom")
        for _ in range(2):  # the error is kept too
            with self.assertRaises(tinker.TrillError) as caught:
                future.result(timeout=5)
            self.assertEqual((caught.exception.code, caught.exception.message, caught.exception.status),
                             ("failed", "loss went boom", None))
        slow = trainer.forward_backward([make_datum()], "slow")
        start = time.monotonic()
        with self.assertRaises(TimeoutError):
            slow.result(timeout=0.3)
        self.assertLess(time.monotonic() - start, 2)
        self.assertEqual(self.fake.sent("GET", "/futures/" + slow.request_id)[0]["query"]["wait"], ["1"])

    def test_trainer_calls(self):
        trainer = self.client.create_lora_training_client("tiny-moe", rank=8)
        step = trainer.optim_step(tinker.AdamParams(learning_rate=3e-4)).result(timeout=5)
        self.assertEqual(step.metrics["learning_rate"], 3e-4)
        self.assertEqual(self.fake.sent("POST", "/optim_step")[0]["body"], {"adam_params": {
            "learning_rate": 3e-4, "beta1": 0.9, "beta2": 0.95, "eps": 1e-12, "weight_decay": 0.0,
            "grad_clip_norm": 0.0}})
        saved = trainer.save_state("step-1").result(timeout=5)
        self.assertEqual(saved.path, "trill://%s/step-1" % trainer.trainer_id)
        self.assertEqual(trainer.load_state(saved.path).result(timeout=5).step, 5)
        trainer.load_state_with_optimizer(saved.path).result(timeout=5)
        self.assertEqual([r["body"] for r in self.fake.sent("POST", "/load_state")],
                         [{"path": saved.path, "with_optimizer": False},
                          {"path": saved.path, "with_optimizer": True}])
        resumed = self.client.create_training_client_from_state_with_optimizer(saved.path)
        self.client.create_training_client_from_state(saved.path)
        from_state = self.fake.sent("POST", "/trainers/from_state")
        self.assertEqual([r["body"]["with_optimizer"] for r in from_state], [True, False])
        info = resumed.get_info()
        self.assertEqual((info.trainer_id, info.base_model, info.lora_rank, info.step),
                         (resumed.trainer_id, "tiny-moe", 8, 3))
        self.assertEqual(info.model_data.model_name, "tiny-moe")
        tokenizer = trainer.get_tokenizer()
        self.assertEqual(tokenizer.encode("hi"), [104, 105])
        self.assertEqual(tokenizer.decode([104, 105]), "hi")
        self.assertEqual(self.fake.sent("POST", "/models/tiny-moe/tokenize")[0]["body"],
                         {"text": "hi", "add_special_tokens": False})
        self.assertEqual(self.fake.sent("POST", "/models/tiny-moe/detokenize")[0]["body"],
                         {"tokens": [104, 105]})
        sampler = trainer.save_weights_and_get_sampling_client("final")
        self.assertTrue(sampler.sampler_id.startswith("s-"))
        self.assertEqual(self.fake.sent("POST", "/api/v1/samplers")[0]["body"],
                         {"model_path": "trill://%s/sampler/final" % trainer.trainer_id})

    def test_cookbook_signatures(self):
        """What tinker-cookbook's recipes call: TINKER_* variables, user_metadata, saves without a
        name and with ttl_seconds, types.tensor_data.TensorData, get_tokenizer().apply_chat_template."""
        with mock.patch.dict(os.environ, {"TINKER_BASE_URL": self.fake.url, "TINKER_API_KEY": KEY}, clear=False):
            for name in ("TRILL_BASE_URL", "TRILL_API_KEY"):
                os.environ.pop(name, None)
            client = tinker.ServiceClient()
            trainer = client.create_lora_training_client("tiny-moe", rank=8, user_metadata={"run": "x"})
        self.assertNotIn("user_metadata", self.fake.sent("POST", "/api/v1/trainers")[0]["body"])
        first = trainer.save_state().result(timeout=5)
        second = trainer.save_weights_for_sampler(ttl_seconds=60).result(timeout=5)
        bodies = [r["body"] for r in self.fake.sent("POST", "/save_state") + self.fake.sent("POST", "/save_weights_for_sampler")]
        self.assertTrue(bodies[0]["name"].startswith("state-") and "ttl_seconds" not in bodies[0], bodies[0])
        self.assertTrue(bodies[1]["name"].startswith("sampler-") and bodies[1]["ttl_seconds"] == 60, bodies[1])
        self.assertNotEqual(first.path, second.path)
        trainer.save_weights_and_get_sampling_client()
        from trill_client.types.tensor_data import TensorData
        self.assertIs(TensorData, tinker.types.TensorData)
        tok = trainer.get_tokenizer()
        convo = [{"role": "user", "content": "hi"}]
        self.assertEqual(tok.apply_chat_template(convo, add_generation_prompt=True, tokenize=False), "<user>hi<assistant>")
        self.assertEqual(tok.apply_chat_template(convo), [ord(c) for c in "<user>hi"])
        self.assertEqual(self.fake.sent("POST", "/apply_chat_template")[0]["body"], {"messages": convo, "add_generation_prompt": True})

    def test_sampling(self):
        sampler = self.client.create_sampling_client(base_model="tiny-moe")
        self.assertEqual(self.fake.sent("POST", "/api/v1/samplers")[0]["body"], {"base_model": "tiny-moe"})
        prompt = tinker.ModelInput.from_ints([5, 6, 7])
        response = sampler.sample(prompt, 2, tinker.SamplingParams(max_tokens=4, seed=0)).result(timeout=5)
        self.assertEqual(self.fake.sent("POST", "/sample")[0]["body"], {
            "prompt": [5, 6, 7], "num_samples": 2,
            "sampling_params": {"max_tokens": 4, "seed": 0, "temperature": 1.0, "top_k": -1, "top_p": 1.0}})
        self.assertEqual([s.tokens for s in response.sequences], [[8, 7], [9, 7]])
        first = response.sequences[0]
        self.assertEqual((first.logprobs, first.stop_reason, first.routed_experts),
                         ([-0.25, -0.5], "length", [0, 1, 0, 1, 0, 1, 0, 1]))
        sampler.sample(prompt, sampling_params=tinker.SamplingParams(stop=["\n"])).result(timeout=5)
        self.assertEqual(self.fake.sent("POST", "/sample")[1]["body"]["sampling_params"]["stop"], ["\n"])
        self.assertEqual(sampler.compute_logprobs(prompt).result(timeout=5), [None, -1.5, -1.5])
        with self.assertRaises(ValueError):
            self.client.create_sampling_client()

    def test_async_variants(self):
        async def loop():
            trainer = await self.client.create_lora_training_client_async("tiny-moe", rank=4)
            future = await trainer.forward_backward_async([make_datum(4)], "cross_entropy")
            self.assertIsInstance(future, tinker.APIFuture)
            output = await future
            step = await (await trainer.optim_step_async(tinker.AdamParams())).result_async(timeout=5)
            sampler = await self.client.create_sampling_client_async(base_model="tiny-moe")
            prompt = tinker.ModelInput.from_ints([1, 2])
            response, logprobs = await asyncio.gather(sampler.sample_async(prompt, 3),
                                                      sampler.compute_logprobs_async(prompt))
            caps = await self.client.get_server_capabilities_async()
            return output, step, response, logprobs, caps

        output, step, response, logprobs, caps = asyncio.run(loop())
        self.assertEqual(len(output.loss_fn_outputs[0]["logprobs"].data), 4)
        self.assertEqual(step.metrics["step"], 1)
        self.assertEqual((len(response.sequences), logprobs), (3, [None, -1.5]))
        self.assertEqual(caps.supported_models[0].model_name, "tiny-moe")

    def test_threads_share_one_client(self):
        trainer = self.client.create_lora_training_client("tiny-moe")
        sampler = self.client.create_sampling_client(base_model="tiny-moe")
        results, errors = {}, []

        def work(k):
            try:
                for _ in range(3):
                    datum = make_datum(n=k + 1, first=10 * k + 1)
                    future = trainer.forward_backward([datum], "cross_entropy")
                    output = future.result(timeout=5)
                    response = sampler.sample(tinker.ModelInput.from_ints([k]), 1).result(timeout=5)
                    results.setdefault(k, []).append(
                        (future.request_id, len(output.loss_fn_outputs[0]["logprobs"].data),
                         response.sequences[0].tokens[0]))
            except Exception as e:  # reported below, in the main thread
                errors.append(e)

        threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        self.assertEqual(errors, [])
        for k in range(8):
            self.assertEqual([(n, first) for _, n, first in results[k]], [(k + 1, k + 1)] * 3)
        request_ids = [rid for rows in results.values() for rid, _, _ in rows]
        self.assertEqual(len(set(request_ids)), 24)

    def test_long_poll_retries_while_server_restarts(self):
        restarting = FakeServer(listen=False)
        self.addCleanup(restarting.stop)
        client = tinker.ServiceClient(restarting.url, KEY, timeout=5)
        with self.assertRaises(tinker.TrillError) as caught:  # only the long-poll retries
            client.create_lora_training_client("tiny-moe")
        self.assertEqual((caught.exception.code, caught.exception.status), ("unreachable", None))
        _, answer = restarting.future({"status": "done", "result": {"path": "trill://t-1/x"}})
        future = tinker.APIFuture(client._http, answer["request_id"], tinker.SaveWeightsResponse.from_wire)
        with mock.patch.object(tinker.APIFuture, "RETRY_DELAYS_S", (0.01, 0.01)):
            with self.assertRaises(tinker.TrillError) as caught:
                future.result(timeout=5)
            self.assertEqual(caught.exception.code, "unreachable")
        threading.Timer(0.2, restarting.start).start()
        with mock.patch.object(tinker.APIFuture, "RETRY_DELAYS_S", (0.1,) * 20):
            self.assertEqual(future.result(timeout=5).path, "trill://t-1/x")


if __name__ == "__main__":
    unittest.main()
