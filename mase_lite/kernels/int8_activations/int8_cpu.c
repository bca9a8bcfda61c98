/* Linear layers with int8 activations on the CPU (llama.cpp's way of multiplying its Q4_0 and Q8_0 weights):
 * y = x . W^T + b with x quantized per block of 32 and W one of
 *
 *   - nibbles: two 4-bit codes a byte (the even element in the low nibble), a float32 scale per block of 32 and
 *     the 16 integers a code stands for (itable, the caller's table divided by a power of two it folds back in);
 *   - codes: MXINT8, int8 codes in -127..127 with an E8M0 scale (a uint8 exponent) per block of 32.
 *
 * x's block: scale amax / 127, codes round-half-even(x * (127 / amax)) in -127..127 (a block holding an infinity
 * or a NaN: codes 0, scale NaN, so the outputs it reaches are NaN). For nibbles the codes are stored as the
 * block's even elements, then its odd ones (the nibbles' order). A block's 32 products are summed exactly in
 * eight int32 lanes (lane i: the stored bytes 4i..4i+3), each lane then accumulated in float32 by a fused
 * multiply-add with the two blocks' scales multiplied (block b into the (b % 4)th of four accumulators), and the
 * accumulators and the lanes summed in one fixed tree: every level computes the same integers and the same float
 * operations in the same order, so its result is bit for bit the plain C one, at any thread count (rows of W are
 * split, never a sum).
 *
 * How the vector levels form the integers (all exact): VNNI's vpdpbusd multiplies unsigned by signed bytes, AVX2's
 * vpmaddubsw too (pairs summed in int16, which |x| <= 127 and |w| <= 127 never overflow). An affine table
 * (itable[n] = n + c: Q4_0's -8..7) multiplies the nibbles themselves and adds c times the lane's sum of x's codes
 * (computed once per x block); MXINT8 codes under VNNI are made unsigned by flipping their sign bit (code + 128)
 * and corrected by -128 times that sum; otherwise |x| meets the weight carrying x's sign.
 *
 * Three levels, chosen by the caller from int8_cpu_levels(): plain C, AVX2 and AVX-512 (VNNI on 256-bit vectors
 * where the CPU has it, else AVX2's instructions). Compiled without -ffast-math and with C11 (no contraction).
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define I8_X86 1
#define AVX2 __attribute__((target("avx2,fma")))
#define VNNI __attribute__((target("avx2,fma,avx512f,avx512vl,avx512vnni")))
#endif

enum { LEVEL_C = 0, LEVEL_AVX2 = 1, LEVEL_AVX512 = 2 };
enum { BLOCK = 32, NIBBLE_BYTES = 16, CHAINS = 4, PREFETCH = 4096 };

int int8_cpu_levels(void) {
    int levels = 1 << LEVEL_C;
#ifdef I8_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) levels |= 1 << LEVEL_AVX2;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl"))
        levels |= 1 << LEVEL_AVX512;
#endif
    return levels;
}

int int8_cpu_vnni(void) {
#ifdef I8_X86
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl");
#else
    return 0;
#endif
}

int int8_cpu_openmp(void) {
#ifdef _OPENMP
    return 1;
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
    const void *scales; /* float32 (nibbles) or uint8 E8M0 (codes), k / 32 a row */
    const int8_t *itable; /* nibbles: the 16 integers */
    int nibbles, affine;
};

static inline float block_scale(const struct weights *w, const int64_t j, int64_t nb, int64_t b) {
    return w->nibbles ? ((const float *)w->scales)[j * nb + b] : e8m0(((const uint8_t *)w->scales)[j * nb + b]);
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

#ifdef I8_X86
/* ---------------------------------------------------------------- AVX2 and VNNI */

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
#define X(b) _mm256_loadu_si256((const __m256i *)(xq + (b) * BLOCK))
#define CORR(b) _mm256_loadu_si256((const __m256i *)(corr + 8 * (b)))
#define SIGNED(MADD, w, x_) MADD(_mm256_setzero_si256(), _mm256_sign_epi8(x_, x_), _mm256_sign_epi8(w, x_))

/* One block's eight int32 lanes for each kind of weight. */
#define LANES_AFFINE(MADD, b) MADD(CORR(b), NIBBLES(p + (b) * NIBBLE_BYTES), X(b))
#define LANES_TABLE(MADD, b) ({ __m256i x_ = X(b); SIGNED(MADD, _mm256_shuffle_epi8(lut, NIBBLES(p + (b) * NIBBLE_BYTES)), x_); })
#define LANES_CODES(MADD, b) ({ __m256i x_ = X(b); SIGNED(MADD, _mm256_loadu_si256((const __m256i *)(p + (b) * BLOCK)), x_); })
#define LANES_FLIPPED(MADD, b) \
    MADD(CORR(b), _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(p + (b) * BLOCK)), flip), X(b))

