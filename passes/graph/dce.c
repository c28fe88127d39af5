/* dce.c — dead-code elimination.
 *
 * Requires: a graph in topological order. Produces: only the nodes from which a graph output
 * can be reached remain (a backward sweep over the node list marks what the outputs need).
 * Values are never deleted (ids index graph->values); a parameter or constant that no live
 * node reads any more simply has no uses, and the printer and code generator list only values
 * that are used.
 */
#include "passes.h"

#include <stdlib.h>

int sbp_pass_dce(ir_graph *g)
{
    bool *needed = calloc((size_t)g->n_values + 1, sizeof *needed);
    if (!needed)
        return ir_diag_error(g->diag, "out of memory in dce");
    for (int i = 0; i < g->n_outputs; i++)
        if (g->outputs[i])
            needed[g->outputs[i]->id] = true;
    for (int i = g->n_nodes - 1; i >= 0; i--) {
        ir_node *n = g->nodes[i];
        if (n->dead)
            continue;
        bool live = false;
        for (int j = 0; j < n->n_out && !live; j++)
            live = n->out[j] && needed[n->out[j]->id];
        if (!live) {
            n->dead = true;
            continue;
        }
        for (int j = 0; j < n->n_in; j++)
            if (n->in[j])
                needed[n->in[j]->id] = true;
    }
    free(needed);
    ir_graph_compact(g);
    return IR_OK;
}
