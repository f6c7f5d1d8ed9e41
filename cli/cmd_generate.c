/* cmd_generate.c: `focus generate`, continuing a prompt with the decode path (model/decode.h). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../checkpoints/load.h"
#include "../data/tokenizer.h"
#include "../model/decode.h"
#include "cli.h"
#include "commands.h"

static const char generate_usage[] =
    "usage: focus generate --model M [--tokenizer T] --prompt TEXT [-n 64]\n"
    "                      [--temperature t] [--top-p p] [--seed s] [--router router.h5 [--topk k] "
    "[--attn dense|hard]]\n"
    "                      [--weights native|f32] [--prefill batched|exact] [--kv f16|f32]\n"
    "Greedy decoding by default; with --temperature > 0, nucleus sampling (top-p). The prompt\n"
    "goes through in one batched pass, then tokens are generated one at a time over a KV cache;\n"
    "with --router, each new token attends to its window and the cached tokens of its top-k\n"
    "groups (causal routing). The projections read the GGUF file's own blocks (F32, F16, BF16,\n"
    "Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K) where it has them (--weights native; fp32 otherwise,\n"
    "or with --weights f32), with activations quantised to int8 per block as llama.cpp does;\n"
    "--prefill exact keeps the prompt's products in fp32 (slower, no quantisation error). The\n"
    "KV cache holds half-precision keys and values (--kv f16, half the bytes a token reads) or\n"
    "fp32 ones (--kv f32).\n";

int cmd_generate(int argc, char** argv) {
    const char *model = NULL, *tok = NULL, *prompt = NULL, *router = NULL, *attn = NULL,
               *weights = NULL, *prefill = "batched", *kv = "f16";
    int n = 64;
    const char* topk = NULL;
    double temperature = 0, top_p = 1;
    int seed = 1;
    if (cli_parse(
            "generate", argc, argv, 1, generate_usage,
            "--model:s --tokenizer:s --prompt:s -n:i[0,1048576] --temperature:x[0,100] "
            "--top-p:x[1e-9,1] "
            "--seed:i[0,2147483647] --router:s --topk:s --attn:s --weights:s --prefill:s --kv:s",
            &model, &tok, &prompt, &n, &temperature, &top_p, &seed, &router, &topk, &attn, &weights,
            &prefill, &kv))
        return 0;
    if (!model || !prompt) fatal("generate: needs --model and --prompt");
    if (top_p <= 0 || top_p > 1) fatal("generate: --top-p must be in (0, 1]");
    if (n < 0) fatal("generate: -n must be >= 0");
    if (strcmp(prefill, "batched") && strcmp(prefill, "exact"))
        fatal("generate: --prefill must be batched or exact, got '%s'", prefill);
    if (strcmp(kv, "f16") && strcmp(kv, "f32"))
        fatal("generate: --kv must be f16 or f32, got '%s'", kv);
    Model m;
    cli_open_model(&m, NULL,
                   &(ModelRequest){.model = model,
                                   .router = router,
                                   .attn = attn,
                                   .topk = topk,
                                   .decode = 1,
                                   .weights = weights});
    m.prefill_exact = !strcmp(prefill, "exact");
    Tokenizer* t = tokenizer_load(tok ? tok : model);
    size_t np;
    int* p = tokenizer_encode(t, prompt, strlen(prompt), &np);
    int bos = tokenizer_bos(t);
    size_t cap = np + (size_t)n + 2, len = 0;
    int* ids = mallocCheck(sizeof(int) * cap);
    if (bos >= 0) ids[len++] = bos;
    memcpy(ids + len, p, sizeof(int) * np);
    len += np;
    free(p);
    if (len == 0) ids[len++] = tokenizer_eot(t);
    cli_check_context(&m, (long)len, "generate", "the prompt");
    const size_t prompt_len = len;
    Rng rng;
    rng_seed(&rng, seed);
    KVCache c;
    kvcache_init(&c, &m, (int)cap, !strcmp(kv, "f16"));
    real* logits = mallocCheck(sizeof(real) * m.cfg.V);
    double t0 = now_seconds();
    model_prefill(&m, &c, ids, (int)len, logits, 0); /* the prompt, in one batched pass */
    fputs(prompt, stdout);
    fflush(stdout);
    int made = 0, full = 0;
    for (; made < n; made++) {
        if ((int)len >= m.cfg.maxT) { /* the next token would lie beyond the context */
            full = 1;
            break;
        }
        int next = decode_sample(logits, m.cfg.V, temperature, top_p, &rng);
        ids[len++] = next;
        if (next == tokenizer_eot(t) || next == tokenizer_eos(t)) break;
        size_t sl;
        char* s = tokenizer_decode(t, &next, 1, &sl);
        fwrite(s, 1, sl, stdout);
        fflush(stdout);
        free(s);
        model_decode_step(&m, &c, next, logits);
    }
    double dt = now_seconds() - t0;
    char desc[1400];
    const AttnMethod* am = model_method(&m);
    if (am->brief) /* "dense over the KV cache", "hard top-k over the group KV cache" */
        snprintf(desc, sizeof desc, "%s over the %sKV cache", am->brief,
                 am->cache == CACHE_GROUPS ? "group " : "");
    else
        cli_attention_desc(&m, desc, sizeof desc);
    printf("\n");
    if (full) fprintf(stderr, "[stopped at the model's context of %d tokens]\n", m.cfg.maxT);
    fprintf(stderr, "[%zu prompt + %zu generated tokens in %.1f s, %.1f tokens/s; attention %s]\n",
            prompt_len, len - prompt_len, dt, (len) / dt, desc);
    free(ids);
    free(logits);
    kvcache_free(&c);
    tokenizer_free(t);
    model_free(&m);
    return 0;
}
