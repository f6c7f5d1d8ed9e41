/* test_decode.c: the KV-cache decode path. Feeding a sequence token by token gives the logits of
 * a full-sequence pass: dense (router off), and hard top-k (k = 1 and 2) in causal routing, for
 * tiny GPT-2 and LLaMA models (each token's keys split among three threads and the parts
 * merged, as long contexts are); so does a batched prefill of the first tokens followed by
 * decoding, which leaves the cache (group lists, pair counts) as decoding would; the same for
 * the training-free patterns and the block patterns (Quest bounds, mean keys, a learned
 * selector with random weights: the blocks a query chooses from the cache's block statistics
 * are the forward pass's). Also: the hard
 * decode path evaluates fewer pairs than dense; several caches decoded in one batch step give
 * each cache's own logits bit for bit; a truncated cache goes on as the untruncated one did. */
#include <math.h>
#include <string.h>

#include <omp.h>

#include "../kernels/cpu.h"
#include "../model/decode.h"
#include "testutil.h"

enum { T = 70 };

static int nthreads;

/* Three sequences decoded together (model_decode_batch, one row per cache, some joining late)
 * give bit for bit the logits and group lists of each decoded alone; a cache truncated to its
 * first tokens and fed the rest again gives them again. */
static void check_batch(Model* m, const int* tok, const char* preset) {
    const int V = m->cfg.V;
    enum { S = 3, N = 30 };
    KVCache alone[S], batch[S];
    real* want = mallocCheck(sizeof(real) * S * N * V);
    real* got = mallocCheck(sizeof(real) * S * V);
    int seq[S][N];
    for (int s = 0; s < S; s++)
        for (int t = 0; t < N; t++) seq[s][t] = tok[(t * (s + 1) + 7 * s) % T];
    for (int s = 0; s < S; s++) {
        kvcache_init(&alone[s], m, N, 1);
        kvcache_init(&batch[s], m, N, 1);
        for (int t = 0; t < N; t++)
            model_decode_step(m, &alone[s], seq[s][t], want + ((size_t)s * N + t) * V);
    }
    int same = 1;
    for (int step = 0; step < N + 4; step++) { /* sequence s starts at step 2 s */
        KVCache* cs[S];
        int tk[S], who[S], n = 0;
        for (int s = 0; s < S; s++) {
            const int t = step - 2 * s;
            if (t < 0 || t >= N) continue;
            cs[n] = &batch[s], tk[n] = seq[s][t], who[n++] = s;
        }
        char why[160];
        CHECK(model_decode_batch(m, cs, tk, n, got, NULL, why, sizeof why), "%s: %s", preset, why);
        for (int i = 0; i < n; i++) {
            const int s = who[i], t = step - 2 * s;
            same &= !memcmp(got + (size_t)i * V, want + ((size_t)s * N + t) * V, sizeof(real) * V);
        }
    }
    for (int s = 0; s < S; s++)
        same &= !memcmp(batch[s].gn, alone[s].gn, sizeof(int) * m->cfg.L * m->fc.K);
    CHECK(same, "%s: decoding three caches together differs from decoding each alone", preset);
    /* truncate to 12 tokens, feed tokens 12 .. N - 1 again: the same logits and group lists */
    kvcache_truncate(&batch[1], 12);
    for (int t = 12; t < N; t++) {
        model_decode_step(m, &batch[1], seq[1][t], got);
        same &= !memcmp(got, want + ((size_t)N + t) * V, sizeof(real) * V);
    }
    same &= !memcmp(batch[1].gn, alone[1].gn, sizeof(int) * m->cfg.L * m->fc.K);
    CHECK(same, "%s: a truncated cache fed its tokens again differs", preset);
    { /* a full cache: an error the caller handles, nothing fed */
        KVCache full;
        kvcache_init(&full, m, 2, 0);
        KVCache* one[1] = {&full};
        char why[160] = "";
        int ok = 1;
        for (int i = 0; i < 3 && ok; i++)
            ok = model_decode_batch(m, one, seq[0], 1, got, NULL, why, sizeof why);
        CHECK(!ok && full.n == 2 && strstr(why, "KV cache full"),
              "%s: a third token into a cache of 2: '%s', %d cached", preset, why, full.n);
        ok = model_prefill_checked(m, &full, seq[0], 1, got, 0, why, sizeof why);
        CHECK(!ok && full.n == 2, "%s: a prompt into a full cache is refused", preset);
        kvcache_free(&full);
    }
    for (int s = 0; s < S; s++) kvcache_free(&alone[s]), kvcache_free(&batch[s]);
    free(want), free(got);
}

