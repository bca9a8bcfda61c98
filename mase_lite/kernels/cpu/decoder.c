/* One decoding step of a Llama-family model whose Linears all take int8 activations, in one call and one parallel
 * region: per layer RMSNorm, the query/key/value projections, rotary embedding, the key/value cache written in
 * place, grouped-query attention over the cache, the output projection, RMSNorm, the gated SiLU MLP, the
 * residuals; then the final norm and the head. The threads split each projection's rows (int8_dot.h: each output
 * the same bits as a call of int8_linear.c for that layer) and the attention's heads, and meet at a barrier between
 * steps; the small vector work between them runs on one thread. Per token that is one call instead of a
 * Python-level call per layer, norm and attention (measured: about 2.4 ms of a 156 M model's token on one core).
 *
 * The float work is float32 in a fixed order, so every thread count gives the same bits: norms sum squares in
 * eight lanes, attention scores in eight lanes per dot product, softmax with expf. Compiled without -ffast-math
 * and with C11 (no contraction). Builds without OpenMP too (one thread).
 */
#include "int8_dot.h"
#ifdef _OPENMP
#include <omp.h>
#endif

enum { GROUP_LAYERS = 3, MAX_HEAD_DIM = 512 };

/* Linears that share an input and a weight kind: count 1..3 (q/k/v, gate/up, one), or 0 for none. */
struct group {
    int nibbles, half, count; /* half: nibbles' scales are float16 */
    int tiled;            /* the weights and scales tiled (int8_dot.h's struct weights) */
    int kinds[GROUP_LAYERS]; /* K-quants: each layer's (kquant_dot.h; nibbles, half, tiled, itable unused); 0: none */
    const int8_t *itable; /* nibbles: the table's 16 integers */
    float unit;           /* the power of two they stand for (MXINT8: 2**-6) */
    int64_t k;            /* inputs */
    int64_t n[GROUP_LAYERS];
    const uint8_t *q[GROUP_LAYERS];
    const void *scales[GROUP_LAYERS];
    const float *bias[GROUP_LAYERS];
};

struct layer {
    const float *norm[2]; /* input and post-attention RMSNorm weights */
    float eps[2];
    struct group qkv, o, gate_up, down;
    float *keys, *values; /* [kv_heads, max_length, head_dim] */
};

struct model {
    int64_t layers, hidden, heads, kv_heads, head_dim, inter /* the widest MLP */, max_length;
    float scaling;
    const float *cos, *sin; /* [max_length, head_dim]; sin negated where rotate_half negates */
    const struct layer *layer;
    const float *norm; /* the final RMSNorm */
    float eps;
    struct group head; /* count 0: out receives the normed hidden state for the caller's head */
    int level;
};

/* The buffers of a step, in scratch's bytes: floats x, h, q, k, v, att, o, gate, up (and act in gate), scores;
 * then x's int8 codes, scales and corrections. */
struct buffers {
    float *x, *h, *q, *k, *v, *att, *o, *gate, *up, *scores, *xs;
    int8_t *xq;
    int32_t *corr;
};

static int64_t widest(const struct model *m) {
    return max64(max64(m->hidden, m->inter), m->heads * m->head_dim);
}

static size_t layout(const struct model *m, char *base, struct buffers *b) {
    int64_t hd = m->head_dim, wide = widest(m);
    int64_t sizes[] = {m->hidden, m->hidden, m->heads * hd, m->kv_heads * hd, m->kv_heads * hd, m->heads * hd,
                       m->hidden, m->inter, m->inter, m->heads * m->max_length, wide / BLOCK};
    float **slots[] = {&b->x, &b->h, &b->q, &b->k, &b->v, &b->att, &b->o, &b->gate, &b->up, &b->scores, &b->xs};
    size_t at = 0;
    for (int i = 0; i < 11; i++) {
        if (base) *slots[i] = (float *)(base + at);
        at += (size_t)(sizes[i] + 15) / 16 * 64; /* each buffer on its own cache lines */
    }
    if (base) b->corr = (int32_t *)(base + at);
    at += (size_t)(wide / BLOCK * 4 + 63) / 64 * 64; /* an int32 correction per block */
    if (base) b->xq = (int8_t *)(base + at);
    return at + (size_t)wide;
}

