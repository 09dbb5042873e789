/* Integer kernels (ple_kernels.h): activation quantisation, the shared dot-product driver, and the three
 * compile-time implementations of its inner runs (portable C, Arm DSP, Arm Helium).
 *
 * The driver walks a vector's group segments; inside a segment it sums scalar values until the activation index
 * reaches the kernel's alignment, hands the aligned middle to the kernel (kseg_i4 / kseg_i8, at most PLE_KCHUNK
 * values per call), and sums the tail in scalar code. Every partial sum is an exact integer, so every kernel gives
 * the portable kernel's result bit for bit; only the one float multiply-add per segment rounds, in the same order
 * for all of them.
 */
#include "ple_kernels.h"

#include <string.h>

#include "ple.h"

#if defined(PLE_KERNEL_DSP)
#include <arm_acle.h>
#elif defined(PLE_KERNEL_MVE)
#include <arm_mve.h>
#endif

#define PAD16(n) (((size_t)(n) + 15) / 16 * 16)

static inline int nib4(uint8_t b, int high) { return ((high ? b >> 4 : b & 15) ^ 8) - 8; }

/* ---- portable C: the reference every other kernel must equal ------------------------------------------- */

#if defined(PLE_KERNEL_PORTABLE)
#define ALIGN_I4 2 /* activation index of a run's first value: a multiple of this */
#define ALIGN_I8 1

static void kact_layout(ple_kact *a, int dtype) { (void)a, (void)dtype; }

/* Sum over n values (n even) whose codes start at byte wb (low nibble first) times q[x0 ...]. */
static int32_t kseg_i4(const uint8_t *wb, const ple_kact *a, uint32_t x0, uint32_t n) {
    const int8_t *q = a->q + x0;
    int32_t s = 0;
    for (uint32_t j = 0; j < n / 2; j++) s += nib4(wb[j], 0) * q[2 * j] + nib4(wb[j], 1) * q[2 * j + 1];
    return s;
}

static int32_t kseg_i8(const int8_t *w, const ple_kact *a, uint32_t x0, uint32_t n) {
    const int8_t *q = a->q + x0;
    int32_t s = 0;
    for (uint32_t i = 0; i < n; i++) s += w[i] * q[i];
    return s;
}
#endif

/* ---- Arm DSP (Cortex-M4 / M7): SXTB16 + SMLAD, two 16-bit multiply-adds per instruction --------------------
 * int4: a 32-bit word holds eight codes, element 2j in byte j's low nibble. (w << 4) & 0xF0F0F0F0 puts the even
 * elements in the high nibble of each byte and w & 0xF0F0F0F0 the odd ones, so a signed byte reads code * 16 with
 * no sign-extension step; SXTB16 (and SXTB16 ROR 8) spread bytes 0, 2 (1, 3) into two int16 lanes. The activation
 * layout pairs the codes those lanes meet: per 8 values, (x0, x4) (x2, x6) (x1, x5) (x3, x7). The sum is exact and
 * a multiple of 16. int8: SXTB16 of a word gives (w0, w2), ROR 8 gives (w1, w3); layout per 4 values (x0, x2)
 * (x1, x3). */
#if defined(PLE_KERNEL_DSP)
#define ALIGN_I4 8
#define ALIGN_I8 4

static inline uint32_t pair16(int8_t lo, int8_t hi) { return (uint16_t)(int16_t)lo | (uint32_t)(uint16_t)(int16_t)hi << 16; }

static inline uint32_t sxtb16_ror8(uint32_t v) {
    uint32_t r;
    __asm__("sxtb16 %0, %1, ror #8" : "=r"(r) : "r"(v));
    return r;
}

static inline uint32_t load32(const void *p) {
    uint32_t v;
    memcpy(&v, p, 4); /* an unaligned LDR: Armv7-M allows it for normal memory */
    return v;
}

