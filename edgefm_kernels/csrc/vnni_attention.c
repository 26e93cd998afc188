/* int8 attention on AVX512-VNNI, softmax(q k^T * scale + mask) v, for fast mode's vision tower on CPUs
 * without AMX (1024 queries x 1024 keys per head, head size 64, no mask). fp32 in and out.
 *
 * Both products run on vpdpbusd (unsigned x signed bytes, 4 products summed per int32 lane):
 *   q k^T: keys centred per channel (q . (k_j - mean_k) differs from q . k_j by a constant per query row,
 *          which the softmax removes), then quantised per key (symmetric, stored as q + 128); queries
 *          quantised per row. The +128 comes back out as 128 * (row sum of the quantised query).
 *   p v:   p = exp(s - row max) in (0, 1] rounded to p * 255 in unsigned bytes; values centred per channel
 *          (sum_j p_j (v_j - mean_v) / sum_j p_j + mean_v is the same weighted mean) and quantised per
 *          channel. The row is divided by the sum of its rounded p, so the weights still sum to one.
 * Rounding: nearest even (the default MXCSR), as torch.round. int32 sums cannot overflow for Lk < 65536
 * (255 * 127 * Lk; the Python side refuses more).
 * Whole score rows, as csrc/attention.c: one max per row, no rescaling. A query row with a NaN or an
 * infinity gives a NaN output row; so does every row of a head whose keys hold one; a value channel with
 * one gives a NaN output column.
 *
 * A thread owns one (batch, KV head) and its query heads at a time (grouped query heads share one packing:
 * for the expert's 15 heads over 5 KV heads the packing was half the work): it packs that KV head's keys as
 * [key groups of 16][D/4][16][4] bytes (one 64-byte load = 16 keys x 4 dims) and values as [Lk/4][channels][4]
 * (one load = 16 channels x 4 keys), then runs each query head's rows in blocks of BQ. Register blocks: 6 rows
 * x 64 keys for the scores, 6 rows x 64 channels for p v, 24 accumulators each as named variables.
 */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "vec_math.h"

#define BQ 48  /* query rows per block (a multiple of RS) */
#define RS 6   /* rows per register block */
#define PAD 16 /* floats between score rows, so rows 4 KB apart do not share L1 sets */
#define MASKED (-3.4028234663852886e38f)

typedef struct {
  int64_t d4, lk64, j4, dv; /* dims / 4; keys padded to 64; keys / 4 (rounded up); channels padded to 64 */
  int64_t lds, ldp;         /* score row stride (floats), p row stride (bytes) */
} dims_t;

static dims_t dims_of(int64_t lk, int64_t d) {
  dims_t s;
  s.d4 = (d + 3) / 4;
  s.lk64 = (lk + 63) / 64 * 64;
  s.j4 = (lk + 3) / 4;
  s.dv = (d + 63) / 64 * 64;
  s.lds = s.lk64 + PAD;
  s.ldp = (s.j4 * 4 + 63) / 64 * 64 + 64;
  return s;
}

static int64_t up64(int64_t n) { return (n + 63) / 64 * 64; }

/* Byte offsets of one thread's scratch parts, in order: kt, sk, vp, sv, vmean, kmean, q8, qs, qsum, s, p8,
 * psum; the last entry is the total. */
static void layout(int64_t lk, int64_t d, int64_t off[13]) {
  const dims_t s = dims_of(lk, d);
  const int64_t sizes[12] = {s.lk64 * s.d4 * 4, s.lk64 * 4, s.j4 * s.dv * 4, s.dv * 4, s.dv * 4, s.d4 * 4 * 4,
                             BQ * s.d4 * 4, BQ * 4, BQ * 4, BQ * s.lds * 4, BQ * s.ldp, BQ * 4};
  off[0] = 0;
  for (int i = 0; i < 12; ++i) off[i + 1] = off[i] + up64(sizes[i]);
}

