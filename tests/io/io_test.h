/* io_test.h — helpers shared by the sbpio tests (header-only, static): a scratch directory per
 * test program (created by the group setup, removed with its contents by the group teardown),
 * writing byte buffers to files, listing leftovers, and finding a Python interpreter that has a
 * given module (for the optional cross-checks; a test without one calls IO_SKIP: it prints
 * "SKIPPED: ..." and calls cmocka's skip()), and io_main, which runs either the program's own
 * tests or (argument --python) its Python cross-checks, registered as a ctest test of their own
 * with SKIP_RETURN_CODE 77: a cross-check that could not run makes that test exit 77, which ctest
 * reports as skipped (never as passed).
 *
 * Paths: IO_TEST_DATA (tests/io/data) and IO_TEST_FIXTURES (tests/fixtures) come from CMake.
 */
#ifndef IO_TEST_H
#define IO_TEST_H

#include <setjmp.h> /* cmocka needs these before cmocka.h */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <dirent.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "sbpio.h"

#ifndef IO_TEST_DATA
#error "IO_TEST_DATA must be defined (tests/io/CMakeLists.txt)"
#endif
#ifndef IO_TEST_FIXTURES
#error "IO_TEST_FIXTURES must be defined (tests/io/CMakeLists.txt)"
#endif

static char io_tmpdir[4096];

static inline int io_setup(void **state)
{
    (void)state;
    const char *t = getenv("TMPDIR");
    snprintf(io_tmpdir, sizeof io_tmpdir, "%s/sbpio_test.XXXXXX", t && *t ? t : "/tmp");
    return mkdtemp(io_tmpdir) ? 0 : -1;
}

/* rm -r without following symlinks. */
static inline void io_rm_tree(const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0)
        return;
    if (S_ISDIR(st.st_mode)) {
        DIR *d = opendir(path);
        if (d) {
            for (struct dirent *e; (e = readdir(d));) {
                if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
                    continue;
                char sub[4400];
                if (snprintf(sub, sizeof sub, "%s/%s", path, e->d_name) < (int)sizeof sub)
                    io_rm_tree(sub);
            }
            closedir(d);
        }
    }
    remove(path);
}

static inline int io_teardown(void **state)
{
    (void)state;
    if (io_tmpdir[0])
        io_rm_tree(io_tmpdir);
    return 0;
}

/* "<tmpdir>/<name>" in a rotating static buffer (8 live results). */
static inline const char *io_path(const char *name)
{
    static char bufs[8][4200];
    static int k;
    char *b = bufs[k++ % 8];
    snprintf(b, sizeof bufs[0], "%s/%s", io_tmpdir, name);
    return b;
}

static inline const char *io_data(const char *name)
{
    static char bufs[8][4200];
    static int k;
    char *b = bufs[k++ % 8];
    snprintf(b, sizeof bufs[0], "%s/%s", IO_TEST_DATA, name);
    return b;
}

static inline const char *io_fixture(const char *name)
{
    static char bufs[8][4200];
    static int k;
    char *b = bufs[k++ % 8];
    snprintf(b, sizeof bufs[0], "%s/%s", IO_TEST_FIXTURES, name);
    return b;
}

static inline void io_write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    if (n)
        assert_int_equal(fwrite(data, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

static inline unsigned char *io_read_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)len + 1);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    *n = (size_t)len;
    return b;
}

static inline bool io_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* Number of entries in the scratch directory whose name contains `part` (temporaries: ".tmp."). */
static inline int io_count_entries(const char *part)
{
    DIR *d = opendir(io_tmpdir);
    assert_non_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (strstr(e->d_name, part))
            n++;
    closedir(d);
    return n;
}

/* Asserts that err contains every one of the given substrings (NULL-terminated list). */
static inline void io_assert_msg(const char *err, ...)
{
    va_list ap;
    va_start(ap, err);
    for (const char *s; (s = va_arg(ap, const char *));) {
        if (!strstr(err, s)) {
            print_error("message \"%s\" lacks \"%s\"\n", err, s);
            va_end(ap);
            fail();
        }
    }
    va_end(ap);
}
#define IO_ASSERT_MSG(err, ...) io_assert_msg(err, __VA_ARGS__, (const char *)NULL)

/* A Python interpreter that can `import module`: $SBP_PYTHON when set (only that one, so
 * SBP_PYTHON=none turns the cross-checks off), else python3 on PATH, else /usr/bin/python3; NULL
 * if none. The result is a static string. */
