/* runconfig.c: INI parsing (libinih) and serialisation of run settings (see runconfig.h). */
#define _GNU_SOURCE /* open_memstream */
#include "runconfig.h"

#include <errno.h>
#include <ini.h>
#include <sys/stat.h>
#include <limits.h>
#include <stddef.h>
#include <string.h>

#include "../io/io.h"

/* The run's own settings, in the columns of settings.h; the [model] shape and [focus] router
 * rows come from MODEL_SETTINGS and FOCUS_SETTINGS. Written in this order, section by section. */
#define RUN_SETTINGS(X)                                                                          \
    X(model, model, STR, model, "", 0, 0, 0, "model file, or scratch (trained here first)")      \
    X(model, tokenizer, STR, tokenizer, "", 0, 0, 0, "tokenizer (default: the model file)")      \
    X(model, weights, STR, weights, "fp32", 0, 0, 0,                                             \
      "frozen weights: fp32, or bf16 (the projections, CPU)")                                    \
    X(data, train, STR, train, "", 0, 0, 0,                                                      \
      "training data: shard folder or file, text folder or file")                                \
    X(data, val, STR, val, "", 0, 0, 0, "validation data (default: the end of train)")           \
    X(data, val_fraction, FLOAT, val_fraction, "0.05", 0, 0.5, 0,                                \
      "held-out share of train when val is empty (0: needs val)")                                \
    X(data, rehearse, STR, rehearse, "", 0, 0, 0,                                                \
      "mass: text the router was trained on before (rehearse_windows of it beside train)")       \
    X(train, B, INT, B, "4", 1, 65536, 0, "sequences per micro-batch")                           \
    X(train, T, INT, T, "1024", 2, 4194304, 0, "sequence length")                                \
    X(train, grad_accum, INT, grad_accum, "1", 1, 65536, 0, "micro-batches per step")            \
    X(train, steps, INT, steps, "100", 1, 1e9, 0, "optimizer steps")                             \
    X(train, warmup, INT, warmup, "10", 0, 1e9, 0, "linear warmup steps")                        \
    X(train, lr, FLOAT, lr, "0.01", 0, 1000, 0, "peak learning rate (cosine decay)")             \
    X(train, min_lr_frac, FLOAT, min_lr_frac, "0.1", 0, 1, 0, "final learning rate / lr")        \
    X(train, beta1, FLOAT, beta1, "0.9", 0, 0.9999999, 0, "AdamW beta1")                         \
    X(train, beta2, FLOAT, beta2, "0.95", 0, 0.9999999, 0, "AdamW beta2")                        \
    X(train, adam_eps, FLOAT, adam_eps, "1e-8", 1e-30, 1, 0, "AdamW epsilon")                    \
    X(train, weight_decay, FLOAT, weight_decay, "0", 0, 1000, 0, "AdamW weight decay")           \
    X(train, clip, FLOAT, clip, "1", 0, 1e9, 0, "global gradient-norm clip (0: off)")            \
    X(train, eval_every, INT, eval_every, "50", 1, 1e9, 0,                                       \
      "steps between validation perplexities")                                                   \
    X(train, eval_tokens, INT, eval_tokens, "8192", 0, INT_MAX, 0,                               \
      "validation tokens evaluated (0: all)")                                                    \
    X(train, ckpt_every, INT, ckpt_every, "50", 1, 1e9, 0, "steps between checkpoints")          \
    X(train, pretrain_steps, INT, pretrain_steps, "0", 0, 1e9, 0,                                \
      "scratch models: pretraining steps")                                                       \
    X(train, pretrain_B, INT, pretrain_B, "8", 1, 65536, 0, "scratch models: pretraining batch") \
    X(train, pretrain_lr, FLOAT, pretrain_lr, "0.003", 0, 1000, 0,                               \
      "scratch models: pretraining lr")                                                          \
    X(train, objective, OBJECTIVE, objective, "lm", 0, 0, 0,                                     \
      "lm | kl | attn | kl+attn (METHOD.md 9) | mass (docs/OBJECTIVE.md)")                       \
    X(train, attn_weight, FLOAT, attn_weight, "1", 0, 1e6, 0, "weight of the attn term")         \
    X(train, init_router, STR, init_router, "", 0, 0, 0,                                         \
      "start from this router.h5 (its W_g, C, beta; same shape): domain adaptation")             \
    X(train, anchor, FLOAT, anchor, "0", 0, 1e6, 0,                                              \
      "with init_router: each step also pulls the router back toward it, by lr x anchor x the "  \
      "difference (L2-SP: adapting to new text without leaving the old)")                        \
    X(train, mass_windows, INT, mass_windows, "16", 1, 1e6, 0,                                   \
      "mass: windows of T tokens whose dense attention is the teacher")                          \
    X(train, mass_every, INT, mass_every, "4", 1, 1e6, 0,                                        \
      "mass: one query tile of 64 rows in this many is a teacher query")                         \
    X(train, mass_keys, INT, mass_keys, "64", 1, 65536, 0,                                       \
      "mass: the far keys of most dense mass kept per teacher query")                            \
    X(train, mass_gate, INT, mass_gate, "0", 0, 1, 0,                                            \
      "mass: 1 scores pairs by the soft gate (lambda, b), 0 by the affinity G_i . G_j itself")   \
    X(train, mass_pairs, INT, mass_pairs, "32", 0, 65536, 0,                                     \
      "mass: random far keys per query that measure the pairs kept (0: mass term only)")         \
    X(train, mass_selector, STR, mass_selector, "", 0, 0, 0,                                     \
      "mass: a block selector (fit-blocks); the teacher is then the mass its blocks miss")       \
    X(train, mass_blocks, INT, mass_blocks, "8", 1, 65536, 0,                                    \
      "mass: blocks per query of mass_selector the teacher leaves out")                          \
    X(train, mass_values, INT, mass_values, "0", 0, 3, 0,                                        \
      "mass: 1 scores a missed key by the output it restores, 2 also the harm, 3 the residual "  \
      "stream's error it closes (and the harm), 0 by its mass")                                  \
    X(train, rehearse_windows, INT, rehearse_windows, "0", 0, 1e6, 0,                            \
      "mass: teacher windows from rehearse beside train's mass_windows (adapt to a new text, "   \
      "still learning the old)")                                                                 \
    X(finetune, method, STR, method, "lora", 0, 0, 0, "focus finetune: lora, full or joint")     \
    X(finetune, lora_rank, INT, lora_rank, "8", 1, 65536, 0, "LoRA rank")                        \
    X(finetune, lora_alpha, FLOAT, lora_alpha, "16", 1e-6, 1e6, 0,                               \
      "LoRA update scale: alpha / rank")                                                         \
    X(finetune, lora_targets, STR, lora_targets, "qkv,o", 0, 0, 0, "LoRA on: qkv, o, fc, fcproj")

