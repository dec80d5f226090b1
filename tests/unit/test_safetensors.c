/* safetensors reading and writing: round trips in every dtype, dtype conversion on
 * write, sharded checkpoints and their index, a corpus of malformed files (each must
 * be refused with a message naming the file and the problem), atomic writes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "testutil.h"
#include "trill/dtype.h"
#include "trill/error.h"
#include "trill/fileio.h"
#include "trill/safetensors.h"

/* ---- helpers ------------------------------------------------------------------------ */

static char *join(const char *dir, const char *name) {
    char *p = trill_path_join(dir, name);
    assert_non_null(p);
    return p;
}

/* The message of the last error must contain `needle`. */
#define assert_msg_has(needle)                                                                   \
    do {                                                                                         \
        const char *m_ = trill_error_message();                                                  \
        if (!strstr(m_, (needle))) fail_msg("message \"%s\" lacks \"%s\"", m_, (needle));        \
    } while (0)

/* Names in `dir`, sorted, joined by "|" (so a test can compare the whole listing). */
static void dir_listing(const char *dir, char *out, size_t cap) {
    struct dirent **ents;
    int n = scandir(dir, &ents, NULL, alphasort);
    assert_true(n >= 0);
    out[0] = '\0';
    for (int i = 0; i < n; i++) {
        if (strcmp(ents[i]->d_name, ".") != 0 && strcmp(ents[i]->d_name, "..") != 0) {
            if (out[0]) strncat(out, "|", cap - strlen(out) - 1);
            strncat(out, ents[i]->d_name, cap - strlen(out) - 1);
        }
        free(ents[i]);
    }
    free(ents);
}

