/* The token sampler: greedy, the logprob convention, the kept sets of top-k/top-p/min-p and
 * their order, frequencies against the truncated distribution, reproducibility, odd logits,
 * parameter checks, and the fast selection against a full-sort reference. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "trill/rng.h"
#include "trill/sample.h"

static trill_sampling params(float temperature, int top_k, float top_p, float min_p) {
    trill_sampling s = trill_sampling_default();
    s.temperature = temperature;
    s.top_k = top_k;
    s.top_p = top_p;
    s.min_p = min_p;
    return s;
}

static void *scratch_for(int V) {
    void *p = malloc(trill_sample_scratch_size(V));
    assert_non_null(p);
    memset(p, 0xA5, trill_sample_scratch_size(V)); /* contents on entry must not matter */
    return p;
}

static void random_logits(float *x, int V, uint64_t key, double scale) {
    for (int i = 0; i < V; i++) x[i] = (float)(scale * trill_rng_normal(key, (uint64_t)i));
}

/* log_softmax(logits / T)[token] in double, the straightforward way (divide, then
 * log-sum-exp), NaN read as -inf. */
static double ref_logprob(const float *logits, int V, double T, int token) {
    double m = -INFINITY;
    for (int i = 0; i < V; i++)
        if (logits[i] / T > m) m = logits[i] / T;
    double S = 0;
    for (int i = 0; i < V; i++)
        if (!isnan(logits[i])) S += exp(logits[i] / T - m);
    return logits[token] / T - m - log(S);
}

/* ---- the documented semantics written the obvious way: libm exp, a full sort of the
 * vocabulary, sequential sums (the sampler's differ from these only in rounding) ---- */

typedef struct ref_tok {
    double w;
    int id;
} ref_tok;

static int cmp_ref(const void *a, const void *b) {
    const ref_tok *x = a, *y = b;
    if (x->w != y->w) return x->w < y->w ? 1 : -1;
    return x->id - y->id;
}

static int cmp_id(const void *a, const void *b) { return ((const ref_tok *)a)->id - ((const ref_tok *)b)->id; }

/* The kept tokens in id order (the order of the draw) with their weights; returns how many.
 * NaN reads as -inf, +inf as FLT_MAX. */
static int ref_kept(const float *logits, int V, const trill_sampling *s, ref_tok *out) {
    double T = s->temperature, m = -INFINITY;
    for (int i = 0; i < V; i++) {
        double x = isnan(logits[i]) ? -INFINITY : isinf(logits[i]) && logits[i] > 0 ? 3.4028234663852886e38 : logits[i];
        if (x > m) m = x;
    }
    double S = 0;
    int n = 0;
    for (int i = 0; i < V; i++) {
        double x = isnan(logits[i]) ? -INFINITY : isinf(logits[i]) && logits[i] > 0 ? 3.4028234663852886e38 : logits[i];
        double w = exp((x - m) / T);
        S += w;
        if (w > 0) out[n++] = (ref_tok){ w, i };
    }
    int k = s->top_k > 0 && s->top_k < V ? s->top_k : 0;
    qsort(out, (size_t)n, sizeof *out, cmp_ref);
    double ref_mass = S;
    if (k && n > k) {
        int nk = k;
        while (nk < n && out[nk].w == out[k - 1].w) nk++;
        n = nk;
    }
    if (k) {
        ref_mass = 0;
        for (int j = 0; j < n; j++) ref_mass += out[j].w;
    }
    if (s->top_p < 1) {
        double acc = 0;
        for (int j = 0; j < n; j++) {
            if (acc >= s->top_p * ref_mass) {
                n = j;
                break;
            }
            acc += out[j].w;
        }
    }
    int kept = 0;
    for (int j = 0; j < n; j++)
        if (out[j].w >= s->min_p) out[kept++] = out[j];
    qsort(out, (size_t)kept, sizeof *out, cmp_id);
    return kept;
}

