/* Chat rendering from a jansson object, for the library and its tests (trill/chat.h is the
 * public API). */
#ifndef TRILL_MODEL_CHAT_JSON_H
#define TRILL_MODEL_CHAT_JSON_H

#include <jansson.h>

#include "trill/chat.h"

/* trill_chat_render_tools from {"messages": [{"role", "content", "reasoning_content"?,
 * "tool_calls"?}...], "tools"?: [...], "add_generation_prompt"?: bool, "enable_thinking"?: bool};
 * a tool call is {"type"?, "function": {"name", "arguments"}} or {"name", "arguments"}, its
 * arguments an object or a string; "content": null is none. */
trill_status trill_chat_render_json(const trill_chat_template *t, const json_t *conversation, char **out);

/* trill_chat_render_after_turn from a JSON array of messages (as in trill_chat_render_json). */
trill_status trill_chat_render_after_turn_json(const trill_chat_template *t, const json_t *messages, bool add_generation_prompt,
                                               int enable_thinking, char **out);

/* The tool calls of a model's turn (trill_chat_parse_tool_calls) as a jansson array. */
trill_status trill_chat_parse_tool_calls_json(const trill_chat_template *t, const char *text, json_t **calls, int *errors);

/* A built-in renderer by its family id (trill_chat_template_family) with the given special
 * tokens, without a tokenizer_config.json: for tests, which need not carry the template text. */
trill_status trill_chat_template_builtin(const char *id, const char *bos_token, const char *eos_token, trill_chat_template **out);

#endif
