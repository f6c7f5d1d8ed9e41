/* fuzz_model.c: model import (checkpoints/load.c) on arbitrary bytes: the GGUF, llm.c and
 * safetensors readers, which model_load tells apart by their first bytes. Built as three targets
 * (fuzz_gguf, fuzz_llmc, fuzz_safetensors) that differ only in their seed corpus. The file is
 * written as model.safetensors beside a config.json of the seeds' LLaMA shape, so a safetensors
 * input reaches the LLaMA path; a model that loads is run forward on a few tokens. */
#include <string.h>

#include "../checkpoints/load.h"
#include "fuzz.h"

static void write_config(void) {
    static const char cfg[] =
        "{\"model_type\": \"llama\", \"num_attention_heads\": 2, \"num_key_value_heads\": 1, "
        "\"intermediate_size\": 16, \"max_position_embeddings\": 32, \"rms_norm_eps\": 1e-5, "
        "\"rope_theta\": 10000}";
    fuzz_write("config.json", (const uint8_t*)cfg, sizeof cfg - 1);
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static int ready;
    if (!ready) write_config(), ready = 1;
    const char* path = fuzz_write("model.safetensors", data, size);
    static Model m; /* static: still reachable after a jump out of model_load */
    memset(&m, 0, sizeof m);
    FocusConfig fc;
    focus_config_default(&fc);
    fc.attn = ATTN_DENSE;
    FUZZ_TRY({
        model_load(&m, path, &fc, NULL);
        int tok[4] = {0, 1, 2, 3};
        for (int i = 0; i < 4; i++) tok[i] %= m.cfg.V;
        if (m.cfg.L * (size_t)m.cfg.C * m.cfg.C < (1u << 22)) model_forward(&m, tok, NULL, 1, 4, 0);
    });
    model_free(&m);
    return 0;
}
