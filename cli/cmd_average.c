/* cmd_average.c: `focus average`, the mean of routers retrofitted from the same starting router
 * (weight averaging, the "model soup" of Wortsman et al. 2022). A brief retrofit moves the
 * router a little toward the new text and a little in directions the windows and the order of
 * its steps happen to pick; that second part differs from seed to seed, and averaging the runs'
 * routers cancels much of it while keeping the first (docs/RESULTS.md, domain adaptation
 * against the spread of its runs). Every value the router holds is averaged: W_g, C, W_q, the
 * gate and beta, the causal bias (each run's beta balances its own router; their mean is what
 * was measured). Routers from different starts share no coordinates (their groups may be
 * permuted), so they are refused, as are routers of another shape, base model or sinks. The
 * output has no optimizer moments, like `focus export`: it evaluates and serves, and no run
 * resumes from it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../checkpoints/blockgate_h5.h"
#include "../checkpoints/router_h5.h"
#include "../train/runconfig.h"
#include "cli.h"
#include "commands.h"

static const char average_usage[] =
    "usage: focus average --model M --out ROUTER.h5 A.h5 B.h5 [C.h5 ...]\n"
    "The mean of routers retrofitted from the same init_router (runs of one recipe with other\n"
    "seeds, for example): W_g, C, W_q, the gate and the causal bias beta are averaged. The\n"
    "output evaluates and serves like each input (--router), on the same base model; no run\n"
    "resumes from it (it has no optimizer moments).\n";

/* The settings of router file path that must agree for an average to mean anything; its stored
 * text into *keep unless keep is NULL (malloc'd). */
static RunConfig router_settings(const char* path, char** keep) {
    if (blockgate_file(path))
        fatal("average: %s is a block selector (focus fit-blocks), not a router; average routers",
              path);
    char* text = router_read_config(path);
    RunConfig rc;
    runconfig_default(&rc);
    runconfig_load_text(&rc, text, path);
    if (keep)
        *keep = text;
    else
        free(text);
    return rc;
}

int cmd_average(int argc, char** argv) {
    const char *model = NULL, *out = NULL;
    CliList in = {0};
    if (cli_parse("average", argc, argv, 1, average_usage, "--model:s --out:s :*", &model, &out,
                  &in))
        return 0;
    if (!model || !out || in.n < 2)
        fatal("average: needs --model, --out and at least two routers (%d given)", in.n);
    char* conf = NULL; /* the first router's settings, which the average keeps */
    const RunConfig first = router_settings(in.v[0], &conf);
    if (!first.init_router[0])
        fatal(
            "average: %s was trained from its seed's initialisation (no init_router); only "
            "routers retrofitted from the same init_router share coordinates to average",
            in.v[0]);
    for (int i = 1; i < in.n; i++) {
        const RunConfig rc = router_settings(in.v[i], NULL);
        if (strcmp(rc.init_router, first.init_router))
            fatal(
                "average: %s started from init_router = '%s', %s from '%s'; only routers "
                "retrofitted from the same one can be averaged",
                in.v[i], rc.init_router, in.v[0], first.init_router);
        if (rc.fc.K != first.fc.K || rc.fc.dg != first.fc.dg || rc.fc.qproj != first.fc.qproj)
            fatal("average: %s has K = %d, dg = %d, qproj = %d and %s K = %d, dg = %d, qproj = %d",
                  in.v[i], rc.fc.K, rc.fc.dg, rc.fc.qproj, in.v[0], first.fc.K, first.fc.dg,
                  first.fc.qproj);
    }
    Model m;
    ModelInfo info;
    CliList sets = {0};
    cli_open_model(
        &m, &info,
        &(ModelRequest){.model = model, .router = in.v[0], .routing = "causal", .sets = &sets});
    const uint64_t fp = model_fingerprint(&m);
    const size_t n = m.num_router, nb = (size_t)m.cfg.L * m.fc.K;
    double* sum = callocCheck(n + nb, sizeof(double)); /* the router's values, then beta */
    RouterState st, first_st;
    for (int i = 0; i < in.n; i++) {
        router_load(in.v[i], &m, NULL, &st, fp); /* the fingerprint, sinks and shapes checked */
        if (i == 0) first_st = st;
        for (size_t j = 0; j < n; j++) sum[j] += m.router_mem[j];
        for (size_t j = 0; j < nb; j++) sum[n + j] += m.beta[j];
    }
    for (size_t j = 0; j < n; j++) m.router_mem[j] = (real)(sum[j] / in.n);
    for (size_t j = 0; j < nb; j++) m.beta[j] = (real)(sum[n + j] / in.n);
    free(sum);
    /* the first router's settings, headed by what the file is */
    size_t len = strlen(conf) + 64;
    for (int i = 0; i < in.n; i++) len += strlen(in.v[i]) + 2;
    char* text = mallocCheck(len);
    int at = snprintf(text, len, "# focus average: the mean of %d routers:", in.n);
    for (int i = 0; i < in.n; i++) at += snprintf(text + at, len - at, " %s", in.v[i]);
    snprintf(text + at, len - at, "\n%s", conf);
    router_save(out, &m, NULL, &first_st, text);
    printf("wrote %s: the mean of %d routers retrofitted from %s, on %s\n", out, in.n,
           first.init_router, info.name);
    free(text), free(conf), free(in.v);
    model_free(&m);
    return 0;
}
