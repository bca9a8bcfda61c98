/* Exact powers of two, binades and float16 values from the bits of IEEE floats, shared by the quantizer kernels and
   the packed-weight kernels. */
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

/* The float32 value of float16 bits, exactly (every float16 is a float32); a NaN comes out quiet, as the F16C
   instruction makes it. */
static inline float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exponent = (h >> 10) & 0x1Fu, mantissa = h & 0x3FFu, bits;
    if (exponent == 0x1F)
        bits = sign | 0x7F800000u | (mantissa ? 0x400000u | mantissa << 13 : 0u);
    else if (exponent)
        bits = sign | (exponent + 112) << 23 | mantissa << 13;
    else { /* zero or subnormal: mantissa * 2**-24, exact in float32 */
        float magnitude = (float)mantissa * 0x1p-24f;
        return sign ? -magnitude : magnitude;
    }
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

#endif
