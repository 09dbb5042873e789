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

#if PLE_IKERNEL == PLE_KERNEL_DSP
#include <arm_acle.h>
#elif PLE_IKERNEL == PLE_KERNEL_HELIUM
#include <arm_mve.h>
#endif

#define PAD16(n) (((size_t)(n) + 15) / 16 * 16)

static inline int nib4(uint8_t b, int high) { return ((high ? b >> 4 : b & 15) ^ 8) - 8; }

/* ---- portable C (for PORTABLE and VECTOR alike): the reference every other kernel must equal -------------- */

#if PLE_IKERNEL == PLE_KERNEL_PORTABLE || PLE_IKERNEL == PLE_KERNEL_VECTOR
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
#if PLE_IKERNEL == PLE_KERNEL_DSP
#define ALIGN_I4 8
#define ALIGN_I8 4

static inline uint32_t pair16(int8_t lo, int8_t hi) { return (uint16_t)(int16_t)lo | (uint32_t)(uint16_t)(int16_t)hi << 16; }

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

/* The loops are written in assembly: GCC 12 loads the four activation words one LDR each, spends a shift on every
 * (w << 4) & mask and a move or two on loop bookkeeping; here one LDM takes the four words (fixed registers r4 r5
 * r6 r8: an LDM list ascends; r7 is Thumb's frame pointer) and AND takes the shifted operand: 13 instructions per
 * eight int4 values, of which eight are the SXTB16 / SMLAD pairs themselves. Weight words may be unaligned (LDR
 * allows it on Armv7-M); the layout words are 16-byte aligned. */
/* One int4 word: load it, split its nibbles (hi reuses the word's register), four SXTB16 / SMLAD pairs. */
#define DSP_I4_WORD                                                                                                \
    "ldr %[w], [%[wb]], #4\n\t"                                                                                  \
    "and %[lo], %[mask], %[w], lsl #4\n\t"                                                                       \
    "and %[w], %[w], %[mask]\n\t"                                                                                \
    "ldmia %[x]!, {r4, r5, r6, r8}\n\t"                                                                          \
    "sxtb16 %[t], %[lo]\n\t"                                                                                     \
    "smlad %[acc], %[t], r4, %[acc]\n\t"                                                                         \
    "sxtb16 %[t], %[lo], ror #8\n\t"                                                                             \
    "smlad %[acc], %[t], r5, %[acc]\n\t"                                                                         \
    "sxtb16 %[t], %[w]\n\t"                                                                                      \
    "smlad %[acc], %[t], r6, %[acc]\n\t"                                                                         \
    "sxtb16 %[t], %[w], ror #8\n\t"                                                                              \
    "smlad %[acc], %[t], r8, %[acc]\n\t"

static int32_t kseg_i4(const uint8_t *wb, const ple_kact *a, uint32_t x0, uint32_t n) {
    const uint32_t *x = (const uint32_t *)a->lay + x0 / 2;
    uint32_t words = n / 8, w, lo, t;
    int32_t acc = 0;
    if (words) {
        register uint32_t r4 __asm__("r4"), r5 __asm__("r5"), r6 __asm__("r6"), r8 __asm__("r8");
        __asm__ volatile("tst %[n], #1\n\t"
                         "beq 2f\n\t" DSP_I4_WORD /* an odd word first, then two a pass */
                         "2:\n\t"
                         "lsrs %[n], %[n], #1\n\t"
                         "beq 3f\n\t"
                         "1:\n\t" DSP_I4_WORD DSP_I4_WORD
                         "subs %[n], %[n], #1\n\t"
                         "bne 1b\n\t"
                         "3:\n\t"
                         : [acc] "+r"(acc), [wb] "+r"(wb), [x] "+r"(x), [n] "+r"(words), [w] "=&r"(w), [lo] "=&r"(lo),
                           [t] "=&r"(t), "=&r"(r4), "=&r"(r5), "=&r"(r6), "=&r"(r8)
                         : [mask] "r"(0xF0F0F0F0u)
                         : "cc", "memory");
    }
    return acc / 16; /* exact: every product was a multiple of 16 */
}

