/* The n-gram hash of a PLE table's n-gram index (docs/ngram-ple.md, "The hash"): which table row each hash head
 * reads at a position, from the ids that end there.
 *
 * Unsigned 32-bit arithmetic only, wrapping modulo 2^32: multiplies, shifts, XORs and one 32-bit modulo per head.
 * No 64-bit division and no floating point, so a core without either computes it as a host does (the bare-metal
 * builds count the compiler helpers a token calls: none). A row is an offset (the heads before it, which may pass
 * 2^32 in a layout of huge heads) plus that remainder: one 64-bit addition. Pinned, with the Python, NumPy and
 * torch forms, to the frozen vectors of docs/ngram-ple-vectors.json (tests/edge/test_ngram_hash.py). */
#include "ple.h"

#define GOLDEN 0x9E3779B9u /* 2^32 / golden ratio, odd */

uint32_t ple_fmix32(uint32_t h) {
    h ^= h >> 16;
    h *= 0x85EBCA6Bu;
    h ^= h >> 13;
    h *= 0xC2B2AE35u;
    return h ^ (h >> 16);
}

uint32_t ple_ngram_multiplier(uint32_t seed, uint32_t order, uint32_t head, uint32_t i) {
    uint32_t key = order << 16 | head << 8 | i;
    return ple_fmix32(seed + GOLDEN * (1u + key)) | 1u;
}

uint32_t ple_ngram_heads(const ple_ngram *g) { return g->n_orders * g->heads; }

uint32_t ple_ngram_max_order(const ple_ngram *g) { return g->orders[g->n_orders - 1]; }

void ple_ngram_multipliers(const ple_ngram *g, uint32_t *mult) {
    for (uint32_t o = 0; o < g->n_orders; o++)
        for (uint32_t k = 0; k < g->heads; k++, mult += PLE_NGRAM_MAX_ORDER)
            for (uint32_t i = 0; i < PLE_NGRAM_MAX_ORDER; i++)
                mult[i] = i < g->orders[o] ? ple_ngram_multiplier(g->seed, g->orders[o], k, i) : 0;
}

void ple_ngram_rows(const ple_ngram *g, const uint32_t *mult, const uint32_t *hist, uint64_t *rows) {
    uint64_t offset = 0;
    for (uint32_t o = 0; o < g->n_orders; o++)
        for (uint32_t k = 0; k < g->heads; k++, mult += PLE_NGRAM_MAX_ORDER) {
            uint32_t h = 0;
            for (uint32_t i = 0; i < g->orders[o]; i++) h ^= hist[i] * mult[i];
            *rows++ = offset + ple_fmix32(h) % g->rows[o];
            offset += g->rows[o];
        }
}