/* The draw over kept[0..n) from ref_kept: inverse CDF in id order. */
static int ref_draw(const ref_tok *kept, int n, const trill_sampling *s, uint64_t request, uint32_t sample,
                    uint32_t position) {
    double total = 0, acc = 0;
    for (int j = 0; j < n; j++) total += kept[j].w;
    double u = trill_rng_uniform(trill_rng_key(trill_rng_key(s->seed, request), sample), position);
    for (int j = 0; j < n; j++)
        if (u * total < (acc += kept[j].w)) return kept[j].id;
    return kept[n - 1].id;
}

/* Bitmask of the tokens drawn over `draws` positions (V <= 32). */
static uint32_t observed_set(const float *logits, int V, trill_sampling s, int draws) {
    void *scratch = scratch_for(V);
    uint32_t seen = 0;
    for (int pos = 0; pos < draws; pos++) {
        int t = trill_sample(logits, V, &s, 0, 0, (uint32_t)pos, scratch, NULL);
        assert_true(t >= 0 && t < V);
        seen |= 1u << t;
    }
    free(scratch);
    return seen;
}

/* ---- tests ---- */

static void test_greedy(void **state) {
    (void)state;
    const float logits[6] = { -INFINITY, 1.0f, 3.0f, NAN, 3.0f, 2.0f };
    void *scratch = scratch_for(6);
    trill_sampling s = params(0, 0, 1, 0);
    float lp;
    for (uint32_t pos = 0; pos < 20; pos++) assert_int_equal(trill_sample(logits, 6, &s, 3, 1, pos, scratch, &lp), 2);
    /* greedy's logprob is the model's own (temperature 1), not log 1 */
    assert_true(fabs(lp - ref_logprob((const float[]){ -INFINITY, 1, 3, -INFINITY, 3, 2 }, 6, 1.0, 2)) < 1e-6);
    assert_true(fabs(lp - log(exp(3.0) / (exp(1.0) + 2 * exp(3.0) + exp(2.0)))) < 1e-6);
    /* the filters cannot change the argmax */
    s = params(0, 3, 0.2f, 0.5f);
    assert_int_equal(trill_sample(logits, 6, &s, 0, 0, 0, scratch, NULL), 2);
    const float first_tie[3] = { 7.0f, 7.0f, -1.0f };
    assert_int_equal(trill_sample(first_tie, 3, &s, 0, 0, 0, scratch, NULL), 0);
    free(scratch);
}

static void test_logprob_is_untruncated_log_softmax(void **state) {
    (void)state;
    enum { V = 1000 };
    float logits[V];
    random_logits(logits, V, 11, 2.0);
    for (int i = 0; i < V; i += 37) logits[i] = -INFINITY;
    void *scratch = scratch_for(V);
    const float temps[3] = { 0.5f, 1.0f, 1.7f };
    const trill_sampling filters[4] = { params(1, 0, 1, 0), params(1, 10, 1, 0), params(1, 0, 0.8f, 0),
                                        params(1, 0, 1, 0.1f) };
    for (int t = 0; t < 3; t++)
        for (int f = 0; f < 4; f++) {
            trill_sampling s = filters[f];
            s.temperature = temps[t];
            for (uint32_t pos = 0; pos < 50; pos++) {
                float lp;
                int tok = trill_sample(logits, V, &s, 5, 0, pos, scratch, &lp);
                assert_true(tok >= 0 && tok < V && tok % 37 != 0);
                double ref = ref_logprob(logits, V, temps[t], tok);
                assert_true(fabs(lp - ref) <= 1.2e-7 * fmax(1.0, fabs(ref))); /* float rounding */
                /* scoring the drawn token (teacher forcing) reports the same bits */
                const float scored = trill_sample_logprob(logits, V, s.temperature, tok, scratch);
                assert_memory_equal(&scored, &lp, sizeof lp);
            }
        }
    free(scratch);
    /* two tokens {0, x}: log p(0) = -log(1 + e^x) shows the accuracy of the weight e^x to a
     * float's 24 bits, where 1 + e^x in double keeps more (x >= -15) */
    void *two = scratch_for(2);
    trill_sampling greedy = params(0, 0, 1, 0);
    for (int step = 0; step <= 1500; step++) {
        const float pair[2] = { 0.0f, -0.01f * (float)step };
        float lp;
        assert_int_equal(trill_sample(pair, 2, &greedy, 0, 0, 0, two, &lp), 0);
        double ref = -log1p(exp(pair[1]));
        assert_true(fabs(lp - ref) <= 1.2e-7 * fabs(ref));
        const float scored = trill_sample_logprob(pair, 2, 0, 0, two); /* greedy: temperature 1 */
        assert_memory_equal(&scored, &lp, sizeof lp);
    }
    free(two);
}

