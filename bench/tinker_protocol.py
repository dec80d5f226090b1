"""trill serve's official Tinker protocol (issue 37), through real HTTP on loopback, as its SDK
calls it (X-API-Key, protobuf forward_backward, retrieve_future):

1. retrieve_future latency p50/p99: of a request already done (the answer alone), and from
   submitting a one-datum forward_backward to its result through a held retrieve_future;
2. 200 concurrent long-polls (retrieve_future calls held on requests queued behind a long call)
   against an unrelated request's latency (get_info), next to the same request on an idle server.

Usage: python3 bench/tinker_protocol.py BUILD_DIR [--calls 400] [--polls 200] [--rounds 3]
Prints figures; never pass/fail. Each figure is taken `rounds` times; the median and the spread
are printed (the machine is shared and noisy)."""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "service"))
import tinker_wire  # noqa: E402  (the tests' protobuf writer)


class Server:
    def __init__(self, trill, work):
        model = os.path.join(work, "tiny")
        subprocess.run([trill, "init", "--out", model, "--preset", "tiny"], check=True, capture_output=True)
        state, port_file = os.path.join(work, "state"), os.path.join(work, "port")
        self.key = subprocess.run([trill, "serve", "keys", "add", "bench", "--state", state], check=True, capture_output=True,
                                  text=True).stdout.strip()
        self.proc = subprocess.Popen([trill, "serve", "--models", model, "--state", state, "--listen", "127.0.0.1:0", "--port-file", port_file,
                                      "--max-seconds", "3600", "--max-queued", "4096"], stderr=subprocess.DEVNULL)
        t = time.monotonic()
        while not os.path.exists(port_file):
            if self.proc.poll() is not None or time.monotonic() - t > 60:
                raise RuntimeError("trill serve did not start")
            time.sleep(0.05)
        with open(port_file) as f:
            self.url = f"http://127.0.0.1:{int(f.read())}/api/v1"

    def post(self, path, body=None, data=None, proto=False, timeout=60):
        headers = {"X-API-Key": self.key, "Content-Type": "application/x-protobuf" if data is not None else "application/json"}
        if proto:
            headers["Accept"] = "application/x-protobuf"
        req = urllib.request.Request(self.url + path, data=data if data is not None else json.dumps(body).encode(), headers=headers, method="POST")
        with urllib.request.urlopen(req, timeout=timeout) as r:
            text = r.read()
            return text if "protobuf" in r.headers.get("Content-Type", "") else json.loads(text)

    def result(self, request_id, proto=False):
        while True:
            answer = self.post("/retrieve_future", {"request_id": request_id}, proto=proto)
            if not (isinstance(answer, dict) and answer.get("type") == "try_again"):
                return answer

    def stop(self):
        self.proc.terminate()
        self.proc.wait()


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def datum(n, shift=0):
    ids = [(7 * i + shift) % 100 + 1 for i in range(n + 1)]  # within the tiny preset's vocabulary
    return (ids[:-1], {"target_tokens": ids[1:]})


def latencies(s, model, calls):
    """(done p50, p99, submit-to-result p50, p99) in ms."""
    fut = s.post("/forward_backward", data=tinker_wire.forward_backward_request(model, [datum(16)], "cross_entropy", forward_only=True))
    s.result(fut["request_id"], proto=True)
    done = []
    for _ in range(calls):
        t = time.perf_counter()
        s.post("/retrieve_future", {"request_id": fut["request_id"]}, proto=True)
        done.append(1e3 * (time.perf_counter() - t))
    e2e = []
    for k in range(calls // 4):
        t = time.perf_counter()
        f = s.post("/forward_backward", data=tinker_wire.forward_backward_request(model, [datum(16, k)], "cross_entropy", forward_only=True))
        s.result(f["request_id"], proto=True)
        e2e.append(1e3 * (time.perf_counter() - t))
    return pct(done, 0.5), pct(done, 0.99), pct(e2e, 0.5), pct(e2e, 0.99)


def unrelated(s, model, n=50):
    """get_info latencies in ms (n calls, one after another)."""
    out = []
    for _ in range(n):
        t = time.perf_counter()
        s.post("/get_info", {"model_id": model})
        out.append(1e3 * (time.perf_counter() - t))
    return out


def under_polls(s, model, busy, polls):
    """get_info p50/p99 while `polls` retrieve_future calls are held: requests queued on model
    `busy` behind a long forward_backward, each polled by a thread of its own."""
    long_call = [datum(1000, k) for k in range(48)]
    s.post("/forward_backward", data=tinker_wire.forward_backward_request(busy, long_call, "cross_entropy"))
    ids = [s.post("/forward_backward", data=tinker_wire.forward_backward_request(busy, [datum(4, k)], "cross_entropy", forward_only=True))["request_id"]
           for k in range(polls)]
    threads = [threading.Thread(target=s.result, args=(i, True)) for i in ids]
    for t in threads:
        t.start()
    time.sleep(0.5)  # the polls are in
    lat = unrelated(s, model)
    for t in threads:
        t.join()
    return lat


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("build")
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--polls", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="trill-bench-tinker-")
    s = Server(os.path.join(args.build, "trill"), work)
    try:
        session = s.post("/create_session", {"tags": [], "user_metadata": None, "sdk_version": "bench"})["session_id"]
        make = lambda: s.result(s.post("/create_model", {"session_id": session, "model_seq_id": 0, "base_model": "tiny"})["request_id"])["model_id"]  # noqa: E731
        model, busy = make(), make()
        figures = {"done": [], "done99": [], "e2e": [], "e2e99": [], "idle": [], "idle99": [], "polls": [], "polls99": []}
        for _ in range(args.rounds):
            d50, d99, e50, e99 = latencies(s, model, args.calls)
            idle = unrelated(s, model)
            held = under_polls(s, model, busy, args.polls)
            for k, v in (("done", d50), ("done99", d99), ("e2e", e50), ("e2e99", e99), ("idle", pct(idle, 0.5)), ("idle99", pct(idle, 0.99)),
                         ("polls", pct(held, 0.5)), ("polls99", pct(held, 0.99))):
                figures[k].append(v)

        def show(name, k):
            xs = figures[k]
            print(f"{name:58s} {statistics.median(xs):8.2f} ms   (rounds {', '.join(f'{x:.2f}' for x in xs)})")

        print(f"tiny preset, {args.rounds} rounds, {args.calls} calls a latency figure, {args.polls} held long-polls")
        show("retrieve_future of a finished request, p50", "done")
        show("retrieve_future of a finished request, p99", "done99")
        show("forward_backward (1 datum, 16 tokens) submit to result, p50", "e2e")
        show("forward_backward (1 datum, 16 tokens) submit to result, p99", "e2e99")
        show("get_info, idle server, p50", "idle")
        show("get_info, idle server, p99", "idle99")
        show(f"get_info, {args.polls} retrieve_future calls held, p50", "polls")
        show(f"get_info, {args.polls} retrieve_future calls held, p99", "polls99")
    finally:
        s.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
