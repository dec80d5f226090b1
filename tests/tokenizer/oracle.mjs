// Reference answers from Hugging Face's tokenizers.js and jinja, pinned in package.json.
// Usage (MODELDIR holds tokenizer.json and tokenizer_config.json; --node-dir as in lib.mjs):
//   oracle.mjs encode --model DIR --in HEXFILE --out IDS.jsonl     hex lines -> JSON id arrays
//   oracle.mjs decode --model DIR --in IDS.jsonl --out HEXFILE     id arrays -> hex of the decoded UTF-8
//   oracle.mjs chat   --model DIR --in CHATS.jsonl --out OUT.jsonl conversations -> JSON strings
//       ({"raise": true} where the template refuses the conversation with raise_exception)
//   oracle.mjs expect-roundtrip --model DIR --in HEXFILE --ids IDS.jsonl --out HEXFILE
//       what decode(ids) must give back: the input itself where it is valid UTF-8 that the
//       normalizer leaves alone (or that the oracle round-trips, for a normalizer its decoder
//       undoes), the oracle's decode of IDS otherwise (invalid UTF-8, NFC changes)
//   oracle.mjs strings-to-hex --in STRINGS.jsonl --out HEXFILE     JSON strings -> hex lines (other values are left out)
// Encoding never adds special tokens; decoding keeps them.
import fs from "node:fs";
import path from "node:path";
import { parseArgs, need, die, readLines, writeLines, findNodeDir, requireFrom, loadModel, tokenContent, warn, cli } from "./lib.mjs";

const USAGE = "usage: oracle.mjs encode|decode|chat|expect-roundtrip|strings-to-hex --model DIR --in FILE --out FILE [--ids FILE] [--node-dir DIR]";

// WHATWG decoding (what Buffer does): each maximal invalid subsequence becomes one U+FFFD and a
// leading BOM is kept, unlike TextDecoder's default which strips it.
const hexToString = (h) => Buffer.from(h, "hex").toString("utf8");
const stringToHex = (s) => Buffer.from(s, "utf8").toString("hex");

// The tokenizer of a model folder (about a second to build for Qwen3's). Under serve.mjs the
// last one built is kept for the next command, since parity.sh's commands on one folder come in a
// row; keeping only that one bounds the memory. A folder is taken to stay as it was when loaded,
// which parity.sh guarantees by writing each one before its first use.
let last = { dir: null, tok: null };
function loadTokenizer(modelDir, nodeDir) {
  const dir = path.resolve(modelDir);
  if (last.dir !== dir) {
    last = { dir: null, tok: null }; // (the previous one can go before the next is built)
    const { tokenizerJson, config } = loadModel(modelDir);
    const { Tokenizer } = requireFrom(nodeDir, "@huggingface/tokenizers");
    last = { dir, tok: new Tokenizer(tokenizerJson, config) };
  }
  return last.tok;
}
const encode = (tok, s) => tok.encode(s, { add_special_tokens: false }).ids;
// tokenizers.js throws on an empty id list; the decoded text of nothing is "".
const decode = (tok, ids) => (ids.length === 0 ? "" : tok.decode(ids, { skip_special_tokens: false }));

// Lines that cannot be decoded (e.g. a malformed answer from the tool under test) get a marker
// that can never equal a hex line, so the comparison reports them instead of the oracle dying.
function decodeLine(tok, line) {
  try {
    const ids = JSON.parse(line);
    if (!Array.isArray(ids) || !ids.every((i) => Number.isInteger(i) && i >= 0 && tok.id_to_token(i) !== undefined))
      return "!invalid-ids";
    return stringToHex(decode(tok, ids));
  } catch {
    return "!unparsable";
  }
}

// @huggingface/jinja 0.5.11 ignores the argument of str.strip/lstrip/rstrip (it always trims JS
// whitespace), but Qwen3's template relies on Python's content.lstrip('\n') keeping other
// leading whitespace, as transformers (Python jinja2) does. Give StringValue Python's methods.
const PY_WHITESPACE = "\t\n\v\f\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006" +
  "\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000";
function pyStrip(s, chars, left, right) {
  const set = Array.from(chars === undefined || chars === null ? PY_WHITESPACE : chars);
  const cps = Array.from(s);
  let a = 0, b = cps.length;
  while (left && a < b && set.includes(cps[a])) ++a;
  while (right && b > a && set.includes(cps[b - 1])) --b;
  return cps.slice(a, b).join("");
}
function pythonStringMethods(jinja) {
  const env = new jinja.Environment();
  env.set("probe", "");
  const probe = env.lookupVariable("probe");
  const proto = Object.getPrototypeOf(probe);
  const original = Object.getOwnPropertyDescriptor(proto, "builtins");
  if (!original?.get) die("chat: unexpected @huggingface/jinja internals (StringValue.builtins)", 1);
  const StringValue = probe.constructor;
  const FunctionValue = probe.builtins.get("strip").constructor;
  Object.defineProperty(proto, "builtins", {
    configurable: true,
    get() {
      const map = original.get.call(this);
      if (!map.pythonStrip) {
        for (const [name, left, right] of [["strip", true, true], ["lstrip", true, false], ["rstrip", false, true]])
          map.set(name, new FunctionValue((args) => new StringValue(pyStrip(this.value, args[0]?.value, left, right))));
        map.pythonStrip = true;
      }
      return map;
    },
  });
}

