/* The int8-activation products shared by int8_linear.c (a call per layer) and decoder.c (a decoding step): see
 * int8_linear.c for what they compute and how. */
#ifndef INT8_DOT_H
#define INT8_DOT_H
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../numerics/native/float_bits.h"
#include "common.h"

enum { BLOCK = 32, NIBBLE_BYTES = 16 };
enum { TILE_ROWS = 8 };                /* rows of W a tile computes together: one per lane of a vector */
enum { MOST_X_ROWS = 4 };              /* rows of x a tile takes at once (VNNI; AVX2 two) */
enum { BLOCK_RUN = 128 };              /* blocks of a tile's rows laid out (scales) and formed (weights) at a time */
enum { X_BLOCK_BYTES = 256 << 10 };    /* bytes of x's codes that the rows of W meet at a time */
enum { MAX_X_ROWS = 256 };             /* and at most so many rows of x */

/* v (|v| <= 127) to the nearest integer, ties to even: adding and subtracting 1.5 * 2**23 leaves float32 no
 * fraction bits (C11: evaluated as written), as nearbyintf would without its call. */
static inline int8_t round_even(float v) {
    const float magic = 12582912.0f;
    return (int8_t)(int)((v + magic) - magic);
}

/* Rows [first, last) of x quantized: xq, xs as int8_linear.c says, a scale per span of 32 or (K-quants) 256
 * elements (interleaved: a block's even elements, then its odd ones); corr: per block of 32, c times the sum of its
 * codes. */
static void quantize_x(const float *x, int64_t k, int64_t first, int64_t last, int interleaved, int c, int span,
                       int8_t *xq, float *xs, int32_t *corr) {
    for (int64_t i = first * k; i < last * k; i += span) {
        float amax = 0.0f;
        int finite = 1;
        for (int t = 0; t < span; t++) {
            float a = fabsf(x[i + t]);
            finite &= a <= FLT_MAX;
            amax = a > amax ? a : amax;
        }
        float inverse = finite && amax > 0.0f ? 127.0f / amax : 0.0f;
        inverse = inverse <= FLT_MAX ? inverse : 0.0f; /* amax below 127 / FLT_MAX: codes 0 */
        xs[i / span] = finite ? amax / 127.0f : NAN;
        for (int64_t b = i; b < i + span; b += BLOCK) {
            int8_t *q = xq + b;
            int32_t sum = 0;
            for (int t = 0; t < BLOCK; t++) {
                q[t] = round_even(x[b + (interleaved ? (t % 16) * 2 + t / 16 : t)] * inverse);
                sum += q[t];
            }
            corr[b / BLOCK] = c * sum;
        }
    }
}

/* The float32 value of an E8M0 exponent: 2**(e - 127), NaN for 255. */
static inline float e8m0(uint8_t e) {
    union { uint32_t bits; float value; } v;
    v.bits = e == 0 ? 0x00400000u : e == 255 ? 0x7fc00000u : (uint32_t)e << 23;
    return v.value;
}

/* Weights by rows (a row: k / 2 bytes of nibbles or k bytes of codes, then the next row; scales k / 32 a row) or tiled:
 * the rows in tiles of 8 (their count a multiple of 8), a tile's blocks in order, each block of the 8 rows as the
 * tiles of a prompt form them, transposed: vector t (32 bytes) holds bytes 4t..4t+3 of each of the 8 rows' block
 * (4 vectors of nibbles, 8 of codes), and a tile's scales 8 a block, block after block. A tile is then read in one
 * stream, and its rows' sums of a block come out one per lane: no sum across lanes. */
struct weights {
    const uint8_t *q;
    const void *scales; /* float16 (half), else float32 (nibbles) or uint8 E8M0 (codes) */
    const int8_t *itable; /* nibbles: the 16 integers */
    int nibbles, affine, half, tiled; /* half: the scales are float16 */
};

/* Where row j's scale of block b is. */
static inline int64_t scale_at(const struct weights *w, int64_t j, int64_t nb, int64_t b) {
    return w->tiled ? ((j / TILE_ROWS) * nb + b) * TILE_ROWS + j % TILE_ROWS : j * nb + b;
}

/* Byte e of row j's block b (k inputs). */
static inline uint8_t weight_byte(const struct weights *w, int64_t j, int64_t k, int64_t b, int e) {
    int64_t nb = k / BLOCK, bytes = w->nibbles ? NIBBLE_BYTES : BLOCK;
    if (!w->tiled) return w->q[(j * nb + b) * bytes + e];
    return w->q[((j / TILE_ROWS) * nb + b) * TILE_ROWS * bytes + (e / 4) * 32 + (j % TILE_ROWS) * 4 + e % 4];
}

