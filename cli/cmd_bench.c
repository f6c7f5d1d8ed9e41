/* cmd_bench.c: `focus bench forward`, `focus bench attention`, `focus bench keys` and `focus
 * bench gemm`.
 *
 * forward: times the forward pass with the router off (dense) and on (soft gate), and a
 * router-only training step (forward + backward), on random tokens. Weights are random unless
 * a model file is given: speed does not depend on their values. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <omp.h>

#include "../kernels/cpu.h"
#include "../kernels/sparse.h"
#include "../io/io.h"
#include "cli.h"
#include "commands.h"
#include "../eval/evaluate.h"

#ifdef FOCUS_CUDA
#include "../kernels/cuda/cuda.h"
#endif

static double gemm_gflops(int n, int reps) {
    real* a = mallocCheck(sizeof(real) * n * n);
    real* b = mallocCheck(sizeof(real) * n * n);
    real* c = mallocCheck(sizeof(real) * n * n);
    for (size_t i = 0; i < (size_t)n * n; i++) a[i] = b[i] = (real)((i % 13) * 0.01);
    gemm(0, 1, n, n, n, 1, a, n, b, n, 0, c, n); /* warm-up */
    double t0 = now_seconds();
    for (int r = 0; r < reps; r++) gemm(0, 1, n, n, n, 1, a, n, b, n, 0, c, n);
    double dt = now_seconds() - t0;
    free(a);
    free(b);
    free(c);
    return 2.0 * n * n * (double)n * reps / dt / 1e9;
}

/* Parse "4096,16384" (option what) into up to 16 positive ints; returns the count. */
static int parse_list(const char* s, int* out, const char* what, const char* example) {
    int n = 0;
    while (*s && n < 16) {
        char* end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 1 || v > INT_MAX || (*end && *end != ','))
            fatal("bench: %s '%s': expected positive integers separated by commas (e.g. %s)", what,
                  s, example);
        out[n++] = (int)v;
        s = *end == ',' ? end + 1 : end;
    }
    return n;
}

/* The decode key kernels (f16_rows_scores, f16_rows_mix) over nk keys a head from memory, for
 * the three query heads of each of 3 key/value heads of 30 layers of an 8192-position f16 cache
 * (SmolLM2's decode step), the keys' rows laid out four ways: one run (the window, a contiguous
 * list), runs of 256 and of 64 rows at random places (a group's runs in the KV cache), and
 * single rows at random positions among the first 7600, ascending (a group's keys read from
 * the positions). The caches are flushed between repetitions; the best of iters. */
static int bench_keys(int nk, int reps) {
    enum { L = 30, H = 3, CAP = 8192, HS = 64, SPAN = 7600 };
    if (nk > SPAN) fatal("bench keys: --n %d: at most %d keys a head", nk, SPAN);
    const size_t n = (size_t)L * H * CAP * HS, flush = (size_t)256 << 20;
    uint16_t* k = mallocPages(2 * n); /* as the KV cache is held */
    uint16_t* v = mallocPages(2 * n);
    for (size_t i = 0; i < n; i++)
        k[i] = (uint16_t)(0x3c00 ^ (i & 0xff)), v[i] = (uint16_t)(0x3c00 ^ (i & 0x7f));
    unsigned char* junk = mallocCheck(flush);
    memset(junk, 0, flush);
    int* keys = mallocCheck(sizeof(int) * SPAN);
    float q[H * HS], o[H * (HS + 2)];
    float* sc = mallocCheck(sizeof(float) * H * CAP);
    for (int i = 0; i < H * HS; i++) q[i] = 0.01f * (float)i;
    Rng rng;
    rng_seed(&rng, 1);
    printf(
        "decode key kernels, %d keys a head of an 8192-position f16 cache, %d layers x %d heads, "
        "from memory, one thread (best of %d):\n",
        nk, L, H, reps);
    const char* name[4] = {"one run", "runs of 256 rows", "runs of 64 rows", "single rows"};
    double base = 0;
    for (int lay = 0; lay < 4; lay++) {
        if (lay == 0)
            for (int t = 0; t < nk; t++) keys[t] = t;
        else if (lay < 3) { /* runs of R rows at random run slots of the first SPAN rows */
            const int R = lay == 1 ? 256 : 64, nr = SPAN / R;
            int* slot = mallocCheck(sizeof(int) * nr);
            for (int i = 0; i < nr; i++) slot[i] = i;
            for (int i = nr - 1; i > 0; i--) {
                const int j = (int)(rng_u64(&rng) % (uint64_t)(i + 1)), s = slot[i];
                slot[i] = slot[j], slot[j] = s;
            }
            for (int t = 0; t < nk; t++) keys[t] = slot[t / R] * R + t % R;
            free(slot);
        } else { /* nk of the first SPAN positions, each with the same chance, ascending */
            int c = 0;
            for (int j = 0; j < SPAN && c < nk; j++)
                if ((int)(rng_u64(&rng) % (uint64_t)(SPAN - j)) < nk - c) keys[c++] = j;
        }
        double best = 1e30;
        for (int r = 0; r < reps; r++) {
            for (size_t i = 0; i < flush; i += 64) junk[i]++;
            const double t0 = now_seconds();
            for (int l = 0; l < L; l++)
                for (int g = 0; g < H; g++) {
                    const size_t at = ((size_t)l * H + g) * CAP * HS;
                    f16_rows_scores(sc, CAP, q, H, k + at, HS, keys, 0, nk, HS, 0.125f, v + at);
                    memset(o, 0, sizeof o);
                    f16_rows_mix(o, HS + 2, sc, CAP, H, v + at, HS, keys, 0, nk, HS);
                }
            const double dt = now_seconds() - t0;
            best = dt < best ? dt : best;
        }
        if (!lay) base = best;
        printf("  %-17s %7.3f ms, %6.2f ns a key and head, %.2fx one run\n", name[lay], best * 1e3,
               best * 1e9 / ((double)L * H * nk), best / base);
    }
    free(k), free(v), free(junk), free(keys), free(sc);
    return 0;
}

