/* The rollout record crosses threads (and later pipes and MPI) as bytes: a packed batch unpacks
 * to the same arrays and texts, and damaged bytes are refused with a message. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "rl/data/rollout.h"
#include "model/model_internal.h"
#include "trill/model.h"

/* Two sequences of one group: 3 prompt + 2 response tokens, 2 prompt + 3 response tokens;
 * 2 MoE layers, top-2. */
static void make_batch(rl_batch *b) {
    static const char *const texts[2] = { "42", "" };
    memset(b, 0, sizeof *b);
    b->n_seqs = 2; b->group_size = 2; b->n_moe_layers = 2; b->top_k = 2;
    const int T = 10, row = 4;
    b->offsets = malloc(sizeof(int) * 3);
    b->prompt_len = malloc(sizeof(int) * 2);
    b->tokens = malloc(sizeof(int) * T);
    b->behav_logp = malloc(sizeof(float) * T);
    b->version = malloc(sizeof(uint32_t) * T);
    b->experts = malloc(sizeof(uint16_t) * T * row);
    b->example = malloc(sizeof(int) * 2);
    b->completion = calloc(2, sizeof(char *));
    b->reward = malloc(sizeof(double) * 2);
    b->adv = malloc(sizeof(double) * 2);
    b->correct = malloc(sizeof(double) * 2);
    b->keep = malloc(sizeof(bool) * 2);
    b->offsets[0] = 0; b->offsets[1] = 5; b->offsets[2] = 10;
    b->prompt_len[0] = 3; b->prompt_len[1] = 2;
    for (int t = 0; t < T; t++) {
        b->tokens[t] = 7 * t + 1;
        b->behav_logp[t] = t == 0 || t == 1 || t == 2 || t == 5 || t == 6 ? NAN : -0.25f * t;
        b->version[t] = (uint32_t)(t / 4);
        for (int i = 0; i < row; i++) b->experts[t * row + i] = (uint16_t)((t + i) % 8);
    }
    for (int i = 0; i < row; i++) { b->experts[4 * row + i] = TRILL_REPLAY_NONE; b->experts[9 * row + i] = TRILL_REPLAY_NONE; }
    for (int s = 0; s < 2; s++) {
        b->example[s] = 11 + s;
        b->completion[s] = strdup(texts[s]);
        b->reward[s] = s ? 0.0 : 1.0;
        b->adv[s] = s ? -0.7071 : 0.7071;
        b->correct[s] = s ? 0.0 : 1.0;
        b->keep[s] = s == 0;
    }
}

static void test_pack_round_trip(void **state) {
    (void)state;
    rl_batch a, b;
    make_batch(&a);
    void *buf;
    size_t len;
    assert_int_equal(trill_rl_batch_pack(&a, &buf, &len), TRILL_OK);
    assert_int_equal(trill_rl_batch_unpack(buf, len, &b), TRILL_OK);
    assert_int_equal(b.n_seqs, 2);
    assert_int_equal(b.group_size, 2);
    assert_int_equal(b.n_moe_layers, 2);
    assert_int_equal(b.top_k, 2);
    assert_memory_equal(b.offsets, a.offsets, sizeof(int) * 3);
    assert_memory_equal(b.prompt_len, a.prompt_len, sizeof(int) * 2);
    assert_memory_equal(b.tokens, a.tokens, sizeof(int) * 10);
    assert_memory_equal(b.behav_logp, a.behav_logp, sizeof(float) * 10); /* NaN bits included */
    assert_memory_equal(b.version, a.version, sizeof(uint32_t) * 10);
    assert_memory_equal(b.experts, a.experts, sizeof(uint16_t) * 40);
    assert_memory_equal(b.example, a.example, sizeof(int) * 2);
    assert_memory_equal(b.reward, a.reward, sizeof(double) * 2);
    assert_memory_equal(b.adv, a.adv, sizeof(double) * 2);
    assert_memory_equal(b.keep, a.keep, sizeof(bool) * 2);
    assert_string_equal(b.completion[0], "42");
    assert_string_equal(b.completion[1], "");
    /* packing the unpacked batch gives the same bytes */
    void *again;
    size_t len2;
    assert_int_equal(trill_rl_batch_pack(&b, &again, &len2), TRILL_OK);
    assert_int_equal(len2, len);
    assert_memory_equal(again, buf, len);
    free(again);
    trill_rl_batch_free(&b);
    trill_rl_batch_free(&a);
    free(buf);
}

static void expect_refused(const void *buf, size_t len, const char *fragment) {
    rl_batch b;
    assert_int_equal(trill_rl_batch_unpack(buf, len, &b), TRILL_ERR_INVALID);
    if (!strstr(trill_error_message(), fragment)) fail_msg("message lacks '%s': %s", fragment, trill_error_message());
    assert_null(b.tokens); /* nothing left allocated */
}

