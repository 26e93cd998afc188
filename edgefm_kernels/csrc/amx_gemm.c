/* GEMM on Intel AMX with its epilogue fused, bf16 or int8 weights (fast mode):
 *   y [M, N] = x [M, K] W^T (+ b)                     (post 0)
 *   y [M, I] = silu(x G^T) * (x U^T)                  (post 1, W = gate and up)
 *   y [M, N] = gelu_tanh(x W^T + b)                   (post 2)
 * each optionally + a residual [M, N or I], added last with one rounding.
 * The weight is packed once (Python side, amx_gemm.py) into the order this kernel reads it: for each block
 * of output columns, its two 16-column tiles, each a contiguous run of 1 KB B tiles over the K steps (32 bf16
 * or 64 int8 values wide, in the VNNI layout: 2 or 4 consecutive K values per 32-bit lane). A block is 32
 * output columns (post 0, 2) or 16 gate and the matching 16 up columns (post 1), so the GLU's two halves meet
 * in one pair of accumulators. With int8 weights (symmetric, per output channel) the rows of x are quantised
 * per row and call (symmetric); int32 sums, both scales applied in the epilogue.
 * x is packed once per call into 1 KB A tiles [row block][K step] (contiguous: rows of x a power-of-two-ish
 * stride apart would share L1 sets). The threads share out (column range, row group) units as they go.
 * - Few rows (decode: M = 50, <= 64): one pass over the weight, which comes from DRAM at every Euler step;
 *   each B tile is loaded once and multiplied by every 16-row block of x (a short last block gets a short
 *   tile: M = 50 costs 50 rows of tile work), the next tiles prefetched.
 * - Many rows (the prefill): 48 rows a pass, each A tile in its own register and two B tiles in turn, so no
 *   tile load waits on the product before it; the outputs (5-19 MB) are written with streaming stores.
 * A block's epilogue (vector work) runs a few rows at a time between the next block's K steps (tile work).
 * On this host one int8 or bf16 tile product takes 5.3 ns; with its A tile from L1 6.4 ns, from L2 8-11 ns.
 */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "amx.h"
#include "vec_math.h"

#define TILE_BYTES 1024 /* one 16 x 64-byte tile */

/* Rows of x a pass takes: the decode's (m <= 64) all at once, the weight streamed once; the prefill 48, each
 * A tile in its own register. */
static inline int64_t group_rows(int64_t m) { return m <= 64 ? 64 : 48; }
#ifndef PREFETCH_L2
#define PREFETCH_L2 16
#endif
#ifndef PREFETCH_L1
#define PREFETCH_L1 4
#endif

/* Accumulator row (16 lanes) -> fp32: the tiles' fp32 sums (bf16), or int32 sums times the row's scale and
 * the columns' (int8: sx the row's activation scale, sw the tile's 16 weight scales). */
static inline __m512 acc_ps(const float *a, const float *sw, float sx) {
  if (!sw) return _mm512_loadu_ps(a);
  return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_loadu_si512(a)), _mm512_mul_ps(_mm512_loadu_ps(sw), _mm512_set1_ps(sx)));
}

/* One block's accumulators acc[t][row][16] (t: the block's two 16-column tiles), rows [ra, rb) of the group
 * starting at r0 -> y.
 * sw: the packed weight scales [nblocks][2][16] (int8) or NULL (bf16); sx: the rows' scales (int8).
 * stream: whole 64-byte lines go past the caches (the prefill's outputs, 5-19 MB: without a read for
 * ownership first, fc1's output costs half the time to write). */
