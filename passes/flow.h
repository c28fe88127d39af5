/* flow.h — the whole compile flow, import to memory plan, as one list and one call.
 *
 *   import → bind-dims → params → fold → dce → retie → recognize → cleanup  (graph/passes.h)
 *          → lora → packed                                         (graph/lora.h, passes.h)
 *          → objective → freeze                                            (graph/passes.h)
 *          → autodiff → stream → plan                                       (train/train.h)
 *
 * The list, sbp_flow_stages (passes/pipeline.c), names each stage with the function that runs
 * it and the one that prints its result (sbpc --dump-ir=NAME). The file that implements a stage
 * is named after it: graph/NAME.c or train/NAME.c, '-' written '_' (import is ir/'s importer;
 * tests/passes/test_flow_files.c checks it). sbp_flow_run runs it up to a named stage. Code
 * generation (codegen.h: sbp_codegen_write_target) then writes the planned program; sbpc, the
 * tests and the benchmarks all compile through here rather than calling the stages one by one.
 */
#ifndef SBP_FLOW_H
#define SBP_FLOW_H

#include "lora.h"
#include "passes.h"
#include "train.h"

#include <stdio.h>

typedef struct sbp_flow_options {
    sbp_pass_options pass;     /* --batch, --seq-len, --no-retie, verify, the fold cap */
    sbp_objective objective;   /* --objective, as asked (a graph that ends in a loss keeps it) */
    const char *const *freeze; /* [n_freeze] --freeze REGEX..., applied in turn */
    int n_freeze;
    sbp_lora_options lora;     /* --lora RANK ... (rank 0: none) */
    sbp_train_options train;   /* --strategy, --chunk, --logits-chunk, --memory-budget, the
                                * objective's hyper-parameters, --precision */
} sbp_flow_options;

typedef struct sbp_flow {
    /* the model: a file, or bytes (buf != NULL; path is then only its display name, and
     * external data is refused) — set by the caller */
    const char *path;
    const uint8_t *buf;
    size_t len;
    const ir_import_options *import; /* the importer's options (NULL: none) */
    /* results */
    ir_graph *g;               /* after "import"; the caller frees it (ir_graph_free), also
                                * when the flow fails */
    sbp_objective chosen;      /* after "objective": SFT, or GRAPH_LOSS for a graph's own loss */
    int n_frozen;              /* after "freeze": parameters --freeze matched */
    int n_adapted;             /* after "lora": weights given a LoRA adapter */
    sbp_train_program *program;/* after "autodiff", "stream" or "plan" (in g's arena) */
    int last;                  /* index of the last stage asked for */
    int done;                  /* index of the last stage run (-1 before the first); zero-
                                * initialise the struct */
    /* the run's own */
    const sbp_flow_options *opt;
    ir_diag *diag;
    sbp_train_stage stop_stage;
} sbp_flow;

typedef struct sbp_flow_stage {
    const char *name;          /* for --dump-ir=NAME */
    const char *what;          /* one line for --help */
    int (*step)(sbp_flow *f);  /* a flow step, or */
    int (*pass)(ir_graph *g, const sbp_pass_options *o); /* a graph pass */
    void (*dump)(const sbp_flow *f, FILE *out);          /* prints the stage's result */
} sbp_flow_stage;

extern const sbp_flow_stage sbp_flow_stages[];
extern const int sbp_n_flow_stages;

/* The index of the stage called name, -1 when there is none. */
int sbp_flow_find(const char *name);

/* Runs the flow on f's model (f->path or f->buf set by the caller) up to and including the
 * stage named stop_after (NULL: through "plan"). Called again on the same f (with the same
 * options), it goes on from where the last call stopped: sbpc prints the canonical graph's
 * summary, then compiles. IR_OK, or IR_ERR with diagnostics in d (a failing stage is named).
 * f->g may be set even on failure: free it. */
int sbp_flow_run(sbp_flow *f, const sbp_flow_options *o, ir_diag *d, const char *stop_after);

#endif
