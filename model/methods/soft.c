/* soft.c: the attention method `soft` (AttnMethod, model/model.h; the table: model/methods.c).
 * The router's soft gate (METHOD.md section 3): every pair is computed, a distant pair weighted
 * by log sigmoid(lambda (G_i . G_j - b)). What router training differentiates through; it does
 * not decode (a decoded token would read every key anyway). */
#include <stdio.h>

#include "methods.h"

static void describe(const Model* m, char* buf, size_t n) {
    attn_describe_router(m, "soft", 0, buf, n);
}

const AttnMethod attn_method_soft = {
    .mode = ATTN_SOFT,
    .name = "soft",
    .serve_name = "soft",
    .needs = NEEDS_ROUTER,
    .sparse = 0,
    .setting = 1,
    .about =
        "every pair, the distant ones weighted by the router's gate (training; METHOD.md section "
        "3)",
    .kernel = ATTN_KERNEL_GATED,
    .kernel_train = ATTN_KERNEL_GATED,
    .gate = GATE_SOFT,
    .masks = MASKS_NONE,
    .count = COUNT_ALL,
    .cache = CACHE_ALL,
    .no_decode = "generation runs dense or hard top-k attention, not the soft gate",
    .cuda = 1,
    .describe = describe,
};