static inline float block_scale(const struct weights *w, const int64_t j, int64_t nb, int64_t b) {
    int64_t at = scale_at(w, j, nb, b);
    if (w->half) return half_to_float(((const uint16_t *)w->scales)[at]);
    return w->nibbles ? ((const float *)w->scales)[at] : e8m0(((const uint8_t *)w->scales)[at]);
}

/* Whether the int8 products of `level` take VNNI (its unsigned-by-signed bytes): the kernels chosen and the correction
 * x's codes carry both follow it. */
static inline int vnni_at(int level) { return level == LEVEL_AVX512 && cpu_vnni(); }

/* ---------------------------------------------------------------- plain C */

/* One output: each block's 32 products summed exactly, then into one float32 chain, blocks in order. */
static float dot_c(const struct weights *w, int64_t j, const int8_t *xq, const float *xs, int64_t k) {
    int64_t nb = k / BLOCK;
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const int8_t *x = xq + b * BLOCK;
        int32_t sum = 0;
        for (int e = 0; e < BLOCK; e++) {
            int weight = !w->nibbles          ? (int8_t)weight_byte(w, j, k, b, e)
                         : e < NIBBLE_BYTES ? w->itable[weight_byte(w, j, k, b, e) & 15]
                                            : w->itable[weight_byte(w, j, k, b, e - NIBBLE_BYTES) >> 4];
            sum += weight * x[e];
        }
        acc = fmaf((float)sum, xs[b] * block_scale(w, j, nb, b), acc);
    }
    return acc;
}

#ifdef CPU_X86
/* ---------------------------------------------------------------- AVX2 and VNNI: tiles of 8 rows of W */

/* A tile: 8 rows of W (a lane each) against up to 4 rows of x. Each block of the 8 rows is formed as 32 bytes a row
 * and transposed so that vector t holds bytes 4t..4t+3 of every row; 8 products with x's 4 bytes t broadcast then sum
 * each row's 32 products exactly in its own lane, and one fused multiply-add per row of x takes the block into the 8
 * outputs' chains: the plain C operations, in its order, whatever the level, the tile or the rows it is given. */
struct tile {
    const uint8_t *q[TILE_ROWS]; /* each row's first block */
    const float *scales;        /* the rows' block scales as float32, block-major: [blocks][8] */
    const void *tiled_scales;   /* tiled weights: the tile's own scales from its first block, 8 a block */
    int scale_kind;             /* theirs: 0 float32, 1 float16, 2 E8M0 */
    const int8_t *xq;           /* the first row of x's codes; rows k bytes apart */
    const float *xs;            /* its block scales; rows nb apart */
    const int32_t *corr;        /* its corrections; rows nb apart */
    const int8_t *itable;
    int64_t k, nb, blocks;      /* blocks: how many from the first this call takes */
    int64_t ahead;              /* bytes from a row to the same row of the next tile (asked of the cache ahead) */
    float *acc;                 /* [rows of x][8]: the chains, read at the start and written at the end */
    uint8_t *packed;            /* the blocks of the 8 rows transposed: [blocks][8 vectors of 32 bytes] */
};

AVX2 INLINE __m256i madd_avx2(__m256i acc, __m256i u, __m256i v) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, v), _mm256_set1_epi16(1)));
}

VNNI INLINE __m256i madd_vnni(__m256i acc, __m256i u, __m256i v) { return _mm256_dpbusd_epi32(acc, u, v); }

/* e8m0() of eight exponents (the low 8 bytes). */
AVX2 INLINE __m256 e8m0_avx2(__m128i bytes) {
    __m256i e = _mm256_cvtepu8_epi32(bytes), bits = _mm256_slli_epi32(e, 23);
    bits = _mm256_blendv_epi8(bits, _mm256_set1_epi32(0x00400000), _mm256_cmpeq_epi32(e, _mm256_setzero_si256()));
    bits = _mm256_blendv_epi8(bits, _mm256_set1_epi32(0x7fc00000), _mm256_cmpeq_epi32(e, _mm256_set1_epi32(255)));
    return _mm256_castsi256_ps(bits);
}