static void epilogue(const float *acc, int64_t ra, int64_t rb, int64_t r0, int64_t nb, int post, const float *bias,
                     const float *sw, const float *sx, const uint16_t *res, int64_t n_out, uint16_t *y, int stream) {
  const float *sw0 = sw ? sw + nb * 32 : NULL, *sw1 = sw ? sw + nb * 32 + 16 : NULL;
  for (int64_t r = ra; r < rb; ++r) {
    const float *a0 = acc + r * 16, *a1 = acc + 64 * 16 + r * 16;
    const float rs = sx ? sx[r0 + r] : 1.0f;
    uint16_t *yr = y + (r0 + r) * n_out;
    const uint16_t *rr = res ? res + (r0 + r) * n_out : NULL;
    if (post == 1) {
      const int64_t c = nb * 16;
      const __mmask16 m = tail_mask(n_out - c);
      const __m512 g = acc_ps(a0, sw0, rs), u = acc_ps(a1, sw1, rs);
      const __m512 e = exp2_fast_ps(_mm512_mul_ps(_mm512_set1_ps(-1.4426950408889634f), g));
      __m512 o = _mm512_mul_ps(_mm512_mul_ps(g, _mm512_rcp14_ps(_mm512_add_ps(_mm512_set1_ps(1.0f), e))), u);
      if (rr) o = _mm512_add_ps(o, load_bf16(rr + c, m));
      store_bf16(yr + c, m, o);
      continue;
    }
    __m512 v[2];
    int valid = 0;
    for (int t = 0; t < 2; ++t) {
      const int64_t c = nb * 32 + t * 16;
      if (c >= n_out) break;
      const __mmask16 m = tail_mask(n_out - c);
      v[t] = acc_ps(t ? a1 : a0, t ? sw1 : sw0, rs);
      if (bias) v[t] = _mm512_add_ps(v[t], _mm512_maskz_loadu_ps(m, bias + c));
      if (post == 2) { /* x / (1 + 2^(-k x (1 + 0.044715 x^2))), k = 2 sqrt(2/pi) log2(e); 1/y to 2^-14 (bf16 out) */
        const __m512 q = _mm512_fmadd_ps(_mm512_mul_ps(v[t], v[t]), _mm512_set1_ps(-2.302208198144325f * 0.044715f),
                                         _mm512_set1_ps(-2.302208198144325f));
        const __m512 e = exp2_fast_ps(_mm512_mul_ps(q, v[t]));
        v[t] = _mm512_mul_ps(v[t], _mm512_rcp14_ps(_mm512_add_ps(_mm512_set1_ps(1.0f), e)));
      }
      if (rr) v[t] = _mm512_add_ps(v[t], load_bf16(rr + c, m));
      valid = t + 1;
    }
    uint16_t *o = yr + nb * 32;
    if (stream && valid == 2 && nb * 32 + 32 <= n_out && ((uintptr_t)o & 63) == 0) {
      _mm512_stream_si512((void *)o, (__m512i)_mm512_cvtne2ps_pbh(v[1], v[0])); /* a whole line, no read for ownership */
      continue;
    }
    for (int t = 0; t < valid; ++t) store_bf16(o + t * 16, tail_mask(n_out - nb * 32 - t * 16), v[t]);
  }
}

/* Tiles for one group of up to four 16-row blocks of x: A operands in tiles 0, 1 and 3 (3: a short last
 * block), the B operand in tile 2, accumulators in 4 + j for row block j, each as tall as its rows; groups of
 * three blocks (48 rows) get tile 7 as a second B operand instead. */
static void configure_group(int64_t rows, int64_t group) {
  tile_config c;
  memset(&c, 0, sizeof c);
  c.palette_id = 1;
  const int64_t tail = rows % 16;
  for (int t = 0; t < 4; ++t) {
    c.colsb[t] = 64;
    c.rows[t] = 16;
  }
  if (tail) c.rows[3] = (uint8_t)tail;
  for (int j = 0; j < 4; ++j) {
    const int64_t r = rows - 16 * j;
    if (r <= 0) continue;
    c.colsb[4 + j] = 64;
    c.rows[4 + j] = (uint8_t)(r >= 16 ? 16 : r);
  }
  if (group == 48) {
    c.colsb[7] = 64;
    c.rows[7] = 16;
  }
  _tile_loadconfig(&c);
}

/* The A tile of row block j in a group of `rows` rows: 3 for a short last block, else 0 and 1 in turn; in
 * groups of three blocks (GROUP 48) the third is 3 as well, so no tile is loaded again within a K step (a
 * load into a tile waits until the product before it has read the tile). */
#define A_TILE(j, rows) ((16 * ((j) + 1) > (rows) || (group == 48 && (j) == 2)) ? 3 : ((j) & 1))

/* One K step of row block J into accumulator C (= 4 + J) with the B operand in tile BT (the intrinsics take
 * literal tile numbers). */
