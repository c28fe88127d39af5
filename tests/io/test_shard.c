/* test_shard.c — llm.c token shards: both formats (magic 20240520 v1 uint16, magic 20240801 v7
 * uint32), batches as llm.c's DataLoader makes them (inputs and next-token labels, wrap-around
 * with an epoch count, seek), the vocabulary check, and bad files (magic, version, size,
 * truncation, a shard too short for a batch), all created in the scratch directory.
 */
#include "io_test.h"

static char err[512];

/* Writes a shard: header (magic, version, ntok_header) + ntok tokens of tsize bytes. */
static void write_shard(const char *path, int32_t magic, int32_t version, uint32_t ntok_header,
                        const uint32_t *tok, size_t ntok, size_t tsize)
{
    size_t n = 1024 + ntok * tsize;
    unsigned char *b = calloc(1, n);
    int32_t h[3] = {magic, version, (int32_t)ntok_header};
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < 4; k++)
            b[4 * i + k] = (unsigned char)((uint32_t)h[i] >> (8 * k));
    for (size_t i = 0; i < ntok; i++)
        for (size_t k = 0; k < tsize; k++)
            b[1024 + i * tsize + k] = (unsigned char)(tok[i] >> (8 * k));
    io_write_file(path, b, n);
    free(b);
}

static void test_v1_batches(void **state)
{
    (void)state;
    enum { N = 20 };
    uint32_t tok[N];
    for (int i = 0; i < N; i++)
        tok[i] = (uint32_t)(i * 3000 + 1); /* up to 57001: uses the high byte of uint16 */
    const char *p = io_path("v1.bin");
    write_shard(p, 20240520, 1, N, tok, N, 2);
    sbpio_shard s;
    assert_int_equal(sbpio_shard_open(p, &s, err, sizeof err), SBPIO_OK);
    assert_int_equal(s.version, 1);
    assert_int_equal(s.token_size, 2);
    assert_int_equal(s.ntok, N);
    for (int i = 0; i < N; i++)
        assert_int_equal(sbpio_shard_token(&s, i), tok[i]);

    /* B=2, T=3: each batch takes 7 tokens and advances by 6 */
    int32_t in[6], lab[6];
    for (int batch = 0; batch < 3; batch++) {
        assert_int_equal(sbpio_shard_next_batch(&s, 2, 3, in, lab, err, sizeof err), SBPIO_OK);
        for (int b = 0; b < 2; b++)
            for (int t = 0; t < 3; t++) {
                int pos = batch * 6 + b * 3 + t;
                assert_int_equal(in[b * 3 + t], tok[pos]);
                assert_int_equal(lab[b * 3 + t], tok[pos + 1]);
            }
    }
    assert_int_equal(s.pos, 18);
    assert_int_equal(s.epoch, 0);
    /* 18 + 7 > 20: wraps to the start */
    assert_int_equal(sbpio_shard_next_batch(&s, 2, 3, in, lab, err, sizeof err), SBPIO_OK);
    assert_int_equal(s.epoch, 1);
    assert_int_equal(in[0], tok[0]);
    assert_int_equal(lab[5], tok[6]);
    assert_int_equal(s.pos, 6);
    /* the last possible window: B*T+1 == ntok */
    assert_int_equal(sbpio_shard_seek(&s, 0, err, sizeof err), SBPIO_OK);
    int32_t in19[19], lab19[19];
    assert_int_equal(sbpio_shard_next_batch(&s, 1, 19, in19, lab19, err, sizeof err), SBPIO_OK);
    assert_int_equal(lab19[18], tok[19]);
    /* errors */
    assert_int_equal(sbpio_shard_next_batch(&s, 4, 5, in19, lab19, err, sizeof err), SBPIO_ERR);
    IO_ASSERT_MSG(err, "v1.bin", "20 tokens", "21");
    assert_int_equal(sbpio_shard_next_batch(&s, 0, 5, in, lab, err, sizeof err), SBPIO_ERR);
    assert_int_equal(sbpio_shard_seek(&s, 20, err, sizeof err), SBPIO_ERR);
    assert_int_equal(sbpio_shard_seek(&s, -1, err, sizeof err), SBPIO_ERR);

    assert_int_equal(sbpio_shard_check_vocab(&s, 57002, err, sizeof err), SBPIO_OK);
    assert_int_equal(sbpio_shard_check_vocab(&s, 50257, err, sizeof err), SBPIO_ERR);
    IO_ASSERT_MSG(err, "v1.bin", "token 51001", "position 17", "50257");
    assert_int_equal(sbpio_shard_check_vocab(&s, 0, err, sizeof err), SBPIO_ERR);
    sbpio_shard_close(&s);
    assert_null(s.raw);
    sbpio_shard_close(&s); /* twice is harmless */
}