#define STEP(LANES, MADD, SCALE, chain, b) \
    chain = _mm256_fmadd_ps(_mm256_cvtepi32_ps(LANES(MADD, b)), _mm256_set1_ps(xs[b] * SCALE(b)), chain)
#define FLOAT_SCALE(b) ((const float *)s)[b]
#define E8M0_SCALE(b) e8m0(((const uint8_t *)s)[b])

#define DOT(NAME, TARGET, LANES, MADD, SCALE, BYTES)                                                       \
    TARGET static float NAME(const uint8_t *p, const void *s, const int8_t *xq, const float *xs,           \
                             const int32_t *corr, const int8_t *itable, int64_t nb) {                        \
        __m256i shift = _mm256_set_epi32(4, 4, 4, 4, 0, 0, 0, 0), low4 = _mm256_set1_epi8(15);            \
        __m256i lut = itable ? _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)itable))      \
                             : _mm256_setzero_si256();                                                    \
        __m256i flip = _mm256_set1_epi8((char)0x80);                                                       \
        (void)corr, (void)lut, (void)shift, (void)low4, (void)flip;                                        \
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                                       \
        int64_t b = 0;                                                                                   \
        for (; b + CHAINS <= nb; b += CHAINS) {                                                          \
            _mm_prefetch((const char *)(p + b * (BYTES) + PREFETCH), _MM_HINT_T0);                      \
            STEP(LANES, MADD, SCALE, a0, b);                                                             \
            STEP(LANES, MADD, SCALE, a1, b + 1);                                                         \
            STEP(LANES, MADD, SCALE, a2, b + 2);                                                         \
            STEP(LANES, MADD, SCALE, a3, b + 3);                                                         \
        }                                                                                                \
        if (b < nb) STEP(LANES, MADD, SCALE, a0, b);                                                     \
        if (b + 1 < nb) STEP(LANES, MADD, SCALE, a1, b + 1);                                             \
        if (b + 2 < nb) STEP(LANES, MADD, SCALE, a2, b + 2);                                             \
        return sum_lanes_avx2(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));              \
    }

DOT(affine_avx2, AVX2, LANES_AFFINE, madd_avx2, FLOAT_SCALE, NIBBLE_BYTES)
DOT(table_avx2, AVX2, LANES_TABLE, madd_avx2, FLOAT_SCALE, NIBBLE_BYTES)
DOT(codes_avx2, AVX2, LANES_CODES, madd_avx2, E8M0_SCALE, BLOCK)
DOT(affine_vnni, VNNI, LANES_AFFINE, madd_vnni, FLOAT_SCALE, NIBBLE_BYTES)
DOT(table_vnni, VNNI, LANES_TABLE, madd_vnni, FLOAT_SCALE, NIBBLE_BYTES)
DOT(codes_vnni, VNNI, LANES_FLIPPED, madd_vnni, E8M0_SCALE, BLOCK)

/* Vectors never cross into code built without AVX: the table goes in as bytes, the result out as a float. */
typedef float (*dot_fn)(const uint8_t *, const void *, const int8_t *, const float *, const int32_t *,
                        const int8_t *, int64_t);

static dot_fn vector_dot(const struct weights *w, int level) {
    int vnni = level == LEVEL_AVX512 && int8_cpu_vnni();
    if (!w->nibbles) return vnni ? codes_vnni : codes_avx2;
    if (w->affine) return vnni ? affine_vnni : affine_avx2;
    return vnni ? table_vnni : table_avx2;
}
#endif

/* ---------------------------------------------------------------- entry points */

enum { MAX_LAYERS = 8 };

