/* Row softmax for attention, in place over a block of scores, with what torch needs
 * several passes for folded into one: the scale, a boolean mask (read as bytes, never
 * made into a float bias), a float bias, a causal limit, and a second copy of the result
 * written with non-temporal stores (attention weights that the caller keeps: each cache
 * line goes to memory without first being fetched).
 *
 * Reference: torch.softmax(s * scale + bias, -1) with hidden scores at -inf and zeros for
 * a row that sees no key (qkv/backends/native.py, softmax_rows_reference).
 * Built by qkv/backends/native.py with the system C compiler and called through ctypes.
 * The kernel needs AVX-512F; qkv_cpu_ok() tells the caller whether this CPU has it.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "exp16.h"

#define AVX512 __attribute__((target("avx512f")))

int qkv_cpu_ok(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f");
}

static inline __mmask16 first(long n) { return n >= 16 ? 0xFFFF : (__mmask16)((1u << n) - 1); }

/* Keys visible among the next min(16, left) mask bytes (nonzero = may attend). */
static inline AVX512 __mmask16 visible16(const uint8_t *m, long left) {
    __m128i bytes;
    if (left >= 16) {
        bytes = _mm_loadu_si128((const __m128i *)m);
    } else {  /* never read past the mask's end */
        uint8_t tail[16] = {0};
        memcpy(tail, m, (size_t)left);
        bytes = _mm_loadu_si128((const __m128i *)tail);
    }
    __m512i v = _mm512_cvtepu8_epi32(bytes);
    return _mm512_test_epi32_mask(v, v);
}

/* x <- x * scale + bias, -inf where the mask hides a key; returns the maximum. */
static inline AVX512 float prepare(float *x, const uint8_t *m, const float *b, long n, float c) {
    __m512 vc = _mm512_set1_ps(c), ninf = _mm512_set1_ps(-INFINITY), mx = ninf;
    for (long j = 0; j < n; j += 16) {
        __mmask16 k = first(n - j);
        __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + j), vc);
        if (b) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(k, b + j));
        if (m) v = _mm512_mask_mov_ps(ninf, visible16(m + j, n - j), v);
        _mm512_mask_storeu_ps(x + j, k, v);
        mx = _mm512_mask_max_ps(mx, k, v, mx);
    }
    return _mm512_reduce_max_ps(mx);
}

static inline AVX512 float row_max(const float *x, long n) {
    __m512 m = _mm512_set1_ps(-INFINITY);
    long j = 0;
    for (; j + 16 <= n; j += 16) m = _mm512_max_ps(_mm512_loadu_ps(x + j), m);
    if (j < n) m = _mm512_mask_max_ps(m, first(n - j), _mm512_maskz_loadu_ps(first(n - j), x + j), m);
    return _mm512_reduce_max_ps(m);
}

/* x <- exp((x - m) * c); returns the sum. */
static inline AVX512 float exp_shifted(float *x, long n, float m, float c) {
    __m512 vm = _mm512_set1_ps(m), vc = _mm512_set1_ps(c), sum = _mm512_setzero_ps();
    long j = 0;
    for (; j + 16 <= n; j += 16) {
        __m512 e = exp16(_mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(x + j), vm), vc));
        _mm512_storeu_ps(x + j, e);
        sum = _mm512_add_ps(sum, e);
    }
    if (j < n) {
        __mmask16 k = first(n - j);
        __m512 d = _mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + j), vm);
        __m512 e = _mm512_maskz_mov_ps(k, exp16(_mm512_mul_ps(d, vc)));
        _mm512_mask_storeu_ps(x + j, k, e);
        sum = _mm512_add_ps(sum, e);
    }
    return _mm512_reduce_add_ps(sum);
}

/* x <- x * c and, unless y is NULL, y <- x * c, streamed where y is 64-byte aligned. */
static inline AVX512 void scale_both(float *x, float *y, long n, float c) {
    __m512 vc = _mm512_set1_ps(c);
    long j = 0;
    if (y && (uintptr_t)y % 4 == 0) {  /* up to the first 64-byte boundary: masked stores */
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
        if (y) _mm512_mask_storeu_ps(y + j, k, p);
    }
}

/* One row: n scores, of which the first `seen` may be visible (the rest are causal). */
static inline AVX512 void softmax_row(float *x, float *y, const uint8_t *m, const float *b,
                                      long n, long seen, float c) {
    /* Without a mask or bias a positive scale waits for the exponent: max(c x) = c max(x),
     * and (x - max) c is exact for c a power of two. Else a first pass prepares the row. */
    int later = !m && !b && c > 0.0f;
    float mx = later ? row_max(x, seen) : prepare(x, m, b, seen, c);
    if (mx == -INFINITY) {  /* no visible key: zeros, not NaN (unless a score is NaN) */
        float fill = 0.0f;
        for (long j = 0; j < seen; j++) fill = x[j] != x[j] ? x[j] : fill;
        for (long j = 0; j < seen; j++) x[j] = fill;
        if (y)
            for (long j = 0; j < seen; j++) y[j] = fill;
    } else {
        scale_both(x, y, seen, 1.0f / exp_shifted(x, seen, mx, later ? c : 1.0f));
    }
    for (long j = seen; j < n; j++) x[j] = 0.0f;
    if (y)
        for (long j = seen; j < n; j++) y[j] = 0.0f;
}

/* Each row of `outer` grids of `rows` rows of n scores becomes its softmax. A tensor's
 * element (g, r, j) is at p[g * (grid stride) + r * (row stride) + j]:
 *   s (so, sr): the scores, in place;   d (do_, dr): a streamed copy of the result, or NULL;
 *   m (mo, mr): a boolean mask, or NULL; b (bo, br): a float bias, or NULL (strides of 0
 *   broadcast them); scale: multiplies the scores first; row r sees at most its first
 *   seen0 + r keys (a causal limit; seen0 >= n: none).
 * The rows are split among `threads` OpenMP threads. Built with -fopenmp, this links the
 * libgomp that torch has loaded already (same soname), so the threads are torch's own. */
AVX512 void qkv_softmax_rows(float *s, long so, long sr, float *d, long do_, long dr,
                             const uint8_t *m, long mo, long mr, const float *b, long bo,
                             long br, long outer, long rows, long n, float scale, long seen0,
                             int threads) {
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
    for (long k = 0; k < outer * rows; k++) {
        long g = k / rows, r = k % rows;
        long seen = seen0 + r < n ? (seen0 + r > 0 ? seen0 + r : 0) : n;
        softmax_row(s + g * so + r * sr, d ? d + g * do_ + r * dr : NULL,
                    m ? m + g * mo + r * mr : NULL, b ? b + g * bo + r * br : NULL, n, seen,
                    scale);
    }
    _mm_sfence();  /* streamed stores are visible before the caller reads d */
}
