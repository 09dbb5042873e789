/* ple_kcheck (ple_kcheck.h): the built kernel against a scalar reference in the same binary, bit for bit. The
 * reference sums each group segment's integer products one by one and applies the scales in the driver's order,
 * so any kernel whose integer sums are right gives exactly its float results. */
#include "ple_kcheck.h"

#include <string.h>

#include "ple_int_kernels.h"

static uint32_t rng(uint32_t *s) { /* xorshift32 */
    *s ^= *s << 13;
    *s ^= *s >> 17;
    *s ^= *s << 5;
    return *s;
}

static float uniform(uint32_t *s) { return (float)(rng(s) >> 8) * (1.0f / 16777216.0f) * 2.0f - 1.0f; }

static int code_at(int dtype, const uint8_t *c, uint64_t e) {
    if (dtype == PLE_INT8) return (int8_t)c[e];
    return (((e & 1) ? c[e / 2] >> 4 : c[e / 2] & 15) ^ 8) - 8;
}

static float reference(int dtype, const uint8_t *codes, const uint8_t *scales, uint32_t group, uint64_t e0,
                       uint32_t n, const ple_kact *a) {
    float sum = 0;
    for (uint64_t s = e0, end = e0 + n; s < end;) {
        uint64_t g = s / group, b = (g + 1) * group < end ? (g + 1) * group : end;
        int64_t isum = 0;
        for (uint64_t e = s; e < b; e++) isum += (int64_t)code_at(dtype, codes, e) * a->q[e - e0];
        float fs = (float)isum;
        sum += fs * ple_f16(scales + 2 * g);
        s = b;
    }
    return sum * a->scale;
}

static uint32_t fnv(uint32_t h, const void *p, size_t n) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 16777619u;
    return h;
}

static void hex(FILE *f, const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++) fprintf(f, "%02x", p[i]);
}

/* Count a result that differs from the reference in any bit (and remember the first such case). */
static void check(ple_kcheck_result *out, uint32_t c, float got, float want) {
    if (!memcmp(&got, &want, sizeof got)) return;
    if (!out->mismatches) out->first_bad = c;
    out->mismatches++;
}

#define UP16(n) (((size_t)(n) + 15) / 16 * 16)

/* The fp16 value of bits h, from its definition: sign, (1024 + mantissa) * 2^(exponent - 25), subnormals m * 2^-24. */
static float f16_reference(uint32_t h) {
    uint32_t e = (h >> 10) & 31, m = h & 0x3ffu, inf = 0x7f800000u, p2 = (e + 102u) << 23; /* p2: 2^(e - 25) */
    float v, f;
    if (e == 31) {
        memcpy(&f, &inf, 4);
        v = m ? f - f : f; /* NaN when the mantissa is not zero */
    } else {
        memcpy(&f, &p2, 4);
        v = e ? (float)(1024 + m) * f : (float)m * (1.0f / 16777216.0f);
    }
    return h & 0x8000u ? -v : v;
}

/* Every fp16 bit pattern through ple_f16 (each build's own conversion) against the definition: the same bits, or
 * both NaN (a conversion may quiet a signalling NaN). */
static void check_f16(ple_kcheck_result *out, uint32_t c) {
    for (uint32_t h = 0; h < 65536; h++) {
        uint8_t p[2] = {(uint8_t)h, (uint8_t)(h >> 8)};
        float got = ple_f16(p), want = f16_reference(h);
        if (got != got && want != want) continue;
        check(out, c, got, want);
    }
}

/* ple_argmax (each build's own: a block-maximum pass on RISC-V F, lanes on Helium, integer compares on soft float)
 * against the plain scan it must equal: the first index of the largest value, a NaN never larger, v[0] NaN giving 0.
 * Values from a set of eight so that ties are common, with -0 and +0, NaNs, and lengths around the 16-value blocks;
 * v (PLE_KCHECK_MAXN floats) is scratch. */
