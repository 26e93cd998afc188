/* int8 GEMM on AVX512-VNNI with its epilogue fused, fp32 in and out (fast mode on AVX-512 CPUs without AMX):
 *   y [M, N] = x [M, K] W^T (+ b)                     (post 0)
 *   y [M, I] = silu(x G^T) * (x U^T)                  (post 1, W = gate and up)
 *   y [M, N] = gelu_tanh(x W^T + b)                   (post 2)
 * each optionally + a residual [M, N or I] (fp32), added last.
 * Weights: int8, symmetric per output channel, stored as unsigned bytes q + 128 (vpdpbusd multiplies unsigned
 * by signed bytes), packed once (vnni_gemm.py) per block of 32 output columns (post 1: 16 gate and the same
 * 16 up columns) as [K/4][32 columns][4 consecutive K values]: one 64-byte load per 16 columns and 4 K values.
 * Rows of x: quantised per row and call (symmetric, round to nearest even); a row with a NaN or an infinity
 * gets a NaN scale, so its outputs are NaN. sum_k (q_w + 128) q_x = sum_k q_w q_x + 128 sum_k q_x: the row sum
 * of q_x is subtracted in the epilogue. int32 sums cannot overflow: |.| <= 255 * 127 * K < 2^31 for K < 66000.
 * The quantised rows are packed in blocks of MR rows as [K/4][MR][4] bytes, so a K group of a block is one
 * 40-byte run, broadcast 4 bytes at a time into the products.
 * Micro kernel: MR = 10 rows x 32 columns, 20 accumulators (10 rather than 12: the decode's 50 rows are five
 * whole blocks, 13-15% faster there than 12-row blocks, the same on the vision tower's 1024 rows). The threads
 * take (row chunk, column block) units two at a time as they finish; a row chunk (MC_BLOCKS row blocks) stays in
 * L2 while its column blocks pass.
 */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vec_math.h"

#define MR 10
#define MC_BLOCKS 24 /* row blocks per chunk: 240 rows, 184-737 KB of quantised rows for K = 768-3072 */

/* Rows [0, m) of x -> the packed quantised blocks qa, scales sx[m] and row sums rs[m]. Rows past m (up to
 * the last block's end) are zero (set by the caller). */
static void quantize_rows(const float *x, int64_t m, int64_t k, int64_t ldx, int64_t kg, int8_t *qa, float *sx,
                          int32_t *rs) {
#pragma omp for schedule(dynamic, 16)
  for (int64_t r = 0; r < m; ++r) {
    const float *xr = x + r * ldx;
    int bad;
    const float a = absmax_ps(xr, NULL, k, &bad);
    int8_t *blk = qa + (r / MR) * kg * MR * 4 + (r % MR) * 4;
    if (bad || a == 0.0f) {
      for (int64_t g = 0; g < kg; ++g) memset(blk + g * MR * 4, 0, 4);
      sx[r] = bad ? NAN : 0.0f;
      rs[r] = 0;
      continue;
    }
    const __m512 inv = _mm512_set1_ps(127.0f / a);
    __m512i sum = _mm512_setzero_si512();
    int8_t row[64] __attribute__((aligned(64)));
    for (int64_t c = 0; c < kg * 4; c += 64) {
      memset(row, 0, sizeof row);
      for (int64_t j = 0; j < 64 && c + j < k; j += 16) {
        const __mmask16 mk = tail_mask(k - c - j);
        const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(mk, xr + c + j), inv));
        sum = _mm512_add_epi32(sum, _mm512_maskz_mov_epi32(mk, q));
        _mm512_mask_cvtsepi32_storeu_epi8(row + j, mk, q);
      }
      for (int64_t g = c / 4; g < kg && g < c / 4 + 16; ++g) memcpy(blk + g * MR * 4, row + (g - c / 4) * 4, 4);
    }
    sx[r] = a / 127.0f;
    rs[r] = _mm512_reduce_add_epi32(sum);
  }
}

/* acc[2 r + t] (row r, 16-column half t) = sum over the K groups of the weight block wb [kg][32][4] times the
 * row block ab [kg][MR][4]. The 20 accumulators are named variables: as an array the compiler kept them on
 * the stack and stored every one at every K group (300 instead of ~1000 GFLOP/s). */
#define FOR_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9)
#define DECL(r) __m512i c##r##a = _mm512_setzero_si512(), c##r##b = _mm512_setzero_si512();
#define STEP(r)                                                      \
  {                                                                  \
    const __m512i av = _mm512_set1_epi32(a[r]);                      \
    c##r##a = _mm512_dpbusd_epi32(c##r##a, b0, av);                  \
    c##r##b = _mm512_dpbusd_epi32(c##r##b, b1, av);                  \
  }
#define STORE(r)          \
  acc[2 * r] = c##r##a;   \
  acc[2 * r + 1] = c##r##b;
static inline void micro(const int8_t *ab, const uint8_t *wb, int64_t kg, __m512i acc[2 * MR]) {
  FOR_ROWS(DECL)
  for (int64_t g = 0; g < kg; ++g) {
    const __m512i b0 = _mm512_load_si512((const void *)(wb + g * 128));
    const __m512i b1 = _mm512_load_si512((const void *)(wb + g * 128 + 64));
    const int32_t *a = (const int32_t *)(ab + g * MR * 4);
    FOR_ROWS(STEP)
  }
  FOR_ROWS(STORE)
}

