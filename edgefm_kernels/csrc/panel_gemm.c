/* fp32 GEMM for the few-row products of the action expert's decode: y = x W^T (+ bias).
 *
 * W [N, K] is packed once into 32-column panels, P [ceil(N/32)][K][32] (zero padded), so a panel is one
 * contiguous stream. Each thread takes a contiguous run of panels; for a panel it computes the rows of x
 * in blocks of at most MR rows, each block holding MR x 32 accumulators (2 zmm per row) in registers.
 * The panel is read from memory once (later row blocks find it in L2), and while it is used the *next*
 * panel is prefetched into L2, spread evenly over the row blocks: in decode the weights come from DRAM
 * (the prefill evicts them from cache), and MKL's packed sgemm leaves that latency exposed.
 * K is summed in blocks of KC (partial sums added into y) so the rounding error grows like a blocked
 * sum, comparable to MKL's, not a K-long serial chain.
 */
#include <immintrin.h>
#include <stdint.h>

#include "vec_math.h"

#define NR 32    /* panel width: two zmm registers */
#define MR 13    /* rows per register block: 26 accumulators + 2 weight vectors + 1 broadcast <= 32 zmm */
#define KC 256   /* K block of the summation */

static inline __attribute__((always_inline)) void row_block(
    int mr, const float *x, int64_t k, const float *panel, const float *bias, float *y, int64_t ldy,
    int ncols, const char *pf, int64_t pf_step) {
  __m512 acc[MR][2];
  const __mmask16 m0 = tail_mask(ncols), m1 = tail_mask(ncols > 16 ? ncols - 16 : 0);
  for (int64_t k0 = 0; k0 < k; k0 += KC) {
    const int64_t k1 = k0 + KC < k ? k0 + KC : k;
    const __m512 init0 = (k0 == 0 && bias) ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();
    const __m512 init1 = (k0 == 0 && bias) ? _mm512_loadu_ps(bias + 16) : _mm512_setzero_ps();
    for (int r = 0; r < mr; ++r) { acc[r][0] = init0; acc[r][1] = init1; }
    for (int64_t kk = k0; kk < k1; ++kk) {
      const __m512 w0 = _mm512_load_ps(panel + kk * NR), w1 = _mm512_load_ps(panel + kk * NR + 16);
      if (pf) _mm_prefetch(pf + kk * pf_step, _MM_HINT_T1);
      for (int r = 0; r < mr; ++r) {
        const __m512 a = _mm512_set1_ps(x[r * k + kk]);
        acc[r][0] = _mm512_fmadd_ps(a, w0, acc[r][0]);
        acc[r][1] = _mm512_fmadd_ps(a, w1, acc[r][1]);
      }
    }
    for (int r = 0; r < mr; ++r) {
      float *out = y + r * ldy;
      if (k0 > 0) {
        acc[r][0] = _mm512_add_ps(acc[r][0], _mm512_maskz_loadu_ps(m0, out));
        acc[r][1] = _mm512_add_ps(acc[r][1], _mm512_maskz_loadu_ps(m1, out + 16));
      }
      _mm512_mask_storeu_ps(out, m0, acc[r][0]);
      _mm512_mask_storeu_ps(out + 16, m1, acc[r][1]);
    }
  }
}

/* Columns padded to panels: the packed size in floats. */
int64_t edgefm_panel_size(int64_t n, int64_t k) { return (n + NR - 1) / NR * NR * k; }

/* W [N, K] row-major -> P [ceil(N/32)][K][32], zero padded; P must hold edgefm_panel_size(n, k) floats. */
void edgefm_panel_pack(const float *w, int64_t n, int64_t k, float *p) {
  const int64_t panels = (n + NR - 1) / NR;
  #pragma omp parallel for schedule(static)
  for (int64_t q = 0; q < panels; ++q)
    for (int64_t kk = 0; kk < k; ++kk)
      for (int j = 0; j < NR; ++j) {
        const int64_t col = q * NR + j;
        p[(q * k + kk) * NR + j] = col < n ? w[col * k + kk] : 0.0f;
      }
}

