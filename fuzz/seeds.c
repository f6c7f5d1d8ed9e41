/* seeds.c: the fuzz targets' seed files (seeds.h). */
#include "seeds.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>

#include "../checkpoints/load.h"
#include "../checkpoints/router_h5.h"
#include "../data/shard.h"

void seeds_model(Model* m) {
    ModelConfig c = {ARCH_LLAMA, 1, 8, 2, 1, 16, 16, 32, 1e-5f, 10000.0f, 0, 1};
    FocusConfig f;
    focus_config_default(&f);
    f.K = 4, f.dg = 4, f.w = 4;
    model_build(m, &c, &f);
    model_init_backbone(m, 1);
    model_init_router(m, 2);
}

static FILE* open_seed(const char* dir, const char* sub, const char* name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, sub);
    if (mkdir(path, 0755) && errno != EEXIST) fatal("%s: cannot create: %s", path, strerror(errno));
    snprintf(path, sizeof path, "%s/%s/%s", dir, sub, name);
    FILE* fp = fopen(path, "wb");
    if (!fp) fatal("%s: cannot create: %s", path, strerror(errno));
    return fp;
}

static void seed_text(const char* dir, const char* sub, const char* name, const char* text) {
    FILE* fp = open_seed(dir, sub, name);
    fputs(text, fp);
    fclose(fp);
}

/* An llm.c GPT-2 checkpoint (header of 256 int32, then fp32 parameters in llm.c order). */
static void seed_llmc(const char* dir) {
    ModelConfig c = {ARCH_GPT2, 1, 8, 2, 2, 32, 16, 8, 1e-5f, 0, 0, 1};
    FocusConfig f;
    focus_config_default(&f);
    Model g;
    model_build(&g, &c, &f);
    model_init_backbone(&g, 3);
    int32_t h[256] = {20240326, 3, c.maxT, c.V, c.L, c.NH, c.C, c.V};
    FILE* fp = open_seed(dir, "llmc", "tiny.bin");
    fwrite(h, 4, 256, fp);
    fwrite(g.params_mem, sizeof(real), g.num_params, fp);
    fclose(fp);
    model_free(&g);
}

/* A LLaMA safetensors file in the Hugging Face names, of the shape fuzz_model's config.json
 * describes. */
static void seed_safetensors(const char* dir, const Model* m) {
    const Params* p = &m->params;
    const size_t C = 8, F = 16, V = 16, nq = 8, nk = 4;
    struct {
        const char* name;
        const real* data;
        size_t rows, cols;
    } t[] = {{"model.embed_tokens.weight", p->wte, V, C},
             {"model.layers.0.input_layernorm.weight", p->ln1w, 0, C},
             {"model.layers.0.self_attn.q_proj.weight", p->qkvw, nq, C},
             {"model.layers.0.self_attn.k_proj.weight", p->qkvw + nq * C, nk, C},
             {"model.layers.0.self_attn.v_proj.weight", p->qkvw + (nq + nk) * C, nk, C},
             {"model.layers.0.self_attn.o_proj.weight", p->attprojw, C, C},
             {"model.layers.0.post_attention_layernorm.weight", p->ln2w, 0, C},
             {"model.layers.0.mlp.gate_proj.weight", p->fcw, F, C},
             {"model.layers.0.mlp.up_proj.weight", p->fcw + F * C, F, C},
             {"model.layers.0.mlp.down_proj.weight", p->fcprojw, C, F},
             {"model.norm.weight", p->lnfw, 0, C}};
    enum { N = sizeof t / sizeof t[0] };
    char hdr[4096];
    size_t len = 0, off = 0;
    len += (size_t)snprintf(hdr, sizeof hdr, "{");
    for (int i = 0; i < N; i++) {
        size_t n = (t[i].rows ? t[i].rows : 1) * t[i].cols * 4;
        char shape[48];
        if (t[i].rows)
            snprintf(shape, sizeof shape, "[%zu,%zu]", t[i].rows, t[i].cols);
        else
            snprintf(shape, sizeof shape, "[%zu]", t[i].cols);
        len +=
            (size_t)snprintf(hdr + len, sizeof hdr - len,
                             "%s\"%s\":{\"dtype\":\"F32\",\"shape\":%s,\"data_offsets\":[%zu,%zu]}",
                             i ? "," : "", t[i].name, shape, off, off + n);
        off += n;
    }
    len += (size_t)snprintf(hdr + len, sizeof hdr - len, "}");
    while (len % 8) hdr[len++] = ' ';
    FILE* fp = open_seed(dir, "safetensors", "tiny.safetensors");
    uint64_t hl = len;
    fwrite(&hl, 8, 1, fp);
    fwrite(hdr, 1, len, fp);
    for (int i = 0; i < N; i++)
        fwrite(t[i].data, sizeof(real), (t[i].rows ? t[i].rows : 1) * t[i].cols, fp);
    fclose(fp);
}

void seeds_write(const char* dir) {
    if (mkdir(dir, 0755) && errno != EEXIST) fatal("%s: cannot create: %s", dir, strerror(errno));
    Model m;
    seeds_model(&m);
    char path[4096];
    fclose(open_seed(dir, "gguf", "f32.gguf"));
    snprintf(path, sizeof path, "%s/gguf/f32.gguf", dir);
    gguf_write_model(&m, path, 0);
    fclose(open_seed(dir, "gguf", "q8.gguf"));
    snprintf(path, sizeof path, "%s/gguf/q8.gguf", dir);
    gguf_write_model(&m, path, 1);
    seed_llmc(dir);
    seed_safetensors(dir, &m);
    int ids[64];
    for (int i = 0; i < 64; i++) ids[i] = (i * 7) % 16;
    fclose(open_seed(dir, "shard", "tokens.bin"));
    snprintf(path, sizeof path, "%s/shard/tokens.bin", dir);
    shard_write(path, ids, 64, 16);
    AdamW opt;
    adamw_init(&opt, model_router_trained(&m, 0), 0.9f, 0.95f, 1e-8f, 0);
    RouterState st = {3, 3, 3, 17, 42, model_fingerprint(&m)};
    fclose(open_seed(dir, "router", "router.h5"));
    snprintf(path, sizeof path, "%s/router/router.h5", dir);
    router_save(path, &m, &opt, &st, "[focus]\nK = 4\ndg = 4\nw = 4\n");
    adamw_free(&opt);
    seed_text(dir, "config", "small.conf",
              "[model]\nmodel = scratch\narch = llama\nL = 2\nC = 64\nNH = 4\nNKV = 2\n"
              "[train]\nB = 8\nT = 128\nlr = 0.02\nval_fraction = 0.05\n"
              "[focus]\nK = 4\ntopk = p0.9:2\ndense_layers = 0,1\nrouting = causal\n");
    seed_text(dir, "config", "finetune.conf",
              "[finetune]\nmethod = lora\nlora_rank = 4\nlora_targets = qkv,o\n[train]\n"
              "objective = kl+attn\nattn_weight = 0.5\n");
    seed_text(dir, "tokenizer", "ascii.txt", "Hello, world! It's 2026: 12345 tokens.\n\n  code()");
    seed_text(dir, "tokenizer", "utf8.txt",
              "caf\xc3\xa9 \xe2\x80\x94 \xf0\x9f\x98\x80 na\xc3\xafve");
    seed_text(dir, "tokenizer", "bytes.txt", "\xff\xfe\x80 abc \xc3 \xe2\x82");
    model_free(&m);
}
