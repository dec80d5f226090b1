// Tokenizers built here for the pre-tokenizers WhitespaceSplit, Whitespace, Punctuation (every
// behaviour) and BertPreTokenizer, alone and in Sequences, over WordLevel and byte-level BPE;
// the reference is the Rust `tokenizers` crate itself (the npm package `tokenizers`, its Node
// binding, pinned in package.json).
// Usage (--node-dir as in lib.mjs):
//   pretok.mjs corpus --seed N --count N --base HEXFILE --out HEXFILE
//       the base corpus (gen_corpus.mjs) followed by N lines of whitespace, punctuation of every
//       Unicode P* category, ASCII symbols and word-class edge cases
//   pretok.mjs build --in HEXFILE --bpe-model DIR --out DIR
//       one folder per configuration (DIR/NAME/tokenizer.json), listed in DIR/names. A WordLevel
//       vocabulary holds the corpus's pre-tokens as the Rust crate splits them, but one in eight
//       (left out so that unk_token is exercised too); BPE configurations take DIR's vocabulary
//       and merges with a pre-tokenizer of ours in front of ByteLevel
//   pretok.mjs sweep --out DIR [--stride K]
//       every code point between two letters, split by the crate: DIR/NAME/{tokenizer.json,ref.jsonl}
//   pretok.mjs sweep-newer --ref REF.jsonl --ours OURS.jsonl --newer whole|split|none
//       a sweep's comparison, which tolerates only characters of Unicode versions after PCRE2's
//   pretok.mjs encode --model DIR --in HEXFILE --out IDS.jsonl
//       the Rust crate's ids (tokenizers.js implements these pre-tokenizers differently: README.md)
import fs from "node:fs";
import path from "node:path";
import { parseArgs, need, die, readLines, writeLines, findNodeDir, requireFrom, say, cli } from "./lib.mjs";

const USAGE = "usage: pretok.mjs corpus|build|encode|sweep|sweep-newer [--seed N --count N --base F] [--in F] [--out F] [--model DIR] [--bpe-model DIR] [--ref F --ours F --newer K] [--node-dir DIR]";
const hexToString = (h) => Buffer.from(h, "hex").toString("utf8");
const stringToHex = (s) => Buffer.from(s, "utf8").toString("hex");

const WORDLEVEL = {
  whitespace_split: { type: "WhitespaceSplit" },
  whitespace: { type: "Whitespace" },
  bert: { type: "BertPreTokenizer" },
  punctuation_default: { type: "Punctuation" },
  ...Object.fromEntries(["Isolated", "Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous"].map(
    (b) => [`punctuation_${b}`, { type: "Punctuation", behavior: b }])),
  seq_whitespace_digits: { type: "Sequence", pretokenizers: [{ type: "Whitespace" }, { type: "Digits", individual_digits: false }] },
  seq_wssplit_punct_next: { type: "Sequence", pretokenizers: [{ type: "WhitespaceSplit" }, { type: "Punctuation", behavior: "MergedWithNext" }] },
  seq_bert_digits: { type: "Sequence", pretokenizers: [{ type: "BertPreTokenizer" }, { type: "Digits", individual_digits: true }] },
};
// Code point sweeps: the punctuation class (all behaviours share it), White_Space, and \w/\s.
// And a Split's regex escapes, which the crate runs on Oniguruma: \s, \S (also inside a negated
// class, as GPT-2's pattern has it), \w, \d, and a bare script name (Script, not PCRE2's
// Script_Extensions). Each sweep names the difference that Unicode
// versions after PCRE2's (14; the crate's is 16) may make, which sweep-newer tolerates: "whole",
// a character new to 15 or 16 that keeps "x" c "x" whole in the crate and splits it here;
// "split", the reverse; "none" for White_Space, which has not changed since.
const split = (Regex) => ({ type: "Split", pattern: { Regex }, behavior: "Isolated", invert: false });
const SWEEP = { sweep_punctuation: [{ type: "Punctuation" }, "none"], sweep_whitespace_split: [{ type: "WhitespaceSplit" }, "none"],
  sweep_whitespace: [{ type: "Whitespace" }, "whole"], sweep_split_s: [split("\\s+"), "none"], sweep_split_S: [split("\\S+"), "none"],
  sweep_split_class_s: [split("[^\\s\\p{L}\\p{N}]+"), "whole"], sweep_split_w: [split("\\w+"), "whole"], sweep_split_d: [split("\\d+"), "split"],
  sweep_split_han: [split("\\p{Han}+"), "split"] };
