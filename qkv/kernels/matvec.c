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
 * Reference: qkv/kernels/matvec.py, linear_reference. Built by qkv/kernels/native.py
 * with the system C compiler and called through ctypes; needs AVX-512F (qkv_cpu_ok()).
 */
#include <immintrin.h>
#include <stdint.h>

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

/* sum_i x[i] w[i] for one row of x and one row of weights, i < in: four sums side by
 * side over blocks of 64 inputs, then blocks of 16, then one by one */
static inline AVX512 float dot1(const float *x, const void *w, long in, int bf16) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    long i = 0;
    for (; i + 64 <= in; i += 64) {
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
            y[r * y_stride + o] = dot1(x + r * x_stride, wo, in, bf16) + (b ? b[o] : 0.0f);
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
