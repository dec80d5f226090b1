#include "base/json.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "trill/fileio.h"

trill_status trill_json_parse(const char *what, const char *buf, size_t len, json_t **out) {
    json_error_t err;
    errno = 0;
    json_t *root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &err);
    /* An allocation failing inside jansson is often reported as a syntax error (or with no
     * message); the allocator's errno tells them apart (parsing a buffer does no I/O). */
    if (!root && (errno == ENOMEM || json_error_code(&err) == json_error_out_of_memory || !err.text[0]))
        return trill_error(TRILL_ERR_NOMEM, "%s: out of memory parsing JSON (%zu bytes)", what, len);
    if (!root)
        return trill_error(TRILL_ERR_INVALID, "%s: invalid JSON at line %d column %d: %s",
                           what, err.line, err.column, err.text);
    *out = root;
    return TRILL_OK;
}

trill_status trill_json_load_file(const char *path, json_t **out) {
    char *buf;
    size_t len;
    trill_status st = trill_read_file(path, &buf, &len);
    if (st) return st;
    st = trill_json_parse(path, buf, len, out);
    free(buf);
    return st;
}

const char *trill_json_type_name(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "object";
    case JSON_ARRAY: return "array";
    case JSON_STRING: return "string";
    case JSON_INTEGER: return "integer";
    case JSON_REAL: return "number";
    case JSON_TRUE:
    case JSON_FALSE: return "boolean";
    case JSON_NULL: return "null";
    }
    return "?";
}

trill_status trill_json_get_int(const json_t *obj, const char *key, const char *what,
                                long long min, long long max, int *out) {
    const json_t *v = json_object_get(obj, key);
    if (!v) return TRILL_OK;
    if (!json_is_integer(v))
        return trill_error(TRILL_ERR_INVALID, "%s: field \"%s\": expected an integer, got %s",
                           what, key, trill_json_type_name(v));
    long long x = json_integer_value(v);
    if (x < min || x > max)
        return trill_error(TRILL_ERR_INVALID, "%s: field \"%s\": %lld is out of range [%lld, %lld]",
                           what, key, x, min, max);
    *out = (int)x;
    return TRILL_OK;
}

trill_status trill_json_get_double(const json_t *obj, const char *key, const char *what,
                                   double min, double max, double *out) {
    const json_t *v = json_object_get(obj, key);
    if (!v) return TRILL_OK;
    if (!json_is_number(v))
        return trill_error(TRILL_ERR_INVALID, "%s: field \"%s\": expected a number, got %s",
                           what, key, trill_json_type_name(v));
    double x = json_number_value(v);
    if (!(x >= min && x <= max))
        return trill_error(TRILL_ERR_INVALID, "%s: field \"%s\": %g is out of range [%g, %g]",
                           what, key, x, min, max);
    *out = x;
    return TRILL_OK;
}

trill_status trill_json_get_bool(const json_t *obj, const char *key, const char *what, bool *out) {
    const json_t *v = json_object_get(obj, key);
    if (!v) return TRILL_OK;
    if (!json_is_boolean(v))
        return trill_error(TRILL_ERR_INVALID, "%s: field \"%s\": expected true or false, got %s",
                           what, key, trill_json_type_name(v));
    *out = json_is_true(v);
    return TRILL_OK;
}

trill_status trill_json_get_string(const json_t *obj, const char *key, const char *what,
                                   const char **out) {
    const json_t *v = json_object_get(obj, key);
    if (!v) return TRILL_OK;
    if (!json_is_string(v))
        return trill_error(TRILL_ERR_INVALID, "%s: field \"%s\": expected a string, got %s",
                           what, key, trill_json_type_name(v));
    *out = json_string_value(v);
    return TRILL_OK;
}

trill_status trill_json_write_file(const char *path, const json_t *root) {
    if (!root) return trill_error(TRILL_ERR_NOMEM, "%s: out of memory building JSON", path); /* json_pack's NULL */
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(15));
    if (!text) return trill_error(TRILL_ERR_NOMEM, "%s: out of memory serialising JSON", path);
    size_t n = strlen(text);
    text[n] = '\n'; /* replace the terminating NUL: the file ends in a newline */
    trill_status st = trill_write_file_atomic(path, text, n + 1);
    free(text);
    return st;
}
