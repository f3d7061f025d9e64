/* basic.c -- the smallest complete FlashCore program: attention over host
 * buffers on the CPU backend (the same call takes device pointers and a
 * cudaStream_t for the CUDA backend). Build against an installed FlashCore:
 *   cc basic.c $(pkg-config --cflags --libs flashcore) -o basic            */
#include <flashcore.h>
#include <stdio.h>
#include <stdlib.h>

int main(void)
{
    enum { B = 1, S = 128, H = 4, D = 64 };
    size_t n = (size_t)B * S * H * D;
    float *q = malloc(n * sizeof *q), *k = malloc(n * sizeof *k), *v = malloc(n * sizeof *v);
    float *o = malloc(n * sizeof *o);
    if (!q || !k || !v || !o) return 1;
    for (size_t i = 0; i < n; i++) {
        q[i] = (float)((i * 7919) % 101) / 50.0f - 1.0f;
        k[i] = (float)((i * 104729) % 97) / 48.0f - 1.0f;
        v[i] = (float)((i * 1299709) % 89) / 44.0f - 1.0f;
    }

    fc_context *ctx;
    if (fc_context_create(&ctx) != FC_OK) return 1;

    fc_attention_args a;
    fc_attention_args_init(&a);
    /* [batch, seqlen, heads, head_dim], contiguous: strides in elements */
    fc_tensor t = {q, FC_DTYPE_F32, 4, {B, S, H, D}, {(int64_t)S * H * D, H * D, D, 1}};
    a.q = t;
    a.k = t; a.k.data = k;
    a.v = t; a.v.data = v;
    a.out = t; a.out.data = o;
    a.causal = 1;

    fc_kernel_info info;
    fc_status st = fc_attention_forward(ctx, &a, NULL, &info);
    if (st != FC_OK) {
        fprintf(stderr, "flashcore: %s: %s\n", fc_status_string(st), fc_last_error(ctx));
        return 1;
    }
    printf("flashcore %s ran %s: out[0] = %f\n", fc_version_string(), info.name, o[0]);
    fc_context_free(ctx);
    free(q); free(k); free(v); free(o);
    return 0;
}
