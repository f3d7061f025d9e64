/*
 * constants.h -- numbers that more than one file needs: device limits,
 * library limits and math constants. Plain #defines, so C host code, the
 * CUDA kernels and static_asserts all read the same value.
 */
#ifndef FC_CONSTANTS_H
#define FC_CONSTANTS_H

/* ---- library limits ---------------------------------------------------- */
/* More splits than this buys nothing: each split must still own several KV
 * blocks, and the combine pass reads num_splits partial rows. */
#define FC_MAX_SPLITS 64
/* The CPU paths keep per-row scratch of head_dim floats per query row of a
 * tile; 512 bounds that scratch and covers every head dim in use. */
#define FC_CPU_MAX_HEAD_DIM 512

/* ---- argument ranges (src/validate.c, docs/API.md) ------------------------ */
/* 1e25 * log2(e) * 512 * 65504^2 = 3.2e37: every fp32 score of f16 inputs at
 * any head dim, and the difference of two, stays finite on every path. */
#define FC_MAX_ABS_SCALE 1e25f
/* 1e-25 / FC_MAX_SOFTCAP = 1e-28: scale*log2(e) and scale/softcap stay normal
 * floats, never 0 (the CUDA kernels read softcap_in == 0 as "no softcap"). */
#define FC_MIN_ABS_SCALE 1e-25f
/* The CUDA tanh is off by up to ~2.4e-7 absolute (tanh_acc, device_math.cuh)
 * and softcap multiplies it into the logit: 1e3 keeps that error <= 2.4e-4. */
#define FC_MAX_SOFTCAP 1e3f
/* FC_MAX_ABS_SCALE / 1e-13 = 1e38 < FLT_MAX: scale/softcap, the factor of the
 * tanh argument, stays a finite float (so never inf * 0 = NaN). */
#define FC_MIN_SOFTCAP 1e-13f

/* ---- Hopper (sm_90) device limits ---------------------------------------- */
/* Shared memory per SM: 228 KB, of which the driver reserves 1 KB per CTA. */
#define FC_SM90_SMEM_PER_SM 233472
#define FC_SMEM_RESERVED_PER_CTA 1024
/* Largest dynamic shared memory one CTA may opt in to: 227 KB. */
#define FC_SM90_SMEM_OPTIN 232448

/* ---- math ----------------------------------------------------------------- */
#define FC_LN2 0.69314718055994530942
#define FC_LOG2E 1.4426950408889634074
#define FC_LN2_F 0.6931471805599453f
#define FC_LOG2E_F 1.4426950408889634f

#endif /* FC_CONSTANTS_H */
