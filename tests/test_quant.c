/* test_quant.c: the block-quantised matrix-vector products (kernels/quant.c) against
 * dequantise-then-multiply in double precision, for every format they read, the vectorised path
 * against the scalar reference at every instruction-set level the CPU has (quant_set_isa); and
 * decoding from native weights (model_load_native) against decoding from the fp32 parameters
 * dequantised from the same file. */
#include <math.h>
#include <string.h>

#include "../checkpoints/load.h"
#include "../io/gguf.h"
#include "../kernels/quant.h"
#include "../model/decode.h"
#include "testutil.h"

/* A random half / bfloat16 of moderate magnitude (exponent near 0). */
static uint16_t rand_f16(Rng* r, int scale_exp) {
    uint64_t u = rng_u64(r);
    return (uint16_t)(((u & 1) << 15) | (uint64_t)(15 + scale_exp - (int)(u >> 1) % 4) << 10 |
                      ((u >> 8) & 0x3ff));
}
static uint16_t rand_bf16(Rng* r) {
    uint64_t u = rng_u64(r);
    return (uint16_t)(((u & 1) << 15) | (uint64_t)(124 + (u >> 1) % 4) << 7 | ((u >> 8) & 0x7f));
}

/* Random bytes of a (rows, cols) matrix of `type`, scales kept finite and small: the f16
 * scales (and Q4_1's min, the K formats' dmin) rewritten, everything else random. */
static uint8_t* random_matrix(int type, int rows, int cols, Rng* r) {
    size_t rb = qtype_row_bytes(type, cols), n = rb * rows;
    uint8_t* b = mallocCheck(n);
    for (size_t i = 0; i < n; i++) b[i] = (uint8_t)rng_u64(r);
    if (type == QTYPE_F32) {
        for (size_t at = 0; at < n; at += 4) {
            float v = (float)(rng_normal(r) * 0.1);
            memcpy(b + at, &v, 4);
        }
        return b;
    }
    /* block bytes and where its f16 scales sit (-1: none) */
    const size_t bb = type == QTYPE_Q4_0   ? 18
                      : type == QTYPE_Q4_1 ? 20
                      : type == QTYPE_Q5_0 ? 22
                      : type == QTYPE_Q8_0 ? 34
                      : type == QTYPE_Q4_K ? 144
                      : type == QTYPE_Q5_K ? 176
                      : type == QTYPE_Q6_K ? 210
                                           : 2;
    const int at0 = type == QTYPE_Q6_K ? 208 : 0;
    const int at1 = type == QTYPE_Q4_1 || type == QTYPE_Q4_K || type == QTYPE_Q5_K ? 2 : -1;
    /* the K formats multiply d by 6- or 8-bit sub-scales: smaller d */
    const int k = type == QTYPE_Q4_K || type == QTYPE_Q5_K || type == QTYPE_Q6_K;
    for (size_t at = 0; at < n; at += bb) {
        uint16_t h = type == QTYPE_BF16 ? rand_bf16(r) : rand_f16(r, k ? -9 : -4);
        memcpy(b + at + at0, &h, 2);
        if (at1 >= 0) {
            uint16_t m = rand_f16(r, k ? -8 : -3);
            memcpy(b + at + at1, &m, 2);
        }
    }
    return b;
}