/* Layouts at a->lay: int4 words for PAD16(cap) values, then int8 words for PAD16(cap) values. */
static void kact_layout(ple_kact *a, int dtype) {
    const int8_t *q = a->q;
    uint32_t n = (uint32_t)PAD16(a->n);
    uint32_t *out = (uint32_t *)a->lay + (dtype == PLE_INT4 ? 0 : PAD16(a->cap) / 2);
    if (dtype == PLE_INT4) {
        for (uint32_t k = 0; k < n; k += 8, out += 4) {
            out[0] = pair16(q[k], q[k + 4]);
            out[1] = pair16(q[k + 2], q[k + 6]);
            out[2] = pair16(q[k + 1], q[k + 5]);
            out[3] = pair16(q[k + 3], q[k + 7]);
        }
    } else {
        for (uint32_t k = 0; k < n; k += 4, out += 2) {
            out[0] = pair16(q[k], q[k + 2]);
            out[1] = pair16(q[k + 1], q[k + 3]);
        }
    }
}

/* (w << 4) & mask in one instruction (AND with a shifted register; GCC would spend a shift on it). */
static inline uint32_t and_lsl4(uint32_t mask, uint32_t w) {
    uint32_t r;
    __asm__("and %0, %1, %2, lsl #4" : "=r"(r) : "r"(mask), "r"(w));
    return r;
}

/* Four layout words at x (8-byte aligned: the layouts start 16-byte aligned, runs at multiples of 8 values):
 * two LDRDs. */
static inline void load4(const uint32_t *x, uint32_t *v) {
    const uint64_t *p = (const uint64_t *)(const void *)x;
    uint64_t a = p[0], b = p[1];
    v[0] = (uint32_t)a, v[1] = (uint32_t)(a >> 32), v[2] = (uint32_t)b, v[3] = (uint32_t)(b >> 32);
}

static int32_t kseg_i4(const uint8_t *wb, const ple_kact *a, uint32_t x0, uint32_t n) {
    const uint32_t *x = (const uint32_t *)a->lay + x0 / 2;
    const uint32_t mask = 0xF0F0F0F0u;
    int32_t acc = 0, acc2 = 0;
    uint32_t k = 0, v[4], u[4];
    for (; k + 16 <= n; k += 16, wb += 8, x += 8) { /* two words a pass: two independent accumulators */
        uint32_t w = load32(wb), w2 = load32(wb + 4);
        uint32_t lo = and_lsl4(mask, w), hi = w & mask, lo2 = and_lsl4(mask, w2), hi2 = w2 & mask;
        load4(x, v);
        load4(x + 4, u);
        acc = __smlad(__sxtb16(lo), v[0], acc);
        acc2 = __smlad(__sxtb16(lo2), u[0], acc2);
        acc = __smlad(sxtb16_ror8(lo), v[1], acc);
        acc2 = __smlad(sxtb16_ror8(lo2), u[1], acc2);
        acc = __smlad(__sxtb16(hi), v[2], acc);
        acc2 = __smlad(__sxtb16(hi2), u[2], acc2);
        acc = __smlad(sxtb16_ror8(hi), v[3], acc);
        acc2 = __smlad(sxtb16_ror8(hi2), u[3], acc2);
    }
    if (k < n) {
        uint32_t w = load32(wb), lo = and_lsl4(mask, w), hi = w & mask;
        load4(x, v);
        acc = __smlad(__sxtb16(lo), v[0], acc);
        acc = __smlad(sxtb16_ror8(lo), v[1], acc);
        acc = __smlad(__sxtb16(hi), v[2], acc);
        acc = __smlad(sxtb16_ror8(hi), v[3], acc);
    }
    return (acc + acc2) / 16; /* exact: every product was a multiple of 16 */
}

static int32_t kseg_i8(const int8_t *w, const ple_kact *a, uint32_t x0, uint32_t n) {
    const uint32_t *x = (const uint32_t *)a->lay + PAD16(a->cap) / 2 + x0 / 2;
    int32_t acc = 0, acc2 = 0;
    uint32_t k = 0;
    for (; k + 8 <= n; k += 8, w += 8, x += 4) {
        uint32_t u = load32(w), v = load32(w + 4);
        acc = __smlad(__sxtb16(u), x[0], acc);
        acc2 = __smlad(__sxtb16(v), x[2], acc2);
        acc = __smlad(sxtb16_ror8(u), x[1], acc);
        acc2 = __smlad(sxtb16_ror8(v), x[3], acc2);
    }
    if (k < n) {
        uint32_t u = load32(w);
        acc = __smlad(__sxtb16(u), x[0], acc);
        acc = __smlad(sxtb16_ror8(u), x[1], acc);
    }
    return acc + acc2;
}
#endif