// @huggingface/jinja 0.5.11 compares with JavaScript's loose ==, so '' == false, ' ' == false and
// '0' == false hold; in Python jinja2 a string never equals a non-string. Llama-2's template asks
// `system_message != false` of the system prompt's text: give == and != Python's answer whenever
// a string is involved (the rest, numbers and booleans alike, already agrees).
function pythonEquality(jinja) {
  const env = new jinja.Environment();
  env.set("probe", true);
  const BooleanValue = env.lookupVariable("probe").constructor;
  const proto = jinja.Interpreter.prototype;
  const original = proto.evaluateBinaryExpression;
  if (typeof original !== "function") die("chat: unexpected @huggingface/jinja internals (Interpreter.evaluateBinaryExpression)", 1);
  proto.evaluateBinaryExpression = function (node, environment) {
    const op = node.operator.value;
    if (op !== "==" && op !== "!=") return original.call(this, node, environment);
    const left = this.evaluate(node.left, environment), right = this.evaluate(node.right, environment);
    const equal = typeof left.value === "string" || typeof right.value === "string"
      ? typeof left.value === typeof right.value && left.value === right.value
      : left.value == right.value;
    return new BooleanValue(op === "==" ? equal : !equal);
  };
}

// transformers' raise_exception: the template refuses the conversation. jinja's own global throws
// an Error with the template's message, one of the literals it passes to raise_exception; such a
// conversation is written as {"raise": true}, as tok_tool writes one that trill refuses.
const raiseMessages = (text) => new Set(Array.from(text.matchAll(/raise_exception\(\s*'([^'\\]*)'\s*\)/g), (m) => m[1]));

// @huggingface/jinja with the two patches above, applied once per process.
let patchedJinja = null;
function jinjaFrom(nodeDir) {
  if (!patchedJinja) {
    const jinja = requireFrom(nodeDir, "@huggingface/jinja");
    pythonStringMethods(jinja);
    pythonEquality(jinja);
    patchedJinja = jinja;
  }
  return patchedJinja;
}

export function main(argv) {
  const opts = parseArgs(argv, USAGE);
  const [cmd] = opts._;
  const input = need(opts, "in", USAGE);
  const output = need(opts, "out", USAGE);
  if (cmd === "strings-to-hex") {
    // (a chat the template refused, {"raise": true}, has no text: it is left out)
    writeLines(output, readLines(input).map((l) => JSON.parse(l)).filter((v) => typeof v === "string").map(stringToHex));
    return 0;
  }
  const modelDir = need(opts, "model", USAGE);
  const nodeDir = findNodeDir(opts, modelDir);
  const tokenizer = () => loadTokenizer(modelDir, nodeDir);
  switch (cmd) {
    case "encode": {
      const tok = tokenizer();
      writeLines(output, readLines(input).map((h) => JSON.stringify(encode(tok, hexToString(h)))));
      break;
    }
    case "decode": {
      const tok = tokenizer();
      writeLines(output, readLines(input).map((l) => decodeLine(tok, l)));
      break;
    }
    case "expect-roundtrip": {
      const tok = tokenizer();
      const ids = readLines(need(opts, "ids", USAGE));
      const hex = readLines(input);
      if (ids.length !== hex.length) die(`expect-roundtrip: ${hex.length} input lines but ${ids.length} id lines`, 1);
      let exact = 0;
      const expected = hex.map((h, i) => {
        const s = hexToString(h);
        const valid = stringToHex(s) === h.toLowerCase();
        const kept = tok.normalizer === null || tok.normalizer(s) === s;
        // A normalizer that always changes the text (SentencePiece-style: Prepend "▁", Replace " ")
        // is undone by its decoder: those lines must round-trip wherever the oracle's do.
        const clean = valid && (kept || decode(tok, encode(tok, s)) === s);
        if (!clean) return decodeLine(tok, ids[i]);
        // Self-check of the oracle: decode(encode(s)) == s must hold for these lines.
        if (decode(tok, encode(tok, s)) !== s) die(`expect-roundtrip: the oracle itself does not round-trip line ${i + 1}`, 1);
        ++exact;
        return h.toLowerCase();
      });
      writeLines(output, expected);
      warn(`expect-roundtrip: ${exact} lines must decode to the input, ${hex.length - exact} to the oracle's decode`);
      break;
    }
    case "chat": {
      const { Template } = jinjaFrom(nodeDir);
      const config = JSON.parse(fs.readFileSync(path.join(modelDir, "tokenizer_config.json"), "utf8"));
      if (typeof config.chat_template !== "string") die(`chat: ${modelDir} has no chat_template string`, 1);
      const template = new Template(config.chat_template);
      const raises = raiseMessages(config.chat_template);
      const rendered = readLines(input).map((line) => {
        const chat = JSON.parse(line);
        // transformers passes special_tokens_map (AddedToken -> its content); a null bos_token
        // (Qwen3) would be absent there, and "" renders the same for these templates.
        const vars = {
          messages: chat.messages,
          add_generation_prompt: chat.add_generation_prompt ?? false,
          bos_token: tokenContent(config.bos_token),
          eos_token: tokenContent(config.eos_token),
        };
        if (chat.enable_thinking !== undefined) vars.enable_thinking = chat.enable_thinking;
        if (chat.tools !== undefined) vars.tools = chat.tools;
        try {
          return JSON.stringify(template.render(vars));
        } catch (e) {
          if (raises.has(e.message)) return JSON.stringify({ raise: true });
          throw e;
        }
      });
      writeLines(output, rendered);
      break;
    }
    default:
      die(USAGE);
  }
  return 0;
}

await cli(import.meta.url, main);
