/* train_run.c — a run of the trainer library (sbptrain.h): open in its phases, each optimizer
 * step, the end of a step, the outputs, close.
 *
 * open:   the files of the run (inputs by identity, every output checked and probed before any
 *         work, the checkpoint folder prepared); the step library (train_steplib.h); the data
 *         source and the DPO / GRPO inputs (checked against the step's B, T, V: cheap, so before
 *         the model); the runtime's contexts (no device is quicker to find than a large model is
 *         to read); the model checked against the step; the arena with the weights copied in,
 *         the moments zeroed and the step prepared; a dataset's reference log-probs; --resume;
 *         --log.
 * step:   the batch (train_source.h), the step on each of the K micro-batches with the
 *         gradients accumulated under the whole batch's denominator, a stop on a failed status
 *         or a non-finite loss (naming the step), the sums over the ranks, the first step's
 *         gradients dumped when asked, and the update (train_optim.h).
 * end:    evaluation when due, the log line, the checkpoint when due and a signal's stop.
 * finish: the trained weights written where asked, in fp32 (train_model.h), and the figures.
 *
 * Data parallel (train_dist.h): under mpirun every rank reads the global batch (G rows per
 * micro-batch), runs the step on its own rows with the global denominator, and the losses and
 * gradients are summed before the update; --zero slices the optimizer state. Rank 0 alone
 * writes.
 */
#include "sbptrain.h"
#include "train_finite.h"
#include "train_inputs.h"
#include "train_log.h"
#include "train_mem.h"
#include "train_model.h"
#include "train_optim.h"
#include "train_outputs.h"
#include "train_refs.h"
#include "train_rewards.h"
#include "train_source.h"
#include "train_steplib.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The steps tokens/s is measured over: the newest ones whose times add up to RATE_SPAN_S, at
 * most RATE_STEPS (fewer at the start), so that one step's timing noise does not swing it. */
enum { RATE_STEPS = 64 };
#define RATE_SPAN_S 1.0

struct train_run {
    train_config c;            /* the options (--epochs resolved into steps) */
    train_sink sink;
    const train_sink *s;       /* &sink */
    train_dist solo, *dist;    /* the caller's ranks, or solo: one */
    sbp_file_set inputs;       /* every file the run reads, for the output checks */
    train_steplib lib;
    sbp_step_info gin;         /* the step's description with the global batch G: the files' */
    train_source src;
    train_inputs ti;
    int32_t *mb_doc_ids;       /* [B*T] one micro-batch's document ids (packed steps) */
    int32_t *sp_stage;         /* sequence parallel: [B*tl] this rank's columns of a batch */
    train_model mdl;           /* until its weights are in the arena */
    train_mem mem;
    train_optim optim;
    int64_t launches;          /* the last step's device launches (train_report), -1: unknown */
    train_refs refs;           /* a DPO / GRPO dataset's reference log-probs */
    train_rewards rewards;     /* DPO: the step's rewards (the row logps it hands back) */
    bool have_refs;
    train_eval ev;             /* --eval-data / --eval-dataset */
    train_log log;
    train_ckpt ckpt;
    train_pretrained pre;      /* --save-pretrained: what it will write */
    train_export *export;      /* --save-safetensors's keys, planned at open */
    train_adapter_merge_plan *merge; /* --merge-lora's base weights, planned at open */
    int64_t next;              /* the next step */
    struct {                   /* tokens/s over the newest steps that span 1 s (rate_add) */
        double tok[RATE_STEPS], dt[RATE_STEPS];
        int n, head;
    } rate;
};

/* ------------------------------------------------------------------ the files of the run */

/* Every file this run reads, by identity (paths that do not exist are left to their readers). */
static int collect_inputs(const train_config *o, sbp_file_set *inputs, const train_sink *s)
{
    const struct {
        const char *path, *role;
    } in[] = {{o->step_path, "the step library"}, {o->model_path, "the model (--model)"},
              {o->ids_path, "--input-ids"},      {o->labels_path, "--labels"},
              {o->data_path, "--data"},          {o->ref_logps, "--ref-logps"},
              {o->old_logps, "--old-logps"},     {o->advantages, "--advantages"},
              {o->pack.doc_ids, "--doc-ids"},
              {o->eval.data, "--eval-data"},
              {o->dataset.path, "--dataset"},    {o->eval.dataset, "--eval-dataset"}};
    for (size_t i = 0; i < sizeof in / sizeof in[0]; i++)
        if (in[i].path && sbp_file_set_add(inputs, in[i].path, in[i].role, NULL) != SBP_FILE_OK)
            return train_err(s, "out of memory");
    return 0;
}

/* Every file the run will write (train_outputs.h): none may replace an input, a special file
 * or another output, and each must be writable, all before step 1 (a run that cannot write
 * its result finds out now, not after training). */
static int check_outputs(const train_config *o, const train_pretrained *pre,
                         const sbp_file_set *inputs, const train_sink *s)
{
    static const char *const adapter_files[] = {"adapter_model.safetensors",
                                                "adapter_config.json"};
    const struct {
        const char *path, *role;
    } files[] = {{o->dump_grads, "--dump-grads"},
                 {o->save, "--save"},
                 {o->save_safetensors, "--save-safetensors"},
                 {o->sched.log_path, "--log"},
                 {o->compute_logps, "--compute-logps"},
                 {o->ref_cache, "--ref-cache"}};
    train_outputs reg;
    char err[1024];
    int rc = 0;
    train_outputs_init(&reg, inputs);
    for (size_t i = 0; i < sizeof files / sizeof files[0] && !rc; i++)
        if (files[i].path && train_outputs_file(&reg, files[i].path, files[i].role, err,
                                                sizeof err))
            rc = -1;
    if (!rc && o->adapter.save_dir &&
        train_outputs_dir(&reg, o->adapter.save_dir, "--save-adapter", adapter_files,
                          (int)(sizeof adapter_files / sizeof adapter_files[0]), err, sizeof err))
        rc = -1;
    if (!rc && o->pretrained.dir &&
        train_outputs_dir(&reg, o->pretrained.dir, "--save-pretrained", pre->names, pre->n_names,
                          err, sizeof err))
        rc = -1;
    const char *ckpt_dir = o->ckpt.dir ? o->ckpt.dir : o->ckpt.resume;
    if (!rc && ckpt_dir &&
        train_outputs_ckpt_dir(&reg, ckpt_dir, o->ckpt.dir ? "--checkpoint-dir" : "--resume",
                               err, sizeof err))
        rc = -1;
    train_outputs_free(&reg);
    /* a file at --ref-cache that is not of sbp-train's log-probs is never replaced (the cache's
     * own identity is checked again before its pass, train_refs.c) */
    if (!rc && o->ref_cache &&
        train_refs_check_cache(o->ref_cache, "--ref-cache", false, err, sizeof err))
        rc = -1;
    return rc ? train_err(s, "%s", err) : 0;
}


