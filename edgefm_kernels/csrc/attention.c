/* fp32 attention, softmax(q k^T * scale + mask) v, for the prefill's long rows (the vision tower: 1024
 * queries x 1024 keys per head, no mask).
 *
 * One thread owns one (batch, head) at a time: it packs that head's keys transposed in 16-key groups,
 * Kt [G][D][16], and its values as contiguous rows (a fused QKV output has them 9 KB apart, which maps
 * every row onto the same few L1 sets), then runs the queries in blocks of BQ rows. For a block it forms
 * the full score rows S [BQ][Lk] (in L2), applies the mask, takes each row's max, overwrites S with
 * exp(s - max) while summing it, multiplies by v and divides by the sum. Whole rows, not an online (flash)
 * softmax: one max per row, as the eager reference takes it, and no rescaling.
 * Register blocks: RS rows x 64 keys for the scores, RS rows x up to 64 dims for p v (24 zmm accumulators;
 * a head size that is not a multiple of 16 is padded with zeros in the packed values). Both products
 * run key block by key block (64 keys) over all rows of the query block, so the block's keys or values
 * stay in L1 while every row uses them.
 */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>

#include "vec_math.h"

#define BQ 48        /* query rows per block (a multiple of RS) */
#define KB 64        /* keys per block of the p v product */
#define RS 6         /* score register block: RS rows x 4 key groups */
#define NG 4         /* key groups (of 16) per score register block */
#define PAD 16       /* floats between score rows, so rows 4 KB apart do not share L1 sets */
#define MASKED (-3.4028234663852886e38f)  /* finfo(float32).min, the reference's fill for hidden keys */

/* Floats of per-thread scratch for lk keys and head size d: packed keys and values, one block of score
 * rows and its output rows. */
int64_t edgefm_attention_scratch(int64_t lk, int64_t d) {
  const int64_t groups = (lk + 16 * NG - 1) / (16 * NG) * NG, ldv = (d + 15) / 16 * 16;
  return groups * 16 * d + lk * ldv + BQ * (groups * 16 + PAD) + BQ * ldv;
}

/* k rows [lk][d] (row stride ldk) -> kt [groups][d][16], keys past lk zero (16 keys gathered per store). */
static void pack_keys(const float *k, int64_t ldk, int64_t lk, int64_t d, int64_t groups, float *kt) {
  const __m512i rows = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                          _mm512_set1_epi32((int)ldk));
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t left = lk - g * 16;
    const __mmask16 t = tail_mask(left > 0 ? left : 0);
    const float *base = k + g * 16 * ldk;
    for (int64_t c = 0; c < d; ++c)
      _mm512_storeu_ps(kt + (g * d + c) * 16,
                       _mm512_mask_i32gather_ps(_mm512_setzero_ps(), t, rows, base + c, 4));
  }
}

/* s[r][g*16 .. +64) = scale * q[r] . kt[g .. g+4) for r < rows (<= RS). */
static inline __attribute__((always_inline)) void score_block(
    int rows, const float *q, int64_t ldq, const float *kt, int64_t d, float scale, float *s, int64_t lds) {
  __m512 acc[RS][NG];
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < NG; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int64_t x = 0; x < d; ++x) {
    __m512 kv[NG];
    for (int c = 0; c < NG; ++c) kv[c] = _mm512_loadu_ps(kt + (c * d + x) * 16);
    for (int r = 0; r < rows; ++r) {
      const __m512 a = _mm512_set1_ps(q[r * ldq + x]);
      for (int c = 0; c < NG; ++c) acc[r][c] = _mm512_fmadd_ps(a, kv[c], acc[r][c]);
    }
  }
  const __m512 sc = _mm512_set1_ps(scale);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < NG; ++c) _mm512_storeu_ps(s + r * lds + c * 16, _mm512_mul_ps(acc[r][c], sc));
}

/* One row of scores (lk valid entries) -> exp(s - max) in place, masked keys first set to MASKED; returns
 * the sum of the exponentials. mrow: lk bytes (nonzero = visible) or NULL. */
