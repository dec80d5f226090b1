/* The adapter files of routed experts that the checkpoint stacks (trill_stacked, src/arch/family.h:
 * gpt-oss's gate_up_proj [E, H, 2I] and down_proj [E, I, H]; Qwen3.5's gate_up_proj [E, 2I, H] and
 * down_proj [E, H, I]), in the form PEFT writes for them:
 * `target_parameters`, a lora.ParamWrapper on each 3-D parameter (PEFT's tuners/lora/layer.py).
 *
 * PEFT's ParamWrapper on a parameter W [E, in, out] (x @ W; transformers marks these experts
 * is_transposed, so PEFT does not swap in and out) holds lora_A [R E, in] and lora_B [out, R E]:
 *   delta W[e] = scale * A_e^T B_e^T,  A_e = A.reshape(E, R, in)[e],  B_e = B.reshape(out, R, E)[:, :, e]
 * On W [E, out, in] (nn.Linear's orientation: Qwen3.5's gate_up_proj [E, 2I, H], gate's rows then
 * up's; not is_transposed, so PEFT swaps) it holds the same A and B, delta W[e] = scale B_e A_e.
 * (A's rows expert-major, B's columns expert-minor), scale = alpha / R (alpha / sqrt(R) with
 * rslora), R and alpha per parameter from rank_pattern / alpha_pattern (a key K applies to the
 * parameter's full name N when N matches "(.*\.)?(K)$", as PEFT's get_pattern_key). Its tensors
 * are named after the module that owns the parameter, the wrapper replacing it; with several
 * parameters of one module targeted, PEFT wraps them in their registration order, each wrapper
 * around the last: the first parameter's tensors are "<module>.base_layer.lora_A.weight" (one
 * "base_layer." per later wrapper), the last one's "<module>.lora_A.weight".
 *
 * trill keeps one adapter per expert and projection (gate [I, H], up [I, H], down [H, I], rank r)
 * like every other family's. gate_up_proj holds gate and up (gpt-oss's interleaved: gate the even
 * columns of out, up the odd; Qwen3.5's one after the other: gate's rows, then up's), so PEFT's one
 * adapter of rank R on it shares A between them:
 *   - written: rank 2r, block-diagonal (gate's rows in rank slots 0..r-1, up's in r..2r-1, the
 *     other slots 0), with rank_pattern 2r and alpha_pattern 2 alpha (sqrt(2) alpha with rslora)
 *     so the scale is r's: the same function, exactly (PEFT's own conversion of separate gate and
 *     up adapters into gate_up_proj's does the same);
 *   - read: that form back exactly, or PEFT's own of rank r (gate and up each take a copy of the
 *     shared A: the same function; training then moves them apart); any other rank is refused.
 *     A scale other than trill's is folded into B.
 * down_proj (stride 1) is a plain per-expert adapter either way. A file whose target_modules name
 * gate_proj / up_proj / down_proj instead holds them under trill's per-expert names
 * (model.layers.L.mlp.experts.E.gate_proj, its own form before this one); that is read too. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "arch/family.h"
#include "base/alloc.h"
#include "base/json.h"
#include "model/lora_internal.h"
#include "trill/safetensors.h"

const trill_stacked *trill_lora_stacked_of(const trill_lora *lora, const trill_param *t) {
    if (t->expert < 0 || t->ndim != 2) return NULL;
    for (int i = 0; i < lora->n_stacked; i++)
        if (lora->stacked[i].role == t->role) return &lora->stacked[i];
    return NULL;
}

/* "model.layers.%d.mlp.experts.gate_up_proj" -> "mlp.experts.gate_up_proj" (target_parameters'
 * entry): the pattern after the layer index's "%d.". */
static const char *suffix_of(const trill_stacked *sk) {
    const char *at = strstr(sk->name, "%d.");
    return at ? at + 3 : sk->name;
}

/* The names of stacked parameter `index` (into lora->stacked) of `layer`'s tensors: PEFT's nesting
 * over the layer's targeted stacked parameters (`targeted`: per lora->stacked entry), distinct
 * names in registration (table) order. */