/* The inputs and outputs, then the checkpoint folder: an unwritable one is found now, not
 * after hours (under mpirun: rank 0 first, which creates it, then the others; a failing rank 0
 * aborts them all). */
static int open_files(train_run *r)
{
    const train_config *o = &r->c;
    char err[512];
    /* --save-pretrained: the export's recorded config, and so the folder's files, first */
    if (o->pretrained.dir &&
        train_pretrained_plan(&r->pre, &o->pretrained, o->model_path, err, sizeof err))
        return train_err(r->s, "%s", err);
    if (collect_inputs(o, &r->inputs, r->s) || check_outputs(o, &r->pre, &r->inputs, r->s))
        return -1;
    if (r->dist->rank != 0)
        train_dist_barrier(r->dist);
    if (train_ckpt_prepare(&r->ckpt, &o->ckpt, r->s, err, sizeof err))
        return train_err(r->s, "%s", err);
    if (r->dist->rank == 0)
        train_dist_barrier(r->dist);
    return 0;
}

/* --eval-data / --eval-dataset: the step's evaluation entry point and the held-out batches,
 * cut or packed as the training data is. */
static int open_eval(train_run *r)
{
    const train_config *o = &r->c;
    const sbp_step_info *in = r->lib.in;
    char err[512];
    if (train_steplib_want_eval(&r->lib, o->eval.dataset ? "--eval-dataset" : "--eval-data",
                                r->s))
        return -1;
    if (o->eval.dataset) /* (of the model's tokenizer, as the training data) */
        return train_eval_open_dataset(&r->ev, &o->eval, in, err, sizeof err) ||
                       train_dataset_check_model(&r->ev.ds, o->model_path, err, sizeof err)
                   ? train_err(r->s, "%s", err) : 0;
    if (in->packed && !o->pack.pack)
        return train_err(r->s, "--eval-data: %s is a packed step, and the held-out text is "
                         "packed as --data is: give --pack --eos ID", o->step_path);
    if (train_eval_open(&r->ev, &o->eval, in->batch, in->seq_len, in->vocab, o->pack.pack,
                        (uint32_t)o->pack.eos, err, sizeof err))
        return train_err(r->s, "%s", err);
    return 0;
}

/* Under mpirun the files (or each --data read) hold the global batch of G rows per
 * micro-batch, which every rank reads whole: r->gin describes it. */
static int plan_ranks(train_run *r, bool pairs)
{
    const train_config *o = &r->c;
    const sbp_step_info *in = r->lib.in;
    train_dist *d = r->dist;
    char err[512];
    r->gin = *in;
    /* sequence parallelism: the groups (every run: a plain one is D = 1 group of one) */
    if (train_dist_seq_start(d, r->lib.step_in->seq_parallel, (int)o->seq_parallel, err,
                             sizeof err))
        return train_err(r->s, "%s: %s", o->step_path, err);
    if (!d->on)
        return 0;
    if (!r->lib.host_visible && !train_dist_have_nccl())
        return train_err(r->s, "%s is a %s step: this sbp-train was built without NCCL, so "
                         "under mpirun only cpu steps run (MPI sums host memory)", o->step_path,
                         r->lib.rt.backend_name());
    if (r->lib.host_state)
        return train_err(r->s, "%s keeps its optimizer state on the host (sbpc --offload "
                         "optimizer), which does not run under mpirun yet", o->step_path);
    const int64_t K = o->grad_accum;
    int64_t rows_all = -1;
    if (o->ids_path) { /* the files' rows; a bad file is the source's to report */
        sbpio_array a;
        rows_all = K * in->batch * d->groups;
        if (sbpio_npy_read(o->ids_path, &a, err, sizeof err) == SBPIO_OK) {
            if (a.rank == 2)
                rows_all = a.shape[0];
            sbpio_array_free(&a);
        }
    }
    if (train_dist_plan_rows(d, in, rows_all, K, pairs, err, sizeof err))
        return train_err(r->s, "%s: %s", o->step_path, err);
    r->gin.batch = d->G;
    return 0;
}