static void test_top_k_one_is_argmax(void **state) {
    (void)state;
    enum { V = 5000 };
    float logits[V];
    void *scratch = scratch_for(V);
    for (int trial = 0; trial < 20; trial++) {
        random_logits(logits, V, 100 + (uint64_t)trial, 1.5);
        int best = 0;
        for (int i = 1; i < V; i++)
            if (logits[i] > logits[best]) best = i;
        trill_sampling s = params(trial % 2 ? 3.0f : 0.7f, 1, 1, 0);
        for (uint32_t pos = 0; pos < 20; pos++) assert_int_equal(trill_sample(logits, V, &s, 0, 0, pos, scratch, NULL), best);
    }
    free(scratch);
    /* top-k keeps everything tied with the k-th (HF and vLLM threshold on the value) */
    const float tie[4] = { 1.0f, 2.0f, 2.0f, 0.0f };
    assert_int_equal(observed_set(tie, 4, params(1, 1, 1, 0), 200), 0x6);
}

/* probabilities 0.4, 0.35, 0.15, 0.1 at T = 1 */
static void test_kept_sets_and_filter_order(void **state) {
    (void)state;
    const float p[4] = { logf(0.4f), logf(0.35f), logf(0.15f), logf(0.1f) };
    const int D = 2000;
    assert_int_equal(observed_set(p, 4, params(1, 0, 1, 0), D), 0xF);
    assert_int_equal(observed_set(p, 4, params(1, 2, 1, 0), D), 0x3);
    /* top-p: kept while the mass ranked above is < top_p */
    assert_int_equal(observed_set(p, 4, params(1, 0, 0.3f, 0), D), 0x1);
    assert_int_equal(observed_set(p, 4, params(1, 0, 0.7f, 0), D), 0x3);   /* 0.4 < 0.7 <= 0.75 */
    assert_int_equal(observed_set(p, 4, params(1, 0, 0.78f, 0), D), 0x7);  /* 0.75 < 0.78 <= 0.9 */
    /* min-p: p >= min_p * 0.4 */
    assert_int_equal(observed_set(p, 4, params(1, 0, 1, 0.3f), D), 0x7);   /* >= 0.12 */
    assert_int_equal(observed_set(p, 4, params(1, 0, 1, 0.5f), D), 0x3);   /* >= 0.2 */
    assert_int_equal(observed_set(p, 4, params(1, 0, 1, 0.9f), D), 0x1);   /* >= 0.36 */
    /* top-p measures after top-k: {.4,.35,.15}/.9 → mass above token 2 is .833 >= .8 */
    assert_int_equal(observed_set(p, 4, params(1, 3, 0.8f, 0), D), 0x3);
    /* top-p before min-p (HF): top-p keeps {0,1,2}, min-p drops only token 3; min-p first
     * (vLLM V1) would renormalise to {.444,.389,.167} and top-p would then drop token 2 */
    assert_int_equal(observed_set(p, 4, params(1, 0, 0.78f, 0.3f), D), 0x7);
    /* temperature before top-p: at T = 2 the probabilities are .328 .307 .201 .164 */
    assert_int_equal(observed_set(p, 4, params(2, 0, 0.7f, 0), D), 0x7);
}