static void tensor_names(const trill_lora *lora, const bool *targeted, int index, int layer, char *name, size_t n_name, char *a, char *b,
                         size_t n) {
    snprintf(name, n_name, lora->stacked[index].name, layer);
    int later = 0, seen_self = 0; /* targeted distinct parameters after this one */
    for (int i = 0; i < lora->n_stacked; i++) {
        bool first = true; /* the first entry of its name (gate and up share gate_up_proj) */
        for (int j = 0; j < i; j++) first &= strcmp(lora->stacked[j].name, lora->stacked[i].name) != 0;
        if (!first) continue;
        bool any = false;
        for (int j = 0; j < lora->n_stacked; j++) any |= targeted[j] && !strcmp(lora->stacked[j].name, lora->stacked[i].name);
        if (!strcmp(lora->stacked[i].name, lora->stacked[index].name)) seen_self = 1;
        else if (seen_self && any) later++;
    }
    const size_t module = (size_t)(strrchr(name, '.') - name); /* "model.layers.L.mlp.experts" */
    char infix[128] = "";
    for (int i = 0; i < later; i++) strncat(infix, ".base_layer", sizeof infix - strlen(infix) - 1);
    snprintf(a, n, "base_model.model.%.*s%s.lora_A.weight", (int)module, name, infix);
    snprintf(b, n, "base_model.model.%.*s%s.lora_B.weight", (int)module, name, infix);
}

/* Which stacked entries the adapter targets (its role's LoRA target selected). */
static void targeted_entries(const trill_lora *lora, bool *targeted) {
    for (int i = 0; i < lora->n_stacked; i++) targeted[i] = false;
    for (size_t t = 0; t < lora->n_tensors; t++) {
        const trill_stacked *sk = trill_lora_stacked_of(lora, &lora->tensors[t]);
        if (sk) targeted[sk - lora->stacked] = true;
    }
}

static trill_lora_peft_param *find_or_add(trill_lora_peft_param **list, int *n, int *cap, const char *name) {
    for (int i = 0; i < *n; i++)
        if (!strcmp((*list)[i].name, name)) return &(*list)[i];
    if (*n == *cap) {
        const int c = *cap ? 2 * *cap : 8;
        trill_lora_peft_param *p = realloc(*list, sizeof *p * (size_t)c);
        if (!p) return NULL;
        *list = p, *cap = c;
    }
    trill_lora_peft_param *p = &(*list)[(*n)++];
    *p = (trill_lora_peft_param){ 0 };
    snprintf(p->name, sizeof p->name, "%s", name);
    return p;
}

void trill_lora_peft_params_free(trill_lora_peft_param *p, int n) {
    for (int i = 0; p && i < n; i++) free(p[i].A), free(p[i].B);
    free(p);
}

