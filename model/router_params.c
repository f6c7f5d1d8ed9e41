/* router_params.c: the router's parameters (W_g, C, W_q, the gate's lambda and b) and its state:
 * allocation for a FocusConfig, initialisation from a seed, and the causal routing bias beta,
 * fitted on the host from the router scores whatever the device (METHOD.md section 4). */
#include <math.h>
#include <string.h>

#include "backend.h"
#include "model.h"

/* (Re)allocate the router buffers for m->fc and initialise them from its seed. */
void model_alloc_router(Model* m) {
    const ModelConfig* cfg = &m->cfg;
    const FocusConfig* fc = &m->fc;
    free(m->router_mem);
    free(m->rgrads_mem);
    free(m->beta);
    m->router_sizes[ROUTER_WG] = (size_t)cfg->L * cfg->C * fc->dg;
    m->router_sizes[ROUTER_CENT] = (size_t)cfg->L * fc->K * fc->dg;
    m->router_sizes[ROUTER_WQ] = fc->qproj ? (size_t)cfg->L * cfg->C * fc->dg : 0;
    m->router_sizes[ROUTER_GATE] = (size_t)cfg->L * 2;
    m->num_router = model_sum_sizes(m->router_sizes, NUM_ROUTER_TENSORS);
    m->router_mem = callocCheck(m->num_router, sizeof(real));
    model_carve((real**)&m->router, m->router_mem, m->router_sizes, NUM_ROUTER_TENSORS);
    m->rgrads_mem = callocCheck(m->num_router, sizeof(real));
    model_carve((real**)&m->rgrads, m->rgrads_mem, m->router_sizes, NUM_ROUTER_TENSORS);
    m->beta = callocCheck((size_t)cfg->L * fc->K, sizeof(real));
    /* activations depend on K and dg: reallocate them on the next forward */
    free(m->acts_mem);
    m->acts_mem = NULL;
    model_init_router(m, fc->seed);
}

void model_set_router_config(Model* m, const FocusConfig* fc) {
    config_validate(&m->cfg, fc);
    m->fc = *fc;
    model_alloc_router(m);
}

size_t model_router_trained(const Model* m, int learn_gate) {
    return m->router_sizes[ROUTER_WG] + m->router_sizes[ROUTER_CENT] + m->router_sizes[ROUTER_WQ] +
           (learn_gate ? m->router_sizes[ROUTER_GATE] : 0);
}

void model_init_router(Model* m, uint64_t seed) {
    const ModelConfig* c = &m->cfg;
    const FocusConfig* f = &m->fc;
    Rng rng;
    rng_seed(&rng, seed);
    for (size_t i = 0; i < m->router_sizes[ROUTER_WG]; i++)
        m->router.wg[i] = (real)(rng_normal(&rng) / sqrt((double)c->C));
    for (size_t i = 0; i < m->router_sizes[ROUTER_CENT]; i++)
        m->router.cent[i] = (real)(rng_normal(&rng) / sqrt((double)f->dg));
    /* the queries start where the keys are: the router begins as the symmetric one */
    if (m->router.wq) memcpy(m->router.wq, m->router.wg, sizeof(real) * m->router_sizes[ROUTER_WQ]);
    for (int l = 0; l < c->L; l++) {
        m->router.gate[2 * l] = f->lambda;
        m->router.gate[2 * l + 1] = f->bias;
    }
    memset(m->beta, 0, sizeof(real) * c->L * f->K);
    m->beta_updates = 0;
}

/* The causal routing bias that balances the groups on this batch, every layer's (targets, L x K):
 * eight steps of the fixed point beta_k -= log(K share_k), the shares those of softmax(S / tau +
 * beta) over (a subsample of at most about 2048 of) the batch's rows. With data-parallel ranks
 * (m->dp) the batch is the union of theirs: the shares' sums are added up across the ranks at
 * every step, so every rank finds the beta one process would on the whole batch. */
static void balanced_beta(Model* m, real* targets) {
    const FocusConfig* f = &m->fc;
    const int L = m->cfg.L, K = f->K, ranks = m->dp ? m->dp->size : 1;
    const size_t BT = (size_t)m->B * m->T, all = BT * ranks;
    /* the global subsample: rows with a global index divisible by step */
    const size_t step = all > 2048 ? all / 2048 : 1;
    const size_t first = (step - ((size_t)(m->dp ? m->dp->rank : 0) * BT) % step) % step;
    double* b = mallocCheck(sizeof(double) * (size_t)L * K);
    double* col = mallocCheck(sizeof(double) * (size_t)L * (K + 1)); /* sums, then the count */
    for (int i = 0; i < L * K; i++) b[i] = m->beta[i];
    for (int it = 0; it < 8; it++) {
#pragma omp parallel for schedule(static)
        for (int l = 0; l < L; l++)
            routing_shares(col + (size_t)l * (K + 1), m->acts.rS + (size_t)l * BT * K, first, BT,
                           step, K, f->tau, b + (size_t)l * K);
        if (ranks > 1) comm_allreduce_sum(m->dp, col, (size_t)L * (K + 1), COMM_F64);
        for (int l = 0; l < L; l++)
            routing_beta_step(b + (size_t)l * K, col + (size_t)l * (K + 1), K);
    }
    for (int i = 0; i < L * K; i++) targets[i] = (real)b[i];
    free(b);
    free(col);
}

void model_update_beta(Model* m) {
    const FocusConfig* f = &m->fc;
    const int L = m->cfg.L, K = f->K, ranks = m->dp ? m->dp->size : 1;
    if (f->beta_balance) {
        /* from the score rows of every layer (a keep = 1 forward pass with the router on) */
        if (!m->keep || !m->acts.rS) return;
        m->backend->pull(m, PULL_SCORES);
        /* at most about 2048 rows a layer, the layers in parallel: on the GPU this host work
         * runs every step (4096 rows on one thread halved the training throughput) */
        real* target = mallocCheck(sizeof(real) * (size_t)L * K);
        balanced_beta(m, target);
        real mom = m->beta_updates ? f->beta_momentum : 0;
        for (int i = 0; i < L * K; i++) m->beta[i] = mom * m->beta[i] + (1 - mom) * target[i];
        free(target);
        m->beta_updates++;
        m->backend->push_router(m);
        return;
    }
    if (f->attn == ATTN_DENSE || f->routing == ROUTE_CAUSAL || !m->acts.colofs) return;
    /* Average of the batch's offsets (over every rank's rows); the first update takes it as is. */
    m->backend->pull(m, PULL_OFFSETS);
    double* sum = callocCheck((size_t)L * K, sizeof(double));
    for (int l = 0; l < L; l++)
        for (int k = 0; k < K; k++)
            for (int b = 0; b < m->B; b++)
                sum[l * K + k] += m->acts.colofs[((size_t)l * m->B + b) * K + k];
    if (ranks > 1) comm_allreduce_sum(m->dp, sum, (size_t)L * K, COMM_F64);
    real mom = m->beta_updates ? f->beta_momentum : 0;
    for (int i = 0; i < L * K; i++)
        m->beta[i] = mom * m->beta[i] + (1 - mom) * (real)(sum[i] / ((double)m->B * ranks));
    free(sum);
    m->beta_updates++;
    m->backend->push_router(m);
}
