/* mass.c: router training with the `mass` objective (objective = mass; docs/OBJECTIVE.md), the
 * loop train_router hands such a run to.
 *
 * Every routed layer's router learns from the frozen model's own dense attention: where each
 * query's attention mass beyond the window goes (kernels/mass.h). Nothing the router does changes
 * a layer's input or the teacher, so the run has two phases:
 *
 * 1. The teacher. mass_windows windows of T tokens (offsets drawn from the run's seed), and
 *    rehearse_windows more from the rehearse text (domain adaptation that keeps rehearsing the
 *    text the router learnt before), each one dense forward pass with no head, seen layer by
 *    layer through Model.layer_observer: the layer's normalised input h (the router's input,
 *    kept in bf16) and, for a sample of query rows, the far mass and its mass_keys largest
 *    entries. Each window goes to its own file, OUT/teacher/window_NNNN.bin (rehearse_NNNN.bin),
 *    written atomically: a stopped run collects only what is missing. One layer's activations
 *    are held at a time, never T x T.
 * 2. The router. Each step draws B windows of all; per routed layer: scores, the training routing
 *    (Sinkhorn by default), the loss, and the router's own backward (routing_backward,
 *    router_scores_backward). No backward through the backbone, no LM head. beta, the causal
 *    bias, is balanced on the step's scores as in the other objectives; then clipping and AdamW.
 *    OUT/router.h5 every ckpt_every steps: --resume continues bit for bit.
 *
 * Perplexity (dense, hard top-k with causal routing) on eval_tokens validation tokens before and
 * after; the memory the plan predicts beside the measured peak at the end. CPU only: the teacher
 * reads the CPU forward pass's activations. */
#include <errno.h>
#include <stddef.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <omp.h>

#include "../checkpoints/blockgate_h5.h"
#include "../checkpoints/router_h5.h"
#include "../io/io.h"
#include "../kernels/adamw.h"
#include "../kernels/mass.h"
#include "../kernels/router.h"
#include "../eval/evaluate.h"
#include "loop.h"

#define MASS_MAGIC "FOCUSMT1"
#define MASS_VERSION 3u

/* The fixed header of a teacher file, then `layers` int32 layer indices, then one chunk per
 * routed layer: h (T, C) bf16, rows (nq) int32, far (nq) f32, idx (nq, keys) int32, p (nq, keys)
 * f32. Little-endian, as written. Version 2 adds the block selector the teacher leaves out
 * (blocks per query, block size, a hash of its weights; 0 without one); a version 1 file (the
 * header without them) is read as a teacher without a selector. Version 3 adds the score
 * (mass_values: 0 the mass, 1 the output restored, 2 that and the harm, 3 the residual stream's
 * error closed and the harm); older files scored
 * the mass. */
typedef struct {
    char magic[8];
    uint32_t version, T, C, layers, nq, keys, w, sinks;
    uint64_t fingerprint, offset;
    uint32_t sel_blocks, sel_bs;
    uint64_t sel_hash;
    uint32_t values, pad;
} MassHeader;
#define MASS_HEADER_V1 offsetof(MassHeader, sel_blocks)
#define MASS_HEADER_V2 offsetof(MassHeader, values)

/* What one window holds: the sampled query rows are the same in every layer. */
typedef struct {
    int nl, T, C, nq, keys;
    const int* layers; /* (nl) the routed layers */
    uint16_t* h;       /* (nl, T, C) */
    MassRows* t;       /* (nl) */
    int* slot;         /* (L) index of each layer among the routed ones, -1 */
    /* the block selector whose blocks the teacher leaves out (mass_selector; blocks 0: none) */
    int sel_blocks, sel_bs;
    uint64_t sel_hash;
    int values; /* the teacher scores the output a key restores (mass_values), not its mass */
} Window;

static size_t chunk_bytes(const Window* w) {
    return (size_t)w->T * w->C * 2 + (size_t)w->nq * 8 + (size_t)w->nq * w->keys * 8;
}

static void window_alloc(Window* w, int nl, const int* layers, int* slot, int T, int C, int nq,
                         int keys) {
    *w = (Window){nl, T, C, nq, keys, layers, NULL, NULL, slot, 0, 0, 0, 0};
    w->h = mallocCheck(sizeof(uint16_t) * (size_t)nl * T * C);
    w->t = mallocCheck(sizeof(MassRows) * nl);
    for (int s = 0; s < nl; s++) {
        MassRows* t = &w->t[s];
        t->nq = nq, t->m = keys;
        t->rows = mallocCheck(sizeof(int) * (nq ? nq : 1));
        t->far = mallocCheck(sizeof(float) * (nq ? nq : 1));
        t->idx = mallocCheck(sizeof(int) * ((size_t)nq * keys + 1));
        t->p = mallocCheck(sizeof(float) * ((size_t)nq * keys + 1));
    }
}

static void window_free(Window* w) {
    for (int s = 0; s < w->nl; s++) {
        free(w->t[s].rows);
        free(w->t[s].far);
        free(w->t[s].idx);
        free(w->t[s].p);
    }
    free(w->t);
    free(w->h);
}

typedef struct {
    Model* m;
    Window* win;
} Teacher;

