/* train_progress.c — the text of sbp-train's progress line on a terminal (train_progress.h). */
#include "train_progress.h"

#include <math.h>
#include <stdio.h>

double train_progress_eta(int64_t s, int64_t total, int64_t done, double elapsed)
{
    if (done < 1 || !(elapsed > 0) || !isfinite(elapsed))
        return -1;
    const int64_t left = total > s ? total - s : 0;
    return elapsed / (double)done * (double)left;
}

void train_progress_duration(char *buf, size_t n, double seconds)
{
    if (!(seconds >= 0) || !isfinite(seconds) || seconds > 1e9) { /* 1e9 s: not an ETA */
        snprintf(buf, n, "?");
        return;
    }
    /* rounded up to whole seconds: "0s" left is only true at the end */
    const long long t = (long long)ceil(seconds);
    if (t < 60)
        snprintf(buf, n, "%llds", t);
    else if (t < 3600)
        snprintf(buf, n, "%lldm %02llds", t / 60, t % 60);
    else if (t < 86400)
        snprintf(buf, n, "%lldh %02lldm", t / 3600, t % 3600 / 60);
    else
        snprintf(buf, n, "%lldd %02lldh", t / 86400, t % 86400 / 3600);
}

void train_progress_format(char *buf, size_t n, int64_t s, int64_t total, double loss,
                           double tokens_per_s, double eta_s)
{
    enum { WIDTH = 30 };
    char bar[WIDTH + 1];
    const int filled = total > 0 ? (int)(s * WIDTH / total) : 0;
    for (int i = 0; i < WIDTH; i++)
        bar[i] = i < filled ? '=' : (i == filled ? '>' : ' ');
    bar[WIDTH] = 0;
    char eta[32];
    train_progress_duration(eta, sizeof eta, eta_s);
    snprintf(buf, n, "[%s] %lld/%lld  loss %.4f  %.0f tokens/s  ETA %s", bar, (long long)s,
             (long long)total, loss, tokens_per_s, eta);
}
