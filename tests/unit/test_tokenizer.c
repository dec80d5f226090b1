/* Tokenizer pipeline pieces against hand-worked expectations; the whole pipeline is checked
 * against the Hugging Face oracle on real vocabularies by tests/tokenizer/parity.sh. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/utf8.h"
#include "trill/rng.h"
#include "text/tokenizer_json.h"
#include "text/tiktoken_pattern.h"
#include "testutil.h"
#include "trill/tokenizer.h"

/* The GPT-2 byte-level symbol of byte b, as UTF-8. */
static void byte_symbol(int b, char out[4]) {
    int shifted = 0;
    for (int x = 0; x < b; x++)
        if (!((x >= '!' && x <= '~') || (x >= 0xa1 && x <= 0xac) || (x >= 0xae && x <= 0xff))) shifted++;
    bool printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
    int n = trill_utf8_encode(printable ? (uint32_t)b : 256u + (uint32_t)shifted, out);
    out[n] = '\0';
}

/* A byte-level BPE tokenizer: the 256 byte symbols (ids 0..255), then the merges in rank
 * order (ids 256..), with the given pre_tokenizer steps before ByteLevel. */
static json_t *bpe_json(const char *const *merges, size_t n_merges, json_t *pre_steps, json_t *normalizer) {
    json_t *vocab = json_object();
    for (int b = 0; b < 256; b++) {
        char s[5];
        byte_symbol(b, s);
        json_object_set_new(vocab, s, json_integer(b));
    }
    json_t *merge_list = json_array();
    for (size_t i = 0; i < n_merges; i++) {
        json_array_append_new(merge_list, json_string(merges[i]));
        char joined[64];
        const char *sp = strchr(merges[i], ' ');
        snprintf(joined, sizeof joined, "%.*s%s", (int)(sp - merges[i]), merges[i], sp + 1);
        json_object_set_new(vocab, joined, json_integer(256 + (json_int_t)i));
    }
    json_array_append_new(pre_steps, json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 0, "use_regex", 0));
    return json_pack("{s:[{s:i, s:s, s:b, s:b, s:b, s:b, s:b}], s:o, s:{s:s, s:o}, s:{s:s, s:o, s:o}, s:{s:s}}",
                     "added_tokens", "id", 999, "content", "<|end|>", "special", 1, "lstrip", 0, "rstrip", 0, "normalized", 0, "single_word", 0,
                     "normalizer", normalizer ? normalizer : json_null(), "pre_tokenizer", "type", "Sequence", "pretokenizers", pre_steps,
                     "model", "type", "BPE", "vocab", vocab, "merges", merge_list, "decoder", "type", "ByteLevel");
}

/* Through the public text form, trill_tokenizer_parse (the same as trill_tokenizer_from_json). */
static trill_tokenizer *load(json_t *j) {
    trill_tokenizer *t = NULL;
    char *text = json_dumps(j, 0);
    assert_non_null(text);
    trill_status st = trill_tokenizer_parse(text, strlen(text), "test.json", &t);
    if (st) fprintf(stderr, "load: %s\n", trill_error_message());
    assert_int_equal(st, TRILL_OK);
    free(text);
    json_decref(j);
    return t;
}

