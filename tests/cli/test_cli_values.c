/* test_cli_values.c — cmocka tests of tools/cli.c, the command line sbpc and sbp-train share.
 *
 * The value checkers on the spellings where strtoll / strtod would be lenient (surrounding
 * whitespace, signs, hex, 'nan', overflow), on their ranges and suffixes, and on the exact
 * words of their messages (the tools' CLI tests match them); then the option loop over a small
 * table: both value forms, abbreviations, ambiguity, a value given to a flag that takes none, a
 * missing value, interleaved positionals, "--", and "-o=FILE". Messages are read from c.err
 * (errf = NULL keeps the test's output quiet).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"

static cli quiet(void)
{
    static const struct option none[] = {{0}};
    cli c;
    char *argv[] = {"test", NULL};
    cli_init(&c, "test", none, 1, argv);
    c.errf = NULL;
    return c;
}

/* The checker failed with a message containing `want`. */
#define assert_refused(call, c, want)                                                             \
    do {                                                                                          \
        assert_int_equal((call), -1);                                                             \
        if (!strstr((c).err, (want)))                                                             \
            fail_msg("message '%s' does not contain '%s'", (c).err, (want));                      \
    } while (0)

static void test_count(void **state)
{
    (void)state;
    cli c = quiet();
    int64_t v = -7;
    assert_int_equal(cli_count(&c, "--batch", "3", 1, 100, &v), 0);
    assert_int_equal(v, 3);
    assert_int_equal(cli_count(&c, "--batch", "007", 1, 100, &v), 0);
    assert_int_equal(v, 7);
    assert_int_equal(cli_count(&c, "--batch", "100", 1, 100, &v), 0);
    /* whitespace anywhere, signs, base prefixes, junk: not a positive integer */
    const char *bad[] = {" 3", "3 ", "\t3", "3\n", "+3", "-3", "0x10", "3.0", "1e3", "x2", "3 4"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char want[64];
        snprintf(want, sizeof want, "--batch: '%s' is not a positive integer", bad[i]);
        v = -7;
        assert_refused(cli_count(&c, "--batch", bad[i], 1, 100, &v), c, want);
        assert_int_equal(v, -7); /* untouched on failure */
    }
    /* ranges, with the range in the message; overflow is out of range, not wrapped */
    assert_refused(cli_count(&c, "--seq-len", "0", 1, 100, &v), c,
                   "--seq-len: '0' is out of range (1 to 100)");
    assert_refused(cli_count(&c, "--seq-len", "101", 1, 100, &v), c, "out of range (1 to 100)");
    assert_refused(cli_count(&c, "--batch", "99999999999999999999", 1, INT64_MAX, &v), c,
                   "--batch: '99999999999999999999' is out of range");
    assert_refused(cli_count(&c, "--batch", "9223372036854775808", 1, INT64_MAX, &v), c,
                   "is out of range");
    assert_int_equal(cli_count(&c, "--n", "9223372036854775807", 1, INT64_MAX, &v), 0);
    assert_true(v == INT64_MAX);
    /* a range from 0 says non-negative */
    assert_int_equal(cli_count(&c, "--n", "0", 0, 5, &v), 0);
    assert_refused(cli_count(&c, "--n", "-1", 0, 5, &v), c, "'-1' is not a non-negative integer");
    /* no value */
    assert_refused(cli_count(&c, "--batch", "", 1, 100, &v), c, "--batch needs a value");
    assert_refused(cli_count(&c, "--batch", NULL, 1, 100, &v), c, "--batch needs a value");
}

static void test_real(void **state)
{
    (void)state;
    cli c = quiet();
    double v = -7;
    const struct {
        const char *s;
        double want;
    } good[] = {{"0", 0},       {"0.1", 0.1},   {".5", 0.5},       {"5.", 5},    {"1e-3", 1e-3},
                {"1E+2", 100},  {"+0.25", 0.25}, {"-0", 0},        {"1e300", 1e300}};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        assert_int_equal(cli_real(&c, "--lr", good[i].s, &v), 0);
        assert_true(v == good[i].want);
    }
    /* -0 comes back as +0, not a negative zero a later printf would show as "-0" */
    assert_int_equal(cli_real(&c, "--lr", "-0.0", &v), 0);
    assert_false(signbit(v));
    /* not a number: whitespace anywhere, junk, hex floats (decided: decimal only), empty parts */
    const char *bad[] = {" 0.1", "0.1 ", "\t0.1", "\n1", "1e-3x", "0.1.2", "0x1p3", "0X10",
                         ".", "e5", "1e", "1e+", "--1", "+-1", "1,5", "one"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char want[64];
        snprintf(want, sizeof want, "--lr: '%s' is not a number", bad[i]);
        v = -7;
        assert_refused(cli_real(&c, "--lr", bad[i], &v), c, want);
        assert_true(v == -7);
    }
    /* not finite, or not representable (overflow to inf, underflow to 0): out of range */
    const char *range[] = {"nan", "NaN", "inf", "-inf", "infinity", "1e400", "1e-400", "-1e400"};
    for (size_t i = 0; i < sizeof range / sizeof range[0]; i++) {
        char want[64];
        snprintf(want, sizeof want, "--lr: '%s' is out of range (not a finite number)", range[i]);
        assert_refused(cli_real(&c, "--lr", range[i], &v), c, want);
    }
    /* whitespace before 'nan' is still whitespace */
    assert_refused(cli_real(&c, "--lr", " nan", &v), c, "' nan' is not a number");
    assert_refused(cli_real(&c, "--beta", "-0.5", &v), c, "--beta: '-0.5' must not be negative");
    assert_refused(cli_real(&c, "--beta", "-1", &v), c, "--beta: '-1' must not be negative");
    assert_refused(cli_real(&c, "--beta", "", &v), c, "--beta needs a value");
}

