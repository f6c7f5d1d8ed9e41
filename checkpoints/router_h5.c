/* router_h5.c: HDF5 router checkpoints (see router_h5.h). */
#define _GNU_SOURCE
#include "router_h5.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "h5file.h"

/* 1: the first; 2: adds config_checksum, the FNV-1a hash of the stored configuration text,
 * which the state checksum covers too (an edited setting is refused). Both are read. */
#define FORMAT_VERSION 2

static uint64_t text_checksum(const char* text) { return fnv1a(FNV1A_START, text, strlen(text)); }

/* The index of the first value of p[0..n) that is NaN or infinite, or n. */
static size_t first_nonfinite(const float* p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(p[i])) return i;
    return n;
}

int router_state_finite(const Model* m, const AdamW* opt) {
    size_t nb = (size_t)m->cfg.L * m->fc.K;
    return first_nonfinite(m->router_mem, m->num_router) == m->num_router &&
           first_nonfinite(m->beta, nb) == nb &&
           (!opt || (first_nonfinite(opt->m, opt->n) == opt->n &&
                     first_nonfinite(opt->v, opt->n) == opt->n));
}

/* with_wq = 0: the file holds no W_q (a router without one, loaded into a run with one) */
static uint64_t state_checksum(const Model* m, int with_wq, const float* mom_m, const float* mom_v,
                               size_t nmom, uint64_t config_sum) {
    uint64_t h = 0xcbf29ce484222325ull;
    if (config_sum) h = fnv1a(h, &config_sum, sizeof config_sum);
    const size_t* s = m->router_sizes;
    const size_t head = s[ROUTER_WG] + s[ROUTER_CENT], wq = with_wq ? s[ROUTER_WQ] : 0;
    h = fnv1a(h, m->router_mem, sizeof(real) * head); /* W_g, C */
    if (wq) h = fnv1a(h, m->router.wq, sizeof(real) * wq);
    h = fnv1a(h, m->router.gate, sizeof(real) * s[ROUTER_GATE]);
    h = fnv1a(h, m->beta, sizeof(real) * (size_t)m->cfg.L * m->fc.K);
    if (mom_m) h = fnv1a(h, mom_m, sizeof(float) * nmom);
    if (mom_v) h = fnv1a(h, mom_v, sizeof(float) * nmom);
    return h;
}

/* The training state's attributes on /, in the order they are written: three signed counters
 * (RouterState's step, adam_t, beta_updates), then unsigned 64-bit values. */
#define NUM_STATE_ATTRS 7
static const char* const state_attrs[NUM_STATE_ATTRS] = {
    "step", "adam_t", "beta_updates", "data_pos", "rng_state", "base_fingerprint", "checksum"};
static hid_t state_attr_type(int i) { return i < 3 ? H5T_NATIVE_INT64 : H5T_NATIVE_UINT64; }

