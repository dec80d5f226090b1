/* RL datasets: JSONL prompts with a ground truth, rendered through a template and tokenised.
 *
 * Each line is a JSON object. The prompt text is the template with every {field} replaced by
 * that field of the line (a string or a number; "{{" and "}}" are literal braces; the empty
 * template is the prompt field alone), or with
 * template "chat" the model's chat template applied to one user message holding the prompt
 * field, with the generation prompt added. The answer field is kept as text for the rewards.
 * The order of a pass is a permutation keyed by (seed, epoch), so any position of a run can be
 * recomputed from the step alone (that is how a resumed run finds its place). */
#ifndef TRILL_DATASET_H
#define TRILL_DATASET_H

#include <stdbool.h>
#include <stdint.h>

#include "trill/chat.h"
#include "trill/error.h"
#include "trill/tokenizer.h"

typedef struct trill_dataset_options {
    const char *prompt_field, *answer_field;
    const char *template_;          /* "{prompt}" style, "chat", or "" (the prompt field as it is) */
    const trill_chat_template *chat; /* needed for "chat" */
    int max_prompt_tokens;
    int limit;                      /* read at most this many lines (0: all) */
    bool allow_missing_answer;      /* a line without the answer field gets "" (else: an error naming it) */
    int max_position_embeddings;    /* the model's; with max_new_tokens, a prompt whose sequence would not */
    int max_new_tokens;             /* fit is refused (0: not checked) */
    /* SFT: the field of the target completion (NULL: none). Each line then needs the prompt and
     * the completion as strings; the completion is tokenised (no special tokens). Instead of the
     * prompt checks above, an example (prompt, completion and the end-of-sequence token) longer
     * than max_seq_len or the model's max_position_embeddings is refused naming its line, or
     * with truncate loses the end of its completion (at least one completion token must fit). */
    const char *completion_field;
    int max_seq_len;
    bool truncate;
} trill_dataset_options;

typedef struct trill_example {
    char *prompt;   /* the rendered prompt text */
    char *answer;   /* the ground truth ("" when the line has none and that is allowed) */
    int *ids;       /* the prompt's tokens */
    int n_ids;
    int *completion_ids; /* SFT: the completion's tokens (no end-of-sequence token), else NULL */
    int n_completion;
} trill_example;

typedef struct trill_dataset {
    char *path;
    int n;
    trill_example *examples;
} trill_dataset;

trill_status trill_dataset_load(const char *path, const trill_tokenizer *tok, const trill_dataset_options *opt,
                                trill_dataset **out);
void trill_dataset_free(trill_dataset *d);

/* The examples at positions pos .. pos + count - 1 of the endless stream epoch 0, 1, ...: each
 * epoch a permutation keyed by (seed, epoch) when shuffling, else file order. */
trill_status trill_dataset_order(const trill_dataset *d, uint64_t seed, bool shuffle, int64_t pos, int count, int *out);

#endif
