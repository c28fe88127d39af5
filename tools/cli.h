/* cli.h — the command line of sbpc and sbp-train: one option loop and one set of value checkers.
 *
 * Each tool keeps its own `struct option` table (getopt_long's) and calls cli_next() in a loop;
 * what comes back is an option's `val` with its value in c->arg, a positional argument
 * (CLI_POSITIONAL), the end (CLI_END), or CLI_ERROR after a message has been printed. The tool
 * then checks the value with one of the checkers below, so that both tools accept and refuse
 * exactly the same spellings, with the same words.
 *
 * The loop, on top of getopt_long (opterr = 0, optstring "-:" + the short options):
 *   - `--flag value` and `--flag=value` both work; short options take `-o value`, `-ovalue`
 *     and, as the tools always did, `-o=value`;
 *   - options and positional arguments may be interleaved; everything after `--` is positional;
 *   - long options may be abbreviated to any unambiguous prefix (getopt_long's rule: `--seq`
 *     is `--seq-len`); an ambiguous prefix is an error naming the candidates;
 *   - a missing value (`--batch` last) is handed to the tool as "", so the checker says what
 *     was wanted ("--batch needs a value", "-o needs a file name");
 *   - messages are compiler-style, "prog: error: ...", and also kept in c->err (for tests).
 * A table entry whose val is a letter or digit is also the short option -val; every other entry
 * needs a val >= 256 (or one that is not alphanumeric), unique in the table.
 *
 * The value checkers (each returns 0, or -1 after a message naming the flag and the value):
 *   cli_count   decimal digits only (no sign, no space, no 0x), in [lo, hi]: "--batch: 'x2' is
 *               not a positive integer", "--seq-len: '0' is out of range (1 to 1073741824)";
 *   cli_real    a finite decimal number >= 0, the whole string: no surrounding whitespace, no hex
 *               float ("0x1p3": no one means that as a learning rate), no 'nan' / 'inf', nothing
 *               that overflows or underflows to 0 (1e400, 1e-400): "is not a number", "is out
 *               of range (not a finite number)", "must not be negative"; -0 is 0;
 *   cli_bytes   decimal digits with an optional K, M or G (either case; powers of 1024), at
 *               least 1 byte: "is not a byte count (e.g. 8G, 512M, 1048576)";
 *   cli_choice  one word of a NULL-terminated list: "--strategy: 'x' is not stream, store or
 *               checkpoint";
 *   cli_path    any non-empty string: "-o needs a file name".
 * Every checker says "FLAG needs a value" (cli_path: "needs a file name") for "".
 */
#ifndef SBP_CLI_H
#define SBP_CLI_H

#include <getopt.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum {
    CLI_END = -1,       /* no more arguments */
    CLI_ERROR = -2,     /* a malformed command line; the message is printed */
    CLI_POSITIONAL = 1, /* a positional argument, in c->arg (getopt's in-order code) */
};

typedef struct cli {
    const char *prog;          /* "sbpc": messages read "sbpc: error: ..." */
    const struct option *opts; /* the tool's table, ending in an all-zero entry */
    int argc;
    char **argv;
    FILE *errf;                /* where messages are printed: stderr; NULL: nowhere (tests) */
    const char *arg;           /* the value of the option last returned ("" when it was
                                * missing, NULL for an option without one), or the positional
                                * argument */
    const char *flag;          /* that option's spelling in messages: "-o", "--batch" */
    bool rest;                 /* after "--" (or getopt's end): the rest are positional */
    char optstring[96];        /* "-:" and the short options, derived from opts */
    char flag_buf[64];         /* storage for flag */
    char err[512];             /* the last message, without "prog: error: " */
} cli;

/* Starts a parse of argv[1..argc-1] (resets getopt's state). */
void cli_init(cli *c, const char *prog, const struct option *opts, int argc, char **argv);
/* The next option's val, CLI_POSITIONAL, CLI_END or CLI_ERROR (see above). */
int cli_next(cli *c);
/* Records and prints "prog: error: <fmt>"; returns -1. For the tools' own command-line errors
 * ("more than one model given"), so that they read like the checkers'. */
int cli_error(cli *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The message convention of sbp-train's parts (train_*.c): formats into err[errlen] (err may be
 * NULL) and returns -1, so a failure reads `return cli_errf(err, errlen, "...", ...);`. */
int cli_errf(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* A byte count for people into buf: "1.25 GiB", "341.5 MiB", "80.6 KiB". Returns buf. */
char *cli_human_bytes(char *buf, size_t n, double bytes);

int cli_count(cli *c, const char *flag, const char *s, int64_t lo, int64_t hi, int64_t *out);
int cli_real(cli *c, const char *flag, const char *s, double *out);
int cli_bytes(cli *c, const char *flag, const char *s, size_t *out);
/* *out = the index of s in words (NULL-terminated). */
int cli_choice(cli *c, const char *flag, const char *s, const char *const *words, int *out);
int cli_path(cli *c, const char *flag, const char *s, const char **out);

#endif