trill_status trill_lora_peft_params(const trill_lora *lora, trill_lora_peft_param **out, int *n_out) {
    trill_lora_peft_param *list = NULL;
    int n = 0, cap = 0;
    bool targeted[TRILL_MAX_STACKED];
    targeted_entries(lora, targeted);
    const int64_t r = lora->config.rank, E = lora->n_experts;
    trill_status st = TRILL_OK;
    for (size_t t = 0; t + 1 < lora->n_tensors && !st; t += 2) { /* A, then B */
        const trill_param *A = &lora->tensors[t], *B = &lora->tensors[t + 1];
        const trill_stacked *sk = trill_lora_stacked_of(lora, A);
        if (!sk) continue;
        char name[160], a[224], b[224];
        tensor_names(lora, targeted, (int)(sk - lora->stacked), A->layer, name, sizeof name, a, b, sizeof a);
        trill_lora_peft_param *p = find_or_add(&list, &n, &cap, name);
        if (!p) { st = trill_error(TRILL_ERR_NOMEM, "out of memory"); break; }
        const int64_t S = sk->stride, R = S * r, in = A->shape[1], rows = B->shape[0];
        if (!p->A) {
            snprintf(p->a_name, sizeof p->a_name, "%s", a);
            snprintf(p->b_name, sizeof p->b_name, "%s", b);
            p->suffix = suffix_of(sk);
            p->layer = A->layer, p->stride = (int)S, p->rank = (int)R, p->in = in, p->out = rows * S, p->experts = E;
            p->alpha = lora->config.alpha * (lora->config.use_rslora ? sqrt((double)S) : (double)S); /* trill's scale at rank S r */
            p->A = trill_calloc((size_t)(R * E * in), sizeof(float));
            p->B = trill_calloc((size_t)(p->out * R * E), sizeof(float));
            if (!p->A || !p->B) { st = trill_error(TRILL_ERR_NOMEM, "out of memory for %s's adapter", name); break; }
        }
        const int64_t o = sk->offset, e = A->expert;
        for (int64_t k = 0; k < r; k++) /* A_e's rows o r .. o r + r - 1 */
            memcpy(p->A + ((e * R + o * r + k) * in), A->data + k * in, sizeof(float) * (size_t)in);
        for (int64_t i = 0; i < rows; i++) /* the member's row i of out: interleaved, or its part's (nn.Linear's layout) */
            for (int64_t k = 0; k < r; k++) p->B[(sk->linear ? o * rows + i : i * S + o) * (R * E) + (o * r + k) * E + e] = B->data[i * r + k];
    }
    if (st) { trill_lora_peft_params_free(list, n); return st; }
    *out = list, *n_out = n;
    return TRILL_OK;
}

/* ---- reading ---- */

/* The value of the first key of a rank_pattern / alpha_pattern object that applies to `name`
 * (PEFT: re.match("(.*\.)?(KEY)$", name)), into *out; false when none does. */
static trill_status pattern_value(const json_t *pattern, const char *name, const char *what, const char *field, double *out, bool *found) {
    *found = false;
    if (!pattern || json_is_null(pattern)) return TRILL_OK;
    if (!json_is_object(pattern)) return trill_error(TRILL_ERR_INVALID, "%s: field \"%s\": expected an object", what, field);
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)pattern, key, v) {
        char *re = trill_malloc(strlen(key) + 16);
        if (!re) return trill_error(TRILL_ERR_NOMEM, "out of memory");
        sprintf(re, "(.*\\.)?(%s)$", key);
        int err;
        PCRE2_SIZE off;
        pcre2_code *code = pcre2_compile((PCRE2_SPTR)re, PCRE2_ZERO_TERMINATED, PCRE2_ANCHORED, &err, &off, NULL);
        free(re);
        if (!code) return trill_error(TRILL_ERR_INVALID, "%s: field \"%s\": key \"%s\" is not a regular expression", what, field, key);
        pcre2_match_data *md = pcre2_match_data_create_from_pattern(code, NULL);
        const int rc = md ? pcre2_match(code, (PCRE2_SPTR)name, strlen(name), 0, 0, md, NULL) : -1;
        pcre2_match_data_free(md);
        pcre2_code_free(code);
        if (rc < 0) continue;
        if (!json_is_number(v)) return trill_error(TRILL_ERR_INVALID, "%s: field \"%s\": key \"%s\": expected a number", what, field, key);
        *out = json_number_value(v);
        *found = true;
        return TRILL_OK;
    }
    return TRILL_OK;
}

trill_status trill_lora_read_target_parameters(const trill_config *c, const json_t *list, const char *what, unsigned *targets) {
    if (!list || json_is_null(list)) return TRILL_OK;
    const trill_family *f = trill_family_of(c);
    if (!json_is_array(list)) return trill_error(TRILL_ERR_INVALID, "%s: field \"target_parameters\": expected a list of parameter names", what);
    size_t i;
    const json_t *x;
    json_array_foreach(list, i, x) {
        const char *s = json_string_value(x);
        bool known = false;
        for (int k = 0; s && k < f->n_stacked; k++) {
            if (strcmp(suffix_of(&f->stacked[k]), s) != 0) continue;
            for (int row = 0; row < f->n_rows; row++)
                if (f->rows[row].role == f->stacked[k].role && f->rows[row].lora_target != TRILL_NO_LORA) {
                    *targets |= 1u << f->rows[row].lora_target;
                    known = true;
                }
        }
        if (!known)
            return trill_error(TRILL_ERR_UNSUPPORTED, "%s: field \"target_parameters\": entry %zu (%s) is not a stacked expert parameter of %s "
                               "(expected mlp.experts.gate_up_proj or mlp.experts.down_proj)", what, i, s ? s : "not a string",
                               trill_config_architecture(c));
    }
    return TRILL_OK;
}

