#!/usr/bin/env python3
"""GSM8K with a calculator tool, as an environment process (README.md, the protocol).

reset: the question (the task's prompt) as a user message after a system message, and one tool,
`calculator`, that evaluates an arithmetic expression.
step: the turn's tool calls (trill parses them with the model's chat template: env.render chat),
or, with plain rendering, the <tool_call>{"name": ..., "arguments": {...}}</tool_call> blocks in the
turn's text. Each call is run (a tool's error, a malformed call included, is its result, which
the model reads) and the results are the next observation, as tool messages. A turn without a
call is the final answer: reward 1 when its last number (after "####" if it writes one) equals
the task's (the number after GSM8K's "####"), and the episode is done.
Metrics: calls (successful tool runs) and correct.

The calculator takes + - * / // % ** and parentheses over numbers, nothing else (Python's ast,
never eval); a result beyond 1e100, a power beyond 1000 or an expression over 300 characters is
an error, and every call runs under a time limit (TOOL_TIMEOUT_S), so no call can hang the
environment.
"""
import ast
import json
import operator
import re
import signal
import sys

TOOL_TIMEOUT_S = 2
TOOLS = [{"type": "function", "function": {
    "name": "calculator",
    "description": "Evaluate an arithmetic expression: numbers, + - * / // % ** and parentheses.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string", "description": "e.g. (48 + 24) / 2"}},
                   "required": ["expression"]}}}]
SYSTEM = ("Solve the problem. You may call the calculator tool for arithmetic. "
          "When you are done, write the final answer as '#### <number>'.")
OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
       ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow, ast.USub: operator.neg, ast.UAdd: operator.pos}
CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


class ToolTimeout(Exception):
    pass


def on_alarm(signum, frame):
    raise ToolTimeout()


def evaluate(node):
    if isinstance(node, ast.Expression):
        return evaluate(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in OPS:
        left, right = evaluate(node.left), evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > 1000:
            raise ValueError("power too large")
        value = OPS[type(node.op)](left, right)
        if abs(value) > 1e100:
            raise ValueError("result too large")
        return value
    if isinstance(node, ast.UnaryOp) and type(node.op) in OPS:
        return OPS[type(node.op)](evaluate(node.operand))
    raise ValueError("only numbers, + - * / // % ** and parentheses")


def calculator(arguments):
    expr = arguments.get("expression") if isinstance(arguments, dict) else None
    if not isinstance(expr, str) or len(expr) > 300:
        return "error: expected {\"expression\": a string of at most 300 characters}"
    signal.alarm(TOOL_TIMEOUT_S)
    try:
        value = evaluate(ast.parse(expr, mode="eval"))
        return str(int(value) if isinstance(value, float) and value.is_integer() else value)
    except ToolTimeout:
        return f"error: the calculation took longer than {TOOL_TIMEOUT_S} s"
    except (ValueError, SyntaxError, ZeroDivisionError, OverflowError, RecursionError, TypeError) as e:
        return f"error: {e}"
    finally:
        signal.alarm(0)


def calls_in(req):
    """trill's parsed calls, else the <tool_call> blocks of the text (plain rendering)."""
    if req.get("tool_calls"):
        return req["tool_calls"]
    out = []
    for body in CALL.findall(req["turn"]):
        try:
            call = json.loads(body)
            out.append({"name": call["name"], "arguments": call.get("arguments", {})})
        except (ValueError, KeyError, TypeError):
            out.append({"error": "not {\"name\": ..., \"arguments\": {...}}", "text": body})
    return out


def last_number(text):
    text = text.split("####")[-1]
    found = NUMBER.findall(text)
    return float(found[-1].replace(",", "")) if found else None


episodes = {}  # episode id -> the answer's number


def reset(req):
    episodes[req["episode"]] = last_number(req["task"].get("answer", ""))
    return {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": req["task"]["prompt"]}], "tools": TOOLS}


def step(req):
    calls = calls_in(req)
    if calls:
        results, ran = [], 0
        for call in calls:
            if "error" in call:
                results.append(f"error: malformed tool call ({call['error']})")
            elif call.get("name") != "calculator":
                results.append(f"error: no tool named {call.get('name')!r}")
            else:
                results.append(calculator(call.get("arguments")))
                ran += not results[-1].startswith("error")
        messages = [{"role": "tool", "content": r} for r in results]
        return {"messages": messages, "reward": 0, "done": False, "metrics": {"calls": ran}}
    got, want = last_number(req["turn"]), episodes.get(req["episode"])
    correct = got is not None and want is not None and abs(got - want) < 1e-6
    return {"messages": [], "reward": float(correct), "done": True, "metrics": {"correct": float(correct)}}


def end(req):
    episodes.pop(req["episode"], None)
    return {}


signal.signal(signal.SIGALRM, on_alarm)
for line in sys.stdin:
    if line.strip():
        req = json.loads(line)
        print(json.dumps({"reset": reset, "step": step, "end": end}[req["op"]](req)), flush=True)
