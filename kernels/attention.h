/* attention.h: causal multi-head attention with grouped-query heads and the Focus gate.
 *
 * qkv is (B, T, (NH + 2*NKV) * hs): per row the NH query heads, then NKV key heads, then NKV
 * value heads; query head h reads key/value head h / (NH / NKV). out is (B, T, NH*hs) and lse
 * (B, NH, T) holds each row's log-sum-exp, from which the backward pass recomputes the
 * probabilities: no T x T buffer outlives a call (METHOD.md section 6).
 *
 * The gate (METHOD.md sections 3 and 5) touches only distant pairs, i - j > w, whose key is not
 * one of the first `sinks` positions (METHOD.md section 9):
 *   soft: s_ij += log sigmoid(lambda * (G_i . G_j - b))
 *   hard: the pair is dropped unless the top-k group masks of i and j intersect.
 * This is the reference implementation (masked dense attention in row blocks of BLAS
 * products); the sparse executor that skips dropped pairs is a separate kernel.
 * Tested by tests/test_gradcheck.c and tests/test_equivalence.c. */
#ifndef FOCUS_ATTENTION_H
#define FOCUS_ATTENTION_H

#include "common.h"

typedef enum { GATE_NONE = 0, GATE_SOFT = 1, GATE_HARD = 2 } GateMode;

typedef struct {
    GateMode mode;
    int K;                /* number of groups */
    int w;                /* local window: pairs with i - j <= w are never gated */
    const real* G;        /* (B, T, K) soft group distributions, for GATE_SOFT */
    const uint32_t* mask; /* (B, T) bitmask of each token's top-k groups, for GATE_HARD */
    real lambda, bias;    /* gate sharpness and offset */
    int sinks;            /* keys j < sinks are never gated (attention sinks, kept like local) */
} AttnGate;

void attention_forward(real* out, real* lse, const real* qkv, const AttnGate* gate, int B, int T,
                       int NH, int NKV, int hs);

/* Accumulates dqkv (B,T,QKV); for a soft gate also dG (B,T,K) and, unless dgate is NULL,
 * dgate[0] += dL/dlambda, dgate[1] += dL/db. out and lse are the forward pass's. */
void attention_backward(real* dqkv, real* dG, real* dgate, const real* dout, const real* qkv,
                        const real* out, const real* lse, const AttnGate* gate, int B, int T,
                        int NH, int NKV, int hs);

/* The dense attention mass each query puts on distant keys (i - j > w, j >= sinks), by the keys'
 * groups and summed over heads: mass (B, T, K) = sum_h sum_j P^h_ij G_j, with P recomputed from
 * the dense forward pass's lse. The target of the `attn` training objective (METHOD.md section 9):
 * where a token's attention beyond its window actually goes. */
void attention_group_mass(real* mass, const real* qkv, const real* lse, const real* G, int K, int w,
                          int sinks, int B, int T, int NH, int NKV, int hs);

#endif