/* The learned selector's logits as a decode step makes them (block_logits), and Quest's bounds
 * with its choice of 8 blocks (block_select): for the 3 query heads of one key/value head (head
 * size 64, SmolLM2's) over nb blocks' statistics, from memory (each call another head's, in a
 * scrambled order among copies spanning 64 MB, as a step's layers find them) and from cache (the
 * same statistics each call); the best of reps rounds of 2000 calls. */
static int bench_logits(int nb, int reps) {
    enum { HS = 64, REP = 3, BS = 64, W = 512, CALLS = 2000 };
    const size_t sb = BLOCKGATE_STAT_BYTES(HS), head = sb * (size_t)nb;
    const int copies = (int)(((size_t)64 << 20) / head) + 1;
    int8_t* st = mallocPages(head * (size_t)copies);
    Rng rng;
    rng_seed(&rng, 1);
    for (size_t i = 0; i < head * (size_t)copies; i++) st[i] = (int8_t)(rng_u64(&rng) % 255 - 127);
    for (size_t c = 0; c < (size_t)nb * copies; c++) { /* each statistic's scale */
        const float sc[4] = {0.01f, 0.02f, 0.01f, 0.01f};
        memcpy(st + c * sb, sc, sizeof sc);
    }
    real q[REP * HS], gate[REP * BLOCKGATE_WIDTH(HS)];
    real* p = mallocCheck(sizeof(real) * REP * (size_t)nb);
    real* sc = mallocCheck(sizeof(real) * (size_t)nb);
    int sel[8];
    for (int i = 0; i < REP * HS; i++) q[i] = (real)rng_normal(&rng);
    for (int i = 0; i < REP * BLOCKGATE_WIDTH(HS); i++) gate[i] = (real)rng_uniform(&rng);
    const int pos = nb * BS + W; /* the query: nb candidate blocks before its window */
    printf(
        "the learned selector's logits and Quest's choice, %d query heads of head size %d over %d "
        "blocks of %d "
        "keys (%.1f KB of statistics), one thread, best of %d:\n",
        REP, HS, nb, BS, head / 1024.0, reps);
    for (int quest = 0; quest < 2; quest++)
        for (int hot = 0; hot < 2; hot++) {
            double best = 1e30;
            for (int r = 0; r < reps; r++) {
                const double t0 = now_seconds();
                for (int i = 0; i < CALLS; i++) {
                    const size_t at = hot ? 0 : (size_t)(((unsigned)i * 7919u) % (unsigned)copies);
                    if (quest)
                        block_select(sel, BLOCKS_QUEST, q, REP, st + at * head, NULL, NULL, 0, NULL,
                                     0, pos, W, 0, BS, 8, 0, HS, sc, p);
                    else
                        block_logits(p, q, REP, st + at * head, gate, pos, W, 0, BS, HS);
                }
                const double dt = (now_seconds() - t0) / CALLS;
                best = dt < best ? dt : best;
            }
            printf("  %-28s %7.3f us a call (the key/value head's query heads)\n",
                   quest ? (hot ? "Quest's choice, from cache" : "Quest's choice, from memory")
                         : (hot ? "the logits, from cache" : "the logits, from memory"),
                   best * 1e6);
        }
    free(st), free(p), free(sc);
    return 0;
}

