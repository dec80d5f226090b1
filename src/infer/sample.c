/* Token sampling: temperature → top-k → top-p → min-p → inverse-CDF draw (trill/sample.h).
 *
 * Everything works on the weights w[i] = exp((logit[i] - max) / T), held in double: w is 1 at the
 * argmax and in [0, 1] elsewhere, so S = sum w needs no dividing through and the filters are
 * thresholds on w. Each filter keeps a prefix of the tokens ranked by (w desc, id asc), so the
 * kept set is one cut in that ranking; the draw walks the kept tokens in id order.
 *
 * Cost at V = 150k is the one pass of exps; the rest is kept near it:
 *   - the exp is the kernels' branch-free fp32 one (kernels/exp_nonpos.h, within 1.01 ulp, 0 below
 *     -87: a weight under 1e-38 of the maximum's), vectorised (omp simd: GCC will not by itself); the
 *     log-prob itself is z - log S in double, so it stays accurate to ~1e-7;
 *   - sums are over fixed blocks of tokens (8 lanes within a block, blocks in order): fast and
 *     the same on every run; the draw finds its block from the block sums, then its token;
 *   - top-k: one pass with a rising threshold and a quickselect, never a sort of V;
 *   - top-p without top-k: a histogram of the mass by binary exponent finds the bucket holding
 *     the cut, and only that bucket's tokens are sorted. */
#include "trill/sample.h"

#include <assert.h>
#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/exp_nonpos.h"
#include "trill/rng.h"

#define BLOCK 256 /* tokens per block sum */

/* Top-p histogram: buckets of w by its top 16 bits (exponent and 4 mantissa bits: 16 buckets an
 * octave), which grow with the value. Bucket 0 holds w = 1, the next ones go down to 2^-64; the
 * last holds everything smaller (with 0, which adds nothing). */
#define KEY_SHIFT 48
#define KEY_ONE ((int)(0x3FF0000000000000ull >> KEY_SHIFT))
#define N_BUCKETS (64 * 16 + 1)

typedef struct cand {
    double w;
    int id;
} cand;

/* A prefix of the ranking: token i is kept iff w[i] > w_cut, or w[i] == w_cut and i <= id_cut.
 * Compared on the bits (w >= 0, so they order as the values) to stay vectorisable. */
typedef struct cut {
    uint64_t w_bits;
    int id;
} cut;

trill_sampling trill_sampling_default(void) {
    return (trill_sampling){ .temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .seed = 0 };
}

/* Written so that NaN fails every range. */
static bool temperature_ok(float t) { return isfinite(t) && t >= 0; }
static bool top_p_ok(float p) { return p > 0 && p <= 1; }
static bool min_p_ok(float p) { return p >= 0 && p < 1; }

trill_status trill_sampling_check(const trill_sampling *s) {
    if (!temperature_ok(s->temperature))
        return trill_error(TRILL_ERR_INVALID, "sampling: temperature must be a finite number >= 0 (0 = greedy), got %g",
                           (double)s->temperature);
    if (s->top_k < 0) return trill_error(TRILL_ERR_INVALID, "sampling: top_k must be >= 0 (0 = off), got %d", s->top_k);
    if (!top_p_ok(s->top_p))
        return trill_error(TRILL_ERR_INVALID, "sampling: top_p must be in (0, 1] (1 = off), got %g", (double)s->top_p);
    if (!min_p_ok(s->min_p))
        return trill_error(TRILL_ERR_INVALID, "sampling: min_p must be in [0, 1) (0 = off), got %g", (double)s->min_p);
    return TRILL_OK;
}

static int n_blocks(int V) { return (V + BLOCK - 1) / BLOCK; }

size_t trill_sample_scratch_size(int V) {
    return (size_t)V * (sizeof(double) + sizeof(cand)) + (size_t)n_blocks(V) * sizeof(double) + N_BUCKETS * sizeof(double);
}

static inline uint64_t bits_of(double d) {
    uint64_t b;
    memcpy(&b, &d, sizeof b);
    return b;
}

static inline double double_of(uint64_t b) {
    double d;
    memcpy(&d, &b, sizeof d);
    return d;
}

/* c ? a : b as masks: GCC (12) will not vectorise a loop with a conditional select in it. */
static inline uint32_t select32(bool c, uint32_t a, uint32_t b) { return (a & -(uint32_t)c) | (b & ~-(uint32_t)c); }

/* NaN → -inf (never sampled); +inf → FLT_MAX, so +inf tokens tie at the maximum and share the
 * mass (the limit of softmax) instead of giving inf - inf = NaN; -0 → +0 so the integer keys
 * below tie the two zeros. Done on the bits with selects: GCC will not vectorise floating-point
 * compares under its default -ftrapping-math, and this runs on every logit. */
