/* exp(x) and 2^x for 16 float32 lanes with AVX-512F, shared by the kernels beside this
 * file (softmax_rows.c and matvec.c take exp16, cpu_flash.c exp2_16).
 * qkv/kernels/native.py rebuilds a kernel when this file changes. */
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

/* 2^x for 16 floats: x = n + r with |r| <= 1/2, 2^r from its Taylor series to r^7
 * (coefficients ln(2)^k / k!; the first term left out is below 6e-9 of the result), times
 * 2^n. Results below the smallest normal float (x < -126) are zero, as in exp16 above. */
static inline __attribute__((target("avx512f"))) __m512 exp2_16(__m512 x) {
    x = _mm512_max_ps(_mm512_set1_ps(-150.0f), x);
    __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_sub_ps(x, n);
    __m512 p = _mm512_set1_ps(1.5252733804059840e-5f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.5403530393381608e-4f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3333558146428443e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(9.6181291076284772e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.5504108664821580e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(2.4022650695910071e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(6.9314718055994531e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    __mmask16 normal = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-126.0f), _CMP_NLT_UQ);
    return _mm512_maskz_scalef_ps(normal, p, n);
}

#endif