/* The group runs (each group's keys and values copied in runs, kvcache.c) over twelve rounds
 * of one cache: each round truncates it (to its first 3 tokens, or to none where the router's
 * bias changed) and feeds another prompt (its tokens turned, and the bias pushing them into one
 * group, another every second round: a list grows over another's old rows, the runs grow and
 * are compacted), then decodes 4 tokens;
 * each round gives bit for bit the logits of a fresh cache fed the same, and the runs stay
 * within what the lists can hold. */
static void check_runs(Model* m, const int* tok, const char* preset) {
    const int V = m->cfg.V, K = m->fc.K, N = T - 4;
    real* want = mallocCheck(sizeof(real) * N * V);
    real* got = mallocCheck(sizeof(real) * N * V);
    real* wl = mallocCheck(sizeof(real) * V);
    real* gl = mallocCheck(sizeof(real) * V);
    KVCache c, f;
    kvcache_init(&c, m, T, 1);
    int same = 1, most = 0;
    const size_t nb = (size_t)m->cfg.L * K;
    real* beta = mallocCheck(sizeof(real) * nb);
    memcpy(beta, m->beta, sizeof(real) * nb);
    for (int round = 0; round < 12; round++) {
        for (size_t i = 0; i < nb; i++)
            m->beta[i] = beta[i] + (real)((int)(i % K) == round / 2 % K ? 4 : 0);
        const int keep = round % 2 ? 3 : 0; /* (the kept tokens' groups: this bias's) */
        int seq[T];
        for (int t = 0; t < T; t++)
            seq[t] = t < 3 ? tok[t] : tok[(t * (round % 5 + 1) + 11 * round) % T];
        kvcache_init(&f, m, T, 1);
        model_prefill(m, &f, seq, N, want, 1);
        kvcache_truncate(&c, keep);
        memcpy(got, want, sizeof(real) * keep * V); /* (the kept rows: c's cached ones) */
        model_prefill(m, &c, seq + keep, N - keep, got + (size_t)keep * V, 1);
        same &= !memcmp(want, got, sizeof(real) * N * V);
        for (int t = N; t < T; t++) {
            model_decode_step(m, &f, seq[t], wl);
            model_decode_step(m, &c, seq[t], gl);
            same &= !memcmp(wl, gl, sizeof(real) * V);
        }
        kvcache_free(&f);
        for (int l = 0; l < m->cfg.L; l++) {
            /* what the lists can hold, every sink in every group, and a third more */
            const int can = (kvcache_runs_most(&c, l) + K * m->fc.sinks + c.run) * 4 / 3 + c.run;
            if (c.prow[l] > can) most = c.prow[l];
        }
    }
    memcpy(m->beta, beta, sizeof(real) * nb);
    free(beta);
    CHECK(same, "%s: a cache reused over twelve prompts differs from fresh caches", preset);
    CHECK(!most, "%s: the group runs grew to %d rows a head", preset, most);
    kvcache_free(&c);
    free(want), free(got), free(wl), free(gl);
}

/* A prompt gives the same bits however it is cut: fed in one call, in chunks of 1, 5, 13 and the
 * rest, or after a cache that held other tokens (truncated to a shared prefix): every row's logits
 * and the cached keys and values. Decoding on gives the same bits on one thread as on three. */
