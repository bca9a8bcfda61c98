/* MXINT8 on the CPU: the linear layer y = x . W^T + b with W held as int8 codes and E8M0 scales,
 * the dequantization of whole rows of W, and their encoding (scale rule "floor").
 *
 * A weight is code * step, step = 2**(scale - 133) (2**-6 for the element, 2**(scale-127) for the
 * block), a NaN for scale 0xFF. The product of an int8 and a power of two at least 2**-133 is exact in
 * float32 (it needs at most 8 significant bits, none below 2**-149), so each weight this file forms
 * is bit for bit the float32 weight of the reference decoder; only -128 * 2**121 overflows, to -inf,
 * as it does there. The linear layer then sums x[k] * w[k] in float32: its result differs from the
 * float64 reference only by float32 accumulation (each level sums in its own fixed order).
 *
 * Three levels, chosen by the caller from cpu_kernels_levels(): plain C, AVX2+FMA (8 lanes), AVX-512
 * (16 lanes, masked loads for ragged blocks). Each output element is computed by the same sequence
 * of operations whatever range of rows a call covers, so splitting rows over threads changes no bit.
 * Compiled without -ffast-math and with C11 (no contraction of a * b + c into an FMA in plain C).
 */
#include "common.h"
#include <math.h>
#include <stdint.h>
#include <string.h>

/* Bytes ahead in each row of W that the regular kernel asks the cache for: weights come from memory
 * faster than the hardware prefetcher alone fetches rows of a few KiB (a 0.85 B Llama's one-token forward). */
enum { PREFETCH_AHEAD = 512 };
enum { TILE_ROWS = 4 }; /* output rows (rows of W) computed together: 4 independent accumulators */

static float STEP[256];

__attribute__((constructor)) static void fill_steps(void) {
    for (int s = 0; s < 255; s++) STEP[s] = ldexpf(1.0f, s - 133);
    STEP[255] = NAN;
}

/* float32 bits to bfloat16, rounded to nearest even (NaN stays NaN: its quiet bit is above the cut). */
static inline uint16_t bf16_bits(float value) {
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    return (uint16_t)((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

/* ---------------------------------------------------------------- plain C */

static void linear_c(const float *x, int64_t m, int64_t k, const int8_t *codes, const uint8_t *scales,
                     int64_t bs, const float *bias, float *out, int64_t n, int64_t first, int64_t last) {
    int64_t nb = (k + bs - 1) / bs;
    for (int64_t j = first; j < last; j++) {
        const int8_t *q = codes + j * k;
        const uint8_t *s = scales + j * nb;
        for (int64_t i = 0; i < m; i++) {
            const float *xi = x + i * k;
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                float step = STEP[s[b]];
                for (int64_t t = b * bs, end = min64(t + bs, k); t < end; t++) acc += ((float)q[t] * step) * xi[t];
            }
            out[i * n + j] = bias ? acc + bias[j] : acc;
        }
    }
}

static void dequantize_c(const int8_t *codes, const uint8_t *scales, int64_t k, int64_t bs, int64_t rows,
                         void *out, int bf16) {
    int64_t nb = (k + bs - 1) / bs;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t b = 0; b < nb; b++) {
            float step = STEP[scales[r * nb + b]];
            for (int64_t t = r * k + b * bs, end = r * k + min64((b + 1) * bs, k); t < end; t++) {
                float w = (float)codes[t] * step;
                if (bf16) ((uint16_t *)out)[t] = bf16_bits(w);
                else ((float *)out)[t] = w;
            }
        }
}

#ifdef CPU_X86
/* ---------------------------------------------------------------- AVX2 + FMA */

AVX2 INLINE __m256 weights8(const int8_t *q, __m256 step) {
    __m256i wide = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)q));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(wide), step);
}

/* sums[r][i] = row j+r of W . row i of x, for R rows of W and MB rows of x. Tails (a block's last
 * len % 8 elements) are summed in scalar accumulators of their own, added at the end. */
