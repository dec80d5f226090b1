/* config.json: the fields every family shares, the architecture's names, and the dispatch to
 * the family's own fields (trill_family.config_*, src/arch/<family>/config.c). */
#include "trill/config.h"
#include "model/config_json.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arch/family.h"
#include "base/json.h"

/* The config.json fields every family reads here; each family reads its own besides
 * (trill_family.config_keys). Others (transformers_version, use_cache...) are accepted and
 * ignored: they do not change the computation. */
static const char *const SHARED_KEYS[] = {
    "architectures", "model_type", "vocab_size", "hidden_size", "num_hidden_layers", "max_position_embeddings",
    "rms_norm_eps", "initializer_range", "tie_word_embeddings", "hidden_act", "bos_token_id", "eos_token_id",
    "torch_dtype", "id2label", "label2id", "num_labels", "pad_token_id",
};

bool trill_config_known_key(const char *key) {
    for (size_t i = 0; i < sizeof SHARED_KEYS / sizeof SHARED_KEYS[0]; i++)
        if (strcmp(key, SHARED_KEYS[i]) == 0) return true;
    for (int f = 0; f < trill_n_families; f++)
        for (const char *const *k = trill_families[f]->config_keys; *k; k++)
            if (strcmp(key, *k) == 0) return true;
    return false;
}

const char *trill_config_architecture(const trill_config *c) {
    const trill_arch_names *n = trill_arch_names_of(c->arch);
    return c->num_labels > 0 ? n->classifier : n->causal_lm;
}

const char *trill_config_model_type(const trill_config *c) { return trill_arch_names_of(c->arch)->model_type; }

bool trill_config_is_multimodal(const trill_config *c) { return trill_arch_names_of(c->arch)->text_model_type != NULL; }

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

/* The model types trill computes, for messages: "\"qwen3_moe\" or \"qwen3\"". */
static const char *model_types(char *buf, size_t size) {
    int n = 0, at = 0;
    for (int f = 0; f < trill_n_families; f++) n += trill_families[f]->n_archs;
    buf[0] = 0;
    for (int f = 0, i = 0; f < trill_n_families; f++)
        for (int a = 0; a < trill_families[f]->n_archs; a++, i++) {
            const char *sep = i == 0 ? "" : i == n - 1 ? " or " : ", ";
            int w = snprintf(buf + at, size - (size_t)at, "%s\"%s\"", sep, trill_families[f]->archs[a].model_type);
            if (w < 0 || (size_t)(at + w) >= size) return buf;
            at += w;
        }
    return buf;
}

/* The model type, and whether "architectures" names the sequence-classification head (a
 * reward model) instead of the causal LM. Every entry must name the same one of the two. */
