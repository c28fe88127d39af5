/* train_model.c — the model a step was compiled from, against the step (train_model.h): its
 * initializers checked parameter by parameter and copied into the parameter block; and the
 * block's weights and gradients written back out in the model's own layouts (an ONNX copy,
 * --dump-grads as safetensors).
 */
#include "train_model.h"
#include "train_adapter.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* An error line printed only when `report`. */
#define MISMATCH(...) ((void)(report ? train_err(s, __VA_ARGS__) : 0))

/* The model's value for step parameter p, checked: a float32 initializer of p's shape. NULL
 * (with an error line when `report`: the first few of a long list) when it does not match. */
static const ir_value *match_param(const ir_graph *g, const sbp_step_param *p, const char *model,
                                   const char *step, bool report, const train_sink *s)
{
    char want[256], have[256];
    const ir_value *v = ir_value_find(g, p->name);
    if (!v || (v->kind != IR_VAL_PARAM && v->kind != IR_VAL_CONST)) {
        MISMATCH("%s does not match %s: the step's parameter '%s' is not an initializer "
                 "of the model", model, step, p->name);
        return NULL;
    }
    if (v->dtype != IR_DT_FLOAT) {
        MISMATCH("%s does not match %s: initializer '%s' is %s, but the step trains it "
                 "as f32", model, step, p->name, ir_dtype_name(v->dtype));
        return NULL;
    }
    bool same = v->rank == p->rank;
    int64_t vd[IR_MAX_RANK];
    for (int d = 0; d < v->rank && d < IR_MAX_RANK; d++) {
        vd[d] = v->dims[d].value;
        same = same && vd[d] == p->dims[d];
    }
    if (!same) {
        MISMATCH("%s does not match %s: initializer '%s' has shape %s but the step was "
                 "compiled for %s", model, step, p->name,
                 train_shape_str(have, sizeof have, v->rank < 0 ? 0 : v->rank, vd),
                 train_shape_str(want, sizeof want, p->rank, p->dims));
        return NULL;
    }
    /* A re-tied copy has no storage in the step: its data is only compared with its owner's. */
    if ((!v->data || v->nbytes != p->numel * sizeof(float)) && p->tied_to < 0) {
        MISMATCH("%s: initializer '%s' has no data (%zu bytes for %zu floats)", model,
                 p->name, v->nbytes, p->numel);
        return NULL;
    }
    return v;
}

void train_model_free(train_model *m)
{
    free(m->vals);
    ir_graph_free(m->g);
    ir_diag_free(&m->diag);
    memset(m, 0, sizeof *m);
}

int train_model_import(train_model *m, const char *path, sbp_file_set *inputs,
                       const train_sink *s)
{
    memset(m, 0, sizeof *m);
    ir_diag_init(&m->diag, path);
    m->g = ir_import_onnx(path, &m->diag, &(ir_import_options){.files = inputs});
    train_say_ir(s, &m->diag); /* errors, or warnings if any */
    if (!m->g || m->diag.n_errors)
        return train_err(s, "cannot read the model %s", path);
    return 0;
}

int train_model_match(train_model *m, const train_config *o, const sbp_step_info *in,
                      const train_sink *s)
{
    char lora_err[512]; /* a LoRA step's adapters join the model's weights */
    if (train_adapter_init(m->g, in, &o->adapter, lora_err, sizeof lora_err) < 0)
        return train_err(s, "%s", lora_err);
    int rc = 0;

    /* A model with fixed input dims must have the step's (a dynamic one may have any). Token
     * inputs are [B,T]; a leading 1 is let through, as position_ids are often [1,T]. */
    for (int i = 0; i < m->g->n_inputs; i++) {
        const ir_value *x = m->g->inputs[i];
        if (!ir_dtype_is_int(x->dtype) || x->rank != 2)
            continue;
        int64_t want[2] = {in->batch, in->seq_len}, have[2];
        bool clash = false;
        for (int d = 0; d < 2; d++) {
            have[d] = x->dims[d].value;
            clash |= !x->dims[d].sym && have[d] >= 0 && have[d] != want[d] &&
                     !(d == 0 && have[d] == 1);
        }
        if (clash) {
            char hs[64], ws[64];
            rc = train_err(s, "%s does not match %s: its input '%s' has the fixed shape %s, but the "
                       "step was compiled for batch %lld and sequence length %lld (%s)",
                       o->model_path, o->step_path, x->name, train_shape_str(hs, sizeof hs, 2, have),
                       (long long)in->batch, (long long)in->seq_len,
                       train_shape_str(ws, sizeof ws, 2, want));
        }
    }

    m->vals = calloc((size_t)in->n_params + 1, sizeof *m->vals);
    if (!m->vals)
        return train_err(s, "out of memory");
    enum { MAX_REPORTED = 8 }; /* a wholly different model would list every parameter */
    int bad = 0;
    for (int i = 0; i < in->n_params; i++)
        if (!(m->vals[i] = match_param(m->g, &in->params[i], o->model_path, o->step_path,
                                       bad < MAX_REPORTED, s)))
            bad++;
    if (bad > MAX_REPORTED)
        train_err(s, "... and %d more of the step's %d parameters do not match", bad - MAX_REPORTED,
              in->n_params);
    if (bad && in->model_path)
        train_say(s, "note", "%s was compiled from %s", o->step_path, in->model_path);
    return bad ? -1 : rc;
}

