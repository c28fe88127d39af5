/* freeze.c — sbpc --freeze REGEX: the parameters it names are not trained (the flow's "freeze"
 * stage, after the objective; passes.h: sbp_freeze_params).
 *
 * A frozen parameter keeps its value: the training program gives it no gradient buffer and no
 * optimizer state. Names are the ONNX initializers' (what --dump-ir prints). A re-tied copy and
 * its owner are one tensor, so freezing either freezes both. Freezing only adds; a --freeze
 * that leaves nothing to train is an error, since the step would run and save the model as if
 * it had trained.
 *
 * requires: a graph whose parameters are told from constants (params) — normally the objective's
 * result. produces: ir_value.frozen set on the matching parameters.
 */
#include "passes.h"

#include <regex.h>

int sbp_freeze_params(ir_graph *g, const char *regex, int *n_frozen)
{
    regex_t re;
    int rc = regcomp(&re, regex, REG_EXTENDED | REG_NOSUB);
    if (rc != 0) {
        char msg[256];
        regerror(rc, &re, msg, sizeof msg);
        return ir_diag_error(g->diag, "--freeze '%s': %s", regex, msg);
    }
    int n = 0;
    for (int i = 0; i < g->n_values; i++) {
        ir_value *v = g->values[i];
        if (v->kind != IR_VAL_PARAM || regexec(&re, v->name, 0, NULL, 0) != 0)
            continue;
        if (!v->frozen)
            n++;
        v->frozen = true;
        if (v->tied_to && !v->tied_to->frozen) {
            v->tied_to->frozen = true;
            n++;
        }
    }
    /* an owner frozen by name freezes its copies too */
    for (int i = 0; i < g->n_values; i++) {
        ir_value *v = g->values[i];
        if (v->kind == IR_VAL_PARAM && v->tied_to && v->tied_to->frozen && !v->frozen) {
            v->frozen = true;
            n++;
        }
    }
    regfree(&re);
    if (n_frozen)
        *n_frozen = n;
    /* A step that trains nothing would still run, print losses and save the model as if it had
     * trained: an error. Freezing only adds, so once nothing is left no later --freeze helps. */
    ir_uses u = ir_uses_build(g);
    if (!u.n_uses)
        return ir_diag_error(g->diag, "out of memory building use lists");
    int n_used = 0, n_left = 0;
    for (int i = 0; i < g->n_values; i++) {
        const ir_value *v = g->values[i];
        if (v->kind != IR_VAL_PARAM || u.n_uses[v->id] == 0)
            continue;
        n_used++;
        n_left += !v->frozen;
    }
    if (n_used > 0 && n_left == 0)
        return ir_diag_error(g->diag,
                             "--freeze '%s' leaves no parameter to train (all %d are frozen): "
                             "the step would change nothing",
                             regex, n_used);
    return IR_OK;
}
