/* exp(x) for 16 float32 lanes with AVX-512F, shared by the kernels beside this file
 * (softmax_rows.c, matvec.c). qkv/kernels/native.py rebuilds a kernel when this file
 * changes. */
#ifndef QKV_EXP16_H
#define QKV_EXP16_H

#include <immintrin.h>

/* exp(x) for 16 floats: x = n ln2 + r with |r| <= ln2/2 (ln2 split in two for an exact
 * product), exp(r) from a degree-7 polynomial (Cephes' expf coefficients), times 2^n.
 * About 1 ulp. Results below the smallest normal float (x < -87.33, 1.2e-38) are zero:
 * making a denormal costs a microcode assist of ~100 cycles, and every hidden key (-inf)
 * would pay it (a random mask ran 15x slower). NaN stays NaN (max_ps returns its second
 * operand when either is NaN, and the comparison keeps NaN lanes). */
static inline __attribute__((target("avx512f"))) __m512 exp16(__m512 x) {
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
    __mmask16 normal = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.33f), _CMP_NLT_UQ);
    return _mm512_maskz_scalef_ps(normal, _mm512_add_ps(p, _mm512_set1_ps(1.0f)), n);
}

#endif
