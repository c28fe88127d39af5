/* train_progress.h — the text of sbp-train's one-line progress bar on a terminal:
 *
 *   [=========>                    ] 30/100  loss 4.1234  51234 tokens/s  ETA 1m 12s
 *
 * Kept apart from sbp_train.c as pure functions (a buffer in, no clock, no terminal) so that
 * the text, and the ETA arithmetic in particular, can be unit-tested without a tty. The ETA is
 * the mean time of the steps this process has run times the steps left: a resumed run counts
 * only its own steps, since the checkpoint's steps were timed by another process (or not at
 * all), and the first step's warm-up is averaged in rather than special-cased.
 */
#ifndef SBP_TRAIN_PROGRESS_H
#define SBP_TRAIN_PROGRESS_H

#include <stddef.h>
#include <stdint.h>

/* Seconds left after step s of total, given that `done` steps (>= 1) of this process took
 * `elapsed` seconds; negative when that is not known (done < 1, no time measured). */
double train_progress_eta(int64_t s, int64_t total, int64_t done, double elapsed);

/* A duration as "45s", "1m 12s", "3h 04m" or "2d 05h"; "?" when negative or not finite. */
void train_progress_duration(char *buf, size_t n, double seconds);

/* The bar's line (no "\r", no newline) into buf (truncated to n - 1 characters). */
void train_progress_format(char *buf, size_t n, int64_t s, int64_t total, double loss,
                           double tokens_per_s, double eta_s);

#endif
