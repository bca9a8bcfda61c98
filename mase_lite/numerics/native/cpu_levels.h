/* The vector levels a packed-weight kernel runs on this CPU, shared by the MXINT8, packed 4-bit and int8-activation
   kernels: bit LEVEL_C always; LEVEL_AVX2 where the CPU has AVX2, FMA and F16C; LEVEL_AVX512 where it has those and
   AVX-512 F, BW and VL (__builtin_cpu_supports also checks that the OS saves the vector registers). */
#ifndef MASE_LITE_CPU_LEVELS_H
#define MASE_LITE_CPU_LEVELS_H

enum { LEVEL_C = 0, LEVEL_AVX2 = 1, LEVEL_AVX512 = 2 };

static inline int cpu_levels(void) {
    int levels = 1 << LEVEL_C;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
        levels |= 1 << LEVEL_AVX2;
    if ((levels >> LEVEL_AVX2 & 1) && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl"))
        levels |= 1 << LEVEL_AVX512;
#endif
    return levels;
}

/* Whether the library was built with OpenMP (else its calls run on one thread). */
static inline int built_with_openmp(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}

#endif