/* N draws at successive positions; each token's frequency must be within 5 standard
 * deviations (sqrt(p(1-p)/N)) of its probability in the truncated, renormalised distribution,
 * and tokens outside it never appear. A correct sampler fails a token's bound with probability
 * 6e-7, so the whole test (about 60 bounds) with < 4e-5 — and the draws are fixed by the seed. */
static void check_frequencies(const float *logits, int V, trill_sampling s) {
    enum { N = 20000 };
    ref_tok *kept = malloc((size_t)V * sizeof *kept);
    double *expect = calloc((size_t)V, sizeof *expect);
    int *hits = calloc((size_t)V, sizeof *hits);
    void *scratch = scratch_for(V);
    int n = ref_kept(logits, V, &s, kept);
    double total = 0;
    for (int j = 0; j < n; j++) total += kept[j].w;
    for (int j = 0; j < n; j++) expect[kept[j].id] = kept[j].w / total;
    for (uint32_t pos = 0; pos < N; pos++) {
        int t = trill_sample(logits, V, &s, 42, 0, pos, scratch, NULL);
        assert_true(t >= 0 && t < V);
        hits[t]++;
    }
    for (int i = 0; i < V; i++) {
        double f = (double)hits[i] / N, q = expect[i];
        if (q == 0) assert_int_equal(hits[i], 0);
        else assert_true(fabs(f - q) <= 5 * sqrt(q * (1 - q) / N));
    }
    free(scratch);
    free(hits);
    free(expect);
    free(kept);
}

static void test_frequencies(void **state) {
    (void)state;
    const float small[8] = { 2.0f, 1.5f, 1.2f, 0.3f, -0.5f, 0.9f, -INFINITY, 1.8f };
    check_frequencies(small, 8, params(0.8f, 0, 1, 0));
    check_frequencies(small, 8, params(0.8f, 4, 1, 0));
    check_frequencies(small, 8, params(0.8f, 0, 0.85f, 0));
    check_frequencies(small, 8, params(1.3f, 0, 1, 0.2f));
    check_frequencies(small, 8, params(1.0f, 5, 0.9f, 0.1f));
    /* the selection path over a larger vocabulary */
    enum { V = 1000 };
    float big[V];
    random_logits(big, V, 7, 2.0);
    check_frequencies(big, V, params(1.0f, 20, 1, 0));
    /* the renormalised probabilities themselves, by hand: top_k = 2 of {0.4, 0.35, ...} */
    const float p[4] = { logf(0.4f), logf(0.35f), logf(0.15f), logf(0.1f) };
    trill_sampling s = params(1, 2, 1, 0);
    void *scratch = scratch_for(4);
    int zeros = 0;
    for (uint32_t pos = 0; pos < 20000; pos++) zeros += trill_sample(p, 4, &s, 0, 0, pos, scratch, NULL) == 0;
    assert_true(fabs(zeros / 20000.0 - 0.4 / 0.75) <= 5 * sqrt(0.5333 * 0.4667 / 20000));
    free(scratch);
}