/* Vectors w[0..7] (a row each, 8 dwords) as t[0..7] (dword t of every row). */
AVX2 INLINE void transpose8(const __m256i w[8], __m256i t[8]) {
    __m256i a[8], b[8];
    for (int i = 0; i < 4; i++) {
        a[2 * i] = _mm256_unpacklo_epi32(w[2 * i], w[2 * i + 1]);
        a[2 * i + 1] = _mm256_unpackhi_epi32(w[2 * i], w[2 * i + 1]);
    }
    for (int h = 0; h < 2; h++) { /* rows 0-3, then 4-7 */
        b[4 * h] = _mm256_unpacklo_epi64(a[4 * h], a[4 * h + 2]);
        b[4 * h + 1] = _mm256_unpackhi_epi64(a[4 * h], a[4 * h + 2]);
        b[4 * h + 2] = _mm256_unpacklo_epi64(a[4 * h + 1], a[4 * h + 3]);
        b[4 * h + 3] = _mm256_unpackhi_epi64(a[4 * h + 1], a[4 * h + 3]);
    }
    for (int i = 0; i < 4; i++) {
        t[i] = _mm256_permute2x128_si256(b[i], b[4 + i], 0x20);
        t[4 + i] = _mm256_permute2x128_si256(b[i], b[4 + i], 0x31);
    }
}

/* The largest of a vector's lanes (exact in any order). */
AVX2 INLINE float max8_avx2(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

/* The sum of a vector's int32 lanes. */
AVX2 INLINE int32_t sum8_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1))));
}

/* quantize_x at the vector levels, the same codes, scales and corrections: amax by max (exact in any order; its value
 * is not used where the span is not finite), the codes by cvtps (round half to even under the default rounding, as
 * round_even), a span holding an infinity or a NaN all zero, as round_even gives there. */
AVX2 static void quantize_x_avx2(const float *x, int64_t k, int64_t first, int64_t last, int interleaved, int c,
                                 int span, int8_t *xq, float *xs, int32_t *corr) {
    const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)), most = _mm256_set1_ps(FLT_MAX);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7); /* packs' dwords back in order */
    const __m256i evens_odds = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,
                                                0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    for (int64_t i = first * k; i < last * k; i += span) {
        __m256 amax = _mm256_setzero_ps(), finite = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
        for (int j = 0; j < span; j += 8) {
            __m256 a = _mm256_and_ps(_mm256_loadu_ps(x + i + j), magnitude);
            finite = _mm256_and_ps(finite, _mm256_cmp_ps(a, most, _CMP_LE_OQ));
            amax = _mm256_max_ps(amax, a);
        }
        if (_mm256_movemask_ps(finite) != 0xFF) {
            for (int64_t b = i; b < i + span; b += BLOCK) {
                _mm256_storeu_si256((__m256i *)(xq + b), _mm256_setzero_si256());
                corr[b / BLOCK] = 0;
            }
            xs[i / span] = NAN;
            continue;
        }
        float m = max8_avx2(amax);
        float scale = m > 0.0f ? 127.0f / m : 0.0f;
        __m256 inverse = _mm256_set1_ps(scale <= FLT_MAX ? scale : 0.0f); /* as quantize_x */
        xs[i / span] = m / 127.0f;
        for (int64_t b = i; b < i + span; b += BLOCK) {
            __m256i q[4];
            for (int j = 0; j < 4; j++)
                q[j] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + b + 8 * j), inverse));
            __m256i codes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
            codes = _mm256_permutevar8x32_epi32(codes, order);
            if (interleaved) /* the even elements, then the odd ones */
                codes = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(codes, evens_odds), _MM_SHUFFLE(3, 1, 2, 0));
            _mm256_storeu_si256((__m256i *)(xq + b), codes);
            __m256i sum = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
            corr[b / BLOCK] = c * sum8_epi32(sum);
        }
    }
}

/* Four bytes in every dword. */
AVX2 INLINE __m256i bytes4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, sizeof v);
    return _mm256_set1_epi32(v);
}

/* A block's nibbles, the low ones (even elements) in the low half, the high ones in the high half. */
#define NIBBLES(p) \
    _mm256_and_si256(_mm256_srlv_epi32(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(p))), shift), low4)
/* Each kind's 32 bytes of row r's block b: unsigned (the affine table's nibbles; looked-up values or MXINT8 codes
 * flipped by +128 under VNNI, x's correction taking the 128 back) or signed (AVX2's looked-up values and codes). */
#define W_AFFINE(r, b) NIBBLES(t->q[r] + (b) * NIBBLE_BYTES)
#define W_TABLE(r, b) _mm256_shuffle_epi8(lut, NIBBLES(t->q[r] + (b) * NIBBLE_BYTES))
#define W_CODES(r, b) _mm256_loadu_si256((const __m256i *)(t->q[r] + (b) * BLOCK))
#define W_FLIPPED(r, b) _mm256_xor_si256(W_CODES(r, b), flip)
#define X4(c, b, i) bytes4(t->xq + (c) * t->k + (b) * BLOCK + 4 * (i))
/* The 8 rows' exact sums of block b against row c of x: unsigned bytes meet x with its correction as the start,
 * signed ones as |w| (unsigned: -128 too) meet x carrying w's sign. */
