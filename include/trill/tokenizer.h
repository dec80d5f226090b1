/* Tokenizer from a Hugging Face tokenizer.json.
 *
 * This module reads the character-level WordLevel form that `trill init` writes
 * (one token per Unicode character, added/special tokens matched first) and refuses
 * other models by name. Byte-level BPE (Qwen3, DeepSeek-V3) is a separate issue. */
#ifndef TRILL_TOKENIZER_H
#define TRILL_TOKENIZER_H

#include <jansson.h>
#include <stddef.h>

#include "trill/error.h"

typedef struct trill_tokenizer trill_tokenizer;

/* Reads DIR/tokenizer.json. */
trill_status trill_tokenizer_load(const char *dir, trill_tokenizer **out);
void trill_tokenizer_free(trill_tokenizer *tok);

/* ids: malloc'ed array of *n ids. */
trill_status trill_tokenizer_encode(const trill_tokenizer *tok, const char *text, size_t len, int **ids, size_t *n);
/* text: malloc'ed, NUL-terminated; *len excludes the NUL. Unknown ids are an error. */
trill_status trill_tokenizer_decode(const trill_tokenizer *tok, const int *ids, size_t n, char **text, size_t *len);

/* Number of ids the tokenizer can produce (largest id + 1). */
int trill_tokenizer_size(const trill_tokenizer *tok);

/* The character-level tokenizer.json written by `trill init`: special tokens
 * "<|endoftext|>" (id 0, end of sequence) and "<unk>" (id 1), then "\n" and printable ASCII. */
json_t *trill_tokenizer_charlevel_json(void);

#endif