static trill_status read_arch(const json_t *root, const char *what, trill_arch *arch, bool *classifier) {
    const char *model_type = NULL;
    char types[256];
    trill_status st = trill_json_get_string(root, "model_type", what, &model_type);
    if (st) return st;
    if (!model_type) return trill_error(TRILL_ERR_INVALID, "%s: field \"model_type\" is missing (expected %s)", what, model_types(types, sizeof types));
    const trill_arch_names *names = trill_arch_by_model_type(model_type);
    if (!names)
        return trill_error(TRILL_ERR_UNSUPPORTED, "%s: field \"model_type\": \"%s\" is not supported (expected %s)", what, model_type,
                           model_types(types, sizeof types));
    *arch = names->arch;

    *classifier = false;
    const char *lm = names->causal_lm, *cls = names->classifier;
    const json_t *archs = json_object_get(root, "architectures");
    if (!archs || json_is_null(archs)) return TRILL_OK;
    if (!json_is_array(archs))
        return trill_error(TRILL_ERR_INVALID, "%s: field \"architectures\": expected a list of names, got %s", what, trill_json_type_name(archs));
    size_t i;
    const json_t *a;
    json_array_foreach(archs, i, a) {
        const char *name = json_is_string(a) ? json_string_value(a) : "(not a string)";
        const bool is_cls = cls && strcmp(name, cls) == 0; /* a family may have no classifier (cls NULL) */
        if (!is_cls && strcmp(name, lm) != 0)
            return trill_error(TRILL_ERR_UNSUPPORTED, "%s: field \"architectures\": entry %zu: \"%s\" is not supported for model_type \"%s\" (expected \"%s\"%s%s%s)",
                               what, i, name, model_type, lm, cls ? " or \"" : "", cls ? cls : "", cls ? "\"" : "");
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

/* The layer map: which layers are MoE and each MoE layer's ordinal. */
static void build_layer_map(trill_config *c, const trill_family *f) {
    c->n_moe_layers = 0;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        const bool moe = f->layer_is_moe(c, l);
        c->moe_ordinal[l] = moe ? (int16_t)c->n_moe_layers : -1;
        if (moe) c->moe_layer[c->n_moe_layers++] = (int16_t)l;
    }
}

static trill_status config_fields(const json_t *root, const json_t *top, const char *what, const trill_family *f, bool classifier,
                                  trill_config *out);

trill_status trill_config_from_json(const json_t *root, const char *what, trill_config *out) {
    if (!json_is_object(root))
        return trill_error(TRILL_ERR_INVALID, "%s: expected a JSON object, got %s", what, trill_json_type_name(root));
    trill_arch arch = TRILL_ARCH_QWEN3_MOE;
    bool classifier = false;
    trill_status st = read_arch(root, what, &arch, &classifier);
    if (st) return st;
    trill_config c;
    memset(&c, 0, sizeof c);
    c.arch = arch;
    c.partial_rotary_factor = 1.0; /* HF's default for every family: RoPE on the whole head */
    c.bos_token_id = -1;
    c.pad_token_id = -1;
    const trill_family *f = trill_family_of(&c);
    f->config_defaults(&c);
    /* a multimodal model's language model: its fields are text_config's (the vision tower's are
     * not read); tie_word_embeddings and the special tokens may sit at the top level too, which wins */
    const json_t *text = root;
    if (trill_arch_names_of(arch)->text_model_type) {
        text = json_object_get(root, "text_config");
        if (!json_is_object(text))
            return trill_error(TRILL_ERR_INVALID, "%s: field \"text_config\": expected an object (the language model's fields of %s), got %s", what,
                               trill_arch_names_of(arch)->causal_lm, text ? trill_json_type_name(text) : "nothing");
    }
    if ((st = config_fields(text, root, what, f, classifier, &c))) return st;
    build_layer_map(&c, f);
    *out = c;
    return TRILL_OK;
}

/* The shared fields and the family's from `root` (text_config for a multimodal config; `top` the
 * whole config.json). */
static trill_status config_fields(const json_t *root, const json_t *top, const char *what, const trill_family *f, bool classifier,
                                  trill_config *out) {
    trill_config c = *out;
    trill_status st;
    if ((st = trill_json_get_int(root, "vocab_size", what, 1, 1 << 24, &c.vocab_size)) ||
        (st = trill_json_get_int(root, "hidden_size", what, 1, 1 << 20, &c.hidden_size)) ||
        (st = trill_json_get_int(root, "num_hidden_layers", what, 1, TRILL_MAX_LAYERS, &c.num_hidden_layers)) ||
        (st = trill_json_get_int(root, "max_position_embeddings", what, 1, 1 << 30, &c.max_position_embeddings)) ||
        (st = trill_json_get_double(root, "rms_norm_eps", what, 0.0, 1.0, &c.rms_norm_eps)) ||
        (st = trill_json_get_double(root, "initializer_range", what, 0.0, 10.0, &c.initializer_range)) ||
        (st = trill_json_get_bool(root, "tie_word_embeddings", what, &c.tie_word_embeddings)) ||
        (top != root && (st = trill_json_get_bool(top, "tie_word_embeddings", what, &c.tie_word_embeddings))) ||
        (st = f->config_read(root, what, &c)))
        return st;

    const char *act = "silu";
    if ((st = trill_json_get_string(root, "hidden_act", what, &act))) return st;
    if (strcmp(act, "silu") != 0)
        return trill_error(TRILL_ERR_UNSUPPORTED, "%s: field \"hidden_act\": \"%s\" is not supported (expected \"silu\")", what, act);
    if ((st = read_token_ids(root, what, &c))) return st;
    if (top != root) { /* the top level's special tokens, where it has them, over text_config's */
        if (json_object_get(top, "eos_token_id")) c.n_eos = 0;
        if ((st = read_token_ids(top, what, &c))) return st;
    }
    if (classifier) {
        const json_t *pad = json_object_get(root, "pad_token_id");
        if ((st = read_labels(root, what, &c)) ||
            (pad && !json_is_null(pad) && (st = trill_json_get_int(root, "pad_token_id", what, 0, c.vocab_size - 1, &c.pad_token_id))))
            return st;
    }
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
    ok &= json_object_set_new(j, "num_hidden_layers", json_integer(c->num_hidden_layers)) == 0;
    ok &= json_object_set_new(j, "hidden_act", json_string("silu")) == 0;
    ok &= json_object_set_new(j, "max_position_embeddings", json_integer(c->max_position_embeddings)) == 0;
    ok &= json_object_set_new(j, "rms_norm_eps", json_real(c->rms_norm_eps)) == 0;
    ok &= json_object_set_new(j, "initializer_range", json_real(c->initializer_range)) == 0;
    ok &= json_object_set_new(j, "tie_word_embeddings", json_boolean(c->tie_word_embeddings)) == 0;
    ok &= ok && trill_family_of(c)->config_write(c, j);
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
    const char *text_type = trill_arch_names_of(c->arch)->text_model_type;
    if (ok && text_type) { /* a multimodal config: the language model's fields in text_config (no vision_config: not kept) */
        json_t *outer = json_object(), *text = j;
        ok &= outer != NULL;
        static const char *const TOP[] = { "architectures", "model_type", "tie_word_embeddings", "torch_dtype" };
        for (size_t i = 0; ok && i < sizeof TOP / sizeof TOP[0]; i++) {
            json_t *v = json_object_get(text, TOP[i]);
            if (v) ok &= json_object_set(outer, TOP[i], v) == 0 && json_object_del(text, TOP[i]) == 0;
        }
        ok &= json_object_set_new(text, "model_type", json_string(text_type)) == 0;
        ok &= ok && json_object_set_new(outer, "text_config", text) == 0;
        j = outer;
    }
    if (!ok) {
        json_decref(j);
        return NULL;
    }
    return j;
}

char *trill_config_to_text(const trill_config *c) {
    json_t *j = trill_config_to_json(c, NULL);
    char *text = j ? json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(15)) : NULL;
    json_decref(j);
    return text;
}
