/* cmd_eval_long.c: the long-context evaluations: `focus eval passkey` (retrieval of a number
 * hidden in filler text) and `focus eval curve` (perplexity against context length), each for
 * dense attention and every Focus mode asked for, one model load.
 *
 * Passkey, after the prompt of Mohtashami and Jaggi (Landmark Attention, 2023) used by most
 * long-context work: an instruction, filler sentences, "The pass key is N. Remember it. N is the
 * pass key." at a chosen depth, more filler, then "What is the pass key? The pass key is". The
 * answer " N" counts as retrieved when each of its tokens is the model's greedy choice (what
 * greedy decoding would write), scored in one forward pass.
 *
 * The needle tasks (--task niah_number, niah_word, niah_multikey) follow RULER (Hsieh et al.,
 * 2024): "One of the special magic numbers for KEY is: VALUE." hidden in a haystack (RULER's
 * noise sentences, or any text given with --haystack), a key of two words, a value of seven
 * digits or one word; niah_multikey hides three more needles with other keys and values
 * (distractors) at random depths. The needles are spliced into the haystack's tokens after a
 * sentence end, so a prompt has exactly the asked length. Every key, value and distractor comes
 * from a seed of (the length's and the depth's places in their lists, trial): every mode sees
 * the same prompts. */
#define _GNU_SOURCE /* strtok_r */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../data/tokenizer.h"
#include "../io/io.h"
#include "cli.h"
#include "commands.h"
#include "../eval/evaluate.h"

static const char passkey_usage[] =
    "usage: focus eval passkey --model M [--tokenizer T] [--router router.h5] [--modes "
    "dense,soft,hard:1]\n"
    "                          [--lengths 1024,2048,4096,8192] [--depths 0,0.25,0.5,0.75,1] "
    "[--trials 2]\n"
    "                          [--task passkey|niah_number|niah_word|niah_multikey]\n"
    "                          [--haystack noise|TEXT] [--set key=value]... [--lora lora.h5]\n"
    "                          [--out passkey.tsv]\n"
    "A 5-digit number hidden at each depth (0: right after the instruction, 1: just before the\n"
    "question) of filler text of each length in tokens; retrieved when greedy decoding would\n"
    "write it. One line per mode with the accuracy by length and depth; --out writes every trial\n"
    "(mode, length, depth, trial, key, retrieved, task) for scripts/plot_passkey.py. Modes:\n"
    "the methods below, NAME:BUDGET (hard:pP too; blocks:pP, a share of the estimated mass);\n"
    "what a method needs comes with --router; routing is causal.\n"
    "--task niah_*: RULER's needle in a haystack (a 7-digit number or a word under a two-word\n"
    "key; multikey: three distractor needles with other keys), in RULER's noise sentences or in\n"
    "the text of --haystack (a text file, cycled as needed).\n"
    "Each prompt is drawn from a seed of its length's and depth's places in the lists and its\n"
    "trial: every mode sees the same prompts, and the same --lengths and --depths draw the same\n"
    "ones again (--lengths 32768 and --lengths 8192,32768 draw different 32K prompts).\n";

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
 * (default: dense, soft and hard:1 with a router, dense without), checking every mode and the nl
 * lengths lens now. */
