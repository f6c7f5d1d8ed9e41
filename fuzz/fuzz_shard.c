/* fuzz_shard.c: token shards (data/shard.c) on arbitrary bytes. */
#include <stdlib.h>

#include "../data/shard.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const char* path = fuzz_write("tokens.bin", data, size);
    static int* ids;
    ids = NULL;
    FUZZ_TRY({
        size_t n;
        int V;
        ids = shard_read(path, &n, &V);
        for (size_t i = 0; i < n; i++)
            if (ids[i] < 0 || ids[i] >= V) abort(); /* the reader promised ids below V */
    });
    free(ids);
    return 0;
}
