/* tokenizer.json as jansson objects, for the library and its tests (the public API,
 * trill/tokenizer.h, takes text or a folder). */
#ifndef TRILL_MODEL_TOKENIZER_JSON_H
#define TRILL_MODEL_TOKENIZER_JSON_H

#include <jansson.h>

#include "trill/tokenizer.h"

/* Builds from a parsed tokenizer.json; `what` names it in messages. */
trill_status trill_tokenizer_from_json(const json_t *root, const char *what, trill_tokenizer **out);

/* The character-level tokenizer.json written by `trill init`: special tokens
 * "<|endoftext|>" (id 0, end of sequence) and "<unk>" (id 1), then "\n" and printable ASCII. */
json_t *trill_tokenizer_charlevel_json(void);

#endif
