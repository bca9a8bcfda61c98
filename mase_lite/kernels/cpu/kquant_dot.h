/* GGML's K-quants Q2_K to Q6_K against int8 activations, as llama.cpp meets them with its Q8_K: x quantized per
 * super-block of 256 (int8_dot.h's quantize_x with span 256: one scale xs a super-block), each super-block's codes then
 * transposed as the weights are, and corr holding per block of 32 the sums of its first and last 16 codes as two int16
 * halves, low and high. A row of W is its super-blocks of 256 weights, one record each (in a tiled layer, two rows'
 * records interleaved: kquant_range): GGUF's values at its bits (the layer converts,
 * kernels/kquants/records.py), the 8 blocks of 32 of a super-block laid across each vector of 32 bytes: byte-vector t
 * (t = 0..7) holds, in its lane i, codes 4t..4t+3 of block i. A record:
 *
 *   - Q4_K, 148 bytes: d, dmin (float16), the 8 blocks' scales sc, then their mins m (uint8, 0..63), then 4 vectors
 *     of 32 bytes of 4-bit codes q (0..15): vector v's low nibbles byte-vector v, its high ones byte-vector v + 4; a
 *     weight is d*sc*q - dmin*m;
 *   - Q5_K, 180 bytes: Q4_K's record of the codes' low 4 bits, then a vector of their high bits (byte-vector t's in
 *     bit t); a weight is d*sc*q - dmin*m, q = 0..31;
 *   - Q6_K, 210 bytes: d (float16), the 8 blocks' scales of their first 16 weights, then of their last 16 (int8),
 *     then 4 vectors of the codes' low 4 bits as Q4_K's, then 2 vectors of their high 2 bits (byte-vector t's in
 *     vector t % 2, bits 2(t / 2) and up: crumbs); a weight is d*sc*(u - 32), u = 0..63;
 *   - Q3_K, 114 bytes: d (float16), the halves' scales as Q6_K's (int8, -32..31), 2 vectors of the codes' low 2 bits
 *     (crumbs, as Q6_K's high ones), a vector of their third bits (as Q5_K's fifth); a weight is d*sc*(u - 4);
 *   - Q2_K, 84 bytes (GGUF's size): d, dmin (float16), each half's scale sc and min m (4 bits each, sc low) in Q6_K's
 *     order of halves, 2 vectors of the 2-bit codes q (crumbs); a weight is d*sc*q - dmin*m.
 *
 * One output is one float32 chain over the super-blocks in order. Per super-block, exactly in int32: T, each half's
 * scale times the sum of its 16 products of the unsigned codes u (a block's scale for both of its halves, Q4_K and
 * Q5_K), and P, each half's sum of x times its pair weight: its block's min (Q4_K, Q5_K), its min (Q2_K) or its scale
 * (Q6_K, Q3_K, whose T then loses the codes' offset times P). Then acc = fmaf(T, xs * d, acc), and where the kind has
 * mins acc = fmaf(-P, xs * dmin, acc); the bias is added last. Every level computes these integers (exact in any
 * order) and float operations in this order: the same bits at every level and thread count, and for a row of x
 * alone or in a batch. The vector levels: unsigned codes meet x by VNNI's vpdpbusd where the CPU has it, else AVX2's
 * vpmaddubsw; P's pairs of halves by vpdpwssd or vpmaddwd. A decoding step (one row of x) reads the records as it
 * meets them, each vector's lane a block (AFFINE_TILE, HALVES_TILE), T and P summed across the lanes. A prompt meets
 * x in bands of 8 rows (AVX2) or pairs of them (VNNI, on 512-bit vectors), each vector's lane a row of x (kquant_band),
 * against rows of W formed once per run of bands (kquant_form_row): the 4 codes of a block broadcast, each block's sum
 * scaled in int32, and the float operations once per super-block for 8 or 16 rows of x. */
#ifndef KQUANT_DOT_H
#define KQUANT_DOT_H

enum { KIND_Q4_K = 1, KIND_Q6_K = 2, KIND_Q5_K = 3, KIND_Q2_K = 4, KIND_Q3_K = 5, KINDS }; /* 0: struct weights' */
enum { SUPER = 256, Q2_K_BYTES = 84, Q3_K_BYTES = 114, Q4_K_BYTES = 148, Q5_K_BYTES = 180, Q6_K_BYTES = 210 };

static inline int64_t kquant_bytes(int kind) {
    static const int64_t bytes[KINDS] = {0, Q4_K_BYTES, Q6_K_BYTES, Q5_K_BYTES, Q2_K_BYTES, Q3_K_BYTES};
    return bytes[kind];
}

/* What a kind's codes stand for: the offset taken off them (a power of two), and whether each half of a block has
 * its scale (else each block its scale and min). */
static inline int code_offset_bits(int kind) { return kind == KIND_Q6_K ? 5 : kind == KIND_Q3_K ? 2 : 0; }
static inline int code_offset(int kind) { return code_offset_bits(kind) ? 1 << code_offset_bits(kind) : 0; }
static inline int by_halves(int kind) { return kind == KIND_Q6_K || kind == KIND_Q3_K || kind == KIND_Q2_K; }
static inline int has_mins(int kind) { return kind == KIND_Q4_K || kind == KIND_Q5_K || kind == KIND_Q2_K; }

/* Half h of block i of record r: its scale (in T) and its pair weight (in P). */
static inline int half_scale(int kind, const uint8_t *r, int i, int h) {
    if (!by_halves(kind)) return r[4 + i];
    if (kind == KIND_Q2_K) return r[4 + 8 * h + i] & 15;
    return (int8_t)r[2 + 8 * h + i];
}
static inline int half_pair(int kind, const uint8_t *r, int i, int h) {
    if (!by_halves(kind)) return r[12 + i];
    if (kind == KIND_Q2_K) return r[4 + 8 * h + i] >> 4;
    return (int8_t)r[2 + 8 * h + i];
}

static inline float half_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, sizeof h);
    return half_to_float(h);
}

