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

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../checkpoints/load.h"
#include "../checkpoints/router_h5.h"
#include "../kernels/adamw.h"
#include "cli.h"
#include "evaluate.h"

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
        kept = reallocCheck(kept, klen + l + 1);
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

void train_router(Model* m, const RunConfig* rc, const TrainData* d, const char* out,
                  const char* conf_text, int resume, long stop_after, const char* device) {
    char ckpt[4096], metrics_path[4096];
    path_join(ckpt, sizeof ckpt, out, "router.h5");
    path_join(metrics_path, sizeof metrics_path, out, "metrics.jsonl");
    /* optimizer and state */
    size_t nopt =
        m->router_sizes[0] + m->router_sizes[1] + (rc->fc.learn_gate ? m->router_sizes[2] : 0);
    AdamW opt;
    adamw_init(&opt, nopt, rc->beta1, rc->beta2, rc->adam_eps, rc->weight_decay);
    RouterState st = {0, 0, 0, 0, 0, model_fingerprint(m)};
    Rng rng, sampler;
    rng_seed(&rng, rc->fc.seed ^ 0x5eedull);
    rng_seed(&sampler, rc->fc.seed ^ 0xda7aull);
    real* base_copy = NULL; /* the backbone must not change: checked at the end */
    base_copy = mallocCheck(sizeof(real) * m->num_params);
    memcpy(base_copy, m->params_mem, sizeof(real) * m->num_params);
    if (resume) {
        router_load(ckpt, m, &opt, &st, st.fingerprint);
        rng.state = st.rng_state;
        sampler.state = st.data_pos;
        truncate_metrics(metrics_path, st.step);
        printf("resumed from %s at step %ld\n", ckpt, st.step);
    } else {
        remove(metrics_path);
    }
    model_place(m, device);
    FILE* mf = fopen(metrics_path, "a");
    if (!mf) fatal("%s: cannot open: %s", metrics_path, strerror(errno));

    /* perplexity before training */
    double ppl_dense = 0, ppl_soft0 = 0, ppl_hard0 = 0, kept0 = 0;
    char tk[32];
    focus_topk_str(&rc->fc, tk);
    if (d->neval > 1) {
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
            fflush(mf);
        }
    }

    int B = rc->B, T = rc->T;
    int use_kl, use_attn;
    runconfig_objective(rc, &use_kl, &use_attn);
    int* inp = mallocCheck(sizeof(int) * B * T);
    int* tgt = mallocCheck(sizeof(int) * B * T);
    m->fc = rc->fc;
    m->fc.attn = ATTN_SOFT;
    double t_start = now_seconds();
    for (long step = st.step; step < rc->steps; step++) {
        double t0 = now_seconds();
        float lr = lr_schedule(step, rc->warmup, rc->steps, rc->lr, rc->min_lr_frac);
        model_zero_grad(m, GRAD_ROUTER);
        double loss = 0, lm_loss = 0;
        for (int micro = 0; micro < rc->grad_accum; micro++) {
            next_batch(d->train, d->ntrain, &sampler, B, T, inp, tgt);
            double obj = 0;
            if (use_kl || use_attn) model_teacher_forward(m, inp, B, T, use_kl, use_attn);
            if (use_attn) {
                obj += rc->attn_weight * model_attn_objective(m, rc->attn_weight, 1);
                if (!use_kl) model_update_beta(m); /* the teacher pass ran the training routing */
            }
            if (!use_attn || use_kl) {
                model_forward(m, inp, tgt, B, T, 1);
                model_update_beta(m);
                model_backward(m, GRAD_ROUTER);
                obj += use_kl ? m->mean_kl : m->mean_loss;
                lm_loss += m->mean_loss / rc->grad_accum;
            }
            if (!isfinite(obj))
                fatal(
                    "retrofit: the loss became %g at step %ld; the last checkpoint (%s) is intact; "
                    "try a lower lr",
                    obj, step + 1, ckpt);
            loss += obj / rc->grad_accum;
        }
        /* mean over micro-batches, clip, AdamW: where the model runs */
        double gnorm = model_router_grad_norm(m, nopt, rc->grad_accum);
        if (!isfinite(gnorm))
            fatal("retrofit: gradient norm is %g at step %ld; the last checkpoint (%s) is intact",
                  gnorm, step + 1, ckpt);
        model_router_adamw(m, &opt, lr, gnorm, rc->clip, rc->grad_accum);
        double dt = now_seconds() - t0;
        double share = focus_largest_share(m), gate = focus_gate_far_mean(m, &rng);
        double tps = (double)B * T * rc->grad_accum / dt;
        printf(
            "step %5ld/%d | %s %.4f | lr %.2e | %8.0f tok/s | %7.0f ms | largest group %.3f | "
            "gate(far) %.3f | |g| %.3f\n",
            step + 1, rc->steps, rc->objective, loss, (double)lr, tps, dt * 1e3, share, gate,
            gnorm);
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
        int last = st.step == rc->steps || st.step == stop_after;
        if (d->neval > 1 && (st.step % rc->eval_every == 0 || st.step == rc->steps)) {
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
            fflush(mf);
        }
        if (st.step % rc->ckpt_every == 0 || last) {
            model_router_adamw_sync(m, &opt);
            st.adam_t = opt.t;
            st.beta_updates = m->beta_updates;
            st.rng_state = rng.state;
            st.data_pos = sampler.state;
            router_save(ckpt, m, &opt, &st, conf_text);
        }
        if (st.step == stop_after) {
            printf("stopped after step %ld as asked; continue with: focus retrofit --resume %s\n",
                   st.step, out);
            break;
        }
    }
    fclose(mf);
    if (memcmp(base_copy, m->params_mem, sizeof(real) * m->num_params))
        fatal("internal: a backbone weight changed during router training");
    free(base_copy);
    if (st.step == rc->steps && d->neval > 1) {
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
    }
    free(inp);
    free(tgt);
    adamw_free(&opt);
}