static void test_reproducible_streams(void **state) {
    (void)state;
    enum { V = 64 };
    float flat[V] = { 0 }, other[V];
    random_logits(other, V, 3, 1.0);
    void *scratch = scratch_for(V);
    trill_sampling s = params(1, 0, 1, 0);
    s.seed = 1234;
    int stream[3][200], same_sample = 0, same_request = 0;
    for (uint32_t pos = 0; pos < 200; pos++) {
        stream[0][pos] = trill_sample(flat, V, &s, 9, 0, pos, scratch, NULL);
        stream[1][pos] = trill_sample(flat, V, &s, 9, 1, pos, scratch, NULL);
        stream[2][pos] = trill_sample(flat, V, &s, 10, 0, pos, scratch, NULL);
        same_sample += stream[0][pos] == stream[1][pos];
        same_request += stream[0][pos] == stream[2][pos];
    }
    /* independent uniform streams over 64 tokens agree at ~3 of 200 positions */
    assert_true(same_sample < 20);
    assert_true(same_request < 20);
    /* the same key gives the same token whatever ran before (other rows, other parameters) */
    trill_sampling t = params(0.5f, 5, 0.9f, 0.05f);
    for (uint32_t pos = 200; pos-- > 0;) {
        trill_sample(other, V, &t, pos, 3, pos, scratch, NULL);
        assert_int_equal(trill_sample(flat, V, &s, 9, 0, pos, scratch, NULL), stream[0][pos]);
    }
    /* the truncated path too, with a fresh scratch */
    void *scratch2 = scratch_for(V);
    for (uint32_t pos = 0; pos < 50; pos++) {
        float a, b;
        assert_int_equal(trill_sample(other, V, &t, 1, 2, pos, scratch, &a), trill_sample(other, V, &t, 1, 2, pos, scratch2, &b));
        assert_true(a == b);
    }
    /* and the seed matters */
    s.seed = 1235;
    int same_seed = 0;
    for (uint32_t pos = 0; pos < 200; pos++) same_seed += trill_sample(flat, V, &s, 9, 0, pos, scratch, NULL) == stream[0][pos];
    assert_true(same_seed < 20);
    free(scratch2);
    free(scratch);
}

static void test_nan_and_inf_logits(void **state) {
    (void)state;
    void *scratch = scratch_for(4);
    float lp;
    /* NaN is -inf: never drawn, no mass */
    const float with_nan[4] = { NAN, 1.0f, NAN, 0.0f };
    assert_int_equal(observed_set(with_nan, 4, params(1, 0, 1, 0), 500), 0xA);
    assert_int_equal(observed_set(with_nan, 4, params(1, 0, 0.99f, 0.01f), 500), 0xA);
    int t = trill_sample(with_nan, 4, &(trill_sampling){ .temperature = 1, .top_p = 1 }, 0, 0, 0, scratch, &lp);
    assert_true(fabs(lp - (t == 1 ? -log1p(exp(-1.0)) : -1 - log1p(exp(-1.0)))) < 1e-6);
    /* nothing drawable: -1 and a -inf logprob, greedy or not */
    const float dead[4] = { NAN, -INFINITY, NAN, -INFINITY };
    trill_sampling greedy = params(0, 0, 1, 0), topk = params(1, 2, 0.5f, 0.1f);
    assert_int_equal(trill_sample(dead, 4, &greedy, 0, 0, 0, scratch, &lp), -1);
    assert_true(isinf(lp) && lp < 0);
    assert_int_equal(trill_sample(dead, 4, &topk, 0, 0, 0, scratch, &lp), -1);
    /* +inf tokens share all the mass */
    const float certain[4] = { 0.0f, INFINITY, 5.0f, INFINITY };
    assert_int_equal(observed_set(certain, 4, params(1, 0, 1, 0), 500), 0xA);
    assert_int_equal(observed_set(certain, 4, params(1, 1, 1, 0), 500), 0xA);
    t = trill_sample(certain, 4, &topk, 0, 0, 7, scratch, &lp);
    assert_true((t == 1 || t == 3) && fabs(lp - log(0.5)) < 1e-7);
    assert_int_equal(trill_sample(certain, 4, &greedy, 0, 0, 0, scratch, &lp), 1);
    assert_true(fabs(lp - log(0.5)) < 1e-7);
    free(scratch);
}

