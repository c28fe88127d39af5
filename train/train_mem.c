/* train_mem.c — the arena and the host views of train_mem.h, and the device memory figures. */
#include "train_mem.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static size_t align_up(size_t n) { return (n + SBPRT_ALIGN - 1) / SBPRT_ALIGN * SBPRT_ALIGN; }

/* After an arena of `asked` bytes did not fit on a device that had free_bytes free: the
 * --memory-budget (sbpc's planned peak: parameters + gradients + workspace) that would fit,
 * keeping the optimizer state, the ids and labels, and some headroom (the step's constants,
 * the runtime's scratch, cuBLAS's workspace: 5% of the free memory, at least 256 MiB or a
 * quarter of it) out. */
static void fit_advice(const sbp_step_info *in, size_t asked, size_t free_bytes, bool adamw,
                       const train_sink *s)
{
    /* parameters + gradients (the trained parameters' only) */
    const size_t pgbytes = (in->param_elems + in->grad_elems) * sizeof(float);
    const size_t rest = asked - in->workspace_bytes - pgbytes; /* optimizer, ids, labels */
    const size_t least = free_bytes / 4 < ((size_t)256 << 20) ? free_bytes / 4
                                                               : ((size_t)256 << 20);
    const size_t headroom = free_bytes / 20 > least ? free_bytes / 20 : least;
    char b1[32], b2[32], b3[32], b4[32];
    if (pgbytes + rest + headroom >= free_bytes) {
        train_say(s, "note", "the device has %s free, and the parameters, gradients%s alone take %s: "
                "this model does not fit on it%s", cli_human_bytes(b1, sizeof b1, (double)free_bytes),
                adamw ? " and AdamW state" : "",
                cli_human_bytes(b2, sizeof b2, (double)(pgbytes + rest)),
                adamw ? " with AdamW (--optimizer sgd keeps no optimizer state)" : "");
        return;
    }
    const size_t budget = free_bytes - headroom - rest;
    const int shift = budget >= ((size_t)64 << 20) ? 20 : budget >= ((size_t)64 << 10) ? 10 : 0;
    train_say(s, "note", "the device has %s free; the step plans %s (parameters, gradients and a "
            "workspace of %s) and needs %s more for %s: a step planned within %zu bytes would "
            "fit: recompile it with sbpc --memory-budget %zu%s (the stream strategy picks the "
            "largest chunks that fit)", cli_human_bytes(b1, sizeof b1, (double)free_bytes),
            cli_human_bytes(b2, sizeof b2, (double)in->planned_peak_bytes),
            cli_human_bytes(b3, sizeof b3, (double)in->workspace_bytes),
            cli_human_bytes(b4, sizeof b4, (double)rest),
            adamw ? "AdamW state, ids and labels" : "ids and labels", budget, budget >> shift,
            shift == 20 ? "M" : shift == 10 ? "K" : "");
}

/* The offsets of the arena's pieces, in the order of train_mem.h; returns its size. */
static size_t layout(const train_mem *m, const sbp_step_info *in, const train_mem_need *need,
                     size_t off[11])
{
    const size_t ntok = (size_t)(in->batch * in->seq_len);
    const size_t mv = m->host_state ? 0 : m->mbytes; /* host_state: m and v are the host's */
    const size_t pieces[11] = {
        m->step_pbytes, m->grads_host ? 0 : m->gbytes, mv, mv, need->ws_bytes, ntok * sizeof(int32_t),
        ntok * sizeof(int32_t), need->ref ? ntok * sizeof(float) : 0,
        need->old ? ntok * sizeof(float) : 0, need->adv ? (in->per_document ? ntok : (size_t)in->batch) * sizeof(float) : 0,
        need->doc_ids ? ntok * sizeof(int32_t) : 0};
    size_t at = 0;
    for (int i = 0; i < 11; i++) {
        off[i] = at;
        at += align_up(pieces[i]);
    }
    return at;
}

/* The memory this machine can still give (MemAvailable of /proc/meminfo), 0 when unknown. */
static size_t host_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f)
        return 0;
    char line[256];
    unsigned long long kib = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1)
            break;
    fclose(f);
    return kib > SIZE_MAX / 1024 ? SIZE_MAX : (size_t)kib * 1024;
}

/* An offloading step's host workspace (sbp_step_info.host_bytes), checked against what the
 * machine has before anything is allocated; the allocation itself is train_mem_alloc's. */