const BYTE_LEVEL = { type: "ByteLevel", add_prefix_space: false, trim_offsets: false, use_regex: false };
const BPE = {
  bpe_bert: { type: "Sequence", pretokenizers: [{ type: "BertPreTokenizer" }, BYTE_LEVEL] },
  bpe_whitespace: { type: "Sequence", pretokenizers: [{ type: "Whitespace" }, BYTE_LEVEL] },
  bpe_punct_prev: { type: "Sequence", pretokenizers: [{ type: "Punctuation", behavior: "MergedWithPrevious" }, BYTE_LEVEL] },
};

function wordLevel(pre, vocab) {
  return { version: "1.0", truncation: null, padding: null, added_tokens: [], normalizer: null, pre_tokenizer: pre,
    post_processor: null, decoder: null, model: { type: "WordLevel", vocab, unk_token: "[UNK]" } };
}

// FNV-1a of the UTF-8 bytes: which pre-tokens stay out of a vocabulary, the same on every run.
function hash(s) {
  let h = 0x811c9dc5;
  for (const b of Buffer.from(s, "utf8")) h = Math.imul(h ^ b, 0x01000193) >>> 0;
  return h;
}

// ---- the extra corpus lines: seeded mulberry32 as gen_corpus.mjs
function extraLines(seed, count) {
  let state = (seed ^ 0x85ebca6b) >>> 0;
  const rand = () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  const pick = (a) => a[Math.floor(rand() * a.length)];
  // Code points assigned by Unicode 6 or earlier, whose categories have not moved since.
  const POOLS = {
    // White_Space, and look-alikes that are not: U+180E (Cf since Unicode 6.3), U+200B, U+FEFF, U+2060
    space: [" ", "  ", "\t", "\n", "\r\n", "\u000b", "\u000c", "\u0085", "\u00a0", "\u1680", "\u2000", "\u2007", "\u200a",
      "\u2028", "\u2029", "\u202f", "\u205f", "\u3000", "\u180e", "\u200b", "\ufeff", "\u2060", "\u001c", "\u001f"],
    // P*: Pc Pd Ps Pe Pi Pf Po from many scripts; ASCII symbols that is_ascii_punctuation counts
    punct: [..."!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~", "_", "\u203f", "\u2040", "\ufe4f", "\uff3f", "-", "\u2010", "\u2013",
      "\u2014", "\u2e17", "\u301c", "\u058a", "\u05be", "(", "\u0f3a", "\u2045", "\u207d", "\u2329", "\u3008", "\uff08",
      "\u0f3b", "\u2046", "\u3009", "\uff09", "\u00ab", "\u2018", "\u201c", "\u2039", "\u2e02", "\u00bb", "\u2019",
      "\u201d", "\u203a", "\u2e03", "\u00a1", "\u00a7", "\u00b6", "\u00b7", "\u00bf", "\u037e", "\u0387", "\u055a",
      "\u0589", "\u05c3", "\u060c", "\u061f", "\u066a", "\u06d4", "\u0964", "\u0965", "\u0970", "\u0e4f", "\u0f04",
      "\u104a", "\u10fb", "\u1362", "\u166d", "\u16eb", "\u17d4", "\u1802", "\u2016", "\u2020", "\u2026", "\u2030",
      "\u203b", "\u2047", "\u3001", "\u3002", "\u30fb", "\uff01", "\uff0c", "\uff1f", "\ufe10", "\ufe50", "\ua4fe",
      "\u{10100}", "\u{1039f}", "\u{12470}"],
    // symbols and other non-punctuation (S*, not ASCII): must not split
    symbol: ["\u00a2", "\u00a3", "\u20ac", "\u00ac", "\u00b1", "\u00d7", "\u2200", "\u2192", "\u00a8", "\u02c2", "\u02dc",
      "\u00a6", "\u00a9", "\u00ae", "\u00b0", "\u2122", "\u2600", "\u263a", "\u{1f600}", "\u{1f44d}\u{1f3fd}", "\u2764\ufe0f",
      "\u{1f468}\u200d\u{1f469}\u200d\u{1f467}", "\u{1f1fa}\u{1f1f8}", "\u2460", "\u00bd", "\u00b2"],
    // word characters of the regex crate's \w that ASCII \w lacks, and near misses
    word: ["caf\u00e9", "e\u0301", "\u00c5", "\u0345", "\u24b6\u24b7", "\u2160\u2161", "\u3007", "x\u200dy", "a\u200cb",
      "\u0660\u0661", "\u0966", "\uff10\uff11", "\u00b2\u00b3", "\u00bd", "\u2070", "\u02b0", "\u16ee", "\u1e9b", "\u4e2d\u6587",
      "\u3042\u30a2", "\ud55c\uad6d\uc5b4", "\u0645\u0631\u062d\u0628\u0627", "\u05e9\u05dc\u05d5\u05dd", "\u0928\u092e\u0938\u094d\u0924\u0947",
      "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35", "\u041f\u0440\u0438\u0432\u0435\u0442", "\u{1d400}\u{1d401}", "\u{20000}", "snake_case",
      "x1", "42", "3.14", "1,000", "foo", "Bar", "\u00df", "\u0130", "\u0131"],
  };
  const kinds = Object.keys(POOLS);
  const lines = [];
  for (let i = 0; i < count; ++i) {
    const n = 1 + Math.floor(rand() * 12);
    let s = "";
    for (let k = 0; k < n; ++k) {
      const pool = POOLS[rand() < 0.3 ? "space" : pick(kinds)];
      const reps = rand() < 0.2 ? 2 + Math.floor(rand() * 3) : 1; // runs of the same piece
      s += pick(pool).repeat(reps);
    }
    lines.push(stringToHex(s));
  }
  // and a few fixed ones: empty, only spaces, only punctuation, invalid UTF-8 between punctuation
  lines.push("", "20", "2020090a", "21", "212121", "2e2e2e20616263", "41ff42", "21c32121", "e2809c68e2809d", "efbbbf21");
  return lines;
}

