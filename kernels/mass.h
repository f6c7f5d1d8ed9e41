/* mass.h: the `mass` objective of router training (docs/OBJECTIVE.md): the router's groups should
 * hold the frozen model's own dense attention mass beyond the window.
 *
 * Two halves. The teacher (mass_teacher) runs once per sequence and layer on the dense forward
 * pass's queries, keys and log-sum-exps and keeps, for a sample of query rows, the far mass
 *   M_i = 1/NH sum_h sum_{j far} P^h_ij            far: sinks <= j < i - w
 * (the dense attention of the layer's heads, averaged: the groups are shared by every head of the
 * layer) and its m largest entries p_ij (key j, mass). The objective (mass_loss) then scores a
 * routing G (T, K) against it with the soft gate of METHOD.md section 3, g_ij =
 * sigmoid(lambda (G_i . G_j - b)):
 *   kept_i = sum_{stored j} p_ij g_ij / M_i          the share of the far mass the gate keeps
 *   cost_i = 1/R sum_{u} g_iu                      the share of far pairs it keeps (R random)
 *   loss   = sum_i M_i (log(cost_i + eps) - log(kept_i + eps)) / sum_i M_i      eps = 0.01
 * Entries stored negative (the harm of mass_values = 2) add, per query, harm_i / (kept_i + eps):
 * harm_i = sum_{stored j, p_ij < 0} -p_ij g_ij / M_i, -log(kept_i - harm_i) to first order in
 * the harm, so that a query stays out of a group whose keys move its output away.
 * the log of the far mass kept per far pair kept (its lift over random groups, which keep as
 * much mass as pairs), weighted by how much of the query's attention is far. Its gradient
 * reaches both the query's and each key's groups.
 * Tested by tests/test_mass.c (teacher against a direct computation, gradients by finite
 * differences in the double build). */
#ifndef FOCUS_MASS_H
#define FOCUS_MASS_H

#include "common.h"

/* The query rows a teacher keeps, nq of them, each with m entries. */
typedef struct {
    int nq, m;
    int* rows;  /* (nq) query positions */
    float* far; /* (nq) M_i: the query's far mass, heads averaged */
    int* idx;   /* (nq, m) key positions, -1 where the row has fewer far keys */
    float* p;   /* (nq, m) their mass, heads averaged, largest first */
} MassRows;

/* The query rows of a T-token sequence that the teacher samples: of the whole tiles of 64 rows
 * whose rows all have far keys (beyond w + sinks), one in `every` (at least one), from a phase
 * chosen by seed. How many depends on T, w, sinks and every, not on the seed. Writes at most T
 * rows to rows, returns their number. */
int mass_sample_rows(int* rows, int T, int w, int sinks, int every, uint64_t seed);

/* The key blocks a block selector chooses for the rows of a teacher (what the centroids beside
 * the blocks need not hold): sel (nq, NKV, nbmax) ascending-free block indices, nsel (nq, NKV)
 * their counts, blocks of bs keys. */
typedef struct {
    int* sel;
    int* nsel;
    int nbmax, bs;
} MassBlocks;

/* The blocks the learned selector (gate: the layer's NH x BLOCKGATE_WIDTH(hs) weights) keeps for
 * each row of t and key/value head, nblocks of them beyond the band [i - w, i] and the sinks, as
 * attention_blocks_forward chooses them (kernels/sparse.h), into b (b->bs set; nbmax >= T / bs +
 * 1). */
void mass_choose_blocks(MassBlocks* b, const MassRows* t, const real* qkv, const real* gate,
                        int nblocks, int T, int NH, int NKV, int hs, int w, int sinks);

