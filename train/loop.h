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
} TrainData;

/* Train the backbone from scratch (all parameters, dense attention) for a `scratch` base, then
 * write it to OUT/base.gguf. */
void train_pretrain(Model* m, const RunConfig* rc, const int* data, size_t n, const char* out);

/* Train only the router of m (the backbone frozen, checked at the end) on device ("cpu",
 * "cuda") as rc says: OUT/router.h5 every ckpt_every steps (conf_text stored in it),
 * OUT/metrics.jsonl a line per step and evaluation, perplexities printed before and after.
 * resume: continue from OUT/router.h5. stop_after: stop after that step (0: run all). */
void train_router(Model* m, const RunConfig* rc, const TrainData* d, const char* out,
                  const char* conf_text, int resume, long stop_after, const char* device);

#endif