#define TILE_RUN_B(J, C, BT)                                                                 \
  if (blocks > J) {                                                                          \
    const char *arow = xa + ((r0 / 16 + J) * ksteps + s) * TILE_BYTES;                       \
    if (A_TILE(J, rows) == 3) _tile_loadd(3, arow, 64);                                       \
    else if (A_TILE(J, rows) == 1) _tile_loadd(1, arow, 64);                                  \
    else _tile_loadd(0, arow, 64);                                                            \
    if (A_TILE(J, rows) == 3) { if (s8) _tile_dpbssd(C, 3, BT); else _tile_dpbf16ps(C, 3, BT); }        \
    else if (A_TILE(J, rows) == 1) { if (s8) _tile_dpbssd(C, 1, BT); else _tile_dpbf16ps(C, 1, BT); }   \
    else { if (s8) _tile_dpbssd(C, 0, BT); else _tile_dpbf16ps(C, 0, BT); }                              \
  }
#define TILE_RUN(J, C) TILE_RUN_B(J, C, 2)

/* x rows -> the A buffer in tiles: [ceil16(m) / 16 row blocks][kp / step K steps][16 rows][64 bytes], zero past m
 * and k, so that each A tile is one contiguous kilobyte (rows of x a power-of-two-ish stride apart share L1
 * sets). bf16 copied, or (s8) int8 with one symmetric scale per row, q = round_half_even(x / scale),
 * scale = max |x| / 127 (1 for a zero row, NaN for a row holding a NaN or an infinity, so that its outputs are
 * NaN). Returns the buffer (64-byte aligned, free() it) or NULL. */
static char *pack_rows(const uint16_t *x, int64_t m, int64_t k, int64_t sx, int64_t kp, int s8, float *scales,
                       int threads) {
  const int64_t mp = (m + 15) / 16 * 16, step = s8 ? 64 : 32, ksteps = kp / step;
  char *xa = aligned_alloc(64, (size_t)(mp / 16 * ksteps * TILE_BYTES));
  if (!xa) return NULL;
  #pragma omp parallel for schedule(dynamic, 32) num_threads(threads) if (m * k >= (1 << 16))
  for (int64_t r = 0; r < mp; ++r) {
    char *row = xa + (r / 16) * ksteps * TILE_BYTES + (r % 16) * 64; /* its 64 bytes of K step s: + s KB */
    const uint16_t *xr = x + r * sx;
    int bad = 0;
    float scale = 1.0f;
    if (r < m && s8) {
      __m512 amax = _mm512_setzero_ps();
      for (int64_t j = 0; j < k; j += 16) {
        const __mmask16 mk = tail_mask(k - j);
        const __m512 v = load_bf16(xr + j, mk);
        bad |= _mm512_mask_fpclass_ps_mask(mk, v, 0x01 | 0x08 | 0x10 | 0x80) != 0;
        amax = _mm512_max_ps(amax, _mm512_abs_ps(v));
      }
      const float mx = _mm512_reduce_max_ps(amax);
      scale = bad ? NAN : mx > 0.0f ? mx / 127.0f : 1.0f;
      scales[r] = scale;
    }
    if (r >= m || bad) {
      for (int64_t st = 0; st < ksteps; ++st) memset(row + st * TILE_BYTES, 0, 64);
      continue;
    }
    if (!s8) {
      for (int64_t st = 0; st < ksteps; ++st) {
        const int64_t j = st * 32, left = k - j;
        const __mmask32 mk = left >= 32 ? 0xFFFFFFFFu : left <= 0 ? 0u : (__mmask32)((1u << left) - 1);
        _mm512_store_si512(row + st * TILE_BYTES, _mm512_maskz_loadu_epi16(mk, xr + j));
      }
      continue;
    }
    const __m512 inv = _mm512_set1_ps(1.0f / scale);
    for (int64_t st = 0; st < ksteps; ++st)
      for (int c = 0; c < 4; ++c) {
        const int64_t j = st * 64 + c * 16;
        const __mmask16 mk = j < k ? tail_mask(k - j) : 0;
        const __m512 v = load_bf16(xr + j, mk);
        _mm_store_si128((__m128i *)(row + st * TILE_BYTES + c * 16), _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v, inv))));
      }
  }
  return xa;
}

