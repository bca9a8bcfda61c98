/* Fake quantization to the formats with a real scale, scaled_integer and nvfp4, of float32 rows in
 * one pass: the same function as their torch implementations in mase_lite/numerics/scaled.py.
 *
 * Every step is the float32 operation torch performs, in the same order (IEEE arithmetic is
 * correctly rounded whatever the vector width, and nothing is contracted: -std=c11 turns FMA
 * contraction off): a scale from a group's largest finite magnitude (or finite minimum and maximum),
 * stored as float32, float16 or bfloat16 (rounded to nearest even, after saturating at the type's
 * largest value) or as the next power of two up; codes x / scale rounded half to even and clamped.
 * A NaN element stays NaN; a group of zeros gives zeros; a zero code gives +0.0.
 *
 * fake_quantize_scaled_integer: groups of `group_size` elements of each row (the last may be short),
 * or one fixed scale and zero point for every element (`fixed`: a per-tensor or static scale, which
 * the caller derives from finite_range over the whole tensor).
 * fake_quantize_nvfp4: blocks of 16 with an E4M3 scale each, under the float32 tensor scale given.
 * finite_range: the smallest and largest finite values of n floats, counting a zero among them.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "float_bits.h"

enum { SCALE_FLOAT32 = 0, SCALE_FLOAT16 = 1, SCALE_BFLOAT16 = 2, SCALE_POW2 = 3 };

static const double ROUNDER = 6755399441055744.0; /* 1.5 * 2**52 */
static const float ROUNDER_F = 12582912.0f;         /* 1.5 * 2**23 */

static inline uint32_t bits_of(float x) {
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    return bits;
}

static inline float float_of(uint32_t bits) {
    float x;
    memcpy(&x, &bits, sizeof x);
    return x;
}

/* A scale (positive, zero or +Inf; never NaN) as it is stored. */
static inline float stored_scale(float scale, int dtype) {
    if (dtype == SCALE_FLOAT16) { /* saturate at 65504, round to 10 fraction bits, subnormals below 2**-14 */
        double v = scale > 65504.0f ? 65504.0 : (double)scale;
        int e = binade(v);
        e = e < -14 ? -14 : e;
        return (float)(((v * pow2(10 - e) + ROUNDER) - ROUNDER) * pow2(e - 10));
    }
    if (dtype == SCALE_BFLOAT16) { /* saturate at bfloat16's largest value, round the low 16 bits away */
        uint32_t bits = scale > float_of(0x7F7F0000u) ? 0x7F7F0000u : bits_of(scale);
        return float_of((bits + 0x7FFFu + ((bits >> 16) & 1u)) & 0xFFFF0000u);
    }
    if (dtype == SCALE_POW2) { /* the power of two at or above the scale (frexp's exponent of Inf is 0) */
        if (!(scale > 0.0f)) return scale;
        int exponent;
        float mantissa = frexpf(scale, &exponent);
        return (float)pow2(exponent - (mantissa == 0.5f)); /* 2**128 overflows to Inf as in float32 */
    }
    return scale;
}

static inline float clampf(float x, float lo, float hi) { return x < lo ? lo : (x > hi ? hi : x); }

static inline void quantize_group(const float *restrict x, float *restrict y, int64_t n, float scale, float zero,
                                  float lo, float hi) {
    if (!(scale > 0.0f)) { /* a zero scale: every code 0 */
        for (int64_t i = 0; i < n; i++) y[i] = isnan(x[i]) ? x[i] : 0.0f;
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        float code = clampf(nearbyintf(x[i] / scale) + zero, lo, hi);
        float value = (code - zero) * scale + 0.0f;
        y[i] = isnan(x[i]) ? x[i] : value;
    }
}

/* Finite floats as integers in the same order (a zero as 0), non-finite ones as 0: integer minima and
   maxima vectorise where float ones (NaN, signed zeros) do not. */
static inline int32_t order_key(float x) {
    uint32_t bits = bits_of(x), magnitude = bits & 0x7FFFFFFFu;
    int32_t key = (bits >> 31) ? -(int32_t)magnitude : (int32_t)magnitude;
    return magnitude < 0x7F800000u ? key : 0;
}

static inline float from_key(int32_t key) {
    return key >= 0 ? float_of((uint32_t)key) : float_of((uint32_t)-key | 0x80000000u);
}

/* min(0, finite values) and max(0, finite values) of n floats. */
static inline void group_range(const float *restrict x, int64_t n, float *low, float *high) {
    int32_t lo = 0, hi = 0;
    for (int64_t i = 0; i < n; i++) {
        int32_t key = order_key(x[i]);
        lo = key < lo ? key : lo;
        hi = key > hi ? key : hi;
    }
    *low = from_key(lo);
    *high = from_key(hi);
}

