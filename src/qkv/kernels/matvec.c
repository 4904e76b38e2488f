/* y = x W^T (+ b) for a few rows x (float32) and weights W of float32 or bfloat16: the
 * matrix-vector products of decoding one token at a time, where reading the weights is
 * the whole cost. A bfloat16 weight is widened to float32 exactly (bfloat16 is the top
 * half of a float32) and every product is summed in float32, so the result is what
 * F.linear(x, W.float(), b) computes, up to the order of the sums.
 *
 * The weights are read once, row after row, in the order they lie in memory: one stream
 * that the hardware prefetcher follows (reading four rows side by side, four streams,
 * halved the rate on the machine of BENCHMARKS.md, 'LLaMA-family decoding').
 *
 * qkv_llama_layer runs a whole LLaMA decoder layer for one token with these products and
 * the few small steps between them (norms, rotary positions, the cache, attention), which
 * in torch are some thirty operations a layer, each costing more in dispatch than in
 * arithmetic at one token. Its weights and KV cache are float32 or bfloat16; everything
 * else is float32.
 *
 * References: qkv/kernels/matvec.py, linear_reference, and qkv/kernels/decode_layer.py,
 * layer_reference. Built by qkv/kernels/native.py with the system C compiler and called
 * through ctypes; needs AVX-512F (qkv_cpu_ok()).
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "exp16.h"

#define AVX512 __attribute__((target("avx512f")))

int qkv_cpu_ok(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f");
}

/* weights w[i .. i+16) as float32: loaded, or (bf16) widened by a shift into the top half */
static inline AVX512 __m512 load16(const void *w, long i, int bf16) {
    if (!bf16) return _mm512_loadu_ps((const float *)w + i);
    __m256i half = _mm256_loadu_si256((const __m256i *)((const uint16_t *)w + i));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
}

static inline float load1(const void *w, long i, int bf16) {
    if (!bf16) return ((const float *)w)[i];
    union { uint32_t u; float f; } wide = {(uint32_t)((const uint16_t *)w)[i] << 16};
    return wide.f;
}

#define AHEAD 4096 /* bytes of weights asked for before they are read (see dot1) */

/* sum_i x[i] w[i] for one row of x and one row of weights, i < in: four sums side by
 * side over blocks of 64 inputs, then blocks of 16, then one by one. Each block asks for
 * the weights AHEAD bytes further on, into L2 (a prefetch never faults, past the end
 * included): over the matrices of SmolLM2's layers on one thread this read float32 at
 * 12.4-12.9 GB/s and bfloat16 at 11.2-11.9, where no prefetch read 11.4 in float32, and
 * a prefetch 2 KB ahead into L1 12.3 and 9.8 (a sum of the same memory: 12-13 GB/s;
 * BENCHMARKS.md, 'LLaMA-family decoding'). matvec and attend call it with bf16 a
 * constant, so that each type gets its own loop, without a test of bf16 inside. */
static inline AVX512 float dot1(const float *x, const void *w, long in, int bf16) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    long i = 0, size = bf16 ? 2 : 4;
    for (; i + 64 <= in; i += 64) {
        const char *ahead = (const char *)w + i * size + AHEAD;
        for (long line = 0; line < 64 * size; line += 64) _mm_prefetch(ahead + line, _MM_HINT_T1);
        a0 = _mm512_fmadd_ps(load16(w, i, bf16), _mm512_loadu_ps(x + i), a0);
        a1 = _mm512_fmadd_ps(load16(w, i + 16, bf16), _mm512_loadu_ps(x + i + 16), a1);
        a2 = _mm512_fmadd_ps(load16(w, i + 32, bf16), _mm512_loadu_ps(x + i + 32), a2);
        a3 = _mm512_fmadd_ps(load16(w, i + 48, bf16), _mm512_loadu_ps(x + i + 48), a3);
    }
    for (; i + 16 <= in; i += 16)
        a0 = _mm512_fmadd_ps(load16(w, i, bf16), _mm512_loadu_ps(x + i), a0);
    float sum = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
    for (; i < in; i++) sum += load1(w, i, bf16) * x[i];
    return sum;
}

