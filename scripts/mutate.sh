#!/usr/bin/env bash
# Mutation check of the test suite (issue 35): plants each bug of the list below, one at a time,
# rebuilds, runs only the tests the entry names and reports whether one of them failed (CAUGHT),
# all passed (MISSED), none failed but they ran past MUTATE_TIMEOUT (HUNG), or the entry could not
# be run (BROKEN: its snippet is not in its file exactly once, the file has local changes, a named
# test does not exist, or the mutant does not compile). Exits non-zero unless every entry is CAUGHT.
#
#   scripts/mutate.sh [BUILD_DIR] [NAME...]   run every entry, or the named ones (BUILD_DIR: build)
#   scripts/mutate.sh --list                  the entries
#   scripts/mutate.sh --check [NAME...]       only check that each entry still applies (no build)
#
# BUILD_DIR is a configured release build (cmake -S . -B build -DCMAKE_BUILD_TYPE=Release). It is
# first built from the clean sources and the named tests run there once (a test that fails
# without a mutation catches nothing; MUTATE_BASELINE=0 skips this). The source file is restored
# after each entry, also on an interrupt, and the build brought back to the clean sources at the
# end. Logs: BUILD_DIR/mutate/NAME.log. Environment: JOBS (build jobs, 2), MUTATE_TIMEOUT (seconds
# for one entry's tests, 1800). Not part of `make test`: the list takes about 25 minutes on 2 cores.
#
# An entry is one exact search/replace in one file. A mutation must compile and be a realistic
# slip (a bound, a sign, a skipped check, swapped operands); it names the smallest set of ctest
# tests that catches it.
set -euo pipefail
shopt -u patsub_replacement 2>/dev/null || true # "&" in a replacement is literal
export LC_ALL=C                                  # lengths in bytes

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

NAMES=() AREAS=() FILES=() TESTS=() SEARCH=() REPLACE=() WHAT=()
# m NAME AREA FILE "TEST..." SEARCH REPLACE WHAT
m() {
    NAMES+=("$1") AREAS+=("$2") FILES+=("$3") TESTS+=("$4") SEARCH+=("$5") REPLACE+=("$6") WHAT+=("$7")
}

# ---- the list ---------------------------------------------------------------------------------

# RL glue: advantages, losses, KL
m adv_population_std rl src/rl/algo/algo.c "test_rl_algo" \
  'sqrt(ss / (group_size - 1))' \
  'sqrt(ss / group_size)' \
  "group advantages normalised by the population std instead of the sample std"
m clip_low_high_swapped rl src/rl/algo/algo.c "test_rl_algo" \
  '.lo = 1.0 - cfg->algo.clip_low, .hi = 1.0 + cfg->algo.clip_high' \
  '.lo = 1.0 - cfg->algo.clip_high, .hi = 1.0 + cfg->algo.clip_low' \
  "token losses use clip_low and clip_high swapped (clip-higher inverted)"
m kl_k3_grad_sign rl src/rl/algo/algo.c "test_rl_algo" \
  'case TRILL_KL_K3: return 1.0 - exp_clamped(-x);' \
  'case TRILL_KL_K3: return exp_clamped(-x) - 1.0;' \
  "the k3 KL estimator's gradient with the wrong sign"
m tis_ratio_inverted rl src/rl/algo/algo.c "test_rl_algo" \
  'fmin(exp((double)old_logp[t] - (double)behav_logp[t]), cap)' \
  'fmin(exp((double)behav_logp[t] - (double)old_logp[t]), cap)' \
  "TIS weight pi_behaviour / pi_old instead of pi_old / pi_behaviour"

# multi-turn episodes: trajectories, the environment process, chat rendering (issue 39)
m episodes_observation_trained rl src/rl/data/episodes.c "test_episodes" \
  '        if (!st) st = append_segment(ep, RL_SEG_INJECTED, NULL, NULL, n);' \
  '        if (!st) st = append_segment(ep, RL_SEG_SAMPLED, NULL, NULL, n);' \
  "an observation is recorded as sampled: the loss would train the environment's tokens"
m env_lost_episode_stepped rl src/rl/env/process.c "rl_env" \
  '        p->generation++; /* the episodes it held are lost */' \
  '        (void)0;' \
  "after a crash the restarted environment process is asked to step episodes it never saw"
m sched_gate_versions rl src/rl/sched/sched.c "rl_reliability" \
  'if (rl_sched_gate(s, s->next) > (int64_t)r->state.step) break;' \
  'if (rl_sched_gate(s, s->next) > (int64_t)r->state.version) break;' \
  "the gate counts policy versions: a step that trains nothing stops the run at the next one"
m chat_tool_call_newline text src/text/chat.c "tokenizer_parity" \
  'if (i > 0 || has_content) trill_strbuf_puts(b, "\n");' \
  'if (i > 0) trill_strbuf_puts(b, "\n");' \
  "Qwen3's first tool call of a turn with content is not put on its own line"
