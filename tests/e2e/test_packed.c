/* test_packed.c — packed documents (sbpc --packed) end to end.
 *
 * The references (tests/fixtures/gen_packed.py, float64 PyTorch) run every document of a
 * packed batch ALONE, as a sequence of its own with positions from 0, and combine the losses as
 * the packed batch's objective does. The packed step must give the same loss (<= 1e-5 relative)
 * and gradients (<= 1e-4 per tensor), with store and with stream at chunk sizes that cut
 * documents in the middle (17, 5 and 1 token; logits chunks 13 and 1), and stream must equal
 * store (<= 1e-5). The SFT batch (B = 2, T = 64) holds a row of five documents (of 1, 17, 5,
 * 30 and 11 tokens, one with an unscored prompt) and a row that is one document, for GPT-2
 * (learned positions: its position table is read by document position), Llama and Qwen3
 * (RoPE, GQA). DPO and GRPO (Llama, B = 4) on rows cut into documents: a row's logp sums over
 * its documents.
 *
 * RoPE is relative (q.k depends only on the position difference), so for Llama and Qwen3 the
 * references cannot tell positions within the document from positions within the row: that
 * RoPE reads the document positions is checked on the program instead; GPT-2's learned table
 * is where positions show (without passes/graph/packed.c its loss is off by 3e-4, its gradients by
 * 1e0).
 *
 * Also: the evaluation entry point of a packed step gives the training loss; a packed step
 * refuses a call without document ids (SBPRT_ERR_INVALID), and a decreasing id is an error
 * (SBPRT_ERR_RANGE), never a silently wrong loss; the same batch given as one document per row
 * with one id per row is the unpacked step's loss. Packing must change the result: the
 * packed loss differs from the unpacked step's on the same tokens (the test would pass
 * vacuously if the document ids were ignored).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "e2e_util.h"

#define B E2E_B
#define T E2E_T
#define PB 4

typedef struct batch {
    int64_t b;
    int32_t ids[PB * T], labels[PB * T], docs[PB * T];
} batch;

static void load_sft(batch *x)
{
    x->b = B;
    e2e_read_i32("packed_input_ids.npy", x->ids, B * T);
    e2e_read_i32("packed_labels.npy", x->labels, B * T);
    e2e_read_i32("packed_doc_ids.npy", x->docs, B * T);
}

static double run_packed(const e2e_step *s, const float *params, float *grads, const batch *x,
                         const float *ref, const float *old, const float *adv)
{
    sbp_step_args a = {.params = params, .grads = grads, .input_ids = x->ids,
                       .labels = x->labels, .doc_ids = x->docs, .ref_logps = ref,
                       .old_logps = old, .advantages = adv};
    return e2e_run(s, &a, true);
}

typedef struct strat {
    sbp_strategy strategy;
    int64_t chunk, logits_chunk;
} strat;

static const strat strategies[] = {
    {SBP_STRATEGY_STORE, 0, 0},
    {SBP_STRATEGY_CHECKPOINT, 0, 0},
    {SBP_STRATEGY_STREAM, 0, 0},
    {SBP_STRATEGY_STREAM, 17, 13},
    {SBP_STRATEGY_STREAM, 5, 7},
    {SBP_STRATEGY_STREAM, 1, 1},
};

/* Every strategy of the family against the reference `file` and against store. */
static void family_case(const char *family, sbp_objective obj, const char *file,
                        const batch *x, const float *ref, const float *old, const float *adv)
{
    char model[128];
    snprintf(model, sizeof model, "%s_op17_dyn.onnx", family);
    e2e_reference r;
    e2e_load_reference(&r, family, file);
    e2e_step st = {0};
    float *params = NULL, *gstore = NULL;
    double lstore = 0;
    for (size_t si = 0; si < sizeof strategies / sizeof strategies[0]; si++) {
        const strat *sc = &strategies[si];
        sbp_train_options o = {.strategy = sc->strategy, .chunk = sc->chunk,
                               .logits_chunk = sc->logits_chunk, .packed = true,
                               .beta = sbp_objective_default_beta(obj),
                               .epsilon = obj == SBP_OBJECTIVE_GRPO ? 0.2 : 0,
                               .eval = obj == SBP_OBJECTIVE_SFT};
        char tag[160];
        snprintf(tag, sizeof tag, "packed_%s_%s_%s_%lld_%lld", family, sbp_objective_name(obj),
                 sbp_strategy_name(sc->strategy), (long long)sc->chunk,
                 (long long)sc->logits_chunk);
        e2e_step s = {0};
        e2e_compile(&s, model, x->b, T, obj, NULL, &o, tag);
        assert_int_equal(s.info->packed, 1);
        if (!params)
            params = e2e_param_block(s.info, s.g);
        float *g = malloc(sizeof *g * (s.info->param_elems + 1));
        assert_non_null(g);
        double l = run_packed(&s, params, g, x, ref, old, adv);
        double e_ref = e2e_max_rel_vs_ref(&s, g, &r, true);
        double e_loss = fabs(l - r.loss) / fabs(r.loss);
        double e_store = 0, e_lstore = 0;
        if (si > 0) {
            e_store = e2e_max_rel_vs(&s, g, &st, gstore, E2E_STORE_TOL);
            e_lstore = fabs(l - lstore) / fabs(lstore);
        }
        print_message("  %-44s loss %.9f (PyTorch %.9f, rel %.1e; vs store %.1e)  grads: vs "
                      "PyTorch %.1e, vs store %.1e\n",
                      tag, l, r.loss, e_loss, e_lstore, e_ref, e_store);
        assert_true(e_loss <= E2E_REF_LOSS_TOL);
        assert_true(e_ref <= E2E_REF_GRAD_TOL);
        assert_true(e_lstore <= E2E_STORE_TOL);
        assert_true(e_store <= E2E_STORE_TOL);
        if (obj == SBP_OBJECTIVE_SFT) { /* the evaluation entry point: the same loss */
            int (*ev)(sbprt_ctx *, const sbp_step_args *);
            *(void **)&ev = dlsym(s.lib, "sbp_step_eval");
            assert_non_null(ev);
            size_t wsb = s.info->eval_workspace_bytes;
            void *ws = aligned_alloc(SBPRT_ALIGN, (wsb + SBPRT_ALIGN - 1) / SBPRT_ALIGN *
                                                      SBPRT_ALIGN);
            assert_non_null(ws);
            memset(ws, 0xff, wsb);
            double le = NAN;
            sbp_step_args a = {.params = params, .input_ids = x->ids, .labels = x->labels,
                               .doc_ids = x->docs, .workspace = ws, .loss = &le};
            assert_int_equal(ev(e2e_ctx, &a), SBPRT_OK);
            assert_true(fabs(le - l) <= 1e-6 * fabs(l));
            free(ws);
        }
        if (si == 0) {
            st = s;
            gstore = g;
            lstore = l;
        } else {
            free(g);
            e2e_free_step(&s);
        }
    }
    free(params);
    free(gstore);
    e2e_free_step(&st);
    e2e_free_reference(&r);
}

