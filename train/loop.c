/* loop.c: the training loops of `focus retrofit` (see loop.h).
 *
 * A router step: grad_accum micro-batches of B x T tokens, windows at random offsets of the
 * training tokens (a seeded sampler), each a forward pass with the training routing (Sinkhorn by
 * default), a beta update and a router-only backward pass; then clipping and AdamW where the model
 * runs. The objective is the LM loss (the paper's), or targets the frozen dense model (METHOD.md
 * section 9): `kl` runs a teacher pass with the router off first (one forward, no backward; on the
 * H200 43K tokens/s against 48K for lm, docs/RESULTS.md) and trains on KL(dense || focus) of the
 * next-token distributions; `attn` needs only the teacher pass: each layer's router is trained so
 * that a token's groups hold its dense attention mass beyond the window, a per-layer loss with no
 * backward pass through the backbone. Everything the next step depends on (router, moments,
 * beta, data sampler and RNG states) is in router.h5, so --resume continues bit-identically on
 * the same machine and thread count. */
#include "loop.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <omp.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../checkpoints/load.h"
#include "../checkpoints/lora_h5.h"
#include "../checkpoints/router_h5.h"
#include "../data/tokenizer.h"
#include "../io/io.h"
#include "../kernels/adamw.h"
#include "../data/corpus.h"
#include "../eval/evaluate.h"

/* Next micro-batch: B rows of T+1 consecutive tokens starting at random offsets drawn from the
 * data sampler r (its state is checkpointed, so a resumed run draws the same batches). A model
 * whose tokenizer adds a BOS (bos >= 0: Gemma) reads it in place of each row's first token, as
 * its evaluation windows do. */
static void next_batch(const int* data, size_t n, Rng* r, int B, int T, int* inp, int* tgt,
                       int bos) {
    for (int b = 0; b < B; b++) {
        uint64_t pos = rng_u64(r) % (uint64_t)(n - (size_t)T);
        for (int t = 0; t < T; t++) {
            inp[b * T + t] = data[pos + (uint64_t)t];
            tgt[b * T + t] = data[pos + (uint64_t)t + 1];
        }
        if (bos >= 0) inp[b * T] = bos;
    }
}

/* After each line of metrics.jsonl: the line must have reached the file (a full disk or a size
 * limit ends the run with one line naming the file, not a run that logs nothing). */
static void metrics_flush(FILE* mf, const char* path) {
    errno = 0;
    if (fflush(mf) || ferror(mf))
        fatal("%s: write failed: %s", path, errno ? strerror(errno) : "I/O error");
}

/* Keep the lines of metrics.jsonl whose "step" is at most `step` (after a resume). */
static void truncate_metrics(const char* path, long step) {
    FILE* fp = fopen_regular(path, "r");
    if (!fp) return;
    char* kept = NULL;
    size_t klen = 0;
    char line[8192];
    while (fgets(line, sizeof line, fp)) {
        const char* s = strstr(line, "\"step\": ");
        if (s && atol(s + 8) > step) continue;
        if (!strchr(line, '\n')) continue; /* cut by a full disk or a kill */
        size_t l = strlen(line);
        kept = reallocCheck(kept, klen + l + 1);
        memcpy(kept + klen, line, l + 1);
        klen += l;
    }
    fclose(fp);
    const void* parts[1] = {kept ? kept : ""};
    write_file_atomic(path, parts, &klen, 1);
    free(kept);
}

