/* bf16 row kernels for fast mode, one pass each (AVX-512 F + BF16): GELU-tanh in place over a GEMM output,
 * SiLU(gate) * up over a fused gate/up GEMM output, RMSNorm and LayerNorm with fp32 statistics, RoPE.
 * Each element is widened to fp32, computed in fp32 (exp to 2.7e-6 relative) and rounded back to bf16 to nearest
 * even, as torch does for bf16 tensors; oneDNN's fused GELU post-op costs as much as the GEMM at the vision
 * MLP's shape, and torch's bf16 GELU/SiLU kernels run at a fraction of memory speed.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "vec_math.h"

/* 1 / x to ~1 ulp: rcp14 and one Newton step (vdivps has a 16-cycle throughput on a 512-bit vector). */
static inline __m512 rcp_ps(__m512 x) {
  const __m512 r = _mm512_rcp14_ps(x);
  return _mm512_mul_ps(r, _mm512_fnmadd_ps(x, r, _mm512_set1_ps(2.0f)));
}

/* gelu_tanh(x) = 0.5 x (1 + tanh(u)) = x / (1 + exp(-2u)), u = sqrt(2/pi) (x + 0.044715 x^3); in place. */
void edgefm_gelu_tanh_bf16(uint16_t *x, int64_t n, int threads) {
  const int64_t blocks = (n + 15) / 16;
  #pragma omp parallel for schedule(dynamic, 256) num_threads(threads) if (n >= (1 << 16))
  for (int64_t i = 0; i < blocks; ++i) {
    const __mmask16 m = tail_mask(n - i * 16);
    const __m512 v = load_bf16(x + i * 16, m);
    const __m512 v3 = _mm512_mul_ps(_mm512_mul_ps(v, v), v);
    const __m512 u = _mm512_mul_ps(_mm512_set1_ps(0.7978845608028654f),
                                   _mm512_add_ps(v, _mm512_mul_ps(_mm512_set1_ps(0.044715f), v3)));
    /* e = exp(-2u) = 2^(-2u log2(e)), capped at 2^100 (the result is x * 8e-31 either way) */
    const __m512 e = exp2_fast_ps(_mm512_mul_ps(_mm512_set1_ps(-2.0f * 1.4426950408889634f), u));
    store_bf16(x + i * 16, m, _mm512_mul_ps(v, rcp_ps(_mm512_add_ps(_mm512_set1_ps(1.0f), e))));
  }
}

/* out[r, j] = silu(y[r, j]) * y[r, inner + j] for y [rows, 2 * inner] (gate | up), out [rows, inner]. */
void edgefm_silu_glu_bf16(const uint16_t *y, int64_t rows, int64_t inner, uint16_t *out, int threads) {
  #pragma omp parallel for schedule(dynamic, 8) num_threads(threads) if (rows * inner >= (1 << 16))
  for (int64_t r = 0; r < rows; ++r) {
    const uint16_t *g = y + r * 2 * inner, *u = g + inner;
    uint16_t *o = out + r * inner;
    for (int64_t j = 0; j < inner; j += 16) {
      const __mmask16 m = tail_mask(inner - j);
      const __m512 gv = load_bf16(g + j, m);
      const __m512 s = _mm512_mul_ps(gv, rcp_ps(_mm512_add_ps(_mm512_set1_ps(1.0f), exp2_fast_ps(_mm512_mul_ps(_mm512_set1_ps(-1.4426950408889634f), gv)))));
      store_bf16(o + j, m, _mm512_mul_ps(s, load_bf16(u + j, m)));
    }
  }
}

/* Sum over a bf16 row x [h] of f(x_j) (x_j in fp32) with four running sums: one chain of adds would wait on
 * the previous vector's latency (a 768-wide row: 48 dependent adds). F: an expression of the vector v. */
#define ROW_SUM(xr, h, F)                                                                                     \
  ({                                                                                                         \
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0, v;                                           \
    int64_t j = 0;                                                                                           \
    for (; j + 64 <= (h); j += 64) {                                                                         \
      v = load_bf16((xr) + j, 0xffff); s0 = _mm512_add_ps(s0, (F));                                          \
      v = load_bf16((xr) + j + 16, 0xffff); s1 = _mm512_add_ps(s1, (F));                                     \
      v = load_bf16((xr) + j + 32, 0xffff); s2 = _mm512_add_ps(s2, (F));                                     \
      v = load_bf16((xr) + j + 48, 0xffff); s3 = _mm512_add_ps(s3, (F));                                     \
    }                                                                                                        \
    for (; j < (h); j += 16) {                                                                               \
      const __mmask16 m_ = tail_mask((h) - j);                                                               \
      v = load_bf16((xr) + j, m_); s0 = _mm512_add_ps(s0, _mm512_maskz_mov_ps(m_, (F)));                     \
    }                                                                                                        \
    _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));                       \
  })

