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
    BLOCK_PATTERN,
    .needs = NEEDS_NOTHING,
    .about =
        "the sinks, the window and the N key blocks of most dense attention mass (a bound: it "
        "needs the dense attention)",
    .score = BLOCKS_ORACLE,
    .no_decode =
        "generation runs dense, hard, window, random or block attention; oracle is an "
        "evaluation ceiling (it scores every key: eval ppl, passkey, curve)",
    .describe = describe,
};
