/* plefuzz: in-process mutation fuzzer for the .ple parser (build with -fsanitize=address,undefined).
 *
 *   plefuzz VALID.ple [--cases N] [--seed S]      -> one JSON line of counts on stdout
 *
 * Each case mutates a copy of a valid file (seeded bit flips, byte sets, truncations, and edits of the size,
 * offset and count fields with every checksum recomputed, so the edit reaches the model-description checks
 * rather than stopping at a CRC), opens it from memory, and when it is accepted runs two decode steps. A
 * rejection must be a non-empty one-line message; a crash, hang or sanitizer report ends the process.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ple.h"

static uint64_t rs;
static uint64_t rnd(void) {
    rs ^= rs >> 12;
    rs ^= rs << 25;
    rs ^= rs >> 27;
    return rs * 0x2545F4914F6CDD1Dull;
}

static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> 8 * i);
}
static uint32_t get32(const uint8_t *p) { return p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static uint64_t get64(const uint8_t *p) { return get32(p) | (uint64_t)get32(p + 4) << 32; }

/* Recompute the model section's sha256, the section-table crc and the header crc of a mutated file. */
static void fix_checksums(uint8_t *f, size_t n) {
    if (n < 64) return;
    uint32_t ns = get32(f + 24);
    if (ns == 0 || ns > 16 || 64 + 64 * (size_t)ns > n) return;
    for (uint32_t i = 0; i < ns; i++) {
        uint8_t *e = f + 64 + 64 * i;
        uint64_t off = get64(e + 16), len = get64(e + 24);
        if (!memcmp(e, "model\0", 6) && off <= n && len <= n - off) ple_sha256(f + off, (size_t)len, e + 32);
    }
    put32(f + 28, ple_crc32(0, f + 64, 64 * (size_t)ns));
    put32(f + 60, ple_crc32(0, f, 60));
}

static const uint32_t INTERESTING[] = {0, 1, 2, 3, 7, 8, 15, 16, 63, 64, 127, 128, 255, 256, 4095, 4096, 65535,
                                       65536, 0x7fffffff, 0x80000000u, 0xfffffffeu, 0xffffffffu, 1u << 24, 1u << 20};

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "plefuzz: usage: plefuzz VALID.ple [--cases N] [--seed S]\n");
        return 2;
    }
    long cases = 10000;
    unsigned long long seed = 1;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--cases")) cases = strtol(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--seed")) seed = strtoull(argv[i + 1], NULL, 10);
    }
    FILE *fp = fopen(argv[1], "rb");
    if (!fp) {
        fprintf(stderr, "plefuzz: cannot open %s\n", argv[1]);
        return 2;
    }
    fseek(fp, 0, SEEK_END);
    size_t n = (size_t)ftell(fp);
    fseek(fp, 0, SEEK_SET);
    uint8_t *orig = malloc(n), *work = malloc(n + 64);
    if (!orig || !work || fread(orig, 1, n, fp) != n) {
        fprintf(stderr, "plefuzz: cannot read %s\n", argv[1]);
        return 2;
    }
    fclose(fp);
    char err[PLE_ERR];
    ple_storage st;
    ple_desc d;
    ple_storage_mem(&st, orig, n);
    if (ple_read_desc(&st, &d, err)) {
        fprintf(stderr, "plefuzz: the seed file is not valid: %s\n", err);
        return 2;
    }
    const ple_section *ms = ple_find_section(&d, "model");
    uint64_t model_off = ms->offset, model_len = ms->nbytes;
    ple_desc_free(&d);

    rs = seed * 0x9E3779B97F4A7C15ull + 1;
    long accepted = 0, rejected = 0, bad_messages = 0, by_kind[6] = {0};
    clock_t t0 = clock();
    for (long c = 0; c < cases; c++) {
        size_t len = n;
        memcpy(work, orig, n);
        int kind = (int)(rnd() % 6);
        by_kind[kind]++;
        int verify = rnd() % 8 == 0; /* checksum paths are simple and slow: exercise them in one case in 8 */
        switch (kind) {
        case 0: /* bit flips anywhere */
            for (int k = 1 + (int)(rnd() % 4); k > 0; k--) work[rnd() % n] ^= (uint8_t)(1u << rnd() % 8);
            break;
        case 1: /* byte sets anywhere */
            for (int k = 1 + (int)(rnd() % 4); k > 0; k--) work[rnd() % n] = (uint8_t)INTERESTING[rnd() % 24];
            break;
        case 2: /* truncation */
            len = (size_t)(rnd() % n);
            break;
        case 3: /* a 4-byte field of the model description, checksums fixed */
        case 4: { /* a header / section-table field, checksums fixed */
            uint64_t off = kind == 3 ? model_off + 4 * (rnd() % (model_len / 4))
                                     : (rnd() % 2 ? 16 + 8 * (rnd() % 2) : 64 + 64 * (rnd() % 4) + 16 + 8 * (rnd() % 2));
            if (off + 4 > n) break;
            uint32_t old = get32(work + off), v;
            switch (rnd() % 4) {
            case 0: v = INTERESTING[rnd() % 24]; break;
            case 1: v = old + 1 - 2 * (uint32_t)(rnd() % 2); break;
            case 2: v = old * 2; break;
            default: v = (uint32_t)rnd(); break;
            }
            put32(work + off, v);
            fix_checksums(work, len);
            verify = 0;
            break;
        }
        default: /* a few bit flips in the model description, checksums fixed */
            for (int k = 1 + (int)(rnd() % 3); k > 0; k--)
                work[model_off + rnd() % model_len] ^= (uint8_t)(1u << rnd() % 8);
            fix_checksums(work, len);
            verify = 0;
            break;
        }
        ple_storage_mem(&st, work, len);
        ple_options opt = {.verify = verify, .map_weights = (int)(rnd() % 2), .max_arena = 64u << 20,
                           .int8_act = (int)(rnd() % 2)};
        ple_model *m;
        err[0] = 0;
        if (ple_open(&m, &st, &opt, err)) {
            rejected++;
            if (!err[0] || strchr(err, '\n')) bad_messages++;
            continue;
        }
        accepted++;
        const ple_desc *md = ple_model_desc(m);
        for (uint32_t pos = 0; pos < 2 && pos < md->max_seq; pos++) {
            const float *logits = ple_forward(m, pos % md->vocab, pos);
            volatile float sink = logits ? logits[md->vocab - 1] : 0;
            (void)sink;
        }
        ple_close(m);
    }
    double secs = (double)(clock() - t0) / CLOCKS_PER_SEC;
    printf("{\"cases\": %ld, \"accepted\": %ld, \"rejected\": %ld, \"bad_messages\": %ld, \"crashes\": 0, "
           "\"seconds\": %.3f, \"by_kind\": {\"bit_flips\": %ld, \"byte_sets\": %ld, \"truncations\": %ld, "
           "\"model_fields\": %ld, \"header_fields\": %ld, \"model_bit_flips\": %ld}}\n",
           cases, accepted, rejected, bad_messages, secs, by_kind[0], by_kind[1], by_kind[2], by_kind[3], by_kind[4],
           by_kind[5]);
    free(orig);
    free(work);
    return bad_messages ? 1 : 0;
}