AVX2 INLINE void tile_avx2(const float *x, int64_t k, const int8_t *codes, const uint8_t *scales, int64_t bs,
                           int64_t j, const int R, const int MB, float sums[TILE_ROWS][4]) {
    int64_t nb = (k + bs - 1) / bs;
    __m256 acc[TILE_ROWS][2];
    float tail[TILE_ROWS][2];
    for (int r = 0; r < R; r++)
        for (int i = 0; i < MB; i++) acc[r][i] = _mm256_setzero_ps(), tail[r][i] = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        int64_t start = b * bs, len = min64(bs, k - start), full = len & ~(int64_t)7;
        float step[TILE_ROWS];
        for (int r = 0; r < R; r++) step[r] = STEP[scales[(j + r) * nb + b]];
        for (int64_t t = start; t < start + full; t += 8) {
            __m256 xv[2];
            for (int i = 0; i < MB; i++) xv[i] = _mm256_loadu_ps(x + i * k + t);
            for (int r = 0; r < R; r++) {
                __m256 w = weights8(codes + (j + r) * k + t, _mm256_set1_ps(step[r]));
                for (int i = 0; i < MB; i++) acc[r][i] = _mm256_fmadd_ps(w, xv[i], acc[r][i]);
            }
        }
        for (int64_t t = start + full; t < start + len; t++)
            for (int r = 0; r < R; r++)
                for (int i = 0; i < MB; i++) tail[r][i] += ((float)codes[(j + r) * k + t] * step[r]) * x[i * k + t];
    }
    for (int r = 0; r < R; r++)
        for (int i = 0; i < MB; i++) sums[r][i] = sum8_avx2(acc[r][i]) + tail[r][i];
}

AVX2 INLINE void rows_avx2(const float *x, int64_t m, int64_t k, const int8_t *codes, const uint8_t *scales,
                           int64_t bs, const float *bias, float *out, int64_t n, int64_t j, const int R) {
    float sums[TILE_ROWS][4];
    for (int64_t i0 = 0; i0 < m; i0 += 2) {
        const float *xi = x + i0 * k;
        int mb = (int)min64(2, m - i0);
        if (mb == 2) tile_avx2(xi, k, codes, scales, bs, j, R, 2, sums);
        else tile_avx2(xi, k, codes, scales, bs, j, R, 1, sums);
        for (int r = 0; r < R; r++)
            for (int i = 0; i < mb; i++) out[(i0 + i) * n + j + r] = bias ? sums[r][i] + bias[j + r] : sums[r][i];
    }
}

/* The regular layout: blocks of a multiple of the vector width that tile a row exactly (as 32 | 4096).
 * No masks, and each block's products code * x summed in float32 first, then scaled by its step into
 * the row's sum: one multiply per block instead of one per weight. The step is a power of two, so this
 * regroups the reference sum without rounding it otherwise, except where code * x itself leaves
 * float32's range (inputs beyond 2**120 at the smallest steps). Each output element gets the same
 * operations whatever tile computes it, so results depend neither on threads nor on the batch.
 *
 * REGULAR_TILE(W, ATTR, LANES, R, MB) defines tile<W>_<R>x<MB>: sums[r * MB + i] = row r of W . row i of
 * x for R rows of W and MB rows of x (sizes known when compiled, so the accumulators stay in registers),
 * with W-bit vectors (256: AVX2, 8 lanes; 512: AVX-512, 16 lanes); codes_<W> decodes LANES codes,
 * sum_<W> adds a vector's lanes. */
AVX2 INLINE __m256 codes_256(const int8_t *q) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)q)));
}

#define sum_256 sum8_avx2

#define REGULAR_TILE(W, ATTR, LANES, R, MB)                                                                  \
    ATTR INLINE void tile##W##_##R##x##MB##_body(const float *x, int64_t k, const int8_t *q, const uint8_t *s, \
                                                 const int64_t bs, float *sums) {                           \
        int64_t nb = k / bs;                                                                                \
        __m##W acc[R][MB], part[R][MB];                                                                     \
        for (int r = 0; r < R; r++)                                                                         \
            for (int i = 0; i < MB; i++) acc[r][i] = _mm##W##_setzero_ps();                                 \
        for (int64_t b = 0; b < nb; b++) {                                                                  \
            const int64_t start = b * bs;                                                                   \
            for (int r = 0; r < R; r++)                                                                     \
                _mm_prefetch((const char *)(q + r * k + start) + PREFETCH_AHEAD, _MM_HINT_T0);              \
            for (int i = 0; i < MB; i++) {                                                                  \
                __m##W xv = _mm##W##_loadu_ps(x + i * k + start);                                           \
                for (int r = 0; r < R; r++) part[r][i] = _mm##W##_mul_ps(codes_##W(q + r * k + start), xv); \
            }                                                                                               \
            for (int64_t t = start + LANES; t < start + bs; t += LANES) {                                   \
                __m##W xv[MB];                                                                              \
                for (int i = 0; i < MB; i++) xv[i] = _mm##W##_loadu_ps(x + i * k + t);                      \
                for (int r = 0; r < R; r++) {                                                               \
                    __m##W w = codes_##W(q + r * k + t);                                                    \
                    for (int i = 0; i < MB; i++) part[r][i] = _mm##W##_fmadd_ps(w, xv[i], part[r][i]);     \
                }                                                                                           \
            }                                                                                               \
            for (int r = 0; r < R; r++) {                                                                   \
                __m##W step = _mm##W##_set1_ps(STEP[s[r * nb + b]]);                                        \
                for (int i = 0; i < MB; i++) acc[r][i] = _mm##W##_fmadd_ps(part[r][i], step, acc[r][i]);   \
            }                                                                                               \
        }                                                                                                   \
        for (int r = 0; r < R; r++)                                                                         \
            for (int i = 0; i < MB; i++) sums[r * MB + i] = sum_##W(acc[r][i]);                             \
    }                                                                                                       \
    ATTR static void tile##W##_##R##x##MB(const float *x, int64_t k, const int8_t *q, const uint8_t *s,      \
                                          int64_t bs, float *sums) {                                        \
        if (bs == 32) tile##W##_##R##x##MB##_body(x, k, q, s, 32, sums); /* the common block: unrolled */   \
        else tile##W##_##R##x##MB##_body(x, k, q, s, bs, sums);                                             \
    }
