/* cmd_plan.c: `focus plan`, the memory a router training run will take, from the shapes alone
 * (model_memory_plan), before committing a machine to it; with data-parallel ranks, the
 * all-reduce volume of a step; with --mem, whether it fits and the longest T that does. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "commands.h"

static const char plan_usage[] =
    "usage: focus plan [--config NAME] [--set key=value]... [--B 1] [--T 1024] [--ranks N]\n"
    "                  [--objective lm|kl|attn|kl+attn] [--mem GB]\n"
    "The memory of a router training step (focus retrofit) from the model's shape alone: frozen\n"
    "weights (fp32), activations kept for the input-gradient backward, logits, the router with\n"
    "its gradients and AdamW state, scratch, the teacher of the kl / attn objectives. NAME: a\n"
    "preset (focus bench --help lists them; default smollm2-135m); --set changes a shape or\n"
    "Focus key (L=2, K=16). --ranks N: data-parallel ranks (B a multiple of N): per-rank memory\n"
    "and the bytes each step all-reduces. --mem GB: does it fit, and the longest T that does.\n"
    "focus retrofit prints its measured peak next to this plan.\n";

static double gb(size_t b) { return b / 1e9; }

int cmd_plan(int argc, char** argv) {
    const char *preset = "smollm2-135m", *objective = "lm";
    CliList sets = {0};
    int B = 1, T = 1024, ranks = 1;
    double mem = 0;
    if (cli_parse("plan", argc, argv, 1, plan_usage,
                  "--config:s --set:* --B:i[1,1048576] --T:i[2,1048576] --ranks:i[1,1048576] "
                  "--objective:s --mem:x[0.001,1e9]",
                  &preset, &sets, &B, &T, &ranks, &objective, &mem))
        return 0;
    ModelConfig cfg;
    FocusConfig fc;
    focus_config_default(&fc);
    if (model_config_preset(preset, &cfg))
        fatal("plan: unknown config '%s' (focus bench --help lists the presets)", preset);
    for (int i = 0; i < sets.n; i++) cli_apply_set(&cfg, &fc, sets.v[i]);
    free(sets.v);
    char err[256];
    if (model_config_check(&cfg, err, sizeof err)) fatal("plan: %s", err);
    const int kl = strstr(objective, "kl") != NULL, attn = strstr(objective, "attn") != NULL;
    if (!kl && !attn && strcmp(objective, "lm"))
        fatal("plan: --objective must be lm, kl, attn or kl+attn, got '%s'", objective);
    if (B % ranks) fatal("plan: B=%d is not a multiple of the %d ranks", B, ranks);
    const int Bl = B / ranks;
    MemoryPlan p = model_memory_plan(&cfg, &fc, Bl, T, kl, attn, 4);
    printf(
        "memory plan: %s (%.3fB parameters, L=%d C=%d heads %d/%d F=%d V=%d), router training,\n"
        "B=%d x T=%d%s, objective %s, fp32 weights\n",
        preset, model_param_count(&cfg) / 1e9, cfg.L, cfg.C, cfg.NH, cfg.NKV, cfg.F, cfg.V, B, T,
        ranks > 1 ? " over the ranks" : "", objective);
    printf("  %-42s %10.3f GB\n", "frozen weights (fp32)", gb(p.weights));
    printf("  %-42s %10.3f GB\n", "activations kept for the backward", gb(p.activations));
    printf("  %-42s %10.3f GB\n", "logits (and their gradient, in place)", gb(p.logits));
    printf("  %-42s %10.3f GB\n", "router, gradients, AdamW moments", gb(p.router));
    printf("  %-42s %10.3f GB\n", "backward scratch, masks, token ids", gb(p.workspace));
    printf("  %-42s %10.3f GB\n", "teacher (kl / attn objectives)", gb(p.teacher));
    printf("  %-42s %10.3f GB%s\n", "total", gb(p.total), ranks > 1 ? " per rank" : "");
    if (ranks > 1) {
        /* a step's all-reduces: router gradients (fp32), the two losses, beta's column sums
         * (8 iterations of L x (K + 1) doubles); a ring sends 2 (N - 1) / N of the bytes */
        const double bytes =
            (double)cfg.L * ((double)cfg.C * fc.dg + (double)fc.K * fc.dg + 2) * 4 + 16 +
            8.0 * cfg.L * (fc.K + 1) * 8;
        printf(
            "data-parallel over %d ranks, %d rows each: %.0f bytes all-reduced per step, about "
            "%.0f sent by each rank (ring)\n",
            ranks, Bl, bytes, 2.0 * (ranks - 1) / ranks * bytes);
    }
    if (mem > 0) {
        const size_t have = (size_t)(mem * 1e9);
        printf("fits in %.3g GB: %s", mem, p.total <= have ? "yes" : "no");
        int t = 2;
        while (t < (1 << 24) && model_memory_plan(&cfg, &fc, Bl, 2 * t, kl, attn, 4).total <= have)
            t *= 2;
        if (model_memory_plan(&cfg, &fc, Bl, t, kl, attn, 4).total <= have) {
            int lo = t, hi = 2 * t; /* the longest T in [lo, hi) that fits */
            while (hi - lo > 1) {
                int mid = lo + (hi - lo) / 2;
                if (model_memory_plan(&cfg, &fc, Bl, mid, kl, attn, 4).total <= have)
                    lo = mid;
                else
                    hi = mid;
            }
            printf(" (the longest T that fits at %d row%s per rank: %d)\n", Bl, Bl > 1 ? "s" : "",
                   lo);
        } else {
            printf(" (not even T=2: the weights alone take %.3f GB)\n", gb(p.weights));
        }
    }
    return 0;
}
