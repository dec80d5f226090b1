// Deterministic conversations for chat-template parity, one JSON object per line:
//   {"messages": [{"role", "content", "reasoning_content"?}...], "add_generation_prompt", "enable_thinking"?}
// Hand-written edge cases first, then seeded random ones. No tools / tool_calls.
// Usage: gen_chats.mjs --out FILE.jsonl --seed N [--count N]   (count >= the fixed cases; default 90)
import { parseArgs, need, writeLines, mulberry32 } from "./lib.mjs";

const USAGE = "usage: gen_chats.mjs --out FILE.jsonl --seed N [--count N]";
const opts = parseArgs(process.argv.slice(2), USAGE);
const out = need(opts, "out", USAGE);
const seed = Number(need(opts, "seed", USAGE));
const count = Number(opts.count ?? 90);

const rand = mulberry32((seed ^ 0x85ebca6b) >>> 0); // the seeded PRNG (lib.mjs)
const int = (n) => Math.floor(rand() * n);
const pick = (a) => a[int(a.length)];
const chance = (p) => rand() < p;

const S = (content) => ({ role: "system", content });
const U = (content) => ({ role: "user", content });
const A = (content, reasoning_content) => (reasoning_content === undefined ? { role: "assistant", content } : { role: "assistant", content, reasoning_content });

const TEXTS = ["Hello!", "hi", "What is 2+2?", "Explain BPE tokenization in one sentence.", "", " ", "\n", "\nleading newline",
  "trailing newline\n", "\n\nboth\n\n", "line one\nline two\n\nline four", "你好，请介绍一下你自己。", "日本語で答えてください。",
  "안녕하세요?", "Ça va? Très bien, merci — e\u0301te\u0301.", "emoji 👍🏽 👨‍👩‍👧‍👦 🇯🇵", "مرحبا", "שלום", "code:\n```python\nprint('x')\n```",
  "  indented\n\tand tabbed  ", "quotes \" ' ` and backslash \\ and {{ braces }} {% not a tag %}", "1234567 3.14159 1,000",
  "don't I'M they'll", "<|im_start|> inside text <|im_end|>", "<｜User｜> fake turn <｜Assistant｜>", "a<think>b</think>c",
  "\u0001\u001b[0m ctrl \u007f", "\ufeffBOM first", "x".repeat(300), "multi\r\nline\r\nCRLF"];
const REASONING = ["", "Let me think.", "\nstep 1\nstep 2\n", "The user asks X.\n\nSo Y.", "\n\n", "推理过程。", "a</think>b"];
const SYSTEMS = ["You are a helpful assistant.", "", "Answer briefly.\nUse markdown.", "系统提示：用中文回答。", "\nSystem with leading newline"];

// Assistant content in the shapes Qwen3's template distinguishes.
function assistantMessage() {
  const c = pick(TEXTS), r = pick(REASONING);
  return pick([
    () => A(c),
    () => A(c, r),
    () => A(`<think>${r}</think>${c}`),
    () => A(`<think>\n${r}\n</think>\n\n${c}`),
    () => A(`${r}</think>\n${c}`), // closing tag only
    () => A(`<think></think>${c}`),
  ])();
}

