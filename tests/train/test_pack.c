/* test_pack.c — cmocka tests of train/train_pack.c, sbp-train's document packing.
 *
 *   test_pack CASES.txt [WORKDIR]
 *
 * The expected rows come from an independent implementation of the documented rule,
 * tests/train/pack_ref.py, which writes CASES.txt (ctest runs it first, as a fixture): for each
 * case a stream, T, EOS, the number of rows and how many rows each train_pack_rows call packs
 * (so the cursor is carried between calls as a checkpointed run carries it), then every row's
 * ids, labels and document ids and the cursor after the last row. The other tests check what
 * the reference cannot: the invariants the step relies on over many random streams, that any
 * split of the calls gives the same rows, the shard wrapper's cursor, the --doc-ids reader's
 * checks, and the micro-batch row order.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "train_pack.h"

static const char *cases_path;
static const char *work_dir = ".";

static uint32_t array_token(const void *ctx, int64_t i) { return ((const uint32_t *)ctx)[i]; }

/* Reads n ints after the word `key` from f. */
static void read_ints(FILE *f, const char *key, int64_t *out, int64_t n)
{
    char word[32];
    assert_int_equal(fscanf(f, "%31s", word), 1);
    assert_string_equal(word, key);
    for (int64_t i = 0; i < n; i++) {
        long long v;
        assert_int_equal(fscanf(f, "%lld", &v), 1);
        out[i] = v;
    }
}

static void test_matches_reference(void **state)
{
    (void)state;
    FILE *f = fopen(cases_path, "r");
    assert_non_null(f);
    char word[32], name[64];
    int n_cases = 0;
    while (fscanf(f, "%31s", word) == 1) {
        assert_string_equal(word, "case");
        long long T, eos, rows, chunk, ntok;
        assert_int_equal(fscanf(f, "%63s %lld %lld %lld %lld", name, &T, &eos, &rows, &chunk), 5);
        assert_int_equal(fscanf(f, "%31s %lld", word, &ntok), 2);
        assert_string_equal(word, "stream");
        uint32_t *stream = malloc((size_t)ntok * sizeof *stream);
        int64_t *tmp = malloc((size_t)(ntok > T ? ntok : T) * sizeof *tmp);
        int32_t *ids = malloc((size_t)(rows * T) * sizeof *ids);
        int32_t *labels = malloc((size_t)(rows * T) * sizeof *labels);
        int32_t *docs = malloc((size_t)(rows * T) * sizeof *docs);
        assert_true(stream && tmp && ids && labels && docs);
        for (long long i = 0; i < ntok; i++) {
            long long v;
            assert_int_equal(fscanf(f, "%lld", &v), 1);
            stream[i] = (uint32_t)v;
        }
        const train_pack_src src = {array_token, stream, ntok};
        train_pack_cursor cur = {0, 0};
        char err[256];
        for (long long r = 0; r < rows; r += chunk) {
            long long n = rows - r < chunk ? rows - r : chunk;
            assert_int_equal(train_pack_rows(&src, (uint32_t)eos, T, n, &cur, ids + r * T,
                                             labels + r * T, docs + r * T, err, sizeof err), 0);
        }
        for (long long r = 0; r < rows; r++) {
            const int32_t *have[3] = {ids + r * T, labels + r * T, docs + r * T};
            const char *keys[3] = {"ids", "labels", "docs"};
            for (int k = 0; k < 3; k++) {
                read_ints(f, keys[k], tmp, T);
                for (long long t = 0; t < T; t++)
                    if (have[k][t] != tmp[t])
                        fail_msg("case %s: row %lld: %s[%lld] is %d, the reference has %lld",
                                 name, r, keys[k], t, have[k][t], (long long)tmp[t]);
            }
        }
        read_ints(f, "cursor", tmp, 2);
        if (cur.pos != tmp[0] || cur.epoch != tmp[1])
            fail_msg("case %s: cursor (%lld, %lld), the reference has (%lld, %lld)", name,
                     (long long)cur.pos, (long long)cur.epoch, (long long)tmp[0],
                     (long long)tmp[1]);
        free(stream);
        free(tmp);
        free(ids);
        free(labels);
        free(docs);
        n_cases++;
    }
    fclose(f);
    assert_true(n_cases >= 10);
}

/* A worked example, by hand, so the rule can be read off a test too: T = 4, EOS = 0.
 * Stream: [5 0] [1 2 3 4 5 0] [0] [7 8 0] [9]; the 6-token document is cut into 4 + 2. */
