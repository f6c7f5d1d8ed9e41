/* cmd_bench_decode.c: `focus bench decode`, the speed of generation: a prompt of --ctx random
 * tokens (one batched prefill, or fed one at a time), then -n tokens decoded greedily over the
 * KV cache, each phase timed apart;
 * from the file's own blocks or from fp32 weights, dense or with a router's hard top-k. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include <omp.h>

#include "../kernels/quant.h"
#include "../model/decode.h"
#include "cli.h"
#include "commands.h"

/* Resident kilobytes of this process now: anonymous memory and mapped files. */
static void resident_kb(long* anon, long* file) {
    *anon = proc_status_kb("RssAnon");
    *file = proc_status_kb("RssFile");
}

/* log p(target) under the distribution softmax(logits) */
static double log_softmax_at(const real* logits, int V, int target) {
    double mx = logits[0], sum = 0;
    for (int v = 1; v < V; v++) mx = logits[v] > mx ? logits[v] : mx;
    for (int v = 0; v < V; v++) sum += exp(logits[v] - mx);
    return logits[target] - mx - log(sum);
}

static const char decode_usage[] =
    "usage: focus bench decode --model M [--ctx 1024] [-n 64] [--weights native|f32]\n"
    "                          [--router router.h5 [--topk k]] [--attn A] [--set key=value]...\n"
    "                          [--prefill batched|exact|steps] [--chunk N]\n"
    "                          [--kv f16|f32] [--threads N] [--seed s]\n"
    "                          [--data D [--tokenizer T]] [--against dense]\n"
    "Tokens/s of the prompt (--ctx random token ids in one batched pass as generate feeds them:\n"
    "int8 products where the CPU has VNNI, fp32 ones with --prefill exact; or with --prefill\n"
    "steps one at a time; --chunk N feeds the batched prompt in calls of N tokens, as the server\n"
    "does) and of decoding -n more tokens greedily after it. Decode steps choose\n"
    "their thread count (up to OMP_NUM_THREADS) by measurement, which keeps a busy machine\n"
    "from halving the speed; --threads N runs every step on N threads instead. --kv: the KV\n"
    "cache's keys and values in half precision (the default) or fp32. --weights native (the "
    "default where the GGUF\n"
    "file allows) reads the projections in their stored blocks; f32 the expanded weights.\n"
    "With --router: hard top-k attention over the group KV cache (causal routing), or with a\n"
    "block selector of fit-blocks its key blocks; --attn window (sinks + window), blocks,\n"
    "blocks_mean need no router; --set w=N and the other attention settings as for eval.\n"
    "With --data the prompt and the decoded tokens are the first ctx + n tokens of that text or\n"
    "shard (teacher-forced), and the perplexity of the stream is printed: native and fp32\n"
    "weights compared on the same tokens.\n"
    "--against dense: the decode steps alternate between the method and dense attention over\n"
    "the same cache (the method's block statistics and group lists kept up in both), on\n"
    "OMP_NUM_THREADS threads, and the attention of each kind of step is timed: the method's\n"
    "against dense's under the same load of the machine (the decode's tokens/s: the method's\n"
    "steps only). A batched prompt then goes in calls of --chunk rows (1024 by default), each\n"
    "into the method's cache and then into a dense cache of its own, and the two prompts'\n"
    "attention is compared the same way (the prompt's tokens/s: the method's calls only).\n";

/* The attention's seconds in a profile (DECODE_PARTS), its selection counted when select is set */
static double attention_seconds(const double* pr, int select) {
    return pr[PART_ATTENTION] + pr[PART_BAND] + (select ? pr[PART_SELECT] : 0) + pr[PART_DISTANT];
}