static uint64_t read_u64le(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* A safetensors file from a header text and a data section, as raw bytes. */
static unsigned char *st_bytes(uint64_t hlen_field, const char *header, const void *data, size_t data_len,
                               size_t *len) {
    size_t h = strlen(header);
    *len = 8 + h + data_len;
    unsigned char *b = malloc(*len ? *len : 1);
    assert_non_null(b);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(hlen_field >> (8 * i));
    memcpy(b + 8, header, h);
    if (data_len) {
        if (data) memcpy(b + 8 + h, data, data_len);
        else memset(b + 8 + h, 0x5a, data_len);
    }
    return b;
}

static void write_st(const char *dir, const char *name, const char *header, size_t data_len) {
    size_t len;
    unsigned char *b = st_bytes(strlen(header), header, NULL, data_len, &len);
    test_write(dir, name, b, len);
    free(b);
}

static uint32_t bits_of_f32(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static uint16_t u16_at(const void *p, size_t i) {
    uint16_t h;
    memcpy(&h, (const unsigned char *)p + 2 * i, 2);
    return h;
}

/* ---- round trip --------------------------------------------------------------------- */

/* Hand-checked conversions: value, BF16 bits, F16 bits (round to nearest, ties to even). */
static const struct { float v; uint16_t bf16, f16; } HAND[] = {
    { 1.0f, 0x3F80, 0x3C00 },
    { -2.5f, 0xC020, 0xC100 },
    { 65504.0f, 0x4780, 0x7BFF },           /* F16 max; BF16 rounds up to 65536 */
    { 1.0f + 0x1p-8f, 0x3F80, 0x3C04 },     /* BF16 tie -> even (1.0) */
    { 1.0f + 3 * 0x1p-8f, 0x3F82, 0x3C0C }, /* BF16 tie -> even (1 + 2^-6) */
    { 1.0f + 0x1p-9f, 0x3F80, 0x3C02 },     /* BF16 below half an ulp -> down */
    { 1.0f + 3 * 0x1p-9f, 0x3F81, 0x3C06 }, /* BF16 above half an ulp -> up */
    { 1.0f + 0x1p-11f, 0x3F80, 0x3C00 },    /* F16 tie -> even (1.0) */
    { 1.0f + 3 * 0x1p-11f, 0x3F80, 0x3C02 },/* F16 tie -> even (1 + 2^-9) */
    { 0.0f, 0x0000, 0x0000 },
    { -0.0f, 0x8000, 0x8000 },
};
#define N_HAND (sizeof HAND / sizeof HAND[0])

typedef struct {
    float vec[N_HAND];
    float mat[2 * 3];
    float cube[2 * 2 * 2];
    float scalar;
    trill_tensor_out t[5];
} rt_set;

static void rt_init(rt_set *s) {
    for (size_t i = 0; i < N_HAND; i++) s->vec[i] = HAND[i].v;
    for (int i = 0; i < 6; i++) s->mat[i] = 0.1f * (float)(i + 1) - 0.35f;
    for (int i = 0; i < 8; i++) s->cube[i] = (float)i * 3.14159f - 7.0f;
    s->scalar = 42.125f;
    /* Names in sorted order so trill_st_tensor(i) lines up with t[i]. */
    s->t[0] = (trill_tensor_out){ .name = "a.vec", .ndim = 1, .shape = { N_HAND }, .data = s->vec, .src_dtype = TRILL_F32 };
    s->t[1] = (trill_tensor_out){ .name = "b.mat", .ndim = 2, .shape = { 2, 3 }, .data = s->mat, .src_dtype = TRILL_F32 };
    s->t[2] = (trill_tensor_out){ .name = "c.cube", .ndim = 3, .shape = { 2, 2, 2 }, .data = s->cube, .src_dtype = TRILL_F32 };
    s->t[3] = (trill_tensor_out){ .name = "d.empty", .ndim = 2, .shape = { 0, 4 }, .data = s->vec, .src_dtype = TRILL_F32 };
    s->t[4] = (trill_tensor_out){ .name = "e.scalar", .ndim = 0, .data = &s->scalar, .src_dtype = TRILL_F32 };
}

/* The stored element i of view v equals src[i] converted to v's dtype. */
static void check_values(const trill_tensor_view *v, const float *src, size_t n) {
    assert_int_equal(v->numel, n);
    assert_int_equal(v->nbytes, n * trill_dtype_size(v->dtype));
    for (size_t i = 0; i < n; i++) {
        switch (v->dtype) {
        case TRILL_F32: {
            float got;
            memcpy(&got, (const unsigned char *)v->data + 4 * i, 4);
            assert_int_equal(bits_of_f32(got), bits_of_f32(src[i]));
            break;
        }
        case TRILL_BF16:
            assert_int_equal(u16_at(v->data, i), trill_f32_to_bf16(src[i]));
            break;
        case TRILL_F16: {
            uint16_t want;
            trill_from_f32(&want, &src[i], TRILL_F16, 1);
            assert_int_equal(u16_at(v->data, i), want);
            break;
        }
        case TRILL_F8_E4M3: case TRILL_U8: fail_msg("the writers do not write F8_E4M3 or U8");
        }
    }
}

static void test_round_trip(void **state) {
    (void)state;
    char *dir = test_tmpdir("st-rt");
    rt_set s;
    rt_init(&s);
    const trill_dtype dts[] = { TRILL_F32, TRILL_BF16, TRILL_F16 };
    for (size_t k = 0; k < 3; k++) {
        trill_dtype dt = dts[k];
        char name[64];
        snprintf(name, sizeof name, "rt-%s.safetensors", trill_dtype_name(dt));
        char *path = join(dir, name);
        assert_int_equal(trill_st_write(path, s.t, 5, dt), TRILL_OK);

        /* Layout: header length a multiple of 8, data section 8-aligned, nothing extra. */
        char *raw;
        size_t raw_len;
        assert_int_equal(trill_read_file(path, &raw, &raw_len), TRILL_OK);
        uint64_t hlen = read_u64le((const unsigned char *)raw);
        assert_int_equal(hlen % 8, 0);
        size_t data_bytes = (N_HAND + 6 + 8 + 0 + 1) * trill_dtype_size(dt);
        assert_int_equal(raw_len, 8 + hlen + data_bytes);
        json_t *hdr = json_loadb(raw + 8, hlen, 0, NULL);
        assert_non_null(hdr);
        assert_string_equal(json_string_value(json_object_get(json_object_get(hdr, "__metadata__"), "format")), "pt");
        const json_t *e = json_object_get(hdr, "e.scalar");
        assert_string_equal(json_string_value(json_object_get(e, "dtype")), trill_dtype_name(dt));
        assert_int_equal(json_array_size(json_object_get(e, "shape")), 0);
        json_decref(hdr);
        free(raw);

        trill_st_file *f = NULL;
        assert_int_equal(trill_st_open(path, &f), TRILL_OK);
        assert_int_equal(trill_st_count(f), 5);
        for (size_t i = 0; i < 5; i++) {
            const trill_tensor_view *v = trill_st_tensor(f, i);
            assert_string_equal(v->name, s.t[i].name);
            assert_string_equal(v->path, path);
            assert_int_equal(v->dtype, dt);
            assert_int_equal(v->ndim, s.t[i].ndim);
            for (int d = 0; d < v->ndim; d++) assert_int_equal(v->shape[d], s.t[i].shape[d]);
            assert_ptr_equal(trill_st_find(f, s.t[i].name), v);
            check_values(v, s.t[i].data, trill_tensor_out_numel(&s.t[i]));
        }
        assert_null(trill_st_find(f, "missing"));
        assert_null(trill_st_find(f, "__metadata__"));
        /* The first tensor starts the data section: 8-aligned in the page-aligned mapping. */
        assert_int_equal((uintptr_t)trill_st_find(f, "a.vec")->data % 8, 0);
        assert_int_equal(trill_st_find(f, "d.empty")->numel, 0);
        assert_int_equal(trill_st_find(f, "e.scalar")->numel, 1);

        /* Hand-checked roundings. */
        const trill_tensor_view *v = trill_st_find(f, "a.vec");
        for (size_t i = 0; i < N_HAND; i++) {
            if (dt == TRILL_BF16) assert_int_equal(u16_at(v->data, i), HAND[i].bf16);
            if (dt == TRILL_F16) assert_int_equal(u16_at(v->data, i), HAND[i].f16);
        }
        float back[N_HAND];
        trill_to_f32(back, v->data, dt, N_HAND);
        assert_true(back[0] == 1.0f && back[1] == -2.5f);
        if (dt == TRILL_F16) assert_true(back[2] == 65504.0f);
        if (dt == TRILL_BF16) {
            assert_true(back[2] == 65536.0f);
            assert_true(back[5] == 1.0f && back[6] == 1.0f + 0x1p-7f);
        }
        trill_st_close(f);

        /* The same bytes parsed from memory give the same views. */
        assert_int_equal(trill_read_file(path, &raw, &raw_len), TRILL_OK);
        assert_int_equal(trill_st_parse("mem", raw, raw_len, &f), TRILL_OK);
        assert_int_equal(trill_st_count(f), 5);
        assert_string_equal(trill_st_tensor(f, 2)->path, "mem");
        check_values(trill_st_tensor(f, 2), s.cube, 8);
        trill_st_close(f);
        free(raw);
        free(path);
    }
    test_rmdir(dir);
    free(dir);
}

/* A file with no tensors at all is valid (header "{}" padded to 8). */
static void test_empty_checkpoint_file(void **state) {
    (void)state;
    char *dir = test_tmpdir("st-empty");
    char *path = join(dir, "none.safetensors");
    assert_int_equal(trill_st_write(path, NULL, 0, TRILL_BF16), TRILL_OK);
    trill_st_file *f = NULL;
    assert_int_equal(trill_st_open(path, &f), TRILL_OK);
    assert_int_equal(trill_st_count(f), 0);
    assert_null(trill_st_find(f, "x"));
    trill_st_close(f);
    /* Hand-made: "{}" and a null __metadata__. */
    write_st(dir, "bare.safetensors", "{}", 0);
    write_st(dir, "nullmeta.safetensors", "{\"__metadata__\":null}   ", 0);
    free(path);
    path = join(dir, "bare.safetensors");
    assert_int_equal(trill_st_open(path, &f), TRILL_OK);
    assert_int_equal(trill_st_count(f), 0);
    trill_st_close(f);
    free(path);
    path = join(dir, "nullmeta.safetensors");
    assert_int_equal(trill_st_open(path, &f), TRILL_OK);
    trill_st_close(f);
    free(path);
    test_rmdir(dir);
    free(dir);
}

/* ---- dtype conversion on write ---------------------------------------------------------- */

static void test_source_dtype_conversion(void **state) {
    (void)state;
    char *dir = test_tmpdir("st-conv");
    float f32[N_HAND];
    for (size_t i = 0; i < N_HAND; i++) f32[i] = HAND[i].v;
    uint16_t bf16[4] = { 0x3F80, 0xC020, 0x3F81, 0x7F7F }; /* 1, -2.5, 1+2^-7, bf16 max */
    uint16_t f16[3] = { 0x3C00, 0x7BFF, 0x0001 };           /* 1, 65504, smallest subnormal */
    trill_tensor_out t[3] = {
        { .name = "bf16src", .ndim = 1, .shape = { 4 }, .data = bf16, .src_dtype = TRILL_BF16 },
        { .name = "f16src", .ndim = 1, .shape = { 3 }, .data = f16, .src_dtype = TRILL_F16 },
        { .name = "f32src", .ndim = 1, .shape = { N_HAND }, .data = f32, .src_dtype = TRILL_F32 },
    };

    /* F32 source stored as BF16: rounded to nearest even. */
    char *p1 = join(dir, "as-bf16.safetensors");
    assert_int_equal(trill_st_write(p1, t, 3, TRILL_BF16), TRILL_OK);
    trill_st_file *f = NULL;
    assert_int_equal(trill_st_open(p1, &f), TRILL_OK);
    const trill_tensor_view *v = trill_st_find(f, "f32src");
    assert_non_null(v);
    assert_int_equal(v->dtype, TRILL_BF16);
    for (size_t i = 0; i < N_HAND; i++) assert_int_equal(u16_at(v->data, i), HAND[i].bf16);
    /* BF16 source stored as BF16: bit-identical. */
    v = trill_st_find(f, "bf16src");
    for (int i = 0; i < 4; i++) assert_int_equal(u16_at(v->data, i), bf16[i]);
    trill_st_close(f);

    /* BF16 / F16 sources stored as F32: widened exactly. */
    char *p2 = join(dir, "as-f32.safetensors");
    assert_int_equal(trill_st_write(p2, t, 3, TRILL_F32), TRILL_OK);
    assert_int_equal(trill_st_open(p2, &f), TRILL_OK);
    v = trill_st_find(f, "bf16src");
    assert_int_equal(v->dtype, TRILL_F32);
    assert_int_equal(v->nbytes, 16);
    for (int i = 0; i < 4; i++) {
        uint32_t got;
        memcpy(&got, (const unsigned char *)v->data + 4 * i, 4);
        assert_int_equal(got, (uint32_t)bf16[i] << 16);
    }
    v = trill_st_find(f, "f16src");
    float w[3];
    memcpy(w, v->data, sizeof w);
    assert_true(w[0] == 1.0f && w[1] == 65504.0f && w[2] == 0x1p-24f);
    v = trill_st_find(f, "f32src");
    for (size_t i = 0; i < N_HAND; i++) {
        float got;
        memcpy(&got, (const unsigned char *)v->data + 4 * i, 4);
        assert_int_equal(bits_of_f32(got), bits_of_f32(HAND[i].v));
    }
    trill_st_close(f);

    /* F32 stored as F16, and BF16 stored as F16 (through fp32). */
    char *p3 = join(dir, "as-f16.safetensors");
    assert_int_equal(trill_st_write(p3, t, 3, TRILL_F16), TRILL_OK);
    assert_int_equal(trill_st_open(p3, &f), TRILL_OK);
    v = trill_st_find(f, "f32src");
    for (size_t i = 0; i < N_HAND; i++) assert_int_equal(u16_at(v->data, i), HAND[i].f16);
    v = trill_st_find(f, "bf16src");
    assert_int_equal(u16_at(v->data, 0), 0x3C00);
    assert_int_equal(u16_at(v->data, 1), 0xC100);
    assert_int_equal(u16_at(v->data, 2), 0x3C08);        /* 1 + 2^-7 */
    assert_int_equal(u16_at(v->data, 3), 0x7C00);        /* beyond F16 range: +inf */
    trill_st_close(f);

    free(p1);
    free(p2);
    free(p3);
    test_rmdir(dir);
    free(dir);
}

/* ---- sharded checkpoints ---------------------------------------------------------------- */

typedef struct {
    float d[5][30];
    trill_tensor_out t[5];
} shard_set;

/* Sizes in F32: 40, 40, 64, 16, 120 bytes. With max_shard_bytes 100 the greedy split is
 * {t0,t1} (80), {t2,t3} (80), {t4} (120: a tensor larger than the limit gets its own shard). */
static void shard_init(shard_set *s) {
    static const char *names[5] = { "layers.0.w", "layers.0.b", "layers.1.w", "layers.1.b", "lm_head" };
    static const int sizes[5] = { 10, 10, 16, 4, 30 };
    for (int i = 0; i < 5; i++) {
        for (int j = 0; j < 30; j++) s->d[i][j] = (float)(i * 100 + j) + 0.5f;
        s->t[i] = (trill_tensor_out){ .name = names[i], .ndim = 1, .shape = { sizes[i] }, .data = s->d[i], .src_dtype = TRILL_F32 };
    }
    s->t[2].ndim = 2; /* a 2-D one among them: [4, 4] */
    s->t[2].shape[0] = 4;
    s->t[2].shape[1] = 4;
}

static void check_checkpoint_data(const trill_checkpoint *ck, const shard_set *s) {
    assert_int_equal(trill_checkpoint_count(ck), 5);
    for (int i = 0; i < 5; i++) {
        const trill_tensor_view *v = trill_checkpoint_find(ck, s->t[i].name);
        assert_non_null(v);
        assert_string_equal(v->name, s->t[i].name);
        assert_int_equal(v->dtype, TRILL_F32);
        assert_int_equal(v->ndim, s->t[i].ndim);
        check_values(v, s->d[i], trill_tensor_out_numel(&s->t[i]));
    }
    assert_null(trill_checkpoint_find(ck, "nope"));
    for (size_t i = 1; i < trill_checkpoint_count(ck); i++)
        assert_true(strcmp(trill_checkpoint_tensor(ck, i - 1)->name, trill_checkpoint_tensor(ck, i)->name) < 0);
}

static void test_sharded_write_and_open(void **state) {
    (void)state;
    char *dir = test_tmpdir("st-shard");
    shard_set s;
    shard_init(&s);

    /* Start from a single file so we can check the sharded write removes it. */
    assert_int_equal(trill_checkpoint_write(dir, s.t, 5, TRILL_F32, 0), TRILL_OK);
    char listing[1024];
    dir_listing(dir, listing, sizeof listing);
    assert_string_equal(listing, "model.safetensors");

    assert_int_equal(trill_checkpoint_write(dir, s.t, 5, TRILL_F32, 100), TRILL_OK);
    dir_listing(dir, listing, sizeof listing);
    assert_string_equal(listing,
                        "model-00001-of-00003.safetensors|model-00002-of-00003.safetensors|"
                        "model-00003-of-00003.safetensors|model.safetensors.index.json");

    char *index_path = join(dir, "model.safetensors.index.json");
    json_error_t jerr;
    json_t *index = json_load_file(index_path, 0, &jerr);
    assert_non_null(index);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(index, "metadata"), "total_size")), 280);
    const json_t *wm = json_object_get(index, "weight_map");
    assert_int_equal(json_object_size(wm), 5);
    static const char *want_file[5] = { "model-00001-of-00003.safetensors", "model-00001-of-00003.safetensors",
                                        "model-00002-of-00003.safetensors", "model-00002-of-00003.safetensors",
                                        "model-00003-of-00003.safetensors" };
    for (int i = 0; i < 5; i++)
        assert_string_equal(json_string_value(json_object_get(wm, s.t[i].name)), want_file[i]);
    json_decref(index);

    trill_checkpoint *ck = NULL;
    assert_int_equal(trill_checkpoint_open(dir, &ck), TRILL_OK);
    assert_int_equal(trill_checkpoint_file_count(ck), 3);
    check_checkpoint_data(ck, &s);
    for (int i = 0; i < 5; i++) {
        const trill_tensor_view *v = trill_checkpoint_find(ck, s.t[i].name);
        const char *base = strrchr(v->path, '/');
        assert_non_null(base);
        assert_string_equal(base + 1, want_file[i]);
    }
    trill_checkpoint_close(ck);

    /* Each shard is itself a valid file holding exactly its tensors. */
    char *shard2 = join(dir, "model-00002-of-00003.safetensors");
    trill_st_file *f = NULL;
    assert_int_equal(trill_st_open(shard2, &f), TRILL_OK);
    assert_int_equal(trill_st_count(f), 2);
    assert_non_null(trill_st_find(f, "layers.1.w"));
    assert_non_null(trill_st_find(f, "layers.1.b"));
    trill_st_close(f);
    free(shard2);

    /* Unsharded over it: the index goes, so the single file is what is read. */
    s.d[0][0] = -123.0f; /* so we can tell which copy was read */
    assert_int_equal(trill_checkpoint_write(dir, s.t, 5, TRILL_F32, 0), TRILL_OK);
    assert_false(trill_file_exists(index_path));
    char *single = join(dir, "model.safetensors");
    assert_true(trill_file_exists(single));
    assert_int_equal(trill_checkpoint_open(dir, &ck), TRILL_OK);
    assert_int_equal(trill_checkpoint_file_count(ck), 1);
    check_checkpoint_data(ck, &s);
    assert_string_equal(trill_checkpoint_find(ck, "lm_head")->path, single);
    trill_checkpoint_close(ck);

    /* A limit the data fits under also writes a single file. */
    assert_int_equal(trill_checkpoint_write(dir, s.t, 5, TRILL_F32, 280), TRILL_OK);
    assert_false(trill_file_exists(index_path));

    /* No checkpoint at all: an i/o error naming the folder. */
    char *empty = join(dir, "empty");
    assert_int_equal(mkdir(empty, 0755), 0);
    assert_int_equal(trill_checkpoint_open(empty, &ck), TRILL_ERR_IO);
    assert_msg_has(empty);
    assert_msg_has("model.safetensors");

    free(empty);
    free(single);
    free(index_path);
    test_rmdir(dir);
    free(dir);
}

