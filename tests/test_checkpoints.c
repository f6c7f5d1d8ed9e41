/* test_checkpoints.c: safetensors and llm.c import, on files this test writes; and the real-shape
 * presets (llama2-7b ... llama3-8b) against their published parameter counts.
 * - GPT-2 as an llm.c checkpoint (fp32 version 3 with a padded vocabulary, and bf16 version 5);
 * - GPT-2 as Hugging Face safetensors (Conv1D weights stored transposed, "transformer." prefix);
 * - LLaMA with Q/K/V biases as Hugging Face safetensors + config.json (half-split rotary rows,
 *   which the importer permutes into the adjacent-pair convention).
 * Each loaded model must give the original's logits (bf16: close, not equal). */
#include <math.h>
#include <string.h>
#include <sys/stat.h>

#include "../io/gguf.h"
#include "../checkpoints/load.h"
#include "testutil.h"

enum { T = 24 };
static int tok[T];

static real* logits_of(Model* m) {
    model_forward(m, tok, NULL, 1, T, 0);
    real* l = mallocCheck(sizeof(real) * T * m->cfg.V);
    memcpy(l, model_logits(m), sizeof(real) * T * m->cfg.V);
    return l;
}

static void compare(const char* what, const char* path, const real* ref, int V, double tol) {
    FocusConfig fc;
    focus_config_default(&fc);
    fc.attn = ATTN_DENSE;
    Model m;
    ModelInfo info;
    model_load(&m, path, &fc, &info);
    real* got = logits_of(&m);
    double d = tu_max_abs_diff(ref, got, (size_t)T * V);
    printf("  %-40s max |logit difference| %.2e\n", what, d);
    CHECK(d <= tol, "%s: logits differ by %g (tolerance %g)", what, d, tol);
    free(got);
    model_free(&m);
}

static Model make(const char* preset, int qkv_bias) {
    ModelConfig cfg;
    FocusConfig fc;
    model_config_preset(preset, &cfg);
    cfg.qkv_bias = qkv_bias;
    focus_config_default(&fc);
    fc.attn = ATTN_DENSE;
    Model m;
    model_build(&m, &cfg, &fc);
    model_init_backbone(&m, 21);
    Rng rng;
    rng_seed(&rng, 4);
    for (size_t i = 0; i < m.num_params; i++) m.params_mem[i] += (real)(0.2 * rng_normal(&rng));
    return m;
}

static uint16_t bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    return (uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

static void write_llmc(const Model* m, const char* path, int version, int Vp) {
    FILE* fp = fopen(path, "wb");
    int32_t h[256] = {20240326, version, m->cfg.maxT, m->cfg.V, m->cfg.L, m->cfg.NH, m->cfg.C, Vp};
    fwrite(h, 4, 256, fp);
    real** p = (real**)&m->params;
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        if (!p[i]) continue;
        size_t n = m->param_sizes[i], pad = i == 0 ? (size_t)(Vp - m->cfg.V) * m->cfg.C : 0;
        for (size_t j = 0; j < n + pad; j++) {
            float v = j < n ? p[i][j] : 0;
            if (version == 3)
                fwrite(&v, 4, 1, fp);
            else {
                uint16_t b = bf16(v);
                fwrite(&b, 2, 1, fp);
            }
        }
    }
    fclose(fp);
}

/* A safetensors writer: tensors given as (name, data, rows, cols, transpose-on-write). */
typedef struct {
    char name[96];
    float* data; /* owned copy in file layout */
    size_t rows, cols;
} STensor;

/* Mutations for the bad-input cases: a tensor left out, and data_offsets moved (the second
 * tensor's span shifted back into the first one's, or every span shifted forward). */
static const char* st_skip;
static int st_overlap, st_shift;

