/* window.c: the attention method `window` (AttnMethod, model/model.h; the table: model/methods.c).
 * Sinks and a sliding window (StreamingLLM): the training-free baseline whose pairs are fixed by
 * w and sinks. */
#include <stdio.h>

#include "../model.h"

static void describe(const Model* m, char* buf, size_t n) {
    const FocusConfig* f = &m->fc;
    char dl[1024];
    snprintf(buf, n, "window (no router): sinks=%d, w=%d, dense layers %s", f->sinks, f->w,
             focus_dense_layers_str(f, dl, sizeof dl));
}

const AttnMethod attn_method_window = {
    .mode = ATTN_WINDOW,
    .name = "window",
    .serve_name = "window",
    .needs = NEEDS_NOTHING,
    .budget = "w",
    .budget_arg = "W",
    .sparse = 1,
    .setting = 1,
    .about = "the sinks and the last W tokens (training-free)",
    .kernel = ATTN_KERNEL_BAND,
    .kernel_train = ATTN_KERNEL_BAND,
    .gate = GATE_NONE,
    .masks = MASKS_NONE,
    .count = COUNT_BAND,
    .cache = CACHE_WINDOW,
    .cuda = 0,
    .describe = describe,
};
