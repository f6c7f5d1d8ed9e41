/* cmd_eval.c: `focus eval ppl` and `focus generate`. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "../checkpoints/load.h"
#include "../data/shard.h"
#include "../data/text.h"
#include "../data/tokenizer.h"
#include "cli.h"

int* load_eval_tokens(const char* data, const char* model_path, const char* tok_path, size_t* n) {
    struct stat st;
    if (stat(data, &st)) fatal("%s: data not found", data);
    if (S_ISDIR(st.st_mode)) {
        char** paths;
        int k = shard_list(data, "val_", &paths);
        if (!k) {
            free(paths);
            k = shard_list(data, "", &paths);
        }
        if (!k) fatal("%s: no token shards (*.bin) in this folder", data);
        int* all = NULL;
        *n = 0;
        int V0 = -1;
        for (int i = 0; i < k; i++) {
            size_t m;
            int V;
            int* ids = shard_read(paths[i], &m, &V);
            if (V0 >= 0 && V != V0) fatal("%s: vocabulary size %d differs from the other shards' %d", paths[i], V, V0);
            V0 = V;
            all = realloc(all, sizeof(int) * (*n + m + 1));
            memcpy(all + *n, ids, sizeof(int) * m);
            *n += m;
            free(ids);
            free(paths[i]);
        }
        free(paths);
        return all;
    }
    if (shard_is_shard(data)) {
        int V;
        return shard_read(data, n, &V);
    }
    const char* tp = tok_path ? tok_path : model_path;
    Tokenizer* t = tokenizer_load(tp);
    size_t len;
    char* text = read_file(data, &len);
    int* ids = tokenizer_encode(t, text, len, n);
    free(text);
    tokenizer_free(t);
    return ids;
}

typedef struct {
    double nll;   /* summed negative log-likelihood */
    size_t count; /* scored tokens */
    double seconds;
} PplResult;

/* Strided perplexity: windows of ctx input tokens (predicting the ctx tokens after each),
 * advancing by stride; each window scores only the targets the previous window did not, so
 * with stride = ctx every token after the first is scored exactly once. */
PplResult eval_perplexity(Model* m, const int* ids, size_t n, int ctx, int stride, int quiet) {
    PplResult r = {0, 0, 0};
    if (n < 2) fatal("eval: need at least 2 tokens, got %zu", n);
    int* tgt = mallocCheck(sizeof(int) * ctx);
    double t0 = now_seconds();
    size_t scored_to = 0; /* targets with absolute index <= scored_to are done */
    for (size_t st = 0;; st += (size_t)stride) {
        size_t end = st + (size_t)ctx + 1 < n ? st + (size_t)ctx + 1 : n; /* targets < end */
        int T = (int)(end - st) - 1;
        if (T < 1) break;
        for (int i = 0; i < T; i++) {
            size_t j = st + 1 + (size_t)i;
            tgt[i] = j > scored_to ? ids[j] : -1;
        }
        model_forward(m, ids + st, tgt, 1, T, 0);
        for (int i = 0; i < T; i++) {
            if (tgt[i] >= 0) {
                r.nll += m->losses[i];
                r.count++;
            }
        }
        scored_to = end - 1;
        if (!quiet) {
            fprintf(stderr, "\r  %zu / %zu tokens, ppl so far %.3f", r.count, n - 1, exp(r.nll / r.count));
            fflush(stderr);
        }
        if (end == n) break;
    }
    if (!quiet) fprintf(stderr, "\n");
    r.seconds = now_seconds() - t0;
    free(tgt);
    return r;
}

static void eval_help(void) {
    printf("usage: focus eval ppl --model M [--tokenizer T] --data DIR|SHARD|TEXT [--ctx 1024] [--stride s]\n"
           "                      [--max-tokens n] [--set key=value]...\n"
           "Perplexity of a model on token shards (a folder: its val_*.bin, else all *.bin), one\n"
           "shard, or a text file (tokenized with the model's own tokenizer or --tokenizer).\n"
           "Windows of --ctx tokens advance by --stride (default ctx); each token is scored once.\n");
}

