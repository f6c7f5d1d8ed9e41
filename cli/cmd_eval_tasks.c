/* cmd_eval_tasks.c: `focus eval tasks`, zero-shot (or k-shot) accuracy on LAMBADA, ARC, PIQA and
 * HellaSwag with the prompt formats and metrics of lm-evaluation-harness (data/tasks.h).
 *
 * Each continuation is scored like the harness's loglikelihood requests: context and
 * context + continuation are tokenized, the continuation's tokens are what the whole text has
 * beyond the context's tokens, and their log-probabilities are summed (no BOS token, the
 * harness's default). acc picks the continuation with the highest sum, acc_norm the highest sum
 * per character of the continuation (without its leading space); LAMBADA's acc asks that every
 * continuation token be the greedy choice, and its perplexity is exp(-mean log-likelihood) over
 * items. An item's continuations run as one batch (padding to the longest; causal attention
 * keeps the padding out of every scored position). */
#define _GNU_SOURCE /* strtok_r */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "../data/tasks.h"
#include "../data/tokenizer.h"
#include "../io/io.h"
#include "cli.h"
#include "commands.h"
#include "../eval/evaluate.h"

static const char tasks_usage[] =
    "usage: focus eval tasks --model M [--tokenizer T] [--tasks "
    "lambada,arc_easy,arc_challenge,piqa,"
    "hellaswag]\n"
    "                        [--data-dir DIR] [--task NAME=FILE[,FILE...]]... [--limit n] [--shots "
    "k]\n"
    "                        [--ctx n] [--router router.h5 [--attn soft|hard] [--topk k]]\n"
    "                        [--set key=value]... [--lora lora.h5] [--out results.json]\n"
    "                        [--details items.jsonl]\n"
    "Zero-shot accuracy with lm-evaluation-harness's prompts and metrics (acc, acc_norm; LAMBADA:\n"
    "last-word accuracy and perplexity). Files: --data-dir (default ../shared/data/evals) holds\n"
    "lambada/lambada_test.shared.jsonl, arc/ARC-Easy-Dev.jsonl, arc/ARC-Challenge-Dev.jsonl,\n"
    "piqa/valid.jsonl (+ valid-labels.lst), hellaswag/hellaswag_val_full.part{1,2,3}.txt; --task\n"
    "NAME=FILE reads another file of the same format (without --tasks, the --task names are the\n"
    "tasks run). --limit n: the first n items of each task (0, the default: all of them).\n"
    "--shots k: k solved items of the same task (fixed choice, never the item itself) before each\n"
    "question, separated by blank lines, as the harness's few-shot prompts; long prompts are "
    "where\n"
    "the router acts (it leaves every pair within the window w alone). --ctx: the longest input\n"
    "(default the model's context; longer prompts lose their oldest tokens). The report gives the\n"
    "share of items longer than the window. --out writes every number as JSON, --details one line\n"
    "per item with each continuation's log-likelihood.\n";

/* Default file names under --data-dir (hellaswag: three parts). */
static int default_files(const char* dir, const char* name, char paths[3][4096]) {
    if (!strcmp(name, "lambada")) {
        snprintf(paths[0], 4096, "%s/lambada/lambada_test.shared.jsonl", dir);
    } else if (!strcmp(name, "arc_easy")) {
        snprintf(paths[0], 4096, "%s/arc/ARC-Easy-Dev.jsonl", dir);
    } else if (!strcmp(name, "arc_challenge")) {
        snprintf(paths[0], 4096, "%s/arc/ARC-Challenge-Dev.jsonl", dir);
    } else if (!strcmp(name, "piqa")) {
        snprintf(paths[0], 4096, "%s/piqa/valid.jsonl", dir);
    } else if (!strcmp(name, "hellaswag")) {
        for (int i = 0; i < 3; i++)
            snprintf(paths[i], 4096, "%s/hellaswag/hellaswag_val_full.part%d.txt", dir, i + 1);
        return 3;
    } else {
        fatal("eval tasks: unknown task '%s' (lambada, arc_easy, arc_challenge, piqa, hellaswag)",
              name);
    }
    return 1;
}

typedef struct {
    int n, long_items;
    double acc, acc_norm; /* sums of 0/1 until the end, then means */
    double ll_sum;        /* LAMBADA: summed continuation log-likelihood */
    double tokens;        /* summed prompt tokens (context + longest continuation) */
    double seconds;
} TaskScore;

