/*
 * test_cuda_memory_space.c -- where the pointers of a CUDA call must live.
 * The library asks the driver once per allocation of a call and keeps no
 * answer for the next call (src/cuda/pointers.c), so:
 *   - q, k, v, out and lse carved out of one cudaMalloc (as torch's caching
 *     allocator does) share one answer: the call runs and matches the
 *     reference; the same from one managed allocation;
 *   - k, v, out or lse in host memory (malloc, and pinned cudaMallocHost)
 *     next to device ones: FC_ERR_INVALID_ARGUMENT naming it, from both
 *     supported() and forward(), nothing written;
 *   - a host buffer where a device allocation of an earlier call was (freed
 *     since): the same clear error, not a device fault;
 *   - AUTO goes where q lives and checks the rest against it;
 *   - the backward's dout, dq, dk, dv likewise.
 * Without a CUDA device: "SKIP: ..." and exit code 77.
 */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashcore.h"
#include "kit.h"
#include "test_util.h"

#if !defined(FC_HAVE_CUDA)
TU_MAIN_WITHOUT_CUDA
#else
#include <sys/mman.h>

#include <cuda_runtime_api.h>

#define CK(call) CHECK((call) == cudaSuccess, "%s: %s", #call, cudaGetErrorString(cudaGetLastError()))

static size_t up256(size_t n) { return (n + 255) / 256 * 256; }

/* The case's tensors at 256-byte aligned offsets of one buffer `arena`
 * (device or managed memory): q, k, v copied in, out and lse after them. */
static fc_attention_args carve(const kit_case *c, char *arena)
{
    fc_attention_args a = c->args;
    size_t off = 0;
    a.q.data = arena + off;   off += up256(c->q_bytes);
    a.k.data = arena + off;   off += up256(c->k_bytes);
    a.v.data = arena + off;   off += up256(c->v_bytes);
    a.out.data = arena + off; off += up256(c->out_bytes);
    a.lse.data = arena + off;
    cudaMemcpy(a.q.data, c->q, c->q_bytes, cudaMemcpyHostToDevice);
    cudaMemcpy(a.k.data, c->k, c->k_bytes, cudaMemcpyHostToDevice);
    cudaMemcpy(a.v.data, c->v, c->v_bytes, cudaMemcpyHostToDevice);
    a.backend = FC_BACKEND_CUDA;
    return a;
}

static size_t arena_bytes(const kit_case *c)
{
    return up256(c->q_bytes) + up256(c->k_bytes) + up256(c->v_bytes) + up256(c->out_bytes) + c->lse_bytes;
}

/* Run a (all device) and compare with the reference. */
static void run_and_compare(fc_context *ctx, const kit_case *c, const fc_attention_args *a, const void *ref_out,
                            const float *ref_lse, const char *what)
{
    void *out = malloc(c->out_bytes);
    float *lse = malloc(c->lse_bytes);
    fc_kernel_info info;
    cudaMemset(a->out.data, 0xff, c->out_bytes);
    cudaMemset(a->lse.data, 0xff, c->lse_bytes);
    const fc_status st = fc_attention_forward(ctx, a, NULL, &info);
    CHECK(st == FC_OK && info.backend == FC_BACKEND_CUDA, "%s: %s: %s", what, fc_status_string(st),
          fc_last_error(ctx));
    CK(cudaDeviceSynchronize());
    if (st == FC_OK && out && lse) {
        cudaMemcpy(out, a->out.data, c->out_bytes, cudaMemcpyDeviceToHost);
        cudaMemcpy(lse, a->lse.data, c->lse_bytes, cudaMemcpyDeviceToHost);
        kit_metrics m;
        const kit_gate g = kit_gate_for(c->s.dtype);
        kit_compare(c, out, lse, ref_out, ref_lse, &g, &m);
        CHECK(kit_gate_pass(&m, &g), "%s [%s]: rel_l2 %.3g max_abs %.3g unwritten %lld", what, info.name, m.rel_l2,
              m.max_abs, (long long)m.unwritten);
    }
    free(out);
    free(lse);
}

/* a must fail with "<name> is <kind> memory but the <backend> backend ..."
 * from supported() and forward(), with the device out and lse unchanged. */
