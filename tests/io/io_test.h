/* io_test.h — helpers shared by the sbpio tests (header-only, static): a scratch directory per
 * test program (created by the group setup, removed with its contents by the group teardown),
 * writing byte buffers to files, listing leftovers, and finding a Python interpreter that has a
 * given module (for the optional cross-checks; a test without one prints "SKIPPED: ..." and
 * calls cmocka's skip()).
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
#include <ftw.h>
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

static int io_setup(void **state)
{
    (void)state;
    const char *t = getenv("TMPDIR");
    snprintf(io_tmpdir, sizeof io_tmpdir, "%s/sbpio_test.XXXXXX", t && *t ? t : "/tmp");
    return mkdtemp(io_tmpdir) ? 0 : -1;
}

static int io_rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

static int io_teardown(void **state)
{
    (void)state;
    if (io_tmpdir[0])
        nftw(io_tmpdir, io_rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return 0;
}

/* "<tmpdir>/<name>" in a rotating static buffer (8 live results). */
static const char *io_path(const char *name)
{
    static char bufs[8][4200];
    static int k;
    char *b = bufs[k++ % 8];
    snprintf(b, sizeof bufs[0], "%s/%s", io_tmpdir, name);
    return b;
}

static const char *io_data(const char *name)
{
    static char bufs[8][4200];
    static int k;
    char *b = bufs[k++ % 8];
    snprintf(b, sizeof bufs[0], "%s/%s", IO_TEST_DATA, name);
    return b;
}

static const char *io_fixture(const char *name)
{
    static char bufs[8][4200];
    static int k;
    char *b = bufs[k++ % 8];
    snprintf(b, sizeof bufs[0], "%s/%s", IO_TEST_FIXTURES, name);
    return b;
}

static void io_write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    if (n)
        assert_int_equal(fwrite(data, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

static unsigned char *io_read_file(const char *path, size_t *n)
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

static bool io_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* Number of entries in the scratch directory whose name contains `part` (temporaries: ".tmp."). */
static int io_count_entries(const char *part)
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
static void io_assert_msg(const char *err, ...)
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

/* A Python interpreter that can `import module`: $SBP_PYTHON, python3, /usr/bin/python3; NULL if
 * none. The result is a static string. */
static const char *io_python_with(const char *module)
{
    static char found[256];
    const char *cands[] = {getenv("SBP_PYTHON"), "python3", "/usr/bin/python3"};
    for (size_t i = 0; i < sizeof cands / sizeof cands[0]; i++) {
        if (!cands[i] || !*cands[i])
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

/* Runs python script text with the given interpreter and arguments; returns its exit status. */
static int io_run_python(const char *python, const char *script_name, const char *script,
                         const char *args)
{
    const char *sp = io_path(script_name);
    io_write_file(sp, script, strlen(script));
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "'%s' '%s' %s", python, sp, args);
    int rc = system(cmd);
    return rc == -1 ? -1 : WEXITSTATUS(rc);
}

#endif /* IO_TEST_H */
