/* test_tokenizer.c: our byte-level BPE against Hugging Face `tokenizers` ids.
 * tests/fixtures/tokenizer_ref.txt holds, per staged text and vocabulary, the reference token
 * count and a hash of the ids (scripts/reference/make_tokenizer_fixture.py). Also: encode then
 * decode gives back every byte sequence (GPT-2 vocabulary: all 256 bytes have tokens), and
 * valid UTF-8 round-trips through the SmolLM2 vocabulary; a byte sequence through SmolLM2 comes
 * back with each of the 21 bytes it has no token for as U+FFFD, and nothing dropped. Vocabularies
 * that are absent
 * (../shared/data, the fetched model) are skipped; with neither, the test exits 77. */
#include <string.h>

#include "../io/io.h"
#include "../data/text.h"
#include "../data/tokenizer.h"
#include "testutil.h"

static uint64_t fnv_ids(const int* ids, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        uint32_t v = (uint32_t)ids[i];
        for (int b = 0; b < 4; b++) h = (h ^ ((v >> (8 * b)) & 0xff)) * 0x100000001b3ull;
    }
    return h;
}

static void roundtrip(Tokenizer* t, const char* name, int any_bytes) {
    Rng rng;
    rng_seed(&rng, 17);
    int ok = 1;
    /* the bytes with a token of their own: a byte alone comes back as itself */
    int present[256], npresent = 0;
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        size_t n, dl;
        int* ids = tokenizer_encode(t, &c, 1, &n);
        char* back = tokenizer_decode(t, ids, n, &dl);
        present[b] = dl == 1 && back[0] == c;
        npresent += present[b];
        free(ids);
        free(back);
    }
    static const char* pieces[] = {"hello",
                                   " world",
                                   "  ",
                                   "\n\n",
                                   "123",
                                   "4567",
                                   "'s",
                                   "'ll",
                                   " don't",
                                   "caf\xc3\xa9",
                                   " \xe4\xb8\xad\xe6\x96\x87",
                                   "\xf0\x9f\x98\x80",
                                   "\t",
                                   "!!",
                                   " ?",
                                   "\xce\xa9mega",
                                   " \xd0\x9f\xd1\x80\xd0\xb8"};
    for (int trial = 0; trial < 300 && ok; trial++) {
        char buf[512];
        size_t len = 0;
        if (any_bytes) {
            len = rng_u64(&rng) % 200;
            for (size_t i = 0; i < len; i++) buf[i] = (char)(rng_u64(&rng) & 0xff);
        } else {
            int k = (int)(rng_u64(&rng) % 20);
            for (int i = 0; i < k; i++) {
                const char* p = pieces[rng_u64(&rng) % (sizeof pieces / sizeof pieces[0])];
                memcpy(buf + len, p, strlen(p));
                len += strlen(p);
            }
        }
        char want[1536];
        size_t wl = 0;
        for (size_t i = 0; i < len; i++) {
            if (present[(unsigned char)buf[i]]) {
                want[wl++] = buf[i];
            } else {
                memcpy(want + wl, "\xef\xbf\xbd", 3);
                wl += 3;
            }
        }
        size_t n, dl;
        int* ids = tokenizer_encode(t, buf, len, &n);
        char* back = tokenizer_decode(t, ids, n, &dl);
        if (dl != wl || memcmp(back, want, wl)) ok = 0;
        free(ids);
        free(back);
    }
    CHECK(ok, "%s: decode(encode(x)) != x (bytes without a token as U+FFFD) for some %s", name,
          any_bytes ? "byte sequence" : "UTF-8 text");
    printf("  %s: 300 %s round-trips %s (%d of 256 bytes have a token)\n", name,
           any_bytes ? "random byte sequences" : "random UTF-8 texts", ok ? "exact" : "FAILED",
           npresent);
}

