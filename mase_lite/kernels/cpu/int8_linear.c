/* Linear layers with int8 activations on the CPU (llama.cpp's way of multiplying its Q4_0 and Q8_0 weights):
 * y = x . W^T + b with x quantized per block of 32 and W one of
 *
 *   - nibbles: two 4-bit codes a byte (the even element in the low nibble), a float32 or float16 scale per block of
 *     32 and the 16 integers a code stands for (itable, the caller's table divided by a power of two it folds back in);
 *   - codes: int8 codes in -127..127 with an E8M0 scale (a uint8 exponent: MXINT8) or a float16 one (GGUF's Q8_0)
 *     per block of 32.
 *
 * x's block: scale amax / 127, codes round-half-even(x * (127 / amax)) in -127..127 (a block holding an infinity
 * or a NaN: codes 0, scale NaN, so the outputs it reaches are NaN; a block whose 127 / amax overflows, amax below
 * 127 / FLT_MAX: codes 0). For nibbles the codes are stored as the
 * block's even elements, then its odd ones (the nibbles' order). A block's 32 products are summed exactly in int32,
 * and each output accumulates its blocks in order in one float32 chain by a fused multiply-add with the two blocks'
 * scales multiplied (fmaf(sum, xs * ws, acc)), then times the table's unit and plus the bias: every level computes the
 * same integers and the same float operations in the same order, so its result is bit for bit the plain C one, at any
 * thread count (rows of W are split, never a sum) and for any batch (a row of x gives the bits it gives alone).
 *
 * How the vector levels form the integers (all exact), in tiles of 8 rows of W, one per lane (int8_dot.h): VNNI's
 * vpdpbusd multiplies unsigned by signed bytes, AVX2's vpmaddubsw too (pairs summed in int16, which |x| <= 127 and
 * weights of at most 15 unsigned or 128 in magnitude never overflow). An affine table (itable[n] = n + c: Q4_0's -8..7)
 * multiplies the nibbles themselves and starts from c times the sum of x's block (computed once per x block); under
 * VNNI looked-up values and 8-bit codes are made unsigned by flipping their sign bit (+128) and start from -128 times
 * that sum; otherwise (AVX2) |w| (unsigned, so Q8_0's -128 too) meets x carrying the weight's sign. The tile's blocks
 * are met transposed (vector t: bytes 4t..4t+3 of the 8 rows) against x's 4 bytes t broadcast, so that each row of x
 * costs 8 products a block for 8 rows of W and each row's sum stays in its lane. Weights held tiled (the layers with
 * int8 activations tile theirs in place: int8_dot.h's struct weights) are read so, one stream a tile, by one row of x
 * (a decoding step) as by many; weights in rows are formed and transposed once per run of rows of x, and one row of x
 * meets each row's whole block instead, its eight lanes summed across the tile's rows.
 *
 * Three levels, chosen by the caller from cpu_kernels_levels(): plain C, AVX2 and AVX-512 (VNNI where the CPU has
 * it, else AVX2's instructions; on 256-bit vectors, a K-quant prompt's on 512-bit ones). Compiled without
 * -ffast-math and with C11 (no contraction).
 */
#include "int8_dot.h"

static void rows_part(const void *a, int part, int64_t first, int64_t last) {
    (void)part;
    rows_range(a, first, last);
}

enum { QUANTIZE_PARALLEL = 1 << 16 }; /* inputs from which x is quantized on all the threads */

struct quantize_args {
    const struct linear_args *a;
    const float *x;
    int8_t *xq;
    float *xs;
    int32_t *corr;
};

static void quantize_part(const void *p, int part, int64_t first, int64_t last) {
    const struct quantize_args *q = p;
    (void)part;
    quantize_rows(q->a, q->x, first, last, q->xq, q->xs, q->corr);
}

/* Whether tiled layers' rows make whole tiles (of `rows`). */
static int whole_tiles(const int64_t *n, int count, int tiled, int64_t rows) {
    for (int l = 0; tiled && l < count; l++)
        if (n[l] % rows) return 0;
    return 1;
}

/* The bytes of scratch a call of m rows of x of k columns takes (int8_linear_*'s scratch): x's codes, a float32
 * scale and an int32 correction per block of 32; for K-quants (`kquants`), a prompt's bands too. */
size_t int8_scratch_bytes(int64_t m, int64_t k, int kquants) {
    size_t bytes = (size_t)(m * k + m * k / 4);
#ifdef CPU_X86
    if (kquants && m > 1) bytes += 63 + (size_t)((m + 15) / 16) * (size_t)(k / SUPER) * sizeof(struct kquant_band);
#endif
    return bytes;
}

#ifdef CPU_X86
static void bands_part(const void *p, int part, int64_t first, int64_t last) {
    const struct linear_args *a = p;
    (void)part;
    kquant_bands(a->xq, a->xs, a->corr, a->m, a->k, first, last, (struct kquant_band *)a->bands);
}
#endif