static void check_chunks(Model* m, const int* tok, int half, const char* preset) {
    const int V = m->cfg.V;
    const size_t hrow = (size_t)model_head_size(&m->cfg) * (half ? 2 : sizeof(real)); /* a head's */
    real* one = mallocCheck(sizeof(real) * T * V);
    real* cut = mallocCheck(sizeof(real) * T * V);
    KVCache a, b;
    kvcache_init(&a, m, T, half);
    kvcache_init(&b, m, T, half);
    a.split_min = b.split_min = 1;
    model_prefill(m, &a, tok, T - 4, one, 1);
    /* b held another prompt sharing the first 9 tokens, truncated there */
    int other[T];
    memcpy(other, tok, sizeof other);
    for (int t = 9; t < T; t++) other[t] = (tok[t] + 1) % V;
    model_prefill(m, &b, other, 30, cut, 1);
    kvcache_truncate(&b, 9);
    memcpy(cut, one, sizeof(real) * 9 * V); /* (rows 0 .. 8 are b's cached ones) */
    const int sizes[] = {1, 5, 13};
    int at = 9;
    for (int i = 0; at < T - 4; i++) {
        const int k = i < 3 && at + sizes[i] < T - 4 ? sizes[i] : T - 4 - at;
        model_prefill(m, &b, tok + at, k, cut + (size_t)at * V, 1);
        at += k;
    }
    int same = !memcmp(one, cut, sizeof(real) * (T - 4) * V);
    for (int l = 0; l < m->cfg.L * m->cfg.NKV; l++) { /* each layer and head's first T - 4 rows */
        const size_t at = l * hrow * T;
        same &= !memcmp((char*)a.k + at, (char*)b.k + at, hrow * (T - 4)) &&
                !memcmp((char*)a.v + at, (char*)b.v + at, hrow * (T - 4));
    }
    CHECK(same, "%s (%s cache): a prompt fed in chunks after a reused prefix differs from one call",
          preset, half ? "f16" : "f32");
    /* decoding on: one thread, then three, from equal caches */
    for (int t = T - 4; t < T; t++) {
        omp_set_num_threads(1);
        model_decode_step(m, &a, tok[t], one);
        omp_set_num_threads(3);
        model_decode_step(m, &b, tok[t], cut);
        same &= !memcmp(one, cut, sizeof(real) * V);
    }
    omp_set_num_threads(nthreads);
    CHECK(same, "%s (%s cache): decoding on one thread differs from three", preset,
          half ? "f16" : "f32");
    kvcache_free(&a), kvcache_free(&b);
    free(one), free(cut);
}

/* how the next runs' sliding-window layers attend (gemma3) */
static LocalLayers local_mode = LOCAL_WINDOW;
/* a router with a query projection in the next runs (qproj) */
static int qproj_mode = 0;
/* the router's groups beside the blocks of a block pattern (--router SELECTOR.h5,ROUTER.h5) */
static int groups_mode = 0;
/* the block patterns' mass-adaptive budget in the next runs (blocks_p; 0: 2 blocks) */
static float blocks_p = 0;

