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
 * Per document (sbpc --packed --per-document; gen_packed.py's per-document batch, Llama, B = 4:
 * rows of 3, 2, 3 and 2 documents, with runs that are not documents because nothing in them is
 * scored): the reference treats every document as a sequence of its own, DPO over the pairs
 * (document k of row i, document k of row 2 + i) with TRL's sigmoid loss, GRPO with each
 * document's advantage and, for the sequence normalisation, the mean over documents of their
 * mean token losses; the same bounds, every strategy. The DPO step's row_logps hold each
 * document's logp at b*T + k (within 1e-6 of the float64 one) and 0 elsewhere; a pair whose rows
 * hold different numbers of documents is refused (SBPRT_ERR_INVALID), and a batch of one
 * document per row gives the per-row step's loss and gradients.
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

static double run_packed_rows(const e2e_step *s, const float *params, float *grads,
                              const batch *x, const float *ref, const float *old,
                              const float *adv, double *row_logps)
{
    sbp_step_args a = {.params = params, .grads = grads, .input_ids = x->ids,
                       .labels = x->labels, .doc_ids = x->docs, .ref_logps = ref,
                       .old_logps = old, .advantages = adv, .row_logps = row_logps};
    return e2e_run(s, &a, true);
}

static double run_packed(const e2e_step *s, const float *params, float *grads, const batch *x,
                         const float *ref, const float *old, const float *adv)
{
    return run_packed_rows(s, params, grads, x, ref, old, adv, NULL);
}

/* The objective's unit: the row, or each document (--per-document) with the GRPO
 * normalisation, and for a per-document DPO step each document's float64 logp [PB*T] (at
 * b*T + k) that its row_logps must hold (NULL: not checked). */
typedef struct unit {
    bool per_document;
    sbp_grpo_norm norm;
    const float *doc_logps;
} unit;

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
static void family_case_unit(const char *family, sbp_objective obj, const char *file,
                             const batch *x, const float *ref, const float *old,
                             const float *adv, const unit *u)
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
                               .grpo_norm = u->norm, .per_document = u->per_document,
                               .eval = obj == SBP_OBJECTIVE_SFT};
        char tag[160];
        snprintf(tag, sizeof tag, "packed_%s%s_%s%s_%s_%lld_%lld", u->per_document ? "doc_" : "",
                 family, sbp_objective_name(obj),
                 obj == SBP_OBJECTIVE_GRPO && u->norm == SBP_GRPO_NORM_TOKEN ? "_token" : "",
                 sbp_strategy_name(sc->strategy), (long long)sc->chunk,
                 (long long)sc->logits_chunk);
        e2e_step s = {0};
        e2e_compile(&s, model, x->b, T, obj, NULL, &o, tag);
        assert_int_equal(s.info->packed, 1);
        assert_int_equal(s.info->per_document, u->per_document);
        if (!params)
            params = e2e_param_block(s.info, s.g);
        float *g = malloc(sizeof *g * (s.info->param_elems + 1));
        assert_non_null(g);
        double rows[PB * T];
        for (int i = 0; i < PB * T; i++)
            rows[i] = NAN;
        double l = run_packed_rows(&s, params, g, x, ref, old, adv, u->doc_logps ? rows : NULL);
        if (u->doc_logps) { /* each document's logp at b*T + k, 0 elsewhere */
            double worst = 0;
            for (int i = 0; i < PB * T; i++) {
                double want = u->doc_logps[i];
                if (want == 0)
                    assert_true(rows[i] == 0);
                worst = fmax(worst, fabs(rows[i] - want) / fmax(1.0, fabs(want)));
            }
            print_message("  %-44s row_logps: each document's within %.1e of float64\n", tag,
                          worst);
            assert_true(worst <= 1e-6);
        }
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

