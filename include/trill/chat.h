/* Chat formatting: a conversation rendered into exactly the string its model's Jinja
 * chat_template produces (as transformers' apply_chat_template renders it), by a built-in
 * renderer per template. The renderer is chosen by tokenizer_config.json's chat_template, which
 * must be one of the known texts (Qwen3, DeepSeek-V3, Llama-2-chat, Mixtral-8x7B-Instruct,
 * Mixtral-8x22B-Instruct); any other template is refused, never approximated, and the refusal
 * names what it looks like (gpt-oss's Harmony and Kimi's are not rendered). Tools, tool calls and
 * tool messages are rendered by the Qwen3 and DeepSeek-V3 templates (the [INST] ones have none). A
 * conversation the template itself refuses (its raise_exception: the [INST] templates' role
 * alternation) is refused with its message. For multi-turn RL: what a template appends after an
 * assistant turn (trill_chat_render_after_turn) and the tool calls of a model's turn
 * (trill_chat_parse_tool_calls). */
#ifndef TRILL_CHAT_H
#define TRILL_CHAT_H

#include <stdbool.h>
#include <stddef.h>

#include "trill/error.h"

typedef struct trill_chat_template trill_chat_template;

/* A tool call of an assistant turn. */
typedef struct trill_chat_tool_call {
    const char *type;              /* "function" (DeepSeek-V3 writes it; NULL: "function") */
    const char *name;
    const char *arguments;         /* JSON text of an object, rendered as the template's tojson renders it
                                      (Python's json.dumps); with arguments_is_text, text written as it is
                                      (the template's `arguments is string`; DeepSeek-V3 needs it so) */
    bool arguments_is_text;
} trill_chat_tool_call;

typedef struct trill_chat_message {
    const char *role;              /* "system", "user", "assistant" or "tool" */
    const char *content;           /* NULL only for an assistant turn of tool calls (the templates' none) */
    const char *reasoning_content; /* optional (Qwen3 thinking); NULL when absent */
    const trill_chat_tool_call *tool_calls; /* an assistant turn's, or NULL */
    size_t n_tool_calls;
} trill_chat_message;

/* Reads DIR/tokenizer_config.json (chat_template, bos_token, eos_token). */
trill_status trill_chat_template_load(const char *dir, trill_chat_template **out);
void trill_chat_template_free(trill_chat_template *t);
/* "qwen3", "deepseek_v3", "llama2", "mixtral" or "mixtral_8x22b" */
const char *trill_chat_template_family(const trill_chat_template *t);

/* enable_thinking: -1 leaves it undefined (the template's default), 0 false, 1 true (Qwen3's;
 * the others ignore it, and the [INST] templates add_generation_prompt too: a user turn ends in
 * [/INST] either way).
 * *out is malloc'ed and NUL-terminated. */
trill_status trill_chat_render(const trill_chat_template *t, const trill_chat_message *messages, size_t n,
                               bool add_generation_prompt, int enable_thinking, char **out);
/* The same with tools: the JSON text of an array of tool definitions (as passed to
 * apply_chat_template(tools=...)), or NULL. */
trill_status trill_chat_render_tools(const trill_chat_template *t, const trill_chat_message *messages, size_t n, const char *tools,
                                     bool add_generation_prompt, int enable_thinking, char **out);

/* ---- multi-turn RL (Qwen3 and DeepSeek-V3) ----
 * What the template writes after an assistant turn's end (trill_chat_turn_end: the text of the
 * token the model samples to end its turn) for `messages` following it (e.g. tool results), up
 * to and with the generation prompt: rendered after a stand-in turn, never after the real one,
 * so nothing before is re-rendered. */
trill_status trill_chat_render_after_turn(const trill_chat_template *t, const trill_chat_message *messages, size_t n,
                                          bool add_generation_prompt, int enable_thinking, char **out);
/* The text of the token that ends an assistant turn ("<|im_end|>", "<｜end▁of▁sentence｜>"); NULL
 * for a template not used in multi-turn episodes. */
const char *trill_chat_turn_end(const trill_chat_template *t);
/* The tool calls in a model's turn, in the template's format (Qwen3's <tool_call> blocks,
 * DeepSeek-V3's tool-call markers), as the JSON text of an array: {"name", "arguments": object}
 * for each call read, {"error", "text"} for each malformed one (*n_errors); *n_calls the good
 * ones. Another template: no calls. */
trill_status trill_chat_parse_tool_calls(const trill_chat_template *t, const char *text, char **calls_json, int *n_calls, int *n_errors);

#endif
