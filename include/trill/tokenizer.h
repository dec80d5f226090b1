/* Tokenizer from a Hugging Face tokenizer.json, token for token equal to HF.
 *
 * Pipeline (as HF tokenizers): added/special tokens are matched first (leftmost-longest;
 * those with "normalized": false on the raw text, the others after normalisation), then the
 * rest is normalised (NFC/NFD/NFKC/NFKD, Prepend, Replace, Sequence), pre-tokenised (Split with
 * a PCRE2 regex or a literal and any HF behaviour, ByteLevel, Metaspace, Digits, Whitespace,
 * WhitespaceSplit, Punctuation, BertPreTokenizer, Sequence) and run through the model:
 * byte-level BPE, BPE over characters (SentencePiece-style, with byte_fallback) or WordLevel.
 * Post-processing adds template special tokens (TemplateProcessing) when asked; decoding runs
 * the decoder chain (ByteLevel, ByteFallback, Replace, Fuse, Strip, Metaspace, Sequence).
 * Anything else is refused by name at load time.
 * Invalid UTF-8 input is first repaired to U+FFFD per maximal subpart, as a UTF-8 decoder with
 * replacement does before text reaches HF. encode/decode are thread-safe. */
#ifndef TRILL_TOKENIZER_H
#define TRILL_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>

#include "trill/error.h"

typedef struct trill_tokenizer trill_tokenizer;

/* Reads DIR/tokenizer.json; without one, a tiktoken vocabulary: DIR/tiktoken.model or
 * DIR/<name>.tiktoken (one "base64-token rank" line per token, every byte a token), the split
 * pattern from DIR/tokenization_*.py's pat_str (Kimi-K2's layout; character-class
 * intersections translated for PCRE2) and the special tokens from DIR/tokenizer_config.json's
 * added_tokens_decoder. Encoding is then tiktoken's: the pattern's matches, each the token of its
 * bytes or their byte-pair merge by rank. */
trill_status trill_tokenizer_load(const char *dir, trill_tokenizer **out);
/* Builds from tokenizer.json text of `len` bytes; `what` names it in messages. */
trill_status trill_tokenizer_parse(const char *text, size_t len, const char *what, trill_tokenizer **out);
void trill_tokenizer_free(trill_tokenizer *tok);

/* ids: malloc'ed array of *n ids. add_special_tokens applies the post-processor's template
 * (e.g. a BOS); special tokens written in the text are matched either way. */
trill_status trill_tokenizer_encode(const trill_tokenizer *tok, const char *text, size_t len, bool add_special_tokens,
                                    int **ids, size_t *n);
/* text: malloc'ed, NUL-terminated, valid UTF-8; *len excludes the NUL. Unknown ids are an error. */
trill_status trill_tokenizer_decode(const trill_tokenizer *tok, const int *ids, size_t n, bool skip_special_tokens,
                                    char **text, size_t *len);

/* trill_tokenizer_decode that never fails on an id: one the tokenizer has no string for (a
 * model's vocabulary can be larger than its tokenizer's) is written as "<id>". Special tokens
 * are kept. */
trill_status trill_tokenizer_decode_lenient(const trill_tokenizer *tok, const int *ids, int n, char **text, size_t *len);

/* Number of ids the tokenizer can produce (largest id + 1). */
int trill_tokenizer_size(const trill_tokenizer *tok);
/* The id of a token string (vocabulary or added token), or -1. */
int trill_tokenizer_token_id(const trill_tokenizer *tok, const char *token);


#endif