/* The objective's inputs: the files' (--ref-logps, ...), or a dataset's own reference. */
static int open_inputs(train_run *r)
{
    const train_config *o = &r->c;
    const sbp_step_info *in = r->lib.in;
    const train_source *src = &r->src;
    const bool grpo_ds = src->have_ds && strcmp(src->ds.d.task, "grpo") == 0;
    const bool self_ref = src->have_ds && (src->ds.pairs || grpo_ds);
    char err[512];
    if (src->have_ds && !self_ref && o->compute_logps)
        return train_err(r->s, "--compute-logps scores the examples of a dpo or grpo step (the "
                         "step here is %s)", in->objective ? in->objective : "sft");
    if (self_ref && o->advantages)
        return train_err(r->s, "--advantages: with --dataset GRPO's advantages are the "
                         "dataset's (sbp-prepare --task grpo)");
    if (grpo_ds && !o->compute_logps && train_dataset_no_advantage(&src->ds))
        return train_err(r->s, "--dataset: %s: every advantage is 0 (each group has one row, "
                         "or equal rewards): GRPO would train nothing; sample several "
                         "completions per prompt", o->dataset.path);
    if (o->ref_cache && !self_ref)
        return train_err(r->s, "--ref-cache keeps the reference log-probs of a dpo or grpo "
                         "dataset; %s is %s %s dataset, which has none", o->dataset.path,
                         src->have_ds && src->ds.d.task[0] == 's' ? "an" : "a",
                         src->have_ds ? src->ds.d.task : "no");
    if (self_ref && o->old_logps && !grpo_ds)
        return train_err(r->s, "--old-logps is an input of GRPO steps; the step's objective is "
                         "dpo (it takes --ref-logps only)");
    if (self_ref && grpo_ds && o->ref_logps && in->beta == 0)
        train_note(r->s, "--ref-logps is not used: the step's beta is 0 (no KL term)");
    if ((self_ref ? ti_open_self_ref(&r->ti, &r->gin, o->grad_accum, o->old_logps != NULL,
                                     r->s, err, sizeof err)
                  : ti_open(&r->ti, &r->gin, o->grad_accum, o->ref_logps, o->old_logps,
                            o->advantages, r->s, err, sizeof err)) ||
        (o->ids_path && ti_check(&r->ti, src->labels, o->labels_path, err, sizeof err)))
        return train_err(r->s, "%s", err);
    if (!self_ref)
        return 0;
    r->have_refs = true;
    return train_steplib_want_logps(&r->lib, r->s) ||
           train_refs_alloc(&r->refs, &src->ds, grpo_ds, r->s);
}

/* The step, the data and the objective's inputs, checked against each other. */
static int open_step_and_data(train_run *r)
{
    train_config *o = &r->c;
    char err[512];
    if (train_steplib_open(&r->lib, o->step_path, r->s))
        return -1;
    const sbp_step_info *in = r->lib.in;
    const bool pairs = in->objective && strcmp(in->objective, "dpo") == 0;
    /* a packed step takes document ids, and only a packed step does */
    if (train_pack_check_step(&o->pack, in, o->step_path, err, sizeof err))
        return train_err(r->s, "%s", err);
    if ((o->eval.data || o->eval.dataset) && open_eval(r))
        return -1;
    if (plan_ranks(r, pairs) ||
        train_source_open(&r->src, o, in, &r->gin, o->grad_accum, &o->steps, r->s))
        return -1;
    if (r->src.have_ds && train_dataset_check_model(&r->src.ds, o->model_path, err, sizeof err))
        return train_err(r->s, "%s", err);
    if (open_inputs(r))
        return -1;
    if (r->lib.sp > 1 &&
        !(r->sp_stage = malloc((size_t)(in->batch * r->lib.sp_tl) * sizeof *r->sp_stage)))
        return train_err(r->s, "out of memory");
    if (!in->packed)
        return 0;
    if (!(r->mb_doc_ids = malloc((size_t)(in->batch * in->seq_len) * sizeof *r->mb_doc_ids)))
        return train_err(r->s, "out of memory");
    return train_source_open_packed(&r->src, r->s);
}

/* The contexts, then the model against the step, and the export plans (before any training). */
static int open_model(train_run *r)
{
    const train_config *o = &r->c;
    const sbp_step_info *in = r->lib.in;
    char err[512];
    if (train_steplib_start(&r->lib, (int)o->threads, r->s) ||
        train_model_import(&r->mdl, o->model_path, &r->inputs, r->s) ||
        /* the files the import read (its external data) against the outputs */
        check_outputs(o, &r->pre, &r->inputs, r->s) || train_model_match(&r->mdl, o, in, r->s))
        return -1;
    /* a cuda step's gradients are summed on the GPUs (NCCL), once its context exists */
    if (r->dist->on && !r->lib.host_visible && train_dist_nccl_start(r->dist, err, sizeof err))
        return train_err(r->s, "%s", err);
    /* sequence parallelism: the step exchanges heads through its context's communicator */
    if (r->dist->sp_mpi) {
        sbprt_comm c;
        if (!r->lib.host_visible && train_dist_seq_nccl(r->dist, err, sizeof err))
            return train_err(r->s, "%s", err);
        train_dist_seq_comm(r->dist, !r->lib.host_visible, &c);
        int st = c.alltoall ? r->lib.set_comm(r->lib.rt.step_ctx, &c) : SBPRT_ERR_INVALID;
        if (st)
            return train_err(r->s, "%s: cannot give the step its communicator: %s",
                             o->step_path, r->lib.rt.status_string(st));
    }
    if ((o->save_safetensors || o->pretrained.dir) &&
        !(r->export = train_export_plan_lora(r->mdl.g, in, o->adapter.merge, r->s, err,
                                             sizeof err)))
        return train_err(r->s, "%s: %s", o->save_safetensors ? "--save-safetensors"
                                                             : "--save-pretrained", err);
    /* --merge-lora: which initializer each adapter updates */
    if (o->adapter.merge &&
        !(r->merge = train_adapter_merge_plan_make(r->mdl.g, in, err, sizeof err)))
        return train_err(r->s, "--merge-lora: %s", err);
    return 0;
}

/* The arena; the model's weights copied in (and the model freed), m and v zeroed, and the
 * step's own preparation (a cuda step uploads its constants), outside any timing. */
