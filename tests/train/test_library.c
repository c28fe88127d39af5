/* test_library.c — the trainer library (train/sbptrain.h) driven directly, as a user's own C
 * program would, with no command line: the bigram step of test_step.c on train_fixture's model
 * and batch.
 *
 *   one SGD step:      the loss and every weight after the update against a float64 reference
 *                      computed here from the model file's initializer (not from the library);
 *   checkpoints:       four AdamW steps stopped after two (a checkpoint written by the library),
 *                      a new run resumed from it for the last two, equal bit for bit to four
 *                      uninterrupted steps;
 *   bad input:         a model that does not exist: open fails, and the sink got one error line
 *                      naming the file.
 *
 *   test_library STEP.so DATA_DIR WORK_DIR
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "ir.h"
#include "sbpio.h"
#include "sbptrain.h"

static const char *step_path, *data_dir, *work_dir;
static char model[4096], ids[4096], labels[4096];

/* The sink: counts the lines of each kind and keeps the last error. */
static int n_errors, n_lines;
static char last_error[2048];
static void line(void *ud, const char *kind, const char *text)
{
    (void)ud;
    n_lines++;
    if (strcmp(kind, "error") == 0) {
        n_errors++;
        snprintf(last_error, sizeof last_error, "%s", text);
    }
}
static const train_sink sink = {line, NULL};

static void base_config(train_config *c)
{
    train_config_init(c);
    c->step_path = step_path;
    c->model_path = model;
    c->ids_path = ids;
    c->labels_path = labels;
    c->threads = 1;
}

/* The float64 reference: loss and gradient of mean cross-entropy with logits = W[ids]. */
static double reference(const float *w, int V, const int32_t *x, const int32_t *y, int64_t n,
                        double *grad)
{
    int scored = 0;
    double loss = 0;
    for (int64_t i = 0; i < n; i++)
        scored += y[i] != -100;
    memset(grad, 0, sizeof(double) * (size_t)(V * V));
    for (int64_t i = 0; i < n; i++) {
        if (y[i] == -100)
            continue;
        const float *row = w + (int64_t)x[i] * V;
        double mx = -INFINITY, s = 0;
        for (int v = 0; v < V; v++)
            mx = fmax(mx, row[v]);
        for (int v = 0; v < V; v++)
            s += exp(row[v] - mx);
        const double lse = mx + log(s);
        loss += (lse - row[y[i]]) / scored;
        for (int v = 0; v < V; v++)
            grad[(int64_t)x[i] * V + v] += (exp(row[v] - lse) - (v == y[i])) / scored;
    }
    return loss;
}

static void test_sgd_step_matches_float64(void **state)
{
    (void)state;
    /* the reference's inputs, read here from the files */
    ir_diag d;
    ir_diag_init(&d, model);
    ir_graph *g = ir_import_onnx(model, &d, NULL);
    assert_non_null(g);
    const ir_value *W = ir_value_find(g, "W");
    assert_non_null(W);
    const int V = (int)W->dims[0].value;
    sbpio_array a, b;
    char err[512];
    assert_int_equal(sbpio_npy_read_i32(ids, &a, err, sizeof err), SBPIO_OK);
    assert_int_equal(sbpio_npy_read_i32(labels, &b, err, sizeof err), SBPIO_OK);
    double *grad = malloc(sizeof(double) * (size_t)(V * V));
    const double loss = reference(W->data, V, a.data, b.data, a.numel, grad);

    train_config c;
    base_config(&c);
    c.adamw = false;
    c.lr = 0.25;
    train_run *r = NULL;
    n_errors = 0;
    assert_int_equal(train_run_open(&r, &c, NULL, &sink), 0);
    assert_int_equal(n_errors, 0);
    train_step_stats st;
    assert_false(train_run_done(r));
    assert_int_equal(train_run_step(r, &st), 0);
    assert_int_equal(train_run_end_step(r, &st), 0);
    assert_true(train_run_done(r));
    assert_int_equal(st.step, 1);
    assert_true(fabs(st.loss - loss) <= 1e-6 * fabs(loss));
    const float *p;
    assert_int_equal(train_run_weights(r, &p), 0);
    const sbp_step_info *in = train_run_info(r);
    assert_int_equal(in->n_params, 1);
    const float *w0 = W->data, *w1 = p + in->params[0].offset;
    double dn = 0, rn = 0;
    for (int i = 0; i < V * V; i++) {
        const double want = w0[i] - 0.25 * grad[i];
        dn += (w1[i] - want) * (w1[i] - want);
        rn += want * want;
    }
    assert_true(sqrt(dn / rn) < 1e-6);
    train_report rep;
    assert_int_equal(train_run_finish(r, &rep), 0);
    assert_true(rep.host_visible);
    assert_true(rep.planned_bytes > 0);
    train_run_close(r);
    free(grad);
    sbpio_array_free(&a);
    sbpio_array_free(&b);
    ir_graph_free(g);
    ir_diag_free(&d);
}

