/* train_say.h — how the trainer library speaks: every diagnostic and result line goes to the
 * caller's sink, never to a stream of its own, and nothing in the library exits.
 *
 * A line has a kind — "error", "warning", "note" (diagnostics: sbp-train prints them as
 * "sbp-train: KIND: text" on stderr) or "out" (a result: what was saved where, an evaluation's
 * loss; sbp-train prints it on stdout) — and one line of text without a newline. The kind ""
 * is a diagnostic of the model's import that carries its own place and severity ("FILE: node
 * 'n' (Op): warning: ..."), printed after the program's name alone. A library
 * function that fails has sent its "error" line(s) and returns -1. A sink that is NULL or has
 * no `line` drops everything (a test that asserts on return codes only).
 */
#ifndef SBP_TRAIN_SAY_H
#define SBP_TRAIN_SAY_H

typedef struct train_sink {
    void (*line)(void *ud, const char *kind, const char *text);
    void *ud;
} train_sink;

/* Formats and sends one line of the given kind. */
void train_say(const train_sink *s, const char *kind, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* An "error" line; returns -1, so that `return train_err(s, ...)` fails the caller. */
int train_err(const train_sink *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A "note" line whose text is given whole (for the modules that hand notes up as strings). */
void train_note(const train_sink *s, const char *text);

/* "[d0,d1,...]" into buf. */
#include <stdint.h>
#include <stddef.h>
char *train_shape_str(char *buf, size_t n, int rank, const int64_t *dims);

/* The entries of an import's diagnostics, one "" line each. */
struct ir_diag;
void train_say_ir(const train_sink *s, const struct ir_diag *d);

#endif
