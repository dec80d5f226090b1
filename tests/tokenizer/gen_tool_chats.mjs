// Deterministic conversations with tools, tool calls and tool messages, for the chat-template
// parity of the templates that render them, one JSON object per line:
//   {"messages": [...], "tools"?: [...], "add_generation_prompt", "enable_thinking"?}
// --family qwen3: tool definitions in the system turn; calls' arguments as objects or strings;
// content always a string. --family deepseek_v3: its template concatenates the arguments (strings
// only) and takes an assistant turn of calls only when its content is null.
// Hand-written cases first, then seeded random ones. Numbers in arguments and tools avoid the two
// places JavaScript and Python write JSON differently: floats with an integral value (JS has no
// 1.0) and exponents (1e-07 vs 1e-7).
// Usage: gen_tool_chats.mjs --family qwen3|deepseek_v3 --out FILE.jsonl --seed N [--count N]
import { parseArgs, need, writeLines, mulberry32 } from "./lib.mjs";

const USAGE = "usage: gen_tool_chats.mjs --family qwen3|deepseek_v3 --out FILE.jsonl --seed N [--count N]";
const opts = parseArgs(process.argv.slice(2), USAGE);
const family = need(opts, "family", USAGE);
const out = need(opts, "out", USAGE);
const seed = Number(need(opts, "seed", USAGE));
const count = Number(opts.count ?? 60);
if (family !== "qwen3" && family !== "deepseek_v3") throw new Error(USAGE);
const qwen = family === "qwen3";

const rand = mulberry32((seed ^ 0x2545f491) >>> 0); // the seeded PRNG (lib.mjs)
const int = (n) => Math.floor(rand() * n);
const pick = (a) => a[int(a.length)];
const chance = (p) => rand() < p;

const TOOLS = [
  { type: "function", function: { name: "get_weather", description: "Get the weather for a city",
    parameters: { type: "object", properties: { city: { type: "string", description: "City name, e.g. 北京" },
      days: { type: "integer", minimum: 1, maximum: 7 } }, required: ["city"] } } },
  { type: "function", function: { name: "calculator", description: "Evaluate an arithmetic expression \"exactly\"",
    parameters: { type: "object", properties: { expression: { type: "string" }, precision: { type: "number", default: 0.5 } },
      required: ["expression"] } } },
  { type: "function", function: { name: "search", description: "Search\nthe web", parameters: { type: "object", properties: {} } } },
];
const ARGS = [{ city: "Paris" }, { city: "北京", days: 3 }, { expression: "12*(3+4)", precision: 0.25 }, {},
  { q: "quotes \" and \\ backslash", nested: { list: [1, 2.5, "x", null, true, false], empty: [] } }, { text: "line\nbreak\ttab" }];
const RESULTS = ["22°C, sunny", "84", "", "{\"temp\": 21.5}", "multi\nline\nresult", "<tool_response>inside</tool_response>", "👍🏽 done"];
const TEXTS = ["What is the weather in Paris?", "Compute 12*(3+4).", "hi", "", "Use the tools.\nThen answer.", "你好"];

const S = (content) => ({ role: "system", content });
const U = (content) => ({ role: "user", content });
const T = (content) => ({ role: "tool", content });
const A = (content, extra = {}) => ({ role: "assistant", content, ...extra });
// a call, OpenAI-style ({type, function}) or flat ({name, arguments}) for Qwen3; DeepSeek-V3's arguments are text
function call(name, args, flat = false) {
  const a = qwen && !flat && chance(0.7) ? args : JSON.stringify(args);
  return flat ? { name, arguments: a } : { type: "function", function: { name, arguments: a } };
}
// an assistant turn of calls: Qwen3 with some content (maybe empty), DeepSeek-V3 with none
const callsTurn = (calls, content = "") => A(qwen ? content : null, { tool_calls: calls });

