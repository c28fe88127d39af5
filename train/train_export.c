/* train_export.c — the keys and layouts of sbp-train --save-safetensors (see train_export.h).
 *
 * Goal: `model.load_state_dict(safetensors.torch.load_file(F))` on the module that was
 * exported. So every step parameter is written under its PyTorch name, in PyTorch's layout, and
 * a re-tied copy (the transpose of another parameter) is not written as a second tensor of its
 * own unless PyTorch knows it under a second name (a tied LM head: HF's state_dict() holds both
 * `transformer.wte.weight` and `lm_head.weight`, and strict loading wants both).
 *
 * An initializer's name is PyTorch's when the export says so: the dynamo exporter's graph
 * signature lists every `PARAMETER target='NAME'`; a TorchScript export has no signature, and
 * there every name but the exporter's own `onnx::*` (and dynamo-style `val_N`) is taken as is.
 * For the others, in this order:
 *   1. The consuming node's scope. TorchScript names nodes by module path:
 *      `/model/layers.0/self_attn/q_proj/MatMul` reads `model.layers.0.self_attn.q_proj.weight`.
 *      The dynamo exporter's node names carry none ("node_linear"); it writes the path into
 *      the node's metadata (pkg.torch.onnx.name_scopes, kept by the importer as ir_node.scope),
 *      which is used first when present.
 *      MatMul reads it as its second input, x @ W, so the stored [in, out] is nn.Linear's
 *      [out, in] transposed and is transposed back; Gemm tells by transB (and its third input
 *      is `.bias`). Other consumers say nothing about the name. A wrapper module puts a prefix
 *      on every scope (`/m/model/...` with the names themselves left bare): it is learned from
 *      the named parameters, whose consumers' scopes end with their own module path.
 *   2. The dynamo signature, when exactly one initializer is left unnamed and exactly one
 *      signature PARAMETER has no initializer: they are the same tensor (the dynamo exporter
 *      keeps one initializer for tied parameters and renames a transposed copy `val_N`).
 * Two different candidates, from two consumers or from the signature, are refused with both
 * named; a name is never guessed by shape or order. A re-tied copy whose name stays unknown is
 * not needed: its values are its owner's, written under the owner's name (a note says so).
 * Step 1's pieces (the signature, scopes, consumer roles, the prefix) live in ir/torch.c, where
 * sbpc's --lora pass names the layers it adapts with them too.
 *
 * LoRA steps: the adapters are not the model's parameters, so they are left out of
 * the naming altogether (they would otherwise count as initializers without a signature entry)
 * and get no key; with --merge-lora the base weights are written merged. Without --merge-lora
 * the plan refuses (as train_adapter_init does first): writing the base weights alone would
 * quietly save the untrained model, and PEFT-named adapter keys next to them would make the
 * file fail a strict load_state_dict on the model it came from.
 */
#include "cli.h"
#include "train_export.h"

#include "sbpio.h"
#include "torch.h" /* PyTorch names (shared with sbpc --lora) */

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct export_key {
    char *name;      /* the PyTorch key */
    int param;       /* the step parameter whose values it holds */
    bool transposed; /* written as the transpose of that parameter's ONNX layout */
} export_key;

struct train_export {
    export_key *keys; /* [n] */
    int n;
};

/* What is known of one step parameter while planning (ir/torch.h). */
typedef ir_torch_name pname;

/* The prefix a wrapper module put on every scope (ir_torch_learn_prefix), learned from the
 * parameters whose names are PyTorch's own. */
static char *learn_prefix(const ir_graph *g, const ir_uses *u, const sbp_step_info *in,
                          const pname *pn)
{
    const ir_value **vals = calloc((size_t)in->n_params + 1, sizeof *vals);
    const char **names = calloc((size_t)in->n_params + 1, sizeof *names);
    char *p = NULL;
    if (vals && names) {
        for (int i = 0; i < in->n_params; i++) {
            names[i] = pn[i].name && !pn[i].recovered ? pn[i].name : NULL;
            vals[i] = names[i] ? ir_value_find(g, in->params[i].name) : NULL;
        }
        p = ir_torch_learn_prefix(g, u, in->n_params, vals, names);
    }
    free(vals);
    free(names);
    return p;
}

