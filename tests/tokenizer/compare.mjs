// Line-by-line comparison of an expected file A with an actual file B.
// Usage: compare.mjs A B --what LABEL [--hex] [--src HEXFILE]
//   default: each line is JSON (id arrays or strings), compared by value
//   --hex:   each line is hex bytes, compared case-insensitively and shown decoded
//   --src:   the corpus (hex lines) the records came from, to show each mismatch's input
// Prints the number compared and the first 5 mismatches; exits 1 on any mismatch or count difference.
import { parseArgs, need, die, readLines, say, cli } from "./lib.mjs";

const USAGE = "usage: compare.mjs A B --what LABEL [--hex] [--src HEXFILE]";
const SHOW = 5;

const clip = (s, n = 160) => (s.length > n ? s.slice(0, n) + `...(${s.length} chars)` : s);
// JSON-quoted, with invisible and combining characters spelled out (so "e\u0301" differs from "é").
const show = (s) => clip(JSON.stringify(s).replace(/(?! )[\p{Cf}\p{Cn}\p{Co}\p{Z}\p{M}\u0080-\u009f]/gu,
  (c) => `\\u{${c.codePointAt(0).toString(16)}}`));
const hexText = (h) => (/^([0-9a-fA-F]{2})*$/.test(h) ? Buffer.from(h, "hex").toString("utf8") : `<not hex: ${h}>`);
const parse = (line) => { try { return { ok: true, v: JSON.parse(line) }; } catch { return { ok: false, v: line }; } };

// Explains one mismatch: for id arrays, the first differing position with context.
function explain(x, y, hexMode) {
  if (hexMode) {
    const [s, t] = [Array.from(hexText(x)), Array.from(hexText(y))];
    let i = 0;
    while (i < s.length && s[i] === t[i]) ++i;
    const at = (c) => show(c.slice(i, i + 12).join(""));
    return `  expected ${show(s.join(""))}\n  actual   ${show(t.join(""))}\n  first difference at character ${i}: ${at(s)} vs ${at(t)}`;
  }
  const [p, q] = [parse(x), parse(y)];
  if (!p.ok || !q.ok) return `  expected ${clip(x)}\n  actual   ${clip(y)}${q.ok ? "" : "  (not JSON)"}`;
  if (Array.isArray(p.v) && Array.isArray(q.v)) {
    let i = 0;
    while (i < p.v.length && i < q.v.length && p.v[i] === q.v[i]) ++i;
    const ctx = (arr) => `${i > 3 ? "... " : ""}[${arr.slice(Math.max(0, i - 3), i).join(",")}] | [${arr.slice(i, i + 4).join(",")}]${arr.length > i + 4 ? " ..." : ""}`;
    return `  ${p.v.length} vs ${q.v.length} ids, first difference at position ${i}\n  expected ${ctx(p.v)}\n  actual   ${ctx(q.v)}`;
  }
  if (typeof p.v === "string" && typeof q.v === "string") {
    const [s, t] = [Array.from(p.v), Array.from(q.v)];
    let i = 0;
    while (i < s.length && s[i] === t[i]) ++i;
    const ctx = (c) => (i > 30 ? "..." : "") + show(c.slice(Math.max(0, i - 30), i + 40).join(""));
    return `  first difference at character ${i} of ${s.length} vs ${t.length}\n  expected ${ctx(s)}\n  actual   ${ctx(t)}`;
  }
  return `  expected ${clip(x)}\n  actual   ${clip(y)}`;
}

function same(x, y, hexMode) {
  if (hexMode) return x.toLowerCase() === y.toLowerCase();
  if (x === y) return true;
  const [p, q] = [parse(x), parse(y)];
  return p.ok && q.ok && JSON.stringify(p.v) === JSON.stringify(q.v);
}

export function main(argv) {
  const opts = parseArgs(argv, USAGE, ["hex"]);
  if (opts._.length !== 2) die(USAGE);
  const [fileA, fileB] = opts._;
  const what = need(opts, "what", USAGE);
  const hexMode = opts.hex === true;
  const a = readLines(fileA), b = readLines(fileB);
  const src = opts.src ? readLines(opts.src) : null;
  const n = Math.min(a.length, b.length);
  let bad = 0;
  for (let i = 0; i < n; ++i) {
    if (same(a[i], b[i], hexMode)) continue;
    if (++bad <= SHOW) {
      say(`${what}: line ${i + 1} differs`);
      if (src && i < src.length) say(`  input    ${show(hexText(src[i]))}`);
      say(explain(a[i], b[i], hexMode));
    }
  }
  if (bad > SHOW) say(`${what}: ... and ${bad - SHOW} more mismatching lines`);
  if (a.length !== b.length) say(`${what}: line count differs: expected ${a.length}, actual ${b.length}`);
  say(`${what}: ${n} lines compared, ${bad} mismatches`);
  return bad === 0 && a.length === b.length ? 0 : 1;
}

await cli(import.meta.url, main);