static void st_add(STensor* ts, int* n, const char* name, const real* src, size_t rows, size_t cols,
                   int transpose) {
    if (st_skip && !strcmp(name, st_skip)) return;
    STensor* t = &ts[(*n)++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->rows = transpose ? cols : rows;
    t->cols = transpose ? rows : cols;
    t->data = mallocCheck(sizeof(float) * rows * cols);
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < cols; c++)
            t->data[transpose ? c * rows + r : r * cols + c] = src[r * cols + c];
}

static void st_write(const char* path, STensor* ts, int n) {
    size_t cap = 1 << 16, len = 0, off = 0;
    char* hdr = mallocCheck(cap);
    len += (size_t)snprintf(hdr, cap, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < n; i++) {
        size_t bytes = ts[i].rows * ts[i].cols * 4;
        off += (size_t)st_shift;
        if (i == 1 && st_overlap) off -= 4;
        if (ts[i].rows == 1)
            len += (size_t)snprintf(
                hdr + len, cap - len,
                ",\"%s\":{\"dtype\":\"F32\",\"shape\":[%zu],\"data_offsets\":[%zu,%zu]}",
                ts[i].name, ts[i].cols, off, off + bytes);
        else
            len += (size_t)snprintf(
                hdr + len, cap - len,
                ",\"%s\":{\"dtype\":\"F32\",\"shape\":[%zu,%zu],\"data_offsets\":[%zu,%zu]}",
                ts[i].name, ts[i].rows, ts[i].cols, off, off + bytes);
        off += bytes - (size_t)st_shift;
        if (i == 1 && st_overlap) off += 4;
    }
    len += (size_t)snprintf(hdr + len, cap - len, "}");
    while (len % 8) hdr[len++] = ' ';
    FILE* fp = fopen(path, "wb");
    uint64_t hl = len;
    fwrite(&hl, 8, 1, fp);
    fwrite(hdr, 1, len, fp);
    for (int i = 0; i < n; i++) {
        fwrite(ts[i].data, 4, ts[i].rows * ts[i].cols, fp);
        free(ts[i].data);
    }
    fclose(fp);
    free(hdr);
}

static void write_hf_gpt2(const Model* m, const char* path) {
    const Params* p = &m->params;
    size_t C = m->cfg.C, F = m->cfg.F, Q = 3 * C;
    STensor* ts = mallocCheck(sizeof(STensor) * 256);
    int n = 0;
    char nm[96];
    st_add(ts, &n, "transformer.wte.weight", p->wte, m->cfg.V, C, 0);
    st_add(ts, &n, "transformer.wpe.weight", p->wpe, m->cfg.maxT, C, 0);
    for (int l = 0; l < m->cfg.L; l++) {
#define A(suffix, src, r, c, tr) \
    (snprintf(nm, sizeof nm, "transformer.h.%d.%s", l, suffix), st_add(ts, &n, nm, src, r, c, tr))
        A("ln_1.weight", p->ln1w + l * C, 1, C, 0);
        A("ln_1.bias", p->ln1b + l * C, 1, C, 0);
        A("attn.c_attn.weight", p->qkvw + l * Q * C, Q, C, 1);
        A("attn.c_attn.bias", p->qkvb + l * Q, 1, Q, 0);
        A("attn.c_proj.weight", p->attprojw + l * C * C, C, C, 1);
        A("attn.c_proj.bias", p->attprojb + l * C, 1, C, 0);
        A("ln_2.weight", p->ln2w + l * C, 1, C, 0);
        A("ln_2.bias", p->ln2b + l * C, 1, C, 0);
        A("mlp.c_fc.weight", p->fcw + l * F * C, F, C, 1);
        A("mlp.c_fc.bias", p->fcb + l * F, 1, F, 0);
        A("mlp.c_proj.weight", p->fcprojw + l * C * F, C, F, 1);
        A("mlp.c_proj.bias", p->fcprojb + l * C, 1, C, 0);
#undef A
    }
    st_add(ts, &n, "transformer.ln_f.weight", p->lnfw, 1, C, 0);
    st_add(ts, &n, "transformer.ln_f.bias", p->lnfb, 1, C, 0);
    st_write(path, ts, n);
    free(ts);
}

