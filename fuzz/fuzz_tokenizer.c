/* fuzz_tokenizer.c: the byte-level BPE tokenizer (data/tokenizer.c) on arbitrary bytes: every id
 * in the vocabulary, and decode(encode(x)) = x, where a byte the vocabulary has no token for
 * comes back as U+FFFD (none for GPT-2's, 21 for SmolLM2's). The tokenizer is
 * ../shared/data/gpt2-tokenizer, or $FOCUS_TOKENIZER (a GGUF file or a tokenizer folder). */
#include <stdlib.h>
#include <string.h>

#include "../data/tokenizer.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static Tokenizer* t;
    static int present[256]; /* a byte alone comes back as itself */
    if (!t) {
        const char* path = getenv("FOCUS_TOKENIZER");
        t = tokenizer_load(path && *path ? path
                                         : FOCUS_SOURCE_DIR "/../shared/data/gpt2-tokenizer");
        for (int b = 0; b < 256; b++) {
            char c = (char)b;
            size_t n, len;
            int* ids = tokenizer_encode(t, &c, 1, &n);
            char* back = tokenizer_decode(t, ids, n, &len);
            present[b] = len == 1 && back[0] == c;
            free(ids);
            free(back);
        }
    }
    size_t n, len;
    int* ids = tokenizer_encode(t, (const char*)data, size, &n);
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= tokenizer_vocab_size(t)) abort();
    char* back = tokenizer_decode(t, ids, n, &len);
    size_t at = 0;
    for (size_t i = 0; i < size; i++) {
        const char* want = present[data[i]] ? (const char*)data + i : "\xef\xbf\xbd";
        const size_t wl = present[data[i]] ? 1 : 3;
        if (at + wl > len || memcmp(back + at, want, wl)) abort();
        at += wl;
    }
    if (at != len) abort();
    free(back);
    free(ids);
    return 0;
}