int cmd_eval(int argc, char** argv) {
    if (argc < 2 || !strcmp(argv[1], "--help")) {
        eval_help();
        return argc < 2 ? 1 : 0;
    }
    if (strcmp(argv[1], "ppl")) fatal("eval: unknown evaluation '%s' (ppl)", argv[1]);
    const char *model = NULL, *tok = NULL, *data = NULL;
    int ctx = 1024, stride = 0;
    size_t max_tokens = 0;
    FocusConfig fc;
    focus_config_default(&fc);
    fc.attn = ATTN_DENSE;
    fc.routing = ROUTE_CAUSAL;
    for (int i = 2; i < argc; i++) {
        const char* a = argv[i];
        if (!strcmp(a, "--help")) {
            eval_help();
            return 0;
        } else if (!strcmp(a, "--model")) model = cli_value(argc, argv, i++);
        else if (!strcmp(a, "--tokenizer")) tok = cli_value(argc, argv, i++);
        else if (!strcmp(a, "--data")) data = cli_value(argc, argv, i++);
        else if (!strcmp(a, "--ctx")) ctx = cli_int(a, cli_value(argc, argv, i++));
        else if (!strcmp(a, "--stride")) stride = cli_int(a, cli_value(argc, argv, i++));
        else if (!strcmp(a, "--max-tokens")) max_tokens = (size_t)cli_int(a, cli_value(argc, argv, i++));
        else if (!strcmp(a, "--set")) {
            ModelConfig dummy;
            cli_apply_set(&dummy, &fc, cli_value(argc, argv, i++));
        } else fatal("eval: unknown option '%s' (see focus eval --help)", a);
    }
    if (!model || !data) fatal("eval ppl: needs --model and --data");
    if (ctx < 2) fatal("eval ppl: --ctx must be at least 2");
    if (!stride) stride = ctx;
    if (stride < 1 || stride > ctx) fatal("eval ppl: --stride must be in 1..ctx");
    Model m;
    ModelInfo info;
    model_load(&m, model, &fc, &info);
    size_t n;
    int* ids = load_eval_tokens(data, model, tok, &n);
    if (max_tokens && n > max_tokens) n = max_tokens;
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= m.cfg.V) fatal("%s: token id %d is outside the model's vocabulary (V=%d); wrong tokenizer?", data, ids[i], m.cfg.V);
    if (ctx > m.cfg.maxT && m.cfg.arch == ARCH_GPT2) fatal("eval ppl: --ctx %d exceeds the model's context (%d)", ctx, m.cfg.maxT);
    PplResult r = eval_perplexity(&m, ids, n, ctx, stride, 0);
    printf("model %s (%s)  data %s  ctx %d stride %d\n", info.name, info.format, data, ctx, stride);
    printf("perplexity %.4f  tokens %zu  nll/token %.5f  %.1f tokens/s (%.1f s)\n", exp(r.nll / r.count), r.count,
           r.nll / r.count, (double)r.count / r.seconds, r.seconds);
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
    const char *model = NULL, *tok = NULL, *prompt = NULL;
    int n = 64;
    double temperature = 0, top_p = 1;
    uint64_t seed = 1;
    FocusConfig fc;
    focus_config_default(&fc);
    fc.attn = ATTN_DENSE;
    fc.routing = ROUTE_CAUSAL;
    for (int i = 1; i < argc; i++) {
        const char* a = argv[i];
        if (!strcmp(a, "--help")) {
            printf("usage: focus generate --model M [--tokenizer T] --prompt TEXT [-n 64]\n"
                   "                      [--temperature t] [--top-p p] [--seed s]\n"
                   "Greedy decoding by default; with --temperature > 0, nucleus sampling (top-p).\n");
            return 0;
        } else if (!strcmp(a, "--model")) model = cli_value(argc, argv, i++);
        else if (!strcmp(a, "--tokenizer")) tok = cli_value(argc, argv, i++);
        else if (!strcmp(a, "--prompt")) prompt = cli_value(argc, argv, i++);
        else if (!strcmp(a, "-n")) n = cli_int(a, cli_value(argc, argv, i++));
        else if (!strcmp(a, "--temperature")) temperature = atof(cli_value(argc, argv, i++));
        else if (!strcmp(a, "--top-p")) top_p = atof(cli_value(argc, argv, i++));
        else if (!strcmp(a, "--seed")) seed = (uint64_t)cli_int(a, cli_value(argc, argv, i++));
        else fatal("generate: unknown option '%s'", a);
    }
    if (!model || !prompt) fatal("generate: needs --model and --prompt");
    if (top_p <= 0 || top_p > 1) fatal("generate: --top-p must be in (0, 1]");
    Tokenizer* t = tokenizer_load(tok ? tok : model);
    Model m;
    model_load(&m, model, &fc, NULL);
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
    fputs(prompt, stdout);
    fflush(stdout);
    double t0 = now_seconds();
    for (int i = 0; i < n; i++) {
        if ((int)len > m.cfg.maxT) break;
        model_forward(&m, ids, NULL, 1, (int)len, 0);
        int next = sample(model_logits(&m) + (len - 1) * (size_t)m.cfg.V, m.cfg.V, temperature, top_p, &rng);
        ids[len++] = next;
        size_t sl;
        char* s = tokenizer_decode(t, &next, 1, &sl);
        fwrite(s, 1, sl, stdout);
        fflush(stdout);
        free(s);
        if (next == tokenizer_eot(t)) break;
    }
    fprintf(stderr, "\n[%d tokens in %.1f s]\n", (int)(len - np), now_seconds() - t0);
    printf("\n");
    free(ids);
    tokenizer_free(t);
    model_free(&m);
    return 0;
}
