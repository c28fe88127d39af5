/* train_log.c — the JSONL log of sbp-train (--log); the format and the rules for the
 * file are in train_log.h. Everything is plain stdio: a line is formatted whole, written with
 * one fputs and flushed, so a reader never sees half a number unless the disk fills up.
 */
#define _POSIX_C_SOURCE 200809L
#include "train_log.h"
#include "files.h"
#include "sbpio.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

double train_log_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The step number of one log line ({"step":N,...}, read by sbpio's JSON parser), -1 when it
 * is not such an object. */
static int64_t line_step(const char *line, size_t n)
{
    uint64_t s = 0;
    return sbpio_json_object_u64(line, n, "step", &s) && s <= INT64_MAX ? (int64_t)s : -1;
}

/* A resumed run's log: keeps the lines of steps <= keep_through of the existing file (a missing
 * file is a new log), rewritten through the atomic writer so a crash here loses nothing. */
static int keep_lines(const char *path, int64_t keep_through, char *err, size_t errlen)
{
    char why[512];
    FILE *in = sbp_file_fopen_input(path, NULL, why, sizeof why);
    if (!in)
        return errno == ENOENT ? 0 : (snprintf(err, errlen, "--log: %s", why), -1);
    sbp_atomic a;
    if (sbp_atomic_begin(&a, path, why, sizeof why) != SBP_FILE_OK) {
        fclose(in);
        snprintf(err, errlen, "--log: %s", why);
        return -1;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    bool ok = true;
    while ((n = getline(&line, &cap, in)) > 0) {
        int64_t s = line_step(line, (size_t)n);
        if (s >= 0 && s <= keep_through && line[n - 1] == '\n')
            ok = ok && fputs(line, a.f) >= 0;
    }
    ok = ok && !ferror(in);
    free(line);
    fclose(in);
    if (!ok) {
        sbp_atomic_abort(&a);
        snprintf(err, errlen, "--log: reading or rewriting %s failed", path);
        return -1;
    }
    if (sbp_atomic_commit(&a, why, sizeof why) != SBP_FILE_OK) {
        snprintf(err, errlen, "--log: %s", why);
        return -1;
    }
    return 0;
}

int train_log_open(train_log *l, const char *path, int64_t keep_through, char *err,
                   size_t errlen)
{
    memset(l, 0, sizeof *l);
    l->t0 = train_log_now();
    if (!path)
        return 0;
    l->path = path;
    if (keep_through >= 0 && keep_lines(path, keep_through, err, errlen))
        return -1;
    /* O_NOFOLLOW is not wanted (a log may well be a symlink the user made); O_NONBLOCK keeps a
     * FIFO swapped in after the output check from blocking the run: it fails to open instead */
    int fd = open(path,
                  O_WRONLY | O_CREAT | (keep_through >= 0 ? O_APPEND : O_TRUNC) | O_NONBLOCK |
                      O_CLOEXEC,
                  0666);
    if (fd < 0) {
        snprintf(err, errlen, "--log: cannot create %s: %s", path, strerror(errno));
        return -1;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0)
        (void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    if (!(l->f = fdopen(fd, "w"))) {
        snprintf(err, errlen, "--log: %s: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    return 0;
}

/* ",\"key\":value" with value in its shortest round-trip form, or null when not finite. */
static size_t put_number(char *buf, size_t n, size_t k, const char *key, double x)
{
    if (k >= n)
        return k;
    if (!isfinite(x))
        return k + (size_t)snprintf(buf + k, n - k, ",\"%s\":null", key);
    char num[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(num, sizeof num, "%.*g", prec, x);
        if (strtod(num, NULL) == x)
            break;
    }
    return k + (size_t)snprintf(buf + k, n - k, ",\"%s\":%s", key, num);
}

int train_log_step(train_log *l, int64_t s, double loss, double lr, double grad_norm,
                   double tokens_per_s, double eval_loss, double aux_loss,
                   const train_rewards_stats *rewards, char *err, size_t errlen)
{
    if (!l->f)
        return 0;
    char line[768]; /* 11 numbers of at most 24 characters and their keys */
    size_t k = (size_t)snprintf(line, sizeof line, "{\"step\":%lld", (long long)s);
    k = put_number(line, sizeof line, k, "loss", loss);
    k = put_number(line, sizeof line, k, "lr", lr);
    k = put_number(line, sizeof line, k, "grad_norm", grad_norm);
    k = put_number(line, sizeof line, k, "tokens_per_s", tokens_per_s);
    k = put_number(line, sizeof line, k, "elapsed_s", train_log_now() - l->t0);
    if (!isnan(eval_loss))
        k = put_number(line, sizeof line, k, "eval_loss", eval_loss);
    if (!isnan(aux_loss)) /* a MoE step: the load-balancing loss (x coef inside loss) */
        k = put_number(line, sizeof line, k, "aux_loss", aux_loss);
    if (rewards && !isnan(rewards->margin)) {
        k = put_number(line, sizeof line, k, "rewards_chosen", rewards->chosen);
        k = put_number(line, sizeof line, k, "rewards_rejected", rewards->rejected);
        k = put_number(line, sizeof line, k, "rewards_margin", rewards->margin);
        k = put_number(line, sizeof line, k, "rewards_accuracy", rewards->accuracy);
    }
    if (k < sizeof line)
        snprintf(line + k, sizeof line - k, "}\n");
    if (fputs(line, l->f) == EOF || fflush(l->f) == EOF) {
        snprintf(err, errlen, "--log: writing %s failed: %s", l->path, strerror(errno));
        return -1;
    }
    return 0;
}

int train_log_close(train_log *l, char *err, size_t errlen)
{
    if (!l || !l->f)
        return 0;
    bool bad = ferror(l->f) != 0;
    bad |= fclose(l->f) != 0;
    l->f = NULL;
    if (bad) {
        snprintf(err, errlen, "--log: writing %s failed: %s", l->path, strerror(errno));
        return -1;
    }
    return 0;
}
