/* runconfig.c: INI parsing (libinih) and serialisation of run settings (see runconfig.h). */
#include "runconfig.h"

#include "cli.h"

#include <ini.h>
#include <string.h>

void runconfig_default(RunConfig* rc) {
    memset(rc, 0, sizeof(*rc));
    rc->val_fraction = 0.05f;
    rc->B = 4, rc->T = 1024, rc->grad_accum = 1, rc->steps = 100, rc->warmup = 10;
    rc->lr = 1e-2f, rc->min_lr_frac = 0.1f, rc->beta1 = 0.9f, rc->beta2 = 0.95f,
    rc->adam_eps = 1e-8f;
    rc->weight_decay = 0, rc->clip = 1.0f;
    rc->eval_every = 50, rc->eval_tokens = 8192, rc->ckpt_every = 50;
    rc->pretrain_steps = 0, rc->pretrain_B = 8, rc->pretrain_lr = 3e-3f;
    strcpy(rc->objective, "lm");
    rc->attn_weight = 1.0f;
    model_config_preset("tiny-llama", &rc->mcfg);
    focus_config_default(&rc->fc);
    rc->fc.routing = ROUTE_SINKHORN;
    rc->fc.attn = ATTN_SOFT;
}

typedef struct {
    const char* name;
    int* i;
    float* f;
    char* s;
} Key;

static int set_key(RunConfig* rc, const char* name, const char* value) {
    Key keys[] = {
        {"model", 0, 0, rc->model},
        {"tokenizer", 0, 0, rc->tokenizer},
        {"train", 0, 0, rc->train},
        {"val", 0, 0, rc->val},
        {"val_fraction", 0, &rc->val_fraction, 0},
        {"B", &rc->B, 0, 0},
        {"T", &rc->T, 0, 0},
        {"grad_accum", &rc->grad_accum, 0, 0},
        {"steps", &rc->steps, 0, 0},
        {"warmup", &rc->warmup, 0, 0},
        {"lr", 0, &rc->lr, 0},
        {"min_lr_frac", 0, &rc->min_lr_frac, 0},
        {"beta1", 0, &rc->beta1, 0},
        {"beta2", 0, &rc->beta2, 0},
        {"adam_eps", 0, &rc->adam_eps, 0},
        {"weight_decay", 0, &rc->weight_decay, 0},
        {"clip", 0, &rc->clip, 0},
        {"eval_every", &rc->eval_every, 0, 0},
        {"eval_tokens", &rc->eval_tokens, 0, 0},
        {"ckpt_every", &rc->ckpt_every, 0, 0},
        {"pretrain_steps", &rc->pretrain_steps, 0, 0},
        {"pretrain_B", &rc->pretrain_B, 0, 0},
        {"pretrain_lr", 0, &rc->pretrain_lr, 0},
        {"attn_weight", 0, &rc->attn_weight, 0},
    };
    if (!strcmp(name, "objective")) {
        if (strcmp(value, "lm") && strcmp(value, "kl") && strcmp(value, "attn") &&
            strcmp(value, "kl+attn"))
            return -2;
        strcpy(rc->objective, value);
        return 0;
    }
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
        if (strcmp(keys[k].name, name)) continue;
        char* end;
        if (keys[k].s) {
            if (strlen(value) >= 1024) return -2;
            strcpy(keys[k].s, value);
        } else if (keys[k].i) {
            long v = strtol(value, &end, 10);
            if (end == value || *end) return -2;
            *keys[k].i = (int)v;
        } else {
            double v = strtod(value, &end);
            if (end == value || *end) return -2;
            *keys[k].f = (float)v;
        }
        return 0;
    }
    return config_set(&rc->mcfg, &rc->fc, name, value);
}

typedef struct {
    RunConfig* rc;
    const char* what;
} Ctx;

static int run_ini_handler(void* user, const char* section, const char* name, const char* value) {
    Ctx* c = user;
    int r = set_key(c->rc, name, value);
    if (r == -1) fatal("%s: [%s] unknown setting '%s'", c->what, section, name);
    if (r == -2) fatal("%s: [%s] bad value '%s' for '%s'", c->what, section, value, name);
    return 1;
}

