/* runconfig.h: the settings of a retrofit run, read from an INI file (configs/NAME.conf) and
 * `--set key=value` overrides, and written back resolved into RUN_DIR/config.conf. */
#ifndef FOCUS_RUNCONFIG_H
#define FOCUS_RUNCONFIG_H

#include "../model/model.h"

typedef struct {
    char model[1024];     /* a model file, or scratch:PRESET (trained here from scratch first) */
    char tokenizer[1024]; /* default: the model file (GGUF) */
    char weights[8];      /* how the frozen weights are held on the CPU: fp32, or bf16 (the
                           * projections; model_store_bf16) */
    char train[1024];     /* training data: shard folder or file, text folder or file */
    char val[1024];       /* validation data; empty: the last val_fraction of train */
    float val_fraction;
    char rehearse[1024]; /* the mass objective: text learnt before, rehearse_windows of it beside
                          * train's (empty: none) */
    int B, T, grad_accum, steps, warmup;
    float lr, min_lr_frac, beta1, beta2, adam_eps, weight_decay, clip;
    int eval_every, eval_tokens, ckpt_every;
    int pretrain_steps, pretrain_B; /* scratch models only */
    float pretrain_lr;
    /* what the router is trained against (METHOD.md section 9): lm (the paper's next-token loss),
     * kl (KL divergence from the frozen dense model's next-token distribution), attn (each
     * token's groups follow its dense attention mass beyond the window), or kl+attn */
    char objective[16];
    float attn_weight; /* weight of the attn term in kl+attn */
    /* the mass objective (train/mass.c): windows collected, query sampling, keys per query */
    int mass_windows, mass_every, mass_keys, mass_pairs, mass_gate;
    char init_router[1024]; /* a router.h5 to start from (empty: the seed's initialisation) */
    float anchor;           /* with init_router: the pull back toward it (train_anchor_step) */
    /* the mass objective beside a block selector: its file and blocks per query (empty: none) */
    char mass_selector[1024];
    int mass_blocks;
    int mass_values; /* the teacher scores the output a far key restores (1; 2: and the harm of
                      * the keys that move it away; 3: in the residual stream, after the output
                      * projection and its norm, and the harm), not its mass alone (0) */
    /* the mass objective's teacher windows drawn from rehearse */
    int rehearse_windows;
    /* focus finetune (the baselines): lora or full, and the adapters' shape */
    char method[16];
    int lora_rank;
    float lora_alpha;
    char lora_targets[64];
    ModelConfig mcfg; /* scratch models only */
    FocusConfig fc;   /* routing = the training routing; evaluation is always causal */
} RunConfig;

void runconfig_default(RunConfig* rc);
/* Parse an INI file into rc; fatal with file and line on errors. */
void runconfig_load(RunConfig* rc, const char* path);
/* The same from text (used when resuming from the copy in router.h5). */
void runconfig_load_text(RunConfig* rc, const char* text, const char* what);
/* key=value, with or without a "section." prefix; fatal on unknown keys or bad values. */
void runconfig_set(RunConfig* rc, const char* kv);
/* Resolved settings as INI text (malloc'd). */
char* runconfig_text(const RunConfig* rc);
void runconfig_print(const RunConfig* rc, FILE* f);
/* Every setting with its section, default and help (`focus settings`). */
void runconfig_help(FILE* f);
/* The objective's parts: *kl and *attn set for kl, attn or kl+attn (both 0 for lm). */
void runconfig_objective(const RunConfig* rc, int* kl, int* attn);

#endif
