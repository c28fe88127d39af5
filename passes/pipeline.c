/* pipeline.c — the canonicalisation driver: a plain list of passes with the verifier between them.
 *
 * `sbpc --dump-ir=NAME` stops after the pass called NAME ("import" stops before the first pass).
 * The verifier runs after every pass: a pass that leaves a broken graph is named at once.
 */
#include "passes.h"

#include <string.h>

static int run_bind(ir_graph *g, const sbp_pass_options *o)
{
    return sbp_pass_bind_dims(g, o->batch, o->seq_len);
}
/* The fold cap: the caller's, else 16 Mi elements or 1024 per token (B*T), whichever is larger,
 * so that tables with a row per token (RoPE's [T, head_dim], which the recogniser needs as
 * constants) fold at any sequence length, while T x T mask chains stay nodes at long T. */
static int64_t fold_cap(const sbp_pass_options *o)
{
    if (o->fold_max_elems)
        return o->fold_max_elems;
    const int64_t cap = (int64_t)1 << 24;
    const int64_t tokens = (o->batch > 0 ? o->batch : 1) * (o->seq_len > 0 ? o->seq_len : 0);
    return tokens > cap / 1024 ? tokens * 1024 : cap;
}

static int run_params(ir_graph *g, const sbp_pass_options *o)
{
    (void)o;
    return sbp_pass_params(g);
}

static int run_fold(ir_graph *g, const sbp_pass_options *o)
{
    return sbp_pass_fold_max(g, fold_cap(o));
}
static int run_dce(ir_graph *g, const sbp_pass_options *o) { (void)o; return sbp_pass_dce(g); }
static int run_retie(ir_graph *g, const sbp_pass_options *o)
{
    return o->no_retie ? IR_OK : sbp_pass_retie(g);
}
static int run_recognize(ir_graph *g, const sbp_pass_options *o)
{
    (void)o;
    return sbp_pass_recognize(g);
}
static int run_cleanup(ir_graph *g, const sbp_pass_options *o)
{
    if (sbp_pass_fold_max(g, fold_cap(o)) != IR_OK)
        return IR_ERR;
    return sbp_pass_dce(g);
}

typedef int (*pass_fn)(ir_graph *, const sbp_pass_options *);

const sbp_pass_desc sbp_pass_list[] = {
    {"import", "the graph as read from the ONNX file"},
    {"bind-dims", "bind the symbolic batch/sequence dims to --batch/--seq-len"},
    {"params", "tell trainable weights from constant initializers (buffers, scalars)"},
    {"fold", "fold shape arithmetic and constants"},
    {"dce", "remove nodes that do not reach an output"},
    {"retie", "restore weight tying broken by the exporter's constant folding"},
    {"recognize", "recognise semantic ops (Linear, norms, attention, ...)"},
    {"cleanup", "fold and dce again after recognition"},
};
const int sbp_n_passes = (int)(sizeof sbp_pass_list / sizeof sbp_pass_list[0]);

static const pass_fn pass_fns[] = {
    NULL, run_bind, run_params, run_fold, run_dce, run_retie, run_recognize, run_cleanup,
};

int sbp_canonicalize(ir_graph *g, const sbp_pass_options *opt, const char *stop_after)
{
    int stop = sbp_n_passes - 1;
    if (stop_after) {
        stop = -1;
        for (int i = 0; i < sbp_n_passes; i++)
            if (strcmp(sbp_pass_list[i].name, stop_after) == 0)
                stop = i;
        if (stop < 0)
            return ir_diag_error(g->diag, "unknown pass '%s' (see sbpc --help for the list)",
                                 stop_after);
    }
    for (int i = 1; i <= stop; i++) {
        if (pass_fns[i](g, opt) != IR_OK || g->diag->n_errors) {
            ir_diag_error(g->diag, "pass '%s' failed", sbp_pass_list[i].name);
            return IR_ERR;
        }
        if (opt->verify && ir_verify(g) != IR_OK) {
            ir_diag_error(g->diag, "the graph is invalid after pass '%s' (an sbpc bug)",
                          sbp_pass_list[i].name);
            return IR_ERR;
        }
    }
    return IR_OK;
}
