/* y = x W^T (+ b) for a few rows x (float32) and weights W stored as bfloat16: the
 * matrix-vector products of decoding one token at a time, where reading the weights is
 * the whole cost. Each weight is widened to float32 exactly (bfloat16 is the top half of
 * a float32) and multiplied in float32, so the result is what
 * F.linear(x, W.float(), b) computes, up to the order of the sums.
 *
 * Reference: qkv/kernels/matvec.py, linear_bf16_reference. Built by qkv/kernels/native.py
 * with the system C compiler and called through ctypes; needs AVX-512F
 * (qkv_cpu_ok()).
 */
#include <immintrin.h>
#include <stdint.h>

#define AVX512 __attribute__((target("avx512f")))

int qkv_cpu_ok(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f");
}

/* 16 bfloat16 weights w[0..16) as float32 (exact: shifted into the top half) */
static inline AVX512 __m512 widen16(const uint16_t *w) {
    __m256i half = _mm256_loadu_si256((const __m256i *)w);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
}

#define MAX_ROWS 4 /* rows of x per call; the caller splits more */

/* y[r, o0 + k] for k < K (K <= 4 outputs): full blocks of 16 inputs in vector registers,
 * the last in - in16 inputs one by one. */
static inline AVX512 void outputs(const float *x, long x_stride, const uint16_t *w,
                                  const float *b, float *y, long y_stride, long rows, long o0,
                                  int K, long in) {
    long in16 = in & ~15L;
    __m512 acc[MAX_ROWS][4];
    for (long r = 0; r < rows; r++)
        for (int k = 0; k < 4; k++) acc[r][k] = _mm512_setzero_ps();
    for (long i = 0; i < in16; i += 16) {
        __m512 wv[4];
        for (int k = 0; k < K; k++) wv[k] = widen16(w + (o0 + k) * in + i);
        for (long r = 0; r < rows; r++) {
            __m512 xv = _mm512_loadu_ps(x + r * x_stride + i);
            for (int k = 0; k < K; k++) acc[r][k] = _mm512_fmadd_ps(wv[k], xv, acc[r][k]);
        }
    }
    for (long r = 0; r < rows; r++)
        for (int k = 0; k < K; k++) {
            float sum = _mm512_reduce_add_ps(acc[r][k]);
            for (long i = in16; i < in; i++) {
                union { uint32_t u; float f; } wide = {(uint32_t)w[(o0 + k) * in + i] << 16};
                sum += wide.f * x[r * x_stride + i];
            }
            y[r * y_stride + o0 + k] = sum + (b ? b[o0 + k] : 0.0f);
        }
}

/* outputs() for one row, four outputs and whole blocks of 16 inputs, the case of decoding
 * one token, with its sums in named registers */
static inline AVX512 void one_row4(const float *x, const uint16_t *w, const float *b, float *y,
                                   long o0, long in) {
    const uint16_t *w0 = w + o0 * in, *w1 = w0 + in, *w2 = w1 + in, *w3 = w2 + in;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (long i = 0; i < in; i += 16) {
        __m512 xv = _mm512_loadu_ps(x + i);
        a0 = _mm512_fmadd_ps(widen16(w0 + i), xv, a0);
        a1 = _mm512_fmadd_ps(widen16(w1 + i), xv, a1);
        a2 = _mm512_fmadd_ps(widen16(w2 + i), xv, a2);
        a3 = _mm512_fmadd_ps(widen16(w3 + i), xv, a3);
    }
    y[o0] = _mm512_reduce_add_ps(a0) + (b ? b[o0] : 0.0f);
    y[o0 + 1] = _mm512_reduce_add_ps(a1) + (b ? b[o0 + 1] : 0.0f);
    y[o0 + 2] = _mm512_reduce_add_ps(a2) + (b ? b[o0 + 2] : 0.0f);
    y[o0 + 3] = _mm512_reduce_add_ps(a3) + (b ? b[o0 + 3] : 0.0f);
}

/* y[r, o] = sum_i x[r, i] w[o, i] + b[o], r < rows <= MAX_ROWS, o < out, i < in.
 * x rows are x_stride floats apart, y rows y_stride; w is (out, in) contiguous; b may be
 * NULL. Output features go four at a time (four independent sums keep the multiply-add
 * units busy while the weights stream in), split among `threads` OpenMP threads. */
AVX512 void qkv_matvec_bf16(const float *x, long x_stride, const uint16_t *w, const float *b,
                            float *y, long y_stride, long rows, long out, long in,
                            int threads) {
    long blocks = out / 4;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (long blk = 0; blk < blocks; blk++) {
        if (rows == 1 && in % 16 == 0)
            one_row4(x, w, b, y, blk * 4, in);
        else
            outputs(x, x_stride, w, b, y, y_stride, rows, blk * 4, 4, in);
    }
    if (out % 4) outputs(x, x_stride, w, b, y, y_stride, rows, blocks * 4, (int)(out % 4), in);
}
