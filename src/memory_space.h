/*
 * memory_space.h -- where the pointers of one call live: device memory (device
 * or managed, which the GPU reads) or not. src/cuda/pointers.c asks the CUDA
 * driver once per distinct allocation of the call; src/cuda_stub.c (no CUDA)
 * answers "not device" for every pointer.
 */
#ifndef FC_MEMORY_SPACE_H
#define FC_MEMORY_SPACE_H

/* Most pointers one call hands the library: 13 forward arrays and tensors,
 * 3 descales, 2 amax outputs, the backward's 5 more. */
#define FC_MAX_CALL_POINTERS 23

/* is_device[i] = 1 if ptrs[i] is device or managed memory, else 0 (host,
 * pinned host, unknown). n <= FC_MAX_CALL_POINTERS. Every pointer must stay
 * valid for the call (the API's ownership rule): that is what lets the
 * pointers inside one allocation share the driver's one answer. */
void fc_cuda_device_pointers(const void *const *ptrs, int n, unsigned char *is_device);

#endif /* FC_MEMORY_SPACE_H */
