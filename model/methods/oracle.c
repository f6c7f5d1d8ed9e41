/* oracle.c: the attention method `oracle` (AttnMethod, model/model.h; the table: model/methods.c).
 * The oracle blocks: the N key blocks that hold the most dense attention mass, which only the
 * whole dense attention can tell. A ceiling for block selection in evaluation; it cannot
 * decode. */
#include <stdio.h>

#include "methods.h"

static void describe(const Model* m, char* buf, size_t n) {
    attn_describe_blocks(m, "oracle blocks", buf, n);
}

const AttnMethod attn_method_oracle = {
    .mode = ATTN_ORACLE,
    .name = "oracle",
    .serve_name = "oracle",
    .needs = NEEDS_NOTHING,
    .budget = "blocks",
    .budget_arg = "N",
    .sparse = 1,
    .setting = 1,
    .about =
        "the sinks, the window and the N key blocks of most dense attention mass (a bound: it "
        "needs the dense attention)",
    .kernel = ATTN_KERNEL_BLOCKS,
    .kernel_train = ATTN_KERNEL_BLOCKS,
    .gate = GATE_NONE,
    .masks = MASKS_NONE,
    .blocks = 1,
    .score = BLOCKS_ORACLE,
    .count = COUNT_KERNEL,
    .cache = CACHE_BLOCKS,
    .no_decode =
        "generation runs dense, hard, window, random or block attention; oracle is an "
        "evaluation ceiling (it scores every key: eval ppl, passkey, curve)",
    .cuda = 0,
    .describe = describe,
};