static void test_worked_example(void **state)
{
    (void)state;
    const uint32_t stream[] = {5, 0, 1, 2, 3, 4, 5, 0, 0, 7, 8, 0, 9};
    const train_pack_src src = {array_token, stream, 13};
    train_pack_cursor cur = {0, 0};
    int32_t ids[16], labels[16], docs[16];
    assert_int_equal(train_pack_rows(&src, 0, 4, 4, &cur, ids, labels, docs, NULL, 0), 0);
    const int32_t want_ids[16] = {5, 0, 0, 0,    /* [5 0], padding: the long one starts a row */
                                  1, 2, 3, 4,    /* a piece of T */
                                  5, 0, 0, 0,    /* its rest [5 0], the document [0], padding */
                                  7, 8, 0, 9};   /* [7 8 0], then the stream's end ends [9] */
    const int32_t want_labels[16] = {0, -100, -100, -100, 2, 3, 4, 5, 0, -100, -100, -100,
                                     8, 0, -100, -100};
    const int32_t want_docs[16] = {0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 1, 2, 0, 0, 0, 1};
    assert_memory_equal(ids, want_ids, sizeof ids);
    assert_memory_equal(labels, want_labels, sizeof labels);
    assert_memory_equal(docs, want_docs, sizeof docs);
    assert_int_equal(cur.pos, 0); /* the stream was used up exactly: the next pass */
    assert_int_equal(cur.epoch, 1);
}

/* Over random streams: any split of the rows into calls gives the same rows and cursor; document
 * ids start at 0 and rise by at most 1 along each row; no label crosses a document boundary; a
 * label inside a document is the next token; EOS is never scored. */
static void test_invariants_and_splits(void **state)
{
    (void)state;
    srand(13);
    for (int iter = 0; iter < 300; iter++) {
        int64_t ntok = 1 + rand() % 80, T = 1 + rand() % 12, rows = 1 + rand() % 30;
        uint32_t eos = 0;
        uint32_t *stream = malloc((size_t)ntok * sizeof *stream);
        for (int64_t i = 0; i < ntok; i++)
            stream[i] = rand() % 4 == 0 ? eos : 1 + (uint32_t)(rand() % 20);
        int32_t *a[3], *b[3];
        for (int k = 0; k < 3; k++) {
            a[k] = malloc((size_t)(rows * T) * sizeof(int32_t));
            b[k] = malloc((size_t)(rows * T) * sizeof(int32_t));
        }
        const train_pack_src src = {array_token, stream, ntok};
        train_pack_cursor ca = {0, 0}, cb = {0, 0};
        assert_int_equal(train_pack_rows(&src, eos, T, rows, &ca, a[0], a[1], a[2], NULL, 0), 0);
        for (int64_t r = 0; r < rows;) {
            int64_t n = 1 + rand() % 3;
            if (n > rows - r)
                n = rows - r;
            assert_int_equal(train_pack_rows(&src, eos, T, n, &cb, b[0] + r * T, b[1] + r * T,
                                             b[2] + r * T, NULL, 0), 0);
            r += n;
        }
        for (int k = 0; k < 3; k++)
            assert_memory_equal(a[k], b[k], (size_t)(rows * T) * sizeof(int32_t));
        assert_int_equal(ca.pos, cb.pos);
        assert_int_equal(ca.epoch, cb.epoch);
        for (int64_t r = 0; r < rows; r++) {
            const int32_t *ids = a[0] + r * T, *lab = a[1] + r * T, *doc = a[2] + r * T;
            assert_int_equal(doc[0], 0);
            for (int64_t t = 0; t < T; t++) {
                if (t > 0)
                    assert_true(doc[t] == doc[t - 1] || doc[t] == doc[t - 1] + 1);
                if (t + 1 < T && doc[t + 1] != doc[t])
                    assert_int_equal(lab[t], -100); /* never across a document boundary */
                else if (t + 1 < T && lab[t] != -100)
                    assert_int_equal(lab[t], ids[t + 1]); /* the next token of its document */
                if (ids[t] == (int32_t)eos)
                    assert_int_equal(lab[t], -100); /* EOS ends its document */
            }
        }
        free(stream);
        for (int k = 0; k < 3; k++) {
            free(a[k]);
            free(b[k]);
        }
    }
}