static int load_for_modes(Model* m, ModelInfo* info, const char* model, const char* router,
                          const char* lora, CliList* sets, const char* modes_s, char* buf,
                          char** modes, const double* lens, int nl, double lo, const char* what) {
    snprintf(buf, 512, "%s", modes_s ? modes_s : router ? "dense,soft,hard:1" : "dense");
    const int nm = split_modes(buf, modes);
    cli_open_model(
        m, info,
        &(ModelRequest){
            .model = model, .router = router, .routing = "causal", .sets = sets, .lora = lora});
    free(sets->v);
    const FocusConfig keep = m->fc;
    for (int k = 0; k < nm; k++) cli_set_mode(m, modes[k], router != NULL);
    m->fc = keep;
    /* the lengths (what: "eval curve: --ctx") within lo .. the model's context */
    for (int l = 0; l < nl; l++)
        if (lens[l] < lo || lens[l] > m->cfg.maxT)
            fatal("%s %g is outside %g .. the model's context of %d tokens", what, lens[l], lo,
                  m->cfg.maxT);
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

typedef enum { TASK_PASSKEY, TASK_NIAH_NUMBER, TASK_NIAH_WORD, TASK_NIAH_MULTIKEY } Retrieval;
static const char* const task_names[] = {"passkey", "niah_number", "niah_word", "niah_multikey"};

/* Keys are two of these words ("silver-harbor"), word values one of them. */
static const char* const niah_words[] = {
    "amber",   "anchor",  "apple",  "arrow",  "autumn",  "badge",   "basket",  "beacon",  "berry",
    "blanket", "bridge",  "candle", "canyon", "carpet",  "castle",  "cedar",   "cherry",  "cliff",
    "cobalt",  "copper",  "coral",  "cotton", "crystal", "desert",  "dragon",  "eagle",   "ember",
    "falcon",  "feather", "forest", "fossil", "garden",  "garnet",  "glacier", "granite", "harbor",
    "hazel",   "helmet",  "island", "ivory",  "jacket",  "jasmine", "kettle",  "ladder",  "lantern",
    "lemon",   "marble",  "meadow", "mirror", "monkey",  "needle",  "nickel",  "orchid",  "pebble",
    "pepper",  "pillow",  "planet", "pocket", "quartz",  "rabbit",  "ribbon",  "saddle",  "salmon",
    "silver",  "spider",  "spruce", "summer", "thunder", "timber",  "tulip",   "velvet",  "violet",
    "walnut",  "willow",  "window", "winter", "zephyr"};
#define NIAH_NWORDS ((int)(sizeof niah_words / sizeof niah_words[0]))

/* The haystack of the needle tasks: RULER's noise sentences, or a text file's tokens. */
static int* niah_haystack(const Tokenizer* t, const char* path, size_t* n) {
    if (!path || !strcmp(path, "noise")) {
        const char* noise =
            " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back "
            "again.";
        return encode(t, noise, n);
    }
    size_t len;
    char* text = read_file(path, &len);
    int* ids = tokenizer_encode(t, text, len, n);
    free(text);
    if (*n < 64) fatal("%s: a haystack needs at least 64 tokens, this text has %zu", path, *n);
    return ids;
}

/* Does token id end a sentence (its text ends with '.', '!' or '?', maybe before spaces)? */
static int ends_sentence(const Tokenizer* t, int id) {
    size_t len;
    char* s = tokenizer_decode(t, &id, 1, &len);
    while (len && (s[len - 1] == ' ' || s[len - 1] == '\n')) len--;
    const int end = len && strchr(".!?", s[len - 1]) != NULL;
    free(s);
    return end;
}

static void niah_key(char* out, size_t n, Rng* rng) {
    const int a = (int)(rng_u64(rng) % NIAH_NWORDS);
    int b = (int)(rng_u64(rng) % (NIAH_NWORDS - 1));
    b += b >= a;
    snprintf(out, n, "%s-%s", niah_words[a], niah_words[b]);
}

static void niah_value(char* out, size_t n, Retrieval task, Rng* rng) {
    if (task == TASK_NIAH_WORD)
        snprintf(out, n, "%s", niah_words[rng_u64(rng) % NIAH_NWORDS]);
    else
        snprintf(out, n, "%d", 1000000 + (int)(rng_u64(rng) % 9000000));
}

/* A needle task's prompt of exactly `len` tokens (the answer's tokens after it) with the target
 * needle at `depth` of the haystack; *first is where the answer starts; *answer gets the value. */
static int* niah_sequence(const Tokenizer* t, Retrieval task, const int* hay, size_t nhay, int len,
                          double depth, Rng* rng, size_t* n, size_t* first, char* answer,
                          size_t answer_cap) {
    const char* kind = task == TASK_NIAH_WORD ? "word" : "number";
    const int nneedles = task == TASK_NIAH_MULTIKEY ? 4 : 1;
    char keys[4][64], vals[4][32], text[512];
    for (int k = 0; k < nneedles; k++) {
        do niah_key(keys[k], sizeof keys[k], rng);
        while (k && !strcmp(keys[k], keys[0]));
        niah_value(vals[k], sizeof vals[k], task, rng);
    }
    snprintf(answer, answer_cap, "%s", vals[0]);
    snprintf(text, sizeof text,
             "Some special magic %ss are hidden within the following text. Make sure to memorize "
             "it. I will quiz you about the %ss afterwards.\n",
             kind, kind);
    size_t nintro, nq, na, nn[4], need = 0;
    int* intro = encode(t, text, &nintro);
    snprintf(text, sizeof text,
             "\nWhat is the special magic %s for %s mentioned in the provided text? The special "
             "magic %s for %s mentioned in the provided text is",
             kind, keys[0], kind, keys[0]);
    int* q = encode(t, text, &nq);
    snprintf(text, sizeof text, " %s", vals[0]);
    int* ans = encode(t, text, &na);
    int* needle[4];
    for (int k = 0; k < nneedles; k++) {
        snprintf(text, sizeof text, " One of the special magic %ss for %s is: %s.", kind, keys[k],
                 vals[k]);
        needle[k] = encode(t, text, &nn[k]);
        need += nn[k];
    }
    const long body = (long)len - (long)(nintro + nq + need);
    if (body < 16)
        fatal("eval passkey --task %s: length %d is too short for the prompt (%zu tokens)",
              task_names[task], len, nintro + nq + need + 16);
    /* where each needle goes in the body: the target at depth, distractors anywhere, each moved
     * forward to just after a sentence end (within 64 tokens) */
    long at[4];
    for (int k = 0; k < nneedles; k++) {
        const double d = k ? (double)(rng_u64(rng) % 1001) / 1000 : depth;
        long p = lround(d * (double)body);
        for (int s = 0; s < 64 && p > 0 && p < body && !ends_sentence(t, hay[(p - 1) % nhay]); s++)
            p++;
        at[k] = p < body ? p : body;
    }
    int* ids = mallocCheck(sizeof(int) * ((size_t)len + na));
    size_t o = 0;
    memcpy(ids, intro, sizeof(int) * nintro);
    o = nintro;
    for (long p = 0; p <= body; p++) {
        for (int k = 0; k < nneedles; k++)
            if (at[k] == p) memcpy(ids + o, needle[k], sizeof(int) * nn[k]), o += nn[k];
        if (p < body) ids[o++] = hay[p % (long)nhay];
    }
    memcpy(ids + o, q, sizeof(int) * nq);
    o += nq;
    *first = o;
    memcpy(ids + o, ans, sizeof(int) * na);
    *n = o + na;
    free(intro), free(q), free(ans);
    for (int k = 0; k < nneedles; k++) free(needle[k]);
    return ids;
}

int cmd_eval_passkey(int argc, char** argv) {
    const char *model = NULL, *tok_path = NULL, *router = NULL, *modes_s = NULL, *out = NULL;
    const char *lora = NULL, *task_s = "passkey", *haystack = NULL;
    const char *lengths_s = "1024,2048,4096,8192", *depths_s = "0,0.25,0.5,0.75,1";
    int trials = 2;
    CliList sets = {0};
    if (cli_parse("eval passkey", argc, argv, 2, passkey_usage,
                  "--model:s --tokenizer:s --router:s --modes:s --lengths:s --depths:s "
                  "--trials:i[1,1000] "
                  "--set:* --out:s --lora:s --task:s --haystack:s",
                  &model, &tok_path, &router, &modes_s, &lengths_s, &depths_s, &trials, &sets, &out,
                  &lora, &task_s, &haystack))
        return 0;
    int task = -1;
    for (int i = 0; i < 4; i++)
        if (!strcmp(task_s, task_names[i])) task = i;
    if (task < 0)
        fatal("eval passkey: unknown --task '%s' (passkey, niah_number, niah_word, niah_multikey)",
              task_s);
    if (haystack && task == TASK_PASSKEY)
        fatal("eval passkey: --haystack is for the niah tasks (the passkey has its own filler)");
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
    const int nm = load_for_modes(&m, &info, model, router, lora, &sets, modes_s, modes_buf, modes,
                                  lens, nl, 64, "eval passkey: length");
    const FocusConfig keep = m.fc;
    Tokenizer* tok = tokenizer_load(tok_path ? tok_path : model);
    size_t nhay = 0;
    int* hay = task == TASK_PASSKEY ? NULL : niah_haystack(tok, haystack, &nhay);
    char* tsv = NULL;
    size_t tsv_len = 0;
    FILE* ts = open_memstream(&tsv, &tsv_len);
    fprintf(ts, "mode\tlength\tdepth\ttrial\tkey\tretrieved\ttask\n");
    printf("model %s (%s), %s retrieval%s%s, %d trials per cell\n", info.name, info.format,
           task_names[task], hay ? " in " : "", hay ? (haystack ? haystack : "noise") : "", trials);
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
                    char answer[32];
                    snprintf(answer, sizeof answer, "%d", key);
                    int* ids =
                        task == TASK_PASSKEY
                            ? passkey_sequence(tok, (int)lens[l], depths[d], key, &n, &first)
                            : niah_sequence(tok, (Retrieval)task, hay, nhay, (int)lens[l],
                                            depths[d], &rng, &n, &first, answer, sizeof answer);
                    double ll;
                    int greedy;
                    eval_continuations(&m, &ids, &n, &first, 1, &ll, &greedy);
                    free(ids);
                    ok += greedy;
                    fprintf(ts, "%s\t%d\t%g\t%d\t%s\t%d\t%s\n", modes[k], (int)lens[l], depths[d],
                            r, answer, greedy, task_names[task]);
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
    free(hay);
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
    const int nm = load_for_modes(&m, &info, model, router, lora, &sets, modes_s, modes_buf, modes,
                                  ctxs, nc, 2, "eval curve: --ctx");
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
    const double t0 = now_seconds();
    for (int k = 0; k < nm; k++) {
        m.fc = keep;
        cli_set_mode(&m, modes[k], router != NULL);
        printf("| %s |", modes[k]);
        for (int c = 0; c < nc; c++) {
            const int ctx = (int)ctxs[c];
            PplResult r = eval_perplexity(&m, ids, n, ctx, ctx, 1);
            const double ppl = exp(r.nll / r.count);
            if (attn_is_sparse(m.fc.attn))
                printf(" %.3f (%.2f of pairs) |", ppl, r.kept);
            else
                printf(" %.3f |", ppl);
            fflush(stdout);
            fprintf(ts, "%s\t%d\t%.6f\t%.6f\t%.1f\n", modes[k], ctx, ppl,
                    attn_is_sparse(m.fc.attn) ? r.kept : 1.0, (double)r.count / r.seconds);
            /* progress on stderr: a curve at long context runs for hours on a CPU */
            const int done = k * nc + c + 1;
            fprintf(stderr, "[eval curve: %d of %d done (%s at ctx %d), %.0f s]\n", done, nm * nc,
                    modes[k], ctx, now_seconds() - t0);
        }
        printf("\n");
    }
    write_table(ts, &tsv, out);
    free(ids);
    model_free(&m);
    return 0;
}