int cmd_bench_decode(int argc, char** argv) {
    const char *model = NULL, *weights = NULL, *router = NULL, *topk = NULL, *data = NULL,
               *attn = NULL, *tok = NULL, *prefill = "batched", *kv = "f16", *against = NULL;
    int ctx = 1024, n = 64, seed = 1, threads = 0, chunk = 0;
    CliList sets = {0};
    if (cli_parse("bench decode", argc, argv, 2, decode_usage,
                  "--model:s --ctx:i[1,1048576] -n:i[1,1048576] --weights:s --router:s --topk:s "
                  "--seed:i --data:s --tokenizer:s --prefill:s --threads:i[1,1024] --kv:s --attn:s "
                  "--chunk:i[1,1048576] --against:s --set:*",
                  &model, &ctx, &n, &weights, &router, &topk, &seed, &data, &tok, &prefill,
                  &threads, &kv, &attn, &chunk, &against, &sets))
        return 0;
    if (!model) fatal("bench decode: needs --model");
    const int steps = !strcmp(prefill, "steps"), exact = !strcmp(prefill, "exact");
    if (!steps && !exact && strcmp(prefill, "batched"))
        fatal("bench decode: --prefill must be batched, exact or steps, got '%s'", prefill);
    if (strcmp(kv, "f16") && strcmp(kv, "f32"))
        fatal("bench decode: --kv must be f16 or f32, got '%s'", kv);
    if (against && strcmp(against, "dense"))
        fatal("bench decode: --against takes dense, got '%s'", against);
    if (against && n < 2) fatal("bench decode: --against dense needs -n 2 or more");
    /* --against dense: the method's steps (the even ones) and the dense ones */
    const int nm = against ? (n + 1) / 2 : n, nd = n - nm;
    long anon0, file0, anon1, file1;
    resident_kb(&anon0, &file0); /* the program and its libraries (CUDA's too, where built) */
    Model m;
    ModelInfo info;
    cli_open_model(&m, &info,
                   &(ModelRequest){.model = model,
                                   .router = router,
                                   .attn = attn,
                                   .topk = topk,
                                   .sets = &sets,
                                   .decode = 1,
                                   .weights = weights});
    free(sets.v);
    m.prefill_exact = exact;
    cli_check_context(&m, (long)ctx + n, "bench decode", "--ctx + -n");
    if (threads) omp_set_num_threads(threads);
    KVCache c;
    kvcache_init(&c, &m, ctx + n, !strcmp(kv, "f16"));
    /* interleaved steps of two kinds would mislead the governor's timing of the steps */
    if (threads || against) c.gov.on = 0;
    if (against) c.profile = 1; /* each kind of step's attention */
    real* logits = mallocCheck(sizeof(real) * m.cfg.V);
    /* the token stream: random ids, or the text's (teacher-forced, scored) */
    int* ids = mallocCheck(sizeof(int) * (size_t)(ctx + n));
    Rng rng;
    rng_seed(&rng, (uint64_t)seed);
    for (int i = 0; i < ctx + n; i++) ids[i] = (int)(rng_u64(&rng) % m.cfg.V);
    if (data) {
        size_t have;
        int* t = load_eval_tokens(data, model, tok, &have);
        if (have < (size_t)(ctx + n))
            fatal("bench decode: %s has %zu tokens, fewer than --ctx + -n = %d", data, have,
                  ctx + n);
        memcpy(ids, t, sizeof(int) * (size_t)(ctx + n));
        free(t);
    }
    double nll = 0;
    /* with --data the prompt's own tokens are scored too: a batched prefill then computes every
     * position's logits (the head over ctx rows, about a fifth more work for SmolLM2) */
    const int scored = data && !steps;
    real* all = scored ? mallocCheck(sizeof(real) * m.cfg.V * (size_t)ctx) : NULL;
    memset(c.pprof, 0, sizeof c.pprof); /* FOCUS_PROFILE: the prompt's rows */
    /* a batched prompt in calls of pchunk rows. --against dense: each call's rows then go into a
     * cache of the dense model's too (d, dense_steps: no state of the method's), the method's
     * and dense's prompt attention timed in turn under the same load of the machine */
    const int pchunk = chunk ? chunk : against ? 1024 : ctx;
    KVCache d;
    real* dlogits = NULL;
    if (against && !steps) {
        kvcache_init(&d, &m, ctx, c.half);
        d.dense_steps = 1, d.profile = 1, d.gov.on = 0;
        dlogits = mallocCheck(sizeof(real) * m.cfg.V);
    }
    double prompt_s = 0; /* the method's calls only */
    if (steps) {
        const double t0 = now_seconds();
        for (int i = 0; i < ctx; i++) {
            if (i) nll += log_softmax_at(logits, m.cfg.V, ids[i]);
            model_decode_step(&m, &c, ids[i], logits);
        }
        prompt_s = now_seconds() - t0;
    } else {
        for (int i = 0; i < ctx; i += pchunk) {
            const int len = ctx - i < pchunk ? ctx - i : pchunk;
            const double t0 = now_seconds();
            model_prefill(&m, &c, ids + i, len, scored ? all + (size_t)i * m.cfg.V : logits,
                          scored);
            prompt_s += now_seconds() - t0;
            if (dlogits) model_prefill(&m, &d, ids + i, len, dlogits, 0);
        }
    }
    /* the dense prompt's attention seconds and pairs */
    double dense_prompt_s = 0;
    long dense_prompt_pairs = 0;
    if (dlogits) {
        dense_prompt_s = attention_seconds(d.pprof, 0), dense_prompt_pairs = d.pairs;
        kvcache_free(&d), free(dlogits);
    }
    if (scored) {
        for (int i = 1; i < ctx; i++)
            nll += log_softmax_at(all + (size_t)(i - 1) * m.cfg.V, m.cfg.V, ids[i]);
        memcpy(logits, all + (size_t)(ctx - 1) * m.cfg.V, sizeof(real) * m.cfg.V);
        free(all);
    }
    const double t1d = now_seconds(); /* the decode's clock starts after the prompt's scoring */
    long pairs0 = c.pairs;            /* the prompt's pairs */
    memset(c.prof, 0, sizeof c.prof); /* FOCUS_PROFILE: the decoded tokens only */
    /* with --data each step's logits are kept and scored after the clock stops */
    real* kept = data ? mallocCheck(sizeof(real) * m.cfg.V * (size_t)n) : NULL;
    /* --against dense: odd steps dense; each kind's seconds, pairs and profile */
    double kind_s[2] = {0, 0}, kind_prof[2][DECODE_NPARTS] = {{0}};
    long kind_pairs[2] = {0, 0};
    double causal[2] = {0, 0}; /* each kind's causal pairs (each attending to every earlier) */
    for (int i = 0; i < n; i++) {
        const int dense = against && (i & 1);
        double prof0[DECODE_NPARTS];
        memcpy(prof0, c.prof, sizeof prof0);
        const long pairs_i = c.pairs;
        const double ts = now_seconds();
        c.dense_steps = dense;
        int next = 0;
        if (data) {
            memcpy(kept + (size_t)i * m.cfg.V, logits, sizeof(real) * m.cfg.V);
            next = ids[ctx + i];
        } else {
            for (int v = 1; v < m.cfg.V; v++)
                if (logits[v] > logits[next]) next = v;
        }
        model_decode_step(&m, &c, next, logits);
        kind_s[dense] += now_seconds() - ts;
        kind_pairs[dense] += c.pairs - pairs_i;
        for (int k = 0; k < DECODE_NPARTS; k++) kind_prof[dense][k] += c.prof[k] - prof0[k];
        causal[dense] += (double)(ctx + i + 1) * m.cfg.NH * m.cfg.L;
    }
    c.dense_steps = 0;
    double t2 = now_seconds();
    for (int i = 0; data && i < n; i++)
        nll += log_softmax_at(kept + (size_t)i * m.cfg.V, m.cfg.V, ids[ctx + i]);
    free(kept);
    free(ids);
    /* of the causal pairs of the decoded tokens (each attends to every earlier one when dense) */
    double dense_pairs = 0;
    for (int i = 0; i < n; i++) dense_pairs += (double)(ctx + i + 1) * m.cfg.NH * m.cfg.L;
    char desc[1400];
    printf("model %s (%s), weights %s, attention %s, KV cache %s, %d threads%s\n", info.name,
           info.format, m.native ? "native (the file's blocks)" : "fp32",
           model_method(&m)->brief ? model_method(&m)->brief
                                   : cli_attention_desc(&m, desc, sizeof desc),
           c.half ? "f16" : "f32", omp_get_max_threads(),
           c.gov.on ? " at most (chosen per decode step)" : "");
    printf("kernels: %s (this CPU's best: %s; FOCUS_ISA forces a level)\n",
           quant_isa_name(quant_isa()), quant_isa_name(quant_isa_detected()));
    if (c.gov.on) {
        int steps_all = 0;
        for (int i = 0; i < 32; i++) steps_all += c.gov.seen[i];
        printf("decode steps by thread count:");
        for (int i = 0; i < 32 && c.gov.seen[i]; i++) {
            const int t = c.gov.max >> i;
            printf(" %d: %.0f %%", t < 1 ? 1 : t, 100.0 * c.gov.seen[i] / steps_all);
        }
        printf("\n");
    }
    printf(
        "prompt %d tokens (%s%s): %.1f tokens/s | decode %d tokens at context %d: %.1f tokens/s "
        "| pairs kept %.3f (the prompt's rows: %.3f)\n",
        ctx,
        steps          ? "one at a time"
        : exact        ? "batched, fp32 products"
        : pchunk < ctx ? "batched, in chunks"
                       : "batched",
        scored ? ", every position's logits" : "", ctx / prompt_s, nm, ctx,
        against ? nm / kind_s[0] : n / (t2 - t1d),
        against ? kind_pairs[0] / causal[0] : (double)(c.pairs - pairs0) / dense_pairs,
        (double)pairs0 / ((double)ctx * (ctx + 1) / 2 * m.cfg.NH * m.cfg.L));
    for (int k = 0; c.profile && k < 2; k++) { /* where a prompt's and a decode step's time goes */
        static const char* const parts[] = {DECODE_PARTS};
        const double* pr = k ? (against ? kind_prof[0] : c.prof) : c.pprof;
        double total = 0;
        for (int i = 0; i < DECODE_NPARTS; i++) total += pr[i];
        if (!k && steps) continue; /* a prompt fed one token at a time is in the decode steps */
        printf("%s profile (FOCUS_PROFILE=1%s), %.3f ms a token:", k ? "decode" : "prompt",
               k && against ? "; the method's steps" : "", 1e3 * total / (k ? nm : ctx));
        const double att = attention_seconds(pr, 1);
        for (int i = 0; i < PART_BAND; i++) {
            const double t = i == PART_ATTENTION ? att : pr[i];
            printf("%s %s %.1f %%", i ? "," : "", parts[i], total > 0 ? 100 * t / total : 0);
            if (i == PART_ATTENTION && att > pr[PART_ATTENTION]) { /* its parts, where split */
                printf(" (");
                for (int j = PART_BAND; j <= PART_DISTANT; j++)
                    if (pr[j] > 0)
                        printf("%s %.1f %%, ", parts[j], total > 0 ? 100 * pr[j] / total : 0);
                printf("the rest %.1f %%)", total > 0 ? 100 * pr[PART_ATTENTION] / total : 0);
            }
        }
        printf("\n");
    }
    if (dense_prompt_pairs > 0) { /* the prompt's attention, each kind's calls in turn */
        const double am = attention_seconds(c.pprof, 1), ad = dense_prompt_s;
        const double p = (double)pairs0 / (double)dense_prompt_pairs;
        printf(
            "against dense, the prompt interleaved (calls of %d rows, the method's cache and a "
            "dense one in turn): attention %.3f ms a token against %.3f: %.3f of dense at pairs "
            "kept %.3f of dense's, %.2f times that share (the method's selection counted)\n",
            pchunk, 1e3 * am / ctx, 1e3 * ad / ctx, am / ad, p, am / ad / p);
    }
    if (against) { /* each kind's attention a step; a dense step's key list is left out */
        const double am = attention_seconds(kind_prof[0], 1) / nm,
                     ad = attention_seconds(kind_prof[1], 0) / nd;
        /* each kind's share of its steps' causal pairs: a dense step is one position on */
        const double p = (kind_pairs[0] / causal[0]) / (kind_pairs[1] / causal[1]);
        printf(
            "against dense, steps interleaved (%d of the method, %d dense, one cache): "
            "attention %.3f ms a token against %.3f: %.3f of dense at pairs kept %.3f of "
            "dense's, %.2f times that share (the method's selection counted, a dense step's "
            "key list not)\n",
            nm, nd, 1e3 * am, 1e3 * ad, am / ad, p, am / ad / p);
    }
    if (data)
        printf("perplexity of the %d tokens after the first%s: %.4f\n", ctx + n - 1,
               against ? " (the decoded ones scored by both kinds of step)" : "",
               exp(-nll / (ctx + n - 1)));
    resident_kb(&anon1, &file1);
    struct stat st;
    const double file_mb = stat(model, &st) ? 0 : st.st_size / 1048576.0;
    size_t runs;
    const double kv_mb = kvcache_bytes(&c, &m.cfg, &runs) / 1048576.0;
    const double all_mb = (anon1 - anon0 + file1 - file0) / 1024.0;
    char of_runs[64] = "";
    if (runs)
        snprintf(of_runs, sizeof of_runs, " (the groups' keys and values in runs: %.1f MB)",
                 runs / 1048576.0);
    printf(
        "resident memory: %.1f MB (%.1f MB allocated, %.1f MB of mapped file), of which the KV "
        "cache %.1f MB%s: the model and the rest %.1f MB; the model file is %.1f MB\n",
        all_mb, (anon1 - anon0) / 1024.0, (file1 - file0) / 1024.0, kv_mb, of_runs, all_mb - kv_mb,
        file_mb);
    free(logits);
    kvcache_free(&c);
    model_free(&m);
    return 0;
}