void router_save(const char* path, const Model* m, const AdamW* opt, const RouterState* st,
                 const char* config_text) {
    if (!router_state_finite(m, opt))
        fatal("%s: the router or its optimizer state holds NaN or inf; not written", path);
    char tmp[4200];
    hid_t f = h5_create(path, tmp, sizeof tmp);
    const ModelConfig* c = &m->cfg;
    const FocusConfig* fc = &m->fc;
    hid_t g = H5Gcreate2(f, "router", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    hsize_t d3[3] = {(hsize_t)c->L, (hsize_t)c->C, (hsize_t)fc->dg};
    h5_write_ds(g, "wg", H5T_NATIVE_FLOAT, m->router.wg, 3, d3, tmp);
    hsize_t dc[3] = {(hsize_t)c->L, (hsize_t)fc->K, (hsize_t)fc->dg};
    h5_write_ds(g, "cent", H5T_NATIVE_FLOAT, m->router.cent, 3, dc, tmp);
    if (m->router.wq) h5_write_ds(g, "wq", H5T_NATIVE_FLOAT, m->router.wq, 3, d3, tmp);
    hsize_t dg2[2] = {(hsize_t)c->L, 2};
    h5_write_ds(g, "gate", H5T_NATIVE_FLOAT, m->router.gate, 2, dg2, tmp);
    hsize_t db[2] = {(hsize_t)c->L, (hsize_t)fc->K};
    h5_write_ds(g, "beta", H5T_NATIVE_FLOAT, m->beta, 2, db, tmp);
    H5Gclose(g);
    if (opt) {
        hid_t o = H5Gcreate2(f, "optim", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        hsize_t dn[1] = {(hsize_t)opt->n};
        h5_write_ds(o, "m", H5T_NATIVE_FLOAT, opt->m, 1, dn, tmp);
        h5_write_ds(o, "v", H5T_NATIVE_FLOAT, opt->v, 1, dn, tmp);
        H5Gclose(o);
    }
    const char* text = config_text ? config_text : "";
    hsize_t dt[1] = {(hsize_t)strlen(text) + 1};
    h5_write_ds(f, "config", H5T_NATIVE_UCHAR, text, 1, dt, tmp);
    int64_t version = FORMAT_VERSION;
    h5_write_attr(f, "format_version", H5T_NATIVE_INT64, &version, tmp);
    uint64_t v[NUM_STATE_ATTRS] = {(uint64_t)st->step,
                                   (uint64_t)st->adam_t,
                                   (uint64_t)st->beta_updates,
                                   st->data_pos,
                                   st->rng_state,
                                   st->fingerprint,
                                   state_checksum(m, 1, opt ? opt->m : NULL, opt ? opt->v : NULL,
                                                  opt ? opt->n : 0, text_checksum(text))};
    uint64_t config_sum = text_checksum(text);
    h5_write_attr(f, "config_checksum", H5T_NATIVE_UINT64, &config_sum, tmp);
    for (int i = 0; i < NUM_STATE_ATTRS; i++)
        h5_write_attr(f, state_attrs[i], state_attr_type(i), &v[i], tmp);
    int64_t sinks = fc->sinks;
    h5_write_attr(f, "sinks", H5T_NATIVE_INT64, &sinks, tmp);
    h5_commit(f, tmp, path);
}

static char* read_config_text(hid_t f, const char* path);

void router_load(const char* path, Model* m, AdamW* opt, RouterState* st, uint64_t fingerprint) {
    hid_t f = h5_open(path, "router checkpoint", FORMAT_VERSION);
    RouterState local;
    if (!st) st = &local;
    uint64_t v[NUM_STATE_ATTRS];
    for (int i = 0; i < NUM_STATE_ATTRS; i++)
        h5_read_attr(f, state_attrs[i], state_attr_type(i), &v[i], path);
    st->step = (long)v[0], st->adam_t = (long)v[1], st->beta_updates = (long)v[2];
    st->data_pos = v[3], st->rng_state = v[4], st->fingerprint = v[5];
    const uint64_t csum = v[6];
    /* routers written before sinks existed have none (the paper's behaviour) */
    int64_t sinks = 0;
    if (H5Aexists(f, "sinks") > 0) h5_read_attr(f, "sinks", H5T_NATIVE_INT64, &sinks, path);
    if (sinks != m->fc.sinks)
        fatal("%s: this router was trained with sinks = %lld, the run asks for sinks = %d", path,
              (long long)sinks, m->fc.sinks);
    if (st->fingerprint != fingerprint)
        fatal(
            "%s: this router was trained on a different base model (fingerprint %016llx, the "
            "loaded model is %016llx); "
            "load it onto the model it was trained with",
            path, (unsigned long long)st->fingerprint, (unsigned long long)fingerprint);
    const ModelConfig* c = &m->cfg;
    const FocusConfig* fc = &m->fc;
    hsize_t d3[3] = {(hsize_t)c->L, (hsize_t)c->C, (hsize_t)fc->dg};
    hsize_t dc[3] = {(hsize_t)c->L, (hsize_t)fc->K, (hsize_t)fc->dg};
    hsize_t dg2[2] = {(hsize_t)c->L, 2};
    hsize_t db[2] = {(hsize_t)c->L, (hsize_t)fc->K};
    h5_read_ds(f, "router/wg", H5T_NATIVE_FLOAT, m->router.wg, 3, d3, path);
    h5_read_ds(f, "router/cent", H5T_NATIVE_FLOAT, m->router.cent, 3, dc, path);
    /* a router without W_q can start a run with one (init_router) */
    const int with_wq = m->router.wq && H5Lexists(f, "router/wq", H5P_DEFAULT) > 0;
    if (with_wq) h5_read_ds(f, "router/wq", H5T_NATIVE_FLOAT, m->router.wq, 3, d3, path);
    if (m->router.wq && !with_wq && opt)
        fatal("%s: this router has no query projection (qproj = 0); the run has qproj = 1", path);
    h5_read_ds(f, "router/gate", H5T_NATIVE_FLOAT, m->router.gate, 2, dg2, path);
    h5_read_ds(f, "router/beta", H5T_NATIVE_FLOAT, m->beta, 2, db, path);
    m->beta_updates = st->beta_updates;
    float *mm = NULL, *vv = NULL;
    size_t nmom = 0;
    htri_t has_optim = H5Lexists(f, "optim", H5P_DEFAULT);
    if (has_optim > 0) {
        hid_t ds = H5Dopen2(f, "optim/m", H5P_DEFAULT);
        if (ds < 0) fatal("%s: dataset 'optim/m' is missing; corrupt checkpoint", path);
        hid_t sp = H5Dget_space(ds);
        hsize_t n = 0;
        if (H5Sget_simple_extent_ndims(sp) != 1)
            fatal("%s: dataset 'optim/m' is not 1-D; corrupt checkpoint", path);
        H5Sget_simple_extent_dims(sp, &n, NULL);
        H5Sclose(sp);
        H5Dclose(ds);
        if (n > m->num_router)
            fatal("%s: optimizer state of %llu values for a router of %zu", path,
                  (unsigned long long)n, m->num_router);
        nmom = (size_t)n;
        mm = mallocCheck(sizeof(float) * (nmom + 1));
        vv = mallocCheck(sizeof(float) * (nmom + 1));
        fatal_defer(free, mm);
        fatal_defer(free, vv);
        h5_read_ds(f, "optim/m", H5T_NATIVE_FLOAT, mm, 1, &n, path);
        h5_read_ds(f, "optim/v", H5T_NATIVE_FLOAT, vv, 1, &n, path);
    }
    uint64_t config_sum = 0; /* format 1 files have none */
    if (H5Aexists(f, "config_checksum") > 0) {
        h5_read_attr(f, "config_checksum", H5T_NATIVE_UINT64, &config_sum, path);
        free(read_config_text(f, path)); /* the text must match it */
    }
    if (state_checksum(m, with_wq, mm, vv, nmom, config_sum) != csum)
        fatal("%s: checksum mismatch; the checkpoint is corrupt", path);
    /* the queries start where the keys are, as model_init_router starts them */
    if (m->router.wq && !with_wq)
        memcpy(m->router.wq, m->router.wg, sizeof(real) * m->router_sizes[ROUTER_WQ]);
    size_t nb = (size_t)c->L * fc->K;
    if (first_nonfinite(m->router_mem, m->num_router) < m->num_router ||
        first_nonfinite(m->beta, nb) < nb || (mm && first_nonfinite(mm, nmom) < nmom) ||
        (vv && first_nonfinite(vv, nmom) < nmom))
        fatal("%s: the checkpoint holds NaN or inf values; it cannot be used", path);
    if (opt) {
        if (!mm) fatal("%s: the checkpoint has no optimizer state to resume from", path);
        if (opt->n != nmom)
            fatal("%s: optimizer state has %zu values, this run optimises %zu", path, nmom, opt->n);
        memcpy(opt->m, mm, sizeof(float) * nmom);
        memcpy(opt->v, vv, sizeof(float) * nmom);
        opt->t = st->adam_t;
    }
    if (mm) fatal_release(vv), fatal_release(mm);
    h5_close(f);
}

/* The stored configuration text of the open file f (malloc'd), checked against its checksum
 * where the file has one (format 2). */
static char* read_config_text(hid_t f, const char* path) {
    hid_t ds = H5Dopen2(f, "config", H5P_DEFAULT);
    if (ds < 0) fatal("%s: dataset 'config' is missing; corrupt checkpoint", path);
    hid_t sp = H5Dget_space(ds);
    hsize_t n = 0;
    if (H5Sget_simple_extent_ndims(sp) != 1 || H5Sget_simple_extent_dims(sp, &n, NULL) < 0 ||
        n > (64u << 20))
        fatal("%s: dataset 'config' is malformed; corrupt checkpoint", path);
    char* s = mallocCheck((size_t)n + 1);
    fatal_defer(free, s);
    if (H5Dread(ds, H5T_NATIVE_UCHAR, H5S_ALL, H5S_ALL, H5P_DEFAULT, s) < 0)
        fatal("%s: reading the configuration failed; corrupt checkpoint", path);
    s[n] = 0;
    H5Sclose(sp);
    H5Dclose(ds);
    if (H5Aexists(f, "config_checksum") > 0) {
        uint64_t want;
        h5_read_attr(f, "config_checksum", H5T_NATIVE_UINT64, &want, path);
        if (text_checksum(s) != want)
            fatal("%s: the stored configuration does not match its checksum; corrupt or edited",
                  path);
    }
    fatal_forget(s);
    return s;
}

char* router_read_config(const char* path) {
    hid_t f = h5_open(path, "router checkpoint", FORMAT_VERSION);
    char* s = read_config_text(f, path);
    h5_close(f);
    return s;
}
