/*
 * tiled_variants.h -- compiles the per-item code of a tiled CPU path once
 * per instruction set: set FC_ITEM_HEADER to its header ("tiled_item.h",
 * "tiled_bwd_item.h") and include this. The header is included with
 * FC_ISA(name) naming the variant: name_generic (plain C for any target)
 * and, on x86-64, name_avx2 under target("avx2,f16c,fma") with FC_ISA_AVX2
 * set (the explicit kernels of tiled_avx2.h), and name_avx512 under
 * target("avx512f,avx512vl,avx512bw,avx2,f16c,fma") with FC_ISA_AVX512 set
 * too (the same, with tiled_avx512.h's matrix products), and
 * name_avx512bf16 with avx512bf16 and FC_ISA_BF16 as well (bf16 inputs'
 * score products by vdpbf16ps, tiled_avx512bf16.h). The generic and
 * vector variants differ in their last bits (fused multiply-adds in the
 * vector ones); the AVX2 and AVX-512 ones agree, and the bf16 one with
 * them except on bf16 inputs.
 */
#ifndef FC_ITEM_HEADER
#error "tiled_variants.h: define FC_ITEM_HEADER before including"
#endif

#define FC_ISA(name) name##_generic
#include FC_ITEM_HEADER
#undef FC_ISA

#ifdef FC_HAVE_AVX2_VARIANT
#include <immintrin.h>
/* every function from here to FC_TARGET_POP compiled for target t */
#define FC_PRAGMA(x) _Pragma(#x)
#if defined(__clang__)
#define FC_TARGET_PUSH(t) FC_PRAGMA(clang attribute push(__attribute__((target(t))), apply_to = function))
#define FC_TARGET_POP FC_PRAGMA(clang attribute pop)
#else
#define FC_TARGET_PUSH(t) FC_PRAGMA(GCC push_options) FC_PRAGMA(GCC target(t))
#define FC_TARGET_POP FC_PRAGMA(GCC pop_options)
#endif

FC_TARGET_PUSH("avx2,f16c,fma")
#define FC_ISA(name) name##_avx2
#define FC_ISA_AVX2 1
#include FC_ITEM_HEADER
#undef FC_ISA
FC_TARGET_POP

#ifdef FC_HAVE_AVX512_VARIANT /* the AVX2 variant's code, 512-bit matrix products */
FC_TARGET_PUSH("avx512f,avx512vl,avx512bw,avx2,f16c,fma")
#define FC_ISA(name) name##_avx512
#define FC_ISA_AVX512 1
#include FC_ITEM_HEADER
#undef FC_ISA_AVX512
#undef FC_ISA
FC_TARGET_POP
#ifdef FC_HAVE_AVX512BF16_VARIANT /* the AVX-512 variant's code, bf16 inputs' scores by vdpbf16ps */
FC_TARGET_PUSH("avx512bf16,avx512f,avx512vl,avx512bw,avx2,f16c,fma")
#define FC_ISA(name) name##_avx512bf16
#define FC_ISA_AVX512 1
#define FC_ISA_BF16 1
#include FC_ITEM_HEADER
#undef FC_ISA_BF16
#undef FC_ISA_AVX512
#undef FC_ISA
FC_TARGET_POP
#endif
#endif

#undef FC_ISA_AVX2
#undef FC_TARGET_PUSH
#undef FC_TARGET_POP
#undef FC_PRAGMA
#endif
