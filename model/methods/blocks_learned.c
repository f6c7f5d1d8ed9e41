/* blocks_learned.c: the attention method `blocks_learned` (AttnMethod, model/model.h; the table:
 * model/methods.c). The learned block selector (focus fit-blocks, kernels/blockgate.c): each block
 * scored by a per-layer, per-query-head estimate of its attention mass from its keys' statistics.
 * With
 * --router SELECTOR.h5,ROUTER.h5 a query also keeps the distant tokens of its token group that
 * its blocks miss (Model.method.with_groups). */
#include <stdio.h>

#include "methods.h"

static void describe(const Model* m, char* buf, size_t n) { attn_describe_learned(m, buf, n); }

const AttnMethod attn_method_blocks_learned = {
    .mode = ATTN_BLOCKS_LEARNED,
    .name = "blocks_learned",
    .serve_name = "blocks_learned",
    BLOCK_PATTERN,
    .needs = NEEDS_SELECTOR,
    .about =
        "the sinks, the window and N key blocks by the learned selector's estimate of their mass; "
        "with --router SELECTOR.h5,ROUTER.h5 also the tokens of its group",
    .score = BLOCKS_LEARNED,
    .describe = describe,
};
