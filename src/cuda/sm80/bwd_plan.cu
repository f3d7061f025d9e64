/*
 * bwd_plan.cu -- the sm80-class backward's planner and launcher (placeholder
 * until the kernels land: answers FC_ERR_UNSUPPORTED).
 */
#include <cstdio>

#include "internal.h"

extern "C" fc_status fc_sm80_bwd_plan(const fc_bwd_params *p, const fc_cuda_device *dev,
                                      const fc_tuning *tune, fc_cuda_choice *choice, char *why,
                                      size_t why_len)
{
    snprintf(why, why_len, "the cuda backward is not implemented yet");
    return FC_ERR_UNSUPPORTED;
}

extern "C" fc_status fc_cuda_backward(const fc_bwd_params *p, const fc_cuda_choice *choice,
                                      const fc_cuda_device *dev, void *stream, char *err,
                                      size_t err_len)
{
    snprintf(err, err_len, "the cuda backward is not implemented yet");
    return FC_ERR_UNSUPPORTED;
}