/* y[r, o] = sum_i x[r, i] w[o, i] + b[o], r < rows, o < out, i < in.
 * x rows are x_stride floats apart, y rows y_stride; w is (out, in) contiguous, float32
 * or (bf16) bfloat16; b may be NULL. The output features are split among `threads`
 * OpenMP threads in contiguous ranges, so each thread also reads its weights in order. */
static inline AVX512 void matvec(const float *x, long x_stride, const void *w, int bf16,
                                 const float *b, float *y, long y_stride, long rows,
                                 long out, long in, int threads) {
    long row_bytes = in * (bf16 ? 2 : 4);
#pragma omp parallel for num_threads(threads) schedule(static)
    for (long o = 0; o < out; o++) {
        const void *wo = (const char *)w + o * row_bytes;
        for (long r = 0; r < rows; r++) /* rows after the first read the weights from L1 */
            y[r * y_stride + o] = (bf16 ? dot1(x + r * x_stride, wo, in, 1) /* one loop */
                                        : dot1(x + r * x_stride, wo, in, 0)) /* per type */
                                  + (b ? b[o] : 0.0f);
    }
}

AVX512 void qkv_matvec_f32(const float *x, long x_stride, const float *w, const float *b,
                           float *y, long y_stride, long rows, long out, long in, int threads) {
    matvec(x, x_stride, w, 0, b, y, y_stride, rows, out, in, threads);
}

AVX512 void qkv_matvec_bf16(const float *x, long x_stride, const uint16_t *w, const float *b,
                            float *y, long y_stride, long rows, long out, long in,
                            int threads) {
    matvec(x, x_stride, w, 1, b, y, y_stride, rows, out, in, threads);
}

/* ---- One LLaMA decoder layer for one token -----------------------------------------
 * x <- x + Attn(RMSNorm(x)); x <- x + SwiGLU(RMSNorm(x)), as qkv.models.Llama's layer
 * computes it for one new token, with its key and value written into the cache. The
 * projections and the cache are float32, or all bfloat16 (bf16); the residual stream x,
 * the gains, the biases and every sum are float32.
 */

/* The layer's weights, (out, in) row-major, float32 or bfloat16; gains and biases
 * float32, a bias may be NULL. */
typedef struct {
    const float *attn_norm;
    const void *wq;
    const float *bq;
    const void *wk;
    const float *bk;
    const void *wv;
    const float *bv;
    const void *wo;
    const float *bo;
    const float *ff_norm;
    const void *wg;
    const float *bg;
    const void *wu;
    const float *bu;
    const void *wd;
    const float *bd;
} qkv_llama_weights;

