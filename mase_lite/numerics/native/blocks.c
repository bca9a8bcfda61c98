/* Fake quantization to block-scaled formats (MXINT, MXFP, block_fp, block_minifloat, block_log) of
 * float32 rows in one pass: the same function as their torch implementations in mase_lite/numerics.
 *
 * Each block of `block_size` consecutive elements of a row (the last block may be shorter) gets a
 * shared exponent S from its largest magnitude by the scale rule, clamped to [shared_min,
 * shared_max]; each element x becomes the element grid's round-to-nearest-even value of
 * x * 2**-S, clamped to +-max_value, times 2**S. A block holding NaN or Inf becomes NaN.
 * Integer grids have step 2**-mbits; float grids have mbits fraction bits and subnormals below
 * 2**emin. A zero result keeps the sign of x, or is +0.0 where zero_is_positive (MXINT's code 0).
 *
 * The arithmetic is exact: scaled values are doubles (a float32 times a power of two), clamped
 * before rounding (the same as after: the bounds are grid points and rounding is monotonic), and
 * rounded by adding and subtracting 1.5 * 2**52 (magnitudes stay below 2**51); every result is a
 * float32 value or beyond float32's range, so the final cast is exact or overflows as float32
 * arithmetic would. Blocks whose powers of two are all normal float32 values (all but extreme
 * scales) take the same steps in float32 lanes (1.5 * 2**23), exact for the same reasons; an
 * element far below its block's grid may lose bits there, and rounds to zero either way.
 * Compiled without -ffast-math: the rounding additions must stay as written.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "float_bits.h"

enum { RULE_FLOOR = 0, RULE_CEIL = 1, RULE_EVEN = 2, RULE_RCEIL = 3, RULE_NEAREST = 4 };

static const double ROUNDER = 6755399441055744.0; /* 1.5 * 2**52 */
static const float ROUNDER_F = 12582912.0f;         /* 1.5 * 2**23 */

typedef struct {
    int integer_grid, rule, mbits, emax, emin, shared_min, shared_max, zero_is_positive;
    double max_value;
    int lanes_min, lanes_max; /* the shared exponents for which float32 lanes are exact */
} Format;

static inline uint32_t magnitude_bits(float x) {
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    return bits & 0x7FFFFFFFu;
}

static inline __attribute__((always_inline)) int shared_exponent(uint32_t amax_bits, const Format *f) {
    if (amax_bits == 0) return f->shared_min; /* an all-zero block: zeros at any scale */
    int exponent;
    double mantissa; /* amax = mantissa * 2**exponent, mantissa in [0.5, 1) */
    if (amax_bits >= 0x00800000u) { /* normal: read the fields */
        exponent = (int)(amax_bits >> 23) - 126;
        mantissa = (double)((amax_bits & 0x007FFFFFu) | 0x00800000u) * 0x1p-24;
    } else {
        float amax;
        memcpy(&amax, &amax_bits, sizeof amax);
        mantissa = frexp((double)amax, &exponent);
    }
    int shared;
    if (f->rule == RULE_FLOOR) {
        shared = exponent - 1 - f->emax;
    } else if (f->rule == RULE_CEIL) {
        shared = exponent - 1 + (mantissa != 0.5) - f->emax;
    } else if (f->rule == RULE_EVEN) { /* amax rounded to mbits fraction bits, then floor */
        double steps = pow2(f->mbits + 1);
        shared = exponent - 1 + (((mantissa * steps + ROUNDER) - ROUNDER) == steps) - f->emax;
    } else if (f->rule == RULE_RCEIL) { /* the smallest scale at which nothing saturates */
        int max_exponent;
        double max_mantissa = frexp(f->max_value, &max_exponent);
        shared = exponent - max_exponent + (mantissa > max_mantissa);
    } else { /* the power of two nearest amax by value, ties up, at most 2**127 */
        int nearest = exponent - 1 + (mantissa >= 0.75);
        shared = (nearest > 127 ? 127 : nearest) - f->emax;
    }
    return shared < f->shared_min ? f->shared_min : (shared > f->shared_max ? f->shared_max : shared);
}