static void test_bytes(void **state)
{
    (void)state;
    cli c = quiet();
    size_t v = 7;
    const struct {
        const char *s;
        size_t want;
    } good[] = {{"1", 1},
                {"1048576", 1048576},
                {"1K", 1024},
                {"1k", 1024},
                {"512M", (size_t)512 << 20},
                {"512m", (size_t)512 << 20},
                {"8G", (size_t)8 << 30},
                {"8g", (size_t)8 << 30}};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        assert_int_equal(cli_bytes(&c, "--memory-budget", good[i].s, &v), 0);
        assert_true(v == good[i].want);
    }
    /* a budget of 0 bytes means nothing fits: refused like junk */
    const char *bad[] = {"0", "0G", "1X", "12Q", " 8G", "8G ", "8 G", "-1", "+1", "8GB", "8KiB",
                         "G", "1.5G", "0x10"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char want[96];
        snprintf(want, sizeof want,
                 "--memory-budget: '%s' is not a byte count (e.g. 8G, 512M, 1048576)", bad[i]);
        v = 7;
        assert_refused(cli_bytes(&c, "--memory-budget", bad[i], &v), c, want);
        assert_true(v == 7);
    }
    assert_refused(cli_bytes(&c, "--memory-budget", "99999999999999999999", &v), c,
                   "'99999999999999999999' is out of range");
    assert_refused(cli_bytes(&c, "--memory-budget", "17179869184G", &v), c, "is out of range");
    assert_refused(cli_bytes(&c, "--memory-budget", "", &v), c, "--memory-budget needs a value");
}

static void test_choice_and_path(void **state)
{
    (void)state;
    cli c = quiet();
    static const char *const three[] = {"stream", "store", "checkpoint", NULL};
    static const char *const two[] = {"adamw", "sgd", NULL};
    static const char *const one[] = {"only", NULL};
    int k = -1;
    assert_int_equal(cli_choice(&c, "--strategy", "checkpoint", three, &k), 0);
    assert_int_equal(k, 2);
    assert_refused(cli_choice(&c, "--strategy", "bogus", three, &k), c,
                   "--strategy: 'bogus' is not stream, store or checkpoint");
    /* exact words: no prefix, no case folding, no whitespace */
    assert_refused(cli_choice(&c, "--strategy", "str", three, &k), c, "is not");
    assert_refused(cli_choice(&c, "--strategy", "Stream", three, &k), c, "is not");
    assert_refused(cli_choice(&c, "--strategy", " stream", three, &k), c, "is not");
    assert_refused(cli_choice(&c, "--optimizer", "adam", two, &k), c,
                   "--optimizer: 'adam' is not adamw or sgd");
    assert_refused(cli_choice(&c, "--x", "y", one, &k), c, "--x: 'y' is not only");
    assert_refused(cli_choice(&c, "--optimizer", "", two, &k), c, "--optimizer needs a value");

    const char *p = NULL;
    assert_int_equal(cli_path(&c, "-o", "a b.so", &p), 0);
    assert_string_equal(p, "a b.so");
    assert_refused(cli_path(&c, "-o", "", &p), c, "-o needs a file name");
}

/* ------------------------------------------------------------------ the option loop */

enum { T_BATCH = 256, T_BETA, T_REPORT, T_DUMP, T_SHARED };
/* two options that share a val, as the trainer's modules' do (train/train_opt.h): the flag
 * names which one it was */