static void family_case(const char *family, sbp_objective obj, const char *file,
                        const batch *x, const float *ref, const float *old, const float *adv)
{
    const unit per_row = {false, SBP_GRPO_NORM_SEQUENCE, NULL};
    family_case_unit(family, obj, file, x, ref, old, adv, &per_row);
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

/* gen_packed.py's per-document batch and inputs: one value per document at [b, k]. */
typedef struct doc_inputs {
    batch x;
    float dpo_ref[PB * T], adv[PB * T], old[PB * T], ref[PB * T], logps[PB * T];
} doc_inputs;

static void load_doc_inputs(doc_inputs *d)
{
    d->x.b = PB;
    e2e_read_i32("pref_doc_input_ids.npy", d->x.ids, PB * T);
    e2e_read_i32("pref_doc_labels.npy", d->x.labels, PB * T);
    e2e_read_i32("pref_doc_doc_ids.npy", d->x.docs, PB * T);
    e2e_read_f32("llama_doc_dpo_ref_logps.npy", d->dpo_ref, PB * T);
    e2e_read_f32("llama_doc_grpo_advantages.npy", d->adv, PB * T);
    e2e_read_f32("llama_doc_grpo_old_logps.npy", d->old, PB * T);
    e2e_read_f32("llama_doc_grpo_ref_logps.npy", d->ref, PB * T);
    e2e_read_f32("llama_doc_logps.npy", d->logps, PB * T);
}

static void test_llama_per_document(void **state)
{
    (void)state;
    static doc_inputs d;
    load_doc_inputs(&d);
    const unit dpo = {true, SBP_GRPO_NORM_SEQUENCE, d.logps};
    const unit seq = {true, SBP_GRPO_NORM_SEQUENCE, NULL};
    const unit tok = {true, SBP_GRPO_NORM_TOKEN, NULL};
    family_case_unit("llama", SBP_OBJECTIVE_DPO, "llama_packed_doc_dpo_grads.safetensors", &d.x,
                     d.dpo_ref, NULL, NULL, &dpo);
    family_case_unit("llama", SBP_OBJECTIVE_GRPO, "llama_packed_doc_grpo_seq_grads.safetensors",
                     &d.x, d.ref, d.old, d.adv, &seq);
    family_case_unit("llama", SBP_OBJECTIVE_GRPO,
                     "llama_packed_doc_grpo_token_grads.safetensors", &d.x, d.ref, d.old, d.adv,
                     &tok);
}

/* A per-document DPO step refuses a pair of rows that hold different numbers of documents;
 * with one document per row it is the per-row step. */
static void test_per_document_pairs(void **state)
{
    (void)state;
    static doc_inputs d;
    load_doc_inputs(&d);
    e2e_step doc = {0}, row = {0};
    sbp_train_options o = {.strategy = SBP_STRATEGY_STREAM, .chunk = 5, .logits_chunk = 7,
                           .packed = true, .per_document = true,
                           .beta = sbp_objective_default_beta(SBP_OBJECTIVE_DPO)};
    e2e_compile(&doc, "llama_op17_dyn.onnx", PB, T, SBP_OBJECTIVE_DPO, NULL, &o, "packed_doc_pairs");
    o.per_document = false;
    e2e_compile(&row, "llama_op17_dyn.onnx", PB, T, SBP_OBJECTIVE_DPO, NULL, &o, "packed_row_pairs");
    assert_int_equal(doc.info->per_document, 1);
    assert_int_equal(row.info->per_document, 0);
    float *params = e2e_param_block(doc.info, doc.g);
    float *g = malloc(sizeof *g * (doc.info->param_elems + 1));
    float *g1 = malloc(sizeof *g1 * (doc.info->param_elems + 1));
    size_t wsb = doc.info->workspace_bytes;
    void *ws = aligned_alloc(SBPRT_ALIGN, (wsb + SBPRT_ALIGN - 1) / SBPRT_ALIGN * SBPRT_ALIGN);
    assert_true(params && g && g1 && ws);
    double loss = NAN;
    sbp_step_args a = {.params = params, .grads = g, .input_ids = d.x.ids,
                       .doc_ids = d.x.docs, .ref_logps = d.dpo_ref, .workspace = ws,
                       .loss = &loss};
    /* row 0 loses its second document (nothing scored in it): 2 documents against row 2's 3 */
    batch fewer = d.x;
    for (int t = 20; t < 45; t++)
        fewer.labels[t] = -100;
    a.labels = fewer.labels;
    assert_int_equal(doc.run(e2e_ctx, &a), SBPRT_ERR_INVALID);
    /* row 3 gains one (its second document cut in two): 3 against row 1's 2 */
    batch more = d.x;
    for (int t = 3 * T + 35; t < 4 * T; t++)
        more.docs[t] += 1;
    a.labels = more.labels;
    a.doc_ids = more.docs;
    assert_int_equal(doc.run(e2e_ctx, &a), SBPRT_ERR_INVALID);
    /* the batch as given is fine */
    a.labels = d.x.labels;
    a.doc_ids = d.x.docs;
    assert_int_equal(doc.run(e2e_ctx, &a), SBPRT_OK);
    /* one document per row (one id per row): the per-row step, each row's reference at b*T */
    batch one = d.x;
    float rref[PB], dref[PB * T];
    memset(dref, 0, sizeof dref);
    for (int b = 0; b < PB; b++) {
        for (int t = 0; t < T; t++)
            one.docs[b * T + t] = b;
        rref[b] = dref[b * T] = -40.0f - 3.0f * (float)b;
    }
    double l_doc = run_packed(&doc, params, g, &one, dref, NULL, NULL);
    double l_row = run_packed(&row, params, g1, &one, rref, NULL, NULL);
    double e_g = e2e_max_rel_vs(&doc, g, &row, g1, 1e-6);
    print_message("  one document per row: per-document loss %.9f, per-row %.9f; gradients "
                  "%.1e\n", l_doc, l_row, e_g);
    assert_true(fabs(l_doc - l_row) <= 1e-6 * fabs(l_row));
    assert_true(e_g <= 1e-6);
    free(ws);
    free(g);
    free(g1);
    free(params);
    e2e_free_step(&doc);
    e2e_free_step(&row);
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
        cmocka_unit_test(test_llama_per_document),
        cmocka_unit_test(test_per_document_pairs),
    };
    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    sbprt_ctx_destroy(e2e_ctx);
    return rc;
}
