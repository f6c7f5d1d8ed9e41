/* cmd_eval_long.c: the long-context evaluations: `focus eval passkey` (retrieval of a number
 * hidden in filler text) and `focus eval curve` (perplexity against context length), each for
 * dense attention and every Focus mode asked for, one model load.
 *
 * Passkey, after the prompt of Mohtashami and Jaggi (Landmark Attention, 2023) used by most
 * long-context work: an instruction, filler sentences, "The pass key is N. Remember it. N is the
 * pass key." at a chosen depth, more filler, then "What is the pass key? The pass key is". The
 * answer " N" counts as retrieved when each of its tokens is the model's greedy choice (what
 * greedy decoding would write), scored in one forward pass. */
#define _GNU_SOURCE /* strtok_r */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../data/tokenizer.h"
#include "../io/io.h"
#include "cli.h"
#include "commands.h"
#include "evaluate.h"

static const char passkey_usage[] =
    "usage: focus eval passkey --model M [--tokenizer T] [--router router.h5] [--modes "
    "dense,soft,hard:1]\n"
    "                          [--lengths 1024,2048,4096,8192] [--depths 0,0.25,0.5,0.75,1] "
    "[--trials 2]\n"
    "                          [--set key=value]... [--lora lora.h5] [--out passkey.tsv]\n"
    "A 5-digit number hidden at each depth (0: right after the instruction, 1: just before the\n"
    "question) of filler text of each length in tokens; retrieved when greedy decoding would\n"
    "write it. One line per mode with the accuracy by length and depth; --out writes every trial\n"
    "(mode, length, depth, trial, key, retrieved) for scripts/plot_passkey.py. Modes: dense,\n"
    "soft, hard:k, hard:pP (the router's modes need --router; routing is causal).\n";

static const char curve_usage[] =
    "usage: focus eval curve --model M [--tokenizer T] --data DATA [--router router.h5]\n"
    "                        [--modes dense,soft,hard:1] [--ctx 512,1024,2048,4096,8192]\n"
    "                        [--max-tokens n] [--set key=value]... [--lora lora.h5] [--out "
    "curve.tsv]\n"
    "Perplexity against context length: the same tokens (the first n of DATA, default 16384)\n"
    "scored in windows of each length (stride = length) for each mode; also the pairs kept by\n"
    "hard modes. --out writes mode, ctx, perplexity, pairs kept, tokens/s for\n"
    "scripts/plot_curve.py.\n";

/* A comma-separated list of up to max numbers. */
static int parse_doubles(const char* s, double* out, int max, const char* opt) {
    int n = 0;
    for (const char* p = s; *p;) {
        char* end;
        double v = strtod(p, &end);
        if (end == p || (*end && *end != ',') || n == max || !isfinite(v))
            fatal("%s: expected up to %d comma-separated numbers, got '%s'", opt, max, s);
        out[n++] = v;
        p = *end ? end + 1 : end;
    }
    if (!n) fatal("%s: empty list", opt);
    return n;
}

