/* governor.c: the decode steps' thread count, chosen by measurement (see decode.h). */
#include <string.h>

#include <omp.h>

#include "decode.h"

/* the thread governor's step counts (see governor_update) */
enum { GOVERN_PERIOD = 128, GOVERN_PROBE = 6, GOVERN_MIN_GAP = 16 };

/* The thread governor. On a machine that is busy with other work, a thread of ours may wait
 * for a core at the end of any of the few hundred parallel regions of a token: two threads on a
 * loaded 2-core machine decoded at half the speed of one (docs/RESULTS.md). So each step's
 * thread count is chosen by measurement among max, max / 2, ..., 1: the count in use keeps a
 * moving average of its step times (about the last 8 steps, stalls included) and its fastest
 * step. Fewer threads are tried (for PROBE steps, the first not counted: threads waking up) only
 * while the count in use stalls, its average 1.3 times its fastest step; more threads are tried
 * every PERIOD steps, or sooner when the count in use has become 1.3 times slower than the last
 * measure of another; the faster is kept. On an idle machine nothing is probed: the steps run
 * on every thread (the first version tried each count at the start, a tenth of a 64-token
 * run on one thread). */
static int candidate(const Governor* g, int i) { /* i-th count: max >> i, the last one 1 */
    const int v = g->max >> i;
    return v < 1 ? 1 : v;
}

static int candidates(const Governor* g) {
    int n = 1;
    while (candidate(g, n) != candidate(g, n - 1)) n++;
    return n;
}

void governor_init(Governor* g) {
    memset(g, 0, sizeof(*g));
    g->max = omp_get_max_threads();
    g->on = g->max > 1;
    g->probe = GOVERN_PROBE; /* measure the full count first */
}

static void note_fastest(Governor* g, int i, double dt) {
    if (!(g->fastest[i] > 0) || dt < g->fastest[i]) g->fastest[i] = dt;
}

void governor_update(Governor* g, double dt) {
    const int i = g->cur, n = candidates(g);
    g->seen[i]++;
    if (n < 2) return;
    if (g->probe > 0) { /* measuring count i */
        if (g->probe < GOVERN_PROBE) g->sum += dt, note_fastest(g, i, dt);
        if (--g->probe) return;
        g->time[i] = g->sum / (GOVERN_PROBE - 1);
        g->known |= 1u << i;
        if (!((g->known >> g->best) & 1) || g->time[i] < g->time[g->best]) g->best = i;
        g->cur = g->best;
        g->since = 0;
        return;
    }
    note_fastest(g, i, dt);
    g->time[i] += (dt - g->time[i]) / 8;
    g->since++;
    /* the count in use stalls: its threads wait for cores (fewer threads may then be faster) */
    const int stalled = g->since >= GOVERN_MIN_GAP && g->time[i] > 1.3 * g->fastest[i];
    /* the next count to try: one never measured, else the next after the one in use; fewer
     * threads only while stalling */
    int next = -1, slower = 0, allowed = 0;
    for (int k = 0; k < n; k++) {
        if (k == g->best || (k > g->best && !stalled)) continue;
        allowed++;
        if (!((g->known >> k) & 1)) {
            next = k;
            break;
        }
        if (g->time[g->best] > 1.3 * g->time[k]) slower = 1;
    }
    if (next < 0) {
        if (!allowed) return;
        if (g->since < GOVERN_PERIOD && !(slower && g->since >= GOVERN_MIN_GAP)) return;
        do {
            g->next = (g->next + 1) % n;
        } while (g->next == g->best || (g->next > g->best && !stalled));
        next = g->next;
    }
    g->cur = next;
    g->probe = GOVERN_PROBE;
    g->sum = 0;
}

int governor_threads(const Governor* g) { return candidate(g, g->cur); }