static void check_format(int type, const char* name, Rng* r) {
    enum { rows = 37, cols = 512, n = 11 };
    QMatrix w = {.type = type,
                 .rows = rows,
                 .cols = cols,
                 .row_bytes = qtype_row_bytes(type, cols),
                 .data = random_matrix(type, rows, cols, r)};
    qmatrix_prepare(&w); /* the packed decode copy, where this level and format have one */
    const int packs =
        type == QTYPE_Q4_0 || type == QTYPE_Q4_1 || type == QTYPE_Q5_0 || type == QTYPE_Q8_0;
    CHECK(!w.packed == !(packs && quant_isa() >= QUANT_ISA_AVX2),
          "%s: a packed decode copy %s at the level %s", name, w.packed ? "made" : "missing",
          quant_isa_name(quant_isa()));
    float* dense = mallocCheck(sizeof(float) * rows * cols);
    CHECK(ggml_dequantize(dense, w.data, (uint32_t)type, (uint64_t)rows * cols) == 0,
          "%s: dequantise", name);
    static float x[n * cols];
    float bias[rows], y[rows], yr[rows];
    /* activations with a mean, as real ones have (Gemma's are large): an offset taken off on
     * the float side instead of in the integers shows here */
    for (int j = 0; j < n * cols; j++) x[j] = (float)(rng_normal(r) + 4);
    for (int i = 0; i < rows; i++) bias[i] = (float)rng_normal(r);
    qmatvec(y, &w, x, bias);
    qmatvec_ref(yr, &w, x, bias);
    /* the block formats quantise the activations to int8 per block: against the exact product
     * they are off by a fraction of a percent (relative RMS), against their scalar reference by
     * round-off only */
    double err = 0, err_ref = 0, scale = 0, se = 0, sw = 0;
    for (int i = 0; i < rows; i++) {
        double want = bias[i];
        for (int j = 0; j < cols; j++) want += (double)dense[(size_t)i * cols + j] * x[j];
        err = fmax(err, fabs(y[i] - want));
        err_ref = fmax(err_ref, fabs(y[i] - yr[i]));
        scale = fmax(scale, fabs(want));
        se += (y[i] - want) * (y[i] - want), sw += want * want;
    }
    const int blocks = type != QTYPE_F32 && type != QTYPE_F16 && type != QTYPE_BF16;
    const double rel = sqrt(se / sw);
    float row[cols];
    qrow(row, &w, 17);
    double rowerr = 0;
    for (int j = 0; j < cols; j++)
        rowerr = fmax(rowerr, fabs(row[j] - dense[(size_t)17 * cols + j]) /
                                  (fabs(dense[(size_t)17 * cols + j]) + 1e-30));
    CHECK(rowerr < 1e-6, "%s: qrow differs from dequantise (relative %g)", name, rowerr);
    /* several rows at once (a server's slots decoding together): each row bit for bit the
     * single-row product, written ldy apart */
    {
        enum { nr = 5, ld = rows + 3 };
        static float ys[nr * ld];
        qmatvec_rows(ys, ld, &w, x, nr, bias);
        int same = 1;
        for (int t = 0; t < nr; t++) {
            float one[rows];
            qmatvec(one, &w, x + (size_t)t * cols, bias);
            same &= !memcmp(one, ys + (size_t)t * ld, sizeof one);
        }
        CHECK(same, "%s: qmatvec_rows differs from qmatvec row by row", name);
    }
    /* the batched product (a prompt's): int8 products on CPUs with VNNI for the formats with
     * one scale per 32 weights (against their scalar reference to round-off, against the exact
     * product like qmatvec), fp32 panels otherwise (against the exact product to round-off) */
    static float yb[n * rows], yi[n * rows];
    qmatmul(yb, rows, &w, x, n, bias, 0);
    const int int8 = type == QTYPE_Q4_0 || type == QTYPE_Q4_1 || type == QTYPE_Q5_0 ||
                     type == QTYPE_Q8_0 || type == QTYPE_Q4_K || type == QTYPE_Q5_K;
    if (int8) qmatmul_int8_ref(yi, rows, &w, x, n, bias);
    if (w.packed) { /* the panels taken from the packed decode copy: the same bits as decoded */
        static float yu[n * rows];
        uint8_t* keep = w.packed;
        w.packed = NULL;
        qmatmul(yu, rows, &w, x, n, bias, 0);
        w.packed = keep;
        CHECK(!memcmp(yu, yb, sizeof yu), "%s: panels from the packed copy differ from decoded",
              name);
    }
    double errb = 0, scb = 0, seb = 0, swb = 0, erri = 0;
    for (int t = 0; t < n; t++)
        for (int i = 0; i < rows; i++) {
            double want = bias[i];
            for (int j = 0; j < cols; j++)
                want += (double)dense[(size_t)i * cols + j] * x[(size_t)t * cols + j];
            const double got = yb[(size_t)t * rows + i];
            errb = fmax(errb, fabs(got - want));
            scb = fmax(scb, fabs(want));
            seb += (got - want) * (got - want), swb += want * want;
            if (int8) erri = fmax(erri, fabs(yi[(size_t)t * rows + i] - want));
        }
    const int vnni = int8 && qmatmul_int8_available(); /* the integer path at this level */
    if (int8) {
        double d = 0;
        for (int i = 0; i < n * rows; i++) d = fmax(d, fabs(yb[i] - yi[i]));
        if (vnni)
            CHECK(d < 1e-5 * (scb + 1), "%s: %s and scalar batched products differ by %g", name,
                  quant_isa_name(quant_isa()), d);
        CHECK(sqrt(seb / swb) < 1e-2 || !vnni, "%s: int8 batched product off by %g (RMS)", name,
              sqrt(seb / swb));
        CHECK(erri < 0.05 * (scb + 1), "%s: scalar int8 batched product off by %g", name, erri);
    }
    printf(
        "  %-5s max |error| %.2e, relative RMS %.1e (vectorised - scalar %.1e) of max |y| %.2f; "
        "batched (%s) relative RMS %.1e\n",
        name, err, rel, err_ref, scale, vnni ? "int8" : "fp32 panels", sqrt(seb / swb));
    /* the block formats' integer sums are exact: only their float scaling rounds (1e-7 of the
     * largest output here; an offset taken off in floats gives 1e-6) */
    CHECK(err_ref < (blocks ? 5e-7 : 1e-5) * (scale + 1),
          "%s: vectorised and scalar paths differ by %g", name, err_ref);
    CHECK(blocks ? rel < 1e-2 : err < 1e-5 * (scale + 1),
          "%s: matvec differs from dequantise-then-multiply (max %g, relative RMS %g)", name, err,
          rel);
    CHECK(vnni || errb < 1e-5 * (scb + 1), "%s: batched product differs by %g", name, errb);
    free(dense);
    qmatrix_release(&w);
    free((void*)w.data);
}

