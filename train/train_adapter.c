/* train_adapter.c — LoRA adapters in sbp-train: initial values, PEFT's adapter directory and
 * the merged ONNX copy (train_adapter.h).
 *
 * The adapters are told from the base weights by name (ir_lora_kind); their module is the name
 * less its `.lora_A.weight` suffix. The rank, alpha and seed are the step's own (sbp_step_info).
 * Writing reuses sbpio's atomic safetensors writer (as --save-safetensors does) and ir/files.h's
 * atomic file for the JSON.
 *
 * Merging: sbpc adapted the Linear whose weight's PyTorch name is `<module>.weight`, named as
 * ir/torch.h names it (the initializer's own name when it is PyTorch's, else recovered from the
 * module scope of the node that reads it). The plan names every step parameter the same way on
 * the imported model and takes the ones named `<module>.weight`; their layout is what the
 * reading node says (ir_torch_consumer_role: MatMul's x @ W stores [in, out], Gemm tells by
 * transB), seen through a 2-D Transpose when the export kept one. Several step parameters with
 * one storage (a re-tied copy and its owner) are updated once, through the owner.
 */
#include "cli.h"
#include "train_adapter.h"

#include "files.h"
#include "sbpio.h"
#include "torch.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

void train_adapter_opts_init(train_adapter_opts *o) { *o = (train_adapter_opts){0}; }

const struct option train_adapter_options[] = {
    {"save-adapter", required_argument, NULL, TRAIN_OPT},
    {"merge-lora", no_argument, NULL, TRAIN_OPT},
    {0},
};

int train_adapter_parse(train_adapter_opts *o, cli *c, const char *v)
{
    if (!strcmp(c->flag, "--save-adapter"))
        return cli_path(c, c->flag, v, &o->save_dir);
    if (!strcmp(c->flag, "--merge-lora")) {
        o->merge = true;
        return 0;
    }
    return TRAIN_OPT_NOT_MINE;
}

int train_adapter_check_outputs(train_adapter_opts *o, bool save, bool save_safetensors,
                                char *err, size_t errlen)
{
    o->save_onnx = save;
    o->save_safetensors = save_safetensors;
    if (o->merge && !save && !save_safetensors)
        return cli_errf(err, errlen, "--merge-lora needs --save OUT.onnx, --save-safetensors F "
                        "or --save-pretrained DIR (the merged weights are written there)");
    return 0;
}

const char *train_adapter_usage(void)
{
    return "LoRA steps (sbpc --lora; only the adapters train; rank, alpha and seed are the "
           "step's):\n"
           "  --save-adapter DIR      write the trained adapters as PEFT does: DIR/adapter_model\n"
           "                          .safetensors and DIR/adapter_config.json (peft.PeftModel\n"
           "                          .from_pretrained(model, DIR) loads them)\n"
           "  --merge-lora            with --save OUT.onnx: write W + (alpha/r)·B·A into every\n"
           "                          adapted weight of the copy (PEFT's merge_and_unload), no\n"
           "                          adapters; with --save-safetensors F: the merged model\n"
           "                          under its transformers names (load_state_dict on the\n"
           "                          original model). Without it a LoRA step's --save and\n"
           "                          --save-safetensors are errors: neither has a place for\n"
           "                          the adapters (--save-adapter writes them)\n";
}

static int count_adapters(const sbp_step_info *in)
{
    int n = 0;
    for (int i = 0; i < in->n_params; i++)
        n += ir_lora_kind(in->params[i].name) != 0;
    return n;
}

/* For an adapter parameter of a MoE layer's fused expert tensor (passes/graph/lora.c names it
 * `<tensor>.lora_A.weight`, the tensor itself a rank-3 step parameter [E, out, in]): that
 * tensor's index; -1 for an adapter of a Linear (`<module>.lora_A.weight`, the weight
 * `<module>.weight`). */
static int expert_tensor(const sbp_step_info *in, const char *adapter)
{
    size_t ml = strlen(adapter) - strlen(IR_LORA_A_SUFFIX); /* both suffixes are as long */
    for (int i = 0; i < in->n_params; i++)
        if (in->params[i].rank == 3 && strlen(in->params[i].name) == ml &&
            strncmp(in->params[i].name, adapter, ml) == 0)
            return i;
    return -1;
}

