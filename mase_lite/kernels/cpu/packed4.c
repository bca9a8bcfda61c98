/* Packed 4-bit weights on the CPU: the linear layer y = x . W^T + b with W held as nibbles (two per byte,
 * the even element of a pair in the low nibble), one float32 or float16 scale per block of 32 elements of a row
 * (float16 ones converted to float32 exactly: by F16C per block in the vector levels' products, a run of rows at
 * a time otherwise), and
 * a table of the 16 values a nibble stands for: two's complement integers -8..7 for 4-bit integers in
 * blocks of 32 with a float16 scale (GGUF's Q4_0) and for MXINT4 codes, E2M1 values for MXFP4.
 *
 * A weight is table[nibble] * scale. For the formats packed it is exact in float32 (a 4-bit integer or an
 * E2M1 value has at most 3 significant bits, a float16 scale 11, an E8M0 one 1, and no product falls below
 * 2**-149), so each weight this file forms is bit for bit the weight of the format's decoder. The linear
 * layer then sums x[t] * w[t] in float32: its result differs from the float64 reference only by float32
 * accumulation, each level summing in its own fixed order. Rows of W are split over threads, never a dot
 * product, so the result is the same at any thread count.
 *
 * Three levels, chosen by the caller from cpu_kernels_levels(): plain C, AVX2+FMA (8 lanes; the table
 * looked up by two permutes and a blend), AVX-512 (16 lanes; the table is one register, one permute per 16
 * weights). Compiled without -ffast-math and with C11 (no contraction of a * b + c into an FMA in plain C).
 */
#include "common.h"
#include <stdint.h>
#include <string.h>

#include "../../numerics/native/float_bits.h"

#ifdef CPU_X86
/* Scale i of a row as float32: float16 ones by F16C (exact). */
#define SCALE_AT(scales, half, i) \
    ((half) ? _cvtsh_ss(((const uint16_t *)(scales))[i]) : ((const float *)(scales))[i])
#endif

enum { BLOCK = 32, BLOCK_BYTES = 16 };
enum { X_ROWS = 4 }; /* rows of x computed together: each decoded block of W is used for up to 4 rows */

/* ---------------------------------------------------------------- plain C */

static void decode_block_c(const uint8_t *q, float scale, const float *table, float *w) {
    for (int t = 0; t < BLOCK_BYTES; t++) {
        w[2 * t] = table[q[t] & 15] * scale;
        w[2 * t + 1] = table[q[t] >> 4] * scale;
    }
}

static void linear_c(const float *x, int64_t m, int64_t k, const uint8_t *q, const float *scales,
                     const float *table, const float *bias, float *out, int64_t n, int64_t first, int64_t last) {
    int64_t nb = k / BLOCK;
    float w[BLOCK];
    for (int64_t j = first; j < last; j++) {
        for (int64_t i0 = 0; i0 < m; i0 += X_ROWS) {
            int64_t rows = min64(X_ROWS, m - i0);
            float acc[X_ROWS] = {0.0f, 0.0f, 0.0f, 0.0f};
            for (int64_t b = 0; b < nb; b++) {
                decode_block_c(q + j * (k / 2) + b * BLOCK_BYTES, scales[j * nb + b], table, w);
                for (int64_t r = 0; r < rows; r++) {
                    const float *xr = x + (i0 + r) * k + b * BLOCK;
                    float sum = acc[r];
                    for (int t = 0; t < BLOCK; t++) sum += w[t] * xr[t];
                    acc[r] = sum;
                }
            }
            for (int64_t r = 0; r < rows; r++) out[(i0 + r) * n + j] = bias ? acc[r] + bias[j] : acc[r];
        }
    }
}

static void dequantize_c(const uint8_t *q, const float *scales, const float *table, int64_t k, int64_t rows,
                         float *out) {
    int64_t nb = k / BLOCK;
    for (int64_t j = 0; j < rows; j++)
        for (int64_t b = 0; b < nb; b++)
            decode_block_c(q + j * (k / 2) + b * BLOCK_BYTES, scales[j * nb + b], table, out + j * k + b * BLOCK);
}

#ifdef CPU_X86
/* ---------------------------------------------------------------- AVX2 + FMA */

/* The 8 table values of the 8 nibbles in the low 8 bytes of `bytes` (one nibble per byte). */
AVX2 static inline __m256 lookup_avx2(__m128i bytes, __m256 low, __m256 high) {
    __m256i index = _mm256_cvtepu8_epi32(bytes);
    __m256 from_low = _mm256_permutevar8x32_ps(low, index);
    __m256 from_high = _mm256_permutevar8x32_ps(high, index);
    return _mm256_blendv_ps(from_low, from_high, _mm256_castsi256_ps(_mm256_slli_epi32(index, 28)));
}

/* The 32 weights of one block: four vectors of 8, in element order. */
AVX2 static inline void decode_block_avx2(const uint8_t *q, float scale, __m256 low, __m256 high, __m256 w[4]) {
    __m128i packed = _mm_loadu_si128((const __m128i *)q);
    __m128i mask = _mm_set1_epi8(15);
    __m128i lo = _mm_and_si128(packed, mask), hi = _mm_and_si128(_mm_srli_epi16(packed, 4), mask);
    __m128i first = _mm_unpacklo_epi8(lo, hi), second = _mm_unpackhi_epi8(lo, hi); /* elements 0-15, 16-31 */
    __m256 s = _mm256_set1_ps(scale);
    w[0] = _mm256_mul_ps(lookup_avx2(first, low, high), s);
    w[1] = _mm256_mul_ps(lookup_avx2(_mm_srli_si128(first, 8), low, high), s);
    w[2] = _mm256_mul_ps(lookup_avx2(second, low, high), s);
    w[3] = _mm256_mul_ps(lookup_avx2(_mm_srli_si128(second, 8), low, high), s);
}

/* The 16 weights of the low (even elements) or high (odd elements) nibbles of one block: two vectors of 8. */
AVX2 static inline void decode_half_avx2(__m128i nibbles, __m256 s, __m256 low, __m256 high, __m256 w[2]) {
    w[0] = _mm256_mul_ps(lookup_avx2(nibbles, low, high), s);
    w[1] = _mm256_mul_ps(lookup_avx2(_mm_srli_si128(nibbles, 8), low, high), s);
}

/* x in blocks of 32 as the 16 even elements, then the 16 odd ones: each nibble's weight meets its input
 * without interleaving the nibbles. */
AVX2 static void linear_avx2(const float *xd, int64_t m, int64_t k, const uint8_t *q, const void *scales, int half,
                             const float *table, const float *bias, float *out, int64_t n, int64_t first,
                             int64_t last) {
    int64_t nb = k / BLOCK;
    __m256 low = _mm256_loadu_ps(table), high = _mm256_loadu_ps(table + 8);
    __m128i mask = _mm_set1_epi8(15);
    for (int64_t j = first; j < last; j++) {
        for (int64_t i0 = 0; i0 < m; i0 += X_ROWS) {
            int64_t rows = min64(X_ROWS, m - i0);
            __m256 acc[X_ROWS][2];
            for (int r = 0; r < X_ROWS; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
            for (int64_t b = 0; b < nb; b++) {
                __m128i packed = _mm_loadu_si128((const __m128i *)(q + j * (k / 2) + b * BLOCK_BYTES));
                __m256 s = _mm256_set1_ps(SCALE_AT(scales, half, j * nb + b)), even[2], odd[2];
                decode_half_avx2(_mm_and_si128(packed, mask), s, low, high, even);
                decode_half_avx2(_mm_and_si128(_mm_srli_epi16(packed, 4), mask), s, low, high, odd);
                for (int64_t r = 0; r < rows; r++) {
                    const float *xr = xd + (i0 + r) * k + b * BLOCK;
                    acc[r][0] = _mm256_fmadd_ps(even[0], _mm256_loadu_ps(xr), acc[r][0]);
                    acc[r][1] = _mm256_fmadd_ps(even[1], _mm256_loadu_ps(xr + 8), acc[r][1]);
                    acc[r][0] = _mm256_fmadd_ps(odd[0], _mm256_loadu_ps(xr + 16), acc[r][0]);
                    acc[r][1] = _mm256_fmadd_ps(odd[1], _mm256_loadu_ps(xr + 24), acc[r][1]);
                }
            }
            for (int64_t r = 0; r < rows; r++) {
                float sum = sum8_avx2(_mm256_add_ps(acc[r][0], acc[r][1]));
                out[(i0 + r) * n + j] = bias ? sum + bias[j] : sum;
            }
        }
    }
}

AVX2 static void dequantize_avx2(const uint8_t *q, const float *scales, const float *table, int64_t k,
                                 int64_t rows, float *out) {
    int64_t nb = k / BLOCK;
    __m256 low = _mm256_loadu_ps(table), high = _mm256_loadu_ps(table + 8);
    for (int64_t j = 0; j < rows; j++)
        for (int64_t b = 0; b < nb; b++) {
            __m256 w[4];
            float *o = out + j * k + b * BLOCK;
            decode_block_avx2(q + j * (k / 2) + b * BLOCK_BYTES, scales[j * nb + b], low, high, w);
            for (int v = 0; v < 4; v++) _mm256_storeu_ps(o + 8 * v, w[v]);
        }
}

/* float16 to float32, eight at a time: how many it converted (a multiple of 8). */
AVX2 static int64_t widen_avx2(const uint16_t *h, int64_t count, float *out) {
    int64_t i = 0;
    for (; i + 8 <= count; i += 8) _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
    return i;
}

/* ---------------------------------------------------------------- AVX-512 */

/* The 32 weights of one block: two vectors of 16, in element order (the table is one register). */
AVX512 static inline void decode_block_avx512(const uint8_t *q, float scale, __m512 table, __m512 w[2]) {
    __m128i packed = _mm_loadu_si128((const __m128i *)q);
    __m128i mask = _mm_set1_epi8(15);
    __m128i lo = _mm_and_si128(packed, mask), hi = _mm_and_si128(_mm_srli_epi16(packed, 4), mask);
    __m512 s = _mm512_set1_ps(scale);
    w[0] = _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi)), table), s);
    w[1] = _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_unpackhi_epi8(lo, hi)), table), s);
}

/* The 16 weights of the nibbles in `nibbles` (one per byte) times the block's scale. */
AVX512 static inline __m512 weights_avx512(__m128i nibbles, __m512 lut, float scale) {
    return _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_cvtepu8_epi32(nibbles), lut), _mm512_set1_ps(scale));
}

/* One row of W against one row of x (deinterleaved): two blocks a step into four accumulators. */
AVX512 static inline float dot_avx512(const float *xd, const uint8_t *row, const void *scales, int half, int64_t nb,
                                      __m512 lut) {
    __m128i mask = _mm_set1_epi8(15);
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
        _mm_prefetch((const char *)(row + b * BLOCK_BYTES + 512), _MM_HINT_T0);
        __m128i p0 = _mm_loadu_si128((const __m128i *)(row + b * BLOCK_BYTES));
        __m128i p1 = _mm_loadu_si128((const __m128i *)(row + (b + 1) * BLOCK_BYTES));
        const float *x0 = xd + b * BLOCK;
        a0 = _mm512_fmadd_ps(weights_avx512(_mm_and_si128(p0, mask), lut, SCALE_AT(scales, half, b)), _mm512_loadu_ps(x0), a0);
        a1 = _mm512_fmadd_ps(weights_avx512(_mm_and_si128(_mm_srli_epi16(p0, 4), mask), lut, SCALE_AT(scales, half, b)),
                             _mm512_loadu_ps(x0 + 16), a1);
        a2 = _mm512_fmadd_ps(weights_avx512(_mm_and_si128(p1, mask), lut, SCALE_AT(scales, half, b + 1)), _mm512_loadu_ps(x0 + 32), a2);
        a3 = _mm512_fmadd_ps(weights_avx512(_mm_and_si128(_mm_srli_epi16(p1, 4), mask), lut, SCALE_AT(scales, half, b + 1)),
                             _mm512_loadu_ps(x0 + 48), a3);
    }
    if (b < nb) {
        __m128i p0 = _mm_loadu_si128((const __m128i *)(row + b * BLOCK_BYTES));
        a0 = _mm512_fmadd_ps(weights_avx512(_mm_and_si128(p0, mask), lut, SCALE_AT(scales, half, b)), _mm512_loadu_ps(xd + b * BLOCK), a0);
        a1 = _mm512_fmadd_ps(weights_avx512(_mm_and_si128(_mm_srli_epi16(p0, 4), mask), lut, SCALE_AT(scales, half, b)),
                             _mm512_loadu_ps(xd + b * BLOCK + 16), a1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

/* x deinterleaved per block (see linear_avx2); each row of x against each row of W by dot_avx512. */
AVX512 static void linear_avx512(const float *xd, int64_t m, int64_t k, const uint8_t *q, const void *scales,
                                 int half, const float *table, const float *bias, float *out, int64_t n,
                                 int64_t first, int64_t last) {
    int64_t nb = k / BLOCK;
    __m512 lut = _mm512_loadu_ps(table);
    for (int64_t j = first; j < last; j++)
        for (int64_t i = 0; i < m; i++) {
            float sum = dot_avx512(xd + i * k, q + j * (k / 2), (const char *)scales + j * nb * (half ? 2 : 4), half,
                                   nb, lut);
            out[i * n + j] = bias ? sum + bias[j] : sum;
        }
}

AVX512 static void dequantize_avx512(const uint8_t *q, const float *scales, const float *table, int64_t k,
                                     int64_t rows, float *out) {
    int64_t nb = k / BLOCK;
    __m512 lut = _mm512_loadu_ps(table);
    for (int64_t j = 0; j < rows; j++)
        for (int64_t b = 0; b < nb; b++) {
            __m512 w[2];
            float *o = out + j * k + b * BLOCK;
            decode_block_avx512(q + j * (k / 2) + b * BLOCK_BYTES, scales[j * nb + b], lut, w);
            _mm512_storeu_ps(o, w[0]);
            _mm512_storeu_ps(o + 16, w[1]);
        }
}
#endif

/* ---------------------------------------------------------------- entry points */

enum { CONVERTED = 4096 }; /* float16 scales converted to float32 at a time: at least a row's (k <= 131072) */

/* Rows [first, last) of the scales as float32: `scales` itself (float32), or those rows converted from float16 into
 * `buffer` (CONVERTED floats; F16C eight at a time from AVX2 on, the same values). */
static const float *float_scales(const void *scales, int half, int64_t nb, int64_t first, int64_t last,
                                 float *buffer, int level) {
    if (!half) return (const float *)scales + first * nb;
    const uint16_t *h = (const uint16_t *)scales + first * nb;
    int64_t i = 0, count = (last - first) * nb;
#ifdef CPU_X86
    if (level >= LEVEL_AVX2) i = widen_avx2(h, count, buffer);
#endif
    for (; i < count; i++) buffer[i] = half_to_float(h[i]);
    return buffer;
}

/* The rows of a range taken a run at a time: as many as CONVERTED float16 scales hold. */
static int64_t run_rows(int half, int64_t nb) { return half ? CONVERTED / nb : INT64_MAX; }

struct linear_args {
    const float *x;
    int64_t m, k;
    const uint8_t *q;
    const void *scales;
    int half; /* scales are float16 */
    const float *table, *bias;
    float *out;
    int64_t n, first; /* the first row of W a call computes */
    int level;
};

static void linear_range(const void *p, int part, int64_t first, int64_t last) {
    const struct linear_args *a = p;
    (void)part;
    first += a->first, last += a->first;
#ifdef CPU_X86
    if (a->level == LEVEL_AVX512) {
        linear_avx512(a->x, a->m, a->k, a->q, a->scales, a->half, a->table, a->bias, a->out, a->n, first, last);
        return;
    }
    if (a->level == LEVEL_AVX2) {
        linear_avx2(a->x, a->m, a->k, a->q, a->scales, a->half, a->table, a->bias, a->out, a->n, first, last);
        return;
    }
#endif
    int64_t nb = a->k / BLOCK, step = run_rows(a->half, nb);
    float buffer[CONVERTED];
    for (int64_t lo = first; lo < last; lo += min64(step, last - lo)) { /* float16 scales a run of rows at a time */
        int64_t hi = lo + min64(step, last - lo);
        const float *bias = a->bias ? a->bias + lo : NULL; /* rows from lo: W, its bias and the output columns */
        linear_c(a->x, a->m, a->k, a->q + lo * (a->k / 2), float_scales(a->scales, a->half, nb, lo, hi, buffer, a->level),
                 a->table, bias, a->out + lo, a->n, 0, hi - lo);
    }
}

/* out[i * n + j] = sum_t x[i * k + t] * W[j, t] (+ bias[j]) for rows i < m of x and first <= j < last, on
 * `threads` threads (OpenMP builds). x: m rows of k float32 (k a multiple of 32); q: n rows of k / 2 bytes;
 * scales: n rows of k / 32 float32 (float16 where `half`, k then at most 131072); table: 16 float32; bias: n or
 * NULL; scratch: m * k float32 (x reordered). */
void packed4_linear(const float *x, int64_t m, int64_t k, const uint8_t *q, const void *scales, int half,
                    const float *table, const float *bias, float *out, int64_t n, int64_t first, int64_t last,
                    int level, int threads, float *scratch) {
    if (level != LEVEL_C) { /* the vector levels read x per block as its even elements, then its odd ones */
        for (int64_t i = 0; i < m * k; i += BLOCK)
            for (int t = 0; t < BLOCK / 2; t++) {
                scratch[i + t] = x[i + 2 * t];
                scratch[i + BLOCK / 2 + t] = x[i + 2 * t + 1];
            }
        x = scratch;
    }
    struct linear_args a = {x, m, k, q, scales, half, table, bias, out, n, first, level};
    split_rows(linear_range, &a, last - first, 1, threads);
}

struct dequantize_args {
    const uint8_t *q;
    const void *scales;
    int half;
    const float *table;
    int64_t k;
    float *out;
    int level;
};

static void dequantize_range(const void *p, int part, int64_t first, int64_t last) {
    const struct dequantize_args *a = p;
    (void)part;
    int64_t nb = a->k / BLOCK, step = run_rows(a->half, nb);
    float buffer[CONVERTED];
    for (int64_t lo = first; lo < last; lo += min64(step, last - lo)) {
        int64_t rows = min64(step, last - lo);
        const float *scales = float_scales(a->scales, a->half, nb, lo, lo + rows, buffer, a->level);
        const uint8_t *q = a->q + lo * (a->k / 2);
        float *out = a->out + lo * a->k;
#ifdef CPU_X86
        if (a->level == LEVEL_AVX512)
            dequantize_avx512(q, scales, a->table, a->k, rows, out);
        else if (a->level == LEVEL_AVX2)
            dequantize_avx2(q, scales, a->table, a->k, rows, out);
        else
#endif
            dequantize_c(q, scales, a->table, a->k, rows, out);
    }
}

/* rows x k weights decoded into float32 out, on `threads` threads (OpenMP builds); scales float16 where `half` (k
 * then at most 131072). */
void packed4_dequantize(const uint8_t *q, const void *scales, int half, const float *table, int64_t k, int64_t rows,
                        float *out, int level, int threads) {
    struct dequantize_args a = {q, scales, half, table, k, out, level};
    split_rows(dequantize_range, &a, rows, 1, threads);
}