const FIXED = [
  { messages: [U("What is the weather in Paris?")], tools: [TOOLS[0]], add_generation_prompt: true },
  { messages: [S("You are a helpful assistant."), U("Weather?")], tools: TOOLS, add_generation_prompt: true },
  { messages: [U("Weather in Paris?"), callsTurn([call("get_weather", { city: "Paris" })]), T("22°C, sunny"), A("It is 22°C and sunny.")],
    tools: [TOOLS[0]], add_generation_prompt: false },
  { messages: [U("Weather in Paris?"), callsTurn([call("get_weather", { city: "Paris" })]), T("22°C, sunny")],
    tools: [TOOLS[0]], add_generation_prompt: true },
  { messages: [U("Two cities"), callsTurn([call("get_weather", { city: "Paris" }), call("get_weather", { city: "北京", days: 3 })]),
    T("22°C"), T("30°C"), A("Paris 22°C, Beijing 30°C.")], tools: [TOOLS[0]], add_generation_prompt: false },
  { messages: [U("calc"), callsTurn([call("calculator", { expression: "2+2" })]), T("4"), callsTurn([call("calculator", { expression: "4*4" })]),
    T("16"), A("16")], tools: [TOOLS[1]], add_generation_prompt: false },
  { messages: [U("calc"), callsTurn([call("calculator", { expression: "2+2" })]), T("4"), U("and again?")], tools: [TOOLS[1]],
    add_generation_prompt: true },
  { messages: [U("no tools given"), callsTurn([call("search", {})]), T("result")], add_generation_prompt: true },
  { messages: [S("sys"), U("q"), A("plain answer")], tools: [], add_generation_prompt: false },
];
if (qwen) {
  FIXED.push(
    { messages: [U("q"), A("Let me check.", { tool_calls: [call("search", { q: "x" })] }), T("found")], tools: [TOOLS[2]],
      add_generation_prompt: true, enable_thinking: false },
    { messages: [U("q"), A("\n", { tool_calls: [call("search", { q: "x" }, true)] }), T("found"), A("done", { reasoning_content: "thought" })],
      tools: [TOOLS[2]], add_generation_prompt: false },
    { messages: [U("q"), A("<think>\nreasoning\n</think>\n\ncalling", { tool_calls: [call("search", {}, true), call("search", { a: 1 })] }),
      T("r1"), T("r2")], tools: TOOLS, add_generation_prompt: true, enable_thinking: true },
    { messages: [U("q"), A("", { reasoning_content: "why", tool_calls: [call("calculator", { expression: "1/3", precision: 0.125 })] }), T("0.333")],
      tools: [TOOLS[1]], add_generation_prompt: true },
    { messages: [T("a tool message first"), U("then a question")], add_generation_prompt: true },
  );
} else {
  FIXED.push(
    { messages: [U("q"), callsTurn([call("search", { q: "x" })]), T("r1"), callsTurn([call("search", { q: "y" })]), T("r2"), A("done")],
      add_generation_prompt: false },
    { messages: [U("q"), A("content and calls: the calls are not written", { tool_calls: [call("search", {})] })], add_generation_prompt: true },
    { messages: [S("s1"), U("q"), callsTurn([call("search", {})]), T("r"), A("a"), S("s2"), U("q2")], add_generation_prompt: true },
  );
}

const chats = FIXED.slice(0, count);
while (chats.length < count) {
  const messages = [];
  if (chance(0.5)) messages.push(S(pick(["You are a helpful assistant.", "", "Use tools when needed.\n"])));
  const rounds = 1 + int(3);
  messages.push(U(pick(TEXTS)));
  for (let r = 0; r < rounds; ++r) {
    const calls = Array.from({ length: 1 + int(3) }, () => call(pick(TOOLS).function.name, pick(ARGS), qwen && chance(0.3)));
    messages.push(callsTurn(calls, qwen ? pick(["", "Calling a tool.", "\n", "<think>r</think>ok"]) : null));
    for (let k = 0; k < (chance(0.8) ? calls.length : 1); ++k) messages.push(T(pick(RESULTS)));
    if (chance(0.4)) messages.push(A(pick(["Done.", "", "The answer is 84."])));
    if (chance(0.3)) messages.push(U(pick(TEXTS)));
  }
  const chat = { messages, add_generation_prompt: chance(0.6) };
  if (chance(0.8)) chat.tools = TOOLS.filter(() => chance(0.6));
  if (qwen) {
    const think = pick([undefined, true, false]);
    if (think !== undefined) chat.enable_thinking = think;
  }
  chats.push(chat);
}
writeLines(out, chats.map((c) => JSON.stringify(c)));