/* Train the backbone from scratch (all parameters, dense attention) for a `scratch` base. */
void train_pretrain(Model* m, const RunConfig* rc, const int* data, size_t n, const char* out) {
    FocusConfig keep = m->fc;
    m->fc.attn = ATTN_DENSE;
    AdamW opt;
    adamw_init(&opt, m->num_params, 0.9f, 0.95f, 1e-8f, 0.0f);
    int B = rc->pretrain_B, T = rc->T;
    int* inp = mallocCheck(sizeof(int) * B * T);
    int* tgt = mallocCheck(sizeof(int) * B * T);
    Rng sampler;
    rng_seed(&sampler, rc->fc.seed ^ 0x9e7aull);
    if (rc->pretrain_steps > 0)
        printf(
            "pretraining the base model from scratch: %d steps of %d x %d tokens, %.2fM "
            "parameters\n",
            rc->pretrain_steps, B, T, m->num_params / 1e6);
    double t0 = now_seconds();
    for (int s = 0; s < rc->pretrain_steps; s++) {
        next_batch(data, n, &sampler, B, T, inp, tgt, m->bos);
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
    if (!out) return; /* another rank writes it */
    char path[4096];
    path_join(path, sizeof path, out, "base.gguf");
    gguf_write_model(m, path, 0);
    printf("%s written to %s\n", rc->pretrain_steps > 0 ? "base model" : "initial weights", path);
}

/* Where a stopped run can continue from, truthfully: "the checkpoint of step N (PATH) is intact"
 * or "no checkpoint was written". */
static const char* last_ckpt_words(long step, const char* path, char* buf, size_t n) {
    if (step < 0)
        snprintf(buf, n, "no checkpoint was written");
    else
        snprintf(buf, n, "the checkpoint of step %ld (%s) is intact", step, path);
    return buf;
}

/* Seconds this rank has spent in collectives: data- and tensor-parallel. */
static double comm_seconds(const Model* m, const Comm* dp) {
    return dp->seconds + (m->tp ? m->tp->seconds : 0);
}

void train_init_router(Model* m, const RunConfig* rc) {
    if (!rc->init_router[0]) return;
    router_load(rc->init_router, m, NULL, NULL, model_fingerprint(m));
    m->beta_updates = 0; /* the first update of beta takes this batch's balance as it is */
    printf("router initialised from %s (W_g, C, beta; new AdamW moments)\n", rc->init_router);
}

real* train_anchor_center(Model* m, const RunConfig* rc, size_t n) {
    if (!(rc->anchor > 0) || !rc->init_router[0]) return NULL; /* (run_prepare refuses that) */
    router_load(rc->init_router, m, NULL, NULL, model_fingerprint(m));
    real* c = mallocCheck(sizeof(real) * n);
    memcpy(c, m->router_mem, sizeof(real) * n);
    return c;
}

void train_anchor_step(Model* m, const real* center, size_t n, float lr, float anchor) {
    if (center) model_router_pull(m, center, n, (real)(lr * anchor));
}

void train_router(Model* m, const RunConfig* rc, const TrainData* d, const char* out,
                  const char* conf_text, int resume, long stop_after, const char* device,
                  Comm* dp) {
    /* with tensor parallelism (m->tp) each data-parallel rank is a group of tp ranks holding the
     * slices of one model: the whole group runs every pass, its first rank writes */
    const int ranks = dp->size, root = dp->rank == 0 && m->cfg.tp_rank == 0;
    if (ranks > 1 && strcmp(device, "cpu"))
        fatal(
            "retrofit: data-parallel training over MPI ranks runs on the CPU (%d ranks asked "
            "for --device %s)",
            ranks, device);
    if (!strcmp(rc->objective, "mass")) {
        if (ranks > 1 || strcmp(device, "cpu"))
            fatal(
                "retrofit: objective = mass runs on the CPU in one process (%d ranks, --device %s)",
                ranks, device);
        train_router_mass(m, rc, d, out, conf_text, resume, stop_after);
        return;
    }
    if (rc->B % ranks)
        fatal("retrofit: B=%d is not a multiple of the %d data-parallel ranks", rc->B, ranks);
    char ckpt[4096], metrics_path[4096];
    path_join(ckpt, sizeof ckpt, out, "router.h5");
    path_join(metrics_path, sizeof metrics_path, out, "metrics.jsonl");
    /* optimizer and state */
    size_t nopt = model_router_trained(m, rc->fc.learn_gate);
    AdamW opt;
    adamw_init(&opt, nopt, rc->beta1, rc->beta2, rc->adam_eps, rc->weight_decay);
    RouterState st = {0, 0, 0, 0, 0, model_fingerprint(m)};
    Rng rng, sampler;
    rng_seed(&rng, rc->fc.seed ^ 0x5eedull);
    rng_seed(&sampler, rc->fc.seed ^ 0xda7aull);
    /* the backbone must not change: its fingerprint (a hash of every weight) checked at the end;
     * a copy of the weights would double their memory */
    const uint64_t base_fp = model_weights_hash(m);
    if (resume && access(ckpt, F_OK)) {
        /* killed before its first checkpoint: nothing to continue from, so start over */
        printf("%s: no checkpoint yet (the run stopped before its first); starting at step 0\n",
               out);
        resume = 0;
    }
    real* center = train_anchor_center(m, rc, nopt);
    if (resume) {
        router_load(ckpt, m, &opt, &st, st.fingerprint);
        rng.state = st.rng_state;
        sampler.state = st.data_pos;
        if (root) truncate_metrics(metrics_path, st.step);
        printf("resumed from %s at step %ld\n", ckpt, st.step);
    } else {
        if (root) remove(metrics_path);
        train_init_router(m, rc);
    }
    model_place(m, device);
    m->pass.lean_acts = 1; /* only the router trains: its backward's activations are enough */
    m->dp = ranks > 1 ? dp : NULL;
    if (ranks > 1)
        printf("data-parallel over %d %s ranks: %d of the B = %d rows each\n", ranks, dp->ops->name,
               rc->B / ranks, rc->B);
    if (m->tp)
        printf(
            "tensor-parallel over %d %s ranks: %d of the %d heads and %d of the F = %d units "
            "each\n",
            m->tp->size, m->tp->ops->name, model_heads(&m->cfg), m->cfg.NH, model_ffn(&m->cfg),
            m->cfg.F);
    long ckpt_step = resume ? st.step : -1; /* the step of the checkpoint on disk, -1: none */
    char words[4200];
    FILE* mf = fopen(root ? metrics_path : "/dev/null", "a");
    if (!mf) fatal("%s: cannot open: %s", metrics_path, strerror(errno));

    /* perplexity before training */
    double ppl_dense = 0, ppl_soft0 = 0, ppl_hard0 = 0, kept0 = 0;
    char tk[32];
    focus_topk_str(&rc->fc, tk);
    /* the first data-parallel rank (all of its tensor-parallel group) evaluates; the others wait */
    const int evaluate = dp->rank == 0 && d->neval > 1;
    if (evaluate) {
        PplResult dn = eval_mode(m, d->val, d->neval, rc->T, ATTN_DENSE, rc->fc.topk, ROUTE_CAUSAL);
        ppl_dense = exp(dn.nll / dn.count);
        if (!resume) {
            PplResult s0 =
                eval_mode(m, d->val, d->neval, rc->T, ATTN_SOFT, rc->fc.topk, ROUTE_CAUSAL);
            PplResult h0 =
                eval_mode(m, d->val, d->neval, rc->T, ATTN_HARD, rc->fc.topk, ROUTE_CAUSAL);
            ppl_soft0 = exp(s0.nll / s0.count), ppl_hard0 = exp(h0.nll / h0.count);
            kept0 = h0.kept;
            printf(
                "before training (causal routing, %zu tokens): dense %.3f | soft %.3f | hard k=%s "
                "%.3f (%.3f of the pairs)\n",
                dn.count, ppl_dense, ppl_soft0, tk, ppl_hard0, kept0);
            fprintf(mf,
                    "{\"type\": \"eval\", \"step\": 0, \"ppl_dense\": %.6f, \"ppl_soft\": %.6f, "
                    "\"ppl_hard\": %.6f, \"pairs_kept\": %.6f, \"topk\": %d}\n",
                    ppl_dense, ppl_soft0, ppl_hard0, kept0, rc->fc.topk);
            metrics_flush(mf, metrics_path);
        }
    }

    int B = rc->B, T = rc->T;
    const int Bl = B / ranks; /* this rank's rows of each batch, from row `first` */
    const size_t first = (size_t)dp->rank * Bl * T;
    int use_kl, use_attn;
    runconfig_objective(rc, &use_kl, &use_attn);
    int* inp = mallocCheck(sizeof(int) * B * T);
    int* tgt = mallocCheck(sizeof(int) * B * T);
    m->fc = rc->fc;
    m->fc.attn = ATTN_SOFT;
    double t_start = now_seconds();
    for (long step = st.step; step < rc->steps; step++) {
        double t0 = now_seconds(), comm0 = comm_seconds(m, dp);
        float lr = lr_schedule(step, rc->warmup, rc->steps, rc->lr, rc->min_lr_frac);
        model_zero_grad(m, GRAD_ROUTER);
        double loss = 0, lm_loss = 0;
        for (int micro = 0; micro < rc->grad_accum; micro++) {
            next_batch(d->train, d->ntrain, &sampler, B, T, inp, tgt, m->bos);
            double obj = 0;
            if (use_kl || use_attn) model_teacher_forward(m, inp + first, Bl, T, use_kl, use_attn);
            if (use_attn) {
                obj += rc->attn_weight * model_attn_objective(m, rc->attn_weight, 1);
                if (!use_kl) model_update_beta(m); /* the teacher pass ran the training routing */
            }
            if (!use_attn || use_kl) {
                model_forward(m, inp + first, tgt + first, Bl, T, 1);
                model_update_beta(m);
                model_backward(m, GRAD_ROUTER);
                obj += use_kl ? m->mean_kl : m->mean_loss;
                lm_loss += m->mean_loss / rc->grad_accum;
            }
            if (!isfinite(obj))
                fatal("retrofit: the loss became %g at step %ld; %s; try a lower lr", obj, step + 1,
                      last_ckpt_words(ckpt_step, ckpt, words, sizeof words));
            loss += obj / rc->grad_accum;
        }
        if (ranks > 1) { /* every rank's rows: the gradients and losses of the whole batch */
            comm_allreduce_sum(dp, m->rgrads_mem, m->num_router, COMM_F32);
            for (size_t i = 0; i < m->num_router; i++) m->rgrads_mem[i] /= (real)ranks;
            double sums[2] = {loss, lm_loss};
            comm_allreduce_sum(dp, sums, 2, COMM_F64);
            loss = sums[0] / ranks, lm_loss = sums[1] / ranks;
        }
        /* mean over micro-batches, clip, AdamW: where the model runs */
        double gnorm = model_router_grad_norm(m, nopt, rc->grad_accum);
        if (!isfinite(gnorm))
            fatal("retrofit: gradient norm is %g at step %ld; %s; try a lower lr", gnorm, step + 1,
                  last_ckpt_words(ckpt_step, ckpt, words, sizeof words));
        model_router_adamw(m, &opt, lr, gnorm, rc->clip, rc->grad_accum);
        train_anchor_step(m, center, nopt, lr, rc->anchor);
        double dt = now_seconds() - t0, comm = comm_seconds(m, dp) - comm0;
        double share = focus_largest_share(m), gate = focus_gate_far_mean(m, &rng);
        double tps = (double)B * T * rc->grad_accum / dt;
        char commtxt[48] = "";
        if (ranks > 1 || m->tp)
            snprintf(commtxt, sizeof commtxt, " (%.0f%% communicating)", 100 * comm / dt);
        printf(
            "step %5ld/%d | %s %.4f | lr %.2e | %8.0f tok/s | %7.0f ms%s | largest group %.3f | "
            "gate(far) %.3f | |g| %.3f\n",
            step + 1, rc->steps, rc->objective, loss, (double)lr, tps, dt * 1e3, commtxt, share,
            gate, gnorm);
        fflush(stdout);
        fprintf(
            mf,
            "{\"type\": \"train\", \"step\": %ld, \"loss\": %.9g, \"lm_loss\": %.9g, \"lr\": %.9g, "
            "\"tokens_per_s\": %.1f, \"ms\": %.1f, \"comm_ms\": %.1f, "
            "\"largest_share\": %.6f, \"gate_far\": %.6f, \"grad_norm\": %.6g}\n",
            step + 1, loss, use_attn && !use_kl ? -1.0 : lm_loss, (double)lr, tps, dt * 1e3,
            comm * 1e3, share, isfinite(gate) ? gate : -1.0, gnorm);
        metrics_flush(mf, metrics_path);
        st.step = step + 1;
        int last = st.step == rc->steps || st.step == stop_after;
        if (evaluate && (st.step % rc->eval_every == 0 || st.step == rc->steps)) {
            PplResult s = eval_mode(m, d->val, d->neval, T, ATTN_SOFT, rc->fc.topk, ROUTE_CAUSAL);
            PplResult h = eval_mode(m, d->val, d->neval, T, ATTN_HARD, rc->fc.topk, ROUTE_CAUSAL);
            printf(
                "  eval step %ld (causal routing): dense %.3f | soft %.3f | hard k=%s %.3f (%.3f "
                "of "
                "the pairs)\n",
                st.step, ppl_dense, exp(s.nll / s.count), tk, exp(h.nll / h.count), h.kept);
            fprintf(mf,
                    "{\"type\": \"eval\", \"step\": %ld, \"ppl_dense\": %.6f, \"ppl_soft\": %.6f, "
                    "\"ppl_hard\": %.6f, \"pairs_kept\": %.6f, \"topk\": %d}\n",
                    st.step, ppl_dense, exp(s.nll / s.count), exp(h.nll / h.count), h.kept,
                    rc->fc.topk);
            metrics_flush(mf, metrics_path);
        }
        if (st.step % rc->ckpt_every == 0 || last) {
            model_router_adamw_sync(m, &opt);
            st.adam_t = opt.t;
            st.beta_updates = m->beta_updates;
            st.rng_state = rng.state;
            st.data_pos = sampler.state;
            if (!router_state_finite(m, &opt))
                fatal("retrofit: the router holds NaN or inf after step %ld; %s; try a lower lr",
                      st.step, last_ckpt_words(ckpt_step, ckpt, words, sizeof words));
            if (root) router_save(ckpt, m, &opt, &st, conf_text);
            ckpt_step = st.step;
        }
        if (st.step == stop_after) {
            printf("stopped after step %ld as asked; continue with: focus retrofit --resume %s\n",
                   st.step, out);
            break;
        }
    }
    metrics_flush(mf, metrics_path);
    fclose(mf);
    if (model_weights_hash(m) != base_fp)
        fatal("internal: a backbone weight changed during router training");
    m->dp = NULL;
    m->pass.lean_acts = 0;
    comm_barrier(dp); /* the others wait for rank 0's last checkpoint */
    if (st.step == rc->steps && evaluate) {
        PplResult s = eval_mode(m, d->val, d->neval, T, ATTN_SOFT, rc->fc.topk, ROUTE_CAUSAL);
        PplResult h = eval_mode(m, d->val, d->neval, T, ATTN_HARD, rc->fc.topk, ROUTE_CAUSAL);
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
        if (!strcmp(device, "cpu")) { /* what `focus plan` predicts, against what it took */
            MemoryPlan p = model_memory_plan(&m->cfg, &rc->fc, Bl, T, use_kl, use_attn,
                                             m->wbf16 ? WEIGHTS_BF16_PROJ : WEIGHTS_FP32);
            const double data = (double)(d->ntrain + d->neval) * sizeof(int);
            printf(
                "memory: peak %.0f MiB above the program's own; the plan (focus plan) %.0f MiB "
                "and the tokens %.0f MiB\n",
                peak_rss_growth_mib(), p.total / 1048576.0, data / 1048576.0);
        }
    }
    free(inp);
    free(tgt);
    adamw_free(&opt);
    free(center);
}

/* One run per folder: an advisory lock on OUT/.lock, held until the process exits (a second run
 * on the same folder is refused); then temporary files that a killed run left behind (any
 * *.tmp.PID: no other run can be writing them) are removed. */
static void lock_run_folder(const char* cmd, const char* out) {
    char path[4096];
    path_join(path, sizeof path, out, ".lock");
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) fatal("%s: cannot create: %s", path, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB))
        fatal("%s: %s: another focus run is using this folder; wait for it or choose another", cmd,
              out);
    DIR* dir = opendir(out);
    if (!dir) fatal("%s: cannot list: %s", out, strerror(errno));
    struct dirent* e;
    while ((e = readdir(dir))) {
        if (!strstr(e->d_name, ".tmp.")) continue;
        path_join(path, sizeof path, out, e->d_name);
        if (!unlink(path)) printf("removed %s, left by a run that was stopped\n", path);
    }
    closedir(dir);
}