/* ---- Arm Helium / MVE (Cortex-M55): sixteen int8 lanes, VMLADAVA sums lane products into a scalar -----------
 * int4: a 16-byte load holds 32 codes; VSHL #4 then VSHR.S8 #4 sign-extends the low nibbles (even elements), VSHR.S8
 * #4 alone the high ones (odd elements), which meet the activation's even / odd halves (laid out once per
 * activation). The last partial vector is predicated (VCTP): no read past the run. */
#if defined(PLE_KERNEL_MVE)
#define ALIGN_I4 2
#define ALIGN_I8 1

/* Even codes at a->lay, odd codes PAD16(cap) / 2 bytes later. */
static void kact_layout(ple_kact *a, int dtype) {
    if (dtype != PLE_INT4) return; /* int8 weights read a->q directly */
    int8_t *xe = (int8_t *)a->lay, *xo = xe + PAD16(a->cap) / 2;
    uint32_t pairs = (uint32_t)PAD16(a->n) / 2;
    for (uint32_t j = 0; j < pairs; j++) {
        xe[j] = a->q[2 * j];
        xo[j] = a->q[2 * j + 1];
    }
}

static int32_t kseg_i4(const uint8_t *wb, const ple_kact *a, uint32_t x0, uint32_t n) {
    const int8_t *xe = (const int8_t *)a->lay + x0 / 2, *xo = xe + PAD16(a->cap) / 2;
    const int8_t *w = (const int8_t *)wb;
    int32_t acc = 0;
    uint32_t pairs = n / 2, j = 0;
    for (; j + 16 <= pairs; j += 16) {
        int8x16_t c = vld1q_s8(w + j);
        acc = vmladavaq_s8(acc, vshrq_n_s8(vshlq_n_s8(c, 4), 4), vld1q_s8(xe + j));
        acc = vmladavaq_s8(acc, vshrq_n_s8(c, 4), vld1q_s8(xo + j));
    }
    if (j < pairs) {
        mve_pred16_t p = vctp8q(pairs - j);
        int8x16_t c = vldrbq_z_s8(w + j, p);
        acc = vmladavaq_s8(acc, vshrq_n_s8(vshlq_n_s8(c, 4), 4), vldrbq_z_s8(xe + j, p));
        acc = vmladavaq_s8(acc, vshrq_n_s8(c, 4), vldrbq_z_s8(xo + j, p));
    }
    return acc;
}

static int32_t kseg_i8(const int8_t *w, const ple_kact *a, uint32_t x0, uint32_t n) {
    const int8_t *q = a->q + x0;
    int32_t acc = 0;
    uint32_t i = 0;
    for (; i + 16 <= n; i += 16) acc = vmladavaq_s8(acc, vld1q_s8(w + i), vld1q_s8(q + i));
    if (i < n) {
        mve_pred16_t p = vctp8q(n - i);
        acc = vmladavaq_s8(acc, vldrbq_z_s8(w + i, p), vldrbq_z_s8(q + i, p));
    }
    return acc;
}
#endif

/* ---- shared: names, memory, quantisation, the driver ----------------------------------------------------- */

const char *ple_kernel_name(void) {
#if defined(PLE_KERNEL_DSP)
    return "dsp";
#elif defined(PLE_KERNEL_MVE)
    return "mve";
#else
    return "portable";
#endif
}

/* The same for every kernel (the arena, and so the memory plan, does not depend on which one is built): codes
 * plus the largest layout (DSP: two int16 per value). */
size_t ple_kact_bytes(uint32_t cap) { return 5 * PAD16(cap); }

void ple_kact_init(ple_kact *a, void *mem, uint32_t cap) {
    a->n = 0;
    a->cap = cap;
    a->scale = 0;
    a->q = (int8_t *)mem;
    a->lay = (uint8_t *)mem + PAD16(cap);
    a->ready = 0;
    memset(mem, 0, ple_kact_bytes(cap));
}

/* Rounding must not depend on the compiler fusing x * inv + 0.5 (-ffp-contract=fast would): the NumPy runtime
 * rounds the float32 product, and so does this. */
#if defined(__clang__)
#define NO_CONTRACT
#elif defined(__GNUC__)
#define NO_CONTRACT __attribute__((optimize("fp-contract=off")))
#else
#define NO_CONTRACT
#endif