/* Bytes of per-thread scratch for lk keys and head size d. */
int64_t edgefm_vnni_attention_scratch(int64_t lk, int64_t d) {
  int64_t off[13];
  layout(lk, d, off);
  return off[12];
}

/* Per-channel mean of n rows [n][d] (row stride ld) -> mean [d]. */
static void column_mean(const float *x, int64_t ld, int64_t n, int64_t d, float *mean) {
  for (int64_t c = 0; c < d; c += 16) {
    const __mmask16 t = tail_mask(d - c);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; ++j) acc = _mm512_add_ps(acc, _mm512_maskz_loadu_ps(t, x + j * ld + c));
    _mm512_mask_storeu_ps(mean + c, t, _mm512_div_ps(acc, _mm512_set1_ps((float)n)));
  }
}

/* 16 values (lanes t) of (x - mean) * inv, rounded to nearest even -> int32 (zero outside t). */
static inline __m512i quantize16(const float *x, const float *mean, __m512 inv, __mmask16 t) {
  __m512 v = _mm512_maskz_loadu_ps(t, x);
  if (mean) v = _mm512_sub_ps(v, _mm512_maskz_loadu_ps(t, mean));
  return _mm512_maskz_cvtps_epi32(t, _mm512_mul_ps(v, inv));
}

/* Keys [lk][d] (row stride ldk) -> kt [lk64/16][d4][16][4] (centred, quantised per key, + 128; keys and dims
 * past the end 128, i.e. zero) and their scales sk [lk64] (0 past lk). Returns 1 when a key is not finite. */
static int pack_keys(const float *k, int64_t ldk, int64_t lk, int64_t d, const dims_t *s, float *kmean,
                     uint8_t *kt, float *sk) {
  column_mean(k, ldk, lk, d, kmean);
  memset(kt, 128, (size_t)(s->lk64 * s->d4 * 4));
  memset(sk, 0, (size_t)(s->lk64 * 4));
  int any = 0;
  for (int64_t j = 0; j < lk; ++j) {
    int bad;
    const float a = absmax_ps(k + j * ldk, kmean, d, &bad);
    any |= bad;
    if (bad || a == 0.0f) continue;
    const __m512 inv = _mm512_set1_ps(127.0f / a);
    sk[j] = a / 127.0f;
    uint8_t *dst = kt + (j / 16) * s->d4 * 64 + (j % 16) * 4;
    for (int64_t c = 0; c < d; c += 16) {
      const __m512i q = quantize16(k + j * ldk + c, kmean + c, inv, tail_mask(d - c));
      const __m128i b = _mm_xor_si128(_mm512_cvtsepi32_epi8(q), _mm_set1_epi8((char)0x80)); /* q + 128 */
      int32_t quads[4];
      _mm_storeu_si128((__m128i *)quads, b);
      for (int64_t i = 0; i < 4 && c / 4 + i < s->d4; ++i) memcpy(dst + (c / 4 + i) * 64, quads + i, 4);
    }
  }
  return any;
}

/* Values [lk][d] (row stride ldv) -> vp [j4][dv][4] (centred and quantised per channel, signed; zero past
 * the ends), their scales sv [dv] and means vmean [dv] (NaN for a channel holding a NaN or an infinity). */
