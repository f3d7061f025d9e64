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
