/* Attention in float32 on the CPU, computed the flash way: softmax(q k^T * scale) v, row
 * by row over blocks of keys, keeping for each query row a running maximum, a running
 * sum and an output rescaled whenever the maximum grows, so that no score matrix is
 * ever stored (Dao et al., 2022). Optionally causal (bottom-right aligned: query row t of
 * Tq sees keys 0 .. t + Tk - Tq) and grouped (Hkv key/value heads, each shared by
 * R = H / Hkv query heads).
 *
 * How it is laid out, so that both products run from registers at the arithmetic rate:
 * - The query rows of one key/value head are taken together, R heads of each position
 *   in turn (row r = t R + j is position t of query head g R + j), MR = 6 rows at a
 *   time, so that every key that is loaded serves 6 rows.
 * - The keys are first copied transposed (gathered 16 at a time), in panels of 32 keys
 *   (kt[n / 32][d][n % 32], zeros past Tk), so that 32 scores of a row are 2 vectors of 16
 *   keys that one broadcast query element multiplies: scores of 6 rows x 64 keys in 24
 *   registers, read from two panels that each lie in one piece (a transposed matrix whose
 *   rows are 4 KB apart would map them to the same few lines of the L1 cache).
 * - GT = 4 tiles walk over the keys side by side, block after block, so that a block of
 *   keys and values comes from memory once for 24 rows and then from the cache.
 * - The values are read as they lie (row n is Dv contiguous floats): the output of 6
 *   rows x 64 columns sits in 24 registers while each key adds p * v[n].
 * - The scale, times log2(e), is applied to the query rows once, as they are copied:
 *   the scores come out in base 2, and exp(s - max) is 2^(s' - max'), one multiplication
 *   fewer per score (the log-sum-exp is turned back into base e at the end).
 * A row's keys past its causal limit are skipped in whole blocks where every row of the
 * 6 is past them, and count as zero weight where only some rows are.
 *
 * A row that sees no key (causal with Tq > Tk) gets zeros and a log-sum-exp of -inf.
 *
 * Reference: qkv/attention.py (attention), the formula; qkv/kernels/cpu_flash.py checks
 * and calls this. Built by qkv/kernels/native.py with the system C compiler and called
 * through ctypes; needs AVX-512F (qkv_cpu_ok()). Rows are split among OpenMP threads.
 */
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "exp16.h"

#define AVX512 __attribute__((target("avx512f")))
#define INLINE static inline __attribute__((always_inline, target("avx512f")))
#define MR 6      /* query rows per tile */
#define NK 256    /* keys per block of the online softmax */
#define MAX_D 512 /* head sizes up to this (the tiles' copies live on the stack) */
#define GT 4      /* tiles that walk over the keys side by side */

int qkv_cpu_ok(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f");
}

/* The first n lanes of 16 (none for n <= 0). */
static inline __mmask16 first(long n) {
    return n <= 0 ? 0 : (n >= 16 ? 0xFFFF : (__mmask16)((1u << n) - 1));
}

/* s[i][0 .. 32 NP) = sum_d qs[i][d] kt[d][0 .. 32 NP) for the MR rows: NP panels of 32
 * keys (kt: the first panel, D x 32 contiguous, the next D x 32 further on); top[i]
 * becomes the maximum of top[i] and the row's new scores. */
