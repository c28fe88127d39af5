/* test_fixtures.c — import, bind_dims(2, 64), fold, dce on every tests/fixtures/ ONNX model.
 *
 * What must hold afterwards: the verifier passes; no shape arithmetic is left (no Shape, Size,
 * ConstantOfShape, Range, and no node whose inputs are all constants: Gather/Concat/Unsqueeze/
 * Expand/... of constants would have folded); every live value has a fully known shape. The
 * op counts that remain (the compute) are printed per fixture. */
#include "pass_test.h"

#include <dirent.h>
#include <errno.h>
#include <unistd.h>

#include "../intree_fixtures.h"

#ifndef SBP_FIXTURES_DIR
#define SBP_FIXTURES_DIR "tests/fixtures"
#endif

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static bool check_one(const char *path)
{
    ir_diag d;
    ir_diag_init(&d, path);
    ir_graph *g = ir_import_onnx(path, &d, &(ir_import_options){0});
    bool ok = g != NULL;
    if (ok)
        ok = sbp_pass_bind_dims(g, 2, 64) == IR_OK && sbp_pass_fold(g) == IR_OK &&
             sbp_pass_dce(g) == IR_OK && ir_verify(g) == IR_OK;
    if (!ok) {
        fprintf(stderr, "%s: failed\n", path);
        diag_dump(&d);
    }
    if (g && ok) {
        for (int i = 0; i < g->n_nodes; i++) {
            ir_node *n = g->nodes[i];
            bool all_const = n->n_in > 0;
            for (int j = 0; j < n->n_in; j++)
                if (n->in[j] && !ir_value_is_const(n->in[j]))
                    all_const = false;
            if (n->op == IR_OP_SHAPE || n->op == IR_OP_SIZE || n->op == IR_OP_CONSTANT_OF_SHAPE ||
                n->op == IR_OP_RANGE || n->op == IR_OP_CONSTANT || all_const) {
                fprintf(stderr, "%s: shape arithmetic left: node '%s' (%s)\n", path, n->name,
                        n->op_type);
                ok = false;
            }
            for (int j = 0; j < n->n_out; j++)
                if (n->out[j] && !ir_value_shape_known(n->out[j])) {
                    fprintf(stderr, "%s: node '%s' (%s) output '%s' has type %s\n", path, n->name,
                            n->op_type, n->out[j]->name, tstr(n->out[j]));
                    ok = false;
                }
        }
        int counts[IR_OP_COUNT] = {0};
        for (int i = 0; i < g->n_nodes; i++)
            counts[g->nodes[i]->op]++;
        const char *slash = strrchr(path, '/');
        printf("%-28s %3d nodes:", slash ? slash + 1 : path, g->n_nodes);
        for (int op = 0; op < IR_OP_COUNT; op++)
            if (counts[op])
                printf(" %s=%d", ir_op_name((ir_op)op), counts[op]);
        printf("\n");
    }
    ir_graph_free(g);
    ir_diag_free(&d);
    return ok;
}

/* The fixtures are committed (../intree_fixtures.h): a missing folder or model is a failure. */
static void test_fixtures(void **state)
{
    (void)state;
    int missing = 0;
    for (int i = 0; i < SBP_N_INTREE_FIXTURES; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", SBP_FIXTURES_DIR, sbp_intree_fixtures[i]);
        if (access(path, R_OK) != 0) {
            print_error("in-tree fixture %s is missing or unreadable: %s\n", path,
                        strerror(errno));
            missing++;
        }
    }
    DIR *dir = opendir(SBP_FIXTURES_DIR);
    if (!dir)
        fail_msg("cannot open the fixture folder %s: %s (it is committed: a missing folder is "
                 "a failure, not a skip)",
                 SBP_FIXTURES_DIR, strerror(errno));
    char *names[256];
    int n = 0;
    for (struct dirent *e; (e = readdir(dir)) && n < 256;) {
        size_t l = strlen(e->d_name);
        if (l > 5 && strcmp(e->d_name + l - 5, ".onnx") == 0)
            names[n++] = strdup(e->d_name);
    }
    closedir(dir);
    qsort(names, (size_t)n, sizeof *names, cmp_str);
    int bad = 0;
    for (int i = 0; i < n; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", SBP_FIXTURES_DIR, names[i]);
        if (!check_one(path))
            bad++;
        free(names[i]);
    }
    if (missing)
        fail_msg("%d in-tree fixture model(s) missing from %s (a failure, not a skip)", missing,
                 SBP_FIXTURES_DIR);
    assert_true(n >= SBP_N_INTREE_FIXTURES);
    assert_int_equal(bad, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixtures),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
