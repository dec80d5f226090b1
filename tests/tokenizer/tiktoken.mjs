// tiktoken vocabularies for the parity test, from npm js-tiktoken's ranks (o200k_base, cl100k_base).
// Usage:
//   tiktoken.mjs write --encoding E --out DIR [--like TOKENIZER_JSON_DIR]
//       DIR as a tiktoken model folder, laid out as Kimi-K2's: E.tiktoken (one "base64-token rank"
//       line per token), tokenizer_config.json (added_tokens_decoder: the special tokens) and
//       tokenization_test.py (pat_str). The pattern is js-tiktoken's with JavaScript's \s spelled
//       out (JS's \s has U+FEFF and lacks U+0085, PCRE2's the other way round), so that PCRE2 and
//       JS split alike. --like: the pattern and added tokens of that tokenizer.json instead (the
//       same vocabulary through both of trill's loaders).
//   tiktoken.mjs kimi-write --encoding E --out DIR
//       the same with Kimi-K2's split pattern (its tokenization_kimi.py: "|".join of raw strings with
//       character-class intersections such as [\p{Lu}...&&[^\p{Han}]], which PCRE2 does not have)
//   tiktoken.mjs kimi-encode --encoding E --in HEXFILE --out IDS.jsonl
//       its reference: the pattern run natively by JavaScript's v flag (intersections included),
//       then tiktoken's byte-pair merge over E's ranks, written out below
//   tiktoken.mjs encode --encoding E --in HEXFILE --out IDS.jsonl   js-tiktoken, every special token allowed
//   tiktoken.mjs rust-encode --encoding E [--kimi] --in HEXFILE --out IDS.jsonl
//       tiktoken itself (npm `tiktoken`: its Rust core, fancy-regex included, in WebAssembly) with
//       E's own pattern or Kimi-K2's, every special token allowed: the reference for the folders
//       written with --raw, whose patterns are as their authors wrote them (`\s` not spelled out)
//   tiktoken.mjs decode --encoding E --in IDS.jsonl --out HEXFILE
import fs from "node:fs";
import path from "node:path";
import { parseArgs, need, die, readLines, writeLines, findNodeDir, requireFrom, cli } from "./lib.mjs";

const USAGE = "usage: tiktoken.mjs write|kimi-write|encode|kimi-encode|rust-encode|decode --encoding o200k_base|cl100k_base --out FILE|DIR [--in FILE] [--like DIR] [--raw] [--kimi] [--node-dir DIR]";

// js-tiktoken's encoder of an encoding and the lines of its rank file, built once per process
// (under serve.mjs, parity.sh's commands share them).
const encoders = new Map(), rankFiles = new Map();
function encoder(nodeDir, encoding) {
  if (!encoders.has(encoding)) {
    const { Tiktoken } = requireFrom(nodeDir, "js-tiktoken/lite");
    const ranks = requireFrom(nodeDir, `js-tiktoken/ranks/${encoding}`);
    encoders.set(encoding, new Tiktoken(ranks.default ?? ranks));
  }
  return encoders.get(encoding);
}
function rankLines(enc, encoding) {
  if (!rankFiles.has(encoding))
    rankFiles.set(encoding, [...enc.textMap.entries()].sort((a, b) => a[0] - b[0]).map(([rank, bytes]) => `${Buffer.from(bytes).toString("base64")} ${rank}`));
  return rankFiles.get(encoding);
}

const hexToString = (h) => Buffer.from(h, "hex").toString("utf8");
const JS_SPACE = "\\t\\n\\x{0B}\\f\\r \\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}\\x{FEFF}";

