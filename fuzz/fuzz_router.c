/* fuzz_router.c: router checkpoints (checkpoints/router_h5.c) on arbitrary bytes, loaded onto the
 * tiny model the seeds were written for (fuzz/seeds.c), with their optimizer state and stored
 * configuration. */
#include <stdlib.h>
#include <string.h>

#include "../checkpoints/load.h"
#include "../checkpoints/router_h5.h"
#include "fuzz.h"
#include "seeds.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static Model m;
    static AdamW opt;
    static uint64_t fp;
    if (!m.params_mem) {
        seeds_model(&m);
        fp = model_fingerprint(&m);
        adamw_init(&opt, model_router_trained(&m, 0), 0.9f, 0.95f, 1e-8f, 0);
    }
    const char* path = fuzz_write("router.h5", data, size);
    static char* text;
    text = NULL;
    FUZZ_TRY({
        RouterState st;
        router_load(path, &m, &opt, &st, fp);
        text = router_read_config(path);
    });
    free(text);
    return 0;
}
