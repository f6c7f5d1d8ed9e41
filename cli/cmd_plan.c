/* cmd_plan.c: `focus plan`, the memory a router training run will take, from the shapes alone
 * (model_memory_plan), before committing a machine to it; with data-parallel ranks, the
 * all-reduce volume of a step; with --mem, whether it fits and the longest T that does. */
#include <stdio.h>
#include <string.h>

#include <omp.h>

#include "../kernels/mass.h"
#include "cli.h"
#include "commands.h"

static const char plan_usage[] =
    "usage: focus plan [--preset NAME] [--set key=value]... [--B 1] [--T 1024]\n"
    "                  [--ranks N | --gpus N] [--tp T] [--weights fp32|bf16|bf16-proj]\n"
    "                  [--objective lm|kl|attn|kl+attn|mass] [--mem GB]\n"
    "The memory of a router training step (focus retrofit) from the model's shape alone, per\n"
    "rank: frozen weights, activations kept for the input-gradient backward, logits, the router\n"
    "with its gradients and AdamW state, scratch, the teacher of the kl / attn objectives.\n"
    "NAME: a preset (focus bench --help lists them; default smollm2-135m); --set changes a shape\n"
    "or Focus key (L=2, K=16). --ranks N (CPU processes) or --gpus N (the same count, named for\n"
    "GPUs): N ranks in N / T data-parallel groups of --tp T tensor-parallel slices (T divides the\n"
    "heads and F; B a multiple of N / T), and the bytes each step all-reduces. --weights bf16:\n"
    "every frozen weight in 2 bytes (the GPU layout; focus's GPU path holds fp32 today);\n"
    "bf16-proj: the CPU's bf16 store (retrofit --set weights=bf16: the projections in bf16).\n"
    "--mem GB: does it fit, the longest T that does, and the smallest T (tensor parallelism)\n"
    "that fits. focus retrofit prints its measured peak next to this plan.\n"
    "--objective mass (docs/OBJECTIVE.md): no backward pass, one layer's activations, one teacher\n"
    "window (mass_every 4, mass_keys 64) and the router step, on the CPU in one process.\n";

static double gb(size_t b) { return b / 1e9; }

/* The reals a step all-reduces within a tensor-parallel group, over the passes it runs: two
 * (BT, C) partial sums per layer in the forward pass, two in the backward (after the MLP up and
 * the QKV products) plus the gate's dG (BT, K) and its lambda, b; a teacher pass (kl / attn)
 * adds a forward and, for attn, the group mass (L, BT, K). */
static double tp_reals(const ModelConfig* c, const FocusConfig* f, double BT, int kl, int attn) {
    const double fwd = 2.0 * c->L * BT * c->C;
    double r = fwd + 2.0 * c->L * BT * c->C + c->L * (BT * f->K + 2);
    if (kl || attn) r += fwd;
    if (attn) r += (double)c->L * BT * f->K;
    return r;
}

/* The mass objective's plan (model_memory_plan_mass): its routed layers (a model's own
 * sliding-window layers keep their window under the default local = window), the teacher's query
 * rows at the defaults mass_every = 4, mass_keys = 64, this machine's threads. */
static void plan_mass(const char* preset, const ModelConfig* cfg, const FocusConfig* fc, int T,
                      WeightStore wbytes, const char* weights) {
    int layers = 0;
    for (int l = 0; l < cfg->L; l++)
        layers += fc->local != LOCAL_WINDOW || model_layer_spec(cfg, l).window < 0;
    int* rows = mallocCheck(sizeof(int) * T);
    const int nq = mass_sample_rows(rows, T, fc->w, fc->sinks, 4, 0);
    free(rows);
    MemoryPlan p =
        model_memory_plan_mass(cfg, fc, T, layers, nq, 64, omp_get_max_threads(), 0, wbytes);
    printf(
        "memory plan: %s, router training with the mass objective, T=%d, %d routed layers, %d "
        "teacher queries, %s weights, %d threads\n",
        preset, T, layers, nq, weights, omp_get_max_threads());
    printf("  %-42s %10.3f GB\n", "frozen weights", gb(p.weights));
    printf("  %-42s %10.3f GB\n", "one layer's activations (no head)", gb(p.activations));
    printf("  %-42s %10.3f GB\n", "router, gradients, AdamW moments", gb(p.router));
    printf("  %-42s %10.3f GB\n", "one teacher window and its scratch", gb(p.teacher));
    printf("  %-42s %10.3f GB\n", "router step buffers", gb(p.workspace));
    printf("  %-42s %10.3f GB\n", "total", gb(p.total));
}

