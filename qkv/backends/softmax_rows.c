/* Row softmax for attention weights, written twice in one pass: back into the scores
 * (where the product P V reads it next, from cache) and into the caller's result with
 * non-temporal stores (the weights are kept, not read again soon, so each cache line is
 * written to memory without first being fetched).
 *
 * Reference: torch.softmax(s, -1), with zeros for a row whose every score is -inf.
 * Built by qkv/backends/native.py with the system C compiler and called through ctypes.
 * The kernel needs AVX-512F; qkv_cpu_ok() tells the caller whether this CPU has it.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#define AVX512 __attribute__((target("avx512f")))

int qkv_cpu_ok(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f");
}

/* exp(x) for 16 floats: x = n ln2 + r with |r| <= ln2/2 (ln2 split in two for an exact
 * product), exp(r) from a degree-7 polynomial (Cephes' expf coefficients), times 2^n.
 * About 1 ulp. exp(-inf) = 0 (x is clamped to -104, below the smallest denormal),
 * NaN stays NaN (max_ps returns its second operand when either is NaN). */
static inline AVX512 __m512 exp16(__m512 x) {
    x = _mm512_max_ps(_mm512_set1_ps(-104.0f), x);
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r);
    return _mm512_scalef_ps(_mm512_add_ps(p, _mm512_set1_ps(1.0f)), n);
}

static inline __mmask16 first(long n) { return n >= 16 ? 0xFFFF : (__mmask16)((1u << n) - 1); }

static inline AVX512 float row_max(const float *x, long n) {
    __m512 m = _mm512_set1_ps(-INFINITY);
    long j = 0;
    for (; j + 16 <= n; j += 16) m = _mm512_max_ps(_mm512_loadu_ps(x + j), m);
    if (j < n) m = _mm512_mask_max_ps(m, first(n - j), _mm512_maskz_loadu_ps(first(n - j), x + j), m);
    return _mm512_reduce_max_ps(m);
}

/* x <- exp(x - m); returns the sum. */
static inline AVX512 float exp_shifted(float *x, long n, float m) {
    __m512 vm = _mm512_set1_ps(m), sum = _mm512_setzero_ps();
    long j = 0;
    for (; j + 16 <= n; j += 16) {
        __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(x + j), vm));
        _mm512_storeu_ps(x + j, e);
        sum = _mm512_add_ps(sum, e);
    }
    if (j < n) {
        __mmask16 k = first(n - j);
        __m512 e = _mm512_maskz_mov_ps(k, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + j), vm)));
        _mm512_mask_storeu_ps(x + j, k, e);
        sum = _mm512_add_ps(sum, e);
    }
    return _mm512_reduce_add_ps(sum);
}

/* x <- x * c and y <- x * c; y streamed where it is 64-byte aligned. */
static inline AVX512 void scale_both(float *x, float *y, long n, float c) {
    __m512 vc = _mm512_set1_ps(c);
    long j = 0;
    if ((uintptr_t)y % 4 == 0) {  /* up to the first 64-byte boundary of y: masked stores */
        long head = (long)((64 - (uintptr_t)y % 64) % 64 / 4);
        head = head < n ? head : n;
        if (head) {
            __mmask16 k = first(head);
            __m512 p = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, x), vc);
            _mm512_mask_storeu_ps(x, k, p);
            _mm512_mask_storeu_ps(y, k, p);
            j = head;
        }
        for (; j + 16 <= n; j += 16) {
            __m512 p = _mm512_mul_ps(_mm512_loadu_ps(x + j), vc);
            _mm512_storeu_ps(x + j, p);
            _mm512_stream_ps(y + j, p);
        }
    }
    for (; j < n; j += 16) {
        __mmask16 k = first(n - j);
        __m512 p = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + j), vc);
        _mm512_mask_storeu_ps(x + j, k, p);
        _mm512_mask_storeu_ps(y + j, k, p);
    }
}

/* Each row of s becomes its softmax, also written to d. Both hold `outer` grids of `rows`
 * rows of n floats (s: grid stride so, row stride sr; d: do_, dr). The rows are split
 * among `threads` OpenMP threads. Built with -fopenmp, this links the libgomp that torch
 * has loaded already (same soname), so the threads are torch's own. */
AVX512 void qkv_softmax_rows(float *s, long so, long sr, float *d, long do_, long dr,
                             long outer, long rows, long n, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
    for (long k = 0; k < outer * rows; k++) {
        float *x = s + (k / rows) * so + (k % rows) * sr;
        float *y = d + (k / rows) * do_ + (k % rows) * dr;
        float m = row_max(x, n);
        if (m == -INFINITY) {  /* no visible key: zeros, not NaN (unless a score is NaN) */
            float fill = 0.0f;
            for (long j = 0; j < n; j++) fill = x[j] != x[j] ? x[j] : fill;
            for (long j = 0; j < n; j++) x[j] = y[j] = fill;
            continue;
        }
        scale_both(x, y, n, 1.0f / exp_shifted(x, n, m));
    }
    _mm_sfence();  /* streamed stores are visible before the caller reads d */
}