INLINE void scores(const float *qs, const float *kt, long d_size, float *s, __m512 *top,
                   int np) {
    __m512 a[MR][4];
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
        for (int u = 0; u < 2 * np; u++) a[i][u] = _mm512_setzero_ps();
    for (long d = 0; d < d_size; d++) {
        __m512 k[4];
#pragma GCC unroll 4
        for (int u = 0; u < 2 * np; u++) k[u] = _mm512_load_ps(kt + (u / 2) * 32 * d_size + 32 * d + 16 * (u % 2));
#pragma GCC unroll 8
        for (int i = 0; i < MR; i++) {
            __m512 q = _mm512_set1_ps(qs[i * d_size + d]);
#pragma GCC unroll 4
            for (int u = 0; u < 2 * np; u++) a[i][u] = _mm512_fmadd_ps(q, k[u], a[i][u]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
        for (int u = 0; u < 2 * np; u++) {
            _mm512_storeu_ps(s + i * NK + 16 * u, a[i][u]);
            top[i] = _mm512_max_ps(top[i], a[i][u]);
        }
}

/* o[i][c .. c + 16 NV) = o[i][..] * corr[i] + sum_n p[i][n] v[n][c ..] for n < nk, the
 * MR rows; the last of the NV vectors keeps only the columns of `tail`. Called with NV a
 * constant, so that each width gets its own loop with the sums in registers. */
INLINE void add_values(float *o, long o_stride, const float *corr, const float *p,
                       const float *v, long vst, long nk, long c, int nv, __mmask16 tail) {
    __m512 a[MR][4];
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++) {
        __m512 f = _mm512_set1_ps(corr[i]);
#pragma GCC unroll 4
        for (int u = 0; u < nv; u++)
            a[i][u] = _mm512_mul_ps(f, _mm512_loadu_ps(o + i * o_stride + c + 16 * u));
    }
    for (long n = 0; n < nk; n++) {
        const float *vn = v + n * vst + c;
        __m512 w[4];
#pragma GCC unroll 4
        for (int u = 0; u < nv; u++)
            w[u] = u == nv - 1 ? _mm512_maskz_loadu_ps(tail, vn + 16 * u) : _mm512_loadu_ps(vn + 16 * u);
#pragma GCC unroll 8
        for (int i = 0; i < MR; i++) {
            __m512 pi = _mm512_set1_ps(p[i * NK + n]);
#pragma GCC unroll 4
            for (int u = 0; u < nv; u++) a[i][u] = _mm512_fmadd_ps(pi, w[u], a[i][u]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
        for (int u = 0; u < nv; u++) _mm512_storeu_ps(o + i * o_stride + c + 16 * u, a[i][u]);
}

/* add_values over all dv columns: 64 at a time, then the 16-column vectors left. */
static AVX512 void add_values_all(float *o, long o_stride, const float *corr, const float *p,
                                  const float *v, long vst, long nk, long dv) {
    long c = 0;
    for (; c + 64 <= dv; c += 64) add_values(o, o_stride, corr, p, v, vst, nk, c, 4, 0xFFFF);
    long left = dv - c;
    if (left <= 0) return;
    __mmask16 tail = first(left - 16 * ((left - 1) / 16));
    switch ((left + 15) / 16) {
        case 1: add_values(o, o_stride, corr, p, v, vst, nk, c, 1, tail); break;
        case 2: add_values(o, o_stride, corr, p, v, vst, nk, c, 2, tail); break;
        case 3: add_values(o, o_stride, corr, p, v, vst, nk, c, 3, tail); break;
        default: add_values(o, o_stride, corr, p, v, vst, nk, c, 4, tail); break;
    }
}

/* A tile: MR query rows of one key/value head on their way over its keys. */
typedef struct {
    float qs[MR * MAX_D] __attribute__((aligned(64)));  /* the rows, times the scale */
    float o[MR * MAX_D] __attribute__((aligned(64)));   /* their outputs so far */
    float m[MR], l[MR];        /* running maximum (base 2) and sum of each row */
    long limit[MR], most;      /* keys each row sees; the most of them */
    float *out_rows[MR], *lse_at[MR];  /* where the results go (NULL: a row past the end) */
} Tile;

/* Starts tile t on the rows q_rows (scaled into base 2: p = 2^(s - max)). */
static AVX512 void tile_start(Tile *t, const float *const *q_rows, long d_size, long dvp,
                              float scale) {
    __m512 f = _mm512_set1_ps(scale * 1.4426950408889634f);
    t->most = 0;
    for (int i = 0; i < MR; i++) {
        for (long d = 0; d < d_size; d += 16) {
            __mmask16 in = first(d_size - d);
            __m512 x = _mm512_maskz_loadu_ps(in, q_rows[i] + d);
            _mm512_mask_storeu_ps(t->qs + i * d_size + d, in, _mm512_mul_ps(x, f));
        }
        memset(t->o + i * dvp, 0, (size_t)dvp * sizeof(float));
        t->m[i] = -INFINITY;
        t->l[i] = 0.0f;
        t->most = t->limit[i] > t->most ? t->limit[i] : t->most;
    }
}

/* Tile t over the keys [n0, n0 + NK) that any of its rows sees: the scores, the online
 * softmax, the weighted values. kt: the head's keys in panels of 32 (see
 * qkv_flash_attention); v: the head's values, rows vst apart. */
static AVX512 void tile_block(Tile *t, long n0, const float *kt, const float *v, long vst,
                              long d_size, long dv, long dvp) {
    float s[MR * NK] __attribute__((aligned(64)));
    float corr[MR];
    long nk = t->most - n0 < NK ? t->most - n0 : NK, cols = (nk + 31) / 32 * 32;
    __m512 top[MR];
    for (int i = 0; i < MR; i++) top[i] = _mm512_set1_ps(-INFINITY);
    long j = 0;
    for (; j + 32 < nk; j += 64) scores(t->qs, kt + (n0 + j) * d_size, d_size, s + j, top, 2);
    if (j < nk) scores(t->qs, kt + (n0 + j) * d_size, d_size, s + j, top, 1);
    for (int i = 0; i < MR; i++) {
        float *si = s + i * NK;
        long seen = t->limit[i] - n0;  /* this row's keys in the block: [0, seen) */
        seen = seen < 0 ? 0 : (seen > nk ? nk : seen);
        if (seen < cols) {  /* some scores are past the row's keys: the maximum again */
            top[i] = _mm512_set1_ps(-INFINITY);
            for (j = 0; j < seen; j += 16)
                top[i] = _mm512_max_ps(top[i], _mm512_mask_loadu_ps(top[i], first(seen - j), si + j));
        }
        float mx = _mm512_reduce_max_ps(top[i]);
        float m_new = mx > t->m[i] ? mx : t->m[i];
        float base = m_new == -INFINITY ? 0.0f : m_new;  /* nothing seen yet: p = 0 */
        corr[i] = _mm512_cvtss_f32(exp2_16(_mm512_set1_ps(t->m[i] - base)));
        t->m[i] = m_new;
        __m512 sum = _mm512_setzero_ps(), b = _mm512_set1_ps(base);
        for (j = 0; j < seen; j += 16) {  /* p = 2^(s - max), 0 past the row's keys */
            __m512 x = _mm512_sub_ps(_mm512_loadu_ps(si + j), b);
            __m512 p = _mm512_maskz_mov_ps(first(seen - j), exp2_16(x));
            _mm512_storeu_ps(si + j, p);
            sum = _mm512_add_ps(sum, p);
        }
        for (; j < nk; j += 16) _mm512_storeu_ps(si + j, _mm512_setzero_ps());
        t->l[i] = t->l[i] * corr[i] + _mm512_reduce_add_ps(sum);
    }
    add_values_all(t->o, dvp, corr, s, v + n0 * vst, vst, nk, dv);
}

/* Tile t's outputs, o / l, and log-sum-exps (back in base e), where they go. */
static AVX512 void tile_finish(const Tile *t, long dv, long dvp) {
    for (int i = 0; i < MR; i++) {
        if (t->out_rows[i] == NULL) continue;
        float l = t->l[i];
        __m512 inv = _mm512_set1_ps(l > 0.0f ? 1.0f / l : 0.0f);
        for (long c = 0; c < dv; c += 16)
            _mm512_mask_storeu_ps(t->out_rows[i] + c, first(dv - c),
                                  _mm512_mul_ps(_mm512_load_ps(t->o + i * dvp + c), inv));
        if (t->lse_at[i] != NULL)
            *t->lse_at[i] = l > 0.0f ? (t->m[i] + log2f(l)) * 0.69314718055994531f : -INFINITY;
    }
}

/* Panel p of one head's keys (k: rows kst apart) into kt, the head's panels of 32
 * (kt[n / 32][d][n % 32], zeros past tk): a gather of 16 keys for each d. */
static AVX512 void pack_panel(float *kt, const float *k, long kst, long tk, long d_size, long p) {
    __m512i rows = _mm512_mullo_epi32(
        _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
        _mm512_set1_epi32((int)kst));
    float *to = kt + p * 32 * d_size;
    long n0 = 32 * p;
    __mmask16 lo = first(tk - n0), hi = first(tk - n0 - 16);
    const float *k0 = k + n0 * kst, *k1 = k + (n0 + 16) * kst;
    for (long d = 0; d < d_size; d++) {
        _mm512_store_ps(to + 32 * d, _mm512_mask_i32gather_ps(_mm512_setzero_ps(), lo, rows, k0 + d, 4));
        _mm512_store_ps(to + 32 * d + 16, _mm512_mask_i32gather_ps(_mm512_setzero_ps(), hi, rows, k1 + d, 4));
    }
}

/* out = softmax(q k^T * scale [causal]) v for q (B, H, Tq, D), k (B, Hkv, Tk, D), v (B, Hkv,
 * Tk, Dv), out (B, H, Tq, Dv), each with its last dimension contiguous and the strides of
 * the other three given (batch, head, position); lse (B, H, Tq) contiguous, or NULL.
 * kst * 16 must fit an int (the gathers' offsets). */
AVX512 void qkv_flash_attention(const float *q, long qsb, long qsh, long qst, const float *k,
                                long ksb, long ksh, long kst, const float *v, long vsb,
                                long vsh, long vst, float *out, long osb, long osh, long ost,
                                float *lse, long batch, long heads, long kv_heads, long tq,
                                long tk, long d_size, long dv, float scale, int causal,
                                int threads) {
    long groups = heads / kv_heads, rows = tq * groups, tiles = (rows + MR - 1) / MR;
    long walks = (tiles + GT - 1) / GT;                /* groups of GT tiles, per head */
    long heads_kv = batch * kv_heads;                  /* key/value heads, all sequences */
    long panels = (tk + 31) / 32, panel = d_size * 32 * panels;  /* floats per head */
    long dvp = (dv + 15) / 16 * 16;                    /* a row of o: whole vectors */
    size_t kt_bytes = (size_t)(heads_kv * panel) * sizeof(float);  /* a multiple of 128 */
    float *kt = aligned_alloc(64, kt_bytes > 0 ? kt_bytes : 64);
    if (kt == NULL) return;
#pragma omp parallel num_threads(threads)
    {
        /* every head's keys into panels of 32 */
#pragma omp for schedule(static)
        for (long hp = 0; hp < heads_kv * panels; hp++) {
            long bg = hp / panels, p = hp % panels;
            pack_panel(kt + bg * panel, k + bg / kv_heads * ksb + bg % kv_heads * ksh, kst, tk,
                       d_size, p);
        }
        /* then the tiles, GT of them walking over the keys side by side (each block of
         * keys and values is read once from memory for the GT), head after head (its keys
         * and values stay in cache), those of the most keys first, taken by the threads
         * as they come free */
#pragma omp for schedule(dynamic, 1)
        for (long item = 0; item < heads_kv * walks; item++) {
            long bg = item / walks, b = bg / kv_heads, g = bg % kv_heads;
            long walk = causal ? walks - 1 - item % walks : item % walks;
            const float *kb = kt + bg * panel, *vb = v + b * vsb + g * vsh;
            Tile ts[GT];
            int count = 0;
            long most = 0;
            for (long tile_i = walk * GT; tile_i < tiles && count < GT; tile_i++, count++) {
                Tile *t = &ts[count];
                const float *q_rows[MR];
                for (int i = 0; i < MR; i++) {
                    long r = tile_i * MR + i, live = r < rows;
                    long rr = live ? r : tile_i * MR, pos = rr / groups;
                    long h = g * groups + rr % groups;
                    q_rows[i] = q + b * qsb + h * qsh + pos * qst;
                    t->out_rows[i] = live ? out + b * osb + h * osh + pos * ost : NULL;
                    t->lse_at[i] = live && lse != NULL ? lse + (b * heads + h) * tq + pos : NULL;
                    long lim = causal ? pos + tk - tq + 1 : tk;
                    t->limit[i] = lim < 0 ? 0 : (lim > tk ? tk : lim);
                }
                tile_start(t, q_rows, d_size, dvp, scale);
                most = t->most > most ? t->most : most;
            }
            for (long n0 = 0; n0 < most; n0 += NK)
                for (int c = 0; c < count; c++)
                    if (n0 < ts[c].most) tile_block(&ts[c], n0, kb, vb, vst, d_size, dv, dvp);
            for (int c = 0; c < count; c++) tile_finish(&ts[c], dv, dvp);
        }
    }
    free(kt);
}
