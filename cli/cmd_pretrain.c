/* cmd_pretrain.c: `focus pretrain`, a model trained from scratch with dense attention or with
 * its Focus router trained jointly, the comparison the method's from-scratch claim rests on
 * (METHOD.md section 8: 13.82 against 13.89 at 7B): same settings, tokens, steps and data order,
 * validation perplexity at every evaluation (loop.c, train_finetune). */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "commands.h"
#include "../train/loop.h"

static const char pretrain_usage[] =
    "usage: focus pretrain --config FILE --out RUN_DIR [--attn dense|focus] [--set key=value]...\n"
    "Train a model from scratch (model = scratch; arch, L, C, NH, NKV, F, maxT and tokenizer\n"
    "from the settings file), every weight from its random start, with dense attention\n"
    "(--attn dense, the default) or with the Focus router trained jointly (--attn focus: the\n"
    "soft gate and the [focus] routing during training, evaluated dense, soft and hard at\n"
    "topk). Both read the same tokens in the same order for the same steps (B, T, grad_accum,\n"
    "steps, lr schedule), so two runs compare dense and Focus at equal budget. Writes\n"
    "RUN_DIR/model.gguf (and router.h5 with --attn focus) every ckpt_every steps, validation\n"
    "perplexity every eval_every steps to RUN_DIR/metrics.jsonl, initial weights to base.gguf.\n"
    "On the CPU; llama models; not resumable. Settings: focus settings.\n";

int cmd_pretrain(int argc, char** argv) {
    const char *cfg_path = NULL, *out = NULL, *attn = "dense";
    CliList sets = {0};
    if (cli_parse("pretrain", argc, argv, 1, pretrain_usage, "--config:s --out:s --attn:s --set:*",
                  &cfg_path, &out, &attn, &sets))
        return 0;
    if (!cfg_path || !out) fatal("pretrain: needs --config and --out");
    const int focus = !strcmp(attn, "focus");
    if (!focus && strcmp(attn, "dense"))
        fatal("pretrain: --attn must be dense or focus, got '%s'", attn);
    RunConfig rc;
    runconfig_default(&rc);
    runconfig_load(&rc, cfg_path);
    for (int i = 0; i < sets.n; i++) runconfig_set(&rc, sets.v[i]);
    free(sets.v);
    if (strncmp(rc.model, "scratch", 7))
        fatal("pretrain: %s: model = %s; pretrain trains a scratch model (model = scratch)",
              cfg_path, rc.model);
    rc.pretrain_steps = 0; /* the run is the pretraining */
    snprintf(rc.method, sizeof rc.method, "%s", focus ? "joint" : "full");
    if (focus && rc.fc.attn == ATTN_DENSE) rc.fc.attn = ATTN_SOFT;
    finetune_run(&rc, "pretrain", out);
    return 0;
}