/* Where code e (0..31) of block i sits in a super-block's byte-vectors (and x's codes): byte-vector e / 4, lane i. */
static inline int transposed(int i, int e) { return 32 * (e / 4) + 4 * i + e % 4; }

/* Code e of block i of record r: Q2_K 0..3, Q3_K 0..7, Q4_K 0..15, Q5_K 0..31, Q6_K 0..63. */
static inline int code_at(int kind, const uint8_t *r, int i, int e) {
    int at = transposed(i, e), t = at / 32, byte = at % 32;
    if (kind == KIND_Q2_K || kind == KIND_Q3_K) {
        int low = (r[(kind == KIND_Q2_K ? 20 : 18) + 32 * (t % 2) + byte] >> (2 * (t / 2))) & 3;
        return kind == KIND_Q3_K ? low | ((r[82 + byte] >> t) & 1) << 2 : low;
    }
    if (kind != KIND_Q6_K) {
        int low = (r[20 + 32 * (t % 4) + byte] >> (4 * (t / 4))) & 15;
        return kind == KIND_Q5_K ? low | ((r[148 + byte] >> t) & 1) << 4 : low;
    }
    int low = (r[18 + 32 * (t % 4) + byte] >> (4 * (t / 4))) & 15;
    int high = (r[146 + 32 * (t % 2) + byte] >> (2 * (t / 2))) & 3;
    return low | high << 4;
}

/* x's codes of each super-block of rows [first, last) (k a multiple of 256) in the weights' transposed order, and each
 * block's corr its halves' sums (int16, the first in the low half). */
static void kquant_x(int8_t *xq, int32_t *corr, int64_t k, int64_t first, int64_t last) {
    for (int64_t at = first * k; at < last * k; at += SUPER) {
        int8_t copy[SUPER];
        memcpy(copy, xq + at, SUPER);
        for (int i = 0; i < 8; i++) {
            int32_t half[2] = {0, 0};
            for (int e = 0; e < BLOCK; e++) {
                xq[at + transposed(i, e)] = copy[BLOCK * i + e];
                half[e / 16] += copy[BLOCK * i + e];
            }
            corr[at / BLOCK + i] = (int32_t)((uint32_t)(uint16_t)half[0] | (uint32_t)(uint16_t)half[1] << 16);
        }
    }
}

#ifdef CPU_X86
/* kquant_x at the vector levels: a super-block's 8 blocks (a vector each, in dwords of 4 codes) transposed by dwords
 * into its byte-vectors, and each block's halves summed in its lane. */
AVX2 static void kquant_x_avx2(int8_t *xq, int32_t *corr, int64_t k, int64_t first, int64_t last) {
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1), low16 = _mm256_set1_epi32(0xFFFF);
    for (int64_t at = first * k; at < last * k; at += SUPER) {
        __m256i blocks[8], vectors[8], half[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
        for (int i = 0; i < 8; i++) blocks[i] = _mm256_loadu_si256((const __m256i *)(xq + at) + i);
        transpose8(blocks, vectors);
        for (int t = 0; t < 8; t++) {
            _mm256_storeu_si256((__m256i *)(xq + at) + t, vectors[t]);
            __m256i quad = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, vectors[t]), ones16); /* each dword's sum */
            half[t / 4] = _mm256_add_epi32(half[t / 4], quad);
        }
        __m256i both = _mm256_or_si256(_mm256_and_si256(half[0], low16), _mm256_slli_epi32(half[1], 16));
        _mm256_storeu_si256((__m256i *)(corr + at / BLOCK), both);
    }
}
#endif

/* Half h (0: the first 16 codes) of a block's sums of x, from its corr. */
static inline int32_t corr_half(int32_t corr, int h) { return (int16_t)(uint16_t)((uint32_t)corr >> (16 * h)); }

/* One output in plain C: row (nsb records, stride bytes apart) against one row of x (its codes transposed, xs a
 * scale per super-block, xsum the halves' sums of each block). */
static float kquant_dot_c(int kind, const uint8_t *row, int64_t stride, const int8_t *xq, const float *xs,
                          const int32_t *xsum, int64_t nsb) {
    float acc = 0.0f;
    for (int64_t s = 0; s < nsb; s++) {
        const uint8_t *r = row + s * stride;
        const int8_t *x = xq + s * SUPER;
        int32_t total = 0, pairs = 0;
        for (int i = 0; i < 8; i++) {
            for (int h = 0; h < 2; h++) {
                int32_t sum = 0;
                for (int e = 16 * h; e < 16 * h + 16; e++) sum += code_at(kind, r, i, e) * x[transposed(i, e)];
                total += half_scale(kind, r, i, h) * sum;
                pairs += half_pair(kind, r, i, h) * corr_half(xsum[8 * s + i], h);
            }
        }
        total -= code_offset(kind) * pairs;
        acc = fmaf((float)total, xs[s] * half_at(r), acc);
        if (has_mins(kind)) acc = fmaf(-(float)pairs, xs[s] * half_at(r + 2), acc);
    }
    return acc;
}

#ifdef CPU_X86
/* What a decoding kernel takes: groups of R rows of W (nsb records each, a row's records stride bytes apart, the
 * next row's row_bytes on, the next group's advance bytes on) against one row of x, into out (plus bias, or NULL). */
struct kquant_rows {
    const uint8_t *row;
    const int8_t *xq;
    const float *xs;
    const int32_t *xsum;
    int64_t nsb, row_bytes, stride, groups, advance;
    const float *bias;
};

AVX2 INLINE float half_f16c(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, sizeof h);
    return _cvtsh_ss(h);
}

/* Eight bytes from p widened to int32 lanes, unsigned or signed. */
AVX2 INLINE __m256i bytes_u32(const uint8_t *p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)); }
AVX2 INLINE __m256i bytes_i32(const uint8_t *p) { return _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)); }

/* Record rec's half scales (first[i], second[i]: block i's halves) and pair weights (each block's two, as int16
 * halves of its lane). */
