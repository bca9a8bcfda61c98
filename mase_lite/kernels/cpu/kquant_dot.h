/* GGML's K-quants Q2_K to Q6_K against int8 activations (x quantized per block of 32: int8_dot.h's quantize_x, then
 * each super-block of 256 codes transposed as the weights are, and corr holding per block the sums of its first and
 * last 16 codes as two int16 halves, low and high). A row of W is its super-blocks of 256 weights, one record each (in
 * a tiled layer, two rows' records interleaved where kquant_paired: kquant_range): GGUF's values at its bits (the
 * layer converts, kernels/kquants/records.py), the 8 blocks of 32 of a super-block laid across each vector of 32
 * bytes: byte-vector t (t = 0..7) holds, in its lane i, codes 4t..4t+3 of block i. A record:
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
 * One output: block i of every super-block accumulates into float32 lane i: its exact integer sum S by
 * fmaf(S, xs * (d * sc), lane), then fmaf(-X, xs * (dmin * m), lane) with X the sum of the block's codes of x (Q4_K,
 * Q5_K); or, where each half of a block has its scale (Q6_K, Q3_K, Q2_K), S the halves' sums each times its scale
 * (in int32) by fmaf(S, xs * d, lane), then for Q2_K fmaf(-M, xs * dmin, lane) with M the halves' sums of x each times
 * its min. The lanes are summed (sum8) at the end of the row. Every level computes these integers and float
 * operations in this order: the same bits at every level and thread count. The vector levels take a byte-vector of W
 * against the same byte-vector of x: each lane's products are block i's, so each block's sum builds in its own lane,
 * with no sum across lanes: the unsigned codes meet x by VNNI's vpdpbusd where the CPU has it, else AVX2's vpmaddubsw
 * (a code u - c as u less c times the half's sum of x, then times the half's scale). A decoding step forms each
 * super-block's codes from the records as it meets them (AFFINE_TILE, HALVES_TILE); a prompt forms each row's codes and
 * scales once per run of rows of x (kquant_form_row) and meets them with tiles of 2 rows of W and up to 4 rows of x
 * (FORMED_TILE): the same integers and float operations, so the same bits. */
#ifndef KQUANT_DOT_H
#define KQUANT_DOT_H

enum { KIND_Q4_K = 1, KIND_Q6_K = 2, KIND_Q5_K = 3, KIND_Q2_K = 4, KIND_Q3_K = 5, KINDS }; /* 0: struct weights' */
enum { SUPER = 256, Q2_K_BYTES = 84, Q3_K_BYTES = 114, Q4_K_BYTES = 148, Q5_K_BYTES = 180, Q6_K_BYTES = 210 };

static inline int64_t kquant_bytes(int kind) {
    static const int64_t bytes[KINDS] = {0, Q4_K_BYTES, Q6_K_BYTES, Q5_K_BYTES, Q2_K_BYTES, Q3_K_BYTES};
    return bytes[kind];
}

/* What a kind's codes stand for: the offset taken off them, and whether each half of a block has its scale (else each
 * block its scale and min). */
static inline int code_offset(int kind) { return kind == KIND_Q6_K ? 32 : kind == KIND_Q3_K ? 4 : 0; }
static inline int by_halves(int kind) { return kind == KIND_Q6_K || kind == KIND_Q3_K || kind == KIND_Q2_K; }

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

/* The sum of a block's codes of x from its corr. */
static inline int32_t block_sum(int32_t corr) { return (int16_t)(corr & 0xFFFF) + (int16_t)((uint32_t)corr >> 16); }

