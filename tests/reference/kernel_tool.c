/* The C side of the kernel reference test (tests/reference/kernels_ref.py):
 *   kernel_tool IN.jsonl OUT.jsonl
 * Each input line is one case {"op": ..., inputs}; each output line the fp32 kernels' results
 * for it (floats printed to round-trip: %.9g, doubles %.17g):
 *   attention  nh nkv hd_qk hd_v scale offsets q k v dout  -> out dq dk dv (gradients from 0)
 *   rope       n_heads head_stride rot_offset rot_dim pairing ("half"|"adjacent") cs_scale pos
 *              inv_freq x dout                               -> y (trill_rope_partial_forward of x),
 *                                                               dx (trill_rope_partial_backward of dout)
 *   yarn       dim theta factor original_max_position_embeddings beta_fast beta_slow mscale
 *              mscale_all_dim truncate                       -> inv_freq attention_factor
 *   router     T E K score ("softmax"|"sigmoid") bias (or null) n_group topk_group norm eps
 *              scaling logits dgates                         -> scores idx gates dlogits
 * Exit status 0 when every case ran; 1 on a malformed case or a kernel error. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trill/kernels.h"

static const char *g_case = "?";

static void die(const char *what) {
    fprintf(stderr, "kernel_tool: case %s: %s\n", g_case, what);
    exit(1);
}

static void *alloc(size_t n) {
    void *p = calloc(n ? n : 1, 1);
    if (!p) die("out of memory");
    return p;
}

static const json_t *field(const json_t *o, const char *name) {
    const json_t *v = json_object_get(o, name);
    if (!v) {
        fprintf(stderr, "kernel_tool: case %s: no field \"%s\"\n", g_case, name);
        exit(1);
    }
    return v;
}

static int get_int(const json_t *o, const char *name) {
    const json_t *v = field(o, name);
    if (!json_is_integer(v)) die(name);
    return (int)json_integer_value(v);
}

static double get_num(const json_t *o, const char *name) {
    const json_t *v = field(o, name);
    if (!json_is_number(v)) die(name);
    return json_number_value(v);
}

/* float array of exactly n entries (n < 0: any length, returned in *len) */
static float *get_floats(const json_t *o, const char *name, long n, size_t *len) {
    const json_t *a = field(o, name);
    if (!json_is_array(a) || (n >= 0 && json_array_size(a) != (size_t)n)) die(name);
    float *x = alloc(sizeof(float) * json_array_size(a));
    for (size_t i = 0; i < json_array_size(a); i++) {
        const json_t *v = json_array_get(a, i);
        if (!json_is_number(v)) die(name);
        x[i] = (float)json_number_value(v);
    }
    if (len) *len = json_array_size(a);
    return x;
}

static int *get_ints(const json_t *o, const char *name, size_t *len) {
    const json_t *a = field(o, name);
    if (!json_is_array(a)) die(name);
    int *x = alloc(sizeof(int) * json_array_size(a));
    for (size_t i = 0; i < json_array_size(a); i++) {
        const json_t *v = json_array_get(a, i);
        if (!json_is_integer(v)) die(name);
        x[i] = (int)json_integer_value(v);
    }
    *len = json_array_size(a);
    return x;
}

static void put_floats(FILE *f, const char *name, const float *x, size_t n) {
    fprintf(f, ", \"%s\": [", name);
    for (size_t i = 0; i < n; i++) fprintf(f, "%s%.9g", i ? ", " : "", (double)x[i]);
    fputc(']', f);
}

static void put_ints(FILE *f, const char *name, const int *x, size_t n) {
    fprintf(f, ", \"%s\": [", name);
    for (size_t i = 0; i < n; i++) fprintf(f, "%s%d", i ? ", " : "", x[i]);
    fputc(']', f);
}

static void check(trill_status st) {
    if (st) die(trill_error_message());
}

