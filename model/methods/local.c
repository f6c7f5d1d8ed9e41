/* local.c: the attention method `local` (AttnMethod, model/model.h; the table: model/methods.c).
 * Not a setting: a sliding-window layer of a model that has them (gemma3) keeping its own window,
 * without sinks, whatever the mode of the others (model_layer_attn). Training runs it as the
 * reference kernel with a hard gate whose masks are all zero (the window), so its backward
 * exists. */
#include <stdio.h>

#include "../model.h"

static void describe(const Model* m, char* buf, size_t n) {
    (void)m;
    snprintf(buf, n, "a sliding-window layer's own window");
}

const AttnMethod attn_method_local = {
    .mode = ATTN_LOCAL,
    .name = "local",
    .serve_name = "local",
    .needs = NEEDS_NOTHING,
    .sparse = 1,
    .setting = 0,
    .about = "a sliding-window layer's own window (not a setting)",
    .kernel = ATTN_KERNEL_BAND,
    .kernel_train = ATTN_KERNEL_GATED,
    .gate = GATE_HARD,
    .masks = MASKS_ZERO,
    .own_window = 1,
    .count = COUNT_BAND,
    .cache = CACHE_WINDOW,
    .cuda = 0,
    .describe = describe,
};
