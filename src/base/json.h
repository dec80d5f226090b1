/* jansson glue: parsing with errors that name the file, line and column, and
 * typed field reads that name the file and field when the type or range is wrong.
 * A missing field leaves *out untouched (the caller's default). */
#ifndef TRILL_JSON_H
#define TRILL_JSON_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "trill/error.h"

trill_status trill_json_load_file(const char *path, json_t **out);
/* `what` names the source in messages (a path, "safetensors header of X", ...). */
trill_status trill_json_parse(const char *what, const char *buf, size_t len, json_t **out);

const char *trill_json_type_name(const json_t *v);

trill_status trill_json_get_int(const json_t *obj, const char *key, const char *what,
                                long long min, long long max, int *out);
trill_status trill_json_get_double(const json_t *obj, const char *key, const char *what,
                                   double min, double max, double *out);
trill_status trill_json_get_bool(const json_t *obj, const char *key, const char *what, bool *out);
trill_status trill_json_get_string(const json_t *obj, const char *key, const char *what,
                                   const char **out);

/* Writes `root` as pretty JSON (2-space indent, keys in insertion order) atomically. root NULL (what
 * a jansson builder returns when out of memory) is TRILL_ERR_NOMEM. */
trill_status trill_json_write_file(const char *path, const json_t *root);

#endif
