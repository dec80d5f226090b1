/* The generator executor: the engine (its weights in generator.dtype, a KV cache, the adapters it
 * was last sent), the sampling settings and stops, and the policy version it holds. It reads the
 * dataset's prompts and the tokenizer; it produces rollout batches and takes weight updates. Used
 * by one thread at a time: the controller's in sync mode, the generator executor's in async. */
#ifndef TRILL_RL_GENERATOR_H
#define TRILL_RL_GENERATOR_H

#include "rl/data/rollout.h"
#include "trill/dataset.h"
#include "trill/infer.h"
#include "trill/lora.h"
#include "trill/model.h"
#include "trill/eval.h"
#include "trill/run_config.h"
#include "trill/tokenizer.h"

typedef struct rl_generator rl_generator;

/* The engine settings of c's generator section for a model of config mc (no tokenizer): the
 * generator's, and generator.on_policy's scoring engine's in the trainer. */
trill_engine_config trill_rl_engine_config(const trill_run_config *c, const trill_config *mc);

/* An engine for `policy`'s base weights (adapters come with the first update) and the request
 * prototype of c's generator section. tok and train must outlive it. */
trill_status trill_rl_generator_create(const trill_run_config *c, const trill_model *policy, const trill_tokenizer *tok,
                                       const trill_dataset *train, rl_generator **out);
void trill_rl_generator_free(rl_generator *g);

/* Episodes' observations rendered by chat (trill_chat_render_after_turn...; NULL: plain). chat must
 * outlive the generator. */
void trill_rl_generator_set_chat(rl_generator *g, const trill_chat_template *chat);

/* Batch `index` of the prompt stream: prompts_per_step prompts in the seeded order, n samples
 * each (request ids by position in the stream), experts captured. between_steps (optional)
 * runs before every engine step. *tokens: response tokens generated. */
trill_status trill_rl_generator_generate(rl_generator *g, int64_t index, trill_status (*between_steps)(void *), void *ctx, rl_batch *out,
                                         long *tokens);

/* The same for some of the batch's prompts: groups[0..n_groups) (ascending places in the batch,
 * [0, prompts_per_step)), each with its request id in the stream, so a replica generating part
 * of a batch gives each of its sequences the tokens the whole batch would. */
trill_status trill_rl_generator_generate_part(rl_generator *g, int64_t index, const int *groups, int n_groups,
                                              trill_status (*between_steps)(void *), void *ctx, rl_batch *out, long *tokens);

/* New weights, applied at the engine's next step: the adapters (adapter sync) or full fp32
 * weights (merge sync); *bytes converted. */
trill_status trill_rl_generator_load_adapter(rl_generator *g, const trill_lora *lora, uint32_t version, size_t *bytes);
trill_status trill_rl_generator_load_weights(rl_generator *g, const trill_model *m, uint32_t version, size_t *bytes);
uint32_t trill_rl_generator_version(const rl_generator *g);
/* An expert-parallel replica: the engine's MoE layers exchange rows with c's ranks
 * (trill_engine_set_expert_comm); every generation is then collective over c. */
trill_status trill_rl_generator_set_expert_comm(rl_generator *g, trill_comm *c);
/* The experts this rank keeps now ([n_moe_layers][num_experts]); false outside a group. */
bool trill_rl_generator_expert_holdings(const rl_generator *g, uint8_t *held);

/* Held-out evaluation on the engine as it is (eval.k samples per prompt at eval.temperature). */
trill_status trill_rl_generator_evaluate(rl_generator *g, const trill_dataset *eval, trill_eval_result *out);

#endif
