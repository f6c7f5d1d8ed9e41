/* test_tp.c: tensor parallelism (model_shard, the partial sums of model_cpu.c) against the whole
 * model, on however many processes ran it (ctest runs it alone and under mpirun with 2 and 4
 * ranks). Every rank builds the same whole model and computes the reference itself; then the
 * ranks split into tensor-parallel groups (tp = 2, and tp = 4 with four ranks), each rank keeps
 * its slice, and the logits, the loss, the router's gradients (W_g, C, and the gate's lambda and b,
 * whose gradient is summed over the slices' heads), the attn objective's loss and gradients and
 * the KL loss must equal the whole model's to round-off: both families, grouped-query attention
 * split, one shared copy and one copy per query head, the soft gate and hard top-k, Sinkhorn and
 * causal routing; and a slice loaded from a GGUF file (model_load_slice) is the one model_shard
 * cuts, with the whole model's fingerprint; a bf16-stored slice matches the whole model's store.
 * Alone, it checks the layouts and the refusals, and the bf16 store (model_store_bf16) against
 * weights rounded by hand. Rank 0 reports. */
#include <math.h>
#include <string.h>

#include "../checkpoints/load.h"
#include "../model/model.h"
#include "testutil.h"

typedef struct {
    const char* name;
    Arch arch;
    int NH, NKV;
} Shape;

static ModelConfig shape_config(const Shape* s) {
    ModelConfig c;
    model_config_preset(s->arch == ARCH_GPT2 ? "tiny-gpt2" : "tiny-llama", &c);
    c.NH = s->NH, c.NKV = s->NKV, c.C = 8 * s->NH, c.F = 96;
    if (s->arch == ARCH_LLAMA) c.qkv_bias = 1; /* Qwen2's biases: sliced with the heads */
    return c;
}

static void build(Model* m, const ModelConfig* c, AttnMode attn, Routing routing) {
    FocusConfig f;
    focus_config_default(&f);
    f.K = 4, f.dg = 4, f.w = 3, f.iters = 8, f.routing = routing, f.learn_gate = 1;
    f.lambda = 4, f.bias = 0.4f, f.sinks = 1, f.attn = attn, f.topk = 2;
    model_build(m, c, &f);
    model_init_backbone(m, 11);
    Rng rng;
    rng_seed(&rng, 5);
    real* biases[4] = {m->params.qkvb, m->params.attprojb, m->params.fcb, m->params.fcprojb};
    const size_t n[4] = {m->param_sizes[5], m->param_sizes[7], m->param_sizes[11],
                         m->param_sizes[13]};
    for (int i = 0; i < 4; i++)
        if (biases[i]) tu_randn(biases[i], n[i], 0.1, &rng);
    /* weights large enough that attention is far from uniform */
    for (size_t i = 0; i < m->param_sizes[4]; i++) m->params.qkvw[i] *= 6;
}

typedef struct {
    real *logits, *rgrads;
    double loss, attn_loss, kl;
    real* attn_grads;
} Result;

enum { B = 2, T = 24 };

static Result run(Model* m, const int* in, const int* tg) {
    Result r = {0};
    const size_t nl = (size_t)B * T * m->cfg.V;
    model_forward(m, in, tg, B, T, 1);
    r.loss = m->mean_loss;
    r.logits = mallocCheck(sizeof(real) * nl);
    memcpy(r.logits, model_logits(m), sizeof(real) * nl);
    r.rgrads = callocCheck(m->num_router, sizeof(real));
    r.attn_grads = callocCheck(m->num_router, sizeof(real));
    if (m->fc.attn != ATTN_SOFT) return r;
    model_zero_grad(m, GRAD_ROUTER);
    memset(m->rgrads_mem, 0, sizeof(real) * m->num_router);
    model_backward(m, GRAD_ROUTER);
    memcpy(r.rgrads, m->rgrads_mem, sizeof(real) * m->num_router);
    /* the attn objective (teacher group mass summed over the slices' heads) and the KL */
    memset(m->rgrads_mem, 0, sizeof(real) * m->num_router);
    model_teacher_forward(m, in, B, T, 1, 1);
    r.attn_loss = model_attn_objective(m, 1, 1);
    memcpy(r.attn_grads, m->rgrads_mem, sizeof(real) * m->num_router);
    model_forward(m, in, tg, B, T, 1);
    r.kl = m->mean_kl;
    return r;
}