/* Dense flash attention against the hard top-k executor on the same random inputs, with
 * synthetic balanced routing: every token's k groups drawn uniformly at random. */
static int bench_attention(const int* Ts, int nT, int K, int topk, int NH, int NKV, int hs, int w,
                           int reps) {
    int nthreads = omp_get_max_threads();
    double gf = gemm_gflops(1024, 5);
    printf(
        "attention benchmark: dense (flash-style) vs Focus hard top-k executor, synthetic balanced "
        "routing\n");
    printf(
        "heads %d / kv-heads %d, head dim %d, K=%d, k=%d, window %d, %d threads, sgemm %.1f "
        "GFLOP/s\n",
        NH, NKV, hs, K, topk, w, nthreads, gf);
    printf("%9s %11s %11s %12s %12s %9s %14s\n", "T", "pairs kept", "pair work", "dense ms",
           "focus ms", "speed-up", "dense GFLOP/s");
    Rng rng;
    rng_seed(&rng, 2026);
    for (int t = 0; t < nT; t++) {
        int T = Ts[t];
        size_t nqkv = (size_t)T * (NH + 2 * NKV) * hs;
        real* qkv = mallocCheck(sizeof(real) * nqkv);
        real* out = mallocCheck(sizeof(real) * (size_t)T * NH * hs);
        real* lse = mallocCheck(sizeof(real) * (size_t)T * NH);
        uint32_t* mask = mallocCheck(sizeof(uint32_t) * T);
        for (size_t i = 0; i < nqkv; i++) qkv[i] = (real)(rng_normal(&rng));
        for (int i = 0; i < T; i++) {
            uint32_t m = 0;
            while (__builtin_popcount(m) < topk) m |= 1u << (rng_u64(&rng) % (uint64_t)K);
            mask[i] = m;
        }
        double dense_pairs = (double)T * (T + 1) / 2;
        double work = hard_pair_count(mask, K, w, T) / dense_pairs;
        /* kept pairs: the local band exactly, distant pairs estimated from 2^20 random samples */
        double local = 0, far_hits = 0, far_total = dense_pairs;
        for (int i = 0; i < T; i++) local += i < w ? i + 1 : w + 1;
        far_total -= local;
        int samples = far_total > 0 ? 1 << 20 : 0;
        for (int sidx = 0; sidx < samples; sidx++) {
            int i = w + 1 + (int)(rng_u64(&rng) % (uint64_t)(T - w - 1 > 0 ? T - w - 1 : 1));
            if (i >= T) continue;
            int j = (int)(rng_u64(&rng) % (uint64_t)(i - w));
            far_hits += (mask[i] & mask[j]) != 0;
        }
        double kept = (local + (samples ? far_hits / samples * far_total : 0)) / dense_pairs;
        double td = 1e30, tf = 1e30;
        for (int r = 0; r < reps; r++) {
            double t0 = now_seconds();
            attention_flash_forward(out, lse, qkv, 1, T, NH, NKV, hs);
            double t1 = now_seconds();
            attention_hard_forward(out, lse, qkv, mask, mask, K, w, 1, T, NH, NKV, hs);
            double t2 = now_seconds();
            td = fmin(td, t1 - t0), tf = fmin(tf, t2 - t1);
        }
        double flops = 4.0 * NH * hs * (double)T * (T + 1) / 2;
        printf("%9d %11.4f %11.4f %12.1f %12.1f %8.2fx %8.1f (%2.0f %%)\n", T, kept, work, td * 1e3,
               tf * 1e3, td / tf, flops / td / 1e9, 100 * flops / td / 1e9 / gf);
        fflush(stdout);
        free(qkv), free(out), free(lse), free(mask);
    }
    return 0;
}

#ifdef FOCUS_CUDA
/* Fraction of causal pairs kept by one sequence's masks: the local band plus the distant pairs
 * sharing a group; exact (per-group counts) when every token has one group, else estimated from
 * 2^20 random distant pairs. */