/* The files a run of focus retrofit, finetune or pretrain leaves in its folder. */
static const char* const run_files[] = {"config.conf", "router.h5",  "metrics.jsonl",
                                        "lora.h5",     "model.gguf", "base.gguf"};

const char* run_folder_kind(const char* out, char* files, size_t n) {
    char path[4096];
    files[0] = 0;
    for (size_t i = 0; i < sizeof run_files / sizeof run_files[0]; i++) {
        path_join(path, sizeof path, out, run_files[i]);
        if (access(path, F_OK)) continue;
        size_t used = strlen(files);
        snprintf(files + used, n - used, "%s%s", used ? ", " : "", run_files[i]);
    }
    if (!files[0]) return NULL;
    static char kind[32];
    path_join(path, sizeof path, out, "config.conf");
    FILE* f = fopen_regular(path, "r");
    char line[256];
    if (f && fgets(line, sizeof line, f) && sscanf(line, "# focus %31s run", kind) == 1) {
        fclose(f);
        return kind;
    }
    if (f) fclose(f);
    /* a folder written before config.conf named its command */
    if (strstr(files, "lora.h5") || strstr(files, "model.gguf")) return "finetune";
    return strstr(files, "router.h5") || strstr(files, "config.conf") ? "retrofit" : "unknown";
}