static float softmax_row(float *s, int64_t lk, const uint8_t *mrow) {
  __m512 vmax = _mm512_set1_ps(MASKED);
  for (int64_t j = 0; j < lk; j += 16) {
    const __mmask16 t = tail_mask(lk - j);
    __m512 x = _mm512_maskz_loadu_ps(t, s + j);
    if (mrow) {
      uint8_t tail[16] = {0};  /* the last, partial 16 bytes (no masked byte loads without AVX512BW) */
      const uint8_t *bytes = mrow + j;
      if (lk - j < 16) {
        for (int64_t i = 0; j + i < lk; ++i) tail[i] = mrow[j + i];
        bytes = tail;
      }
      const __m128i b = _mm_loadu_si128((const __m128i *)bytes);
      const __mmask16 vis = _mm512_test_epi32_mask(_mm512_cvtepu8_epi32(b), _mm512_cvtepu8_epi32(b));
      x = _mm512_mask_blend_ps(vis, _mm512_set1_ps(MASKED), x);
      _mm512_mask_storeu_ps(s + j, t, x);
    }
    vmax = _mm512_mask_max_ps(vmax, t, vmax, x);
  }
  const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(vmax));
  __m512 vsum = _mm512_setzero_ps();
  for (int64_t j = 0; j < lk; j += 16) {
    const __mmask16 t = tail_mask(lk - j);
    const __m512 e = exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(t, s + j), m));
    _mm512_mask_storeu_ps(s + j, t, e);
    vsum = _mm512_mask_add_ps(vsum, t, vsum, e);
  }
  return _mm512_reduce_add_ps(vsum);
}

/* o[r, c] += p[r, j0:j1] @ v[j0:j1, c] for r < rows (<= RS), c over nc (<= 4) vectors; v and o rows are
 * ldv floats apart (the head size padded to whole vectors, zeros past it). */
static inline __attribute__((always_inline)) void pv_block(
    int rows, int nc, const float *p, int64_t ldp, const float *v, int64_t ldv, int64_t j0, int64_t j1, float *o) {
  __m512 acc[RS * 4];
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < nc; ++c) acc[r * nc + c] = _mm512_loadu_ps(o + r * ldv + c * 16);
  for (int64_t j = j0; j < j1; ++j) {
    __m512 vv[4];
    for (int c = 0; c < nc; ++c) vv[c] = _mm512_loadu_ps(v + j * ldv + c * 16);
    for (int r = 0; r < rows; ++r) {
      const __m512 a = _mm512_set1_ps(p[r * ldp + j]);
      for (int c = 0; c < nc; ++c) acc[r * nc + c] = _mm512_fmadd_ps(a, vv[c], acc[r * nc + c]);
    }
  }
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < nc; ++c) _mm512_storeu_ps(o + r * ldv + c * 16, acc[r * nc + c]);
}

/* Every (rows, vectors) pair the blocks use, as constants so the accumulators stay in registers. */
#define PV(R, NC) pv_block(R, NC, s + r0 * lds, lds, v + c0 * 16, ldv, j0, j1, o + r0 * ldv + c0 * 16)
/* o [rows][ldv] = p [rows][lk] @ v [lk][ldv], key block by key block, RS rows x at most 4 vectors (64 dims)
 * at a time. */
static void pv_rows(int rows, int64_t dv, const float *s, int64_t lds, const float *v, int64_t ldv, int64_t lk,
                    float *o) {
  for (int64_t i = 0; i < rows * ldv; ++i) o[i] = 0.0f;
  for (int64_t j0 = 0; j0 < lk; j0 += KB) {
    const int64_t j1 = j0 + KB < lk ? j0 + KB : lk;
    for (int64_t c0 = 0; c0 < dv; c0 += 4) {
      const int nc = (int)(dv - c0 < 4 ? dv - c0 : 4);
      for (int r0 = 0; r0 < rows; r0 += RS) {
        switch (nc * 10 + (rows - r0 < RS ? rows - r0 : RS)) {
          case 11: PV(1, 1); break; case 12: PV(2, 1); break; case 13: PV(3, 1); break;
          case 14: PV(4, 1); break; case 15: PV(5, 1); break; case 16: PV(6, 1); break;
          case 21: PV(1, 2); break; case 22: PV(2, 2); break; case 23: PV(3, 2); break;
          case 24: PV(4, 2); break; case 25: PV(5, 2); break; case 26: PV(6, 2); break;
          case 31: PV(1, 3); break; case 32: PV(2, 3); break; case 33: PV(3, 3); break;
          case 34: PV(4, 3); break; case 35: PV(5, 3); break; case 36: PV(6, 3); break;
          case 41: PV(1, 4); break; case 42: PV(2, 4); break; case 43: PV(3, 4); break;
          case 44: PV(4, 4); break; case 45: PV(5, 4); break; default: PV(6, 4); break;
        }
      }
    }
  }
}

