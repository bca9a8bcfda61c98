/* The int8-activation dot products shared by int8_linear.c (a call per layer) and decoder.c (a decoding step):
 * see int8_linear.c for what they compute and how. */
#ifndef INT8_DOT_H
#define INT8_DOT_H
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../../numerics/native/float_bits.h"
#include "common.h"

enum { BLOCK = 32, NIBBLE_BYTES = 16, CHAINS = 4, PREFETCH = 4096 };

/* v (|v| <= 127) to the nearest integer, ties to even: adding and subtracting 1.5 * 2**23 leaves float32 no
 * fraction bits (C11: evaluated as written), as nearbyintf would without its call. */
static inline int8_t round_even(float v) {
    const float magic = 12582912.0f;
    return (int8_t)(int)((v + magic) - magic);
}

/* xq, xs as above (interleaved: evens then odds); corr: per block, c times each lane's sum of codes. */
static void quantize_x(const float *x, int64_t m, int64_t k, int interleaved, int c, int8_t *xq, float *xs,
                       int32_t *corr) {
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
        xs[i / BLOCK] = finite ? amax / 127.0f : NAN;
        for (int t = 0; t < BLOCK; t++) q[t] = round_even(x[i + (interleaved ? (t % 16) * 2 + t / 16 : t)] * inverse);
        for (int l = 0; l < 8; l++) corr[i / 4 + l] = c * (q[4 * l] + q[4 * l + 1] + q[4 * l + 2] + q[4 * l + 3]);
    }
}

/* The float32 value of an E8M0 exponent: 2**(e - 127), NaN for 255. */
static inline float e8m0(uint8_t e) {
    union { uint32_t bits; float value; } v;
    v.bits = e == 0 ? 0x00400000u : e == 255 ? 0x7fc00000u : (uint32_t)e << 23;
    return v.value;
}

struct weights {
    const uint8_t *q; /* a row: k / 2 bytes of nibbles or k bytes of codes */
    const void *scales; /* float32 or float16 (nibbles) or uint8 E8M0 (codes), k / 32 a row */
    const int8_t *itable; /* nibbles: the 16 integers */
    int nibbles, affine, half; /* half: the nibbles' scales are float16 */
};

static inline float block_scale(const struct weights *w, const int64_t j, int64_t nb, int64_t b) {
    if (!w->nibbles) return e8m0(((const uint8_t *)w->scales)[j * nb + b]);
    return w->half ? half_to_float(((const uint16_t *)w->scales)[j * nb + b]) : ((const float *)w->scales)[j * nb + b];
}

static inline float sum_lanes(const float l[8]) {
    return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

/* ---------------------------------------------------------------- plain C */

static float dot_c(const struct weights *w, int64_t j, const int8_t *xq, const float *xs, int64_t k) {
    int64_t nb = k / BLOCK;
    float acc[CHAINS][8] = {{0}};
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = w->q + j * (w->nibbles ? k / 2 : k) + b * (w->nibbles ? NIBBLE_BYTES : BLOCK);
        const int8_t *x = xq + b * BLOCK;
        float d = xs[b] * block_scale(w, j, nb, b);
        for (int l = 0; l < 8; l++) {
            int32_t sum = 0;
            for (int e = 4 * l; e < 4 * l + 4; e++) {
                int weight = !w->nibbles ? (int8_t)p[e] : e < NIBBLE_BYTES ? w->itable[p[e] & 15]
                                                                        : w->itable[p[e - NIBBLE_BYTES] >> 4];
                sum += weight * x[e];
            }
            acc[b % CHAINS][l] = fmaf((float)sum, d, acc[b % CHAINS][l]);
        }
    }
    float lanes[8];
    for (int l = 0; l < 8; l++) lanes[l] = (acc[0][l] + acc[1][l]) + (acc[2][l] + acc[3][l]);
    return sum_lanes(lanes);
}

#ifdef CPU_X86
/* ---------------------------------------------------------------- AVX2 and VNNI */

AVX2 static inline __m256i madd_avx2(__m256i acc, __m256i u, __m256i v) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, v), _mm256_set1_epi16(1)));
}

