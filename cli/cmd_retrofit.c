/* cmd_retrofit.c: `focus retrofit`, the project's main job: train only the router of a frozen
 * base model on the user's text, evaluate dense / soft / hard perplexity, checkpoint to HDF5.
 * This file resolves the run (settings, base model, tokenizer, data); loop.c trains. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <omp.h>

#include "../checkpoints/load.h"
#include "../checkpoints/router_h5.h"
#include "../data/tokenizer.h"
#include "../io/io.h"
#include "../kernels/comm.h"
#include "cli.h"
#include "commands.h"
#include "../train/loop.h"

static const char retrofit_usage[] =
    "usage: focus retrofit --config FILE [--set key=value]... --out RUN_DIR [--stop-after N]\n"
    "                      [--device cpu|cuda]\n"
    "       focus retrofit --resume RUN_DIR [--stop-after N] [--device cpu|cuda]\n"
    "       mpirun -np N focus retrofit ... [--tp T]\n"
    "MPI ranks: groups of T consecutive ranks each hold one copy of the model cut into T\n"
    "tensor-parallel slices (T divides the heads and F; default 1), and the N / T groups are\n"
    "data-parallel replicas (B a multiple of N / T).\n"
    "Trains only the Focus router of a frozen base model. Writes RUN_DIR/router.h5 (checkpoint),\n"
    "RUN_DIR/metrics.jsonl and RUN_DIR/config.conf; prints perplexity before and after.\n"
    "--stop-after N stops after step N (the schedule still spans all steps); --resume continues.\n"
    "Settings: see configs/*.conf; any of them can be overridden with --set.\n"
    "--device cuda trains on the GPU (a scratch base is pretrained on the CPU first); a run\n"
    "can be resumed on either device.\n";

static void release_comm(void* c) { comm_free(c); }

/* A run stored before these keys existed had no sinks and the lm objective. */
static void legacy_defaults(RunConfig* rc) {
    rc->fc.sinks = 0;
    rc->fc.beta_balance = 0;
    rc->fc.beta_momentum = 0.99f;
}

/* The run's config.conf must say what its checkpoint was trained with: an edited file would
 * stay behind disagreeing with the run. Fatal naming the first key that differs. */
static void check_config_file(const RunConfig* sealed, const char* conf, const char* ckpt) {
    RunConfig disk;
    runconfig_default(&disk);
    legacy_defaults(&disk);
    runconfig_load(&disk, conf);
    char *a = runconfig_text(sealed), *b = runconfig_text(&disk);
    fatal_defer(free, a);
    fatal_defer(free, b);
    char *la = a, *lb = b;
    while (*la && *lb) {
        char *ea = strchr(la, '\n'), *eb = strchr(lb, '\n');
        size_t na = ea ? (size_t)(ea - la) : strlen(la), nb = eb ? (size_t)(eb - lb) : strlen(lb);
        if (na != nb || memcmp(la, lb, na)) {
            char line_a[320], line_b[320], key[64] = "?", va[256] = "", vb[256] = "";
            snprintf(line_a, sizeof line_a, "%.*s", (int)na, la);
            snprintf(line_b, sizeof line_b, "%.*s", (int)nb, lb);
            sscanf(line_a, "%63s = %255[^\n]", key, va);
            sscanf(line_b, "%*s = %255[^\n]", vb);
            fatal(
                "%s: %s = %s, but the run was trained with %s = %s (%s); put it back (or "
                "delete the file: it is restored from the checkpoint)",
                conf, key, vb[0] ? vb : "(empty)", key, va[0] ? va : "(empty)", ckpt);
        }
        la += na + (ea != NULL);
        lb += nb + (eb != NULL);
    }
    fatal_release(b);
    fatal_release(a);
}

int cmd_retrofit(int argc, char** argv) {
    /* started by mpirun: data-parallel ranks; rank 0 alone prints (the others' output is
     * dropped, their errors are not) */
    Comm* world = comm_world(&argc, &argv);
    fatal_defer(release_comm, world); /* held until exit, also on the way out of an error */
    if (world->rank && !freopen("/dev/null", "w", stdout))
        fatal("retrofit: rank %d: cannot silence its output", world->rank);
    const char *cfg_path = NULL, *out = NULL, *resume = NULL;
    CliList sets = {0};
    int stop_after = 0, on_gpu = 0, tp = 1;
    if (cli_parse("retrofit", argc, argv, 1, retrofit_usage,
                  "--config:s --out:s --resume:s --stop-after:i[1,2147483647] --device:d "
                  "--tp:i[1,4096] --set:*",
                  &cfg_path, &out, &resume, &stop_after, &on_gpu, &tp, &sets))
        return 0;
    if (world->size % tp)
        fatal("retrofit: %d MPI ranks are not a multiple of --tp %d", world->size, tp);
    /* ranks r with the same r / tp hold the slices of one model; those with the same r % tp
     * hold the same slice of the data-parallel replicas */
    Comm* tpc = comm_split(world, world->rank / tp, world->rank % tp);
    Comm* dpc = comm_split(world, world->rank % tp, world->rank / tp);
    fatal_defer(release_comm, tpc);
    fatal_defer(release_comm, dpc);
    const char* device = on_gpu ? "cuda" : "cpu";
    if (!resume && (!cfg_path || !out))
        fatal("retrofit: needs --config and --out (or --resume RUN_DIR)");
    if (resume && (cfg_path || out))
        fatal(
            "retrofit: --resume %s continues that run in its folder with its own settings; "
            "%s does not go with it (change a setting with --set key=value)",
            resume, cfg_path ? "--config" : "--out");
    if (resume) {
        out = resume;
        char files[256];
        const char* kind = run_folder_kind(out, files, sizeof files);
        if (!kind) fatal("retrofit: %s holds no run to resume (no config.conf, no router.h5)", out);
        if (strcmp(kind, "retrofit"))
            fatal(
                "retrofit: %s holds a %s run (%s), not a retrofit run; --resume continues "
                "only focus retrofit runs",
                out, kind, files);
    }
    char ckpt[4096];
    path_join(ckpt, sizeof ckpt, out, "router.h5");

    RunConfig rc;
    runconfig_default(&rc);
    char conf[4096];
    path_join(conf, sizeof conf, out, "config.conf");
    if (resume && access(ckpt, F_OK) && !access(conf, R_OK)) {
        /* stopped before its first checkpoint: the settings it was started with */
        runconfig_load(&rc, conf);
    } else if (resume) {
        char* text = router_read_config(ckpt);
        legacy_defaults(&rc);
        runconfig_load_text(&rc, text, ckpt);
        free(text);
        if (!access(conf, F_OK)) check_config_file(&rc, conf, ckpt);
    } else {
        runconfig_load(&rc, cfg_path);
    }
    for (int i = 0; i < sets.n; i++) runconfig_set(&rc, sets.v[i]);
    free(sets.v);
    Model m;
    TrainData d = {.rank = world->rank, .tp = tp > 1 ? tpc : NULL};
    char* conf_text = run_prepare(&rc, "retrofit", out, resume != NULL, &m, &d);
    train_router(&m, &rc, &d, out, conf_text, resume != NULL, stop_after, device, dpc);
    free(conf_text);
    free(d.train_mem);
    free(d.val_mem);
    free(d.old);
    model_free(&m);
    fatal_release(dpc);
    fatal_release(tpc);
    fatal_release(world);
    return 0;
}