static double kept_fraction(const uint32_t* mask, int w, int T) {
    double dense = (double)T * (T + 1) / 2, local = 0, far = 0;
    for (int i = 0; i < T; i++) local += i < w ? i + 1 : w + 1;
    int single = 1;
    for (int i = 0; i < T && single; i++) single = __builtin_popcount(mask[i]) == 1;
    if (single) {
        double count[32] = {0}; /* keys j < i - w with each group */
        for (int i = w + 1; i < T; i++) {
            count[__builtin_ctz(mask[i - w - 1])] += 1;
            far += count[__builtin_ctz(mask[i])];
        }
    } else if (T > w + 1) {
        Rng rng;
        rng_seed(&rng, 99);
        double hits = 0;
        const int samples = 1 << 20;
        for (int s = 0; s < samples; s++) {
            int i = w + 1 + (int)(rng_u64(&rng) % (uint64_t)(T - w - 1));
            int j = (int)(rng_u64(&rng) % (uint64_t)(i - w));
            hits += (mask[i] & mask[j]) != 0;
        }
        far = hits / samples * (dense - local);
    }
    return (local + far) / dense;
}

/* GPU attention benchmark: the bf16 tensor-core dense kernel against the hard top-k executor
 * on the same random inputs, synthetic balanced routing, for each T and each K. */
static int bench_attention_cuda(const int* Ts, int nT, const int* Ks, int nK, int topk, int NH,
                                int NKV, int hs, int w, int reps, const char* json) {
    cuda_init(0);
    printf("GPU attention benchmark: bf16 dense (our flash kernel) vs Focus hard top-k executor\n");
    printf("heads %d / kv-heads %d, head dim %d, k=%d, window %d, synthetic balanced routing\n", NH,
           NKV, hs, topk, w);
    printf("%9s %3s %10s %11s %11s %9s %13s\n", "T", "K", "pairs kept", "dense ms", "focus ms",
           "speed-up", "dense TFLOP/s");
    FILE* jf = json ? fopen(json, "w") : NULL;
    if (json && !jf) fatal("%s: cannot open for writing", json);
    if (jf) fprintf(jf, "[\n");
    int first_row = 1;
    HardPlan* plan = hard_plan_create();
    for (int t = 0; t < nT; t++) {
        int T = Ts[t];
        size_t nqkv = (size_t)T * (NH + 2 * NKV) * hs;
        uint16_t* qkv = cuda_malloc(2 * nqkv);
        float* out = cuda_malloc(sizeof(float) * (size_t)T * NH * hs);
        float* lse = cuda_malloc(sizeof(float) * (size_t)T * NH);
        uint32_t* mask = cuda_malloc(sizeof(uint32_t) * T);
        cuda_fill_normal_bf16(qkv, nqkv, 2026 + T);
        int r = T >= (1 << 18) ? 1 : reps;
        /* warm-up (kernel loading, the plan's buffers) */
        attention_flash_forward_bf16_cuda(out, lse, qkv, 1, T < 4096 ? T : 4096, NH, NKV, hs);
        cuda_sync();
        double td = 1e30;
        for (int i = 0; i < r; i++) {
            double t0 = now_seconds();
            attention_flash_forward_bf16_cuda(out, lse, qkv, 1, T, NH, NKV, hs);
            cuda_sync();
            td = fmin(td, now_seconds() - t0);
        }
        double flops = 4.0 * NH * hs * (double)T * (T + 1) / 2;
        for (int k = 0; k < nK; k++) {
            int K = Ks[k];
            cuda_random_masks(mask, T, K, topk, 77 + K);
            uint32_t* hmask = mallocCheck(sizeof(uint32_t) * T);
            cuda_download(hmask, mask, sizeof(uint32_t) * T);
            double kept = kept_fraction(hmask, w, T);
            free(hmask);
            attention_hard_forward_bf16_cuda(plan, out, lse, qkv, mask, K, w, 1, T, NH, NKV, hs);
            cuda_sync();
            double tf = 1e30;
            for (int i = 0; i < r; i++) {
                double t0 = now_seconds();
                attention_hard_forward_bf16_cuda(plan, out, lse, qkv, mask, K, w, 1, T, NH, NKV,
                                                 hs);
                cuda_sync();
                tf = fmin(tf, now_seconds() - t0);
            }
            printf("%9d %3d %10.4f %11.2f %11.2f %8.2fx %13.1f\n", T, K, kept, td * 1e3, tf * 1e3,
                   td / tf, flops / td / 1e12);
            fflush(stdout);
            if (jf) {
                fprintf(jf,
                        "%s  {\"T\": %d, \"K\": %d, \"topk\": %d, \"heads\": %d, \"head_dim\": %d, "
                        "\"w\": %d, \"pairs_kept\": %.6f, \"dense_ms\": %.4f, \"focus_ms\": %.4f, "
                        "\"dense_tflops\": %.2f}",
                        first_row ? "" : ",\n", T, K, topk, NH, hs, w, kept, td * 1e3, tf * 1e3,
                        flops / td / 1e12);
                first_row = 0;
            }
        }
        cuda_free(qkv), cuda_free(out), cuda_free(lse), cuda_free(mask);
    }
    hard_plan_free(plan);
    if (jf) {
        fprintf(jf, "\n]\n");
        fclose_checked(jf, json);
    }
    return 0;
}
#endif