NO_CONTRACT float ple_quantize_i8(const float *x, uint32_t n, int8_t *q) {
#if defined(__clang__)
#pragma clang fp contract(off)
#endif
    float mx = 0;
    for (uint32_t i = 0; i < n; i++) {
        float v = x[i] < 0 ? -x[i] : x[i];
        mx = v > mx ? v : mx;
    }
    if (!(mx > 0) || mx > 3.0e38f) { /* all zeros (or not finite): zero codes */
        memset(q, 0, n);
        return 0;
    }
    float inv = 127.0f / mx;
    for (uint32_t i = 0; i < n; i++) {
        float v = x[i] * inv;
        v = v < 0 ? v - 0.5f : v + 0.5f; /* half away from zero, then truncate */
        int c = (int)v;
        q[i] = (int8_t)(c > 127 ? 127 : c < -127 ? -127 : c);
    }
    return mx / 127.0f;
}

void ple_kact_quantize(ple_kact *a, const float *x, uint32_t n) {
    a->n = n;
    a->ready = 0;
    memset(a->q + n, 0, PAD16(n) - n);
    a->scale = ple_quantize_i8(x, n, a->q);
}

void ple_kact_prepare(ple_kact *a, int dtype) {
    unsigned bit = dtype == PLE_INT4 ? 1u : 2u;
    if (a->ready & bit) return;
    kact_layout(a, dtype);
    a->ready |= bit;
}

/* Integer sum of values [s, b) of the vector times a->q[x0 ...] (x0: s's index in the activation); b - s is at
 * most PLE_KCHUNK, so the sum fits an int32. */
static int32_t run(int dtype, const uint8_t *c, uint64_t s, uint64_t b, uint32_t x0, const ple_kact *a) {
    const int8_t *q = a->q;
    uint32_t n = (uint32_t)(b - s), i = 0;
    int32_t total = 0;
    if (dtype == PLE_INT8) {
        const int8_t *w = (const int8_t *)c + s;
        for (; i < n && (x0 + i) % ALIGN_I8; i++) total += w[i] * q[x0 + i];
        uint32_t mid = (n - i) / ALIGN_I8 * ALIGN_I8;
        if (mid) total += kseg_i8(w + i, a, x0 + i, mid);
        for (i += mid; i < n; i++) total += w[i] * q[x0 + i];
        return total;
    }
    /* int4: pairs line up with the activation's only when s and x0 have the same parity */
    int lined_up = ((s ^ x0) & 1) == 0;
    for (; i < n && (!lined_up || (x0 + i) % ALIGN_I4); i++)
        total += nib4(c[(s + i) / 2], (int)((s + i) & 1)) * q[x0 + i];
    uint32_t mid = (n - i) / ALIGN_I4 * ALIGN_I4;
    if (mid) total += kseg_i4(c + (s + i) / 2, a, x0 + i, mid);
    for (i += mid; i < n; i++) total += nib4(c[(s + i) / 2], (int)((s + i) & 1)) * q[x0 + i];
    return total;
}

float ple_kdot(int dtype, const uint8_t *codes, const uint8_t *scales, uint32_t group, uint64_t e0, uint32_t n,
               const ple_kact *a) {
    float sum = 0;
    /* 32-bit division where the offsets allow (a 64-bit one is a library call on 32-bit cores) */
    uint64_t g = e0 <= UINT32_MAX ? (uint32_t)e0 / group : e0 / group, end = e0 + n;
    for (uint64_t s = e0; s < end; g++) {
        uint64_t b = (g + 1) * group < end ? (g + 1) * group : end;
        uint32_t x0 = (uint32_t)(s - e0);
        float isum;
        if (b - s <= PLE_KCHUNK) {
            isum = (float)run(dtype, codes, s, b, x0, a);
        } else { /* a long group: int32 chunks summed in int64 */
            int64_t t = 0;
            for (uint64_t p = s; p < b; p += PLE_KCHUNK)
                t += run(dtype, codes, p, b - p < PLE_KCHUNK ? b : p + PLE_KCHUNK, x0 + (uint32_t)(p - s), a);
            isum = (float)t;
        }
        sum += isum * ple_f16(scales + 2 * g);
        s = b;
    }
    return sum * a->scale;
}
