/* retrofit.c: `focus retrofit`, the project's main job: train only the router of a frozen
 * base model on the user's text, evaluate dense / soft / hard perplexity, checkpoint to HDF5.
 *
 * A step: grad_accum micro-batches of B x T tokens, windows at random offsets of the training
 * tokens (a seeded sampler), each a forward pass with the training routing (Sinkhorn by default), a
 * beta EMA update and a router-only backward pass; then clipping and AdamW. The objective is the
 * LM loss (the paper's), or targets the frozen dense model (METHOD.md section 9): `kl` runs a
 * teacher pass with the router off first (one forward, no backward; on the H200 43K tokens/s
 * against 48K for lm, docs/RESULTS.md) and trains on KL(dense || focus) of the next-token
 * distributions; `attn` needs only the teacher pass: each layer's router is trained so that a
 * token's groups hold its dense attention mass beyond the window, a per-layer loss with no backward
 * pass through the backbone. Everything the next step depends on (router, moments, beta, data
 * sampler and RNG states) is in router.h5, so
 * --resume continues bit-identically on the same machine and thread count. */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <omp.h>

#include "../io/io.h"
#include "../checkpoints/load.h"
#include "../checkpoints/router_h5.h"
#include "../data/shard.h"
#include "../data/tokenizer.h"
#include "cli.h"
#include "../kernels/adamw.h"
#include "runconfig.h"

#ifdef FOCUS_CUDA
#include "../model/model_cuda.h"
#endif

/* mkdir -p */
static int make_dirs(const char* path) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path);
    for (char* p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0755) && errno != EEXIST) return -1;
        *p = '/';
    }
    return mkdir(buf, 0755) && errno != EEXIST ? -1 : 0;
}

static void path_join(char* out, size_t n, const char* dir, const char* name) {
    snprintf(out, n, "%s/%s", dir, name);
}

/* Next micro-batch: B rows of T+1 consecutive tokens starting at random offsets drawn from the
 * data sampler r (its state is checkpointed, so a resumed run draws the same batches). */
static void next_batch(const int* data, size_t n, Rng* r, int B, int T, int* inp, int* tgt) {
    for (int b = 0; b < B; b++) {
        uint64_t pos = rng_u64(r) % (uint64_t)(n - (size_t)T);
        for (int t = 0; t < T; t++) {
            inp[b * T + t] = data[pos + (uint64_t)t];
            tgt[b * T + t] = data[pos + (uint64_t)t + 1];
        }
    }
}

double focus_largest_share(const Model* m) {
    double s = 0;
    for (int l = 0; l < m->cfg.L; l++)
        s += routing_largest_share(model_groups(m, l), (size_t)m->B * m->T, m->fc.K);
    return s / m->cfg.L;
}

/* Mean gate value sigmoid(lambda (G_i . G_j - b)) over 256 random distant pairs per layer. */
double focus_gate_far_mean(const Model* m, Rng* rng) {
    int B = m->B, T = m->T, K = m->fc.K, w = m->fc.w;
    if (T <= w + 1) return NAN;
    double s = 0;
    int n = 0;
    for (int l = 0; l < m->cfg.L; l++) {
        const real* G = model_groups(m, l);
        double lam = m->router.gate[2 * l], bias = m->router.gate[2 * l + 1];
        for (int k = 0; k < 256; k++) {
            int b = (int)(rng_u64(rng) % (uint64_t)B);
            int i = w + 1 + (int)(rng_u64(rng) % (uint64_t)(T - w - 1));
            int j = (int)(rng_u64(rng) % (uint64_t)(i - w));
            double a = 0;
            for (int g = 0; g < K; g++)
                a += G[((size_t)b * T + i) * K + g] * G[((size_t)b * T + j) * K + g];
            s += 1 / (1 + exp(-lam * (a - bias)));
            n++;
        }
    }
    return s / n;
}

/* Perplexity of m on ids in a given mode; restores the model's settings afterwards. */
static PplResult eval_mode(Model* m, const int* ids, size_t n, int T, AttnMode attn, int topk,
                           Routing r) {
    FocusConfig keep = m->fc;
    m->fc.attn = attn;
    m->fc.topk = topk;
    m->fc.routing = r;
    PplResult res = eval_perplexity(m, ids, n, T, T, 1);
    m->fc = keep;
    return res;
}

