#include "trill/config.h"
#include "model/config_json.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"

/* Every config.json field trill reads. Others (transformers_version, use_cache,
 * torch_dtype...) are accepted and ignored: they do not change the computation. */
static const char *const KNOWN_KEYS[] = {
    "architectures", "model_type", "vocab_size", "hidden_size", "intermediate_size",
    "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
    "max_position_embeddings", "rms_norm_eps", "rope_theta", "initializer_range",
    "tie_word_embeddings", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
    "decoder_sparse_step", "norm_topk_prob", "mlp_only_layers", "bos_token_id", "eos_token_id",
    "hidden_act", "rope_scaling", "rope_parameters", "use_sliding_window", "attention_bias",
    "layer_types", "torch_dtype", "id2label", "label2id", "num_labels", "pad_token_id",
};

bool trill_config_known_key(const char *key) {
    for (size_t i = 0; i < sizeof KNOWN_KEYS / sizeof KNOWN_KEYS[0]; i++)
        if (strcmp(key, KNOWN_KEYS[i]) == 0) return true;
    return false;
}

static const char *architecture_name(trill_arch arch, bool classifier) {
    if (arch == TRILL_ARCH_QWEN3_MOE) return classifier ? "Qwen3MoeForSequenceClassification" : "Qwen3MoeForCausalLM";
    return classifier ? "Qwen3ForSequenceClassification" : "Qwen3ForCausalLM";
}

const char *trill_config_architecture(const trill_config *c) { return architecture_name(c->arch, c->num_labels > 0); }

const char *trill_config_model_type(const trill_config *c) {
    return c->arch == TRILL_ARCH_QWEN3_MOE ? "qwen3_moe" : "qwen3";
}

/* Hugging Face defaults for each architecture. */
static void set_defaults(trill_config *c, trill_arch arch) {
    memset(c, 0, sizeof *c);
    c->arch = arch;
    c->vocab_size = 151936;
    c->num_attention_heads = 32;
    c->max_position_embeddings = 32768;
    c->rms_norm_eps = 1e-6;
    c->rope_theta = 10000.0;
    c->initializer_range = 0.02;
    c->bos_token_id = -1;
    c->pad_token_id = -1;
    if (arch == TRILL_ARCH_QWEN3_MOE) {
        c->hidden_size = 2048;
        c->intermediate_size = 6144;
        c->num_hidden_layers = 24;
        c->num_key_value_heads = 4;
        c->head_dim = 0; /* HF: hidden_size / num_attention_heads when absent */
        c->num_experts = 128;
        c->num_experts_per_tok = 8;
        c->moe_intermediate_size = 768;
        c->decoder_sparse_step = 1;
    } else {
        c->hidden_size = 4096;
        c->intermediate_size = 22016;
        c->num_hidden_layers = 32;
        c->num_key_value_heads = 32;
        c->head_dim = 128;
    }
}

static trill_status refuse_if_true(const json_t *root, const char *key, const char *what) {
    bool flag = false;
    trill_status st = trill_json_get_bool(root, key, what, &flag);
    if (st) return st;
    if (flag) return trill_error(TRILL_ERR_UNSUPPORTED, "%s: field \"%s\": true is not supported (expected false)", what, key);
    return TRILL_OK;
}