static double rel_diff(const real* a, const real* b, size_t n) {
    double d = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        s = fmax(s, fabs((double)a[i]));
    }
    return d / (s > 0 ? s : 1);
}

static void free_result(Result* r) {
    free(r->logits);
    free(r->rgrads);
    free(r->attn_grads);
}

/* Alone: which key/value heads each slice holds, and the refusals. */
static void check_layouts(void) {
    ModelConfig c;
    model_config_preset("smollm2-135m", &c); /* 9 query heads, 3 key/value heads */
    char err[256];
    CHECK(model_tp_check(&c, 3, err, sizeof err) == 0, "smollm2 tp=3: %s", err);
    CHECK(model_tp_check(&c, 2, err, sizeof err) && strstr(err, "does not divide the model's 9"),
          "smollm2 tp=2 must be refused (9 heads), got '%s'", err);
    c.tp = 3;
    for (int r = 0; r < 3; r++) {
        c.tp_rank = r;
        CHECK(model_kv_heads(&c) == 1 && model_kv_head(&c, 0) == r,
              "smollm2 tp=3 slice %d: kv heads %d from %d", r, model_kv_heads(&c),
              model_kv_head(&c, 0));
        CHECK(model_qkv_width(&c) == 5 * 64 && model_att_width(&c) == 3 * 64 &&
                  model_fc_width(&c) == 2 * 512,
              "smollm2 tp=3 widths %d %d %d", model_qkv_width(&c), model_att_width(&c),
              model_fc_width(&c));
    }
    model_config_preset("llama2-70b", &c); /* 64 heads, 8 kv heads */
    c.tp = 16, c.tp_rank = 5; /* 4 query heads (20..23), all reading kv head 2: one copy */
    CHECK(model_kv_heads(&c) == 1 && model_kv_head(&c, 0) == 2, "70b tp=16: %d heads from %d",
          model_kv_heads(&c), model_kv_head(&c, 0));
    ModelConfig e = shape_config(&(Shape){"", ARCH_LLAMA, 6, 3});
    e.tp = 2, e.tp_rank = 1; /* query heads 3, 4, 5 read kv heads 1, 2, 2: one copy each */
    CHECK(model_kv_heads(&e) == 3 && model_kv_head(&e, 0) == 1 && model_kv_head(&e, 2) == 2,
          "6/3 tp=2: %d heads", model_kv_heads(&e));
    e.F = 95;
    CHECK(model_tp_check(&e, 2, err, sizeof err) && strstr(err, "F=95"),
          "an odd F must be refused for tp=2, got '%s'", err);
}

/* The bf16 store (model_store_bf16): the passes equal a model whose projections were rounded to
 * bf16 by hand, the fingerprint is the fp32 model's, the weights' hash sees the store, and what
 * needs fp32 weights is refused. */
static void refuse_lora(const void* arg) {
    Model* m = (Model*)arg;
    model_lora_init(m, &(LoraConfig){4, 8, LORA_QKV}, 1);
}
static void refuse_grad_all(const void* arg) { model_backward((Model*)arg, GRAD_ALL); }
static void refuse_cuda(const void* arg) { model_place((Model*)arg, "cuda"); }