/* One output in plain C: row (nsb records, stride bytes apart) against one row of x (its codes transposed). */
static float kquant_dot_c(int kind, const uint8_t *row, int64_t stride, const int8_t *xq, const float *xs,
                          const int32_t *xsum, int64_t nsb) {
    float lanes[8] = {0};
    for (int64_t s = 0; s < nsb; s++) {
        const uint8_t *r = row + s * stride;
        const int8_t *x = xq + s * SUPER;
        float d = half_at(r);
        for (int i = 0; i < 8; i++) {
            int64_t b = 8 * s + i;
            int32_t half[2] = {0, 0};
            for (int e = 0; e < BLOCK; e++)
                half[e / 16] += (code_at(kind, r, i, e) - code_offset(kind)) * x[transposed(i, e)];
            if (!by_halves(kind)) {
                lanes[i] = fmaf((float)(half[0] + half[1]), xs[b] * (d * (float)r[4 + i]), lanes[i]);
                lanes[i] = fmaf(-(float)block_sum(xsum[b]), xs[b] * (half_at(r + 2) * (float)r[12 + i]), lanes[i]);
            } else if (kind != KIND_Q2_K) {
                const int8_t *sc = (const int8_t *)r + 2;
                lanes[i] = fmaf((float)(sc[i] * half[0] + sc[8 + i] * half[1]), xs[b] * d, lanes[i]);
            } else { /* Q2_K: the halves' scales and mins, 4 bits each */
                int32_t x0 = (int16_t)(xsum[b] & 0xFFFF), x1 = (int16_t)((uint32_t)xsum[b] >> 16);
                int first = r[4 + i], second = r[12 + i];
                lanes[i] = fmaf((float)((first & 15) * half[0] + (second & 15) * half[1]), xs[b] * d, lanes[i]);
                lanes[i] = fmaf(-(float)((first >> 4) * x0 + (second >> 4) * x1), xs[b] * half_at(r + 2), lanes[i]);
            }
        }
    }
    return sum8(lanes);
}

#ifdef CPU_X86
/* What a vector kernel takes: R rows of W (nsb records each, a row's records stride bytes apart, the next row's
 * row_bytes on) against C rows of x (k codes, nb scales and sums apart). */
struct kquant_rows {
    const uint8_t *row;
    const int8_t *xq;
    const float *xs;
    const int32_t *xsum;
    int64_t nsb, k, nb, row_bytes, stride;
};

AVX2 INLINE float half_f16c(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, sizeof h);
    return _cvtsh_ss(h);
}

#define X_VECTOR(c, s, vector) _mm256_loadu_si256((const __m256i *)(t->xq + (c) * t->k + (s) * SUPER) + (vector))
#define RECORD(r, s) (t->row + (r) * t->row_bytes + (s) * t->stride)
#define ZERO_SUMS(R, C)                                                                                                \
    __m256i sums[R][C][2];                                                                                             \
    UNROLL for (int r = 0; r < R; r++) UNROLL for (int c = 0; c < C; c++)                                              \
        sums[r][c][0] = sums[r][c][1] = _mm256_setzero_si256();
#define TILE_OUT(R, C)                                                                                                 \
    UNROLL for (int r = 0; r < R; r++) UNROLL for (int c = 0; c < C; c++) out[r * C + c] = sum8_avx2(acc[r][c]);

/* NAME(t, out): Q4_K or Q5_K (KIND), R rows of W against C rows of x into out[r * C + c] (decoding: C = 1): each
 * super-block's codes formed once for the C rows of x, each vector of x's codes and its block scales loaded once for
 * the R rows of W. Q5_K's fifth bits: byte-vector b's bit b of their vector, moved to bit 4 as Q6_K's crumbs are. */
