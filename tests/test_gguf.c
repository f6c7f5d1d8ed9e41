/* test_gguf.c: the GGUF reader.
 * - Dequantisation of every supported block type equals the `gguf` package's
 *   (tests/fixtures/dequant_ref.txt, scripts/reference/make_dequant_fixture.py).
 * - A tiny LLaMA written here as GGUF (F32, F16 and Q8_0 tensors) loads back into a model whose
 *   logits equal the original's (F32 exactly; the quantised copy closely).
 * - Thousands of mutated files (truncations, corrupted header bytes, wrong magic, bad offsets,
 *   unsupported types) are rejected with a message or read safely; run under the sanitizer
 *   build, any out-of-bounds read fails the test.
 * With an argument, leaves a copy of tiny.gguf at that path for tests/cli_errors.sh. */
#include <math.h>
#include <string.h>

#include "../io/io.h"
#include "../io/gguf.h"
#include "../checkpoints/load.h"
#include "../data/text.h"
#include "../data/tokenizer.h"
#include "../model/decode.h"
#include "testutil.h"

/* ------------------------------------------------------------- dequantisation fixture */

static int type_from_name(const char* s) {
    static const struct {
        const char* n;
        int t;
    } m[] = {{"Q4_0", GGML_Q4_0}, {"Q4_1", GGML_Q4_1}, {"Q5_0", GGML_Q5_0}, {"Q5_1", GGML_Q5_1},
             {"Q8_0", GGML_Q8_0}, {"Q4_K", GGML_Q4_K}, {"Q5_K", GGML_Q5_K}, {"Q6_K", GGML_Q6_K},
             {"F16", GGML_F16},   {"BF16", GGML_BF16}};
    for (size_t i = 0; i < sizeof m / sizeof m[0]; i++)
        if (!strcmp(s, m[i].n)) return m[i].t;
    return -1;
}

static void check_dequant(void) {
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/fixtures/dequant_ref.txt", FOCUS_SOURCE_DIR);
    size_t len;
    char* text = read_file(path, &len);
    int types = 0;
    char* save;
    char* line = strtok_r(text, "\n", &save);
    while (line) {
        if (line[0] == '#') {
            line = strtok_r(NULL, "\n", &save);
            continue;
        }
        char name[16];
        size_t n;
        int off;
        if (sscanf(line, "%15s %zu %n", name, &n, &off) != 2) break;
        const char* hex = line + off;
        size_t nb = strlen(hex) / 2;
        uint8_t* raw = mallocCheck(nb);
        for (size_t i = 0; i < nb; i++) sscanf(hex + 2 * i, "%2hhx", &raw[i]);
        char* vals = strtok_r(NULL, "\n", &save);
        float* want = mallocCheck(sizeof(float) * n);
        float* got = mallocCheck(sizeof(float) * n);
        char* p = vals;
        for (size_t i = 0; i < n; i++) want[i] = strtof(p, &p);
        int t = type_from_name(name);
        CHECK(t >= 0 && ggml_nbytes((uint32_t)t, n) == nb, "%s: block size mismatch", name);
        int rc = ggml_dequantize(got, raw, (uint32_t)t, n);
        double worst = 0;
        for (size_t i = 0; i < n; i++)
            worst = fmax(worst, fabs(got[i] - want[i]) / (fabs(want[i]) + 1e-6));
        printf("  dequantise %-5s %4zu values: max relative difference from gguf-py %.2e\n", name,
               n, worst);
        CHECK(rc == 0 && worst < 1e-6, "%s: dequantisation differs from the reference (%g)", name,
              worst);
        types++;
        free(raw), free(want), free(got);
        line = strtok_r(NULL, "\n", &save);
    }
    CHECK(types == 10, "expected 10 types in the fixture, found %d", types);
    free(text);
}

typedef struct {
    uint8_t* b;
    size_t n, cap;
} Buf;

static void save(const char* path, const Buf* b) {
    FILE* fp = fopen(path, "wb");
    fwrite(b->b, 1, b->n, fp);
    fclose(fp);
}

static Buf write_gguf(const Model* m, int quant) {
    Buf b = {0};
    b.b = gguf_serialize_llama(m, quant, &b.n);
    b.cap = b.n;
    return b;
}

/* Open a mutated buffer; if it parses, dequantise every tensor (bounds are then exercised). */
static int try_open(const char* path, const Buf* b, char* err, size_t errlen) {
    save(path, b);
    GGUFFile f;
    int rc = gguf_open(&f, path, err, errlen);
    if (rc == 0) {
        for (uint64_t i = 0; i < f.n_tensors; i++) {
            const GGUFTensor* t = &f.tensors[i];
            if (!t->data) continue;
            float* tmp = mallocCheck(sizeof(float) * t->nelem);
            ggml_dequantize(tmp, t->data, t->type, t->nelem);
            free(tmp);
        }
        gguf_close(&f);
    }
    return rc;
}

