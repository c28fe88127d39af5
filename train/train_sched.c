/* train_sched.c — the learning-rate schedules and clip_grad_norm_ of sbp-train.
 *
 * The formulas are in train_sched.h; each is written the way transformers writes it (Python
 * floats are doubles, the same operations in the same order), so the rates agree to the last
 * bit or two, far inside the tests' 1e-4. The norm is summed per parameter by the backend in
 * double and added here in the parameter table's order, so it does not depend on the thread
 * count or the device.
 */
#include "train_sched.h"
#include <string.h>

#include <math.h>
#include <stdio.h>

/* Python's math.pi (M_PI is not ISO C) */
#define SCHED_PI 3.141592653589793

static const char *const sched_names[] = {"constant", "linear", "cosine", NULL};

/* the options' offsets from the tool's base val (train_sched.h) */
const struct option train_sched_options[] = {
    {"lr-schedule", required_argument, NULL, TRAIN_OPT},
    {"warmup-steps", required_argument, NULL, TRAIN_OPT},
    {"min-lr", required_argument, NULL, TRAIN_OPT},
    {"clip-grad-norm", required_argument, NULL, TRAIN_OPT},
    {"log", required_argument, NULL, TRAIN_OPT},
    {0},
};

int train_sched_parse(train_sched_opts *t, cli *c, const char *v)
{
    const char *f = c->flag;
    if (!strcmp(f, "--lr-schedule"))
        return cli_choice(c, f, v, sched_names, &t->kind);
    if (!strcmp(f, "--warmup-steps"))
        return cli_count(c, f, v, 0, (int64_t)1 << 30, &t->warmup);
    if (!strcmp(f, "--min-lr")) {
        t->min_lr_set = true;
        return cli_real(c, f, v, &t->min_lr);
    }
    if (!strcmp(f, "--clip-grad-norm")) {
        if (cli_real(c, f, v, &t->clip))
            return -1;
        /* clip_grad_norm_(max_norm=0) zeroes every gradient: a typo, not a wish */
        if (t->clip <= 0)
            return cli_error(c, "--clip-grad-norm: '%s' must be positive (the largest gradient "
                             "norm kept)", v);
        return 0;
    }
    if (!strcmp(f, "--log"))
        return cli_path(c, f, v, &t->log_path);
    return TRAIN_OPT_NOT_MINE;
}

int train_sched_check(const train_sched_opts *t, double lr, char *err, size_t errlen)
{
    if (t->min_lr_set && t->kind == TRAIN_SCHED_CONSTANT) {
        snprintf(err, errlen, "--min-lr is the floor of the linear and cosine schedules; give "
                 "--lr-schedule linear or cosine (the schedule is constant)");
        return -1;
    }
    if (t->min_lr_set && t->min_lr > lr) {
        snprintf(err, errlen, "--min-lr %g is above --lr %g: the schedule would rise, not decay",
                 t->min_lr, lr);
        return -1;
    }
    return 0;
}

const char *train_sched_usage(void)
{
    return "  --lr-schedule NAME      constant (default), linear or cosine, transformers'\n"
           "                          get_*_schedule_with_warmup: step s of N (--steps) uses\n"
           "                          lr * f(s-1), W = --warmup-steps, r = --min-lr / --lr:\n"
           "                          c < W: f(c) = c / max(1, W); constant: f(c) = 1;\n"
           "                          linear: f(c) = max(0, (N-c) / max(1, N-W)) (1-r) + r;\n"
           "                          cosine: f(c) = max(0, (1 + cos(pi p)) / 2 (1-r) + r),\n"
           "                          p = (c-W) / max(1, N-W)\n"
           "  --warmup-steps N        linear warmup from 0 over the first N steps (default 0)\n"
           "  --min-lr F              the floor of linear and cosine (default 0; as\n"
           "                          get_cosine_with_min_lr_schedule_with_warmup's min_lr)\n"
           "  --clip-grad-norm F      scale the gradients by min(1, F / (norm + 1e-6)), norm =\n"
           "                          the global L2 norm of every trained parameter's gradient\n"
           "                          (as torch.nn.utils.clip_grad_norm_); the norm is printed\n"
           "                          every step either way\n"
           "  --log FILE.jsonl        one JSON object per step (step, loss, lr, grad_norm,\n"
           "                          tokens_per_s, elapsed_s; DPO: its rewards_*),\n"
           "                          flushed after each step\n";
}

double train_sched_lr(const train_sched_opts *t, double lr, int64_t s, int64_t total)
{
    const double c = (double)(s - 1); /* transformers' current_step: steps already taken */
    const double w = (double)t->warmup, n = (double)total;
    /* min_lr / lr as transformers forms min_lr_rate (a division of Python floats) */
    const double r = t->min_lr_set && lr > 0 ? t->min_lr / lr : 0.0;
    double f;
    if (c < w) {
        /* constant: max(1.0, W); the others max(1, W): the same value for W >= 0 */
        f = c / fmax(1.0, w);
    } else if (t->kind == TRAIN_SCHED_CONSTANT) {
        f = 1.0;
    } else {
        const double span = fmax(1.0, (double)(total - t->warmup));
        if (t->kind == TRAIN_SCHED_LINEAR) {
            f = fmax(0.0, (n - c) / span);
            if (t->min_lr_set)
                f = f * (1 - r) + r;
        } else {
            const double progress = (c - w) / span;
            /* math.pi * float(num_cycles) * 2.0 * progress, num_cycles = 0.5 */
            f = 0.5 * (1.0 + cos(SCHED_PI * 0.5 * 2.0 * progress));
            f = f * (1 - r) + r;
            f = fmax(0.0, f);
        }
    }
    return lr * f;
}

double train_clip_coef(double max_norm, double norm)
{
    const double coef = max_norm / (norm + 1e-6);
    return coef < 1.0 ? coef : 1.0; /* torch.clamp(clip_coef, max=1.0) */
}

int train_clip_grads(const train_grad_rt *rt, const sbp_step_info *in, float *grads,
                     double max_norm, double *norm, double *coef)
{
    double sq = 0;
    int st;
    *coef = 1.0;
    const bool multi = rt->sq_norm_multi && rt->scale_multi && rt->spans;
    /* tied copies have no storage of their own, frozen parameters are not trained */
    if (multi && (st = rt->sq_norm_multi(rt->sq_ctx, &sq, grads, rt->spans, rt->nspans)))
        return st;
    for (int i = 0; !multi && i < in->n_params; i++) {
        const sbp_step_param *p = &in->params[i];
        if (p->tied_to >= 0 || !p->trainable || p->numel == 0)
            continue;
        if ((st = rt->sq_norm(rt->sq_ctx, &sq, grads + p->grad_offset, p->numel)))
            return st;
    }
    *norm = sqrt(sq);
    if (max_norm <= 0)
        return SBPRT_OK;
    const double k = train_clip_coef(max_norm, *norm);
    if (!(k < 1.0))
        return SBPRT_OK; /* torch multiplies by 1.0: a no-op */
    *coef = k;
    if (multi)
        return rt->scale_multi(rt->scale_ctx, grads, rt->spans, rt->nspans, (float)k);
    for (int i = 0; i < in->n_params; i++) {
        const sbp_step_param *p = &in->params[i];
        if (p->tied_to >= 0 || !p->trainable || p->numel == 0)
            continue;
        if ((st = rt->scale(rt->scale_ctx, grads + p->grad_offset, grads + p->grad_offset, p->numel,
                            (float)k)))
            return st;
    }
    return SBPRT_OK;
}