/* rope_scaling / rope_parameters: only plain RoPE ("default") is computed. */
static trill_status read_rope(const json_t *root, const char *what, trill_config *c) {
    const json_t *scaling = json_object_get(root, "rope_scaling");
    const json_t *params = json_object_get(root, "rope_parameters");
    const char *keys[2] = { "rope_scaling", "rope_parameters" };
    const json_t *vals[2] = { scaling, params };
    for (int i = 0; i < 2; i++) {
        const json_t *v = vals[i];
        if (!v || json_is_null(v)) continue;
        if (!json_is_object(v))
            return trill_error(TRILL_ERR_INVALID, "%s: field \"%s\": expected an object or null, got %s", what, keys[i], trill_json_type_name(v));
        const char *type = NULL;
        if (trill_json_get_string(v, "rope_type", what, &type)) return TRILL_ERR_INVALID;
        if (!type) trill_json_get_string(v, "type", what, &type);
        if (!type || strcmp(type, "default") != 0)
            return trill_error(TRILL_ERR_UNSUPPORTED, "%s: field \"%s\": rope type \"%s\" is not supported (only plain RoPE, rope_type \"default\")",
                               what, keys[i], type ? type : "(missing)");
        trill_status st = trill_json_get_double(v, "rope_theta", what, 1e-3, 1e12, &c->rope_theta);
        if (st) return st;
    }
    return trill_json_get_double(root, "rope_theta", what, 1e-3, 1e12, &c->rope_theta);
}

static trill_status read_token_ids(const json_t *root, const char *what, trill_config *c) {
    trill_status st = TRILL_OK;
    const json_t *bos = json_object_get(root, "bos_token_id");
    if (bos && !json_is_null(bos) && (st = trill_json_get_int(root, "bos_token_id", what, 0, c->vocab_size - 1, &c->bos_token_id)))
        return st;
    const json_t *eos = json_object_get(root, "eos_token_id");
    if (!eos || json_is_null(eos)) return TRILL_OK;
    const json_t *list = eos;
    json_t *wrapped = NULL;
    if (json_is_integer(eos) && !(list = wrapped = json_pack("[O]", eos)))
        return trill_error(TRILL_ERR_NOMEM, "%s: out of memory reading \"eos_token_id\"", what);
    if (!json_is_array(list) || json_array_size(list) > TRILL_MAX_EOS)
        return trill_error(TRILL_ERR_INVALID, "%s: field \"eos_token_id\": expected an integer or a list of at most %d integers", what, TRILL_MAX_EOS);
    size_t i;
    const json_t *v;
    json_array_foreach(list, i, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= c->vocab_size) {
            st = trill_error(TRILL_ERR_INVALID, "%s: field \"eos_token_id\": entry %zu: expected a token id in [0, %d)", what, i, c->vocab_size);
            break;
        }
        c->eos_token_ids[c->n_eos++] = (int)json_integer_value(v);
    }
    json_decref(wrapped);
    return st;
}

static trill_status read_mlp_only_layers(const json_t *root, const char *what, trill_config *c) {
    const json_t *v = json_object_get(root, "mlp_only_layers");
    if (!v || json_is_null(v)) return TRILL_OK;
    if (!json_is_array(v))
        return trill_error(TRILL_ERR_INVALID, "%s: field \"mlp_only_layers\": expected a list of layer indices, got %s", what, trill_json_type_name(v));
    size_t i;
    const json_t *x;
    json_array_foreach(v, i, x) {
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= c->num_hidden_layers)
            return trill_error(TRILL_ERR_INVALID, "%s: field \"mlp_only_layers\": entry %zu: expected a layer index in [0, %d)", what, i, c->num_hidden_layers);
        c->mlp_only[json_integer_value(x)] = true;
    }
    return TRILL_OK;
}

static trill_status check_layer_types(const json_t *root, const char *what) {
    const json_t *v = json_object_get(root, "layer_types");
    if (!v || json_is_null(v)) return TRILL_OK;
    if (!json_is_array(v))
        return trill_error(TRILL_ERR_INVALID, "%s: field \"layer_types\": expected a list, got %s", what, trill_json_type_name(v));
    size_t i;
    const json_t *x;
    json_array_foreach(v, i, x) {
        if (!json_is_string(x) || strcmp(json_string_value(x), "full_attention") != 0)
            return trill_error(TRILL_ERR_UNSUPPORTED, "%s: field \"layer_types\": entry %zu: only \"full_attention\" is supported", what, i);
    }
    return TRILL_OK;
}

/* The model type, and whether "architectures" names the sequence-classification head (a
 * reward model) instead of the causal LM. Every entry must name the same one of the two. */