/* The largest finite magnitude of n floats (0 for none). */
static inline float group_amax(const float *restrict x, int64_t n) {
    uint32_t amax = 0;
    for (int64_t i = 0; i < n; i++) {
        uint32_t magnitude = bits_of(x[i]) & 0x7FFFFFFFu;
        magnitude &= -(uint32_t)(magnitude < 0x7F800000u); /* 0 for NaN and Inf */
        amax = magnitude > amax ? magnitude : amax;
    }
    return float_of(amax);
}

VECTOR_CLONES
void finite_range(const float *restrict x, int64_t n, float *restrict low_high) {
    group_range(x, n, &low_high[0], &low_high[1]);
}

VECTOR_CLONES
void fake_quantize_scaled_integer(const float *restrict x, float *restrict y, int64_t rows, int64_t length,
                                  int64_t group_size, int symmetric, float clip, float qmax, int scale_dtype,
                                  int fixed, float fixed_scale, float fixed_zero, int full_range) {
    /* full_range: the two's-complement grid -qmax-1..qmax, the amax on code qmax + 1/2 */
    const float lo = symmetric ? -qmax - (float)full_range : 0.0f;
    const float top = full_range ? qmax + 0.5f : qmax;
    for (int64_t r = 0; r < rows; r++) {
        const float *row_in = x + r * length;
        float *row_out = y + r * length;
        for (int64_t start = 0; start < length; start += group_size) {
            const int64_t n = length - start < group_size ? length - start : group_size;
            for (int64_t line = 0; line < n; line += 16) /* one 64-byte line per 16 floats */
                __builtin_prefetch(row_in + start + PREFETCH_AHEAD + line);
            float scale = fixed_scale, zero = fixed_zero;
            if (!fixed) {
                if (symmetric) {
                    scale = stored_scale(group_amax(row_in + start, n) * clip / top, scale_dtype);
                    zero = 0.0f;
                } else {
                    float low, high;
                    group_range(row_in + start, n, &low, &high);
                    low *= clip;
                    high *= clip;
                    scale = stored_scale((high - low) / qmax, scale_dtype);
                    zero = scale > 0.0f ? clampf(nearbyintf(-low / scale), 0.0f, qmax) : 0.0f;
                }
            }
            quantize_group(row_in + start, row_out + start, n, scale, zero, lo, qmax);
        }
    }
}

/* Round to E4M3 (3 fraction bits) a value in [2**-6, 448], or NaN. */
static inline float round_e4m3(float v) {
    if (isnan(v)) return v;
    int e = binade_f(v);
    return ((v * pow2f(3 - e) + ROUNDER_F) - ROUNDER_F) * pow2f(e - 3);
}

/* Round to E2M1 (1 fraction bit, subnormals below 1) a value in [-6, 6] or NaN, keeping a zero's sign. */
static inline float round_e2m1(float v) {
    int e = binade_f(v);
    e = e < 0 ? 0 : e; /* at most 2 for |v| <= 6; 128 for NaN, which stays NaN */
    return copysignf(((v * pow2f(1 - e) + ROUNDER_F) - ROUNDER_F) * pow2f(e - 1), v);
}

/* v clamped to [-6, 6], NaN kept, on the bits (a float clamp here keeps the loop from vectorising). */
static inline float saturate6(float v) {
    const uint32_t bits = bits_of(v), magnitude = bits & 0x7FFFFFFFu, six = 0x40C00000u;
    const uint32_t over = (magnitude > six) & (magnitude <= 0x7F800000u);
    return float_of(over ? (bits & 0x80000000u) | six : bits);
}

static inline __attribute__((always_inline)) void nvfp4_block(
        const float *restrict x, float *restrict y, int64_t n, float tensor_scale, float reciprocal) {
    float block_scale = group_amax(x, n) / 6.0f / tensor_scale;
    block_scale = round_e4m3(clampf(block_scale, 0x1p-6f, 448.0f));
    const int live = tensor_scale > 0.0f;
    const float scale = live ? tensor_scale * block_scale : 0.0f;
    const float multiplier = live ? reciprocal / block_scale : 0.0f;
    for (int64_t i = 0; i < n; i++) {
        float value = round_e2m1(saturate6(x[i] * multiplier)) * scale;
        y[i] = isnan(x[i]) ? x[i] : value;
    }
}

VECTOR_CLONES
void fake_quantize_nvfp4(const float *restrict x, float *restrict y, int64_t rows, int64_t length,
                         float tensor_scale) {
    const float reciprocal = 1.0f / tensor_scale;
    for (int64_t r = 0; r < rows; r++) {
        const float *row_in = x + r * length;
        float *row_out = y + r * length;
        for (int64_t start = 0; start < length; start += 16) {
            __builtin_prefetch(row_in + start + PREFETCH_AHEAD);
            if (length - start >= 16) /* a loop of known length, unrolled and vectorised whole */
                nvfp4_block(row_in + start, row_out + start, 16, tensor_scale, reciprocal);
            else
                nvfp4_block(row_in + start, row_out + start, length - start, tensor_scale, reciprocal);
        }
    }
}