/* Layers that share an input (a block's query, key and value projections): x is quantized once, their rows form
 * one range split over the threads. */
struct linear_args {
    int nibbles, affine;
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
    struct weights w = {a->q[l], a->scales[l], a->itable, a->nibbles, a->affine};
    const float *bias = a->bias[l];
    float *out = a->out[l];
#ifdef I8_X86
    if (a->level >= LEVEL_AVX2) {
        dot_fn dot = vector_dot(&w, a->level);
        int64_t row_bytes = w.nibbles ? k / 2 : k;
        size_t scale_bytes = w.nibbles ? sizeof(float) : 1;
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

/* The rows [first, last) of all the layers' rows in order. */
static void rows_range(const struct linear_args *a, int64_t first, int64_t last) {
    int64_t start = 0;
    for (int l = 0; l < a->count; start += a->n[l], l++) {
        int64_t lo = first > start ? first : start, hi = last < start + a->n[l] ? last : start + a->n[l];
        if (lo < hi) linear_range(a, l, lo - start, hi - start);
    }
}

static void run(struct linear_args *a, const float *x, int c, int threads, void *scratch) {
    int64_t mk = a->m * a->k, rows = 0;
    int8_t *xq = scratch;
    float *xs = (float *)((char *)scratch + mk);
    int32_t *corr = (int32_t *)(xs + mk / BLOCK);
    quantize_x(x, a->m, a->k, a->nibbles, c, xq, xs, corr);
    a->xq = xq, a->xs = xs, a->corr = corr;
    for (int l = 0; l < a->count; l++) rows += a->n[l];
    int parts = (int)(threads < 1 ? 1 : threads < rows ? threads : rows < 1 ? 1 : rows);
#ifdef _OPENMP
#pragma omp parallel for num_threads(parts) schedule(static, 1) if (parts > 1)
#endif
    for (int t = 0; t < parts; t++) rows_range(a, rows * t / parts, rows * (t + 1) / parts);
}

/* out[l][i * n[l] + j] = sum_t x[i * k + t] * W_l[j, t] (+ bias[l][j]) for the `count` layers (at most 8) that
 * share x, x quantized as above: the m rows of x (k a multiple of 32) and the n[l] rows of each W_l, on `threads`
 * threads (OpenMP builds). scratch: 2 * m * k + m * k / 8 bytes, 4-byte aligned. Nibbles: q[l] n[l] rows of
 * k / 2 bytes, scales[l] n[l] rows of k / 32 float32, itable the 16 integers of every layer, unit the power of
 * two they are multiplied by. Returns -1 (nothing done) for more than 8 layers. */
int int8_linear_nibbles(const float *x, int64_t m, int64_t k, int count, const uint8_t *const *q,
                        const float *const *scales, const float *const *bias, float *const *out, const int64_t *n,
                        const int8_t *itable, float unit, int level, int threads, void *scratch) {
    if (count < 1 || count > MAX_LAYERS) return -1;
    int affine = 1;
    for (int t = 1; t < 16; t++) affine &= itable[t] == itable[0] + t;
    struct linear_args a = {1, affine, itable, unit, count, q, (const void *const *)scales, bias, out, n,
                            0, 0, 0, m, k, level};
    run(&a, x, affine && level >= LEVEL_AVX2 ? itable[0] : 0, threads, scratch);
    return 0;
}

/* The same for MXINT8: codes[l] n[l] rows of k int8 (-127..127), scales[l] n[l] rows of k / 32 E8M0 exponents; a
 * weight is code * 2**-6 * 2**(scale - 127). */
int int8_linear_codes(const float *x, int64_t m, int64_t k, int count, const int8_t *const *codes,
                      const uint8_t *const *scales, const float *const *bias, float *const *out, const int64_t *n,
                      int level, int threads, void *scratch) {
    if (count < 1 || count > MAX_LAYERS) return -1;
    struct linear_args a = {0, 0, 0, 1.0f / 64.0f, count, (const uint8_t *const *)codes, (const void *const *)scales,
                            bias, out, n, 0, 0, 0, m, k, level};
    int flipped = level == LEVEL_AVX512 && int8_cpu_vnni();
    run(&a, x, flipped ? -128 : 0, threads, scratch);
    return 0;
}
