/* bf16 attention on Intel AMX (fast mode): softmax(q k^T * scale + mask) v for head size 64.
 *
 * For each (batch, KV head, block of 16 query rows of the query heads that share it, stacked):
 *   1. S [16, Lk] fp32 = Q K^T on the tiles (bf16 products, fp32 sums), two 16-key blocks at a time;
 *      Right after each pair of tiles is stored (still in L1), masked keys get the reference's finfo.min
 *      score and each row's running maximum is updated: the softmax does not read S a second time;
 *   2. each row: E = exp((s - max) * scale) (to 7.7e-5 relative) rounded to bf16 (2^-9, as the reference
 *      rounds its probabilities to the value dtype) and its sum (a row with no visible key is uniform), keys
 *      past Lk get exactly 0;
 *   3. O [16, 64] = (E V on the tiles) / sum, rounded to bf16 (one pass over E instead of two).
 * K and V are packed once per call and KV head into the tiles' VNNI layout (pairs of the reduction index
 * side by side): K as 16-key x 32-dim tiles, V as 32-key x 16-dim tiles, zero past Lk.
 * Every tile is 16 rows x 64 bytes; tiles 0-1 hold A operands, 2-3 B operands, 4-7 accumulators. The rows of
 * S and P are padded by 64 bytes: with S's 4 KB row stride a tile's 16 rows all fell in one L1 set.
 * Steps 1 and 3 run on the tiles, step 2 on the vector units: each thread pipelines its blocks so that block
 * i's step 1 and block i-2's step 3 have block i-1's softmax rows between their key steps, and the two units
 * overlap (vision shape: 12.7 -> 9.8 ms a layer for three cameras, the softmax alone ~6).
 */
#include <float.h>
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "amx.h"
#include "vec_math.h"

#define D 64
#define GRAB 4 /* blocks of 16 query rows a thread takes at a time (of one head: K and V stay in L2) */
#define MAX_RANGES 64
#define S_PAD 16 /* floats past each row of S, and bf16 past each row of P: rows in different L1 sets */
#define P_PAD 32

static void configure_tiles(void) {
  tile_config c;
  memset(&c, 0, sizeof c);
  c.palette_id = 1;
  for (int t = 0; t < 8; ++t) {
    c.colsb[t] = 64;
    c.rows[t] = 16;
  }
  _tile_loadconfig(&c);
}

static inline __m512 bf16_to_ps(__m256i v) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
}

/* 16 x 16 32-bit words: r[i] lane j -> r[j] lane i (four rounds of in-lane and cross-lane shuffles). */
static inline void transpose16_epi32(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  /* each 128-bit lane now holds one 4-word column group of four consecutive rows; two rounds of 128-bit
   * shuffles put the groups of a column in order */
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_i32x4(r[i], r[4 + i], 0x88);
    t[4 + i] = _mm512_shuffle_i32x4(r[i], r[4 + i], 0xDD);
    t[8 + i] = _mm512_shuffle_i32x4(r[8 + i], r[12 + i], 0x88);
    t[12 + i] = _mm512_shuffle_i32x4(r[8 + i], r[12 + i], 0xDD);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm512_shuffle_i32x4(t[i], t[8 + i], 0x88);
    r[8 + i] = _mm512_shuffle_i32x4(t[i], t[8 + i], 0xDD);
    r[4 + i] = _mm512_shuffle_i32x4(t[4 + i], t[12 + i], 0x88);
    r[12 + i] = _mm512_shuffle_i32x4(t[4 + i], t[12 + i], 0xDD);
  }
}

/* K [Lk, D] (row stride sk) -> kp[kb][c][r][n] = the dim pair (32 c + 2 r, +1) of key 16 kb + n, one 32-bit
 * word (one 1 KB tile per kb, c): 16 keys x 16 words transposed. Zero past lk. */
static void pack_k(const uint16_t *k, int64_t sk, int64_t lk, int64_t lkp, uint16_t *kp) {
  for (int64_t kb = 0; kb < lkp / 16; ++kb)
    for (int c = 0; c < 2; ++c) {
      __m512i r[16];
      for (int n = 0; n < 16; ++n) {
        const int64_t key = kb * 16 + n;
        r[n] = key < lk ? _mm512_loadu_si512(k + key * sk + c * 32) : _mm512_setzero_si512();
      }
      transpose16_epi32(r);
      uint32_t *t = (uint32_t *)(kp + (kb * 2 + c) * 512);
      for (int i = 0; i < 16; ++i) _mm512_storeu_si512(t + i * 16, r[i]);
    }
}