static void expect_refused(fc_context *ctx, const fc_attention_args *a, const kit_case *c, const char *name,
                           const char *kind, const char *backend, const char *what)
{
    char want[128];
    snprintf(want, sizeof want, "%s is %s memory but the %s backend", name, kind, backend);
    fc_status st = fc_attention_supported(ctx, a, NULL);
    CHECK(st == FC_ERR_INVALID_ARGUMENT && strstr(fc_last_error(ctx), want), "%s: supported: %s: %s (want '%s')",
          what, fc_status_string(st), fc_last_error(ctx), want);
    /* out may be device or host memory: a cudaMemcpyDefault copy reads either */
    void *before = malloc(c->out_bytes), *after = malloc(c->out_bytes);
    if (!before || !after) CHECK(0, "out of host memory");
    else CK(cudaMemcpy(before, a->out.data, c->out_bytes, cudaMemcpyDefault));
    st = fc_attention_forward(ctx, a, NULL, NULL);
    CHECK(st == FC_ERR_INVALID_ARGUMENT && strstr(fc_last_error(ctx), want), "%s: forward: %s: %s (want '%s')",
          what, fc_status_string(st), fc_last_error(ctx), want);
    CK(cudaDeviceSynchronize());
    if (before && after) {
        CK(cudaMemcpy(after, a->out.data, c->out_bytes, cudaMemcpyDefault));
        CHECK(memcmp(before, after, c->out_bytes) == 0, "%s: the refused call wrote out", what);
    }
    free(before);
    free(after);
}

/* Each of k, v, out, lse in host memory (pageable, then pinned), the rest
 * in the device arena of a. */
static void host_operands(fc_context *ctx, const kit_case *c, const fc_attention_args *a)
{
    const char *names[4] = {"k", "v", "out", "lse"};
    for (int pinned = 0; pinned < 2; pinned++) {
        for (int i = 0; i < 4; i++) {
            fc_attention_args b = *a;
            fc_tensor *t = i == 0 ? &b.k : i == 1 ? &b.v : i == 2 ? &b.out : &b.lse;
            const size_t bytes = i == 0 ? c->k_bytes : i == 1 ? c->v_bytes : i == 2 ? c->out_bytes : c->lse_bytes;
            void *h = NULL;
            if (pinned) CK(cudaMallocHost(&h, bytes));
            else h = malloc(bytes);
            if (!h) continue;
            memset(h, 0, bytes);
            t->data = h;
            char what[64];
            snprintf(what, sizeof what, "%s in %s host memory", names[i], pinned ? "pinned" : "pageable");
            expect_refused(ctx, &b, c, names[i], "host", "cuda", what);
            if (pinned) cudaFreeHost(h);
            else free(h);
        }
    }
}

/* k in host memory mapped where a freed device allocation was, if the
 * system puts it there (reported); refused either way. */
static void freed_range(fc_context *ctx, const kit_case *c, const fc_attention_args *a)
{
    const size_t bytes = (size_t)2 << 20;
    fc_attention_args b = *a;
    void *d = NULL;
    CK(cudaMalloc(&d, bytes));
    if (!d || c->k_bytes > bytes) return;
    cudaMemcpy(d, c->k, c->k_bytes, cudaMemcpyHostToDevice);
    b.k.data = d;
    CHECK(fc_attention_forward(ctx, &b, NULL, NULL) == FC_OK, "k in a fresh allocation: %s", fc_last_error(ctx));
    CK(cudaDeviceSynchronize());
    CK(cudaFree(d));
    void *h = MAP_FAILED;
    int inside = 0;
    for (int tries = 0; tries < 64 && !inside; tries++) {
        if (h != MAP_FAILED) munmap(h, bytes);
        h = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        inside = h != MAP_FAILED && (uintptr_t)h >= (uintptr_t)d && (uintptr_t)h < (uintptr_t)d + bytes;
    }
    if (h == MAP_FAILED) {
        CHECK(0, "mmap of %zu bytes failed", bytes);
        return;
    }
    printf("freed range: host memory %s the freed device range\n", inside ? "landed inside" : "did not land in");
    memcpy(h, c->k, c->k_bytes);
    b.k.data = h;
    expect_refused(ctx, &b, c, "k", "host", "cuda", "k in host memory after a freed device range");
    munmap(h, bytes);
}

/* AUTO: all on the device runs on CUDA; q on the device with k on the host
 * is refused naming k; q on the host with k on the device goes to the CPU
 * backend and is refused naming k. */
static void auto_backend(fc_context *ctx, const kit_case *c, const fc_attention_args *a, const void *ref_out,
                         const float *ref_lse)
{
    fc_attention_args b = *a;
    b.backend = FC_BACKEND_AUTO;
    run_and_compare(ctx, c, &b, ref_out, ref_lse, "AUTO, all on the device");
    b.k.data = c->k;
    expect_refused(ctx, &b, c, "k", "host", "cuda", "AUTO, k on the host");
    fc_attention_args h = c->args;
    h.backend = FC_BACKEND_AUTO;
    h.k.data = a->k.data;
    expect_refused(ctx, &h, c, "k", "device", "cpu", "AUTO, q on the host, k on the device");
}

