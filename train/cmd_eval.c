/* cmd_eval.c: `focus eval ppl` and `focus generate`. */
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

/* Apply --router/--attn/--topk/--routing to a loaded model. Reads K and dg from the run's
 * config.conf next to router.h5 when there is one (the router's shape). */
void apply_router_options(Model* m, const char* router, const char* attn, const char* topk,
                          const char* routing) {
    FocusConfig* f = &m->fc;
    if (router) {
        char* text = router_read_config(router);
        /* take the router shape and gate settings from the stored configuration; a router
         * stored without these keys was trained before they existed: no sinks, no dense layers */
        f->sinks = 0;
        memset(f->dense_layers, 0, sizeof f->dense_layers);
        for (char* line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
            char key[64], val[256];
            if (sscanf(line, " %63[^= ] = %255s", key, val) != 2) continue;
            if (!strcmp(key, "K") || !strcmp(key, "dg") || !strcmp(key, "tau") ||
                !strcmp(key, "iters") || !strcmp(key, "w") || !strcmp(key, "learn_gate") ||
                !strcmp(key, "sinks") || !strcmp(key, "dense_layers"))
                config_set(&m->cfg, f, key, val);
        }
        free(text);
        model_set_router_config(m, f);
        router_load(router, m, NULL, NULL, model_fingerprint(m));
        f->attn = ATTN_SOFT;
    }
    if (attn) {
        if (config_set(&m->cfg, f, "attn", attn))
            fatal("--attn must be dense, soft or hard, got '%s'", attn);
        if (f->attn != ATTN_DENSE && !router) fatal("--attn %s needs --router router.h5", attn);
    }
    if (topk) {
        if (config_set(&m->cfg, f, "topk", topk))
            fatal(
                "--topk must be a group count (1..K) or pP / pP:k (a share of the group mass), "
                "got '%s'",
                topk);
        if (f->topk > f->K) fatal("--topk %s exceeds the router's K = %d", topk, f->K);
    }
    if (routing && routing_parse(routing, &f->routing))
        fatal("--routing must be causal, sinkhorn or prefix_sinkhorn, got '%s'", routing);
}

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
           m->fc.attn == ATTN_HARD ? "hard" : "soft", focus_topk_str(&m->fc, tk), m->fc.sinks,
           m->fc.w, ctx, d.count);
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

static void eval_help(void) {
    printf(
        "usage: focus eval ppl|layers --model M [--tokenizer T] --data DIR|SHARD|TEXT [--ctx 1024] "
        "[--stride s]\n"
        "                      [--max-tokens n] [--router router.h5 [--attn dense|soft|hard] "
        "[--topk k|pP]\n"
        "                      [--routing causal|sinkhorn|prefix_sinkhorn]] [--set key=value]...\n"
        "                      [--device cpu|cuda]\n"
        "Perplexity of a model on token shards (a folder: its val_*.bin, else all *.bin), one\n"
        "shard, or a text file (tokenized with the model's own tokenizer or --tokenizer).\n"
        "Windows of --ctx tokens advance by --stride (default ctx); each token is scored once.\n"
        "With --router the trained router is loaded onto the model (which must be the one it was\n"
        "trained on); --attn soft is the default then, routing causal. Sinkhorn routing sees the\n"
        "future, so its numbers are marked non-causal. --device cuda runs the model on the GPU.\n"
        "--topk 1,2,p0.9 evaluates several budgets in turn; p0.9 keeps each token's groups until\n"
        "90 %% of its group mass is covered (p0.9:2: at most 2 groups). The router's sinks and dense_layers apply; --set sinks=N, --set\n"
        "dense_layers=0,1 or --set w=N override them for this evaluation.\n"
        "eval layers (with --router) measures each layer's cost on its own: perplexity with only\n"
        "that layer sparse, every other dense; it prints dense_layers lines for the worst "
        "layers.\n");
}

static void eval_report(Model* m, const ModelInfo* info, const int* ids, size_t n, const char* data,
                        int ctx, int stride) {
    PplResult r = eval_perplexity(m, ids, n, ctx, stride, 0);
    static const char* attn_names[] = {"dense", "soft", "hard"};
    printf("model %s (%s)  data %s  ctx %d stride %d\n", info->name, info->format, data, ctx,
           stride);
    char mode[1400] = "dense (router off)";
    if (m->fc.attn != ATTN_DENSE) {
        char tk[32], dl[1024];
        snprintf(mode, sizeof mode, "%s%s, routing %s, K=%d, w=%d, sinks=%d, dense layers %s",
                 attn_names[m->fc.attn], m->fc.attn == ATTN_HARD ? " top-k" : "",
                 routing_name(m->fc.routing), m->fc.K, m->fc.w, m->fc.sinks,
                 focus_dense_layers_str(&m->fc, dl, sizeof dl));
        if (m->fc.attn == ATTN_HARD)
            snprintf(mode + strlen(mode), sizeof mode - strlen(mode), ", k=%s",
                     focus_topk_str(&m->fc, tk));
    }
    const char* mark =
        m->fc.attn != ATTN_DENSE && m->fc.routing == ROUTE_SINKHORN ? "  (non-causal)" : "";
    printf("attention %s\n", mode);
    printf("perplexity %.4f%s  tokens %zu  nll/token %.5f  %.1f tokens/s (%.1f s)\n",
           exp(r.nll / r.count), mark, r.count, r.nll / r.count, (double)r.count / r.seconds,
           r.seconds);
    if (m->fc.attn == ATTN_HARD) printf("pairs kept %.4f of causal pairs%s\n", r.kept, mark);
}

