/* dense.c: the attention method `dense` (AttnMethod, model/model.h; the table: model/methods.c).
 * Dense causal attention, the frozen model as it was trained: the reference every method is
 * measured against. Evaluation runs the fastest exact kernel, training the gated reference
 * kernel (whose backward exists) with no gate. */
#include <stdio.h>

#include "../model.h"

static void describe(const Model* m, char* buf, size_t n) {
    (void)m;
    snprintf(buf, n, "dense (router off)");
}

const AttnMethod attn_method_dense = {
    .mode = ATTN_DENSE,
    .name = "dense",
    .serve_name = "dense",
    .needs = NEEDS_NOTHING,
    .sparse = 0,
    .setting = 1,
    .about = "every causal pair (the router off)",
    .kernel = ATTN_KERNEL_DENSE,
    .kernel_train = ATTN_KERNEL_GATED,
    .gate = GATE_NONE,
    .masks = MASKS_NONE,
    .count = COUNT_ALL,
    .cache = CACHE_ALL,
    .cuda = 1,
    .brief = "dense",
    .describe = describe,
};