/* Our q/k rows (h, 2i + c) back to Hugging Face's half-split order (h, c * hs/2 + i). */
static void permute_to_hf(real* dst, const real* src, int heads, int hs, size_t cols) {
    for (int h = 0; h < heads; h++)
        for (int i = 0; i < hs / 2; i++)
            for (int c = 0; c < 2; c++)
                memcpy(dst + ((size_t)h * hs + c * hs / 2 + i) * cols,
                       src + ((size_t)h * hs + 2 * i + c) * cols, sizeof(real) * cols);
}

/* shards > 1: the tensors dealt round-robin over that many files (model-0000i-of-0000n), named
 * by a model.safetensors.index.json, as Hugging Face saves a large model */
static void write_hf_llama_shards(const Model* m, const char* dir, int shards);
static void write_hf_llama(const Model* m, const char* dir) { write_hf_llama_shards(m, dir, 1); }

static void write_hf_llama_shards(const Model* m, const char* dir, int shards) {
    const Params* p = &m->params;
    const ModelConfig* c = &m->cfg;
    int hs = c->C / c->NH;
    size_t C = c->C, F = c->F, nq = (size_t)c->NH * hs, nk = (size_t)c->NKV * hs, Q = nq + 2 * nk;
    STensor* ts = mallocCheck(sizeof(STensor) * 256);
    int n = 0;
    char nm[96];
    real* tmp = mallocCheck(sizeof(real) * nq * C);
    st_add(ts, &n, "model.embed_tokens.weight", p->wte, c->V, C, 0);
    for (int l = 0; l < c->L; l++) {
#define A(suffix, src, r, cl) \
    (snprintf(nm, sizeof nm, "model.layers.%d.%s", l, suffix), st_add(ts, &n, nm, src, r, cl, 0))
        const real* qkv = p->qkvw + l * Q * C;
        A("input_layernorm.weight", p->ln1w + l * C, 1, C);
        permute_to_hf(tmp, qkv, c->NH, hs, C);
        A("self_attn.q_proj.weight", tmp, nq, C);
        permute_to_hf(tmp, qkv + nq * C, c->NKV, hs, C);
        A("self_attn.k_proj.weight", tmp, nk, C);
        A("self_attn.v_proj.weight", qkv + (nq + nk) * C, nk, C);
        const real* b = p->qkvb + l * Q;
        permute_to_hf(tmp, b, c->NH, hs, 1);
        A("self_attn.q_proj.bias", tmp, 1, nq);
        permute_to_hf(tmp, b + nq, c->NKV, hs, 1);
        A("self_attn.k_proj.bias", tmp, 1, nk);
        A("self_attn.v_proj.bias", b + nq + nk, 1, nk);
        A("self_attn.o_proj.weight", p->attprojw + l * C * C, C, C);
        A("post_attention_layernorm.weight", p->ln2w + l * C, 1, C);
        A("mlp.gate_proj.weight", p->fcw + l * 2 * F * C, F, C);
        A("mlp.up_proj.weight", p->fcw + l * 2 * F * C + F * C, F, C);
        A("mlp.down_proj.weight", p->fcprojw + l * C * F, C, F);
#undef A
    }
    st_add(ts, &n, "model.norm.weight", p->lnfw, 1, C, 0);
    st_add(ts, &n, "lm_head.weight", p->lmhead, c->V, C, 0);
    mkdir(dir, 0755);
    char path[512];
    if (shards == 1) {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        st_write(path, ts, n);
    } else {
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
        FILE* ix = fopen(path, "w");
        fprintf(ix, "{\"metadata\": {}, \"weight_map\": {");
        for (int i = 0; i < n; i++)
            fprintf(ix, "%s\"%s\": \"model-%05d-of-%05d.safetensors\"", i ? ", " : "", ts[i].name,
                    i % shards + 1, shards);
        fprintf(ix, "}}\n");
        fclose(ix);
        STensor* part = mallocCheck(sizeof(STensor) * (size_t)n);
        for (int k = 0; k < shards; k++) {
            int np = 0;
            for (int i = k; i < n; i += shards) part[np++] = ts[i];
            snprintf(path, sizeof path, "%s/model-%05d-of-%05d.safetensors", dir, k + 1, shards);
            st_write(path, part, np);
        }
        free(part);
    }
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE* fp = fopen(path, "w");
    fprintf(fp,
            "{\"model_type\": \"qwen2\", \"hidden_size\": %d, \"num_attention_heads\": %d, "
            "\"num_key_value_heads\": %d,"
            " \"num_hidden_layers\": %d, \"intermediate_size\": %d, \"vocab_size\": %d, "
            "\"max_position_embeddings\": %d,"
            " \"rms_norm_eps\": %g, \"rope_theta\": %g, \"tie_word_embeddings\": false}\n",
            c->C, c->NH, c->NKV, c->L, c->F, c->V, c->maxT, (double)c->eps, (double)c->rope_theta);
    fclose(fp);
    free(tmp);
    free(ts);
}