/* float32 -> bfloat16 rounded to nearest, ties to even (as torch rounds); NaN stays NaN */
static inline uint16_t to_bf16(float value) {
    union { float f; uint32_t u; } bits = {value};
    if ((bits.u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
    return (uint16_t)((bits.u + 0x7fffu + ((bits.u >> 16) & 1u)) >> 16);
}

/* y = RMSNorm(x) g over n values: x / sqrt(mean(x^2) + eps), times the gain */
static inline AVX512 void rms_norm(const float *x, const float *g, float eps, float *y, long n) {
    __m512 squares16 = _mm512_setzero_ps();
    long i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        squares16 = _mm512_fmadd_ps(v, v, squares16);
    }
    float squares = _mm512_reduce_add_ps(squares16);
    for (; i < n; i++) squares += x[i] * x[i];
    float r = 1.0f / sqrtf(squares / (float)n + eps);
    for (i = 0; i < n; i++) y[i] = g[i] * (x[i] * r);
}

/* v <- v cos + rotate_half(v) sin over one head of d values, rotate_half(v1, v2) = (-v2, v1) */
static inline AVX512 void rotate(float *v, const float *cos, const float *sin, long d) {
    long half = d / 2;
    for (long i = 0; i < half; i++) {
        float a = v[i], b = v[i + half];
        v[i] = a * cos[i] - b * sin[i];
        v[i + half] = b * cos[i + half] + a * sin[i + half];
    }
}

/* gate <- SiLU(gate) * up = gate / (1 + exp(-gate)) * up over n values */
static inline AVX512 void silu_times(float *gate, const float *up, long n) {
    long i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 g = _mm512_loadu_ps(gate + i);
        __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
        __m512 silu = _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
        _mm512_storeu_ps(gate + i, _mm512_mul_ps(silu, _mm512_loadu_ps(up + i)));
    }
    for (; i < n; i++) gate[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

/* out = softmax(q K^T / sqrt(d)) V over the keys first..last of one key/value head;
 * keys and values are rows of d float32 or (bf16) bfloat16 values; p holds
 * last - first + 1 floats. Called with bf16 a constant (one loop per type, as dot1). */
static inline AVX512 void attend(const float *q, const void *k, const void *v, int bf16,
                                 long first, long last, long d, float *p, float *out) {
    float scale = 1.0f / sqrtf((float)d), top = -INFINITY, total = 0.0f;
    long row_bytes = d * (bf16 ? 2 : 4);
    for (long j = first; j <= last; j++) {
        float s = dot1(q, (const char *)k + j * row_bytes, d, bf16) * scale;
        p[j - first] = s;
        top = s > top ? s : top;
    }
    for (long j = first; j <= last; j++) {
        p[j - first] = expf(p[j - first] - top);
        total += p[j - first];
    }
    long i = 0;
    for (; i + 16 <= d; i += 16) { /* 16 columns of the weighted sum at a time */
        __m512 sum = _mm512_setzero_ps();
        for (long j = first; j <= last; j++)
            sum = _mm512_fmadd_ps(_mm512_set1_ps(p[j - first]), load16(v, j * d + i, bf16), sum);
        _mm512_storeu_ps(out + i, _mm512_div_ps(sum, _mm512_set1_ps(total)));
    }
    for (; i < d; i++) {
        float sum = 0.0f;
        for (long j = first; j <= last; j++) sum += p[j - first] * load1(v, j * d + i, bf16);
        out[i] = sum / total;
    }
}

static inline int threads_for(long out, int threads) {
    long most = out / 16 > 1 ? out / 16 : 1; /* at least 16 output rows a thread */
    return (int)(threads < most ? threads : most);
}

static AVX512 void product(const float *x, const void *w, int bf16, const float *b, float *y,
                           long out, long in, int threads) {
    matvec(x, 0, w, bf16, b, y, 0, 1, out, in, threads_for(out, threads));
}

/* One token through one layer. x (e): the residual stream, updated in place. cos, sin
 * (d): the rotation of this token's position. k_cache, v_cache (hkv, capacity, d): the
 * cached keys and values, positions 0..length-1 filled; this token's go to position
 * `length`, and the token attends to positions from length + 1 - window (window 0: all).
 * bf16: the projections and the caches are bfloat16 (a key or value is rounded once, as
 * it is written), else float32.
 * Returns 0, or -1 when memory for the scratch could not be had (nothing written). */
AVX512 int qkv_llama_layer(float *x, const qkv_llama_weights *w, int bf16, const float *cos,
                           const float *sin, void *k_cache, void *v_cache, long capacity,
                           long length, long window, long e, long h, long hkv, long d, long f,
                           float eps, int threads) {
    long last = length, first = window > 0 && length + 1 > window ? length + 1 - window : 0;
    long keys = last - first + 1;
    long floats = e + 2 * h * d + 2 * hkv * d + 2 * f + h * keys;
    float *scratch = malloc(sizeof(float) * floats);
    if (!scratch) return -1;
    float *xn = scratch, *q = xn + e, *heads = q + h * d, *k = heads + h * d, *v = k + hkv * d;
    float *gate = v + hkv * d, *up = gate + f, *p = up + f;

    /* attention: project, rotate, append to the cache, attend per head, project back */
    rms_norm(x, w->attn_norm, eps, xn, e);
    product(xn, w->wq, bf16, w->bq, q, h * d, e, threads);
    product(xn, w->wk, bf16, w->bk, k, hkv * d, e, threads);
    product(xn, w->wv, bf16, w->bv, v, hkv * d, e, threads);
    for (long g = 0; g < hkv; g++) rotate(k + g * d, cos, sin, d);
    for (long g = 0; g < hkv; g++) {
        long at = (g * capacity + length) * d; /* this token's row of head g */
        for (long i = 0; i < d; i++) {
            if (bf16) {
                ((uint16_t *)k_cache)[at + i] = to_bf16(k[g * d + i]);
                ((uint16_t *)v_cache)[at + i] = to_bf16(v[g * d + i]);
            } else {
                ((float *)k_cache)[at + i] = k[g * d + i];
                ((float *)v_cache)[at + i] = v[g * d + i];
            }
        }
    }
    long group = h / hkv, head_bytes = capacity * d * (bf16 ? 2 : 4); /* per key/value head */
#pragma omp parallel for num_threads(threads) schedule(static) /* the heads among the threads */
    for (long i = 0; i < h; i++) {
        long g = i / group; /* group query heads share a key/value head */
        rotate(q + i * d, cos, sin, d);
        const char *keys_g = (char *)k_cache + g * head_bytes;
        const char *values_g = (char *)v_cache + g * head_bytes;
        if (bf16)
            attend(q + i * d, keys_g, values_g, 1, first, last, d, p + i * keys, heads + i * d);
        else
            attend(q + i * d, keys_g, values_g, 0, first, last, d, p + i * keys, heads + i * d);
    }
    product(heads, w->wo, bf16, w->bo, xn, e, h * d, threads);
    for (long i = 0; i < e; i++) x[i] += xn[i];

    /* feed-forward: x + down(silu(gate(n)) * up(n)) */
    rms_norm(x, w->ff_norm, eps, xn, e);
    product(xn, w->wg, bf16, w->bg, gate, f, e, threads);
    product(xn, w->wu, bf16, w->bu, up, f, e, threads);
    silu_times(gate, up, f);
    product(gate, w->wd, bf16, w->bd, xn, e, f, threads);
    for (long i = 0; i < e; i++) x[i] += xn[i];
    free(scratch);
    return 0;
}

/* ---- The steps between the products of a prompt --------------------------------------
 * Over many tokens the products are matrix products (torch's), and what lies between them
 * is the same few steps as above, row after row: here each is one pass over its rows,
 * split among `threads` OpenMP threads.
 */

/* y[r] = RMSNorm(x[r]) g for rows r < rows of n values */
AVX512 void qkv_rms_norm_rows(const float *x, const float *g, float eps, float *y, long rows,
                              long n, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (long r = 0; r < rows; r++) rms_norm(x + r * n, g, eps, y + r * n, n);
}

/* Rotate every head of v (batch, tokens, heads, d) in place; token t of sequence b turns
 * by cos, sin rows b * cs_batch + t of d values (cs_batch 0: one rotation for the batch) */
AVX512 void qkv_rotate_rows(float *v, const float *cos, const float *sin, long batch,
                            long tokens, long heads, long d, long cs_batch, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (long row = 0; row < batch * tokens; row++) {
        long at = (row / tokens * cs_batch + row % tokens) * d;
        for (long i = 0; i < heads; i++) rotate(v + (row * heads + i) * d, cos + at, sin + at, d);
    }
}

/* gate <- SiLU(gate) * up over n values, in blocks among the threads */
AVX512 void qkv_silu_times(float *gate, const float *up, long n, int threads) {
    long block = 4096;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (long start = 0; start < n; start += block)
        silu_times(gate + start, up + start, n - start < block ? n - start : block);
}