// The crate's number of pieces for each "x" c "x", from one pass over "x c0 x c1 x ... x" (1.1M
// separate calls take seconds a sweep): the pieces that overlap c's window, characters 2i to 2i+2
// (the crate's offsets count characters). That is the count "x" c "x" alone gives, since windows
// share only an x, and no class swept here joins an x to a neighbour's c differently.
function sweepCounts(splitter, cps) {
  const pieces = splitter.preTokenizeString(`x${cps.join("x")}x`).map(([, [start, end]]) => [start, end]);
  const counts = [];
  let first = 0; // the first piece that may overlap the current window
  for (let i = 0; i < cps.length; ++i) {
    const lo = 2 * i, hi = 2 * i + 3;
    while (first < pieces.length && pieces[first][1] <= lo) ++first;
    let n = 0;
    for (let k = first; k < pieces.length && pieces[k][0] < hi; ++k) ++n;
    counts.push(n);
  }
  return counts;
}

export async function main(argv) {
  const opts = parseArgs(argv, USAGE);
  const [cmd] = opts._;
  const rust = () => requireFrom(findNodeDir(opts, null), "tokenizers");
  switch (cmd) {
    case "corpus": {
      const base = readLines(need(opts, "base", USAGE));
      writeLines(need(opts, "out", USAGE), base.concat(extraLines(Number(need(opts, "seed", USAGE)), Number(need(opts, "count", USAGE)))));
      break;
    }
    case "build": {
      const { Tokenizer } = rust();
      const corpus = readLines(need(opts, "in", USAGE)).map(hexToString);
      const out = need(opts, "out", USAGE);
      const names = [];
      const write = (name, json) => {
        fs.mkdirSync(path.join(out, name), { recursive: true });
        fs.writeFileSync(path.join(out, name, "tokenizer.json"), JSON.stringify(json));
        fs.writeFileSync(path.join(out, name, "tokenizer_config.json"), "{}\n");
        names.push(name);
      };
      for (const [name, pre] of Object.entries(WORDLEVEL)) {
        const splitter = Tokenizer.fromString(JSON.stringify(wordLevel(pre, { "[UNK]": 0 }))).getPreTokenizer();
        const vocab = { "[UNK]": 0 };
        let size = 1;
        for (const s of corpus)
          for (const [piece] of splitter.preTokenizeString(s))
            if (!(piece in vocab) && hash(piece) % 8 !== 0 && !piece.includes("\0")) vocab[piece] = size++; // jansson: no NUL in keys
        write(name, wordLevel(pre, vocab));
      }
      const bpe = JSON.parse(fs.readFileSync(path.join(need(opts, "bpe-model", USAGE), "tokenizer.json"), "utf8"));
      for (const [name, pre] of Object.entries(BPE)) write(name, { ...bpe, pre_tokenizer: pre });
      writeLines(path.join(out, "names"), names);
      break;
    }
    case "encode": {
      const json = fs.readFileSync(path.join(need(opts, "model", USAGE), "tokenizer.json"), "utf8");
      const lines = readLines(need(opts, "in", USAGE)).map(hexToString);
      const tok = rust().Tokenizer.fromString(json);
      const ids = [];
      for (const s of lines) ids.push((await tok.encode(s, null, { addSpecialTokens: false })).getIds());
      writeLines(need(opts, "out", USAGE), ids.map((a) => JSON.stringify(Array.from(a))));
      break;
    }
    case "sweep": {
      // Every code point c (no surrogates) as "x" c "x", split by the Rust crate: the number of
      // pieces, as the ids of a vocabulary of [UNK] alone ([0,0,0] for 3) to compare with ours.
      const { Tokenizer } = rust();
      const out = need(opts, "out", USAGE);
      fs.mkdirSync(out, { recursive: true });
      // --stride K (make test's sample): every code point below U+3400 (the scripts, punctuation
      // and spaces of most text), then every K-th one (offset 7, off the blocks' starts).
      const stride = Number(opts.stride ?? 1);
      if (!Number.isInteger(stride) || stride < 1) die(`sweep: --stride ${opts.stride}: expected a positive integer`);
      const cps = [];
      for (let c = 0; c <= 0x10ffff; ++c)
        if ((c < 0xd800 || c > 0xdfff) && (stride === 1 || c < 0x3400 || c % stride === 7)) cps.push(String.fromCodePoint(c));
      writeLines(path.join(out, "cps.hex"), cps.map((c) => stringToHex(`x${c}x`)));
      for (const [name, [pre, newer]] of Object.entries(SWEEP)) {
        const json = wordLevel(pre, { "[UNK]": 0 });
        fs.mkdirSync(path.join(out, name), { recursive: true });
        fs.writeFileSync(path.join(out, name, "tokenizer.json"), JSON.stringify(json));
        fs.writeFileSync(path.join(out, name, "newer"), newer + "\n");
        const splitter = Tokenizer.fromString(JSON.stringify(json)).getPreTokenizer();
        writeLines(path.join(out, name, "ref.jsonl"), sweepCounts(splitter, cps).map((n) => JSON.stringify(Array(n).fill(0))));
      }
      writeLines(path.join(out, "names"), Object.keys(SWEEP));
      break;
    }
    case "sweep-newer": {
      // Passes when the only differences are of the kind --newer names (see SWEEP): the crate one
      // piece ("x" c "x" whole) and ours three for "whole", the reverse for "split", none for "none".
      const ref = readLines(need(opts, "ref", USAGE)), ours = readLines(need(opts, "ours", USAGE));
      const kind = need(opts, "newer", USAGE);
      const tolerated = { whole: ["[0]", "[0,0,0]"], split: ["[0,0,0]", "[0]"], none: [] }[kind] ?? die(`sweep-newer: --newer ${kind}: expected whole, split or none`);
      if (ref.length !== ours.length) die(`sweep-newer: ${ref.length} reference lines but ${ours.length} of ours`, 1);
      let newer = 0, bad = 0;
      for (let i = 0; i < ref.length; ++i) {
        if (ref[i] === ours[i]) continue;
        if (ref[i] === tolerated[0] && ours[i] === tolerated[1]) { ++newer; continue; }
        if (++bad <= 5) say(`sweep: code point line ${i + 1} splits into ${JSON.parse(ref[i]).length} pieces in the crate, ${JSON.parse(ours[i]).length} here`);
      }
      const note = kind === "none" ? "" : ` (${newer} characters of Unicode > 14 that PCRE2 does not know)`;
      say(`sweep: ${ref.length} code points compared, ${bad} mismatches${note}`);
      return bad === 0 ? 0 : 1;
    }
    default:
      die(USAGE);
  }
  return 0;
}

await cli(import.meta.url, main);