static void check_bf16_store(void) {
    const Shape sh = {"", ARCH_LLAMA, 4, 2};
    ModelConfig c = shape_config(&sh);
    int in[B * T], tg[B * T];
    for (int i = 0; i < B * T; i++) in[i] = (i * 7 + 3) % c.V, tg[i] = (i * 5 + 1) % c.V;
    Model ref, st;
    build(&ref, &c, ATTN_SOFT, ROUTE_SINKHORN);
    build(&st, &c, ATTN_SOFT, ROUTE_SINKHORN);
    const uint64_t fp = model_fingerprint(&st);
    real* w[4] = {ref.params.qkvw, ref.params.attprojw, ref.params.fcw, ref.params.fcprojw};
    const size_t n[4] = {ref.param_sizes[4], ref.param_sizes[6], ref.param_sizes[10],
                         ref.param_sizes[12]};
    for (int k = 0; k < 4; k++)
        for (size_t i = 0; i < n[k]; i++) w[k][i] = bf16_to_f32(f32_to_bf16(w[k][i]));
    gguf_write_model(&st, tu_path("bf16.gguf"), 0);
    model_store_bf16(&st);
    CHECK(st.num_params + n[0] + n[1] + n[2] + n[3] == ref.num_params,
          "the store keeps the projections out of the fp32 parameters");
    /* loaded straight into the store: the same store, never the fp32 projections */
    Model ld;
    model_load_slice(&ld, tu_path("bf16.gguf"), &st.fc, NULL,
                     &(ModelLayout){NULL, WEIGHTS_BF16_PROJ});
    const size_t nb = n[0] + n[1] + n[2] + n[3];
    CHECK(ld.num_params == st.num_params && ld.wbf16 &&
              !memcmp(ld.wbf16, st.wbf16, sizeof(uint16_t) * nb) &&
              !memcmp(ld.params_mem, st.params_mem, sizeof(real) * st.num_params) &&
              model_fingerprint(&ld) == fp,
          "a model loaded into the bf16 store differs from one stored after loading");
    model_free(&ld);
    Result a = run(&ref, in, tg), b = run(&st, in, tg);
    const size_t nl = (size_t)B * T * c.V;
    CHECK(!memcmp(a.logits, b.logits, sizeof(real) * nl) &&
              !memcmp(a.rgrads, b.rgrads, sizeof(real) * ref.num_router) && a.loss == b.loss,
          "bf16 store: the passes differ from hand-rounded fp32 weights (logits %.2e)",
          rel_diff(a.logits, b.logits, nl));
    CHECK(model_fingerprint(&st) == fp, "bf16 store: the fingerprint must stay the fp32 model's");
    const uint64_t h = model_weights_hash(&st);
    st.wbf16[5] ^= 1;
    CHECK(model_weights_hash(&st) != h, "the weights' hash must cover the bf16 store");
    st.wbf16[5] ^= 1;
    char msg[256];
    CHECK(tu_fails_with(refuse_lora, &st, "adapters need the fp32 weights", msg, sizeof msg),
          "lora on the bf16 store: %s", msg);
    model_forward(&st, in, tg, B, T, 1); /* here: a forked child must not start threads */
    CHECK(tu_fails_with(refuse_grad_all, &st, "trains the router only", msg, sizeof msg),
          "weight gradients on the bf16 store: %s", msg);
    CHECK(tu_fails_with(refuse_cuda, &st, "bf16 weight store is the CPU's", msg, sizeof msg),
          "cuda with the bf16 store: %s", msg);
    free_result(&a);
    free_result(&b);
    model_free(&ref);
    model_free(&st);
}

/* lean_acts: a router's backward from the activations it reads (no per-layer ln2 and MLP
 * activation) gives the same gradients, bit for bit, in less memory; weight gradients refused. */