/* V [Lk, D] (row stride sv) -> vp[kc][j][r][n][i] = V[32 kc + 2 r + i][16 j + n]: rows 2r and 2r+1 of a dim
 * block interleaved element by element. Zero past lk. */
static void pack_v(const uint16_t *v, int64_t sv, int64_t lk, int64_t lkp, uint16_t *vp) {
  const __m512i mix = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                       23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  for (int64_t kc = 0; kc < lkp / 32; ++kc)
    for (int r = 0; r < 16; ++r) {
      const int64_t k0 = kc * 32 + 2 * r, k1 = k0 + 1;
      for (int j = 0; j < 4; ++j) {
        const __m256i a = k0 < lk ? _mm256_loadu_si256((const __m256i *)(v + k0 * sv + j * 16)) : _mm256_setzero_si256();
        const __m256i b = k1 < lk ? _mm256_loadu_si256((const __m256i *)(v + k1 * sv + j * 16)) : _mm256_setzero_si256();
        const __m512i ab = _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
        _mm512_storeu_si512(vp + (kc * 4 + j) * 512 + r * 32, _mm512_permutexvar_epi16(mix, ab));
      }
    }
}

/* 2^t for the softmax's t <= 0: f = t - floor(t) in [0, 1) (one vreduceps), a degree-3 fit of 2^f (7.7e-5
 * relative; P is rounded to bf16, 3.9e-3, right after), times 2^floor(t) (vscalefps). The caller runs with
 * FTZ/DAZ: results below 2^-126 are zero, never slow denormals. */
static inline __m512 exp2_softmax_ps(__m512 t) {
  const __m512 f = _mm512_reduce_ps(t, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m512 p = _mm512_set1_ps(0.07790716f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.22623319f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.69577708f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.99992785f));
  return _mm512_scalef_ps(p, t);
}

/* One row of scores s [lk] (fp32, unscaled; masked keys already at finfo.min) whose maximum is the largest
 * lane of rowmax [16] -> p [lkp] bf16 = exp((s - max) * scale), zero past lk; returns the sum of the
 * exponentials (the caller divides the row's P V by it). */