#define ROW_SUMS(UNSIGNED, MADD, tw, c, b)                                                                          \
    ({                                                                                                              \
        __m256i part_[4] = {_mm256_set1_epi32(UNSIGNED ? t->corr[(c) * t->nb + (b)] : 0), _mm256_setzero_si256(),  \
                            _mm256_setzero_si256(), _mm256_setzero_si256()}; /* four short chains, then added */    \
        UNROLL for (int i = 0; i < 8; i++) {                                                                        \
            __m256i x_ = X4(c, b, i);                                                                               \
            part_[i % 4] = UNSIGNED ? MADD(part_[i % 4], tw[i], x_)                                                 \
                                    : MADD(part_[i % 4], _mm256_abs_epi8(tw[i]), _mm256_sign_epi8(x_, tw[i]));      \
        }                                                                                                           \
        _mm256_add_epi32(_mm256_add_epi32(part_[0], part_[1]), _mm256_add_epi32(part_[2], part_[3]));               \
    })
#define UNROLL _Pragma("GCC unroll 8")
/* What the W_ macros use: the shifts and mask of NIBBLES, the sign flip, the table (flipped for unsigned bytes). */
#define WEIGHT_CONSTANTS(UNSIGNED)                                                                                  \
    const __m256i shift = _mm256_set_epi32(4, 4, 4, 4, 0, 0, 0, 0), low4 = _mm256_set1_epi8(15);                    \
    const __m256i flip = _mm256_set1_epi8((char)0x80);                                                              \
    const __m256i table = t->itable ? _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)t->itable))      \
                                    : _mm256_setzero_si256();                                                       \
    const __m256i lut = UNSIGNED ? _mm256_xor_si256(table, flip) : table;                                           \
    (void)shift, (void)low4, (void)flip, (void)lut;

/* NAME(t): blocks [0, t->blocks) of the tile's 8 rows formed and transposed into t->packed. */
#define PACK(NAME, TARGET, WEIGHT, UNSIGNED, BYTES)                                                                 \
    TARGET static void NAME(const struct tile *t) {                                                                 \
        WEIGHT_CONSTANTS(UNSIGNED)                                                                                  \
        __m256i *packed = (__m256i *)t->packed;                                                                     \
        for (int64_t b = 0; b < t->blocks; b++) {                                                                   \
            __m256i w[TILE_ROWS];                                                                                   \
            UNROLL for (int r = 0; r < TILE_ROWS; r++) {                                                            \
                if ((b * (BYTES)) % 64 == 0) _mm_prefetch((const char *)(t->q[r] + b * (BYTES) + t->ahead), _MM_HINT_T1); \
                w[r] = WEIGHT(r, b);                                                                                \
            }                                                                                                       \
            transpose8(w, packed + TILE_ROWS * b);                                                                  \
        }                                                                                                           \
    }

/* The body of a tile's kernel: blocks [0, t->blocks) of its 8 rows against C rows of x, into t->acc; FORM(tw, AT)
 * puts block b's 8 transposed vectors in tw from AT, SCALES is its 8 scales as float32. */
#define TILE_SUMS(UNSIGNED, MADD, C, FORM, AT, SCALES)                                                              \
    __m256 acc[C];                                                                                                  \
    UNROLL for (int c = 0; c < C; c++) acc[c] = _mm256_loadu_ps(t->acc + 8 * c);                                    \
    for (int64_t b = 0; b < t->blocks; b++) {                                                                       \
        __m256i tw[TILE_ROWS];                                                                                      \
        FORM(tw, AT)                                                                                                \
        __m256 ws = SCALES;                                                                                         \
        UNROLL for (int c = 0; c < C; c++) {                                                                        \
            __m256 d = _mm256_mul_ps(_mm256_set1_ps(t->xs[c * t->nb + b]), ws);                                     \
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ROW_SUMS(UNSIGNED, MADD, tw, c, b)), d, acc[c]);            \
        }                                                                                                           \
    }                                                                                                               \
    UNROLL for (int c = 0; c < C; c++) _mm256_storeu_ps(t->acc + 8 * c, acc[c]);
#define FORM_PACKED(tw, p) UNROLL for (int i_ = 0; i_ < TILE_ROWS; i_++) tw[i_] = _mm256_load_si256((p) + i_);

/* NAME(t): blocks [0, t->blocks) of the packed 8 rows against C rows of x, into t->acc. */
#define TILE(NAME, TARGET, UNSIGNED, MADD, C)                                                                       \
    TARGET static void NAME(const struct tile *t) {                                                                 \
        TILE_SUMS(UNSIGNED, MADD, C, FORM_PACKED, (const __m256i *)t->packed + TILE_ROWS * b,                      \
                  _mm256_loadu_ps(t->scales + 8 * b))                                                               \
    }