/* Decode n tokens of m, return the last logits (V) in out. */
static void decode(Model* m, const int* tok, int n, real* out) {
    KVCache c;
    kvcache_init(&c, m, n, 0);
    for (int i = 0; i < n; i++) model_decode_step(m, &c, tok[i], out);
    kvcache_free(&c);
}

/* f32_to_f16: every half comes back as itself; ties to even; the range's edges. */
static void check_f16(void) {
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) continue; /* NaN payloads */
        bad += f32_to_f16(f16_to_f32((uint16_t)h), 0) != h;
    }
    CHECK(bad == 0, "f32_to_f16: %d halves do not come back as themselves", bad);
    const struct {
        float f;
        uint16_t want, want_sat;
    } cases[] = {
        {1.0f + 0x1p-11f, 0x3c00, 0x3c00},     /* a tie: to the even 1.0 */
        {1.0f + 3 * 0x1p-11f, 0x3c02, 0x3c02}, /* a tie: to the even 1 + 2^-9 */
        {1.0f + 0x1p-11f + 0x1p-20f, 0x3c01, 0x3c01},
        {65519.0f, 0x7bff, 0x7bff},
        {65520.0f, 0x7c00, 0x7bff},
        {-1e9f, 0xfc00, 0xfbff},
        {0x1p-25f, 0x0000, 0x0000}, /* half the smallest subnormal: to 0 */
        {3 * 0x1p-26f, 0x0001, 0x0001},
        {0x1p-14f - 0x1p-25f, 0x0400, 0x0400}, /* rounds up into the normals */
        {-0.0f, 0x8000, 0x8000},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint16_t got = f32_to_f16(cases[i].f, 0), sat = f32_to_f16(cases[i].f, 1);
        CHECK(got == cases[i].want && sat == cases[i].want_sat,
              "f32_to_f16(%a) = %04x / %04x (saturated), want %04x / %04x", (double)cases[i].f, got,
              sat, cases[i].want, cases[i].want_sat);
    }
    CHECK(f32_to_f16(NAN, 1) == 0x7e00, "f32_to_f16(NaN) must be a NaN");
}