static void pack_values(const float *v, int64_t ldv, int64_t lk, int64_t d, const dims_t *s, int8_t *vp, float *sv,
                        float *vmean) {
  memset(vmean, 0, (size_t)(s->dv * 4));
  memset(sv, 0, (size_t)(s->dv * 4));
  column_mean(v, ldv, lk, d, vmean);
  for (int64_t c = 0; c < d; c += 16) {
    const __mmask16 t = tail_mask(d - c);
    const __m512 m = _mm512_maskz_loadu_ps(t, vmean + c);
    __m512 a = _mm512_setzero_ps();
    __mmask16 nf = 0;
    for (int64_t j = 0; j < lk; ++j) {
      const __m512 x = _mm512_maskz_loadu_ps(t, v + j * ldv + c);
      nf |= _mm512_mask_fpclass_ps_mask(t, x, 0x99);
      a = _mm512_max_ps(a, _mm512_abs_ps(_mm512_sub_ps(x, m)));
    }
    a = _mm512_mul_ps(a, _mm512_set1_ps(1.0f / 127.0f));
    _mm512_mask_storeu_ps(sv + c, t, _mm512_mask_mov_ps(a, nf, _mm512_set1_ps(NAN)));
    _mm512_mask_storeu_ps(vmean + c, t, _mm512_mask_mov_ps(m, nf, _mm512_set1_ps(NAN)));
  }
  memset(vp, 0, (size_t)(s->j4 * s->dv * 4));
  for (int64_t c = 0; c < d; c += 16) {
    const __mmask16 t = tail_mask(d - c);
    const __m512 scale = _mm512_loadu_ps(sv + c);
    /* 1 / scale where the channel varies; 0 for a constant or NaN channel (its mean or NaN comes back) */
    const __mmask16 live = _mm512_cmp_ps_mask(scale, _mm512_setzero_ps(), _CMP_GT_OQ) & t;
    const __m512 inv = _mm512_maskz_div_ps(live, _mm512_set1_ps(1.0f), scale);
    for (int64_t j0 = 0; j0 < lk; j0 += 4) {
      __m128i b[4];
      for (int i = 0; i < 4; ++i)
        b[i] = j0 + i < lk ? _mm512_cvtsepi32_epi8(quantize16(v + (j0 + i) * ldv + c, vmean + c, inv, live))
                           : _mm_setzero_si128();
      /* [key][16 channels] -> [16 channels][4 keys] */
      const __m128i t0 = _mm_unpacklo_epi8(b[0], b[1]), t1 = _mm_unpackhi_epi8(b[0], b[1]);
      const __m128i t2 = _mm_unpacklo_epi8(b[2], b[3]), t3 = _mm_unpackhi_epi8(b[2], b[3]);
      __m128i *dst = (__m128i *)(vp + ((j0 / 4) * s->dv + c) * 4);
      _mm_storeu_si128(dst, _mm_unpacklo_epi16(t0, t2));
      _mm_storeu_si128(dst + 1, _mm_unpackhi_epi16(t0, t2));
      _mm_storeu_si128(dst + 2, _mm_unpacklo_epi16(t1, t3));
      _mm_storeu_si128(dst + 3, _mm_unpackhi_epi16(t1, t3));
    }
  }
}

/* Rows [0, rows) of q (row stride ldq) -> q8 [BQ][d4 * 4] signed (zero past d and past rows), scales qs and
 * row sums qsum (a NaN scale for a row holding a NaN or an infinity). */
static void quantize_queries(const float *q, int64_t ldq, int rows, int64_t d, const dims_t *s, int8_t *q8,
                             float *qs, int32_t *qsum) {
  memset(q8, 0, (size_t)(BQ * s->d4 * 4));
  for (int r = 0; r < BQ; ++r) qs[r] = 0.0f, qsum[r] = 0;
  for (int r = 0; r < rows; ++r) {
    const float *x = q + r * ldq;
    int bad;
    const float a = absmax_ps(x, NULL, d, &bad);
    if (bad || a == 0.0f) {
      qs[r] = bad ? NAN : 0.0f;
      continue;
    }
    const __m512 inv = _mm512_set1_ps(127.0f / a);
    __m512i sum = _mm512_setzero_si512();
    for (int64_t c = 0; c < d; c += 16) {
      const __mmask16 t = tail_mask(d - c);
      const __m512i v = quantize16(x + c, NULL, inv, t);
      sum = _mm512_add_epi32(sum, v);
      _mm512_mask_cvtsepi32_storeu_epi8(q8 + r * s->d4 * 4 + c, t, v);
    }
    qs[r] = a / 127.0f;
    qsum[r] = _mm512_reduce_add_epi32(sum);
  }
}