#define AFFINE_TILE(NAME, TARGET, MADD, R, C, KIND)                                                                    \
    TARGET static void NAME(const struct kquant_rows *t, float *out) {                                                 \
        const int FIFTH = KIND == KIND_Q5_K;                                                                           \
        const __m256i low4 = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1), bit4 = _mm256_set1_epi8(16);           \
        __m256 acc[R][C];                                                                                              \
        UNROLL for (int r = 0; r < R; r++) UNROLL for (int c = 0; c < C; c++) acc[r][c] = _mm256_setzero_ps();         \
        for (int64_t s = 0; s < t->nsb; s++) {                                                                         \
            ZERO_SUMS(R, C)                                                                                            \
            __m256i fifth[R];                                                                                          \
            UNROLL for (int r = 0; r < R; r++)                                                                         \
                fifth[r] = FIFTH ? _mm256_loadu_si256((const __m256i *)(RECORD(r, s) + 148)) : low4;                   \
            UNROLL for (int v = 0; v < 4; v++) {                                                                       \
                __m256i low[R], high[R];                                                                               \
                UNROLL for (int r = 0; r < R; r++) {                                                                   \
                    __m256i w = _mm256_loadu_si256((const __m256i *)(RECORD(r, s) + 20) + v);                          \
                    low[r] = _mm256_and_si256(w, low4), high[r] = _mm256_and_si256(_mm256_srli_epi16(w, 4), low4);     \
                    if (FIFTH) { /* byte-vectors v (bit v to 4) and v + 4 (bit v + 4 to 4) */                          \
                        __m256i up = v ? _mm256_srli_epi16(fifth[r], v) : fifth[r];                                    \
                        __m256i down = _mm256_slli_epi16(fifth[r], 4 - v);                                             \
                        low[r] = _mm256_or_si256(low[r], _mm256_and_si256(down, bit4));                                \
                        high[r] = _mm256_or_si256(high[r], _mm256_and_si256(up, bit4));                                \
                    }                                                                                                  \
                }                                                                                                      \
                UNROLL for (int c = 0; c < C; c++) {                                                                   \
                    __m256i x_low = X_VECTOR(c, s, v), x_high = X_VECTOR(c, s, v + 4);                                 \
                    UNROLL for (int r = 0; r < R; r++) {                                                               \
                        sums[r][c][0] = MADD(sums[r][c][0], low[r], x_low);                                            \
                        sums[r][c][1] = MADD(sums[r][c][1], high[r], x_high);                                          \
                    }                                                                                                  \
                }                                                                                                      \
            }                                                                                                          \
            __m256 dsc[R], dm[R];                                                                                      \
            UNROLL for (int r = 0; r < R; r++) {                                                                       \
                const uint8_t *rec = RECORD(r, s);                                                                     \
                __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(rec + 4))));     \
                __m256 m = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(rec + 12))));     \
                dsc[r] = _mm256_mul_ps(_mm256_set1_ps(half_f16c(rec)), sc);                                            \
                dm[r] = _mm256_mul_ps(_mm256_set1_ps(half_f16c(rec + 2)), m);                                          \
            }                                                                                                          \
            UNROLL for (int c = 0; c < C; c++) {                                                                       \
                __m256 x8 = _mm256_loadu_ps(t->xs + c * t->nb + 8 * s);                                                \
                __m256i halves = _mm256_loadu_si256((const __m256i *)(t->xsum + c * t->nb + 8 * s));                   \
                __m256 xsum8 = _mm256_cvtepi32_ps(_mm256_madd_epi16(halves, ones)); /* the two halves added */         \
                UNROLL for (int r = 0; r < R; r++) {                                                                   \
                    __m256 total = _mm256_cvtepi32_ps(_mm256_add_epi32(sums[r][c][0], sums[r][c][1]));                 \
                    acc[r][c] = _mm256_fmadd_ps(total, _mm256_mul_ps(x8, dsc[r]), acc[r][c]);                          \
                    acc[r][c] = _mm256_fnmadd_ps(xsum8, _mm256_mul_ps(x8, dm[r]), acc[r][c]);                          \
                }                                                                                                      \
            }                                                                                                          \
        }                                                                                                              \
        TILE_OUT(R, C)                                                                                                 \
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

/* NAME(t, out): a kind whose blocks' halves have their scales (Q6_K, Q3_K, Q2_K), R rows of W against C rows of x,
 * as AFFINE_TILE: the unsigned codes u meet x, byte-vectors 0-3 summing the blocks' first halves and 4-7 their
 * second; the offset times the halves' sums of x is taken off before their scales multiply them (Q2_K: the halves'
 * sums of x times their mins make M). */
