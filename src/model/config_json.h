/* config.json as jansson objects, for the library and its tests (the public API, trill/config.h,
 * takes and gives text). */
#ifndef TRILL_MODEL_CONFIG_JSON_H
#define TRILL_MODEL_CONFIG_JSON_H

#include <jansson.h>

#include "trill/config.h"

/* `what` names the source in error messages (usually the config.json path). */
trill_status trill_config_from_json(const json_t *root, const char *what, trill_config *out);

/* HF config.json contents; `torch_dtype` is "float32" or "bfloat16" (NULL: omitted). NULL when out
 * of memory (never an object missing a field). */
json_t *trill_config_to_json(const trill_config *c, const char *torch_dtype);

/* config.json contents of a named preset (trill_config_preset_text), or NULL if unknown (or out
 * of memory). */
json_t *trill_config_preset(const char *name);

#endif