static void test_damaged_bytes_are_refused(void **state) {
    (void)state;
    rl_batch a;
    make_batch(&a);
    unsigned char *buf;
    size_t len;
    assert_int_equal(trill_rl_batch_pack(&a, (void **)&buf, &len), TRILL_OK);
    unsigned char *copy = malloc(len);
    expect_refused(buf, 10, "shorter than its header");
    expect_refused(buf, len - 1, "bytes, the header describes");
    memcpy(copy, buf, len);
    copy[0] ^= 1;
    expect_refused(copy, len, "not a packed rollout batch");
    memcpy(copy, buf, len);
    copy[len - 1] = 'x'; /* the last completion loses its terminator */
    expect_refused(copy, len, "completion 1 is not terminated");
    /* offsets: the header is followed by offsets[0..2]; make sequence 0 end after sequence 1 starts */
    const size_t off_at = len - 4 /* "42" and "" with their NULs */ - (sizeof(int) * (3 + 2 + 10 + 2) + sizeof(float) * 10 + sizeof(uint32_t) * 10 +
                                     sizeof(uint16_t) * 40 + sizeof(double) * 6 + sizeof(bool) * 2);
    memcpy(copy, buf, len);
    const int bad = 11;
    memcpy(copy + off_at + sizeof(int), &bad, sizeof bad);
    expect_refused(copy, len, "sequence 1 has offsets [11, 10)");
    free(copy);
    free(buf);
    trill_rl_batch_free(&a);
}

/* make_batch's second sequence as a trajectory of four segments: its prompt (2 tokens), a sampled
 * token, one injected (a tool's answer: no behaviour log-prob) and a sampled one. */
static void make_trajectories(rl_batch *b) {
    make_batch(b);
    b->behav_logp[8] = NAN;
    static const int offsets[3] = { 0, 2, 6 };
    static const rl_segment segs[6] = { { 3, RL_SEG_INJECTED }, { 2, RL_SEG_SAMPLED }, { 2, RL_SEG_INJECTED },
                                        { 1, RL_SEG_SAMPLED }, { 1, RL_SEG_INJECTED }, { 1, RL_SEG_SAMPLED } };
    b->seg_offsets = malloc(sizeof offsets);
    b->segs = malloc(sizeof segs);
    memcpy(b->seg_offsets, offsets, sizeof offsets);
    memcpy(b->segs, segs, sizeof segs);
    assert_int_equal(trill_rl_batch_derive(b), TRILL_OK);
}

static void test_trajectories(void **state) {
    (void)state;
    rl_batch a, b, c;
    make_trajectories(&a);
    /* the loss mask: sampled tokens only */
    assert_memory_equal(a.loss_mask, ((uint8_t[]){ 0, 0, 0, 1, 1, 0, 0, 1, 0, 1 }), 10);
    assert_false(trill_rl_batch_is_single_turn(&a));
    void *buf, *again;
    size_t len, len2;
    assert_int_equal(trill_rl_batch_pack(&a, &buf, &len), TRILL_OK);
    assert_int_equal(((const uint32_t *)buf)[1], 2); /* format 2: with its segments */
    assert_int_equal(trill_rl_batch_unpack(buf, len, &b), TRILL_OK);
    assert_memory_equal(b.seg_offsets, a.seg_offsets, sizeof(int) * 3);
    assert_memory_equal(b.segs, a.segs, sizeof(rl_segment) * 6);
    assert_memory_equal(b.loss_mask, a.loss_mask, 10);
    assert_int_equal(trill_rl_batch_pack(&b, &again, &len2), TRILL_OK);
    assert_int_equal(len2, len);
    assert_memory_equal(again, buf, len);
    free(again);
    /* merged with a single-turn part: each sequence keeps its segments */
    rl_batch single;
    make_batch(&single);
    rl_batch parts[2] = { a, single };
    assert_int_equal(trill_rl_batch_merge(parts, 2, (const int[]){ 1, 0 }, 2, &c), TRILL_OK);
    assert_int_equal(c.seg_offsets[4], 2 + 2 + 2 + 4);
    assert_memory_equal(c.loss_mask, ((uint8_t[]){ 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 0, 0, 1, 0, 1 }), 20);
    trill_rl_batch_free(&c);
    trill_rl_batch_free(&single);
    /* segments that do not cover a sequence, or do not start with its prompt, are refused by name */
    b.segs[5].len = 2;
    assert_int_equal(trill_rl_batch_derive(&b), TRILL_ERR_INVALID);
    assert_non_null(strstr(trill_error_message(), "sequence 1 has 5 tokens, its segments 6"));
    b.segs[5].len = 1;
    b.segs[2].kind = RL_SEG_SAMPLED;
    assert_int_equal(trill_rl_batch_derive(&b), TRILL_ERR_INVALID);
    assert_non_null(strstr(trill_error_message(), "sequence 1 does not start with its prompt"));
    trill_rl_batch_free(&b);
    trill_rl_batch_free(&a);
    free(buf);
}

/* A single-turn batch keeps packed format 1, byte for byte, and unpacks to two segments a sequence. */
static void test_single_turn_format(void **state) {
    (void)state;
    rl_batch a, b;
    make_batch(&a);
    void *buf;
    size_t len;
    assert_int_equal(trill_rl_batch_pack(&a, &buf, &len), TRILL_OK);
    assert_int_equal(((const uint32_t *)buf)[1], 1);
    assert_int_equal(trill_rl_batch_unpack(buf, len, &b), TRILL_OK);
    assert_true(trill_rl_batch_is_single_turn(&b));
    assert_memory_equal(b.seg_offsets, ((int[]){ 0, 2, 4 }), sizeof(int) * 3);
    assert_memory_equal(b.loss_mask, ((uint8_t[]){ 0, 0, 0, 1, 1, 0, 0, 1, 1, 1 }), 10);
    trill_rl_batch_free(&b);
    trill_rl_batch_free(&a);
    free(buf);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pack_round_trip),
        cmocka_unit_test(test_damaged_bytes_are_refused),
        cmocka_unit_test(test_trajectories),
        cmocka_unit_test(test_single_turn_format),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
