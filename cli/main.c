/* main.c: the `focus` command line. One binary, one subcommand per job, one file per command
 * (commands.h); this table is the list `focus help` prints. */
#include <stdio.h>
#include <string.h>

#include "../io/io.h"
#include "../kernels/common.h"
#include "../kernels/comm.h"
#include "../kernels/cpu.h"
#include "cli.h"
#include "commands.h"

typedef struct {
    const char* name;
    int (*run)(int argc, char** argv);
    const char* usage; /* the command line and what it does, for `focus help` */
} Command;

static const Command commands[] = {
    {"retrofit", cmd_retrofit,
     "retrofit        train the Focus router of a frozen model on your text"},
    {"finetune", cmd_finetune,
     "finetune        the baselines: LoRA adapters or full fine-tuning on the same data and "
     "budget"},
    {"pretrain", cmd_pretrain,
     "pretrain        a model from scratch, dense or with the Focus router trained jointly"},
    {"groups", cmd_groups,
     "groups          what the learned groups are (text report and SVG picture)"},
    {"tokenize", cmd_tokenize, "tokenize        text to token ids (or back, with --decode)"},
    {"prepare", cmd_prepare,
     "prepare         text files to token shards for training and evaluation"},
    {"eval", cmd_eval,
     "eval ppl        perplexity of a model on shards or text (dense, or with a router)\n"
     "  eval layers     each layer's cost under sparse attention (to choose dense_layers)\n"
     "  eval tasks      zero-shot / k-shot accuracy: LAMBADA, ARC, PIQA, HellaSwag\n"
     "  eval passkey    retrieval of a number hidden in long filler text, by length and depth\n"
     "  eval curve      perplexity against context length, dense and each Focus mode"},
    {"generate", cmd_generate, "generate        continue a prompt (greedy or sampled)"},
    {"serve", cmd_serve, "serve           an OpenAI-compatible HTTP server (parallel requests)"},
    {"bench", cmd_bench,
     "bench forward   forward and forward+backward (router-only) tokens/s of a model\n"
     "  bench decode    generation tokens/s (prompt, decode), native or fp32 weights\n"
     "  bench gemm      this machine's single-precision GEMM rate (GFLOP/s)\n"
     "  bench attention dense attention against the sparse executor, by length"},
    {"plan", cmd_plan,
     "plan            the memory of a training run from the model's shape (before running it)"},
    {"settings", cmd_settings,
     "settings        every configuration setting, its default and meaning; every attention "
     "method (--methods: as the README's table)"},
    {"average", cmd_average,
     "average         the mean of routers retrofitted from the same start (runs of other seeds)"},
    {"export", cmd_export,
     "export          a trained router for sharing, without its optimizer moments"},
    {"fit-blocks", cmd_fitblocks,
     "fit-blocks      the learned block selector, fitted to the model's own dense attention"},
};

static void usage(FILE* o) {
    fprintf(o,
            "focus: learned sparse attention retrofitted onto frozen language models\n"
            "\n"
            "usage: focus <command> [options]\n"
            "\n"
            "commands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(o, "  %s\n", commands[i].usage);
    fprintf(o,
            "  help            this text\n"
            "\n"
            "Run `focus <command> --help` for the options of a command.\n");
}

int main(int argc, char** argv) {
    blas_check_core(argv); /* the BLAS kernels this CPU can run (kernels/cpu.h) */
    if (argc < 2 || !strcmp(argv[1], "help") || !strcmp(argv[1], "--help") ||
        !strcmp(argv[1], "-h")) {
        usage(stdout);
        return argc < 2 ? 1 : 0;
    }
    mark_start_rss();
    io_guard_output();
    if (comm_launched_by_mpi() && strcmp(argv[1], "retrofit") && strcmp(argv[1], "bench"))
        fatal(
            "focus %s runs in one process; of the commands only retrofit and bench forward run "
            "over MPI ranks",
            argv[1]);
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].run(argc - 1, argv + 1);
    fatal("unknown command '%s' (see focus --help)", argv[1]);
}