static trill_status read_arch(const json_t *root, const char *what, trill_arch *arch, bool *classifier) {
    const char *model_type = NULL;
    trill_status st = trill_json_get_string(root, "model_type", what, &model_type);
    if (st) return st;
    if (!model_type) return trill_error(TRILL_ERR_INVALID, "%s: field \"model_type\" is missing (expected \"qwen3_moe\" or \"qwen3\")", what);
    if (strcmp(model_type, "qwen3_moe") == 0) *arch = TRILL_ARCH_QWEN3_MOE;
    else if (strcmp(model_type, "qwen3") == 0) *arch = TRILL_ARCH_QWEN3;
    else return trill_error(TRILL_ERR_UNSUPPORTED, "%s: field \"model_type\": \"%s\" is not supported (expected \"qwen3_moe\" or \"qwen3\")", what, model_type);

    *classifier = false;
    const char *lm = architecture_name(*arch, false), *cls = architecture_name(*arch, true);
    const json_t *archs = json_object_get(root, "architectures");
    if (!archs || json_is_null(archs)) return TRILL_OK;
    if (!json_is_array(archs))
        return trill_error(TRILL_ERR_INVALID, "%s: field \"architectures\": expected a list of names, got %s", what, trill_json_type_name(archs));
    size_t i;
    const json_t *a;
    json_array_foreach(archs, i, a) {
        const char *name = json_is_string(a) ? json_string_value(a) : "(not a string)";
        const bool is_cls = strcmp(name, cls) == 0;
        if (!is_cls && strcmp(name, lm) != 0)
            return trill_error(TRILL_ERR_UNSUPPORTED, "%s: field \"architectures\": entry %zu: \"%s\" is not supported for model_type \"%s\" (expected \"%s\" or \"%s\")",
                               what, i, name, model_type, lm, cls);
        if (i > 0 && is_cls != *classifier)
            return trill_error(TRILL_ERR_INVALID, "%s: field \"architectures\": names both \"%s\" and \"%s\" (expected one: a causal LM has lm_head.weight, a classifier score.weight)",
                               what, lm, cls);
        *classifier = is_cls;
    }
    return TRILL_OK;
}

/* HF PretrainedConfig: num_labels is len(id2label) when id2label is present (keys are the label
 * ids as JSON strings), else the "num_labels" argument, else 2. id2label must name each id in
 * [0, n) once, since score.weight has one row per id; a "num_labels" that disagrees with it is
 * refused (HF only warns and uses id2label). Label names are not kept: a saved config has
 * HF's default names "LABEL_i". */
static trill_status read_labels(const json_t *root, const char *what, trill_config *c) {
    enum { MAX_LABELS = 1 << 16 };
    const json_t *map = json_object_get(root, "id2label");
    trill_status st;
    if (!map || json_is_null(map)) {
        c->num_labels = 2;
        return trill_json_get_int(root, "num_labels", what, 1, MAX_LABELS, &c->num_labels);
    }
    if (!json_is_object(map))
        return trill_error(TRILL_ERR_INVALID, "%s: field \"id2label\": expected an object {\"0\": name, ...}, got %s", what, trill_json_type_name(map));
    const size_t n = json_object_size(map);
    if (n == 0 || n > MAX_LABELS)
        return trill_error(TRILL_ERR_INVALID, "%s: field \"id2label\": %zu labels (expected 1 to %d)", what, n, (int)MAX_LABELS);
    const char *key;
    const json_t *name;
    json_object_foreach((json_t *)map, key, name) {
        char *end;
        const long id = strtol(key, &end, 10);
        const bool canonical = key[0] >= '0' && key[0] <= '9' && *end == 0 && (key[0] != '0' || key[1] == 0);
        if (!canonical || id < 0 || (size_t)id >= n)
            return trill_error(TRILL_ERR_INVALID, "%s: field \"id2label\": key \"%s\": expected a label id in [0, %zu) written as a decimal integer", what, key, n);
        if (!json_is_string(name))
            return trill_error(TRILL_ERR_INVALID, "%s: field \"id2label\": key \"%s\": expected a label name (string), got %s", what, key, trill_json_type_name(name));
    }
    /* n distinct keys, each a distinct canonical id in [0, n): every id is there exactly once */
    c->num_labels = (int)n;
    int stated = c->num_labels;
    if ((st = trill_json_get_int(root, "num_labels", what, 1, MAX_LABELS, &stated))) return st;
    if (stated != c->num_labels)
        return trill_error(TRILL_ERR_INVALID, "%s: field \"num_labels\": %d disagrees with the %d labels of \"id2label\"", what, stated, c->num_labels);
    return TRILL_OK;
}

