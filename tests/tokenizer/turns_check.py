"""Token identity across turns, on the real tokenizers: what trill trains on (the prompt, the
sampled turn's tokens as the model wrote them, then what the template writes after a turn, each
tokenised once) against a re-render of the whole conversation, tokenised whole. With tool results
the two are the same ids (the templates extend their prefix), except where a template renders a
turn otherwise than the model wrote it: after a new user query Qwen3's re-render drops the earlier
turn's <think> block; DeepSeek-V3's leaves a lone tool call's block unclosed. trill keeps the
turn as sampled.
Usage: turns_check.py TOK_TOOL FAMILY MODEL_DIR  (tok_tool renders and encodes; its renderings are
checked against the Jinja oracle by parity.sh's chat checks)."""
import json
import subprocess
import sys

tool, family, model = sys.argv[1:4]
SENTINEL = "\u0001S\u0001"


def run(mode, lines):
    """tok_tool MODE over lines at once (the tokenizer is loaded once)."""
    r = subprocess.run([tool, mode, model], input="".join(l + "\n" for l in lines), capture_output=True, text=True, check=True)
    return [json.loads(l) for l in r.stdout.splitlines()]


def chats(convs):
    return run("chat", [json.dumps(c) for c in convs])


def encs(texts):
    return run("encode", [t.encode().hex() for t in texts])


question = {"role": "user", "content": "What is 17*23? Use the calculator."}
if family == "qwen3":
    end = "<|im_end|>"
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "17*23"}}\n</tool_call>'
    turn = f"<think>\nI should call the calculator for 17*23.\n</think>\n\n{call}"
    assistant = {"role": "assistant", "content": turn}
    cases = [("a tool result", turn, assistant, [{"role": "tool", "content": "391"}], True),
             ("a new user query", turn, assistant, [{"role": "user", "content": "And 17*24?"}], False)]
else:
    end = "<\uff5cend\u2581of\u2581sentence\uff5c>"
    sep, begin = "<\uff5ctool\u2581sep\uff5c>", "<\uff5ctool\u2581call\u2581begin\uff5c>"
    one = begin + "function" + sep + 'calculator\n```json\n{"expression": "17*23"}\n```<\uff5ctool\u2581call\u2581end\uff5c>'
    calls = lambda n: "<\uff5ctool\u2581calls\u2581begin\uff5c>" + "\n".join([one] * n) + "<\uff5ctool\u2581calls\u2581end\uff5c>"
    tc = {"type": "function", "function": {"name": "calculator", "arguments": '{"expression": "17*23"}'}}
    results = [{"role": "tool", "content": "391"}, {"role": "tool", "content": "391"}]
    # the template closes a block of calls only from its second call on (its is_first), so a lone
    # call's re-render lacks the block's end and the turn's end the model wrote
    cases = [("two calls' results", calls(2), {"role": "assistant", "content": None, "tool_calls": [tc, tc]}, results, True),
             ("a lone call's result", calls(1), {"role": "assistant", "content": None, "tool_calls": [tc]}, results[:1], False)]
failed = False
for what, turn, assistant, follow, want_same in cases:
    prompt, after, whole_text = chats([
        {"messages": [question], "add_generation_prompt": True},
        {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": SENTINEL}] + follow, "add_generation_prompt": True},
        {"messages": [question, assistant] + follow, "add_generation_prompt": True}])
    after = after[after.index(SENTINEL + end) + len(SENTINEL + end):]  # what the template writes after a turn
    ids = encs([prompt, turn + end, after, whole_text])
    trill, whole = ids[0] + ids[1] + ids[2], ids[3]
    agree = next((i for i, (a, b) in enumerate(zip(trill, whole)) if a != b), min(len(trill), len(whole)))
    same = trill == whole
    print(f"  {family}, after {what}: trill's {len(trill)} ids, a re-render's {len(whole)}, "
          f"{'identical' if same else f'the first {agree} agree'}")
    failed |= same != want_same
sys.exit(1 if failed else 0)
