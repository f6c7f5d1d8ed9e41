/* sample.c: the next token from a model's logits (see sample.h). */
#include "sample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

Sampling sampling_defaults(void) {
    return (Sampling){.temperature = 1, .top_p = 1, .repeat_penalty = 1, .repeat_last_n = 64};
}

typedef struct {
    double p;
    int id;
} Cand;

static int by_p_desc(const void* a, const void* b) {
    const double x = ((const Cand*)a)->p, y = ((const Cand*)b)->p;
    return x < y ? 1 : x > y ? -1 : ((const Cand*)a)->id - ((const Cand*)b)->id;
}

/* The logits a request's bias and penalties make (a copy), or NULL when it has none. */
static real* adjusted(const real* logits, int V, const Sampling* s, const int* recent, int nrecent,
                      const int* text, int ntext) {
    const int rep = s->repeat_penalty != 1 && s->repeat_last_n != 0 && nrecent > 0;
    const int pen = (s->frequency_penalty != 0 || s->presence_penalty != 0) && ntext > 0;
    if (!s->nbias && !rep && !pen) return NULL;
    real* w = mallocCheck(sizeof(real) * (size_t)V);
    memcpy(w, logits, sizeof(real) * (size_t)V);
    for (int i = 0; i < s->nbias; i++) w[s->bias[i].id] += s->bias[i].bias;
    if (rep || pen) {
        int* count = callocCheck((size_t)V, sizeof(int));
        if (rep) { /* once per distinct token among the last repeat_last_n */
            const int from =
                s->repeat_last_n < 0 || s->repeat_last_n > nrecent ? 0 : nrecent - s->repeat_last_n;
            for (int i = from; i < nrecent; i++) {
                const int t = recent[i];
                if (count[t]++) continue;
                w[t] =
                    w[t] > 0 ? (real)(w[t] / s->repeat_penalty) : (real)(w[t] * s->repeat_penalty);
            }
            for (int i = from; i < nrecent; i++) count[recent[i]] = 0;
        }
        if (pen) {
            for (int i = 0; i < ntext; i++) count[text[i]]++;
            for (int i = 0; i < ntext; i++) {
                const int t = text[i];
                if (!count[t]) continue; /* done */
                w[t] -= (real)(count[t] * s->frequency_penalty + s->presence_penalty);
                count[t] = 0;
            }
        }
        free(count);
    }
    return w;
}

int sample_token(const real* logits, int V, const Sampling* s, const int* recent, int nrecent,
                 const int* text, int ntext, Rng* rng) {
    real* w = adjusted(logits, V, s, recent, nrecent, text, ntext);
    const real* lg = w ? w : logits;
    int best = 0;
    for (int v = 1; v < V; v++) best = lg[v] > lg[best] ? v : best;
    if (s->temperature <= 0) {
        free(w);
        return best;
    }
    /* the candidates within exp(-30) of the most likely: the rest carries no practical mass */
    Cand* c = mallocCheck(sizeof(Cand) * (size_t)V);
    int n = 0;
    double sum = 0;
    for (int v = 0; v < V; v++) {
        const double z = (lg[v] - lg[best]) / s->temperature;
        if (z < -30) continue;
        c[n].p = exp(z), c[n].id = v;
        sum += c[n++].p;
    }
    free(w);
    const int k = s->top_k > 0 && s->top_k < n ? s->top_k : n;
    if (k < n || s->top_p < 1) { /* most likely first */
        qsort(c, (size_t)n, sizeof(Cand), by_p_desc);
        if (k < n) {
            n = k, sum = 0;
            for (int j = 0; j < n; j++) sum += c[j].p;
        }
    }
    if (s->top_p < 1) { /* the nucleus: until top_p of the mass */
        double mass = 0;
        int m = 0;
        while (m < n && mass < s->top_p * sum) mass += c[m++].p;
        n = m, sum = mass;
    }
    if (s->min_p > 0) { /* p >= min_p x p(most likely), whose p here is exp(0) = 1 */
        int m = 0;
        sum = 0;
        for (int j = 0; j < n; j++)
            if (c[j].p >= s->min_p) c[m++] = c[j], sum += c[j].p;
        n = m;
    }
    const double r = rng_uniform(rng) * sum;
    double acc = 0;
    int choice = c[n - 1].id;
    for (int j = 0; j < n; j++) {
        acc += c[j].p;
        if (r < acc) {
            choice = c[j].id;
            break;
        }
    }
    free(c);
    return choice;
}

static double log_sum_exp(const real* logits, int V, double* mx) {
    double m = logits[0], sum = 0;
    for (int v = 1; v < V; v++) m = logits[v] > m ? logits[v] : m;
    for (int v = 0; v < V; v++) sum += exp(logits[v] - m);
    *mx = m;
    return log(sum);
}

double token_logprobs(const real* logits, int V, int id, int n, int* ids, float* lps) {
    double mx;
    const double lse = log_sum_exp(logits, V, &mx); /* once for the token and its alternatives */
    /* insertion into a list of n kept sorted: n is small (at most 20) */
    int have = 0;
    for (int v = 0; v < V && n > 0; v++) {
        if (have == n && logits[v] <= logits[ids[n - 1]]) continue;
        int at = have < n ? have++ : n - 1;
        while (at > 0 && logits[ids[at - 1]] < logits[v]) ids[at] = ids[at - 1], at--;
        ids[at] = v;
    }
    for (int i = 0; i < have; i++) lps[i] = (float)(logits[ids[i]] - mx - lse);
    return logits[id] - mx - lse;
}
