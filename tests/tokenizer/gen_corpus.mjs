// Deterministic tokenizer test corpus: one line per string, the HEX of its raw bytes, so that
// newlines, "\r" and invalid UTF-8 survive the trip through line-oriented tools.
// Usage: gen_corpus.mjs --vocab qwen3|deepseek_v3|llama2 --seed N --count N --out FILE
//        [--model DIR] [--node-dir DIR] [--stats FILE]
// Categories come in blocks (fixed cases first) so a failing line number tells its category;
// --stats writes the per-category line ranges.
// Character pools stick to code points assigned by Unicode 6 or so (emoji: 12), so that the
// oracle's answers do not move with the Unicode version of the Node/ICU that runs it.
import fs from "node:fs";
import path from "node:path";
import { parseArgs, need, die, writeLines, modelDirFor, mulberry32 } from "./lib.mjs";

const USAGE =
  "usage: gen_corpus.mjs --vocab qwen3|deepseek_v3|llama2 --seed N --count N --out FILE [--model DIR] [--node-dir DIR] [--stats FILE]";
const opts = parseArgs(process.argv.slice(2), USAGE);
const vocab = need(opts, "vocab", USAGE);
if (!["qwen3", "deepseek_v3", "llama2"].includes(vocab)) die(USAGE);
const seed = Number(need(opts, "seed", USAGE));
const count = Number(need(opts, "count", USAGE));
const out = need(opts, "out", USAGE);
const modelDir = opts.model ?? modelDirFor(vocab, opts);
const addedTokens = JSON.parse(fs.readFileSync(path.join(modelDir, "tokenizer.json"), "utf8"))
  .added_tokens.map((t) => t.content);

const rand = mulberry32((seed ^ 0x9e3779b9) >>> 0); // the seeded PRNG (lib.mjs)
const int = (n) => Math.floor(rand() * n); // 0..n-1
const between = (lo, hi) => lo + int(hi - lo + 1); // inclusive
const pick = (a) => a[int(a.length)];
const chance = (p) => rand() < p;
const cp = (c) => String.fromCodePoint(c);
const times = (n, f) => Array.from({ length: n }, f).join("");
const cpLen = (s) => Array.from(s).length;
const cpSlice = (s, a, b) => Array.from(s).slice(a, b).join("");

// ---- pools
const WORDS = ("the of and to in is you that it he was for on are as with his they at be this from " +
  "have or by one had not but what all were when we there can an your which their said if do will " +
  "each about how up out them then she many some so these would other into has more her two like him " +
  "see time could no make than first been its who now people my made over did down only way find use " +
  "may water long little very after words called just where most know get through back much before " +
  "go good new write our used me man too any day same right look think also around another came come " +
  "work three word must because does part even place well such here take why things help put years " +
  "different away again off went old number great tell men say small every found still between name " +
  "should Mr home big give air line set own under read last never us left end along while might next " +
  "sound below saw something thought both few those always looked show large often together asked " +
  "house don't world going want school important until form food keep children feet land side without " +
  "boy once animals life enough took sometimes four head above kind began almost live page got earth " +
  "Hello HELLO Python JavaScript tokenizer Tokenizer GPU CUDA OpenAI Qwen DeepSeek iPhone McDonald " +
  "supercalifragilisticexpialidocious antidisestablishmentarianism pneumonoultramicroscopic").split(" ");
const WS_ATOMS = [" ", " ", " ", "  ", "    ", "\t", "\t\t", "\n", "\n", "\r\n", "\r", "\n\n", "\n\n\n",
  "\u00a0", "\u3000", "\u2028", "\u2029", "\u0085", "\u000b", "\u000c", "\u2003", "\u200a", "\u1680", "\u202f",
  "\u180e"]; // (U+180E: in PCRE2's \s, in neither Oniguruma's nor Rust's regex crate's)
const PUNCT = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~".split("").concat(
  ["…", "—", "–", "‘", "’", "“", "”", "«", "»", "¡", "¿", "§", "¶", "•", "·", "※", "‼", "⁇", "。", "、", "！", "？", "「", "」", "《", "》", "【", "】", "〜"]);