static char *shape_text(char *buf, size_t n, int rank, const int64_t *dims, bool swap)
{
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int d = 0; d < rank && k < n; d++) {
        int64_t x = swap && rank == 2 ? dims[1 - d] : dims[d];
        k += (size_t)snprintf(buf + k, n - k, "%s%lld", d ? "," : "", (long long)x);
    }
    if (k < n)
        snprintf(buf + k, n - k, "]");
    return buf;
}

/* Step 1 of the header: the name of parameter i from its consumers' scopes. 0 with pn->name
 * set or left NULL (nothing said), -1 when two consumers disagree. */
static int recover_from_scopes(const ir_graph *g, const ir_uses *u, const sbp_step_info *in,
                               int i, const char *prefix, pname *pn, char *err, size_t errlen)
{
    return ir_torch_name_from_scopes(g, u, ir_value_find(g, in->params[i].name), prefix, pn, err,
                                     errlen);
}

struct unclaimed {
    const ir_graph *g;
    const pname *pn;
    int n_params;
    const char *first, *second; /* (not NUL-terminated) */
    size_t first_len, second_len;
    int count;
};

static void unclaimed_cb(const char *s, size_t n, void *ctx)
{
    struct unclaimed *q = ctx;
    char *name = strndup(s, n);
    if (!name)
        return;
    bool claimed = ir_value_find(q->g, name) != NULL;
    for (int i = 0; i < q->n_params && !claimed; i++)
        claimed = q->pn[i].name && strcmp(q->pn[i].name, name) == 0;
    free(name);
    if (claimed)
        return;
    if (q->count == 0) {
        q->first = s;
        q->first_len = n;
    } else if (q->count == 1) {
        q->second = s;
        q->second_len = n;
    }
    q->count++;
}

static bool same_shape(const sbp_step_param *a, bool ta, const sbp_step_param *b, bool tb)
{
    if (a->rank != b->rank)
        return false;
    for (int d = 0; d < a->rank; d++) {
        int64_t x = ta && a->rank == 2 ? a->dims[1 - d] : a->dims[d];
        int64_t y = tb && b->rank == 2 ? b->dims[1 - d] : b->dims[d];
        if (x != y)
            return false;
    }
    return true;
}

/* Every model parameter named now (a tied copy is written once, under its owner's name), and
 * each recovered name said in a note. */
static int check_names(const ir_graph *g, const sbp_step_info *in, const pname *pn,
                       const train_sink *note, char *err, size_t errlen)
{
    char line[1024], s1[64], s2[64];
    for (int i = 0; i < in->n_params; i++) {
        const sbp_step_param *p = &in->params[i];
        if (ir_lora_kind(p->name))
            continue;
        if (!pn[i].name && p->tied_to >= 0) {
            snprintf(line, sizeof line, "--save-safetensors: '%s' is the transpose of '%s' "
                     "(tied) and has no PyTorch name of its own: written once, as '%s'",
                     p->name, in->params[p->tied_to].name,
                     pn[p->tied_to].name ? pn[p->tied_to].name : in->params[p->tied_to].name);
            if (note)
                train_note(note, line);
            continue;
        }
        if (!pn[i].name)
            return cli_errf(err, errlen,
                            "initializer '%s' %s was renamed by the exporter, and its PyTorch name "
                            "cannot be recovered: no node that reads it is a Linear's MatMul or "
                            "Gemm with a module scope%s", p->name,
                            shape_text(s1, sizeof s1, p->rank, p->dims, false),
                            g->torch_signature ? ", and the graph signature does not single one out"
                                           : "");
        if (pn[i].recovered && note) {
            snprintf(line, sizeof line, "--save-safetensors: '%s' %s is '%s' %s%s (from %s)",
                     p->name, shape_text(s1, sizeof s1, p->rank, p->dims, false), pn[i].name,
                     shape_text(s2, sizeof s2, p->rank, p->dims, pn[i].transposed),
                     pn[i].transposed ? ", transposed back" : "", pn[i].via);
            train_note(note, line);
        }
    }
    return 0;
}