static void check_lean_acts(void) {
    const Shape sh = {"", ARCH_LLAMA, 4, 2};
    ModelConfig c = shape_config(&sh);
    c.L = 3;
    int in[B * T], tg[B * T];
    for (int i = 0; i < B * T; i++) in[i] = (i * 7 + 3) % c.V, tg[i] = (i * 5 + 1) % c.V;
    Model full, lean;
    build(&full, &c, ATTN_SOFT, ROUTE_CAUSAL);
    build(&lean, &c, ATTN_SOFT, ROUTE_CAUSAL);
    lean.pass.lean_acts = 1;
    Result a = run(&full, in, tg), b = run(&lean, in, tg);
    const size_t nl = (size_t)B * T * c.V;
    CHECK(!memcmp(a.logits, b.logits, sizeof(real) * nl) &&
              !memcmp(a.rgrads, b.rgrads, sizeof(real) * full.num_router) &&
              !memcmp(a.attn_grads, b.attn_grads, sizeof(real) * full.num_router) &&
              lean.keep == KEEP_ROUTER,
          "lean_acts: the router's gradients must not change");
    /* the tensors are carved one after another: ln2 .. lnf spans fewer reals */
    CHECK(lean.acts.lnf - lean.acts.ln2 < full.acts.lnf - full.acts.ln2,
          "lean_acts keeps fewer activations");
    char msg[256];
    CHECK(tu_fails_with(refuse_grad_all, &lean, "kept the router's activations only", msg,
                        sizeof msg),
          "weight gradients after a lean pass: %s", msg);
    free_result(&a);
    free_result(&b);
    model_free(&full);
    model_free(&lean);
}