static int open_memory(train_run *r)
{
    const train_config *o = &r->c;
    const train_steplib *L = &r->lib;
    const sbp_step_info *in = L->in;
    char why[400];
    /* --zero 1|2 under mpirun keeps this rank's slice of m and v only */
    r->dist->zero = (int)o->zero;
    if (train_dist_plan_slices(r->dist, in, why, sizeof why))
        return train_err(r->s, "%s", why);
    /* evaluation runs in the training workspace (its plan is usually the smaller) */
    const train_mem_need need = {
        .ws_bytes = L->eval && in->eval_workspace_bytes > in->workspace_bytes
                        ? in->eval_workspace_bytes : in->workspace_bytes,
        .state_elems = train_dist_state_elems(r->dist), .adamw = o->adamw,
        .ref = r->ti.mb_ref != NULL, .old = r->ti.mb_old != NULL, .adv = r->ti.mb_adv != NULL,
        .doc_ids = r->src.doc_ids != NULL, .host_budget = o->host_budget};
    if (train_mem_alloc(&r->mem, L, &need, r->s))
        return -1;
    memset(r->mem.host_params, 0, r->mem.pbytes);
    train_model_copy_weights(&r->mdl, o, in, r->mem.host_params, r->s);
    train_model_free(&r->mdl); /* the weights are in the block now */
    if (train_mem_upload(&r->mem, L, r->s) || train_mem_zero_state(&r->mem, L, r->s))
        return -1;
    int st;
    if (L->rt.step_init && (st = L->rt.step_init(L->rt.step_ctx)))
        return train_err(r->s, "preparing the step (sbp_step_init) failed: %s%s",
                         L->rt.status_string(st),
                         train_steplib_why(L, L->rt.step_ctx, why, sizeof why));
    return 0;
}

/* Checkpoints: --resume overwrites the weights, m, v and the data position. Under ZeRO a
 * checkpoint still holds the whole moments: a resume reads this rank's slice of them, and rank
 * 0 writes the ranks' slices as they arrive. */
static int open_checkpoints(train_run *r)
{
    const train_config *o = &r->c;
    const train_steplib *L = &r->lib;
    train_dist *d = r->dist;
    const bool sliced = d->on && d->zero > 0 && o->adamw && r->ckpt.dir;
    d->state_sliced = sliced;
    d->state_m = r->mem.d_m;
    d->state_v = r->mem.d_v;
    const size_t gtok = (size_t)(r->gin.batch * L->in->seq_len); /* the global micro-batch */
    char ckpt_err[1024], pack_id[64]; /* the packing is part of the run's identity */
    train_pack_identity(&o->pack, r->src.doc_ids, (size_t)o->grad_accum * gtok, pack_id,
                        sizeof pack_id);
    if (r->src.have_ds && r->src.ds.packed) /* a dataset's examples, packed next-fit */
        snprintf(pack_id, sizeof pack_id, "next-fit");
    if (train_ckpt_start(&r->ckpt, &(train_ckpt_run){
            .in = L->in, .step_path = o->step_path, .adamw = o->adamw,
            .grad_accum = o->grad_accum, .total_steps = o->steps, .lr = o->lr,
            .weight_decay = o->weight_decay, .sched = &o->sched,
            .dump_grads = o->dump_grads != NULL,
            .shard = r->src.have_shard ? &r->src.shard : NULL, .ids = r->src.ids,
            .labels = r->src.labels, .dataset = r->src.have_ds ? &r->src.ds : NULL,
            .ntok_all = (size_t)(r->ti.N * L->in->seq_len) /* the global batch */,
            .pbytes = r->mem.pbytes, .gbytes = r->mem.gbytes, .d_params = r->mem.d_params,
            .d_m = r->mem.d_m, .d_v = r->mem.d_v, .host_params = r->mem.host_params,
            .ranks = d->size, .seq_parallel = d->sp,
            .threads = train_steplib_threads(L, o->threads),
            .state_fill = sliced ? train_dist_fill_state : NULL, .state_arg = d,
            .state_lo = d->lo, .state_n = d->hi - d->lo, /* ZeRO's slice */
            .host_visible = L->host_visible || L->host_state, /* the state's memory */
            .copy = L->rt.copy, .copy_ctx = *L->rt.copy_ctx,
            .note = r->s, .packing = pack_id}, ckpt_err, sizeof ckpt_err))
        return train_err(r->s, "%s", ckpt_err);
    if (d->on && d->rank != 0) /* rank 0 alone writes checkpoints */
        r->ckpt.dir = NULL;
    return 0;
}

int train_run_open(train_run **out, const train_config *c, train_dist *dist,
                   const train_sink *s)
{
    train_run *r = *out = calloc(1, sizeof *r);
    if (!r)
        return train_err(s, "out of memory");
    r->c = *c;
    r->launches = -1;
    if (s)
        r->sink = *s;
    r->s = &r->sink;
    r->solo = (train_dist){.size = 1};
    r->dist = dist ? dist : &r->solo;
    r->optim = (train_optim){.adamw = c->adamw, .weight_decay = c->weight_decay,
                             .clip = c->sched.clip};
    if (open_files(r) || open_step_and_data(r) || open_model(r) || open_memory(r))
        return -1;
    if (train_rewards_open(&r->rewards, r->lib.in))
        return train_err(r->s, "out of memory");
    /* the reference log-probs, from the model's initial weights: before a resume restores
     * later ones (GRPO needs them only with a KL term, beta > 0) */
    if (r->have_refs && (!r->refs.grpo || r->ti.ref || r->c.compute_logps) &&
        train_refs_compute(&r->refs, &r->c, &r->lib, &r->mem, &r->src.ds, r->dist, r->s))
        return -1;
    if (r->have_refs && r->ti.old &&
        train_refs_load_old(&r->refs, r->c.old_logps, &r->src.ds, r->s))
        return -1;
    if (r->refs.logps_only)
        return 0;
    char err[512];
    if (open_checkpoints(r) || (r->lib.host_state && train_mem_upload(&r->mem, &r->lib, r->s)))
        return -1; /* (a resume restored the masters: the step's block from them) */
    r->next = train_ckpt_first_step(&r->ckpt); /* > 1 when resumed */
    r->src.epoch0 = r->src.shard.epoch;
    if (train_log_open(&r->log, r->c.sched.log_path, r->next > 1 ? r->next - 1 : -1, err,
                       sizeof err))
        return train_err(r->s, "%s", err);
    return 0;
}