static int plan_names(const ir_graph *g, const sbp_step_info *in, pname *pn,
                      const train_sink *note, char *err, size_t errlen)
{
    char s1[64];
    for (int i = 0; i < in->n_params; i++) {
        pn[i].tr_hint = -1;
        if (ir_lora_kind(in->params[i].name))
            continue; /* not the model's: merged, or refused by train_export_plan_lora */
        if (ir_torch_is_name(g, in->params[i].name) && !(pn[i].name = strndup(in->params[i].name,
                                                                         strlen(in->params[i].name))))
            return cli_errf(err, errlen, "out of memory");
    }
    ir_uses u = ir_uses_build(g);
    if (!u.n_uses)
        return cli_errf(err, errlen, "out of memory building use lists");
    char *prefix = learn_prefix(g, &u, in, pn);
    if (!prefix)
        return cli_errf(err, errlen, "out of memory");
    int rc = 0;
    for (int i = 0; i < in->n_params && !rc; i++)
        if (!pn[i].name && !ir_lora_kind(in->params[i].name))
            rc = recover_from_scopes(g, &u, in, i, prefix, &pn[i], err, errlen);
    free(prefix);
    if (rc)
        return rc;

    /* Step 2: the signature's one PARAMETER without an initializer, for the one unnamed. */
    int unnamed = 0, first = -1, second = -1;
    for (int i = 0; i < in->n_params; i++)
        if (!pn[i].name && !ir_lora_kind(in->params[i].name)) {
            second = unnamed == 1 ? i : second;
            first = unnamed++ == 0 ? i : first;
        }
    struct unclaimed q = {.g = g, .pn = pn, .n_params = in->n_params};
    ir_torch_signature_params(g->torch_signature, unclaimed_cb, &q);
    if (unnamed == 1 && q.count == 1 && pn[first].tr_hint >= 0) {
        pn[first] = (pname){.name = strndup(q.first, q.first_len), .transposed = pn[first].tr_hint,
                            .recovered = true, .via = "the graph signature (its only parameter "
                            "without an initializer)"};
        if (!pn[first].name)
            return cli_errf(err, errlen, "out of memory");
    } else if (unnamed >= 1 && q.count >= 2 && in->params[first].tied_to < 0) {
        return cli_errf(err, errlen,
                        "initializer '%s' %s was renamed by the exporter and no node scope names "
                        "it; the graph signature leaves %d parameters without an initializer (such "
                        "as '%.*s' and '%.*s') for %d renamed initializer(s): ambiguous, refusing "
                        "to guess (an export with node scopes names them: TorchScript's, or a "
                        "dynamo export that keeps its nodes' pkg.torch.onnx.name_scopes metadata)",
                        in->params[first].name,
                        shape_text(s1, sizeof s1, in->params[first].rank, in->params[first].dims,
                               false),
                        q.count, (int)q.first_len, q.first, (int)q.second_len, q.second, unnamed);
    }
    (void)second;
    return check_names(g, in, pn, note, err, errlen);
}

/* Is parameter j's written tensor the same as parameter i's (a re-tied copy under the same
 * name and layout)? */
static bool same_tensor(const sbp_step_info *in, const pname *pn, int i, int j)
{
    const sbp_step_param *a = &in->params[i], *b = &in->params[j];
    int oa = a->tied_to >= 0 ? a->tied_to : i, ob = b->tied_to >= 0 ? b->tied_to : j;
    /* in the owner's layout: a tied copy is the owner transposed */
    bool ta = pn[i].transposed != (a->tied_to >= 0), tb = pn[j].transposed != (b->tied_to >= 0);
    return oa == ob && ta == tb;
}

train_export *train_export_plan_lora(const ir_graph *g, const sbp_step_info *in, bool merge,
                                     const train_sink *note, char *err, size_t errlen)
{
    for (int i = 0; i < in->n_params && !merge; i++)
        if (ir_lora_kind(in->params[i].name)) {
            cli_errf(err, errlen, "the step trains LoRA adapters, which the model's state_dict "
                     "has no place for: add --merge-lora to write the merged model (W + "
                     "(alpha/r)·B·A) under its transformers names, or use --save-adapter DIR");
            return NULL;
        }
    pname *pn = calloc((size_t)in->n_params + 1, sizeof *pn);
    train_export *x = calloc(1, sizeof *x);
    if (x)
        x->keys = calloc((size_t)in->n_params + 1, sizeof *x->keys);
    int rc = !pn || !x || !x->keys ? cli_errf(err, errlen, "out of memory")
                                   : plan_names(g, in, pn, note, err, errlen);
    for (int i = 0; i < in->n_params && !rc; i++) {
        if (!pn[i].name)
            continue;
        bool dup = false;
        for (int k = 0; k < x->n && !rc; k++) {
            if (strcmp(x->keys[k].name, pn[i].name) != 0)
                continue;
            if (same_tensor(in, pn, x->keys[k].param, i) &&
                same_shape(&in->params[x->keys[k].param], x->keys[k].transposed,
                           &in->params[i], pn[i].transposed))
                dup = true; /* a duplicated copy: written once */
            else
                rc = cli_errf(err, errlen,
                              "initializers '%s' and '%s' would both be written as '%s' "
                              "but hold different tensors; refusing to guess which it is",
                              in->params[x->keys[k].param].name, in->params[i].name, pn[i].name);
        }
        if (!dup && !rc) {
            x->keys[x->n++] = (export_key){.name = pn[i].name, .param = i,
                                           .transposed = pn[i].transposed};
            pn[i].name = NULL; /* owned by the key now */
        }
    }
    for (int i = 0; pn && i < in->n_params; i++)
        free(pn[i].name);
    free(pn);
    if (rc) {
        train_export_free(x);
        return NULL;
    }
    return x;
}