static inline uint32_t clean_bits(float x) {
    uint32_t b;
    memcpy(&b, &x, sizeof b);
    b = select32((b & 0x7fffffffu) > 0x7f800000u, 0xff800000u, b);
    b = select32(b == 0x7f800000u, 0x7f7fffffu, b);
    return select32(b == 0x80000000u, 0, b);
}

static inline float clean_logit(float x) {
    uint32_t b = clean_bits(x);
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

/* An int32 that orders as the (cleaned) float does. */
static inline int32_t order_key(uint32_t b) { return (int32_t)(b & 0x80000000u ? b ^ 0x7fffffffu : b); }

static double z_of(float logit, float max, double inv_t) { return ((double)clean_logit(logit) - max) * inv_t; }

/* (64-bit index: GCC vectorises the masked sum below with it, not with int) */
static inline bool kept(uint64_t w_bits, int64_t i, cut k) {
    return (w_bits > k.w_bits) | ((w_bits == k.w_bits) & (i <= k.id));
}

/* The kept weights of w[lo..hi) (all of them if k is NULL: the common case, kept cheap)
 * summed in 8 interleaved lanes, then the lanes in order. */
static double block_sum_of(const double *w, int64_t lo, int64_t hi, const cut *k) {
    double lane[8] = { 0 }, sum = 0;
    int64_t i = lo;
    if (k)
        for (; i + 8 <= hi; i += 8)
            for (int j = 0; j < 8; j++) lane[j] += kept(bits_of(w[i + j]), i + j, *k) ? w[i + j] : 0.0;
    else
        for (; i + 8 <= hi; i += 8)
            for (int j = 0; j < 8; j++) lane[j] += w[i + j];
    for (int j = 0; j < 8; j++) sum += lane[j];
    for (; i < hi; i++) sum += !k || kept(bits_of(w[i]), i, *k) ? w[i] : 0.0;
    return sum;
}

/* Sums of the kept weights (k NULL: all) per block of BLOCK tokens into block_sum; returns
 * their total, added block by block. */
static double block_sums(const double *w, int V, const cut *k, double *block_sum) {
    double total = 0;
    for (int b = 0; b < n_blocks(V); b++) {
        block_sum[b] = block_sum_of(w, (int64_t)b * BLOCK, b * BLOCK + BLOCK < V ? b * BLOCK + BLOCK : V, k);
        total += block_sum[b];
    }
    return total;
}

/* The kept token at u of the kept mass: its block from the block sums, then the token by a
 * running sum within the block. Where rounding leaves u past the last running sum (u * total
 * rounded up, or a block's running sum a little under its lane sum) the draw falls to the last
 * kept token with weight in that block. */
static int draw(const double *w, int V, const double *block_sum, double total, cut k, double u) {
    double target = u * total, acc = 0;
    int nb = n_blocks(V), b = 0;
    while (b < nb && !(target < acc + block_sum[b])) acc += block_sum[b++];
    if (b == nb) { /* u * total rounded up to total: the last block with mass */
        do b--;
        while (block_sum[b] == 0);
        acc -= block_sum[b];
    }
    int lo = b * BLOCK, hi = lo + BLOCK < V ? lo + BLOCK : V, last = -1;
    for (int i = lo; i < hi; i++) {
        if (w[i] == 0 || !kept(bits_of(w[i]), i, k)) continue;
        last = i;
        if (target < (acc += w[i])) return i;
    }
    return last;
}

/* Descending weight, ties → lower id: the ranking every filter uses. */
static int cmp_rank(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->w != y->w) return x->w < y->w ? 1 : -1;
    return (x->id > y->id) - (x->id < y->id);
}

static inline void swap_cand(cand *a, cand *b) {
    cand t = *a;
    *a = *b;
    *b = t;
}

/* The k-th largest w among c[0..n) (1 <= k <= n), by quickselect with a three-way partition
 * (many equal values, as in a flat distribution, stay linear). Reorders c. */
static double kth_largest(cand *c, int n, int k) {
    int lo = 0, hi = n, r = k - 1;
    for (;;) {
        double a = c[lo].w, b = c[lo + (hi - lo) / 2].w, d = c[hi - 1].w;
        double pivot = fmax(fmin(a, b), fmin(fmax(a, b), d)); /* median of three */
        /* [lo, gt) > pivot, [gt, lt) == pivot, [lt, hi) < pivot */
        int gt = lo, i = lo, lt = hi;
        while (i < lt) {
            if (c[i].w > pivot) swap_cand(&c[gt++], &c[i++]);
            else if (c[i].w < pivot) swap_cand(&c[i], &c[--lt]);
            else i++;
        }
        if (r < gt) hi = gt;
        else if (r < lt) return pivot;
        else lo = lt;
    }
}