static void observe(void* ctx, int layer, const real* h, const real* qkv, const real* lse, int B,
                    int T) {
    Teacher* o = ctx;
    const Window* w = o->win;
    const int s = w->slot[layer];
    if (s < 0 || B != 1) return;
    Model* m = o->m;
    const ModelConfig* c = &m->cfg;
    const int NH = model_heads(c), NKV = model_kv_heads(c), hs = model_head_size(c);
    real_to_bf16_rows(w->h + (size_t)s * T * c->C, h, (size_t)T * c->C);
    /* mass_values = 3: the layer's output projection, and the norm of its output (Gemma 3) */
    MassStream st = {0};
    if (w->values == 3) {
        const LayerSpec S = model_layer_spec(c, layer);
        st = (MassStream){model_layer_weight(m, P_ATTPROJW, layer),
                          S.sandwich ? m->params.pan + (size_t)layer * c->C : NULL, c->C, c->eps};
    }
    const MassStream* sp = w->values == 3 ? &st : NULL;
    if (!w->sel_blocks) {
        mass_teacher(&w->t[s], qkv, lse, T, NH, NKV, hs, m->fc.w, m->fc.sinks, NULL, w->values, sp);
        return;
    }
    /* beside a block selector: the blocks it keeps in this layer (its per-layer budget scaled
     * to sel_blocks) are left out of the teacher */
    const int n = model_selector_budget(m, layer, w->sel_blocks);
    MassBlocks b = {NULL, NULL, T / w->sel_bs + 1, w->sel_bs};
    b.sel = mallocCheck(sizeof(int) * (size_t)w->nq * NKV * b.nbmax);
    b.nsel = mallocCheck(sizeof(int) * (size_t)w->nq * NKV);
    mass_choose_blocks(&b, &w->t[s], qkv,
                       m->method.selector + (size_t)layer * NH * BLOCKGATE_WIDTH(hs), n, T, NH, NKV,
                       hs, m->fc.w, m->fc.sinks);
    mass_teacher(&w->t[s], qkv, lse, T, NH, NKV, hs, m->fc.w, m->fc.sinks, &b, w->values, sp);
    free(b.sel), free(b.nsel);
}

/* Window k's file: the first mw windows are train's (window_NNNN), the rest rehearse's
 * (rehearse_NNNN), so that changing either count leaves the other's files theirs. */
static void window_path(char* path, size_t n, const char* out, int k, int mw) {
    char name[64];
    if (k < mw)
        snprintf(name, sizeof name, "teacher/window_%04d.bin", k);
    else
        snprintf(name, sizeof name, "teacher/rehearse_%04d.bin", k - mw);
    path_join(path, n, out, name);
}

static void window_write(const char* path, const Window* w, uint64_t fingerprint, uint64_t offset,
                         const FocusConfig* f) {
    MassHeader hd = {MASS_MAGIC,
                     MASS_VERSION,
                     (uint32_t)w->T,
                     (uint32_t)w->C,
                     (uint32_t)w->nl,
                     (uint32_t)w->nq,
                     (uint32_t)w->keys,
                     (uint32_t)f->w,
                     (uint32_t)f->sinks,
                     fingerprint,
                     offset,
                     (uint32_t)w->sel_blocks,
                     (uint32_t)w->sel_bs,
                     w->sel_hash,
                     (uint32_t)w->values,
                     0};
    const int np = 2 + 5 * w->nl;
    const void** parts = mallocCheck(sizeof(void*) * np);
    size_t* sizes = mallocCheck(sizeof(size_t) * np);
    parts[0] = &hd, sizes[0] = sizeof hd;
    parts[1] = w->layers, sizes[1] = sizeof(int) * w->nl;
    for (int s = 0; s < w->nl; s++) {
        const MassRows* t = &w->t[s];
        const size_t nk = (size_t)w->nq * w->keys;
        const void* ps[5] = {w->h + (size_t)s * w->T * w->C, t->rows, t->far, t->idx, t->p};
        const size_t sz[5] = {(size_t)w->T * w->C * 2, sizeof(int) * w->nq, sizeof(float) * w->nq,
                              sizeof(int) * nk, sizeof(float) * nk};
        for (int i = 0; i < 5; i++) parts[2 + 5 * s + i] = ps[i], sizes[2 + 5 * s + i] = sz[i];
    }
    write_file_atomic(path, parts, sizes, np);
    free(parts);
    free(sizes);
}

/* The header's bytes (a version 1 file's are fewer) when path holds a teacher window of this
 * run (header, layers and size as expected); 0 when it does not exist; fatal, naming the file,
 * when it exists but does not match. */