int cmd_eval(int argc, char** argv) {
    if (argc < 2 || !strcmp(argv[1], "--help")) {
        eval_help();
        return argc < 2 ? 1 : 0;
    }
    const int layers = !strcmp(argv[1], "layers");
    if (strcmp(argv[1], "ppl") && !layers)
        fatal("eval: unknown evaluation '%s' (ppl or layers)", argv[1]);
    const char *model = NULL, *tok = NULL, *data = NULL;
    int ctx = 1024, stride = 0;
    size_t max_tokens = 0;
    const char *router = NULL, *attn = NULL, *routing = NULL, *topk = NULL;
    const char* sets[64];
    int nsets = 0, device = 0;
    FocusConfig fc;
    focus_config_default(&fc);
    fc.attn = ATTN_DENSE;
    fc.routing = ROUTE_CAUSAL;
    for (int i = 2; i < argc; i++) {
        const char* a = argv[i];
        if (!strcmp(a, "--help")) {
            eval_help();
            return 0;
        } else if (!strcmp(a, "--model"))
            model = cli_value(argc, argv, i++);
        else if (!strcmp(a, "--tokenizer"))
            tok = cli_value(argc, argv, i++);
        else if (!strcmp(a, "--data"))
            data = cli_value(argc, argv, i++);
        else if (!strcmp(a, "--ctx"))
            ctx = cli_int(a, cli_value(argc, argv, i++));
        else if (!strcmp(a, "--stride"))
            stride = cli_int(a, cli_value(argc, argv, i++));
        else if (!strcmp(a, "--max-tokens"))
            max_tokens = (size_t)cli_int(a, cli_value(argc, argv, i++));
        else if (!strcmp(a, "--router"))
            router = cli_value(argc, argv, i++);
        else if (!strcmp(a, "--attn"))
            attn = cli_value(argc, argv, i++);
        else if (!strcmp(a, "--topk"))
            topk = cli_value(argc, argv, i++);
        else if (!strcmp(a, "--routing"))
            routing = cli_value(argc, argv, i++);
        else if (!strcmp(a, "--device"))
            device = cli_device(cli_value(argc, argv, i++));
        else if (!strcmp(a, "--set")) {
            if (nsets == 64) fatal("eval: too many --set options");
            sets[nsets++] = cli_value(argc, argv, i++);
        } else
            fatal("eval: unknown option '%s' (see focus eval --help)", a);
    }
    if (!model || !data) fatal("eval ppl: needs --model and --data");
    if (ctx < 2) fatal("eval ppl: --ctx must be at least 2");
    if (!stride) stride = ctx;
    if (stride < 1 || stride > ctx) fatal("eval ppl: --stride must be in 1..ctx");
    Model m;
    ModelInfo info;
    model_load(&m, model, &fc, &info);
    apply_router_options(&m, router, attn, topk && !strchr(topk, ',') ? topk : NULL, routing);
    /* the model's own settings come from its file and the router's shape from router.h5: only
     * the other Focus keys take effect here */
    for (int i = 0; i < nsets; i++) {
        ModelConfig from_file = m.cfg;
        FocusConfig want = m.fc;
        cli_apply_set(&from_file, &want, sets[i]);
        if (want.K != m.fc.K || want.dg != m.fc.dg)
            fatal("eval: --set %s: K and dg are the router's shape, fixed by %s", sets[i],
                  router ? router : "the model");
        config_validate(&m.cfg, &want);
        if (router && want.sinks != m.fc.sinks)
            fprintf(stderr,
                    "note: sinks = %d for this evaluation (the router was trained with %d)\n",
                    want.sinks, m.fc.sinks);
        m.fc = want;
    }
    model_use_device(&m, device);
    size_t n;
    int* ids = load_eval_tokens(data, model, tok, &n);
    if (max_tokens && n > max_tokens) n = max_tokens;
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= m.cfg.V)
            fatal("%s: token id %d is outside the model's vocabulary (V=%d); wrong tokenizer?",
                  data, ids[i], m.cfg.V);
    if (ctx > m.cfg.maxT && m.cfg.arch == ARCH_GPT2)
        fatal("eval ppl: --ctx %d exceeds the model's context (%d)", ctx, m.cfg.maxT);
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
        eval_report(&m, &info, ids, n, data, ctx, stride);
    } while (next_budget);
    free(ids);
    model_free(&m);
    return 0;
}