/* Keeps the c[j] with w >= threshold; returns how many. */
static int keep_from(cand *c, int n, double threshold) {
    int m = 0;
    for (int j = 0; j < n; j++)
        if (c[j].w >= threshold) c[m++] = c[j];
    return m;
}

/* The top k weights and any tied with the k-th (HF and vLLM keep ties: a threshold on the
 * value) into c, in no particular order; returns how many. One pass copies the tokens above a
 * threshold; whenever the buffer fills, a quickselect raises the threshold to the k-th largest
 * so far, so after the first few thousand tokens almost nothing is copied. */
static int top_k_set(const double *w, int V, int k, cand *c) {
    int cap = k < V / 8 ? (4 * k > 4096 ? 4 * k : 4096) : V, n = 0;
    if (cap > V) cap = V;
    double threshold = DBL_MIN; /* weights are 0 (never a candidate) or >= e^-87 > DBL_MIN */
    for (int i = 0; i < V; i++) {
        if (w[i] < threshold) continue;
        c[n++] = (cand){ w[i], i };
        if (n == cap && n > k) {
            threshold = kth_largest(c, n, k);
            n = keep_from(c, n, threshold);
            if (n > cap / 2) cap = cap <= V / 2 ? 2 * cap : V; /* many ties: give them room */
        }
    }
    if (n > k) n = keep_from(c, n, kth_largest(c, n, k));
    return n;
}

static int bucket_of(double w) {
    int b = KEY_ONE - (int)(bits_of(w) >> KEY_SHIFT);
    return b < N_BUCKETS - 1 ? b : N_BUCKETS - 1;
}

/* The smallest value in bucket b. */
static double bucket_floor(int b) { return b < N_BUCKETS - 1 ? double_of((uint64_t)(KEY_ONE - b) << KEY_SHIFT) : 0; }

/* Top-p over the ranked c[0..n), `above` being the mass ranked before c[0] (< target): a token
 * is kept while the mass ranked above it is < target, so the cut is at the first token whose
 * running sum reaches it. False when none does (then all of c is kept). */
static bool top_p_cut_in(const cand *c, int n, double above, double target, cut *out) {
    for (int j = 0; j < n; j++)
        if ((above += c[j].w) >= target) {
            *out = (cut){ bits_of(c[j].w), c[j].id };
            return true;
        }
    return false;
}

/* Top-p without top-k, over the whole vocabulary: mass per histogram bucket, from the top,
 * up to the bucket where it reaches top_p * S; only that bucket's tokens are ranked. */
static cut top_p_cut(const double *w, int V, double S, float top_p, double *mass, cand *c) {
    memset(mass, 0, N_BUCKETS * sizeof *mass);
    for (int i = 0; i < V; i++) mass[bucket_of(w[i])] += w[i];
    double target = (double)top_p * S, above = 0;
    int b = 0, last = 0;
    for (; b < N_BUCKETS; b++) {
        if (mass[b] == 0) continue;
        last = b;
        if (above + mass[b] >= target) break;
        above += mass[b];
    }
    if (b == N_BUCKETS) { /* rounding: top_p * S above the bucket total */
        b = last;
        above -= mass[b];
    }
    double lo = bucket_floor(b), hi = b > 0 ? bucket_floor(b - 1) : INFINITY;
    int n = 0;
    for (int i = 0; i < V; i++)
        if (w[i] >= lo && w[i] < hi && w[i] > 0) c[n++] = (cand){ w[i], i };
    qsort(c, (size_t)n, sizeof *c, cmp_rank);
    cut k;
    if (!top_p_cut_in(c, n, above, target, &k)) k = (cut){ bits_of(c[n - 1].w), c[n - 1].id };
    return k;
}

/* The stricter (shorter) of two prefixes of the ranking. */
static cut stricter(cut a, cut b) { return a.w_bits > b.w_bits || (a.w_bits == b.w_bits && a.id < b.id) ? a : b; }

/* The kept prefix after top-k, top-p and min-p, those switched on. */
static cut truncation_cut(const double *w, int V, double S, const trill_sampling *s, bool top_k, bool top_p,
                          bool min_p, double *mass, cand *c) {
    cut k = { 0, V }; /* everything */
    if (top_k) {
        int n = top_k_set(w, V, s->top_k, c);
        double kth = c[0].w;
        for (int j = 1; j < n; j++) kth = fmin(kth, c[j].w);
        k = (cut){ bits_of(kth), V }; /* ties with the k-th stay */
        if (top_p) { /* the mass top-p measures is what top-k kept, renormalised, ranked */
            qsort(c, (size_t)n, sizeof *c, cmp_rank);
            double S_k = 0;
            for (int j = 0; j < n; j++) S_k += c[j].w;
            cut p;
            if (top_p_cut_in(c, n, 0, (double)s->top_p * S_k, &p)) k = stricter(k, p);
        }
    } else if (top_p) {
        k = top_p_cut(w, V, S, s->top_p, mass, c);
    }
    /* p < min_p * p_max is w < min_p (w_max = 1, and the ratio survives renormalisation);
     * the argmax (w = 1 > min_p) always stays */
    if (min_p) k = stricter(k, (cut){ bits_of((double)s->min_p), V });
    return k;
}