static int window_check(const char* path, const Window* w, uint64_t fingerprint, uint64_t offset,
                        const FocusConfig* f) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT) return 0;
        fatal("%s: cannot open: %s", path, strerror(errno));
    }
    MassHeader hd = {0};
    struct stat st;
    if (fstat(fd, &st) || pread(fd, &hd, MASS_HEADER_V1, 0) != (ssize_t)MASS_HEADER_V1)
        fatal("%s: truncated teacher file (%lld bytes); delete it and resume to collect it again",
              path, (long long)st.st_size);
    if (memcmp(hd.magic, MASS_MAGIC, 8) || hd.version < 1 || hd.version > MASS_VERSION)
        fatal("%s: not a focus teacher file of version 1 to %u", path, MASS_VERSION);
    const size_t head = hd.version == 1   ? MASS_HEADER_V1
                        : hd.version == 2 ? MASS_HEADER_V2
                                          : sizeof hd;
    if (hd.version > 1 && pread(fd, &hd, head, 0) != (ssize_t)head)
        fatal("%s: truncated teacher file (%lld bytes); delete it and resume to collect it again",
              path, (long long)st.st_size);
    close(fd);
    const size_t want = head + sizeof(int) * w->nl + chunk_bytes(w) * w->nl;
    if (hd.sel_blocks != (uint32_t)w->sel_blocks || hd.sel_bs != (uint32_t)w->sel_bs ||
        hd.sel_hash != w->sel_hash)
        fatal(
            "%s: collected beside %u blocks per query of a block selector (0: none), this run "
            "asks for %d%s: use another run folder, or delete its teacher",
            path, hd.sel_blocks, w->sel_blocks,
            hd.sel_blocks == (uint32_t)w->sel_blocks ? " of another selector" : "");
    if (hd.values != (uint32_t)w->values)
        fatal(
            "%s: scored by %s (mass_values = %u), this run asks for mass_values = %d: use "
            "another run folder, or delete its teacher",
            path,
            hd.values == 3 ? "the stream's error closed"
            : hd.values    ? "the output restored"
                           : "the mass",
            hd.values, w->values);
    if (hd.fingerprint != fingerprint)
        fatal("%s: collected from another base model (fingerprint differs)", path);
    if (hd.T != (uint32_t)w->T || hd.C != (uint32_t)w->C || hd.layers != (uint32_t)w->nl ||
        hd.nq != (uint32_t)w->nq || hd.keys != (uint32_t)w->keys || hd.w != (uint32_t)f->w ||
        hd.sinks != (uint32_t)f->sinks)
        fatal(
            "%s: collected with other settings (T %u, layers %u, queries %u, keys %u, w %u, sinks "
            "%u; this run: %d, %d, %d, %d, %d, %d)",
            path, hd.T, hd.layers, hd.nq, hd.keys, hd.w, hd.sinks, w->T, w->nl, w->nq, w->keys,
            f->w, f->sinks);
    if ((size_t)st.st_size != want)
        fatal("%s: %lld bytes, expected %zu; delete it and resume to collect it again", path,
              (long long)st.st_size, want);
    if (hd.offset != offset)
        fatal(
            "%s: collected from tokens %llu.., this run draws this window from tokens %llu.. "
            "(other data): use another run folder, or delete its teacher",
            path, (unsigned long long)hd.offset, (unsigned long long)offset);
    return (int)head;
}

/* Layer s of window file fd into h (T, C) and t. */
static void window_read_layer(int fd, int head, const char* path, const Window* w, int s, real* h,
                              uint16_t* hb, MassRows* t) {
    const size_t nk = (size_t)w->nq * w->keys;
    off_t off = (off_t)((size_t)head + sizeof(int) * w->nl + chunk_bytes(w) * s);
    void* dst[5] = {hb, t->rows, t->far, t->idx, t->p};
    const size_t sz[5] = {(size_t)w->T * w->C * 2, sizeof(int) * w->nq, sizeof(float) * w->nq,
                          sizeof(int) * nk, sizeof(float) * nk};
    for (int i = 0; i < 5; i++) {
        size_t done = 0;
        while (done < sz[i]) {
            ssize_t r = pread(fd, (char*)dst[i] + done, sz[i] - done, off + (off_t)done);
            if (r <= 0) fatal("%s: read failed: %s", path, r < 0 ? strerror(errno) : "truncated");
            done += (size_t)r;
        }
        off += (off_t)sz[i];
    }
    bf16_to_real_rows(h, hb, (size_t)w->T * w->C);
    for (int r = 0; r < w->nq; r++) /* a corrupt index must not reach an array */
        for (size_t e = 0; e < (size_t)w->keys; e++) {
            const int j = t->idx[(size_t)r * w->keys + e];
            if (j < -1 || j >= w->T || t->rows[r] < 0 || t->rows[r] >= w->T)
                fatal("%s: layer %d holds a position outside the window", path, w->layers[s]);
        }
}

static void eta_text(char* buf, size_t n, double seconds) {
    if (!(seconds >= 0)) seconds = 0;
    snprintf(buf, n, "%dm%02ds", (int)(seconds / 60), (int)fmod(seconds, 60));
}