const HANZI = "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长知民样现分将外但身些与高意进把法此实回二理美点月明其种声全工己话儿者向情部正名定女问力机给等几很业最间新什打便位因重被走电四第门相次东政海口使教西再平真听世气信北少关并内加化由却代军产入先山五太水万市眼体别处总才场师书比住员九笑性通目华报立马命张活难神数件安表原车白应路期叫死常提感金何更反合放做系计或司利受光王果亲界及今京务制解各任至清物台象记边共风战干接它许八特觉望直服毛林题建南度统色字请交爱让认算论百吃义科怎元社术结六功指思非流每青管夫连远资队跟带花快条院变联言权往展该领传近留红治决周保达办运武半候七必城父强步完革深区即求品士转量空甚众技轻程告江语英基派满式李息写呢识极令黄德收脸钱党倒未持取设始版双历越史商千片容研像找友孩站广改议形委早房音火际则首单据导影失拿网香似斯专石若兵弟谁校读志飞观争究包组造落视济喜离虽坏兴切湖";
const KANA = () => cp(chance(0.5) ? between(0x3041, 0x3094) : between(0x30a1, 0x30fa));
const HANGUL = () => cp(between(0xac00, 0xd7a3));
const CJK_PUNCT = ["、", "。", "！", "？", "「", "」", "『", "』", "（", "）", "：", "；", "，", "・", "ー", "〜", "〇", "々"];
const CJK_SENTENCES = ["你好，世界！", "我爱自然语言处理。", "今天天气很好，我们去公园散步吧。", "机器学习模型需要大量的数据。",
  "こんにちは、世界！", "東京は日本の首都です。", "カタカナとひらがなと漢字。", "ありがとうございます。",
  "안녕하세요, 세계!", "한국어 토크나이저 테스트입니다.", "大規模言語モデル（LLM）", "中文English混合text测试123",
  "第1章：简介", "価格は¥1,000です", "𠀀𠀁𠀂𪚥 𠮷野家", "ｶﾀｶﾅ ﾊﾝｶｸ", "Ｆｕｌｌｗｉｄｔｈ　ＡＢＣ　１２３"];
const EMOJI = ["😀", "😂", "🤣", "❤️", "❤", "👍", "🔥", "🎉", "✨", "🙏", "😭", "🥺", "🤔", "👀", "💯", "🚀", "🌍", "🍕",
  "⚽", "🎵", "☕", "⭐", "✅", "❌", "⚠️", "©️", "™️", "↩️", "🆗", "🈯", "🀄", "🃏"];
const EMOJI_SEQ = ["👍🏻", "👍🏽", "👍🏿", "👋🏼", "👨‍👩‍👧‍👦", "👩🏽‍💻", "🏳️‍🌈", "🧑‍🤝‍🧑", "👁️‍🗨️", "❤️‍🔥", "🤷‍♀️", "🙋🏾‍♂️",
  "👨🏻‍🦰", "🇺🇸", "🇯🇵", "🇩🇪", "🇨🇳", "🇫🇷", "🇧🇷", "🇰🇷", "🇪🇺", "1️⃣", "#️⃣", "*️⃣", "🏴󠁧󠁢󠁥󠁮󠁧󠁿", "🏴󠁧󠁢󠁳󠁣󠁴󠁿"];
const ACCENT_WORDS = ["café", "naïve", "résumé", "Ångström", "façade", "piñata", "Zürich", "São Paulo", "Tiếng Việt",
  "Łódź", "Dvořák", "Ελληνικά", "crème brûlée", "jalapeño", "coöperate", "Beyoncé", "Øresund", "Ærø", "señor",
  "über", "Straße", "Ça va", "À bientôt", "ÉCOLE", "Việt Nam", "Nguyễn", "Đà Nẵng", "İstanbul", "ğüşöçı"];
// NFC changes these even though they look composed: singletons, reordering, Hangul jamo, exclusions
const NFC_TRICKY = ["\u212b", "\u2126", "\u212a", "\u0340", "\u0341", "\u0343", "\u0374", "\u037e", "\u0387",
  "\uf900", "\uf91d", "\ufa10", "\u1100\u1161", "\u1100\u1161\u11a8", "\u110b\u1175", "a\u0323\u0301", "a\u0301\u0323",
  "e\u0301\u0302", "o\u0308\u0304", "\u0958", "\u0915\u093c", "\u2000", "\u2001", "\u1e9b\u0323", "q\u0307\u0323",
  "\u0041\u030a", "\u03a9\u0301", "\u0627\u0653", "\u05d0\u05b7", "\u00c5\u0301", "\u0ddd", "\u0dd9\u0dcf\u0dca"];
