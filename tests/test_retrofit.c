#define _GNU_SOURCE
/* test_retrofit.c: router-only training, through the library (no data files needed).
 * - On a frozen random LLaMA whose data has long-range structure (a token predicts the token
 *   that followed it last time, far back), AdamW on W_g and C lowers the training loss.
 * - The backbone is byte-identical afterwards; only router parameters moved.
 * - A router checkpoint saved to HDF5 loads back bit-exactly; loading onto another base model,
 *   a truncated file, or a file with a flipped byte is refused (checked in a child process,
 *   since refusals exit). */
#include <math.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../checkpoints/load.h"
#include "../checkpoints/router_h5.h"
#include "../kernels/adamw.h"
#include "testutil.h"

enum { B = 4, T = 96 };

/* Exit status of fn(arg) run in a child process, with its stderr discarded. */
static int child_status(void (*fn)(const char*), const char* arg) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        freopen("/dev/null", "w", stderr);
        fn(arg);
        _exit(0);
    }
    int st;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static Model* g_model;
static void load_into_global(const char* path) {
    router_load(path, g_model, NULL, NULL, model_fingerprint(g_model));
}
static void load_wrong_base(const char* path) { router_load(path, g_model, NULL, NULL, 12345); }
static void save_global(const void* path) {
    RouterState st = {1, 1, 1, 0, 0, 0};
    router_save(path, g_model, NULL, &st, "");
}
static void read_config(const void* path) { free(router_read_config(path)); }