/* PEFT's key of adapter parameter p (less "base_model.model."): a Linear's as sbpc names it; an
 * expert tensor's under its module M (the tensor's name less its last component) as PEFT's
 * ParamWrapper nests them: the wrappers of one module nest in the order its parameters are
 * defined (transformers' experts: gate_up_proj, then down_proj), the first innermost, so
 * gate_up_proj's adapters are M.base_layer.lora_* when down_proj is adapted too, else M.lora_*. */
static void peft_key(const sbp_step_info *in, const char *name, char *out, size_t n)
{
    const int t = expert_tensor(in, name);
    if (t < 0) {
        snprintf(out, n, "%s", name);
        return;
    }
    const char *tensor = in->params[t].name, *dot = strrchr(tensor, '.');
    const size_t ml = dot ? (size_t)(dot - tensor) : 0;
    bool inner = false;
    if (dot && strcmp(dot + 1, "gate_up_proj") == 0) {
        char down[1100];
        snprintf(down, sizeof down, "%.*s.down_proj%s", (int)ml, tensor, IR_LORA_A_SUFFIX);
        for (int i = 0; i < in->n_params && !inner; i++)
            inner = strcmp(in->params[i].name, down) == 0;
    }
    snprintf(out, n, "%.*s%s%s", (int)ml, tensor, inner ? ".base_layer" : "",
             name + strlen(tensor));
}

int train_adapter_init(ir_graph *g, const sbp_step_info *in, const train_adapter_opts *o,
                       char *err, size_t errlen)
{
    if (count_adapters(in) == 0) {
        if (o->save_dir || o->merge)
            return cli_errf(err, errlen, "%s: the step has no LoRA adapters (compile it with sbpc "
                            "--lora)", o->save_dir ? "--save-adapter" : "--merge-lora");
        return 0;
    }
    /* an sbpc older than sbp_step_info's lora_* fields leaves them 0 */
    if (in->lora_rank <= 0 || !(in->lora_alpha > 0))
        return cli_errf(err, errlen,
                        "the step has LoRA adapters but does not say its lora_rank and "
                        "lora_alpha (compiled by an older sbpc): compile it again");
    if (o->save_onnx && !o->merge)
        return cli_errf(err, errlen, "--save: the step trains LoRA adapters, which the ONNX model "
                        "has no place for: add --merge-lora to write W + (alpha/r)·B·A into the "
                        "copy, or use --save-adapter DIR");
    if (o->save_safetensors && !o->merge)
        return cli_errf(err, errlen, "%s: the step trains LoRA adapters, which the model's "
                        "state_dict has no place for: add --merge-lora to write the "
                        "merged model (W + (alpha/r)·B·A) under its transformers names, or use "
                        "--save-adapter DIR (PEFT's adapter files)",
                        o->save_pretrained ? "--save-pretrained" : "--save-safetensors");
    int added = 0;
    for (int i = 0; i < in->n_params; i++) {
        const sbp_step_param *p = &in->params[i];
        if (!ir_lora_kind(p->name) || ir_value_find(g, p->name))
            continue; /* a model that holds it (a merged export, say) gives its own values */
        if (p->rank != 2 || p->dims[0] <= 0 || p->dims[1] <= 0)
            return cli_errf(err, errlen, "the step's LoRA adapter '%s' is not a matrix", p->name);
        ir_dim d[2] = {{p->dims[0], NULL}, {p->dims[1], NULL}};
        ir_value *v = ir_value_new(g, p->name, IR_VAL_PARAM, IR_DT_FLOAT, 2, d);
        if (!v || strcmp(v->name, p->name) != 0)
            return cli_errf(err, errlen, "cannot add the LoRA adapter '%s' to the model", p->name);
        v->nbytes = p->numel * sizeof(float);
        if (!(v->data = ir_arena_alloc(g->arena, v->nbytes)))
            return cli_errf(err, errlen, "out of memory");
        ir_lora_init(p->name, in->lora_seed, p->dims[0], p->dims[1], v->data);
        added++;
    }
    return added;
}

/* The config's "target_modules" (experts false: the adapted Linears' modules) or
 * "target_parameters" (true: the adapted fused expert tensors), by full name, null when there
 * are none of the kind. */