#define TILES(NAME, TARGET, UNSIGNED, MADD)                    \
    TILE(NAME##_1, TARGET, UNSIGNED, MADD, 1)                   \
    TILE(NAME##_2, TARGET, UNSIGNED, MADD, 2)                   \
    TILE(NAME##_3, TARGET, UNSIGNED, MADD, 3)                   \
    TILE(NAME##_4, TARGET, UNSIGNED, MADD, 4)
TILES(unsigned_avx2, AVX2, 1, madd_avx2)
TILES(signed_avx2, AVX2, 0, madd_avx2)
TILES(unsigned_vnni, VNNI, 1, madd_vnni)

/* The eight vectors' lane sums, vector r's in lane r. */
AVX2 INLINE __m256i lane_sums8(const __m256i v[8]) {
    __m256i h01 = _mm256_hadd_epi32(v[0], v[1]), h23 = _mm256_hadd_epi32(v[2], v[3]);
    __m256i h45 = _mm256_hadd_epi32(v[4], v[5]), h67 = _mm256_hadd_epi32(v[6], v[7]);
    __m256i low = _mm256_hadd_epi32(h01, h23), high = _mm256_hadd_epi32(h45, h67); /* halves of rows 0-3, 4-7 */
    return _mm256_add_epi32(_mm256_permute2x128_si256(low, high, 0x20), _mm256_permute2x128_si256(low, high, 0x31));
}

/* NAME(t) for one row of x (decoding): each row's block meets x's whole block, its eight lanes then summed across
 * (exactly: the same integers as the transposed tiles' by other additions), fewer operations than a transpose. */
#define TILE1(NAME, TARGET, WEIGHT, UNSIGNED, MADD, BYTES)                                                          \
    TARGET static void NAME(const struct tile *t) {                                                                 \
        WEIGHT_CONSTANTS(UNSIGNED)                                                                                  \
        __m256 acc = _mm256_loadu_ps(t->acc);                                                                       \
        for (int64_t b = 0; b < t->blocks; b++) {                                                                   \
            __m256i x = _mm256_loadu_si256((const __m256i *)(t->xq + b * BLOCK));                                   \
            __m256i lanes[TILE_ROWS];                                                                               \
            UNROLL for (int r = 0; r < TILE_ROWS; r++) {                                                            \
                if ((b * (BYTES)) % 64 == 0) _mm_prefetch((const char *)(t->q[r] + b * (BYTES) + t->ahead), _MM_HINT_T1); \
                __m256i w = WEIGHT(r, b);                                                                           \
                lanes[r] = UNSIGNED ? MADD(_mm256_setzero_si256(), w, x)                                            \
                                    : MADD(_mm256_setzero_si256(), _mm256_abs_epi8(w), _mm256_sign_epi8(x, w));     \
            }                                                                                                       \
            __m256i sums = lane_sums8(lanes);                                                                       \
            if (UNSIGNED) sums = _mm256_add_epi32(sums, _mm256_set1_epi32(t->corr[b]));                             \
            __m256 d = _mm256_mul_ps(_mm256_set1_ps(t->xs[b]), _mm256_loadu_ps(t->scales + 8 * b));                 \
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), d, acc);                                                \
        }                                                                                                           \
        _mm256_storeu_ps(t->acc, acc);                                                                              \
    }

/* The 8 float32 scales of block b of a tile of tiled weights, exactly. */
AVX2 INLINE __m256 tiled_scale8(const struct tile *t, int64_t b) {
    if (t->scale_kind == 1) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)t->tiled_scales + 8 * b)));
    if (t->scale_kind == 2) return e8m0_avx2(_mm_loadl_epi64((const __m128i *)((const uint8_t *)t->tiled_scales + 8 * b)));
    return _mm256_loadu_ps((const float *)t->tiled_scales + 8 * b);
}

/* Tiled weights (struct weights): a tile's block read as the 8 vectors the transposed tiles hold, formed in
 * registers, then its sums against one row of x (a decoding step; more rows take TILED_PACK's blocks): the same
 * integers and float operations as the tiles of rows. */
#define FORM_NIBBLES(tw, p, MAP)                                                                                    \
    UNROLL for (int i_ = 0; i_ < 4; i_++) {                                                                         \
        __m256i v_ = _mm256_loadu_si256((const __m256i *)(p) + i_);                                                 \
        tw[i_] = MAP(_mm256_and_si256(v_, low4));                                                                   \
        tw[i_ + 4] = MAP(_mm256_and_si256(_mm256_srli_epi16(v_, 4), low4));                                         \
    }
