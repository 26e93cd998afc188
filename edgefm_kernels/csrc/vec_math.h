/* Vector math shared by the AVX-512 kernels (header only: each kernel library gets its own copy). */
#ifndef EDGEFM_VEC_MATH_H
#define EDGEFM_VEC_MATH_H

#include <immintrin.h>
#include <stdint.h>

/* exp(x) in fp32 to ~1 ulp: x = n ln2 + r (two-part ln2), |r| <= ln2/2, degree-7 Taylor (truncation
 * < 6e-9 relative), 2^n applied by scalef, which saturates to inf past the fp32 range. Below, x is clamped
 * at -87.33 (just above ln of the smallest normal float): a denormal result costs a microcode assist per lane
 * wherever it goes next (the VNNI GEMM's GELU epilogue ran 5x slower on outputs above ~10, whose tanh
 * argument passes -87), and exp(-87.33) = 1.2e-38 is as good as zero beside the 1 it is added to. */
static inline __m512 exp_ps(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.33f)), _mm512_set1_ps(89.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), r);
  __m512 e = _mm512_set1_ps(1.0f / 5040.0f);
  e = _mm512_fmadd_ps(e, r, _mm512_set1_ps(1.0f / 720.0f));
  e = _mm512_fmadd_ps(e, r, _mm512_set1_ps(1.0f / 120.0f));
  e = _mm512_fmadd_ps(e, r, _mm512_set1_ps(1.0f / 24.0f));
  e = _mm512_fmadd_ps(e, r, _mm512_set1_ps(1.0f / 6.0f));
  e = _mm512_fmadd_ps(e, r, _mm512_set1_ps(0.5f));
  e = _mm512_fmadd_ps(e, r, _mm512_set1_ps(1.0f));
  e = _mm512_fmadd_ps(e, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(e, n);
}

/* 2^t in fp32 to 2.7e-6 relative, for t clamped to [-100, 100] (bf16 kernels: their results are rounded to
 * bf16, 3.9e-3 relative): t = n + f with |f| <= 1/2, a degree-4 fit of 2^f (relative error weighted), 2^n by
 * scalef. Half the instructions of exp_ps: the softmax and GELU passes of the bf16 kernels are bound by it.
 * The clamp keeps every result and every quotient by 1 + 2^t a normal number: a denormal costs a microcode
 * assist per lane (GELU over GEMM outputs whose negative tail reached 2^-127 ran 10x slower). */
static inline __m512 exp2_fast_ps(__m512 t) {
  t = _mm512_min_ps(_mm512_max_ps(t, _mm512_set1_ps(-100.0f)), _mm512_set1_ps(100.0f));
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, n);
  __m512 p = _mm512_set1_ps(0.009560510516166687f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.05591703951358795f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.24024981260299683f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.6931219696998596f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.9999991655349731f));
  return _mm512_scalef_ps(p, n);
}

/* Lanes [0, n) of a 16-lane vector (n in [0, 16]). */
static inline __mmask16 tail_mask(int64_t n) { return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1); }

/* max |x[c] - mean[c]| over c < d (mean NULL: max |x[c]|), and in *bad whether a value is a NaN or an
 * infinity. */
static inline float absmax_ps(const float *x, const float *mean, int64_t d, int *bad) {
  __m512 a = _mm512_setzero_ps();
  __mmask16 nf = 0;
  for (int64_t c = 0; c < d; c += 16) {
    const __mmask16 t = tail_mask(d - c);
    const __m512 v = _mm512_maskz_loadu_ps(t, x + c);
    nf |= _mm512_mask_fpclass_ps_mask(t, v, 0x99); /* QNaN, SNaN, +inf, -inf */
    a = _mm512_max_ps(a, _mm512_abs_ps(mean ? _mm512_sub_ps(v, _mm512_maskz_loadu_ps(t, mean + c)) : v));
  }
  *bad = nf != 0;
  return _mm512_reduce_max_ps(a);
}

/* 16 bf16 values (lanes in m, zero elsewhere) -> fp32, exactly. */
static inline __m512 load_bf16(const uint16_t *p, __mmask16 m) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}

#ifdef __AVX512BF16__ /* kernels built with -mavx512bf16 (native.ISA) */
/* 16 fp32 -> bf16 (nearest even) into lanes m of p. */
static inline void store_bf16(uint16_t *p, __mmask16 m, __m512 v) {
  _mm256_mask_storeu_epi16(p, m, (__m256i)_mm512_cvtneps_pbh(v));
}
#endif

#endif