VNNI static inline __m256i madd_vnni(__m256i acc, __m256i u, __m256i v) { return _mm256_dpbusd_epi32(acc, u, v); }

/* A block's nibbles, the low ones (even elements) in the low half, the high ones in the high half. */
#define NIBBLES(p) \
    _mm256_and_si256(_mm256_srlv_epi32(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(p))), shift), low4)
#define X(b) _mm256_loadu_si256((const __m256i *)(xq + (b) * BLOCK))
#define CORR(b) _mm256_loadu_si256((const __m256i *)(corr + 8 * (b)))
#define SIGNED(MADD, w, x_) MADD(_mm256_setzero_si256(), _mm256_sign_epi8(x_, x_), _mm256_sign_epi8(w, x_))

/* One block's eight int32 lanes for each kind of weight. */
#define LANES_AFFINE(MADD, b) MADD(CORR(b), NIBBLES(p + (b) * NIBBLE_BYTES), X(b))
#define LANES_TABLE(MADD, b) ({ __m256i x_ = X(b); SIGNED(MADD, _mm256_shuffle_epi8(lut, NIBBLES(p + (b) * NIBBLE_BYTES)), x_); })
#define LANES_CODES(MADD, b) ({ __m256i x_ = X(b); SIGNED(MADD, _mm256_loadu_si256((const __m256i *)(p + (b) * BLOCK)), x_); })
#define LANES_FLIPPED(MADD, b) \
    MADD(CORR(b), _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(p + (b) * BLOCK)), flip), X(b))

/* Block b into a chain, scaled by d (its x scale times its weight scale, broadcast). */
#define STEPD(LANES, MADD, chain, b, d) chain = _mm256_fmadd_ps(_mm256_cvtepi32_ps(LANES(MADD, b)), d, chain)
#define STEP(LANES, MADD, SCALE, chain, b) STEPD(LANES, MADD, chain, b, _mm256_set1_ps(xs[b] * SCALE(b)))
#define LANE(d, i) _mm256_permutevar8x32_ps(d, _mm256_set1_epi32(i))
#define FLOAT_SCALE(b) ((const float *)s)[b]
#define HALF_SCALE(b) _cvtsh_ss(((const uint16_t *)s)[b])
#define E8M0_SCALE(b) e8m0(((const uint8_t *)s)[b])
/* Eight blocks' weight scales as float32, exactly. */
#define FLOAT_SCALES(b) _mm256_loadu_ps((const float *)s + (b))
#define HALF_SCALES(b) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)s + (b))))
#define E8M0_SCALES(b) e8m0_avx2(_mm_loadl_epi64((const __m128i *)((const uint8_t *)s + (b))))

/* e8m0() of eight exponents (the low 8 bytes). */
AVX2 static inline __m256 e8m0_avx2(__m128i bytes) {
    __m256i e = _mm256_cvtepu8_epi32(bytes), bits = _mm256_slli_epi32(e, 23);
    bits = _mm256_blendv_epi8(bits, _mm256_set1_epi32(0x00400000), _mm256_cmpeq_epi32(e, _mm256_setzero_si256()));
    bits = _mm256_blendv_epi8(bits, _mm256_set1_epi32(0x7fc00000), _mm256_cmpeq_epi32(e, _mm256_set1_epi32(255)));
    return _mm256_castsi256_ps(bits);
}

/* Block b goes to chain b % 4, blocks in order: eight at a time with their eight scales multiplied in one vector
 * (the same products as one at a time), then four, then the rest one at a time. */
