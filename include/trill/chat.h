/* Chat formatting: a conversation rendered into exactly the string its model's Jinja
 * chat_template produces, by a built-in renderer per template family. The family is chosen
 * from tokenizer_config.json's chat_template, which must be one of the known templates
 * (Qwen3, DeepSeek-V3); any other template is refused, never approximated. Tool calls and
 * tool messages are not supported yet. */
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

/* Reads DIR/tokenizer_config.json (chat_template, bos_token). */
trill_status trill_chat_template_load(const char *dir, trill_chat_template **out);
void trill_chat_template_free(trill_chat_template *t);
const char *trill_chat_template_family(const trill_chat_template *t); /* "qwen3" or "deepseek_v3" */

/* enable_thinking: -1 leaves it undefined (the template's default), 0 false, 1 true.
 * *out is malloc'ed and NUL-terminated. */
trill_status trill_chat_render(const trill_chat_template *t, const trill_chat_message *messages, size_t n,
                               bool add_generation_prompt, int enable_thinking, char **out);

#endif