#define FOR_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5)
#define DECL(r) \
  __m512i c##r##0 = _mm512_setzero_si512(), c##r##1 = c##r##0, c##r##2 = c##r##0, c##r##3 = c##r##0;
/* c[r][i] += u[i] . s for 4 vectors: u unsigned bytes, s signed (vpdpbusd's operand order) */
#define DOT4(r, s, u0, u1, u2, u3)                 \
  {                                                \
    c##r##0 = _mm512_dpbusd_epi32(c##r##0, u0, s); \
    c##r##1 = _mm512_dpbusd_epi32(c##r##1, u1, s); \
    c##r##2 = _mm512_dpbusd_epi32(c##r##2, u2, s); \
    c##r##3 = _mm512_dpbusd_epi32(c##r##3, u3, s); \
  }
/* c[r][i] += u . s[i]: one unsigned broadcast against 4 signed vectors */
#define DOT4U(r, u, s0, s1, s2, s3)                \
  {                                                \
    c##r##0 = _mm512_dpbusd_epi32(c##r##0, u, s0); \
    c##r##1 = _mm512_dpbusd_epi32(c##r##1, u, s1); \
    c##r##2 = _mm512_dpbusd_epi32(c##r##2, u, s2); \
    c##r##3 = _mm512_dpbusd_epi32(c##r##3, u, s3); \
  }

/* int32 sums of the 6 query rows q8 against 64 keys kt (4 groups of 16) -> acc [6][64]. The conversion to
 * scores is a separate pass: fused here, its registers pushed gcc into storing every accumulator at every
 * step. */
#define SC_STEP(r) DOT4(r, _mm512_set1_epi32(a[r * d4]), k0, k1, k2, k3)
#define ACC_STORE(r)                                  \
  _mm512_store_si512(acc + r * 64, c##r##0);          \
  _mm512_store_si512(acc + r * 64 + 16, c##r##1);     \
  _mm512_store_si512(acc + r * 64 + 32, c##r##2);     \
  _mm512_store_si512(acc + r * 64 + 48, c##r##3);
static void score_block(const int8_t *q8, int64_t d4, const uint8_t *kt, int32_t *acc) {
  FOR_ROWS(DECL)
  for (int64_t x = 0; x < d4; ++x) {
    const __m512i k0 = _mm512_loadu_si512(kt + x * 64), k1 = _mm512_loadu_si512(kt + (d4 + x) * 64);
    const __m512i k2 = _mm512_loadu_si512(kt + (2 * d4 + x) * 64), k3 = _mm512_loadu_si512(kt + (3 * d4 + x) * 64);
    const int32_t *a = (const int32_t *)q8 + x;
    FOR_ROWS(SC_STEP)
  }
  FOR_ROWS(ACC_STORE)
}

/* acc [6][64] of score_block -> s [6][64] (row stride lds): (acc - 128 qsum) * qs * scale * sk, with scale in
 * log2 units (times log2 e: the softmax takes 2^x, see softmax_row). Keys at or past ``valid`` (< 64 only in
 * the last block) are left out of the rows' running maxima vmax [6]; so are masked keys, whose scores are set
 * to MASKED. mrows: the first nrows rows' mask bytes for these keys (row stride ldm) or NULL. */
static void scores_from(const int32_t *acc, const float *qs, const int32_t *qsum, const float *sk, float scale,
                        int64_t valid, const uint8_t *mrows, int nrows, int64_t ldm, float *s, int64_t lds,
                        __m512 *vmax) {
  for (int r = 0; r < RS; ++r) {
    const __m512i off = _mm512_set1_epi32(128 * qsum[r]);
    const __m512 f = _mm512_set1_ps(qs[r] * scale);
    for (int c = 0; c < 64; c += 16) {
      const __mmask16 t = tail_mask(valid - c > 0 ? valid - c : 0);
      __m512 x = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_load_si512(acc + r * 64 + c),
                                                                                  off)), f), _mm512_loadu_ps(sk + c));
      if (mrows && t && r < nrows) {
        uint8_t bytes[16] = {0};
        memcpy(bytes, mrows + r * ldm + c, (size_t)(valid - c < 16 ? valid - c : 16));
        const __m512i m = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)bytes));
        x = _mm512_mask_blend_ps(_mm512_test_epi32_mask(m, m), _mm512_set1_ps(MASKED), x);
      }
      vmax[r] = _mm512_mask_max_ps(vmax[r], t, vmax[r], x);
      _mm512_storeu_ps(s + r * lds + c, x);
    }
  }
}

