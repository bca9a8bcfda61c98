/* MX fake quantization of float32 rows in one pass: the same function as mase_lite/numerics/mx.py.
 *
 * Each block of `block_size` consecutive elements of a row (the last block may be shorter) gets a
 * shared exponent E from its largest magnitude by the scale rule; each element x becomes the
 * element format's round-to-nearest-even value of x * 2**-E (clamped to +-max_value), times 2**E.
 * A block holding NaN or Inf becomes NaN. The arithmetic is exact: scaled values are doubles (a
 * float32 times a power of two), rounded by adding and subtracting 1.5 * 2**52 (the magnitudes
 * stay far below 2**51), and every result is a float32 value, so the final cast is exact. Blocks
 * whose powers of two are all normal float32 values (all but the extreme scales) take the same
 * steps in float32 (1.5 * 2**23), exact for the same reasons.
 * MXINT elements (is_int) sit on a fixed grid of step 2**-mbits and a zero result is +0.0;
 * MXFP elements have mbits fraction bits, subnormals below 2**emin, and keep the sign of zero.
 * Compiled without -ffast-math: the rounding additions must stay as written.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

enum { RULE_FLOOR = 0, RULE_CEIL = 1, RULE_EVEN = 2, RULE_RCEIL = 3 };

static const double ROUNDER = 6755399441055744.0; /* 1.5 * 2**52 */
static const float ROUNDER_F = 12582912.0f;         /* 1.5 * 2**23 */

static inline double pow2(int exponent) {
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

static inline int binade_f(float x) { /* floor(log2(|x|)) of a normal float; -127 for zero and subnormals */
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    return (int)((bits >> 23) & 0xFF) - 127;
}

static inline uint32_t magnitude_bits(float x) {
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    return bits & 0x7FFFFFFFu;
}

static inline int binade(double x) { /* floor(log2(|x|)) of a normal double; -1023 for zero */
    uint64_t bits;
    memcpy(&bits, &x, sizeof bits);
    return (int)((bits >> 52) & 0x7FF) - 1023;
}

static int shared_exponent(uint32_t amax_bits, int rule, int mbits, int emax, double max_value) {
    if (amax_bits == 0) return -127;
    int exponent;
    double mantissa; /* amax = mantissa * 2**exponent, mantissa in [0.5, 1) */
    if (amax_bits >= 0x00800000u) { /* normal: read the fields */
        exponent = (int)(amax_bits >> 23) - 126;
        mantissa = (double)((amax_bits & 0x007FFFFFu) | 0x00800000u) * 0x1p-24;
    } else {
        float amax_f;
        memcpy(&amax_f, &amax_bits, sizeof amax_f);
        mantissa = frexp((double)amax_f, &exponent);
    }
    int shared;
    if (rule == RULE_FLOOR) {
        shared = exponent - 1 - emax;
    } else if (rule == RULE_CEIL) {
        shared = exponent - 1 + (mantissa != 0.5) - emax;
    } else if (rule == RULE_EVEN) {
        double steps = pow2(mbits + 1);
        shared = exponent - 1 + (((mantissa * steps + ROUNDER) - ROUNDER) == steps) - emax;
    } else {
        int max_exponent;
        double max_mantissa = frexp(max_value, &max_exponent);
        shared = exponent - max_exponent + (mantissa > max_mantissa);
    }
    return shared < -127 ? -127 : (shared > 127 ? 127 : shared);
}

static inline __attribute__((always_inline)) void quantize_block(
        const float *restrict x, float *restrict y, int64_t n, int is_int, int rule, int mbits, int emax, int emin,
        double max_value) {
    uint32_t amax = 0;
    for (int64_t i = 0; i < n; i++) {
        uint32_t m = magnitude_bits(x[i]);
        amax = m > amax ? m : amax;
    }
    if (amax >= 0x7F800000u) { /* NaN or Inf in the block */
        for (int64_t i = 0; i < n; i++) y[i] = NAN;
        return;
    }
    int shared = shared_exponent(amax, rule, mbits, emax, max_value);
    if (shared >= -126 + (is_int ? mbits : 0) && shared <= 126) {
        /* every power of two below is a normal float32 and every product exact (or, for elements
           far below the block's grid, rounding to zero either way): float32 lanes, twice as many */
        float down = pow2f(-shared), up = pow2f(shared);
        if (is_int) {
            float to_codes = pow2f(mbits - shared), from_codes = pow2f(shared - mbits);
            float largest = (float)(max_value * pow2(mbits));
            for (int64_t i = 0; i < n; i++) {
                float code = (x[i] * to_codes + ROUNDER_F) - ROUNDER_F;
                code = code > largest ? largest : (code < -largest ? -largest : code);
                y[i] = code * from_codes + 0.0f;
            }
            return;
        }
        float limit = (float)max_value;
        for (int64_t i = 0; i < n; i++) {
            float scaled = x[i] * down;
            int e = binade_f(scaled);
            e = e < emin ? emin : e;
            float value = ((scaled * pow2f(mbits - e) + ROUNDER_F) - ROUNDER_F) * pow2f(e - mbits);
            value = value > limit ? limit : (value < -limit ? -limit : value);
            y[i] = copysignf(value * up, scaled);
        }
        return;
    }
    double down = pow2(-shared), up = pow2(shared);
    if (is_int) {
        double to_codes = pow2(mbits) * down, from_codes = pow2(-mbits) * up;
        double largest = max_value * pow2(mbits);
        for (int64_t i = 0; i < n; i++) {
            double code = ((double)x[i] * to_codes + ROUNDER) - ROUNDER;
            code = code > largest ? largest : (code < -largest ? -largest : code);
            y[i] = (float)(code * from_codes + 0.0);
        }
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        double scaled = (double)x[i] * down;
        int e = binade(scaled);
        e = e < emin ? emin : e;
        double value = (((scaled * pow2(mbits - e)) + ROUNDER) - ROUNDER) * pow2(e - mbits);
        value = value > max_value ? max_value : (value < -max_value ? -max_value : value);
        y[i] = (float)copysign(value * up, scaled);
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
#define VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define VECTOR_CLONES
#endif

/* Rows [0, rows) of length `length`, contiguous, from x into y. */
VECTOR_CLONES
void mx_fake_quantize(const float *restrict x, float *restrict y, int64_t rows, int64_t length, int64_t block_size,
                      int is_int, int rule, int mbits, int emax, int emin, double max_value) {
    for (int64_t r = 0; r < rows; r++) {
        const float *row_in = x + r * length;
        float *row_out = y + r * length;
        for (int64_t start = 0; start < length; start += block_size) {
            int64_t n = length - start < block_size ? length - start : block_size;
            if (n == 32) /* the MX block: a loop of known length, unrolled and vectorised whole */
                quantize_block(row_in + start, row_out + start, 32, is_int, rule, mbits, emax, emin, max_value);
            else
                quantize_block(row_in + start, row_out + start, n, is_int, rule, mbits, emax, emin, max_value);
        }
    }
}