static void run(const char* preset, AttnMode attn, int topk, int sinks, float topp, int dense0) {
    ModelConfig cfg;
    FocusConfig fc;
    model_config_preset(preset, &cfg);
    cfg.maxT = T;
    focus_config_default(&fc);
    fc.K = 4, fc.dg = 8, fc.w = 6, fc.routing = ROUTE_CAUSAL, fc.attn = attn, fc.topk = topk;
    fc.sinks = sinks, fc.topp = topp, fc.local = local_mode, fc.qproj = qproj_mode;
    if (dense0) fc.dense_layers[0] = 1;
    const AttnMethod* am = attn_methods[attn];
    const int blocks = attn_is_blocks(attn);
    if (blocks)
        fc.block = 4, fc.blocks = blocks_p > 0 ? 3 : 2,
        fc.blocks_p = blocks_p; /* w = 6 >= block - 1 */
    Model m;
    model_build(&m, &cfg, &fc);
    if (attn == ATTN_BLOCKS_LEARNED) {
        const int W = BLOCKGATE_WIDTH(model_head_size(&cfg));
        Rng wr;
        rng_seed(&wr, 9);
        m.method.selector = mallocCheck(sizeof(real) * (size_t)cfg.L * cfg.NH * W);
        blockgate_init(m.method.selector, cfg.L * cfg.NH, model_head_size(&cfg));
        for (int i = 0; i < cfg.L * cfg.NH * W; i++)
            m.method.selector[i] += (real)(0.3 * rng_normal(&wr));
        if (sinks) { /* per-layer budgets: 1 and 3 blocks, 2 on average */
            m.method.selector_blocks = mallocCheck(sizeof(int) * cfg.L);
            for (int l = 0; l < cfg.L; l++) m.method.selector_blocks[l] = l % 2 ? 3 : 1;
            m.method.selector_n0 = 2;
        }
    }
    m.method.with_groups = blocks && groups_mode;
    model_init_backbone(&m, 31);
    for (size_t i = 0; i < m.num_params; i++)
        if (m.params_mem[i] != 1 && m.params_mem[i] != 0) m.params_mem[i] *= 10;
    for (int i = 0; i < cfg.L * fc.K; i++) m.beta[i] = (real)(0.3 * (i % 5));
    if (m.router.wq) { /* the queries' projection apart from the keys' */
        Rng qr;
        rng_seed(&qr, 17);
        for (size_t i = 0; i < m.router_sizes[ROUTER_WQ]; i++)
            m.router.wq[i] += (real)(0.2 * rng_normal(&qr));
    }
    Rng rng;
    rng_seed(&rng, 3);
    int tok[T];
    for (int t = 0; t < T; t++) tok[t] = (int)(rng_u64(&rng) % cfg.V);
    const int grouped = am->masks == MASKS_ROUTER || am->masks == MASKS_PATTERN;
    model_forward(&m, tok, NULL, 1, T, 0);
    const double pattern_share = m.pattern_pairs > 0 ? m.pattern_kept / m.pattern_pairs : -1;
    real* full = mallocCheck(sizeof(real) * T * cfg.V);
    memcpy(full, model_logits(&m), sizeof(real) * T * cfg.V);
    KVCache c;
    omp_set_num_threads(3); /* every token's attention split in three parts, merged */
    kvcache_init(&c, &m, T, 0);
    omp_set_num_threads(nthreads);
    c.split_min = 1;
    real* lg = mallocCheck(sizeof(real) * cfg.V);
    double worst = 0, scale = 0;
    for (int t = 0; t < T; t++) {
        model_decode_step(&m, &c, tok[t], lg);
        for (int v = 0; v < cfg.V; v++) {
            worst = fmax(worst, fabs(lg[v] - full[(size_t)t * cfg.V + v]));
            scale = fmax(scale, fabs(full[(size_t)t * cfg.V + v]));
        }
    }
    /* the prompt in one batched pass (model_prefill), then decoding on from the cache it left */
    enum { P = 41 };
    KVCache c2;
    kvcache_init(&c2, &m, T, 0);
    real* all = mallocCheck(sizeof(real) * P * cfg.V);
    model_prefill(&m, &c2, tok, P, all, 1);
    double wp = 0;
    for (size_t i = 0; i < (size_t)P * cfg.V; i++) wp = fmax(wp, fabs(all[i] - full[i]));
    model_prefill(&m, &c2, tok + P, T - P, all, 0); /* a cache in use: step by step */
    for (int v = 0; v < cfg.V; v++) wp = fmax(wp, fabs(all[v] - full[(size_t)(T - 1) * cfg.V + v]));
    CHECK(wp < 1e-4 * (scale > 1 ? scale : 1) && c2.n == T,
          "%s: prefill then decode differs from the full pass by %g", preset, wp);
    CHECK(c2.pairs == c.pairs, "%s: prefill counted %ld pairs, decoding %ld", preset, c2.pairs,
          c.pairs);
    int same = !memcmp(c2.gn, c.gn, sizeof(int) * cfg.L * fc.K);
    for (int l = 0; l < cfg.L; l++) /* the masks of the routed layers (the others keep none) */
        if (grouped && model_layer_routed(&m, l))
            same &= !memcmp(c2.mask + l * T, c.mask + l * T, sizeof(uint32_t) * T);
    CHECK(same, "%s: prefill left other group lists than decoding", preset);
    kvcache_free(&c2);
    /* a half-precision cache: the same logits to its rounding */
    kvcache_init(&c2, &m, T, 1);
    double wh = 0;
    for (int t = 0; t < T; t++) {
        model_decode_step(&m, &c2, tok[t], lg);
        for (int v = 0; v < cfg.V; v++) wh = fmax(wh, fabs(lg[v] - full[(size_t)t * cfg.V + v]));
    }
    /* ... unless the rounding moved a token to another group (a discrete change: the tiny
     * models' adaptive budget does that), then there is nothing to compare */
    int moved = 0;
    for (int l = 0; l < cfg.L; l++)
        if (grouped && model_layer_routed(&m, l))
            moved |= memcmp(c2.mask + l * T, c.mask + l * T, sizeof(uint32_t) * T) != 0;
    /* (the block patterns choose from the rounded keys' statistics: another block is the same
     * kind of discrete change, so their f16 logits are not compared) */
    CHECK(moved || blocks || wh < 1e-2 * (scale > 1 ? scale : 1), "%s: f16 cache off by %g", preset,
          wh);
    if (moved || blocks) wh = NAN;
    kvcache_free(&c2);
    free(all);
    double dense_pairs = (double)cfg.L * cfg.NH * T * (T + 1) / 2;
    printf(
        "  %-10s %-5s%s%s%s k=%d p=%.1f sinks=%d%s: decode vs full-sequence logits max |diff| %.2e "
        "(max "
        "|logit| %.1f), prefill %.2e, f16 cache %.1e, pairs %.3f of dense\n",
        preset, am->name, fc.qproj ? " (query projection)" : "",
        m.method.with_groups ? " + groups" : "",
        blocks && fc.blocks_p > 0 ? " (blocks to p=0.7)" : "", topk, (double)topp, sinks,
        dense0 ? " layer 0 dense" : "", worst, scale, wp, wh, c.pairs / dense_pairs);
    CHECK(worst < 1e-4 * (scale > 1 ? scale : 1),
          "%s: decode path differs from the full pass by %g", preset, worst);
    if (attn_is_sparse(attn))
        CHECK(c.pairs < 0.9 * dense_pairs, "sparse decode should skip pairs (%ld)", c.pairs);
    /* the forward pass counts alike */
    if (attn_is_sparse(attn) && (am->count != COUNT_GROUPS || fc.qproj))
        CHECK(fabs(pattern_share - c.pairs / dense_pairs) < 1e-12,
              "%s: the forward pass keeps %.6f of the pairs, decoding %.6f", preset, pattern_share,
              c.pairs / dense_pairs);
    free(full), free(lg);
    kvcache_free(&c);
    check_batch(&m, tok, preset);
    if (grouped || m.method.with_groups) check_runs(&m, tok, preset);
    check_chunks(&m, tok, 0, preset);
    check_chunks(&m, tok, 1, preset);
    model_free(&m);
}