/* p v for the 6 rows p8 (row stride ldp bytes) over j4 key quads and 64 channels of vp (row stride dv
 * channels) -> the int32 sums acc [6][64] (64-byte aligned). */
#define PV_STEP(r) DOT4U(r, _mm512_set1_epi32(*(const int32_t *)(p8 + r * ldp + 4 * j)), v0, v1, v2, v3)
static void pv_block(const uint8_t *p8, int64_t ldp, int64_t j4, const int8_t *vp, int64_t dv, int32_t *acc) {
  FOR_ROWS(DECL)
  for (int64_t j = 0; j < j4; ++j) {
    const int8_t *vj = vp + j * dv * 4;
    const __m512i v0 = _mm512_loadu_si512(vj), v1 = _mm512_loadu_si512(vj + 64), v2 = _mm512_loadu_si512(vj + 128),
                  v3 = _mm512_loadu_si512(vj + 192);
    FOR_ROWS(PV_STEP)
  }
  FOR_ROWS(ACC_STORE)
}

/* One row of scores in log2 units (lk valid, masked ones already MASKED) and its maximum -> p8 =
 * round(255 * 2^(s - max)), zeros past lk up to ldp; returns the sum of p8. The 255 rides in the exponent;
 * exp2_fast_ps's 2.7e-6 relative error is far below the byte's 1/255. */
static int32_t softmax_row(const float *s, int64_t lk, float max, uint8_t *p8, int64_t ldp) {
  const __m512 m = _mm512_set1_ps(max - 7.99435343685885793f); /* log2 255 */
  __m512i sum = _mm512_setzero_si512();
  memset(p8 + lk / 16 * 16, 0, (size_t)(ldp - lk / 16 * 16));
  for (int64_t j = 0; j < lk; j += 16) {
    const __mmask16 t = tail_mask(lk - j);
    const __m512i p = _mm512_maskz_cvtps_epi32(t, exp2_fast_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(t, s + j), m)));
    _mm512_mask_cvtusepi32_storeu_epi8(p8 + j, t, p);
    sum = _mm512_add_epi32(sum, p);
  }
  return _mm512_reduce_add_epi32(sum);
}

/* out = attention(q, k, v, mask): q, out [B, H, Lq, D] and k/v [B, Hkv, Lk, D], each given by its element
 * strides (batch, head, row; unit stride in D); H % Hkv == 0; 1 <= D <= 16384, 1 <= Lk < 65536; mask
 * [B, Lq, Lk] bytes (contiguous, nonzero = visible) or NULL; scratch: threads *
 * edgefm_vnni_attention_scratch(lk, d) bytes, 64-byte aligned. */
