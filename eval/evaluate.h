/* evaluate.h: what the commands measure on a model: strided perplexity, the share of causal
 * pairs hard top-k keeps, and statistics of the groups. */
#ifndef FOCUS_EVALUATE_H
#define FOCUS_EVALUATE_H

#include "../model/model.h"

typedef struct {
    double nll;   /* summed negative log-likelihood */
    size_t count; /* scored tokens */
    double seconds;
    double kept; /* hard attention: fraction of causal pairs kept, averaged over windows */
} PplResult;

/* Strided perplexity of m (its current attention and routing settings) on ids; windows start
 * with the model's BOS where its tokenizer adds one (m->bos, in place of the first token). */
PplResult eval_perplexity(Model* m, const int* ids, size_t n, int ctx, int stride, int quiet);
/* With llama: scored as llama.cpp's llama-perplexity does (ids then start with the BOS; whole
 * windows of ctx, stride = ctx, each scoring the predictions of its positions ctx/2 .. ctx - 2). */
PplResult eval_perplexity_llama(Model* m, const int* ids, size_t n, int ctx, int stride, int llama,
                                int quiet);
/* The same in a given mode, windows of T; the model's settings are restored afterwards. */
PplResult eval_mode(Model* m, const int* ids, size_t n, int T, AttnMode attn, int topk, Routing r);
/* Scoring continuations, as lm-evaluation-harness's loglikelihood requests: nc token sequences
 * seqs[c] of n[c] tokens run as one batch (padded to the longest); ll[c] receives the summed
 * log-probability of tokens first[c] .. n[c] - 1 given what precedes them, greedy[c] whether
 * each of them is the model's most likely next token (so greedy decoding would produce them). A
 * model whose tokenizer adds a BOS (m->bos) reads each sequence after it. On the CPU (the logits
 * are read on the host). */
void eval_continuations(Model* m, int* const* seqs, const size_t* n, const size_t* first, int nc,
                        double* ll, int* greedy);
/* Fraction of causal pairs the hard top-k mask keeps in the last forward pass, all layers. */
double hard_pairs_kept(const Model* m);
/* Average over layers of the largest group's share of tokens, from the last forward pass. */
double focus_largest_share(const Model* m);
/* Mean gate value sigmoid(lambda (G_i . G_j - b)) over 256 random distant pairs per layer. */
double focus_gate_far_mean(const Model* m, Rng* rng);

#endif
