/* Fake quantization of float32 elements in one pass: the same functions as the torch
 * implementations of `integer` (integer.py) and of the float grids of minifloat_ieee,
 * minifloat_denorm and log (exponents.py: round_to_float).
 *
 * Both take `rows` rows of `length` contiguous elements.
 * fake_quantize_integer: round(x * 2**frac) (half to even, or floor), clamped to [lo, hi], times
 * 2**-frac, in float32 as torch computes it (the products are exact, NaN stays NaN, code 0 is +0.0).
 * fake_quantize_float_grid: x clamped to +-max_value (Inf saturates, NaN stays NaN) and rounded
 * (half to even) to mbits fraction bits, with subnormals below 2**emin; a zero keeps x's sign.
 * Exact: the clamp equals clamping after rounding (max_value is on the grid), and rounding adds
 * and subtracts 1.5 * 2**23 (float32 lanes, where every power of two involved is a normal float32
 * and mbits <= 21) or 1.5 * 2**52 (doubles otherwise). Compiled without -ffast-math.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "float_bits.h"

#define CHUNK 64

/* `body` for every i in [0, n), in chunks of CHUNK elements with the lines ahead prefetched. */
#define FOR_EACH_ELEMENT(n, x, body)                                                  \
    for (int64_t start = 0; start < (n); start += CHUNK) {                            \
        for (int64_t line = 0; line < CHUNK; line += 16)                              \
            __builtin_prefetch((x) + start + PREFETCH_AHEAD + line);                  \
        const int64_t end = start + CHUNK < (n) ? start + CHUNK : (n);                \
        for (int64_t i = start; i < end; i++) { body }                                \
    }

VECTOR_CLONES
void fake_quantize_integer(const float *restrict x, float *restrict y, int64_t rows, int64_t length, float scale,
                           float unscale, float lo, float hi, int floor_rounding) {
    const int64_t n = rows * length;
    if (floor_rounding) {
        FOR_EACH_ELEMENT(n, x, {
            float code = floorf(x[i] * scale);
            code = code < lo ? lo : (code > hi ? hi : code);
            y[i] = code * unscale + 0.0f; /* code 0 is +0.0: a two's complement code has no sign of zero */
        })
        return;
    }
    FOR_EACH_ELEMENT(n, x, {
        float code = nearbyintf(x[i] * scale);
        code = code < lo ? lo : (code > hi ? hi : code);
        y[i] = code * unscale + 0.0f;
    })
}

VECTOR_CLONES
void fake_quantize_float_grid(const float *restrict x, float *restrict y, int64_t rows, int64_t length, int mbits,
                              int emin, int emax, double max_value) {
    const int64_t n = rows * length;
    if (mbits <= 21 && emin - mbits >= -126 && emax - mbits <= 126 && emax <= 127) {
        const float limit = (float)max_value, rounder = 12582912.0f; /* 1.5 * 2**23 */
        FOR_EACH_ELEMENT(n, x, {
            float v = x[i] > limit ? limit : (x[i] < -limit ? -limit : x[i]);
            int e = binade_f(v);
            e = e < emin ? emin : e;
            float value = ((v * pow2f(mbits - e) + rounder) - rounder) * pow2f(e - mbits);
            y[i] = copysignf(value, x[i]);
        })
        return;
    }
    const double rounder = 6755399441055744.0; /* 1.5 * 2**52 */
    FOR_EACH_ELEMENT(n, x, {
        double v = x[i] > max_value ? max_value : (x[i] < -max_value ? -max_value : (double)x[i]);
        int e = binade(v);
        e = e < emin ? emin : e;
        double value = ((v * pow2(mbits - e) + rounder) - rounder) * pow2(e - mbits);
        y[i] = copysignf((float)value, x[i]);
    })
}