/* The backward's own pointers: each of dout, dq, dk, dv on the host. */
static void backward_operands(fc_context *ctx, const kit_case *c, const fc_attention_args *a)
{
    char *g = NULL;
    const size_t gb = up256(c->out_bytes) + up256(c->q_bytes) + up256(c->k_bytes) + up256(c->v_bytes);
    CK(cudaMalloc((void **)&g, gb));
    if (!g) return;
    CK(cudaMemcpy(g, c->q, c->out_bytes, cudaMemcpyHostToDevice)); /* dout: q's values (same shape) */
    fc_attention_backward_args b;
    fc_attention_backward_args_init(&b);
    b.fwd = *a;
    b.dout = a->out;
    b.dout.data = g;
    b.dq = a->q;
    b.dq.data = g + up256(c->out_bytes);
    b.dk = a->k;
    b.dk.data = (char *)b.dq.data + up256(c->q_bytes);
    b.dv = a->v;
    b.dv.data = (char *)b.dk.data + up256(c->k_bytes);
    CHECK(fc_attention_forward(ctx, a, NULL, NULL) == FC_OK, "forward for the backward: %s", fc_last_error(ctx));
    fc_status st = fc_attention_backward(ctx, &b, NULL, NULL);
    CHECK(st == FC_OK, "backward, all on the device: %s: %s", fc_status_string(st), fc_last_error(ctx));
    CK(cudaDeviceSynchronize());
    const char *names[4] = {"dout", "dq", "dk", "dv"};
    void *h = calloc(1, c->k_bytes > c->q_bytes ? c->k_bytes : c->q_bytes);
    for (int i = 0; h && i < 4; i++) {
        fc_attention_backward_args e = b;
        fc_tensor *t = i == 0 ? &e.dout : i == 1 ? &e.dq : i == 2 ? &e.dk : &e.dv;
        t->data = h;
        char want[96];
        snprintf(want, sizeof want, "%s is host memory but the cuda backend", names[i]);
        st = fc_attention_backward_supported(ctx, &e, NULL);
        CHECK(st == FC_ERR_INVALID_ARGUMENT && strstr(fc_last_error(ctx), want), "backward supported, %s host: %s",
              names[i], fc_last_error(ctx));
        st = fc_attention_backward(ctx, &e, NULL, NULL);
        CHECK(st == FC_ERR_INVALID_ARGUMENT && strstr(fc_last_error(ctx), want), "backward, %s host: %s",
              names[i], fc_last_error(ctx));
    }
    free(h);
    CK(cudaFree(g));
}

int main(void)
{
    fc_context *ctx;
    const int rc = tu_cuda_start(&ctx);
    if (rc >= 0) return rc;
    kit_shape sh = test_shape(1, 4, 2, 128, 192, 64, FC_DTYPE_F16);
    kit_case c;
    if (kit_case_init(&c, &sh, 7) != 0) return test_give_up("FAIL kit_case_init");
    void *ref_out = malloc(c.out_bytes);
    float *ref_lse = malloc(c.lse_bytes);
    if (!ref_out || !ref_lse || test_reference(ctx, &c, ref_out, ref_lse) != FC_OK)
        return test_give_up("FAIL the reference");

    char *arena = NULL, *managed = NULL;
    CK(cudaMalloc((void **)&arena, arena_bytes(&c)));
    CK(cudaMallocManaged((void **)&managed, arena_bytes(&c), cudaMemAttachGlobal));
    if (!arena || !managed) return test_give_up("FAIL device allocations");
    const fc_attention_args a = carve(&c, arena);
    run_and_compare(ctx, &c, &a, ref_out, ref_lse, "one device allocation");
    const fc_attention_args m = carve(&c, managed);
    run_and_compare(ctx, &c, &m, ref_out, ref_lse, "one managed allocation");
    host_operands(ctx, &c, &a);
    freed_range(ctx, &c, &a);
    auto_backend(ctx, &c, &a, ref_out, ref_lse);
    backward_operands(ctx, &c, &a);
    /* the refusals left the context usable: the same call runs again */
    run_and_compare(ctx, &c, &a, ref_out, ref_lse, "after the refusals");

    cudaFree(arena);
    cudaFree(managed);
    free(ref_out);
    free(ref_lse);
    kit_case_free(&c);
    fc_context_free(ctx);
    return test_summary();
}
#endif
