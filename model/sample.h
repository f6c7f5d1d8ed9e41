/* sample.h: the next token from a model's logits, as a server's clients ask for it: a bias per
 * token, the repetition penalties (llama.cpp's repeat penalty, OpenAI's frequency and presence
 * penalties), then greedy or a draw from the tempered distribution cut by top-k, top-p and
 * min-p; and the log-probabilities clients ask to see. */
#ifndef FOCUS_MODEL_SAMPLE_H
#define FOCUS_MODEL_SAMPLE_H

#include "../kernels/common.h"

typedef struct {
    int id;
    float bias;
} LogitBias;

typedef struct {
    double temperature;    /* <= 0: the most likely token (after bias and penalties) */
    double top_p;          /* the smallest set of most likely tokens holding this mass (1: all) */
    int top_k;             /* the k most likely tokens only (0: all) */
    double min_p;          /* tokens below min_p x p(most likely) dropped (0: none) */
    double repeat_penalty; /* the logits of the last repeat_last_n tokens (prompt and text):
                            * positive ones divided by it, negative ones multiplied (1: off) */
    int repeat_last_n;
    double frequency_penalty; /* minus count x this, count: the token's uses in the text so far */
    double presence_penalty;  /* minus this once a token is in the text so far */
    const LogitBias* bias;    /* added to the logits first (-100: never, +100: always) */
    int nbias;
} Sampling;

/* temperature 1, everything else off */
Sampling sampling_defaults(void);

/* The next token: recent holds the last tokens of the context (prompt and text, nrecent of
 * them, for the repeat penalty), text the tokens generated so far (ntext, for the frequency and
 * presence penalties). With nothing but temperature and top_p set, the draw of decode_sample. */
int sample_token(const real* logits, int V, const Sampling* s, const int* recent, int nrecent,
                 const int* text, int ntext, Rng* rng);

/* log softmax(logits)[id], returned, and the n most likely tokens (ids and log-probabilities,
 * most likely first; ties by id) of the model's own distribution: temperature 1, no bias or
 * penalty. */
double token_logprobs(const real* logits, int V, int id, int n, int* ids, float* lps);

#endif