/* Refuse to start a new run in a folder that holds one (its files would be overwritten). */
static void refuse_occupied_folder(const char* cmd, const char* out) {
    char files[256];
    const char* kind = run_folder_kind(out, files, sizeof files);
    if (!kind) return;
    if (!strcmp(cmd, "retrofit") && !strcmp(kind, "retrofit"))
        fatal(
            "%s: %s already holds a retrofit run (%s); continue or extend it with focus "
            "retrofit --resume %s [--set steps=N], or choose another --out",
            cmd, out, files, out);
    fatal("%s: %s already holds a %s run (%s); choose another --out (nothing was written)", cmd,
          out, kind, files);
}

void run_write_config(const char* cmd, const char* out, const char* conf_text) {
    char conf_path[4096], head[160];
    path_join(conf_path, sizeof conf_path, out, "config.conf");
    snprintf(head, sizeof head,
             "# focus %s run: its settings, sealed in its checkpoint; change one with\n"
             "# focus retrofit --resume RUN_DIR --set key=value (retrofit runs)\n",
             cmd);
    const void* parts[2] = {head, conf_text};
    size_t sz[2] = {strlen(head), strlen(conf_text)};
    write_file_atomic(conf_path, parts, sz, 2);
}

/* A loaded model decides its own shape ([model] L, C, arch, V, ...): a setting of the run that
 * differs from both the default and the file would be ignored without a word, so it is refused. */
