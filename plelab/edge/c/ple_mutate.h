/* Seeded mutations of a valid .ple file, shared by the host fuzzer (plefuzz.c) and the bare-metal harness
 * (mcu/plemcu.c): bit flips, byte sets, truncations, and edits of the size / offset / count fields of the
 * header, section table and model description with every checksum recomputed, so the edit reaches the
 * description checks rather than stopping at a CRC; one kind edits only the description's head, its PLE layer list
 * and its n-gram index, where a random field of the whole description rarely lands. Header-only (static
 * functions): each program includes it. */
#ifndef PLE_MUTATE_H
#define PLE_MUTATE_H

#include <string.h>

#include "ple.h"

enum { PLE_MUT_BIT_FLIPS, PLE_MUT_BYTE_SETS, PLE_MUT_TRUNCATION, PLE_MUT_MODEL_FIELD, PLE_MUT_HEADER_FIELD,
       PLE_MUT_MODEL_BIT_FLIPS, PLE_MUT_HEAD_FIELD, PLE_MUT_KINDS };

static const char *const PLE_MUT_NAMES[PLE_MUT_KINDS] = {"bit_flips", "byte_sets", "truncations", "model_fields",
                                                         "header_fields", "model_bit_flips", "head_fields"};

typedef struct { uint64_t s; } ple_rng;

static inline void ple_rng_seed(ple_rng *r, uint64_t seed) { r->s = seed * 0x9E3779B97F4A7C15ull + 1; }

static inline uint64_t ple_rng_next(ple_rng *r) { /* xorshift64* */
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return r->s * 0x2545F4914F6CDD1Dull;
}

static inline void ple_mut_put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> 8 * i);
}
static inline uint32_t ple_mut_get32(const uint8_t *p) {
    return p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t ple_mut_get64(const uint8_t *p) {
    return ple_mut_get32(p) | (uint64_t)ple_mut_get32(p + 4) << 32;
}

/* Recompute the model section's sha256, the section-table crc and the header crc of a mutated file. */
static inline void ple_fix_checksums(uint8_t *f, size_t n) {
    if (n < 64) return;
    uint32_t ns = ple_mut_get32(f + 24);
    if (ns == 0 || ns > 16 || 64 + 64 * (size_t)ns > n) return;
    for (uint32_t i = 0; i < ns; i++) {
        uint8_t *e = f + 64 + 64 * i;
        uint64_t off = ple_mut_get64(e + 16), len = ple_mut_get64(e + 24);
        if (!memcmp(e, "model\0", 6) && off <= n && len <= n - off) ple_sha256(f + off, (size_t)len, e + 32);
    }
    ple_mut_put32(f + 28, ple_crc32(0, f + 64, 64 * (size_t)ns));
    ple_mut_put32(f + 60, ple_crc32(0, f, 60));
}

static const uint32_t PLE_MUT_INTERESTING[] = {0, 1, 2, 3, 7, 8, 15, 16, 63, 64, 127, 128, 255, 256, 4095, 4096,
                                               65535, 65536, 0x7fffffff, 0x80000000u, 0xfffffffeu, 0xffffffffu,
                                               1u << 24, 1u << 20};

/* Bytes of the model description's head (104), its PLE layer list and, with an n-gram index (version 3), its
 * n-gram block: the fields that say what the model is (docs/ple-format.md section 4b). */
static inline uint64_t ple_mut_head_bytes(const uint8_t *model, uint64_t len) {
    if (len < 104) return len;
    uint64_t n = 104 + (4 * (uint64_t)ple_mut_get32(model + 60) + 7) / 8 * 8;
    if (ple_mut_get32(model + 84) == 1 && n + 4 <= len) n += (16 + 8 * (uint64_t)ple_mut_get32(model + n) + 7) / 8 * 8;
    return n < len ? n : len;
}

/* Overwrite work with a mutation of the n-byte file orig (model description at model_off, model_len bytes);
 * returns the mutated length. *kind: which mutation; *verify: whether the case should verify checksums (the
 * field edits recompute them, so verifying would only re-check them; one other case in 8 verifies). */
static inline size_t ple_mutate(ple_rng *r, uint8_t *work, const uint8_t *orig, size_t n, uint64_t model_off,
                                uint64_t model_len, int *kind, int *verify) {
    size_t len = n;
    memcpy(work, orig, n);
    *kind = (int)(ple_rng_next(r) % PLE_MUT_KINDS);
    *verify = ple_rng_next(r) % 8 == 0; /* checksum paths are simple and slow: exercise them in one case in 8 */
    switch (*kind) {
    case PLE_MUT_BIT_FLIPS:
        for (int k = 1 + (int)(ple_rng_next(r) % 4); k > 0; k--)
            work[ple_rng_next(r) % n] ^= (uint8_t)(1u << ple_rng_next(r) % 8);
        break;
    case PLE_MUT_BYTE_SETS:
        for (int k = 1 + (int)(ple_rng_next(r) % 4); k > 0; k--)
            work[ple_rng_next(r) % n] = (uint8_t)PLE_MUT_INTERESTING[ple_rng_next(r) % 24];
        break;
    case PLE_MUT_TRUNCATION:
        len = (size_t)(ple_rng_next(r) % n);
        break;
    case PLE_MUT_MODEL_FIELD:
    case PLE_MUT_HEAD_FIELD:
    case PLE_MUT_HEADER_FIELD: {
        /* a u32 of the description (of its head part for HEAD_FIELD: the whole when it is shorter than 4 bytes),
         * or a size / offset field of the header or the section table */
        uint64_t span = *kind == PLE_MUT_HEAD_FIELD ? ple_mut_head_bytes(orig + model_off, model_len) : model_len;
        uint64_t off = *kind != PLE_MUT_HEADER_FIELD ? model_off + 4 * (ple_rng_next(r) % (span / 4 ? span / 4 : 1))
                                                     : (ple_rng_next(r) % 2 ? 16 + 8 * (ple_rng_next(r) % 2)
                                                                            : 64 + 64 * (ple_rng_next(r) % 4) + 16 +
                                                                                  8 * (ple_rng_next(r) % 2));
        if (off + 4 > n) break;
        uint32_t old = ple_mut_get32(work + off), v;
        switch (ple_rng_next(r) % 4) {
        case 0: v = PLE_MUT_INTERESTING[ple_rng_next(r) % 24]; break;
        case 1: v = old + 1 - 2 * (uint32_t)(ple_rng_next(r) % 2); break;
        case 2: v = old * 2; break;
        default: v = (uint32_t)ple_rng_next(r); break;
        }
        ple_mut_put32(work + off, v);
        ple_fix_checksums(work, len);
        *verify = 0;
        break;
    }
    default:
        for (int k = 1 + (int)(ple_rng_next(r) % 3); k > 0; k--)
            work[model_off + ple_rng_next(r) % model_len] ^= (uint8_t)(1u << ple_rng_next(r) % 8);
        ple_fix_checksums(work, len);
        *verify = 0;
        break;
    }
    return len;
}

/* What a fuzz case does with a file that opened: decode two positions, so a description that passed the
 * checks but lies about the data shows up as a fault, not only at open. */
static inline void ple_mut_exercise(ple_model *m) {
    const ple_desc *md = ple_model_desc(m);
    for (uint32_t pos = 0; pos < 2 && pos < md->max_seq; pos++) {
        const float *logits = ple_forward(m, pos % md->vocab, pos);
        volatile float sink = logits ? logits[md->vocab - 1] : 0;
        (void)sink;
    }
}

#endif