static void set_float_lanes_range(Format *f) {
    int exact;
    if (f->integer_grid)
        exact = f->max_value * pow2(f->mbits) < 0x1p22;
    else
        exact = f->mbits <= 21 && f->emin - f->mbits >= -126 && f->emax - f->mbits <= 126 && f->emax <= 127;
    /* every power of two the block uses, 2**(+-shared) and (integer grid) 2**(+-(mbits - shared)), is normal */
    f->lanes_min = f->integer_grid ? (f->mbits - 126 > -126 ? f->mbits - 126 : -126) : -126;
    f->lanes_max = exact ? (f->integer_grid && f->mbits + 126 < 126 ? f->mbits + 126 : 126) : -1000;
}

static inline __attribute__((always_inline)) void quantize_block(
        const float *restrict x, float *restrict y, int64_t n, const Format *f) {
    uint32_t amax = 0;
    for (int64_t i = 0; i < n; i++) {
        uint32_t m = magnitude_bits(x[i]);
        amax = m > amax ? m : amax;
    }
    if (amax >= 0x7F800000u) { /* NaN or Inf in the block */
        for (int64_t i = 0; i < n; i++) y[i] = NAN;
        return;
    }
    const int shared = shared_exponent(amax, f), mbits = f->mbits, emin = f->emin;
    const int positive_zero = f->zero_is_positive;
    if (shared >= f->lanes_min && shared <= f->lanes_max) {
        const float up = pow2f(shared), down = pow2f(-shared);
        if (f->integer_grid) {
            const float to_codes = pow2f(mbits - shared), from_codes = pow2f(shared - mbits);
            const float largest = (float)(f->max_value * pow2(mbits));
            for (int64_t i = 0; i < n; i++) {
                float code = x[i] * to_codes;
                code = code > largest ? largest : (code < -largest ? -largest : code);
                code = (code + ROUNDER_F) - ROUNDER_F;
                float value = code * from_codes;
                y[i] = positive_zero ? value + 0.0f : copysignf(value, x[i]);
            }
            return;
        }
        const float limit = (float)f->max_value;
        for (int64_t i = 0; i < n; i++) {
            float scaled = x[i] * down;
            scaled = scaled > limit ? limit : (scaled < -limit ? -limit : scaled);
            int e = binade_f(scaled);
            e = e < emin ? emin : e;
            float value = ((scaled * pow2f(mbits - e) + ROUNDER_F) - ROUNDER_F) * pow2f(e - mbits);
            y[i] = copysignf(value * up, x[i]);
        }
        return;
    }
    const double up = pow2(shared), down = pow2(-shared), limit = f->max_value;
    for (int64_t i = 0; i < n; i++) {
        double scaled = (double)x[i] * down;
        scaled = scaled > limit ? limit : (scaled < -limit ? -limit : scaled);
        int e = f->integer_grid ? 0 : binade(scaled);
        e = f->integer_grid || e >= emin ? e : emin;
        float result = (float)(((((scaled * pow2(mbits - e)) + ROUNDER) - ROUNDER) * pow2(e - mbits)) * up);
        y[i] = positive_zero ? result + 0.0f : copysignf(result, x[i]);
    }
}

/* Rows [0, rows) of length `length`, contiguous, from x into y. */
VECTOR_CLONES
void fake_quantize_blocks(const float *restrict x, float *restrict y, int64_t rows, int64_t length,
                          int64_t block_size, int integer_grid, int rule, int mbits, int emax, int emin,
                          int shared_min, int shared_max, int zero_is_positive, double max_value) {
    Format f = {integer_grid, rule, mbits, emax, emin, shared_min, shared_max, zero_is_positive, max_value, 0, 0};
    set_float_lanes_range(&f);
    for (int64_t r = 0; r < rows; r++) {
        const float *row_in = x + r * length;
        float *row_out = y + r * length;
        for (int64_t start = 0; start < length; start += block_size) {
            int64_t n = length - start < block_size ? length - start : block_size;
            for (int64_t line = 0; line < n; line += 16) /* one 64-byte line per 16 floats */
                __builtin_prefetch(row_in + start + PREFETCH_AHEAD + line);
            if (n == 32) /* loops of known length, unrolled and vectorised whole */
                quantize_block(row_in + start, row_out + start, 32, &f);
            else if (n == 16)
                quantize_block(row_in + start, row_out + start, 16, &f);
            else
                quantize_block(row_in + start, row_out + start, n, &f);
        }
    }
}
