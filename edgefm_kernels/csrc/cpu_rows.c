/* Row-wise fp32 kernels for exact mode: RMSNorm and half-split RoPE, each one pass over its rows.
 *
 * Both round like the PyTorch reference (edgefm_kernels/norm.py, edgefm_kernels/rope.py): every product and sum is
 * rounded on its own (no FMA contraction: native.py builds with -ffp-contract=off, and the intrinsics say
 * what they do), so
 * RoPE is bitwise the reference and RMSNorm differs only in the order of its sum of squares.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "vec_math.h"

/* y[r] = w * (x[r] * (1 / sqrt(mean(x[r]^2) + eps))) for rows r < rows; x, y [rows, h] contiguous. */
void edgefm_rms_norm(const float *x, const float *w, int64_t rows, int64_t h, float eps, float *y, int threads) {
  #pragma omp parallel for schedule(dynamic, 16) num_threads(threads) if (rows * h >= (1 << 18))
  for (int64_t r = 0; r < rows; ++r) {
    const float *xr = x + r * h;
    float *yr = y + r * h;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t j = 0; j < h; j += 16) {
      const __m512 v = _mm512_maskz_loadu_ps(tail_mask(h - j), xr + j);
      acc = _mm512_add_ps(acc, _mm512_mul_ps(v, v));
    }
    const float inv = 1.0f / sqrtf(_mm512_reduce_add_ps(acc) / (float)h + eps);
    const __m512 s = _mm512_set1_ps(inv);
    for (int64_t j = 0; j < h; j += 16) {
      const __mmask16 m = tail_mask(h - j);
      const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, xr + j), s);
      _mm512_mask_storeu_ps(yr + j, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, w + j), v));
    }
  }
}

/* out [B, L, H, D] (contiguous) = x rotated: out[:D/2] = x1 c - x2 s, out[D/2:] = x2 c + x1 s, with
 * x [B, L, H, D] strided (element strides sb, sl, sh; unit stride in D) and cos/sin [B, L, D/2] contiguous. */
void edgefm_rope(const float *x, int64_t sb, int64_t sl, int64_t sh, int64_t b, int64_t l, int64_t nh, int64_t d,
                 const float *cos, const float *sin, float *out, int threads) {
  const int64_t half = d / 2;
  #pragma omp parallel for schedule(dynamic, 16) num_threads(threads) if (b * l * nh * d >= (1 << 18))
  for (int64_t bl = 0; bl < b * l; ++bl) {
    const int64_t bi = bl / l, li = bl % l;
    const float *c = cos + bl * half, *s = sin + bl * half;
    for (int64_t hi = 0; hi < nh; ++hi) {
      const float *xr = x + bi * sb + li * sl + hi * sh;
      float *o = out + (bl * nh + hi) * d;
      for (int64_t j = 0; j < half; j += 16) {
        const __mmask16 m = tail_mask(half - j);
        const __m512 x1 = _mm512_maskz_loadu_ps(m, xr + j), x2 = _mm512_maskz_loadu_ps(m, xr + half + j);
        const __m512 cv = _mm512_maskz_loadu_ps(m, c + j), sv = _mm512_maskz_loadu_ps(m, s + j);
        _mm512_mask_storeu_ps(o + j, m, _mm512_sub_ps(_mm512_mul_ps(x1, cv), _mm512_mul_ps(x2, sv)));
        _mm512_mask_storeu_ps(o + half + j, m, _mm512_add_ps(_mm512_mul_ps(x2, cv), _mm512_mul_ps(x1, sv)));
      }
    }
  }
}