/* Unicode characters of s (UTF-8), the harness's len(). */
static size_t utf8_chars(const char* s) {
    size_t n = 0;
    for (; *s; s++) n += ((unsigned char)*s & 0xc0) != 0x80;
    return n;
}

/* The prompt of item i: `shots` other items with their gold continuation, then its context. */
static char* item_prompt(const TaskSet* ts, int i, int shots, Rng* rng) {
    size_t cap = 1024, len = 0;
    char* p = mallocCheck(cap);
    p[0] = 0;
    for (int s = 0; s < shots && ts->n > 1; s++) {
        int j = (int)(rng_u64(rng) % (uint64_t)(ts->n - 1));
        if (j >= i) j++; /* never the item itself */
        const TaskItem* e = &ts->items[j];
        size_t need = len + strlen(e->context) + strlen(e->choices[e->gold]) + 3;
        if (need > cap) p = reallocCheck(p, cap = 2 * need);
        len += (size_t)sprintf(p + len, "%s%s\n\n", e->context, e->choices[e->gold]);
    }
    const char* c = ts->items[i].context;
    if (len + strlen(c) + 1 > cap) p = reallocCheck(p, len + strlen(c) + 1);
    strcpy(p + len, c);
    return p;
}

/* Score one item: ll[c] = summed log-probabilities of continuation c, greedy[c] = every one of
 * its tokens is the argmax. Returns the prompt length in tokens (context + longest). */
static int score_item(Model* m, const Tokenizer* tok, const char* prompt, const TaskItem* it,
                      int maxlen, double* ll, int* greedy) {
    const int nc = it->nchoices;
    size_t nctx;
    int* ctx = tokenizer_encode(tok, prompt, strlen(prompt), &nctx);
    int** whole = mallocCheck(sizeof(int*) * nc);
    size_t* nw = mallocCheck(sizeof(size_t) * nc);
    size_t* first = mallocCheck(sizeof(size_t) * nc); /* index of the first continuation token */
    int longest = 0;
    for (int c = 0; c < nc; c++) {
        size_t plen = strlen(prompt), clen = strlen(it->choices[c]);
        char* text = mallocCheck(plen + clen + 1);
        memcpy(text, prompt, plen);
        memcpy(text + plen, it->choices[c], clen + 1);
        whole[c] = tokenizer_encode(tok, text, plen + clen, &nw[c]);
        free(text);
        size_t f = nctx < nw[c] ? nctx : nw[c] - 1; /* at least one continuation token */
        if (nw[c] < 2) fatal("eval tasks: an item tokenizes to fewer than 2 tokens");
        if (f == 0) f = 1;
        /* keep the last maxlen + 1 tokens: the oldest context goes first */
        size_t drop = nw[c] > (size_t)maxlen + 1 ? nw[c] - (size_t)maxlen - 1 : 0;
        if (drop > f - 1) fatal("eval tasks: a continuation is longer than --ctx %d", maxlen);
        first[c] = f - drop;
        memmove(whole[c], whole[c] + drop, sizeof(int) * (nw[c] - drop));
        nw[c] -= drop;
        if ((int)nw[c] > longest) longest = (int)nw[c];
    }
    eval_continuations(m, whole, nw, first, nc, ll, greedy);
    for (int c = 0; c < nc; c++) free(whole[c]);
    free(whole), free(nw), free(first), free(ctx);
    return longest;
}