static int host_check(const train_mem *m, const train_steplib *L, size_t budget,
                      const train_sink *s)
{
    /* the checkpoints; --offload optimizer: the masters, the gradients, m, v and the staging
     * block */
    size_t state = m->host_state ? m->pbytes + m->gbytes + 2 * m->mbytes + m->step_pbytes : 0;
    size_t need = L->in->host_bytes + state, avail = budget ? budget : host_available();
    char b1[32], b2[32];
    if (need && avail && need > avail)
        return train_err(s, "%s keeps %zu bytes (%s) of %s in host memory (sbpc --offload), "
                         "but %s %zu bytes (%s): recompile with a shorter --seq-len, or run "
                         "where the host has more", L->path, need,
                         cli_human_bytes(b1, sizeof b1, (double)need),
                         !state ? "layer checkpoints"
                         : L->in->host_bytes ? "layer checkpoints and optimizer state"
                                             : "optimizer state",
                         budget ? "--host-budget allows" : "this machine has available",
                         avail, cli_human_bytes(b2, sizeof b2, (double)avail));
    if ((L->in->host_bytes || m->grads_host) && !L->rt.host_alloc)
        return train_err(s, "%s needs a host workspace of %zu bytes, but its runtime exports no "
                         "sbprt_host_alloc / sbprt_host_free", L->path, need);
    return 0;
}

/* host_state: the masters, the gradients' copy, m, v and the upload's staging block in host
 * memory (aligned as the CPU runtime's arena); the step gets the arena's parameter block, and
 * its gradient block unless it writes the host's (grads_host: page-locked, from the step's
 * runtime, so that its copies overlap the kernels). */
static int host_state_alloc(train_mem *m, const train_steplib *L, const train_sink *s)
{
    float **p[5] = {&m->d_params, &m->d_grads, &m->d_m, &m->d_v, &m->staging};
    const size_t bytes[5] = {m->pbytes, m->gbytes, m->mbytes, m->mbytes, m->step_pbytes};
    for (int i = 0; i < 5; i++) {
        size_t b = (bytes[i] + SBPRT_ALIGN) / SBPRT_ALIGN * SBPRT_ALIGN;
        int st = SBPRT_OK;
        if (i == 1 && m->grads_host)
            st = TRAIN_RT(L->rt, host_alloc, arena_ctx, (void **)p[i], b);
        else if (!(*p[i] = aligned_alloc(SBPRT_ALIGN, b)))
            st = SBPRT_ERR_NOMEM;
        if (st) {
            *p[i] = NULL;
            return train_err(s, "out of host memory for the offloaded optimizer state (%zu "
                             "bytes): %s", bytes[i], L->rt.status_string(st));
        }
        memset(*p[i], 0, b); /* the staging block's padding is uploaded too */
    }
    m->host_params = m->d_params;
    m->host_grads = m->d_grads;
    if (m->grads_host)
        m->step_grads = m->d_grads;
    return 0;
}

int train_mem_upload(train_mem *m, const train_steplib *L, const train_sink *s)
{
    if (m->host_state) {
        const sbp_step_info *dev = L->step_in, *host = L->in;
        for (int i = 0; i < dev->n_params; i++)
            if (dev->params[i].tied_to < 0)
                sbp_step_param_store(&dev->params[i], m->staging,
                                     m->d_params + host->params[i].offset);
        return train_steplib_copy(L, m->step_params, m->staging, m->step_pbytes,
                                  SBPRT_COPY_HOST_TO_DEVICE, s);
    }
    return L->host_visible ? 0
                           : train_steplib_copy(L, m->d_params, m->host_params, m->pbytes,
                                                SBPRT_COPY_HOST_TO_DEVICE, s);
}

int train_mem_fetch_grads(train_mem *m, const train_steplib *L, const train_sink *s)
{
    return m->host_state && !m->grads_host
               ? train_steplib_copy(L, m->d_grads, m->step_grads, m->gbytes,
                                    SBPRT_COPY_DEVICE_TO_HOST, s)
               : 0;
}