AVX2 INLINE void half_sides(int kind, const uint8_t *rec, __m256i *first, __m256i *second, __m256i *pairs) {
    if (!by_halves(kind)) {
        __m256i m = bytes_u32(rec + 12);
        *first = *second = bytes_u32(rec + 4), *pairs = _mm256_or_si256(m, _mm256_slli_epi32(m, 16));
    } else if (kind == KIND_Q2_K) {
        __m256i a = bytes_u32(rec + 4), z = bytes_u32(rec + 12), low4 = _mm256_set1_epi32(15);
        *first = _mm256_and_si256(a, low4), *second = _mm256_and_si256(z, low4);
        *pairs = _mm256_or_si256(_mm256_srli_epi32(a, 4), _mm256_slli_epi32(_mm256_srli_epi32(z, 4), 16));
    } else {
        *first = bytes_i32(rec + 2), *second = bytes_i32(rec + 10);
        *pairs = _mm256_or_si256(_mm256_and_si256(*first, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(*second, 16));
    }
}

/* A decoding step's super-block of R rows (R <= 2; records rec[r], the halves' sums sums[r][0] of the first halves,
 * [1] of the second, lane i block i) into their chains, lane r of acc: each row's T and P summed across the lanes
 * together, then the float operations of both rows at once. */
AVX2 INLINE __m128 kquant_step(int kind, int R, const uint8_t *const *rec, const __m256i (*sums)[2], __m256i corr,
                               float xs, __m128 acc) {
    __m256i total[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()}, paired[2] = {total[0], total[1]};
    int32_t sides[2] = {0, 0}; /* each row's d and dmin (float16) */
    for (int r = 0; r < R; r++) {
        __m256i first, second, pairs;
        half_sides(kind, rec[r], &first, &second, &pairs);
        total[r] = by_halves(kind) ? _mm256_add_epi32(_mm256_mullo_epi32(sums[r][0], first),
                                                      _mm256_mullo_epi32(sums[r][1], second))
                                   : _mm256_mullo_epi32(_mm256_add_epi32(sums[r][0], sums[r][1]), first);
        paired[r] = _mm256_madd_epi16(corr, pairs);
        memcpy(&sides[r], rec[r], has_mins(kind) ? 4 : 2);
    }
    /* [T0 T1 P0 P1], each the sum of its vector's lanes */
    __m256i both = _mm256_hadd_epi32(_mm256_hadd_epi32(total[0], total[1]), _mm256_hadd_epi32(paired[0], paired[1]));
    __m128i ints = _mm_add_epi32(_mm256_castsi256_si128(both), _mm256_extracti128_si256(both, 1));
    if (code_offset(kind)) /* T less the offset times P */
        ints = _mm_sub_epi32(ints, _mm_slli_epi32(_mm_unpackhi_epi64(ints, ints), code_offset_bits(kind)));
    __m128 values = _mm_cvtepi32_ps(ints);
    __m128 halves = _mm_cvtph_ps(_mm_setr_epi32(sides[0], sides[1], 0, 0)); /* d0 dmin0 d1 dmin1 */
    __m128 scales = _mm_mul_ps(_mm_shuffle_ps(halves, halves, _MM_SHUFFLE(3, 1, 2, 0)), _mm_set1_ps(xs));
    acc = _mm_fmadd_ps(values, scales, acc); /* lanes 0, 1: fmaf(T, xs * d, acc) */
    if (has_mins(kind)) acc = _mm_fnmadd_ps(_mm_movehl_ps(values, values), _mm_movehl_ps(scales, scales), acc);
    return acc;
}

#define X_VECTOR(s, vector) _mm256_loadu_si256((const __m256i *)(t->xq + (s) * SUPER) + (vector))
#define RECORD(r, s) (row + (r) * t->row_bytes + (s) * t->stride)

/* NAME##_rows(t, row): Q4_K or Q5_K (KIND), R rows of W from row against one row of x, row r's chain in lane r: each
 * vector of x's codes loaded once for the R rows. Q5_K's fifth bits: byte-vector b's bit b of their vector, moved to
 * bit 4 as Q6_K's crumbs are. */
#define AFFINE_TILE(NAME, TARGET, MADD, R, KIND)                                                                       \
    TARGET INLINE __m128 NAME##_rows(const struct kquant_rows *t, const uint8_t *row) {                                \
        const int FIFTH = KIND == KIND_Q5_K;                                                                           \
        const __m256i low4 = _mm256_set1_epi8(15), bit4 = _mm256_set1_epi8(16);                                        \
        __m128 acc = _mm_setzero_ps();                                                                                 \
        for (int64_t s = 0; s < t->nsb; s++) {                                                                         \
            __m256i sums[R][2], fifth[R];                                                                              \
            UNROLL for (int r = 0; r < R; r++) {                                                                       \
                sums[r][0] = sums[r][1] = _mm256_setzero_si256();                                                      \
                fifth[r] = FIFTH ? _mm256_loadu_si256((const __m256i *)(RECORD(r, s) + 148)) : low4;                   \
            }                                                                                                          \
            UNROLL for (int v = 0; v < 4; v++) {                                                                       \
                __m256i x_low = X_VECTOR(s, v), x_high = X_VECTOR(s, v + 4);                                           \
                UNROLL for (int r = 0; r < R; r++) {                                                                   \
                    __m256i w = _mm256_loadu_si256((const __m256i *)(RECORD(r, s) + 20) + v);                          \
                    __m256i low = _mm256_and_si256(w, low4), high = _mm256_and_si256(_mm256_srli_epi16(w, 4), low4);   \
                    if (FIFTH) { /* byte-vectors v (bit v to 4) and v + 4 (bit v + 4 to 4) */                          \
                        __m256i up = v ? _mm256_srli_epi16(fifth[r], v) : fifth[r];                                    \
                        __m256i down = _mm256_slli_epi16(fifth[r], 4 - v);                                             \
                        low = _mm256_or_si256(low, _mm256_and_si256(down, bit4));                                      \
                        high = _mm256_or_si256(high, _mm256_and_si256(up, bit4));                                      \
                    }                                                                                                  \
                    sums[r][0] = MADD(sums[r][0], low, x_low), sums[r][1] = MADD(sums[r][1], high, x_high);            \
                }                                                                                                      \
            }                                                                                                          \
            const uint8_t *rec[R];                                                                                     \
            UNROLL for (int r = 0; r < R; r++) rec[r] = RECORD(r, s);                                                  \
            __m256i corr = _mm256_loadu_si256((const __m256i *)(t->xsum + 8 * s));                                     \
            acc = kquant_step(KIND, R, rec, sums, corr, t->xs[s], acc);                                                \
        }                                                                                                              \
        return acc;                                                                                                    \
    }