/* AVX2: 4 rows of W against 1 row of x, 3 against 2, 2 against 3 (what fits in 16 vector registers). */
REGULAR_TILE(256, AVX2, 8, 4, 1)
REGULAR_TILE(256, AVX2, 8, 3, 2)
REGULAR_TILE(256, AVX2, 8, 2, 3)
REGULAR_TILE(256, AVX2, 8, 1, 1)
REGULAR_TILE(256, AVX2, 8, 1, 2)
REGULAR_TILE(256, AVX2, 8, 1, 3)

typedef void (*regular_tile_fn)(const float *, int64_t, const int8_t *, const uint8_t *, int64_t, float *);

/* Output rows first .. last for all m rows of x, regular layout: rows of x three at a time, each group
 * against tiles of rows of W (wide[mb - 1], tile_rows[mb - 1] rows), the rows of W left over one at a
 * time (single[mb - 1]). */
static void linear_regular(const regular_tile_fn wide[3], const regular_tile_fn single[3], const int tile_rows[3],
                           const float *x, int64_t m, int64_t k, const int8_t *codes, const uint8_t *scales,
                           int64_t bs, const float *bias, float *out, int64_t n, int64_t first, int64_t last) {
    int64_t nb = k / bs;
    float sums[12];
    for (int64_t i0 = 0; i0 < m; i0 += 3) {
        const int mb = (int)min64(3, m - i0), R = tile_rows[mb - 1];
        for (int64_t j = first; j < last;) {
            const int take = last - j >= R ? R : 1;
            (take == R ? wide : single)[mb - 1](x + i0 * k, k, codes + j * k, scales + j * nb, bs, sums);
            for (int r = 0; r < take; r++)
                for (int i = 0; i < mb; i++)
                    out[(i0 + i) * n + j + r] = bias ? sums[r * mb + i] + bias[j + r] : sums[r * mb + i];
            j += take;
        }
    }
}

AVX2 static void linear_avx2(const float *x, int64_t m, int64_t k, const int8_t *codes, const uint8_t *scales,
                             int64_t bs, const float *bias, float *out, int64_t n, int64_t first, int64_t last) {
    if (bs % 8 == 0 && k % bs == 0) {
        static const regular_tile_fn wide[3] = {tile256_4x1, tile256_3x2, tile256_2x3};
        static const regular_tile_fn single[3] = {tile256_1x1, tile256_1x2, tile256_1x3};
        static const int tile_rows[3] = {4, 3, 2};
        linear_regular(wide, single, tile_rows, x, m, k, codes, scales, bs, bias, out, n, first, last);
        return;
    }
    int64_t j = first;
    for (; j + TILE_ROWS <= last; j += TILE_ROWS) rows_avx2(x, m, k, codes, scales, bs, bias, out, n, j, TILE_ROWS);
    for (; j < last; j++) rows_avx2(x, m, k, codes, scales, bs, bias, out, n, j, 1);
}

AVX2 static void dequantize_avx2(const int8_t *codes, const uint8_t *scales, int64_t k, int64_t bs, int64_t rows,
                                 void *out, int bf16) {
    int64_t nb = (k + bs - 1) / bs;
    const __m256i half = _mm256_set1_epi32(0x7FFF), one = _mm256_set1_epi32(1);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t b = 0; b < nb; b++) {
            int64_t start = r * k + b * bs, len = min64(bs, k - b * bs), full = len & ~(int64_t)7;
            float step = STEP[scales[r * nb + b]];
            __m256 vstep = _mm256_set1_ps(step);
            for (int64_t t = start; t < start + full; t += 8) {
                __m256 w = weights8(codes + t, vstep);
                if (!bf16) {
                    _mm256_storeu_ps((float *)out + t, w);
                    continue;
                }
                __m256i bits = _mm256_castps_si256(w);
                __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), one);
                __m256i h = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(bits, half), lsb), 16);
                __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(h, h), 0x08);
                _mm_storeu_si128((__m128i *)((uint16_t *)out + t), _mm256_castsi256_si128(packed));
            }
            for (int64_t t = start + full; t < start + len; t++) {
                float w = (float)codes[t] * step;
                if (bf16) ((uint16_t *)out)[t] = bf16_bits(w);
                else ((float *)out)[t] = w;
            }
        }
}

