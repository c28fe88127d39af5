/* train_optim.c — the update of train_optim.h. */
#include "train_optim.h"
#include "train_finite.h"

int train_optim_update(const train_optim *o, const train_steplib *L, train_mem *m, train_dist *d,
                       int64_t s, double lr, double *gnorm, const train_sink *sink)
{
    const sbp_step_info *in = L->in;
    const train_rt *rt = &L->rt;
    char err[512], why[400];
    double clip_coef = 1;
    const train_grad_rt grt = {rt->grad_sq_norm, *rt->norm_ctx, rt->scale, *rt->scale_ctx};
    int st = d->on && d->zero > 0 /* the norm of the ranks' slices */
                 ? train_dist_clip(d, &grt, in, m->d_grads, o->clip, gnorm, &clip_coef)
                 : train_clip_grads(&grt, in, m->d_grads, o->clip, gnorm, &clip_coef);
    if (st)
        return train_err(sink, "step %lld: the gradient norm%s failed: %s%s", (long long)s,
                         o->clip > 0 ? " or its clipping" : "", rt->status_string(st),
                         train_steplib_why(L, *rt->norm_ctx, why, sizeof why));
    for (int i = 0; i < in->n_params; i++) {
        const sbp_step_param *p = &in->params[i];
        size_t a = 0, n = p->numel; /* the part this rank updates (ZeRO: a slice) */
        if (p->tied_to >= 0 || !p->trainable || p->numel == 0 || !train_dist_owned(d, p, &a, &n))
            continue;
        size_t k = p->offset + a, g = p->grad_offset + a; /* the parameter and gradient blocks */
        size_t mo = g - d->lo; /* m and v hold the slice [lo, hi) of the gradient block */
        if (o->adamw)
            st = TRAIN_RT(*rt, adamw_update, adamw_ctx, m->d_params + k, m->d_m + mo,
                          m->d_v + mo, m->d_grads + g, n, lr, 0.9, 0.999, 1e-8, o->weight_decay,
                          s > INT32_MAX ? INT32_MAX : (int)s);
        else
            st = TRAIN_RT(*rt, sgd_update, sgd_ctx, m->d_params + k, m->d_grads + g, n, lr,
                          o->weight_decay);
        if (st)
            return train_err(sink, "step %lld: the %s update of '%s' failed: %s", (long long)s,
                             o->adamw ? "adamw" : "sgd", p->name, rt->status_string(st));
    }
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