static TaskScore run_task(Model* m, const Tokenizer* tok, const TaskSet* ts, int limit, int shots,
                          int maxlen, FILE* details) {
    TaskScore r = {0};
    const int n = limit > 0 && limit < ts->n ? limit : ts->n;
    double* ll = mallocCheck(sizeof(double) * 8);
    int* greedy = mallocCheck(sizeof(int) * 8);
    double t0 = now_seconds();
    for (int i = 0; i < n; i++) {
        const TaskItem* it = &ts->items[i];
        if (it->nchoices > 8)
            fatal("%s: item %d has %d choices (at most 8)", ts->name, i, it->nchoices);
        Rng rng;
        rng_seed(&rng, 1234 + (uint64_t)i);
        char* prompt = item_prompt(ts, i, shots, &rng);
        int len = score_item(m, tok, prompt, it, maxlen, ll, greedy);
        free(prompt);
        r.tokens += len;
        r.long_items += len > m->fc.w + 1;
        if (ts->kind == TASK_LAMBADA) {
            r.acc += greedy[0];
            r.ll_sum += ll[0];
        } else {
            int best = 0, best_norm = 0;
            for (int c = 1; c < it->nchoices; c++) {
                if (ll[c] > ll[best]) best = c;
                double a = ll[c] / (double)utf8_chars(it->choices[c] + 1);
                double b = ll[best_norm] / (double)utf8_chars(it->choices[best_norm] + 1);
                if (a > b) best_norm = c;
            }
            r.acc += best == it->gold;
            r.acc_norm += best_norm == it->gold;
        }
        if (details) {
            fprintf(details,
                    "{\"task\": \"%s\", \"item\": %d, \"gold\": %d, \"tokens\": %d, \"ll\": [",
                    ts->name, i, it->gold, len);
            for (int c = 0; c < it->nchoices; c++) fprintf(details, c ? ", %.6f" : "%.6f", ll[c]);
            fprintf(details, "]%s}\n",
                    ts->kind == TASK_LAMBADA ? (greedy[0] ? ", \"greedy\": 1" : ", \"greedy\": 0")
                                             : "");
        }
        r.n = i + 1;
        fprintf(stderr, "\r  %s: %d / %d items, acc %.4f", ts->name, r.n, n, r.acc / r.n);
        fflush(stderr);
    }
    fprintf(stderr, "\n");
    r.seconds = now_seconds() - t0;
    r.acc /= r.n;
    r.acc_norm /= r.n;
    free(ll), free(greedy);
    return r;
}

/* Standard error of a mean of 0/1 outcomes, as the harness reports it. */
static double binom_se(double p, int n) { return n > 1 ? sqrt(p * (1 - p) / (n - 1)) : 0; }