/* ---------------------------------------------------------------- AVX-512 */

AVX512 INLINE __mmask16 lanes(int64_t remaining) {
    return remaining >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << remaining) - 1u);
}

AVX512 INLINE __m512 weights16(const int8_t *q, __mmask16 mask, __m512 step) {
    __m512i wide = _mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(mask, q));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(wide), step);
}

/* As tile_avx2 with 16 lanes; a ragged block's last elements are masked lanes (zeros elsewhere). */
AVX512 INLINE void tile_avx512(const float *x, int64_t k, const int8_t *codes, const uint8_t *scales, int64_t bs,
                               int64_t j, const int R, const int MB, float sums[TILE_ROWS][4]) {
    int64_t nb = (k + bs - 1) / bs;
    __m512 acc[TILE_ROWS][4];
    for (int r = 0; r < R; r++)
        for (int i = 0; i < MB; i++) acc[r][i] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        int64_t start = b * bs, end = min64(start + bs, k);
        __m512 step[TILE_ROWS];
        for (int r = 0; r < R; r++) step[r] = _mm512_set1_ps(STEP[scales[(j + r) * nb + b]]);
        for (int64_t t = start; t < end; t += 16) {
            __mmask16 mask = lanes(end - t);
            __m512 xv[4];
            for (int i = 0; i < MB; i++) xv[i] = _mm512_maskz_loadu_ps(mask, x + i * k + t);
            for (int r = 0; r < R; r++) {
                __m512 w = weights16(codes + (j + r) * k + t, mask, step[r]);
                for (int i = 0; i < MB; i++) acc[r][i] = _mm512_fmadd_ps(w, xv[i], acc[r][i]);
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int i = 0; i < MB; i++) sums[r][i] = _mm512_reduce_add_ps(acc[r][i]);
}

AVX512 INLINE void rows_avx512(const float *x, int64_t m, int64_t k, const int8_t *codes, const uint8_t *scales,
                               int64_t bs, const float *bias, float *out, int64_t n, int64_t j, const int R) {
    float sums[TILE_ROWS][4];
    for (int64_t i0 = 0; i0 < m; i0 += 4) {
        const float *xi = x + i0 * k;
        int mb = (int)min64(4, m - i0);
        switch (mb) {
        case 4: tile_avx512(xi, k, codes, scales, bs, j, R, 4, sums); break;
        case 3: tile_avx512(xi, k, codes, scales, bs, j, R, 3, sums); break;
        case 2: tile_avx512(xi, k, codes, scales, bs, j, R, 2, sums); break;
        default: tile_avx512(xi, k, codes, scales, bs, j, R, 1, sums);
        }
        for (int r = 0; r < R; r++)
            for (int i = 0; i < mb; i++) out[(i0 + i) * n + j + r] = bias ? sums[r][i] + bias[j + r] : sums[r][i];
    }
}

AVX512 INLINE __m512 codes_512(const int8_t *q) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)q)));
}

AVX512 INLINE float sum_512(__m512 v) { return _mm512_reduce_add_ps(v); }

/* The regular layout (see REGULAR_TILE above) with AVX-512: 8 rows of W against 1 row of x, 6 against
 * 2, 4 against 3 (what fits in 32 vector registers). */
REGULAR_TILE(512, AVX512, 16, 8, 1)
REGULAR_TILE(512, AVX512, 16, 6, 2)
REGULAR_TILE(512, AVX512, 16, 4, 3)
REGULAR_TILE(512, AVX512, 16, 1, 1)
REGULAR_TILE(512, AVX512, 16, 1, 2)
REGULAR_TILE(512, AVX512, 16, 1, 3)

/* Output rows first .. last for all m rows of x, regular layout, AVX-512: tiles of 8 rows of W against
 * one row of x, 6 against two, 4 against three (what fits in the 32 vector registers). */
AVX512 static void linear_avx512_regular(const float *x, int64_t m, int64_t k, const int8_t *codes,
                                         const uint8_t *scales, int64_t bs, const float *bias, float *out,
                                         int64_t n, int64_t first, int64_t last) {
    static const regular_tile_fn wide[3] = {tile512_8x1, tile512_6x2, tile512_4x3};
    static const regular_tile_fn single[3] = {tile512_1x1, tile512_1x2, tile512_1x3};
    static const int tile_rows[3] = {8, 6, 4};
    linear_regular(wide, single, tile_rows, x, m, k, codes, scales, bs, bias, out, n, first, last);
}