bool trill_lora_in_file(const trill_lora *lora, const trill_param *p, unsigned params, unsigned modules, bool expert_modules) {
    const unsigned bit = 1u << p->lora_target;
    const trill_stacked *sk = trill_lora_stacked_of(lora, p);
    if (sk) return (params & bit) || ((!sk->linear || expert_modules) && (modules & bit));
    return (modules & bit) != 0;
}

size_t trill_lora_file_tensors(const trill_lora *lora, const trill_model *m, unsigned params, unsigned modules, bool expert_modules) {
    bool targeted[TRILL_MAX_STACKED];
    for (int i = 0; i < lora->n_stacked; i++) targeted[i] = false;
    size_t members = 0, n_params = 0, absent = 0;
    for (size_t t = 0; t < m->n_tensors; t++) {
        const trill_param *p = &m->tensors[t];
        if (p->lora_target == TRILL_NO_LORA || !(lora->config.targets & (1u << p->lora_target))) continue;
        absent += !trill_lora_in_file(lora, p, params, modules, expert_modules);
        if (!(params & (1u << p->lora_target))) continue;
        const trill_stacked *sk = trill_lora_stacked_of(lora, p);
        if (!sk) continue;
        members++;
        if (p->expert == 0) {
            targeted[sk - lora->stacked] = true;
            bool first = true; /* one parameter per layer and name */
            for (int j = 0; j < sk - lora->stacked; j++) first &= !(targeted[j] && !strcmp(lora->stacked[j].name, sk->name));
            n_params += first;
        }
    }
    return lora->n_global_tensors - 2 * members + 2 * n_params - 2 * absent;
}

/* Trill's pair (A [r, in], B [rows, r]; a tensor-parallel slice's part) of member `o` of expert
 * e from PEFT's A [R E, in_whole], B [rows_whole S, R E]: block-diagonal (R = S r) or shared (R = r);
 * the member's rows of B interleaved (row i at i S + o) or, nn.Linear's layout (linear), its
 * part's (o rows_whole + i). */
static void fill_pair(trill_param *A, trill_param *B, const float *pa, const float *pb, int64_t R, int64_t r, int64_t S, int64_t o, int64_t E,
                      int64_t in_whole, bool linear, double ratio) {
    const int64_t e = A->expert, slot0 = R == r ? 0 : o * r, rows_whole = B->whole_shape[0];
    for (int64_t k = 0; k < r; k++)
        for (int64_t j = 0; j < A->shape[1]; j++) A->data[k * A->shape[1] + j] = pa[(e * R + slot0 + k) * in_whole + j + A->slice_at[1]];
    for (int64_t i = 0; i < B->shape[0]; i++) {
        const int64_t row = linear ? o * rows_whole + i + B->slice_at[0] : (i + B->slice_at[0]) * S + o;
        for (int64_t k = 0; k < r; k++) B->data[i * r + k] = (float)(ratio * pb[row * (R * E) + (slot0 + k) * E + e]);
    }
}