static void test_shard_cursor(void **state)
{
    (void)state;
    /* a version-1 shard's raw tokens are little-endian uint16 */
    static unsigned char raw[2 * 7];
    const uint16_t toks[7] = {1, 2, 0, 3, 4, 5, 6};
    for (int i = 0; i < 7; i++) {
        raw[2 * i] = (unsigned char)(toks[i] & 0xff);
        raw[2 * i + 1] = (unsigned char)(toks[i] >> 8);
    }
    sbpio_shard s = {.path = "mem.bin", .version = 1, .token_size = 2, .ntok = 7, .raw = raw};
    int32_t ids[6], labels[6], docs[6];
    char err[256];
    assert_int_equal(train_pack_shard(&s, 0, 3, 2, ids, labels, docs, err, sizeof err), 0);
    const int32_t want_ids[6] = {1, 2, 0, 3, 4, 5};
    const int32_t want_labels[6] = {2, 0, -100, 4, 5, 6};
    assert_memory_equal(ids, want_ids, sizeof ids);
    assert_memory_equal(labels, want_labels, sizeof labels);
    assert_int_equal(s.pos, 6);
    assert_int_equal(s.epoch, 0);
    assert_int_equal(train_pack_shard(&s, 0, 3, 1, ids, labels, docs, err, sizeof err), 0);
    /* [6] ends the stream (its label -100); the next pass's [1 2 0] does not fit: padding */
    const int32_t want2[3] = {6, 0, 0}, want2_labels[3] = {-100, -100, -100}, want2_docs[3] = {
                                            0, 1, 1};
    assert_memory_equal(ids, want2, sizeof want2);
    assert_memory_equal(labels, want2_labels, sizeof want2_labels);
    assert_memory_equal(docs, want2_docs, sizeof want2_docs);
    assert_int_equal(s.pos, 0);
    assert_int_equal(s.epoch, 1);
    assert_true(train_pack_shard_has(&s, 0));
    assert_false(train_pack_shard_has(&s, 9));
    s.pos = 7; /* outside: an error naming the shard, not a read past its end */
    assert_int_equal(train_pack_shard(&s, 0, 3, 1, ids, labels, docs, err, sizeof err), -1);
    assert_non_null(strstr(err, "mem.bin"));
}

static void write_npy(const char *path, sbpio_dtype dt, int64_t r, int64_t c, const void *data)
{
    char err[256];
    const int64_t shape[2] = {r, c};
    assert_int_equal(sbpio_npy_write(path, dt, 2, shape, data, err, sizeof err), SBPIO_OK);
}

static void test_load_doc_ids(void **state)
{
    (void)state;
    char path[1024], err[512];
    int32_t out[6];
    snprintf(path, sizeof path, "%s/pack_docs.npy", work_dir);
    const int64_t good[6] = {0, 0, 1, 0, 2, 2};
    write_npy(path, SBPIO_DT_I64, 2, 3, good);
    assert_int_equal(train_pack_load_doc_ids(path, 2, 3, out, err, sizeof err), 0);
    const int32_t want[6] = {0, 0, 1, 0, 2, 2};
    assert_memory_equal(out, want, sizeof want);

    const int32_t down[6] = {0, 1, 1, 0, 2, 1};
    write_npy(path, SBPIO_DT_I32, 2, 3, down);
    assert_int_equal(train_pack_load_doc_ids(path, 2, 3, out, err, sizeof err), -1);
    assert_non_null(strstr(err, "doc_ids[1,2] = 1 is below doc_ids[1,1] = 2"));

    assert_int_equal(train_pack_load_doc_ids(path, 3, 3, out, err, sizeof err), -1);
    assert_non_null(strstr(err, "document ids have shape [2,3], but the input ids and labels are "
                                "[3,3]"));

    const float f[6] = {0};
    write_npy(path, SBPIO_DT_F32, 2, 3, f);
    assert_int_equal(train_pack_load_doc_ids(path, 2, 3, out, err, sizeof err), -1);
    assert_non_null(strstr(err, "must be int32 or int64"));

    const int32_t neg[6] = {-1, 0, 0, 0, 0, 0};
    write_npy(path, SBPIO_DT_I32, 2, 3, neg);
    assert_int_equal(train_pack_load_doc_ids(path, 2, 3, out, err, sizeof err), -1);
    assert_non_null(strstr(err, "doc_ids[0,0] = -1 is not a document id"));
    remove(path);
}

static void test_micro_rows(void **state)
{
    (void)state;
    /* N = 4 rows of T = 1, B = 2: plain micro-batch 1 is rows 2, 3; DPO's is rows 1 and 3 */
    const int32_t docs[4] = {10, 11, 12, 13};
    int32_t mb[2];
    train_pack_micro(docs, mb, 4, 2, 1, 1, false);
    assert_int_equal(mb[0], 12);
    assert_int_equal(mb[1], 13);
    train_pack_micro(docs, mb, 4, 2, 1, 1, true);
    assert_int_equal(mb[0], 11);
    assert_int_equal(mb[1], 13);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: test_pack CASES.txt [WORKDIR] (CASES.txt: pack_ref.py cases)\n");
        return 2;
    }
    cases_path = argv[1];
    if (argc > 2)
        work_dir = argv[2];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matches_reference),
        cmocka_unit_test(test_worked_example),
        cmocka_unit_test(test_invariants_and_splits),
        cmocka_unit_test(test_shard_cursor),
        cmocka_unit_test(test_load_doc_ids),
        cmocka_unit_test(test_micro_rows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