/* The first token at the maximum (ties: the lowest id), or -1 when every logit is -inf or NaN:
 * the first block of 256 whose vectorised maximum is it, then a scalar walk inside that block. */
static int argmax_of(const float *logits, int V) {
    int32_t best = order_key(clean_bits(-INFINITY));
    for (int i = 0; i < V; i++) {
        int32_t key = order_key(clean_bits(logits[i]));
        best = key > best ? key : best;
    }
    if (best == order_key(clean_bits(-INFINITY))) return -1; /* only -inf and NaN */
    for (int b0 = 0; b0 < V; b0 += 256) {
        const int hi = b0 + 256 < V ? b0 + 256 : V;
        int32_t block_best = order_key(clean_bits(-INFINITY));
        for (int i = b0; i < hi; i++) {
            int32_t key = order_key(clean_bits(logits[i]));
            block_best = key > block_best ? key : block_best;
        }
        if (block_best != best) continue;
        int argmax = b0;
        while (order_key(clean_bits(logits[argmax])) != best) argmax++;
        return argmax;
    }
    return -1;
}

/* w[i] = exp((logit[i] - max) / T) into scratch and their sum S: what the draw and the log-prob
 * read. Greedy reports the model's own log-probability: temperature 1. */
static double weights_of(const float *logits, int V, float temperature, float max, double *w, double *block_sum, double *inv_t) {
    const double it = *inv_t = temperature == 0 ? 1.0 : 1.0 / temperature;
    /* simd: GCC will not vectorise exp_nonpos_f32's float compare by itself (-ftrapping-math); each
     * element is computed alone, so the results are the scalar loop's */
#pragma omp simd
    for (int i = 0; i < V; i++) w[i] = exp_nonpos_f32((float)z_of(logits[i], max, it));
    return block_sums(w, V, NULL, block_sum);
}

float trill_sample_logprob(const float *logits, int V, float temperature, int token, void *scratch) {
    assert(logits && V > 0 && scratch && token >= 0 && token < V && temperature_ok(temperature));
    const int argmax = argmax_of(logits, V);
    if (argmax < 0) return -INFINITY;
    const float max = clean_logit(logits[argmax]);
    double *w = scratch, inv_t;
    double *block_sum = (double *)((cand *)(w + V) + V);
    const double S = weights_of(logits, V, temperature, max, w, block_sum, &inv_t);
    return (float)(z_of(logits[token], max, inv_t) - log(S));
}

int trill_sample(const float *logits, int V, const trill_sampling *s, uint64_t request, uint32_t sample,
                 uint32_t position, void *scratch, float *logprob) {
    assert(logits && V > 0 && s && scratch);
    assert(temperature_ok(s->temperature) && s->top_k >= 0 && top_p_ok(s->top_p) && min_p_ok(s->min_p));
    const int argmax = argmax_of(logits, V);
    if (argmax < 0) {
        if (logprob) *logprob = -INFINITY;
        return -1;
    }
    float max = clean_logit(logits[argmax]);
    if (s->temperature == 0 && !logprob) return argmax;

    double *w = scratch, inv_t;
    cand *c = (cand *)(w + V);
    double *block_sum = (double *)(c + V);
    double *mass = block_sum + n_blocks(V);
    const double S = weights_of(logits, V, s->temperature, max, w, block_sum, &inv_t);

    int token = argmax;
    if (s->temperature > 0) {
        double u = trill_rng_uniform(trill_rng_key(trill_rng_key(s->seed, request), sample), position);
        bool top_k = s->top_k > 0 && s->top_k < V, top_p = s->top_p < 1, min_p = s->min_p > 0;
        if (top_k || top_p || min_p) {
            cut k = truncation_cut(w, V, S, s, top_k, top_p, min_p, mass, c);
            token = draw(w, V, block_sum, block_sums(w, V, &k, block_sum), k, u);
        } else {
            token = draw(w, V, block_sum, S, (cut){ 0, V }, u);
        }
    }
    if (logprob) *logprob = (float)(z_of(logits[token], max, inv_t) - log(S));
    return token;
}
