/* main.c: the `focus` command line. One binary, one subcommand per job. */
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>

#include "cli.h"

#ifdef FOCUS_CUDA
#include "../kernels/cuda/cuda.h"
#include "../model/model_cuda.h"
#endif

static void usage(FILE* o) {
    fprintf(o,
            "focus: learned sparse attention retrofitted onto frozen language models\n"
            "\n"
            "usage: focus <command> [options]\n"
            "\n"
            "commands:\n"
            "  retrofit        train the Focus router of a frozen model on your text\n"
            "  groups          what the learned groups are (text report and SVG picture)\n"
            "  tokenize        text to token ids (or back, with --decode)\n"
            "  prepare         text files to token shards for training and evaluation\n"
            "  eval ppl        perplexity of a model on shards or text (dense, or with a router)\n"
            "  eval layers     each layer's cost under sparse attention (to choose dense_layers)\n"
            "  generate        continue a prompt (greedy or sampled)\n"
            "  bench forward   forward and forward+backward (router-only) tokens/s of a model\n"
            "  bench gemm      this machine's single-precision GEMM rate (GFLOP/s)\n"
            "  help            this text\n"
            "\n"
            "Run `focus <command> --help` for the options of a command.\n");
}

const char* cli_value(int argc, char** argv, int i) {
    if (i + 1 >= argc) fatal("option %s needs a value", argv[i]);
    return argv[i + 1];
}

int cli_int(const char* opt, const char* v) {
    char* end;
    long x = strtol(v, &end, 10);
    if (end == v || *end) fatal("option %s expects an integer, got '%s'", opt, v);
    return (int)x;
}

const char* cli_split_set(const char* kv, char* key, size_t keycap) {
    const char* eq = strchr(kv, '=');
    if (!eq) fatal("--set expects key=value, got '%s'", kv);
    size_t n = (size_t)(eq - kv);
    if (n >= keycap) fatal("--set: key too long in '%s'", kv);
    memcpy(key, kv, n);
    key[n] = 0;
    return eq + 1;
}

void cli_apply_set(ModelConfig* cfg, FocusConfig* fc, const char* kv) {
    char key[128];
    const char* value = cli_split_set(kv, key, sizeof key);
    int r = config_set(cfg, fc, key, value);
    if (r == -1) fatal("--set: unknown setting '%s'", key);
    if (r == -2) fatal("--set: bad value '%s' for setting '%s'", value, key);
}

int cli_device(const char* v) {
    if (!strcmp(v, "cpu")) return 0;
    if (strcmp(v, "cuda")) fatal("--device expects cpu or cuda, got '%s'", v);
#ifdef FOCUS_CUDA
    if (!cuda_available()) fatal("--device cuda: no usable CUDA device on this machine");
    return 1;
#else
    fatal("--device cuda: this focus was built without CUDA (no nvcc found at configure time)");
#endif
}

void model_use_device(Model* m, int device) {
#ifdef FOCUS_CUDA
    if (device) model_to_cuda(m);
#else
    (void)m;
    (void)device;
#endif
}

double peak_rss_mib(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss / 1024.0;
}

int main(int argc, char** argv) {
    if (argc < 2 || !strcmp(argv[1], "help") || !strcmp(argv[1], "--help") ||
        !strcmp(argv[1], "-h")) {
        usage(stdout);
        return argc < 2 ? 1 : 0;
    }
    if (!strcmp(argv[1], "bench")) return cmd_bench(argc - 1, argv + 1);
    if (!strcmp(argv[1], "retrofit")) return cmd_retrofit(argc - 1, argv + 1);
    if (!strcmp(argv[1], "groups")) return cmd_groups(argc - 1, argv + 1);
    if (!strcmp(argv[1], "tokenize")) return cmd_tokenize(argc - 1, argv + 1);
    if (!strcmp(argv[1], "prepare")) return cmd_prepare(argc - 1, argv + 1);
    if (!strcmp(argv[1], "eval")) return cmd_eval(argc - 1, argv + 1);
    if (!strcmp(argv[1], "generate")) return cmd_generate(argc - 1, argv + 1);
    fatal("unknown command '%s' (see focus --help)", argv[1]);
}
