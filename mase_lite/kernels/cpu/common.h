/* What every kernel of the CPU library shares: the vector levels, their target attributes, one horizontal sum and
 * one split of rows over threads.
 *
 * Levels: bit LEVEL_C always; LEVEL_AVX2 where the CPU has AVX2, FMA and F16C; LEVEL_AVX512 where it has those and
 * AVX-512 F, BW and VL (__builtin_cpu_supports also checks that the OS saves the vector registers). The int8 dot
 * products of LEVEL_AVX512 take AVX-512 VNNI where the CPU has it (cpu_vnni): on 256-bit vectors, and a K-quant
 * prompt's on 512-bit ones (kquant_dot.h). */
#ifndef MASE_LITE_KERNELS_COMMON_H
#define MASE_LITE_KERNELS_COMMON_H
#include <stdint.h>

enum { LEVEL_C = 0, LEVEL_AVX2 = 1, LEVEL_AVX512 = 2 };

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_X86 1
#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,fma,f16c")))
#define VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512vnni")))
#endif

#define INLINE static inline __attribute__((always_inline))

static inline int cpu_levels(void) {
    int levels = 1 << LEVEL_C;
#ifdef CPU_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
        levels |= 1 << LEVEL_AVX2;
    if ((levels >> LEVEL_AVX2 & 1) && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl"))
        levels |= 1 << LEVEL_AVX512;
#endif
    return levels;
}

/* Whether the CPU has AVX-512 VNNI, on 256-bit vectors too. */
static inline int cpu_vnni(void) {
#ifdef CPU_X86
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl");
#else
    return 0;
#endif
}

/* Whether the library was built with OpenMP (else its calls run on one thread). */
static inline int built_with_openmp(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

static inline int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* The sum of eight float32 lanes: ((0+4)+(2+6))+((1+5)+(3+7)), the order every kernel's reductions take. */
static inline float sum8(const float l[8]) {
    return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

#ifdef CPU_X86
/* sum8 of a vector's lanes. */
AVX2 INLINE float sum8_avx2(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#endif

/* Part `part` of `parts` of [0, units): the runs every split takes (as even as whole units allow). */
static inline void part_of(int64_t units, int part, int parts, int64_t *first, int64_t *last) {
    *first = units * part / parts;
    *last = units * (part + 1) / parts;
}

typedef void (*rows_fn)(const void *args, int part, int64_t first, int64_t last);

/* fn(args, part, first, last) on [0, rows) cut into at most `threads` runs (part 0, 1, ...) on multiples of `align`
 * rows, in parallel where built with OpenMP (torch's own team: the library shares the OpenMP runtime torch has
 * loaded), else one after another. Rows are split, never a sum: results do not depend on the thread count. */
static inline void split_rows(rows_fn fn, const void *args, int64_t rows, int64_t align, int threads) {
    int64_t units = (rows + align - 1) / align;
    int parts = (int)min64(threads < 1 ? 1 : threads, units < 1 ? 1 : units);
#ifdef _OPENMP
#pragma omp parallel for num_threads(parts) schedule(static, 1) if (parts > 1)
#endif
    for (int t = 0; t < parts; t++) {
        int64_t first, last;
        part_of(units, t, parts, &first, &last);
        fn(args, t, min64(rows, first * align), min64(rows, last * align));
    }
}

#endif