/* Byte-vector b of a record's codes u, for the kinds whose blocks' halves have their scales: Q6_K's (its nibbles and
 * crumbs), Q3_K's (crumbs and third bits), Q2_K's (crumbs); each part moved to its bits as the byte's own. */
AVX2 INLINE __m256i halves_codes(int kind, const uint8_t *rec, int b) {
    int at = 2 * (b / 2); /* the byte-vector's crumbs' bit */
    if (kind == KIND_Q6_K) {
        __m256i nibbles = _mm256_loadu_si256((const __m256i *)(rec + 18) + b % 4);
        __m256i low = _mm256_and_si256(b / 4 ? _mm256_srli_epi16(nibbles, 4) : nibbles, _mm256_set1_epi8(15));
        __m256i h = _mm256_loadu_si256((const __m256i *)(rec + 146) + b % 2);
        h = at < 4 ? _mm256_slli_epi16(h, 4 - at) : at > 4 ? _mm256_srli_epi16(h, at - 4) : h;
        return _mm256_or_si256(low, _mm256_and_si256(h, _mm256_set1_epi8(0x30)));
    }
    __m256i crumbs = _mm256_loadu_si256((const __m256i *)(rec + (kind == KIND_Q2_K ? 20 : 18)) + b % 2);
    __m256i low = _mm256_and_si256(at ? _mm256_srli_epi16(crumbs, at) : crumbs, _mm256_set1_epi8(3));
    if (kind == KIND_Q2_K) return low;
    __m256i third = _mm256_loadu_si256((const __m256i *)(rec + 82));
    third = b > 2 ? _mm256_srli_epi16(third, b - 2) : b < 2 ? _mm256_slli_epi16(third, 2 - b) : third;
    return _mm256_or_si256(low, _mm256_and_si256(third, _mm256_set1_epi8(4)));
}

/* NAME##_rows(t, row): a kind whose blocks' halves have their scales (Q6_K, Q3_K, Q2_K), R rows of W against one row
 * of x, as AFFINE_TILE: byte-vectors 0-3 sum the blocks' first halves, 4-7 their second. */
#define HALVES_TILE(NAME, TARGET, MADD, R, KIND)                                                                       \
    TARGET INLINE __m128 NAME##_rows(const struct kquant_rows *t, const uint8_t *row) {                                \
        __m128 acc = _mm_setzero_ps();                                                                                 \
        for (int64_t s = 0; s < t->nsb; s++) {                                                                         \
            __m256i sums[R][2];                                                                                        \
            UNROLL for (int r = 0; r < R; r++) sums[r][0] = sums[r][1] = _mm256_setzero_si256();                       \
            UNROLL for (int b = 0; b < 8; b++) {                                                                       \
                __m256i x = X_VECTOR(s, b);                                                                            \
                UNROLL for (int r = 0; r < R; r++)                                                                     \
                    sums[r][b / 4] = MADD(sums[r][b / 4], halves_codes(KIND, RECORD(r, s), b), x);                     \
            }                                                                                                          \
            const uint8_t *rec[R];                                                                                     \
            UNROLL for (int r = 0; r < R; r++) rec[r] = RECORD(r, s);                                                  \
            __m256i corr = _mm256_loadu_si256((const __m256i *)(t->xsum + 8 * s));                                     \
            acc = kquant_step(KIND, R, rec, sums, corr, t->xs[s], acc);                                                \
        }                                                                                                              \
        return acc;                                                                                                    \
    }

