/* Vector math shared by the AVX-512 kernels (header only: each kernel library gets its own copy). */
#ifndef EDGEFM_VEC_MATH_H
#define EDGEFM_VEC_MATH_H

#include <immintrin.h>
#include <stdint.h>

/* exp(x) in fp32 to ~1 ulp: x = n ln2 + r (two-part ln2), |r| <= ln2/2, degree-7 Taylor (truncation
 * < 6e-9 relative), 2^n applied by scalef, which saturates to inf / 0 past the fp32 range. */
static inline __m512 exp_ps(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-104.0f)), _mm512_set1_ps(89.0f));
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

/* Lanes [0, n) of a 16-lane vector (n in [0, 16]). */
static inline __mmask16 tail_mask(int64_t n) { return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1); }

#endif