void train_run_close(train_run *r)
{
    if (!r)
        return;
    train_ckpt_free(&r->ckpt);
    char log_err[512]; /* a run that failed keeps the steps it logged */
    (void)train_log_close(&r->log, log_err, sizeof log_err);
    train_mem_free(&r->mem, &r->lib);
    train_steplib_stop(&r->lib);
    free(r->mb_doc_ids);
    free(r->sp_stage);
    train_eval_close(&r->ev);
    ti_free(&r->ti);
    train_source_close(&r->src);
    train_refs_free(&r->refs);
    train_rewards_free(&r->rewards);
    train_model_free(&r->mdl);
    train_export_free(r->export);
    train_pretrained_free(&r->pre);
    train_adapter_merge_plan_free(r->merge);
    sbp_file_set_free(&r->inputs);
    free(r);
}

const sbp_step_info *train_run_info(const train_run *r) { return r->lib.in; }
const train_config *train_run_config(const train_run *r) { return &r->c; }
bool train_run_logps_only(const train_run *r) { return r->refs.logps_only; }
int64_t train_run_next_step(const train_run *r) { return r->next; }
bool train_run_done(const train_run *r) { return r->next > r->c.steps || r->ckpt.stopped; }

int train_run_weights(train_run *r, const float **params)
{
    *params = NULL;
    if (!r->mem.arena)
        return train_err(r->s, "the run has no weights yet (it did not open)");
    if (!r->lib.host_visible && !r->lib.host_state &&
        train_steplib_copy(&r->lib, r->mem.host_params, r->mem.d_params, r->mem.pbytes,
                           SBPRT_COPY_DEVICE_TO_HOST, r->s))
        return -1;
    *params = r->mem.host_params;
    return 0;
}

/* ------------------------------------------------------------------ a step */

/* Micro-batch k's rows, document ids and objective inputs into the arena; the padded DPO
 * pairs on this rank go to *pad_pairs. */
/* Host token arrays [B, T] (the whole rows) to the step's memory: a sequence-parallel step
 * takes this rank's columns [s*tl, (s+1)*tl) of each row, cut out into r->sp_stage. */
static int copy_rows(train_run *r, void *dst, const int32_t *src)
{
    const train_steplib *L = &r->lib;
    const int64_t B = L->in->batch, T = L->in->seq_len, tl = L->sp_tl;
    const int h2d = SBPRT_COPY_HOST_TO_DEVICE;
    if (L->sp <= 1)
        return train_steplib_copy(L, dst, src, (size_t)(B * T) * sizeof *src, h2d, r->s);
    const int64_t off = (int64_t)r->dist->sp_rank * tl;
    for (int64_t b = 0; b < B; b++)
        memcpy(r->sp_stage + b * tl, src + b * T + off, (size_t)tl * sizeof *src);
    return train_steplib_copy(L, dst, r->sp_stage, (size_t)(B * tl) * sizeof *src, h2d, r->s);
}

static int load_micro(train_run *r, int64_t k, int64_t *pad_pairs)
{
    const train_steplib *L = &r->lib;
    const sbp_step_info *in = L->in;
    train_inputs *ti = &r->ti;
    train_mem *m = &r->mem;
    const int64_t B = in->batch;
    const size_t ntok = (size_t)(B * in->seq_len);
    const int h2d = SBPRT_COPY_HOST_TO_DEVICE;
    if (r->dist->on) /* this rank's rows of the global micro-batch */
        *pad_pairs += train_dist_micro(r->dist, ti, r->src.ids, r->src.labels, k);
    else
        ti_micro(ti, r->src.ids, r->src.labels, k);
    if (r->src.doc_ids) { /* the micro-batch's document ids, in its row order */
        if (r->dist->on) /* this rank's rows of the global batch's, as its ids above */
            train_dist_micro_docs(r->dist, ti, r->src.doc_ids, r->mb_doc_ids, k);
        else
            train_pack_micro(r->src.doc_ids, r->mb_doc_ids, r->c.grad_accum * B, B, in->seq_len,
                             k, ti->dpo);
        if (copy_rows(r, m->d_doc_ids, r->mb_doc_ids))
            return -1;
    }
    return copy_rows(r, m->d_ids, ti->mb_ids) || copy_rows(r, m->d_labels, ti->mb_labels) ||
                   (ti->mb_ref && train_steplib_copy(L, m->d_ref, ti->mb_ref,
                                                     (ti->dpo ? (size_t)(B * ti->W) : ntok) *
                                                         sizeof(float),
                                                     h2d, r->s)) ||
                   (ti->mb_old &&
                    train_steplib_copy(L, m->d_old, ti->mb_old, ntok * sizeof(float), h2d, r->s)) ||
                   (ti->mb_adv && train_steplib_copy(L, m->d_adv, ti->mb_adv,
                                                     (size_t)(B * ti->W) * sizeof(float), h2d,
                                                     r->s))
               ? -1
               : 0;
}

/* The K micro-batches, the gradients accumulated with the whole batch's denominator; *loss
 * their sum; *aux_loss (a MoE step) the mean of their load-balancing losses (each micro-batch's
 * counts its own rows, as transformers' per forward); a failed status names the step (and the
 * micro-batch). */