#define AS_IS(v) (v)
#define LOOKED_UP(v) _mm256_shuffle_epi8(lut, v)
#define FORM_AFFINE(tw, p) FORM_NIBBLES(tw, p, AS_IS)
#define FORM_TABLE(tw, p) FORM_NIBBLES(tw, p, LOOKED_UP)
#define FORM_CODES(tw, p) UNROLL for (int i_ = 0; i_ < 8; i_++) tw[i_] = _mm256_loadu_si256((const __m256i *)(p) + i_);
#define FORM_FLIPPED(tw, p)                                                                                         \
    UNROLL for (int i_ = 0; i_ < 8; i_++) tw[i_] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(p) + i_), flip);
#define TILED(NAME, TARGET, FORM, UNSIGNED, MADD, BYTES)                                                            \
    TARGET static void NAME(const struct tile *t) { /* one stream, which the hardware follows: no prefetch */       \
        WEIGHT_CONSTANTS(UNSIGNED)                                                                                  \
        TILE_SUMS(UNSIGNED, MADD, 1, FORM, t->q[0] + b * TILE_ROWS * (BYTES), tiled_scale8(t, b))                  \
    }
/* NAME(t): blocks [0, t->blocks) of a tile of tiled weights formed into t->packed, and their scales as float32 into
 * t->scales: what the tiles of rows give (many rows of x then meet them there). */
#define TILED_PACK(NAME, TARGET, FORM, UNSIGNED, BYTES)                                                             \
    TARGET static void NAME(const struct tile *t) {                                                                 \
        WEIGHT_CONSTANTS(UNSIGNED)                                                                                  \
        __m256i *packed = (__m256i *)t->packed;                                                                     \
        const uint8_t *p = t->q[0];                                                                                 \
        for (int64_t b = 0; b < t->blocks; b++, p += TILE_ROWS * (BYTES)) {                                         \
            __m256i tw[TILE_ROWS];                                                                                  \
            FORM(tw, p)                                                                                             \
            UNROLL for (int i = 0; i < TILE_ROWS; i++) _mm256_store_si256(packed + TILE_ROWS * b + i, tw[i]);        \
            _mm256_storeu_ps((float *)t->scales + 8 * b, tiled_scale8(t, b));                                       \
        }                                                                                                           \
    }
/* A kind's kernels at a level: for weights in rows, one row of x and the forming of a run of blocks; for tiled ones,
 * the same two. */
#define KIND(NAME, TARGET, WEIGHT, FORM, UNSIGNED, MADD, BYTES)                                                    \
    TILE1(NAME##_row, TARGET, WEIGHT, UNSIGNED, MADD, BYTES)                                                        \
    PACK(NAME##_pack, TARGET, WEIGHT, UNSIGNED, BYTES)                                                              \
    TILED(tiled_##NAME##_1, TARGET, FORM, UNSIGNED, MADD, BYTES)                                                    \
    TILED_PACK(tiled_##NAME##_pack, TARGET, FORM, UNSIGNED, BYTES)
KIND(affine_avx2, AVX2, W_AFFINE, FORM_AFFINE, 1, madd_avx2, NIBBLE_BYTES)
KIND(table_avx2, AVX2, W_TABLE, FORM_TABLE, 0, madd_avx2, NIBBLE_BYTES)
KIND(codes_avx2, AVX2, W_CODES, FORM_CODES, 0, madd_avx2, BLOCK)
KIND(affine_vnni, VNNI, W_AFFINE, FORM_AFFINE, 1, madd_vnni, NIBBLE_BYTES)
KIND(table_vnni, VNNI, W_TABLE, FORM_TABLE, 1, madd_vnni, NIBBLE_BYTES)
KIND(codes_vnni, VNNI, W_FLIPPED, FORM_FLIPPED, 1, madd_vnni, BLOCK)


/* Blocks [b0, b0 + blocks) of the 8 rows' scales as float32, exactly, block-major ([blocks][8]): eight blocks of each
 * row converted at once and transposed, the rest one at a time. */
AVX2 static void lay_out_scales(const struct weights *w, const int64_t rows[8], int64_t nb, int64_t b0, int64_t blocks,
                                float *out) {
    int64_t b = 0;
    for (; b + 8 <= blocks; b += 8) {
        __m256i v[8], t[8];
        for (int r = 0; r < 8; r++) {
            int64_t at = rows[r] * nb + b0 + b;
            __m256 s = w->half     ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)w->scales + at)))
                       : !w->nibbles ? e8m0_avx2(_mm_loadl_epi64((const __m128i *)((const uint8_t *)w->scales + at)))
                                     : _mm256_loadu_ps((const float *)w->scales + at);
            v[r] = _mm256_castps_si256(s);
        }
        transpose8(v, t);
        for (int i = 0; i < 8; i++) _mm256_storeu_si256((__m256i *)(out + 8 * (b + i)), t[i]);
    }
    for (; b < blocks; b++)
        for (int r = 0; r < 8; r++) out[8 * b + r] = block_scale(w, rows[r], nb, b0 + b);
}