/* Index of the next token from logits (V): greedy when temperature <= 0, else nucleus sampling. */
static int sample(const real* logits, int V, double temperature, double top_p, Rng* rng) {
    int best = 0;
    for (int v = 1; v < V; v++) best = logits[v] > logits[best] ? v : best;
    if (temperature <= 0) return best;
    double* p = mallocCheck(sizeof(double) * V);
    int* idx = mallocCheck(sizeof(int) * V);
    double sum = 0;
    for (int v = 0; v < V; v++) {
        p[v] = exp((logits[v] - logits[best]) / temperature);
        sum += p[v];
        idx[v] = v;
    }
    /* Sort candidates by probability (partial selection until top_p mass is reached). */
    double mass = 0;
    int k = 0;
    while (k < V && mass < top_p * sum) {
        int bi = k;
        for (int j = k + 1; j < V; j++) bi = p[idx[j]] > p[idx[bi]] ? j : bi;
        int tmp = idx[k];
        idx[k] = idx[bi];
        idx[bi] = tmp;
        mass += p[idx[k++]];
        if (k > 1024) break; /* the tail beyond 1024 candidates carries no practical mass */
    }
    double r = rng_uniform(rng) * mass, acc = 0;
    int choice = idx[k - 1];
    for (int j = 0; j < k; j++) {
        acc += p[idx[j]];
        if (r < acc) {
            choice = idx[j];
            break;
        }
    }
    free(p);
    free(idx);
    return choice;
}

int cmd_generate(int argc, char** argv) {
    const char *model = NULL, *tok = NULL, *prompt = NULL, *router = NULL, *attn = NULL;
    int n = 64;
    const char* topk = NULL;
    double temperature = 0, top_p = 1;
    uint64_t seed = 1;
    FocusConfig fc;
    focus_config_default(&fc);
    fc.attn = ATTN_DENSE;
    fc.routing = ROUTE_CAUSAL;
    for (int i = 1; i < argc; i++) {
        const char* a = argv[i];
        if (!strcmp(a, "--help")) {
            printf(
                "usage: focus generate --model M [--tokenizer T] --prompt TEXT [-n 64]\n"
                "                      [--temperature t] [--top-p p] [--seed s] [--router "
                "router.h5 [--topk k] [--attn dense|hard]]\n"
                "Greedy decoding by default; with --temperature > 0, nucleus sampling (top-p). "
                "Tokens are\n"
                "generated one at a time over a KV cache; with --router, each new token attends to "
                "its\n"
                "window and the cached tokens of its top-k groups (causal routing).\n");
            return 0;
        } else if (!strcmp(a, "--model"))
            model = cli_value(argc, argv, i++);
        else if (!strcmp(a, "--tokenizer"))
            tok = cli_value(argc, argv, i++);
        else if (!strcmp(a, "--prompt"))
            prompt = cli_value(argc, argv, i++);
        else if (!strcmp(a, "-n"))
            n = cli_int(a, cli_value(argc, argv, i++));
        else if (!strcmp(a, "--temperature"))
            temperature = atof(cli_value(argc, argv, i++));
        else if (!strcmp(a, "--top-p"))
            top_p = atof(cli_value(argc, argv, i++));
        else if (!strcmp(a, "--seed"))
            seed = (uint64_t)cli_int(a, cli_value(argc, argv, i++));
        else if (!strcmp(a, "--router"))
            router = cli_value(argc, argv, i++);
        else if (!strcmp(a, "--topk"))
            topk = cli_value(argc, argv, i++);
        else if (!strcmp(a, "--attn"))
            attn = cli_value(argc, argv, i++);
        else
            fatal("generate: unknown option '%s'", a);
    }
    if (!model || !prompt) fatal("generate: needs --model and --prompt");
    if (top_p <= 0 || top_p > 1) fatal("generate: --top-p must be in (0, 1]");
    if (n < 0) fatal("generate: -n must be >= 0");
    Model m;
    model_load(&m, model, &fc, NULL);
    Tokenizer* t = tokenizer_load(tok ? tok : model);
    apply_router_options(&m, router, router ? (attn ? attn : "hard") : attn, topk, "causal");
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
    Rng rng;
    rng_seed(&rng, seed);
    KVCache c;
    kvcache_init(&c, &m, (int)cap);
    real* logits = mallocCheck(sizeof(real) * m.cfg.V);
    double t0 = now_seconds();
    for (size_t i = 0; i < len; i++) model_decode_step(&m, &c, ids[i], logits); /* the prompt */
    fputs(prompt, stdout);
    fflush(stdout);
    int made = 0;
    for (; made < n; made++) {
        if (m.cfg.arch == ARCH_GPT2 && (int)len >= m.cfg.maxT) break;
        int next = sample(logits, m.cfg.V, temperature, top_p, &rng);
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
    printf("\n");
    fprintf(
        stderr, "[%zu prompt + %d generated tokens in %.1f s, %.1f tokens/s; attention %s]\n",
        len - made, made, dt, (len) / dt,
        m.fc.attn == ATTN_HARD ? "hard top-k over the group KV cache" : "dense over the KV cache");
    free(ids);
    free(logits);
    kvcache_free(&c);
    tokenizer_free(t);
    model_free(&m);
    return 0;
}