#define RUN_ROW(sec, nm, ty, fld, def, lo, hi, fl, hp)                                             \
    {#sec, #nm, SETTING_##ty, offsetof(RunConfig, fld), sizeof(((RunConfig*)0)->fld), def, lo, hi, \
     fl,   hp},
static const Setting run_settings[] = {RUN_SETTINGS(RUN_ROW)};
static const int run_settings_count = sizeof run_settings / sizeof run_settings[0];

void runconfig_default(RunConfig* rc) {
    memset(rc, 0, sizeof(*rc));
    settings_defaults(run_settings, run_settings_count, rc);
    model_config_preset("tiny-llama", &rc->mcfg);
    focus_config_default(&rc->fc);
}

static int set_key(RunConfig* rc, const char* name, const char* value) {
    const Setting* s = setting_find(run_settings, run_settings_count, name);
    if (s) return setting_parse(s, rc, value);
    return config_set(&rc->mcfg, &rc->fc, name, value);
}

/* What a value of setting name must be (for messages). */
static const char* expect(const char* name, char* buf, size_t n) {
    const Setting* s = setting_find(run_settings, run_settings_count, name);
    return setting_expect(s ? s : config_find(name), buf, n);
}

typedef struct {
    RunConfig* rc;
    const char* what;
    char err[1024];
} Ctx;

