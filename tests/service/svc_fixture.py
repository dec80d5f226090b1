"""What the trill serve tests share: a model, servers on loopback bounded in time, datums, raw HTTP.

Every server listens on 127.0.0.1, any free port, and stops by itself after --max-seconds."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "clients", "python"))
import trill_client as tinker  # noqa: E402

DEADLINE_S = 120  # any one future


def slurp(path, mode="r"):
    with open(path, mode) as f:
        return f.read()


def make_model(trill, out, seed=3):
    """The tests' tiny MoE: hidden 64, 8 experts top-2, a byte-level tokenizer."""
    subprocess.run([trill, "init", "--out", out, "--preset", "tiny", "--set", "hidden_size=64", "--set", "intermediate_size=128",
                    "--set", "moe_intermediate_size=32", "--set", "head_dim=16", "--seed", str(seed)], check=True, capture_output=True)


class Server:
    """trill serve on a loopback port (a free one unless given), its log in LOG."""

    def __init__(self, trill, model, state, log, port=0, extra=(), max_seconds=600):
        port_file = state.rstrip("/") + ".port"
        if os.path.exists(port_file):
            os.remove(port_file)
        self.log_path = log
        self.log = open(log, "a")
        self.proc = subprocess.Popen([trill, "serve", "--models", model, "--state", state, "--listen", f"127.0.0.1:{port}",
                                      "--port-file", port_file, "--max-seconds", str(max_seconds), *extra],
                                     stderr=self.log, stdout=self.log)
        t = time.monotonic()
        while not os.path.exists(port_file):
            if self.proc.poll() is not None or time.monotonic() - t > 60:
                raise RuntimeError("trill serve did not start: " + slurp(log)[-2000:])
            time.sleep(0.02)
        self.port = int(slurp(port_file))
        self.url = f"http://127.0.0.1:{self.port}"
        self.stopping = False
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self):
        """Says so at once when the server ends by itself (a crash, a signal), with how."""
        code = self.proc.wait()
        if not self.stopping:
            how = f"signal {-code}" if code < 0 else f"exit status {code}"
            print(f"svc_fixture: trill serve (pid {self.proc.pid}) ended by itself: {how}; its log: {self.log_path}", file=sys.stderr, flush=True)

    def client(self, key):
        return tinker.ServiceClient(base_url=self.url, api_key=key)

    def stop(self, sig=signal.SIGTERM):
        self.stopping = True
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        self.proc.wait(timeout=60)
        self.log.close()
        return self.proc.returncode


def sequence_datum(tok, text, **inputs):
    ids = tok.encode(text)
    return tinker.Datum(model_input=tinker.ModelInput.from_ints(ids[:-1]),
                        loss_fn_inputs={"target_tokens": ids[1:], **{k: v(len(ids) - 1) for k, v in inputs.items()}})


def raw(url, method, path, body=None, key=None, data=None, timeout=60, header="Authorization", headers=None):
    """(status, answer) of one request to url/api/v1/path; the key in `header` (Authorization:
    Bearer KEY, or X-API-Key: KEY as the official Tinker SDK sends it). The answer: JSON, or the
    bytes of a protobuf one."""
    req = urllib.request.Request(url + "/api/v1" + path, method=method,
                                 data=data if data is not None else (None if body is None else json.dumps(body).encode()))
    if key:
        req.add_header(header, f"Bearer {key}" if header == "Authorization" else key)
    for name, value in (headers or {}).items():
        req.add_header(name, value)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            text = r.read()
            return r.status, text if "protobuf" in r.headers.get("Content-Type", "") else json.loads(text)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def clean_log(log):
    """No sanitizer or runtime-error report in a server's log."""
    text = slurp(log)
    assert "Sanitizer" not in text and "runtime error" not in text, text[-3000:]