int main(int argc, char** argv) {
    Comm* w = comm_world(&argc, &argv);
    const int r = w->rank, n = w->size;
    if (n == 1) check_layouts(), check_bf16_store(), check_lean_acts();
    const Shape shapes[] = {{"gpt2", ARCH_GPT2, 4, 4},
                            {"llama, kv heads split", ARCH_LLAMA, 4, 2},
                            {"llama, one kv head shared", ARCH_LLAMA, 4, 1},
                            {"llama, one kv copy per head", ARCH_LLAMA, 6, 3}};
    int ran = 0;
    for (int tp = 2; tp <= n; tp *= 2) {
        if (n % tp) continue;
        Comm* group = comm_split(w, r / tp, r % tp);
        for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
            ModelConfig c = shape_config(&shapes[s]);
            if (c.NH % tp) continue;
            int in[B * T], tg[B * T];
            for (int i = 0; i < B * T; i++) in[i] = (i * 7 + 3) % c.V, tg[i] = (i * 5 + 1) % c.V;
            for (int mode = 0; mode < 4; mode++) {
                const AttnMode attn = mode < 2 ? ATTN_SOFT : ATTN_HARD;
                const Routing routing = mode % 2 ? ROUTE_CAUSAL : ROUTE_SINKHORN;
                Model whole, slice;
                build(&whole, &c, attn, routing);
                Result a = run(&whole, in, tg);
                build(&slice, &c, attn, routing);
                model_shard(&slice, group);
                CHECK(model_fingerprint(&slice) == model_fingerprint(&whole),
                      "a slice's fingerprint must be the whole model's");
                CHECK(slice.num_params < whole.num_params, "the slice holds fewer weights");
                Result b = run(&slice, in, tg);
                const size_t nl = (size_t)B * T * c.V;
                double dl = rel_diff(a.logits, b.logits, nl);
                double dg = rel_diff(a.rgrads, b.rgrads, whole.num_router);
                double da = rel_diff(a.attn_grads, b.attn_grads, whole.num_router);
                const char* what = attn == ATTN_SOFT ? "soft" : "hard";
                const char* how = routing == ROUTE_CAUSAL ? "causal" : "sinkhorn";
                CHECK(dl < 1e-5, "tp=%d %s %s %s rank %d: logits differ by %.2e", tp,
                      shapes[s].name, what, how, r, dl);
                CHECK(fabs(a.loss - b.loss) < 1e-5 * fabs(a.loss),
                      "tp=%d %s %s %s: loss %.8f, whole %.8f", tp, shapes[s].name, what, how,
                      b.loss, a.loss);
                if (attn == ATTN_SOFT) {
                    double gate = fabs(a.rgrads[whole.num_router - 2]);
                    CHECK(gate > 0, "the test must give the gate a gradient");
                    CHECK(dg < 1e-4, "tp=%d %s %s %s rank %d: router gradients differ by %.2e", tp,
                          shapes[s].name, what, how, r, dg);
                    CHECK(da < 1e-4 && fabs(a.attn_loss - b.attn_loss) < 1e-5 * a.attn_loss,
                          "tp=%d %s %s %s: attn objective %.8f vs %.8f, gradients %.2e", tp,
                          shapes[s].name, what, how, b.attn_loss, a.attn_loss, da);
                    CHECK(fabs(a.kl - b.kl) < 1e-5 * (fabs(a.kl) + 1e-3),
                          "tp=%d %s %s %s: kl %.8g vs %.8g", tp, shapes[s].name, what, how, b.kl,
                          a.kl);
                }
                if (mode == 0) {
                    /* the bf16 store of a slice is the slice of the whole model's store */
                    Model wb, sb;
                    build(&wb, &c, attn, routing);
                    model_store_bf16(&wb);
                    build(&sb, &c, attn, routing);
                    model_shard(&sb, group);
                    model_store_bf16(&sb);
                    Result x = run(&wb, in, tg), y = run(&sb, in, tg);
                    CHECK(rel_diff(x.logits, y.logits, (size_t)B * T * c.V) < 1e-5 &&
                              rel_diff(x.rgrads, y.rgrads, wb.num_router) < 1e-4 &&
                              model_fingerprint(&sb) == model_fingerprint(&whole),
                          "tp=%d %s: a bf16-stored slice differs from the whole store", tp,
                          shapes[s].name);
                    free_result(&x);
                    free_result(&y);
                    model_free(&wb);
                    model_free(&sb);
                }
                if (mode == 0 && c.arch == ARCH_LLAMA) {
                    /* a slice loaded from a file (model_load_slice) is the slice model_shard cuts
                     */
                    char path[64];
                    snprintf(path, sizeof path, "whole_%zu.gguf", s);
                    gguf_write_model(&whole, tu_path(path), 0);
                    Model loaded;
                    model_load_slice(&loaded, tu_path(path), &whole.fc, NULL,
                                     &(ModelLayout){group, WEIGHTS_FP32});
                    CHECK(loaded.num_params == slice.num_params && loaded.tp == group &&
                              !memcmp(loaded.params_mem, slice.params_mem,
                                      sizeof(real) * slice.num_params) &&
                              model_fingerprint(&loaded) == model_fingerprint(&whole),
                          "tp=%d %s: the slice loaded from a file differs from model_shard's", tp,
                          shapes[s].name);
                    model_free(&loaded);
                    Model lb; /* into a slice's bf16 store */
                    model_load_slice(&lb, tu_path(path), &whole.fc, NULL,
                                     &(ModelLayout){group, WEIGHTS_BF16_PROJ});
                    model_store_bf16(&slice);
                    CHECK(lb.num_params == slice.num_params &&
                              !memcmp(lb.params_mem, slice.params_mem,
                                      sizeof(real) * slice.num_params) &&
                              lb.wbf16_n == slice.wbf16_n &&
                              !memcmp(lb.wbf16, slice.wbf16, sizeof(uint16_t) * slice.wbf16_n) &&
                              model_fingerprint(&lb) == model_fingerprint(&whole),
                          "tp=%d %s: a slice loaded into the bf16 store differs", tp,
                          shapes[s].name);
                    model_free(&lb);
                }
                ran++;
                free_result(&a);
                free_result(&b);
                model_free(&whole);
                model_free(&slice);
            }
        }
        comm_free(group);
    }
    if (r == 0 && n > 1) printf("  %d rank(s): %d sharded runs equal the whole model\n", n, ran);
    int failed = tu_finish("test_tp");
    comm_free(w);
    return failed;
}
