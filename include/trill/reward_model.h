/* A reward model: a Hugging Face Qwen3ForSequenceClassification (or
 * Qwen3MoeForSequenceClassification) checkpoint with one label, scoring whole texts.
 *
 * HF's score (transformers GenericForSequenceClassification.forward): logits = score(final-normed
 * hidden states), pooled at each row's rightmost token that is not pad_token_id (the last token
 * when the config has none). trill packs the texts without padding, so it pools at the last
 * token after dropping trailing pad_token_id tokens the text itself ends with (all pad: its
 * first token, as HF's argmax over an all-zero mask does); causal attention makes that the
 * same hidden state HF reads.
 *
 * The text is what the reward model reads, exactly: HF reward models are trained on the
 * chat-formatted conversation (tokenizer.apply_chat_template(messages, tokenize=True), which
 * tokenizes the rendered template without adding special tokens). So the caller renders the
 * prompt and completion with the reward model's chat template (trill/chat.h) and passes the
 * result; trill tokenizes it with the reward model's tokenizer.json, add_special_tokens false
 * (special tokens written in the text, such as "<|im_start|>", are matched as such). */
#ifndef TRILL_REWARD_MODEL_H
#define TRILL_REWARD_MODEL_H

#include "trill/error.h"
#include "trill/model.h"

typedef struct trill_reward_model trill_reward_model;

/* Loads DIR/config.json, the weights (TRILL_STORE_CHECKPOINT: a bf16 checkpoint stays bf16)
 * and DIR/tokenizer.json. Refuses a causal LM and a classifier whose num_labels is not 1. */
trill_status trill_reward_model_load(const char *dir, trill_reward_model **out);

/* scores[i] = the reward of texts[i] (see above). The texts are tokenized and run in packed
 * batches of up to a few thousand tokens (one forward per batch; a longer text runs alone).
 * A text with no token is refused. Thread-safe on a shared model. */
trill_status trill_reward_model_score(const trill_reward_model *rm, const char *const *texts, int n, double *scores);

/* The same for token ids already made with the reward model's tokenizer: sequence s is
 * tokens[offsets[s] .. offsets[s+1]), every one non-empty, all in one forward pass. */
trill_status trill_reward_model_score_tokens(const trill_reward_model *rm, const int *tokens, const int *offsets, int n_seqs,
                                             double *scores);

/* The underlying model (its config, its weights). */
const trill_model *trill_reward_model_model(const trill_reward_model *rm);

void trill_reward_model_free(trill_reward_model *rm);

#endif