/* The thread governor on made-up step times: while the machine is busy (steps before
 * idle_at), two threads take 8 ms a step and stall six times as long every seventh step, one
 * thread 6 ms; once it is idle, two threads 4 ms and one 7 ms. Returns the share of steps 200
 * to 399 run on one thread. */
static double governed(Governor* c, int idle_at) {
    int on_one = 0;
    for (int s = 0; s < 400; s++) {
        const int t = governor_threads(c);
        double ms = s >= idle_at ? (t == 1 ? 7 : 4) : (t == 1 ? 6 : s % 7 == 3 ? 48 : 8);
        governor_update(c, ms * 1e-3);
        on_one += s >= 200 && t == 1;
    }
    return on_one / 200.0;
}

static void check_governor(void) {
    Governor c;
    memset(&c, 0, sizeof c);
    c.max = 2, c.on = 1, c.probe = 6;
    double share = governed(&c, 1000);
    printf("  governor, busy machine: %.0f %% of the steps on one thread\n", 100 * share);
    CHECK(share > 0.9, "the governor should keep one thread on a busy machine (%.2f)", share);
    memset(&c, 0, sizeof c);
    c.max = 2, c.on = 1, c.probe = 6;
    share = governed(&c, 100);
    printf("  governor, load gone at step 100: %.0f %% on one thread after step 200\n",
           100 * share);
    CHECK(share < 0.1, "the governor should return to two threads (%.2f)", share);
    /* an idle machine from the start: no step on one thread, not even a probe */
    memset(&c, 0, sizeof c);
    c.max = 2, c.on = 1, c.probe = 6;
    governed(&c, 0);
    printf("  governor, idle machine: %d of 400 steps on one thread\n", c.seen[1]);
    CHECK(c.seen[1] == 0, "an idle machine should decode on every thread (%d steps on one)",
          c.seen[1]);
}