// JavaScript's \s and \S written out as the characters they are in JS (inside a class: the list).
function jsSpaces(pattern) {
  let out = "", inClass = false;
  for (let i = 0; i < pattern.length; i++) {
    const c = pattern[i];
    if (c === "\\") {
      const n = pattern[i + 1];
      if (n === "s") out += inClass ? JS_SPACE : `[${JS_SPACE}]`;
      else if (n === "S") { if (inClass) die("tiktoken.mjs: \\S inside a class"); out += `[^${JS_SPACE}]`; }
      else out += c + n;
      i++;
      continue;
    }
    if (c === "[" && !inClass) inClass = true;
    else if (c === "]" && inClass) inClass = false;
    out += c;
  }
  return out;
}

// Kimi-K2's pat_str pieces (tokenization_kimi.py), and the same in JavaScript's syntax.
const KIMI = [
  String.raw`[\p{Han}]+`,
  String.raw`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?`,
  String.raw`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?`,
  String.raw`\p{N}{1,3}`,
  String.raw` ?[^\s\p{L}\p{N}]+[\r\n]*`,
  String.raw`\s*[\r\n]+`,
  String.raw`\s+(?!\S)`,
  String.raw`\s+`,
];
// JavaScript's spelling of the same: (?i:...) written out (Node 20 has no inline modifiers), the
// script as Script=Han (what tiktoken's regex crate takes an unqualified script name to mean: its
// UNICODE.md, "\p{Greek} selects the Greek script"; PCRE2 >= 10.40 would take Script_Extensions,
// so trill writes \p{sc=Han}), and the union left of && bracketed ([A B&&C] is [[A B]&&C] in v mode).
const CASE_SUFFIX = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])";
const kimiJs = () =>
  new RegExp(KIMI.join("|").replaceAll("\\p{Han}", "\\p{Script=Han}").replaceAll("(?i:'s|'t|'re|'ve|'m|'ll|'d)", CASE_SUFFIX)
    .replace(/\[([^\[\]]*?)&&/g, "[[$1]&&"), "gv");

// tiktoken's byte-pair merge of one piece over the ranks (rank of the joined bytes, leftmost on ties).
function bytePairMerge(enc, bytes) {
  const whole = enc.rankMap.get(bytes.join(","));
  if (whole !== undefined) return [whole];
  const rankOf = (a, b) => enc.rankMap.get(bytes.slice(a, b).join(",")) ?? Infinity;
  const starts = [...bytes.keys(), bytes.length];
  for (;;) {
    let best = Infinity, at = -1;
    for (let i = 0; i + 2 < starts.length; i++) {
      const r = rankOf(starts[i], starts[i + 2]);
      if (r < best) best = r, at = i;
    }
    if (at < 0) break;
    starts.splice(at + 1, 1);
  }
  return starts.slice(0, -1).map((s, i) => enc.rankMap.get(bytes.slice(s, starts[i + 1]).join(",")));
}

// Special tokens first (leftmost, longest), the text between them split by the pattern.
function kimiEncode(enc, text) {
  const specials = Object.keys(enc.specialTokens);
  const ids = [];
  let rest = text;
  while (rest.length) {
    let at = rest.length, hit = null;
    for (const sp of specials) {
      const i = rest.indexOf(sp);
      if (i >= 0 && (i < at || (i === at && sp.length > hit.length))) at = i, hit = sp;
    }
    for (const m of rest.slice(0, at).matchAll(kimiJs())) ids.push(...bytePairMerge(enc, [...Buffer.from(m[0], "utf8")]));
    if (!hit) break;
    ids.push(enc.specialTokens[hit]);
    rest = rest.slice(at + hit.length);
  }
  return ids;
}

export function main(argv) {
  const opts = parseArgs(argv, USAGE, ["raw", "kimi"]);
  const spaces = (p) => (opts.raw ? p : jsSpaces(p));
  const [cmd] = opts._;
  const encoding = need(opts, "encoding", USAGE);
  if (!["o200k_base", "cl100k_base"].includes(encoding)) die(USAGE);
  const nodeDir = findNodeDir(opts, null);
  const enc = encoder(nodeDir, encoding);
  switch (cmd) {
    case "kimi-write": {
      const out = need(opts, "out", USAGE);
      fs.mkdirSync(out, { recursive: true });
      writeLines(path.join(out, `${encoding}.tiktoken`), rankLines(enc, encoding));
      const decoder = Object.fromEntries(Object.entries(enc.specialTokens).map(([content, id]) => [String(id), { content, special: true }]));
      fs.writeFileSync(path.join(out, "tokenizer_config.json"), JSON.stringify({ added_tokens_decoder: decoder }, null, 1));
      const q = '"""';
      const pieces = KIMI.map((p) => `            r${q}${spaces(p)}${q},`).join("\n");
      fs.writeFileSync(path.join(out, "tokenization_kimi.py"),
                       `class TikTokenTokenizer:\n    num_reserved_special_tokens = 256\n\n    pat_str = "|".join(\n        [\n${pieces}\n        ]\n    )\n`);
      break;
    }
    case "kimi-encode":
      writeLines(need(opts, "out", USAGE), readLines(need(opts, "in", USAGE)).map((h) => JSON.stringify(kimiEncode(enc, hexToString(h)))));
      break;
    case "write": {
      const out = need(opts, "out", USAGE);
      fs.mkdirSync(out, { recursive: true });
      writeLines(path.join(out, `${encoding}.tiktoken`), rankLines(enc, encoding));
      let pattern = spaces(enc.patStr), specials = Object.entries(enc.specialTokens).map(([content, id]) => ({ id, content }));
      if (opts.like) {
        const tj = JSON.parse(fs.readFileSync(path.join(opts.like, "tokenizer.json"), "utf8"));
        const split = tj.pre_tokenizer.pretokenizers.find((p) => p.type === "Split");
        pattern = split.pattern.Regex;
        specials = tj.added_tokens.map((t) => ({ id: t.id, content: t.content }));
      }
      const decoder = Object.fromEntries(specials.map(({ id, content }) => [String(id), { content, special: true, lstrip: false, rstrip: false }]));
      fs.writeFileSync(path.join(out, "tokenizer_config.json"), JSON.stringify({ added_tokens_decoder: decoder }, null, 1));
      if (pattern.includes('"""')) die("tiktoken.mjs: the pattern contains triple quotes");
      fs.writeFileSync(path.join(out, "tokenization_test.py"), `# the split pattern, as Kimi-K2's tokenization_kimi.py gives it\npat_str = r"""${pattern}"""\n`);
      break;
    }
    case "encode":
      writeLines(need(opts, "out", USAGE), readLines(need(opts, "in", USAGE)).map((h) => JSON.stringify(enc.encode(hexToString(h), "all"))));
      break;
    case "rust-encode": {
      const { Tiktoken } = requireFrom(nodeDir, "tiktoken/lite");
      const def = requireFrom(nodeDir, `tiktoken/encoders/${encoding}.json`);
      const rust = new Tiktoken(def.bpe_ranks, def.special_tokens, opts.kimi ? KIMI.join("|") : def.pat_str);
      writeLines(need(opts, "out", USAGE), readLines(need(opts, "in", USAGE)).map((h) => JSON.stringify(Array.from(rust.encode(hexToString(h), "all")))));
      rust.free();
      break;
    }
    case "decode": {
      const lines = readLines(need(opts, "in", USAGE)).map((l) => {
        try {
          const bytes = [];
          for (const id of JSON.parse(l)) bytes.push(...(enc.textMap.get(id) ?? new TextEncoder().encode(Object.keys(enc.specialTokens).find((k) => enc.specialTokens[k] === id) ?? "\u0000!")));
          return Buffer.from(Buffer.from(bytes).toString("utf8"), "utf8").toString("hex");
        } catch {
          return "!unparsable";
        }
      });
      writeLines(need(opts, "out", USAGE), lines);
      break;
    }
    default:
      die(USAGE);
  }
  return 0;
}

await cli(import.meta.url, main);