static void expect_ids(const trill_tokenizer *t, const char *text, size_t len, const int *want, size_t n_want) {
    int *ids;
    size_t n;
    assert_int_equal(trill_tokenizer_encode(t, text, len, false, &ids, &n), TRILL_OK);
    if (n != n_want || (n > 0 && memcmp(ids, want, n * sizeof *ids) != 0)) {
        fprintf(stderr, "encode(\"%.*s\"): got", (int)len, text);
        for (size_t i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
        fprintf(stderr, "\n");
        fail();
    }
    free(ids);
}
#define EXPECT(t, text, ...) do { const int w_[] = { __VA_ARGS__ }; expect_ids(t, text, strlen(text), w_, sizeof w_ / sizeof w_[0]); } while (0)

static void test_bpe_merge_order(void **state) {
    (void)state;
    /* ranks: "a b"=256, "b c"=257, "ab c"=258: "abc" takes a+b first (lower rank), then ab+c */
    const char *merges[] = { "a b", "b c", "ab c", "c c" };
    trill_tokenizer *t = load(bpe_json(merges, 4, json_array(), NULL));
    EXPECT(t, "abc", 258);
    EXPECT(t, "bc", 257);
    EXPECT(t, "ccc", 259, 'c'); /* leftmost pair first on equal rank */
    EXPECT(t, "ab<|end|>c", 256, 999, 'c'); /* added tokens split the text before BPE */
    EXPECT(t, " x", ' ', 'x'); /* each byte's symbol has the byte's id here */
    char *text;
    size_t len;
    const int ids[] = { 258, 999, 'c', 0xe4, 0xbd, 0xa0 };
    assert_int_equal(trill_tokenizer_decode(t, ids, 6, false, &text, &len), TRILL_OK);
    assert_string_equal(text, "abc<|end|>c\xe4\xbd\xa0");
    free(text);
    assert_int_equal(trill_tokenizer_decode(t, ids, 6, true, &text, &len), TRILL_OK); /* skip specials */
    assert_string_equal(text, "abcc\xe4\xbd\xa0");
    free(text);
    const int split_char[] = { 0xe4, 0xbd }; /* a truncated character decodes to U+FFFD, as HF */
    assert_int_equal(trill_tokenizer_decode(t, split_char, 2, false, &text, &len), TRILL_OK);
    assert_string_equal(text, "\xef\xbf\xbd");
    free(text);
    const int bad[] = { 5000 };
    assert_int_equal(trill_tokenizer_decode(t, bad, 1, false, &text, &len), TRILL_ERR_INVALID);
    /* words longer than the short-word path go through the heap: same order of merges */
    char longword[302];
    memset(longword, 'c', 301);
    longword[301] = '\0';
    int *long_ids;
    size_t n;
    assert_int_equal(trill_tokenizer_encode(t, longword, 301, false, &long_ids, &n), TRILL_OK);
    assert_int_equal(n, 151); /* "cc" x 150, then "c": leftmost pairs merge first */
    for (size_t i = 0; i < 150; i++) assert_int_equal(long_ids[i], 259);
    assert_int_equal(long_ids[150], 'c');
    free(long_ids);
    for (int i = 0; i < 300; i++) longword[i] = "abc"[i % 3];
    assert_int_equal(trill_tokenizer_encode(t, longword, 300, false, &long_ids, &n), TRILL_OK);
    assert_int_equal(n, 100);
    for (size_t i = 0; i < 100; i++) assert_int_equal(long_ids[i], 258);
    free(long_ids);
    trill_tokenizer_free(t);
}

static void test_invalid_utf8_becomes_replacement(void **state) {
    (void)state;
    trill_tokenizer *t = load(bpe_json(NULL, 0, json_array(), NULL));
    /* 0xff, and a truncated 3-byte sequence: each maximal subpart becomes U+FFFD (EF BF BD) */
    const char text[] = { 'a', (char)0xff, (char)0xe2, (char)0x82, 'b' };
    const int want[] = { 'a', 0xef, 0xbf, 0xbd, 0xef, 0xbf, 0xbd, 'b' };
    expect_ids(t, text, sizeof text, want, 8);
    trill_tokenizer_free(t);
}

static json_t *split_step(const char *regex, const char *behavior, bool invert) {
    return json_pack("{s:s, s:{s:s}, s:s, s:b}", "type", "Split", "pattern", "Regex", regex, "behavior", behavior, "invert", invert);
}

/* With merge "x x" absent, each byte is one id, so the pieces show in where merges can't cross.
 * "-" merges only inside a piece: use merge "a -" and "- b" to reveal piece boundaries. */
static void test_split_behaviors(void **state) {
    (void)state;
    const char *merges[] = { "a -", "- b" }; /* 256 = "a-", 257 = "-b" */
    struct { const char *behavior; bool invert; int want[4]; size_t n; } cases[] = {
        { "Isolated", false, { 'a', '-', 'b' }, 3 },
        { "Removed", false, { 'a', 'b' }, 2 },
        { "MergedWithPrevious", false, { 256, 'b' }, 2 },
        { "MergedWithNext", false, { 'a', 257 }, 2 },
        { "Contiguous", false, { 'a', '-', 'b' }, 3 },
        { "Removed", true, { '-' }, 1 }, /* invert: the gaps are the delimiters */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        trill_tokenizer *t = load(bpe_json(merges, 2, json_pack("[o]", split_step("-", cases[i].behavior, cases[i].invert)), NULL));
        expect_ids(t, "a-b", 3, cases[i].want, cases[i].n);
        trill_tokenizer_free(t);
    }
    /* Contiguous joins runs of delimiters: "a--b" -> a, "--", b with merge "- -" */
    const char *dash[] = { "- -" };
    trill_tokenizer *t = load(bpe_json(dash, 1, json_pack("[o]", split_step("-", "Contiguous", false)), NULL));
    EXPECT(t, "a--b", 'a', 256, 'b');
    trill_tokenizer_free(t);
}

static void test_digits_and_nfc(void **state) {
    (void)state;
    const char *merges[] = { "1 2", "12 3" };
    trill_tokenizer *t = load(bpe_json(merges, 2, json_pack("[{s:s, s:b}]", "type", "Digits", "individual_digits", 1), NULL));
    EXPECT(t, "123", '1', '2', '3');
    trill_tokenizer_free(t);
    t = load(bpe_json(merges, 2, json_pack("[{s:s, s:b}]", "type", "Digits", "individual_digits", 0), NULL));
    EXPECT(t, "a123", 'a', 257);
    trill_tokenizer_free(t);
    /* NFC composes e + combining acute (CC 81) into é (C3 A9) before BPE */
    t = load(bpe_json(NULL, 0, json_array(), json_pack("{s:s, s:[{s:s}]}", "type", "Sequence", "normalizers", "type", "NFC")));
    EXPECT(t, "e\xcc\x81", 0xc3, 0xa9);
    trill_tokenizer_free(t);
}

/* Encodes text with a WordLevel tokenizer whose vocabulary is the expected pieces (ids 1.., "[UNK]"
 * 0): the ids come out 1, 2, ... only if the pre-tokenizer split the text into exactly those. */
static void expect_pieces(json_t *pre, const char *text, const char *const *pieces, size_t n) {
    json_t *vocab = json_pack("{s:i}", "[UNK]", 0);
    int want[16];
    assert_true(n <= 16);
    for (size_t i = 0; i < n; i++) {
        const json_t *id = json_object_get(vocab, pieces[i]);
        if (!id) json_object_set_new(vocab, pieces[i], json_integer((json_int_t)json_object_size(vocab)));
        want[i] = (int)json_integer_value(json_object_get(vocab, pieces[i]));
    }
    trill_tokenizer *t = load(json_pack("{s:o, s:{s:s, s:o, s:s}}", "pre_tokenizer", pre, "model", "type", "WordLevel", "vocab", vocab, "unk_token", "[UNK]"));
    expect_ids(t, text, strlen(text), want, n);
    trill_tokenizer_free(t);
}
#define PIECES(pre, text, ...) do { const char *const p_[] = { __VA_ARGS__ }; expect_pieces(pre, text, p_, sizeof p_ / sizeof p_[0]); } while (0)

/* As the Rust crate splits them (tokenizers 0.23, checked with its Node binding). */
static void test_whitespace_punctuation_bert(void **state) {
    (void)state;
    /* White_Space as char::is_whitespace: NBSP, NEL and the ideographic space; U+200B is not */
    PIECES(json_pack("{s:s}", "type", "WhitespaceSplit"), "Hey  friend!\xc2\xa0How\xc2\x85" "are\xe3\x80\x80you?\xe2\x80\x8bx",
           "Hey", "friend!", "How", "are", "you?\xe2\x80\x8bx");
    /* \w+|[^\w\s]+ with the regex crate's Unicode \w: accents, ZWJ, circled letters (Alphabetic) */
    PIECES(json_pack("{s:s}", "type", "Whitespace"), "Hey man!! h\xc3\xa9llo_w\xc3\xb6rld x\xe2\x80\x8dy \xe2\x92\xb6\xe2\x92\xb7 3.14",
           "Hey", "man", "!!", "h\xc3\xa9llo_w\xc3\xb6rld", "x\xe2\x80\x8dy", "\xe2\x92\xb6\xe2\x92\xb7", "3", ".", "14");
    /* Punctuation: Isolated by default, each character its own delimiter */
    PIECES(json_pack("{s:s}", "type", "Punctuation"), "Hey friend!     How are you?!?",
           "Hey friend", "!", "     How are you", "?", "!", "?");
    /* $ is ASCII punctuation to Rust; U+166D (Po in Unicode 8) is in, U+2E43 (Po since 9.0) is not */
    PIECES(json_pack("{s:s}", "type", "Punctuation"), "x\xe1\x99\xady\xe2\xb9\x83z\xc2\xa7", "x", "\xe1\x99\xad", "y\xe2\xb9\x83z", "\xc2\xa7");
    struct { const char *behavior; const char *pieces[6]; size_t n; } cases[] = {
        { "Isolated", { "a", "!", "?", "b", "$", "c" }, 6 },
        { "Removed", { "a", "b", "c" }, 3 },
        { "MergedWithPrevious", { "a!", "?", "b$", "c" }, 4 },
        { "MergedWithNext", { "a", "!", "?b", "$c" }, 4 },
        { "Contiguous", { "a", "!?", "b", "$", "c" }, 5 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        expect_pieces(json_pack("{s:s, s:s}", "type", "Punctuation", "behavior", cases[i].behavior), "a!?b$c", cases[i].pieces, cases[i].n);
    /* BertPreTokenizer: whitespace removed, then punctuation isolated */
    PIECES(json_pack("{s:s}", "type", "BertPreTokenizer"), "Hey friend!     How are you?!?",
           "Hey", "friend", "!", "How", "are", "you", "?", "!", "?");
    PIECES(json_pack("{s:s}", "type", "BertPreTokenizer"), "\xc2\xbfQu\xc3\xa9? \xc2\xabsi\xc2\xbb",
           "\xc2\xbf", "Qu\xc3\xa9", "?", "\xc2\xab", "si", "\xc2\xbb");
    /* in a Sequence, each splits the pieces of the one before */
    PIECES(json_pack("{s:s, s:[{s:s}, {s:s, s:b}]}", "type", "Sequence", "pretokenizers", "type", "Whitespace", "type", "Digits", "individual_digits", 0),
           "abc123 4!!", "abc", "123", "4", "!!");
    /* and before byte-level BPE: "a -" is not merged across Bert's split */
    const char *merges[] = { "a -" };
    trill_tokenizer *t = load(bpe_json(merges, 1, json_pack("[{s:s}]", "type", "BertPreTokenizer"), NULL));
    EXPECT(t, "a- b", 'a', '-', 'b');
    trill_tokenizer_free(t);
    t = load(bpe_json(merges, 1, json_pack("[{s:s, s:s}]", "type", "Punctuation", "behavior", "MergedWithPrevious"), NULL));
    EXPECT(t, "a- b", 256, ' ', 'b');
    trill_tokenizer_free(t);
}

static void test_template_and_wordlevel(void **state) {
    (void)state;
    json_t *j = bpe_json(NULL, 0, json_array(), NULL);
    json_object_set_new(j, "post_processor",
                        json_pack("{s:s, s:[{s:{s:s}}, {s:{s:s}}, {s:{s:s}}], s:{s:{s:[i]}, s:{s:[i]}}}", "type", "TemplateProcessing",
                                  "single", "SpecialToken", "id", "<s>", "Sequence", "id", "A", "SpecialToken", "id", "</s>",
                                  "special_tokens", "<s>", "ids", 999, "</s>", "ids", 7));
    trill_tokenizer *t = load(j);
    int *ids;
    size_t n;
    assert_int_equal(trill_tokenizer_encode(t, "hi", 2, true, &ids, &n), TRILL_OK);
    assert_int_equal(n, 4);
    assert_int_equal(ids[0], 999);
    assert_int_equal(ids[3], 7);
    free(ids);
    assert_int_equal(trill_tokenizer_encode(t, "hi", 2, false, &ids, &n), TRILL_OK);
    assert_int_equal(n, 2);
    free(ids);
    trill_tokenizer_free(t);

    /* the character-level tokenizer of `trill init` */
    t = load(trill_tokenizer_charlevel_json());
    EXPECT(t, "Hi!\n<|endoftext|>\x01", 43, 76, 4, 2, 0, 1);
    assert_int_equal(trill_tokenizer_token_id(t, "<unk>"), 1);
    char *text;
    size_t len;
    const int back[] = { 43, 76, 2, 0 };
    assert_int_equal(trill_tokenizer_decode(t, back, 4, false, &text, &len), TRILL_OK);
    assert_string_equal(text, "Hi\n<|endoftext|>");
    free(text);
    trill_tokenizer_free(t);
}

static void expect_lenient(const trill_tokenizer *t, const int *ids, int n, const char *want) {
    char *text = NULL;
    size_t len = 0;
    assert_int_equal(trill_tokenizer_decode_lenient(t, ids, n, &text, &len), TRILL_OK);
    assert_string_equal(text, want);
    assert_int_equal(len, strlen(want));
    free(text);
}

static char *strict(const trill_tokenizer *t, const int *ids, int n) {
    char *text;
    size_t len;
    assert_int_equal(trill_tokenizer_decode(t, ids, (size_t)n, false, &text, &len), TRILL_OK);
    return text;
}

/* decode_lenient: ids the tokenizer has no string for (a hole in the vocabulary, negative, at
 * or past its size) become "<id>"; the runs of known ids between them decode as the strict
 * decoder decodes them, together, so a character split over several byte tokens survives and
 * one cut by an unknown id is repaired to U+FFFD on each side; special tokens are kept. */
static void test_decode_lenient(void **state) {
    (void)state;
    const char *merges[] = { "a b", "b c", "ab c", "c c" }; /* ids 256..259; 260..998 are holes; 999 "<|end|>" */
    trill_tokenizer *t = load(bpe_json(merges, 4, json_array(), NULL));
    assert_int_equal(trill_tokenizer_size(t), 1000);
    const int known[] = { 258, 999, 'c', 0xe4, 0xbd, 0xa0 };
    expect_lenient(t, known, 6, "abc<|end|>c\xe4\xbd\xa0"); /* all known: the strict decoding */
    expect_lenient(t, known, 0, "");
    const int mixed[] = { 'a', 500, 0xe4, 0xbd, 0xa0, 5000, -3, 999, 'b', 1000 };
    expect_lenient(t, mixed, 10, "a<500>\xe4\xbd\xa0<5000><-3><|end|>b<1000>");
    const int cut[] = { 0xe4, 0xbd, 700, 0xa0 }; /* a character cut by an unknown id */
    expect_lenient(t, cut, 4, "\xef\xbf\xbd<700>\xef\xbf\xbd");
    const int only[] = { 260, 998 };
    expect_lenient(t, only, 2, "<260><998>");

    /* random runs of known ids (bytes of multi-byte characters among them) around one unknown:
     * strict(before) "<id>" strict(after) */
    static const int pool[] = { 'a', 'b', 'c', ' ', 256, 257, 258, 259, 999, 0xe4, 0xbd, 0xa0, 0xc3, 0xa9, 0xf0, 0x9f, 0x98, 0x80 };
    const int n_pool = sizeof pool / sizeof pool[0];
    for (int trial = 0; trial < 300; trial++) {
        int ids[24];
        const int n = 2 + (int)(trill_rng_bits(7, (uint64_t)trial * 64) % 20), at = (int)(trill_rng_bits(8, trial) % (uint64_t)n);
        for (int i = 0; i < n; i++) ids[i] = pool[trill_rng_bits(9, (uint64_t)trial * 64 + i) % (uint64_t)n_pool];
        const int bad = trial % 3 == 0 ? 1000 + trial : trial % 3 == 1 ? 260 + trial : -1 - trial;
        ids[at] = bad;
        char *before = strict(t, ids, at), *after = strict(t, ids + at + 1, n - at - 1), want[512];
        snprintf(want, sizeof want, "%s<%d>%s", before, bad, after);
        expect_lenient(t, ids, n, want);
        free(before);
        free(after);
    }
    trill_tokenizer_free(t);

    /* the character-level tokenizer (98 ids) under a model vocabulary of 128 */
    t = load(trill_tokenizer_charlevel_json());
    const int gen[] = { 43, 76, 120, 2, 0, 127 };
    expect_lenient(t, gen, 6, "Hi<120>\n<|endoftext|><127>");
    trill_tokenizer_free(t);
}

/* SentencePiece-style BPE (Llama-2, Mixtral): over characters, "▁" for spaces, <0xNN> byte
 * fallback; vocabulary ids: <unk> 0, ▁ 1, a 2, b 3, c 4, ▁a 5, ab 6, ▁ab 7, <0xC3> 8, <0xA9> 9,
 * <s> 10 (added, special), abc 11 (no merge makes it); merges ▁+a, a+b, ▁a+b in rank order. */
#define SP "\xe2\x96\x81" /* ▁ */

static json_t *sp_json(json_t *normalizer, json_t *pre_tokenizer, json_t *decoder, bool ignore_merges) {
    return json_pack("{s:[{s:i, s:s, s:b, s:b, s:b, s:b, s:b}], s:o, s:o, s:{s:s, s:s, s:b, s:b, s:b, s:{s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, "
                     "s:i, s:i, s:i}, s:[s, s, s]}, s:o}",
                     "added_tokens", "id", 10, "content", "<s>", "special", 1, "lstrip", 0, "rstrip", 0, "normalized", 0, "single_word", 0,
                     "normalizer", normalizer ? normalizer : json_null(), "pre_tokenizer", pre_tokenizer ? pre_tokenizer : json_null(),
                     "model", "type", "BPE", "unk_token", "<unk>", "byte_fallback", 1, "fuse_unk", 1, "ignore_merges", ignore_merges,
                     "vocab", "<unk>", 0, SP, 1, "a", 2, "b", 3, "c", 4, SP "a", 5, "ab", 6, SP "ab", 7, "<0xC3>", 8,
                     "<0xA9>", 9, "abc", 11, "merges", SP " a", "a b", SP "a b", "decoder", decoder);
}

static void expect_text(const trill_tokenizer *t, const int *ids, size_t n, const char *want) {
    char *text;
    size_t len;
    assert_int_equal(trill_tokenizer_decode(t, ids, n, false, &text, &len), TRILL_OK);
    if (len != strlen(want) || memcmp(text, want, len) != 0) fail_msg("decode: got \"%s\", want \"%s\"", text, want);
    free(text);
}
#define DECODES(t, want, ...) do { const int i_[] = { __VA_ARGS__ }; expect_text(t, i_, sizeof i_ / sizeof i_[0], want); } while (0)

static void test_sentencepiece_bpe(void **state) {
    (void)state;
    /* Llama-2's pipeline: Prepend + Replace normalizers; Replace, ByteFallback, Fuse, Strip decoders */
    trill_tokenizer *t = load(sp_json(json_pack("{s:s, s:[{s:s, s:s}, {s:s, s:{s:s}, s:s}]}", "type", "Sequence", "normalizers", "type", "Prepend",
                                                "prepend", SP, "type", "Replace", "pattern", "String", " ", "content", SP),
                                      NULL,
                                      json_pack("{s:s, s:[{s:s, s:{s:s}, s:s}, {s:s}, {s:s}, {s:s, s:s, s:i, s:i}]}", "type", "Sequence", "decoders",
                                                "type", "Replace", "pattern", "String", SP, "content", " ", "type", "ByteFallback", "type",
                                                "Fuse", "type", "Strip", "content", " ", "start", 1, "stop", 0),
                                      false));
    EXPECT(t, "ab", 7);                          /* ▁ab: ▁+a (rank 0), then ▁a+b (rank 2) */
    EXPECT(t, "a b", 5, 1, 3);                   /* ▁a ▁ b */
    EXPECT(t, "\xc3\xa9", 1, 8, 9);              /* é is not in the vocabulary: its bytes */
    EXPECT(t, "xy", 1, 0);                       /* two unknowns fused into one <unk> */
    EXPECT(t, "x\xe2\x82\xac", 1, 0);           /* € has no byte tokens: <unk>, fused with x's */
    EXPECT(t, "<s>ab", 10, 7);                   /* each piece after an added token gets its own ▁ */
    expect_ids(t, "", 0, NULL, 0);               /* nothing: Prepend leaves empty text alone */
    DECODES(t, "ab", 7);
    DECODES(t, "a b", 5, 1, 3);
    DECODES(t, "\xc3\xa9", 1, 8, 9);
    DECODES(t, "\xef\xbf\xbd", 8);                /* a lone byte token: U+FFFD */
    DECODES(t, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd", 8, 8, 9); /* an invalid run: one U+FFFD per byte */
    DECODES(t, "<s> ab", 10, 7);
    trill_tokenizer_free(t);

    /* Metaspace pre-tokenizer (split on ▁, prepended by scheme) and decoder */
    const char *schemes[] = { "always", "first", "never" };
    const int after_special[] = { 5, 2, 2 }; /* "<s>a": only "always" prepends after <s>, "first" only at the input's start */
    for (int k = 0; k < 3; k++) {
        t = load(sp_json(NULL, json_pack("{s:s, s:s, s:s, s:b}", "type", "Metaspace", "replacement", SP, "prepend_scheme", schemes[k],
                                         "split", 1),
                         json_pack("{s:s, s:s, s:s}", "type", "Metaspace", "replacement", SP, "prepend_scheme", schemes[k]), false));
        if (k < 2) EXPECT(t, "a b", 5, 1, 3); /* ▁a | ▁b: split before each ▁ */
        else EXPECT(t, "a b", 2, 1, 3);
        EXPECT(t, "<s>a", 10, after_special[k]);
        DECODES(t, k < 2 ? "a b" : " a b", 5, 1, 3); /* the first token loses its ▁ unless the scheme is never */
        trill_tokenizer_free(t);
    }

    /* ignore_merges: a piece that is a token is taken whole, whatever the merges make */
    json_t *never = json_pack("{s:s, s:s, s:s, s:b}", "type", "Metaspace", "replacement", SP, "prepend_scheme", "never", "split", 0);
    t = load(sp_json(NULL, json_incref(never), json_pack("{s:s}", "type", "Fuse"), true));
    EXPECT(t, "abc", 11);
    trill_tokenizer_free(t);
    t = load(sp_json(NULL, never, json_pack("{s:s}", "type", "Fuse"), false));
    EXPECT(t, "abc", 6, 4);
    trill_tokenizer_free(t);
}

/* tiktoken: the split pattern read from a Python tokenizer, class intersections translated for
 * PCRE2, a ranks file (every byte, then merged tokens), and refusals naming the file. */
static void expect_translation_as(const char *in, trill_regex_dialect d, const char *want) {
    char *out = NULL;
    assert_int_equal(trill_regex_translate(in, d, &out), TRILL_OK);
    if (strcmp(out, want) != 0) fail_msg("translate(%s): got %s, want %s", in, out, want);
    free(out);
}
static void expect_translation(const char *in, const char *want) { expect_translation_as(in, TRILL_REGEX_RUST, want); }

static void test_tiktoken(void **state) {
    (void)state;
    char *pat = NULL;
    assert_int_equal(trill_tiktoken_pattern_from_python("x = 1\n  pat_str = r\"\\p{L}+| ?\\d\"  # one\n", "t.py", &pat), TRILL_OK);
    assert_string_equal(pat, "\\p{L}+| ?\\d");
    free(pat);
    assert_int_equal(trill_tiktoken_pattern_from_python("PAT_STR = \"|\".join(\n  [\n    r\"\"\"a\"\"\",  # first\n    'b\\\\c',\n  ]\n)\n", "t.py", &pat),
                     TRILL_OK);
    assert_string_equal(pat, "a|b\\c");
    free(pat);
    assert_int_equal(trill_tiktoken_pattern_from_python("mypat_str = 'x'\n", "t.py", &pat), TRILL_ERR_INVALID);
    assert_non_null(strstr(trill_error_message(), "t.py"));
    assert_int_equal(trill_tiktoken_pattern_from_python("pat_str = compute()\n", "t.py", &pat), TRILL_ERR_UNSUPPORTED);
    expect_translation("[a-z&&[^aeiou]]+", "(?:(?![aeiou])[a-z])+");
    expect_translation("[\\p{L}&&[\\p{Lu}]&&[^\\p{Han}]]", "(?:(?=[\\p{Lu}])(?![\\p{sc=Han}])[\\p{L}])");
    expect_translation("\\[a&&b\\]|[x]|[]a]", "\\[a&&b\\]|[x]|[]a]"); /* escapes and plain classes are copied */
    /* \s, \S, \w, \W as each engine means them, inside and outside classes and && operands */
    expect_translation_as("\\s+(?!\\S)|[^\\s\\p{L}]", TRILL_REGEX_ONIG, "\\p{White_Space}+(?!\\P{White_Space})|[^\\p{White_Space}\\p{L}]");
    expect_translation_as("\\w+\\W[\\w-]", TRILL_REGEX_ONIG, "[" TRILL_ONIG_WORD "]+[^" TRILL_ONIG_WORD "][" TRILL_ONIG_WORD "-]");
    expect_translation("\\w|[\\w&&[^\\s]]", "[" TRILL_RUST_WORD "]|(?:(?![\\p{White_Space}])[" TRILL_RUST_WORD "])");
    expect_translation("\\\\s\\d\\Q\\s[\\E\\s", "\\\\s\\d\\Q\\s[\\E\\p{White_Space}"); /* \\s is a backslash and s; \Q..\E as it is */
    /* a bare script name is the Script property; categories, properties and qualified names stay */
    expect_translation_as("\\p{Han}[^\\P{Latin}\\p{L}]\\p{sc=Han}\\p{White_Space}\\p{Lu}\\pL\\p{", TRILL_REGEX_ONIG,
                          "\\p{sc=Han}[^\\P{sc=Latin}\\p{L}]\\p{sc=Han}\\p{White_Space}\\p{Lu}\\pL\\p{");
    char *out = NULL;
    assert_int_equal(trill_regex_translate("[^a&&[b]]", TRILL_REGEX_RUST, &out), TRILL_ERR_UNSUPPORTED);
    assert_int_equal(trill_regex_translate("[a&&b]", TRILL_REGEX_RUST, &out), TRILL_ERR_UNSUPPORTED);
    assert_int_equal(trill_regex_translate("[a", TRILL_REGEX_RUST, &out), TRILL_ERR_INVALID);
    assert_int_equal(trill_regex_translate("[\\W]", TRILL_REGEX_ONIG, &out), TRILL_ERR_UNSUPPORTED);

    /* a vocabulary: the 256 bytes (rank = byte), then "ab" 256, "abc" 257, "ba" 258 */
    char *dir = test_tmpdir("tiktoken");
    char ranks[8192];
    size_t o = 0;
    for (int b = 0; b < 256; b++) {
        static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        o += (size_t)snprintf(ranks + o, sizeof ranks - o, "%c%c== %d\n", B64[b >> 2], B64[(b & 3) << 4], b);
    }
    o += (size_t)snprintf(ranks + o, sizeof ranks - o, "YWI= 256\nYWJj 257\nYmE= 258\n");
    test_write(dir, "test.tiktoken", ranks, o);
    const char py[] = "pat_str = r\"\"\"[a-z]+| ?[0-9]|\\s+\"\"\"\n";
    test_write(dir, "tokenization_test.py", py, sizeof py - 1);
    const char cfg[] = "{\"added_tokens_decoder\": {\"300\": {\"content\": \"<|end|>\", \"special\": true}}}";
    test_write(dir, "tokenizer_config.json", cfg, sizeof cfg - 1);
    trill_tokenizer *t = NULL;
    assert_int_equal(trill_tokenizer_load(dir, &t), TRILL_OK);
    EXPECT(t, "abc", 257);                    /* a whole piece that is a token */
    EXPECT(t, "abab", 256, 256);              /* a+b (256) twice, then ab+ab is no token */
    EXPECT(t, "bab", 'b', 256);               /* a+b (256) ranks before b+a (258): b, ab */
    EXPECT(t, "ba", 258);
    EXPECT(t, "x<|end|> 7", 'x', 300, ' ', '7');
    DECODES(t, "abc<|end|>", 257, 300);
    trill_tokenizer_free(t);
    test_write(dir, "test.tiktoken", "YWI= 256\n", 9); /* bytes missing */
    assert_int_equal(trill_tokenizer_load(dir, &t), TRILL_ERR_INVALID);
    assert_non_null(strstr(trill_error_message(), "byte 0x00 is not a token"));
    test_write(dir, "test.tiktoken", "Y!I= 256\n", 9);
    assert_int_equal(trill_tokenizer_load(dir, &t), TRILL_ERR_INVALID);
    assert_non_null(strstr(trill_error_message(), "test.tiktoken: line 1"));
    /* a rank given to two tokens, a token on two ranks, and a special token on a vocabulary rank:
     * which token an id decodes to would depend on the order, so each is refused by name */
    memcpy(ranks + o, "YmM= 257\n", 9); /* "bc" on "abc"'s rank */
    test_write(dir, "test.tiktoken", ranks, o + 9);
    assert_int_equal(trill_tokenizer_load(dir, &t), TRILL_ERR_INVALID);
    assert_non_null(strstr(trill_error_message(), "test.tiktoken: line 260: rank 257 is given twice: to \"abc\" before, to \"bc\" here"));
    memcpy(ranks + o, "YWJj 259\n", 9); /* "abc" again */
    test_write(dir, "test.tiktoken", ranks, o + 9);
    assert_int_equal(trill_tokenizer_load(dir, &t), TRILL_ERR_INVALID);
    assert_non_null(strstr(trill_error_message(), "test.tiktoken: line 260: the token \"abc\" is listed twice: rank 257 before, rank 259 here"));
    test_write(dir, "test.tiktoken", ranks, o);
    const char on_vocab[] = "{\"added_tokens_decoder\": {\"97\": {\"content\": \"<|end|>\", \"special\": true}}}";
    test_write(dir, "tokenizer_config.json", on_vocab, sizeof on_vocab - 1);
    assert_int_equal(trill_tokenizer_load(dir, &t), TRILL_ERR_INVALID);
    assert_non_null(strstr(trill_error_message(),
                           "tokenizer_config.json: added_tokens_decoder \"97\": the special token \"<|end|>\" is on rank 97, which "));
    assert_non_null(strstr(trill_error_message(), "test.tiktoken gives to \"a\""));
    test_rmdir(dir);
    free(dir);
}

static void test_refusals(void **state) {
    (void)state;
    { /* text that is not JSON: the name given and the line */
        trill_tokenizer *bad = NULL;
        const char text[] = "{\n  \"model\": [1, 2,\n";
        assert_int_equal(trill_tokenizer_parse(text, sizeof text - 1, "broken.json", &bad), TRILL_ERR_INVALID);
        assert_non_null(strstr(trill_error_message(), "broken.json"));
        assert_null(bad);
    }
    struct { const char *field, *value, *message; } cases[] = {
        { "normalizer", "{\"type\": \"Lowercase\"}", "normalizer \"Lowercase\" is not supported" },
        { "pre_tokenizer", "{\"type\": \"CharDelimiterSplit\", \"delimiter\": \"_\"}", "pre_tokenizer \"CharDelimiterSplit\" is not supported" },
        { "pre_tokenizer", "{\"type\": \"Metaspace\", \"replacement\": \"ab\"}", "Metaspace: \"replacement\" must be one character" },
        { "pre_tokenizer", "{\"type\": \"Metaspace\", \"replacement\": \"_\", \"prepend_scheme\": \"sometimes\"}", "prepend_scheme must be" },
        { "normalizer", "{\"type\": \"Replace\", \"pattern\": {\"String\": \"\"}, \"content\": \"x\"}", "an empty pattern" },
        { "decoder", "{\"type\": \"Strip\", \"content\": \" \", \"start\": -1, \"stop\": 0}", "decoder Strip" },
        { "decoder", "{\"type\": \"WordPiece\"}", "decoder \"WordPiece\" is not supported" },
        { "post_processor", "{\"type\": \"BertProcessing\"}", "post_processor \"BertProcessing\" is not supported" },
        { "model", "{\"type\": \"Unigram\", \"vocab\": []}", "model \"Unigram\" is not supported" },
        { "pre_tokenizer", "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"(\"}, \"behavior\": \"Isolated\"}", "pre-tokenizer regex \"(\"" },
        { "pre_tokenizer", "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"x\"}, \"behavior\": \"Sideways\"}", "behavior Sideways is not supported" },
        { "pre_tokenizer", "{\"type\": \"Punctuation\", \"behavior\": \"Sideways\"}", "Punctuation: behavior Sideways is not supported" },
        { "pre_tokenizer", "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Whitespace\"}, {\"type\": \"UnicodeScripts\"}]}",
          "pre_tokenizer \"UnicodeScripts\" is not supported" },
        { "added_tokens", "[{\"id\": 1, \"content\": \"x\", \"single_word\": true}]", "single_word true is not supported" },
        { "post_processor", "{\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<s>\"}}], "
                            "\"special_tokens\": {\"<s>\": {\"ids\": [700]}}}", "id 700 is not a token of the vocabulary" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_t *j = bpe_json(NULL, 0, json_array(), NULL);
        json_object_set_new(j, cases[i].field, json_loads(cases[i].value, 0, NULL));
        trill_tokenizer *t = NULL;
        trill_status st = trill_tokenizer_from_json(j, "test.json", &t);
        assert_int_not_equal(st, TRILL_OK);
        if (!strstr(trill_error_message(), cases[i].message) || !strstr(trill_error_message(), "test.json")) {
            fprintf(stderr, "case %zu: message \"%s\" lacks \"%s\"\n", i, trill_error_message(), cases[i].message);
            fail();
        }
        assert_null(t);
        json_decref(j);
    }
    /* BPE whose merges name a token missing from the vocabulary */
    const char *merges[] = { "a b" };
    json_t *j = bpe_json(merges, 1, json_array(), NULL);
    json_array_append_new(json_object_get(json_object_get(j, "model"), "merges"), json_string("q zz"));
    trill_tokenizer *t = NULL;
    assert_int_equal(trill_tokenizer_from_json(j, "test.json", &t), TRILL_ERR_INVALID);
    assert_non_null(strstr(trill_error_message(), "model.merges[1]"));
    json_decref(j);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bpe_merge_order),        cmocka_unit_test(test_invalid_utf8_becomes_replacement),
        cmocka_unit_test(test_split_behaviors),        cmocka_unit_test(test_digits_and_nfc),
        cmocka_unit_test(test_template_and_wordlevel), cmocka_unit_test(test_sentencepiece_bpe), cmocka_unit_test(test_tiktoken), cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_decode_lenient),         cmocka_unit_test(test_whitespace_punctuation_bert),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
