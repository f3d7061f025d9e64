/*
 * tiled_bwd.c -- the tiled multithreaded CPU backward (placeholder until the
 * backward lands: answers FC_ERR_UNSUPPORTED).
 */
#include <stdio.h>

#include "internal.h"

fc_status fc_cpu_tiled_backward(const fc_bwd_params *p, int num_threads, char *err, size_t err_len)
{
    snprintf(err, err_len, "the cpu backward is not implemented yet");
    return FC_ERR_UNSUPPORTED;
}
