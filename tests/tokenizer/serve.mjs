// Runs the commands of compare.mjs, oracle.mjs, pretok.mjs, templates.mjs and tiktoken.mjs for
// parity.sh in one node process, so that node starts once and each package and vocabulary is
// loaded once per test run instead of once per command (about a second for Qwen3's tokenizer;
// the test runs some 200 commands).
// Usage: serve.mjs OUTFILE <REQUESTS 3>REPLIES
//   A request is the number of its fields, then the fields: the script's name without .mjs
//   ("oracle") and its arguments, each field ended by a NUL byte. For each request serve.mjs
//   runs the script's main, writes what the command printed (stdout and stderr in order) to
//   OUTFILE, then its exit status as a line to file descriptor 3. It ends at the end of REQUESTS.
import fs from "node:fs";
import { capture } from "./lib.mjs";
import { main as compare } from "./compare.mjs";
import { main as oracle } from "./oracle.mjs";
import { main as pretok } from "./pretok.mjs";
import { main as templates } from "./templates.mjs";
import { main as tiktoken } from "./tiktoken.mjs";

const SCRIPTS = { compare, oracle, pretok, templates, tiktoken };
const [outFile] = process.argv.slice(2);
if (outFile === undefined) {
  process.stderr.write("usage: serve.mjs OUTFILE <REQUESTS 3>REPLIES\n");
  process.exit(2);
}

async function run([script, ...argv]) {
  const main = SCRIPTS[script];
  const { status, text } = main
    ? await capture(main, argv)
    : { status: 2, text: `serve.mjs: unknown script ${script} (known: ${Object.keys(SCRIPTS).join(", ")})\n` };
  fs.writeFileSync(outFile, text);
  fs.writeSync(3, `${status}\n`);
}

process.stdin.setEncoding("utf8");
let pending = "";
const fields = [];
for await (const chunk of process.stdin) {
  pending += chunk;
  for (let end; (end = pending.indexOf("\0")) >= 0; pending = pending.slice(end + 1)) {
    fields.push(pending.slice(0, end));
    if (fields.length === Number(fields[0]) + 1) await run(fields.splice(0).slice(1));
  }
}