static void refuse_shape_settings(const char* cmd, const RunConfig* rc, const Model* m) {
    RunConfig def;
    runconfig_default(&def);
    for (int i = 0; i < model_settings_count; i++) {
        const Setting* s = &model_settings[i];
        char set[1100], dflt[1100], file[1100];
        setting_format(s, &rc->mcfg, 1, set, sizeof set);
        setting_format(s, &def.mcfg, 1, dflt, sizeof dflt);
        setting_format(s, &m->cfg, 1, file, sizeof file);
        if (strcmp(set, dflt) && strcmp(set, file))
            fatal(
                "%s: %s = %s, but the model %s has %s = %s: a loaded model decides its own "
                "shape (remove the setting)",
                cmd, s->name, set, rc->model, s->name, file);
    }
}

char* run_prepare(RunConfig* rc, const char* cmd, const char* out, int resume, Model* m,
                  TrainData* d) {
    if (rc->B < 1 || rc->T < 2 || rc->steps < 1 || rc->grad_accum < 1)
        fatal("%s: B, T (>= 2), steps and grad_accum must be positive", cmd);
    if (!rc->model[0]) fatal("%s: no base model (set model = PATH or model = scratch)", cmd);
    if (!rc->train[0]) fatal("%s: no training data (set train = PATH)", cmd);
    if (rc->anchor > 0 && !rc->init_router[0])
        fatal("%s: anchor = %g pulls toward init_router, and init_router is not set", cmd,
              (double)rc->anchor);
    if (rc->rehearse_windows > 0 && !rc->rehearse[0])
        fatal("%s: rehearse_windows = %d, and no rehearse = PATH to draw them from", cmd,
              rc->rehearse_windows);
    if (rc->rehearse[0] && (rc->rehearse_windows < 1 || strcmp(rc->objective, "mass")))
        fatal(
            "%s: rehearse = %s is read by the mass objective's rehearse_windows (set "
            "objective = mass and rehearse_windows >= 1)",
            cmd, rc->rehearse);
    if (make_dirs(out)) fatal("%s: cannot create the run folder: %s", out, strerror(errno));
    const int rank = d->rank; /* rank 0 of a data-parallel run holds the folder and writes */
    if (rank == 0) {
        lock_run_folder(cmd, out);
        if (!resume) refuse_occupied_folder(cmd, out);
    }

    /* base model and tokenizer */
    ModelInfo info = {0};
    char base_path[4096];
    path_join(base_path, sizeof base_path, out, "base.gguf");
    int scratch = !strncmp(rc->model, "scratch", 7);
    const char* tok_path = rc->tokenizer[0] ? rc->tokenizer : (scratch ? NULL : rc->model);
    if (!tok_path) fatal("%s: a scratch model needs tokenizer = PATH", cmd);
    int need_pretrain = 0;
    if (strcmp(rc->weights, "fp32") && strcmp(rc->weights, "bf16"))
        fatal("%s: weights = %s; expected fp32 or bf16", cmd, rc->weights);
    const int bf16 = !strcmp(rc->weights, "bf16");
    const ModelLayout lay = {d->tp, bf16 ? WEIGHTS_BF16_PROJ : WEIGHTS_FP32};
    if (scratch && access(base_path, R_OK) == 0 && resume) {
        model_load_slice(m, base_path, &rc->fc, &info, &lay);
    } else if (scratch) {
        Tokenizer* t = tokenizer_load(tok_path);
        rc->mcfg.V = tokenizer_vocab_size(t);
        tokenizer_free(t);
        if (rc->mcfg.maxT < rc->T) rc->mcfg.maxT = rc->T;
        model_build(m, &rc->mcfg, &rc->fc);
        model_init_backbone(m, rc->fc.seed + 1);
        snprintf(info.name, sizeof info.name, "scratch (%s, %.2fM parameters)",
                 rc->mcfg.arch == ARCH_GPT2 ? "gpt2" : "llama", m->num_params / 1e6);
        need_pretrain = 1;
    } else {
        model_load_slice(m, rc->model, &rc->fc, &info, &lay);
        refuse_shape_settings(cmd, rc, m);
    }
    rc->mcfg = m->cfg;
    rc->mcfg.tp = rc->mcfg.tp_rank = 0; /* the whole model's shape */
    if (rc->T > m->cfg.maxT)
        fatal("%s: T=%d exceeds the model's context %d", cmd, rc->T, m->cfg.maxT);

    /* data */
    size_t ntrain, nval;
    int* train = load_tokens(rc->train, "train_", tok_path, 1, &ntrain);
    int* val;
    if (rc->val[0]) {
        val = load_tokens(rc->val, "val_", tok_path, 1, &nval);
    } else {
        nval = (size_t)(rc->val_fraction * (double)ntrain);
        val = mallocCheck(sizeof(int) * (nval + 1));
        memcpy(val, train + ntrain - nval, sizeof(int) * nval);
        ntrain -= nval;
    }
    for (size_t i = 0; i < ntrain; i++)
        if (train[i] >= m->cfg.V)
            fatal("%s: token id %d outside the model's vocabulary (%d)", rc->train, train[i],
                  m->cfg.V);
    for (size_t i = 0; i < nval; i++)
        if (val[i] >= m->cfg.V)
            fatal("%s: token id %d outside the model's vocabulary (%d)", rc->val, val[i], m->cfg.V);
    if (nval < 2 && rc->val[0])
        fatal("%s: %zu validation tokens (val = %s); the run would report no perplexity", rc->val,
              nval, rc->val);
    if (nval < 2)
        fatal(
            "%s: %zu validation tokens: val_fraction = %g and no val = FILE; the run would "
            "report no perplexity (set val_fraction > 0 or val = PATH)",
            cmd, nval, rc->val_fraction);
    if (ntrain < (size_t)rc->T + 1)
        fatal("%s: %zu training tokens, fewer than T + 1 = %d", rc->train, ntrain, rc->T + 1);
    size_t neval =
        rc->eval_tokens > 0 && nval > (size_t)rc->eval_tokens ? (size_t)rc->eval_tokens : nval;
    size_t nreh = 0; /* the rehearse text's tokens */
    int* reh = rc->rehearse[0] ? load_tokens(rc->rehearse, "train_", tok_path, 1, &nreh) : NULL;
    for (size_t i = 0; i < nreh; i++)
        if (reh[i] >= m->cfg.V)
            fatal("%s: token id %d outside the model's vocabulary (%d)", rc->rehearse, reh[i],
                  m->cfg.V);
    if (reh && nreh < (size_t)rc->T + 1)
        fatal("%s: %zu tokens, fewer than T + 1 = %d", rc->rehearse, nreh, rc->T + 1);

    printf(
        "focus %s: base %s (%s), %zu training tokens, %zu validation tokens (%zu evaluated), "
        "%d threads\n",
        cmd, info.name, info.format[0] ? info.format : "built here", ntrain, nval, neval,
        omp_get_max_threads());
    runconfig_print(rc, stdout);
    if (need_pretrain) { /* every rank the same (same data, seed and code); rank 0 writes */
        train_pretrain(m, rc, train, ntrain, rank == 0 ? out : NULL);
        snprintf(rc->model, sizeof rc->model, "scratch");
        if (d->tp) model_shard(m, d->tp); /* pretrained whole, then sliced */
    }
    if (bf16 && need_pretrain) { /* pretrained in fp32 (a loaded model is stored already) */
        model_store_bf16(m);
        printf("frozen projections stored in bf16 (the norms, embeddings and head in fp32)\n");
    }

    char* conf_text = runconfig_text(rc);
    if (rank == 0) {
        /* on resume the file says what the run now trains with: restored if it was deleted,
         * rewritten if --set changed a setting (cmd_retrofit checked it against the checkpoint) */
        char conf_path[4096];
        path_join(conf_path, sizeof conf_path, out, "config.conf");
        char* old = resume ? read_file_opt(conf_path, NULL) : NULL;
        const char* body = old;
        while (body && *body == '#') body = strchr(body, '\n') ? strchr(body, '\n') + 1 : "";
        if (!resume || !old || strcmp(body, conf_text)) run_write_config(cmd, out, conf_text);
        if (resume && !old)
            printf("%s: restored from the checkpoint's settings\n", conf_path);
        else if (resume && strcmp(body, conf_text))
            printf("%s: rewritten with the settings changed by --set\n", conf_path);
        free(old);
    }
    *d = (TrainData){train, ntrain, val, neval, train, val, rank, d->tp, reh, nreh};
    return conf_text;
}