/* Vectors never cross into code built without AVX: tables and codes go in as bytes, the chains as floats. */
typedef void (*tile_fn)(const struct tile *);

/* A kind's kernels at a level: one row of x; forming the packed blocks; packed blocks against 1..4 rows of x. */
struct kernels {
    tile_fn row, pack, rows[MOST_X_ROWS];
    int widest; /* the most rows of x `rows` takes at once (AVX2's 16 vector registers: two; VNNI's 32: four) */
};

static const struct kernels *vector_kernels(const struct weights *w, int level) {
#define KERNELS(NAME, TILES, WIDEST) {NAME##_row, NAME##_pack, {TILES##_1, TILES##_2, TILES##_3, TILES##_4}, WIDEST}
#define TILED_KERNELS(NAME, TILES, WIDEST) {NAME##_1, NAME##_pack, {TILES##_1, TILES##_2, TILES##_3, TILES##_4}, WIDEST}
    static const struct kernels kernels[2][2][3] = {
        {{KERNELS(affine_avx2, unsigned_avx2, 2), KERNELS(table_avx2, signed_avx2, 2), KERNELS(codes_avx2, signed_avx2, 2)},
         {KERNELS(affine_vnni, unsigned_vnni, 4), KERNELS(table_vnni, unsigned_vnni, 4),
          KERNELS(codes_vnni, unsigned_vnni, 4)}},
        {{TILED_KERNELS(tiled_affine_avx2, unsigned_avx2, 2), TILED_KERNELS(tiled_table_avx2, signed_avx2, 2),
          TILED_KERNELS(tiled_codes_avx2, signed_avx2, 2)},
         {TILED_KERNELS(tiled_affine_vnni, unsigned_vnni, 4), TILED_KERNELS(tiled_table_vnni, unsigned_vnni, 4),
          TILED_KERNELS(tiled_codes_vnni, unsigned_vnni, 4)}}};
#undef KERNELS
#undef TILED_KERNELS
    return &kernels[w->tiled][vnni_at(level)][!w->nibbles ? 2 : w->affine ? 0 : 1];
}
#endif

/* ---------------------------------------------------------------- rows of layers */

enum { MAX_LAYERS = 8 };

/* Layers that share an input (a block's query, key and value projections): x is quantized once, their rows form
 * one range split over the threads. */
struct linear_args {
    int nibbles, affine, half, tiled; /* tiled: every layer's weights (struct weights) */
    const int *kinds; /* K-quants (kquant_dot.h): each layer's kind; NULL: nibbles or codes */
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
    const void *bands; /* K-quants: a prompt's x in pairs of bands (kquant_dot.h's struct kquant_band), or NULL */
    int64_t m, k;
    int level;
};

#include "kquant_dot.h"

#ifdef CPU_X86
/* Rows [first, last) of layer l by tiles of 8 rows of W (rows past the range repeat its last; their outputs are not
 * kept): runs of up to MAX_X_ROWS rows of x that stay in the core's cache met by every tile, each tile's blocks taken a
 * run at a time (its scales laid out, and for more than one row of x its weights formed and transposed once for all
 * the run's rows of x). */