int train_export_count(const train_export *x) { return x ? x->n : 0; }

/* Key k's values into dst: the parameter in its ONNX layout (a tied copy is its owner
 * transposed), then transposed once more when PyTorch's layout is the other one. */
static void gather_key(const sbp_step_info *in, const export_key *k, const float *params,
                       float *dst)
{
    const sbp_step_param *p = &in->params[k->param];
    const sbp_step_param *own = p->tied_to >= 0 ? &in->params[p->tied_to] : p;
    const float *src = params + own->offset;
    if ((p->tied_to >= 0) == k->transposed) { /* the owner's layout: as stored */
        memcpy(dst, src, p->numel * sizeof(float));
        return;
    }
    int64_t r = own->dims[0], c = own->dims[1];
    for (int64_t a = 0; a < r; a++)
        for (int64_t b = 0; b < c; b++)
            dst[b * r + a] = src[a * c + b];
}

int train_export_write_lora(const train_export *x, const sbp_step_info *in, const float *params,
                            const train_adapter_merge_plan *merge, const char *path, char *err,
                            size_t errlen)
{
    sbpio_st_tensor *ts = calloc((size_t)x->n + 1, sizeof *ts);
    int64_t(*shapes)[SBP_STEP_MAX_RANK] = calloc((size_t)x->n + 1, sizeof *shapes);
    float **bufs = calloc((size_t)x->n + 1, sizeof *bufs);
    float *merged = merge ? malloc(in->param_elems * sizeof(float) + 1) : NULL;
    int rc = !ts || !shapes || !bufs || (merge && !merged) ? cli_errf(err, errlen, "out of memory")
                                                          : 0;
    if (!rc && merged) { /* the block as --save --merge-lora writes it; the adapters unread */
        train_adapter_merge(merge, in, params, merged);
        params = merged;
    }
    for (int k = 0; k < x->n && !rc; k++) {
        const sbp_step_param *p = &in->params[x->keys[k].param];
        if (!(bufs[k] = malloc(p->numel * sizeof(float) + 1))) {
            rc = cli_errf(err, errlen, "out of memory");
            break;
        }
        gather_key(in, &x->keys[k], params, bufs[k]);
        for (int d = 0; d < p->rank; d++)
            shapes[k][d] = x->keys[k].transposed && p->rank == 2 ? p->dims[1 - d] : p->dims[d];
        ts[k] = (sbpio_st_tensor){.name = x->keys[k].name, .dtype = SBPIO_DT_F32,
                                  .rank = p->rank, .shape = shapes[k], .data = bufs[k]};
    }
    /* "format": "pt" is what safetensors.torch.save_file writes and load_file expects */
    sbpio_kv meta[] = {{"format", "pt"}, {"producer", "sbp-train --save-safetensors"}};
    if (!rc && sbpio_st_write(path, x->n, ts, 2, meta, true, err, errlen) != SBPIO_OK)
        rc = -1;
    for (int k = 0; bufs && k < x->n; k++)
        free(bufs[k]);
    free(merged);
    free(bufs);
    free(shapes);
    free(ts);
    return rc;
}

void train_export_free(train_export *x)
{
    if (!x)
        return;
    for (int k = 0; k < x->n; k++)
        free(x->keys[k].name);
    free(x->keys);
    free(x);
}