/* Larger batches, regular layout: a GEMM of our own, so each weight is decoded into the core's caches
 * right before the multiply reads it (no float32 copy of W through memory). x^T comes packed in tiles
 * of 64 rows of x, xp[tile][t][64] (zeros past the last row). For each tile, a chunk of k (kc columns,
 * whole blocks, up to GEMM_CHUNK: the tile's chunk of xp, 1 MiB, stays in the core's second-level cache;
 * fewer, longer chunks measured faster than chunks that fit the first-level cache) and 6 rows of W: decode those 6 x kc weights (exact, as the reference decoder; the next 6 rows
 * are fetched into the cache meanwhile, else decoding waits on memory), then 24
 * accumulators (6 rows of W x 4 vectors of 16 rows of x) take one fused multiply-add per weight and row
 * of x, starting from the bias, and are scattered into out[i][j] (gathered back for the next chunk,
 * exactly). Each output is bias + x[i] . w[j] summed in the order of k in float32 fused multiply-adds. */
enum { GEMM_NR = 6, GEMM_MV = 4, GEMM_TILE_ROWS = 16 * GEMM_MV, GEMM_CHUNK = 4096 };

struct gemm_out {
    float *out;  /* row i0 of out, column j0 */
    int64_t n;   /* out's row length */
    int64_t m;   /* rows of x left from i0 (the lanes past them are masked) */
    const float *bias; /* bias + j0, or NULL */
};

#define GEMM_TILE(NR, MV)                                                                                  \
    AVX512 static void gemm_tile_##NR##x##MV(const float *xp, const float *wd, int64_t kc,                 \
                                             const struct gemm_out *o, int first_chunk) {                  \
        __m512 acc[NR][MV];                                                                                \
        __m512i rows = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, \
                                                           1, 0), _mm512_set1_epi32((int)o->n));           \
        __mmask16 live[MV];                                                                                \
        for (int v = 0; v < MV; v++) live[v] = lanes(o->m - 16 * v);                                       \
        for (int r = 0; r < NR; r++)                                                                       \
            for (int v = 0; v < MV; v++)                                                                   \
                acc[r][v] = !first_chunk                                                                   \
                    ? _mm512_mask_i32gather_ps(_mm512_setzero_ps(), live[v], rows,                         \
                                               o->out + 16 * v * o->n + r, 4)                               \
                    : o->bias ? _mm512_set1_ps(o->bias[r]) : _mm512_setzero_ps();                          \
        for (int64_t t = 0; t < kc; t++) {                                                                 \
            __m512 xv[MV];                                                                                 \
            for (int v = 0; v < MV; v++) xv[v] = _mm512_loadu_ps(xp + t * GEMM_TILE_ROWS + 16 * v);        \
            for (int r = 0; r < NR; r++) {                                                                 \
                __m512 w = _mm512_set1_ps(wd[r * kc + t]);                                                 \
                for (int v = 0; v < MV; v++) acc[r][v] = _mm512_fmadd_ps(xv[v], w, acc[r][v]);            \
            }                                                                                              \
        }                                                                                                  \
        for (int r = 0; r < NR; r++)                                                                       \
            for (int v = 0; v < MV; v++)                                                                   \
                _mm512_mask_i32scatter_ps(o->out + 16 * v * o->n + r, live[v], rows, acc[r][v], 4);        \
    }
#define GEMM_TILES(NR) GEMM_TILE(NR, 1) GEMM_TILE(NR, 2) GEMM_TILE(NR, 3) GEMM_TILE(NR, 4)
GEMM_TILES(1)
GEMM_TILES(2)
GEMM_TILES(3)
GEMM_TILES(4)
GEMM_TILES(5)
GEMM_TILES(6)

typedef void (*gemm_tile_fn)(const float *, const float *, int64_t, const struct gemm_out *, int);

/* Columns first .. last of out (rows of W) for the tiles of rows of x from tile_first up to row m_last;
 * wd: room for GEMM_NR * kc_max floats. */
