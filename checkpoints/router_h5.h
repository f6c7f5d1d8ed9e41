/* router_h5.h: router checkpoints in HDF5 (RUN_DIR/router.h5).
 *
 * Layout:
 *   /router/wg    (L, C, dg) float32      /router/beta  (L, K) float32
 *   /router/cent  (L, K, dg) float32      /optim/m, /optim/v  (n) float32 AdamW moments
 *   /router/gate  (L, 2) float32 lambda, b
 *   /router/wq    (L, C, dg) float32 the queries' projection, only with qproj = 1
 *   /config       uint8 text of the resolved run configuration (INI)
 *   attributes on /: format_version, step, adam_t, beta_updates, data_pos, rng_state,
 *   base_fingerprint (of the backbone it was trained on), checksum (FNV-1a of all tensors),
 *   sinks (attention sinks it was trained with; absent in older files: 0).
 * Written to a temporary file, fsynced and renamed. Loading checks shapes, the checksum and the
 * base model's fingerprint, and rejects anything else with a one-line error.
 * Tested by tests/test_retrofit.c. */
#ifndef FOCUS_ROUTER_H5_H
#define FOCUS_ROUTER_H5_H

#include "../model/model.h"
#include "../kernels/adamw.h"

typedef struct {
    long step; /* optimizer steps completed */
    long adam_t;
    long beta_updates;
    uint64_t data_pos; /* next training token offset */
    uint64_t rng_state;
    uint64_t fingerprint; /* base model */
} RouterState;

/* opt may be NULL (no moments saved). config_text may be NULL. */
void router_save(const char* path, const Model* m, const AdamW* opt, const RouterState* st,
                 const char* config_text);
/* Load the router (and, if opt is non-NULL, its moments) onto m. fingerprint is the loaded base
 * model's; a mismatch is refused, and so is m->fc.sinks other than the stored one. st may be
 * NULL. */
void router_load(const char* path, Model* m, AdamW* opt, RouterState* st, uint64_t fingerprint);
/* 1 when the router, beta and (if opt) the moments hold only finite values. router_save refuses
 * to write anything else, and router_load to read it. */
int router_state_finite(const Model* m, const AdamW* opt);
/* The stored configuration text (malloc'd), checked against its checksum. */
char* router_read_config(const char* path);

#endif