static void run(struct linear_args *a, const float *x, int threads, void *scratch) {
    int64_t mk = a->m * a->k;
    float *xs = (float *)((char *)scratch + mk);
    struct quantize_args q = {a, x, scratch, xs, (int32_t *)(xs + mk / BLOCK)};
    split_rows(quantize_part, &q, a->m, 1, mk >= QUANTIZE_PARALLEL ? threads : 1);
    a->xq = q.xq, a->xs = q.xs, a->corr = q.corr;
#ifdef CPU_X86
    if (a->kinds && a->m > 1 && a->level >= LEVEL_AVX2) { /* a K-quant prompt: x in bands, after x's codes */
        size_t codes = int8_scratch_bytes(a->m, a->k, 0);
        a->bands = (void *)(((uintptr_t)scratch + codes + 63) & ~(uintptr_t)63);
        split_rows(bands_part, a, (a->m + 15) / 16, 1, mk >= QUANTIZE_PARALLEL ? threads : 1);
    }
#endif
    split_rows(rows_part, a, total_rows(a), row_align(a), threads);
}

/* out[l][i * n[l] + j] = sum_t x[i * k + t] * W_l[j, t] (+ bias[l][j]) for the `count` layers (at most 8) that
 * share x, x quantized as above: the m rows of x (k a multiple of 32) and the n[l] rows of each W_l, on `threads`
 * threads (OpenMP builds). scratch: int8_scratch_bytes(m, k, 0) bytes (x's codes, then a float32 scale and an int32
 * correction per block), 4-byte aligned. Nibbles: q[l] n[l] rows of
 * k / 2 bytes, scales[l] n[l] rows of k / 32 float32 (float16 where `half`), itable the 16 integers of every
 * layer, unit the power of two they are multiplied by; `tiled`: every layer's weights and scales tiled (int8_dot.h's
 * struct weights; n[l] multiples of 8). Returns -1 (nothing done) for more than 8 layers or tiles of fewer rows. */
int int8_linear_nibbles(const float *x, int64_t m, int64_t k, int count, const uint8_t *const *q,
                        const void *const *scales, int half, const float *const *bias, float *const *out,
                        const int64_t *n, const int8_t *itable, float unit, int tiled, int level, int threads,
                        void *scratch) {
    if (count < 1 || count > MAX_LAYERS || !whole_tiles(n, count, tiled, TILE_ROWS)) return -1;
    struct linear_args a = {.nibbles = 1, .affine = affine_table(itable), .half = half, .tiled = tiled,
                            .itable = itable, .unit = unit, .count = count, .q = q, .scales = scales, .bias = bias,
                            .out = out, .n = n, .m = m, .k = k, .level = level};
    run(&a, x, threads, scratch);
    return 0;
}

/* The same for 8-bit codes: codes[l] n[l] rows of k int8 (-127..127), scales[l] n[l] rows of k / 32 scales (or both
 * tiled): MXINT8's E8M0 exponents, a weight code * 2**-6 * 2**(scale - 127); or, `half`, GGUF Q8_0's float16 d, a
 * weight code * d. */
int int8_linear_codes(const float *x, int64_t m, int64_t k, int count, const int8_t *const *codes,
                      const void *const *scales, int half, const float *const *bias, float *const *out,
                      const int64_t *n, int tiled, int level, int threads, void *scratch) {
    if (count < 1 || count > MAX_LAYERS || !whole_tiles(n, count, tiled, TILE_ROWS)) return -1;
    struct linear_args a = {.unit = half ? 1.0f : 1.0f / 64.0f, .half = half, .tiled = tiled, .count = count,
                            .q = (const uint8_t *const *)codes,
                            .scales = (const void *const *)scales, .bias = bias, .out = out, .n = n, .m = m, .k = k,
                            .level = level};
    run(&a, x, threads, scratch);
    return 0;
}

/* The same for GGML's K-quants (kquant_dot.h: x quantized per super-block of 256, as llama.cpp's Q8_K): q[l] n[l] rows
 * of k / 256 records of kinds[l] (KIND_Q2_K .. KIND_Q6_K; k a multiple of 256); `tiled`: every layer's records paired
 * (n[l] even). scratch: int8_scratch_bytes(m, k, 1) bytes, where a prompt (m > 1, a vector level) also lays x out in
 * pairs of bands of 8 rows. */
int int8_linear_kquants(const float *x, int64_t m, int64_t k, int count, const uint8_t *const *q, const int *kinds,
                        const float *const *bias, float *const *out, const int64_t *n, int tiled, int level,
                        int threads, void *scratch) {
    if (count < 1 || count > MAX_LAYERS || k % SUPER || !whole_tiles(n, count, tiled, 2)) return -1;
    for (int l = 0; l < count; l++)
        if (kinds[l] < KIND_Q4_K || kinds[l] >= KINDS) return -1;
    struct linear_args a = {.unit = 1.0f, .kinds = kinds, .tiled = tiled, .count = count, .q = q, .bias = bias,
                            .out = out, .n = n, .m = m, .k = k, .level = level};
    run(&a, x, threads, scratch);
    return 0;
}
