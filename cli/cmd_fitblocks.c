/* cmd_fitblocks.c: `focus fit-blocks`, the learned block selector (kernels/blockgate.h) fitted
 * to a frozen model's own dense attention on a text: dense forward passes over windows of the
 * text, a sample of each layer's queries with the exact attention mass of its band and of each
 * candidate key block, then a convex fit per layer and query head. No backward pass through the
 * model: a window costs about one dense forward. Prints, on held-out windows of the same text,
 * the attention mass that each block selection keeps at the budget (Quest's bounds, mean keys,
 * the untrained cumulant expansion, the fitted selector, the oracle), and from the same data
 * gives each layer its budget. The file evaluates, decodes and serves with --router
 * SELECTOR.h5 (the mode blocks_learned:N). */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "../checkpoints/blockgate_h5.h"
#include "../kernels/blockgate.h"
#include "cli.h"
#include "commands.h"

static const char fit_usage[] =
    "usage: focus fit-blocks --model M [--tokenizer T] --data DATA --out SELECTOR.h5\n"
    "                        [--ctx 8192] [--windows 8] [--heldout 1] [--queries 256]\n"
    "                        [--iters 300] [--lr 0.02] [--seed 1] [--budget uniform|layers]\n"
    "                        [--floor N] [--init SELECTOR.h5] [--set w=512] [--set sinks=4]\n"
    "                        [--set block=64] [--set blocks=8]\n"
    "The learned block selector (mode blocks_learned:N): per layer and query head, weights that\n"
    "estimate from each key block's mean, variance, min and max how much attention a query\n"
    "gives the block, fitted to the model's own dense attention on windows of ctx tokens spread\n"
    "over DATA (a shard folder, shard or text file). No gradient flows through the model, so a\n"
    "window costs one dense forward pass. w and sinks are the band every query keeps, block the\n"
    "key block size, blocks the budget. --budget uniform (the default) keeps that many blocks\n"
    "in every layer; --budget layers (needs held-out windows) gives each layer its own number,\n"
    "L x blocks in all: --floor (blocks / 2) in every layer, the rest one at a time to the layer\n"
    "whose held-out attention mass gains most (blocks_learned:N scales them to N on average;\n"
    "on SmolLM2 at ctx 8192 it kept more mass but gave a higher perplexity, docs/RESULTS.md).\n"
    "--init starts from a selector's weights (with --windows 0: no fitting, only the held-out\n"
    "report and the budgets). Evaluate it with --router SELECTOR.h5 --attn blocks_learned\n"
    "(eval ppl) or --modes blocks_learned:8 (eval curve, eval passkey); generate, bench decode\n"
    "and serve take it with --router too. On a model with sliding-window layers (Gemma 3) only\n"
    "the layers the selector acts on are sampled and fitted: under local = window (the default)\n"
    "the global ones, the others keeping their own window.\n";

typedef struct {
    BlockFit* fit;
    const Model* m;
    int nq;
    uint64_t seed;
} Observer;

/* Samples of the layers the selector acts on: a sliding-window layer under local = window keeps
 * its own band, so its samples (and its fit) would be spent on weights nothing reads. */
static void observe(void* ctx, int layer, const real* h, const real* qkv, const real* lse, int B,
                    int T) {
    (void)h, (void)lse;
    Observer* o = ctx;
    if (!model_layer_routed(o->m, layer)) return;
    for (int b = 0; b < B; b++)
        blockfit_add(o->fit, layer,
                     qkv + (size_t)b * T * (o->fit->NH + 2 * o->fit->NKV) * o->fit->hs, T, o->nq,
                     o->seed + 0x9e3779b97f4a7c15ull * (uint64_t)(layer * B + b + 1));
}

/* Run dense forward passes over n windows of ctx tokens starting at the offsets, feeding fit. */
static void collect(Model* m, BlockFit* fit, const int* ids, const size_t* offs, int n, int ctx,
                    int nq, uint64_t seed, const char* what) {
    Observer o = {fit, m, nq, seed};
    m->layer_observer = observe;
    m->layer_observer_ctx = &o;
    for (int k = 0; k < n; k++) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        o.seed = seed + 1000003ull * (uint64_t)k;
        model_forward(m, ids + offs[k], NULL, 1, ctx, 0);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        printf("%s window %d/%d (tokens %zu..%zu): %.1f s\n", what, k + 1, n, offs[k],
               offs[k] + ctx, (t1.tv_sec - t0.tv_sec) + 1e-9 * (t1.tv_nsec - t0.tv_nsec));
        fflush(stdout);
    }
    m->layer_observer = NULL;
    m->layer_observer_ctx = NULL;
}