void runconfig_load(RunConfig* rc, const char* path) {
    Ctx c = {rc, path};
    int line = ini_parse(path, run_ini_handler, &c);
    if (line < 0) fatal("%s: cannot open config file", path);
    if (line > 0) fatal("%s: line %d: not a valid INI line", path, line);
}

void runconfig_load_text(RunConfig* rc, const char* text, const char* what) {
    Ctx c = {rc, what};
    int line = ini_parse_string(text, run_ini_handler, &c);
    if (line) fatal("%s: stored configuration is malformed at line %d", what, line);
}

void runconfig_set(RunConfig* rc, const char* kv) {
    char key[128];
    const char* value = cli_split_set(kv, key, sizeof key);
    const char* dot = strchr(key, '.');
    const char* name = dot ? dot + 1 : key; /* "section.key" or "key" */
    int r = set_key(rc, name, value);
    if (r == -1) fatal("--set: unknown setting '%s'", key);
    if (r == -2) fatal("--set: bad value '%s' for '%s'", value, key);
}

char* runconfig_text(const RunConfig* rc) {
    size_t cap = 8192;
    char* s = mallocCheck(cap);
    const ModelConfig* m = &rc->mcfg;
    const FocusConfig* f = &rc->fc;
    char topk[32], dense[1024];
    snprintf(s, cap,
             "[model]\nmodel = %s\ntokenizer = %s\narch = %s\nL = %d\nC = %d\nNH = %d\nNKV = %d\nF "
             "= %d\nV = %d\n"
             "maxT = %d\neps = %.9g\nrope_theta = %.9g\nqkv_bias = %d\ntied = %d\n"
             "[data]\ntrain = %s\nval = %s\nval_fraction = %.9g\n"
             "[train]\nB = %d\nT = %d\ngrad_accum = %d\nsteps = %d\nwarmup = %d\nlr = "
             "%.9g\nmin_lr_frac = %.9g\n"
             "beta1 = %.9g\nbeta2 = %.9g\nadam_eps = %.9g\nweight_decay = %.9g\nclip = "
             "%.9g\neval_every = %d\n"
             "eval_tokens = %d\nckpt_every = %d\npretrain_steps = %d\npretrain_B = %d\npretrain_lr "
             "= %.9g\nobjective = %s\nattn_weight = %.9g\n"
             "[focus]\nK = %d\ndg = %d\ntau = %.9g\niters = %d\nw = %d\nlambda = %.9g\nb = "
             "%.9g\nrouting = %s\n"
             "topk = %s\nsinks = %d\ndense_layers = %s\nlearn_gate = %d\nbeta_momentum = "
             "%.9g\nbeta_balance = %d\nseed = %llu\n",
             rc->model, rc->tokenizer, m->arch == ARCH_GPT2 ? "gpt2" : "llama", m->L, m->C, m->NH,
             m->NKV, m->F, m->V, m->maxT, (double)m->eps, (double)m->rope_theta, m->qkv_bias,
             m->tied, rc->train, rc->val, (double)rc->val_fraction, rc->B, rc->T, rc->grad_accum,
             rc->steps, rc->warmup, (double)rc->lr, (double)rc->min_lr_frac, (double)rc->beta1,
             (double)rc->beta2, (double)rc->adam_eps, (double)rc->weight_decay, (double)rc->clip,
             rc->eval_every, rc->eval_tokens, rc->ckpt_every, rc->pretrain_steps, rc->pretrain_B,
             (double)rc->pretrain_lr, rc->objective, (double)rc->attn_weight, f->K, f->dg,
             (double)f->tau, f->iters, f->w, (double)f->lambda, (double)f->bias,
             routing_name(f->routing), focus_topk_str(f, topk), f->sinks,
             focus_dense_layers_str(f, dense, sizeof dense), f->learn_gate,
             (double)f->beta_momentum, f->beta_balance, (unsigned long long)f->seed);
    return s;
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
