#!/usr/bin/env python3
"""Higher or lower, as an environment process: trill's built-in `guess` written against the
JSON-lines protocol (README.md), turn for turn the same, so the two can be compared.

The secret is the task's "answer" when it is an integer, else the seed's draw in [0, 100). The
first observation is the task's "prompt"; each turn is read for its first integer: the secret
ends the episode with reward 1, another number is answered "higher\n" or "lower\n", a turn
without one "number?\n".
"""
import json
import re
import sys

episodes = {}  # episode id -> secret


def reset(req):
    task = req["task"]
    try:
        secret = int(task.get("answer", ""))
    except ValueError:
        secret = req["seed"] % 100
    episodes[req["episode"]] = secret
    return {"messages": [{"role": "user", "content": task.get("prompt") or "guess 0-99\n"}]}


def step(req):
    secret = episodes[req["episode"]]
    m = re.search(r"-?\d+", req["turn"])
    # the built-in's reading: a '-' counts only right before a digit
    if m is None:
        return {"messages": [{"role": "user", "content": "number?\n"}], "reward": 0, "done": False}
    guess = int(m.group())
    if guess == secret:
        return {"messages": [], "reward": 1, "done": True, "metrics": {"solved": 1}}
    return {"messages": [{"role": "user", "content": "higher\n" if guess < secret else "lower\n"}], "reward": 0, "done": False}


def end(req):
    episodes.pop(req["episode"], None)
    return {}


for line in sys.stdin:
    if not line.strip():
        continue
    req = json.loads(line)
    reply = {"reset": reset, "step": step, "end": end}[req["op"]](req)
    print(json.dumps(reply), flush=True)