/* Two shards written by hand (A: x, y; B: z) and an index we write ourselves. */
#define SHARD_A "model-00001-of-00002.safetensors"
#define SHARD_B "model-00002-of-00002.safetensors"

static char *make_two_shards(void) {
    char *dir = test_tmpdir("st-index");
    static float x[2] = { 1, 2 }, y[3] = { 3, 4, 5 }, z[1] = { 6 };
    trill_tensor_out a[2] = {
        { .name = "x", .ndim = 1, .shape = { 2 }, .data = x, .src_dtype = TRILL_F32 },
        { .name = "y", .ndim = 1, .shape = { 3 }, .data = y, .src_dtype = TRILL_F32 },
    };
    trill_tensor_out b[1] = { { .name = "z", .ndim = 1, .shape = { 1 }, .data = z, .src_dtype = TRILL_F32 } };
    char *pa = join(dir, SHARD_A), *pb = join(dir, SHARD_B);
    assert_int_equal(trill_st_write(pa, a, 2, TRILL_F32), TRILL_OK);
    assert_int_equal(trill_st_write(pb, b, 1, TRILL_F32), TRILL_OK);
    free(pa);
    free(pb);
    return dir;
}

static void write_index(const char *dir, const char *text) {
    test_write(dir, "model.safetensors.index.json", text, strlen(text));
}