int main(void) {
    const char* data = tu_data_dir();
    const char* gguf = tu_smollm2();
    const char* gemma_file = tu_gemma3();
    if (!data && !gguf && !gemma_file) {
        printf("test_tokenizer: skipped (no ../shared/data and no fetched model)\n");
        return 77;
    }
    char path[4096];
    Tokenizer* gpt2 = NULL;
    if (data) {
        snprintf(path, sizeof path, "%s/gpt2-tokenizer", data);
        gpt2 = tokenizer_load(path);
        CHECK(tokenizer_vocab_size(gpt2) == 50257, "GPT-2 vocabulary size %d",
              tokenizer_vocab_size(gpt2));
        CHECK(tokenizer_eot(gpt2) == 50256, "GPT-2 <|endoftext|> id %d", tokenizer_eot(gpt2));
        roundtrip(gpt2, "gpt2", 1);
        CHECK(tokenizer_replaced_bytes() == 0, "GPT-2 replaced %zu bytes",
              tokenizer_replaced_bytes());
        roundtrip(gpt2, "gpt2", 0);
    }
    Tokenizer* smol = gguf ? tokenizer_load(gguf) : NULL;
    if (smol) {
        CHECK(tokenizer_vocab_size(smol) == 49152, "SmolLM2 vocabulary size %d",
              tokenizer_vocab_size(smol));
        CHECK(!strcmp(tokenizer_pretokenizer(smol), "smollm"), "SmolLM2 pre-tokenizer '%s'",
              tokenizer_pretokenizer(smol));
        roundtrip(smol, "smollm2", 0);
        roundtrip(smol, "smollm2", 1);
    }
    /* Gemma 3's SentencePiece vocabulary: byte fallback makes every byte string round-trip */
    Tokenizer* gemma = gemma_file ? tokenizer_load(gemma_file) : NULL;
    if (gemma) {
        CHECK(tokenizer_vocab_size(gemma) == 262144, "Gemma 3 vocabulary size %d",
              tokenizer_vocab_size(gemma));
        CHECK(tokenizer_bos(gemma) == 2 && tokenizer_eos(gemma) == 1, "Gemma 3 BOS %d, EOS %d",
              tokenizer_bos(gemma), tokenizer_eos(gemma));
        CHECK(tokenizer_find(gemma, "<start_of_turn>") == 105, "<start_of_turn> id %d",
              tokenizer_find(gemma, "<start_of_turn>"));
        roundtrip(gemma, "gemma3", 0);
        roundtrip(gemma, "gemma3", 1);
    }
    {
        snprintf(path, sizeof path, "%s/tests/fixtures/tokenizer_ref.txt", FOCUS_SOURCE_DIR);
        FILE* fp = fopen(path, "r");
        CHECK(fp != NULL, "cannot open %s", path);
        char line[1024];
        int compared = 0;
        while (fp && fgets(line, sizeof line, fp)) {
            char vocab[32], file[512], hex[32];
            size_t count;
            if (line[0] == '#' ||
                sscanf(line, "%31s %511s %zu %31s", vocab, file, &count, hex) != 4)
                continue;
            Tokenizer* t = !strcmp(vocab, "gpt2") ? gpt2 : !strcmp(vocab, "gemma3") ? gemma : smol;
            /* fixtures/...: a file of this repository's tests; else one of ../shared/data */
            const int ours = !strncmp(file, "fixtures/", 9);
            if (!t || (!ours && !data)) continue;
            char fp2[4096];
            snprintf(fp2, sizeof fp2, "%s/%s", ours ? FOCUS_SOURCE_DIR "/tests" : data, file);
            size_t len, n;
            char* text = read_file(fp2, &len);
            int* ids = tokenizer_encode(t, text, len, &n);
            uint64_t want = strtoull(hex, NULL, 16), got = fnv_ids(ids, n);
            printf("  %-8s %-46s %7zu tokens %s\n", vocab, file, n,
                   (n == count && got == want) ? "= reference" : "DIFFERS");
            CHECK(n == count && got == want,
                  "%s %s: %zu tokens (reference %zu), hash %016llx (reference %s)", vocab, file, n,
                  count, (unsigned long long)got, hex);
            compared++;
            free(ids);
            free(text);
        }
        if (fp) fclose(fp);
        CHECK(compared >= (data ? 10 : 1), "only %d fixture lines compared", compared);
    }
    /* long runs of one character are single pieces: BPE must stay near-linear in their length
     * (the quadratic merge loop took over a minute for 200 KB) */
    Tokenizer* t = gpt2 ? gpt2 : smol ? smol : gemma;
    const char* runs[] = {"a", "\xc3\xa9", " "};
    for (int r = 0; r < 3 && t; r++) {
        size_t unit = strlen(runs[r]), len = 200000 / unit * unit, n;
        char* text = mallocCheck(len + 1);
        for (size_t i = 0; i < len; i += unit) memcpy(text + i, runs[r], unit);
        text[len] = 0;
        double t0 = now_seconds();
        int* ids = tokenizer_encode(t, text, len, &n);
        double dt = now_seconds() - t0;
        size_t back;
        char* dec = tokenizer_decode(t, ids, n, &back);
        printf("  200 KB run of '%s': %zu tokens in %.3f s\n", r == 2 ? "space" : runs[r], n, dt);
        CHECK(dt < 2.0, "a 200 KB run of one character took %.1f s to tokenize", dt);
        CHECK(back == len && !memcmp(dec, text, len), "the run does not decode back to itself");
        free(dec);
        free(ids);
        free(text);
    }
    /* SentencePiece merging keeps a heap of pairs: near-linear too */
    for (int r = 0; r < 3 && gemma; r++) {
        size_t unit = strlen(runs[r]), len = 200000 / unit * unit, n;
        char* text = mallocCheck(len + 1);
        for (size_t i = 0; i < len; i += unit) memcpy(text + i, runs[r], unit);
        double t0 = now_seconds();
        int* ids = tokenizer_encode(gemma, text, len, &n);
        double dt = now_seconds() - t0;
        size_t back;
        char* dec = tokenizer_decode(gemma, ids, n, &back);
        printf("  gemma3: 200 KB run of '%s': %zu tokens in %.3f s\n", r == 2 ? "space" : runs[r],
               n, dt);
        CHECK(dt < 2.0, "gemma3: a 200 KB run of one character took %.1f s to tokenize", dt);
        CHECK(back == len && !memcmp(dec, text, len), "gemma3: the run does not decode back");
        free(dec), free(ids), free(text);
    }
    tokenizer_free(gpt2);
    tokenizer_free(smol);
    tokenizer_free(gemma);
    return tu_finish("test_tokenizer");
}