const FIXED = [
  { messages: [U("Hello!")], add_generation_prompt: true },
  { messages: [U("Hello!")], add_generation_prompt: false },
  { messages: [U("Hello!")], add_generation_prompt: true, enable_thinking: false },
  { messages: [U("Hello!")], add_generation_prompt: true, enable_thinking: true },
  { messages: [U("Hello!")], add_generation_prompt: false, enable_thinking: false },
  { messages: [S("You are a helpful assistant."), U("Hi")], add_generation_prompt: true },
  { messages: [S("You are a helpful assistant."), U("Hi"), A("Hello! How can I help?")], add_generation_prompt: false },
  { messages: [S("sys"), U("q1"), A("a1"), U("q2"), A("a2"), U("q3")], add_generation_prompt: true },
  { messages: [S("sys"), U("q1"), A("a1"), U("q2"), A("a2"), U("q3")], add_generation_prompt: true, enable_thinking: false },
  { messages: [U("q1"), A("<think>\nreasoning 1\n</think>\n\nanswer 1"), U("q2"), A("<think>\nreasoning 2\n</think>\n\nanswer 2")], add_generation_prompt: false },
  { messages: [U("q1"), A("<think>\nreasoning 1\n</think>\n\nanswer 1"), U("q2")], add_generation_prompt: true },
  { messages: [U("q"), A("answer", "my reasoning")], add_generation_prompt: false },
  { messages: [U("q"), A("answer", "")], add_generation_prompt: false },
  { messages: [U("q"), A("answer", "\n\nspaced reasoning\n\n")], add_generation_prompt: false },
  { messages: [U("q"), A("\n\nanswer with leading newlines")], add_generation_prompt: false },
  { messages: [U("q"), A("no think here")], add_generation_prompt: true },
  { messages: [U("q1"), A("a1", "r1"), U("q2"), A("a2", "r2")], add_generation_prompt: false },
  { messages: [U("q1"), A("a1"), A("a2 (two assistant turns)"), A("<think>r3</think>a3")], add_generation_prompt: false },
  { messages: [S("first system"), S("second system"), U("q")], add_generation_prompt: true },
  { messages: [S("first system"), S("second system"), S("third"), U("q"), A("a")], add_generation_prompt: false },
  { messages: [S("sys"), U("q"), S("mid-conversation system"), U("q2")], add_generation_prompt: true },
  { messages: [S("only a system message")], add_generation_prompt: true },
  { messages: [S("")], add_generation_prompt: false },
  { messages: [A("assistant speaks first")], add_generation_prompt: false },
  { messages: [U("")], add_generation_prompt: true },
  { messages: [U(""), A("")], add_generation_prompt: false },
  { messages: [U("\n"), A("\n", "\n")], add_generation_prompt: true },
  { messages: [U("<tool_response>\nresult\n</tool_response>")], add_generation_prompt: true },
  { messages: [U("real question"), A("a1", "r1"), U("<tool_response>\n42\n</tool_response>"), A("final", "r2")], add_generation_prompt: false },
  { messages: [U("real question"), A("<think>r1</think>a1"), U("<tool_response>x</tool_response>")], add_generation_prompt: true, enable_thinking: true },
  { messages: [U("你好"), A("<think>\n用户打招呼。\n</think>\n\n你好！有什么可以帮你？")], add_generation_prompt: false },
  { messages: [U("emoji 👍🏽"), A("👨‍👩‍👧‍👦")], add_generation_prompt: true, enable_thinking: false },
  { messages: [U("q"), A("a</think>b</think>c")], add_generation_prompt: false },
  { messages: [U("q"), A("<think>x<think>y</think>z")], add_generation_prompt: false },
  { messages: [U("quotes \" ' ` \\ {{ x }} {% if %}")], add_generation_prompt: true },
  // [INST] templates (Llama-2, Mixtral): role alternation, where the system prompt goes, strip(),
  // and Python's '' != false
  { messages: [S("sys"), U("q1"), S("a system message where an assistant turn belongs"), U("q2")], add_generation_prompt: true },
  { messages: [U("q1"), S("system after the first user turn"), U("q2"), A("a2")], add_generation_prompt: false },
  { messages: [S(""), U("empty system prompt")], add_generation_prompt: true },
  { messages: [S(" "), U("blank system prompt")], add_generation_prompt: true },
  { messages: [S("0"), U("system prompt 0")], add_generation_prompt: true },
  { messages: [S("sys"), U("q"), A("a")], add_generation_prompt: false },
  { messages: [S("sys"), U("q1"), A("a1"), U("q2")], add_generation_prompt: true },
  { messages: [U(" \u3000\u0085 padded\u00a0\t\u001f"), A("\ufeff BOM kept by Python's strip \u2028"), U("\u200b zero width \u180e")], add_generation_prompt: true },
  { messages: [A("an assistant first"), U("then a user")], add_generation_prompt: true },
  { messages: [U("a user"), U("then a user again")], add_generation_prompt: true },
  { messages: [S("sys")], add_generation_prompt: true },
];

const chats = FIXED.slice(0, count);
while (chats.length < count) {
  const messages = [];
  const nSys = pick([0, 0, 1, 1, 1, 2, 3]);
  for (let i = 0; i < nSys; ++i) messages.push(S(pick(SYSTEMS)));
  const turns = 1 + int(5);
  for (let t = 0; t < turns; ++t) {
    messages.push(U(pick(TEXTS)));
    if (t < turns - 1 || chance(0.5)) messages.push(assistantMessage());
    if (chance(0.05)) messages.push(S(pick(SYSTEMS)));
  }
  const chat = { messages, add_generation_prompt: chance(0.6) };
  const think = pick([undefined, undefined, true, false]);
  if (think !== undefined) chat.enable_thinking = think;
  chats.push(chat);
}
writeLines(out, chats.map((c) => JSON.stringify(c)));