m tool_parse_error_uncounted text src/text/chat.c "test_chat" \
  '        else {
            ++*errors;
            ok = add_failed(calls, close ? "expected {\"name\": string, \"arguments\": object}" : "no </tool_call>", body, len);' \
  '        else {
            ok = add_failed(calls, close ? "expected {\"name\": string, \"arguments\": object}" : "no </tool_call>", body, len);' \
  "a malformed Qwen3 tool call is not counted as a parse error"

# multi-turn generation: held samples continued with injected tokens (engine_turns.c)
m profile_flops_k infer src/infer/engine_internal.h "test_engine" \
  'f += 2.0 * list[i].T * list[i].W->N * list[i].W->K, b +=' \
  'f += 2.0 * list[i].T * list[i].W->N, b +=' \
  "generator profile: a product's FLOPs counted without its inner dimension"
m profile_logits_phase infer src/infer/engine_sample.c "test_engine" \
  '    eng_phase(e, TRILL_PHASE_LOGITS);' \
  '    eng_phase(e, TRILL_PHASE_SAMPLE);' \
  "generator profile: lm_head charged to sampling"
m gqa_values_token_major infer src/infer/gen_decoder.c "golden_outputs" \
  'gen_weighted_heads(kc, t, layer, true, hd, kvh * bs * hd, hd,' \
  'gen_weighted_heads(kc, t, layer, true, hd, kvh * hd, hd,' \
  "GQA attention: a kv head's values read at its token-major offset in the head-major cache"
m gqa_tile_past_end infer src/infer/gen_blocks.h "test_gen_attention" \
  'if (j0 + j >= common && (!ends || j0 + j >= ends[g])) continue;' \
  'if (j0 + j >= common && (!ends || j0 + j > ends[g])) continue;' \
  "GQA prefill tiles: a row's values summed one position past its own (the next row's)"
m plan_lora_in_only rl src/rl/apps/plan.c "test_plan" \
  'w->out->lora[m] += (int64_t)w->rank * (t->shape[0] + t->shape[1]);' \
  'w->out->lora[m] += (int64_t)w->rank * t->shape[1];' \
  "trill plan: a LoRA pair counted as A alone (r x in)"
m plan_experts_not_sharded rl src/rl/apps/plan.c "test_plan" \
  'if (routed(t)) return 1.0 / ep;' \
  'if (routed(t)) return 1.0;' \
  "trill plan: every trainer device holds every routed expert under expert parallelism"
m plan_search_slowest_first rl src/rl/apps/plan.c "test_plan" \
  'while (at > 0 && out[at - 1].step_s > l->step_s) at--;' \
  'while (at > 0 && out[at - 1].step_s < l->step_s) at--;' \
  "trill plan --search: keeps the slowest layouts first"
m plan_prefill_every_sample rl src/rl/apps/plan.c "test_plan" \
  'const double P = w->prompt_len, prompts = per_rep / n;' \
  'const double P = w->prompt_len, prompts = per_rep;' \
  "trill plan: every sample prefills its prompt (they share it)"
m plan_gen_tp_kv_whole rl src/rl/apps/plan.c "test_plan" \
  ': 2.0 * ((c->num_key_value_heads + tp - 1) / tp) * c->head_dim * elem;' \
  ': 2.0 * c->num_key_value_heads * c->head_dim * elem;' \
  "trill plan --gen-tp: every tensor-parallel device keeps every kv head"
m plan_cache_full_steps rl src/rl/apps/plan.c "test_plan" \
  'const double full = (per_rep - C) * len / C;' \
  'const double full = (per_rep - C) * len / per_rep;' \
  "trill plan: continuous batching runs too few steps with its caches full"
m qk_keys_stride infer src/infer/gen_blocks.h "test_gen_attention" \
  'const char *kp = key + (size_t)(j + p) * key_stride;' \
  'const char *kp = key + (size_t)(j + p) * key_stride / 2;' \
  "generator attention: q.k of four keys at once reads them at half their stride"
m attention_qk_tree infer src/infer/gen_blocks.h "golden_outputs" \
  'const __m128 t = _mm_add_ps(_mm256_castps256_ps128(p), _mm256_extractf128_ps(p, 1)); /* p_l + p_{l+4} */' \
  'const __m128 h = _mm256_extractf128_ps(p, 1), t = _mm_add_ps(_mm256_castps256_ps128(p), _mm_shuffle_ps(h, h, _MM_SHUFFLE(0, 1, 2, 3)));' \
  "generator attention: q.k's lanes reduced in another order than gen_reduce_lanes' tree"
m turns_keys_restart infer src/infer/engine_sample.c "test_engine" \
  '(uint32_t)(s->key_base + gen), work, &lp);' \
  '(uint32_t)gen, work, &lp);' \
  "a continued turn draws with the first turn's keys again"
m turns_experts_short infer src/infer/engine_turns.c "test_engine" \
  'memcpy(ex, prev->experts, sizeof(uint16_t) * per_token * (size_t)(old - 1));' \
  'memcpy(ex, prev->experts, sizeof(uint16_t) * per_token * (size_t)(old - 2));' \
  "a continued sample loses the routed experts of its last forwarded token"
m turns_digest_unchecked infer src/infer/engine_turns.c "test_engine" \
  'if (!prev->tokens || total != s->n_tokens || trill_eng_token_digest(prev->tokens, total) != s->digest)' \
  'if (!prev->tokens || total != s->n_tokens)' \
  "continuing accepts an output whose tokens were changed"
m turns_held_blocks_kept infer src/infer/engine_turns.c "test_engine" \
  'if (!s->kv.n) continue;' \
  'if (s->kv.n) continue;' \
  "a full cache never takes a held sample's blocks back"

# capture and replay of the router's expert ids
m capture_layer_major replay src/model/blocks.c "test_model" \
  'experts[((size_t)t * n_moe_layers + ordinal) * K + j]' \
  'experts[((size_t)ordinal * T + t) * K + j]' \
  "the training forward captures experts [layer][token] instead of [token][layer]"
m replay_gates_unreplayed replay src/model/decoder.c "test_service" \
  '        trill_moe_replay(a->moe.topi, replay, ordinal, c->n_moe_layers, T, K);
        trill_router_gates_forward(a->moe.topw, a->scores, a->moe.topi, T, E, K, c->norm_topk_prob, 0.0f, 1.0f);' \
  '        trill_router_gates_forward(a->moe.topw, a->scores, a->moe.topi, T, E, K, c->norm_topk_prob, 0.0f, 1.0f);
        trill_moe_replay(a->moe.topi, replay, ordinal, c->n_moe_layers, T, K);' \
  "Qwen3: the gates are taken at the router's own top-k before the replayed ids replace it"

# routers
m qwen3_norm_topk_always router src/model/decoder.c "parity_torch" \
  'a->scores, a->moe.topi, T, E, K, c->norm_topk_prob, 0.0f, 1.0f);' \
  'a->scores, a->moe.topi, T, E, K, 1, 0.0f, 1.0f);' \
  "Qwen3 training forward renormalises the top-k gates even with norm_topk_prob false"
m ds_group_score_unbiased router src/kernels/ops_impl.h "test_kernels" \
  'const REAL si = bias ? p[i] + bias[i] : p[i];' \
  'const REAL si = p[i];' \
  "DeepSeek grouped router: group scores from the scores without the correction bias"

# YaRN
m yarn_ramp_rounding yarn src/kernels/ops_impl.h "test_kernels" \
  'if (truncate) low = floor(low), high = ceil(high);' \
  'if (truncate) low = ceil(low), high = floor(high);' \
  "YaRN correction range rounded inwards instead of outwards"
m yarn_softmax_mscale_once yarn src/model/decoder.c "parity_deepseek" \
  'softmax *= m * m;' \
  'softmax *= m;' \
  "DeepSeek YaRN: the softmax scale takes mscale(factor, mscale_all_dim) once, not squared"
m yarn_gqa_cos_unscaled yarn src/model/decoder.c "parity_torch" \
  '        *rope_scale = (float)rope_tables(c, inv_freq, trill_decoder_rope_dims(c));' \
  '        *rope_scale = 1.0f + 0 * (float)rope_tables(c, inv_freq, trill_decoder_rope_dims(c));' \
  "GQA YaRN: cos and sin left without the attention factor"

# the decoder's options (issue 38)
m glm_qkv_bias_no_grad decoder src/train/decoder_backward.c "parity_glm" \
  '        trill_decoder_bias_backward(trill_grad_of(sink, w->k_bias), dk, T, nkv * hd);' \
  '        (void)dk;' \
  "GLM: the k_proj bias gets no gradient"
m partial_rope_whole_head decoder src/model/decoder.c "parity_glm" \
  '    if (rd == hd && cs == 1.0f) trill_rope_forward(x, pos, inv_freq, n, heads, hd);' \
  '    if (cs == 1.0f) trill_rope_forward(x, pos, inv_freq, n, heads, hd);' \
  "GLM: RoPE turns the whole head instead of partial_rotary_factor of it"
m window_blocks_kept generator src/infer/engine_requests.c "test_engine_mixtral" \
  '    if (e->kv_window) trill_kv_table_drop_before(&e->kv, &s->kv, s->n_computed - e->kv_window + 1);' \
  '    if (0 && e->kv_window) trill_kv_table_drop_before(&e->kv, &s->kv, s->n_computed - e->kv_window + 1);' \
  "a sliding window's blocks are never given back"
m window_ignored_in_training decoder src/model/decoder.c "parity_mixtral" \
  '    const trill_attention_opts opts = { .window = desc->window, .sinks = desc->sinks ? w->sinks : NULL };
    return' \
  '    const trill_attention_opts opts = { .window = 0, .sinks = desc->sinks ? w->sinks : NULL };
    return' \
  "Mixtral: the training forward attends over the whole prefix despite sliding_window"
m sinks_ignored_in_generator generator src/infer/gen_decoder.c "test_engine_gptoss" \
  'paged_attention(e, l, desc->window, desc->sinks ? L->vec[TRILL_ROLE_SINKS] : NULL, R);' \
  'paged_attention(e, l, desc->window, NULL, R);' \
  "gpt-oss: the generator's attention leaves the sinks out of the softmax's denominator"
m sinks_no_grad decoder src/train/decoder_backward.c "parity_gptoss" \
  '.dsinks = desc->sinks ? trill_grad_of(sink, w->sinks) : NULL };' \
  '.dsinks = NULL };' \
  "gpt-oss: the attention sinks get no gradient"
m o_bias_missing decoder src/model/decoder.c "parity_gptoss" \
  '    if (desc->o_bias) trill_decoder_bias_forward(d->out, w->o_bias, T, H);' \
  '    if (0 && desc->o_bias) trill_decoder_bias_forward(d->out, w->o_bias, T, H);' \
  "gpt-oss: the training forward leaves out o_proj's bias"
m router_bias_missing_in_generator generator src/infer/gen_decoder.c "test_engine_gptoss" \
  '    if (desc->router_linear_bias) trill_decoder_bias_forward(f->scores' \
  '    if (0 && desc->router_linear_bias) trill_decoder_bias_forward(f->scores' \
  "gpt-oss: the generator's router leaves out its bias"
m clamp_up_grad_one_sided decoder src/kernels/ops_impl.h "parity_gptoss" \
  'if (up[i] >= -limit && up[i] <= limit) dup[i]' \
  'if (up[i] <= limit) dup[i]' \
  "gpt-oss: the clamped SwiGLU passes up's gradient where the lower clamp cut"
m clamp_plus_one_in_generator generator src/infer/gen_blocks.c "test_engine_gptoss" \
  'a[i] = gc / (1.0f + expf(-alpha * gc)) * (uc + 1.0f);' \
  'a[i] = gc / (1.0f + expf(-alpha * gc)) * uc;' \
  "gpt-oss: the generator's clamped SwiGLU drops the + 1 on up"
m stacked_offset_swapped checkpoint src/model/model.c "test_arch" \
  'return (size_t)((e * C + j) * R * S + i * S + sk->offset);' \
  'return (size_t)((e * C + j) * R * S + i * S + (S - 1 - sk->offset));' \
  "gpt-oss: the loader reads gate from gate_up_proj's odd columns and up from the even ones"
m peft_b_expert_major lora src/model/lora_stacked.c "parity_gptoss" \
  '* (R * E) + (o * r + k) * E + e] = B->data[i * r + k];' \
  '* (R * E) + e * R + o * r + k] = B->data[i * r + k];' \
  "PEFT's target_parameters form: lora_B's columns written expert-major instead of expert-minor"
m peft_nesting_reversed lora src/model/lora_stacked.c "parity_gptoss" \
  'else if (seen_self && any) later++;' \
  'else if (!seen_self && any) later++;' \
  "PEFT's target_parameters form: base_layer on down_proj's wrapper instead of gate_up_proj's"
m window_cache_kept generator src/infer/engine_requests.c "test_engine_gptoss" \
  '    if (e->kv_split) trill_kv_table_drop_before(&e->kv_win' \
  '    if (0 && e->kv_split) trill_kv_table_drop_before(&e->kv_win' \
  "gpt-oss: the windowed layers' cache never gives its blocks back"
m gdn_decay_grad kernels src/kernels/gdn_impl.h "test_gradcheck" \
  'dg[(size_t)t * stride_g] += da * a;' \
  'dg[(size_t)t * stride_g] += da;' \
  "gated delta rule: the log decay's gradient without exp(g)'s factor"
m gdn_fork_state infer src/infer/engine_sample.c "test_engine_qwen3next" \
  'if (s->gdn) memcpy(s->gdn, parent->gdn,' \
  'if (s->gdn && 0) memcpy(s->gdn, parent->gdn,' \
  "generator: a prompt's forked samples start from an empty linear-attention state, not the parent's"
m gdn_state_reset infer src/infer/gen_gdn.c "test_engine_qwen3next" \
  'if (e->rows.pos[r] == 0) memset(state, 0, per_layer * sizeof(float));' \
  'if (e->rows.pos[r] < 0) memset(state, 0, per_layer * sizeof(float));' \
  "generator: a sequence recomputed from position 0 (preempted) keeps its stale linear-attention state"
m gdn_conv_state infer src/kernels/gdn_impl.h "test_engine_qwen3next" \
  'st[j] = p >= 0 ? x[(size_t)(t0 + p) * C + c] : st[K - 1 + p];' \
  'st[j] = p >= 0 ? x[(size_t)(t0 + p - 1) * C + c] : st[K - 1 + p];' \
  "generator: the conv state keeps the inputs one position too early"
m norm_centered model src/arch/family.h "parity_qwen3next" \
  'static inline float trill_norm_offset(const trill_config *c, int role) { return trill_norm_centered(c, role) ? 1.0f : 0.0f; }' \
  'static inline float trill_norm_offset(const trill_config *c, int role) { return trill_norm_centered(c, role) && role != TRILL_ROLE_FINAL_NORM ? 1.0f : 0.0f; }' \
  "Qwen3-Next: the final norm applied as w instead of 1 + w"
m gdn_split_order model src/model/gdn.c "parity_qwen3next" \
  'memcpy(mk, qkvz_h + d->dk, F * d->dk);' \
  'memcpy(mk, qkvz_h, F * d->dk);' \
  "Gated DeltaNet: k read from q's place in in_proj_qkvz's per-key-head block"
m output_gate_grad train src/train/decoder_backward.c "parity_qwen3next" \
  'g->dqg[N + i] = dg * a->att[i] * s * (1.0f - s);' \
  'g->dqg[N + i] = dg * a->att[i] * s;' \
  "gated attention: the output gate's gradient without the sigmoid's derivative"
m qwen35_b_a_swap model src/model/gdn.c "parity_qwen35" \
  '(st = trill_linear(fp, g->beta, a->xn1, w->gdn_b, ad->gdn_b, a->xa[XA_GDN_B], T, H, d.nv)) ||' \
  '(st = trill_linear(fp, g->beta, a->xn1, w->gdn_a, ad->gdn_b, a->xa[XA_GDN_B], T, H, d.nv)) ||' \
  "Qwen3.5: beta computed from in_proj_a instead of in_proj_b"
m stacked_linear_offset model src/model/model.c "test_arch" \
  'if (sk->linear) return (size_t)(((e * S + sk->offset) * R + i) * C + j);' \
  'if (sk->linear) return (size_t)(((e * S + sk->offset) * C + j) * R + i);' \
  "Qwen3.5's stacked experts read transposed (x @ W) instead of nn.Linear's orientation"
m gdn_chunk_cumsum_float kernels src/kernels/gdn_impl.h "test_gradcheck" \
  'double G[GDN_CHUNK], acc = 0;' \
  'REAL G[GDN_CHUNK], acc = 0;' \
  "gated delta rule (chunked): the chunk's cumulative decay summed in float (exp(G_i - G_j) loses digits under strong decay)"
m gdn_chunk_backward_solve kernels src/kernels/gdn_impl.h "test_gradcheck" \
  'CblasTrans, CblasUnit, c, dv, 1, w->L, C, w->dVb, dv);' \
  'CblasNoTrans, CblasUnit, c, dv, 1, w->L, C, w->dVb, dv);' \
  "gated delta rule (chunked) backward: beta v's gradient solved with (I + L) instead of its transpose"
m gdn_chunk_decay_grad kernels src/kernels/gdn_impl.h "test_gradcheck" \
  'dG[i] += h, dG[j] -= h;' \
  'dG[i] += h;' \
  "gated delta rule (chunked) backward: P's decay exp(G_i - G_j) differentiated for G_i only"
m bf16_pack_ties kernels src/kernels/gemm_bf16.c "test_gemm_bf16" \
  'const uint32_t nearest = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16' \
  'const uint32_t nearest = (u + 0x8000u) >> 16' \
  "bf16 GEMM packing: ties rounded away from zero instead of to even"
m bf16_pack_odd_pair kernels src/kernels/gemm_bf16.c "test_gemm_bf16" \
  'odd_end = 2 * p + 1 == kc;' \
  'odd_end = 2 * p + 2 == kc;' \
  "bf16 GEMM packing (contiguous rows): the last pair's high half zeroed when K is even, read past the chunk when odd"
m precision_auto_gen_f32 rl src/rl/exec/trainer_setup.c "rl_e2e" \
  'return cpu_fp32 || gen_f32 ? TRILL_PRECISION_FP32 : TRILL_PRECISION_BF16;' \
  'return cpu_fp32 ? TRILL_PRECISION_FP32 : TRILL_PRECISION_BF16;' \
  "trainer.precision auto: bf16 beside an f32 generator"
m mxfp4_nibbles_swapped checkpoint src/model/model.c "parity_gptoss" \
  'FP4_E2M1[k % 2 ? byte >> 4 : byte & 15]' \
  'FP4_E2M1[k % 2 ? byte & 15 : byte >> 4]' \
  "MXFP4: the even element from the high nibble instead of the low one"

# expert and tensor parallelism
m ep_serve_order ep src/model/moe_ep.c "ep_mpi_2 ep_mpi_4" \
  'for (int s = 0; s < P && !st; s++)
        for (int el = 0; el < El && !st; el++) {' \
  'for (int el = 0; el < El && !st; el++)
        for (int s = 0; s < P && !st; s++) {' \
  "EP forward serves the received rows expert-major instead of in source order"
m tp_lora_a_unsummed tp src/model/tp.c "tp_mpi_2" \
  '    if (!st) st = trill_tp_sum(fp, xa, (size_t)n * r);
' \
  '' \
  "TP row-parallel layer: the adapter's partial x A^T is not summed over the group"

# tokenizers
m bpe_tie_rightmost tokenizer src/text/tokenizer.c "test_tokenizer" \
  'if (merge[i] < merge[at]) at = i;' \
  'if (merge[i] <= merge[at]) at = i;' \
  "byte-level BPE merges the rightmost of equal-rank pairs first"
m pretok_pcre_s tokenizer src/text/tiktoken_pattern.c "test_tokenizer" \
  'case '\''s'\'': trill_strbuf_put(b, "\\p{White_Space}", 15); break;' \
  'case '\''s'\'': trill_strbuf_put(b, "\\s", 2); break;' \
  "pre-tokenizer regex: \\s left as PCRE2's \\s (no U+0085) instead of White_Space"
m tiktoken_left_pair_stale tokenizer src/text/tokenizer.c "test_tokenizer" \
  'for (size_t i = at ? at - 1 : 0; i <= at && i + 1 < m; i++) {' \
  'for (size_t i = at; i <= at && i + 1 < m; i++) {' \
  "tiktoken merge: the pair left of a merge keeps its old rank"
m chat_qwen3_last_think tokenizer src/text/chat.c "tokenizer_parity" \
  'if (after_query && (last || reasoning_len > 0)) {' \
  'if (after_query && reasoning_len > 0) {' \
  "Qwen3 chat: a final assistant turn without reasoning gets no empty think block"

# checkpoints
m ckpt_xxh64_unchecked checkpoint src/rl/run/checkpoint.c "rl_reliability" \
  '            else if (strcmp(hex, json_string_value(jh)) != 0)
                st = trill_error(TRILL_ERR_INVALID, "%s has checksum %s, the manifest says %s", file, hex, json_string_value(jh));
' \
  '' \
  "resume: the manifest's XXH64 of each file is not compared (sizes only)"
m ckpt_base_weights_unchecked checkpoint src/rl/run/checkpoint.c "rl_reliability" \
  '(strcmp(ch, nc) != 0 || strcmp(wh, nw) != 0)' \
  '(strcmp(ch, nc) != 0)' \
  "resume: the base model's weights hash is not compared (config.json only)"

# the service: authentication and isolation
m svc_tokenize_unauthenticated service src/service/http.c "service" \
  '    if (!authenticate(c, s, key_id))
        return trill_svc_answer_error(c, "unauthorized", "a valid API key is needed' \
  '    if (!authenticate(c, s, key_id) && !strstr(url, "tokenize"))
        return trill_svc_answer_error(c, "unauthorized", "a valid API key is needed' \
  "/models/*/tokenize and /detokenize answer without an API key"
m svc_state_any_owner service src/service/tenants.c "service" \
  'if (!r.found || strcmp(r.key_id, key_id) != 0) return trill_svc_fail' \
  'if (!r.found) return trill_svc_fail' \
  "a trill:// saved state of another key can be loaded"
m svc_sampler_any_owner service src/service/tenants.c "service" \
  'if (strcmp(p->id, id) == 0) return strcmp(p->key_id, key_id) == 0 && !p->creating' \
  'if (strcmp(p->id, id) == 0) return !p->creating' \
  "another key's sampler can be used by its id"

# trajectories
m trajectory_injected_trained rl src/rl/exec/trainer.c "test_rl_exec" \
  'if (b->loss_mask) trill_rl_trn_gather_u8(b, m, b->loss_mask, mask);' \
  'if (0) trill_rl_trn_gather_u8(b, m, b->loss_mask, mask);' \
  "a trajectory's injected tokens (a tool's answer) are trained as if the model had sampled them"
m trajectory_mask_from_kind rl src/rl/data/rollout.c "test_rollout" \
  'memset(mask + t, b->segs[k].kind == RL_SEG_SAMPLED, (size_t)b->segs[k].len);' \
  'memset(mask + t, b->segs[k].kind != RL_SEG_INJECTED || k > 0, (size_t)b->segs[k].len);' \
  "the loss mask marks injected segments after the first one as sampled"

# async policies
m async_gate_one_early async src/rl/sched/sched.c "rl_async" \
  'return (int64_t)s->s0 + (k - s->k0) - s->bound;' \
  'return (int64_t)s->s0 + (k - s->k0) - s->bound - 1;' \
  "async wait gate: the generator starts a batch one step too early"
m async_stale_by_mean_lag async src/rl/sched/sched.c "rl_async" \
  'const int lag = m->staleness_max;' \
  'const int lag = (int)m->staleness_mean;' \
  "async drop/regenerate judge a batch by its mean lag, so tokens beyond the bound are trained"
m async_regen_not_awaited async src/rl/sched/sched.c "rl_async" \
  's->want = k;' \
  's->want = -1;' \
  "async regenerate: the trainer does not wait for the regenerated batch, it trains the next one first"
m async_ranks_gate_all async src/rl/sched/sched.c "dist_executors" \
  'if (s->on_stale != TRILL_STALE_WAIT) return INT64_MIN;' \
  'if (s->bound < 0) return INT64_MIN;' \
  "async (across ranks too): the wait gate also holds back drop and regenerate"
m aipo_ratio_vs_old async src/rl/algo/algo.c "test_rl_algo" \
  'L->ratio_to == TRILL_RATIO_SAMPLER ? behav_logp : old_logp' \
  'L->ratio_to == TRILL_RATIO_SAMPLER ? old_logp : old_logp' \
  "AIPO's truncated ratio against the trainer's old policy instead of the behaviour policy"

# instruction-set dispatch
# the command's process: its memory tuning
m memory_no_restart process src/cli/main.c "process_memory" \
  'if (!ok || !strstr(mode, "[madvise]")) return;' \
  'if (!ok || !strstr(mode, "[always]")) return;' \
  "the restart with huge pages on request looks for the wrong kernel setting"
m memory_exe_name process src/cli/main.c "process_memory" \
  'execv(self, argv);' \
  'execv("/proc/self/exe", argv);' \
  "the restart names the process \"exe\""
m isa_pin_best_only isa src/infer/gemm.c "cli golden_outputs" \
  'if (trill_gen_isa_supported(all[i])) g_isa_active = all[i];' \
  'if (trill_gen_isa_supported(all[i]) && all[i] == trill_gen_isa_best()) g_isa_active = all[i];' \
  "TRILL_GEN_ISA refuses a supported instruction set other than the best"
m isa_avx2_bf16_pairs isa src/infer/gemm.c "test_gen_gemm_avx2" \
  'x.f = _mm256_broadcast_ss((const float *)(const void *)(p + 4));
        x.fx = _mm256_broadcast_ss((const float *)(const void *)p);' \
  'x.f = _mm256_broadcast_ss((const float *)(const void *)p);
        x.fx = _mm256_broadcast_ss((const float *)(const void *)(p + 4));' \
  "AVX2 bf16 kernel pairs the activations' odd and even halves the wrong way round"

# ---- the machinery ----------------------------------------------------------------------------

die() { echo "mutate.sh: $*" >&2; exit 2; }

index_of() {
    local i
    for i in "${!NAMES[@]}"; do [[ ${NAMES[$i]} == "$1" ]] && { echo "$i"; return 0; }; done
    return 1
}

# TEXT: the file's text, exactly (trailing newlines kept).
load() { TEXT=$(cat -- "$1"; printf x); TEXT=${TEXT%x}; }

# How many times $2 occurs in $1 (non-overlapping).
count_of() { local rest=${1//"$2"/}; echo $(( (${#1} - ${#rest}) / ${#2} )); }

# Why entry $1 cannot be applied, or nothing.
problem() {
    local i=$1 f=${FILES[$1]} n
    [[ -n ${SEARCH[$i]} ]] || { echo "empty snippet"; return; }
    [[ -f $f ]] || { echo "$f does not exist"; return; }
    git diff --quiet HEAD -- "$f" 2>/dev/null || { echo "$f has local changes: commit or stash them first"; return; }
    load "$f"
    n=$(count_of "$TEXT" "${SEARCH[$i]}")
    [[ $n -eq 1 ]] || echo "the snippet occurs $n times in $f (exactly once expected): update the entry"
}

# The file being mutated (its original text in $SAVED), and the running tests: both are dealt
# with whatever happens.
CUR_FILE="" CHILD="" SAVED=""
restore() {
    if [[ -n $CUR_FILE ]]; then
        cat "$SAVED" > "$CUR_FILE" # a new mtime: the next build recompiles it
        CUR_FILE=""
    fi
}
on_exit() {
    local rc=$?
    if [[ -n $CHILD ]]; then
        kill -TERM "$CHILD" 2>/dev/null || true # timeout passes it on to ctest's group
        wait "$CHILD" 2>/dev/null || true
    fi
    if [[ -n $CUR_FILE ]]; then
        restore
        echo "mutate.sh: interrupted; the sources are restored, $BUILD holds a mutant until the next build" >&2
    fi
    [[ -z $SAVED ]] || rm -f "$SAVED"
    exit $rc
}

rebuild() { cmake --build "$BUILD" -j"$JOBS" >"$1" 2>&1; }

# Runs the tests $2 (names, space-separated) with ctest's output appended to $1; sets RC, FAILED
# (the tests that failed or timed out, comma-separated) and SKIPPED. In the background, so that an
# interrupt is handled at once: timeout runs ctest in a process group of its own, which the
# terminal's ^C does not reach.
run_tests() {
    local regex
    regex="^($(tr ' ' '|' <<<"$2"))\$"
    timeout -k 30 "$TIMEOUT" ctest --test-dir "$BUILD" --output-on-failure -R "$regex" >>"$1" 2>&1 &
    CHILD=$! RC=0
    wait "$CHILD" || RC=$?
    CHILD=""
    FAILED=$(sed -n 's/^.*Test *#[0-9]*: \([^ ]*\) .*\*\*\*\(Failed\|Timeout\|Exception\|Not Run\).*$/\1/p' "$1" | paste -sd, -)
    SKIPPED=$(sed -n 's/^.*Test *#[0-9]*: \([^ ]*\) .*\*\*\*Skipped.*$/\1/p' "$1" | paste -sd, -)
}

main() {
    local MODE=run
    case "${1:-}" in
    --list)
        for i in "${!NAMES[@]}"; do printf '%-28s %-10s %-30s %s\n' "${NAMES[$i]}" "${AREAS[$i]}" "${TESTS[$i]}" "${WHAT[$i]}"; done
        return 0 ;;
    --check) MODE=check; shift ;;
    -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; return 0 ;;
    esac

    BUILD=build
    if [[ $MODE == run && $# -gt 0 && -d $1 ]]; then BUILD=${1%/}; shift; fi
    local SELECTED=() n idx i
    if [[ $# -eq 0 ]]; then
        SELECTED=("${!NAMES[@]}")
    else
        for n in "$@"; do
            idx=$(index_of "$n") || die "no entry named $n (--list shows them)"
            SELECTED+=("$idx")
        done
    fi

    if [[ $MODE == check ]]; then
        local bad=0 why
        for i in "${SELECTED[@]}"; do
            why=$(problem "$i")
            if [[ -n $why ]]; then echo "BROKEN ${NAMES[$i]}: $why"; bad=1; else echo "ok     ${NAMES[$i]}"; fi
        done
        return $bad
    fi

    [[ -f $BUILD/CMakeCache.txt ]] || die "$BUILD is not a configured build (cmake -S . -B $BUILD -DCMAKE_BUILD_TYPE=Release)"
    JOBS=${JOBS:-2}
    TIMEOUT=${MUTATE_TIMEOUT:-1800}
    local LOGS=$BUILD/mutate t_all=$SECONDS
    mkdir -p "$LOGS"
    SAVED=$(mktemp)
    trap on_exit EXIT
    trap 'exit 130' INT TERM

    echo "building $BUILD from the clean sources ..." >&2
    rebuild "$LOGS/build.log" || die "$BUILD does not build from the clean sources (see $LOGS/build.log)"
    local all_tests t
    all_tests=$(ctest --test-dir "$BUILD" -N 2>/dev/null | sed -n 's/^ *Test *#[0-9]*: *//p')

    # A test that fails without a mutation catches nothing: the named tests must pass first.
    if [[ ${MUTATE_BASELINE:-1} != 0 ]]; then
        local wanted=() seen=" "
        for i in "${SELECTED[@]}"; do
            for t in ${TESTS[$i]}; do
                [[ $seen == *" $t "* ]] && continue
                seen+="$t "
                grep -Fx -- "$t" >/dev/null <<<"$all_tests" && wanted+=("$t")
            done
        done
        if [[ ${#wanted[@]} -gt 0 ]]; then
            echo "baseline: ${#wanted[@]} tests on the clean sources ..." >&2
            : >"$LOGS/baseline.log"
            run_tests "$LOGS/baseline.log" "${wanted[*]}"
            [[ $RC -eq 0 ]] || die "on the clean sources, tests fail (${FAILED:-ctest rc $RC}): fix them first (see $LOGS/baseline.log) or run with MUTATE_BASELINE=0"
            [[ -z $SKIPPED ]] || echo "baseline: skipped on this machine: $SKIPPED" >&2
        fi
    fi

    local rows=() failures=0 name f log t0 result by note why
    for i in "${SELECTED[@]}"; do
        name=${NAMES[$i]} f=${FILES[$i]} log=$LOGS/${NAMES[$i]}.log t0=$SECONDS result="" by="" note=""
        : >"$log"
        why=$(problem "$i")
        for t in ${TESTS[$i]}; do
            grep -Fx -- "$t" >/dev/null <<<"$all_tests" || why="${why:+$why; }no ctest test named $t in $BUILD"
        done
        if [[ -n $why ]]; then
            result=BROKEN note=$why
        else
            printf '%s: %s ... ' "$name" "${WHAT[$i]}" >&2
            cp -- "$f" "$SAVED"
            CUR_FILE=$f
            load "$f"
            printf '%s' "${TEXT/"${SEARCH[$i]}"/"${REPLACE[$i]}"}" > "$f"
            if ! rebuild "$log"; then
                result=BROKEN note="the mutant does not compile (see $log)"
            else
                run_tests "$log" "${TESTS[$i]}"
                if [[ -n $FAILED ]]; then
                    result=CAUGHT by=$FAILED
                elif [[ $RC -eq 124 || $RC -eq 137 ]]; then
                    result=HUNG note="no test failed within ${TIMEOUT}s (MUTATE_TIMEOUT)"
                elif [[ $RC -ne 0 ]]; then
                    result=BROKEN note="ctest exited $RC with no failed test (see $log)"
                else
                    result=MISSED note=${SKIPPED:+"skipped here: $SKIPPED"}
                fi
            fi
            restore
            echo "$result" >&2
        fi
        [[ $result == CAUGHT ]] || failures=$((failures + 1))
        rows+=("$(printf '%-28s %-10s %-32s %-7s %-24s %5ds %s' "$name" "${AREAS[$i]}" "${TESTS[$i]}" "$result" "${by:--}" $((SECONDS - t0)) "$note")")
    done

    echo "rebuilding $BUILD from the clean sources ..." >&2
    rebuild "$LOGS/build.log" || echo "mutate.sh: the clean rebuild failed (see $LOGS/build.log)" >&2

    printf '\n%-28s %-10s %-32s %-7s %-24s %6s %s\n' ENTRY AREA TESTS RESULT "FAILED TEST" TIME NOTE
    printf '%s\n' "${rows[@]}"
    echo
    echo "${#SELECTED[@]} entries, $failures not caught (MISSED, HUNG or BROKEN), $((SECONDS - t_all)) s"
    [[ $failures -eq 0 ]]
}

main "$@"; exit