static int write_targets(FILE *f, const sbp_step_info *in, bool experts, const char *path,
                         char *err, size_t errlen)
{
    int any = 0, k = 0;
    for (int i = 0; i < in->n_params; i++)
        any += ir_lora_kind(in->params[i].name) == 'A' &&
               (expert_tensor(in, in->params[i].name) >= 0) == experts;
    fprintf(f, "  \"%s\": %s", experts ? "target_parameters" : "target_modules",
            any ? "[" : "null");
    for (int i = 0; i < in->n_params && any; i++) {
        const char *name = in->params[i].name;
        if (ir_lora_kind(name) != 'A' || (expert_tensor(in, name) >= 0) != experts)
            continue;
        char mod[1024];
        snprintf(mod, sizeof mod, "%.*s", (int)(strlen(name) - strlen(IR_LORA_A_SUFFIX)), name);
        char *quoted = sbpio_json_quote(mod); /* names are UTF-8 (ONNX strings) */
        if (!quoted)
            return cli_errf(err, errlen, "%s: module name '%s' is not valid UTF-8", path, mod);
        fputs(k++ ? ",\n    " : "\n    ", f);
        fputs(quoted, f);
        free(quoted);
    }
    fprintf(f, any ? "\n  ],\n" : ",\n");
    return 0;
}

static int write_config(const char *path, const sbp_step_info *in, int64_t r, char *err,
                        size_t errlen)
{
    sbp_atomic a;
    if (sbp_atomic_begin(&a, path, err, errlen) != SBP_FILE_OK)
        return -1;
    FILE *f = a.f;
    fprintf(f, "{\n  \"peft_type\": \"LORA\",\n  \"task_type\": \"CAUSAL_LM\",\n");
    fprintf(f, "  \"base_model_name_or_path\": null,\n  \"revision\": null,\n");
    fprintf(f, "  \"r\": %lld,\n", (long long)r);
    const double alpha = in->lora_alpha;
    if (alpha == floor(alpha) && alpha < 1e15)
        fprintf(f, "  \"lora_alpha\": %lld,\n", (long long)alpha);
    else
        fprintf(f, "  \"lora_alpha\": %.17g,\n", alpha);
    /* the adapted modules by full path: PEFT matches a target by name or dotted suffix, so a
     * full path selects exactly the module sbpc adapted (a short name like "q_proj" would also
     * select the layers a custom --lora-targets left out) */
    if (write_targets(f, in, false, path, err, errlen) || write_targets(f, in, true, path, err,
                                                                          errlen)) {
        sbp_atomic_abort(&a);
        return -1;
    }
    fprintf(f, "  \"lora_dropout\": 0.0,\n  \"bias\": \"none\",\n  \"fan_in_fan_out\": false,\n"
               "  \"modules_to_save\": null,\n  \"init_lora_weights\": true,\n"
               "  \"use_rslora\": false,\n  \"use_dora\": false,\n  \"inference_mode\": true\n}\n");
    if (ferror(f)) {
        sbp_atomic_abort(&a);
        return cli_errf(err, errlen, "%s: write error", path);
    }
    return sbp_atomic_commit(&a, err, errlen) == SBP_FILE_OK ? 0 : -1;
}

int train_adapter_save(const train_adapter_opts *o, const sbp_step_info *in, const float *params,
                       int *n_written, char *err, size_t errlen)
{
    *n_written = 0;
    struct stat st;
    if (stat(o->save_dir, &st) != 0) {
        if (mkdir(o->save_dir, 0777) != 0)
            return cli_errf(err, errlen, "--save-adapter: cannot make the directory %s: %s",
                            o->save_dir, strerror(errno));
    } else if (!S_ISDIR(st.st_mode)) {
        return cli_errf(err, errlen, "--save-adapter: %s exists and is not a directory",
                        o->save_dir);
    }
    int n = count_adapters(in);
    sbpio_st_tensor *ts = calloc((size_t)n + 1, sizeof *ts);
    char **names = calloc((size_t)n + 1, sizeof *names);
    int64_t(*shapes)[2] = calloc((size_t)n + 1, sizeof *shapes);
    int rc = !ts || !names || !shapes ? cli_errf(err, errlen, "out of memory") : 0;
    int k = 0;
    int64_t r = -1;
    for (int i = 0; i < in->n_params && !rc; i++) {
        const sbp_step_param *p = &in->params[i];
        int kind = ir_lora_kind(p->name);
        if (!kind)
            continue;
        int64_t pr = kind == 'A' ? p->dims[0] : p->dims[1];
        const int et = expert_tensor(in, p->name); /* [E r, in] / [out, r E] */
        if (et >= 0 && in->params[et].dims[0] > 0 && pr % in->params[et].dims[0] == 0)
            pr /= in->params[et].dims[0];
        if (pr != in->lora_rank) {
            rc = cli_errf(err, errlen, "--save-adapter: adapter '%s' has rank %lld, the step says "
                          "lora_rank %lld", p->name, (long long)pr, (long long)in->lora_rank);
            break;
        }
        r = pr;
        char key[1200];
        peft_key(in, p->name, key, sizeof key);
        size_t len = strlen(key) + sizeof "base_model.model.";
        if (!(names[k] = malloc(len))) {
            rc = cli_errf(err, errlen, "out of memory");
            break;
        }
        snprintf(names[k], len, "base_model.model.%s", key);
        shapes[k][0] = p->dims[0];
        shapes[k][1] = p->dims[1];
        ts[k] = (sbpio_st_tensor){.name = names[k], .dtype = SBPIO_DT_F32, .rank = 2,
                                  .shape = shapes[k], .data = params + p->offset};
        k++;
    }
    char path[4096];
    sbpio_kv meta[] = {{"format", "pt"}, {"producer", "sbp-train --save-adapter"}};
    if (!rc) {
        snprintf(path, sizeof path, "%s/adapter_model.safetensors", o->save_dir);
        if (sbpio_st_write(path, k, ts, 2, meta, true, err, errlen) != SBPIO_OK)
            rc = -1;
    }
    if (!rc) {
        snprintf(path, sizeof path, "%s/adapter_config.json", o->save_dir);
        rc = write_config(path, in, r, err, errlen);
    }
    if (!rc)
        *n_written = k;
    for (int i = 0; names && i < k; i++)
        free(names[i]);
    free(names);
    free(shapes);
    free(ts);
    return rc;
}