void edgefm_vnni_attention(const float *q, int64_t qb, int64_t qh, int64_t ql, const float *k, int64_t kb, int64_t kh,
                           int64_t kl, const float *v, int64_t vb, int64_t vh, int64_t vl, float *out, int64_t ob,
                           int64_t oh, int64_t ol, int64_t b, int64_t h, int64_t hkv, int64_t lq, int64_t lk,
                           int64_t d, const uint8_t *mask, float scale, uint8_t *scratch, int threads) {
  const dims_t s = dims_of(lk, d);
  scale *= 1.4426950408889634f; /* log2 e */
  int64_t off[13];
  layout(lk, d, off);
  const int64_t group = h / hkv; /* query heads per KV head: a thread takes a whole group, packing K and V once */
#pragma omp parallel num_threads(threads)
  {
  int64_t packed = -1; /* the (batch, KV head) this thread's scratch holds */
  int kbad = 0;
#pragma omp for schedule(dynamic, group)
  for (int64_t bh = 0; bh < b * h; ++bh) {
    const int64_t bi = bh / h, hi = bh % h, kvh = hi / group;
    uint8_t *base = scratch + (int64_t)omp_get_thread_num() * off[12];
    uint8_t *kt = base + off[0], *p8 = base + off[10];
    float *sk = (float *)(base + off[1]), *sv = (float *)(base + off[3]), *vmean = (float *)(base + off[4]);
    float *kmean = (float *)(base + off[5]), *qs = (float *)(base + off[7]), *sc = (float *)(base + off[9]);
    int8_t *vp = (int8_t *)(base + off[2]), *q8 = (int8_t *)(base + off[6]);
    int32_t *qsum = (int32_t *)(base + off[8]), *psum = (int32_t *)(base + off[11]);
    if (packed != bi * hkv + kvh) {
      kbad = pack_keys(k + bi * kb + kvh * kh, kl, lk, d, &s, kmean, kt, sk);
      pack_values(v + bi * vb + kvh * vh, vl, lk, d, &s, vp, sv, vmean);
      packed = bi * hkv + kvh;
    }
    int32_t acc[RS * 64] __attribute__((aligned(64)));
    __m512 vmax[BQ];
    for (int64_t q0 = 0; q0 < lq; q0 += BQ) {
      const int rows = (int)(lq - q0 < BQ ? lq - q0 : BQ);
      float *dst = out + bi * ob + hi * oh + q0 * ol;
      quantize_queries(q + bi * qb + hi * qh + q0 * ql, ql, rows, d, &s, q8, qs, qsum);
      for (int r = 0; r < BQ; ++r) vmax[r] = _mm512_set1_ps(MASKED);
      for (int64_t g = 0; g < s.lk64; g += 64) /* 64 keys (4 KB of kt for D = 64) at a time, for every row */
        for (int r0 = 0; r0 < rows; r0 += RS) {
          score_block(q8 + r0 * s.d4 * 4, s.d4, kt + g * s.d4 * 4, acc);
          scores_from(acc, qs + r0, qsum + r0, sk + g, scale, lk - g, mask ? mask + (bi * lq + q0 + r0) * lk + g : 0,
                      rows - r0, lk, sc + r0 * s.lds + g, s.lds, vmax + r0);
        }
      for (int r = 0; r < rows; ++r)
        psum[r] = softmax_row(sc + r * s.lds, lk, _mm512_reduce_max_ps(vmax[r]), p8 + r * s.ldp, s.ldp);
      for (int r = rows; r < (rows + RS - 1) / RS * RS; ++r) memset(p8 + r * s.ldp, 0, (size_t)s.ldp);
      for (int64_t c0 = 0; c0 < s.dv; c0 += 64)
        for (int r0 = 0; r0 < rows; r0 += RS) {
          pv_block(p8 + r0 * s.ldp, s.ldp, s.j4, vp + c0 * 4, s.dv, acc);
          for (int r = r0; r < rows && r < r0 + RS; ++r) {
            const float inv = kbad || isnan(qs[r]) ? NAN : 1.0f / (float)psum[r];
            for (int64_t c = c0; c < d && c < c0 + 64; c += 16) {
              const __mmask16 t = tail_mask(d - c);
              const __m512 a = _mm512_cvtepi32_ps(_mm512_loadu_si512(acc + (r - r0) * 64 + (c - c0)));
              const __m512 o = _mm512_fmadd_ps(_mm512_mul_ps(a, _mm512_set1_ps(inv)), _mm512_loadu_ps(sv + c),
                                               _mm512_loadu_ps(vmean + c));
              _mm512_mask_storeu_ps(dst + r * ol + c, t, o);
            }
          }
        }
    }
  }
  }
}
