/* Exact powers of two and binades from the bits of IEEE floats, shared by the quantizer kernels. */
#ifndef MASE_LITE_FLOAT_BITS_H
#define MASE_LITE_FLOAT_BITS_H

#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#define VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define VECTOR_CLONES
#endif

/* Floats read ahead of the element at hand (2 KiB), a 64-byte line per 16 floats: without it the
   kernels stall on memory here (16-element blocks took 43 ms instead of 18 ms per 4096x4096 tensor). */
#define PREFETCH_AHEAD 512

static inline double pow2(int exponent) { /* exponent in [-1022, 1023] */
    uint64_t bits = (uint64_t)(exponent + 1023) << 52;
    double value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

static inline float pow2f(int exponent) { /* exponent in [-126, 127] */
    uint32_t bits = (uint32_t)(exponent + 127) << 23;
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

static inline int binade(double x) { /* floor(log2(|x|)) of a normal double; -1023 for zero */
    uint64_t bits;
    memcpy(&bits, &x, sizeof bits);
    return (int)((bits >> 52) & 0x7FF) - 1023;
}

static inline int binade_f(float x) { /* floor(log2(|x|)) of a normal float; -127 for zero and subnormals */
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    return (int)((bits >> 23) & 0xFF) - 127;
}

#endif
