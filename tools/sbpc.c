/* sbpc.c — the compiler driver.
 *
 *   sbpc MODEL.onnx [--batch N] [--seq-len N] [--no-retie] [--dump-ir[=PASS]]
 *
 * Reads the model, runs the canonicalisation pipeline (passes/pipeline.c) and prints the IR or a
 * summary. This is the only place where diagnostics become exit codes: library code records them,
 * the driver prints them compiler-style and exits 1.
 */
#include "ir.h"
#include "passes.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static const char *prog = "sbpc";

static void usage(FILE *f)
{
    fprintf(f,
            "usage: sbpc MODEL.onnx [options]\n"
            "\n"
            "Compiles an ONNX export of a transformer language model into a training step.\n"
            "\n"
            "options:\n"
            "  --batch N          bind the symbolic batch dim to N\n"
            "  --seq-len N        bind the symbolic sequence dim to N\n"
            "  --no-retie         keep a tied weight that the exporter duplicated as two\n"
            "                     separate parameters\n"
            "  --dump-ir[=PASS]   print the IR after PASS (default: the last pass)\n"
            "  -h, --help         this text\n"
            "  --version          print the version\n"
            "\n"
            "passes (for --dump-ir=PASS):\n");
    for (int i = 0; i < sbp_n_passes; i++)
        fprintf(f, "  %-12s %s\n", sbp_pass_list[i].name, sbp_pass_list[i].what);
}

/* A strict positive count: decimal digits only, no sign, no trailing junk, at most 2^30 (no
 * transformer batch or sequence is larger, and it keeps every later product in range). */
static int parse_count(const char *flag, const char *s, int64_t *out)
{
    if (!s || !*s) {
        fprintf(stderr, "%s: error: %s needs a value\n", prog, flag);
        return -1;
    }
    for (const char *p = s; *p; p++)
        if (*p < '0' || *p > '9') {
            fprintf(stderr, "%s: error: %s: '%s' is not a positive integer\n", prog, flag, s);
            return -1;
        }
    errno = 0;
    long long v = strtoll(s, NULL, 10);
    if (errno || v <= 0 || v > (1ll << 30)) {
        fprintf(stderr, "%s: error: %s: '%s' is out of range (1 to %lld)\n", prog, flag, s,
                1ll << 30);
        return -1;
    }
    *out = v;
    return 0;
}

/* "--flag=value" or "--flag value"; advances *i in the second form. */
static const char *flag_value(int argc, char **argv, int *i, const char *flag)
{
    size_t n = strlen(flag);
    if (strncmp(argv[*i], flag, n) == 0 && argv[*i][n] == '=')
        return argv[*i] + n + 1;
    if (strcmp(argv[*i], flag) == 0) {
        if (*i + 1 >= argc)
            return "";
        return argv[++*i];
    }
    return NULL;
}

static void summary(const ir_graph *g)
{
    int64_t params = 0;
    int nparams = 0;
    for (int i = 0; i < g->n_values; i++) {
        const ir_value *v = g->values[i];
        if (v->kind == IR_VAL_PARAM && !v->tied_to && ir_value_use_count(g, v) > 0) {
            nparams++;
            params += ir_value_numel(v);
        }
    }
    printf("%s: %d nodes, %d parameter tensors (%lld elements), %d attention layers\n", g->path,
           g->n_nodes, nparams, (long long)params, ir_graph_count_op(g, IR_OP_ATTENTION));
}

int main(int argc, char **argv)
{
    const char *model = NULL, *dump_pass = NULL;
    bool dump = false;
    sbp_pass_options opt = {.verify = true};

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(a, "--version") == 0) {
            printf("sbpc %s\n", SBP_VERSION);
            return 0;
        } else if ((v = flag_value(argc, argv, &i, "--batch"))) {
            if (parse_count("--batch", v, &opt.batch))
                return 1;
        } else if ((v = flag_value(argc, argv, &i, "--seq-len"))) {
            if (parse_count("--seq-len", v, &opt.seq_len))
                return 1;
        } else if (strcmp(a, "--no-retie") == 0) {
            opt.no_retie = true;
        } else if (strcmp(a, "--dump-ir") == 0) {
            dump = true;
        } else if (strncmp(a, "--dump-ir=", 10) == 0) {
            dump = true;
            dump_pass = a + 10;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "%s: error: unknown option '%s' (see --help)\n", prog, a);
            return 1;
        } else if (model) {
            fprintf(stderr, "%s: error: more than one model given ('%s' and '%s')\n", prog, model,
                    a);
            return 1;
        } else {
            model = a;
        }
    }
    if (!model) {
        fprintf(stderr, "%s: error: no model given\n", prog);
        usage(stderr);
        return 1;
    }

    ir_diag diag;
    ir_diag_init(&diag, model);
    int rc = 0;
    ir_graph *g = ir_import_onnx(model, &diag, NULL);
    if (!g || diag.n_errors) {
        rc = 1;
    } else if (sbp_canonicalize(g, &opt, dump_pass) != IR_OK) {
        rc = 1;
    }
    ir_diag_print(&diag, stderr, prog);
    if (rc == 0) {
        if (dump)
            ir_print(g, stdout);
        else
            summary(g);
    }
    ir_graph_free(g);
    ir_diag_free(&diag);
    return rc;
}