/* The bytes of scratch a step of this model needs (4-byte aligned). */
size_t int8_decoder_scratch(const struct model *m) { return layout(m, NULL, NULL); }

/* *a set for g's Linears over x (one row), their outputs out[0..count), x quantized into b's buffers. */
static void prepare(struct linear_args *a, const struct group *g, float *const *out, const float *x,
                    const struct buffers *b, int level) {
    struct linear_args args = {.nibbles = g->nibbles, .affine = g->nibbles && affine_table(g->itable),
                               .half = g->half, .tiled = g->tiled, .kinds = g->kinds[0] ? g->kinds : NULL,
                               .itable = g->itable, .unit = g->unit, .count = g->count, .q = g->q,
                               .scales = g->scales, .bias = g->bias, .out = out, .n = g->n, .m = 1, .k = g->k,
                               .level = level};
    *a = args;
    quantize_rows(a, x, 0, 1, b->xq, b->xs, b->corr);
    a->xq = b->xq, a->xs = b->xs, a->corr = b->corr;
}

static void rms_norm(const float *x, const float *weight, float eps, int64_t n, float *out) {
    float lanes[8] = {0};
    for (int64_t i = 0; i < n; i++) lanes[i % 8] += x[i] * x[i];
    float r = 1.0f / sqrtf(sum8(lanes) / (float)n + eps);
    for (int64_t i = 0; i < n; i++) out[i] = weight[i] * (x[i] * r);
}

/* x cos + rotate_half(x) sin for one head (sin carries rotate_half's sign), into out (may be x). */
static void rotate(const float *x, const float *cos, const float *sin, int64_t hd, float *out) {
    float copy[MAX_HEAD_DIM];
    memcpy(copy, x, (size_t)hd * sizeof(float));
    for (int64_t d = 0; d < hd; d++) out[d] = copy[d] * cos[d] + copy[(d + hd / 2) % hd] * sin[d];
}

static float dot8(const float *a, const float *b, int64_t n) {
    float lanes[8] = {0};
    int64_t d = 0;
    for (; d + 8 <= n; d += 8)
        for (int l = 0; l < 8; l++) lanes[l] += a[d + l] * b[d + l];
    for (; d < n; d++) lanes[d % 8] += a[d] * b[d];
    return sum8(lanes);
}

/* Head h's attention over positions 0..length-1 of its key/value head. */
static void attend(const struct model *m, const struct layer *L, const struct buffers *b, int64_t h, int64_t length) {
    int64_t hd = m->head_dim, g = h / (m->heads / m->kv_heads);
    const float *q = b->q + h * hd, *keys = L->keys + g * m->max_length * hd, *values = L->values + g * m->max_length * hd;
    float *scores = b->scores + h * m->max_length, *out = b->att + h * hd, top = -INFINITY, total = 0.0f;
    for (int64_t t = 0; t < length; t++) {
        scores[t] = dot8(q, keys + t * hd, hd) * m->scaling;
        top = scores[t] > top ? scores[t] : top;
    }
    for (int64_t t = 0; t < length; t++) total += scores[t] = expf(scores[t] - top);
    for (int64_t d = 0; d < hd; d++) out[d] = 0.0f;
    for (int64_t t = 0; t < length; t++) {
        float p = scores[t] / total;
        for (int64_t d = 0; d < hd; d++) out[d] += p * values[t * hd + d];
    }
}

