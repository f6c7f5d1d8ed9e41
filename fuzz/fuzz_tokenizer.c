/* fuzz_tokenizer.c: the GPT-2 tokenizer (data/tokenizer.c) on arbitrary bytes: every id in the
 * vocabulary and the bytes given back exactly by decoding (byte-level BPE loses nothing). The
 * tokenizer is ../shared/data/gpt2-tokenizer, or $FOCUS_TOKENIZER. */
#include <stdlib.h>
#include <string.h>

#include "../data/tokenizer.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static Tokenizer* t;
    if (!t) {
        const char* path = getenv("FOCUS_TOKENIZER");
        t = tokenizer_load(path ? path : FOCUS_SOURCE_DIR "/../shared/data/gpt2-tokenizer");
    }
    size_t n, len;
    int* ids = tokenizer_encode(t, (const char*)data, size, &n);
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= tokenizer_vocab_size(t)) abort();
    char* back = tokenizer_decode(t, ids, n, &len);
    if (len != size || memcmp(back, data, size)) abort();
    free(back);
    free(ids);
    return 0;
}
