/* train_config.c — a run's options (sbptrain.h: train_config): their defaults, the checks of
 * one against another that no single option's parser can make, and the digest of them that the
 * ranks of a distributed run compare before any work. The messages name the command-line
 * flags, as the fields are sbp-train's options one for one.
 */
#include "sbptrain.h"

#include <string.h>

void train_config_init(train_config *o)
{
    *o = (train_config){.steps = 1, .lr = 1e-3, .adamw = true, .grad_accum = 1};
    train_pack_opts_init(&o->pack);
    train_adapter_opts_init(&o->adapter);
}

/* The first option of o that only training reads, or NULL: --compute-logps trains nothing, so
 * each of them would be dropped without a word (its steps, outputs, checkpoint folder). */
static const char *training_only(const train_config *o)
{
    const struct {
        bool given;
        const char *flag;
    } f[] = {{o->steps_given, "--steps"}, {o->dataset.epochs != 0, "--epochs"},
             {o->dataset.shuffle, "--shuffle-seed"}, {o->save != NULL, "--save"},
             {o->save_safetensors != NULL, "--save-safetensors"},
             {o->pretrained.dir != NULL, "--save-pretrained"},
             {o->adapter.save_dir != NULL, "--save-adapter"}, {o->adapter.merge, "--merge-lora"},
             {o->sched.log_path != NULL, "--log"}, {o->dump_grads != NULL, "--dump-grads"},
             {o->ckpt.dir != NULL, "--checkpoint-dir"}, {o->ckpt.resume != NULL, "--resume"},
             {o->ckpt.every != 0, "--checkpoint-every"},
             {o->eval.data != NULL, "--eval-data"}, {o->eval.dataset != NULL, "--eval-dataset"},
             {o->grad_accum != 1, "--grad-accum"}, {o->advantages != NULL, "--advantages"},
             {o->training_flag != NULL, o->training_flag}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (f[i].given)
            return f[i].flag;
    return NULL;
}

/* 0, -1 after the error line, or -2 when no step library is given (the caller's usage text
 * says what one is). */
int train_config_check(train_config *o, const train_sink *s)
{
    char sched_err[256]; /* the schedule's options against each other and --lr */
    if (train_sched_check(&o->sched, o->lr, sched_err, sizeof sched_err) ||
        train_eval_check_opts(&o->eval, sched_err, sizeof sched_err)) /* and evaluation's */
        return train_err(s, "%s", sched_err);
    if (o->ref_cache && !o->dataset.path)
        return train_err(s, "--ref-cache FILE keeps the reference log-probs of --dataset FILE");
    if (o->compute_logps && !o->dataset.path)
        return train_err(s, "--compute-logps OUT.safetensors scores the examples of --dataset FILE");
    if (o->compute_logps && (o->ref_logps || o->old_logps))
        return train_err(s, "%s is an input of training, and --compute-logps OUT only scores the "
                         "examples with the model given (nothing is trained)",
                         o->ref_logps ? "--ref-logps" : "--old-logps");
    const char *ignored = o->compute_logps ? training_only(o) : NULL;
    if (ignored) /* before any file or folder is touched */
        return train_err(s, "%s is read by training, and --compute-logps OUT only scores the "
                         "examples (nothing is trained, saved or logged): drop %s or "
                         "--compute-logps", ignored, ignored);
    if (o->pretrained.tokenizer && !o->pretrained.dir)
        return train_err(s, "--tokenizer TOKDIR is read with --save-pretrained DIR (its files are "
                     "copied there)");
    o->adapter.save_pretrained = o->pretrained.dir != NULL;
    if (train_adapter_check_outputs(&o->adapter, o->save != NULL,
                                    o->save_safetensors != NULL || o->pretrained.dir != NULL,
                                    sched_err, sizeof sched_err))
        return train_err(s, "%s", sched_err); /* --merge-lora needs --save or -safetensors */
    if (!o->step_path) /* the caller adds its usage */
        return train_err(s, "no step library given"), -2;
    if (!o->model_path)
        return train_err(s, "--model MODEL.onnx is required (the model the step was compiled from)");
    if (o->dataset.path && (o->data_path || o->ids_path || o->labels_path))
        return train_err(s, "give one source of training data: --dataset, --data, or --input-ids with "
                     "--labels");
    if (!o->dataset.path && (o->dataset.epochs || o->dataset.shuffle))
        return train_err(s, "%s is read with --dataset FILE", o->dataset.epochs ? "--epochs"
                                                                         : "--shuffle-seed");
    if (o->dataset.epochs && o->steps_given)
        return train_err(s, "give --epochs or --steps, not both: --epochs sets the steps");
    if (o->data_path && (o->ids_path || o->labels_path))
        return train_err(s, "give either --data or --input-ids with --labels, not both");
    if (!o->dataset.path && !o->data_path && !o->ids_path && !o->labels_path)
        return train_err(s, "no training data: give --dataset DATA.safetensors, --input-ids X.npy "
                     "--labels Y.npy, or --data SHARD.bin");
    if (!o->dataset.path && !o->data_path && (!o->ids_path || !o->labels_path))
        return train_err(s, "%s needs %s too", o->ids_path ? "--input-ids" : "--labels",
                     o->ids_path ? "--labels" : "--input-ids");
    char pack_err[256]; /* --pack / --eos / --doc-ids against the data flags */
    if (o->dataset.path && (o->pack.eos >= 0 || o->pack.doc_ids))
        return train_err(s, "%s is read with --data or --input-ids; a dataset's examples are its "
                     "documents (--dataset with --pack needs no more)",
                     o->pack.eos >= 0 ? "--eos" : "--doc-ids");
    if (!o->dataset.path &&
        train_pack_check_opts(&o->pack, o->data_path != NULL, o->ids_path != NULL, pack_err,
                              sizeof pack_err))
        return train_err(s, "%s", pack_err);
    return 0;
}


void train_config_rank_outputs(train_config *o)
{
    o->save = o->save_safetensors = o->sched.log_path = NULL;
    o->adapter.save_dir = NULL;
    o->pretrained.dir = NULL;
}

/* Under mpirun: this rank's options and files against rank 0's (train_dist_agree), before
 * anything depends on them; 0, or -1 after the one rank that differs has printed which.
 * Every field is one that, differing, would hang a collective or train another run than rank
 * 0's. Left out, as local to a rank or to what rank 0 alone writes: --threads and
 * OMP_NUM_THREADS (this machine's cores; another count changes only the last bits of this
 * rank's share), and the outputs that only rank 0 writes and train_config_rank_outputs drops on the others: --save,
 * --save-safetensors, --merge-lora (what --save holds), --save-adapter, --save-pretrained and
 * its --tokenizer, --log, --keep-checkpoints (rank 0's pruning). --dump-grads is rank 0's file too, but whether it is
 * given changes step 1's sum under ZeRO 2 on every rank. Files are compared by size and
 * content, not by path (a model's external data files are known only once it is imported, and
 * are not among them); the checkpoint folders by path, as every rank reads --resume's and
 * bases its checkpoint decisions on --checkpoint-dir. */
int train_config_agree(const train_config *o, train_dist *d, bool leaving, const train_sink *s)
{
    static const char *const scheds[] = {"constant", "linear", "cosine"};
    train_dist_digest g;
    char err[1024];
    train_dist_digest_init(&g);
    /* a rank that only prints --help or --version must not leave the others waiting */
    train_dist_digest_str(&g, "--help or --version", leaving ? "given" : NULL);
    if (leaving)
        return train_dist_agree(d, &g, err, sizeof err) ? train_err(s, "%s", err) : 0;
    train_dist_digest_file(&g, "the step library", o->step_path);
    train_dist_digest_file(&g, "--model", o->model_path);
    train_dist_digest_file(&g, "--input-ids", o->ids_path);
    train_dist_digest_file(&g, "--labels", o->labels_path);
    train_dist_digest_file(&g, "--data", o->data_path);
    train_dist_digest_file(&g, "--dataset", o->dataset.path);
    train_dist_digest_file(&g, "--ref-logps", o->ref_logps);
    train_dist_digest_file(&g, "--old-logps", o->old_logps);
    train_dist_digest_file(&g, "--advantages", o->advantages);
    train_dist_digest_file(&g, "--doc-ids", o->pack.doc_ids);
    train_dist_digest_file(&g, "--eval-data", o->eval.data);
    train_dist_digest_file(&g, "--eval-dataset", o->eval.dataset);
    train_dist_digest_int(&g, "--steps", o->steps);
    train_dist_digest_int(&g, "--epochs", o->dataset.epochs);
    if (o->dataset.shuffle)
        train_dist_digest_int(&g, "--shuffle-seed", (int64_t)o->dataset.seed);
    else
        train_dist_digest_str(&g, "--shuffle-seed", NULL);
    train_dist_digest_real(&g, "--lr", o->lr);
    train_dist_digest_str(&g, "--optimizer", o->adamw ? "adamw" : "sgd");
    train_dist_digest_real(&g, "--weight-decay", o->weight_decay);
    train_dist_digest_int(&g, "--grad-accum", o->grad_accum);
    train_dist_digest_int(&g, "--zero", o->zero);
    train_dist_digest_int(&g, "--seq-parallel", o->seq_parallel);
    train_dist_digest_str(&g, "--lr-schedule", o->sched.kind >= 0 && o->sched.kind < 3
                                                   ? scheds[o->sched.kind] : "?");
    train_dist_digest_int(&g, "--warmup-steps", o->sched.warmup);
    if (o->sched.min_lr_set)
        train_dist_digest_real(&g, "--min-lr", o->sched.min_lr);
    else
        train_dist_digest_str(&g, "--min-lr", NULL);
    train_dist_digest_real(&g, "--clip-grad-norm", o->sched.clip);
    train_dist_digest_str(&g, "--checkpoint-dir", o->ckpt.dir);
    train_dist_digest_int(&g, "--checkpoint-every", o->ckpt.every);
    train_dist_digest_str(&g, "--resume", o->ckpt.resume);
    train_dist_digest_str(&g, "--pack", o->pack.pack ? "given" : NULL);
    train_dist_digest_int(&g, "--eos", o->pack.eos);
    train_dist_digest_int(&g, "--eval-every", o->eval.every);
    train_dist_digest_int(&g, "--eval-batches", o->eval.batches);
    train_dist_digest_str(&g, "--dump-grads", o->dump_grads ? "given" : NULL);
    if (train_dist_agree(d, &g, err, sizeof err))
        return train_err(s, "%s", err);
    return 0;
}