static trill_status check_consistency(const trill_config *c, const char *what) {
    if (c->head_dim < 2) /* derived as hidden_size / num_attention_heads when absent */
        return trill_error(TRILL_ERR_INVALID, "%s: field \"head_dim\": %d (hidden_size %d / num_attention_heads %d) must be at least 2",
                           what, c->head_dim, c->hidden_size, c->num_attention_heads);
    if (c->num_attention_heads % c->num_key_value_heads != 0)
        return trill_error(TRILL_ERR_INVALID, "%s: num_attention_heads (%d) must be a multiple of num_key_value_heads (%d)",
                           what, c->num_attention_heads, c->num_key_value_heads);
    if (c->head_dim % 2 != 0)
        return trill_error(TRILL_ERR_INVALID, "%s: field \"head_dim\": %d must be even for RoPE", what, c->head_dim);
    if (c->arch == TRILL_ARCH_QWEN3_MOE && c->num_experts > 0 &&
        (c->num_experts_per_tok < 1 || c->num_experts_per_tok > c->num_experts))
        return trill_error(TRILL_ERR_INVALID, "%s: field \"num_experts_per_tok\": %d must be in [1, num_experts=%d]",
                           what, c->num_experts_per_tok, c->num_experts);
    return TRILL_OK;
}

/* HF Qwen3MoeDecoderLayer: MoE iff not in mlp_only_layers and (i+1) % decoder_sparse_step == 0. */
static void build_layer_map(trill_config *c) {
    c->n_moe_layers = 0;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        bool moe = c->arch == TRILL_ARCH_QWEN3_MOE && !c->mlp_only[l] && c->num_experts > 0 &&
                   (l + 1) % c->decoder_sparse_step == 0;
        c->moe_ordinal[l] = moe ? (int16_t)c->n_moe_layers : -1;
        if (moe) c->moe_layer[c->n_moe_layers++] = (int16_t)l;
    }
}