trill_status trill_lora_read_stacked(trill_lora *lora, unsigned params, const json_t *cfg, const char *cfg_path, const trill_st_file *f,
                                     const char *st_path) {
    bool targeted[TRILL_MAX_STACKED];
    targeted_entries(lora, targeted);
    const int64_t r = lora->config.rank, E = lora->n_experts;
    trill_status st = TRILL_OK;
    for (size_t t = 0; t + 1 < lora->n_tensors && !st; t += 2) {
        trill_param *A = &lora->tensors[t], *B = &lora->tensors[t + 1];
        const trill_stacked *sk = trill_lora_stacked_of(lora, A);
        if (!sk || !(params & (1u << A->lora_target))) continue;
        char name[160], an[224], bn[224];
        tensor_names(lora, targeted, (int)(sk - lora->stacked), A->layer, name, sizeof name, an, bn, sizeof an);
        double rank = (double)r, alpha = lora->config.alpha;
        bool fr, fa;
        if ((st = pattern_value(json_object_get(cfg, "rank_pattern"), name, cfg_path, "rank_pattern", &rank, &fr)) ||
            (st = pattern_value(json_object_get(cfg, "alpha_pattern"), name, cfg_path, "alpha_pattern", &alpha, &fa)))
            break;
        const int64_t S = sk->stride, R = (int64_t)rank, in = A->whole_shape[1], out = B->whole_shape[0] * S;
        if (R != r && R != S * r) {
            st = trill_error(TRILL_ERR_UNSUPPORTED, "%s: %s: rank %lld: trill's per-expert adapters of rank %lld hold rank %lld (PEFT's own) or "
                             "%lld (gate and up apart, block-diagonal)", cfg_path, name, (long long)R, (long long)r, (long long)r, (long long)(S * r));
            break;
        }
        const trill_tensor_view *va = trill_st_find(f, an), *vb = trill_st_find(f, bn);
        if (!va || !vb) {
            st = trill_error(TRILL_ERR_INVALID, "%s: missing tensor \"%s\" (adapter_config.json's target_parameters name %s)", st_path, va ? bn : an,
                             suffix_of(sk));
            break;
        }
        if (va->ndim != 2 || va->shape[0] != R * E || va->shape[1] != in || vb->ndim != 2 || vb->shape[0] != out || vb->shape[1] != R * E) {
            st = trill_error(TRILL_ERR_INVALID, "%s: tensors \"%s\" / \"lora_B\": shapes do not match the model and rank %lld (expected [%lld, %lld] and "
                             "[%lld, %lld])", st_path, an, (long long)R, (long long)(R * E), (long long)in, (long long)out, (long long)(R * E));
            break;
        }
        /* widened once per member: the tensors are small next to the experts they adapt */
        float *pa = trill_malloc(sizeof(float) * (size_t)(R * E * in)), *pb = trill_malloc(sizeof(float) * (size_t)(out * R * E));
        if (!pa || !pb) st = trill_error(TRILL_ERR_NOMEM, "out of memory reading %s", an);
        if (!st) {
            trill_to_f32(pa, va->data, va->dtype, (size_t)(R * E * in));
            trill_to_f32(pb, vb->data, vb->dtype, (size_t)(out * R * E));
            if (R == S * r && S > 1) /* block-diagonal: this member's rows use its slots only */
                for (int64_t i = 0; i < out && !st; i++)
                    for (int64_t k = 0; k < R * E && !st; k++)
                        if (pb[i * R * E + k] != 0 && (k / E) / r != (sk->linear ? i / (out / S) : i % S))
                            st = trill_error(TRILL_ERR_UNSUPPORTED, "%s: %s: rank %lld is trill's block-diagonal form of rank-%lld gate and up adapters, "
                                             "but lora_B row %lld uses rank slot %lld of the other projection", st_path, name, (long long)R,
                                             (long long)r, (long long)i, (long long)(k / E));
        }
        if (!st) { /* a scale other than trill's folded into B (1 when it is trill's, up to rounding: B exactly as written) */
            const bool rs = lora->config.use_rslora;
            const double ratio = (rs ? alpha / sqrt((double)R) : alpha / (double)R) / (rs ? lora->config.alpha / sqrt((double)r) : lora->config.alpha / (double)r);
            fill_pair(A, B, pa, pb, R, r, S, sk->offset, E, in, sk->linear, fabs(ratio - 1) < 1e-9 ? 1.0 : ratio);
        }
        free(pa);
        free(pb);
    }
    return st;
}
