/* What the AMX kernels share (header only; each kernel library is built from one source file): the tile
 * configuration layout and the request for the tile state, which every AMX library exports as
 * edgefm_amx_init (native.amx_unavailable calls it before the first use). */
#ifndef EDGEFM_AMX_H
#define EDGEFM_AMX_H

#include <immintrin.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>
long syscall(long number, ...);  /* unistd.h declares it only under _GNU_SOURCE / _DEFAULT_SOURCE (-std=c11) */

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

/* Asks the kernel for the AMX tile state (once per process; 0 = granted). */
int edgefm_amx_init(void) { return (int)syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA); }

/* _tile_loadconfig's 64-byte operand (palette 1): bytes per row and rows of each of the 8 tiles. */
typedef struct {
  uint8_t palette_id, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} tile_config;

#endif