// NFC keeps these (compatibility characters): a normalizer doing NFKC by mistake would differ
const NFC_KEEPS = ["ﬁ", "ﬀ", "ℌ", "①", "²", "½", "™", "ｶ", "Ａ", "㍻", "ℕ", "𝐀", "𝑥", "𝔸", "ſ", "µ", "Ⅻ", "ǆ"];
const SCRIPT_TEXT = ["مرحبا بالعالم، كيف حالك؟", "العَرَبِيَّةُ لُغَةٌ جَمِيلَةٌ", "می‌خواهم بروم", "שָׁלוֹם עוֹלָם", "עברית היא שפה",
  "नमस्ते दुनिया", "हिन्दी भाषा में क्षत्रिय", "สวัสดีชาวโลก", "ภาษาไทยไม่มีช่องว่าง", "Привет, мир! Ёжик и щука.",
  "СЪЕШЬ ЖЕ ЕЩЁ ЭТИХ МЯГКИХ", "Γειά σου Κόσμε", "ΐ ΰ ϊ ϋ ά έ ή ί ό ύ ώ", "Բարեւ աշխարհ", "გამარჯობა მსოფლიო",
  "ওহে বিশ্ব", "வணக்கம் உலகம்", "ሰላም ልዑል", "ສະບາຍດີ", "မင်္ဂလာပါ", "ជំរាបសួរ", "ᐊᐃᓐᓇᐅᓯᖅ", "\u200fRTL\u200e mark",
  "abc\u202edcba\u202c", "Україна їжак ґанок", "Ölçü ıIiİ", "Ÿ ÿ ŉ", "ﷲ ﷺ"];
const MATH = ["∑", "∫", "√", "∞", "≠", "≤", "≥", "±", "×", "÷", "∂", "∇", "∈", "∉", "⊂", "⊃", "∪", "∩", "→", "⇒", "↔", "ℝ",
  "ℕ", "ℤ", "ℚ", "∀", "∃", "∅", "≈", "≡", "⊕", "⊗", "∧", "∨", "¬", "°", "′", "″", "‰", "∝", "∠", "⊥", "∥", "⌈", "⌉",
  "⌊", "⌋", "⟨", "⟩", "α", "β", "γ", "δ", "ε", "θ", "λ", "μ", "π", "σ", "φ", "ω", "Δ", "Σ", "Ω", "₀", "₁", "₂", "⁰", "¹",
  "²", "³", "ⁿ", "€", "£", "¥", "₹", "₩", "¢", "$", "─", "│", "┌", "┐", "└", "┘", "├", "┼", "═", "║", "█", "░", "▲", "●", "◆", "★"];
const MATH_TEXT = ["x² + y² = z²", "∀ε>0 ∃δ>0: |x−a|<δ ⇒ |f(x)−f(a)|<ε", "∫₀^∞ e^{-x²} dx = √π/2",
  "\\frac{a}{b} + \\sqrt{2}", "$E = mc^2$", "a_{i,j} = \\sum_{k=1}^{n} b_{ik} c_{kj}", "P(A|B) = P(B|A)P(A)/P(B)",
  "f'(x) = 2x", "1/2 + 1/3 = 5/6", "n! ≈ √(2πn)(n/e)^n", "3 × 4 = 12 ÷ 1", "0.1 + 0.2 ≠ 0.3", "λx.x", "𝐯 = (v₁, v₂)"];
const URLS = ["https://example.com/path?q=1&r=2#frag", "http://localhost:8080/", "mailto:someone@example.org",
  "ftp://ftp.example.net/pub/file.tar.gz", "www.google.com", "user.name+tag@sub.example.co.uk",
  "C:\\Users\\foo\\Documents\\file.txt", "/usr/local/bin/python3", "https://例え.jp/パス?クエリ=値",
  "https://en.wikipedia.org/wiki/Unicode_(disambiguation)", "https://github.com/huggingface/tokenizers/blob/main/README.md",
  "git@github.com:user/repo.git", "s3://bucket/key/with%20space", "http://[::1]:3000/api/v1/users/42",
  "data:text/plain;base64,SGVsbG8sIFdvcmxkIQ==", "../../etc/passwd", "~/.bashrc", "https://a.b/c?d=e&f=g&h=%E2%9C%93"];
const CONTRACTION_BASES = ["don", "can", "won", "isn", "aren", "I", "you", "they", "she", "he", "we", "it", "that",
  "there", "who", "what", "let", "y'all", "o", "rock 'n", "ma"];
const CONTRACTION_SUFFIXES = ["s", "t", "re", "ve", "m", "ll", "d", "S", "T", "RE", "Re", "rE", "VE", "vE", "M", "LL",
  "Ll", "lL", "D", "x", "z", "sa", "tt", "dd", "ss"];