/* This thread's share of gate = silu(gate) * up. */
static void silu_times(float *gate, const float *up, int64_t n, int thread, int threads) {
    int64_t first, last;
    part_of(n, thread, threads, &first, &last);
    for (int64_t i = first; i < last; i++) gate[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

static void add(float *x, const float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] += y[i];
}

/* This thread's share of a's rows. */
static void share(const struct linear_args *a, int thread, int threads) {
    int64_t first, last, align = row_align(a), rows = total_rows(a);
    part_of((rows + align - 1) / align, thread, threads, &first, &last);
    rows_range(a, min64(rows, first * align), min64(rows, last * align));
}

#ifdef _OPENMP
#define SINGLE _Pragma("omp single")
#define BARRIER _Pragma("omp barrier")
#else
#define SINGLE
#define BARRIER
#endif

/* The token at `position` (its embedding `embedded`, hidden floats): its keys and values written into each layer's
 * cache at `position`, and `out` the logits (head.count > 0: its rows) or the final normed hidden state. */
int int8_decoder_step(const struct model *m, const float *embedded, int64_t position, float *out, int threads,
                      void *scratch) {
    if (position < 0 || position >= m->max_length || m->head_dim > MAX_HEAD_DIM || m->head_dim % 2 ||
        m->heads % m->kv_heads)
        return -1;
    struct buffers b;
    layout(m, scratch, &b);
    int64_t hd = m->head_dim;
    const float *cos = m->cos + position * hd, *sin = m->sin + position * hd;
    memcpy(b.x, embedded, (size_t)m->hidden * sizeof(float));
    float *qkv_out[3] = {b.q, b.k, b.v}, *o_out[1] = {b.o}, *gate_up_out[2] = {b.gate, b.up}, *down_out[1] = {b.o};
    float *head_out[1] = {out};
    struct linear_args a; /* the projection now being computed: set by one thread, read by all after a barrier */
#ifdef _OPENMP
    int parts = threads < 1 ? 1 : threads;
#pragma omp parallel num_threads(parts) if (parts > 1)
#else
    (void)threads;
#endif
    {
#ifdef _OPENMP
        int thread = omp_get_thread_num(), count = omp_get_num_threads();
#else
        int thread = 0, count = 1;
#endif
        for (int64_t l = 0; l < m->layers; l++) {
            const struct layer *L = m->layer + l;
            SINGLE {
                rms_norm(b.x, L->norm[0], L->eps[0], m->hidden, b.h);
                prepare(&a, &L->qkv, qkv_out, b.h, &b, m->level);
            }
            share(&a, thread, count);
            BARRIER
            SINGLE {
                for (int64_t g = 0; g < m->kv_heads; g++) {
                    rotate(b.k + g * hd, cos, sin, hd, L->keys + (g * m->max_length + position) * hd);
                    memcpy(L->values + (g * m->max_length + position) * hd, b.v + g * hd, (size_t)hd * sizeof(float));
                }
            }
            for (int64_t h = thread; h < m->heads; h += count) {
                rotate(b.q + h * hd, cos, sin, hd, b.q + h * hd);
                attend(m, L, &b, h, position + 1);
            }
            BARRIER
            SINGLE {
                prepare(&a, &L->o, o_out, b.att, &b, m->level);
            }
            share(&a, thread, count);
            BARRIER
            SINGLE {
                add(b.x, b.o, m->hidden);
                rms_norm(b.x, L->norm[1], L->eps[1], m->hidden, b.h);
                prepare(&a, &L->gate_up, gate_up_out, b.h, &b, m->level);
            }
            share(&a, thread, count);
            BARRIER
            silu_times(b.gate, b.up, L->gate_up.n[0], thread, count); /* each thread its share: expf is costly */
            BARRIER
            SINGLE {
                prepare(&a, &L->down, down_out, b.gate, &b, m->level);
            }
            share(&a, thread, count);
            BARRIER
            SINGLE add(b.x, b.o, m->hidden);
        }
        SINGLE {
            rms_norm(b.x, m->norm, m->eps, m->hidden, m->head.count ? b.h : out);
            if (m->head.count) {
                prepare(&a, &m->head, head_out, b.h, &b, m->level);
            }
        }
        if (m->head.count) share(&a, thread, count);
    }
    return 0;
}