/* NAME(t, out): t's groups of R rows of W, each by its tile NAME##_rows, into out (plus the bias). */
#define KQUANT_GROUPS(NAME, TARGET, R)                                                                                 \
    TARGET static void NAME(const struct kquant_rows *t, float *out) {                                                 \
        for (int64_t g = 0; g < t->groups; g++, out += R) {                                                            \
            const float *bias = t->bias ? t->bias + g * R : NULL;                                                      \
            float lanes[4];                                                                                            \
            _mm_storeu_ps(lanes, NAME##_rows(t, t->row + g * t->advance));                                             \
            UNROLL for (int r = 0; r < R; r++) out[r] = bias ? lanes[r] + bias[r] : lanes[r];                          \
        }                                                                                                              \
    }

/* A kind's decoding kernels at a level: [0] groups of one row of W, [1] of two rows. */
typedef void (*kquant_fn)(const struct kquant_rows *, float *);
#define KQUANT_SET(TILE, NAME, TARGET, MADD, KIND)                                                                     \
    TILE(NAME##_1, TARGET, MADD, 1, KIND) TILE(NAME##_2, TARGET, MADD, 2, KIND)                                        \
    KQUANT_GROUPS(NAME##_1, TARGET, 1) KQUANT_GROUPS(NAME##_2, TARGET, 2)                                              \
    static const kquant_fn NAME[2] = {NAME##_1, NAME##_2};
KQUANT_SET(AFFINE_TILE, q4_k_avx2, AVX2, madd_avx2, KIND_Q4_K)
KQUANT_SET(AFFINE_TILE, q4_k_vnni, VNNI, madd_vnni, KIND_Q4_K)
KQUANT_SET(AFFINE_TILE, q5_k_avx2, AVX2, madd_avx2, KIND_Q5_K)
KQUANT_SET(AFFINE_TILE, q5_k_vnni, VNNI, madd_vnni, KIND_Q5_K)
KQUANT_SET(HALVES_TILE, q6_k_avx2, AVX2, madd_avx2, KIND_Q6_K)
KQUANT_SET(HALVES_TILE, q6_k_vnni, VNNI, madd_vnni, KIND_Q6_K)
KQUANT_SET(HALVES_TILE, q3_k_avx2, AVX2, madd_avx2, KIND_Q3_K)
KQUANT_SET(HALVES_TILE, q3_k_vnni, VNNI, madd_vnni, KIND_Q3_K)
KQUANT_SET(HALVES_TILE, q2_k_avx2, AVX2, madd_avx2, KIND_Q2_K)
KQUANT_SET(HALVES_TILE, q2_k_vnni, VNNI, madd_vnni, KIND_Q2_K)

static const kquant_fn *kquant_kernels(int kind, int level) {
    static const kquant_fn *const sets[KINDS][2] = {
        {NULL, NULL},         {q4_k_avx2, q4_k_vnni}, {q6_k_avx2, q6_k_vnni},
        {q5_k_avx2, q5_k_vnni}, {q2_k_avx2, q2_k_vnni}, {q3_k_avx2, q3_k_vnni}};
    return sets[kind][vnni_at(level)];
}

/* Prompts. x in bands of 8 rows (rows past m zero), laid out in pairs of bands, a pair's super-block as kquant_band:
 * vector i * 8 + t holds in dword j the 4 codes of row j's byte-vector t, lane i (codes 4t..4t+3 of block i); corr[i]
 * in dword j row j's corr of block i; xs[j] row j's scale; rows 0-7 the first band's, 8-15 the second's. A band is
 * either half of each: AVX2's tiles read one band (band_view: its vectors 64 bytes apart), AVX-512's a pair. */
struct kquant_band {
    _Alignas(64) int8_t q[64][64];
    int32_t corr[8][16];
    float xs[16];
};

/* Band c of pairs, super-block 0 (the next super-block's sizeof(struct kquant_band) bytes on). */
static inline const char *band_view(const struct kquant_band *pairs, int64_t nsb, int64_t c) {
    return (const char *)(pairs + c / 2 * nsb) + 32 * (c % 2);
}

/* Pairs of bands [first, last) of x's m rows (codes transposed, k a multiple of 256) as kquant_band, nsb super-blocks
 * each. */
AVX2 static void kquant_bands(const int8_t *xq, const float *xs, const int32_t *corr, int64_t m, int64_t k,
                              int64_t first, int64_t last, struct kquant_band *pairs) {
    int64_t nsb = k / SUPER;
    for (int64_t band = 2 * first; band < 2 * last; band++)
        for (int64_t s = 0; s < nsb; s++) {
            struct kquant_band *out = pairs + band / 2 * nsb + s;
            int64_t rows = max64(0, min64(8, m - 8 * band)), lane = 8 * (band % 2); /* of its first row */
            __m256i v[8], w[8];
            float scales[8] = {0};
            for (int t = 0; t < 8; t++) {
                for (int j = 0; j < 8; j++)
                    v[j] = j < rows ? _mm256_loadu_si256((const __m256i *)(xq + (8 * band + j) * k + s * SUPER) + t)
                                    : _mm256_setzero_si256();
                transpose8(v, w);
                for (int i = 0; i < 8; i++) _mm256_store_si256((__m256i *)(out->q[8 * i + t] + 4 * lane), w[i]);
            }
            for (int j = 0; j < 8; j++) {
                v[j] = j < rows ? _mm256_loadu_si256((const __m256i *)(corr + (8 * band + j) * (k / BLOCK) + 8 * s))
                                : _mm256_setzero_si256();
                if (j < rows) scales[j] = xs[(8 * band + j) * nsb + s];
            }
            transpose8(v, w);
            for (int i = 0; i < 8; i++) _mm256_store_si256((__m256i *)(out->corr[i] + lane), w[i]);
            memcpy(out->xs + lane, scales, sizeof scales);
        }
}

/* A row of W formed for the bands, a super-block each: its byte-vectors of codes u, and per block its halves' scales
 * and its pair weights (as int16 halves), as broadcasts want them. */
struct kquant_formed {
    __m256i codes[8];
    int32_t scale[2][8], pairs[8];
    float d, dmin;
};

/* Byte-vector b of a Q4_K or Q5_K record's codes, as AFFINE_TILE forms it. */
AVX2 INLINE __m256i affine_codes(int kind, const uint8_t *rec, int b) {
    __m256i w = _mm256_loadu_si256((const __m256i *)(rec + 20) + b % 4);
    __m256i low = _mm256_and_si256(b / 4 ? _mm256_srli_epi16(w, 4) : w, _mm256_set1_epi8(15));
    if (kind != KIND_Q5_K) return low;
    __m256i fifth = _mm256_loadu_si256((const __m256i *)(rec + 148)); /* byte-vector b's bit b, to bit 4 */
    fifth = b < 4 ? _mm256_slli_epi16(fifth, 4 - b) : b > 4 ? _mm256_srli_epi16(fifth, b - 4) : fifth;
    return _mm256_or_si256(low, _mm256_and_si256(fifth, _mm256_set1_epi8(16)));
}

/* The nsb super-blocks of a row (row: its first record, the next stride bytes on) as kquant_formed. */
AVX2 static void kquant_form_row(int kind, const uint8_t *row, int64_t stride, int64_t nsb, struct kquant_formed *f) {
    for (int64_t s = 0; s < nsb; s++, f++) {
        const uint8_t *rec = row + s * stride;
        for (int b = 0; b < 8; b++)
            f->codes[b] = by_halves(kind) ? halves_codes(kind, rec, b) : affine_codes(kind, rec, b);
        __m256i first, second, pairs;
        half_sides(kind, rec, &first, &second, &pairs);
        _mm256_storeu_si256((__m256i *)f->scale[0], first), _mm256_storeu_si256((__m256i *)f->scale[1], second);
        _mm256_storeu_si256((__m256i *)f->pairs, pairs);
        f->d = half_f16c(rec), f->dmin = has_mins(kind) ? half_f16c(rec + 2) : 0.0f;
    }
}

/* A band tile's vector operations at a width (V256, AVX2's tiles: a band of 8 rows; V512, AVX-512's: a pair, 16):
 * the intrinsics' names past their prefix, and loads of a band's or pair's aligned vectors. */
#define V256(op) _mm256_##op
#define V512(op) _mm512_##op
#define LOAD256(p) _mm256_load_si256((const __m256i *)(p))
#define LOAD512(p) _mm512_load_si512((const void *)(p))

AVX2 INLINE __m256i pairs_avx2(__m256i acc, __m256i a, __m256i b) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
}
VNNI INLINE __m512i madd_vnni512(__m512i acc, __m512i u, __m512i v) { return _mm512_dpbusd_epi32(acc, u, v); }
VNNI INLINE __m512i pairs_vnni512(__m512i acc, __m512i a, __m512i b) { return _mm512_dpwssd_epi32(acc, a, b); }

/* What a band tile takes: R formed rows of W against B bands (AVX2) or pairs (AVX-512) of x (band_view; a pair's
 * view is its first band's), nsb super-blocks. */
struct kquant_band_rows {
    const struct kquant_formed *rows[4];
    const char *bands[2];
    int64_t nsb;
};

/* A band tile's blocks two at a time: unrolled over all 8, GCC moved every block's scaling after the last block's
 * products and kept the 64 sums on the stack (Q5_K 2816 x 1024, 512 rows of x: 125 GMAC/s against 142, Q6_K 107
 * against 138; one thread, VNNI; AVX2 62 against 70). */
#define BLOCK_PAIRS _Pragma("GCC unroll 2")

/* NAME(t, out): R formed rows of KIND against B bands or pairs of x (LANES rows each, vectors of type I and F, V's
 * operations) into out[(r * B + c) * LANES + j] (row j of band or pair c): per block, each half's products (or the
 * block's, where both halves share its scale) summed in int32 and scaled into T; per super-block, P by pairs of
 * halves, then the float operations for the LANES rows at once. A row's lane does the same operations at either
 * width: the same bits. */
#define BAND_TILE(NAME, TARGET, V, I, F, LOAD, MADD, PAIRS, R, B, KIND)                                               \
    TARGET static void NAME(const struct kquant_band_rows *t, float *out) {                                            \
        enum { LANES = sizeof(F) / sizeof(float) };                                                                    \
        F acc[R][B];                                                                                                   \
        UNROLL for (int r = 0; r < R; r++) UNROLL for (int c = 0; c < B; c++) acc[r][c] = V(set1_ps)(0.0f);            \
        for (int64_t s = 0; s < t->nsb; s++) {                                                                         \
            const struct kquant_formed *f[R];                                                                          \
            const char *x[B];                                                                                          \
            I total[R][B];                                                                                             \
            UNROLL for (int r = 0; r < R; r++) f[r] = t->rows[r] + s;                                                  \
            UNROLL for (int c = 0; c < B; c++) x[c] = t->bands[c] + s * (int64_t)sizeof(struct kquant_band);           \
            UNROLL for (int r = 0; r < R; r++) UNROLL for (int c = 0; c < B; c++) total[r][c] = V(set1_epi32)(0);      \
            BLOCK_PAIRS for (int i = 0; i < 8; i++) UNROLL for (int h = 0; h < 2; h += by_halves(KIND) ? 1 : 2) {      \
                I sums[R][B];                                                                                          \
                UNROLL for (int r = 0; r < R; r++) UNROLL for (int c = 0; c < B; c++) sums[r][c] = V(set1_epi32)(0);   \
                UNROLL for (int v = 4 * h; v < (by_halves(KIND) ? 4 * h + 4 : 8); v++) {                               \
                    I xv[B];                                                                                           \
                    UNROLL for (int c = 0; c < B; c++) xv[c] = LOAD(x[c] + 64 * (8 * i + v));                          \
                    UNROLL for (int r = 0; r < R; r++) {                                                               \
                        I w = V(set1_epi32)(((const int32_t *)&f[r]->codes[v])[i]); /* block i's 4 codes */            \
                        UNROLL for (int c = 0; c < B; c++) sums[r][c] = MADD(sums[r][c], w, xv[c]);                    \
                    }                                                                                                  \
                }                                                                                                      \
                UNROLL for (int r = 0; r < R; r++) {                                                                   \
                    I scale = V(set1_epi32)(f[r]->scale[h][i]);                                                        \
                    UNROLL for (int c = 0; c < B; c++)                                                                 \
                        total[r][c] = V(add_epi32)(total[r][c], V(mullo_epi32)(sums[r][c], scale));                    \
                }                                                                                                      \
            }                                                                                                          \
            UNROLL for (int r = 0; r < R; r++) UNROLL for (int c = 0; c < B; c++) {                                    \
                const char *corr = x[c] + offsetof(struct kquant_band, corr);                                          \
                I paired = V(set1_epi32)(0);                                                                           \
                UNROLL for (int i = 0; i < 8; i++)                                                                     \
                    paired = PAIRS(paired, LOAD(corr + 64 * i), V(set1_epi32)(f[r]->pairs[i]));                        \
                if (code_offset(KIND))                                                                                 \
                    total[r][c] = V(sub_epi32)(total[r][c], V(slli_epi32)(paired, code_offset_bits(KIND)));            \
                F xs = V(load_ps)((const float *)(x[c] + offsetof(struct kquant_band, xs)));                           \
                F scale = V(mul_ps)(xs, V(set1_ps)(f[r]->d));                                                          \
                acc[r][c] = V(fmadd_ps)(V(cvtepi32_ps)(total[r][c]), scale, acc[r][c]);                                \
                if (has_mins(KIND))                                                                                    \
                    acc[r][c] = V(fnmadd_ps)(V(cvtepi32_ps)(paired), V(mul_ps)(xs, V(set1_ps)(f[r]->dmin)), acc[r][c]);\
            }                                                                                                          \
        }                                                                                                              \
        UNROLL for (int r = 0; r < R; r++) UNROLL for (int c = 0; c < B; c++)                                          \
            V(storeu_ps)(out + (r * B + c) * LANES, acc[r][c]);                                                        \
    }

/* A kind's band tiles at a level, [rows of W: 1, 2, 4][bands or pairs: 1, 2]: AVX2's by bands of 8 rows (its 16
 * registers take one band), VNNI's by pairs of bands on 512-bit vectors, a vpdpbusd for 16 rows of x. On an Intel
 * Xeon's core, whose vpdpbusd peaks at 440 GMAC/s on 512-bit vectors and 240 on 256-bit ones, 512 rows of x against
 * Q5_K 2816 x 1024 ran at 170 GMAC/s against 130 by bands of 8, Q6_K 1024 x 2816 at 140 against 109. */
typedef void (*kquant_band_fn)(const struct kquant_band_rows *, float *);
#define BAND_SET(NAME, TARGET, V, I, F, LOAD, MADD, PAIRS, B, KIND)                                                   \
    BAND_TILE(NAME##_1, TARGET, V, I, F, LOAD, MADD, PAIRS, 1, B, KIND)                                                \
    BAND_TILE(NAME##_2, TARGET, V, I, F, LOAD, MADD, PAIRS, 2, B, KIND)                                                \
    BAND_TILE(NAME##_4, TARGET, V, I, F, LOAD, MADD, PAIRS, 4, B, KIND)
#define BAND_SETS(NAME, KIND)                                                                                          \
    BAND_SET(NAME##_avx2, AVX2, V256, __m256i, __m256, LOAD256, madd_avx2, pairs_avx2, 1, KIND)                        \
    BAND_SET(NAME##_vnni_x1, VNNI, V512, __m512i, __m512, LOAD512, madd_vnni512, pairs_vnni512, 1, KIND)               \
    BAND_SET(NAME##_vnni_x2, VNNI, V512, __m512i, __m512, LOAD512, madd_vnni512, pairs_vnni512, 2, KIND)               \
    static const kquant_band_fn NAME##_avx2[3][2] = {{NAME##_avx2_1}, {NAME##_avx2_2}, {NAME##_avx2_4}};               \
    static const kquant_band_fn NAME##_vnni[3][2] = {{NAME##_vnni_x1_1, NAME##_vnni_x2_1},                             \
                                                     {NAME##_vnni_x1_2, NAME##_vnni_x2_2},                             \
                                                     {NAME##_vnni_x1_4, NAME##_vnni_x2_4}};
BAND_SETS(q4_k_band, KIND_Q4_K)
BAND_SETS(q6_k_band, KIND_Q6_K)
BAND_SETS(q3_k_band, KIND_Q3_K)
BAND_SETS(q2_k_band, KIND_Q2_K)

static const kquant_band_fn (*kquant_band_kernels(int kind, int level))[2] {
    /* Q5_K's formed codes meet x as Q4_K's: only the forming differs */
    static const kquant_band_fn (*const sets[KINDS][2])[2] = {
        {NULL, NULL},
        {q4_k_band_avx2, q4_k_band_vnni},
        {q6_k_band_avx2, q6_k_band_vnni},
        {q4_k_band_avx2, q4_k_band_vnni},
        {q2_k_band_avx2, q2_k_band_vnni},
        {q3_k_band_avx2, q3_k_band_vnni}};
    return sets[kind][vnni_at(level)];
}
#endif

/* Row j of K-quant layer l: its first record (the next super-block's stride bytes on). A tiled layer's records are
 * paired (`pairs`), so that a decoding step reads two rows of W in one stream: Q4_K 2816 x 1024 took 0.081 ms against
 * 0.096 in rows, Q2_K 8000 x 4096 0.62 against 0.77, Q6_K 8192 x 1024 0.204 against 0.256 (one thread, AMD EPYC, a
 * call taking every pair of the thread's rows). */
static inline const uint8_t *kquant_row(const struct linear_args *a, int l, int64_t j, int pairs) {
    int64_t bytes = kquant_bytes(a->kinds[l]), nsb = a->k / SUPER;
    return a->q[l] + (pairs ? (j - j % 2) * nsb * bytes + j % 2 * bytes : j * nsb * bytes);
}

#ifdef CPU_X86
/* Bytes of x's codes in a run of bands (their bands take 1.14 times as many): twice int8_dot.h's X_BLOCK_BYTES, so
 * that rows of W are formed half as often, within a core's L2 (1 MB and more on the CPUs measured). Q5_K_M, 512
 * rows of x on an Intel Xeon: 1.6 % and 2.0-3.4 % more tokens/s at one and two threads (in-process A/B, 8-10
 * rounds); Q4_K_M, whose forming costs less, 0.3 % at two. */
enum { BAND_X_BYTES = 2 * X_BLOCK_BYTES };

/* A band tile's outputs (totals: row r of W's 8 lanes `apart` floats after row r - 1's) for `count` rows of x into
 * out (row i of x n floats after row i - 1), plus the bias where there is one: 4 rows of W by a transpose, each row of
 * x's 4 outputs stored together. */
AVX2 static void kquant_store(const float *totals, int64_t apart, int64_t rows, int64_t count, const float *bias,
                              float *out, int64_t n) {
    if (rows != 4) {
        for (int64_t i = 0; i < count; i++)
            for (int64_t r = 0; r < rows; r++)
                out[i * n + r] = bias ? totals[r * apart + i] + bias[r] : totals[r * apart + i];
        return;
    }
    __m256 v[4], u[4];
    for (int r = 0; r < 4; r++) v[r] = _mm256_loadu_ps(totals + r * apart);
    __m256 low01 = _mm256_unpacklo_ps(v[0], v[1]), high01 = _mm256_unpackhi_ps(v[0], v[1]);
    __m256 low23 = _mm256_unpacklo_ps(v[2], v[3]), high23 = _mm256_unpackhi_ps(v[2], v[3]);
    /* u[i]: lane i of the 4 rows (and lane i + 4 in the high half) */
    u[0] = _mm256_shuffle_ps(low01, low23, 0x44), u[1] = _mm256_shuffle_ps(low01, low23, 0xEE);
    u[2] = _mm256_shuffle_ps(high01, high23, 0x44), u[3] = _mm256_shuffle_ps(high01, high23, 0xEE);
    __m128 add = bias ? _mm_loadu_ps(bias) : _mm_setzero_ps();
    for (int64_t i = 0; i < count; i++) {
        __m128 four = i < 4 ? _mm256_castps256_ps128(u[i]) : _mm256_extractf128_ps(u[i - 4], 1);
        _mm_storeu_ps(out + i * n, bias ? _mm_add_ps(four, add) : four);
    }
}

/* The bands' rows [first, last) of layer l (a prompt; its records paired or not, a row's stride bytes apart): runs of
 * bands that stay in the core's cache, each met by every group of up to 4 rows of W formed once for the run
 * (kquant_form_row), by units of `per` bands (AVX2: a band; VNNI: a pair), a tile taking one or two units. Returns 0
 * where no memory is left to form rows (nothing done). */
static int kquant_band_range(const struct linear_args *a, int l, int64_t first, int64_t last, int pairs,
                             int64_t stride) {
    int kind = a->kinds[l], vnni = vnni_at(a->level);
    int per = vnni ? 2 : 1, widest = vnni ? 2 : 1; /* bands a unit; units a tile (AVX2's 16 registers take one) */
    int64_t k = a->k, nsb = k / SUPER, n = a->n[l], bands = (a->m + 7) / 8, units = (bands + per - 1) / per;
    int64_t run = max64(1, BAND_X_BYTES / k / 8 / per);
    struct kquant_formed *formed = aligned_alloc(32, 4 * (size_t)nsb * sizeof *formed);
    if (!formed) return 0;
    const kquant_band_fn(*tiles)[2] = kquant_band_kernels(kind, a->level);
    const struct kquant_band *all = (const struct kquant_band *)a->bands;
    const float *bias = a->bias[l];
    float *out = a->out[l], totals[4 * 2 * 16];
    for (int64_t u0 = 0; u0 < units; u0 += run) {
        int64_t u_end = min64(units, u0 + run);
        for (int64_t j = first; j < last;) {
            int64_t rows = last - j >= 4 ? 4 : last - j >= 2 ? 2 : 1;
            struct kquant_band_rows t = {{formed, formed + nsb, formed + 2 * nsb, formed + 3 * nsb}, {NULL, NULL}, nsb};
            for (int64_t r = 0; r < rows; r++)
                kquant_form_row(kind, kquant_row(a, l, j + r, pairs), stride, nsb, formed + r * nsb);
            for (int64_t u = u0; u < u_end;) {
                int64_t width = u_end - u >= widest ? widest : 1; /* units in the tile */
                t.bands[0] = band_view(all, nsb, u * per), t.bands[1] = band_view(all, nsb, (u + width - 1) * per);
                tiles[rows == 4 ? 2 : rows - 1][width - 1](&t, totals);
                for (int64_t e = 0; e < width * per && u * per + e < bands; e++) { /* the tile's bands of 8 rows */
                    int64_t c = u * per + e;
                    kquant_store(totals + e * 8, width * per * 8, rows, min64(8, a->m - 8 * c), bias ? bias + j : NULL,
                                 out + 8 * c * n + j, n);
                }
                u += width;
            }
            j += rows;
        }
    }
    free(formed);
    return 1;
}
#endif

/* Rows [first, last) of K-quant layer l (kind) against x's m rows, its records in rows (nsb a row, in order) or paired
 * (a->tiled: rows 2p and 2p + 1 with their records interleaved, super-block s of row j at record
 * 2(p nsb + s) + j % 2), so that two rows are one stream. A prompt with x in bands takes them (kquant_band_range); a
 * decoding step (one row of x), or a prompt where no memory is left, reads the records as they are, a kernel's call
 * taking the rows from j on: two rows of W at a time where they are paired, else one. */
static void kquant_range(const struct linear_args *a, int l, int64_t first, int64_t last) {
    int kind = a->kinds[l];
    int64_t k = a->k, nb = k / BLOCK, nsb = k / SUPER, n = a->n[l], bytes = kquant_bytes(kind);
    int pairs = a->tiled;
    int64_t stride = pairs ? 2 * bytes : bytes, next = pairs ? bytes : nsb * bytes; /* next: row j + 1's */
    const float *bias = a->bias[l];
    float *out = a->out[l];
#ifdef CPU_X86
    if (a->bands && kquant_band_range(a, l, first, last, pairs, stride)) return;
    const kquant_fn *kernels = a->level >= LEVEL_AVX2 ? kquant_kernels(kind, a->level) : NULL;
    for (int64_t j = first; kernels && j < last;) { /* a call takes pairs of rows where they are paired, else rows */
        int64_t rows = pairs && j % 2 == 0 && last - j >= 2 ? 2 : 1;
        int64_t groups = rows == 2 ? (last - j) / 2 : pairs ? 1 : last - j;
        const uint8_t *row = kquant_row(a, l, j, pairs);
        for (int64_t i = 0; i < a->m; i++) {
            struct kquant_rows t = {row,    a->xq + i * k, a->xs + i * nsb,       a->corr + i * nb, nsb, next,
                                    stride, groups,        rows * nsb * bytes, bias ? bias + j : NULL};
            kernels[rows - 1](&t, out + i * n + j);
        }
        j += groups * rows;
    }
    if (kernels) return;
#endif
    for (int64_t j = first; j < last; j++) {
        const uint8_t *row = kquant_row(a, l, j, pairs);
        for (int64_t i = 0; i < a->m; i++) {
            float total = kquant_dot_c(kind, row, stride, a->xq + i * k, a->xs + i * nsb, a->corr + i * nb, nsb);
            out[i * n + j] = bias ? total + bias[j] : total;
        }
    }
}

#endif