static void test_v7_uint32(void **state)
{
    (void)state;
    enum { N = 9 };
    uint32_t tok[N] = {0, 70000, 128255, 1, 2, 3, 100000, 65536, 5};
    const char *p = io_path("v7.bin");
    write_shard(p, 20240801, 7, N, tok, N, 4);
    sbpio_shard s;
    assert_int_equal(sbpio_shard_open(p, &s, err, sizeof err), SBPIO_OK);
    assert_int_equal(s.version, 7);
    assert_int_equal(s.token_size, 4);
    int32_t in[8], lab[8];
    assert_int_equal(sbpio_shard_next_batch(&s, 2, 4, in, lab, err, sizeof err), SBPIO_OK);
    for (int i = 0; i < 8; i++) {
        assert_int_equal(in[i], tok[i]);
        assert_int_equal(lab[i], tok[i + 1]);
    }
    assert_int_equal(sbpio_shard_check_vocab(&s, 128256, err, sizeof err), SBPIO_OK);
    assert_int_equal(sbpio_shard_check_vocab(&s, 128000, err, sizeof err), SBPIO_ERR);
    IO_ASSERT_MSG(err, "token 128255 at position 2");
    sbpio_shard_close(&s);

    /* a token beyond int32 cannot become an input id */
    uint32_t huge[3] = {1, 0x80000000u, 2};
    write_shard(p, 20240801, 7, 3, huge, 3, 4);
    assert_int_equal(sbpio_shard_open(p, &s, err, sizeof err), SBPIO_OK);
    assert_int_equal(sbpio_shard_next_batch(&s, 1, 2, in, lab, err, sizeof err), SBPIO_ERR);
    IO_ASSERT_MSG(err, "2147483648", "position 1", "int32");
    sbpio_shard_close(&s);
}

static void expect_open_fails(const char *name, const char *want1, const char *want2)
{
    sbpio_shard s;
    assert_int_equal(sbpio_shard_open(io_path(name), &s, err, sizeof err), SBPIO_ERR);
    assert_null(s.raw);
    assert_null(s.path);
    IO_ASSERT_MSG(err, name, want1, want2);
}

static void test_bad_files(void **state)
{
    (void)state;
    uint32_t tok[4] = {1, 2, 3, 4};
    write_shard(io_path("magic.bin"), 12345, 1, 4, tok, 4, 2);
    expect_open_fails("magic.bin", "bad magic 12345", "20240520");
    write_shard(io_path("ver1.bin"), 20240520, 7, 4, tok, 4, 2);
    expect_open_fails("ver1.bin", "version 7", "version 1");
    write_shard(io_path("ver7.bin"), 20240801, 1, 4, tok, 4, 4);
    expect_open_fails("ver7.bin", "version 1", "version 7");
    /* header says 5 tokens, 4 present */
    write_shard(io_path("short.bin"), 20240520, 1, 5, tok, 4, 2);
    expect_open_fails("short.bin", "1032 bytes", "truncated");
    /* header says 3 tokens, 4 present */
    write_shard(io_path("long.bin"), 20240520, 1, 3, tok, 4, 2);
    expect_open_fails("long.bin", "1030", "trailing bytes");
    /* uint16 payload under a uint32 header */
    write_shard(io_path("mixed.bin"), 20240801, 7, 4, tok, 4, 2);
    expect_open_fails("mixed.bin", "4 bytes", "1040");
    /* shorter than the header */
    io_write_file(io_path("tiny.bin"), "abc", 3);
    expect_open_fails("tiny.bin", "3 bytes", "header");
    io_write_file(io_path("empty.bin"), "", 0);
    expect_open_fails("empty.bin", "0 bytes", "header");
    expect_open_fails("missing.bin", "No such file", "");
    /* a directory */
    sbpio_shard s;
    assert_int_equal(sbpio_shard_open(io_tmpdir, &s, err, sizeof err), SBPIO_ERR);
    /* an empty but valid shard opens; no batch fits */
    write_shard(io_path("zero.bin"), 20240520, 1, 0, tok, 0, 2);
    assert_int_equal(sbpio_shard_open(io_path("zero.bin"), &s, err, sizeof err), SBPIO_OK);
    assert_int_equal(s.ntok, 0);
    int32_t in[1], lab[1];
    assert_int_equal(sbpio_shard_next_batch(&s, 1, 1, in, lab, err, sizeof err), SBPIO_ERR);
    sbpio_shard_close(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_v1_batches),
        cmocka_unit_test(test_v7_uint32),
        cmocka_unit_test(test_bad_files),
    };
    return cmocka_run_group_tests(tests, io_setup, io_teardown);
}