static void test_check_errors(void **state) {
    (void)state;
    trill_sampling s = trill_sampling_default();
    assert_true(s.temperature == 1 && s.top_k == 0 && s.top_p == 1 && s.min_p == 0);
    assert_int_equal(trill_sampling_check(&s), TRILL_OK);
    assert_int_equal(trill_sampling_check(&(trill_sampling){ .temperature = 0, .top_k = 5, .top_p = 1e-3f, .min_p = 0.999f }),
                     TRILL_OK);
    const struct {
        trill_sampling s;
        const char *needle;
    } bad[] = {
        { params(-0.1f, 0, 1, 0), "temperature must be a finite number >= 0" },
        { params(NAN, 0, 1, 0), "temperature" },
        { params(INFINITY, 0, 1, 0), "temperature" },
        { params(1, -1, 1, 0), "top_k must be >= 0 (0 = off), got -1" },
        { params(1, 0, 0, 0), "top_p must be in (0, 1]" },
        { params(1, 0, 1.5f, 0), "top_p must be in (0, 1] (1 = off), got 1.5" },
        { params(1, 0, NAN, 0), "top_p" },
        { params(1, 0, 1, 1), "min_p must be in [0, 1)" },
        { params(1, 0, 1, -0.5f), "min_p must be in [0, 1) (0 = off), got -0.5" },
        { params(1, 0, 1, NAN), "min_p" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(trill_sampling_check(&bad[i].s), TRILL_ERR_INVALID);
        assert_non_null(strstr(trill_error_message(), bad[i].needle));
    }
}

/* The fast paths (rising-threshold top-k, histogram top-p, block sums, polynomial exp) give the
 * reference's tokens and logprobs over logits with ties, masks and NaNs and parameters that
 * cut at every depth (top_p just under 1, top_k >= V included). Rounding could in principle
 * move a cut or a draw that lies within ~1e-15 of a boundary; none of these 1200 does. */
static void test_matches_full_sort_reference(void **state) {
    (void)state;
    enum { V = 3000 };
    float logits[V];
    ref_tok *buf = malloc(V * sizeof *buf);
    void *scratch = scratch_for(V);
    const float temps[] = { 0.3f, 0.7f, 1.0f, 1.5f, 4.0f };
    const int ks[] = { 0, 1, 5, 50, 2999, 3000, 5000 };
    const float ps[] = { 1.0f, 0.999999f, 0.95f, 0.5f, 0.1f };
    const float mps[] = { 0.0f, 0.01f, 0.3f };
    int truncated = 0;
    for (uint64_t trial = 0; trial < 300; trial++) {
        uint64_t key = trill_rng_key(77, trial);
        random_logits(logits, V, key, trial % 3 == 0 ? 0.5 : 3.0);
        if (trial % 4 == 1) /* coarse values: many exact ties */
            for (int i = 0; i < V; i++) logits[i] = roundf(logits[i] * 2) / 2;
        if (trial % 5 == 2)
            for (int i = 0; i < V; i += 3) logits[i] = i % 2 ? -INFINITY : NAN;
        trill_sampling s = params(temps[trill_rng_bits(key, 1000) % 5], ks[trill_rng_bits(key, 1001) % 7],
                                  ps[trill_rng_bits(key, 1002) % 5], mps[trill_rng_bits(key, 1003) % 3]);
        s.seed = trial;
        int n = ref_kept(logits, V, &s, buf);
        for (uint32_t pos = 0; pos < 4; pos++) {
            float lp;
            int tok = trill_sample(logits, V, &s, trial, 0, pos, scratch, &lp);
            assert_int_equal(tok, ref_draw(buf, n, &s, trial, 0, pos));
            double ref = ref_logprob(logits, V, s.temperature, tok);
            assert_true(fabs(lp - ref) <= 1.2e-7 * fmax(1.0, fabs(ref)));
        }
        truncated += n < V / 2;
    }
    assert_true(truncated > 100); /* the filters actually cut */
    free(scratch);
    free(buf);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy),
        cmocka_unit_test(test_logprob_is_untruncated_log_softmax),
        cmocka_unit_test(test_top_k_one_is_argmax),
        cmocka_unit_test(test_kept_sets_and_filter_order),
        cmocka_unit_test(test_frequencies),
        cmocka_unit_test(test_reproducible_streams),
        cmocka_unit_test(test_nan_and_inf_logits),
        cmocka_unit_test(test_check_errors),
        cmocka_unit_test(test_matches_full_sort_reference),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