#define DOT(NAME, TARGET, LANES, MADD, SCALE, SCALES, BYTES)                                               \
    TARGET static float NAME(const uint8_t *p, const void *s, const int8_t *xq, const float *xs,           \
                             const int32_t *corr, const int8_t *itable, int64_t nb) {                        \
        __m256i shift = _mm256_set_epi32(4, 4, 4, 4, 0, 0, 0, 0), low4 = _mm256_set1_epi8(15);            \
        __m256i lut = itable ? _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)itable))      \
                             : _mm256_setzero_si256();                                                    \
        __m256i flip = _mm256_set1_epi8((char)0x80);                                                       \
        (void)corr, (void)lut, (void)shift, (void)low4, (void)flip;                                        \
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                                       \
        int64_t b = 0;                                                                                   \
        for (; b + 2 * CHAINS <= nb; b += 2 * CHAINS) {                                                  \
            _mm_prefetch((const char *)(p + b * (BYTES) + PREFETCH), _MM_HINT_T0);                      \
            _mm_prefetch((const char *)(p + (b + CHAINS) * (BYTES) + PREFETCH), _MM_HINT_T0);           \
            __m256 d = _mm256_mul_ps(_mm256_loadu_ps(xs + b), SCALES(b));                               \
            STEPD(LANES, MADD, a0, b, LANE(d, 0));                                                       \
            STEPD(LANES, MADD, a1, b + 1, LANE(d, 1));                                                   \
            STEPD(LANES, MADD, a2, b + 2, LANE(d, 2));                                                   \
            STEPD(LANES, MADD, a3, b + 3, LANE(d, 3));                                                   \
            STEPD(LANES, MADD, a0, b + 4, LANE(d, 4));                                                   \
            STEPD(LANES, MADD, a1, b + 5, LANE(d, 5));                                                   \
            STEPD(LANES, MADD, a2, b + 6, LANE(d, 6));                                                   \
            STEPD(LANES, MADD, a3, b + 7, LANE(d, 7));                                                   \
        }                                                                                                \
        if (b + CHAINS <= nb) {                                                                          \
            STEP(LANES, MADD, SCALE, a0, b);                                                             \
            STEP(LANES, MADD, SCALE, a1, b + 1);                                                         \
            STEP(LANES, MADD, SCALE, a2, b + 2);                                                         \
            STEP(LANES, MADD, SCALE, a3, b + 3);                                                         \
            b += CHAINS;                                                                                 \
        }                                                                                                \
        if (b < nb) STEP(LANES, MADD, SCALE, a0, b);                                                     \
        if (b + 1 < nb) STEP(LANES, MADD, SCALE, a1, b + 1);                                             \
        if (b + 2 < nb) STEP(LANES, MADD, SCALE, a2, b + 2);                                             \
        return sum8_avx2(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));              \
    }

DOT(affine_avx2, AVX2, LANES_AFFINE, madd_avx2, FLOAT_SCALE, FLOAT_SCALES, NIBBLE_BYTES)
DOT(table_avx2, AVX2, LANES_TABLE, madd_avx2, FLOAT_SCALE, FLOAT_SCALES, NIBBLE_BYTES)
DOT(affine_half_avx2, AVX2, LANES_AFFINE, madd_avx2, HALF_SCALE, HALF_SCALES, NIBBLE_BYTES)
DOT(table_half_avx2, AVX2, LANES_TABLE, madd_avx2, HALF_SCALE, HALF_SCALES, NIBBLE_BYTES)
DOT(codes_avx2, AVX2, LANES_CODES, madd_avx2, E8M0_SCALE, E8M0_SCALES, BLOCK)
DOT(affine_vnni, VNNI, LANES_AFFINE, madd_vnni, FLOAT_SCALE, FLOAT_SCALES, NIBBLE_BYTES)
DOT(table_vnni, VNNI, LANES_TABLE, madd_vnni, FLOAT_SCALE, FLOAT_SCALES, NIBBLE_BYTES)
DOT(affine_half_vnni, VNNI, LANES_AFFINE, madd_vnni, HALF_SCALE, HALF_SCALES, NIBBLE_BYTES)
DOT(table_half_vnni, VNNI, LANES_TABLE, madd_vnni, HALF_SCALE, HALF_SCALES, NIBBLE_BYTES)
DOT(codes_vnni, VNNI, LANES_FLIPPED, madd_vnni, E8M0_SCALE, E8M0_SCALES, BLOCK)

/* Vectors never cross into code built without AVX: the table goes in as bytes, the result out as a float. */
typedef float (*dot_fn)(const uint8_t *, const void *, const int8_t *, const float *, const int32_t *,
                        const int8_t *, int64_t);

