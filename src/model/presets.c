/* trill init's presets: each family's (its folder's presets.c), found through the registry. */
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arch/family.h"
#include "model/config_json.h"
#include "trill/error.h"

static const trill_preset *find(const char *name) {
    for (int f = 0; f < trill_n_families; f++)
        for (int i = 0; i < *trill_families[f]->n_presets; i++)
            if (strcmp(name, trill_families[f]->presets[i].name) == 0) return &trill_families[f]->presets[i];
    return NULL;
}

static char g_names[1024];
static void list_names(void) {
    size_t at = 0;
    for (int f = 0; f < trill_n_families; f++) {
        for (int i = 0; i < *trill_families[f]->n_presets; i++)
            at += (size_t)snprintf(g_names + at, sizeof g_names - at, "%s%s", at ? ", " : "", trill_families[f]->presets[i].name);
        at += (size_t)snprintf(g_names + at, sizeof g_names - at, " (%s)", trill_families[f]->name);
        if (at >= sizeof g_names) break;
    }
}

const char *trill_config_preset_names(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, list_names);
    return g_names;
}

bool trill_config_preset_is_real(const char *name) {
    const trill_preset *p = find(name);
    return p && p->real;
}

json_t *trill_config_preset(const char *name) {
    const trill_preset *p = find(name);
    return p ? json_loads(p->config, 0, NULL) : NULL;
}

char *trill_config_preset_text(const char *name) {
    if (!find(name)) {
        trill_error(TRILL_ERR_INVALID, "unknown preset \"%s\" (expected one of: %s)", name, trill_config_preset_names());
        return NULL;
    }
    json_t *j = trill_config_preset(name);
    if (!j) {
        trill_error(TRILL_ERR_NOMEM, "out of memory");
        return NULL;
    }
    char *text = json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(j);
    if (!text) trill_error(TRILL_ERR_NOMEM, "out of memory");
    return text;
}
