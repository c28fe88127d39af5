/* test_progress.c — cmocka tests of tools/train_progress.c, the text of sbp-train's progress
 * line on a terminal. The tty test (progress_tty.sh) shows the line is drawn; this
 * one pins what it says: the ETA is the mean step time of this process times the steps left
 * (a resumed run's earlier steps are not counted), durations read as a person would, and an
 * unknown ETA is "?" rather than a made-up number.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "train_progress.h"

static void eta_is_mean_step_time_times_steps_left(void **state)
{
    (void)state;
    /* 10 steps of this process took 5 s: 0.5 s a step, 90 steps left */
    assert_true(fabs(train_progress_eta(10, 100, 10, 5.0) - 45.0) < 1e-12);
    /* resumed after step 50: steps 51..60 are this process's 10 steps */
    assert_true(fabs(train_progress_eta(60, 100, 10, 5.0) - 20.0) < 1e-12);
    assert_true(train_progress_eta(100, 100, 10, 5.0) == 0.0); /* the last step */
    assert_true(train_progress_eta(3, 10, 0, 5.0) < 0);        /* nothing timed yet */
    assert_true(train_progress_eta(3, 10, 3, 0.0) < 0);
    assert_true(train_progress_eta(3, 10, 3, NAN) < 0);
}

static void durations(void **state)
{
    (void)state;
    char b[32];
    const struct {
        double s;
        const char *want;
    } cases[] = {{0, "0s"},          {0.2, "1s"},         {45, "45s"},
                 {59.5, "1m 00s"},   {72, "1m 12s"},      {3599, "59m 59s"},
                 {3600, "1h 00m"},   {3 * 3600 + 240, "3h 04m"},
                 {2 * 86400 + 5 * 3600, "2d 05h"},        {-1, "?"},
                 {NAN, "?"},         {INFINITY, "?"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        train_progress_duration(b, sizeof b, cases[i].s);
        assert_string_equal(b, cases[i].want);
    }
}

static void the_line(void **state)
{
    (void)state;
    char b[256];
    train_progress_format(b, sizeof b, 30, 100, 4.12341, 51234.4, 72);
    assert_string_equal(b, "[=========>                    ] 30/100  loss 4.1234  51234 tokens/s"
                           "  ETA 1m 12s");
    train_progress_format(b, sizeof b, 3, 3, 2.5, 10, 0);
    assert_string_equal(b, "[==============================] 3/3  loss 2.5000  10 tokens/s  ETA 0s");
    train_progress_format(b, sizeof b, 1, 3, 2.5, 10, -1);
    assert_non_null(strstr(b, "ETA ?"));
    char small[8]; /* truncated, still terminated */
    train_progress_format(small, sizeof small, 1, 3, 2.5, 10, 1);
    assert_int_equal(strlen(small), 7);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(eta_is_mean_step_time_times_steps_left),
        cmocka_unit_test(durations),
        cmocka_unit_test(the_line),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
