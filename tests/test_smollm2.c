/* test_smollm2.c: the real model. SmolLM2-135M's first logits on the first 16 tokens of
 * "Alice's Adventures in Wonderland" agree with an independent NumPy forward pass over the
 * same GGUF (tests/fixtures/smollm2_first_logits.txt, scripts/reference/ppl_ref.py).
 * Skips (77) when the model has not been fetched (scripts/fetch_model.sh). */
#include <math.h>
#include <string.h>

#include "../io/io.h"
#include "../checkpoints/load.h"
#include "../data/text.h"
#include "testutil.h"

int main(void) {
    const char* gguf = tu_smollm2();
    if (!gguf) {
        printf("test_smollm2: skipped (run scripts/fetch_model.sh)\n");
        return 77;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/fixtures/smollm2_first_logits.txt", FOCUS_SOURCE_DIR);
    size_t len;
    char* text = read_file(path, &len);
    char* p = strchr(text, '\n') + 1;
    enum { T = 16, NV = 8 };
    int tok[T];
    for (int i = 0; i < T; i++) tok[i] = (int)strtol(p, &p, 10);
    float want[T][NV];
    for (int t = 0; t < T; t++)
        for (int v = 0; v < NV; v++) want[t][v] = strtof(p, &p);
    FocusConfig fc;
    focus_config_default(&fc);
    fc.attn = ATTN_DENSE;
    Model m;
    ModelInfo info;
    model_load(&m, gguf, &fc, &info);
    CHECK(m.cfg.L == 30 && m.cfg.C == 576 && m.cfg.NH == 9 && m.cfg.NKV == 3 && m.cfg.F == 1536 &&
              m.cfg.V == 49152,
          "SmolLM2 hyperparameters L=%d C=%d NH=%d NKV=%d F=%d V=%d", m.cfg.L, m.cfg.C, m.cfg.NH,
          m.cfg.NKV, m.cfg.F, m.cfg.V);
    CHECK(m.cfg.tied && fabsf(m.cfg.rope_theta - 100000) < 1, "tied %d theta %g", m.cfg.tied,
          (double)m.cfg.rope_theta);
    model_forward(&m, tok, NULL, 1, T, 0);
    double worst = 0;
    for (int t = 0; t < T; t++)
        for (int v = 0; v < NV; v++)
            worst = fmax(worst, fabs(model_logits(&m)[(size_t)t * m.cfg.V + v] - want[t][v]));
    printf("  SmolLM2 first logits vs NumPy reference: max |difference| %.2e\n", worst);
    CHECK(worst < 2e-3, "logits differ from the reference by %g", worst);
    model_free(&m);
    free(text);
    return tu_finish("test_smollm2");
}