/* The mean over layers of the attention mass each selection keeps on the held-out samples. */
static void report_kept(const BlockFit* h, const real* init, const real* wgt, int nsel, int W) {
    static const char* names[] = {"Quest bounds", "mean keys", "cumulant (untrained)",
                                  "learned selector", "oracle"};
    const BlockScore how[] = {BLOCKS_QUEST, BLOCKS_MEAN, BLOCKS_LEARNED, BLOCKS_LEARNED,
                              BLOCKS_ORACLE};
    printf("held-out attention mass kept with %d blocks of %d (band + blocks; dense = 1):\n", nsel,
           h->bs);
    for (int s = 0; s < 5; s++) {
        double sum = 0, worst = 1;
        int fitted = 0;
        for (int l = 0; l < h->L; l++) {
            if (!blockfit_samples(h, l)) continue; /* a layer with its own window */
            fitted++;
            const real* w = s == 2 ? init : wgt;
            double k = blockfit_kept(h, l, how[s], w + (size_t)l * h->NH * W, nsel);
            sum += k;
            worst = k < worst ? k : worst;
        }
        printf("  %-22s mean over layers %.4f, lowest layer %.4f\n", names[s],
               fitted ? sum / fitted : 0.0, worst);
    }
}

int cmd_fitblocks(int argc, char** argv) {
    const char *model = NULL, *tok_path = NULL, *data = NULL, *out = NULL, *budget = "uniform",
               *init_path = NULL;
    int ctx = 8192, windows = 8, heldout = 1, queries = 256, iters = 300, seed = 1, floor = -1;
    double lr = 0.02;
    CliList sets = {0};
    if (cli_parse(
            "fit-blocks", argc, argv, 1, fit_usage,
            "--model:s --tokenizer:s --data:s --out:s --ctx:i[2,1048576] --windows:i[0,100000] "
            "--heldout:i[0,100000] --queries:i[1,1000000] --iters:i[0,1000000] "
            "--lr:x[0,10] --seed:i --budget:s --init:s --floor:i[0,1048576] --set:*",
            &model, &tok_path, &data, &out, &ctx, &windows, &heldout, &queries, &iters, &lr, &seed,
            &budget, &init_path, &floor, &sets))
        return 0;
    if (!model || !data || !out) fatal("fit-blocks: needs --model, --data and --out");
    const int per_layer = !strcmp(budget, "layers");
    if (!per_layer && strcmp(budget, "uniform"))
        fatal("fit-blocks: --budget must be layers or uniform, got '%s'", budget);
    if (per_layer && !heldout)
        fatal("fit-blocks: --budget layers needs held-out windows (--heldout 1 or more)");
    if (!windows && !init_path) fatal("fit-blocks: --windows 0 needs --init SELECTOR.h5");
    if (!windows) iters = 0;
    Model m;
    ModelInfo info;
    cli_open_model(
        &m, &info,
        &(ModelRequest){.model = model, .attn = "dense", .routing = "causal", .sets = &sets});
    free(sets.v);
    const FocusConfig f = m.fc;
    if (floor < 0) floor = f.blocks / 2; /* the per-layer budgets' least */
    m.fc.attn = ATTN_DENSE;
    const ModelConfig* c = &m.cfg;
    const int hs = model_head_size(c), W = BLOCKGATE_WIDTH(hs), nkv = model_kv_heads(c);
    if (model_tp(c) > 1) fatal("fit-blocks: runs on one process (no tensor parallelism)");
    if (ctx > c->maxT)
        fatal("fit-blocks: --ctx %d exceeds the model's context of %d", ctx, c->maxT);
    if (f.sinks + f.w + 2 * f.block >= ctx)
        fatal(
            "fit-blocks: --ctx %d leaves no query with two candidate blocks (sinks %d + w %d + "
            "2 blocks of %d)",
            ctx, f.sinks, f.w, f.block);
    size_t n = 0;
    int* ids = load_eval_tokens(data, model, tok_path, &n);
    const int total = windows + heldout;
    if (n < (size_t)ctx * total)
        fatal("fit-blocks: %s has %zu tokens, %d windows of %d need %zu", data, n, total, ctx,
              (size_t)ctx * total);
    /* windows spread evenly over the text; the held-out ones are the last */
    size_t* offs = mallocCheck(sizeof(size_t) * total);
    for (int k = 0; k < total; k++)
        offs[k] = total > 1 ? (size_t)((double)k * (n - ctx) / (total - 1)) : n - ctx;
    printf(
        "fit-blocks: %s, %d layers x %d query heads (%d key/value), head size %d; band: %d "
        "sinks + w %d; blocks of %d; %d windows of %d tokens (+ %d held out), %d queries each\n",
        info.name, c->L, c->NH, nkv, hs, f.sinks, f.w, f.block, windows, ctx, heldout, queries);
    BlockFit fit, held;
    blockfit_init(&fit, c->L, c->NH, nkv, hs, f.block, f.w, f.sinks);
    blockfit_init(&held, c->L, c->NH, nkv, hs, f.block, f.w, f.sinks);
    collect(&m, &fit, ids, offs, windows, ctx, queries, (uint64_t)seed, "fit");
    collect(&m, &held, ids, offs + windows, heldout, ctx, queries, (uint64_t)seed + 77, "held-out");
    real* wgt = mallocCheck(sizeof(real) * (size_t)c->L * c->NH * W);
    real* init = mallocCheck(sizeof(real) * (size_t)c->L * c->NH * W);
    blockgate_init(init, c->L * c->NH, hs);
    memcpy(wgt, init, sizeof(real) * (size_t)c->L * c->NH * W);
    if (init_path) { /* its weights, on this model; its band and block size must be these */
        BlockGateInfo from;
        blockgate_load(init_path, &m, &from, model_fingerprint(&m));
        if (from.block != f.block || from.w != f.w || from.sinks != f.sinks)
            fatal(
                "fit-blocks: %s was fitted with block %d, w %d, sinks %d; this run asks for %d, "
                "%d, %d",
                init_path, from.block, from.w, from.sinks, f.block, f.w, f.sinks);
        memcpy(wgt, m.method.selector, sizeof(real) * (size_t)c->L * c->NH * W);
    }
    double* before = mallocCheck(sizeof(double) * c->L * c->NH);
    double* after = mallocCheck(sizeof(double) * c->L * c->NH);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    blockfit_solve(&fit, wgt, iters, (real)lr, before, after);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf(
        "fit: %d Adam steps per (layer, head) in %.1f s; KL (nats) from the dense mass, mean "
        "over heads, training samples:\n",
        iters, (t1.tv_sec - t0.tv_sec) + 1e-9 * (t1.tv_nsec - t0.tv_nsec));
    int routed = 0;
    for (int l = 0; l < c->L; l++) {
        if (!model_layer_routed(&m, l)) {
            printf("  layer %2d: its own sliding window (keys i - j <= %d; not fitted)\n", l,
                   model_layer_spec(c, l).window);
            continue;
        }
        routed++;
        double b = 0, a = 0, hb = 0, ha = 0;
        for (int h = 0; h < c->NH; h++) {
            b += before[l * c->NH + h], a += after[l * c->NH + h];
            if (heldout) {
                hb += blockfit_loss(&held, l, h, init + ((size_t)l * c->NH + h) * W, NULL);
                ha += blockfit_loss(&held, l, h, wgt + ((size_t)l * c->NH + h) * W, NULL);
            }
        }
        printf("  layer %2d: %.4f -> %.4f", l, b / c->NH, a / c->NH);
        if (heldout) printf("   held out %.4f -> %.4f", hb / c->NH, ha / c->NH);
        printf("\n");
    }
    if (heldout) report_kept(&held, init, wgt, f.blocks, W);
    BlockGateInfo bi = {f.block, f.w, f.sinks, 0, NULL};
    int* blocks = NULL;
    if (per_layer) { /* each layer's held-out mass against its budget, then the greedy shares */
        /* over the layers the selector acts on; the others keep the uniform number (unread) */
        const int nmax = 4 * f.blocks;
        double* curves = mallocCheck(sizeof(double) * (size_t)routed * (nmax + 1));
        int* at = mallocCheck(sizeof(int) * (size_t)routed);
        int* got_blocks = mallocCheck(sizeof(int) * (size_t)routed);
        for (int l = 0, r = 0; l < c->L; l++)
            if (model_layer_routed(&m, l)) {
                at[r] = l;
                blockfit_kept_curve(&held, l, BLOCKS_LEARNED, wgt + (size_t)l * c->NH * W, nmax,
                                    curves + (size_t)r++ * (nmax + 1));
            }
        blockfit_allocate(curves, routed, nmax, f.blocks, floor, got_blocks);
        blocks = mallocCheck(sizeof(int) * c->L);
        for (int l = 0; l < c->L; l++) blocks[l] = f.blocks;
        double uni = 0, got = 0;
        printf("per-layer budgets (%d blocks on average, at least %d, at most %d):", f.blocks,
               floor < f.blocks ? floor : f.blocks, nmax);
        for (int r = 0; r < routed; r++) {
            blocks[at[r]] = got_blocks[r];
            uni += curves[(size_t)r * (nmax + 1) + f.blocks];
            got += curves[(size_t)r * (nmax + 1) + got_blocks[r]];
            printf(" %d", got_blocks[r]);
        }
        printf(
            "\nheld-out mass kept, mean over layers: %.4f with %d blocks in every layer, %.4f "
            "with the per-layer budgets\n",
            routed ? uni / routed : 0.0, f.blocks, routed ? got / routed : 0.0);
        bi.n0 = f.blocks, bi.blocks = blocks;
        free(curves), free(at), free(got_blocks);
    }
    blockgate_save(out, &m, wgt, &bi, model_fingerprint(&m));
    printf("wrote %s: evaluate with --router %s --modes blocks_learned:%d\n", out, out, f.blocks);
    blockfit_free(&fit);
    blockfit_free(&held);
    free(wgt), free(init), free(before), free(after), free(offs), free(ids), free(blocks);
    model_free(&m);
    return 0;
}
