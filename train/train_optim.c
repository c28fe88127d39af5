/* train_optim.c — the update of train_optim.h. */
#include "train_optim.h"
#include "train_finite.h"

#include <stdlib.h>

/* The spans this rank updates: every trainable parameter with storage (tied copies have none),
 * its owned slice under ZeRO. [*n] malloc'd, or NULL when out of memory. */
static sbprt_span *update_spans(const sbp_step_info *in, const train_dist *d, int *count)
{
    sbprt_span *sp = malloc(((size_t)in->n_params + 1) * sizeof *sp);
    int n = 0;
    for (int i = 0; sp && i < in->n_params; i++) {
        const sbp_step_param *p = &in->params[i];
        size_t a = 0, len = p->numel; /* the part this rank updates (ZeRO: a slice) */
        if (p->tied_to >= 0 || !p->trainable || p->numel == 0 || !train_dist_owned(d, p, &a, &len))
            continue;
        /* m and v hold the slice [lo, hi) of the gradient block */
        sp[n++] = (sbprt_span){p->offset + a, p->grad_offset + a, p->grad_offset + a - d->lo, len};
    }
    *count = n;
    return sp;
}

/* The per-tensor path, for a step whose runtime has no multi-tensor forms. */
static int update_each(const train_optim *o, const train_steplib *L, train_mem *m,
                       const sbprt_span *sp, int nsp, int step, double lr, int *failed)
{
    const train_rt *rt = &L->rt;
    for (int i = 0; i < nsp; i++) {
        int st = o->adamw ? TRAIN_RT(*rt, adamw_update, adamw_ctx, m->d_params + sp[i].param,
                                     m->d_m + sp[i].state, m->d_v + sp[i].state,
                                     m->d_grads + sp[i].grad, sp[i].n, lr, 0.9, 0.999, 1e-8,
                                     o->weight_decay, step)
                          : TRAIN_RT(*rt, sgd_update, sgd_ctx, m->d_params + sp[i].param,
                                     m->d_grads + sp[i].grad, sp[i].n, lr, o->weight_decay);
        if (st) {
            *failed = i;
            return st;
        }
    }
    return 0;
}

int train_optim_update(const train_optim *o, const train_steplib *L, train_mem *m, train_dist *d,
                       int64_t s, double lr, double *gnorm, const train_sink *sink)
{
    const sbp_step_info *in = L->in;
    const train_rt *rt = &L->rt;
    char err[512], why[400];
    double clip_coef = 1;
    int nsp = 0;
    sbprt_span *sp = update_spans(in, d, &nsp);
    if (!sp)
        return train_err(sink, "step %lld: out of memory", (long long)s);
    const bool zero = d->on && d->zero > 0;
    /* without ZeRO the update list is every trainable tensor whole: the norm's list too */
    const train_grad_rt grt = {rt->grad_sq_norm, *rt->norm_ctx, rt->scale, *rt->scale_ctx,
                               rt->grad_sq_norm_multi, rt->scale_multi, zero ? NULL : sp, nsp};
    int st = zero /* the norm of the ranks' slices */
                 ? train_dist_clip(d, &grt, in, m->d_grads, o->clip, gnorm, &clip_coef)
                 : train_clip_grads(&grt, in, m->d_grads, o->clip, gnorm, &clip_coef);
    if (st) {
        free(sp);
        return train_err(sink, "step %lld: the gradient norm%s failed: %s%s", (long long)s,
                         o->clip > 0 ? " or its clipping" : "", rt->status_string(st),
                         train_steplib_why(L, *rt->norm_ctx, why, sizeof why));
    }
    const int step = s > INT32_MAX ? INT32_MAX : (int)s;
    int failed = -1; /* the span whose per-tensor update failed, or -1 */
    if (o->adamw && rt->adamw_update_multi)
        st = TRAIN_RT(*rt, adamw_update_multi, adamw_ctx, m->d_params, m->d_m, m->d_v,
                      m->d_grads, sp, nsp, lr, 0.9, 0.999, 1e-8, o->weight_decay, step);
    else if (!o->adamw && rt->sgd_update_multi)
        st = TRAIN_RT(*rt, sgd_update_multi, sgd_ctx, m->d_params, m->d_grads, sp, nsp, lr,
                      o->weight_decay);
    else
        st = update_each(o, L, m, sp, nsp, step, lr, &failed);
    if (st) {
        const char *name = "the parameters";
        for (int i = 0; failed >= 0 && i < in->n_params; i++) /* the tensor at that span */
            if (in->params[i].tied_to < 0 && in->params[i].grad_offset <= sp[failed].grad &&
                sp[failed].grad < in->params[i].grad_offset + in->params[i].numel)
                name = in->params[i].name;
        free(sp);
        return train_err(sink, "step %lld: the %s update of %s%s%s failed: %s%s", (long long)s,
                         o->adamw ? "adamw" : "sgd", failed >= 0 ? "'" : "", name,
                         failed >= 0 ? "'" : "", rt->status_string(st),
                         train_steplib_why(L, o->adamw ? *rt->adamw_ctx : *rt->sgd_ctx, why,
                                           sizeof why));
    }
    free(sp);
    if ((st = rt->sync(*rt->sync_ctx)))
        return train_err(sink, "step %lld: %s%s", (long long)s, rt->status_string(st),
                         train_steplib_why(L, *rt->sync_ctx, why, sizeof why));
    /* ZeRO: every rank's updated slice to every rank (the moments move only for a checkpoint) */
    if (train_dist_gather_params(d, in, m->d_params, m->d_grads, err, sizeof err))
        return train_err(sink, "step %lld: %s", (long long)s, err);
    /* a device's weights are checked when they come back to be written (finish, checkpoints) */
    if ((L->host_visible || L->host_state) &&
        train_finite_check(in, TRAIN_BLOCK_PARAMS, m->d_params, 0, in->param_elems, false,
                           "the update made a weight non-finite", err, sizeof err))
        return train_err(sink, "step %lld: %s: stopping (nothing of this step is saved; a smaller "
                         "--lr or --weight-decay?)", (long long)s, err);
    return 0;
}
