/* loop.h: the training loops of `focus retrofit`: pretraining a scratch backbone, and training
 * the router of a frozen one (checkpoints, metrics, evaluation along the way). */
#ifndef FOCUS_LOOP_H
#define FOCUS_LOOP_H

#include "runconfig.h"

typedef struct {
    const int* train; /* training tokens */
    size_t ntrain;
    const int* val; /* validation tokens, the first neval of them evaluated */
    size_t neval;
    int *train_mem, *val_mem; /* what run_prepare allocated (free both) */
    int rank;                 /* this process's rank in a data-parallel run (0 writes the files) */
    Comm* tp; /* tensor parallelism: run_prepare loads this group's slice of the model (NULL: whole)
               */
    int* old; /* the rehearse tokens (NULL: none; run_prepare allocated them: free) */
    size_t nold;
} TrainData;

/* Which command's run the folder OUT holds ("retrofit", "finetune", "pretrain"; from the first
 * line of its config.conf, or for older folders from its files), NULL if it holds none; files
 * gets the run files present ("router.h5, metrics.jsonl"). */
const char* run_folder_kind(const char* out, char* files, size_t n);
/* OUT/config.conf: a line naming the command, then the settings text (atomic write). */
void run_write_config(const char* cmd, const char* out, const char* conf_text);

/* A run's common set-up, for command cmd: check rc, create the folder OUT (refusing one that holds
 * a run unless resume), load the base model into m (or build a scratch one from rc and pretrain it,
 * writing OUT/base.gguf; on resume the one written before), load the training and validation tokens
 * into d, print the header and the settings, and (unless resume) write OUT/config.conf. Returns the
 * settings text (malloc'd). */
char* run_prepare(RunConfig* rc, const char* cmd, const char* out, int resume, Model* m,
                  TrainData* d);

/* Train the backbone from scratch (all parameters, dense attention) for a `scratch` base, then
 * write it to OUT/base.gguf (out NULL: nothing written; another rank writes it). */
void train_pretrain(Model* m, const RunConfig* rc, const int* data, size_t n, const char* out);

/* Train only the router of m (the backbone frozen, checked at the end) on device ("cpu",
 * "cuda") as rc says: OUT/router.h5 every ckpt_every steps (conf_text stored in it),
 * OUT/metrics.jsonl a line per step and evaluation, perplexities printed before and after.
 * resume: continue from OUT/router.h5. stop_after: stop after that step (0: run all).
 * dp: the data-parallel ranks (one process: a communicator of one). Each step's batch of B rows
 * is drawn the same on every rank, and rank r runs rows r B / n .. (r + 1) B / n; the router's
 * gradients, the losses and beta's statistics are added up across the ranks, so every rank takes
 * the same AdamW step one process would on the whole batch. Rank 0 alone evaluates, prints and
 * writes files; the sampler is the whole batch's, so a run resumes with any rank count. A model
 * cut into tensor-parallel slices (model_shard; m->tp) trains the same way: each data-parallel
 * rank is then its group of slices, which run every pass together; the group of dp rank 0
 * evaluates and its first rank writes. */
void train_router(Model* m, const RunConfig* rc, const TrainData* d, const char* out,
                  const char* conf_text, int resume, long stop_after, const char* device, Comm* dp);

/* A run that does not resume starts from rc->init_router when set (router_load: the same base
 * model, shape and sinks), else from the seed's initialisation. */
void train_init_router(Model* m, const RunConfig* rc);

/* anchor > 0 (domain adaptation that keeps the old text: L2-SP, Li et al. 2018): the n trained
 * router values of rc->init_router, the point each step pulls back toward (loaded into m, so call
 * it before a resume's router_load); NULL when anchor = 0 (run_prepare refuses anchor without
 * init_router). train_anchor_step, after a step at rate lr: theta -= lr anchor (theta - center),
 * decoupled from the gradient as AdamW's weight decay is (beta, the balance, is not pulled). */
real* train_anchor_center(Model* m, const RunConfig* rc, size_t n);
void train_anchor_step(Model* m, const real* center, size_t n, float lr, float anchor);

/* train_router for objective = mass (train/mass.c): the teacher's windows, then the router trained
 * on them layer by layer; the same files, checkpoints, resume and evaluation. */
void train_router_mass(Model* m, const RunConfig* rc, const TrainData* d, const char* out,
                       const char* conf_text, int resume, long stop_after);

/* The baselines a retrofit is compared with, on the same data, budget and data order: LoRA
 * adapters (rc->method "lora": only the adapters train; OUT/lora.h5) or full fine-tuning ("full":
 * every weight; OUT/model.gguf, llama models), with dense attention; or every weight and the
 * Focus router together ("joint": the soft gate trains, the router's routing; OUT/model.gguf and
 * OUT/router.h5 holding conf_text), which `focus pretrain` runs from scratch. Validation
 * perplexity before, every eval_every steps and at the end; OUT/metrics.jsonl. Not resumable. */
void train_finetune(Model* m, const RunConfig* rc, const TrainData* d, const char* out,
                    const char* conf_text);
/* run_prepare, then train_finetune, for command cmd. */
void finetune_run(RunConfig* rc, const char* cmd, const char* out);

#endif