int cmd_plan(int argc, char** argv) {
    const char *preset = "smollm2-135m", *config = NULL, *objective = "lm", *weights = "fp32";
    CliList sets = {0};
    int B = 1, T = 1024, ranks = 0, gpus = 0, tp = 1;
    double mem = 0;
    if (cli_parse(
            "plan", argc, argv, 1, plan_usage,
            "--preset:s --config:s --set:* --B:i[1,1048576] --T:i[2,1048576] --ranks:i[1,1048576] "
            "--gpus:i[1,1048576] --tp:i[1,4096] --weights:s --objective:s --mem:x[0.001,1e9]",
            &preset, &config, &sets, &B, &T, &ranks, &gpus, &tp, &weights, &objective, &mem))
        return 0;
    if (config)
        fatal(
            "plan: --config takes a settings file (retrofit, finetune, pretrain); the model "
            "shapes here are presets: --preset %s",
            config);
    ModelConfig cfg;
    FocusConfig fc;
    focus_config_default(&fc);
    if (model_config_preset(preset, &cfg))
        fatal("plan: unknown preset '%s' (focus bench --help lists them)", preset);
    for (int i = 0; i < sets.n; i++) cli_apply_set(&cfg, &fc, sets.v[i]);
    free(sets.v);
    char err[256];
    if (model_config_check(&cfg, err, sizeof err)) fatal("plan: %s", err);
    const int kl = strstr(objective, "kl") != NULL, attn = strstr(objective, "attn") != NULL;
    const int mass = !strcmp(objective, "mass");
    if (!kl && !attn && !mass && strcmp(objective, "lm"))
        fatal("plan: --objective must be lm, kl, attn, kl+attn or mass, got '%s'", objective);
    const WeightStore wbytes = !strcmp(weights, "bf16")        ? WEIGHTS_BF16
                               : !strcmp(weights, "bf16-proj") ? WEIGHTS_BF16_PROJ
                                                               : WEIGHTS_FP32;
    if (strcmp(weights, "fp32") && wbytes == WEIGHTS_FP32)
        fatal("plan: --weights must be fp32, bf16 or bf16-proj, got '%s'", weights);
    if (mass) {
        if (ranks || gpus || tp > 1 || B != 1 || mem > 0)
            fatal(
                "plan: --objective mass runs in one process: no --ranks, --gpus, --tp, --B, --mem");
        plan_mass(preset, &cfg, &fc, T, wbytes, weights);
        return 0;
    }
    if (ranks && gpus) fatal("plan: give --ranks or --gpus, not both");
    const char* unit = gpus ? "GPU" : "rank";
    const int N = gpus ? gpus : ranks ? ranks : tp;
    if (N % tp) fatal("plan: %d %ss are not a multiple of --tp %d", N, unit, tp);
    if (model_tp_check(&cfg, tp, err, sizeof err)) fatal("plan: %s", err);
    const int dp = N / tp;
    if (B % dp) fatal("plan: B=%d is not a multiple of the %d data-parallel groups", B, dp);
    const int Bl = B / dp;
    ModelConfig slice = cfg;
    slice.tp = tp; /* slice 0's shapes: every slice's are the same */
    MemoryPlan p = model_memory_plan(&slice, &fc, Bl, T, kl, attn, wbytes);
    printf(
        "memory plan: %s (%.3fB parameters, L=%d C=%d heads %d/%d F=%d V=%d), router training,\n"
        "B=%d x T=%d, objective %s, %s weights, %d %s%s",
        preset, model_param_count(&cfg) / 1e9, cfg.L, cfg.C, cfg.NH, cfg.NKV, cfg.F, cfg.V, B, T,
        objective, weights, N, unit, N > 1 ? "s" : "");
    if (N > 1) printf(" (tp %d x dp %d, %d row%s per group)", tp, dp, Bl, Bl > 1 ? "s" : "");
    printf("\n");
    char what[64];
    snprintf(what, sizeof what, "frozen weights (%s%s)", weights, tp > 1 ? ", this slice" : "");
    printf("  %-42s %10.3f GB\n", what, gb(p.weights));
    printf("  %-42s %10.3f GB\n", "activations kept for the backward", gb(p.activations));
    printf("  %-42s %10.3f GB\n", "logits (and their gradient, in place)", gb(p.logits));
    printf("  %-42s %10.3f GB\n", "router, gradients, AdamW moments", gb(p.router));
    printf("  %-42s %10.3f GB\n", "backward scratch, masks, token ids", gb(p.workspace));
    printf("  %-42s %10.3f GB\n", "teacher (kl / attn objectives)", gb(p.teacher));
    printf("  %-42s %10.3f GB%s\n", "total", gb(p.total), N > 1 ? " per rank" : "");
    if (tp > 1) {
        const double bytes = 4 * tp_reals(&cfg, &fc, (double)Bl * T, kl, attn);
        printf(
            "tensor-parallel over %d: %.3f GB all-reduced per step in each group, about %.3f GB "
            "sent by each %s (ring)\n",
            tp, bytes / 1e9, 2.0 * (tp - 1) / tp * bytes / 1e9, unit);
    }
    if (dp > 1) {
        /* a step's all-reduces: router gradients (fp32), the two losses, beta's column sums
         * (8 iterations of L x (K + 1) doubles); a ring sends 2 (N - 1) / N of the bytes */
        const double bytes =
            (double)cfg.L * ((double)cfg.C * fc.dg + (double)fc.K * fc.dg + 2) * 4 + 16 +
            8.0 * cfg.L * (fc.K + 1) * 8;
        printf(
            "data-parallel over %d groups, %d rows each: %.0f bytes all-reduced per step, about "
            "%.0f sent by each %s (ring)\n",
            dp, Bl, bytes, 2.0 * (dp - 1) / dp * bytes, unit);
    }
    if (mem > 0) {
        const size_t have = (size_t)(mem * 1e9);
        printf("fits in %.3g GB: %s", mem, p.total <= have ? "yes" : "no");
        int t = 2;
        while (t < (1 << 24) &&
               model_memory_plan(&slice, &fc, Bl, 2 * t, kl, attn, wbytes).total <= have)
            t *= 2;
        if (model_memory_plan(&slice, &fc, Bl, t, kl, attn, wbytes).total <= have) {
            int lo = t, hi = 2 * t; /* the longest T in [lo, hi) that fits */
            while (hi - lo > 1) {
                int mid = lo + (hi - lo) / 2;
                if (model_memory_plan(&slice, &fc, Bl, mid, kl, attn, wbytes).total <= have)
                    lo = mid;
                else
                    hi = mid;
            }
            printf(" (the longest T that fits at %d row%s per rank: %d)\n", Bl, Bl > 1 ? "s" : "",
                   lo);
        } else {
            printf(" (not even T=2: the weights alone take %.3f GB)\n", gb(p.weights));
        }
        /* the smallest tensor parallelism that fits, B rows per group (tp dividing the heads and
         * F; with --gpus / --ranks, also the count) */
        int best = 0;
        for (int t2 = 1; t2 <= cfg.NH && !best; t2++) {
            if (model_tp_check(&cfg, t2, err, sizeof err) || ((gpus || ranks) && N % t2)) continue;
            ModelConfig s2 = cfg;
            s2.tp = t2;
            const int b2 = (gpus || ranks) ? B / (N / t2) : B;
            if (b2 >= 1 && model_memory_plan(&s2, &fc, b2, T, kl, attn, wbytes).total <= have)
                best = t2;
        }
        if (best)
            printf("smallest tensor parallelism that fits %.3g GB per %s at T=%d: tp %d\n", mem,
                   unit, T, best);
        else
            printf("no tensor parallelism that divides the heads fits %.3g GB per %s at T=%d\n",
                   mem, unit, T);
    }
    return 0;
}