/* Phase 1: every teacher window not on disk yet. */
static void collect(Model* m, const RunConfig* rc, const TrainData* d, const char* out, Window* w,
                    const uint64_t* offs, uint64_t fp) {
    const int T = rc->T, mw = rc->mass_windows, nwin = mw + rc->rehearse_windows;
    char path[4096];
    int missing = 0;
    for (int k = 0; k < nwin; k++) {
        window_path(path, sizeof path, out, k, mw);
        missing += !window_check(path, w, fp, offs[k], &m->fc);
    }
    char also[1200] = "";
    if (rc->rehearse_windows)
        snprintf(also, sizeof also, " (%d of train, %d of rehearse = %s)", mw, rc->rehearse_windows,
                 rc->rehearse);
    printf(
        "teacher: %d windows of %d tokens%s, %d query rows each (one tile in %d), %d keys per "
        "query, %d routed layers; %d on disk, %d to collect (one dense forward each)\n",
        nwin, T, also, w->nq, rc->mass_every, w->keys, w->nl, nwin - missing, missing);
    if (!missing) return;
    int* ids = mallocCheck(sizeof(int) * T);
    Teacher o = {m, w};
    const FocusConfig keep = m->fc;
    m->fc.attn = ATTN_DENSE;
    m->pass.no_head = 1;
    m->layer_observer = observe;
    m->layer_observer_ctx = &o;
    double t0 = now_seconds();
    int done = 0;
    for (int k = 0; k < nwin; k++) {
        window_path(path, sizeof path, out, k, mw);
        if (window_check(path, w, fp, offs[k], &keep)) continue;
        memcpy(ids, (k < mw ? d->train : d->old) + offs[k], sizeof(int) * T);
        if (m->bos >= 0) ids[0] = m->bos;
        mass_sample_rows(w->t[0].rows, T, keep.w, keep.sinks, rc->mass_every,
                         keep.seed ^ (0x3a55ull + (uint64_t)k));
        for (int s = 1; s < w->nl; s++) memcpy(w->t[s].rows, w->t[0].rows, sizeof(int) * w->nq);
        double t1 = now_seconds();
        model_forward(m, ids, NULL, 1, T, 0);
        window_write(path, w, fp, offs[k], &keep);
        done++;
        const double el = now_seconds() - t0;
        char eta[32];
        eta_text(eta, sizeof eta, el / done * (missing - done));
        double far = 0;
        for (int s = 0; s < w->nl; s++)
            for (int r = 0; r < w->nq; r++) far += w->t[s].far[r];
        printf(
            "teacher window %d/%d (%s tokens %llu..%llu): %.1f s | %s %.3f of the attention | "
            "ETA %s\n",
            k + 1, nwin, k < mw ? "train" : "rehearse", (unsigned long long)offs[k],
            (unsigned long long)(offs[k] + T), now_seconds() - t1,
            w->values ? "restoring score" : "far mass",
            w->nq && w->nl ? far / ((double)w->nq * w->nl) : 0.0, eta);
        fflush(stdout);
    }
    m->layer_observer = NULL;
    m->layer_observer_ctx = NULL;
    m->pass.no_head = 0;
    m->fc = keep;
    free(ids);
}

/* What a pass over saved windows reads and writes. */
typedef struct {
    Model* m;
    const Window* w;
    const int* fds;
    const int* heads; /* each window file's header bytes */
    const char* out;
    int mw;       /* train's windows; the rest are rehearse's (window_path) */
    double* part; /* (nl, 3): each layer's loss, far mass and far pairs top-1 groups keep, summed
                   * over windows */
    MassGate gate;
    struct Scratch* scratch; /* one per OpenMP thread, allocated once for the run */
} Pass;

/* A thread's buffers for one layer of one window: h in fp32 and bf16, the router's projection
 * and its gradient, S, G, dG, dS (T, K) each, and with a query projection (qproj) the queries'
 * twins of these, the teacher's rows. */
typedef struct Scratch {
    real *h, *proj, *dproj, *S, *G, *dG, *dS;
    real *qproj, *dqproj, *Sq, *Gq, *dGq, *dSq;
    uint16_t* hb;
    MassRows t;
} Scratch;

static Scratch* scratch_alloc(const Window* w, int K, int dg, int n) {
    Scratch* all = mallocCheck(sizeof(Scratch) * n);
    const size_t T = (size_t)w->T, nk = (size_t)w->nq * w->keys;
    for (int i = 0; i < n; i++) {
        Scratch* x = &all[i];
        x->h = mallocCheck(sizeof(real) * T * w->C);
        x->hb = mallocCheck(sizeof(uint16_t) * T * w->C);
        x->proj = mallocCheck(sizeof(real) * T * dg * 4);
        x->dproj = x->proj + T * dg, x->qproj = x->dproj + T * dg, x->dqproj = x->qproj + T * dg;
        x->S = mallocCheck(sizeof(real) * T * K * 8);
        x->G = x->S + T * K, x->dG = x->G + T * K, x->dS = x->dG + T * K;
        x->Sq = x->dS + T * K, x->Gq = x->Sq + T * K, x->dGq = x->Gq + T * K;
        x->dSq = x->dGq + T * K;
        x->t = (MassRows){w->nq,
                          w->keys,
                          mallocCheck(sizeof(int) * w->nq),
                          mallocCheck(sizeof(float) * w->nq),
                          mallocCheck(sizeof(int) * nk),
                          mallocCheck(sizeof(float) * nk)};
    }
    return all;
}

static void scratch_free(Scratch* all, int n) {
    for (int i = 0; i < n; i++) {
        Scratch* x = &all[i];
        free(x->t.rows), free(x->t.far), free(x->t.idx), free(x->t.p);
        free(x->S), free(x->proj), free(x->hb), free(x->h);
    }
    free(all);
}