trill_status trill_config_from_json(const json_t *root, const char *what, trill_config *out) {
    if (!json_is_object(root))
        return trill_error(TRILL_ERR_INVALID, "%s: expected a JSON object, got %s", what, trill_json_type_name(root));
    trill_arch arch = TRILL_ARCH_QWEN3_MOE;
    bool classifier = false;
    trill_status st = read_arch(root, what, &arch, &classifier);
    if (st) return st;
    trill_config c;
    set_defaults(&c, arch);

    const int BIG = 1 << 24;
    if ((st = trill_json_get_int(root, "vocab_size", what, 1, BIG, &c.vocab_size)) ||
        (st = trill_json_get_int(root, "hidden_size", what, 1, 1 << 20, &c.hidden_size)) ||
        (st = trill_json_get_int(root, "intermediate_size", what, 1, BIG, &c.intermediate_size)) ||
        (st = trill_json_get_int(root, "num_hidden_layers", what, 1, TRILL_MAX_LAYERS, &c.num_hidden_layers)) ||
        (st = trill_json_get_int(root, "num_attention_heads", what, 1, 4096, &c.num_attention_heads)) ||
        (st = trill_json_get_int(root, "num_key_value_heads", what, 1, 4096, &c.num_key_value_heads)) ||
        (st = trill_json_get_int(root, "max_position_embeddings", what, 1, 1 << 30, &c.max_position_embeddings)) ||
        (st = trill_json_get_double(root, "rms_norm_eps", what, 0.0, 1.0, &c.rms_norm_eps)) ||
        (st = trill_json_get_double(root, "initializer_range", what, 0.0, 10.0, &c.initializer_range)) ||
        (st = trill_json_get_bool(root, "tie_word_embeddings", what, &c.tie_word_embeddings)) ||
        (st = read_rope(root, what, &c)))
        return st;
    if (c.head_dim == 0) c.head_dim = c.hidden_size / c.num_attention_heads;
    if ((st = trill_json_get_int(root, "head_dim", what, 2, 1 << 16, &c.head_dim))) return st;

    if (arch == TRILL_ARCH_QWEN3_MOE &&
        ((st = trill_json_get_int(root, "num_experts", what, 0, 65535, &c.num_experts)) ||
         (st = trill_json_get_int(root, "num_experts_per_tok", what, 1, 65535, &c.num_experts_per_tok)) ||
         (st = trill_json_get_int(root, "moe_intermediate_size", what, 1, BIG, &c.moe_intermediate_size)) ||
         (st = trill_json_get_int(root, "decoder_sparse_step", what, 1, TRILL_MAX_LAYERS, &c.decoder_sparse_step)) ||
         (st = trill_json_get_bool(root, "norm_topk_prob", what, &c.norm_topk_prob)) ||
         (st = read_mlp_only_layers(root, what, &c))))
        return st;
    if (arch == TRILL_ARCH_QWEN3) c.num_experts = c.num_experts_per_tok = 0;

    const char *act = "silu";
    if ((st = trill_json_get_string(root, "hidden_act", what, &act))) return st;
    if (strcmp(act, "silu") != 0)
        return trill_error(TRILL_ERR_UNSUPPORTED, "%s: field \"hidden_act\": \"%s\" is not supported (expected \"silu\")", what, act);
    if ((st = refuse_if_true(root, "use_sliding_window", what)) ||
        (st = refuse_if_true(root, "attention_bias", what)) ||
        (st = check_layer_types(root, what)) ||
        (st = read_token_ids(root, what, &c)) ||
        (st = check_consistency(&c, what)))
        return st;
    if (classifier) {
        const json_t *pad = json_object_get(root, "pad_token_id");
        if ((st = read_labels(root, what, &c)) ||
            (pad && !json_is_null(pad) && (st = trill_json_get_int(root, "pad_token_id", what, 0, c.vocab_size - 1, &c.pad_token_id))))
            return st;
    }

    build_layer_map(&c);
    *out = c;
    return TRILL_OK;
}

trill_status trill_config_load(const char *path, trill_config *out) {
    json_t *root;
    trill_status st = trill_json_load_file(path, &root);
    if (st) return st;
    st = trill_config_from_json(root, path, out);
    json_decref(root);
    return st;
}

trill_status trill_config_parse(const char *text, size_t len, const char *what, trill_config *out) {
    json_t *root;
    trill_status st = trill_json_parse(what, text, len, &root);
    if (st) return st;
    st = trill_config_from_json(root, what, out);
    json_decref(root);
    return st;
}