const CODE = [
  "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
  "class Foo(Bar):\n    \"\"\"Docstring.\"\"\"\n\n    def __init__(self, x: int = 0) -> None:\n        super().__init__()\n        self.x = x\n",
  "for i in range(10):\n\tprint(f\"{i:>4d} {i**2}\")\n",
  "import numpy as np\nx = np.arange(12).reshape(3, 4)\nprint(x @ x.T)  # matmul\n",
  "#include <stdio.h>\n\nint main(int argc, char **argv) {\n    printf(\"Hello, %s!\\n\", argv[0]);\n    return 0;\n}\n",
  "static inline uint32_t rotl(uint32_t x, int k) {\n\treturn (x << k) | (x >> (32 - k));\n}\n",
  "for (size_t i = 0; i < n; ++i) {\n        if (a[i] != b[i]) { return -1; }\n}\n",
  "{\n  \"name\": \"trill\",\n  \"version\": \"0.1.0\",\n  \"tags\": [\"a\", \"b\"],\n  \"nested\": {\"x\": 1.5e-3, \"y\": null}\n}",
  "{\"a\":1,\"b\":[true,false,null],\"c\":\"\\u00e9\\n\"}",
  "const f = async (x) => {\n  const r = await fetch(`/api/${x}`);\n  return r.json();\n};\n",
  "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC LIMIT 10;",
  "#!/bin/bash\nset -euo pipefail\nfor f in *.txt; do\n  echo \"$f\" | tr a-z A-Z\ndone\n",
  "<div class=\"container\">\n  <p>Hello &amp; welcome</p>\n</div>\n",
  "fn main() {\n    let v: Vec<i32> = (0..10).map(|x| x * 2).collect();\n    println!(\"{:?}\", v);\n}\n",
  "    return x;\n\n\n\n    }\n  }\n}",
  "if (x) {\r\n    y = 1;\r\n}\r\n",
  "   \t  mixed_indent = True\n\t    other = False\n",
  "x=1;y=2;z=x+y;print(z)",
  "// comment with trailing spaces   \n/* block\n * comment\n */\n",
  "a = [1,2,3]\nb = {k: v for k, v in zip('abc', a)}\nassert b['a'] == 1\n",
];
// Ranges assigned long ago (stable across Unicode versions), for random code points.
const STABLE_RANGES = [[0x20, 0x7e], [0x20, 0x7e], [0x00, 0x1f], [0x7f, 0x9f], [0xa0, 0x24f], [0x250, 0x2af],
  [0x391, 0x3a1], [0x3a3, 0x3c9], [0x400, 0x4ff], [0x5d0, 0x5ea], [0x621, 0x63a], [0x641, 0x64a], [0x660, 0x669],
  [0x905, 0x939], [0x966, 0x96f], [0xe01, 0xe3a], [0x1e00, 0x1e9b], [0x1ea0, 0x1ef9], [0x2010, 0x2027],
  [0x2190, 0x21ff], [0x2200, 0x22ff], [0x2500, 0x257f], [0x2600, 0x2613], [0x3041, 0x3094], [0x30a1, 0x30fa],
  [0x4e00, 0x9fa5], [0xac00, 0xd7a3], [0xff01, 0xff5e], [0x1f600, 0x1f64f], [0x1d400, 0x1d454], [0x20000, 0x2a6d6]];
const randomCodePoint = () => { const [lo, hi] = pick(STABLE_RANGES); return between(lo, hi); };