static void run_attention(const json_t *c, FILE *out) {
    const int nh = get_int(c, "nh"), nkv = get_int(c, "nkv"), hd = get_int(c, "hd_qk"), hv = get_int(c, "hd_v");
    const float scale = (float)get_num(c, "scale");
    size_t n_off;
    int *offsets = get_ints(c, "offsets", &n_off);
    if (n_off < 1 || nh < 1 || nkv < 1 || nh % nkv || hd < 1 || hv < 1) die("shape");
    const int n_seqs = (int)n_off - 1, T = offsets[n_seqs];
    const long nq = (long)T * nh * hd, nk = (long)T * nkv * hd, nv = (long)T * nkv * hv, no = (long)T * nh * hv;
    float *q = get_floats(c, "q", nq, NULL), *k = get_floats(c, "k", nk, NULL), *v = get_floats(c, "v", nv, NULL);
    float *dout = get_floats(c, "dout", no, NULL);
    float *o = alloc(sizeof(float) * no), *dq = alloc(sizeof(float) * nq), *dk = alloc(sizeof(float) * nk), *dv = alloc(sizeof(float) * nv);
    check(trill_attention_forward(o, q, k, v, offsets, n_seqs, nh, nkv, hd, hv, scale, TRILL_PRECISION_FP32, NULL));
    check(trill_attention_backward(dq, dk, dv, dout, q, k, v, offsets, n_seqs, nh, nkv, hd, hv, scale, TRILL_PRECISION_FP32, NULL));
    put_floats(out, "out", o, no);
    put_floats(out, "dq", dq, nq);
    put_floats(out, "dk", dk, nk);
    put_floats(out, "dv", dv, nv);
    free(offsets), free(q), free(k), free(v), free(dout), free(o), free(dq), free(dk), free(dv);
}

static void run_rope(const json_t *c, FILE *out) {
    const int nh = get_int(c, "n_heads"), stride = get_int(c, "head_stride"), off = get_int(c, "rot_offset");
    const int rd = get_int(c, "rot_dim");
    const char *pairing = json_string_value(field(c, "pairing"));
    if (!pairing || (strcmp(pairing, "half") && strcmp(pairing, "adjacent"))) die("pairing");
    const int pr = strcmp(pairing, "adjacent") ? ROPE_ROTATE_HALF : ROPE_ADJACENT;
    const float cs = (float)get_num(c, "cs_scale");
    size_t T;
    int *pos = get_ints(c, "pos", &T);
    if (rd < 2 || rd % 2 || off < 0 || off + rd > stride) die("shape");
    const long n = (long)T * nh * stride;
    float *inv = get_floats(c, "inv_freq", rd / 2, NULL), *x = get_floats(c, "x", n, NULL), *dx = get_floats(c, "dout", n, NULL);
    trill_rope_partial_forward(x, pos, inv, (int)T, nh, stride, off, rd, pr, cs);
    trill_rope_partial_backward(dx, pos, inv, (int)T, nh, stride, off, rd, pr, cs);
    put_floats(out, "y", x, n);
    put_floats(out, "dx", dx, n);
    free(pos), free(inv), free(x), free(dx);
}

static void run_yarn(const json_t *c, FILE *out) {
    const int dim = get_int(c, "dim");
    if (dim < 2 || dim % 2) die("dim");
    float *inv = alloc(sizeof(float) * (dim / 2));
    const double af = trill_rope_inv_freq_yarn(inv, dim, get_num(c, "theta"), get_num(c, "factor"),
                                         get_int(c, "original_max_position_embeddings"), get_num(c, "beta_fast"),
                                         get_num(c, "beta_slow"), get_num(c, "mscale"), get_num(c, "mscale_all_dim"),
                                         json_is_true(field(c, "truncate")));
    put_floats(out, "inv_freq", inv, dim / 2);
    fprintf(out, ", \"attention_factor\": %.17g", af);
    free(inv);
}