static void expect_ck_fail(const char *dir, trill_status want, const char *needle1, const char *needle2) {
    trill_checkpoint *ck = (trill_checkpoint *)0x1;
    trill_status st = trill_checkpoint_open(dir, &ck);
    if (st != want) fail_msg("status %d (%s), wanted %d; message: %s", st, trill_status_name(st), want, trill_error_message());
    assert_ptr_equal(ck, (trill_checkpoint *)0x1); /* untouched on failure */
    assert_msg_has(needle1);
    if (needle2) assert_msg_has(needle2);
}

static void test_index_good(void **state) {
    (void)state;
    char *dir = make_two_shards();
    write_index(dir, "{\"metadata\": {\"total_size\": 24}, \"weight_map\": {\"x\": \"" SHARD_A "\", \"y\": \"" SHARD_A
                     "\", \"z\": \"" SHARD_B "\"}}");
    trill_checkpoint *ck = NULL;
    assert_int_equal(trill_checkpoint_open(dir, &ck), TRILL_OK);
    assert_int_equal(trill_checkpoint_count(ck), 3);
    assert_int_equal(trill_checkpoint_file_count(ck), 2);
    float z;
    memcpy(&z, trill_checkpoint_find(ck, "z")->data, 4);
    assert_true(z == 6.0f);
    assert_string_equal(trill_checkpoint_tensor(ck, 1)->name, "y");
    trill_checkpoint_close(ck);
    test_rmdir(dir);
    free(dir);
}

