/* diag.c — diagnostics collected by library code and printed by the tools.
 *
 * Library code never exits: it records what went wrong and where (file, node name, op type) and
 * returns IR_ERR. The tools print every entry in the compiler style users know from cc:
 *   sbpc: model.onnx: node '/blocks.0/Add_3' (Add): error: ...
 * Allocation failures inside the diagnostics themselves are ignored (a message is dropped) so
 * that reporting can never be the thing that crashes.
 */
#include "ir.h"

#include <stdlib.h>
#include <string.h>

static char *dup_or_null(const char *s) { return s ? strdup(s) : NULL; }

void ir_diag_init(ir_diag *d, const char *file)
{
    memset(d, 0, sizeof *d);
    d->file = dup_or_null(file);
}

void ir_diag_free(ir_diag *d)
{
    for (int i = 0; i < d->n; i++) {
        free(d->entries[i].file);
        free(d->entries[i].node);
        free(d->entries[i].op);
        free(d->entries[i].msg);
    }
    free(d->entries);
    free(d->file);
    memset(d, 0, sizeof *d);
}

void ir_diag_set_file(ir_diag *d, const char *file)
{
    free(d->file);
    d->file = dup_or_null(file);
}

static int diag_vadd(ir_diag *d, ir_severity sev, const char *node, const char *op,
                     const char *fmt, va_list ap)
{
    if (sev == IR_SEV_ERROR)
        d->n_errors++;
    if (d->n == d->cap) {
        int nc = d->cap ? d->cap * 2 : 16;
        ir_diag_entry *ne = realloc(d->entries, (size_t)nc * sizeof *ne);
        if (!ne)
            return sev == IR_SEV_ERROR ? IR_ERR : IR_OK;
        d->entries = ne;
        d->cap = nc;
    }
    char buf[1024];
    vsnprintf(buf, sizeof buf, fmt, ap);
    ir_diag_entry *e = &d->entries[d->n++];
    e->sev = sev;
    e->file = dup_or_null(d->file);
    e->node = dup_or_null(node);
    e->op = dup_or_null(op);
    e->msg = strdup(buf);
    return sev == IR_SEV_ERROR ? IR_ERR : IR_OK;
}

int ir_diag_add(ir_diag *d, ir_severity sev, const char *node, const char *op, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int r = diag_vadd(d, sev, node, op, fmt, ap);
    va_end(ap);
    return r;
}

int ir_diag_error(ir_diag *d, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int r = diag_vadd(d, IR_SEV_ERROR, NULL, NULL, fmt, ap);
    va_end(ap);
    return r;
}

void ir_diag_note(ir_diag *d, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    diag_vadd(d, IR_SEV_NOTE, NULL, NULL, fmt, ap);
    va_end(ap);
}

void ir_diag_print(const ir_diag *d, FILE *f, const char *prog)
{
    ir_diag_print_from(d, 0, f, prog);
}

void ir_diag_print_from(const ir_diag *d, int first, FILE *f, const char *prog)
{
    static const char *sevname[] = {"note", "warning", "error"};
    for (int i = first < 0 ? 0 : first; i < d->n; i++) {
        const ir_diag_entry *e = &d->entries[i];
        if (prog)
            fprintf(f, "%s: ", prog);
        if (e->file)
            fprintf(f, "%s: ", e->file);
        if (e->node)
            fprintf(f, "node '%s' (%s): ", e->node, e->op ? e->op : "?");
        fprintf(f, "%s: %s\n", sevname[e->sev], e->msg ? e->msg : "(message lost)");
    }
}