static void load_path(const void* path) {
    Model m;
    FocusConfig fc;
    focus_config_default(&fc);
    model_load(&m, path, &fc, NULL);
}

/* An llm.c file of g with header word `word` set to v (or, with word < 0, a NaN weight). */
static void llmc_mutant(const Model* g, const char* path, int word, int32_t v) {
    if (word < 0) {
        real keep = g->params.wte[5];
        g->params.wte[5] = NAN;
        write_llmc(g, path, 3, 64);
        g->params.wte[5] = keep;
        return;
    }
    write_llmc(g, path, 3, 64);
    FILE* fp = fopen(path, "r+b");
    fseek(fp, 4L * word, SEEK_SET);
    fwrite(&v, 4, 1, fp);
    fclose(fp);
}

/* Bad input: each must be refused with one line naming the file and the problem (issue 15). */
static void bad_inputs(Model* g, Model* l) {
    char msg[4096];
    const char* p = tu_path("bad.bin");
    struct {
        int word;
        int32_t v;
        const char* want;
    } llmc[] = {{6, 2147483647, "inconsistent sizes"}, /* C = 2^31 - 1: no overflow first */
                {4, 1000000, "inconsistent sizes"},    /* a million layers: nothing allocated */
                {3, -5, "inconsistent sizes"},
                {-1, 0, "wte is nan"}};
    for (size_t i = 0; i < sizeof llmc / sizeof llmc[0]; i++) {
        llmc_mutant(g, p, llmc[i].word, llmc[i].v);
        CHECK(tu_fails_with(load_path, p, llmc[i].want, msg, sizeof msg), "llm.c mutant %zu: %s", i,
              msg);
    }
    struct {
        const char* skip;
        int overlap, shift;
        const char* want;
    } st[] = {{"model.layers.0.self_attn.q_proj.bias", 0, 0, "q_proj.bias' is missing"},
              {NULL, 1, 0, "overlaps"},
              {NULL, 0, 4, "gap"}};
    for (size_t i = 0; i < sizeof st / sizeof st[0]; i++) {
        st_skip = st[i].skip, st_overlap = st[i].overlap, st_shift = st[i].shift;
        write_hf_llama(l, tu_path("bad_hf"));
        st_skip = NULL, st_overlap = st_shift = 0;
        CHECK(tu_fails_with(load_path, tu_path("bad_hf"), st[i].want, msg, sizeof msg),
              "safetensors mutant %zu: %s", i, msg);
        printf("  refused: %s\n", msg);
    }
    CHECK(tu_fails_with(load_path, tu_tmpdir(), "model.safetensors", msg, sizeof msg),
          "a folder without a model: %s", msg);
}

