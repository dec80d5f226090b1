#include "trill/dtype.h"

#include <string.h>

size_t trill_dtype_size(trill_dtype dt) { return dt == TRILL_F32 ? 4 : 2; }

const char *trill_dtype_name(trill_dtype dt) {
    switch (dt) {
    case TRILL_F32: return "F32";
    case TRILL_BF16: return "BF16";
    case TRILL_F16: return "F16";
    }
    return "?";
}

int trill_dtype_parse(const char *name, trill_dtype *out) {
    static const trill_dtype all[] = { TRILL_F32, TRILL_BF16, TRILL_F16 };
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (strcmp(name, trill_dtype_name(all[i])) == 0) { *out = all[i]; return 0; }
    return -1;
}

void trill_to_f32(float *dst, const void *src, trill_dtype src_dtype, size_t n) {
    const unsigned char *s = src;
    switch (src_dtype) {
    case TRILL_F32:
        memcpy(dst, src, n * sizeof(float));
        return;
    case TRILL_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, s + 2 * i, 2);
            dst[i] = trill_bf16_to_f32(h);
        }
        return;
    case TRILL_F16:
        for (size_t i = 0; i < n; i++) {
            _Float16 h;
            memcpy(&h, s + 2 * i, 2);
            dst[i] = (float)h;
        }
        return;
    }
}

void trill_from_f32(void *dst, const float *src, trill_dtype dst_dtype, size_t n) {
    unsigned char *d = dst;
    switch (dst_dtype) {
    case TRILL_F32:
        memcpy(dst, src, n * sizeof(float));
        return;
    case TRILL_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h = trill_f32_to_bf16(src[i]);
            memcpy(d + 2 * i, &h, 2);
        }
        return;
    case TRILL_F16:
        for (size_t i = 0; i < n; i++) {
            _Float16 h = (_Float16)src[i];
            memcpy(d + 2 * i, &h, 2);
        }
        return;
    }
}