static void run_router(const json_t *c, FILE *out) {
    const int T = get_int(c, "T"), E = get_int(c, "E"), K = get_int(c, "K");
    const char *score = json_string_value(field(c, "score"));
    if (!score || (strcmp(score, "softmax") && strcmp(score, "sigmoid"))) die("score");
    const int sigmoid = !strcmp(score, "sigmoid"), norm = json_is_true(field(c, "norm"));
    if (T < 1 || E < 1 || K < 1 || K > E) die("shape");
    float *logits = get_floats(c, "logits", (long)T * E, NULL), *dgates = get_floats(c, "dgates", (long)T * K, NULL);
    float *bias = json_is_null(field(c, "bias")) ? NULL : get_floats(c, "bias", E, NULL);
    const float eps = (float)get_num(c, "eps"), scaling = (float)get_num(c, "scaling");
    float *scores = alloc(sizeof(float) * T * E), *val = alloc(sizeof(float) * T * K), *gates = alloc(sizeof(float) * T * K);
    float *dsel = alloc(sizeof(float) * T * K), *dlogits = alloc(sizeof(float) * T * E);
    int *idx = alloc(sizeof(int) * T * K);
    if (sigmoid) trill_sigmoid_forward(scores, logits, (size_t)T * E);
    else trill_softmax_forward(scores, logits, T, E);
    check(trill_router_topk_forward(idx, val, scores, bias, T, E, K, get_int(c, "n_group"), get_int(c, "topk_group")));
    trill_router_gates_forward(gates, scores, idx, T, E, K, norm, eps, scaling);
    trill_router_gates_backward(dsel, dgates, scores, idx, T, E, K, norm, eps, scaling);
    if (sigmoid) trill_router_sigmoid_backward(dlogits, dsel, scores, idx, T, E, K);
    else trill_router_softmax_backward(dlogits, dsel, scores, idx, T, E, K);
    put_floats(out, "scores", scores, (size_t)T * E);
    put_ints(out, "idx", idx, (size_t)T * K);
    put_floats(out, "gates", gates, (size_t)T * K);
    put_floats(out, "dlogits", dlogits, (size_t)T * E);
    free(logits), free(dgates), free(bias), free(scores), free(val), free(gates), free(dsel), free(dlogits), free(idx);
}

int main(int argc, char **argv) {
    trill_blas_restart(argv); /* OpenBLAS's kernels for this CPU */
    if (argc != 3) {
        fprintf(stderr, "usage: kernel_tool IN.jsonl OUT.jsonl\n");
        return 2;
    }
    FILE *in = fopen(argv[1], "r"), *out = in ? fopen(argv[2], "w") : NULL;
    if (!in || !out) {
        perror(in ? argv[2] : argv[1]);
        return 1;
    }
    char *line = NULL;
    size_t cap = 0;
    int n = 0;
    while (getline(&line, &cap, in) > 0) {
        if (strspn(line, " \t\r\n") == strlen(line)) continue;
        json_error_t err;
        json_t *c = json_loads(line, 0, &err);
        if (!c) {
            fprintf(stderr, "kernel_tool: %s line %d: %s\n", argv[1], n + 1, err.text);
            return 1;
        }
        const char *op = json_string_value(json_object_get(c, "op"));
        g_case = json_string_value(json_object_get(c, "name")) ? json_string_value(json_object_get(c, "name")) : "?";
        fprintf(out, "{\"name\": \"%s\"", g_case);
        if (!op) die("no op");
        else if (!strcmp(op, "attention")) run_attention(c, out);
        else if (!strcmp(op, "rope")) run_rope(c, out);
        else if (!strcmp(op, "yarn")) run_yarn(c, out);
        else if (!strcmp(op, "router")) run_router(c, out);
        else die("unknown op");
        fputs("}\n", out);
        json_decref(c);
        n++;
    }
    free(line);
    fclose(in);
    if (fclose(out)) {
        perror(argv[2]);
        return 1;
    }
    return 0;
}