/* The real-shape presets: valid configurations with their published parameter counts. */
static void check_presets(void) {
    const struct {
        const char* name;
        size_t params;
    } p[] = {{"llama2-7b", 6738415616u},   {"llama2-13b", 13015864320u},
             {"llama2-70b", 68976648192u}, {"mistral-7b", 7241732096u},
             {"qwen2.5-7b", 7615616512u},  {"llama3-8b", 8030261248u}};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) {
        ModelConfig c;
        char err[256] = "";
        int rc = model_config_preset(p[i].name, &c);
        CHECK(rc == 0 && model_config_check(&c, err, sizeof err) == 0 &&
                  model_param_count(&c) == p[i].params,
              "preset %s: %s, %zu parameters (published: %zu)", p[i].name, err,
              rc ? 0 : model_param_count(&c), p[i].params);
    }
}

int main(void) {
    check_presets();
    for (int i = 0; i < T; i++) tok[i] = (i * 11 + 3) % 64;
    Model g = make("tiny-gpt2", 0);
    real* ref = logits_of(&g);
    write_llmc(&g, tu_path("tiny_gpt2_fp32.bin"), 3, 80);
    compare("GPT-2, llm.c fp32 (padded vocabulary)", tu_path("tiny_gpt2_fp32.bin"), ref, g.cfg.V,
            0);
    write_llmc(&g, tu_path("tiny_gpt2_bf16.bin"), 5, 64);
    compare("GPT-2, llm.c bf16", tu_path("tiny_gpt2_bf16.bin"), ref, g.cfg.V, 0.05);
    mkdir(tu_path("tiny_gpt2_hf"), 0755);
    write_hf_gpt2(&g, tu_path("tiny_gpt2_hf/model.safetensors"));
    FILE* fp = fopen(tu_path("tiny_gpt2_hf/config.json"), "w");
    fprintf(fp, "{\"model_type\": \"gpt2\", \"n_head\": %d, \"n_embd\": %d, \"n_layer\": %d}\n",
            g.cfg.NH, g.cfg.C, g.cfg.L);
    fclose(fp);
    compare("GPT-2, Hugging Face safetensors file", tu_path("tiny_gpt2_hf/model.safetensors"), ref,
            g.cfg.V, 0);
    free(ref);
    model_free(&g);

    Model l = make("tiny-llama", 1);
    ref = logits_of(&l);
    write_hf_llama(&l, tu_path("tiny_llama_hf"));
    compare("LLaMA + QKV bias, HF safetensors dir", tu_path("tiny_llama_hf"), ref, l.cfg.V, 1e-5);
    write_hf_llama_shards(&l, tu_path("tiny_llama_3"), 3);
    compare("LLaMA + QKV bias, 3 safetensors files and their index", tu_path("tiny_llama_3"), ref,
            l.cfg.V, 1e-5);
    compare("the same, given the index's path",
            tu_path("tiny_llama_3/model.safetensors.index.json"), ref, l.cfg.V, 1e-5);
    {
        char msg[512];
        /* the index names a tensor in a file that does not hold it */
        FILE* ix = fopen(tu_path("tiny_llama_3/model.safetensors.index.json"), "w");
        fprintf(ix,
                "{\"weight_map\": {\"model.norm.weight\": "
                "\"model-00001-of-00003.safetensors\", \"lm_head.weight\": "
                "\"model-00002-of-00003.safetensors\", \"model.embed_tokens.weight\": "
                "\"model-00003-of-00003.safetensors\"}}\n");
        fclose(ix);
        CHECK(tu_fails_with(load_path, tu_path("tiny_llama_3"), "where the index puts it", msg,
                            sizeof msg),
              "a tensor not where the index says: %s", msg);
        remove(tu_path("tiny_llama_3/model-00002-of-00003.safetensors"));
        CHECK(tu_fails_with(load_path, tu_path("tiny_llama_3"), "model-00002-of-00003", msg,
                            sizeof msg),
              "a shard missing: %s", msg);
    }
    free(ref);
    g = make("tiny-gpt2", 0);
    bad_inputs(&g, &l);
    model_free(&g);
    model_free(&l);
    return tu_finish("test_checkpoints");
}