/* Every routed layer (in parallel: each one's router, gradients and scores are its own) over the
 * nw windows wins: scores, routing r, the loss; with backward, the router's gradients scaled by
 * 1 / (nw layers) and every `every`-th score row into Sb (nl, nw, nb, K). */
static void mass_pass(const Pass* P, const int* wins, int nw, Routing r, int backward, real* Sb,
                      size_t every, size_t nb) {
    Model* m = P->m;
    const Window* w = P->w;
    const ModelConfig* c = &m->cfg;
    const FocusConfig* f = &m->fc;
    const int T = w->T, K = f->K, dg = f->dg, nl = w->nl;
#pragma omp parallel
    {
        Scratch* x = &P->scratch[omp_get_thread_num()];
        real *h = x->h, *S = x->S, *G = x->G, *dG = x->dG, *dS = x->dS;
        char wpath[4096];
#pragma omp for schedule(dynamic, 1)
        for (int s = 0; s < nl; s++) {
            const int l = w->layers[s];
            const size_t lC = (size_t)l * c->C;
            const real *wg = m->router.wg + lC * dg, *cent = m->router.cent + (size_t)l * K * dg;
            const real* wq = m->router.wq ? m->router.wq + lC * dg : NULL;
            const real* beta = m->beta + (size_t)l * K;
            double* part = P->part + 3 * s;
            part[0] = part[1] = part[2] = 0;
            for (int b = 0; b < nw; b++) {
                window_path(wpath, sizeof wpath, P->out, wins[b], P->mw);
                window_read_layer(P->fds[wins[b]], P->heads[wins[b]], wpath, w, s, h, x->hb, &x->t);
                router_scores_forward(x->proj, S, h, wg, cent, T, c->C, dg, K);
                routing_forward(G, NULL, S, beta, r, 1, T, K, f->tau, f->iters);
                memset(dG, 0, sizeof(real) * (size_t)T * K);
                /* the queries' groups: their own projection, causal routing with the keys'
                 * beta (what hard routing uses; only the keys' groups need balance) */
                real *Gq = G, *dGq = dG;
                if (wq) {
                    Gq = x->Gq, dGq = x->dGq;
                    router_scores_forward(x->qproj, x->Sq, h, wq, cent, T, c->C, dg, K);
                    routing_forward(Gq, NULL, x->Sq, beta, ROUTE_CAUSAL, 1, T, K, f->tau, f->iters);
                    memset(dGq, 0, sizeof(real) * (size_t)T * K);
                }
                MassKept kp;
                part[0] += mass_loss(backward ? dGq : NULL, dG, Gq, G, K, &x->t, &P->gate,
                                     (real)(1.0 / (nw * nl)), &kp);
                part[1] += kp.mass_top1, part[2] += kp.pairs_top1;
                if (!backward) continue;
                memset(dS, 0, sizeof(real) * (size_t)T * K);
                routing_backward(dS, dG, S, G, beta, r, 1, T, K, f->tau, f->iters);
                router_scores_backward(NULL, m->rgrads.wg + lC * dg,
                                       m->rgrads.cent + (size_t)l * K * dg, x->dproj, dS, h,
                                       x->proj, wg, cent, T, c->C, dg, K);
                if (wq) {
                    memset(x->dSq, 0, sizeof(real) * (size_t)T * K);
                    routing_backward(x->dSq, dGq, x->Sq, Gq, beta, ROUTE_CAUSAL, 1, T, K, f->tau,
                                     f->iters);
                    router_scores_backward(NULL, m->rgrads.wq + lC * dg,
                                           m->rgrads.cent + (size_t)l * K * dg, x->dqproj, x->dSq,
                                           h, x->qproj, wq, cent, T, c->C, dg, K);
                }
                real* sb = Sb + ((size_t)s * nw + b) * nb * K;
                for (size_t i = 0, q = 0; i < (size_t)T; i += every, q++)
                    memcpy(sb + q * K, S + i * K, sizeof(real) * K);
            }
        }
    }
}

/* The far mass top-1 groups keep over every saved window and routed layer, under the training
 * routing and under causal routing with the current beta (what evaluation and decoding use). */
static void report_kept(const Pass* P, int nwin, const char* when) {
    int* all = mallocCheck(sizeof(int) * nwin);
    for (int k = 0; k < nwin; k++) all[k] = k;
    const Routing train = P->m->fc.routing;
    double mass[2], pairs[2];
    for (int i = 0; i < 2; i++) {
        mass_pass(P, all, nwin, i ? ROUTE_CAUSAL : train, 0, NULL, 1, 0);
        mass[i] = pairs[i] = 0;
        for (int s = 0; s < P->w->nl; s++) {
            mass[i] += P->part[3 * s + 1] / (nwin * P->w->nl);
            pairs[i] += P->part[3 * s + 2] / (nwin * P->w->nl);
        }
        if (train == ROUTE_CAUSAL) {
            mass[1] = mass[0], pairs[1] = pairs[0];
            break;
        }
    }
    printf(
        "%s, over the %d teacher windows: top-1 groups keep %.3f of the far mass (stored keys) "
        "and %.3f of the far pairs in %s routing",
        when, nwin, mass[0], pairs[0], routing_name(train));
    if (train != ROUTE_CAUSAL) printf(", %.3f and %.3f in causal routing", mass[1], pairs[1]);
    printf("\n");
    fflush(stdout);
    free(all);
}

