/* random.c: the attention method `random` (AttnMethod, model/model.h; the table: model/methods.c).
 * The random control: the router's executor with k of K groups drawn per token from a seeded
 * hash (focus_random_seed), the same in the full pass and in decoding. What trained groups must
 * beat. */
#include <stdio.h>

#include "../model.h"

static void describe(const Model* m, char* buf, size_t n) {
    const FocusConfig* f = &m->fc;
    char tk[32], dl[1024];
    snprintf(buf, n, "random groups (no router): K=%d, k=%s, w=%d, sinks=%d, dense layers %s", f->K,
             focus_topk_str(f, tk), f->w, f->sinks, focus_dense_layers_str(f, dl, sizeof dl));
}

/* k of K groups per token, drawn from a hash of the layer's seed and the position */
static void random_mask(uint32_t* mask, int B, int T, const Model* m, int l, int pos0) {
    const FocusConfig* f = &m->fc;
    routing_random_mask(mask, B, T, f->K, f->topk, f->sinks, pos0, focus_random_seed(f, l));
}

const AttnMethod attn_method_random = {
    .mode = ATTN_RANDOM,
    .name = "random",
    .serve_name = "random",
    .needs = NEEDS_NOTHING,
    .budget = "topk",
    .budget_arg = "k",
    .sparse = 1,
    .setting = 1,
    .about = "the sinks, the window and the tokens of k of K untrained random groups",
    .kernel = ATTN_KERNEL_SPARSE,
    .kernel_train = ATTN_KERNEL_SPARSE,
    .gate = GATE_HARD,
    .masks = MASKS_PATTERN,
    .pattern_mask = random_mask,
    .count = COUNT_MASKS,
    .cache = CACHE_GROUPS,
    .cuda = 0,
    .describe = describe,
};