static void sft_family(const char *family)
{
    batch x;
    load_sft(&x);
    char file[128];
    snprintf(file, sizeof file, "%s_packed_grads.safetensors", family);
    family_case(family, SBP_OBJECTIVE_SFT, file, &x, NULL, NULL, NULL);
}

static void test_gpt2(void **state) { (void)state; sft_family("gpt2"); }
static void test_llama(void **state) { (void)state; sft_family("llama"); }
static void test_qwen3(void **state) { (void)state; sft_family("qwen3"); }

static void test_llama_dpo_grpo(void **state)
{
    (void)state;
    batch x;
    x.b = PB;
    e2e_read_i32("pref_packed_input_ids.npy", x.ids, PB * T);
    e2e_read_i32("pref_packed_labels.npy", x.labels, PB * T);
    e2e_read_i32("pref_packed_doc_ids.npy", x.docs, PB * T);
    float dpo_ref[PB], adv[PB], old[PB * T], ref[PB * T];
    e2e_read_f32("llama_dpo_ref_logps.npy", dpo_ref, PB);
    e2e_read_f32("llama_grpo_advantages.npy", adv, PB);
    e2e_read_f32("llama_grpo_old_logps.npy", old, PB * T);
    e2e_read_f32("llama_grpo_ref_logps.npy", ref, PB * T);
    family_case("llama", SBP_OBJECTIVE_DPO, "llama_packed_dpo_grads.safetensors", &x, dpo_ref,
                NULL, NULL);
    family_case("llama", SBP_OBJECTIVE_GRPO, "llama_packed_grpo_seq_grads.safetensors", &x, ref,
                old, adv);
}