#define HALVES_TILE(NAME, TARGET, MADD, R, C, KIND)                                                                    \
    TARGET static void NAME(const struct kquant_rows *t, float *out) {                                                 \
        __m256 acc[R][C];                                                                                              \
        UNROLL for (int r = 0; r < R; r++) UNROLL for (int c = 0; c < C; c++) acc[r][c] = _mm256_setzero_ps();         \
        for (int64_t s = 0; s < t->nsb; s++) {                                                                         \
            ZERO_SUMS(R, C)                                                                                            \
            UNROLL for (int b = 0; b < 8; b++) {                                                                       \
                __m256i u[R];                                                                                          \
                UNROLL for (int r = 0; r < R; r++) u[r] = halves_codes(KIND, RECORD(r, s), b);                         \
                UNROLL for (int c = 0; c < C; c++) {                                                                   \
                    __m256i x = X_VECTOR(c, s, b);                                                                     \
                    UNROLL for (int r = 0; r < R; r++) sums[r][c][b / 4] = MADD(sums[r][c][b / 4], u[r], x);           \
                }                                                                                                      \
            }                                                                                                          \
            __m256i first[R], second[R], first_m[R], second_m[R];                                                      \
            __m256 d[R], dmin[R];                                                                                      \
            UNROLL for (int r = 0; r < R; r++) {                                                                       \
                const uint8_t *rec = RECORD(r, s);                                                                     \
                d[r] = _mm256_set1_ps(half_f16c(rec));                                                                 \
                if (KIND == KIND_Q2_K) {                                                                               \
                    __m256i a = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(rec + 4)));                     \
                    __m256i z = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(rec + 12)));                    \
                    first[r] = _mm256_and_si256(a, _mm256_set1_epi32(15)), first_m[r] = _mm256_srli_epi32(a, 4);       \
                    second[r] = _mm256_and_si256(z, _mm256_set1_epi32(15)), second_m[r] = _mm256_srli_epi32(z, 4);     \
                    dmin[r] = _mm256_set1_ps(half_f16c(rec + 2));                                                      \
                } else {                                                                                               \
                    first[r] = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(rec + 2)));                      \
                    second[r] = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(rec + 10)));                    \
                    first_m[r] = second_m[r] = _mm256_setzero_si256(), dmin[r] = _mm256_setzero_ps();                  \
                }                                                                                                      \
            }                                                                                                          \
            UNROLL for (int c = 0; c < C; c++) {                                                                       \
                __m256i halves = _mm256_loadu_si256((const __m256i *)(t->xsum + c * t->nb + 8 * s));                   \
                __m256i xa = _mm256_srai_epi32(_mm256_slli_epi32(halves, 16), 16), xb = _mm256_srai_epi32(halves, 16); \
                __m256i offa = _mm256_mullo_epi32(xa, _mm256_set1_epi32(code_offset(KIND)));                           \
                __m256i offb = _mm256_mullo_epi32(xb, _mm256_set1_epi32(code_offset(KIND)));                           \
                __m256 x8 = _mm256_loadu_ps(t->xs + c * t->nb + 8 * s);                                                \
                UNROLL for (int r = 0; r < R; r++) {                                                                   \
                    __m256i total = _mm256_add_epi32(                                                                  \
                        _mm256_mullo_epi32(_mm256_sub_epi32(sums[r][c][0], offa), first[r]),                           \
                        _mm256_mullo_epi32(_mm256_sub_epi32(sums[r][c][1], offb), second[r]));                         \
                    acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), _mm256_mul_ps(x8, d[r]), acc[r][c]);        \
                    if (KIND == KIND_Q2_K) {                                                                           \
                        __m256i m = _mm256_add_epi32(_mm256_mullo_epi32(xa, first_m[r]),                               \
                                                     _mm256_mullo_epi32(xb, second_m[r]));                             \
                        acc[r][c] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(m), _mm256_mul_ps(x8, dmin[r]), acc[r][c]);    \
                    }                                                                                                  \
                }                                                                                                      \
            }                                                                                                          \
        }                                                                                                              \
        TILE_OUT(R, C)                                                                                                 \
    }

