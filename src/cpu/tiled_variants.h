/*
 * tiled_variants.h -- compiles the per-item code of a tiled CPU path once
 * per instruction set: set FC_ITEM_HEADER to its header ("tiled_item.h",
 * "tiled_bwd_item.h") and include this. The header is included with
 * FC_ISA(name) naming the variant: name_generic (plain C for any target)
 * and, on x86-64, name_avx2 under target("avx2,f16c,fma") with FC_ISA_AVX2 set
 * (the explicit kernels of tiled_avx2.h). The target leaves out fma on purpose
 * (tiled.c says why): both variants give the same bits.
 */
#ifndef FC_ITEM_HEADER
#error "tiled_variants.h: define FC_ITEM_HEADER before including"
#endif

#define FC_ISA(name) name##_generic
#include FC_ITEM_HEADER
#undef FC_ISA

#ifdef FC_HAVE_AVX2_VARIANT
#include <immintrin.h>
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,f16c,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,f16c,fma")
#endif
#define FC_ISA(name) name##_avx2
#define FC_ISA_AVX2 1
#include FC_ITEM_HEADER
#undef FC_ISA_AVX2
#undef FC_ISA
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif
