/* Packed 4-bit weights on the CPU: the linear layer y = x . W^T + b with W held as nibbles (two per byte,
 * the even element of a pair in the low nibble), one float32 scale per block of 32 elements of a row, and
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
 * Three levels, chosen by the caller from packed4_cpu_levels(): plain C, AVX2+FMA (8 lanes; the table
 * looked up by two permutes and a blend), AVX-512 (16 lanes; the table is one register, one permute per 16
 * weights). Compiled without -ffast-math and with C11 (no contraction of a * b + c into an FMA in plain C).
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define P4_X86 1
#define AVX2 __attribute__((target("avx2,fma")))
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,fma")))
#endif

enum { LEVEL_C = 0, LEVEL_AVX2 = 1, LEVEL_AVX512 = 2 };
enum { BLOCK = 32, BLOCK_BYTES = 16 };
enum { X_ROWS = 4 }; /* rows of x computed together: each decoded block of W is used for up to 4 rows */

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* Bit i set where level i runs on this CPU (the OS saving the vector registers included). */
int packed4_cpu_levels(void) {
    int levels = 1 << LEVEL_C;
#ifdef P4_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) levels |= 1 << LEVEL_AVX2;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl"))
        levels |= 1 << LEVEL_AVX512;
#endif
    return levels;
}

int packed4_cpu_openmp(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}

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

#ifdef P4_X86
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

AVX2 static float sum_avx2(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* The 16 weights of the low (even elements) or high (odd elements) nibbles of one block: two vectors of 8. */
AVX2 static inline void decode_half_avx2(__m128i nibbles, __m256 s, __m256 low, __m256 high, __m256 w[2]) {
    w[0] = _mm256_mul_ps(lookup_avx2(nibbles, low, high), s);
    w[1] = _mm256_mul_ps(lookup_avx2(_mm_srli_si128(nibbles, 8), low, high), s);
}

/* x in blocks of 32 as the 16 even elements, then the 16 odd ones: each nibble's weight meets its input
 * without interleaving the nibbles. */
AVX2 static void linear_avx2(const float *xd, int64_t m, int64_t k, const uint8_t *q, const float *scales,
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
                __m256 s = _mm256_set1_ps(scales[j * nb + b]), even[2], odd[2];
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
                float sum = sum_avx2(_mm256_add_ps(acc[r][0], acc[r][1]));
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
AVX512 static inline float dot_avx512(const float *xd, const uint8_t *row, const float *scales, int64_t nb, __m512 lut) {
    __m128i mask = _mm_set1_epi8(15);
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
        _mm_prefetch((const char *)(row + b * BLOCK_BYTES + 512), _MM_HINT_T0);
        __m128i p0 = _mm_loadu_si128((const __m128i *)(row + b * BLOCK_BYTES));
        __m128i p1 = _mm_loadu_si128((const __m128i *)(row + (b + 1) * BLOCK_BYTES));
        const float *x0 = xd + b * BLOCK;
        a0 = _mm512_fmadd_ps(weights_avx512(_mm_and_si128(p0, mask), lut, scales[b]), _mm512_loadu_ps(x0), a0);
        a1 = _mm512_fmadd_ps(weights_avx512(_mm_and_si128(_mm_srli_epi16(p0, 4), mask), lut, scales[b]),
                             _mm512_loadu_ps(x0 + 16), a1);
        a2 = _mm512_fmadd_ps(weights_avx512(_mm_and_si128(p1, mask), lut, scales[b + 1]), _mm512_loadu_ps(x0 + 32), a2);
        a3 = _mm512_fmadd_ps(weights_avx512(_mm_and_si128(_mm_srli_epi16(p1, 4), mask), lut, scales[b + 1]),
                             _mm512_loadu_ps(x0 + 48), a3);
    }
    if (b < nb) {
        __m128i p0 = _mm_loadu_si128((const __m128i *)(row + b * BLOCK_BYTES));
        a0 = _mm512_fmadd_ps(weights_avx512(_mm_and_si128(p0, mask), lut, scales[b]), _mm512_loadu_ps(xd + b * BLOCK), a0);
        a1 = _mm512_fmadd_ps(weights_avx512(_mm_and_si128(_mm_srli_epi16(p0, 4), mask), lut, scales[b]),
                             _mm512_loadu_ps(xd + b * BLOCK + 16), a1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

/* x deinterleaved per block (see linear_avx2); each row of x against each row of W by dot_avx512. */
AVX512 static void linear_avx512(const float *xd, int64_t m, int64_t k, const uint8_t *q, const float *scales,
                                 const float *table, const float *bias, float *out, int64_t n, int64_t first,
                                 int64_t last) {
    int64_t nb = k / BLOCK;
    __m512 lut = _mm512_loadu_ps(table);
    for (int64_t j = first; j < last; j++)
        for (int64_t i = 0; i < m; i++) {
            float sum = dot_avx512(xd + i * k, q + j * (k / 2), scales + j * nb, nb, lut);
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

typedef void (*rows_fn)(const void *args, int64_t first, int64_t last);

/* fn(args, first, last) on [first, last) cut into at most `threads` runs, in parallel where built with OpenMP
 * (torch's own team: the library shares the OpenMP runtime torch has loaded). */
static void split_rows(rows_fn fn, const void *args, int64_t first, int64_t last, int threads) {
    int64_t rows = last - first;
    int parts = (int)min64(threads < 1 ? 1 : threads, rows < 1 ? 1 : rows);
#ifdef _OPENMP
#pragma omp parallel for num_threads(parts) schedule(static, 1) if (parts > 1)
#endif
    for (int t = 0; t < parts; t++) fn(args, first + rows * t / parts, first + rows * (t + 1) / parts);
}

struct linear_args {
    const float *x;
    int64_t m, k;
    const uint8_t *q;
    const float *scales, *table, *bias;
    float *out;
    int64_t n;
    int level;
};

static void linear_range(const void *p, int64_t first, int64_t last) {
    const struct linear_args *a = p;
#ifdef P4_X86
    if (a->level == LEVEL_AVX512) {
        linear_avx512(a->x, a->m, a->k, a->q, a->scales, a->table, a->bias, a->out, a->n, first, last);
        return;
    }
    if (a->level == LEVEL_AVX2) {
        linear_avx2(a->x, a->m, a->k, a->q, a->scales, a->table, a->bias, a->out, a->n, first, last);
        return;
    }
#endif
    linear_c(a->x, a->m, a->k, a->q, a->scales, a->table, a->bias, a->out, a->n, first, last);
}

/* out[i * n + j] = sum_t x[i * k + t] * W[j, t] (+ bias[j]) for rows i < m of x and first <= j < last, on
 * `threads` threads (OpenMP builds). x: m rows of k float32 (k a multiple of 32); q: n rows of k / 2 bytes;
 * scales: n rows of k / 32 float32; table: 16 float32; bias: n or NULL; scratch: m * k float32 (x reordered). */
void packed4_linear(const float *x, int64_t m, int64_t k, const uint8_t *q, const float *scales,
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
    struct linear_args a = {x, m, k, q, scales, table, bias, out, n, level};
    split_rows(linear_range, &a, first, last, threads);
}

struct dequantize_args {
    const uint8_t *q;
    const float *scales, *table;
    int64_t k;
    float *out;
    int level;
};

static void dequantize_range(const void *p, int64_t first, int64_t last) {
    const struct dequantize_args *a = p;
    const uint8_t *q = a->q + first * (a->k / 2);
    const float *scales = a->scales + first * (a->k / BLOCK);
    float *out = a->out + first * a->k;
#ifdef P4_X86
    if (a->level == LEVEL_AVX512) {
        dequantize_avx512(q, scales, a->table, a->k, last - first, out);
        return;
    }
    if (a->level == LEVEL_AVX2) {
        dequantize_avx2(q, scales, a->table, a->k, last - first, out);
        return;
    }
#endif
    dequantize_c(q, scales, a->table, a->k, last - first, out);
}

/* rows x k weights decoded into float32 out, on `threads` threads (OpenMP builds). */
void packed4_dequantize(const uint8_t *q, const float *scales, const float *table, int64_t k, int64_t rows,
                        float *out, int level, int threads) {
    struct dequantize_args a = {q, scales, table, k, out, level};
    split_rows(dequantize_range, &a, 0, rows, threads);
}

/* ---------------------------------------------------------------- int8 activations (llama.cpp's way)
 *
 * x quantized per block of 32: scale amax / 127, codes round-half-even(x * (127 / amax)) in -127..127 (a block
 * holding an infinity or a NaN: codes 0, scale NaN, so the outputs it reaches are NaN), stored as
 * the block's even elements, then its odd ones (the nibbles' order). Weights as integers: itable[nibble] (the
 * table divided by a power of two the caller folds back in). A block's 32 products are summed exactly in eight
 * int32 lanes (lane i: bytes 4i..4i+3), each lane then accumulated in float32 by a fused multiply-add with the
 * two blocks' scales multiplied (block b into the (b % 4)th of four accumulators), and the accumulators and the
 * lanes summed in one fixed tree: every level computes the same integers and the same float operations in the
 * same order, so its result is bit for bit the plain C one, at any thread count (rows of W are split, never a
 * sum). Where the table is affine (itable[n] = n + c: Q4_0's -8..7) the vector levels multiply the nibbles
 * themselves, unsigned, and add c times the lane's sum of codes (computed once per x block): the same integers
 * in fewer instructions; otherwise they look the nibbles up and multiply |x| by the weight with x's sign. */

int packed4_cpu_vnni(void) {
#ifdef P4_X86
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl");
#else
    return 0;
#endif
}

/* v (|v| <= 127) to the nearest integer, ties to even: adding and subtracting 1.5 * 2**23 leaves float32 no
 * fraction bits (C11: evaluated as written), as nearbyintf would without its call. */
static inline int8_t round_even(float v) {
    const float magic = 12582912.0f;
    return (int8_t)(int)((v + magic) - magic);
}

/* xq, xs as above; corr: per block, c times each lane's sum of codes (eight int32). */
static void quantize_x(const float *x, int64_t m, int64_t k, int c, int8_t *xq, float *xs, int32_t *corr) {
    for (int64_t i = 0; i < m * k; i += BLOCK) {
        float amax = 0.0f;
        int finite = 1;
        for (int t = 0; t < BLOCK; t++) {
            float a = fabsf(x[i + t]);
            finite &= a <= FLT_MAX;
            amax = a > amax ? a : amax;
        }
        float inverse = finite && amax > 0.0f ? 127.0f / amax : 0.0f;
        int8_t *q = xq + i;
        xs[i / BLOCK] = finite ? amax / 127.0f : NAN; /* an infinite or NaN input: its outputs NaN */
        for (int t = 0; t < BLOCK / 2; t++) {
            q[t] = round_even(x[i + 2 * t] * inverse);
            q[BLOCK / 2 + t] = round_even(x[i + 2 * t + 1] * inverse);
        }
        for (int l = 0; l < 8; l++) corr[i / 4 + l] = c * (q[4 * l] + q[4 * l + 1] + q[4 * l + 2] + q[4 * l + 3]);
    }
}

static inline float sum_lanes(const float l[8]) {
    return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

enum { CHAINS = 4 };

static float dot_q8_c(const int8_t *xq, const float *xs, const uint8_t *p, const float *s, const int8_t *itable,
                      int64_t nb) {
    float acc[CHAINS][8] = {{0}};
    for (int64_t b = 0; b < nb; b++, p += BLOCK_BYTES, xq += BLOCK) {
        float d = xs[b] * s[b];
        for (int l = 0; l < 8; l++) {
            int32_t sum = 0;
            for (int e = 4 * l; e < 4 * l + 4; e++)
                sum += (e < BLOCK_BYTES ? itable[p[e] & 15] : itable[p[e - BLOCK_BYTES] >> 4]) * xq[e];
            acc[b % CHAINS][l] = fmaf((float)sum, d, acc[b % CHAINS][l]);
        }
    }
    float lanes[8];
    for (int l = 0; l < 8; l++) lanes[l] = (acc[0][l] + acc[1][l]) + (acc[2][l] + acc[3][l]);
    return sum_lanes(lanes);
}

#ifdef P4_X86
#define VNNI __attribute__((target("avx2,fma,avx512f,avx512vl,avx512vnni")))

AVX2 static inline float sum_lanes_avx2(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

AVX2 static inline __m256i madd_avx2(__m256i acc, __m256i u, __m256i v) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, v), _mm256_set1_epi16(1)));
}

VNNI static inline __m256i madd_vnni(__m256i acc, __m256i u, __m256i v) { return _mm256_dpbusd_epi32(acc, u, v); }

/* A block's nibbles, the low ones (even elements) in the low half, the high ones in the high half. */
#define NIBBLES(p) \
    _mm256_and_si256(_mm256_srlv_epi32(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(p))), shift), low4)

/* One block's eight int32 lanes: affine tables multiply the nibbles and add the correction, others look up. */
#define LANES_AFFINE(MADD, b) \
    MADD(_mm256_loadu_si256((const __m256i *)(corr + 8 * (b))), NIBBLES(p + (b) * BLOCK_BYTES), \
         _mm256_loadu_si256((const __m256i *)(xq + (b) * BLOCK)))
#define LANES_TABLE(MADD, b)                                                                     \
    ({                                                                                           \
        __m256i x_ = _mm256_loadu_si256((const __m256i *)(xq + (b) * BLOCK));                    \
        MADD(_mm256_setzero_si256(), _mm256_sign_epi8(x_, x_),                                   \
             _mm256_sign_epi8(_mm256_shuffle_epi8(lut, NIBBLES(p + (b) * BLOCK_BYTES)), x_));    \
    })

#define STEP(LANES, MADD, chain, b) \
    chain = _mm256_fmadd_ps(_mm256_cvtepi32_ps(LANES(MADD, b)), _mm256_set1_ps(xs[b] * s[b]), chain)

#define DOT_Q8(LANES, MADD)                                                                              \
    __m256i shift = _mm256_set_epi32(4, 4, 4, 4, 0, 0, 0, 0), low4 = _mm256_set1_epi8(15);              \
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                                         \
    int64_t b = 0;                                                                                     \
    for (; b + CHAINS <= nb; b += CHAINS) {                                                            \
        _mm_prefetch((const char *)(p + b * BLOCK_BYTES + 4096), _MM_HINT_T0);                         \
        STEP(LANES, MADD, a0, b);                                                                      \
        STEP(LANES, MADD, a1, b + 1);                                                                  \
        STEP(LANES, MADD, a2, b + 2);                                                                  \
        STEP(LANES, MADD, a3, b + 3);                                                                  \
    }                                                                                                  \
    if (b < nb) STEP(LANES, MADD, a0, b);                                                              \
    if (b + 1 < nb) STEP(LANES, MADD, a1, b + 1);                                                      \
    if (b + 2 < nb) STEP(LANES, MADD, a2, b + 2);                                                      \
    return sum_lanes_avx2(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));

#define DOT_FN(NAME, TARGET, LANES, MADD)                                                                  \
    TARGET static float NAME(const int8_t *xq, const float *xs, const int32_t *corr, const uint8_t *p,     \
                             const float *s, __m256i lut, int64_t nb) {                                    \
        (void)corr;                                                                                        \
        (void)lut;                                                                                         \
        DOT_Q8(LANES, MADD)                                                                                \
    }

DOT_FN(dot_affine_avx2, AVX2, LANES_AFFINE, madd_avx2)
DOT_FN(dot_table_avx2, AVX2, LANES_TABLE, madd_avx2)
DOT_FN(dot_affine_vnni, VNNI, LANES_AFFINE, madd_vnni)
DOT_FN(dot_table_vnni, VNNI, LANES_TABLE, madd_vnni)

typedef float (*dot_fn)(const int8_t *, const float *, const int32_t *, const uint8_t *, const float *, __m256i,
                        int64_t);

#define LINEAR_Q8(NAME, TARGET)                                                                                \
    TARGET static void NAME(dot_fn dot, const int8_t *xq, const float *xs, const int32_t *corr, int64_t m,    \
                            int64_t k, const uint8_t *q, const float *scales, const int8_t *itable, float unit, \
                            const float *bias, float *out, int64_t n, int64_t first, int64_t last) {          \
        int64_t nb = k / BLOCK;                                                                               \
        __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)itable));                  \
        for (int64_t j = first; j < last; j++)                                                                \
            for (int64_t i = 0; i < m; i++) {                                                                 \
                float total = dot(xq + i * k, xs + i * nb, corr + i * (k / 4), q + j * (k / 2), scales + j * nb, \
                                  lut, nb) * unit;                                                            \
                out[i * n + j] = bias ? total + bias[j] : total;                                              \
            }                                                                                                 \
    }

LINEAR_Q8(linear_q8_avx2, AVX2)
LINEAR_Q8(linear_q8_vnni, VNNI)
#endif

struct linear_q8_args {
    const int8_t *xq;
    const float *xs;
    const int32_t *corr;
    int64_t m, k;
    const uint8_t *q;
    const float *scales;
    const int8_t *itable;
    float unit;
    int affine;
    const float *bias;
    float *out;
    int64_t n;
    int level;
};

static void linear_q8_range(const void *p, int64_t first, int64_t last) {
    const struct linear_q8_args *a = p;
#ifdef P4_X86
    if (a->level == LEVEL_AVX512 && packed4_cpu_vnni()) {
        linear_q8_vnni(a->affine ? dot_affine_vnni : dot_table_vnni, a->xq, a->xs, a->corr, a->m, a->k, a->q,
                       a->scales, a->itable, a->unit, a->bias, a->out, a->n, first, last);
        return;
    }
    if (a->level >= LEVEL_AVX2) {
        linear_q8_avx2(a->affine ? dot_affine_avx2 : dot_table_avx2, a->xq, a->xs, a->corr, a->m, a->k, a->q,
                       a->scales, a->itable, a->unit, a->bias, a->out, a->n, first, last);
        return;
    }
#endif
    int64_t nb = a->k / BLOCK;
    for (int64_t j = first; j < last; j++)
        for (int64_t i = 0; i < a->m; i++) {
            float total = dot_q8_c(a->xq + i * a->k, a->xs + i * nb, a->q + j * (a->k / 2), a->scales + j * nb,
                                   a->itable, nb) * a->unit;
            a->out[i * a->n + j] = a->bias ? total + a->bias[j] : total;
        }
}

/* out as packed4_linear's, with x quantized to int8 per block (see above) and the weight table given as 16
 * integers times `unit`. scratch: 2 * m * k bytes (the codes, then m * k / 32 float32 scales and m * k / 4
 * int32 corrections). */
void packed4_linear_q8(const float *x, int64_t m, int64_t k, const uint8_t *q, const float *scales,
                       const int8_t *itable, float unit, const float *bias, float *out, int64_t n, int64_t first,
                       int64_t last, int level, int threads, void *scratch) {
    int affine = 1;
    for (int t = 1; t < 16; t++) affine &= itable[t] == itable[0] + t;
    int8_t *xq = scratch;
    float *xs = (float *)((char *)scratch + m * k);
    int32_t *corr = (int32_t *)(xs + m * k / BLOCK);
    quantize_x(x, m, k, affine ? itable[0] : 0, xq, xs, corr);
    struct linear_q8_args a = {xq, xs, corr, m, k, q, scales, itable, unit, affine, bias, out, n, level};
    split_rows(linear_q8_range, &a, first, last, threads);
}