/* x / (1 + exp(-2u)), u = sqrt(2/pi) (x + 0.044715 x^3): gelu_tanh, as F.gelu(approximate="tanh") */
static inline __m512 gelu_tanh(__m512 x) {
  const __m512 u2 = _mm512_mul_ps(_mm512_fmadd_ps(_mm512_mul_ps(x, x), _mm512_set1_ps(-2.0f * 0.7978845608028654f * 0.044715f),
                                                  _mm512_set1_ps(-2.0f * 0.7978845608028654f)), x);
  return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), exp_ps(u2)));
}

static inline __m512 silu(__m512 x) {
  return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), x))));
}

/* Rows [r0, r0 + rows) of one column block nb from its accumulators -> y (and the residual). */
static void epilogue(const __m512i acc[2 * MR], int64_t r0, int64_t rows, int64_t nb, int post, const float *bias,
                     const float *sw, const float *sx, const int32_t *rs, const float *res, int64_t n_out, float *y) {
  const __m512 s0 = _mm512_loadu_ps(sw + nb * 32), s1 = _mm512_loadu_ps(sw + nb * 32 + 16);
  const int64_t c0 = post == 1 ? nb * 16 : nb * 32;
  const __mmask16 m0 = tail_mask(n_out - c0), m1 = post == 1 || n_out <= c0 + 16 ? 0 : tail_mask(n_out - c0 - 16);
  __m512 b0 = _mm512_setzero_ps(), b1 = _mm512_setzero_ps();
  if (bias && post != 1) {
    b0 = _mm512_maskz_loadu_ps(m0, bias + c0);
    b1 = _mm512_maskz_loadu_ps(m1, bias + c0 + 16);
  }
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t r = r0 + i;
    const __m512i off = _mm512_set1_epi32(128 * rs[r]);
    const __m512 sr = _mm512_set1_ps(sx[r]);
    __m512 v0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc[2 * i], off)), _mm512_mul_ps(s0, sr));
    __m512 v1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc[2 * i + 1], off)), _mm512_mul_ps(s1, sr));
    float *yr = y + r * n_out + c0;
    const float *rr = res ? res + r * n_out + c0 : NULL;
    if (post == 1) {
      v0 = _mm512_mul_ps(silu(v0), v1);
      if (rr) v0 = _mm512_add_ps(v0, _mm512_maskz_loadu_ps(m0, rr));
      _mm512_mask_storeu_ps(yr, m0, v0);
      continue;
    }
    v0 = _mm512_add_ps(v0, b0);
    v1 = _mm512_add_ps(v1, b1);
    if (post == 2) {
      v0 = gelu_tanh(v0);
      v1 = gelu_tanh(v1);
    }
    if (rr) {
      v0 = _mm512_add_ps(v0, _mm512_maskz_loadu_ps(m0, rr));
      v1 = _mm512_add_ps(v1, _mm512_maskz_loadu_ps(m1, rr + 16));
    }
    _mm512_mask_storeu_ps(yr, m0, v0);
    if (m1) _mm512_mask_storeu_ps(yr + 16, m1, v1);
  }
}

/* Scratch bytes for m rows and kg K groups: the quantised row blocks (see edgefm_vnni_gemm). */
int64_t edgefm_vnni_gemm_scratch(int64_t m, int64_t kg) { return (m + MR - 1) / MR * MR * kg * 4; }

/* x [m, k] fp32 (row stride ldx) times the packed weight w [nb][kg][32][4] (unsigned, q + 128) with scales
 * sw [nb][32] -> y [m, n_out] fp32 contiguous; bias [n] fp32 or NULL (not with post 1); res [m, n_out] fp32
 * contiguous or NULL. scratch: edgefm_vnni_gemm_scratch(m, kg) bytes, 64-byte aligned; sx, rs: m floats and
 * ints. */
void edgefm_vnni_gemm(const float *x, int64_t m, int64_t k, int64_t ldx, const uint8_t *w, const float *sw,
                      int64_t nb, int64_t kg, const float *bias, int post, const float *res, int64_t n_out, float *y,
                      int8_t *scratch, float *sx, int32_t *rs, int threads) {
  const int64_t mblocks = (m + MR - 1) / MR;
  const int64_t chunks = (mblocks + MC_BLOCKS - 1) / MC_BLOCKS;
  if (m % MR) memset(scratch + (m / MR) * kg * MR * 4, 0, (size_t)(kg * MR * 4)); /* the last block's pad rows */
#pragma omp parallel num_threads(threads)
  {
    quantize_rows(x, m, k, ldx, kg, scratch, sx, rs);
    __m512i acc[2 * MR];
    /* dynamic: on a robot the control loop and the sensor drivers share these cores, and a static split waits
     * at the barrier for the thread they preempted (FULL fast chunk with a 50%-duty busy loop beside it: 2.81
     * and 2.28 s against 2.95 and 2.72 static; the same without one). Consecutive units share a row chunk. */
#pragma omp for collapse(2) schedule(dynamic, 2)
    for (int64_t ch = 0; ch < chunks; ++ch) {
      for (int64_t j = 0; j < nb; ++j) {
        const uint8_t *wb = w + j * kg * 128;
        const int64_t end = (ch + 1) * MC_BLOCKS < mblocks ? (ch + 1) * MC_BLOCKS : mblocks;
        for (int64_t b = ch * MC_BLOCKS; b < end; ++b) {
          micro(scratch + b * kg * MR * 4, wb, kg, acc);
          const int64_t rows = m - b * MR < MR ? m - b * MR : MR;
          epilogue(acc, b * MR, rows, j, post, bias, sw, sx, rs, res, n_out, y);
        }
      }
    }
  }
}
