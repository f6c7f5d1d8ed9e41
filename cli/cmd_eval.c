/* cmd_eval.c: `focus eval ppl` and `focus eval layers`. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "../checkpoints/load.h"
#include "../checkpoints/router_h5.h"
#include "../data/shard.h"
#include "../data/text.h"
#include "../data/tokenizer.h"
#include "../model/decode.h"
#include "cli.h"
#include "commands.h"
#include "../eval/evaluate.h"

/* `focus eval layers`: how much each layer's sparse attention costs on its own (every other
 * layer dense), so a user can choose dense_layers. */
static void eval_layer_sensitivity(Model* m, const int* ids, size_t n, int ctx, int stride) {
    const int L = m->cfg.L;
    FocusConfig keep = m->fc;
    m->fc.attn = ATTN_DENSE;
    PplResult d = eval_perplexity(m, ids, n, ctx, stride, 1);
    m->fc = keep;
    memset(m->fc.dense_layers, 0, sizeof m->fc.dense_layers);
    PplResult all = eval_perplexity(m, ids, n, ctx, stride, 1);
    const double pd = exp(d.nll / d.count), pa = exp(all.nll / all.count);
    char tk[32];
    printf("layer sensitivity: %s attention, k=%s, sinks=%d, w=%d, ctx %d, %zu tokens\n",
           model_method(m)->name, focus_topk_str(&m->fc, tk), m->fc.sinks, m->fc.w, ctx, d.count);
    printf("dense (router off) %.4f; every layer sparse %.4f (%+.2f %%)\n", pd, pa,
           100 * (pa / pd - 1));
    printf("%5s  %10s  %8s   (only this layer sparse, every other layer dense)\n", "layer",
           "perplexity", "vs dense");
    double* cost = mallocCheck(sizeof(double) * L);
    for (int l = 0; l < L; l++) {
        memset(m->fc.dense_layers, 0, sizeof m->fc.dense_layers);
        for (int j = 0; j < L; j++)
            if (j != l) m->fc.dense_layers[j >> 6] |= 1ull << (j & 63);
        PplResult r = eval_perplexity(m, ids, n, ctx, stride, 1);
        double p = exp(r.nll / r.count);
        cost[l] = p / pd - 1;
        printf("%5d  %10.4f  %+7.2f %%\n", l, p, 100 * cost[l]);
        fflush(stdout);
    }
    /* the most sensitive layers first: a dense_layers line for the 1, 2, 4 and 8 worst */
    int* order = mallocCheck(sizeof(int) * L);
    for (int l = 0; l < L; l++) order[l] = l;
    for (int i = 0; i < L; i++)
        for (int j = i + 1; j < L; j++)
            if (cost[order[j]] > cost[order[i]]) {
                int t = order[i];
                order[i] = order[j];
                order[j] = t;
            }
    for (int c = 1; c <= 8 && c <= L; c *= 2) {
        printf("the %d most sensitive: dense_layers = ", c);
        for (int i = 0; i < c; i++) printf(i ? ",%d" : "%d", order[i]);
        printf("\n");
    }
    free(cost);
    free(order);
    m->fc = keep;
}