/* One GEMM: the weight wp packed [nblocks][2][kp / KSTEP][TILE bytes], bf16 (KSTEP 32) or, with sw, int8
 * (KSTEP 64) whose column scales are sw [nblocks][2][16]; bias [n_out] fp32 or NULL; post (0 none, 1 SiLU-GLU,
 * 2 GELU-tanh); res [m, n_out] bf16 contiguous or NULL, added last (a residual: one rounding for both); x as
 * its A tiles xa (pack_rows) and row scales (int8); y [m, n_out] bf16 contiguous. */
typedef struct {
  const void *wp;
  const float *sw;
  int64_t nblocks, kp;
  const float *bias;
  int post;
  const uint16_t *res;
  int64_t m, n_out;
  const char *xa;
  const float *scales;
  uint16_t *y;
} gemm_t;

/* Row group [r0, r0 + 64 or 48) of x times column blocks [lo, hi) of the weight (inside a parallel region). */
static void gemm_group(const gemm_t *g, int64_t r0, int64_t lo, int64_t hi) {
  const int s8 = g->sw != NULL, post = g->post;
  const int64_t m = g->m, ksteps = g->kp / (s8 ? 64 : 32), n_out = g->n_out;
  const int stream_w = m <= 64;
  const char *xa = g->xa;
  const float *bias = g->bias, *sw = g->sw, *scales = g->scales;
  const uint16_t *res = g->res;
  uint16_t *y = g->y;
  /* [block parity][tile][row of the group][16], fp32 or int32 sums: a block's epilogue (vector work) runs
   * a few rows at a time between the next block's K steps (tile work), so the two units overlap */
  float acc[2][2 * 64 * 16] __attribute__((aligned(64)));
  const int64_t group = group_rows(m);
  const int64_t rows = (m - r0) < group ? (m - r0) : group, blocks = (rows + 15) / 16;
  configure_group(rows, group);
  int64_t pend = -1, done = 0, step = 0; /* the block whose epilogue is under way, its rows done */
  const int64_t total = 2 * ksteps;
#define EPILOGUE_SLICE()                                                                          \
  if (pend >= 0) {                                                                                \
    const int64_t to = ++step * rows / total;                                                     \
    if (to > done) {                                                                              \
      epilogue(acc[pend & 1], done, to, r0, pend, post, bias, sw, scales, res, n_out, y, m > 64); \
      done = to;                                                                                  \
    }                                                                                             \
  }
  for (int64_t nb = lo; nb < hi; ++nb) {
    step = 0;
    for (int t = 0; t < 2; ++t) {
      if (post != 1 && nb * 32 + t * 16 >= n_out) break;
      const char *wt = (const char *)g->wp + (nb * 2 + t) * ksteps * TILE_BYTES;
      _tile_zero(4);
      if (blocks > 1) _tile_zero(5);
      if (blocks > 2) _tile_zero(6);
      if (blocks > 3 && group == 64) _tile_zero(7);
      int64_t s = 0;
      if (group == 48) /* two B tiles in turn: the next step's load need not wait for this step's products */
        for (; s + 1 < ksteps; s += 2) {
          _tile_loadd(2, wt + s * TILE_BYTES, 64);
          TILE_RUN_B(0, 4, 2)
          TILE_RUN_B(1, 5, 2)
          TILE_RUN_B(2, 6, 2)
          EPILOGUE_SLICE()
          ++s;
          _tile_loadd(7, wt + s * TILE_BYTES, 64);
          TILE_RUN_B(0, 4, 7)
          TILE_RUN_B(1, 5, 7)
          TILE_RUN_B(2, 6, 7)
          EPILOGUE_SLICE()
          --s;
        }
      for (; s < ksteps; ++s) {
        const char *b = wt + s * TILE_BYTES;
        if (stream_w) /* decode: the weight comes from memory once; the prefill's stays in L2 */
          for (int l = 0; l < TILE_BYTES; l += 64) {
            _mm_prefetch(b + PREFETCH_L2 * TILE_BYTES + l, _MM_HINT_T1);
            _mm_prefetch(b + PREFETCH_L1 * TILE_BYTES + l, _MM_HINT_T0);
          }
        _tile_loadd(2, b, 64);
        TILE_RUN(0, 4)
        TILE_RUN(1, 5)
        TILE_RUN(2, 6)
        TILE_RUN(3, 7)
        EPILOGUE_SLICE()
      }
      float *a = acc[nb & 1] + t * 64 * 16;
      _tile_stored(4, a, 64);
      if (blocks > 1) _tile_stored(5, a + 16 * 16, 64);
      if (blocks > 2) _tile_stored(6, a + 32 * 16, 64);
      if (blocks > 3) _tile_stored(7, a + 48 * 16, 64);
    }
    if (pend >= 0 && done < rows) epilogue(acc[pend & 1], done, rows, r0, pend, post, bias, sw, scales, res, n_out, y, m > 64);
    pend = nb;
    done = 0;
  }
#undef EPILOGUE_SLICE
  if (pend >= 0) epilogue(acc[pend & 1], 0, rows, r0, pend, post, bias, sw, scales, res, n_out, y, m > 64);
}