/* bench forward's weights: N(0, 0.02) matrices, unit norms, zero biases, each slab drawn from
 * its own seed, so a tensor-parallel slice holds exactly its part of the one-process model (and
 * prints the same loss) */
static void random_slab(void* ctx, int t, int l, real* dst) {
    const ModelConfig* c = ctx;
    const size_t n = model_param_slab(c, t);
    const ParamInit init = model_params[t].init;
    const int norm = init == INIT_ONE, bias = init == INIT_ZERO;
    Rng rng;
    rng_seed(&rng, 0x5eed0000ull + (uint64_t)t * 4096 + (uint64_t)l);
    for (size_t i = 0; i < n; i++) dst[i] = norm ? 1 : bias ? 0 : (real)(0.02 * rng_normal(&rng));
}

/* "  (N % in all-reduces)" of a tensor-parallel run's comm seconds out of total, else "" */
static void comm_share(char* buf, size_t n, int tp, double comm, double total) {
    buf[0] = 0;
    if (tp > 1) snprintf(buf, n, "  (%.0f %% in all-reduces)", 100 * comm / total);
}

/* The usage of each bench subcommand; bench --help prints them all. */
static const char bench_forward_usage[] =
    "usage: focus bench forward [--preset NAME] [--set key=value]... [--B n] [--T n] [--iters n]\n"
    "forward: tokens/s of the forward pass dense (router off) and Focus (soft gate), and of a\n"
    "router-only training step (forward + backward), at batch B x T on random tokens.\n"
    "  --preset NAME   gpt2-124m | smollm2-135m | tiny-gpt2 | tiny-llama (default smollm2-135m),\n"
    "                  or a real shape with random weights: llama2-7b | llama2-13b | llama2-70b |\n"
    "                  mistral-7b | qwen2.5-7b | llama3-8b (fewer layers with --set L=2)\n"
    "  --set k=v       override a model or Focus setting (e.g. K=4, w=64, routing=causal, L=2)\n"
    "  --iters n       timed repetitions of each measurement (default 2)\n"
    "  --weights bf16  the frozen projections stored in bf16 (CPU; default fp32)\n"
    "  --tp T          under mpirun -np T: the model cut into T tensor-parallel slices, one\n"
    "                  per rank (rank 0 prints; the share of time in all-reduces is shown)\n"
    "  --device cuda   run on the GPU; --json FILE writes the figures as JSON\n";
static const char bench_gemm_usage[] =
    "usage: focus bench gemm [--n 2048] [--iters 2]\n"
    "gemm: single-precision n x n x n matrix product rate, the machine's practical peak.\n";
static const char bench_attention_usage[] =
    "usage: focus bench attention [--T 4096,16384,65536] [--K 8] [--topk 1] [--heads 1]\n"
    "                             [--kv-heads 1] [--dhead 64] [--w 128] [--iters 1]\n"
    "                             [--device cuda] [--json FILE]\n"
    "attention: dense vs the hard top-k executor, same random inputs, synthetic balanced\n"
    "routing; prints pairs kept, ms, speed-up per T. --device cuda: bf16 tensor-core kernels on\n"
    "the GPU, --K may list several values (8,4); --json FILE writes one record per (T, K).\n";
static const char bench_keys_usage[] =
    "usage: focus bench keys [--n 2048] [--iters 20]\n"
    "keys: the decode step's key kernels over n keys a head from memory (SmolLM2's cache at\n"
    "8K: 30 layers, 3 key/value heads of 3 queries, f16), the keys laid out as one run, as runs\n"
    "of 256 and of 64 rows, and as single rows at random positions; ns a key and head.\n";