static const char eval_usage[] =
    "usage: focus eval ppl|layers --model M [--tokenizer T] --data DIR|SHARD|TEXT [--ctx 1024] "
    "[--stride s] [--llama-perplexity]\n"
    "                      [--max-tokens n] [--router router.h5 [--attn dense|soft|hard] [--topk "
    "k|pP]\n"
    "                      [--attn window|random|blocks|blocks_mean|oracle]\n"
    "                      [--router SELECTOR.h5 --attn blocks_learned]\n"
    "                      [--routing causal|sinkhorn|prefix_sinkhorn]] [--set key=value]...\n"
    "                      [--device cpu|cuda] [--lora lora.h5] [--attn-error]\n"
    "Perplexity of a model on token shards (a folder: its val_*.bin, else all *.bin), one\n"
    "shard, or a text file (tokenized with the model's own tokenizer or --tokenizer).\n"
    "Windows of --ctx tokens advance by --stride (default ctx); each token is scored once.\n"
    "A model whose tokenizer adds a BOS (Gemma) reads it in place of each window's first\n"
    "token. --llama-perplexity scores as llama.cpp's llama-perplexity does (the tokens after\n"
    "a BOS, whole windows only, the second half of each window less its last token).\n"
    "With --router the trained router is loaded onto the model (which must be the one it was\n"
    "trained on); --attn soft is the default then, routing causal. Sinkhorn routing sees the\n"
    "future, so its numbers are marked non-causal. --device cuda runs the model on the GPU.\n"
    "--topk 1,2,p0.9 evaluates several budgets in turn; p0.9 keeps each token's groups until\n"
    "90 % of its group mass is covered (p0.9:2: at most 2 groups). The router's sinks and "
    "dense_layers apply; --set sinks=N, --set\n"
    "dense_layers=0,1 or --set w=N override them for this evaluation.\n"
    "The training-free methods below need no router (the same sinks, --set w=N, and for the\n"
    "block ones --set block=64 --set blocks=8; random: --topk k). --attn blocks_learned reads\n"
    "a block selector of focus fit-blocks (--router SELECTOR.h5: its block size, w and sinks).\n"
    "eval layers (with --router) measures each layer's cost on its own: perplexity with only\n"
    "that layer sparse, every other dense; it prints dense_layers lines for the worst layers.\n"
    "--attn-error (CPU) prints, per global layer, how far the attention is from the dense\n"
    "attention of the same input: its heads' output before the output projection, and the\n"
    "residual stream after the attention's contribution (the output projection, and its norm\n"
    "where the model has one: Gemma 3), each as a squared error relative to dense's (|o_D|^2,\n"
    "|y_D - x|^2), beside the same for the window alone (sinks and w).\n";

/* --attn-error: the relative errors Model.attn_error gathered over the evaluation, per global
 * layer (model.h, AttnError) */
static void attn_error_report(const Model* m, const AttnError* e) {
    printf(
        "attention error against dense (squared, relative: heads |o - o_D|^2 / |o_D|^2, "
        "stream |y - y_D|^2 / |y_D - x|^2)\n");
    printf("layer  heads     window    stream    window\n");
    for (int l = 0; l < m->cfg.L; l++) {
        if (!(e->heads_ref[l] > 0) || !(e->out_ref[l] > 0)) continue; /* a local layer */
        printf("%5d  %.6f  %.6f  %.6f  %.6f\n", l, e->heads[l] / e->heads_ref[l],
               e->heads_window[l] / e->heads_ref[l], e->out[l] / e->out_ref[l],
               e->out_window[l] / e->out_ref[l]);
    }
}

static void eval_report(Model* m, const ModelInfo* info, const int* ids, size_t n, const char* data,
                        int ctx, int stride, int llama, int attn_error) {
    const int L = m->cfg.L;
    double* sums = attn_error ? callocCheck((size_t)6 * L, sizeof(double)) : NULL;
    AttnError err = {0};
    if (attn_error) {
        double** f[6] = {&err.heads, &err.heads_window, &err.heads_ref,
                         &err.out,   &err.out_window,   &err.out_ref};
        for (int k = 0; k < 6; k++) *f[k] = sums + (size_t)k * L;
        m->attn_error = &err;
    }
    PplResult r = eval_perplexity_llama(m, ids, n, ctx, stride, llama, 0);
    m->attn_error = NULL;
    printf("model %s (%s)  data %s  ctx %d stride %d", info->name, info->format, data, ctx, stride);
    if (llama) printf("  scored as llama-perplexity");
    if (m->bos >= 0) printf("  windows start with BOS %d", m->bos);
    printf("\n");
    char mode[1400];
    cli_attention_desc(m, mode, sizeof mode);
    const char* mark =
        m->fc.attn != ATTN_DENSE && m->fc.routing == ROUTE_SINKHORN ? "  (non-causal)" : "";
    printf("attention %s\n", mode);
    if (!isfinite(r.nll))
        fatal("eval ppl: %s on %s: the loss is not finite (%g); the model or router is corrupt",
              info->name, data, r.nll);
    printf("perplexity %.4f%s  tokens %zu  nll/token %.5f  %.1f tokens/s (%.1f s)\n",
           exp(r.nll / r.count), mark, r.count, r.nll / r.count, (double)r.count / r.seconds,
           r.seconds);
    if (attn_is_sparse(m->fc.attn)) printf("pairs kept %.4f of causal pairs%s\n", r.kept, mark);
    if (attn_error) attn_error_report(m, &err);
    free(sums);
}