/* Train the backbone from scratch (all parameters, dense attention) for a `scratch` base. */
static void pretrain(Model* m, const RunConfig* rc, const int* data, size_t n, const char* out) {
    FocusConfig keep = m->fc;
    m->fc.attn = ATTN_DENSE;
    AdamW opt;
    adamw_init(&opt, m->num_params, 0.9f, 0.95f, 1e-8f, 0.0f);
    int B = rc->pretrain_B, T = rc->T;
    int* inp = mallocCheck(sizeof(int) * B * T);
    int* tgt = mallocCheck(sizeof(int) * B * T);
    Rng sampler;
    rng_seed(&sampler, rc->fc.seed ^ 0x9e7aull);
    printf(
        "pretraining the base model from scratch: %d steps of %d x %d tokens, %.2fM parameters\n",
        rc->pretrain_steps, B, T, m->num_params / 1e6);
    double t0 = now_seconds();
    for (int s = 0; s < rc->pretrain_steps; s++) {
        next_batch(data, n, &sampler, B, T, inp, tgt);
        model_forward(m, inp, tgt, B, T, 1);
        if (!isfinite(m->mean_loss))
            fatal("pretraining: loss became %g at step %d; lower pretrain_lr", (double)m->mean_loss,
                  s);
        model_zero_grad(m, GRAD_ALL);
        model_backward(m, GRAD_ALL);
        clip_grad_norm(m->grads_mem, m->num_params, 1.0);
        adamw_step(
            &opt, m->params_mem, m->grads_mem,
            lr_schedule(s, rc->pretrain_steps / 10, rc->pretrain_steps, rc->pretrain_lr, 0.1f));
        if (s % 20 == 0 || s == rc->pretrain_steps - 1)
            printf("  pretrain step %4d/%d | loss %.4f | %.1f s\n", s + 1, rc->pretrain_steps,
                   (double)m->mean_loss, now_seconds() - t0);
    }
    adamw_free(&opt);
    free(m->grads_mem);
    m->grads_mem = NULL;
    memset(&m->grads, 0, sizeof(m->grads));
    free(inp);
    free(tgt);
    m->fc = keep;
    char path[4096];
    path_join(path, sizeof path, out, "base.gguf");
    gguf_write_model(m, path, 0);
    printf("base model written to %s\n", path);
}

/* Keep the lines of metrics.jsonl whose "step" is at most `step` (after a resume). */
static void truncate_metrics(const char* path, long step) {
    FILE* fp = fopen(path, "r");
    if (!fp) return;
    char* kept = NULL;
    size_t klen = 0;
    char line[8192];
    while (fgets(line, sizeof line, fp)) {
        const char* s = strstr(line, "\"step\": ");
        if (s && atol(s + 8) > step) continue;
        size_t l = strlen(line);
        kept = realloc(kept, klen + l + 1);
        memcpy(kept + klen, line, l + 1);
        klen += l;
    }
    fclose(fp);
    fp = fopen(path, "w");
    if (!fp) fatal("%s: cannot rewrite: %s", path, strerror(errno));
    if (klen) fwrite(kept, 1, klen, fp);
    fclose(fp);
    free(kept);
}

/* The optimizer on the GPU (model_cuda.h); these exist so the loop reads the same either way. */
static double device_grad_sumsq(Model* m, size_t n) {
#ifdef FOCUS_CUDA
    return model_cuda_grad_sumsq(m, n);
#else
    (void)m, (void)n;
    return 0;
#endif
}

static void device_adamw(Model* m, AdamW* opt, float lr, float scale) {
#ifdef FOCUS_CUDA
    model_cuda_adamw(m, opt, lr, scale);
#else
    (void)m, (void)opt, (void)lr, (void)scale;
#endif
}

static void device_adamw_download(Model* m, AdamW* opt) {
#ifdef FOCUS_CUDA
    model_cuda_adamw_download(m, opt);
#else
    (void)m, (void)opt;
#endif
}