static dot_fn vector_dot(const struct weights *w, int level) {
    int vnni = level == LEVEL_AVX512 && cpu_vnni();
    if (!w->nibbles) return vnni ? codes_vnni : codes_avx2;
    if (w->half && w->affine) return vnni ? affine_half_vnni : affine_half_avx2;
    if (w->half) return vnni ? table_half_vnni : table_half_avx2;
    if (w->affine) return vnni ? affine_vnni : affine_avx2;
    return vnni ? table_vnni : table_avx2;
}
#endif

/* ---------------------------------------------------------------- rows of layers */

enum { MAX_LAYERS = 8 };

/* Layers that share an input (a block's query, key and value projections): x is quantized once, their rows form
 * one range split over the threads. */
struct linear_args {
    int nibbles, affine, half;
    const int8_t *itable;
    float unit;
    int count;
    const uint8_t *const *q;
    const void *const *scales;
    const float *const *bias;
    float *const *out;
    const int64_t *n;
    const int8_t *xq;
    const float *xs;
    const int32_t *corr;
    int64_t m, k;
    int level;
};

static void linear_range(const struct linear_args *a, int l, int64_t first, int64_t last) {
    int64_t k = a->k, nb = k / BLOCK, n = a->n[l];
    struct weights w = {a->q[l], a->scales[l], a->itable, a->nibbles, a->affine, a->half};
    const float *bias = a->bias[l];
    float *out = a->out[l];
#ifdef CPU_X86
    if (a->level >= LEVEL_AVX2) {
        dot_fn dot = vector_dot(&w, a->level);
        int64_t row_bytes = w.nibbles ? k / 2 : k;
        size_t scale_bytes = !w.nibbles ? 1 : w.half ? 2 : sizeof(float);
        for (int64_t j = first; j < last; j++)
            for (int64_t i = 0; i < a->m; i++) {
                float total = dot(w.q + j * row_bytes, (const char *)w.scales + j * nb * scale_bytes, a->xq + i * k,
                                  a->xs + i * nb, a->corr + i * (k / 4), w.itable, nb) * a->unit;
                out[i * n + j] = bias ? total + bias[j] : total;
            }
        return;
    }
#endif
    for (int64_t j = first; j < last; j++)
        for (int64_t i = 0; i < a->m; i++) {
            float total = dot_c(&w, j, a->xq + i * k, a->xs + i * nb, k) * a->unit;
            out[i * n + j] = bias ? total + bias[j] : total;
        }
}

/* Whether a table of 16 integers is n + itable[0] (Q4_0's -8..7): its nibbles multiply x as they are. */
static int affine_table(const int8_t *itable) {
    int affine = 1;
    for (int t = 1; t < 16; t++) affine &= itable[t] == itable[0] + t;
    return affine;
}

/* x (a->m rows of a->k) quantized into xq, xs, corr for a's layers, with the correction their level adds: the
 * affine table's offset, or -128 for MXINT8 codes flipped unsigned under VNNI. */
static void quantize_for(struct linear_args *a, const float *x, int8_t *xq, float *xs, int32_t *corr) {
    int c = a->nibbles ? (a->affine && a->level >= LEVEL_AVX2 ? a->itable[0] : 0)
                       : (a->level == LEVEL_AVX512 && cpu_vnni() ? -128 : 0);
    quantize_x(x, a->m, a->k, a->nibbles, c, xq, xs, corr);
    a->xq = xq, a->xs = xs, a->corr = corr;
}

/* The rows [first, last) of all the layers' rows in order. */
static void rows_range(const struct linear_args *a, int64_t first, int64_t last) {
    int64_t start = 0;
    for (int l = 0; l < a->count; start += a->n[l], l++) {
        int64_t lo = first > start ? first : start, hi = last < start + a->n[l] ? last : start + a->n[l];
        if (lo < hi) linear_range(a, l, lo - start, hi - start);
    }
}

static int64_t total_rows(const struct linear_args *a) {
    int64_t rows = 0;
    for (int l = 0; l < a->count; l++) rows += a->n[l];
    return rows;
}

#endif