static int run_micro_batches(train_run *r, int64_t s, double denominator, double *loss,
                             double *aux_loss, int64_t *pad_pairs)
{
    const train_steplib *L = &r->lib;
    const train_rt *rt = &L->rt;
    train_inputs *ti = &r->ti;
    train_mem *m = &r->mem;
    const int64_t K = r->c.grad_accum;
    char why[400];
    int st = SBPRT_OK;
    int64_t micro = 0; /* after a failure: the failed micro-batch's number, from 1 */
    train_rewards_begin(&r->rewards);
    const bool moe = L->in->moe_layers > 0;
    *aux_loss = moe ? 0 : NAN;
    for (*loss = 0; micro < K && st == SBPRT_OK; micro++) {
        if (load_micro(r, micro, pad_pairs))
            return -1;
        double micro_loss = NAN, micro_aux = 0;
        sbp_step_args args = {
            .params = m->step_params, .grads = m->step_grads, .accumulate = micro > 0,
            .input_ids = m->d_ids, .labels = m->d_labels, .denominator = denominator,
            .workspace = m->workspace, .host_workspace = m->host_ws, .loss = &micro_loss,
            .ref_logps = ti->mb_ref ? m->d_ref : NULL, .old_logps = ti->mb_old ? m->d_old : NULL,
            .advantages = ti->mb_adv ? m->d_adv : NULL,
            .doc_ids = m->d_doc_ids, /* NULL unless the step is packed */
            .row_logps = train_rewards_out(&r->rewards), /* DPO: host memory */
            .aux_loss = moe ? &micro_aux : NULL,
        };
        st = L->run(rt->step_ctx, &args);
        if (!st)
            st = rt->sync(*rt->sync_ctx);
        *loss += micro_loss;
        if (moe)
            *aux_loss += micro_aux;
        if (!st)
            train_rewards_add(&r->rewards, ti->mb_ref, ti->mb_labels, r->mb_doc_ids);
    }
    if (moe)
        *aux_loss /= (double)K;
    if (!st) /* --offload optimizer: the gradients to the host, where the update runs */
        return train_mem_fetch_grads(m, L, r->s);
    char mb[64] = "";
    if (K > 1)
        snprintf(mb, sizeof mb, " (micro-batch %lld of %lld)", (long long)micro, (long long)K);
    train_err(r->s, "step %lld%s: the step failed: %s%s%s", (long long)s, mb,
              rt->status_string(st),
              st == SBPRT_ERR_RANGE ? " (a token id or label outside the vocabulary)" : "",
              train_steplib_why(L, rt->step_ctx, why, sizeof why));
    if (st == SBPRT_ERR_NOMEM)
        train_mem_step_nomem(m, L, r->s);
    return -1;
}

/* The sums over the ranks (a padded DPO pair's ln 2 taken out first; ZeRO 2 keeps its slice of
 * the gradients only, except for the first step's --dump-grads), and the loss checked finite. */
static int reduce_loss(train_run *r, int64_t s, double denominator, int64_t pad_pairs,
                       double *loss)
{
    const train_config *o = &r->c;
    train_dist *d = r->dist;
    char err[512];
    if (d->on) {
        if (train_dist_injected_failure(d, s))
            return train_err(r->s, "step %lld: a failure injected by the tests "
                             "(SBP_TEST_FAIL_RANK)", (long long)s);
        *loss -= (double)pad_pairs * log(2.0) / denominator;
        if (train_dist_reduce(d, r->mem.d_grads, loss, s == 1 && o->dump_grads, err, sizeof err))
            return train_err(r->s, "step %lld: %s", (long long)s, err);
    }
    if (!isfinite(*loss))
        return train_err(r->s, "step %lld: the loss is %s; stopping before the update%s",
                         (long long)s, isnan(*loss) ? "NaN" : "infinite",
                         o->save ? " (nothing saved)" : "");
    return 0;
}

/* This step's tokens and time into the window; the window's tokens/s. */
static double rate_add(train_run *r, double tokens, double dt)
{
    r->rate.head = (r->rate.head + 1) % RATE_STEPS;
    r->rate.tok[r->rate.head] = tokens;
    r->rate.dt[r->rate.head] = dt;
    if (r->rate.n < RATE_STEPS)
        r->rate.n++;
    double tok = 0, t = 0;
    for (int i = 0; i < r->rate.n && t < RATE_SPAN_S; i++) {
        const int k = (r->rate.head - i + RATE_STEPS) % RATE_STEPS;
        tok += r->rate.tok[k];
        t += r->rate.dt[k];
    }
    return t > 0 ? tok / t : 0;
}

/* --dump-grads: step 1's gradients, written by rank 0. */
static int dump_first(train_run *r, int64_t s, double loss)
{
    const train_config *o = &r->c;
    const train_steplib *L = &r->lib;
    if (s != 1 || !o->dump_grads)
        return 0;
    if (!L->host_visible && !L->host_state &&
        train_steplib_copy(L, r->mem.host_grads, r->mem.d_grads, r->mem.gbytes,
                           SBPRT_COPY_DEVICE_TO_HOST, r->s))
        return -1;
    if (r->dist->rank == 0 && train_write_grads(o->dump_grads, L->in, r->mem.host_grads, loss, r->s))
        return -1;
    return 0;
}

/* Device launches queued so far on the step's contexts (sbprt_ctx_launches), or -1 when the
 * step's runtime does not count them. */
static int64_t step_launches(const train_steplib *L)
{
    const train_rt *rt = &L->rt;
    if (!rt->ctx_launches)
        return -1;
    unsigned long long n = rt->ctx_launches(rt->step_ctx);
    if (rt->own_ctx && rt->own_ctx != rt->step_ctx)
        n += sbprt_ctx_launches(rt->own_ctx);
    return (int64_t)n;
}