int main(void) {
    check_f16();
    Rng r;
    rng_seed(&r, 5);
    const struct {
        int type;
        const char* name;
    } fmts[] = {{QTYPE_F32, "F32"},   {QTYPE_F16, "F16"},   {QTYPE_BF16, "BF16"},
                {QTYPE_Q4_0, "Q4_0"}, {QTYPE_Q4_1, "Q4_1"}, {QTYPE_Q5_0, "Q5_0"},
                {QTYPE_Q8_0, "Q8_0"}, {QTYPE_Q4_K, "Q4_K"}, {QTYPE_Q5_K, "Q5_K"},
                {QTYPE_Q6_K, "Q6_K"}};
    /* every instruction-set level this CPU has, each against the scalar reference */
    const int best = quant_isa_detected();
    for (int level = best; level >= QUANT_ISA_SCALAR; level--) {
        if (!quant_isa_has(level)) { /* (not nested on every CPU) */
            printf(" level %s: not on this CPU\n", quant_isa_name(level));
            continue;
        }
        quant_set_isa(level);
        rng_seed(&r, 5); /* the same matrices at every level */
        printf(" level %s%s:\n", quant_isa_name(level), level == best ? " (this CPU's best)" : "");
        for (size_t i = 0; i < sizeof fmts / sizeof fmts[0]; i++)
            check_format(fmts[i].type, fmts[i].name, &r);
    }
    quant_set_isa(best);

    /* decoding: native weights against the fp32 parameters of the same file */
    ModelConfig cfg;
    FocusConfig fc;
    model_config_preset("tiny-llama", &cfg);
    cfg.tied = 1;
    focus_config_default(&fc);
    fc.attn = ATTN_DENSE;
    Model src;
    model_build(&src, &cfg, &fc);
    model_init_backbone(&src, 8);
    int tok[12];
    for (int i = 0; i < 12; i++) tok[i] = (i * 5 + 1) % cfg.V;
    for (int quant = 0; quant < 2; quant++) {
        const char* path = tu_path("decode.gguf");
        gguf_write_model(&src, path, quant);
        Model m;
        model_load(&m, path, &fc, NULL);
        real *a = mallocCheck(sizeof(real) * cfg.V), *b = mallocCheck(sizeof(real) * cfg.V);
        decode(&m, tok, 12, a);
        char why[512];
        int rc = model_load_native(&m, path, why, sizeof why);
        CHECK(rc == 0, "native weights of %s: %s", quant ? "Q8_0/F16" : "F32", why);
        decode(&m, tok, 12, b);
        double d = 0, s = 0;
        for (int v = 0; v < cfg.V; v++) d = fmax(d, fabs(a[v] - b[v])), s = fmax(s, fabs(a[v]));
        printf("  decode from %s blocks: max |logit difference| %.2e of %.2f\n",
               quant ? "Q8_0 / F16" : "F32", d, s);
        const double tol = quant ? 1e-2 : 1e-4; /* int8 activations for Q8_0 blocks */
        CHECK(rc == 0 && d < tol * (s + 1), "native decode differs by %g", d);
        model_free(&m);
        /* decoding only from the file (model_load_lean): the same logits, no fp32 matrices */
        rc = model_load_lean(&m, path, &fc, NULL, why, sizeof why);
        CHECK(rc == 0 && m.decode_only, "lean load: %s", why);
        decode(&m, tok, 12, b);
        d = 0;
        for (int v = 0; v < cfg.V; v++) d = fmax(d, fabs(a[v] - b[v]));
        printf("  decode-only load: max |logit difference| %.2e\n", d);
        CHECK(rc == 0 && d < tol * (s + 1), "decode-only load differs by %g", d);
        /* the prompt batched from the blocks: the fp32 parameters' logits (int8 products for
         * the Q8_0 blocks where the CPU has VNNI) */
        KVCache c;
        kvcache_init(&c, &m, 12, 0);
        model_prefill(&m, &c, tok, 12, b, 0);
        kvcache_free(&c);
        d = 0;
        for (int v = 0; v < cfg.V; v++) d = fmax(d, fabs(a[v] - b[v]));
        printf("  batched prefill from the blocks: max |logit difference| %.2e\n", d);
        CHECK(d < tol * (s + 1), "batched prefill from the blocks differs by %g", d);
        free(a);
        free(b);
        model_free(&m);
    }
    model_free(&src);
    /* a GPT-2 model: refused with a reason, the model unchanged */
    model_config_preset("tiny-gpt2", &cfg);
    Model g;
    model_build(&g, &cfg, &fc);
    char why[512];
    CHECK(model_load_native(&g, "unused.gguf", why, sizeof why) == -1 && strstr(why, "llama") &&
              !g.native,
          "a gpt2 model must be refused: %s", why);
    model_free(&g);
    return tu_finish("test_quant");
}