/* A kind's kernels at a level for one row of x: [0] one row of W, [1] two rows. */
typedef void (*kquant_fn)(const struct kquant_rows *, float *);
#define KQUANT_SET(TILE, NAME, TARGET, MADD, KIND)                                                                     \
    TILE(NAME##_1x1, TARGET, MADD, 1, 1, KIND) TILE(NAME##_2x1, TARGET, MADD, 2, 1, KIND)                              \
    static const kquant_fn NAME[2] = {NAME##_1x1, NAME##_2x1};
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

/* Prompts: a row's super-blocks formed once per run of rows of x (kquant_form_row: each byte-vector of codes and the
 * scales as the tiles above form them) and met by every group of up to 4 rows of x there; the same integers and
 * float operations as the tiles above, so the same bits. */
struct kquant_formed {
    __m256i codes[8];                         /* byte-vector b of the super-block's codes u */
    __m256 scale, min;                        /* Q4_K, Q5_K: d * sc and dmin * m of each block */
    __m256i first, second, first_m, second_m; /* the halves' kinds: each half's scale (Q2_K: and min) */
    __m256 d, dmin;                           /* d (every kind); Q2_K: dmin */
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
        f->d = _mm256_set1_ps(half_f16c(rec));
        f->scale = f->min = f->dmin = _mm256_setzero_ps();
        f->first = f->second = f->first_m = f->second_m = _mm256_setzero_si256();
        if (!by_halves(kind)) {
            __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(rec + 4))));
            __m256 m = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(rec + 12))));
            f->scale = _mm256_mul_ps(f->d, sc), f->min = _mm256_mul_ps(_mm256_set1_ps(half_f16c(rec + 2)), m);
        } else if (kind == KIND_Q2_K) {
            __m256i a = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(rec + 4)));
            __m256i z = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(rec + 12)));
            f->first = _mm256_and_si256(a, _mm256_set1_epi32(15)), f->first_m = _mm256_srli_epi32(a, 4);
            f->second = _mm256_and_si256(z, _mm256_set1_epi32(15)), f->second_m = _mm256_srli_epi32(z, 4);
            f->dmin = _mm256_set1_ps(half_f16c(rec + 2));
        } else {
            f->first = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(rec + 2)));
            f->second = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(rec + 10)));
        }
    }
}

/* What a formed tile takes: R formed rows of W against C rows of x (k codes, nb scales and sums apart). */
struct kquant_formed_rows {
    const struct kquant_formed *rows[2];
    const int8_t *xq;
    const float *xs;
    const int32_t *xsum;
    int64_t nsb, k, nb;
};

/* NAME(t, out): R formed rows of KIND against C rows of x into out[r * C + c], as AFFINE_TILE or HALVES_TILE. */
#define FORMED_TILE(NAME, TARGET, MADD, R, C, KIND)                                                                    \
    TARGET static void NAME(const struct kquant_formed_rows *t, float *out) {                                          \
        const __m256i ones = _mm256_set1_epi16(1);                                                                     \
        __m256 acc[R][C];                                                                                              \
        UNROLL for (int r = 0; r < R; r++) UNROLL for (int c = 0; c < C; c++) acc[r][c] = _mm256_setzero_ps();         \
        for (int64_t s = 0; s < t->nsb; s++) {                                                                         \
            ZERO_SUMS(R, C)                                                                                            \
            const struct kquant_formed *f[R];                                                                          \
            UNROLL for (int r = 0; r < R; r++) f[r] = t->rows[r] + s;                                                  \
            UNROLL for (int b = 0; b < 8; b++) UNROLL for (int c = 0; c < C; c++) {                                    \
                __m256i x = X_VECTOR(c, s, b);                                                                         \
                UNROLL for (int r = 0; r < R; r++) sums[r][c][b / 4] = MADD(sums[r][c][b / 4], f[r]->codes[b], x);     \
            }                                                                                                          \
            UNROLL for (int c = 0; c < C; c++) {                                                                       \
                __m256i halves = _mm256_loadu_si256((const __m256i *)(t->xsum + c * t->nb + 8 * s));                   \
                __m256 x8 = _mm256_loadu_ps(t->xs + c * t->nb + 8 * s);                                                \
                if (!by_halves(KIND)) {                                                                                \
                    __m256 xsum8 = _mm256_cvtepi32_ps(_mm256_madd_epi16(halves, ones)); /* the two halves added */     \
                    UNROLL for (int r = 0; r < R; r++) {                                                               \
                        __m256 total = _mm256_cvtepi32_ps(_mm256_add_epi32(sums[r][c][0], sums[r][c][1]));             \
                        acc[r][c] = _mm256_fmadd_ps(total, _mm256_mul_ps(x8, f[r]->scale), acc[r][c]);                 \
                        acc[r][c] = _mm256_fnmadd_ps(xsum8, _mm256_mul_ps(x8, f[r]->min), acc[r][c]);                  \
                    }                                                                                                  \
                    continue;                                                                                          \
                }                                                                                                      \
                __m256i xa = _mm256_srai_epi32(_mm256_slli_epi32(halves, 16), 16), xb = _mm256_srai_epi32(halves, 16); \
                __m256i offa = _mm256_mullo_epi32(xa, _mm256_set1_epi32(code_offset(KIND)));                           \
                __m256i offb = _mm256_mullo_epi32(xb, _mm256_set1_epi32(code_offset(KIND)));                           \
                UNROLL for (int r = 0; r < R; r++) {                                                                   \
                    __m256i total = _mm256_add_epi32(                                                                  \
                        _mm256_mullo_epi32(_mm256_sub_epi32(sums[r][c][0], offa), f[r]->first),                        \
                        _mm256_mullo_epi32(_mm256_sub_epi32(sums[r][c][1], offb), f[r]->second));                      \
                    acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), _mm256_mul_ps(x8, f[r]->d), acc[r][c]);     \
                    if (KIND == KIND_Q2_K) {                                                                           \
                        __m256i m = _mm256_add_epi32(_mm256_mullo_epi32(xa, f[r]->first_m),                           \
                                                     _mm256_mullo_epi32(xb, f[r]->second_m));                          \
                        acc[r][c] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(m), _mm256_mul_ps(x8, f[r]->dmin), acc[r][c]); \
                    }                                                                                                  \
                }                                                                                                      \
            }                                                                                                          \
        }                                                                                                              \
        TILE_OUT(R, C)                                                                                                 \
    }

