/* cmd_retrofit.c: `focus retrofit`, the project's main job: train only the router of a frozen
 * base model on the user's text, evaluate dense / soft / hard perplexity, checkpoint to HDF5.
 * This file resolves the run (settings, base model, tokenizer, data); loop.c trains. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <omp.h>

#include "../checkpoints/load.h"
#include "../checkpoints/router_h5.h"
#include "../data/tokenizer.h"
#include "../io/io.h"
#include "cli.h"
#include "commands.h"
#include "loop.h"

static const char retrofit_usage[] =
    "usage: focus retrofit --config FILE [--set key=value]... --out RUN_DIR [--stop-after N]\n"
    "                      [--device cpu|cuda]\n"
    "       focus retrofit --resume RUN_DIR [--stop-after N] [--device cpu|cuda]\n"
    "Trains only the Focus router of a frozen base model. Writes RUN_DIR/router.h5 (checkpoint),\n"
    "RUN_DIR/metrics.jsonl and RUN_DIR/config.conf; prints perplexity before and after.\n"
    "--stop-after N stops after step N (the schedule still spans all steps); --resume continues.\n"
    "Settings: see configs/*.conf; any of them can be overridden with --set.\n"
    "--device cuda trains on the GPU (a scratch base is pretrained on the CPU first); a run\n"
    "can be resumed on either device.\n";

int cmd_retrofit(int argc, char** argv) {
    const char *cfg_path = NULL, *out = NULL, *resume = NULL;
    CliList sets = {0};
    int stop_after = 0, on_gpu = 0;
    if (cli_parse("retrofit", argc, argv, 1, retrofit_usage,
                  "--config:s --out:s --resume:s --stop-after:i --device:d --set:*", &cfg_path,
                  &out, &resume, &stop_after, &on_gpu, &sets))
        return 0;
    const char* device = on_gpu ? "cuda" : "cpu";
    if (!resume && (!cfg_path || !out))
        fatal("retrofit: needs --config and --out (or --resume RUN_DIR)");
    if (resume) out = resume;
    char ckpt[4096], conf_path[4096];
    path_join(ckpt, sizeof ckpt, out, "router.h5");
    path_join(conf_path, sizeof conf_path, out, "config.conf");

    RunConfig rc;
    runconfig_default(&rc);
    if (resume) {
        char* text = router_read_config(ckpt);
        /* a run stored before these keys existed had no sinks and the lm objective */
        rc.fc.sinks = 0;
        rc.fc.beta_balance = 0;
        rc.fc.beta_momentum = 0.99f;
        runconfig_load_text(&rc, text, ckpt);
        free(text);
    } else {
        runconfig_load(&rc, cfg_path);
    }
    for (int i = 0; i < sets.n; i++) runconfig_set(&rc, sets.v[i]);
    free(sets.v);
    if (rc.B < 1 || rc.T < 2 || rc.steps < 1 || rc.grad_accum < 1)
        fatal("retrofit: B, T (>= 2), steps and grad_accum must be positive");
    if (!rc.model[0]) fatal("retrofit: no base model (set model = PATH or model = scratch)");
    if (!rc.train[0]) fatal("retrofit: no training data (set train = PATH)");
    if (make_dirs(out)) fatal("%s: cannot create the run folder: %s", out, strerror(errno));

    /* base model and tokenizer */
    Model m;
    ModelInfo info = {0};
    char base_path[4096];
    path_join(base_path, sizeof base_path, out, "base.gguf");
    int scratch = !strncmp(rc.model, "scratch", 7);
    const char* tok_path = rc.tokenizer[0] ? rc.tokenizer : (scratch ? NULL : rc.model);
    if (!tok_path) fatal("retrofit: a scratch model needs tokenizer = PATH");
    int need_pretrain = 0;
    if (scratch && access(base_path, R_OK) == 0 && resume) {
        model_load(&m, base_path, &rc.fc, &info);
    } else if (scratch) {
        Tokenizer* t = tokenizer_load(tok_path);
        rc.mcfg.V = tokenizer_vocab_size(t);
        tokenizer_free(t);
        if (rc.mcfg.maxT < rc.T) rc.mcfg.maxT = rc.T;
        model_build(&m, &rc.mcfg, &rc.fc);
        model_init_backbone(&m, rc.fc.seed + 1);
        snprintf(info.name, sizeof info.name, "scratch (%s, %.2fM parameters)",
                 rc.mcfg.arch == ARCH_GPT2 ? "gpt2" : "llama", m.num_params / 1e6);
        need_pretrain = 1;
    } else {
        model_load(&m, rc.model, &rc.fc, &info);
    }
    rc.mcfg = m.cfg;
    if (rc.T > m.cfg.maxT && m.cfg.arch == ARCH_GPT2)
        fatal("retrofit: T=%d exceeds the model's context %d", rc.T, m.cfg.maxT);

    /* data */
    size_t ntrain, nval;
    int* train = load_tokens(rc.train, "train_", tok_path, 1, &ntrain);
    int* val;
    if (rc.val[0]) {
        val = load_tokens(rc.val, "val_", tok_path, 1, &nval);
    } else {
        nval = (size_t)(rc.val_fraction * (double)ntrain);
        val = mallocCheck(sizeof(int) * (nval + 1));
        memcpy(val, train + ntrain - nval, sizeof(int) * nval);
        ntrain -= nval;
    }
    for (size_t i = 0; i < ntrain; i++)
        if (train[i] >= m.cfg.V)
            fatal("%s: token id %d outside the model's vocabulary (%d)", rc.train, train[i],
                  m.cfg.V);
    for (size_t i = 0; i < nval; i++)
        if (val[i] >= m.cfg.V)
            fatal("%s: token id %d outside the model's vocabulary (%d)", rc.val, val[i], m.cfg.V);
    if (ntrain < (size_t)rc.T + 1)
        fatal("%s: %zu training tokens, fewer than T + 1 = %d", rc.train, ntrain, rc.T + 1);
    size_t neval =
        rc.eval_tokens > 0 && nval > (size_t)rc.eval_tokens ? (size_t)rc.eval_tokens : nval;

    printf(
        "focus retrofit: base %s (%s), %zu training tokens, %zu validation tokens (%zu evaluated), "
        "%d threads\n",
        info.name, info.format[0] ? info.format : "built here", ntrain, nval, neval,
        omp_get_max_threads());
    runconfig_print(&rc, stdout);
    if (need_pretrain) {
        train_pretrain(&m, &rc, train, ntrain, out);
        snprintf(rc.model, sizeof rc.model, "scratch");
    }
    char* conf_text = runconfig_text(&rc);
    if (!resume) {
        const void* parts[1] = {conf_text};
        size_t sz = strlen(conf_text);
        write_file_atomic(conf_path, parts, &sz, 1);
    }

    TrainData d = {train, ntrain, val, neval};
    train_router(&m, &rc, &d, out, conf_text, resume != NULL, stop_after, device);
    free(conf_text);
    free(train);
    free(val);
    model_free(&m);
    return 0;
}
