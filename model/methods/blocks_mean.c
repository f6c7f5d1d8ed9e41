/* blocks_mean.c: the attention method `blocks_mean` (AttnMethod, model/model.h; the table:
 * model/methods.c). Block selection by each block's mean key (the query's score against it), the
 * other training-free block score. */
#include <stdio.h>

#include "methods.h"

static void describe(const Model* m, char* buf, size_t n) {
    attn_describe_blocks(m, "blocks", buf, n);
}

const AttnMethod attn_method_blocks_mean = {
    .mode = ATTN_BLOCKS_MEAN,
    .name = "blocks_mean",
    .serve_name = "blocks_mean",
    .needs = NEEDS_NOTHING,
    .budget = "blocks",
    .budget_arg = "N",
    .sparse = 1,
    .setting = 1,
    .about = "the sinks, the window and N key blocks by their mean key (training-free)",
    .kernel = ATTN_KERNEL_BLOCKS,
    .kernel_train = ATTN_KERNEL_BLOCKS,
    .gate = GATE_NONE,
    .masks = MASKS_NONE,
    .blocks = 1,
    .score = BLOCKS_MEAN,
    .count = COUNT_KERNEL,
    .cache = CACHE_BLOCKS,
    .cuda = 0,
    .describe = describe,
};