typedef void (*kquant_formed_fn)(const struct kquant_formed_rows *, float *);
#define FORMED_SET(NAME, TARGET, MADD, KIND)                                                                           \
    FORMED_TILE(NAME##_1x1, TARGET, MADD, 1, 1, KIND) FORMED_TILE(NAME##_1x2, TARGET, MADD, 1, 2, KIND)                \
    FORMED_TILE(NAME##_1x3, TARGET, MADD, 1, 3, KIND) FORMED_TILE(NAME##_1x4, TARGET, MADD, 1, 4, KIND)                \
    FORMED_TILE(NAME##_2x1, TARGET, MADD, 2, 1, KIND) FORMED_TILE(NAME##_2x2, TARGET, MADD, 2, 2, KIND)                \
    FORMED_TILE(NAME##_2x3, TARGET, MADD, 2, 3, KIND) FORMED_TILE(NAME##_2x4, TARGET, MADD, 2, 4, KIND)                \
    static const kquant_formed_fn NAME[2][4] = {{NAME##_1x1, NAME##_1x2, NAME##_1x3, NAME##_1x4},                      \
                                                {NAME##_2x1, NAME##_2x2, NAME##_2x3, NAME##_2x4}};
FORMED_SET(q4_k_formed_avx2, AVX2, madd_avx2, KIND_Q4_K)
FORMED_SET(q4_k_formed_vnni, VNNI, madd_vnni, KIND_Q4_K)
FORMED_SET(q6_k_formed_avx2, AVX2, madd_avx2, KIND_Q6_K)
FORMED_SET(q6_k_formed_vnni, VNNI, madd_vnni, KIND_Q6_K)
FORMED_SET(q3_k_formed_avx2, AVX2, madd_avx2, KIND_Q3_K)
FORMED_SET(q3_k_formed_vnni, VNNI, madd_vnni, KIND_Q3_K)
FORMED_SET(q2_k_formed_avx2, AVX2, madd_avx2, KIND_Q2_K)
FORMED_SET(q2_k_formed_vnni, VNNI, madd_vnni, KIND_Q2_K)

static const kquant_formed_fn (*kquant_formed_kernels(int kind, int level))[4] {
    /* Q5_K's formed codes meet x as Q4_K's: only the forming differs */
    static const kquant_formed_fn (*const sets[KINDS][2])[4] = {
        {NULL, NULL},
        {q4_k_formed_avx2, q4_k_formed_vnni},
        {q6_k_formed_avx2, q6_k_formed_vnni},
        {q4_k_formed_avx2, q4_k_formed_vnni},
        {q2_k_formed_avx2, q2_k_formed_vnni},
        {q3_k_formed_avx2, q3_k_formed_vnni}};
    return sets[kind][vnni_at(level)];
}
#endif

/* Whether a kind's records are paired where its layer is tiled, so that a decoding step reads two rows of W in one
 * stream: Q4_K 2816 x 1024 took 0.081 ms against 0.096 in rows, Q2_K 8000 x 4096 0.62 against 0.77 (one thread, AMD
 * EPYC). Q6_K's stay in rows, read one row at a time: two rows of it at once, even paired, took 1.9-2.0 ms against
 * 1.4-1.9 on 8000 x 4096, beyond the L2 cache. */
static inline int kquant_paired(int kind) { return kind != KIND_Q6_K; }

/* Rows [first, last) of K-quant layer l (kind) against x's m rows, its records in rows (nsb a row, in order) or paired
 * (a->tiled and kquant_paired: rows 2p and 2p + 1 with their records interleaved, super-block s of row j at record
 * 2(p nsb + s) + j % 2), so that two rows are one stream. A prompt takes runs of rows of x that stay in the core's
 * cache (int8_dot.h's): each pair of rows of W formed once per run (kquant_form_row), then met by up to 4 rows of x at
 * a time. A decoding step (one row of x), or a prompt where no memory is left to form rows, reads the records as they
 * are: two rows of W at a time where they are paired (or for a prompt), else one. */
static void kquant_range(const struct linear_args *a, int l, int64_t first, int64_t last) {
    int kind = a->kinds[l];
    int64_t k = a->k, nb = k / BLOCK, nsb = k / SUPER, n = a->n[l], bytes = kquant_bytes(kind);
    int pairs = a->tiled && kquant_paired(kind);
    int64_t stride = pairs ? 2 * bytes : bytes, next = pairs ? bytes : nsb * bytes; /* next: row j + 1's */
    int64_t rows_x = max64(1, min64(MAX_X_ROWS, X_BLOCK_BYTES / k)), tall = 1;  /* tall: rows of W a kernel takes */
    const float *bias = a->bias[l];
    float *out = a->out[l];
#ifdef CPU_X86
    const kquant_fn *kernels = a->level >= LEVEL_AVX2 ? kquant_kernels(kind, a->level) : NULL;
    const kquant_formed_fn(*prompt)[4] = kernels ? kquant_formed_kernels(kind, a->level) : NULL;
    struct kquant_formed *formed = kernels && a->m > 1 ? aligned_alloc(32, 2 * (size_t)nsb * sizeof *formed) : NULL;
    if (kernels) tall = a->m > 1 || pairs ? 2 : 1;
#endif
    for (int64_t i0 = 0; i0 < a->m; i0 += rows_x) {
        int64_t end = min64(a->m, i0 + rows_x);
        for (int64_t j = first; j < last;) {
            int64_t rows = tall == 2 && last - j >= 2 && (!pairs || j % 2 == 0) ? 2 : 1;
            const uint8_t *row = a->q[l] + (pairs ? (j - j % 2) * nsb * bytes + j % 2 * bytes : j * nsb * bytes);
            float totals[8];
#ifdef CPU_X86
            if (formed) {
                for (int64_t r = 0; r < rows; r++) kquant_form_row(kind, row + r * next, stride, nsb, formed + r * nsb);
                struct kquant_formed_rows t = {{formed, formed + nsb}, NULL, NULL, NULL, nsb, k, nb};
                for (int64_t i = i0; i < end;) {
                    int64_t c = min64(4, end - i);
                    t.xq = a->xq + i * k, t.xs = a->xs + i * nb, t.xsum = a->corr + i * nb;
                    prompt[rows - 1][c - 1](&t, totals);
                    for (int64_t r = 0; r < rows; r++)
                        for (int64_t e = 0; e < c; e++)
                            out[(i + e) * n + j + r] = bias ? totals[r * c + e] + bias[j + r] : totals[r * c + e];
                    i += c;
                }
                j += rows;
                continue;
            }
#endif
            for (int64_t i = i0; i < end; i++) {
#ifdef CPU_X86
                if (kernels) {
                    struct kquant_rows t = {row, a->xq + i * k, a->xs + i * nb, a->corr + i * nb, nsb, k, nb, next,
                                            stride};
                    kernels[rows - 1](&t, totals);
                } else
#endif
                    totals[0] = kquant_dot_c(kind, row, stride, a->xq + i * k, a->xs + i * nb, a->corr + i * nb, nsb);
                for (int64_t r = 0; r < rows; r++) out[i * n + j + r] = bias ? totals[r] + bias[j + r] : totals[r];
            }
            j += rows;
        }
    }
#ifdef CPU_X86
    free(formed);
#endif
}

#endif
