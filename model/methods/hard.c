/* hard.c: the attention method `hard` (AttnMethod, model/model.h; the table: model/methods.c).
 * The token router's hard top-k groups (METHOD.md section 4): a query keeps the sinks, its window
 * and the earlier tokens of its k groups (a router with a query projection: the keys' top-1
 * groups that are among the query's k). The sparse executor skips the dropped pairs; decoding
 * reads the cache's group lists, so its routing must be causal. The pairs are counted from the
 * groups by evaluate.c (from the masks with a query projection). */
#include <stdio.h>

#include "methods.h"

static void describe(const Model* m, char* buf, size_t n) {
    attn_describe_router(m, "hard top-k", 1, buf, n);
}

const AttnMethod attn_method_hard = {
    .mode = ATTN_HARD,
    .name = "hard",
    .serve_name = "router",
    .needs = NEEDS_ROUTER,
    .budget = "topk",
    .budget_arg = "k",
    .sparse = 1,
    .setting = 1,
    .about = "the sinks, the window and the tokens of its top-k groups",
    .kernel = ATTN_KERNEL_SPARSE,
    .kernel_train = ATTN_KERNEL_SPARSE,
    .gate = GATE_HARD,
    .masks = MASKS_ROUTER,
    .count = COUNT_GROUPS,
    .cache = CACHE_GROUPS,
    .causal_routing = 1,
    .cuda = 1,
    .brief = "hard top-k",
    .describe = describe,
};