/* int8: per eight values two weight words, one LDM of four layout words, four SXTB16 / SMLAD pairs. */
static int32_t kseg_i8(const int8_t *w, const ple_kact *a, uint32_t x0, uint32_t n) {
    const uint32_t *x = (const uint32_t *)a->lay + PAD16(a->cap) / 2 + x0 / 2;
    uint32_t blocks = n / 8, u, v, t;
    int32_t acc = 0;
    if (blocks) {
        register uint32_t r4 __asm__("r4"), r5 __asm__("r5"), r6 __asm__("r6"), r8 __asm__("r8");
        __asm__ volatile("1:\n\t"
                         "ldr %[u], [%[w]], #4\n\t"
                         "ldr %[v], [%[w]], #4\n\t"
                         "ldmia %[x]!, {r4, r5, r6, r8}\n\t"
                         "sxtb16 %[t], %[u]\n\t"
                         "smlad %[acc], %[t], r4, %[acc]\n\t"
                         "sxtb16 %[t], %[u], ror #8\n\t"
                         "smlad %[acc], %[t], r5, %[acc]\n\t"
                         "sxtb16 %[t], %[v]\n\t"
                         "smlad %[acc], %[t], r6, %[acc]\n\t"
                         "sxtb16 %[t], %[v], ror #8\n\t"
                         "smlad %[acc], %[t], r8, %[acc]\n\t"
                         "subs %[n], %[n], #1\n\t"
                         "bne 1b\n\t"
                         : [acc] "+r"(acc), [w] "+r"(w), [x] "+r"(x), [n] "+r"(blocks), [u] "=&r"(u), [v] "=&r"(v),
                           [t] "=&r"(t), "=&r"(r4), "=&r"(r5), "=&r"(r6), "=&r"(r8)
                         :
                         : "cc", "memory");
    }
    if (n % 8) { /* four values left (runs are multiples of ALIGN_I8) */
        uint32_t word;
        memcpy(&word, w, 4);
        acc = __smlad(__sxtb16(word), x[0], acc);
        acc = __smlad(__sxtb16(word >> 8 | word << 24), x[1], acc);
    }
    return acc;
}
#endif

/* ---- Arm Helium / MVE (Cortex-M55): sixteen int8 lanes, VMLADAVA sums lane products into a scalar -----------
 * int4: a 16-byte load holds 32 codes; VSHL #4 then VSHR.S8 #4 sign-extends the low nibbles (even elements), VSHR.S8
 * #4 alone the high ones (odd elements), which meet the activation's even / odd halves (laid out once per
 * activation). The last partial vector is predicated (VCTP): no read past the run. */
#if PLE_IKERNEL == PLE_KERNEL_HELIUM
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
    uint32_t pairs = n / 2;
    for (; pairs >= 16; pairs -= 16, w += 16, xe += 16, xo += 16) {
        int8x16_t c = vld1q_s8(w);
        acc = vmladavaq_s8(acc, vshrq_n_s8(vshlq_n_s8(c, 4), 4), vld1q_s8(xe));
        acc = vmladavaq_s8(acc, vshrq_n_s8(c, 4), vld1q_s8(xo));
    }
    if (pairs) {
        mve_pred16_t p = vctp8q(pairs);
        int8x16_t c = vldrbq_z_s8(w, p);
        acc = vmladavaq_s8(acc, vshrq_n_s8(vshlq_n_s8(c, 4), 4), vldrbq_z_s8(xe, p));
        acc = vmladavaq_s8(acc, vshrq_n_s8(c, 4), vldrbq_z_s8(xo, p));
    }
    return acc;
}

static int32_t kseg_i8(const int8_t *w, const ple_kact *a, uint32_t x0, uint32_t n) {
    const int8_t *q = a->q + x0;
    int32_t acc = 0;
    for (; n >= 16; n -= 16, w += 16, q += 16) acc = vmladavaq_s8(acc, vld1q_s8(w), vld1q_s8(q));
    if (n) {
        mve_pred16_t p = vctp8q(n);
        acc = vmladavaq_s8(acc, vldrbq_z_s8(w, p), vldrbq_z_s8(q, p));
    }
    return acc;
}
#endif

/* ---- shared: names, memory, quantisation, the driver ----------------------------------------------------- */

const char *ple_kernel_name(void) {
#if PLE_IKERNEL == PLE_KERNEL_DSP
    return "dsp";
#elif PLE_IKERNEL == PLE_KERNEL_HELIUM
    return "helium";
#elif PLE_IKERNEL == PLE_KERNEL_VECTOR
    return "vector";
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

void ple_kdot_rows(float *out, int dtype, const uint8_t *codes, const uint8_t *scales, size_t stride, uint32_t rows,
                   uint32_t n, const ple_kact *a) {
    for (uint32_t r = 0; r < rows; r++, codes += stride, scales += stride) /* (0 + isum * s) * scale, as ple_kdot */
        out[r] = (float)run(dtype, codes, 0, n, 0, a) * ple_f16(scales) * a->scale;
}