static void load_tokenizer_path(const void* path) { tokenizer_free(tokenizer_load(path)); }

static void load_path(const void* path) {
    Model m;
    FocusConfig fc;
    focus_config_default(&fc);
    model_load(&m, path, &fc, NULL);
}

/* A copy of b with the value of metadata key `key` (after its u32 type) replaced by the n bytes
 * at v, saved to path. */
static void save_patched(const Buf* b, const char* key, const void* v, size_t n, const char* path) {
    Buf c = {mallocCheck(b->n), b->n, b->n};
    memcpy(c.b, b->b, b->n);
    size_t kl = strlen(key);
    for (size_t i = 0; i + kl + 4 + n <= c.n; i++)
        if (!memcmp(c.b + i, key, kl)) {
            memcpy(c.b + i + kl + 4, v, n);
            break;
        }
    save(path, &c);
    free(c.b);
}

/* Numeric metadata out of range or not finite, and a NaN weight: refused in one line before
 * anything the shape sizes is allocated (issue 15). */
static void bad_metadata(const Model* m) {
    Buf good = write_gguf(m, 0);
    char msg[4096];
    const char* p = tu_path("bad_meta.gguf");
    const uint32_t big = 1000000;
    const float nan = NAN, neg = -1, zero = 0;
    struct {
        const char* key;
        const void* v;
        const char* want;
    } cases[] = {{"llama.block_count", &big, "L = 1000000 is out of range"},
                 {"llama.embedding_length", &big, "C = 1000000 is out of range"},
                 {"llama.attention.head_count", &big, "NH = 1000000 is out of range"},
                 {"llama.attention.layer_norm_rms_epsilon", &nan, "eps = nan"},
                 {"llama.attention.layer_norm_rms_epsilon", &neg, "eps = -1"},
                 {"llama.rope.freq_base", &nan, "rope_theta = nan"},
                 {"llama.rope.freq_base", &zero, "rope_theta = 0"},
                 {"llama.rope.freq_base", &neg, "rope_theta = -1"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        save_patched(&good, cases[i].key, cases[i].v, 4, p);
        int ok = tu_fails_with(load_path, p, cases[i].want, msg, sizeof msg);
        CHECK(ok && strstr(msg, "bad_meta.gguf"), "%s mutated: %s", cases[i].key, msg);
    }
    /* general.alignment 32 -> 16: the data no longer starts where the offsets say, unless the
     * header happens to end on a 32-byte boundary anyway: refused, or read exactly as written */
    const uint32_t a16 = 16;
    save_patched(&good, "general.alignment", &a16, 4, p);
    if (!tu_fails_with(load_path, p, "bad_meta.gguf", msg, sizeof msg)) {
        Model back;
        FocusConfig fc;
        focus_config_default(&fc);
        model_load(&back, p, &fc, NULL);
        CHECK(!memcmp(back.params_mem, m->params_mem, sizeof(real) * m->num_params),
              "alignment 16 read garbage without an error: %s", msg);
        model_free(&back);
    } else {
        printf("  alignment 16: %s\n", msg);
    }
    /* a NaN weight: the first element of token_embd.weight (F32, the first tensor's data) */
    GGUFFile f;
    char err[256];
    save(p, &good);
    if (!gguf_open(&f, p, err, sizeof err)) {
        size_t at = (size_t)(gguf_tensor(&f, "token_embd.weight")->data - f.map);
        gguf_close(&f);
        memcpy(good.b + at, &nan, 4);
        save(p, &good);
        CHECK(tu_fails_with(load_path, p, "weight 0 of wte is nan", msg, sizeof msg),
              "NaN weight: %s", msg);
    }
    free(good.b);
}

/* A tiny gemma3 through GGUF: the shape's own keys read back (head size, sliding window, its
 * period and RoPE base), the logits exactly (F32) or to Q8_0's rounding (the native decode
 * path too); a file contradicting itself refused naming the key (issue 26). */
static void gemma3_file(void) {
    ModelConfig cfg;
    FocusConfig fc;
    model_config_preset("tiny-gemma3", &cfg);
    focus_config_default(&fc);
    fc.attn = ATTN_DENSE;
    Model m;
    model_build(&m, &cfg, &fc);
    model_init_backbone(&m, 5);
    for (size_t i = 0; i < m.num_params; i++)
        if (m.params_mem[i] != 1) m.params_mem[i] *= 10;
    enum { T = 20 };
    int tok[T];
    for (int i = 0; i < T; i++) tok[i] = (i * 5 + 1) % cfg.V;
    model_forward(&m, tok, NULL, 1, T, 0);
    const size_t nl = (size_t)T * cfg.V;
    real* ref = mallocCheck(sizeof(real) * nl);
    memcpy(ref, model_logits(&m), sizeof(real) * nl);
    double scale = 0;
    for (size_t i = 0; i < nl; i++) scale = fmax(scale, fabs(ref[i]));
    for (int quant = 0; quant < 2; quant++) {
        Buf b = write_gguf(&m, quant);
        const char* path = tu_path(quant ? "gemma_q8.gguf" : "gemma.gguf");
        save(path, &b);
        Model m2;
        ModelInfo info;
        model_load(&m2, path, &fc, &info);
        const ModelConfig* c2 = &m2.cfg;
        CHECK(c2->arch == ARCH_GEMMA3 && c2->hs == cfg.hs && c2->swa == cfg.swa &&
                  c2->swa_period == cfg.swa_period && c2->rope_local == cfg.rope_local &&
                  !strcmp(info.arch, "gemma3"),
              "gemma3 shape read back: arch %d hs %d swa %d period %d rope_local %g", c2->arch,
              c2->hs, c2->swa, c2->swa_period, (double)c2->rope_local);
        CHECK(model_fingerprint(&m2) == model_fingerprint(&m) || quant,
              "gemma3 F32 file: another fingerprint");
        model_forward(&m2, tok, NULL, 1, T, 0);
        double d = tu_max_abs_diff(ref, model_logits(&m2), nl);
        /* the file's blocks, decoded in place (Q8_0 matrices, int8 activations) */
        char why[256];
        double dn = -1;
        if (quant && !model_load_native(&m2, path, why, sizeof why)) {
            KVCache kc;
            kvcache_init(&kc, &m2, T, 0);
            real* lg = mallocCheck(sizeof(real) * cfg.V);
            dn = 0;
            for (int t = 0; t < T; t++) {
                model_decode_step(&m2, &kc, tok[t], lg);
                for (int v = 0; v < cfg.V; v++)
                    dn = fmax(dn, fabs(lg[v] - ref[(size_t)t * cfg.V + v]));
            }
            free(lg);
            kvcache_free(&kc);
        }
        printf(
            "  tiny gemma3 through GGUF (%s): max |logit difference| %.2e%s (max |logit| %.1f)\n",
            quant ? "F16 + Q8_0" : "F32", d, quant ? ", native decode" : "", scale);
        if (quant) {
            CHECK(d < 0.02 * scale && d > 0, "quantised gemma3 GGUF logits differ by %g", d);
            CHECK(dn >= 0 && dn < 0.03 * scale, "gemma3 native decode: %s (differs by %g)",
                  dn < 0 ? why : "ok", dn);
        } else {
            CHECK(d == 0, "F32 gemma3 GGUF must reproduce the logits exactly (%g)", d);
        }
        model_free(&m2);
        free(b.b);
    }
    /* contradictions: each refused in one line naming the key */
    Buf good = write_gguf(&m, 0);
    char msg[4096];
    const char* p = tu_path("bad_gemma.gguf");
    const uint32_t big = 100000, three = 3, hs24 = 24;
    struct {
        const char* key;
        const void* v;
        const char* want;
    } cases[] = {
        {"gemma3.attention.sliding_window", &big, "'gemma3.attention.sliding_window' = 100000"},
        {"gemma3.attention.head_count", &three, "'gemma3.attention.head_count' = 3"},
        {"gemma3.attention.value_length", &hs24, "'gemma3.attention.value_length' = 24"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        save_patched(&good, cases[i].key, cases[i].v, 4, p);
        int ok = tu_fails_with(load_path, p, cases[i].want, msg, sizeof msg);
        CHECK(ok && strstr(msg, "bad_gemma.gguf") && !strchr(msg, '\n'), "%s mutated: %s",
              cases[i].key, msg);
        printf("  %s mutated: %s\n", cases[i].key, msg);
    }
    save(p, &good); /* its tokenizer model is "none" */
    CHECK(tu_fails_with(load_tokenizer_path, p, "'tokenizer.ggml.model' = 'none'", msg, sizeof msg),
          "unknown tokenizer model: %s", msg);
    free(good.b);
    free(ref);
    model_free(&m);
}

int main(int argc, char** argv) {
    gemma3_file();
    check_dequant();

    ModelConfig cfg;
    FocusConfig fc;
    model_config_preset("tiny-llama", &cfg);
    focus_config_default(&fc);
    fc.attn = ATTN_DENSE;
    Model m;
    model_build(&m, &cfg, &fc);
    model_init_backbone(&m, 3);
    for (size_t i = 0; i < m.num_params; i++)
        if (m.params_mem[i] != 1) m.params_mem[i] *= 10;
    enum { T = 20 };
    int tok[T];
    for (int i = 0; i < T; i++) tok[i] = (i * 7) % cfg.V;
    model_forward(&m, tok, NULL, 1, T, 0);
    size_t nl = (size_t)T * cfg.V;
    real* ref = mallocCheck(sizeof(real) * nl);
    memcpy(ref, model_logits(&m), sizeof(real) * nl);

    for (int quant = 0; quant < 2; quant++) {
        Buf b = write_gguf(&m, quant);
        const char* path = tu_path(quant ? "tiny_q8.gguf" : "tiny.gguf");
        save(path, &b);
        if (!quant && argc > 1) save(argv[1], &b);
        Model m2;
        ModelInfo info;
        model_load(&m2, path, &fc, &info);
        model_forward(&m2, tok, NULL, 1, T, 0);
        double d = tu_max_abs_diff(ref, model_logits(&m2), nl);
        double scale = 0;
        for (size_t i = 0; i < nl; i++) scale = fmax(scale, fabs(ref[i]));
        printf("  tiny llama through GGUF (%s): max |logit difference| %.2e (max |logit| %.1f)\n",
               quant ? "F16 + Q8_0" : "F32", d, scale);
        if (quant)
            CHECK(d < 0.02 * scale && d > 0, "quantised GGUF logits differ by %g", d);
        else
            CHECK(d == 0, "F32 GGUF must reproduce the logits exactly (%g)", d);
        CHECK(!strcmp(info.arch, "llama") && !strcmp(info.format, "gguf"), "info %s %s", info.arch,
              info.format);
        model_free(&m2);
        free(b.b);
    }

    /* Mutations of the F32 file. */
    Buf good = write_gguf(&m, 0);
    Buf mut = {mallocCheck(good.n), 0, good.n};
    char err[512];
    Rng rng;
    rng_seed(&rng, 12);
    int rejected = 0, opened = 0, one_line = 1;
    /* every truncation length in the header, then a stride through the data */
    for (size_t cut = 0; cut < good.n; cut += cut < 2048 ? 1 : 97) {
        memcpy(mut.b, good.b, cut);
        mut.n = cut;
        if (try_open(tu_path("mutant.gguf"), &mut, err, sizeof err))
            rejected++, one_line &= !strchr(err, '\n');
        else
            opened++;
    }
    CHECK(opened == 0, "%d truncated files were accepted", opened);
    printf("  %d truncated files: all rejected\n", rejected);
    int hdr_rejected = 0, hdr_opened = 0;
    for (int trial = 0; trial < 3000; trial++) {
        memcpy(mut.b, good.b, good.n);
        mut.n = good.n;
        int flips = 1 + (int)(rng_u64(&rng) % 4);
        for (int k = 0; k < flips; k++) {
            size_t at = rng_u64(&rng) % 1500; /* the header and tensor table */
            mut.b[at] = (uint8_t)(trial % 3 == 0 ? 0xff : rng_u64(&rng));
        }
        if (try_open(tu_path("mutant.gguf"), &mut, err, sizeof err))
            hdr_rejected++, one_line &= !strchr(err, '\n');
        else
            hdr_opened++;
    }
    printf(
        "  3000 files with corrupted header bytes: %d rejected with a message, %d still readable\n",
        hdr_rejected, hdr_opened);
    CHECK(hdr_rejected > 1000, "too few corrupted headers were noticed (%d)", hdr_rejected);
    CHECK(one_line, "an error message spans several lines");

    memcpy(mut.b, good.b, good.n);
    mut.n = good.n;
    mut.b[0] = 'X';
    CHECK(try_open(tu_path("mutant.gguf"), &mut, err, sizeof err) && strstr(err, "magic"),
          "wrong magic: %s", err);
    memcpy(mut.b, good.b, 8);
    uint32_t v9 = 9;
    memcpy(mut.b + 4, &v9, 4);
    CHECK(try_open(tu_path("mutant.gguf"), &mut, err, sizeof err) && strstr(err, "version"),
          "bad version: %s", err);
    free(mut.b);
    free(good.b);

    CHECK(ggml_dequantize(NULL, NULL, 10, 256) == -1 && !strcmp(ggml_type_name(10), "Q2_K"),
          "Q2_K must be reported as unsupported");
    bad_metadata(&m);
    free(ref);
    model_free(&m);

    return tu_finish("test_gguf");
}
