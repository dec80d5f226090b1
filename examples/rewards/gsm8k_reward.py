#!/usr/bin/env python3
"""A trill external reward for GSM8K-style answers (see README.md for the protocol).

Reads one JSON request per line on stdin, {"prompt", "completion", "ground_truth"}, and
replies one JSON line per request: {"reward": 1.0 or 0.0, "metrics": {"has_answer": 1 or 0}}.
The answer is the number after the last "#### ", else the content of the last \\boxed{...},
else the last number in the text (a simpler version of trill's built-in "numeric" verifier).
The ground truth may be a bare number or a full GSM8K answer ending in "#### N".
"""
import json
import re
import sys

NUMBER = re.compile(r"-?\$?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+(?:\.\d+)?)?|-?\.\d+")


def to_float(token):
    token = token.replace(",", "").replace("$", "")
    if "/" in token:
        num, den = token.split("/", 1)
        return float(num) / float(den) if float(den) != 0 else float(num)
    return float(token)


def last_boxed(text):
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 1, start + len("\\boxed{")
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j]
    return None


def extract(text):
    """The final answer of a text as a float, or None."""
    marker = re.findall(r"####\s*(" + NUMBER.pattern + ")", text)
    if marker:
        return to_float(marker[-1])
    boxed = last_boxed(text)
    if boxed is not None:
        frac = re.search(r"(-?)\\d?frac\{([\d.]+)\}\{([\d.]+)\}", boxed)
        if frac and float(frac.group(3)) != 0:
            value = float(frac.group(2)) / float(frac.group(3))
            return -value if frac.group(1) else value
        text = boxed.replace("{,}", ",")
    numbers = NUMBER.findall(text)
    return to_float(numbers[-1]) if numbers else None


def score(request):
    answer = extract(request["completion"])
    truth = extract(request["ground_truth"])
    correct = (
        answer is not None
        and truth is not None
        and abs(answer - truth) <= max(1e-9, 1e-6 * max(abs(answer), abs(truth)))
    )
    return {"reward": 1.0 if correct else 0.0, "metrics": {"has_answer": 0 if answer is None else 1}}


def main():
    for line in sys.stdin:
        if not line.strip():
            continue
        reply = score(json.loads(line))
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()  # trill waits for each reply line: never leave it in a buffer


if __name__ == "__main__":
    main()