/* Validation perplexity of a fine-tuning or from-scratch run at `step`: dense, and for a joint
 * run soft and hard as well; printed and written to mf. */
static void finetune_eval(Model* m, const RunConfig* rc, const TrainData* d, int joint, long step,
                          FILE* mf) {
    PplResult dn = eval_mode(m, d->val, d->neval, rc->T, ATTN_DENSE, 1, ROUTE_CAUSAL);
    const double pd = exp(dn.nll / dn.count);
    if (!joint) {
        printf("  eval step %ld: validation perplexity %.3f\n", step, pd);
        fprintf(mf, "{\"type\": \"eval\", \"step\": %ld, \"ppl\": %.6f}\n", step, pd);
        return;
    }
    PplResult s = eval_mode(m, d->val, d->neval, rc->T, ATTN_SOFT, rc->fc.topk, ROUTE_CAUSAL);
    PplResult h = eval_mode(m, d->val, d->neval, rc->T, ATTN_HARD, rc->fc.topk, ROUTE_CAUSAL);
    char tk[32];
    printf(
        "  eval step %ld (causal routing): dense %.3f | soft %.3f | hard k=%s %.3f (%.3f of the "
        "pairs)\n",
        step, pd, exp(s.nll / s.count), focus_topk_str(&rc->fc, tk), exp(h.nll / h.count), h.kept);
    fprintf(mf,
            "{\"type\": \"eval\", \"step\": %ld, \"ppl_dense\": %.6f, \"ppl_soft\": %.6f, "
            "\"ppl_hard\": %.6f, \"pairs_kept\": %.6f, \"topk\": %d}\n",
            step, pd, exp(s.nll / s.count), exp(h.nll / h.count), h.kept, rc->fc.topk);
}