/* RMSNorm of bf16 rows, as the fast reference rounds it: n = bf16(x * rsqrt(mean(x^2) + eps)) with fp32
 * statistics, y = bf16(w * n); x, y [rows, h] contiguous, w [h] bf16. */
void edgefm_rms_norm_bf16(const uint16_t *x, const uint16_t *w, int64_t rows, int64_t h, float eps, uint16_t *y,
                          int threads) {
  #pragma omp parallel for schedule(dynamic, 32) num_threads(threads) if (rows * h >= (1 << 16))
  for (int64_t r = 0; r < rows; ++r) {
    const uint16_t *xr = x + r * h;
    uint16_t *yr = y + r * h;
    const __m512 s = _mm512_set1_ps(1.0f / sqrtf(ROW_SUM(xr, h, _mm512_mul_ps(v, v)) / (float)h + eps));
    for (int64_t j = 0; j < h; j += 16) {
      const __mmask16 m = tail_mask(h - j);
      const __m512 n = _mm512_cvtpbh_ps(_mm512_cvtneps_pbh(_mm512_mul_ps(load_bf16(xr + j, m), s)));
      store_bf16(yr + j, m, _mm512_mul_ps(load_bf16(w + j, m), n));
    }
  }
}

/* LayerNorm of bf16 rows with fp32 statistics (mean, then the mean square of x - mean) and parameters,
 * rounded once: y = bf16((x - mean) * rstd * w + b); x, y [rows, h] contiguous, w, b [h] fp32. */
void edgefm_layer_norm_bf16(const uint16_t *x, const float *w, const float *b, int64_t rows, int64_t h, float eps,
                            uint16_t *y, int threads) {
  #pragma omp parallel for schedule(dynamic, 32) num_threads(threads) if (rows * h >= (1 << 16))
  for (int64_t r = 0; r < rows; ++r) {
    const uint16_t *xr = x + r * h;
    uint16_t *yr = y + r * h;
    const __m512 mv = _mm512_set1_ps(ROW_SUM(xr, h, v) / (float)h);
    const float var = ROW_SUM(xr, h, _mm512_mul_ps(_mm512_sub_ps(v, mv), _mm512_sub_ps(v, mv))) / (float)h;
    const __m512 rstd = _mm512_set1_ps(1.0f / sqrtf(var + eps));
    for (int64_t j = 0; j < h; j += 16) {
      const __mmask16 m = tail_mask(h - j);
      const __m512 n = _mm512_mul_ps(_mm512_sub_ps(load_bf16(xr + j, m), mv), rstd);
      store_bf16(yr + j, m, _mm512_fmadd_ps(n, _mm512_maskz_loadu_ps(m, w + j), _mm512_maskz_loadu_ps(m, b + j)));
    }
  }
}

/* Half-split RoPE of bf16 q/k as the fp32 reference computes it, rounded once: out[:D/2] = x1 c - x2 s,
 * out[D/2:] = x2 c + x1 s with x [B, L, H, D] bf16 strided (element strides sb, sl, sh; unit in D), cos/sin
 * [B, L, D/2] fp32 contiguous, out [B, L, H, D] bf16 contiguous. */
void edgefm_rope_bf16(const uint16_t *x, int64_t sb, int64_t sl, int64_t sh, int64_t b, int64_t l, int64_t nh,
                      int64_t d, const float *cos, const float *sin, uint16_t *out, int threads) {
  const int64_t half = d / 2;
  #pragma omp parallel for schedule(dynamic, 16) num_threads(threads) if (b * l * nh * d >= (1 << 16))
  for (int64_t bl = 0; bl < b * l; ++bl) {
    const int64_t bi = bl / l, li = bl % l;
    const float *c = cos + bl * half, *s = sin + bl * half;
    for (int64_t hi = 0; hi < nh; ++hi) {
      const uint16_t *xr = x + bi * sb + li * sl + hi * sh;
      uint16_t *o = out + (bl * nh + hi) * d;
      for (int64_t j = 0; j < half; j += 16) {
        const __mmask16 m = tail_mask(half - j);
        const __m512 x1 = load_bf16(xr + j, m), x2 = load_bf16(xr + half + j, m);
        const __m512 cv = _mm512_maskz_loadu_ps(m, c + j), sv = _mm512_maskz_loadu_ps(m, s + j);
        store_bf16(o + j, m, _mm512_sub_ps(_mm512_mul_ps(x1, cv), _mm512_mul_ps(x2, sv)));
        store_bf16(o + half + j, m, _mm512_add_ps(_mm512_mul_ps(x2, cv), _mm512_mul_ps(x1, sv)));
      }
    }
  }
}