/* ------------------------------------------------------------------ --merge-lora */

bool train_adapter_is_adapter(const char *name) { return ir_lora_kind(name) != 0; }

typedef struct merge_entry {
    int a, b;        /* the step parameters lora_A [r, in] and lora_B [out, r] */
    int target;      /* the step parameter with storage the update goes to */
    bool transposed; /* target's layout is [in, out] (the update is (B·A)^T), else [out, in] */
    int64_t experts; /* > 0: target is a fused expert tensor [E, out, in], A [E r, in] and B
                      * [out, r E] in PEFT's ParamWrapper layout (expert i: A's rows i r ..,
                      * B's columns j E + i); 0: a Linear's weight */
} merge_entry;

struct train_adapter_merge_plan {
    merge_entry *e; /* [n] */
    int n;
};

/* How the model reads weight v: 1 as [in, out] (x @ W), 0 as [out, in] (Gemm transB = 1), -1
 * when no reader says; -2 when two readers disagree. A 2-D Transpose in between flips it. */
static int read_layout(const ir_uses *u, const ir_value *v, int depth)
{
    int lay = -1;
    for (int k = 0; k < u->n_uses[v->id]; k++) {
        const ir_node *n = u->uses[v->id][k].node;
        const char *leaf;
        bool tr;
        int here = -1;
        if (n->dead)
            continue;
        if (ir_torch_consumer_role(n, u->uses[v->id][k].slot, v, &leaf, &tr)) {
            if (strcmp(leaf, "weight") != 0)
                continue;
            here = tr;
        } else if (n->op == IR_OP_TRANSPOSE && v->rank == 2 && n->n_out == 1 && n->out[0] &&
                   depth == 0) {
            const ir_attr *perm = ir_attr_get(n, "perm");
            if (perm && !(perm->n == 2 && perm->ints[0] == 1 && perm->ints[1] == 0))
                continue;
            int t = read_layout(u, n->out[0], 1);
            if (t == -2)
                return -2;
            here = t < 0 ? -1 : !t;
        }
        if (here < 0)
            continue;
        if (lay >= 0 && lay != here)
            return -2;
        lay = here;
    }
    return lay;
}

static int find_param(const sbp_step_info *in, const char *name)
{
    for (int i = 0; i < in->n_params; i++)
        if (strcmp(in->params[i].name, name) == 0)
            return i;
    return -1;
}

/* The PyTorch name of every step parameter that is a base matrix (names[i], malloc'd, or NULL),
 * as passes/graph/lora.c named the weights it adapted. */