json_t *trill_config_to_json(const trill_config *c, const char *torch_dtype) {
    json_t *j = json_object();
    bool ok = j != NULL; /* every insertion checked: a config missing a field is never written */
    ok &= json_object_set_new(j, "architectures", json_pack("[s]", trill_config_architecture(c))) == 0;
    ok &= json_object_set_new(j, "model_type", json_string(trill_config_model_type(c))) == 0;
    ok &= json_object_set_new(j, "vocab_size", json_integer(c->vocab_size)) == 0;
    ok &= json_object_set_new(j, "hidden_size", json_integer(c->hidden_size)) == 0;
    ok &= json_object_set_new(j, "intermediate_size", json_integer(c->intermediate_size)) == 0;
    ok &= json_object_set_new(j, "num_hidden_layers", json_integer(c->num_hidden_layers)) == 0;
    ok &= json_object_set_new(j, "num_attention_heads", json_integer(c->num_attention_heads)) == 0;
    ok &= json_object_set_new(j, "num_key_value_heads", json_integer(c->num_key_value_heads)) == 0;
    ok &= json_object_set_new(j, "head_dim", json_integer(c->head_dim)) == 0;
    ok &= json_object_set_new(j, "hidden_act", json_string("silu")) == 0;
    ok &= json_object_set_new(j, "max_position_embeddings", json_integer(c->max_position_embeddings)) == 0;
    ok &= json_object_set_new(j, "rms_norm_eps", json_real(c->rms_norm_eps)) == 0;
    ok &= json_object_set_new(j, "rope_theta", json_real(c->rope_theta)) == 0;
    ok &= json_object_set_new(j, "rope_scaling", json_null()) == 0;
    ok &= json_object_set_new(j, "initializer_range", json_real(c->initializer_range)) == 0;
    ok &= json_object_set_new(j, "tie_word_embeddings", json_boolean(c->tie_word_embeddings)) == 0;
    ok &= json_object_set_new(j, "attention_bias", json_false()) == 0;
    ok &= json_object_set_new(j, "use_sliding_window", json_false()) == 0;
    if (c->arch == TRILL_ARCH_QWEN3_MOE) {
        ok &= json_object_set_new(j, "num_experts", json_integer(c->num_experts)) == 0;
        ok &= json_object_set_new(j, "num_experts_per_tok", json_integer(c->num_experts_per_tok)) == 0;
        ok &= json_object_set_new(j, "moe_intermediate_size", json_integer(c->moe_intermediate_size)) == 0;
        ok &= json_object_set_new(j, "decoder_sparse_step", json_integer(c->decoder_sparse_step)) == 0;
        ok &= json_object_set_new(j, "norm_topk_prob", json_boolean(c->norm_topk_prob)) == 0;
        json_t *mlp_only = json_array();
        for (int l = 0; l < c->num_hidden_layers; l++)
            if (c->mlp_only[l]) ok &= json_array_append_new(mlp_only, json_integer(l)) == 0;
        ok &= json_object_set_new(j, "mlp_only_layers", mlp_only) == 0;
    }
    if (c->bos_token_id >= 0) ok &= json_object_set_new(j, "bos_token_id", json_integer(c->bos_token_id)) == 0;
    if (c->n_eos == 1) ok &= json_object_set_new(j, "eos_token_id", json_integer(c->eos_token_ids[0])) == 0;
    else if (c->n_eos > 1) {
        json_t *eos = json_array();
        for (int i = 0; i < c->n_eos; i++) ok &= json_array_append_new(eos, json_integer(c->eos_token_ids[i])) == 0;
        ok &= json_object_set_new(j, "eos_token_id", eos) == 0;
    }
    if (c->num_labels > 0) {
        json_t *id2label = json_object(), *label2id = json_object();
        for (int i = 0; i < c->num_labels; i++) {
            char id[16], name[32];
            snprintf(id, sizeof id, "%d", i);
            snprintf(name, sizeof name, "LABEL_%d", i);
            ok &= json_object_set_new(id2label, id, json_string(name)) == 0;
            ok &= json_object_set_new(label2id, name, json_integer(i)) == 0;
        }
        ok &= json_object_set_new(j, "id2label", id2label) == 0;
        ok &= json_object_set_new(j, "label2id", label2id) == 0;
        if (c->pad_token_id >= 0) ok &= json_object_set_new(j, "pad_token_id", json_integer(c->pad_token_id)) == 0;
    }
    if (torch_dtype) ok &= json_object_set_new(j, "torch_dtype", json_string(torch_dtype)) == 0;
    if (!ok) {
        json_decref(j);
        return NULL;
    }
    return j;
}