int main(void) {
    ModelConfig cfg;
    FocusConfig fc;
    model_config_preset("tiny-llama", &cfg);
    cfg.maxT = T;
    focus_config_default(&fc);
    fc.K = 4, fc.dg = 8, fc.w = 8, fc.routing = ROUTE_SINKHORN;
    Model m;
    model_build(&m, &cfg, &fc);
    model_init_backbone(&m, 9);
    for (size_t i = 0; i < m.num_params; i++)
        if (m.params_mem[i] != 1) m.params_mem[i] *= 8;
    g_model = &m;
    /* Synthetic text: random tokens with repeats of earlier spans beyond the window. */
    Rng rng;
    rng_seed(&rng, 77);
    int inp[B * T], tgt[B * T];
    int seq[T + 1];
    for (int b = 0; b < B; b++) {
        for (int t = 0; t <= T; t++)
            seq[t] = t < 30 || rng_uniform(&rng) < 0.3 ? (int)(rng_u64(&rng) % cfg.V) : seq[t - 30];
        for (int t = 0; t < T; t++) inp[b * T + t] = seq[t], tgt[b * T + t] = seq[t + 1];
    }
    real* backbone = mallocCheck(sizeof(real) * m.num_params);
    memcpy(backbone, m.params_mem, sizeof(real) * m.num_params);
    AdamW opt;
    size_t nopt = model_router_trained(&m, 0);
    adamw_init(&opt, nopt, 0.9f, 0.95f, 1e-8f, 0);
    double first = 0, last = 0;
    for (int step = 0; step < 40; step++) {
        model_forward(&m, inp, tgt, B, T, 1);
        model_update_beta(&m);
        if (step == 0) first = m.mean_loss;
        last = m.mean_loss;
        model_zero_grad(&m, GRAD_ROUTER);
        model_backward(&m, GRAD_ROUTER);
        clip_grad_norm(m.rgrads_mem, nopt, 1.0);
        adamw_step(&opt, m.router_mem, m.rgrads_mem, 0.02f);
    }
    printf("  router-only training, 40 steps: loss %.4f -> %.4f\n", first, last);
    CHECK(last < first - 0.01, "router-only training must lower the loss (%g -> %g)", first, last);
    CHECK(!memcmp(backbone, m.params_mem, sizeof(real) * m.num_params), "backbone weights changed");

    /* save, perturb, load: bit-exact */
    RouterState st = {40, opt.t, m.beta_updates, 1234, 99, model_fingerprint(&m)};
    router_save(tu_path("test_router.h5"), &m, &opt, &st, "[focus]\nK = 4\n");
    real* saved = mallocCheck(sizeof(real) * m.num_router);
    memcpy(saved, m.router_mem, sizeof(real) * m.num_router);
    real beta0 = m.beta[0];
    for (size_t i = 0; i < m.num_router; i++) m.router_mem[i] = 0;
    m.beta[0] = 42;
    AdamW opt2;
    adamw_init(&opt2, nopt, 0.9f, 0.95f, 1e-8f, 0);
    RouterState st2;
    router_load(tu_path("test_router.h5"), &m, &opt2, &st2, model_fingerprint(&m));
    CHECK(!memcmp(saved, m.router_mem, sizeof(real) * m.num_router) && m.beta[0] == beta0,
          "router not restored exactly");
    CHECK(!memcmp(opt.m, opt2.m, sizeof(float) * nopt) &&
              !memcmp(opt.v, opt2.v, sizeof(float) * nopt) && opt2.t == opt.t,
          "optimizer moments not restored exactly");
    CHECK(st2.step == 40 && st2.data_pos == 1234 && st2.rng_state == 99, "state not restored");

    /* refusals */
    CHECK(child_status(load_wrong_base, tu_path("test_router.h5")) == 1,
          "a router for another base model must be refused");
    FILE* fp = fopen(tu_path("test_router.h5"), "rb");
    fseek(fp, 0, SEEK_END);
    long size = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    char* bytes = mallocCheck((size_t)size);
    CHECK(fread(bytes, 1, (size_t)size, fp) == (size_t)size, "read back");
    fclose(fp);
    int refused = 0, cases = 0;
    for (long cut = 0; cut < size; cut += size / 12 + 1) {
        fp = fopen(tu_path("bad_router.h5"), "wb");
        fwrite(bytes, 1, (size_t)cut, fp);
        fclose(fp);
        refused += child_status(load_into_global, tu_path("bad_router.h5")) == 1;
        cases++;
    }
    printf("  truncated router.h5: %d of %d lengths refused\n", refused, cases);
    CHECK(refused == cases, "every truncated router.h5 must be refused");
    /* flip a byte inside the stored W_g values: found by the checksum */
    float probe = (float)saved[0];
    char* hit = memmem(bytes, (size_t)size, &probe, sizeof probe);
    CHECK(hit != NULL, "W_g data not found in the file");
    if (hit) {
        hit[1] ^= 0x40;
        fp = fopen(tu_path("bad_router.h5"), "wb");
        fwrite(bytes, 1, (size_t)size, fp);
        fclose(fp);
        CHECK(child_status(load_into_global, tu_path("bad_router.h5")) == 1,
              "a corrupted W_g value must be refused");
    }
    /* an edited setting in the stored configuration: refused by its checksum */
    memcpy(m.router_mem, saved, sizeof(real) * m.num_router);
    router_save(tu_path("test_router.h5"), &m, &opt, &st, "[focus]\nK = 4\nw = 8\n");
    fp = fopen(tu_path("test_router.h5"), "rb");
    CHECK(fread(bytes, 1, (size_t)size, fp) > 0, "read back");
    long size2 = ftell(fp);
    fclose(fp);
    char* w = memmem(bytes, (size_t)size2, "w = 8", 5);
    CHECK(w != NULL, "stored configuration not found in the file");
    char msg[4096];
    if (w) {
        w[4] = '0';
        fp = fopen(tu_path("bad_router.h5"), "wb");
        fwrite(bytes, 1, (size_t)size2, fp);
        fclose(fp);
        CHECK(tu_fails_with(read_config, tu_path("bad_router.h5"), "checksum", msg, sizeof msg),
              "an edited stored setting must be refused: %s", msg);
        CHECK(child_status(load_into_global, tu_path("bad_router.h5")) == 1,
              "an edited stored setting must be refused by router_load");
    }
    /* NaN in the router: never written, the file in place stays as it was */
    m.router_mem[3] = NAN;
    CHECK(tu_fails_with(save_global, tu_path("test_router.h5"), "NaN or inf", msg, sizeof msg),
          "a router holding NaN must not be written: %s", msg);
    CHECK(child_status(load_into_global, tu_path("test_router.h5")) == 0,
          "the checkpoint before the NaN must still load");
    free(bytes);
    free(saved);
    free(backbone);
    adamw_free(&opt);
    adamw_free(&opt2);
    model_free(&m);
    return tu_finish("test_retrofit");
}
