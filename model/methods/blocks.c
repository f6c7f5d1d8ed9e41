/* blocks.c: the attention method `blocks` (AttnMethod, model/model.h; the table: model/methods.c).
 * Quest's block selection: beyond the sinks and the window, each query and key/value head keeps
 * the N key blocks whose per-channel key bounds promise the largest score (or, with a budget
 * pP, blocks until a share P of the estimated mass). The blocks kernel counts its pairs. */
#include <stdio.h>

#include "methods.h"

static void describe(const Model* m, char* buf, size_t n) {
    attn_describe_blocks(m, "blocks", buf, n);
}

const AttnMethod attn_method_blocks = {
    .mode = ATTN_BLOCKS,
    .name = "blocks",
    .serve_name = "blocks",
    BLOCK_PATTERN,
    .needs = NEEDS_NOTHING,
    .about =
        "the sinks, the window and N key blocks per query and key/value head by Quest's bounds "
        "(training-free)",
    .score = BLOCKS_QUEST,
    .describe = describe,
};