int cmd_eval(int argc, char** argv) {
    if (argc < 2 || !strcmp(argv[1], "--help")) {
        fputs(eval_usage, stdout);
        return argc < 2 ? 1 : 0;
    }
    if (!strcmp(argv[1], "tasks")) return cmd_eval_tasks(argc, argv);
    if (!strcmp(argv[1], "passkey")) return cmd_eval_passkey(argc, argv);
    if (!strcmp(argv[1], "curve")) return cmd_eval_curve(argc, argv);
    const int layers = !strcmp(argv[1], "layers");
    if (strcmp(argv[1], "ppl") && !layers)
        fatal("eval: unknown evaluation '%s' (ppl, layers, tasks, passkey or curve)", argv[1]);
    const char *model = NULL, *tok = NULL, *data = NULL;
    int ctx = 1024, stride = 0, llama = 0;
    int max_tokens = 0, device = 0, attn_error = 0;
    const char *router = NULL, *attn = NULL, *routing = NULL, *topk = NULL, *lora = NULL;
    CliList sets = {0};
    if (cli_parse(
            "eval", argc, argv, 2, eval_usage,
            "--model:s --tokenizer:s --data:s --ctx:i[2,1048576] --stride:i[1,1048576] "
            "--max-tokens:i[1,2147483647] --llama-perplexity:f "
            "--router:s --attn:s --topk:s --routing:s --device:d --set:* --lora:s --attn-error:f",
            &model, &tok, &data, &ctx, &stride, &max_tokens, &llama, &router, &attn, &topk,
            &routing, &device, &sets, &lora, &attn_error))
        return 0;
    if (max_tokens < 0) fatal("eval: --max-tokens must be >= 0");
    if (!model || !data) fatal("eval ppl: needs --model and --data");
    if (ctx < 2) fatal("eval ppl: --ctx must be at least 2");
    if (!stride) stride = ctx;
    if (attn_error && device) fatal("eval ppl: --attn-error runs on the CPU (--device cpu)");
    if (attn_error && layers) fatal("eval layers: --attn-error is an option of eval ppl");
    if (stride < 1 || stride > ctx) fatal("eval ppl: --stride must be in 1..ctx");
    if (llama && stride != ctx)
        fatal("eval ppl: --llama-perplexity scores windows that do not overlap (--stride = --ctx)");
    Model m;
    ModelInfo info;
    cli_open_model(&m, &info,
                   &(ModelRequest){.model = model,
                                   .router = router,
                                   .attn = attn,
                                   .topk = topk && !strchr(topk, ',') ? topk : NULL,
                                   .routing = routing,
                                   .sets = &sets,
                                   .device = device,
                                   .lora = lora});
    if (attn_error && m.tp)
        fatal("eval ppl: --attn-error measures a whole model, not a tensor-parallel slice");
    size_t n;
    int* ids = load_eval_tokens(data, model, tok, &n);
    if (max_tokens && n > (size_t)max_tokens) n = (size_t)max_tokens;
    free(sets.v);
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= m.cfg.V)
            fatal("%s: token id %d is outside the model's vocabulary (V=%d); wrong tokenizer?",
                  data, ids[i], m.cfg.V);
    cli_check_context(&m, ctx, "eval ppl", "--ctx");
    if (llama && m.bos >= 0) { /* llama-perplexity's token list starts with the BOS */
        ids = reallocCheck(ids, sizeof(int) * (n + 1));
        memmove(ids + 1, ids, sizeof(int) * n);
        ids[0] = m.bos;
        n++;
    }
    if (layers) {
        if (!router || m.fc.attn == ATTN_DENSE)
            fatal("eval layers: needs --router (and hard or soft attention)");
        eval_layer_sensitivity(&m, ids, n, ctx, stride);
        free(ids);
        model_free(&m);
        return 0;
    }
    /* --topk 1,2,p0.9: one evaluation per budget, the model loaded once */
    char budgets[256];
    snprintf(budgets, sizeof budgets, "%s", topk && strchr(topk, ',') ? topk : "");
    char* next_budget = budgets[0] ? budgets : NULL;
    do {
        if (next_budget) {
            char* comma = strchr(next_budget, ',');
            if (comma) *comma = 0;
            apply_router_options(&m, NULL, NULL, next_budget, NULL);
            next_budget = comma ? comma + 1 : NULL;
        }
        eval_report(&m, &info, ids, n, data, ctx, stride, llama, attn_error);
    } while (next_budget);
    free(ids);
    model_free(&m);
    return 0;
}