/* out = attention(q, k, v, mask): q, out [B, H, Lq, D] and k/v [B, Hkv, Lk, D], each given by its element
 * strides (batch, head, row; unit stride in D); H % Hkv == 0; any D >= 1; mask [B, Lq, Lk] bytes
 * (contiguous, nonzero = visible) or NULL; scratch: threads * edgefm_attention_scratch(lk, d) floats. */
void edgefm_attention(const float *q, int64_t qb, int64_t qh, int64_t ql, const float *k, int64_t kb, int64_t kh,
                      int64_t kl, const float *v, int64_t vb, int64_t vh, int64_t vl, float *out, int64_t ob,
                      int64_t oh, int64_t ol, int64_t b, int64_t h, int64_t hkv, int64_t lq, int64_t lk, int64_t d,
                      const uint8_t *mask, float scale, float *scratch, int threads) {
  const int64_t groups = (lk + 16 * NG - 1) / (16 * NG) * NG, lds = groups * 16 + PAD;
  const int64_t per = edgefm_attention_scratch(lk, d);
  const int64_t dv = (d + 15) / 16, ldv = dv * 16;  /* value rows padded to whole vectors */
  const __mmask16 dtail = tail_mask(d - (dv - 1) * 16);
  #pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t bh = 0; bh < b * h; ++bh) {
    const int64_t bi = bh / h, hi = bh % h, kvh = hi / (h / hkv);
    float *kt = scratch + (int64_t)omp_get_thread_num() * per, *vp = kt + groups * 16 * d, *s = vp + lk * ldv;
    float *o = s + BQ * lds;
    pack_keys(k + bi * kb + kvh * kh, kl, lk, d, groups, kt);
    for (int64_t j = 0; j < lk; ++j) {
      const float *src = v + bi * vb + kvh * vh + j * vl;
      for (int64_t c = 0; c < dv; ++c)
        _mm512_storeu_ps(vp + j * ldv + c * 16, _mm512_maskz_loadu_ps(c == dv - 1 ? dtail : 0xFFFF, src + c * 16));
    }
    for (int64_t q0 = 0; q0 < lq; q0 += BQ) {
      const int rows = (int)(lq - q0 < BQ ? lq - q0 : BQ);
      const float *qr = q + bi * qb + hi * qh + q0 * ql;
      for (int64_t g = 0; g < groups; g += NG)  /* 64 keys (16 KB of kt) at a time, for every row */
        for (int r0 = 0; r0 < rows; r0 += RS) {
          const int n = rows - r0 < RS ? rows - r0 : RS;
          const float *qq = qr + r0 * ql, *kg = kt + g * d * 16;
          float *sg = s + r0 * lds + g * 16;
          switch (n) {
            case 1: score_block(1, qq, ql, kg, d, scale, sg, lds); break;
            case 2: score_block(2, qq, ql, kg, d, scale, sg, lds); break;
            case 3: score_block(3, qq, ql, kg, d, scale, sg, lds); break;
            case 4: score_block(4, qq, ql, kg, d, scale, sg, lds); break;
            case 5: score_block(5, qq, ql, kg, d, scale, sg, lds); break;
            default: score_block(6, qq, ql, kg, d, scale, sg, lds); break;
          }
        }
      float sum[BQ];
      for (int r = 0; r < rows; ++r)
        sum[r] = softmax_row(s + r * lds, lk, mask ? mask + (bi * lq + q0 + r) * lk : 0);
      pv_rows(rows, dv, s, lds, vp, ldv, lk, o);
      float *dst = out + bi * ob + hi * oh + q0 * ol;
      for (int r = 0; r < rows; ++r) {
        const __m512 inv = _mm512_set1_ps(1.0f / sum[r]);
        for (int64_t c = 0; c < dv; ++c)
          _mm512_mask_storeu_ps(dst + r * ol + c * 16, c == dv - 1 ? dtail : 0xFFFF,
                                _mm512_mul_ps(_mm512_loadu_ps(o + r * ldv + c * 16), inv));
      }
    }
  }
}