/* Copies the model's weights into the parameter block (host memory, [param_elems]); warns
 * where a re-tied copy in the file is not the transpose of its owner. */
void train_model_copy_weights(const train_model *m, const train_config *o,
                              const sbp_step_info *in, float *params, const train_sink *s)
{
    for (int i = 0; i < in->n_params; i++) {
        const sbp_step_param *p = &in->params[i];
        if (p->tied_to < 0) { /* rounded to bf16 where the step keeps it so */
            sbp_step_param_store(p, params, m->vals[i]->data);
            continue;
        }
        const sbp_step_param *own = &in->params[p->tied_to];
        const float *mine = m->vals[i]->data, *owner = m->vals[p->tied_to]->data;
        int64_t r = own->dims[0], c = own->dims[1];
        bool transposed = mine && m->vals[i]->nbytes == p->numel * sizeof(float);
        for (int64_t a = 0; a < r && transposed; a++)
            for (int64_t b = 0; b < c; b++)
                if (memcmp(&mine[b * r + a], &owner[a * c + b], sizeof(float)) != 0) {
                    transposed = false;
                    break;
                }
        if (!transposed)
            train_say(s, "warning", "%s: initializer '%s' is not the transpose of '%s', but %s ties "
                    "them: training starts from '%s' and '%s' follows it", o->model_path,
                    p->name, own->name, o->step_path, own->name, p->name);
    }
}

/* The shortest decimal form of x that reads back as x (as Python's repr), at least 9
 * significant digits so a float32 loss also survives the trip. */
static void repr_double(char *buf, size_t n, double x)
{
    for (int prec = 9; prec <= 17; prec++) {
        snprintf(buf, n, "%.*g", prec, x);
        if (strtod(buf, NULL) == x)
            return;
    }
}

/* Host copies of the gradient or weight of every parameter in its own layout: the block's
 * slice for a parameter with storage, the owner's transposed for a re-tied one. `bufs` gets
 * the copies made (to free); data[i] points at parameter i's values. grads: the block is the
 * gradient block (slices at grad_offset; a frozen parameter, which has none, gets zeros). */
static int gather_views(const sbp_step_info *in, const float *block, bool grads,
                        const float **data, float **bufs, const train_sink *s)
{
    for (int i = 0; i < in->n_params; i++) {
        const sbp_step_param *p = &in->params[i];
        const sbp_step_param *own = p->tied_to < 0 ? p : &in->params[p->tied_to];
        size_t off = grads ? own->grad_offset : own->offset;
        bufs[i] = NULL;
        if (grads && off == SIZE_MAX) { /* not trained: its gradient is zero */
            if (!(bufs[i] = calloc(p->numel + 1, sizeof(float))))
                return train_err(s, "out of memory");
            data[i] = bufs[i];
            continue;
        }
        if (p->tied_to < 0) {
            data[i] = block + off;
            continue;
        }
        int64_t r = own->dims[0], c = own->dims[1];
        const float *src = block + off;
        float *t = malloc(p->numel * sizeof(float) + 1);
        if (!t)
            return train_err(s, "out of memory");
        for (int64_t a = 0; a < r; a++)
            for (int64_t b = 0; b < c; b++)
                t[b * r + a] = src[a * c + b];
        bufs[i] = t;
        data[i] = t;
    }
    return 0;
}

int train_write_grads(const char *path, const sbp_step_info *in, const float *grads, double loss,
                      const train_sink *s)
{
    int n = in->n_params, rc = 0;
    const float **data = calloc((size_t)n + 1, sizeof *data);
    float **bufs = calloc((size_t)n + 1, sizeof *bufs);
    sbpio_st_tensor *ts = calloc((size_t)n + 1, sizeof *ts);
    if (!data || !bufs || !ts) {
        rc = train_err(s, "out of memory");
        goto out;
    }
    if ((rc = gather_views(in, grads, true, data, bufs, s)))
        goto out;
    for (int i = 0; i < n; i++)
        ts[i] = (sbpio_st_tensor){.name = in->params[i].name, .dtype = SBPIO_DT_F32,
                                  .rank = in->params[i].rank, .shape = in->params[i].dims,
                                  .data = data[i]};
    char loss_s[64], err[512];
    repr_double(loss_s, sizeof loss_s, loss);
    sbpio_kv meta[] = {{"format", "pt"}, {"loss", loss_s}, {"step", "1"},
                       {"producer", "sbp-train"}};
    if (sbpio_st_write(path, n, ts, (int)(sizeof meta / sizeof meta[0]), meta, false,
                       err, sizeof err) != SBPIO_OK)
        rc = train_err(s, "--dump-grads: %s", err);
out:
    for (int i = 0; bufs && i < n; i++)
        free(bufs[i]);
    free(bufs);
    free(data);
    free(ts);
    return rc;
}