/* The document ids matter, are required, and are checked. */
static void test_ids(void **state)
{
    (void)state;
    batch x;
    load_sft(&x);
    e2e_step pk = {0}, un = {0};
    sbp_train_options o = {.strategy = SBP_STRATEGY_STREAM, .chunk = 17, .logits_chunk = 13,
                           .packed = true};
    e2e_compile(&pk, "qwen3_op17_dyn.onnx", B, T, SBP_OBJECTIVE_SFT, NULL, &o, "packed_ids");
    o.packed = false;
    e2e_compile(&un, "qwen3_op17_dyn.onnx", B, T, SBP_OBJECTIVE_SFT, NULL, &o, "packed_ids_un");
    assert_int_equal(un.info->packed, 0);
    /* RoPE is relative (q.k depends on the position difference), so the references cannot
     * tell document positions from row positions: check the program reads them instead */
    int ropes = 0;
    for (int bi = 0; bi < pk.p->n_blocks; bi++)
        for (int i = 0; i < pk.p->blocks[bi]->n_insts; i++) {
            const tp_inst *in = &pk.p->blocks[bi]->insts[i];
            if (in->k == TP_K_ROPE_FWD || in->k == TP_K_ROPE_BWD) {
                assert_int_equal(in->buf[2], pk.p->doc_pos_buf);
                ropes++;
            }
            assert_true(in->k != TP_K_ATTENTION_FWD && in->k != TP_K_ATTENTION_BWD);
        }
    assert_true(ropes > 0);
    float *params = e2e_param_block(pk.info, pk.g);
    float *g = malloc(sizeof *g * (pk.info->param_elems + 1));
    assert_non_null(g);
    /* one document per row: the unpacked step's loss (bit for bit is not promised: the packed
     * kernels may order the work differently; 1e-6) */
    batch one = x;
    memset(one.docs, 0, sizeof one.docs);
    for (int i = T; i < B * T; i++)
        one.docs[i] = 7; /* any constant per row */
    double l_one = run_packed(&pk, params, g, &one, NULL, NULL, NULL);
    sbp_step_args a = {.params = params, .grads = g, .input_ids = x.ids, .labels = x.labels};
    double l_un = e2e_run(&un, &a, true);
    print_message("  one document per row: packed %.9f, unpacked %.9f\n", l_one, l_un);
    assert_true(fabs(l_one - l_un) <= 1e-6 * fabs(l_un));
    /* the real documents: a different loss (the tiny random model is nearly uniform, so
     * attention moves the loss little: 7e-4 relative; float noise is 1e-7) */
    double l_pk = run_packed(&pk, params, g, &x, NULL, NULL, NULL);
    print_message("  packed documents %.9f vs one per row %.9f\n", l_pk, l_one);
    assert_true(fabs(l_pk - l_one) > 1e-4 * fabs(l_one));
    /* no document ids: refused; a decreasing id: an error */
    size_t wsb = pk.info->workspace_bytes;
    void *ws = aligned_alloc(SBPRT_ALIGN, (wsb + SBPRT_ALIGN - 1) / SBPRT_ALIGN * SBPRT_ALIGN);
    assert_non_null(ws);
    double loss = NAN;
    sbp_step_args n = {.params = params, .grads = g, .input_ids = x.ids, .labels = x.labels,
                       .workspace = ws, .loss = &loss};
    assert_int_equal(pk.run(e2e_ctx, &n), SBPRT_ERR_INVALID);
    batch bad = x;
    bad.docs[10] = 0; /* row 0: ... 1, 0, ... */
    n.doc_ids = bad.docs;
    assert_int_equal(pk.run(e2e_ctx, &n), SBPRT_ERR_RANGE);
    free(ws);
    free(g);
    free(params);
    e2e_free_step(&pk);
    e2e_free_step(&un);
}

int main(int argc, char **argv)
{
    e2e_init();
    if (sbprt_ctx_create(&e2e_ctx, 0) != SBPRT_OK)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ids),
        cmocka_unit_test(test_gpt2),
        cmocka_unit_test(test_llama),
        cmocka_unit_test(test_qwen3),
        cmocka_unit_test(test_llama_dpo_grpo),
    };
    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    sbprt_ctx_destroy(e2e_ctx);
    return rc;
}