/* Runs steps until `stop_after` (0: to the end), then returns a copy of the weights. */
static float *train_steps(train_config *c, int64_t stop_after, int64_t *first)
{
    train_run *r = NULL;
    n_errors = 0;
    if (train_run_open(&r, c, NULL, &sink))
        fail_msg("train_run_open: %s", last_error);
    *first = train_run_next_step(r);
    train_step_stats st;
    while (!train_run_done(r) && (!stop_after || train_run_next_step(r) <= stop_after)) {
        assert_int_equal(train_run_step(r, &st), 0);
        assert_int_equal(train_run_end_step(r, &st), 0);
    }
    const float *p;
    assert_int_equal(train_run_weights(r, &p), 0);
    const size_t n = train_run_info(r)->param_elems;
    float *copy = malloc(n * sizeof *copy);
    memcpy(copy, p, n * sizeof *copy);
    train_run_close(r);
    assert_int_equal(n_errors, 0);
    return copy;
}

static void test_checkpoint_round_trip(void **state)
{
    (void)state;
    char dir[4200]; /* a new folder each run: the checkpoints are this run's alone */
    mkdir(work_dir, 0755);
    snprintf(dir, sizeof dir, "%s/ckpt-XXXXXX", work_dir);
    assert_non_null(mkdtemp(dir));
    train_config c;
    base_config(&c);
    c.steps = 4;
    c.lr = 0.05;
    int64_t first;
    float *whole = train_steps(&c, 0, &first); /* four steps, no checkpoints */
    assert_int_equal(first, 1);
    base_config(&c);
    c.steps = 4;
    c.lr = 0.05;
    c.ckpt.dir = dir;
    c.ckpt.every = 2;
    float *half = train_steps(&c, 2, &first); /* steps 1-2, checkpoint after 2 */
    free(half);
    base_config(&c);
    c.steps = 4;
    c.lr = 0.05;
    c.ckpt.resume = dir;
    float *resumed = train_steps(&c, 0, &first); /* steps 3-4 from the checkpoint */
    assert_int_equal(first, 3);
    assert_memory_equal(whole, resumed, 16 * 16 * sizeof(float));
    free(whole);
    free(resumed);
}

static void test_missing_model_is_an_error(void **state)
{
    (void)state;
    train_config c;
    base_config(&c);
    char missing[4200];
    snprintf(missing, sizeof missing, "%s/no-such-model.onnx", work_dir);
    c.model_path = missing;
    train_run *r = NULL;
    n_errors = 0;
    assert_int_equal(train_run_open(&r, &c, NULL, &sink), -1);
    assert_true(n_errors >= 1);
    assert_non_null(strstr(last_error, "no-such-model.onnx"));
    train_run_close(r);
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: test_library STEP.so DATA_DIR WORK_DIR\n");
        return 2;
    }
    step_path = argv[1];
    data_dir = argv[2];
    work_dir = argv[3];
    snprintf(model, sizeof model, "%s/bigram.onnx", data_dir);
    snprintf(ids, sizeof ids, "%s/i32_ids.npy", data_dir);
    snprintf(labels, sizeof labels, "%s/i32_labels.npy", data_dir);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sgd_step_matches_float64),
        cmocka_unit_test(test_checkpoint_round_trip),
        cmocka_unit_test(test_missing_model_is_an_error),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
