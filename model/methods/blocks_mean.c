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
    BLOCK_PATTERN,
    .needs = NEEDS_NOTHING,
    .about = "the sinks, the window and N key blocks by their mean key (training-free)",
    .score = BLOCKS_MEAN,
    .describe = describe,
};