int train_mem_alloc(train_mem *m, const train_steplib *L, const train_mem_need *need,
                    const train_sink *s)
{
    const sbp_step_info *in = L->in;
    const train_rt *rt = &L->rt;
    char why[400];
    memset(m, 0, sizeof *m);
    m->dev_mem = !L->host_visible && rt->device_memory &&
                 rt->device_memory(rt->step_ctx, &m->dev_before, &m->dev_total) == SBPRT_OK;
    m->pbytes = in->param_elems * sizeof(float);
    m->gbytes = in->grad_elems * sizeof(float);
    m->mbytes = need->adamw ? need->state_elems * sizeof(float) : 0;
    m->host_state = L->host_state;
    m->grads_host = L->host_state && L->step_in->grads_on_host;
    m->step_pbytes = L->step_in->param_elems * sizeof(float);
    size_t off[11];
    m->bytes = layout(m, in, need, off);
    if (host_check(m, L, need->host_budget, s))
        return -1;
    int st = TRAIN_RT(*rt, arena_alloc, arena_ctx, (void **)&m->arena, m->bytes);
    if (st) {
        char b1[32];
        train_err(s, "cannot allocate %s for parameters, gradients, optimizer state and "
                  "workspace: %s%s", cli_human_bytes(b1, sizeof b1, (double)m->bytes),
                  rt->status_string(st), train_steplib_why(L, *rt->arena_ctx, why, sizeof why));
        if (m->dev_mem && st == SBPRT_ERR_NOMEM)
            fit_advice(in, m->bytes, m->dev_total - m->dev_before, need->adamw, s);
        m->arena = NULL;
        return -1;
    }
    if (in->host_bytes &&
        (st = TRAIN_RT(*rt, host_alloc, arena_ctx, &m->host_ws, in->host_bytes))) {
        m->host_ws = NULL;
        return train_err(s, "cannot allocate the %zu bytes of host memory the offloaded "
                         "checkpoints take: %s%s", in->host_bytes, rt->status_string(st),
                         train_steplib_why(L, *rt->arena_ctx, why, sizeof why));
    }
    train_mem_sample(m, L);
    char *a = m->arena;
    m->d_params = (float *)(a + off[0]);
    m->d_grads = (float *)(a + off[1]);
    m->d_m = (float *)(a + off[2]);
    m->d_v = (float *)(a + off[3]);
    m->workspace = a + off[4];
    m->d_ids = (int32_t *)(a + off[5]);
    m->d_labels = (int32_t *)(a + off[6]);
    m->d_ref = (float *)(a + off[7]);
    m->d_old = (float *)(a + off[8]);
    m->d_adv = (float *)(a + off[9]);
    m->d_doc_ids = need->doc_ids ? (int32_t *)(a + off[10]) : NULL;
    m->step_params = m->d_params;
    m->step_grads = m->d_grads;
    if (m->host_state)
        return host_state_alloc(m, L, s);
    if (L->host_visible) {
        m->host_params = m->d_params;
        m->host_grads = m->d_grads;
        return 0;
    }
    m->own_host = true;
    m->host_params = malloc(m->pbytes + 1);
    m->host_grads = malloc(m->gbytes + 1);
    return !m->host_params || !m->host_grads ? train_err(s, "out of memory") : 0;
}

void train_mem_sample(train_mem *m, const train_steplib *L)
{
    size_t used = 0;
    if (m->dev_mem && L->rt.device_memory(L->rt.step_ctx, &used, NULL) == SBPRT_OK &&
        used > m->dev_peak)
        m->dev_peak = used;
}

int train_mem_zero_state(train_mem *m, const train_steplib *L, const train_sink *s)
{
    if (!m->mbytes)
        return 0;
    if (m->host_state) {
        memset(m->d_m, 0, m->mbytes);
        memset(m->d_v, 0, m->mbytes);
        return 0;
    }
    float *zeros = calloc(1, m->mbytes + 1);
    if (!zeros)
        return train_err(s, "out of memory");
    int rc = train_steplib_copy(L, m->d_m, zeros, m->mbytes, SBPRT_COPY_HOST_TO_DEVICE, s) ||
             train_steplib_copy(L, m->d_v, zeros, m->mbytes, SBPRT_COPY_HOST_TO_DEVICE, s);
    free(zeros);
    return rc ? -1 : 0;
}

void train_mem_step_nomem(const train_mem *m, const train_steplib *L, const train_sink *s)
{
    size_t used = 0;
    if (m->dev_mem && L->rt.device_memory(L->rt.step_ctx, &used, NULL) == SBPRT_OK)
        train_say(s, "note", "the runtime's scratch or cuBLAS's workspace did not fit next to the "
                  "arena (%zu of %zu bytes in use); recompile the step with a --memory-budget "
                  "some hundreds of MiB below its planned %zu bytes", used, m->dev_total,
                  L->in->planned_peak_bytes);
}

void train_mem_free(train_mem *m, const train_steplib *L)
{
    if (m->own_host) {
        free(m->host_params);
        free(m->host_grads);
    }
    if (m->host_state) {
        free(m->d_params);
        if (m->grads_host && m->d_grads)
            L->rt.host_free(*L->rt.arena_ctx, m->d_grads);
        else
            free(m->d_grads);
        free(m->d_m);
        free(m->d_v);
        free(m->staging);
    }
    if (m->host_ws)
        L->rt.host_free(*L->rt.arena_ctx, m->host_ws);
    if (m->arena)
        L->rt.arena_free(*L->rt.arena_ctx, m->arena);
    memset(m, 0, sizeof *m);
}
