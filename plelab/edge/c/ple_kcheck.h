/* Self-check of the integer kernels (ple_int_kernels.h) on the target itself: the kernel this build selected against a
 * plain scalar reference compiled into the same binary, on odd sizes. Run by plektest on the host and by the
 * bare-metal harness's `plemcu kernels` under QEMU (tests/edge/test_c_mcu_kernels.py). */
#ifndef PLE_KCHECK_H
#define PLE_KCHECK_H

#include <stdint.h>
#include <stdio.h>

typedef struct {
    uint32_t cases, mismatches;    /* dot products compared, and how many differed in any bit */
    uint32_t first_bad;            /* the first differing case (when mismatches > 0) */
    uint32_t digest;               /* FNV-1a of every result's bits and every activation code */
} ple_kcheck_result;

/* Working memory ple_kcheck needs (the caller's: a bare-metal board hands it a spare RAM region). */
#define PLE_KCHECK_MAXN 4400u /* longest vector: past PLE_KCHUNK, so a group is summed in two int32 runs */
/* the activation (floats), its kact memory (ple_kact_bytes), the codes, the scales (two bytes a group of one) */
#define PLE_KCHECK_BYTES (4u * PLE_KCHECK_MAXN + 6u * (PLE_KCHECK_MAXN + 16u) + 64u + (PLE_KCHECK_MAXN + 16u) + 2u * PLE_KCHECK_MAXN + 256u)

/* `cases` random dot products (seeded): int4 / int8 weights, group sizes and lengths that are no multiple of any
 * kernel's width, runs starting at odd offsets, groups longer than a kernel's int32 run, full code ranges. Each
 * case's inputs and both results go to `emit` as one JSON line when it is not NULL (the host test recomputes them
 * in NumPy). mem: PLE_KCHECK_BYTES, 16-byte aligned. */
void ple_kcheck(uint32_t seed, uint32_t cases, FILE *emit, void *mem, ple_kcheck_result *out);

#endif