/* The first problem is kept and reported once inih has returned (and freed its line buffer). */
static int run_ini_handler(void* user, const char* section, const char* name, const char* value) {
    Ctx* c = user;
    if (c->err[0]) return 0;
    int r = set_key(c->rc, name, value);
    char w[96];
    if (r == -1)
        snprintf(c->err, sizeof c->err, "%s: [%s] unknown setting '%s'", c->what, section, name);
    else if (r == -2)
        snprintf(c->err, sizeof c->err, "%s: [%s] bad value '%s' for '%s' (expected %s)", c->what,
                 section, value, name, expect(name, w, sizeof w));
    return !c->err[0];
}

/* Parse settings text (what names it in messages). libinih reads a line into a buffer of
 * INI_MAX_LINE (200) bytes and splits a longer one in two, which would change a value silently:
 * such lines are refused first (text settings are limited to fit, setting_parse). */
static void load_text(RunConfig* rc, const char* text, const char* what) {
    int line = 1;
    for (const char* p = text; *p; line++) {
        const char* e = strchr(p, '\n');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n + 3 > INI_MAX_LINE)
            fatal("%s: line %d is %zu bytes long; settings lines hold at most %d", what, line, n,
                  INI_MAX_LINE - 3);
        p += n + (e != NULL);
    }
    Ctx c = {rc, what, ""};
    line = ini_parse_string(text, run_ini_handler, &c);
    if (c.err[0]) fatal("%s", c.err);
    if (line) fatal("%s: line %d: not a valid INI line", what, line);
}

void runconfig_load(RunConfig* rc, const char* path) {
    struct stat st;
    if (stat(path, &st)) fatal("%s: cannot open config file: %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode)) fatal("%s: not a regular file (a config file is expected)", path);
    size_t len;
    char* text = read_file(path, &len);
    if (strlen(text) != len)
        fatal("%s: a config file holds text, this one holds a zero byte", path);
    load_text(rc, text, path);
    free(text);
}

void runconfig_load_text(RunConfig* rc, const char* text, const char* what) {
    load_text(rc, text, what);
}

void runconfig_set(RunConfig* rc, const char* kv) {
    char key[128];
    const char* value = config_split_setting(kv, key, sizeof key);
    const char* dot = strchr(key, '.');
    const char* name = dot ? dot + 1 : key; /* "section.key" or "key" */
    int r = set_key(rc, name, value);
    if (r == -1) fatal("--set: unknown setting '%s'", key);
    char w[96];
    if (r == -2)
        fatal("--set: bad value '%s' for '%s' (expected %s)", value, key,
              expect(name, w, sizeof w));
}

char* runconfig_text(const RunConfig* rc) {
    char* s = NULL;
    size_t n = 0;
    FILE* f = open_memstream(&s, &n);
    if (!f) fatal("out of memory writing the run configuration");
    const char* sections[] = {"model", "data", "train", "focus", "finetune"};
    for (int i = 0; i < 5; i++) {
        fprintf(f, "[%s]\n", sections[i]);
        settings_write(f, run_settings, run_settings_count, rc, sections[i]);
        settings_write(f, model_settings, model_settings_count, &rc->mcfg, sections[i]);
        settings_write(f, focus_settings, focus_settings_count, &rc->fc, sections[i]);
    }
    fclose(f);
    return s;
}

void runconfig_help(FILE* f) {
    settings_help(f, run_settings, run_settings_count);
    settings_help(f, model_settings, model_settings_count);
    settings_help(f, focus_settings, focus_settings_count);
}

void runconfig_objective(const RunConfig* rc, int* kl, int* attn) {
    *kl = !strcmp(rc->objective, "kl") || !strcmp(rc->objective, "kl+attn");
    *attn = !strcmp(rc->objective, "attn") || !strcmp(rc->objective, "kl+attn");
}

void runconfig_print(const RunConfig* rc, FILE* f) {
    char* t = runconfig_text(rc);
    fprintf(f, "+--------------------------------------------------------------+\n");
    for (char* line = strtok(t, "\n"); line; line = strtok(NULL, "\n"))
        fprintf(f, "| %-60s |\n", line);
    fprintf(f, "+--------------------------------------------------------------+\n");
    free(t);
}