/* Work sharing that survives a preempted thread: on a robot other processes take a core now and then, and
 * with the columns split in halves up front the other thread waited at the end of every GEMM (a quarter of
 * a core of background load made a chunk 30-45% slower). The columns are cut into ranges, each with a
 * counter of its next row group; a thread takes the row groups of its own ranges first (the prefill keeps
 * its half of the weight in L2), then what is left of the others'. */
#define MAX_RANGES 256

/* One range per thread for the prefill; for the decode (one row group: its ranges are the only work to
 * share) up to eight per thread, each of at least 8 column blocks (each range starts its weight stream cold:
 * the expert's down projection, 23 blocks, took 60 us in 2 ranges and 64 in 16). At most one per column
 * block and MAX_RANGES. */
static int64_t ranges_for(int64_t m, int64_t nblocks, int threads) {
  int64_t r = threads;
  if (m <= 64) {
    const int64_t by_size = nblocks / 8, most = 8 * (int64_t)threads;
    r = by_size > most ? most : by_size > r ? by_size : r;
  }
  r = r < nblocks ? r : nblocks;
  return r < 1 ? 1 : r > MAX_RANGES ? MAX_RANGES : r;
}

/* x [m, k] bf16 (row stride sx elements) times one GEMM's weight (gemm_t's fields, in order) -> y [m, n_out]
 * bf16 contiguous. Returns 0, or -1 when the row buffer cannot be allocated. */
int edgefm_amx_gemm(const uint16_t *x, int64_t m, int64_t k, int64_t sx, const void *wp, const float *sw,
                    int64_t nblocks, int64_t kp, const float *bias, int post, const uint16_t *res, int64_t n_out,
                    uint16_t *y, int threads) {
  const int s8 = sw != NULL;
  float *scales = s8 ? malloc((size_t)(m > 0 ? m : 1) * sizeof(float)) : NULL;
  char *xa = (s8 && !scales) ? NULL : pack_rows(x, m, k, sx, kp, s8, scales, threads);
  if (!xa) {
    free(scales);
    return -1;
  }
  const gemm_t g = {wp, sw, nblocks, kp, bias, post, res, m, n_out, xa, scales, y};
  const int64_t ranges = ranges_for(m, nblocks, threads), group = group_rows(m),
                groups = (m + group - 1) / group;
  int64_t next[MAX_RANGES] = {0}; /* the next row group of each column range (atomic adds) */
  #pragma omp parallel num_threads(threads)
  {
    const int64_t nth = omp_get_num_threads(), first = ranges * omp_get_thread_num() / nth;
    for (int64_t i = 0; i < ranges; ++i) {
      const int64_t u = (first + i) % ranges, lo = nblocks * u / ranges, hi = nblocks * (u + 1) / ranges;
      for (int64_t gi; lo < hi && (gi = __atomic_fetch_add(&next[u], 1, __ATOMIC_RELAXED)) < groups;)
        gemm_group(&g, gi * group, lo, hi);
    }
    _mm_sfence(); /* the streamed lines visible before the caller reads y */
    _tile_release();
  }
  free(xa);
  free(scales);
  return 0;
}
