/* Chat formatting: a conversation rendered into exactly the string its model's Jinja
 * chat_template produces (as transformers' apply_chat_template renders it), by a built-in
 * renderer per template. The renderer is chosen by tokenizer_config.json's chat_template, which
 * must be one of the known texts (Qwen3, DeepSeek-V3, Llama-2-chat, Mixtral-8x7B-Instruct,
 * Mixtral-8x22B-Instruct); any other template is refused, never approximated, and the refusal
 * names what it looks like (gpt-oss's Harmony and Kimi's are not rendered). Tool calls and tool
 * messages are not supported yet. A conversation the template itself refuses (its
 * raise_exception: the [INST] templates' role alternation) is refused with its message. */
#ifndef TRILL_CHAT_H
#define TRILL_CHAT_H

#include <stdbool.h>
#include <stddef.h>

#include "trill/error.h"

typedef struct trill_chat_template trill_chat_template;

typedef struct trill_chat_message {
    const char *role;              /* "system", "user" or "assistant" */
    const char *content;
    const char *reasoning_content; /* optional (Qwen3 thinking); NULL when absent */
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

#endif
