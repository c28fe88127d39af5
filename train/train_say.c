/* train_say.c — the library's lines, formatted here and handed to the caller's sink
 * (train_say.h). Long lines are formatted into a heap buffer rather than cut. */
#include "train_say.h"

#include "ir.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

static void send(const train_sink *s, const char *kind, const char *fmt, va_list ap)
{
    if (!s || !s->line)
        return;
    char small[1024], *buf = small;
    va_list again;
    va_copy(again, ap);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    if (n >= (int)sizeof small) {
        buf = malloc((size_t)n + 1);
        if (buf)
            vsnprintf(buf, (size_t)n + 1, fmt, again);
        else
            buf = small; /* cut short rather than lost */
    }
    va_end(again);
    s->line(s->ud, kind, n < 0 ? fmt : buf);
    if (buf != small)
        free(buf);
}

void train_say(const train_sink *s, const char *kind, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    send(s, kind, fmt, ap);
    va_end(ap);
}

int train_err(const train_sink *s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    send(s, "error", fmt, ap);
    va_end(ap);
    return -1;
}

void train_note(const train_sink *s, const char *text)
{
    if (s && s->line)
        s->line(s->ud, "note", text);
}

void train_say_ir(const train_sink *s, const ir_diag *d)
{
    static const char *const sevname[] = {"note", "warning", "error"};
    for (int i = 0; i < d->n; i++) {
        const ir_diag_entry *e = &d->entries[i];
        char node[600] = "";
        if (e->node)
            snprintf(node, sizeof node, "node '%s' (%s): ", e->node, e->op ? e->op : "?");
        train_say(s, "", "%s%s%s%s: %s", e->file ? e->file : "", e->file ? ": " : "", node,
                  sevname[e->sev], e->msg ? e->msg : "(message lost)");
    }
}

char *train_shape_str(char *buf, size_t n, int rank, const int64_t *dims)
{
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < rank && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? "," : "", (long long)dims[i]);
    if (k < n)
        snprintf(buf + k, n - k, "]");
    return buf;
}