/* The strided pattern's groups (model/methods/strided.c): beyond the sinks, a query and a key
 * share a group exactly when their distance is a multiple of K/k; a sink shares every group. */
static void check_strided(void) {
    Model m;
    memset(&m, 0, sizeof m);
    focus_config_default(&m.fc);
    m.fc.K = 8, m.fc.sinks = 3;
    const int T = 80;
    uint32_t mask[80];
    for (int k = 1; k <= 8; k *= 2) {
        m.fc.topk = k;
        attn_methods[ATTN_STRIDED]->pattern_mask(mask, 1, T, &m, 0, 0);
        int bad = 0;
        for (int i = 0; i < T; i++)
            for (int j = 0; j <= i; j++) {
                const int want = j < m.fc.sinks || i < m.fc.sinks || (i - j) % (8 / k) == 0;
                bad += want != ((mask[i] & mask[j]) != 0);
            }
        printf("  strided k=%d of K=8: a query shares a group with the keys %d apart (%d wrong)\n",
               k, 8 / k, bad);
        CHECK(!bad, "strided k=%d: %d query-key pairs share a group wrongly", k, bad);
    }
}

/* RoPE of cached rows through a table of their angles (made once for every layer of a base):
 * the bits of rope_forward / rope_halves_forward at each row's position */
static void check_rope_table(void) {
    enum { NH = 3, NKV = 1, HS = 16, N = 5 };
    const int Q = (NH + 2 * NKV) * HS, pos[N] = {0, 7, 1000, 8191, 3};
    real a[N * Q], b[N * Q], cs[N * HS];
    Rng rng;
    rng_seed(&rng, 5);
    for (int e = 0; e < N * Q; e++) a[e] = b[e] = (real)rng_normal(&rng);
    for (int halves = 0; halves <= 1; halves++) {
        rope_rows_table(cs, N, pos, HS, 1e4f);
        rope_rows_apply(a, N, cs, NH, NKV, HS, halves);
        for (int r = 0; r < N; r++)
            (halves ? rope_halves_forward : rope_forward)(b + (size_t)r * Q, 1, 1, NH, NKV, HS,
                                                          1e4f, pos[r]);
        int bad = 0;
        for (int e = 0; e < N * Q; e++) bad += a[e] != b[e];
        printf("  RoPE from a table of the rows' angles, halves %d: %d values differ\n", halves,
               bad);
        CHECK(!bad, "rope_rows_apply (halves %d): %d values differ from rope_forward", halves, bad);
    }
}