/* Split a comma-separated mode list in place into up to 16 modes. */
static int split_modes(char* s, char** modes) {
    int n = 0;
    char* save = NULL;
    for (char* t = strtok_r(s, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (n == 16) fatal("--modes: at most 16 modes");
        modes[n++] = t;
    }
    if (!n) fatal("--modes: no mode given");
    return n;
}

/* Load the model (with --router / --lora / --set, causal routing) and split the mode list
 * (default: dense, soft and hard:1 with a router, dense without), checking every mode now. */
static int load_for_modes(Model* m, ModelInfo* info, const char* model, const char* router,
                          const char* lora, CliList* sets, const char* modes_s, char* buf,
                          char** modes) {
    snprintf(buf, 512, "%s", modes_s ? modes_s : router ? "dense,soft,hard:1" : "dense");
    const int nm = split_modes(buf, modes);
    cli_load_model(m, info, model, router, NULL, NULL, "causal", sets, 0, lora);
    free(sets->v);
    const FocusConfig keep = m->fc;
    for (int k = 0; k < nm; k++) cli_set_mode(m, modes[k], router != NULL);
    m->fc = keep;
    return nm;
}

/* Close the table written into memory (open_memstream into *tsv) and write it to out
 * atomically, if asked; free it. */
static void write_table(FILE* ts, char** tsv, const char* out) {
    fclose(ts); /* sets *tsv */
    if (out) {
        const void* parts[1] = {*tsv};
        const size_t n = strlen(*tsv);
        write_file_atomic(out, parts, &n, 1);
    }
    free(*tsv);
}

static int* encode(const Tokenizer* t, const char* s, size_t* n) {
    return tokenizer_encode(t, s, strlen(s), n);
}

/* The passkey prompt of about `len` tokens with the key at `depth`, and its answer: *first is
 * where the answer's tokens start in the returned sequence of *n tokens. */
static int* passkey_sequence(const Tokenizer* t, int len, double depth, int key, size_t* n,
                             size_t* first) {
    static const char* intro =
        "There is an important info hidden inside a lot of irrelevant text. Find it and memorize "
        "it. I will quiz you about the important information there.";
    static const char* filler =
        " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back "
        "again.";
    char needle[160], answer[32];
    snprintf(needle, sizeof needle, " The pass key is %d. Remember it. %d is the pass key.", key,
             key);
    snprintf(answer, sizeof answer, " %d", key);
    const char* question = " What is the pass key? The pass key is";
    size_t a, b, c, d;
    free(encode(t, intro, &a));
    free(encode(t, filler, &b));
    free(encode(t, needle, &c));
    free(encode(t, question, &d));
    const long reps = ((long)len - (long)(a + c + d)) / (long)b;
    if (reps < 1)
        fatal("eval passkey: length %d is too short for the prompt (%zu tokens)", len,
              a + b + c + d);
    const long at = lround(depth * (double)reps);
    const size_t cap = strlen(intro) + (size_t)reps * strlen(filler) + strlen(needle) +
                       strlen(question) + strlen(answer) + 1;
    char* text = mallocCheck(cap);
    size_t o = (size_t)sprintf(text, "%s", intro);
    for (long r = 0; r <= reps; r++) {
        if (r == at) o += (size_t)sprintf(text + o, "%s", needle);
        if (r < reps) o += (size_t)sprintf(text + o, "%s", filler);
    }
    o += (size_t)sprintf(text + o, "%s", question);
    size_t nprompt;
    free(tokenizer_encode(t, text, o, &nprompt));
    sprintf(text + o, "%s", answer);
    int* ids = tokenizer_encode(t, text, strlen(text), n);
    free(text);
    *first = nprompt < *n ? nprompt : *n - 1;
    return ids;
}

int cmd_eval_passkey(int argc, char** argv) {
    const char *model = NULL, *tok_path = NULL, *router = NULL, *modes_s = NULL, *out = NULL;
    const char* lora = NULL;
    const char *lengths_s = "1024,2048,4096,8192", *depths_s = "0,0.25,0.5,0.75,1";
    int trials = 2;
    CliList sets = {0};
    if (cli_parse("eval passkey", argc, argv, 2, passkey_usage,
                  "--model:s --tokenizer:s --router:s --modes:s --lengths:s --depths:s "
                  "--trials:i[1,1000] "
                  "--set:* --out:s --lora:s",
                  &model, &tok_path, &router, &modes_s, &lengths_s, &depths_s, &trials, &sets, &out,
                  &lora))
        return 0;
    if (!model) fatal("eval passkey: needs --model");
    if (trials < 1) fatal("eval passkey: --trials must be at least 1");
    double lens[16], depths[16];
    const int nl = parse_doubles(lengths_s, lens, 16, "--lengths");
    const int nd = parse_doubles(depths_s, depths, 16, "--depths");
    for (int d = 0; d < nd; d++)
        if (depths[d] < 0 || depths[d] > 1) fatal("--depths: %g is not in [0, 1]", depths[d]);
    char modes_buf[512], *modes[16];
    Model m;
    ModelInfo info;
    const int nm = load_for_modes(&m, &info, model, router, lora, &sets, modes_s, modes_buf, modes);
    for (int l = 0; l < nl; l++)
        if (lens[l] < 64 || lens[l] > m.cfg.maxT)
            fatal("eval passkey: length %g is outside 64 .. the model's context %d", lens[l],
                  m.cfg.maxT);
    const FocusConfig keep = m.fc;
    for (int k = 0; k < nm; k++)
        cli_set_mode(&m, modes[k], router != NULL); /* check them all first */
    Tokenizer* tok = tokenizer_load(tok_path ? tok_path : model);
    char* tsv = NULL;
    size_t tsv_len = 0;
    FILE* ts = open_memstream(&tsv, &tsv_len);
    fprintf(ts, "mode\tlength\tdepth\ttrial\tkey\tretrieved\n");
    printf("model %s (%s), passkey retrieval, %d trials per cell\n", info.name, info.format,
           trials);
    for (int k = 0; k < nm; k++) {
        m.fc = keep;
        cli_set_mode(&m, modes[k], router != NULL);
        printf("\n%s: retrieved / trials by length (rows) and depth (columns)\n| length |",
               modes[k]);
        for (int d = 0; d < nd; d++) printf(" %g |", depths[d]);
        printf("\n|---|");
        for (int d = 0; d < nd; d++) printf("---|");
        printf("\n");
        int total = 0, right = 0;
        for (int l = 0; l < nl; l++) {
            printf("| %d |", (int)lens[l]);
            for (int d = 0; d < nd; d++) {
                int ok = 0;
                for (int r = 0; r < trials; r++) {
                    Rng rng;
                    rng_seed(&rng, 1000003 * (uint64_t)(l + 1) + 1009 * (uint64_t)d + (uint64_t)r);
                    const int key = 10000 + (int)(rng_u64(&rng) % 90000);
                    size_t n, first;
                    int* ids = passkey_sequence(tok, (int)lens[l], depths[d], key, &n, &first);
                    double ll;
                    int greedy;
                    eval_continuations(&m, &ids, &n, &first, 1, &ll, &greedy);
                    free(ids);
                    ok += greedy;
                    fprintf(ts, "%s\t%d\t%g\t%d\t%d\t%d\n", modes[k], (int)lens[l], depths[d], r,
                            key, greedy);
                    fprintf(stderr, "\r  %s: length %d, depth %g, trial %d", modes[k], (int)lens[l],
                            depths[d], r + 1);
                }
                printf(" %d/%d |", ok, trials);
                total += trials, right += ok;
                fflush(stdout);
            }
            printf("\n");
        }
        fprintf(stderr, "\n");
        printf("%s: %d of %d retrieved (%.1f %%)\n", modes[k], right, total, 100.0 * right / total);
    }
    write_table(ts, &tsv, out);
    tokenizer_free(tok);
    model_free(&m);
    return 0;
}

int cmd_eval_curve(int argc, char** argv) {
    const char *model = NULL, *tok_path = NULL, *data = NULL, *router = NULL, *modes_s = NULL;
    const char* lora = NULL;
    const char *ctx_s = "512,1024,2048,4096,8192", *out = NULL;
    int max_tokens = 16384;
    CliList sets = {0};
    if (cli_parse("eval curve", argc, argv, 2, curve_usage,
                  "--model:s --tokenizer:s --data:s --router:s --modes:s --ctx:s "
                  "--max-tokens:i[1,2147483647] "
                  "--set:* --out:s --lora:s",
                  &model, &tok_path, &data, &router, &modes_s, &ctx_s, &max_tokens, &sets, &out,
                  &lora))
        return 0;
    if (!model || !data) fatal("eval curve: needs --model and --data");
    if (max_tokens < 2) fatal("eval curve: --max-tokens must be at least 2");
    double ctxs[16];
    const int nc = parse_doubles(ctx_s, ctxs, 16, "--ctx");
    char modes_buf[512], *modes[16];
    Model m;
    ModelInfo info;
    const int nm = load_for_modes(&m, &info, model, router, lora, &sets, modes_s, modes_buf, modes);
    for (int c = 0; c < nc; c++)
        if (ctxs[c] < 2 || (ctxs[c] > m.cfg.maxT && m.cfg.arch == ARCH_GPT2))
            fatal("eval curve: --ctx %g is outside 2 .. the model's context %d", ctxs[c],
                  m.cfg.maxT);
    const FocusConfig keep = m.fc;
    size_t n;
    int* ids = load_eval_tokens(data, model, tok_path, &n);
    if (n > (size_t)max_tokens) n = (size_t)max_tokens;
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= m.cfg.V)
            fatal("%s: token id %d is outside the model's vocabulary (V=%d); wrong tokenizer?",
                  data, ids[i], m.cfg.V);
    char* tsv = NULL;
    size_t tsv_len = 0;
    FILE* ts = open_memstream(&tsv, &tsv_len);
    fprintf(ts, "mode\tctx\tperplexity\tpairs_kept\ttokens_per_s\n");
    printf("model %s (%s), %s, first %zu tokens, causal routing\n| mode |", info.name, info.format,
           data, n);
    for (int c = 0; c < nc; c++) printf(" ctx %d |", (int)ctxs[c]);
    printf("\n|---|");
    for (int c = 0; c < nc; c++) printf("---|");
    printf("\n");
    for (int k = 0; k < nm; k++) {
        m.fc = keep;
        cli_set_mode(&m, modes[k], router != NULL);
        printf("| %s |", modes[k]);
        for (int c = 0; c < nc; c++) {
            const int ctx = (int)ctxs[c];
            PplResult r = eval_perplexity(&m, ids, n, ctx, ctx, 1);
            const double ppl = exp(r.nll / r.count);
            if (m.fc.attn == ATTN_HARD)
                printf(" %.3f (%.2f of pairs) |", ppl, r.kept);
            else
                printf(" %.3f |", ppl);
            fflush(stdout);
            fprintf(ts, "%s\t%d\t%.6f\t%.6f\t%.1f\n", modes[k], ctx, ppl,
                    m.fc.attn == ATTN_HARD ? r.kept : 1.0, (double)r.count / r.seconds);
        }
        printf("\n");
    }
    write_table(ts, &tsv, out);
    free(ids);
    model_free(&m);
    return 0;
}