static const char bench_logits_usage[] =
    "usage: focus bench logits [--n 127] [--iters 5]\n"
    "logits: the learned block selector's logits of a decode step for one key/value head's 3\n"
    "query heads (head size 64) over n blocks of 64 keys (127: SmolLM2 at 8K), and Quest's\n"
    "bounds with its choice of 8, the blocks' statistics from memory and from cache; us a call.\n";
static const char bench_decode_line[] =
    "decode: focus bench decode --model M [--ctx 1024] [-n 64] [--weights native|f32]:\n"
    "generation speed (focus bench decode --help).\n";

static void bench_help(FILE* f) {
    fprintf(f, "%s\n%s\n%s\n%s\n%s\n%s", bench_forward_usage, bench_gemm_usage,
            bench_attention_usage, bench_keys_usage, bench_logits_usage, bench_decode_line);
}

int cmd_bench(int argc, char** argv) {
    if (argc < 2 || !strcmp(argv[1], "--help")) {
        bench_help(stdout);
        return argc < 2 ? 1 : 0;
    }
    const char* what = argv[1];
    if (!strcmp(what, "decode")) return cmd_bench_decode(argc, argv);
    const char *preset = "smollm2-135m", *config = NULL;
    int B = 1, T = 1024, iters = 0, gemm_n = 0; /* iters: 2, or 20 for keys, unless given */
    int Ts[16] = {4096, 16384, 65536}, nT = 3, K = 8, topk = 1, heads = 1, kv_heads = 1, dhead = 64,
        w = 128;
    ModelConfig cfg;
    FocusConfig fc;
    focus_config_default(&fc);
    CliList sets = {0};
    int device = 0, Ks[16] = {8}, nK = 1, tp = 1;
    const char* weights = "fp32";
    const char* json = NULL;
    const char *Tlist = NULL, *Klist = NULL;
    if (cli_parse(
            "bench", argc, argv, 2,
            !strcmp(what, "gemm")        ? bench_gemm_usage
            : !strcmp(what, "attention") ? bench_attention_usage
            : !strcmp(what, "keys")      ? bench_keys_usage
            : !strcmp(what, "logits")    ? bench_logits_usage
                                         : bench_forward_usage,
            "--preset:s --config:s --set:* --B:i[1,4096] --T:s --iters:i[1,100000] --n:i[1,16384] "
            "--K:s "
            "--device:d "
            "--json:s --topk:i[1,32] --heads:i[1,1024] --kv-heads:i[1,1024] --dhead:i[1,1024] "
            "--w:i[0,1048576] --tp:i[1,4096] --weights:s",
            &preset, &config, &sets, &B, &Tlist, &iters, &gemm_n, &Klist, &device, &json, &topk,
            &heads, &kv_heads, &dhead, &w, &tp, &weights))
        return 0;
    if (config)
        fatal(
            "bench: --config takes a settings file (retrofit, finetune, pretrain); the model "
            "shapes here are presets: --preset %s",
            config);
    if (comm_launched_by_mpi() && strcmp(what, "forward"))
        fatal("bench %s runs in one process; under mpirun only bench forward --tp runs", what);
    /* attention takes lists of lengths and group counts; forward one length */
    if (Tlist && !strcmp(what, "attention"))
        nT = parse_list(Tlist, Ts, "--T", "1024,4096");
    else if (Tlist)
        T = cli_int("--T", Tlist);
    if (Klist) {
        nK = parse_list(Klist, Ks, "--K", "4,8,16");
        K = Ks[0];
    }
    const int iters_given = iters > 0, gemm_n_given = gemm_n > 0;
    if (!gemm_n_given) gemm_n = 2048;
    if (!iters_given) iters = 2;
    if (B < 1 || T < 1 || iters < 1) fatal("bench: --B, --T and --iters must be positive");
    if (strcmp(what, "forward") && sets.n) fatal("bench: --set applies to bench forward only");
    if (!strcmp(what, "attention")) {
        if (K < 1 || K > 32 || topk < 1 || topk > K)
            fatal("bench attention: need 1 <= topk <= K <= 32");
        if (heads < 1 || kv_heads < 1 || heads % kv_heads || dhead < 1 || w < 0)
            fatal("bench attention: bad head settings");
        for (int k = 0; k < nK; k++)
            if (Ks[k] > 32 || topk > Ks[k]) fatal("bench attention: need 1 <= topk <= K <= 32");
#ifdef FOCUS_CUDA
        if (device)
            return bench_attention_cuda(Ts, nT, Ks, nK, topk, heads, kv_heads, dhead, w, iters,
                                        json);
#endif
        if (nK > 1) fatal("bench attention: one K at a time on the CPU");
        return bench_attention(Ts, nT, K, topk, heads, kv_heads, dhead, w, iters);
    }
    int nthreads = omp_get_max_threads();
    if (!strcmp(what, "gemm")) {
        printf("sgemm %d x %d x %d, %d threads: %.1f GFLOP/s\n", gemm_n, gemm_n, gemm_n, nthreads,
               gemm_gflops(gemm_n, 5));
        return 0;
    }
    if (!strcmp(what, "keys")) return bench_keys(gemm_n, iters_given ? iters : 20);
    if (!strcmp(what, "logits"))
        return bench_logits(gemm_n_given ? gemm_n : 127, iters_given ? iters : 5);
    if (strcmp(what, "forward"))
        fatal("bench: unknown benchmark '%s' (forward | decode | gemm | attention | keys | logits)",
              what);
    if (model_config_preset(preset, &cfg))
        fatal(
            "bench: unknown preset '%s' (gpt2-124m | smollm2-135m | tiny-gpt2 | tiny-llama | "
            "llama2-7b | llama2-13b | llama2-70b | mistral-7b | qwen2.5-7b | llama3-8b)",
            preset);
    for (int i = 0; i < sets.n; i++) cli_apply_set(&cfg, &fc, sets.v[i]);
    free(sets.v);
    if (cfg.maxT < T) cfg.maxT = T;
    fc.attn = ATTN_SOFT;
    config_validate(&cfg, &fc);
    Comm* world = comm_world(&argc, &argv);
    if (world->size != tp)
        fatal("bench forward: --tp %d needs mpirun -np %d (this run has %d rank%s)", tp, tp,
              world->size, world->size > 1 ? "s" : "");
    if (world->rank && !freopen("/dev/null", "w", stdout))
        fatal("bench: rank %d: cannot silence its output", world->rank);
    if (tp > 1 && device) fatal("bench forward: --tp runs on CPU ranks (--device cuda: one GPU)");
    config_print(&cfg, &fc, stdout);

    Model m;
    if (strcmp(weights, "bf16") && strcmp(weights, "fp32"))
        fatal("bench forward: --weights must be fp32 or bf16, got '%s'", weights);
    const ModelLayout lay = {tp > 1 ? world : NULL,
                             strcmp(weights, "bf16") ? WEIGHTS_FP32 : WEIGHTS_BF16_PROJ};
    model_build_slice(&m, &cfg, &fc, &lay);
    model_fill(&m, &cfg, &(WeightSource){&cfg, random_slab});
    if (tp > 1)
        printf(
            "tensor-parallel over %d %s ranks: %d of the %d heads (%d kv) and %d of F = %d "
            "each\n",
            tp, world->ops->name, model_heads(&m.cfg), cfg.NH, model_kv_heads(&m.cfg),
            model_ffn(&m.cfg), cfg.F);
    size_t n = (size_t)B * T;
    int* tok = mallocCheck(sizeof(int) * n);
    int* tgt = mallocCheck(sizeof(int) * n);
    Rng rng;
    rng_seed(&rng, 5);
    for (size_t i = 0; i < n; i++)
        tok[i] = (int)(rng_u64(&rng) % cfg.V), tgt[i] = (int)(rng_u64(&rng) % cfg.V);
    printf(
        "model: %.1fM backbone parameters (%.1fM on this rank), %zu router parameters (%.3f %%), "
        "B=%d T=%d, %d threads\n",
        model_param_count(&cfg) / 1e6, m.num_params / 1e6, m.num_router,
        100.0 * m.num_router / model_param_count(&cfg), B, T, nthreads);

    /* on the GPU, percentages are of the CPU's rate make no sense: report TFLOP/s only */
    double gf = device ? 0 : gemm_gflops(gemm_n, 3);
    if (!device)
        printf("machine sgemm rate (%d^3): %.1f GFLOP/s%s\n", gemm_n, gf,
               tp > 1 ? " per rank (percentages below: of all ranks together)" : "");
    model_place(&m, device ? "cuda" : "cpu");
#ifdef FOCUS_CUDA
    if (device) {
        AttnGate probe = {GATE_SOFT, fc.K, fc.w, NULL, NULL, 0, 0, 0};
        printf("training attention: %s\n",
               attention_mma_applies(&probe, model_head_size(&cfg))
                   ? "bf16 tensor cores (FOCUS_ATTN_MMA=0 for the fp32 kernels)"
                   : "fp32 flash kernels");
    }
#endif
    /* Approximate forward FLOPs: 2 per weight per token in matrix products, plus causal attention.
     */
    double matflops =
        2.0 *
        (double)(model_param_count(&cfg) - (cfg.arch == ARCH_GPT2 ? (size_t)cfg.maxT * cfg.C : 0) +
                 (cfg.tied ? (size_t)cfg.V * cfg.C : 0) - (size_t)cfg.V * cfg.C) *
        n;
    double attflops = 4.0 * cfg.L * cfg.C * (double)T * (T + 1) / 2 * B;

    const char* modes[2] = {"dense", "focus soft"};
    double fwd_tps[2] = {0, 0};
    char commtxt[64] = "";
    for (int mode = 0; mode < 2; mode++) {
        m.fc.attn = mode ? ATTN_SOFT : ATTN_DENSE;
        model_forward(&m, tok, tgt, B, T, 0); /* warm-up and allocation */
        double t0 = now_seconds(), c0 = world->seconds;
        for (int r = 0; r < iters; r++) model_forward(&m, tok, tgt, B, T, 0);
        double dt = (now_seconds() - t0) / iters;
        comm_share(commtxt, sizeof commtxt, tp, world->seconds - c0, iters * dt);
        if (device)
            printf("forward %-11s %8.1f tokens/s  %8.1f ms  ~%.1f TFLOP/s  loss %.4f\n",
                   modes[mode], n / dt, dt * 1e3, (matflops + attflops) / dt / 1e12,
                   (double)m.mean_loss);
        else
            printf(
                "forward %-11s %8.1f tokens/s  %8.1f ms  ~%.1f GFLOP/s (%.0f %% of sgemm)  loss "
                "%.4f%s\n",
                modes[mode], n / dt, dt * 1e3, (matflops + attflops) / dt / 1e9,
                100.0 * (matflops + attflops) / dt / 1e9 / (gf * tp), (double)m.mean_loss, commtxt);
        fwd_tps[mode] = n / dt;
    }
    m.fc.attn = ATTN_SOFT;
    model_forward(&m, tok, tgt, B, T, 1);
    model_zero_grad(&m, GRAD_ROUTER);
    model_backward(&m, GRAD_ROUTER);
#ifdef FOCUS_CUDA
    if (device) cuda_prof_report(NULL); /* FOCUS_PROFILE=1: time the training steps alone */
#endif
    double t0 = now_seconds(), c0 = world->seconds;
    for (int r = 0; r < iters; r++) {
        model_forward(&m, tok, tgt, B, T, 1);
        model_zero_grad(&m, GRAD_ROUTER);
        model_backward(&m, GRAD_ROUTER);
    }
    double dt = (now_seconds() - t0) / iters;
    comm_share(commtxt, sizeof commtxt, tp, world->seconds - c0, iters * dt);
#ifdef FOCUS_CUDA
    if (device) cuda_prof_report("router training steps, all iterations");
#endif
    t0 = now_seconds();
    for (int r = 0; r < iters; r++) model_forward(&m, tok, tgt, B, T, 1);
    double dtf = (now_seconds() - t0) / iters;
    printf(
        "train step (router-only fwd+bwd) %8.1f tokens/s  %8.1f ms (forward %.1f ms, backward %.1f "
        "ms)%s\n",
        n / dt, dt * 1e3, dtf * 1e3, (dt - dtf) * 1e3, commtxt);
    printf("peak RSS %.0f MiB\n", peak_rss_mib());
    if (json) {
        FILE* jf = fopen(json, "w");
        if (!jf) fatal("%s: cannot open for writing", json);
        fprintf(jf,
                "{\"config\": \"%s\", \"device\": \"%s\", \"B\": %d, \"T\": %d, "
                "\"forward_dense_tokens_per_s\": %.1f, \"forward_soft_tokens_per_s\": %.1f, "
                "\"train_step_tokens_per_s\": %.1f, \"train_step_ms\": %.3f, \"train_forward_ms\": "
                "%.3f}\n",
                preset, device ? "cuda" : "cpu", B, T, fwd_tps[0], fwd_tps[1], n / dt, dt * 1e3,
                dtf * 1e3);
        fclose_checked(jf, json);
    }
    free(tok);
    free(tgt);
    model_free(&m);
    comm_free(world);
    return 0;
}