static const struct option table[] = {
    {"batch", required_argument, NULL, T_BATCH}, {"beta", required_argument, NULL, T_BETA},
    {"report", no_argument, NULL, T_REPORT},     {"dump-ir", optional_argument, NULL, T_DUMP},
    {"output", required_argument, NULL, 'o'},    {"help", no_argument, NULL, 'h'},
    {"resume", required_argument, NULL, T_SHARED}, {"log", required_argument, NULL, T_SHARED},
    {0},
};

/* Runs the loop over argv (NULL-terminated) and writes "code:flag=arg" per result, space
 * separated, into out; stops after an error with "ERR(message)". */
static void trace(char **argv, char *out, size_t n)
{
    int argc = 0;
    while (argv[argc])
        argc++;
    cli c;
    cli_init(&c, "test", table, argc, argv);
    c.errf = NULL;
    size_t k = 0;
    out[0] = 0;
    for (int r; (r = cli_next(&c)) != CLI_END && k < n;) {
        if (r == CLI_ERROR) {
            snprintf(out + k, n - k, "ERR(%.400s)", c.err);
            return;
        }
        if (r == CLI_POSITIONAL)
            k += (size_t)snprintf(out + k, n - k, "[%s] ", c.arg);
        else
            k += (size_t)snprintf(out + k, n - k, "%s=%s ", c.flag,
                                  c.arg ? c.arg : "(none)");
    }
}

#define assert_trace(want, ...)                                                                   \
    do {                                                                                          \
        char *argv_[] = {"test", __VA_ARGS__, NULL};                                              \
        char got_[512];                                                                           \
        trace(argv_, got_, sizeof got_);                                                          \
        assert_string_equal(got_, want);                                                          \
    } while (0)

static void test_loop(void **state)
{
    (void)state;
    /* both value forms, positionals in order between options */
    assert_trace("[m.onnx] --batch=2 --beta=0.1 [extra] ", "m.onnx", "--batch", "2",
                 "--beta=0.1", "extra");
    /* a value that looks like an option is still the value */
    assert_trace("--batch=-5 ", "--batch", "-5");
    assert_trace("--batch=--beta ", "--batch", "--beta");
    /* a missing value reaches the checker as "" */
    assert_trace("[m] --batch= ", "m", "--batch");
    assert_trace("--batch= ", "--batch=");
    /* abbreviations: unique prefixes are the option, shared ones are an error */
    assert_trace("--batch=3 --report=(none) ", "--bat", "3", "--rep");
    assert_trace("ERR(option '--b' is ambiguous: --batch, --beta (see --help))", "--b", "3");
    assert_trace("ERR(option '--b' is ambiguous: --batch, --beta (see --help))", "--b=3");
    /* unknown options, long and short, and a value given to a flag that takes none */
    assert_trace("ERR(unknown option '--frobnicate' (see --help))", "--frobnicate");
    assert_trace("ERR(unknown option '--frobnicate=1' (see --help))", "--frobnicate=1");
    assert_trace("ERR(unknown option '-x' (see --help))", "-x");
    assert_trace("-h=(none) ERR(unknown option '-x' (see --help))", "-hx");
    assert_trace("ERR(--report takes no value ('--report=1'))", "--report=1");
    assert_trace("ERR(--report takes no value ('--rep=1'))", "--rep=1");
    /* an optional value only with '=' */
    assert_trace("--dump-ir=(none) [program] ", "--dump-ir", "program");
    assert_trace("--dump-ir=program ", "--dump-ir=program");
    assert_trace("--dump-ir= ", "--dump-ir=");
    /* short options: -o FILE, -oFILE, -o=FILE (as the tools always read it), --output */
    assert_trace("-o=a.so ", "-o", "a.so");
    assert_trace("-o=a.so ", "-oa.so");
    assert_trace("-o=a.so ", "-o=a.so");
    assert_trace("-o=a.so ", "--output=a.so");
    assert_trace("-o= ", "-o");
    assert_trace("-o= ", "-o=");
    /* "-" is a positional (stdin by convention); after "--" everything is */
    assert_trace("[-] ", "-");
    assert_trace("--batch=1 [--beta] [-o] ", "--batch", "1", "--", "--beta", "-o");
    /* options that share a val: each by its own name, with a value, a missing one, a prefix */
    assert_trace("--log=a --resume=b ", "--log", "a", "--resume=b");
    assert_trace("--log= ", "--log");
    assert_trace("--resume= ", "--res");
}

/* Two parses in one process start afresh (getopt's state is reset by cli_init). */
static void test_loop_twice(void **state)
{
    (void)state;
    assert_trace("-h=(none) ", "-h");
    assert_trace("[a] -h=(none) ", "a", "-h");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_count),
        cmocka_unit_test(test_real),
        cmocka_unit_test(test_bytes),
        cmocka_unit_test(test_choice_and_path),
        cmocka_unit_test(test_loop),
        cmocka_unit_test(test_loop_twice),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
