/* sched_check.c — checks an sbp-train run with --lr-schedule / --clip-grad-norm / --log
 * against a float64 PyTorch reference made by tests/fixtures/gen_sched.py:
 *
 *   sched_check STDOUT.txt REF.json LOG.jsonl
 *
 * REF.json holds "loss", "lr" and "grad_norm" arrays (torch.optim.AdamW + the transformers
 * scheduler + clip_grad_norm_, one entry per step). Both what sbp-train prints ("step N loss X
 * tokens/s Y lr Z grad_norm G") and its JSONL log (full precision) must match them within 1e-4
 * relative, every step present once and in order; the log must also hold tokens_per_s and
 * elapsed_s (non-decreasing). Prints the worst relative difference of each quantity; exit 1 on
 * any failure. A zero reference (the lr of a warmup's first step) must be matched exactly.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_STEPS 256
#define TOL 1e-4

static int failures;

static void fail(const char *what, long long step, double got, double want)
{
    fprintf(stderr, "sched_check: step %lld: %s %.10g, the reference says %.10g\n", step, what,
            got, want);
    failures++;
}

static char *read_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "sched_check: cannot open %s\n", path);
        exit(1);
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)(n > 0 ? n : 0) + 1);
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        fprintf(stderr, "sched_check: cannot read %s\n", path);
        exit(1);
    }
    buf[n] = 0;
    fclose(f);
    return buf;
}

/* The numbers of the array after "key": in json; their count. */
static int json_array(const char *json, const char *key, double *out)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(json, pat);
    if (!p || !(p = strchr(p, '[')))
        return 0;
    int n = 0;
    for (p++; *p && *p != ']' && n < MAX_STEPS;) {
        char *end;
        double x = strtod(p, &end);
        if (end == p) {
            p++;
            continue;
        }
        out[n++] = x;
        p = end;
    }
    return n;
}

static double rel(double got, double want)
{
    if (want == 0)
        return got == 0 ? 0 : INFINITY;
    return fabs(got - want) / fabs(want);
}

/* Compares one value; keeps the worst relative difference. */
static void check(const char *what, long long step, double got, double want, double *worst)
{
    double e = rel(got, want);
    if (!(e <= TOL))
        fail(what, step, got, want);
    else if (e > *worst)
        *worst = e;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: sched_check STDOUT.txt REF.json LOG.jsonl\n");
        return 2;
    }
    char *out = read_text(argv[1]), *json = read_text(argv[2]), *log = read_text(argv[3]);
    static double loss[MAX_STEPS], lr[MAX_STEPS], norm[MAX_STEPS];
    int n = json_array(json, "loss", loss);
    if (n < 2 || json_array(json, "lr", lr) != n || json_array(json, "grad_norm", norm) != n) {
        fprintf(stderr, "sched_check: %s: no loss, lr and grad_norm arrays of one length\n",
                argv[2]);
        return 1;
    }

    /* the printed lines (loss has 6 decimals: 1e-4 relative is far above that at loss ~3) */
    double w_loss = 0, w_lr = 0, w_norm = 0;
    int seen = 0;
    for (char *line = out, *nl; line && *line; line = nl ? nl + 1 : NULL) {
        nl = strchr(line, '\n');
        long long s;
        double l, tps, r, g;
        if (sscanf(line, "step %lld loss %lf tokens/s %lf lr %lf grad_norm %lf", &s, &l, &tps, &r,
                   &g) != 5)
            continue;
        if (s != ++seen || s > n) {
            fprintf(stderr, "sched_check: unexpected printed step %lld\n", s);
            return 1;
        }
        check("printed loss", s, l, loss[s - 1], &w_loss);
        check("printed lr", s, r, lr[s - 1], &w_lr);
        check("printed grad_norm", s, g, norm[s - 1], &w_norm);
    }
    if (seen != n) {
        fprintf(stderr, "sched_check: %d printed steps, the reference has %d\n", seen, n);
        failures++;
    }
    printf("printed: %d steps; worst relative difference: loss %.3g, lr %.3g, grad_norm %.3g\n",
           seen, w_loss, w_lr, w_norm);

    /* the JSONL log, at full precision */
    w_loss = w_lr = w_norm = 0;
    seen = 0;
    double last_elapsed = 0;
    for (char *line = log, *nl; line && *line; line = nl ? nl + 1 : NULL) {
        nl = strchr(line, '\n');
        long long s;
        double l, r, g, tps, el;
        if (sscanf(line, "{\"step\":%lld,\"loss\":%lf,\"lr\":%lf,\"grad_norm\":%lf,"
                         "\"tokens_per_s\":%lf,\"elapsed_s\":%lf}", &s, &l, &r, &g, &tps, &el) != 6) {
            fprintf(stderr, "sched_check: %s: not a log line: %.80s\n", argv[3], line);
            return 1;
        }
        if (s != ++seen || s > n) {
            fprintf(stderr, "sched_check: unexpected logged step %lld\n", s);
            return 1;
        }
        if (!(tps > 0) || !(el >= last_elapsed)) {
            fprintf(stderr, "sched_check: step %lld: tokens_per_s %g, elapsed_s %g after %g\n", s,
                    tps, el, last_elapsed);
            failures++;
        }
        last_elapsed = el;
        check("logged loss", s, l, loss[s - 1], &w_loss);
        check("logged lr", s, r, lr[s - 1], &w_lr);
        check("logged grad_norm", s, g, norm[s - 1], &w_norm);
        if (!nl || !nl[1])
            break;
    }
    if (seen != n) {
        fprintf(stderr, "sched_check: %d logged steps, the reference has %d\n", seen, n);
        failures++;
    }
    printf("logged:  %d steps; worst relative difference: loss %.3g, lr %.3g, grad_norm %.3g\n",
           seen, w_loss, w_lr, w_norm);
    free(out);
    free(json);
    free(log);
    return failures ? 1 : 0;
}