#define ROWS(R) case R: row_block(R, x + m0 * k, k, panel, bias, y + m0 * ldy, ldy, ncols, pf, pf_step); break;

/* Panel q of p for all m rows: y[:, 0:ncols] (row stride ldy) = x @ panel + bias[0:32] (bias may be NULL).
 * While it runs, the following panel (the next q, contiguous in p) is prefetched into L2. */
static void panel_product(const float *x, int64_t m, int64_t k, const float *p, int64_t q, int64_t panels,
                          const float *bias, float *y, int64_t ldy, int ncols) {
  const float *panel = p + q * k * NR;
  const int blocks = (int)((m + MR - 1) / MR);
  int64_t m0 = 0;
  for (int blk = 0; blk < blocks; ++blk) {
    const int left = blocks - blk;  /* rows split evenly over the blocks still to run */
    const int mr = (int)((m - m0 + left - 1) / left);
    const char *pf = 0;
    int64_t pf_step = 0;
    if (q + 1 < panels) {  /* this block's share of the next panel, one prefetch per k step */
      pf = (const char *)(panel + k * NR) + (int64_t)blk * k * NR * 4 / blocks;
      pf_step = NR * 4 / blocks;
    }
    switch (mr) { ROWS(1) ROWS(2) ROWS(3) ROWS(4) ROWS(5) ROWS(6) ROWS(7) ROWS(8) ROWS(9) ROWS(10) ROWS(11)
                  ROWS(12) ROWS(13) }
    m0 += mr;
  }
}

/* y [M, N] = x [M, K] @ W^T + bias. x, y row-major contiguous; p from edgefm_panel_pack (64-byte aligned);
 * bias [ceil(N/32)*32] (padded) or NULL; threads > 0. */
void edgefm_panel_gemm(const float *x, int64_t m, int64_t k, const float *p, int64_t n, const float *bias,
                       float *y, int threads) {
  const int64_t panels = (n + NR - 1) / NR;
  #pragma omp parallel for schedule(guided) num_threads(threads)
  for (int64_t q = 0; q < panels; ++q)
    panel_product(x, m, k, p, q, panels, bias ? bias + q * NR : 0, y + q * NR, n,
                  (int)(n - q * NR < NR ? n - q * NR : NR));
}

/* h [M, N] = silu(x W_gate^T) * (x W_up^T), the gated MLP's first half in one pass. p holds the gate and up
 * panels interleaved (gate panel j at 2j, up panel j at 2j+1, as edgefm_panel_pack makes them from each
 * weight); both panels of a pair run on one thread into tmp [M, 2*ceil(N/32)*32], and that thread forms
 * its 32 columns of h while they are still in its cache. */
void edgefm_panel_glu(const float *x, int64_t m, int64_t k, const float *p, int64_t n, float *tmp, float *h,
                      int threads) {
  const int64_t pairs = (n + NR - 1) / NR, panels = 2 * pairs, ldt = panels * NR;
  #pragma omp parallel for schedule(guided) num_threads(threads)
  for (int64_t j = 0; j < pairs; ++j) {
    const int ncols = (int)(n - j * NR < NR ? n - j * NR : NR);
    float *g = tmp + 2 * j * NR, *u = g + NR;
    panel_product(x, m, k, p, 2 * j, panels, 0, g, ldt, NR);
    panel_product(x, m, k, p, 2 * j + 1, panels, 0, u, ldt, NR);
    const __mmask16 m0 = tail_mask(ncols), m1 = tail_mask(ncols > 16 ? ncols - 16 : 0);
    for (int64_t r = 0; r < m; ++r)
      for (int v = 0; v < 2; ++v) {
        const __m512 gv = _mm512_loadu_ps(g + r * ldt + 16 * v), uv = _mm512_loadu_ps(u + r * ldt + 16 * v);
        const __m512 sig = _mm512_add_ps(_mm512_set1_ps(1.0f), exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), gv)));
        _mm512_mask_storeu_ps(h + r * n + j * NR + 16 * v, v ? m1 : m0, _mm512_mul_ps(_mm512_div_ps(gv, sig), uv));
      }
  }
}