static int name_params(const ir_graph *g, const ir_uses *u, const sbp_step_info *in,
                       char **names, char *err, size_t errlen)
{
    const int nv = g->n_values;
    const ir_value **vals = calloc((size_t)nv + 1, sizeof *vals);
    const char **known = calloc((size_t)nv + 1, sizeof *known);
    char *prefix = NULL;
    int rc = !vals || !known ? cli_errf(err, errlen, "out of memory") : 0;
    for (int i = 0; i < nv && !rc; i++) /* the wrapper prefix, learned as lora.c learns it */
        if (g->values[i]->kind == IR_VAL_PARAM && ir_torch_is_name(g, g->values[i]->name)) {
            vals[i] = g->values[i];
            known[i] = g->values[i]->name;
        }
    if (!rc && !(prefix = ir_torch_learn_prefix(g, u, nv, vals, known)))
        rc = cli_errf(err, errlen, "out of memory");
    for (int i = 0; i < in->n_params && !rc; i++) {
        const sbp_step_param *p = &in->params[i];
        const ir_value *v = ir_value_find(g, p->name);
        if (ir_lora_kind(p->name) || p->rank != 2 || !v)
            continue;
        if (ir_torch_is_name(g, p->name)) {
            if (!(names[i] = strdup(p->name)))
                rc = cli_errf(err, errlen, "out of memory");
            continue;
        }
        ir_torch_name pn = {.tr_hint = -1};
        char why[512];
        if (ir_torch_name_from_scopes(g, u, v, prefix, &pn, why, sizeof why) == 0)
            names[i] = pn.name; /* NULL when nothing says: sbpc could not adapt it either */
        else
            free(pn.name); /* readers disagree: sbpc did not adapt it by either name */
    }
    free(prefix);
    free(vals);
    free(known);
    return rc;
}

/* Plans adapter pair (a, b) of module `module` onto the parameters named `<module>.weight`. */
static int plan_pair(train_adapter_merge_plan *pl, const ir_graph *g, const ir_uses *u,
                     const sbp_step_info *in, char *const *names, int a, int b,
                     const char *module, char *err, size_t errlen)
{
    const sbp_step_param *pa = &in->params[a], *pb = &in->params[b];
    const int64_t r = pa->dims[0], nin = pa->dims[1], nout = pb->dims[0];
    if (pa->rank != 2 || pb->rank != 2 || pb->dims[1] != r || r != in->lora_rank)
        return cli_errf(err, errlen, "adapters '%s' and '%s' do not have the step's rank %lld",
                        pa->name, pb->name, (long long)in->lora_rank);
    size_t ml = strlen(module);
    int found = 0;
    for (int i = 0; i < in->n_params; i++) {
        const char *nm = names[i];
        if (!nm || strncmp(nm, module, ml) != 0 || strcmp(nm + ml, ".weight") != 0)
            continue;
        const sbp_step_param *p = &in->params[i];
        int lay = read_layout(u, ir_value_find(g, p->name), 0);
        if (lay == -2)
            return cli_errf(err, errlen, "the model reads '%s' (%s) both as [in, out] and as [out, "
                            "in]: cannot tell which way to add B·A", p->name, nm);
        bool fits_oi = p->dims[0] == nout && p->dims[1] == nin;
        bool fits_io = p->dims[0] == nin && p->dims[1] == nout;
        if (lay < 0 && fits_oi != fits_io) /* no reader says: the shape does, when not square */
            lay = fits_io;
        if (lay < 0 || !(lay ? fits_io : fits_oi))
            return cli_errf(err, errlen, "'%s' (%s, [%lld, %lld]) does not fit its adapters '%s' "
                            "[%lld, %lld] and '%s' [%lld, %lld]%s", p->name, nm,
                            (long long)p->dims[0], (long long)p->dims[1], pa->name, (long long)r,
                            (long long)nin, pb->name, (long long)nout, (long long)r,
                            lay < 0 ? " (no Linear reads it, and the shape is square)" : "");
        /* a re-tied copy has no storage: its owner is its transpose */
        merge_entry e = {.a = a, .b = b, .target = p->tied_to >= 0 ? p->tied_to : i,
                         .transposed = p->tied_to >= 0 ? !lay : lay};
        bool dup = false; /* the same storage reached through a second name: once */
        for (int k = 0; k < pl->n && !dup; k++)
            dup = pl->e[k].a == a && pl->e[k].target == e.target;
        if (!dup)
            pl->e[pl->n++] = e;
        found++;
    }
    if (!found)
        return cli_errf(err, errlen, "no initializer of the model is '%s.weight', the base weight "
                        "of the adapter '%s'", module, pa->name);
    return 0;
}