static void linear_tiles(const struct linear_args *a, const struct weights *w, int l, int64_t first, int64_t last) {
    int64_t k = a->k, nb = k / BLOCK, n = a->n[l];
    const struct kernels *kernels = vector_kernels(w, a->level);
    int64_t row_bytes = w->nibbles ? k / 2 : k, rows_x = max64(1, min64(MAX_X_ROWS, X_BLOCK_BYTES / k));
    const float *bias = a->bias[l];
    float *out = a->out[l], scales[BLOCK_RUN * TILE_ROWS], acc[MAX_X_ROWS * TILE_ROWS];
    _Alignas(32) uint8_t packed[BLOCK_RUN * TILE_ROWS * 32];
    int64_t rows[TILE_ROWS];
    struct tile t = {.scales = scales, .scale_kind = w->half ? 1 : !w->nibbles ? 2 : 0, .itable = w->itable, .k = k,
                     .nb = nb,
                     .ahead = w->tiled ? 16 * TILE_ROWS * (row_bytes / nb) : TILE_ROWS * row_bytes, .packed = packed};
    for (int64_t i0 = 0; i0 < a->m; i0 += rows_x) {
        int64_t i_end = min64(a->m, i0 + rows_x);
        for (int64_t j = first; j < last; j += TILE_ROWS) {
            for (int r = 0; r < TILE_ROWS; r++) rows[r] = min64(j + r, last - 1);
            memset(acc, 0, (size_t)(i_end - i0) * TILE_ROWS * sizeof(float));
            for (int64_t b0 = 0; b0 < nb; b0 += BLOCK_RUN) {
                t.blocks = min64(BLOCK_RUN, nb - b0);
                if (w->tiled) { /* the tile's blocks from b0, one stream */
                    int64_t at = ((j / TILE_ROWS) * nb + b0) * TILE_ROWS;
                    t.tiled_scales = w->half     ? (const void *)((const uint16_t *)w->scales + at)
                                     : !w->nibbles ? (const void *)((const uint8_t *)w->scales + at)
                                                   : (const void *)((const float *)w->scales + at);
                    t.q[0] = w->q + at * (row_bytes / nb);
                    if (a->m > 1) kernels->pack(&t);
                } else {
                    lay_out_scales(w, rows, nb, b0, t.blocks, scales);
                    for (int r = 0; r < TILE_ROWS; r++) t.q[r] = w->q + rows[r] * row_bytes + b0 * (row_bytes / nb);
                    if (a->m > 1) kernels->pack(&t);
                }
                for (int64_t i = i0; i < i_end; i += kernels->widest) {
                    int cx = (int)min64(kernels->widest, i_end - i);
                    t.xq = a->xq + i * k + b0 * BLOCK, t.xs = a->xs + i * nb + b0, t.corr = a->corr + i * nb + b0;
                    t.acc = acc + (i - i0) * TILE_ROWS;
                    (a->m > 1 ? kernels->rows[cx - 1] : kernels->row)(&t);
                }
            }
            for (int64_t i = i0; i < i_end; i++)
                for (int r = 0; r < (int)min64(TILE_ROWS, last - j); r++) {
                    float total = acc[(i - i0) * TILE_ROWS + r] * a->unit;
                    out[i * n + j + r] = bias ? total + bias[j + r] : total;
                }
        }
    }
}
#endif

static void linear_range(const struct linear_args *a, int l, int64_t first, int64_t last) {
    if (a->kinds) {
        kquant_range(a, l, first, last);
        return;
    }
    int64_t k = a->k, nb = k / BLOCK, n = a->n[l];
    struct weights w = {a->q[l], a->scales[l], a->itable, a->nibbles, a->affine, a->half, a->tiled};
#ifdef CPU_X86
    if (a->level >= LEVEL_AVX2) {
        linear_tiles(a, &w, l, first, last);
        return;
    }
#endif
    const float *bias = a->bias[l];
    float *out = a->out[l];
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

/* The correction x's codes carry for a's kind at its level: the affine table's offset, or -128 for looked-up values
 * and MXINT8 codes flipped unsigned under VNNI; 0 for none (K-quants: kquant_x sets their own). */
static int correction(const struct linear_args *a) {
    return a->nibbles && a->affine && a->level >= LEVEL_AVX2 ? a->itable[0] : vnni_at(a->level) ? -128 : 0;
}

/* Rows [first, last) of x (a->k columns) quantized into xq, xs, corr for a's layers. */
static void quantize_rows(const struct linear_args *a, const float *x, int64_t first, int64_t last, int8_t *xq,
                          float *xs, int32_t *corr) {
#ifdef CPU_X86
    if (a->level >= LEVEL_AVX2) {
        quantize_x_avx2(x, a->k, first, last, a->nibbles, correction(a), a->kinds ? SUPER : BLOCK, xq, xs, corr);
        if (a->kinds) kquant_x_avx2(xq, corr, a->k, first, last);
        return;
    }
#endif
    quantize_x(x, a->k, first, last, a->nibbles, correction(a), a->kinds ? SUPER : BLOCK, xq, xs, corr);
    if (a->kinds) kquant_x(xq, corr, a->k, first, last);
}

/* The rows [first, last) of all the layers' rows in order. */
static void rows_range(const struct linear_args *a, int64_t first, int64_t last) {
    int64_t start = 0;
    for (int l = 0; l < a->count; start += a->n[l], l++) {
        int64_t lo = first > start ? first : start, hi = last < start + a->n[l] ? last : start + a->n[l];
        if (lo < hi) linear_range(a, l, lo - start, hi - start);
    }
}

/* The rows a split keeps together: a tile of tiled weights, a pair of paired K-quant records. */
static int64_t row_align(const struct linear_args *a) { return a->tiled ? a->kinds ? 2 : TILE_ROWS : 1; }

static int64_t total_rows(const struct linear_args *a) {
    int64_t rows = 0;
    for (int l = 0; l < a->count; l++) rows += a->n[l];
    return rows;
}

#endif