void train_finetune(Model* m, const RunConfig* rc, const TrainData* d, const char* out,
                    const char* conf_text) {
    const int lora = !strcmp(rc->method, "lora"), joint = !strcmp(rc->method, "joint");
    if (!lora && !joint && strcmp(rc->method, "full"))
        fatal("finetune: method must be lora, full or joint, got '%s'", rc->method);
    if (!lora && m->cfg.arch != ARCH_LLAMA)
        fatal("finetune: method %s writes a GGUF, which this build writes for llama models only",
              rc->method);
    if (joint && rc->fc.attn == ATTN_DENSE)
        fatal("finetune: method joint trains the router with the backbone; attn is dense");
    const uint64_t fp = model_fingerprint(m);
    char path[4096], rpath[4096], metrics_path[4096];
    path_join(path, sizeof path, out, lora ? "lora.h5" : "model.gguf");
    path_join(rpath, sizeof rpath, out, "router.h5");
    path_join(metrics_path, sizeof metrics_path, out, "metrics.jsonl");
    /* the baselines change the weights, not the attention; a joint run trains the soft gate */
    m->fc = rc->fc;
    m->fc.attn = joint ? ATTN_SOFT : ATTN_DENSE;
    if (lora) {
        const int targets = lora_parse_targets(rc->lora_targets);
        if (targets <= 0)
            fatal("finetune: lora_targets '%s' is not a subset of qkv,o,fc,fcproj",
                  rc->lora_targets);
        LoraConfig lc = {rc->lora_rank, rc->lora_alpha, targets};
        model_lora_init(m, &lc, rc->fc.seed);
    } else {
        model_zero_grad(m, GRAD_ALL); /* allocates the gradients */
    }
    const GradMode mode = lora ? GRAD_LORA : GRAD_ALL;
    real* params = lora ? m->lora_mem : m->params_mem;
    const size_t n = lora ? m->num_lora : m->num_params;
    AdamW opt, ropt = {0}; /* the router has its own moments (its parameters live apart) */
    adamw_init(&opt, n, rc->beta1, rc->beta2, rc->adam_eps, rc->weight_decay);
    const size_t nr = model_router_trained(m, rc->fc.learn_gate);
    if (joint) adamw_init(&ropt, nr, rc->beta1, rc->beta2, rc->adam_eps, rc->weight_decay);
    printf("finetune (%s): %zu trained parameters (%.2f %% of the backbone's %zu)%s\n", rc->method,
           n + (joint ? nr : 0), 100.0 * n / m->num_params, m->num_params,
           joint ? ", the router trained with the backbone" : "");
    FILE* mf = fopen(metrics_path, "w");
    if (!mf) fatal("%s: cannot open: %s", metrics_path, strerror(errno));
    if (d->neval > 1) {
        printf("before training:\n");
        finetune_eval(m, rc, d, joint, 0, mf);
    }
    const int B = rc->B, T = rc->T;
    int* inp = mallocCheck(sizeof(int) * B * T);
    int* tgt = mallocCheck(sizeof(int) * B * T);
    Rng sampler;
    rng_seed(&sampler,
             rc->fc.seed ^ 0xda7aull); /* the retrofit's data order, for the same budget */
    const double t_start = now_seconds();
    for (long step = 0; step < rc->steps; step++) {
        const double t0 = now_seconds();
        const float lr = lr_schedule(step, rc->warmup, rc->steps, rc->lr, rc->min_lr_frac);
        model_zero_grad(m, mode);
        double loss = 0;
        for (int micro = 0; micro < rc->grad_accum; micro++) {
            next_batch(d->train, d->ntrain, &sampler, B, T, inp, tgt, m->bos);
            model_forward(m, inp, tgt, B, T, 1);
            if (!isfinite(m->mean_loss))
                fatal("finetune: the loss became %g at step %ld; try a lower lr",
                      (double)m->mean_loss, step + 1);
            if (joint) model_update_beta(m);
            model_backward(m, mode);
            loss += m->mean_loss / rc->grad_accum;
        }
        real* grads = lora ? m->lora_grads_mem : m->grads_mem;
        if (rc->grad_accum > 1)
            for (size_t i = 0; i < n; i++) grads[i] /= (real)rc->grad_accum;
        /* one norm over everything that trains, both parts clipped by the same factor */
        double gnorm = grad_norm(grads, n);
        if (joint) gnorm = hypot(gnorm, model_router_grad_norm(m, nr, rc->grad_accum));
        if (!isfinite(gnorm))
            fatal("finetune: the gradient norm became %g at step %ld; try a lower lr", gnorm,
                  step + 1);
        grad_clip(grads, n, gnorm, rc->clip);
        adamw_step(&opt, params, grads, lr);
        if (joint) model_router_adamw(m, &ropt, lr, gnorm, rc->clip, rc->grad_accum);
        const double dt = now_seconds() - t0;
        printf("step %5ld/%d | loss %.4f | lr %.2e | %8.0f tok/s | |g| %.3f\n", step + 1, rc->steps,
               loss, (double)lr, (double)B * T * rc->grad_accum / dt, gnorm);
        fflush(stdout);
        fprintf(mf,
                "{\"type\": \"train\", \"step\": %ld, \"loss\": %.9g, \"lr\": %.9g, \"grad_norm\": "
                "%.6g}\n",
                step + 1, loss, (double)lr, gnorm);
        const int last = step + 1 == rc->steps;
        if (d->neval > 1 && ((step + 1) % rc->eval_every == 0 || last))
            finetune_eval(m, rc, d, joint, step + 1, mf);
        metrics_flush(mf, metrics_path);
        if ((step + 1) % rc->ckpt_every == 0 || last) {
            if (lora) {
                lora_save(path, m, fp);
                continue;
            }
            gguf_write_model(m, path, 0);
            if (joint) { /* the router of the weights just written */
                RouterState st = {step + 1, ropt.t, m->beta_updates, 0, 0, model_fingerprint(m)};
                router_save(rpath, m, &ropt, &st, conf_text);
            }
        }
    }
    metrics_flush(mf, metrics_path);
    fclose(mf);
    printf("finetune took %.1f s; %s written (load it with --%s)%s\n", now_seconds() - t_start,
           path, lora ? "lora" : "model", joint ? " with its router.h5 (--router)" : "");
    free(inp);
    free(tgt);
    adamw_free(&opt);
    if (joint) adamw_free(&ropt);
}

void finetune_run(RunConfig* rc, const char* cmd, const char* out) {
    Model m;
    TrainData d = {0};
    char* conf_text = run_prepare(rc, cmd, out, 0, &m, &d);
    train_finetune(&m, rc, &d, out, conf_text);
    free(conf_text);
    free(d.train_mem);
    free(d.val_mem);
    free(d.old);
    model_free(&m);
}
