/*
 * cuda_stub.c -- the CUDA layer of a build without CUDA. Every entry answers
 * "not compiled in", so the selection function reports FC_ERR_UNSUPPORTED /
 * FC_ERR_NO_DEVICE with a reason instead of failing at link or launch time.
 */
#include <stdio.h>
#include <string.h>

#include "internal.h"
#include "memory_space.h"

static const char k_no_cuda[] = "this FlashCore build has no CUDA backend (configured without nvcc)";

int fc_cuda_compiled(void) { return 0; }
const char *fc_cuda_compiled_archs(void) { return ""; }
int fc_cuda_compiled_from(int major, int minor, int floor)
{
    (void)major, (void)minor, (void)floor;
    return 0;
}

fc_status fc_cuda_get_device(int device, fc_cuda_device *dev, char *err, size_t err_len)
{
    snprintf(err, err_len, "%s", k_no_cuda);
    return FC_ERR_NO_DEVICE;
}

/* Without the CUDA runtime every pointer is host memory. */
void fc_cuda_device_pointers(const void *const *ptrs, int n, unsigned char *is_device)
{
    memset(is_device, 0, (size_t)(n > 0 ? n : 0));
}

fc_status fc_cuda_copy_to_host(void *dst, const void *src, size_t bytes, void *stream, char *err,
                               size_t err_len)
{
    snprintf(err, err_len, "%s", k_no_cuda);
    return FC_ERR_NO_DEVICE;
}

int fc_cuda_stream_is_capturing(void *stream) { return 0; }

fc_status fc_sm80_plan(const fc_fwd_params *p, const fc_cuda_device *dev, const fc_tuning *tune,
                       fc_cuda_choice *choice, char *why, size_t why_len)
{
    snprintf(why, why_len, "%s", k_no_cuda);
    return FC_ERR_UNSUPPORTED;
}

fc_status fc_sm90_plan(const fc_fwd_params *p, const fc_cuda_device *dev, const fc_tuning *tune,
                       fc_cuda_choice *choice, char *why, size_t why_len)
{
    snprintf(why, why_len, "%s", k_no_cuda);
    return FC_ERR_UNSUPPORTED;
}

/* No tile tables without CUDA: every tuning row index is out of range. */
int fc_sm90_tile_row(int i, fc_tile_row *row) { return 0; }
int fc_sm90_bwd_tile_row(int i, fc_tile_row *row) { return 0; }
int fc_sm80_tile_row(int i, fc_tile_row *row) { return 0; }
int fc_sm80_bwd_tile_row(int i, fc_tile_row *row) { return 0; }

void fc_cuda_tile_shape(const fc_cuda_choice *choice, int *block_m, int *block_n)
{
    *block_m = 1;
    *block_n = 1;
}

fc_status fc_cuda_forward(const fc_fwd_params *p, const fc_cuda_choice *choice,
                          const fc_cuda_device *dev, void *stream, char *err, size_t err_len)
{
    snprintf(err, err_len, "%s", k_no_cuda);
    return FC_ERR_NO_DEVICE;
}

int64_t fc_cuda_split_workspace_bytes(const fc_fwd_params *p, int splits) { return 0; }

fc_status fc_sm80_bwd_plan(const fc_bwd_params *p, const fc_cuda_device *dev, const fc_tuning *tune,
                           fc_cuda_choice *choice, char *why, size_t why_len)
{
    snprintf(why, why_len, "%s", k_no_cuda);
    return FC_ERR_UNSUPPORTED;
}

fc_status fc_sm90_bwd_plan(const fc_bwd_params *p, const fc_cuda_device *dev, const fc_tuning *tune,
                           fc_cuda_choice *choice, char *why, size_t why_len)
{
    snprintf(why, why_len, "%s", k_no_cuda);
    return FC_ERR_UNSUPPORTED;
}

fc_status fc_cuda_backward(const fc_bwd_params *p, const fc_cuda_choice *choice,
                           const fc_cuda_device *dev, void *stream, char *err, size_t err_len)
{
    snprintf(err, err_len, "%s", k_no_cuda);
    return FC_ERR_NO_DEVICE;
}