static void check_argmax(ple_kcheck_result *out, uint32_t c, uint32_t *s, float *v) {
    static const float pool[8] = {-3.0f, -1.0f, -0.0f, 0.0f, 0.5f, 2.0f, 2.5f, 1e30f};
    uint32_t nan_bits = 0x7fc00000u;
    float nan;
    memcpy(&nan, &nan_bits, 4);
    for (uint32_t k = 0; k < 400; k++) {
        uint32_t n = 1 + (k < 100 ? k : rng(s) % (k < 300 ? 70 : 600)), top = 2 + k % 7; /* values from pool[0..top) */
        for (uint32_t i = 0; i < n; i++) v[i] = pool[rng(s) % top];
        if (k % 3 == 0) v[rng(s) % n] = nan;
        if (k % 17 == 0) v[0] = nan;
        uint32_t want = 0;
        if (v[0] == v[0])
            for (uint32_t i = 1; i < n; i++)
                if (v[i] > v[want]) want = i;
        uint32_t got = ple_argmax(v, n);
        if (got != want && !out->mismatches++) out->first_bad = c;
        out->digest = fnv(out->digest, &got, 4);
    }
    out->cases += 400;
}

void ple_kcheck(uint32_t seed, uint32_t cases, FILE *emit, void *mem, ple_kcheck_result *out) {
    static const uint32_t groups[] = {1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 48, 64, 96, 100, 127, 128, 200};
    const uint32_t maxn = PLE_KCHECK_MAXN;
    uint8_t *base = mem;
    float *x = (float *)mem;
    void *kmem = base + UP16(4 * maxn);
    uint8_t *codes = base + UP16(4 * maxn) + UP16(ple_kact_bytes(maxn));
    uint8_t *scales = codes + UP16(maxn);
    ple_kact a;
    ple_kact_init(&a, kmem, maxn);
    uint32_t s = seed * 2654435761u + 1u;
    memset(out, 0, sizeof *out);
    out->digest = 2166136261u;
    check_f16(out, cases);
    check_argmax(out, cases, &s, x);
    for (int32_t v = -(1 << 17); v <= 1 << 17; v++) check(out, cases, PLE_I2F(v), (float)v); /* the model's (float)v */
    for (uint32_t c = 0; c < cases; c++) {
        int dtype = rng(&s) & 1 ? PLE_INT4 : PLE_INT8;
        uint32_t group, n, e0;
        if (c % 16 == 15) { /* one group longer than a kernel's int32 run (PLE_KCHUNK values) */
            group = maxn;
            n = PLE_KCHUNK + 1 + rng(&s) % (maxn - PLE_KCHUNK - 64);
        } else if (c % 16 == 7) { /* rows and groups of whole 32-value chunks (kernels that take rows four at a time) */
            group = 32 * (1 + rng(&s) % 4);
            n = 32 * (1 + rng(&s) % 8);
        } else {
            group = groups[rng(&s) % (sizeof groups / sizeof groups[0])];
            n = 1 + rng(&s) % 300;
        }
        e0 = rng(&s) % (maxn - n + 1 < 3 * group ? maxn - n + 1 : 3 * group); /* odd starts and straddled groups */
        uint32_t values = e0 + n, ngroups = (values + group - 1) / group;
        uint32_t code_bytes = dtype == PLE_INT8 ? values : (values + 1) / 2;
        for (uint32_t i = 0; i < code_bytes; i++) codes[i] = (uint8_t)rng(&s); /* every code, -8 and -128 too */
        for (uint32_t g = 0; g < ngroups; g++) { /* normal fp16 scales of either sign, 2^-10 .. 2^5 */
            uint32_t h = (rng(&s) & 0x8000u) | (5u + rng(&s) % 16) << 10 | (rng(&s) & 0x3ffu);
            scales[2 * g] = (uint8_t)h, scales[2 * g + 1] = (uint8_t)(h >> 8);
        }
        float mag = (float)(1u << (rng(&s) % 12)) / 64.0f;
        uint32_t kind = rng(&s) % 8;
        for (uint32_t i = 0; i < n; i++) x[i] = kind == 0 ? 0.0f : uniform(&s) * mag;
        if (kind == 1) x[rng(&s) % n] = 100.0f * mag; /* an outlier: most codes round to 0 or +-1 */
        ple_kact_quantize(&a, x, n);
        ple_kact_prepare(&a, dtype);
        float got = ple_kdot(dtype, codes, scales, group, e0, n, &a);
        float want = reference(dtype, codes, scales, group, e0, n, &a);
        check(out, c, got, want);
        out->cases++;
        out->digest = fnv(fnv(out->digest, &got, sizeof got), a.q, n);
        if (emit) {
            fprintf(emit, "{\"case\": %lu, \"dtype\": \"%s\", \"group\": %lu, \"e0\": %lu, \"n\": %lu, \"codes\": \"",
                    (unsigned long)c, dtype == PLE_INT8 ? "int8" : "int4", (unsigned long)group, (unsigned long)e0,
                    (unsigned long)n);
            hex(emit, codes, code_bytes);
            fprintf(emit, "\", \"scales\": \"");
            hex(emit, scales, 2 * (size_t)ngroups);
            fprintf(emit, "\", \"x\": \"");
            hex(emit, (const uint8_t *)x, 4 * (size_t)n);
            fprintf(emit, "\", \"q\": \"");
            hex(emit, (const uint8_t *)a.q, n);
            fprintf(emit, "\", \"scale\": \"");
            hex(emit, (const uint8_t *)&a.scale, 4);
            fprintf(emit, "\", \"got\": \"");
            hex(emit, (const uint8_t *)&got, 4);
            fprintf(emit, "\", \"want\": \"");
            hex(emit, (const uint8_t *)&want, 4);
            fprintf(emit, "\"}\n");
        }
        if (n <= 300) { /* the row walkers: ple_kdot_dense on rows of n values, ple_kdot_rows on n-value records */
            float rows_out[16];
            uint32_t r0 = e0 / n, r1 = r0 + 1 + rng(&s) % 9;
            if (r1 * n > maxn) r1 = maxn / n;
            uint32_t total = r1 * n, cb = dtype == PLE_INT8 ? total : (total + 1) / 2;
            for (uint32_t i = 0; i < cb; i++) codes[i] = (uint8_t)rng(&s);
            for (uint32_t g = 0; g < (total + group - 1) / group; g++) {
                uint32_t h = (rng(&s) & 0x8000u) | (5u + rng(&s) % 16) << 10 | (rng(&s) & 0x3ffu);
                scales[2 * g] = (uint8_t)h, scales[2 * g + 1] = (uint8_t)(h >> 8);
            }
            ple_kdot_dense(rows_out, dtype, codes, scales, group, r0, r1, n, &a);
            for (uint32_t r = r0; r < r1; r++)
                check(out, c, rows_out[r - r0], reference(dtype, codes, scales, group, (uint64_t)r * n, n, &a));
            /* records: the codes, then the fp16 scale, then 0-2 bytes of padding; up to 16 of them, so kernels
             * that take rows in groups (four of one offset class) meet groups and leftovers */
            uint32_t scale_at = dtype == PLE_INT8 ? n : (n + 1) / 2, rec = scale_at + 2 + rng(&s) % 3;
            uint32_t nrec = 1 + rng(&s) % 16;
            for (uint32_t i = 0; i < nrec * rec; i++) codes[i] = (uint8_t)rng(&s);
            /* positive scales, never zero (a zero sum times a negative scale, or a negative sum times zero, is -0 in
             * the row walkers, +0 in ple_kdot's 0 + isum * s), some subnormal, some near fp16's largest, and one
             * record in sixteen an infinity or NaN (exponent 31: what the per-row scale test is for) */
            for (uint32_t r = 0; r < nrec; r++) {
                uint32_t v = rng(&s), pick = v % 16, low = (v >> 8) & 3;
                /* exponent 0 (a mantissa of 256 or more), 30, 31, or 4..19 */
                uint32_t top = pick < 2 ? 1 + low % 3 : pick < 4 ? 0x78 | low : pick == 4 ? 0x7c | low
                                                                                          : 0x10 + (v >> 8) % 0x40;
                codes[r * rec + scale_at + 1] = (uint8_t)top;
            }
            /* twice: with the per-row scale test, and without it where ple_scales_plain allows (most cases: a
             * subnormal scale is one record in eight) */
            int plain = ple_scales_plain(codes + scale_at, rec, nrec);
            for (int pass = 0; pass <= plain; pass++) {
                ple_kdot_rows(rows_out, dtype, codes, codes + scale_at, rec, nrec, n, pass, &a);
                for (uint32_t r = 0; r < nrec; r++)
                    check(out, c, rows_out[r],
                          reference(dtype, codes + r * rec, codes + r * rec + scale_at, n, 0, n, &a));
            }
            uint32_t idx[16]; /* rows picked out of order (the greedy head's blocks) */
            for (uint32_t k = 0; k < nrec; k++) idx[k] = (k * 7 + nrec - 1) % nrec;
            ple_kdot_pick(rows_out, dtype, codes, codes + scale_at, rec, idx, nrec, n, plain, &a);
            for (uint32_t k = 0; k < nrec; k++)
                check(out, c, rows_out[k],
                      reference(dtype, codes + idx[k] * rec, codes + idx[k] * rec + scale_at, n, 0, n, &a));
            out->cases += (r1 - r0) + 2 * nrec;
        }
    }
}