void train_router_mass(Model* m, const RunConfig* rc, const TrainData* d, const char* out,
                       const char* conf_text, int resume, long stop_after) {
    const ModelConfig* c = &m->cfg;
    const FocusConfig* f = &rc->fc;
    const int T = rc->T, B = rc->B, K = f->K, L = c->L;
    if (m->tp || m->dp)
        fatal("retrofit: objective = mass runs in one process (no MPI ranks, no --tp)");
    if (T > c->maxT) fatal("retrofit: T = %d is longer than the model's context (%d)", T, c->maxT);
    if ((size_t)T + 1 >= d->ntrain)
        fatal("retrofit: the training data has %zu tokens, fewer than one window of T = %d",
              d->ntrain, T);
    char ckpt[4096], metrics_path[4096], dir[4096];
    path_join(ckpt, sizeof ckpt, out, "router.h5");
    path_join(metrics_path, sizeof metrics_path, out, "metrics.jsonl");
    path_join(dir, sizeof dir, out, "teacher");
    if (make_dirs(dir)) fatal("%s: cannot create: %s", dir, strerror(errno));
    m->fc = *f;
    m->fc.attn = ATTN_SOFT;
    int* slot = mallocCheck(sizeof(int) * L);
    int* layers = mallocCheck(sizeof(int) * L);
    int nl = 0;
    for (int l = 0; l < L; l++) slot[l] = model_layer_routed(m, l) ? (layers[nl] = l, nl++) : -1;
    if (!nl) fatal("retrofit: objective = mass: no layer is routed (dense_layers holds them all)");
    int* probe = mallocCheck(sizeof(int) * T);
    const int nq = mass_sample_rows(probe, T, f->w, f->sinks, rc->mass_every, 0);
    free(probe);
    if (!nq)
        fatal("retrofit: objective = mass: T = %d leaves no key beyond w = %d and %d sinks", T,
              f->w, f->sinks);
    Window w;
    /* mass_values = 2 and 3 store mass_keys keys of harm beside as many of gain */
    const int keys = rc->mass_values >= 2 ? 2 * rc->mass_keys : rc->mass_keys;
    window_alloc(&w, nl, layers, slot, T, c->C, nq, keys);
    if (rc->mass_selector[0]) { /* the teacher: the mass a block selector's blocks miss */
        BlockGateInfo bi;
        blockgate_load(rc->mass_selector, m, &bi, model_fingerprint(m));
        const int NH = model_heads(c), hs = model_head_size(c);
        if (f->w < bi.block - 1)
            fatal("retrofit: mass_selector %s: w = %d is narrower than its blocks of %d less one",
                  rc->mass_selector, f->w, bi.block);
        w.sel_blocks = rc->mass_blocks, w.sel_bs = bi.block;
        w.sel_hash = fnv1a(FNV1A_START, m->method.selector,
                           sizeof(real) * (size_t)L * NH * BLOCKGATE_WIDTH(hs));
        if (m->method.selector_blocks)
            w.sel_hash = fnv1a(w.sel_hash, m->method.selector_blocks, sizeof(int) * (size_t)L);
        printf(
            "teacher: the attention mass beyond the window that %s's %d key blocks of %d per "
            "query (its per-layer budgets) leave out\n",
            rc->mass_selector, rc->mass_blocks, bi.block);
    }
    w.values = rc->mass_values;
    if (w.values == 3)
        printf(
            "teacher: each missed key scored by the residual stream's error it closes "
            "(mass_values = 3: after the output projection%s; the keys that move it away kept "
            "as harm)\n",
            model_layer_spec(c, layers[0]).sandwich ? " and its norm" : "");
    else if (w.values)
        printf(
            "teacher: each missed key scored by the output it restores (mass_values = %d: its "
            "value against the direction the sparse output is off by%s)\n",
            w.values, w.values == 2 ? "; the keys that move it away kept as harm" : "");
    /* the windows' offsets: from the seed alone, so a resumed run collects the same ones;
     * rehearse's from a stream of their own (train's stay where they were without them) */
    const int mw = rc->mass_windows, nwin = mw + rc->rehearse_windows;
    if (rc->rehearse_windows && !d->old)
        fatal("retrofit: rehearse_windows = %d and no rehearse tokens", rc->rehearse_windows);
    uint64_t* offs = mallocCheck(sizeof(uint64_t) * nwin);
    Rng wr, wo;
    rng_seed(&wr, f->seed ^ 0x7eac4e5ull);
    rng_seed(&wo, f->seed ^ 0x01d7e4full);
    for (int k = 0; k < nwin; k++)
        offs[k] = k < mw ? rng_u64(&wr) % (uint64_t)(d->ntrain - (size_t)T)
                         : rng_u64(&wo) % (uint64_t)(d->nold - (size_t)T);
    const uint64_t fp = model_fingerprint(m);

    /* optimizer and state, as train_router's */
    const size_t nopt = model_router_trained(m, f->learn_gate);
    AdamW opt;
    adamw_init(&opt, nopt, rc->beta1, rc->beta2, rc->adam_eps, rc->weight_decay);
    RouterState st = {0, 0, 0, 0, 0, fp};
    Rng rng;
    rng_seed(&rng, f->seed ^ 0x3a55eedull);
    real* center = train_anchor_center(m, rc, nopt);
    if (resume && !access(ckpt, F_OK)) {
        router_load(ckpt, m, &opt, &st, fp);
        rng.state = st.rng_state;
        m->beta_updates = st.beta_updates;
        printf("resumed from %s at step %ld\n", ckpt, st.step);
    } else {
        remove(metrics_path);
        train_init_router(m, rc);
    }
    FILE* mf = fopen(metrics_path, "a");
    if (!mf) fatal("%s: cannot open: %s", metrics_path, strerror(errno));
    const double t_start = now_seconds();

    /* perplexity before (dense and hard top-k, causal routing) */
    char tk[32];
    focus_topk_str(f, tk);
    double ppl_dense = 0, ppl_hard0 = 0, kept0 = 0;
    const int evaluate = d->neval > 1;
    if (evaluate && !st.step) {
        PplResult dn = eval_mode(m, d->val, d->neval, T, ATTN_DENSE, f->topk, ROUTE_CAUSAL);
        PplResult h0 = eval_mode(m, d->val, d->neval, T, ATTN_HARD, f->topk, ROUTE_CAUSAL);
        ppl_dense = exp(dn.nll / dn.count), ppl_hard0 = exp(h0.nll / h0.count), kept0 = h0.kept;
        printf(
            "before training (causal routing, %zu tokens): dense %.3f | hard k=%s %.3f (%.3f of "
            "the pairs)\n",
            dn.count, ppl_dense, tk, ppl_hard0, kept0);
        fprintf(mf,
                "{\"type\": \"eval\", \"step\": 0, \"ppl_dense\": %.6f, \"ppl_hard\": %.6f, "
                "\"pairs_kept\": %.6f}\n",
                ppl_dense, ppl_hard0, kept0);
        fflush(mf);
    }

    collect(m, rc, d, out, &w, offs, fp);

    /* phase 2 */
    m->fc = *f;
    m->fc.attn = ATTN_SOFT;
    /* beta's score rows: 2048 a layer over the step's windows */
    const size_t every = (size_t)T * B > 2048 ? (size_t)T * B / 2048 : 1;
    const size_t nb = ((size_t)T + every - 1) / every;
    real* Sb = mallocCheck(sizeof(real) * (size_t)nl * B * nb * K);
    double* bb = mallocCheck(sizeof(double) * (K + 1) * 2);
    double* part = mallocCheck(sizeof(double) * 3 * nl); /* each layer's loss and kept shares */
    int* wins = mallocCheck(sizeof(int) * B);
    int* fds = mallocCheck(sizeof(int) * nwin);
    int* heads = mallocCheck(sizeof(int) * nwin);
    char path[4096];
    for (int k = 0; k < nwin; k++) {
        window_path(path, sizeof path, out, k, mw);
        heads[k] = window_check(path, &w, fp, offs[k], f);
        fds[k] = open(path, O_RDONLY | O_CLOEXEC);
        if (fds[k] < 0) fatal("%s: cannot open: %s", path, strerror(errno));
    }
    const int nthreads = omp_get_max_threads();
    Pass P = {m,
              &w,
              fds,
              heads,
              out,
              mw,
              part,
              {rc->mass_gate ? f->lambda : 0, f->bias, rc->mass_pairs, f->w, f->sinks},
              scratch_alloc(&w, K, f->dg, nthreads)};
    if (!st.step) report_kept(&P, nwin, "before training");
    long ckpt_step = resume ? st.step : -1;
    const double t_train = now_seconds();
    const long first_step = st.step;
    for (long step = st.step; step < rc->steps; step++) {
        const double t0 = now_seconds();
        const float lr = lr_schedule(step, rc->warmup, rc->steps, rc->lr, rc->min_lr_frac);
        model_zero_grad(m, GRAD_ROUTER);
        for (int b = 0; b < B; b++) wins[b] = (int)(rng_u64(&rng) % (uint64_t)nwin);
        mass_pass(&P, wins, B, f->routing, 1, Sb, every, nb);
        double loss = 0, kmass = 0, kpairs = 0;
        for (int s = 0; s < nl; s++) {
            loss += part[3 * s] / (B * nl);
            kmass += part[3 * s + 1] / (B * nl), kpairs += part[3 * s + 2] / (B * nl);
        }
        if (!isfinite(loss))
            fatal("retrofit: the loss became %g at step %ld; try a lower lr", loss, step + 1);
        /* beta: balanced on this step's scores (as model_update_beta), as an EMA */
        if (f->beta_balance) {
            const real mom = m->beta_updates ? f->beta_momentum : 0;
            for (int s = 0; s < nl; s++) {
                real* beta = m->beta + (size_t)layers[s] * K;
                double* bl = bb + K + 1;
                for (int k = 0; k < K; k++) bl[k] = beta[k];
                for (int it = 0; it < 8; it++) {
                    routing_shares(bb, Sb + (size_t)s * B * nb * K, 0, (size_t)B * nb, 1, K, f->tau,
                                   bl);
                    routing_beta_step(bl, bb, K);
                }
                for (int k = 0; k < K; k++) beta[k] = mom * beta[k] + (1 - mom) * (real)bl[k];
            }
            m->beta_updates++;
        }
        const double gnorm = model_router_grad_norm(m, nopt, 1);
        if (!isfinite(gnorm))
            fatal("retrofit: gradient norm is %g at step %ld; try a lower lr", gnorm, step + 1);
        model_router_adamw(m, &opt, lr, gnorm, rc->clip, 1);
        train_anchor_step(m, center, nopt, lr, rc->anchor);
        const double dt = now_seconds() - t0;
        st.step = step + 1;
        char eta[32];
        eta_text(
            eta, sizeof eta,
            (now_seconds() - t_train) / (double)(st.step - first_step) * (rc->steps - st.step));
        printf(
            "step %5ld/%d | mass %.4f | top-1 keeps %.3f of the far mass, %.3f of the far pairs | "
            "lr "
            "%.2e | %6.0f ms | |g| %.3f | ETA %s\n",
            st.step, rc->steps, loss, kmass, kpairs, (double)lr, dt * 1e3, gnorm, eta);
        fflush(stdout);
        fprintf(mf,
                "{\"type\": \"train\", \"step\": %ld, \"loss\": %.9g, \"mass_top1\": %.6f, "
                "\"pairs_top1\": %.6f, \"lr\": %.9g, \"ms\": %.1f, \"grad_norm\": %.6g}\n",
                st.step, loss, kmass, kpairs, (double)lr, dt * 1e3, gnorm);
        if (fflush(mf) || ferror(mf)) fatal("%s: write failed", metrics_path);
        const int last = st.step == rc->steps || st.step == stop_after;
        if (st.step % rc->ckpt_every == 0 || last) {
            model_router_adamw_sync(m, &opt);
            st.adam_t = opt.t;
            st.beta_updates = m->beta_updates;
            st.rng_state = rng.state;
            if (!router_state_finite(m, &opt))
                fatal(
                    "retrofit: the router holds NaN or inf after step %ld; the checkpoint of "
                    "step %ld is intact; try a lower lr",
                    st.step, ckpt_step);
            router_save(ckpt, m, &opt, &st, conf_text);
            ckpt_step = st.step;
        }
        if (st.step == stop_after) {
            printf("stopped after step %ld as asked; continue with: focus retrofit --resume %s\n",
                   st.step, out);
            break;
        }
    }
    if (st.step == rc->steps) report_kept(&P, nwin, "after training");
    for (int k = 0; k < nwin; k++) close(fds[k]);
    if (st.step == rc->steps && evaluate) {
        PplResult dn = eval_mode(m, d->val, d->neval, T, ATTN_DENSE, f->topk, ROUTE_CAUSAL);
        PplResult h1 = eval_mode(m, d->val, d->neval, T, ATTN_HARD, f->topk, ROUTE_CAUSAL);
        printf("\nperplexity on %zu validation tokens (causal routing, T=%d):\n", h1.count, T);
        if (ppl_hard0 > 0)
            printf("  before: dense %.3f | hard k=%s %.3f (%.3f of the pairs)\n", ppl_dense, tk,
                   ppl_hard0, kept0);
        printf("  after:  dense %.3f | hard k=%s %.3f (%.3f of the pairs)\n",
               exp(dn.nll / dn.count), tk, exp(h1.nll / h1.count), h1.kept);
        fprintf(mf,
                "{\"type\": \"eval\", \"step\": %ld, \"ppl_dense\": %.6f, \"ppl_hard\": %.6f, "
                "\"pairs_kept\": %.6f}\n",
                st.step, exp(dn.nll / dn.count), exp(h1.nll / h1.count), h1.kept);
    }
    if (st.step == rc->steps) {
        printf(
            "router training took %.1f s; run files in %s (router.h5, metrics.jsonl, "
            "config.conf, teacher/)\n",
            now_seconds() - t_start, out);
        const double data = (double)(d->ntrain + d->neval + d->nold) * sizeof(int);
        const WeightStore ws = m->wbf16 ? WEIGHTS_BF16_PROJ : WEIGHTS_FP32;
        const double plan = model_memory_plan_mass(c, f, T, nl, nq, keys, omp_get_max_threads(),
                                                   rc->mass_values, ws)
                                .total;
        /* the perplexities before and after run the head: their logits, a window at a time */
        const double logits =
            evaluate ? (double)model_memory_plan(c, f, 1, T, 0, 0, ws).logits : 0.0;
        printf(
            "memory: peak %.0f MiB above the program's own; the plan %.0f MiB (%.0f MiB of it "
            "the evaluation's logits) and the tokens %.0f MiB\n",
            peak_rss_growth_mib(), (plan + logits) / 1048576.0, logits / 1048576.0,
            data / 1048576.0);
    }
    fclose(mf);
    scratch_free(P.scratch, nthreads);
    free(fds), free(bb), free(Sb), free(part), free(wins), free(offs);
    window_free(&w);
    free(layers), free(slot);
    adamw_free(&opt);
    free(center);
}
