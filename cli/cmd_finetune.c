/* cmd_finetune.c: `focus finetune`, the baselines of a router retrofit: LoRA adapters or full
 * fine-tuning of the backbone, on the data and budget of a retrofit config (loop.c). */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "commands.h"
#include "../train/loop.h"

static const char finetune_usage[] =
    "usage: focus finetune --config FILE [--set key=value]... --out RUN_DIR\n"
    "The baselines a router retrofit is compared with, on the same settings file (data, B, T,\n"
    "steps, lr schedule, data order): [finetune] method = lora (adapters of rank lora_rank,\n"
    "scale lora_alpha / lora_rank, on lora_targets: qkv,o,fc,fcproj; only they train; writes\n"
    "RUN_DIR/lora.h5, evaluated with --lora) or method = full (every weight trains; writes\n"
    "RUN_DIR/model.gguf, evaluated as --model; llama models); attention stays dense. method =\n"
    "joint trains every weight and the Focus router together (model.gguf and router.h5). Prints\n"
    "validation perplexity before and after; RUN_DIR/metrics.jsonl and config.conf. On the CPU;\n"
    "not resumable. Settings: focus settings.\n";

int cmd_finetune(int argc, char** argv) {
    const char *cfg_path = NULL, *out = NULL;
    CliList sets = {0};
    if (cli_parse("finetune", argc, argv, 1, finetune_usage, "--config:s --out:s --set:*",
                  &cfg_path, &out, &sets))
        return 0;
    if (!cfg_path || !out) fatal("finetune: needs --config and --out");
    RunConfig rc;
    runconfig_default(&rc);
    runconfig_load(&rc, cfg_path);
    for (int i = 0; i < sets.n; i++) runconfig_set(&rc, sets.v[i]);
    free(sets.v);
    finetune_run(&rc, "finetune", out);
    return 0;
}
