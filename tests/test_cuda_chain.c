/*
 * test_cuda_chain.c -- stream order between two forward calls: O1 =
 * attn(Q, K, V) and, queued right behind it on the same stream with no
 * synchronisation, O2 = attn(O1, K, V). The second call must see every
 * element of the first call's output. Judged bitwise against the same two
 * calls with a stream synchronisation between them (each call alone is
 * deterministic), after poisoning both outputs, three times per shape, on
 * each CUDA kernel family, with programmatic dependent launch off and on
 * (fc_tuning.pdl 0 / -1: the default is on for sm_90+ devices, which
 * lets a kernel start launching while the previous one finishes; it must
 * wait before it reads). The decode shape runs split-KV on both paths, so
 * the combine kernel is chained behind the forward kernel too.
 * Without a CUDA device: "SKIP: ..." and exit code 77.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashcore.h"
#include "kit.h"
#include "test_util.h"

#if !defined(FC_HAVE_CUDA)
TU_MAIN_WITHOUT_CUDA
#else
#include <cuda_runtime_api.h>

typedef struct chain {
    void *q, *k, *v, *o1, *o2;
    fc_attention_args a1, a2; /* q -> o1, o1 -> o2 */
} chain;

#define CK(call)                                                                                       \
    do {                                                                                               \
        cudaError_t e_ = (call);                                                                       \
        if (e_ != cudaSuccess) {                                                                       \
            printf("FAIL %s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_));          \
            return -1;                                                                                 \
        }                                                                                              \
    } while (0)

static int chain_setup(chain *ch, const kit_case *c)
{
    memset(ch, 0, sizeof *ch);
    CK(cudaMalloc(&ch->q, c->q_bytes));
    CK(cudaMalloc(&ch->k, c->k_bytes));
    CK(cudaMalloc(&ch->v, c->v_bytes));
    CK(cudaMalloc(&ch->o1, c->out_bytes));
    CK(cudaMalloc(&ch->o2, c->out_bytes));
    CK(cudaMemcpy(ch->q, c->q, c->q_bytes, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(ch->k, c->k, c->k_bytes, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(ch->v, c->v, c->v_bytes, cudaMemcpyHostToDevice));
    CK(cudaDeviceSynchronize()); /* pageable copies: landed before any kernel */
    ch->a1 = c->args;
    ch->a1.q.data = ch->q;
    ch->a1.k.data = ch->k;
    ch->a1.v.data = ch->v;
    ch->a1.out.data = ch->o1;
    ch->a1.backend = FC_BACKEND_CUDA;
    ch->a2 = ch->a1;
    ch->a2.q = c->args.out; /* O1 as the next query: same shape and layout (BSHD, Hq == Hkv) */
    ch->a2.q.data = ch->o1;
    ch->a2.out.data = ch->o2;
    return 0;
}

static void chain_free(chain *ch)
{
    cudaFree(ch->q); cudaFree(ch->k); cudaFree(ch->v); cudaFree(ch->o1); cudaFree(ch->o2);
}

/* Poison both outputs, run the two calls (synchronised between them or
 * not), copy both back. */
static int chain_run(fc_context *ctx, chain *ch, cudaStream_t s, size_t bytes, int sync_between, void *h1,
                     void *h2, char *name, size_t name_len)
{
    CK(cudaMemset(ch->o1, 0xff, bytes)); /* 0xffff: a NaN in f16 and bf16 */
    CK(cudaMemset(ch->o2, 0xff, bytes));
    CK(cudaDeviceSynchronize());
    fc_kernel_info info;
    fc_status st = fc_attention_forward(ctx, &ch->a1, s, &info);
    if (st == FC_OK && sync_between) st = cudaStreamSynchronize(s) == cudaSuccess ? FC_OK : FC_ERR_CUDA;
    if (st == FC_OK) st = fc_attention_forward(ctx, &ch->a2, s, &info);
    if (st != FC_OK) {
        printf("FAIL forward: %s: %s\n", fc_status_string(st), fc_last_error(ctx));
        return -1;
    }
    snprintf(name, name_len, "%s", info.name);
    CK(cudaStreamSynchronize(s));
    CK(cudaMemcpy(h1, ch->o1, bytes, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(h2, ch->o2, bytes, cudaMemcpyDeviceToHost));
    return 0;
}

int main(void)
{
    fc_context *ctx = NULL;
    if (fc_context_create(&ctx) != FC_OK) {
        printf("FAIL fc_context_create\n0 passed, 1 failed\n");
        return 1;
    }
    if (!fc_cuda_available()) {
        printf("SKIP: no CUDA device\n");
        fc_context_free(ctx);
        return 77;
    }
    cudaStream_t s;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
        printf("FAIL cudaStreamCreate\n0 passed, 1 failed\n");
        return 1;
    }
    /* The first call long enough that the second is queued well before it
     * ends; Hq == Hkv so that O1 has Q's shape and layout. */
    kit_shape shapes[5];
    shapes[0] = test_shape(2, 16, 16, 2048, 2048, 128, FC_DTYPE_BF16);
    shapes[1] = test_shape(4, 16, 16, 1024, 1024, 64, FC_DTYPE_F16);
    shapes[2] = test_shape(1, 8, 8, 512, 512, 64, FC_DTYPE_F16); /* the mission shape */
    shapes[3] = shapes[0];
    shapes[3].causal = 1;
    shapes[4] = test_shape(4, 8, 8, 4, 8192, 128, FC_DTYPE_BF16); /* decode-like: split-KV + combine */
    const int paths[2] = {90, 80};
    for (int pdl = 0; pdl < 2; pdl++) {
        fc_tuning tune;
        fc_tuning_init(&tune); /* pdl -1: the default, on */
        if (!pdl) tune.pdl = 0;
        fc_context_set_tuning(ctx, &tune);
        for (int pi = 0; pi < 2; pi++) {
            for (int si = 0; si < 5; si++) {
                kit_shape sh = shapes[si];
                sh.layout = KIT_LAYOUT_BSHD;
                sh.want_lse = 0; /* outputs compared: O1 and O2 */
                kit_case c;
                if (kit_case_init(&c, &sh, 1000 + si) != 0) {
                    CHECK(0, "kit_case_init");
                    continue;
                }
                fc_context_set_cuda_path(ctx, paths[pi]);
                chain ch;
                void *r1 = malloc(c.out_bytes), *r2 = malloc(c.out_bytes);
                void *h1 = malloc(c.out_bytes), *h2 = malloc(c.out_bytes);
                char name[96] = "";
                if (!r1 || !r2 || !h1 || !h2 || chain_setup(&ch, &c) != 0) {
                    CHECK(0, "setup");
                } else if (chain_run(ctx, &ch, s, c.out_bytes, 1, r1, r2, name, sizeof name) != 0) {
                    CHECK(0, "path %d shape %d: synchronised run", paths[pi], si);
                } else {
                    for (int rep = 0; rep < 3; rep++) {
                        if (chain_run(ctx, &ch, s, c.out_bytes, 0, h1, h2, name, sizeof name) != 0) {
                            CHECK(0, "path %d shape %d: chained run", paths[pi], si);
                            break;
                        }
                        CHECK(memcmp(h1, r1, c.out_bytes) == 0 && memcmp(h2, r2, c.out_bytes) == 0,
                              "pdl %d path %d shape %d [%s] rep %d: the chained calls differ from the "
                              "synchronised ones (first call %s, second %s)",
                              pdl, paths[pi], si, name, rep, memcmp(h1, r1, c.out_bytes) ? "differs" : "same",
                              memcmp(h2, r2, c.out_bytes) ? "differs" : "same");
                    }
                    chain_free(&ch);
                }
                free(r1); free(r2); free(h1); free(h2);
                kit_case_free(&c);
            }
        }
    }
    fc_context_set_cuda_path(ctx, 0);
    cudaStreamDestroy(s);
    fc_context_free(ctx);
    return test_summary();
}
#endif