static void test_index_errors(void **state) {
    (void)state;
    char *dir = make_two_shards();

    /* x is listed in B, but lives in A. */
    write_index(dir, "{\"weight_map\": {\"x\": \"" SHARD_B "\", \"y\": \"" SHARD_A "\", \"z\": \"" SHARD_B "\"}}");
    expect_ck_fail(dir, TRILL_ERR_INVALID, "\"x\"", SHARD_B);
    assert_msg_has("missing from that shard");

    /* w is listed in A, but A has no w. */
    write_index(dir, "{\"weight_map\": {\"x\": \"" SHARD_A "\", \"y\": \"" SHARD_A "\", \"z\": \"" SHARD_B
                     "\", \"w\": \"" SHARD_A "\"}}");
    expect_ck_fail(dir, TRILL_ERR_INVALID, "\"w\"", SHARD_A);
    assert_msg_has("missing from that shard");

    /* A holds y, which the index does not list. */
    write_index(dir, "{\"weight_map\": {\"x\": \"" SHARD_A "\", \"z\": \"" SHARD_B "\"}}");
    expect_ck_fail(dir, TRILL_ERR_INVALID, "\"y\"", SHARD_A);
    assert_msg_has("not listed");

    /* File names that leave the folder. */
    write_index(dir, "{\"weight_map\": {\"x\": \"sub/" SHARD_A "\"}}");
    expect_ck_fail(dir, TRILL_ERR_INVALID, "weight_map[\"x\"]", "model.safetensors.index.json");
    write_index(dir, "{\"weight_map\": {\"y\": \"..\"}}");
    expect_ck_fail(dir, TRILL_ERR_INVALID, "weight_map[\"y\"]", "model.safetensors.index.json");
    write_index(dir, "{\"weight_map\": {\"z\": \"../" SHARD_B "\"}}");
    expect_ck_fail(dir, TRILL_ERR_INVALID, "weight_map[\"z\"]", "same folder");
    write_index(dir, "{\"weight_map\": {\"z\": \"\"}}");
    expect_ck_fail(dir, TRILL_ERR_INVALID, "weight_map[\"z\"]", "same folder");
    write_index(dir, "{\"weight_map\": {\"z\": 7}}");
    expect_ck_fail(dir, TRILL_ERR_INVALID, "weight_map[\"z\"]", "same folder");

    /* A shard file that does not exist. */
    write_index(dir, "{\"weight_map\": {\"x\": \"" SHARD_A "\", \"y\": \"" SHARD_A "\", \"z\": \"gone.safetensors\"}}");
    expect_ck_fail(dir, TRILL_ERR_IO, "gone.safetensors", "cannot open");

    /* Not JSON; JSON without a weight_map object. */
    write_index(dir, "{\"weight_map\": {\"x\": ");
    expect_ck_fail(dir, TRILL_ERR_INVALID, "model.safetensors.index.json", "invalid JSON");
    write_index(dir, "{\"metadata\": {}}");
    expect_ck_fail(dir, TRILL_ERR_INVALID, "model.safetensors.index.json", "\"weight_map\"");
    write_index(dir, "[1, 2]");
    expect_ck_fail(dir, TRILL_ERR_INVALID, "model.safetensors.index.json", "\"weight_map\"");

    /* A malformed shard: its own message comes through. */
    write_st(dir, SHARD_B, "{\"z\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4);
    write_index(dir, "{\"weight_map\": {\"x\": \"" SHARD_A "\", \"y\": \"" SHARD_A "\", \"z\": \"" SHARD_B "\"}}");
    expect_ck_fail(dir, TRILL_ERR_INVALID, SHARD_B, "\"z\"");
    assert_msg_has("outside the data section");

    test_rmdir(dir);
    free(dir);
}

/* ---- malformed single files ------------------------------------------------------------- */

typedef struct {
    const char *file;      /* name in the temporary folder */
    uint64_t hlen;         /* header length field (0: strlen(header)) */
    const char *header;    /* NULL: use raw/raw_len */
    size_t data_len;       /* bytes of data after the header */
    const char *raw;       /* whole-file bytes when header is NULL */
    size_t raw_len;
    trill_status want;
    const char *needle;    /* distinctive part of the message */
    const char *needle2;   /* NULL or a second one (usually the tensor name) */
} bad_case;

#define T1(dtype, shape, offs) "{\"t\":{\"dtype\":" dtype ",\"shape\":" shape ",\"data_offsets\":" offs "}}"

static const bad_case BAD[] = {
    { "empty.st", 0, NULL, 0, "", 0, TRILL_ERR_INVALID, "file is 0 bytes", NULL },
    { "seven.st", 0, NULL, 0, "\x02\0\0\0\0\0\0", 7, TRILL_ERR_INVALID, "file is 7 bytes", NULL },
    { "truncated-header.st", 100, "{\"t\":{\"dtype\":\"F32\"", 0, NULL, 0, TRILL_ERR_INVALID, "runs past the end", "truncated" },
    { "hlen-2e63.st", 1ull << 63, "{}", 0, NULL, 0, TRILL_ERR_INVALID, "exceeds the 100000000-byte limit", "9223372036854775808" },
    { "hlen-200mb.st", 200000000, "{}", 0, NULL, 0, TRILL_ERR_INVALID, "exceeds the 100000000-byte limit", "200000000" },
    { "hlen-zero.st", 0, NULL, 0, "\0\0\0\0\0\0\0\0{}", 10, TRILL_ERR_INVALID, "starting with '{'", NULL },
    { "not-brace.st", 0, " {}     ", 0, NULL, 0, TRILL_ERR_INVALID, "starting with '{'", NULL },
    { "array.st", 0, "[{\"t\":1}]", 0, NULL, 0, TRILL_ERR_INVALID, "starting with '{'", NULL },
    { "bad-json.st", 0, "{\"t\": {\"dtype\": }}", 0, NULL, 0, TRILL_ERR_INVALID, "invalid JSON at line 1", NULL },
    { "unterminated.st", 0, "{\"t\": {", 0, NULL, 0, TRILL_ERR_INVALID, "invalid JSON", NULL },
    { "duplicate.st", 0,
      "{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
      8, NULL, 0, TRILL_ERR_INVALID, "duplicate", NULL },
    { "dtype-i64.st", 0, T1("\"I64\"", "[1]", "[0,8]"), 8, NULL, 0, TRILL_ERR_UNSUPPORTED, "dtype \"I64\" is not supported", "\"t\"" },
    { "dtype-f8-e5m2.st", 0, T1("\"F8_E5M2\"", "[1]", "[0,1]"), 1, NULL, 0, TRILL_ERR_UNSUPPORTED, "dtype \"F8_E5M2\" is not supported", "\"t\"" },
    { "span-f8.st", 0, T1("\"F8_E4M3\"", "[2,2]", "[0,8]"), 8, NULL, 0, TRILL_ERR_INVALID, "span 8 bytes but shape and dtype need 4", "\"t\"" },
    { "dtype-lower.st", 0, T1("\"f32\"", "[1]", "[0,4]"), 4, NULL, 0, TRILL_ERR_UNSUPPORTED, "dtype \"f32\"", NULL },
    { "dtype-number.st", 0, T1("5", "[1]", "[0,4]"), 4, NULL, 0, TRILL_ERR_INVALID, "\"dtype\" must be a string", "\"t\"" },
    { "dtype-missing.st", 0, "{\"t\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, NULL, 0, TRILL_ERR_INVALID, "\"dtype\" must be a string", NULL },
    { "shape-string.st", 0, T1("\"F32\"", "\"[1]\"", "[0,4]"), 4, NULL, 0, TRILL_ERR_INVALID, "\"shape\" must be a list", "\"t\"" },
    { "shape-missing.st", 0, "{\"t\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, NULL, 0, TRILL_ERR_INVALID, "\"shape\" must be a list", NULL },
    { "shape-negative.st", 0, T1("\"F32\"", "[2,-1]", "[0,0]"), 0, NULL, 0, TRILL_ERR_INVALID, "shape entry 1 must be a non-negative integer", "\"t\"" },
    { "shape-float.st", 0, T1("\"F32\"", "[1.0]", "[0,4]"), 4, NULL, 0, TRILL_ERR_INVALID, "shape entry 0 must be a non-negative integer", NULL },
    { "shape-9d.st", 0, T1("\"F32\"", "[1,1,1,1,1,1,1,1,1]", "[0,4]"), 4, NULL, 0, TRILL_ERR_INVALID, "at most 8 sizes", "\"t\"" },
    { "shape-overflow.st", 0, T1("\"F32\"", "[4611686018427387904,4611686018427387904]", "[0,4]"), 4, NULL, 0, TRILL_ERR_INVALID, "shape overflows", NULL },
    { "bytes-overflow.st", 0, T1("\"F32\"", "[4611686018427387904]", "[0,0]"), 0, NULL, 0, TRILL_ERR_INVALID, "shape overflows", NULL },
    { "offs-short.st", 0, T1("\"F32\"", "[1]", "[0]"), 4, NULL, 0, TRILL_ERR_INVALID, "\"data_offsets\" must be [begin, end]", "\"t\"" },
    { "offs-long.st", 0, T1("\"F32\"", "[1]", "[0,4,8]"), 4, NULL, 0, TRILL_ERR_INVALID, "\"data_offsets\" must be [begin, end]", NULL },
    { "offs-string.st", 0, T1("\"F32\"", "[1]", "[\"0\",4]"), 4, NULL, 0, TRILL_ERR_INVALID, "\"data_offsets\" must be [begin, end]", NULL },
    { "offs-missing.st", 0, "{\"t\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, NULL, 0, TRILL_ERR_INVALID, "\"data_offsets\" must be [begin, end]", NULL },
    { "offs-negative.st", 0, T1("\"F32\"", "[1]", "[-4,0]"), 4, NULL, 0, TRILL_ERR_INVALID, "data_offsets [-4, 0] outside", "\"t\"" },
    { "offs-reversed.st", 0, T1("\"F32\"", "[1]", "[8,4]"), 8, NULL, 0, TRILL_ERR_INVALID, "data_offsets [8, 4] outside", NULL },
    { "offs-past-end.st", 0, T1("\"F32\"", "[4]", "[0,16]"), 8, NULL, 0, TRILL_ERR_INVALID, "data_offsets [0, 16] outside the data section of 8 bytes", "\"t\"" },
    { "offs-huge.st", 0, T1("\"F32\"", "[1]", "[9223372036854775800,9223372036854775804]"), 4, NULL, 0, TRILL_ERR_INVALID, "outside the data section", NULL },
    { "span.st", 0, T1("\"F32\"", "[2]", "[0,4]"), 4, NULL, 0, TRILL_ERR_INVALID, "span 4 bytes but shape and dtype need 8", "\"t\"" },
    { "span-bf16.st", 0, T1("\"BF16\"", "[2,2]", "[0,16]"), 16, NULL, 0, TRILL_ERR_INVALID, "span 16 bytes but shape and dtype need 8", NULL },
    { "overlap.st", 0,
      "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
      12, NULL, 0, TRILL_ERR_INVALID, "overlap the previous tensor \"a\"", "tensor \"b\"" },
    { "same-offsets.st", 0,
      "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
      4, NULL, 0, TRILL_ERR_INVALID, "overlap", NULL },
    { "gap.st", 0,
      "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
      12, NULL, 0, TRILL_ERR_INVALID, "4 unused bytes before", "tensor \"b\"" },
    { "gap-at-start.st", 0, T1("\"F32\"", "[1]", "[4,8]"), 8, NULL, 0, TRILL_ERR_INVALID, "4 unused bytes before", "\"t\"" },
    { "trailing.st", 0, T1("\"F32\"", "[1]", "[0,4]"), 7, NULL, 0, TRILL_ERR_INVALID, "3 bytes after the last tensor", NULL },
    { "trailing-no-tensors.st", 0, "{}", 5, NULL, 0, TRILL_ERR_INVALID, "5 bytes after the last tensor", NULL },
    { "metadata-string.st", 0, "{\"__metadata__\":\"pt\"}", 0, NULL, 0, TRILL_ERR_INVALID, "\"__metadata__\" must be an object", NULL },
    { "metadata-list.st", 0, "{\"__metadata__\":[]}", 0, NULL, 0, TRILL_ERR_INVALID, "\"__metadata__\" must be an object", NULL },
    { "entry-number.st", 0, "{\"t\":5}", 0, NULL, 0, TRILL_ERR_INVALID, "expected an object, got integer", "\"t\"" },
    { "entry-list.st", 0, "{\"t\":[\"F32\",[1],[0,4]]}", 4, NULL, 0, TRILL_ERR_INVALID, "expected an object, got array", NULL },
};

static void test_malformed_files(void **state) {
    (void)state;
    char *dir = test_tmpdir("st-bad");
    for (size_t i = 0; i < sizeof BAD / sizeof BAD[0]; i++) {
        const bad_case *c = &BAD[i];
        size_t len;
        unsigned char *b;
        if (c->header) {
            b = st_bytes(c->hlen ? c->hlen : strlen(c->header), c->header, NULL, c->data_len, &len);
        } else {
            len = c->raw_len;
            b = malloc(len ? len : 1);
            memcpy(b, c->raw, len);
        }
        test_write(dir, c->file, b, len);
        char *path = join(dir, c->file);
        trill_st_file *f = (trill_st_file *)0x1;
        trill_status st = trill_st_open(path, &f);
        if (st != c->want)
            fail_msg("%s: status %d (%s), wanted %d; message: %s", c->file, st, trill_status_name(st), c->want,
                     trill_error_message());
        assert_ptr_equal(f, (trill_st_file *)0x1);
        if (!strstr(trill_error_message(), path)) fail_msg("%s: message lacks the path: %s", c->file, trill_error_message());
        if (!strstr(trill_error_message(), c->needle))
            fail_msg("%s: message lacks \"%s\": %s", c->file, c->needle, trill_error_message());
        if (c->needle2 && !strstr(trill_error_message(), c->needle2))
            fail_msg("%s: message lacks \"%s\": %s", c->file, c->needle2, trill_error_message());

        /* The in-memory parser says the same (it is what the fuzzer drives). */
        f = (trill_st_file *)0x1;
        assert_int_equal(trill_st_parse(c->file, b, len, &f), c->want);
        assert_ptr_equal(f, (trill_st_file *)0x1);
        if (!strstr(trill_error_message(), c->needle))
            fail_msg("%s (parse): message lacks \"%s\": %s", c->file, c->needle, trill_error_message());
        free(path);
        free(b);
    }
    /* Not a file at all. */
    char *missing = join(dir, "missing.safetensors");
    trill_st_file *f = NULL;
    assert_int_equal(trill_st_open(missing, &f), TRILL_ERR_IO);
    assert_msg_has(missing);
    assert_msg_has("cannot open");
    free(missing);
    test_rmdir(dir);
    free(dir);
}

/* A valid file cut short inside its data section. */
static void test_truncated_data(void **state) {
    (void)state;
    char *dir = test_tmpdir("st-trunc");
    rt_set s;
    rt_init(&s);
    char *path = join(dir, "cut.safetensors");
    assert_int_equal(trill_st_write(path, s.t, 5, TRILL_BF16), TRILL_OK);
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    /* e.scalar is last: 2 bytes. Cutting 3 bytes also clips c.cube. */
    assert_int_equal(truncate(path, sb.st_size - 3), 0);
    trill_st_file *f = (trill_st_file *)0x1;
    assert_int_equal(trill_st_open(path, &f), TRILL_ERR_INVALID);
    assert_ptr_equal(f, (trill_st_file *)0x1);
    assert_msg_has(path);
    assert_msg_has("outside the data section");
    /* Whichever tensor is reported, it is one of the two that no longer fit. */
    assert_true(strstr(trill_error_message(), "\"e.scalar\"") || strstr(trill_error_message(), "\"c.cube\""));

    /* Cut inside the header itself. */
    assert_int_equal(truncate(path, 20), 0);
    assert_int_equal(trill_st_open(path, &f), TRILL_ERR_INVALID);
    assert_msg_has("runs past the end of the 20-byte file");
    free(path);
    test_rmdir(dir);
    free(dir);
}

/* A zero-size tensor shares its offset with the next one; header order must not matter
 * (the reference implementation sorts by (begin, end)). */
static void test_zero_size_tensor_offsets(void **state) {
    (void)state;
    char *dir = test_tmpdir("st-zero");
    write_st(dir, "z-first.safetensors",
             "{\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]},"
             "\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
             "\"z\":{\"dtype\":\"F32\",\"shape\":[3,0],\"data_offsets\":[8,8]}}",
             8);
    char *path = join(dir, "z-first.safetensors");
    trill_st_file *f = NULL;
    assert_int_equal(trill_st_open(path, &f), TRILL_OK);
    assert_int_equal(trill_st_count(f), 3);
    assert_int_equal(trill_st_find(f, "z")->nbytes, 0);
    assert_int_equal(trill_st_find(f, "z")->shape[0], 3);
    assert_int_equal(trill_st_find(f, "w")->nbytes, 8);
    trill_st_close(f);
    free(path);

    write_st(dir, "z-last.safetensors",
             "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
             "\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}",
             8);
    path = join(dir, "z-last.safetensors");
    assert_int_equal(trill_st_open(path, &f), TRILL_OK);
    assert_int_equal(trill_st_count(f), 2);
    trill_st_close(f);
    free(path);
    test_rmdir(dir);
    free(dir);
}

/* ---- atomic writes ---------------------------------------------------------------------- */

static void test_atomic_write(void **state) {
    (void)state;
    char *dir = test_tmpdir("st-atomic");
    rt_set s;
    rt_init(&s);
    char *path = join(dir, "out.safetensors");
    assert_int_equal(trill_st_write(path, s.t, 5, TRILL_F32), TRILL_OK);
    /* Overwrite in place with different content. */
    s.scalar = -1.0f;
    assert_int_equal(trill_st_write(path, s.t, 5, TRILL_F32), TRILL_OK);
    char listing[1024];
    dir_listing(dir, listing, sizeof listing);
    assert_string_equal(listing, "out.safetensors");
    assert_null(strstr(listing, ".tmp."));
    trill_st_file *f = NULL;
    assert_int_equal(trill_st_open(path, &f), TRILL_OK);
    float v;
    memcpy(&v, trill_st_find(f, "e.scalar")->data, 4);
    assert_true(v == -1.0f);
    trill_st_close(f);

    /* Into a folder that does not exist. */
    char *bad = join(dir, "no-such-dir/out.safetensors");
    assert_int_equal(trill_st_write(bad, s.t, 5, TRILL_F32), TRILL_ERR_IO);
    assert_msg_has(bad);
    free(bad);

    /* Over a directory: the rename fails, the temporary file is removed. */
    char *blocked = join(dir, "blocked.safetensors");
    assert_int_equal(mkdir(blocked, 0755), 0);
    assert_int_equal(trill_st_write(blocked, s.t, 5, TRILL_F32), TRILL_ERR_IO);
    assert_msg_has(blocked);
    dir_listing(dir, listing, sizeof listing);
    assert_string_equal(listing, "blocked.safetensors|out.safetensors");

    /* trill_checkpoint_write into a missing folder fails the same way. */
    char *nodir = join(dir, "nowhere");
    assert_int_equal(trill_checkpoint_write(nodir, s.t, 5, TRILL_F32, 0), TRILL_ERR_IO);
    assert_msg_has(nodir);
    assert_int_equal(trill_checkpoint_write(nodir, s.t, 5, TRILL_F32, 16), TRILL_ERR_IO);
    assert_msg_has(nodir);
    dir_listing(dir, listing, sizeof listing);
    assert_string_equal(listing, "blocked.safetensors|out.safetensors");

    free(nodir);
    free(blocked);
    free(path);
    test_rmdir(dir);
    free(dir);
}

/* The writer refuses what no reader would accept, before writing anything. */
static void test_write_rejects_bad_tensors(void **state) {
    (void)state;
    char *dir = test_tmpdir("st-wbad");
    char *path = join(dir, "x.safetensors");
    float data[4] = { 1, 2, 3, 4 };
    trill_tensor_out t[2] = {
        { .name = "a", .ndim = 1, .shape = { 4 }, .data = data, .src_dtype = TRILL_F32 },
        { .name = "a", .ndim = 1, .shape = { 4 }, .data = data, .src_dtype = TRILL_F32 },
    };
    assert_int_equal(trill_st_write(path, t, 2, TRILL_F32), TRILL_ERR_INVALID);
    assert_msg_has("tensor \"a\" given twice");
    t[1].name = "__metadata__";
    assert_int_equal(trill_st_write(path, t, 2, TRILL_F32), TRILL_ERR_INVALID);
    assert_msg_has("\"__metadata__\" is not allowed");
    t[1].name = "bad\xff";
    assert_int_equal(trill_st_write(path, t, 2, TRILL_F32), TRILL_ERR_INVALID);
    assert_msg_has("not valid UTF-8");
    t[1].name = "b";
    t[1].ndim = 9;
    assert_int_equal(trill_st_write(path, t, 2, TRILL_F32), TRILL_ERR_INVALID);
    assert_msg_has("9 dimensions");
    t[1].ndim = 1;
    t[1].shape[0] = -4;
    assert_int_equal(trill_st_write(path, t, 2, TRILL_F32), TRILL_ERR_INVALID);
    assert_msg_has("negative size");
    char listing[1024];
    dir_listing(dir, listing, sizeof listing);
    assert_string_equal(listing, ""); /* nothing written, no temporary left */
    free(path);
    test_rmdir(dir);
    free(dir);
}

/* Rewriting a folder with another layout or shard count leaves only the new checkpoint. */
static void test_stale_shards_removed(void **state) {
    (void)state;
    char *dir = test_tmpdir("st-stale");
    rt_set s;
    rt_init(&s);
    char listing[1024];
    assert_int_equal(trill_checkpoint_write(dir, s.t, 5, TRILL_F32, 16), TRILL_OK); /* one tensor a shard */
    dir_listing(dir, listing, sizeof listing);
    assert_non_null(strstr(listing, "-of-00004.safetensors"));
    assert_int_equal(trill_checkpoint_write(dir, s.t, 5, TRILL_F32, N_HAND * sizeof(float) + 8), TRILL_OK);
    dir_listing(dir, listing, sizeof listing);
    assert_null(strstr(listing, "-of-00004"));
    assert_string_equal(listing, "model-00001-of-00003.safetensors|model-00002-of-00003.safetensors|"
                                 "model-00003-of-00003.safetensors|model.safetensors.index.json");
    assert_int_equal(trill_checkpoint_write(dir, s.t, 5, TRILL_F32, 0), TRILL_OK);
    dir_listing(dir, listing, sizeof listing);
    assert_string_equal(listing, "model.safetensors");
    test_rmdir(dir);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_write_rejects_bad_tensors),
        cmocka_unit_test(test_stale_shards_removed),
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_empty_checkpoint_file),
        cmocka_unit_test(test_source_dtype_conversion),
        cmocka_unit_test(test_sharded_write_and_open),
        cmocka_unit_test(test_index_good),
        cmocka_unit_test(test_index_errors),
        cmocka_unit_test(test_malformed_files),
        cmocka_unit_test(test_truncated_data),
        cmocka_unit_test(test_zero_size_tensor_offsets),
        cmocka_unit_test(test_atomic_write),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