int cmd_eval_tasks(int argc, char** argv) {
    const char *model = NULL, *tok_path = NULL, *tasks = NULL;
    const char *data_dir = "../shared/data/evals", *router = NULL, *attn = NULL, *topk = NULL;
    const char *out = NULL, *details_path = NULL, *lora = NULL;
    int limit = 0, shots = 0, ctx = 0;
    CliList sets = {0}, files = {0};
    if (cli_parse(
            "eval tasks", argc, argv, 2, tasks_usage,
            "--model:s --tokenizer:s --tasks:s --data-dir:s --task:* --limit:i --shots:i[0,1000] "
            "--ctx:i[2,1048576] --router:s --attn:s --topk:s --set:* --out:s --details:s --lora:s",
            &model, &tok_path, &tasks, &data_dir, &files, &limit, &shots, &ctx, &router, &attn,
            &topk, &sets, &out, &details_path, &lora))
        return 0;
    if (!model) fatal("eval tasks: needs --model");
    if (limit < 0 || shots < 0 || ctx < 0)
        fatal("eval tasks: --limit, --shots and --ctx must be >= 0");
    /* read every task file before the model: a wrong file fails at once, with no result file */
    char list[1024];
    if (tasks) {
        snprintf(list, sizeof list, "%s", tasks);
    } else if (files.n) { /* the tasks given files */
        list[0] = 0;
        for (int i = 0; i < files.n; i++) {
            char key[64];
            config_split_setting(files.v[i], key, sizeof key);
            size_t used = strlen(list);
            snprintf(list + used, sizeof list - used, "%s%s", used ? "," : "", key);
        }
    } else {
        snprintf(list, sizeof list, "lambada,arc_easy,arc_challenge,piqa,hellaswag");
    }
    for (int i = 0; i < files.n; i++) { /* a --task for a task that is not run is a mistake */
        char key[64], padded[1100], want[80];
        config_split_setting(files.v[i], key, sizeof key);
        snprintf(padded, sizeof padded, ",%s,", list);
        snprintf(want, sizeof want, ",%s,", key);
        if (!strstr(padded, want))
            fatal("eval tasks: --task %s: %s is not among the tasks run (%s)", files.v[i], key,
                  list);
    }
    TaskSet sets_[8];
    int ntasks = 0;
    char* save = NULL;
    for (char* name = strtok_r(list, ",", &save); name; name = strtok_r(NULL, ",", &save)) {
        if (ntasks == 8) fatal("eval tasks: at most 8 tasks");
        char paths[3][4096];
        const char* p[3];
        int np = 0;
        for (int i = 0; i < files.n; i++) { /* --task NAME=FILE[,FILE] */
            char key[64];
            const char* v = config_split_setting(files.v[i], key, sizeof key);
            if (strcmp(key, name)) continue;
            np = 0;
            const char* s = v;
            while (*s) {
                if (np == 3) fatal("--task %s: at most 3 files", files.v[i]);
                const char* comma = strchr(s, ',');
                size_t l = comma ? (size_t)(comma - s) : strlen(s);
                snprintf(paths[np], 4096, "%.*s", (int)l, s);
                np++;
                s = comma ? comma + 1 : s + l;
            }
        }
        if (!np) np = default_files(data_dir, name, paths);
        for (int i = 0; i < np; i++) p[i] = paths[i];
        taskset_load(&sets_[ntasks++], name, p, np);
    }
    if (!ntasks) fatal("eval tasks: no task given");
    Model m;
    ModelInfo info;
    cli_open_model(&m, &info,
                   &(ModelRequest){.model = model,
                                   .router = router,
                                   .attn = attn,
                                   .topk = topk,
                                   .sets = &sets,
                                   .lora = lora});
    free(sets.v);
    free(files.v);
    const int maxlen = ctx ? ctx : m.cfg.maxT;
    cli_check_context(&m, maxlen, "eval tasks", "--ctx");
    Tokenizer* tok = tokenizer_load(tok_path ? tok_path : model);
    FILE* details = NULL;
    char details_tmp[4200];
    if (details_path) {
        snprintf(details_tmp, sizeof details_tmp, "%s.tmp", details_path);
        details = fopen(details_tmp, "w");
        if (!details) fatal("%s: cannot create", details_tmp);
    }
    char mode[1400];
    cli_attention_desc(&m, mode, sizeof mode);
    printf("model %s (%s)  attention %s  %d-shot\n", info.name, info.format, mode, shots);
    printf("| task | items | acc | acc_norm | items longer than w=%d | mean tokens | s |\n",
           m.fc.w);
    printf("|---|---|---|---|---|---|---|\n");
    cJSON* root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "model", model);
    cJSON_AddStringToObject(root, "router", router ? router : "");
    cJSON_AddStringToObject(root, "attention", mode);
    cJSON_AddNumberToObject(root, "shots", shots);
    cJSON* jt = cJSON_AddObjectToObject(root, "tasks");
    for (int k = 0; k < ntasks; k++) {
        const TaskSet* ts = &sets_[k];
        TaskScore r = run_task(&m, tok, ts, limit, shots, maxlen, details);
        double share = (double)r.long_items / r.n;
        cJSON* o = cJSON_AddObjectToObject(jt, ts->name);
        cJSON_AddNumberToObject(o, "n", r.n);
        cJSON_AddNumberToObject(o, "acc", r.acc);
        cJSON_AddNumberToObject(o, "acc_stderr", binom_se(r.acc, r.n));
        if (ts->kind == TASK_LAMBADA) {
            const double ppl = exp(-r.ll_sum / r.n);
            cJSON_AddNumberToObject(o, "perplexity", ppl);
            printf("| %s | %d | %.4f ± %.4f | (perplexity %.3f) | %.3f | %.0f | %.0f |\n", ts->name,
                   r.n, r.acc, binom_se(r.acc, r.n), ppl, share, r.tokens / r.n, r.seconds);
        } else {
            cJSON_AddNumberToObject(o, "acc_norm", r.acc_norm);
            cJSON_AddNumberToObject(o, "acc_norm_stderr", binom_se(r.acc_norm, r.n));
            printf("| %s | %d | %.4f ± %.4f | %.4f ± %.4f | %.3f | %.0f | %.0f |\n", ts->name, r.n,
                   r.acc, binom_se(r.acc, r.n), r.acc_norm, binom_se(r.acc_norm, r.n), share,
                   r.tokens / r.n, r.seconds);
        }
        cJSON_AddNumberToObject(o, "long_share", share);
        cJSON_AddNumberToObject(o, "mean_tokens", r.tokens / r.n);
        cJSON_AddNumberToObject(o, "seconds", r.seconds);
        fflush(stdout);
    }
    char* json = cJSON_Print(root);
    cJSON_Delete(root);
    if (out) {
        const void* parts[2] = {json, "\n"};
        const size_t sizes[2] = {strlen(json), 1};
        write_file_atomic(out, parts, sizes, 2);
    }
    if (details) {
        fclose_checked(details, details_tmp);
        if (rename(details_tmp, details_path)) fatal("%s: rename failed", details_path);
    }
    free(json);
    for (int k = 0; k < ntasks; k++) taskset_free(&sets_[k]);
    tokenizer_free(tok);
    model_free(&m);
    return 0;
}
