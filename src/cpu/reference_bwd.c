/*
 * reference_bwd.c -- the double-precision backward oracle (placeholder until
 * the backward lands: answers FC_ERR_UNSUPPORTED).
 */
#include <stdio.h>

#include "internal.h"

fc_status fc_cpu_reference_backward(const fc_bwd_params *p, char *err, size_t err_len)
{
    snprintf(err, err_len, "the cpu-reference backward is not implemented yet");
    return FC_ERR_UNSUPPORTED;
}