int train_run_step(train_run *r, train_step_stats *st)
{
    const int64_t s = r->next;
    *st = (train_step_stats){.step = s, .eval_loss = NAN, .aux_loss = NAN};
    if (train_source_next(&r->src, s, r->s))
        return -1;
    if (r->src.row_ex || r->src.doc_ex) /* a DPO / GRPO dataset's: reference, advantages */
        train_refs_fill(&r->refs, &r->src, &r->ti);
    const int64_t l0 = step_launches(&r->lib);
    double t0 = train_log_now();
    const double denominator = ti_denominator(&r->ti, r->src.labels, r->src.doc_ids);
    int64_t pad_pairs = 0; /* DPO pairs of padding on this rank */
    char err[512];
    if (run_micro_batches(r, s, denominator, &st->loss, &st->aux_loss, &pad_pairs) ||
        reduce_loss(r, s, denominator, pad_pairs, &st->loss))
        return -1;
    if (train_rewards_finish(&r->rewards, r->dist, denominator, &st->rewards, err, sizeof err))
        return train_err(r->s, "step %lld: %s", (long long)s, err);
    double t_run = train_log_now() - t0; /* the dump is not the step's time */
    if (dump_first(r, s, st->loss))
        return -1;
    st->lr = train_sched_lr(&r->c.sched, r->c.lr, s, r->c.steps);
    t0 = train_log_now();
    if (train_optim_update(&r->optim, &r->lib, &r->mem, r->dist, s, st->lr, &st->grad_norm, r->s) ||
        (r->lib.host_state && train_mem_upload(&r->mem, &r->lib, r->s)))
        return -1;
    train_mem_sample(&r->mem, &r->lib);
    const int64_t l1 = step_launches(&r->lib);
    r->launches = l0 >= 0 && l1 >= 0 ? l1 - l0 : -1;
    double dt = t_run + (train_log_now() - t0);
    /* the global batch's tokens (all ranks'; ti.N = K*G), over the window of steps */
    st->tokens_per_s = rate_add(r, (double)r->ti.N * (double)r->lib.in->seq_len, dt);
    return 0;
}

/* ------------------------------------------------------------------ the end of a step */

/* Evaluation after step s: the step's forward-only entry point on the held-out batches, with
 * the denominator 1 so that each batch's loss is the sum of its token losses (for a mean and
 * for a graph's summed loss alike); *out = their total over the scored tokens of all. One "out"
 * line 'eval step N loss X ppl Y ...'. */
static int run_eval(train_run *r, int64_t s, double *out)
{
    const train_steplib *L = &r->lib;
    const train_rt *rt = &L->rt;
    const sbp_step_info *in = L->in;
    train_eval *ev = &r->ev;
    train_mem *m = &r->mem;
    const size_t ntok = (size_t)(in->batch * in->seq_len);
    char err[512], why[400];
    double sum = 0, t0 = train_log_now();
    int64_t scored = 0;
    train_eval_rewind(ev);
    for (int64_t k = 0; k < ev->K; k++) {
        if (train_eval_next(ev, err, sizeof err))
            return train_err(r->s, "step %lld: evaluation batch %lld: %s", (long long)s,
                             (long long)k + 1, err);
        if (copy_rows(r, m->d_ids, ev->ids) || copy_rows(r, m->d_labels, ev->labels) ||
            (in->packed && ev->doc_ids && copy_rows(r, m->d_doc_ids, ev->doc_ids)))
            return -1;
        double batch_sum = NAN;
        int64_t n = 0;
        sbp_step_args args = {.params = m->step_params, .input_ids = m->d_ids,
                              .labels = m->d_labels, .denominator = 1.0, /* the sum */
                              .workspace = m->workspace, .loss = &batch_sum, .n_scored = &n,
                              .doc_ids = in->packed ? m->d_doc_ids : NULL};
        int st = L->eval(rt->step_ctx, &args);
        if (!st)
            st = rt->sync(*rt->sync_ctx);
        if (st)
            return train_err(r->s, "step %lld: evaluation batch %lld failed: %s%s%s",
                             (long long)s, (long long)k + 1, rt->status_string(st),
                             st == SBPRT_ERR_RANGE ? " (a token id or label outside the "
                                                     "vocabulary)" : "",
                             train_steplib_why(L, rt->step_ctx, why, sizeof why));
        if (r->dist->sp_mpi) { /* this rank's tokens' share: the group's sum is the rows' */
            double part[2] = {batch_sum, (double)n};
            if (train_dist_seq_sum(r->dist, part, 2, err, sizeof err))
                return train_err(r->s, "step %lld: evaluation: %s", (long long)s, err);
            batch_sum = part[0];
            n = (int64_t)part[1];
        }
        sum += batch_sum;
        scored += n;
    }
    double dt = train_log_now() - t0;
    if (scored == 0) {
        train_say(r->s, "note", "step %lld: the evaluation batches have no scored token",
                  (long long)s);
        return 0;
    }
    *out = sum / (double)scored;
    train_say(r->s, "out", "eval step %lld loss %.6f ppl %.4f (%lld batches, %lld scored tokens, "
              "%.1f tokens/s)", (long long)s, *out, exp(*out), (long long)ev->K,
              (long long)scored, dt > 0 ? (double)ntok * (double)ev->K / dt : 0.0);
    if (!isfinite(*out))
        return train_err(r->s, "step %lld: the evaluation loss is %s", (long long)s,
                         isnan(*out) ? "NaN" : "infinite");
    return 0;
}

int train_run_end_step(train_run *r, train_step_stats *st)
{
    const train_config *o = &r->c;
    train_dist *d = r->dist;
    const int64_t s = st->step;
    char err[1024];
    if (train_eval_due(&o->eval, s, o->steps) && run_eval(r, s, &st->eval_loss))
        return -1;
    if (train_log_step(&r->log, s, st->loss, st->lr, st->grad_norm, st->tokens_per_s,
                       st->eval_loss, st->aux_loss, &st->rewards, err, sizeof err))
        return train_err(r->s, "step %lld: %s", (long long)s, err);
    /* the signal this step acts on, read once: under mpirun the ranks' combined one, so that
     * every rank decides alike whether a checkpoint is due */
    int sig = train_ckpt_stop_signal();
    if (d->on) {
        sig = train_dist_max(d, sig);
        train_ckpt_request_stop(sig);
    }
    if (train_ckpt_after_step(&r->ckpt, s, sig, err, sizeof err))
        return train_err(r->s, "%s", err);
    /* ZeRO: the other ranks' moment slices go to rank 0 as it writes them */
    if (d->state_sliced && d->rank != 0 && train_ckpt_due(&o->ckpt, s, o->steps, sig) &&
        train_dist_send_state(d, err, sizeof err))
        return train_err(r->s, "step %lld: %s", (long long)s, err);
    if (d->on) /* rank 0 stopped by a signal stops every rank */
        r->ckpt.stopped = train_dist_any(d, r->ckpt.stopped);
    r->next = s + 1;
    return 0;
}