/* The teacher of one sequence: for the rows of t (t->rows, t->nq set, ascending), far, idx and p
 * from qkv (T, (NH + 2 NKV) hs) after RoPE and lse (NH, T), the dense forward pass's. With b
 * (else NULL), a head's mass on the keys of the blocks b chose for its key/value head is left
 * out: the teacher of the centroids beside a block selector (the mass the blocks miss).
 *
 * values = 1 scores a missed key by the output it restores instead of its mass alone (the
 * `mass_values` setting, docs/OBJECTIVE.md). For head h of query i, the kept keys (sinks, window,
 * chosen blocks) give the output o_S, the missed ones o_M; u = o_M - o_S is the direction the
 * sparse output is off by (the dense output is o_S + Z_M u, Z_M the missed mass). Then
 *   c^h_ij = P^h_ij (v_j - o_S) . u / (|u| rho)
 *   rho^2  = sum_{j missed} P^h_ij |v_j - o_S|^2 / Z_M
 * the key's mass times how far its value moves the output towards the dense one, in units of the
 * missed values' spread. Summed over j it is Z_M |u| / rho <= Z_M (a head whose missed values
 * cancel out needs nothing kept); each |c| <= P |v_j - o_S| / rho. The heads' mean is clipped at
 * 0 (a key that moves the output away is not one to keep) and stands for p_ij; M_i is its sum.
 * values = 2 stores the harm as well: the first m / 2 entries hold the largest positive scores,
 * the last m - m / 2 the most negative ones, stored negative (mass_loss counts them as harm).
 * values = 3: the residual stream's error in place of the heads' (MassStream below; stream set). */
typedef struct MassStream MassStream;
void mass_teacher(MassRows* t, const real* qkv, const real* lse, int T, int NH, int NKV, int hs,
                  int w, int sinks, const MassBlocks* b, int values, const MassStream* stream);

/* values = 3 scores a missed key by how far it moves the residual stream towards the dense
 * one: after the layer's output projection W_o (Cm x NH hs, row-major: z = W_o o) and, where the
 * model norms the attention's contribution (Gemma 3's post-attention norm: y = x + norm_w (.) z /
 * rms(z)), that norm; the score of the heads' output (values 1, 2) is blind to both. Per query i,
 * with o_S^h the kept keys' output of head h, Z_S^h their mass, o_D^h the dense output:
 *   e     = N(W_o o_D) - N(W_o o_S)        the stream's error (N the norm, or nothing)
 *   u^h   = (W_o^T J^T e)^h                e pulled back to head h (J: N's Jacobian at W_o o_S)
 *   c_ij  = Zbar_M sum_h P^h_ij (v_j - o_S^h) . u^h / (Z_S^h |e|^2)
 * the share of the stream's error that adding key j closes to first order (adding every missed
 * key closes about 1 / Z_S of it), in units of the query's missed mass Zbar_M (the heads' mean),
 * so that queries weigh in the loss as with the mass. Clipped at 0, the harm stored as with
 * values = 2. Each head's queries and keys are multiplied twice (the directions need every
 * head's o_S first). */
struct MassStream {
    const real* wo;   /* (Cm, NH hs) */
    const real* norm; /* (Cm) the norm's weight; NULL: the contribution is added unnormed */
    int Cm;
    real eps;
};

/* The gate and the pairs' sample of the objective: lambda, b (METHOD.md section 3; lambda = 0:
 * the affinity G_i . G_j itself, top-1 routing's soft twin), nrand
 * random far keys per query (0: no pairs term), w and sinks (what is far). */
typedef struct {
    real lambda, b;
    int nrand, w, sinks;
} MassGate;

/* What a routing keeps: shares of the far mass (of sum_i M_i) by the soft gate and by top-1
 * groups (argmax G_i == argmax G_j), and of the far pairs (on the random sample). */
typedef struct {
    double mass_gate, mass_top1, pairs_gate, pairs_top1;
} MassKept;

/* The objective of one sequence's routing against t (see the file header): the queries' groups
 * Gq (T, K) against the keys' groups Gk (T, K) (the same array for a router without a query
 * projection), scaled by `scale`; dGq, dGk (T, K) += scale * dloss / dGq, dGk unless dGq is NULL
 * (they may be the same array when Gq and Gk are); kept (unless NULL) what it keeps (top-1: the
 * query's most likely group is the key's). Returns the loss (before scaling). */
double mass_loss(real* dGq, real* dGk, const real* Gq, const real* Gk, int K, const MassRows* t,
                 const MassGate* mg, real scale, MassKept* kept);

#endif