// Special tokens of this vocabulary; placeholders (DeepSeek has 800) are sampled, not listed.
const notPlaceholder = addedTokens.filter((t) => !t.includes("place▁holder"));
const specialToken = () => (chance(0.9) || notPlaceholder.length === addedTokens.length ? pick(notPlaceholder) : pick(addedTokens));
// Those of the other vocabulary: plain text here, which the tokenizer must not treat as special.
const FOREIGN_TOKENS = vocab === "qwen3"
  ? ["<｜User｜>", "<｜Assistant｜>", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<|EOT|>"]
  : ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>"].concat(vocab === "llama2" ? ["[INST]", "<<SYS>>"] : []);

// ---- generators, one per category
const word = () => pick(WORDS);
const sentence = () => times(between(1, 12), (_, i) => (i ? " " : "") + word()) + pick(["", ".", "!", "?", ",", ":"]);

function numbers() {
  const digits = (n) => times(n, (_, i) => String(i === 0 && n > 1 ? between(1, 9) : int(10)));
  const forms = [
    () => digits(between(1, 25)),
    () => `${digits(between(1, 6))}.${digits(between(1, 8))}`,
    () => { let s = String(between(1, 999)); for (let k = between(1, 4); k > 0; --k) s += "," + String(int(1000)).padStart(3, "0"); return s; },
    () => `-${digits(between(1, 7))}`,
    () => `${between(1, 9)}.${digits(3)}e${pick(["", "-", "+"])}${between(1, 30)}`,
    () => `v${int(20)}.${int(20)}.${int(100)}`,
    () => `${String(int(24)).padStart(2, "0")}:${String(int(60)).padStart(2, "0")}:${String(int(60)).padStart(2, "0")}`,
    () => `${between(1900, 2099)}-${String(between(1, 12)).padStart(2, "0")}-${String(between(1, 28)).padStart(2, "0")}`,
    () => `0x${int(2 ** 31).toString(16).toUpperCase()}`,
    () => `${digits(between(1, 3))}%`,
    () => `+1 (${digits(3)}) ${digits(3)}-${digits(4)}`,
    () => times(between(1, 8), () => cp(0x660 + int(10))), // Arabic-Indic digits
    () => times(between(1, 8), () => cp(0x966 + int(10))), // Devanagari digits
    () => times(between(1, 8), () => cp(0xff10 + int(10))), // fullwidth digits
    () => pick(["²", "³", "¹", "½", "¾", "⅓", "Ⅻ", "ⅷ", "①", "⑩", "𝟘𝟙𝟚", "٣.١٤", "〇一二三", "0", "00", "007", "1,000", "3.14159"]),
    () => `${word()} ${digits(between(1, 12))} ${word()}`,
    () => `${digits(between(1, 4))}${word()}${digits(between(1, 4))}`,
    () => `$${digits(between(1, 5))}.${digits(2)}`,
  ];
  return times(between(1, 4), () => pick(forms)() + pick(["", " ", " ", ", ", "\n", "x", "-"]));
}

function whitespace() {
  const forms = [
    () => times(between(1, 6), () => pick(WS_ATOMS)),
    () => pick(WS_ATOMS) + sentence() + times(between(1, 3), () => pick(WS_ATOMS)),
    () => times(between(2, 6), () => word() + times(between(1, 3), () => pick(WS_ATOMS))),
    () => " ".repeat(between(1, 40)) + word(),
    () => word() + " ".repeat(between(1, 40)),
    () => "\t".repeat(between(1, 10)) + word() + "\n".repeat(between(1, 5)),
    () => word() + pick([" \n ", "  \n  ", "\n \n", " \r\n", "\r\n\r\n", "\n\t\n", "  \n", "\n  "]) + word(),
    () => times(between(1, 5), () => pick(["\r\n", "\n", "\r"])) + sentence(),
  ];
  return pick(forms)();
}

function code() {
  let s = pick(CODE);
  if (chance(0.3)) s = s.replace(/^ {4}/gm, pick(["  ", "\t", "        ", "   "]));
  if (chance(0.2)) s = s.replace(/\n/g, "\r\n");
  if (chance(0.3)) s = s.replace(/\b(x|fib|main|Foo|name)\b/g, () => pick(WORDS).replace(/\W/g, "") || "v");
  if (chance(0.3)) s = cpSlice(s, int(cpLen(s)), cpLen(s));
  return s;
}

function cjk() {
  const forms = [
    () => pick(CJK_SENTENCES),
    () => times(between(1, 30), () => HANZI[int(HANZI.length)]),
    () => times(between(1, 20), KANA),
    () => times(between(1, 15), HANGUL) + pick(["", " ", "다.", "요?"]),
    () => times(between(1, 6), () => pick([HANZI[int(HANZI.length)], KANA(), HANGUL(), pick(CJK_PUNCT), word(), " ", String(int(100))])),
    () => times(between(1, 6), () => cp(between(0x20000, 0x2a6d6))), // CJK Ext B: astral
    () => times(between(1, 8), () => cp(between(0xff66, 0xff9d))), // halfwidth katakana
    () => times(between(1, 6), () => cp(between(0x9fa0, 0x9fbb))) + HANZI[int(HANZI.length)], // near DeepSeek's \u9fa5 edge
  ];
  return times(between(1, 3), () => pick(forms)());
}

function emoji() {
  const forms = [
    () => times(between(1, 8), () => pick(EMOJI)),
    () => times(between(1, 5), () => pick(EMOJI_SEQ)),
    () => sentence() + " " + pick(EMOJI) + pick(EMOJI_SEQ),
    () => times(between(1, 7), () => cp(0x1f1e6 + int(26))), // regional indicators, odd counts too
    () => pick(EMOJI) + cp(0x1f3fb + int(5)) + (chance(0.5) ? "\u200d" : "") + pick(EMOJI),
    () => word() + "\u200d" + word() + "\ufe0f" + word(),
    () => times(between(1, 10), () => cp(between(0x1f600, 0x1f64f))),
  ];
  return pick(forms)();
}

function accents() {
  const w = pick(ACCENT_WORDS);
  const forms = [
    () => w,
    () => w.normalize("NFD"),
    () => Array.from(w).map((c) => (chance(0.5) ? c.normalize("NFD") : c)).join(""),
    () => w.normalize("NFD") + " " + w,
    () => pick(NFC_TRICKY),
    () => times(between(1, 4), () => pick(NFC_TRICKY) + pick(["", " ", "x"])),
    () => pick(NFC_KEEPS) + pick(NFC_KEEPS) + " " + pick(NFC_KEEPS),
    () => pick(["a", "e", "o", "u", " ", "1", "\n", "ㄱ"]) + times(between(1, 6), () => cp(between(0x300, 0x36f))),
    () => "e\u0301" + pick(["", " ", "\n"]) + "e\u0301".repeat(between(1, 4)),
    () => times(between(1, 5), () => cp(0x1100 + int(19)) + cp(0x1161 + int(21)) + (chance(0.5) ? cp(0x11a8 + int(27)) : "")),
    () => sentence().replace(/[aeiou]/g, (c) => c + cp(between(0x300, 0x308))),
  ];
  return times(between(1, 3), () => pick(forms)() + pick(["", " ", ", "]));
}

function scripts() {
  const forms = [
    () => pick(SCRIPT_TEXT),
    () => pick(SCRIPT_TEXT) + " " + pick(SCRIPT_TEXT),
    () => pick(SCRIPT_TEXT) + " " + sentence(),
    () => cpSlice(pick(SCRIPT_TEXT), 0, between(1, 10)),
    () => times(between(3, 30), () => cp(randomCodePoint())),
  ];
  return pick(forms)();
}

function math() {
  return pick([
    () => pick(MATH_TEXT),
    () => times(between(1, 12), () => pick(MATH) + (chance(0.3) ? " " : "")),
    () => `${pick(["x", "y", "n", "f(x)"])} ${pick(MATH)} ${between(0, 99)} ${pick(MATH)} ${pick(["α", "β", "π", "∞"])}`,
  ])();
}

function urls() {
  const host = () => times(between(1, 3), (_, i) => (i ? "." : "") + word().toLowerCase().replace(/\W/g, "")) + pick([".com", ".org", ".io", ".de", ".cn"]);
  return pick([
    () => pick(URLS),
    () => `${pick(["http", "https"])}://${host()}/${times(between(0, 4), () => word().replace(/\W/g, "") + "/")}${chance(0.5) ? "?id=" + int(99999) : ""}`,
    () => `See ${pick(URLS)} for details.`,
    () => `${word()}.${word()}@${host()}`.replace(/'/g, ""),
    () => `<${pick(URLS)}>` + pick(["", ",", "."]),
  ])();
}

function contractions() {
  const c = () => pick(CONTRACTION_BASES) + pick(["'", "'", "'", "’"]) + pick(CONTRACTION_SUFFIXES);
  return pick([
    () => times(between(1, 6), () => c() + " " + word() + " "),
    () => pick(["don't", "DON'T", "I'm", "I'M", "they'll", "THEY'LL", "she'd", "we've", "you're", "it's", "IT'S", "'s",
      "O'Neil", "rock 'n' roll", "'twas", "don’t", "''", "'''", "y'all'd've", "ain't", "'S'T'RE", "x'", "'", "He said 'hi'"]),
    () => sentence().replace(/ /g, () => (chance(0.2) ? pick(["'s ", "'LL ", "'d ", "'Ve ", "' ", "'m "]) : " ")),
    () => c().toUpperCase() + " " + c().toLowerCase(),
  ])();
}

function punctuation() {
  const run = () => times(between(1, 12), () => pick(PUNCT));
  return pick([
    () => run(),
    () => run() + pick(["\n", "\r\n", "\n\n", " \n", ""]) + run(),
    () => word() + run() + word(),
    () => " " + run() + "\n\n" + sentence(),
    () => pick(["...", "!!!", "???", "?!", "---", "___", "***", "===", "<<<>>>", "((()))", "[[]]", "{{}}", "\"\"\"", "'''",
      "```", "```python\n", "-->", "<!--", "//", "/* */", "#!", "$$", "%%", "&&", "||", "::", ";;", "…", "——", "«»", "¿¡"]),
    () => times(between(2, 6), () => sentence() + pick(PUNCT)),
  ])();
}

function specials() {
  const t = specialToken;
  const partial = (s) => cpSlice(s, 0, between(1, cpLen(s) - 1));
  return pick([
    () => t(),
    () => t() + t() + t(),
    () => `${t()}${word()}\n${sentence()}${t()}`,
    () => `${word()}${t()}${word()}`,
    () => ` ${t()} `,
    () => `${pick(WS_ATOMS)}${t()}${pick(WS_ATOMS)}${t()}\n`,
    () => partial(t()),
    () => partial(t()) + t() + partial(t()),
    () => t().slice(1),
    () => "<" + t() + ">",
    () => t().toUpperCase(),
    () => t() + pick(["\u0301", "\u0308", "\u200d", "\ufe0f"]), // combining mark right after a token
    () => pick(FOREIGN_TOKENS) + sentence() + pick(FOREIGN_TOKENS),
    () => `${t()}${pick(["user", "assistant", "system"])}\n${sentence()}${t()}\n${t()}${pick(["assistant", "user"])}\n`,
    () => `${t()}${t().slice(0, -1)}`,
    () => times(between(2, 5), () => t() + pick(["", " ", "\n", word(), pick(EMOJI), HANZI[int(HANZI.length)]])),
  ])();
}

const GENERATORS = { numbers, whitespace, code, cjk, emoji, accents, scripts, math, urls, contractions, punctuation, specials };
const anyFragment = () => {
  const f = pick([...Object.values(GENERATORS), sentence, sentence, () => cp(randomCodePoint())]);
  return f() + pick(["", "", " ", "\n", "  ", "\t"]);
};

function mixed() {
  const target = between(1, 300);
  let s = "";
  while (cpLen(s) < target) s += anyFragment();
  return cpSlice(s, 0, target);
}

function long() {
  return pick([
    () => String(between(1, 9)).repeat(between(500, 3000)),
    () => " ".repeat(between(500, 3000)) + "x",
    () => "a".repeat(between(500, 3000)),
    () => "\n".repeat(between(200, 1000)),
    () => times(between(200, 1000), () => HANZI[int(HANZI.length)]),
    () => times(between(100, 400), () => word() + " "),
    () => times(between(100, 300), () => pick(EMOJI)),
    () => "e\u0301".repeat(between(200, 800)),
    () => times(between(20, 40), () => anyFragment()),
  ])();
}

// Invalid UTF-8: raw byte sequences spliced into valid text at random byte offsets (which may
// also cut a multi-byte character in half).
const BAD = ["80", "bf", "8080", "c0af", "c180", "e080af", "f08080af", "f8888080", "fc8480808080", "ff", "fe", "c2",
  "e282", "e2", "f09f98", "f09f", "f4908080", "f5808080", "eda080", "edbfbf", "edafbfedb080", "c3", "e4bd", "ce"];
function invalid() {
  const base = Buffer.from(chance(0.2) ? "" : mixed(), "utf8");
  const parts = [];
  let at = 0;
  const cuts = Array.from({ length: between(1, 3) }, () => int(base.length + 1)).sort((a, b) => a - b);
  for (const c of cuts) {
    parts.push(base.subarray(at, c), Buffer.from(pick(BAD), "hex"));
    at = c;
  }
  parts.push(base.subarray(at));
  return Buffer.concat(parts);
}

// ---- fixed cases: the spec's explicit examples and known edge cases
function fixedCases() {
  const tok = notPlaceholder;
  const im = { qwen3: ["<|im_start|>", "<|im_end|>"], deepseek_v3: ["<｜User｜>", "<｜Assistant｜>"], llama2: ["<s>", "</s>"] }[vocab];
  const valid = [
    "", "1", "12", "123", "1234", "12345", "1234567", "3.14159", "1,000", "1,000,000", "-42", "0.5", "٣٤٥", "１２３",
    " ", "  ", "   ", "\t", "\t\t", "\n", "\r\n", "\r", "\n\n\n", "\r\n\r\n", "hello   ", "   hello", "  \n  ",
    "a \n b", "a\n\n\nb", "x\t \ty", " \u00a0 ", "\u3000", "\u0085", "a\u0085b", "a \u0085 b", "\u2028\u2029", "a \u180e b", " \u180e", "x\u180e",
    "\ufeff", "\ufeffhello", "a\ufeffb", "hello\ufeff", "\u200b", "a\u200bb", "\u00ad", "\u0000", "a\u0000b", "\u007f",
    "\u001b[31mred\u001b[0m", "\u000b\u000c", "don't", "I'M", "they'll", "THEY'LL", "we'Re", "it's", "It'S", "'s",
    "Hello, world!", "Hello world", " Hello", "hello.world", "HTTP/1.1 200 OK",
    "e\u0301", "\u00e9", "e\u0301\u00e9", "\u212b", "\u1100\u1161\u11a8", "ﬁ①²",
    "你好", "こんにちは", "안녕하세요", "👍🏽", "👨‍👩‍👧‍👦", "🇺🇸🇯🇵", "\u{1F600}", "𝐀𝐁𝐂", "𠮷",
    "def f(x):\n    return x\n", "{\"a\": [1, 2]}", "    indented", "\ttabbed",
    "...", "!!!", "?!?!", "--", "a--b", "'''", "\"\"", "@@@", "<<>>",
    "<|im_start|>user\nhi<|im_end|>", "<|im_sta", "<|im_start|", "<|", "|>", "<|im_end|><|im_end|>", "<<|im_end|>>",
    "<｜User｜>hi<｜Assistant｜>", "<｜User", "<｜begin▁of▁sentence｜>", "<think>\n\n</think>\n\n", "</think>",
    `${im[0]}`, `${im[1]}`, `${im[0]}${im[1]}`, ` ${im[0]}`, `${im[0]} `, `\n${im[1]}\n`, `a${im[0]}b`, `${im[1]}\u0301`,
    `${im[0]}user\ne\u0301${im[1]}`, `${im[0]}   `, `   ${im[1]}`,
  ];
  for (const t of tok) valid.push(t, `x${t}y`, ` ${t}\n`, cpSlice(t, 0, cpLen(t) - 1));
  const badHex = ["80", "ff", "c0af", "eda080", "e282", "f09f98", "61ff62", "68656c6c6fc3", "f4908080", "efbbbf", "efbbbf61"];
  // efbbbf is a valid BOM: listed here as hex so the line is exactly those bytes
  return { valid, badHex };
}

// ---- assemble
const lines = [];
const ranges = [];
function block(name, n, make) {
  const start = lines.length;
  for (let i = 0; i < n; ++i) lines.push(make());
  if (n > 0) ranges.push({ name, first: start + 1, last: start + n });
}
const fixed = fixedCases();
block("fixed", fixed.valid.length, (() => { let i = 0; return () => fixed.valid[i++]; })());
block("fixed-bytes", fixed.badHex.length, (() => { let i = 0; return () => Buffer.from(fixed.badHex[i++], "hex"); })());

const WEIGHTS = [["numbers", 8], ["whitespace", 8], ["code", 6], ["cjk", 8], ["emoji", 6], ["accents", 7], ["scripts", 7],
  ["math", 4], ["urls", 4], ["contractions", 5], ["punctuation", 5], ["specials", 9], ["long", 1], ["invalid", 3]];
const rest = Math.max(0, count - lines.length);
const sized = WEIGHTS.map(([name, w]) => [name, Math.floor((rest * w) / 100)]);
const mixedCount = rest - sized.reduce((a, [, n]) => a + n, 0);
const ALL = { ...GENERATORS, long, invalid, mixed };
for (const [name, n] of [...sized, ["mixed", mixedCount]]) block(name, n, ALL[name]);

// Valid lines must round-trip through UTF-8 (no lone surrogates); invalid ones must not.
let nInvalid = 0;
const hex = lines.map((l, i) => {
  const bytes = typeof l === "string" ? Buffer.from(l, "utf8") : l;
  const ok = Buffer.from(bytes.toString("utf8"), "utf8").equals(bytes);
  if (typeof l === "string" && bytes.toString("utf8") !== l) die(`internal error: line ${i + 1} has a lone surrogate`, 1);
  if (!ok) ++nInvalid;
  return bytes.toString("hex");
});
writeLines(out, hex);
if (opts.stats) {
  const table = ranges.map((r) => `${r.name.padEnd(12)} ${String(r.last - r.first + 1).padStart(5)}  lines ${r.first}-${r.last}`);
  table.push(`${"total".padEnd(12)} ${String(lines.length).padStart(5)}  (${nInvalid} with invalid UTF-8)`);
  fs.writeFileSync(opts.stats, table.join("\n") + "\n");
}