/* ------------------------------------------------------------------ the outputs */

/* The writers, on the fp32 view of the parameters (in, host32). */
static int write_outputs(train_run *r, const sbp_step_info *in, const float *host32)
{
    const train_config *o = &r->c;
    char err[1024];
    if (o->save) {
        float *merged = NULL; /* --merge-lora: W + (alpha/r)·B·A, a copy */
        if (r->merge && !(merged = malloc(in->param_elems * sizeof(float) + 1)))
            return train_err(r->s, "--merge-lora: out of memory");
        if (merged)
            train_adapter_merge(r->merge, in, host32, merged);
        int bad = train_write_onnx(o, in, merged ? merged : host32, r->s);
        free(merged);
        if (bad)
            return -1;
        if (r->merge)
            train_say(r->s, "out", "merged the LoRA adapters into %d weights (scaling %g = %g / "
                      "%lld)", train_adapter_merge_count(r->merge),
                      in->lora_alpha / (double)in->lora_rank, in->lora_alpha,
                      (long long)in->lora_rank);
        train_say(r->s, "out", "saved the trained weights to %s", o->save);
    }
    if (o->save_safetensors) {
        if (train_export_write_lora(r->export, in, host32, r->merge, o->save_safetensors, err,
                                    sizeof err))
            return train_err(r->s, "--save-safetensors: %s", err);
        train_say(r->s, "out", "saved the trained weights as %d PyTorch tensors to %s",
                  train_export_count(r->export), o->save_safetensors);
    }
    if (o->pretrained.dir) { /* a model folder for from_pretrained */
        if (train_pretrained_write(&r->pre, &o->pretrained, r->export, in, host32, r->merge, err,
                                   sizeof err))
            return train_err(r->s, "%s", err);
        train_say(r->s, "out", "saved the trained model (%d files: config, %d weights%s) to %s",
                  r->pre.n_names, train_export_count(r->export),
                  r->pre.n_tok ? ", tokenizer" : "", o->pretrained.dir);
    }
    if (o->adapter.save_dir) { /* PEFT's adapter directory */
        int n_saved = 0;
        if (train_adapter_save(&o->adapter, in, host32, &n_saved, err, sizeof err))
            return train_err(r->s, "%s", err);
        train_say(r->s, "out", "saved %d LoRA adapter tensors (PEFT) to %s", n_saved,
                  o->adapter.save_dir);
    }
    return 0;
}

/* The weights back from a device, in fp32, checked finite, then written. */
static int save_all(train_run *r)
{
    const train_config *o = &r->c;
    const train_steplib *L = &r->lib;
    const sbp_step_info *in = L->in;
    if (!o->save && !o->save_safetensors && !o->adapter.save_dir && !o->pretrained.dir)
        return 0;
    if (!L->host_visible && !L->host_state &&
        train_steplib_copy(L, r->mem.host_params, r->mem.d_params, r->mem.pbytes,
                           SBPRT_COPY_DEVICE_TO_HOST, r->s))
        return -1;
    train_f32_view view = {.info = *in};
    if (train_f32_view_make(&view, o, in, r->mem.host_params, r->s))
        return -1;
    const float *host32 = view.block ? view.block : r->mem.host_params;
    if (view.block)
        in = &view.info;
    /* nothing non-finite leaves the run (a cuda step's weights are checked only here) */
    char err[1024];
    int rc = train_finite_check(in, TRAIN_BLOCK_PARAMS, host32, 0, in->param_elems, false,
                                "the trained weights", err, sizeof err)
                 ? train_err(r->s, "%s: nothing saved", err)
                 : write_outputs(r, in, host32);
    train_f32_view_free(&view);
    return rc;
}

int train_run_finish(train_run *r, train_report *rep)
{
    const train_config *o = &r->c;
    const sbp_step_info *in = r->lib.in;
    const train_mem *m = &r->mem;
    *rep = (train_report){.stopped = r->ckpt.stopped};
    if (r->ckpt.stopped) /* stopped by a signal: the checkpoint is the output */
        return 0;
    if (save_all(r))
        return -1;
    if (o->dump_grads)
        train_say(r->s, "out", "wrote the first step's gradients to %s", o->dump_grads);
    rep->host_visible = r->lib.host_visible;
    rep->planned_bytes = in->planned_peak_bytes;
    rep->opt_state_bytes = o->adamw && !m->host_state ? 2 * m->mbytes : 0; /* the device's */
    rep->host_bytes = in->host_bytes; /* and --offload optimizer's masters, gradients, m, v */
    if (m->host_state)
        rep->host_bytes += m->pbytes + m->gbytes + 2 * m->mbytes + m->step_pbytes; /* staging */
    rep->opt_state_full = o->adamw ? 2 * m->gbytes : 0;
    rep->dev_known = m->dev_mem && m->dev_peak >= m->dev_before;
    rep->dev_used = rep->dev_known ? m->dev_peak - m->dev_before : 0;
    rep->dev_peak = m->dev_peak;
    rep->dev_total = m->dev_total;
    rep->launches = r->launches;
    rep->data_parallel = r->dist->on;
    rep->ranks = r->dist->on ? r->dist->size : 1;
    rep->seq_parallel = r->dist->sp_mpi ? r->dist->sp : 0;
    rep->row_tokens = r->lib.in->seq_len;
    rep->zero = r->dist->zero;
    rep->global_rows = r->gin.batch;
    rep->seq_len = in->seq_len;
    if (r->src.n_rows > 0 && r->src.pairs_full > 0) {
        rep->docs = r->src.n_docs;
        rep->rows = r->src.n_rows;
        rep->pairs_packed = r->src.pairs_packed;
        rep->pairs_full = r->src.pairs_full;
    }
    return 0;
}