AVX512 static void gemm_avx512(const float *xp, int64_t m, int64_t k, const int8_t *codes, const uint8_t *scales,
                               int64_t bs, const float *bias, float *out, int64_t n, int64_t first, int64_t last,
                               int64_t tile_first, int64_t m_last, float *wd, int64_t kc_max) {
#define ROW_OF_TILES(NR) {gemm_tile_##NR##x1, gemm_tile_##NR##x2, gemm_tile_##NR##x3, gemm_tile_##NR##x4}
    static const gemm_tile_fn tiles[GEMM_NR][GEMM_MV] = {ROW_OF_TILES(1), ROW_OF_TILES(2), ROW_OF_TILES(3),
                                                          ROW_OF_TILES(4), ROW_OF_TILES(5), ROW_OF_TILES(6)};
#undef ROW_OF_TILES
    int64_t nb = k / bs;
    for (int64_t i0 = tile_first * GEMM_TILE_ROWS; i0 < m_last; i0 += GEMM_TILE_ROWS) {
        int mv = (int)min64(GEMM_MV, (m - i0 + 15) / 16);
        const float *tile = xp + i0 * k;
        for (int64_t kc0 = 0; kc0 < k; kc0 += kc_max) {
            int64_t kc = min64(kc_max, k - kc0);
            for (int64_t j0 = first; j0 < last; j0 += GEMM_NR) {
                int nr = (int)min64(GEMM_NR, last - j0);
                for (int r = 0; r < nr; r++) {
                    const int8_t *q = codes + (j0 + r) * k + kc0;
                    const uint8_t *s = scales + (j0 + r) * nb + kc0 / bs;
                    for (int64_t t = 0; t < kc; t += bs, s++) {
                        _mm_prefetch((const char *)(q + GEMM_NR * k + t), _MM_HINT_T1); /* the next run's row */
                        __m512 step = _mm512_set1_ps(STEP[*s]);
                        for (int64_t u = t; u < t + bs; u += 16)
                            _mm512_storeu_ps(wd + r * kc + u, _mm512_mul_ps(codes_512(q + u), step));
                    }
                }
                struct gemm_out o = {out + i0 * n + j0, n, m - i0, bias ? bias + j0 : NULL};
                tiles[nr - 1][mv - 1](tile + kc0 * GEMM_TILE_ROWS, wd, kc, &o, kc0 == 0);
            }
        }
    }
}

AVX512 static void linear_avx512(const float *x, int64_t m, int64_t k, const int8_t *codes, const uint8_t *scales,
                                 int64_t bs, const float *bias, float *out, int64_t n, int64_t first, int64_t last) {
    if (bs % 16 == 0 && k % bs == 0) {
        linear_avx512_regular(x, m, k, codes, scales, bs, bias, out, n, first, last);
        return;
    }
    int64_t j = first;
    for (; j + TILE_ROWS <= last; j += TILE_ROWS) rows_avx512(x, m, k, codes, scales, bs, bias, out, n, j, TILE_ROWS);
    for (; j < last; j++) rows_avx512(x, m, k, codes, scales, bs, bias, out, n, j, 1);
}

AVX512 static void dequantize_avx512(const int8_t *codes, const uint8_t *scales, int64_t k, int64_t bs,
                                     int64_t rows, void *out, int bf16) {
    int64_t nb = (k + bs - 1) / bs;
    const __m512i half = _mm512_set1_epi32(0x7FFF), one = _mm512_set1_epi32(1);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t b = 0; b < nb; b++) {
            int64_t start = r * k + b * bs, end = r * k + min64((b + 1) * bs, k);
            __m512 step = _mm512_set1_ps(STEP[scales[r * nb + b]]);
            for (int64_t t = start; t < end; t += 16) {
                __mmask16 mask = lanes(end - t);
                __m512 w = weights16(codes + t, mask, step);
                if (!bf16) {
                    _mm512_mask_storeu_ps((float *)out + t, mask, w);
                    continue;
                }
                __m512i bits = _mm512_castps_si512(w);
                __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), one);
                __m512i h = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(bits, half), lsb), 16);
                _mm256_mask_storeu_epi16((uint16_t *)out + t, mask, _mm512_cvtepi32_epi16(h));
            }
        }
}
#endif

/* ---------------------------------------------------------------- encoding */

/* Rows of k float32 weights to int8 codes and E8M0 scales, bit for bit mase_lite.numerics.mx.mxint_encode
 * with the "floor" rule: shared exponent E = floor(log2(amax)) read from the exponent bits (frexp for a
 * subnormal amax), -127 for an all-zero block, clamped to [-127, 127]; code = x * 2**(6 - E) rounded to
 * nearest even (exact in double: one power-of-two product, then 1.5 * 2**52 added and taken away, the
 * magnitude being below 2**8), clamped to +-127; -0.0 gives code 0. A block holding NaN or Inf gets
 * codes 0 and scale 0xFF. */
