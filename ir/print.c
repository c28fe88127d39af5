/* print.c — the textual IR dump behind `sbpc --dump-ir`.
 *
 * The format is stable because golden tests compare it: a header, then the graph inputs,
 * parameters and constants that live nodes read, then one line per live node in order, then the
 * outputs. Semantic ops print under their own names with their attributes, and the attention op
 * carries the word "attention" in its trailing comment so a reader (or grep) finds each layer's
 * attention at a glance. Constant data is summarised, never dumped whole.
 */
#include "ir.h"

#include <stdlib.h>
#include <string.h>

static void print_attr(FILE *f, const ir_attr *a)
{
    fprintf(f, "%s=", a->name);
    switch (a->kind) {
    case IR_ATTR_INT: fprintf(f, "%lld", (long long)a->i); break;
    case IR_ATTR_FLOAT: fprintf(f, "%.9g", a->f); break;
    case IR_ATTR_STRING: fprintf(f, "\"%s\"", a->s ? a->s : ""); break;
    case IR_ATTR_INTS:
        fputc('[', f);
        for (int i = 0; i < a->n; i++)
            fprintf(f, "%s%lld", i ? "," : "", (long long)a->ints[i]);
        fputc(']', f);
        break;
    case IR_ATTR_FLOATS:
        fputc('[', f);
        for (int i = 0; i < a->n; i++)
            fprintf(f, "%s%.9g", i ? "," : "", a->floats[i]);
        fputc(']', f);
        break;
    case IR_ATTR_TENSOR: {
        char buf[128];
        fprintf(f, "tensor:%s", a->t ? ir_value_type_str(a->t, buf, sizeof buf) : "?");
        break;
    }
    }
}

/* A short preview of small integer constants (shapes, axes), which is what a reader wants. */
static void print_const_preview(FILE *f, const ir_value *v)
{
    int64_t n = ir_value_numel(v);
    if (!v->data || n < 0 || n > 8 || !(ir_dtype_is_int(v->dtype) || v->dtype == IR_DT_BOOL ||
                                        ir_dtype_is_float(v->dtype)))
        return;
    if (v->dtype == IR_DT_FLOAT16 || v->dtype == IR_DT_BFLOAT16)
        return;
    fprintf(f, " = {");
    for (int64_t i = 0; i < n; i++) {
        if (ir_dtype_is_float(v->dtype))
            fprintf(f, "%s%.9g", i ? "," : "", ir_const_f64(v, i));
        else
            fprintf(f, "%s%lld", i ? "," : "", (long long)ir_const_i64(v, i));
    }
    fputc('}', f);
}

void ir_print(const ir_graph *g, FILE *f)
{
    char buf[256];
    bool *used = calloc((size_t)g->n_values + 1, 1);
    if (!used)
        return;
    for (int i = 0; i < g->n_nodes; i++) {
        const ir_node *n = g->nodes[i];
        if (n->dead)
            continue;
        for (int j = 0; j < n->n_in; j++)
            if (n->in[j])
                used[n->in[j]->id] = true;
    }
    for (int i = 0; i < g->n_outputs; i++)
        used[g->outputs[i]->id] = true;

    fprintf(f, "graph %s (opset %lld)\n", g->name ? g->name : "graph", (long long)g->opset);
    for (int i = 0; i < g->n_inputs; i++)
        fprintf(f, "input  %%%s: %s\n", g->inputs[i]->name,
                ir_value_type_str(g->inputs[i], buf, sizeof buf));
    for (int i = 0; i < g->n_values; i++) {
        const ir_value *v = g->values[i];
        if (!used[v->id] || v->kind != IR_VAL_PARAM)
            continue;
        fprintf(f, "param  %%%s: %s", v->name, ir_value_type_str(v, buf, sizeof buf));
        if (v->tied_to)
            fprintf(f, "  # tied: transpose of %%%s", v->tied_to->name);
        if (v->frozen)
            fprintf(f, "  # frozen");
        fputc('\n', f);
    }
    for (int i = 0; i < g->n_values; i++) {
        const ir_value *v = g->values[i];
        if (!used[v->id] || v->kind != IR_VAL_CONST)
            continue;
        fprintf(f, "const  %%%s: %s", v->name, ir_value_type_str(v, buf, sizeof buf));
        print_const_preview(f, v);
        fputc('\n', f);
    }
    for (int i = 0; i < g->n_nodes; i++) {
        const ir_node *n = g->nodes[i];
        if (n->dead)
            continue;
        fputc(' ', f);
        int nprinted = 0;
        for (int j = 0; j < n->n_out; j++) {
            if (!n->out[j])
                continue;
            fprintf(f, "%s%%%s", nprinted++ ? ", " : " ", n->out[j]->name);
        }
        fprintf(f, " = %s(", ir_op_name(n->op));
        for (int j = 0; j < n->n_in; j++)
            fprintf(f, "%s%s%s", j ? ", " : "", n->in[j] ? "%" : "", n->in[j] ? n->in[j]->name : "_");
        fputc(')', f);
        if (n->n_attr) {
            fputs(" {", f);
            for (int j = 0; j < n->n_attr; j++) {
                if (j)
                    fputs(", ", f);
                print_attr(f, &n->attrs[j]);
            }
            fputc('}', f);
        }
        fputs(" :", f);
        for (int j = 0; j < n->n_out; j++)
            if (n->out[j])
                fprintf(f, " %s", ir_value_type_str(n->out[j], buf, sizeof buf));
        fprintf(f, "  # %s", n->name);
        if (n->op == IR_OP_ATTENTION)
            fputs(" [causal self-attention]", f);
        fputc('\n', f);
    }
    for (int i = 0; i < g->n_outputs; i++)
        fprintf(f, "output %%%s: %s\n", g->outputs[i]->name,
                ir_value_type_str(g->outputs[i], buf, sizeof buf));
    free(used);
}