/* The parameter table and block with every parameter in fp32, for the writers
 * (--save, --merge-lora, --save-safetensors, --save-adapter), which index the block by
 * parameter offset. A step with a weight kept as bf16 (--base-precision bf16) gets a copy laid
 * out as an fp32 step's; its bf16 weights, frozen, get the model file's own fp32 values (read
 * once more), which is what the step started from and what a step with fp32 base weights
 * writes: the bf16 values are only the step's rounding of them. Any other step is used as is. */
int train_f32_view_make(train_f32_view *v, const train_config *o, const sbp_step_info *in,
                        const float *block, const train_sink *s)
{
    v->info = *in;
    v->params = NULL;
    v->block = NULL;
    bool any = false;
    for (int i = 0; i < in->n_params; i++)
        any |= in->params[i].storage == SBP_STEP_PARAM_BF16;
    if (!any)
        return 0;
    if (!(v->params = malloc(sizeof *v->params * (size_t)in->n_params)))
        return train_err(s, "out of memory");
    size_t off = 0;
    for (int i = 0; i < in->n_params; i++) {
        v->params[i] = in->params[i];
        v->params[i].storage = SBP_STEP_PARAM_F32;
        if (in->params[i].tied_to < 0) {
            v->params[i].offset = off;
            off += in->params[i].numel;
        }
    }
    for (int i = 0; i < in->n_params; i++)
        if (in->params[i].tied_to >= 0)
            v->params[i].offset = v->params[in->params[i].tied_to].offset;
    v->info.params = v->params;
    v->info.param_elems = off;
    if (!(v->block = malloc(off * sizeof(float) + 1))) {
        train_f32_view_free(v);
        return train_err(s, "out of memory");
    }
    ir_diag diag;
    ir_diag_init(&diag, o->model_path);
    ir_graph *g = ir_import_onnx(o->model_path, &diag, NULL);
    int rc = 0;
    if (!g || diag.n_errors) {
        train_say_ir(s, &diag);
        rc = train_err(s, "cannot read the model %s again for its full-precision frozen weights",
                   o->model_path);
    }
    for (int i = 0; rc == 0 && i < in->n_params; i++) {
        const sbp_step_param *p = &in->params[i];
        if (p->tied_to >= 0)
            continue;
        if (p->storage == SBP_STEP_PARAM_F32) {
            sbp_step_param_fetch(p, block, v->block + v->params[i].offset);
            continue;
        }
        const ir_value *x = match_param(g, p, o->model_path, o->step_path, true, s);
        if (!x)
            rc = -1;
        else
            memcpy(v->block + v->params[i].offset, x->data, p->numel * sizeof(float));
    }
    ir_graph_free(g);
    ir_diag_free(&diag);
    if (rc)
        train_f32_view_free(v);
    return rc;
}

void train_f32_view_free(train_f32_view *v)
{
    free(v->params);
    free(v->block);
    v->params = NULL;
    v->block = NULL;
}

/* --save: the ONNX copy with the block's weights (in, params: the fp32 view, f32_view). */
int train_write_onnx(const train_config *o, const sbp_step_info *in, const float *params,
                     const train_sink *s)
{
    int n = in->n_params, rc = 0;
    const float **data = calloc((size_t)n + 1, sizeof *data);
    float **bufs = calloc((size_t)n + 1, sizeof *bufs);
    const char **names = calloc((size_t)n + 1, sizeof *names);
    if (!data || !bufs || !names) {
        rc = train_err(s, "out of memory");
        goto out;
    }
    if ((rc = gather_views(in, params, false, data, bufs, s)))
        goto out;
    int k = 0; /* a LoRA step's adapters are not the model's (--merge-lora) */
    for (int i = 0; i < n; i++)
        if (!train_adapter_is_adapter(in->params[i].name)) {
            names[k] = in->params[i].name;
            data[k++] = data[i];
        }
    char err[512];
    if (sbpio_onnx_save_with_weights(o->model_path, o->save, k, names, data, err, sizeof err) !=
        SBPIO_OK)
        rc = train_err(s, "--save: %s", err);
out:
    for (int i = 0; bufs && i < n; i++)
        free(bufs[i]);
    free(bufs);
    free(data);
    free(names);
    return rc;
}