static void retrofit_help(void) {
    printf(
        "usage: focus retrofit --config FILE [--set key=value]... --out RUN_DIR [--stop-after N]\n"
        "                      [--device cpu|cuda]\n"
        "       focus retrofit --resume RUN_DIR [--stop-after N] [--device cpu|cuda]\n"
        "Trains only the Focus router of a frozen base model. Writes RUN_DIR/router.h5 "
        "(checkpoint),\n"
        "RUN_DIR/metrics.jsonl and RUN_DIR/config.conf; prints perplexity before and after.\n"
        "--stop-after N stops after step N (the schedule still spans all steps); --resume "
        "continues.\n"
        "Settings: see configs/*.conf; any of them can be overridden with --set.\n"
        "--device cuda trains on the GPU (a scratch base is pretrained on the CPU first); a run\n"
        "can be resumed on either device.\n");
}

int cmd_retrofit(int argc, char** argv) {
    const char *cfg_path = NULL, *out = NULL, *resume = NULL;
    const char* sets[64];
    int nsets = 0;
    long stop_after = 0;
    int device = 0;
    for (int i = 1; i < argc; i++) {
        const char* a = argv[i];
        if (!strcmp(a, "--help")) {
            retrofit_help();
            return 0;
        } else if (!strcmp(a, "--config"))
            cfg_path = cli_value(argc, argv, i++);
        else if (!strcmp(a, "--out"))
            out = cli_value(argc, argv, i++);
        else if (!strcmp(a, "--resume"))
            resume = cli_value(argc, argv, i++);
        else if (!strcmp(a, "--stop-after"))
            stop_after = cli_int(a, cli_value(argc, argv, i++));
        else if (!strcmp(a, "--device"))
            device = cli_device(cli_value(argc, argv, i++));
        else if (!strcmp(a, "--set")) {
            if (nsets == 64) fatal("too many --set options");
            sets[nsets++] = cli_value(argc, argv, i++);
        } else
            fatal("retrofit: unknown option '%s' (see focus retrofit --help)", a);
    }
    if (!resume && (!cfg_path || !out))
        fatal("retrofit: needs --config and --out (or --resume RUN_DIR)");
    if (resume) out = resume;
    char ckpt[4096], metrics_path[4096], conf_path[4096];
    path_join(ckpt, sizeof ckpt, out, "router.h5");
    path_join(metrics_path, sizeof metrics_path, out, "metrics.jsonl");
    path_join(conf_path, sizeof conf_path, out, "config.conf");

    RunConfig rc;
    runconfig_default(&rc);
    if (resume) {
        char* text = router_read_config(ckpt);
        /* a run stored before these keys existed had no sinks and the lm objective */
        rc.fc.sinks = 0;
        rc.fc.beta_balance = 0;
        rc.fc.beta_momentum = 0.99f;
        runconfig_load_text(&rc, text, ckpt);
        free(text);
    } else {
        runconfig_load(&rc, cfg_path);
    }
    for (int i = 0; i < nsets; i++) runconfig_set(&rc, sets[i]);
    if (rc.B < 1 || rc.T < 2 || rc.steps < 1 || rc.grad_accum < 1)
        fatal("retrofit: B, T (>= 2), steps and grad_accum must be positive");
    if (!rc.model[0]) fatal("retrofit: no base model (set model = PATH or model = scratch)");
    if (!rc.train[0]) fatal("retrofit: no training data (set train = PATH)");
    if (make_dirs(out)) fatal("%s: cannot create the run folder: %s", out, strerror(errno));

    /* base model and tokenizer */
    Model m;
    ModelInfo info = {0};
    char base_path[4096];
    path_join(base_path, sizeof base_path, out, "base.gguf");
    int scratch = !strncmp(rc.model, "scratch", 7);
    const char* tok_path = rc.tokenizer[0] ? rc.tokenizer : (scratch ? NULL : rc.model);
    if (!tok_path) fatal("retrofit: a scratch model needs tokenizer = PATH");
    int need_pretrain = 0;
    if (scratch && access(base_path, R_OK) == 0 && resume) {
        model_load(&m, base_path, &rc.fc, &info);
    } else if (scratch) {
        Tokenizer* t = tokenizer_load(tok_path);
        rc.mcfg.V = tokenizer_vocab_size(t);
        tokenizer_free(t);
        if (rc.mcfg.maxT < rc.T) rc.mcfg.maxT = rc.T;
        model_build(&m, &rc.mcfg, &rc.fc);
        model_init_backbone(&m, rc.fc.seed + 1);
        snprintf(info.name, sizeof info.name, "scratch (%s, %.2fM parameters)",
                 rc.mcfg.arch == ARCH_GPT2 ? "gpt2" : "llama", m.num_params / 1e6);
        need_pretrain = 1;
    } else {
        model_load(&m, rc.model, &rc.fc, &info);
    }
    rc.mcfg = m.cfg;
    if (rc.T > m.cfg.maxT && m.cfg.arch == ARCH_GPT2)
        fatal("retrofit: T=%d exceeds the model's context %d", rc.T, m.cfg.maxT);

    /* data */
    size_t ntrain, nval;
    int* train = load_tokens(rc.train, "train_", tok_path, 1, &ntrain);
    int* val;
    if (rc.val[0]) {
        val = load_tokens(rc.val, "val_", tok_path, 1, &nval);
    } else {
        nval = (size_t)(rc.val_fraction * (double)ntrain);
        val = mallocCheck(sizeof(int) * (nval + 1));
        memcpy(val, train + ntrain - nval, sizeof(int) * nval);
        ntrain -= nval;
    }
    for (size_t i = 0; i < ntrain; i++)
        if (train[i] >= m.cfg.V)
            fatal("%s: token id %d outside the model's vocabulary (%d)", rc.train, train[i],
                  m.cfg.V);
    for (size_t i = 0; i < nval; i++)
        if (val[i] >= m.cfg.V)
            fatal("%s: token id %d outside the model's vocabulary (%d)", rc.val, val[i], m.cfg.V);
    if (ntrain < (size_t)rc.T + 1)
        fatal("%s: %zu training tokens, fewer than T + 1 = %d", rc.train, ntrain, rc.T + 1);
    size_t neval =
        rc.eval_tokens > 0 && nval > (size_t)rc.eval_tokens ? (size_t)rc.eval_tokens : nval;

    printf(
        "focus retrofit: base %s (%s), %zu training tokens, %zu validation tokens (%zu evaluated), "
        "%d threads\n",
        info.name, info.format[0] ? info.format : "built here", ntrain, nval, neval,
        omp_get_max_threads());
    runconfig_print(&rc, stdout);
    if (need_pretrain) {
        pretrain(&m, &rc, train, ntrain, out);
        snprintf(rc.model, sizeof rc.model, "scratch");
    }
    uint64_t fp = model_fingerprint(&m);
    char* conf_text = runconfig_text(&rc);
    if (!resume) {
        const void* parts[1] = {conf_text};
        size_t sz = strlen(conf_text);
        write_file_atomic(conf_path, parts, &sz, 1);
    }

    /* optimizer and state */
    size_t nopt =
        m.router_sizes[0] + m.router_sizes[1] + (rc.fc.learn_gate ? m.router_sizes[2] : 0);
    AdamW opt;
    adamw_init(&opt, nopt, rc.beta1, rc.beta2, rc.adam_eps, rc.weight_decay);
    RouterState st = {0, 0, 0, 0, 0, fp};
    Rng rng, sampler;
    rng_seed(&rng, rc.fc.seed ^ 0x5eedull);
    rng_seed(&sampler, rc.fc.seed ^ 0xda7aull);
    real* base_copy = NULL; /* the backbone must not change: checked at the end */
    base_copy = mallocCheck(sizeof(real) * m.num_params);
    memcpy(base_copy, m.params_mem, sizeof(real) * m.num_params);
    if (resume) {
        router_load(ckpt, &m, &opt, &st, fp);
        rng.state = st.rng_state;
        sampler.state = st.data_pos;
        truncate_metrics(metrics_path, st.step);
        printf("resumed from %s at step %ld\n", ckpt, st.step);
    } else {
        remove(metrics_path);
    }
    model_use_device(&m, device);
    FILE* mf = fopen(metrics_path, "a");
    if (!mf) fatal("%s: cannot open: %s", metrics_path, strerror(errno));

    /* perplexity before training */
    double ppl_dense = 0, ppl_soft0 = 0, ppl_hard0 = 0, kept0 = 0;
    char tk[32];
    focus_topk_str(&rc.fc, tk);
    if (neval > 1) {
        PplResult d = eval_mode(&m, val, neval, rc.T, ATTN_DENSE, rc.fc.topk, ROUTE_CAUSAL);
        ppl_dense = exp(d.nll / d.count);
        if (!resume) {
            PplResult s0 = eval_mode(&m, val, neval, rc.T, ATTN_SOFT, rc.fc.topk, ROUTE_CAUSAL);
            PplResult h0 = eval_mode(&m, val, neval, rc.T, ATTN_HARD, rc.fc.topk, ROUTE_CAUSAL);
            ppl_soft0 = exp(s0.nll / s0.count), ppl_hard0 = exp(h0.nll / h0.count);
            kept0 = h0.kept;
            printf(
                "before training (causal routing, %zu tokens): dense %.3f | soft %.3f | hard k=%s "
                "%.3f (%.3f of the pairs)\n",
                d.count, ppl_dense, ppl_soft0, tk, ppl_hard0, kept0);
            fprintf(mf,
                    "{\"type\": \"eval\", \"step\": 0, \"ppl_dense\": %.6f, \"ppl_soft\": %.6f, "
                    "\"ppl_hard\": %.6f, \"pairs_kept\": %.6f, \"topk\": %d}\n",
                    ppl_dense, ppl_soft0, ppl_hard0, kept0, rc.fc.topk);
            fflush(mf);
        }
    }

    int B = rc.B, T = rc.T;
    int use_kl, use_attn;
    runconfig_objective(&rc, &use_kl, &use_attn);
    int* inp = mallocCheck(sizeof(int) * B * T);
    int* tgt = mallocCheck(sizeof(int) * B * T);
    m.fc = rc.fc;
    m.fc.attn = ATTN_SOFT;
    double t_start = now_seconds();
    for (long step = st.step; step < rc.steps; step++) {
        double t0 = now_seconds();
        float lr = lr_schedule(step, rc.warmup, rc.steps, rc.lr, rc.min_lr_frac);
        model_zero_grad(&m, GRAD_ROUTER);
        double loss = 0, lm_loss = 0;
        for (int micro = 0; micro < rc.grad_accum; micro++) {
            next_batch(train, ntrain, &sampler, B, T, inp, tgt);
            double obj = 0;
            if (use_kl || use_attn) model_teacher_forward(&m, inp, B, T, use_kl, use_attn);
            if (use_attn) {
                obj += rc.attn_weight * model_attn_objective(&m, rc.attn_weight, 1);
                if (!use_kl) model_update_beta(&m); /* the teacher pass ran the training routing */
            }
            if (!use_attn || use_kl) {
                model_forward(&m, inp, tgt, B, T, 1);
                model_update_beta(&m);
                model_backward(&m, GRAD_ROUTER);
                obj += use_kl ? m.mean_kl : m.mean_loss;
                lm_loss += m.mean_loss / rc.grad_accum;
            }
            if (!isfinite(obj))
                fatal(
                    "retrofit: the loss became %g at step %ld; the last checkpoint (%s) is intact; "
                    "try a lower lr",
                    obj, step + 1, ckpt);
            loss += obj / rc.grad_accum;
        }
        double gnorm;
        if (device) {
            /* the same arithmetic on the device: mean over micro-batches, clip, AdamW */
            gnorm = sqrt(device_grad_sumsq(&m, nopt)) / rc.grad_accum;
            if (!isfinite(gnorm))
                fatal(
                    "retrofit: gradient norm is %g at step %ld; the last checkpoint (%s) is "
                    "intact",
                    gnorm, step + 1, ckpt);
            double k = rc.clip > 0 && gnorm > rc.clip ? rc.clip / (gnorm + 1e-12) : 1.0;
            device_adamw(&m, &opt, lr, (float)(k / rc.grad_accum));
        } else {
            if (rc.grad_accum > 1)
                for (size_t i = 0; i < nopt; i++) m.rgrads_mem[i] /= (real)rc.grad_accum;
            gnorm = clip_grad_norm(m.rgrads_mem, nopt, rc.clip);
            if (!isfinite(gnorm))
                fatal(
                    "retrofit: gradient norm is %g at step %ld; the last checkpoint (%s) is "
                    "intact",
                    gnorm, step + 1, ckpt);
            adamw_step(&opt, m.router_mem, m.rgrads_mem, lr);
        }
        double dt = now_seconds() - t0;
        double share = focus_largest_share(&m), gate = focus_gate_far_mean(&m, &rng);
        double tps = (double)B * T * rc.grad_accum / dt;
        printf(
            "step %5ld/%d | %s %.4f | lr %.2e | %8.0f tok/s | %7.0f ms | largest group %.3f | "
            "gate(far) %.3f | |g| %.3f\n",
            step + 1, rc.steps, rc.objective, loss, (double)lr, tps, dt * 1e3, share, gate, gnorm);
        fflush(stdout);
        fprintf(
            mf,
            "{\"type\": \"train\", \"step\": %ld, \"loss\": %.9g, \"lm_loss\": %.9g, \"lr\": %.9g, "
            "\"tokens_per_s\": %.1f, \"ms\": %.1f, "
            "\"largest_share\": %.6f, \"gate_far\": %.6f, \"grad_norm\": %.6g}\n",
            step + 1, loss, use_attn && !use_kl ? -1.0 : lm_loss, (double)lr, tps, dt * 1e3, share,
            isfinite(gate) ? gate : -1.0, gnorm);
        fflush(mf);
        st.step = step + 1;
        int last = st.step == rc.steps || st.step == stop_after;
        if (neval > 1 && (st.step % rc.eval_every == 0 || st.step == rc.steps)) {
            PplResult s = eval_mode(&m, val, neval, T, ATTN_SOFT, rc.fc.topk, ROUTE_CAUSAL);
            PplResult h = eval_mode(&m, val, neval, T, ATTN_HARD, rc.fc.topk, ROUTE_CAUSAL);
            printf(
                "  eval step %ld (causal routing): dense %.3f | soft %.3f | hard k=%s %.3f (%.3f "
                "of "
                "the pairs)\n",
                st.step, ppl_dense, exp(s.nll / s.count), tk, exp(h.nll / h.count), h.kept);
            fprintf(mf,
                    "{\"type\": \"eval\", \"step\": %ld, \"ppl_dense\": %.6f, \"ppl_soft\": %.6f, "
                    "\"ppl_hard\": %.6f, \"pairs_kept\": %.6f, \"topk\": %d}\n",
                    st.step, ppl_dense, exp(s.nll / s.count), exp(h.nll / h.count), h.kept,
                    rc.fc.topk);
            fflush(mf);
        }
        if (st.step % rc.ckpt_every == 0 || last) {
            if (device) device_adamw_download(&m, &opt);
            st.adam_t = opt.t;
            st.beta_updates = m.beta_updates;
            st.rng_state = rng.state;
            st.data_pos = sampler.state;
            router_save(ckpt, &m, &opt, &st, conf_text);
        }
        if (st.step == stop_after) {
            printf("stopped after step %ld as asked; continue with: focus retrofit --resume %s\n",
                   st.step, out);
            break;
        }
    }
    fclose(mf);
    if (memcmp(base_copy, m.params_mem, sizeof(real) * m.num_params))
        fatal("internal: a backbone weight changed during router training");
    free(base_copy);
    if (st.step == rc.steps && neval > 1) {
        PplResult s = eval_mode(&m, val, neval, T, ATTN_SOFT, rc.fc.topk, ROUTE_CAUSAL);
        PplResult h = eval_mode(&m, val, neval, T, ATTN_HARD, rc.fc.topk, ROUTE_CAUSAL);
        printf("\nperplexity on %zu validation tokens (causal routing, T=%d):\n", s.count, T);
        if (ppl_soft0 > 0)
            printf("  before: dense %.3f | soft %.3f | hard k=%s %.3f (%.3f of the pairs)\n",
                   ppl_dense, ppl_soft0, tk, ppl_hard0, kept0);
        printf("  after:  dense %.3f | soft %.3f | hard k=%s %.3f (%.3f of the pairs)\n", ppl_dense,
               exp(s.nll / s.count), tk, exp(h.nll / h.count), h.kept);
        printf(
            "router training took %.1f s; run files in %s (router.h5, metrics.jsonl, "
            "config.conf)\n",
            now_seconds() - t_start, out);
    }
    free(conf_text);
    free(inp);
    free(tgt);
    free(train);
    free(val);
    adamw_free(&opt);
    model_free(&m);
    return 0;
}