void mxint8_quantize_rows(const float *w, int64_t k, int64_t bs, int64_t rows, int8_t *codes, uint8_t *scales) {
    static const double ROUNDER = 6755399441055744.0; /* 1.5 * 2**52 */
    int64_t nb = (k + bs - 1) / bs;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t b = 0; b < nb; b++) {
            int64_t start = r * k + b * bs, end = r * k + min64((b + 1) * bs, k);
            uint32_t amax = 0;
            for (int64_t t = start; t < end; t++) {
                uint32_t bits;
                memcpy(&bits, w + t, sizeof bits);
                bits &= 0x7FFFFFFFu;
                amax = bits > amax ? bits : amax;
            }
            if (amax >= 0x7F800000u) { /* Inf or NaN in the block */
                memset(codes + start, 0, (size_t)(end - start));
                scales[r * nb + b] = 0xFF;
                continue;
            }
            int shared;
            if (amax == 0) {
                shared = -127;
            } else if (amax >= 0x00800000u) {
                shared = (int)(amax >> 23) - 127;
            } else {
                float value;
                memcpy(&value, &amax, sizeof value);
                int exponent;
                frexpf(value, &exponent);
                shared = exponent - 1;
            }
            shared = shared < -127 ? -127 : shared;
            scales[r * nb + b] = (uint8_t)(shared + 127);
            double factor = ldexp(1.0, 6 - shared);
            for (int64_t t = start; t < end; t++) {
                double v = ((double)w[t] * factor + ROUNDER) - ROUNDER;
                v = v > 127.0 ? 127.0 : v < -127.0 ? -127.0 : v;
                codes[t] = (int8_t)v;
            }
        }
}

/* ---------------------------------------------------------------- entry points */

struct linear_args {
    const float *x;
    int64_t m, k;
    const int8_t *codes;
    const uint8_t *scales;
    int64_t bs;
    const float *bias;
    float *out;
    int64_t n;
    int level;
};

static void linear_range(const void *p, int part, int64_t first, int64_t last) {
    const struct linear_args *a = p;
    (void)part;
#ifdef CPU_X86
    if (a->level == LEVEL_AVX512) {
        linear_avx512(a->x, a->m, a->k, a->codes, a->scales, a->bs, a->bias, a->out, a->n, first, last);
        return;
    }
    if (a->level == LEVEL_AVX2) {
        linear_avx2(a->x, a->m, a->k, a->codes, a->scales, a->bs, a->bias, a->out, a->n, first, last);
        return;
    }
#endif
    linear_c(a->x, a->m, a->k, a->codes, a->scales, a->bs, a->bias, a->out, a->n, first, last);
}

/* out[i * n + j] = sum_t x[i * k + t] * W[j, t] (+ bias[j]) for rows i < m of x and first <= j < last,
 * on `threads` threads (OpenMP builds). x: m rows of k float32; codes: n rows of k int8; scales: n rows of
 * ceil(k / bs) uint8; bias: n or NULL. Threads take runs of 8 rows of W (the widest tile). */
void mxint8_linear_rows(const float *x, int64_t m, int64_t k, const int8_t *codes, const uint8_t *scales,
                        int64_t bs, const float *bias, float *out, int64_t n, int64_t first, int64_t last,
                        int level, int threads) {
    struct linear_args a = {x, m, k, codes + first * k, scales + first * ((k + bs - 1) / bs), bs,
                            bias ? bias + first : NULL, out + first, n, level};
    split_rows(linear_range, &a, last - first, 8, threads);
}

struct dequantize_args {
    const int8_t *codes;
    const uint8_t *scales;
    int64_t k, bs;
    void *out;
    int bf16, level;
};

static void dequantize_range(const void *p, int part, int64_t first, int64_t last) {
    const struct dequantize_args *a = p;
    (void)part;
    int64_t nb = (a->k + a->bs - 1) / a->bs;
    const int8_t *codes = a->codes + first * a->k;
    const uint8_t *scales = a->scales + first * nb;
    void *out = (char *)a->out + first * a->k * (a->bf16 ? 2 : 4);
#ifdef CPU_X86
    if (a->level == LEVEL_AVX512) {
        dequantize_avx512(codes, scales, a->k, a->bs, last - first, out, a->bf16);
        return;
    }
    if (a->level == LEVEL_AVX2) {
        dequantize_avx2(codes, scales, a->k, a->bs, last - first, out, a->bf16);
        return;
    }
#endif
    dequantize_c(codes, scales, a->k, a->bs, last - first, out, a->bf16);
}

struct gemm_args {
    struct linear_args layer; /* layer.x: x^T packed in tiles */
    float *wd;
    int by_tiles;
};

/* Columns of k per chunk: k cut into the fewest chunks of whole blocks of at most GEMM_CHUNK columns
 * (at least one block), as even as blocks allow. */
static int64_t gemm_chunk(int64_t k, int64_t bs) {
    int64_t blocks = k / bs, chunks = (k + GEMM_CHUNK - 1) / GEMM_CHUNK;
    return bs * ((blocks + chunks - 1) / chunks);
}