int main(void) {
    nthreads = omp_get_max_threads();
    check_rope_table();
    check_governor();
    check_strided();
    run("tiny-gpt2", ATTN_DENSE, 1, 0, 0, 0);
    run("tiny-llama", ATTN_DENSE, 1, 0, 0, 0);
    run("tiny-gpt2", ATTN_HARD, 1, 0, 0, 0);
    run("tiny-llama", ATTN_HARD, 1, 0, 0, 0);
    run("tiny-llama", ATTN_HARD, 2, 0, 0, 0);
    /* attention sinks, an adaptive budget, a dense layer */
    run("tiny-gpt2", ATTN_HARD, 1, 4, 0, 0);
    run("tiny-llama", ATTN_HARD, 2, 1, 0, 0);
    run("tiny-llama", ATTN_HARD, 0, 2, 0.6f, 1);
    /* the training-free patterns on the same cache: sinks and window; random groups */
    run("tiny-gpt2", ATTN_WINDOW, 1, 0, 0, 0);
    run("tiny-llama", ATTN_WINDOW, 1, 3, 0, 1);
    run("tiny-llama", ATTN_RANDOM, 1, 2, 0, 0);
    run("tiny-gpt2", ATTN_RANDOM, 1, 0, 0, 1);
    /* the strided pattern (model/methods/strided.c): every K-th, every (K/2)-th token */
    run("tiny-llama", ATTN_STRIDED, 1, 2, 0, 0);
    run("tiny-gpt2", ATTN_STRIDED, 2, 0, 0, 1);
    run("tiny-gemma3", ATTN_STRIDED, 1, 3, 0, 0);
    /* key blocks chosen per query and key/value head from the cache's block statistics */
    run("tiny-llama", ATTN_BLOCKS, 1, 2, 0, 0);
    run("tiny-gpt2", ATTN_BLOCKS_MEAN, 1, 0, 0, 1);
    run("tiny-llama", ATTN_BLOCKS_LEARNED, 1, 3, 0, 0);
    run("tiny-gpt2", ATTN_BLOCKS_LEARNED, 1, 0, 0, 1);
    /* gemma3: QK-norm, sandwich norms, GeGLU, local layers in their own window (a hard gate on
     * the global layer), then routed like the global one, then dense */
    run("tiny-gemma3", ATTN_DENSE, 1, 0, 0, 0);
    run("tiny-gemma3", ATTN_HARD, 1, 2, 0, 0);
    run("tiny-gemma3", ATTN_WINDOW, 1, 3, 0, 0);
    run("tiny-gemma3", ATTN_BLOCKS_LEARNED, 1, 3, 0, 0);
    local_mode = LOCAL_ROUTE;
    run("tiny-gemma3", ATTN_HARD, 2, 2, 0, 0);
    run("tiny-gemma3", ATTN_BLOCKS, 1, 2, 0, 0);
    local_mode = LOCAL_DENSE;
    run("tiny-gemma3", ATTN_HARD, 1, 2, 0, 0);
    local_mode = LOCAL_WINDOW;
    /* a router with a query projection: keys in their top-1 group, queries in their own top-k */
    qproj_mode = 1;
    run("tiny-llama", ATTN_HARD, 1, 0, 0, 0);
    run("tiny-llama", ATTN_HARD, 2, 2, 0, 1);
    run("tiny-gemma3", ATTN_HARD, 2, 2, 0, 0);
    /* the router's groups beside the blocks (a key in a chosen block is taken once), with and
     * without a query projection */
    groups_mode = 1;
    run("tiny-llama", ATTN_BLOCKS_LEARNED, 1, 3, 0, 0);
    run("tiny-gemma3", ATTN_BLOCKS_LEARNED, 1, 3, 0, 0);
    qproj_mode = 0;
    run("tiny-llama", ATTN_BLOCKS_LEARNED, 1, 2, 0, 0);
    run("tiny-gpt2", ATTN_BLOCKS, 1, 0, 0, 1);
    groups_mode = 0;
    /* a mass-adaptive budget: blocks until 0.7 of the estimated mass, at most 3 */
    blocks_p = 0.7f;
    run("tiny-llama", ATTN_BLOCKS_LEARNED, 1, 3, 0, 0);
    run("tiny-gemma3", ATTN_BLOCKS, 1, 2, 0, 0);
    blocks_p = 0;
    return tu_finish("test_decode");
}