static float softmax_row(const float *s, const float *rowmax, int64_t lk, int64_t lkp, float scale, uint16_t *p) {
  const float m = _mm512_reduce_max_ps(_mm512_load_ps(rowmax));
  if (m == -FLT_MAX) {  /* no visible key: uniform weights, as the reference's finfo.min fill gives */
    for (int64_t j = 0; j < lkp; j += 16)
      _mm256_storeu_si256((__m256i *)(p + j), (__m256i)_mm512_cvtneps_pbh(
          _mm512_maskz_mov_ps(j < lk ? tail_mask(lk - j) : 0, _mm512_set1_ps(1.0f))));
    return (float)lk;
  }
  /* exp((s - max) * scale) = 2^(s c - max c), c = scale * log2(e), one FMA a vector; two sums: one chain
   * would wait on the previous vector's add */
  const __m512 c = _mm512_set1_ps(scale * 1.4426950408889634f);
  const __m512 mc = _mm512_set1_ps(m * (scale * 1.4426950408889634f));
  __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0;
  int64_t j = 0;
  for (; j + 32 <= lk; j += 32) {
    const __m512 e0 = exp2_softmax_ps(_mm512_fmsub_ps(_mm512_loadu_ps(s + j), c, mc));
    const __m512 e1 = exp2_softmax_ps(_mm512_fmsub_ps(_mm512_loadu_ps(s + j + 16), c, mc));
    acc0 = _mm512_add_ps(acc0, e0);
    acc1 = _mm512_add_ps(acc1, e1);
    _mm512_storeu_si512(p + j, (__m512i)_mm512_cvtne2ps_pbh(e1, e0));
  }
  for (; j < lkp; j += 32) { /* the last keys, lkp a multiple of 32 */
    const __mmask16 t0 = j < lk ? tail_mask(lk - j) : 0, t1 = j + 16 < lk ? tail_mask(lk - j - 16) : 0;
    const __m512 e0 = _mm512_maskz_mov_ps(t0, exp2_softmax_ps(_mm512_fmsub_ps(_mm512_maskz_loadu_ps(t0, s + j), c, mc)));
    const __m512 e1 = _mm512_maskz_mov_ps(t1, exp2_softmax_ps(_mm512_fmsub_ps(_mm512_maskz_loadu_ps(t1, s + j + 16), c, mc)));
    acc0 = _mm512_add_ps(acc0, e0);
    acc1 = _mm512_add_ps(acc1, e1);
    _mm512_storeu_si512(p + j, (__m512i)_mm512_cvtne2ps_pbh(e1, e0));
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

/* One block of 16 query rows of one KV head: the rows of its query heads stacked (GQA: the decode's 3 x 50
 * rows make 10 blocks instead of 3 x 4 with 14 rows of padding each), each row's head and position, and the
 * block's buffers (S fp32, P bf16, the softmax sums). */
typedef struct {
  int64_t bi, rows, kvh, head[16], pos[16];
  float *s, sums[16];
  float mx[16 * 16] __attribute__((aligned(64))); /* per row, 16 running maxima of its scores */
  uint16_t *p;
} qblock;

/* Keys [k0, k0 + 32) of block blk's scores s (row stride ss) were just stored: masked keys get the reference's
 * finfo.min fill (it comes after the scale, and any scale > 0 keeps it lowest), and each row's running maxima
 * take them in (keys past lk: not counted). mask: uint8 [B, Lq, Lk] or NULL. */
static void scores_seen(qblock *blk, float *s, int64_t ss, int64_t k0, const uint8_t *mask, int64_t lq, int64_t lk) {
  const __mmask16 t0 = k0 < lk ? tail_mask(lk - k0) : 0, t1 = k0 + 16 < lk ? tail_mask(lk - k0 - 16) : 0;
  const __m512 lowest = _mm512_set1_ps(-FLT_MAX);
  for (int64_t r = 0; r < blk->rows; ++r) {
    float *sr = s + r * ss + k0;
    if (mask != NULL) {
      const uint8_t *mr = mask + (blk->bi * lq + blk->pos[r]) * lk + k0;
      const __mmask16 seen0 = _mm_test_epi8_mask(_mm_maskz_loadu_epi8(t0, mr), _mm_set1_epi8(-1));
      const __mmask16 seen1 = _mm_test_epi8_mask(_mm_maskz_loadu_epi8(t1, mr + 16), _mm_set1_epi8(-1));
      _mm512_mask_store_ps(sr, t0 & ~seen0, lowest);
      _mm512_mask_store_ps(sr + 16, t1 & ~seen1, lowest);
    }
    const __m512 m = _mm512_load_ps(blk->mx + r * 16);
    const __m512 v = _mm512_mask_max_ps(m, t0, m, _mm512_load_ps(sr));
    _mm512_store_ps(blk->mx + r * 16, _mm512_mask_max_ps(v, t1, v, _mm512_load_ps(sr + 16)));
  }
}

/* The softmax of rows [r0, r1) of block `blk` (rows past its end: zero probabilities). */
static void softmax_rows(qblock *blk, int64_t r0, int64_t r1, int64_t lk, int64_t lkp, float scale) {
  for (int64_t r = r0; r < r1; ++r) {
    if (r < blk->rows)
      blk->sums[r] = softmax_row(blk->s + r * (lkp + S_PAD), blk->mx + r * 16, lk, lkp, scale,
                                 blk->p + r * (lkp + P_PAD));
    else
      memset(blk->p + r * (lkp + P_PAD), 0, lkp * sizeof(uint16_t));
  }
}

/* O = P V / sums for block `blk` (its softmax done), rounded to bf16 into out; between its key steps, rows
 * [r0, r1) of `next`'s softmax (next may be NULL). */
static void pv_block(const qblock *blk, const uint16_t *vt, int64_t lkp, float *ob, uint16_t *out, const int64_t *os,
                     qblock *next, int64_t r0, int64_t r1, int64_t lk, float scale) {
  _tile_zero(4);
  _tile_zero(5);
  _tile_zero(6);
  _tile_zero(7);
  const int64_t steps = lkp / 32;
  for (int64_t kc = 0; kc < steps; ++kc) {
    if (next) softmax_rows(next, r0 + kc * (r1 - r0) / steps, r0 + (kc + 1) * (r1 - r0) / steps, lk, lkp, scale);
    _tile_loadd(0, blk->p + kc * 32, (lkp + P_PAD) * sizeof(uint16_t));
    _tile_loadd(2, vt + (kc * 4 + 0) * 512, 64);
    _tile_loadd(3, vt + (kc * 4 + 1) * 512, 64);
    _tile_dpbf16ps(4, 0, 2);
    _tile_dpbf16ps(5, 0, 3);
    _tile_loadd(2, vt + (kc * 4 + 2) * 512, 64);
    _tile_loadd(3, vt + (kc * 4 + 3) * 512, 64);
    _tile_dpbf16ps(6, 0, 2);
    _tile_dpbf16ps(7, 0, 3);
  }
  _tile_stored(4, ob, D * sizeof(float));
  _tile_stored(5, ob + 16, D * sizeof(float));
  _tile_stored(6, ob + 32, D * sizeof(float));
  _tile_stored(7, ob + 48, D * sizeof(float));
  for (int64_t r = 0; r < blk->rows; ++r) {
    uint16_t *o = out + blk->bi * os[0] + blk->head[r] * os[1] + blk->pos[r] * os[2];
    const __m512 inv = _mm512_set1_ps(1.0f / blk->sums[r]);
    for (int j = 0; j < D; j += 32)
      _mm512_storeu_si512(o + j,
                          (__m512i)_mm512_cvtne2ps_pbh(_mm512_mul_ps(_mm512_load_ps(ob + r * D + j + 16), inv),
                                                       _mm512_mul_ps(_mm512_load_ps(ob + r * D + j), inv)));
  }
}

/* q [B, Hq, Lq, 64] (element strides qs[3], unit in D), k/v [B, Hkv, Lk, 64] (ks[3], vs[3]),
 * mask uint8 [B, Lq, Lk] contiguous or NULL, out [B, Hq, Lq, 64] (element strides os[3], unit in D); all bf16
 * as uint16.
 * work: 2 * B * Hkv * lkp * 64 bf16 for the packed K and V (lkp = Lk rounded up to 32). */
void edgefm_amx_attention(const uint16_t *q, const int64_t *qs, const uint16_t *k, const int64_t *ks,
                          const uint16_t *v, const int64_t *vs, const uint8_t *mask, int64_t b, int64_t hq,
                          int64_t hkv, int64_t lq, int64_t lk, float scale, uint16_t *out, const int64_t *os,
                          uint16_t *work,
                          int threads) {
  const int64_t lkp = (lk + 31) / 32 * 32, per = lkp * D, groups = hq / hkv, stacked = groups * lq,
                qblocks = (stacked + 15) / 16;
  uint16_t *kp = work, *vp = work + b * hkv * per;
  #pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t bh = 0; bh < b * hkv; ++bh) {
    const int64_t bi = bh / hkv, h = bh % hkv;
    pack_k(k + bi * ks[0] + h * ks[1], ks[2], lk, lkp, kp + bh * per);
    pack_v(v + bi * vs[0] + h * vs[1], vs[2], lk, lkp, vp + bh * per);
  }
  /* the blocks in one contiguous range per thread; a thread takes GRAB at a time from its own range, then
   * from the others' (atomic counts of the blocks taken from each) */
  const int64_t ranges = threads < MAX_RANGES ? (threads > 0 ? threads : 1) : MAX_RANGES;
  int64_t taken[MAX_RANGES] = {0};
  #pragma omp parallel num_threads(threads)
  {
    const unsigned csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8040); /* FTZ and DAZ (restored at the end) */
    configure_tiles();
    /* Software pipeline over this thread's blocks: while the tiles compute a block's scores or P V, the vector
     * units run another block's softmax, a few rows between each pair of key steps (the tile products are
     * long-latency instructions that the vector work after them overlaps). Three S and P buffers. */
    qblock blk[3];
    for (int i = 0; i < 3; ++i) {
      blk[i].s = aligned_alloc(64, 16 * (lkp + S_PAD) * sizeof(float));
      blk[i].p = aligned_alloc(64, 16 * (lkp + P_PAD) * sizeof(uint16_t));
    }
    uint16_t qb[16 * D] __attribute__((aligned(64)));
    float ob[16 * D] __attribute__((aligned(64)));
    const int64_t total = b * hkv * qblocks, steps = lkp / 32;
    /* item i: its scores on the tiles with the first half of block i-1's softmax between them, then block
     * i-2's P V with the second half between its steps */
    qblock *prev = NULL, *prev2 = NULL;
    /* a thread that another process preempts leaves the rest of its range to the other (with the blocks split
     * in halves up front the other waited at the end; one shared counter for all blocks, without ranges, cost
     * the decode's small calls 25%) */
    const int64_t own = ranges * omp_get_thread_num() / omp_get_num_threads();
    for (int64_t item = 0, grabbed = 0, mine = 0, k = 0;; ++mine) {
      if (++item >= grabbed) { /* the next GRAB blocks of this range, or of the next one with some left */
        for (item = -1; k < ranges; ++k) {
          const int64_t u = (own + k) % ranges, lo = total * u / ranges, hi = total * (u + 1) / ranges;
          const int64_t first = lo + __atomic_fetch_add(&taken[u], GRAB, __ATOMIC_RELAXED);
          if (first < hi) {
            item = first;
            grabbed = first + GRAB < hi ? first + GRAB : hi;
            break;
          }
        }
        if (item < 0) break;
      }
      qblock *cur = &blk[mine % 3]; /* this thread's blocks in turn: the pipeline's three buffers */
      cur->bi = item / (hkv * qblocks);
      const int64_t kh = item / qblocks % hkv, row0 = item % qblocks * 16;
      cur->rows = stacked - row0 < 16 ? stacked - row0 : 16;
      cur->kvh = cur->bi * hkv + kh;
      for (int64_t r = 0; r < 16; ++r) {  /* the block's queries, zero rows past the last */
        if (r < cur->rows) {
          cur->head[r] = kh * groups + (row0 + r) / lq;
          cur->pos[r] = (row0 + r) % lq;
          memcpy(qb + r * D, q + cur->bi * qs[0] + cur->head[r] * qs[1] + cur->pos[r] * qs[2], D * sizeof(uint16_t));
        } else {
          memset(qb + r * D, 0, D * sizeof(uint16_t));
        }
      }
      const uint16_t *kt = kp + cur->kvh * per;
      float *sc = cur->s;
      for (int r = 0; r < 16; ++r) _mm512_store_ps(cur->mx + r * 16, _mm512_set1_ps(-FLT_MAX));
      _tile_loadd(0, qb, 128);
      _tile_loadd(1, qb + 32, 128);
      for (int64_t j = 0; j < steps; ++j) {  /* two key blocks a step (lkp is a multiple of 32) */
        const int64_t kb = 2 * j;
        _tile_zero(4);
        _tile_zero(5);
        _tile_loadd(2, kt + (kb * 2 + 0) * 512, 64);
        _tile_loadd(3, kt + (kb * 2 + 2) * 512, 64);
        _tile_dpbf16ps(4, 0, 2);
        _tile_dpbf16ps(5, 0, 3);
        _tile_loadd(2, kt + (kb * 2 + 1) * 512, 64);
        _tile_loadd(3, kt + (kb * 2 + 3) * 512, 64);
        _tile_dpbf16ps(4, 1, 2);
        _tile_dpbf16ps(5, 1, 3);
        _tile_stored(4, sc + kb * 16, (lkp + S_PAD) * sizeof(float));
        _tile_stored(5, sc + kb * 16 + 16, (lkp + S_PAD) * sizeof(float));
        scores_seen(cur, sc, lkp + S_PAD, kb * 16, mask, lq, lk);
        if (prev) softmax_rows(prev, j * 8 / steps, (j + 1) * 8 / steps, lk, lkp, scale);
      }
      if (prev2) pv_block(prev2, vp + prev2->kvh * per, lkp, ob, out, os, prev, 8, 16, lk, scale);
      else if (prev) softmax_rows(prev, 8, 16, lk, lkp, scale);
      prev2 = prev;
      prev = cur;
    }
    if (prev2) pv_block(prev2, vp + prev2->kvh * per, lkp, ob, out, os, NULL, 0, 0, lk, scale);
    if (prev) {
      softmax_rows(prev, 0, 16, lk, lkp, scale);
      pv_block(prev, vp + prev->kvh * per, lkp, ob, out, os, NULL, 0, 0, lk, scale);
    }
    _tile_release();
    _mm_setcsr(csr);
    for (int i = 0; i < 3; ++i) {
      free(blk[i].s);
      free(blk[i].p);
    }
  }
}