/* Plans the adapter pair (a, b) of fused expert tensor et [E, out, in]. */
static int plan_experts(train_adapter_merge_plan *pl, const sbp_step_info *in, int a, int b,
                        int et, char *err, size_t errlen)
{
    const sbp_step_param *pa = &in->params[a], *pb = &in->params[b], *pt = &in->params[et];
    const int64_t E = pt->dims[0], r = in->lora_rank;
    if (pa->rank != 2 || pb->rank != 2 || pa->dims[0] != E * r || pa->dims[1] != pt->dims[2] ||
        pb->dims[0] != pt->dims[1] || pb->dims[1] != r * E)
        return cli_errf(err, errlen, "adapters '%s' and '%s' do not fit the experts' '%s' [%lld, "
                        "%lld, %lld] at the step's rank %lld", pa->name, pb->name, pt->name,
                        (long long)E, (long long)pt->dims[1], (long long)pt->dims[2],
                        (long long)r);
    pl->e[pl->n++] = (merge_entry){.a = a, .b = b, .target = et, .experts = E};
    return 0;
}

train_adapter_merge_plan *train_adapter_merge_plan_make(const ir_graph *g,
                                                        const sbp_step_info *in, char *err,
                                                        size_t errlen)
{
    train_adapter_merge_plan *pl = calloc(1, sizeof *pl);
    char **names = calloc((size_t)in->n_params + 1, sizeof *names);
    ir_uses u = ir_uses_build(g);
    int rc = !pl || !names || !u.n_uses ? cli_errf(err, errlen, "out of memory") : 0;
    /* a parameter has one PyTorch name, so it is planned for one adapter pair at most */
    if (!rc && !(pl->e = calloc((size_t)in->n_params + 1, sizeof *pl->e)))
        rc = cli_errf(err, errlen, "out of memory");
    if (!rc)
        rc = name_params(g, &u, in, names, err, errlen);
    for (int a = 0; a < in->n_params && !rc; a++) {
        const char *an = in->params[a].name;
        if (ir_lora_kind(an) != 'A')
            continue;
        size_t ml = strlen(an) - strlen(IR_LORA_A_SUFFIX);
        char module[1024], bname[1100];
        snprintf(module, sizeof module, "%.*s", (int)ml, an);
        snprintf(bname, sizeof bname, "%s%s", module, IR_LORA_B_SUFFIX);
        int b = find_param(in, bname), et = expert_tensor(in, an);
        if (b >= 0 && et >= 0)
            rc = plan_experts(pl, in, a, b, et, err, errlen);
        else
            rc = b < 0 ? cli_errf(err, errlen, "adapter '%s' has no '%s'", an, bname)
                       : plan_pair(pl, g, &u, in, names, a, b, module, err, errlen);
    }
    for (int i = 0; names && i < in->n_params; i++)
        free(names[i]);
    free(names);
    if (rc) {
        train_adapter_merge_plan_free(pl);
        return NULL;
    }
    return pl;
}

int train_adapter_merge_count(const train_adapter_merge_plan *p) { return p ? p->n : 0; }

void train_adapter_merge(const train_adapter_merge_plan *p, const sbp_step_info *in,
                         const float *params, float *out)
{
    memcpy(out, params, in->param_elems * sizeof(float));
    const double scaling = in->lora_alpha / (double)in->lora_rank;
    for (int k = 0; k < p->n; k++) {
        const merge_entry *e = &p->e[k];
        const sbp_step_param *pa = &in->params[e->a], *pb = &in->params[e->b];
        const int64_t r = pa->dims[0], nin = pa->dims[1], nout = pb->dims[0];
        const float *A = params + pa->offset, *B = params + pb->offset;
        float *W = out + in->params[e->target].offset;
        if (e->experts > 0) { /* W[i] += scaling B_i A_i, expert by expert */
            const int64_t E = e->experts, rr = r / E;
            for (int64_t x = 0; x < E; x++)
                for (int64_t o = 0; o < nout; o++)
                    for (int64_t i = 0; i < nin; i++) {
                        double d = 0;
                        for (int64_t j = 0; j < rr; j++)
                            d += (double)B[o * rr * E + j * E + x] *
                                 (double)A[(x * rr + j) * nin + i];
                        float *w = &W[(x * nout + o) * nin + i];
                        *w = (float)((double)*w + scaling * d);
                    }
            continue;
        }
        for (int64_t o = 0; o < nout; o++)
            for (int64_t i = 0; i < nin; i++) {
                double d = 0;
                for (int64_t j = 0; j < r; j++)
                    d += (double)B[o * r + j] * (double)A[j * nin + i];
                float *w = e->transposed ? &W[i * nout + o] : &W[o * nin + i];
                *w = (float)((double)*w + scaling * d);
            }
    }
}

void train_adapter_merge_plan_free(train_adapter_merge_plan *p)
{
    if (!p)
        return;
    free(p->e);
    free(p);
}