static inline const char *io_python_with(const char *module)
{
    static char found[256];
    const char *env = getenv("SBP_PYTHON");
    const char *cands[] = {env && *env ? env : "python3", env && *env ? NULL : "/usr/bin/python3"};
    for (size_t i = 0; i < sizeof cands / sizeof cands[0]; i++) {
        if (!cands[i])
            continue;
        char cmd[600];
        snprintf(cmd, sizeof cmd, "'%s' -c 'import %s' >/dev/null 2>&1", cands[i], module);
        if (system(cmd) == 0) {
            snprintf(found, sizeof found, "%s", cands[i]);
            return found;
        }
    }
    return NULL;
}

/* How many checks called IO_SKIP; io_main turns any into exit status 77. */
static int io_skipped;
#define IO_SKIP(...)                                                                               \
    do {                                                                                           \
        printf("SKIPPED: " __VA_ARGS__);                                                           \
        fflush(stdout);                                                                            \
        io_skipped++;                                                                              \
        skip();                                                                                    \
    } while (0)

/* Runs tests[0..n) (no arguments) or python[0..npy) (argument --python) as one cmocka group.
 * Returns cmocka's count of failures when there are any, else 77 (ctest's SKIP_RETURN_CODE for
 * these tests) when a check skipped, else 0. */
static inline int io_main(int argc, char **argv, const char *name, const struct CMUnitTest *tests,
                          size_t n, const struct CMUnitTest *python, size_t npy)
{
    bool py = argc > 1 && strcmp(argv[1], "--python") == 0;
    if (argc > 2 || (argc == 2 && !py)) {
        fprintf(stderr, "usage: %s [--python]\n", argv[0]);
        return 2;
    }
    int failed = _cmocka_run_group_tests(py ? "python cross-checks" : name, py ? python : tests,
                                         py ? npy : n, io_setup, io_teardown);
    if (failed)
        return failed;
    if (io_skipped) {
        printf("%d check(s) SKIPPED (see above): exit status 77, reported by ctest as skipped\n",
               io_skipped);
        return 77;
    }
    return 0;
}
#define IO_MAIN(name, tests, python)                                                               \
    io_main(argc, argv, name, tests, sizeof tests / sizeof tests[0], python,                     \
            sizeof python / sizeof python[0])

/* splitmix64: a fixed-seed generator for the mutation tests. */
static inline uint64_t io_rand(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* A mutated copy of src[0..n) in dst (capacity n + 16): a few random byte changes, sometimes a
 * truncation or an inserted byte, biased towards the first `hot` bytes (the header). Returns the
 * new length. Parsers run on these under ASan/UBSan must fail cleanly or succeed. */
static inline size_t io_mutate(uint64_t *rng, const unsigned char *src, size_t n, size_t hot,
                               unsigned char *dst)
{
    memcpy(dst, src, n);
    size_t len = n;
    int edits = 1 + (int)(io_rand(rng) % 4);
    for (int e = 0; e < edits && len; e++) {
        uint64_t r = io_rand(rng);
        size_t span = (r & 1) && hot && hot < len ? hot : len;
        size_t at = (size_t)((r >> 8) % span);
        switch ((r >> 4) % 8) {
        case 0: len = at; break; /* truncate */
        case 1: /* insert */
            if (len < n + 8) {
                memmove(dst + at + 1, dst + at, len - at);
                dst[at] = (unsigned char)(r >> 40);
                len++;
            }
            break;
        case 2: { /* a syntax character */
            static const char syn[] = "{}[]\":,0-9e\\ '()TF";
            dst[at] = (unsigned char)syn[(r >> 40) % (sizeof syn - 1)];
            break;
        }
        case 3: dst[at] = 0xff; break;
        default: dst[at] ^= (unsigned char)(1u << ((r >> 40) % 8)); break;
        }
    }
    return len;
}

/* Runs python script text with the given interpreter and arguments; returns its exit status. */
static inline int io_run_python(const char *python, const char *script_name, const char *script,
                                const char *args)
{
    const char *sp = io_path(script_name);
    io_write_file(sp, script, strlen(script));
    char cmd[8192];
    if (snprintf(cmd, sizeof cmd, "'%s' '%s' %s", python, sp, args) >= (int)sizeof cmd)
        return -1;
    int rc = system(cmd);
    return rc == -1 ? -1 : WEXITSTATUS(rc);
}

#endif /* IO_TEST_H */