struct pack_args {
    const float *x;
    int64_t m, k;
    float *xp;
};

/* Columns first .. last of x^T into every tile of xp (zeros past row m). */
static void pack_range(const void *p, int part, int64_t first, int64_t last) {
    const struct pack_args *a = p;
    (void)part;
    int64_t tiles = (a->m + GEMM_TILE_ROWS - 1) / GEMM_TILE_ROWS;
    for (int64_t tile = 0; tile < tiles; tile++) {
        const float *src = a->x + tile * GEMM_TILE_ROWS * a->k;
        int rows = (int)min64(GEMM_TILE_ROWS, a->m - tile * GEMM_TILE_ROWS);
        for (int64_t t = first; t < last; t++) { /* writes in order; the tile's rows of x stay in cache */
            float *dst = a->xp + (tile * a->k + t) * GEMM_TILE_ROWS;
            for (int i = 0; i < rows; i++) dst[i] = src[i * a->k + t];
            for (int i = rows; i < GEMM_TILE_ROWS; i++) dst[i] = 0.0f;
        }
    }
}

/* A run of rows of W for every tile of x, or (by_tiles) a run of tiles of x for every row of W. */
static void gemm_range(const void *p, int part, int64_t first, int64_t last) {
#ifdef CPU_X86
    const struct gemm_args *g = p;
    const struct linear_args *a = &g->layer;
    int64_t kc_max = gemm_chunk(a->k, a->bs);
    float *wd = g->wd + (int64_t)part * GEMM_NR * kc_max;
    if (g->by_tiles)
        gemm_avx512(a->x, a->m, a->k, a->codes, a->scales, a->bs, a->bias, a->out, a->n, 0, a->n, first,
                    min64(a->m, last * GEMM_TILE_ROWS), wd, kc_max);
    else
        gemm_avx512(a->x, a->m, a->k, a->codes, a->scales, a->bs, a->bias, a->out, a->n, first, last, 0, a->m,
                    wd, kc_max);
#else
    (void)p, (void)part, (void)first, (void)last;
#endif
}

/* Floats of decoding buffer mxint8_gemm needs per thread. */
int64_t mxint8_gemm_buffer(int64_t k, int64_t bs) { return GEMM_NR * gemm_chunk(k, bs); }

/* out[i * n + j] = bias[j] + sum_t x[i, t] * W[j, t] for i < m, j < n (AVX-512, the regular layout: blocks of
 * a multiple of 16 that tile k; n * 15 < 2**31), on `threads` threads (OpenMP builds): x (m rows of k
 * floats) is packed into xp first, x^T in tiles of 64 rows ([ceil(m / 64)][k][64] floats, zeros past row
 * m), then each thread takes a run of tiles where there are as many tiles as threads, else a run of 6
 * rows of W. bias: n or NULL; wd: threads * mxint8_gemm_buffer(k, bs) floats for the decoded weights.
 * Returns 0, or -1 where it does not apply. */
int mxint8_gemm(const float *x, int64_t m, int64_t k, const int8_t *codes, const uint8_t *scales, int64_t bs,
                const float *bias, float *out, int64_t n, float *xp, float *wd, int threads) {
#ifdef CPU_X86
    if (!(cpu_levels() >> LEVEL_AVX512 & 1) || bs % 16 || k % bs || n * 15 >= (int64_t)1 << 31) return -1;
    struct pack_args packing = {x, m, k, xp};
    split_rows(pack_range, &packing, k, 16, threads);
    int64_t tiles = (m + GEMM_TILE_ROWS - 1) / GEMM_TILE_ROWS;
    struct gemm_args a = {{xp, m, k, codes, scales, bs, bias, out, n, LEVEL_AVX512}, wd, tiles >= threads};
    if (a.by_tiles) /* each thread its own tiles of x: its share of xp stays in its core's cache */
        split_rows(gemm_range, &a, tiles, 1, threads);
    else
        split_rows(gemm_range, &a, n, GEMM_NR, threads);
    return 0;
#else
    (void)x, (void)m, (void)k, (void)codes, (void)scales, (void)bs, (void)bias, (void)out, (void)n, (void)xp;
    (void)wd, (void)threads;
    return -1;
#endif
}

/* rows x k weights decoded into out, as float32 (bf16 = 0) or bfloat16 (bf16 = 1, round to nearest even),
 * on `threads` threads (OpenMP builds). */
void mxint8_dequantize_rows(const int8_t *codes, const uint8_t *scales, int64_t k, int64_t bs, int64_t rows,
                            void *out, int bf16, int level, int threads) {
    struct dequantize_args a = {codes, scales, k, bs, out, bf16, level};
    split_rows(dequantize_range, &a, rows, 1, threads);
}
