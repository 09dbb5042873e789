/* Integer kernels (ple_int_kernels.h): activation quantisation, the shared dot-product driver, and the three
 * compile-time implementations of its inner runs (portable C, Arm DSP, Arm Helium).
 *
 * The driver walks a vector's group segments; inside a segment it sums scalar values until the activation index
 * reaches the kernel's alignment, hands the aligned middle to the kernel (kseg_i4 / kseg_i8, at most PLE_KCHUNK
 * values per call), and sums the tail in scalar code. Every partial sum is an exact integer, so every kernel gives
 * the portable kernel's result bit for bit; only the one float multiply-add per segment rounds, in the same order
 * for all of them.
 */
#include "ple_int_kernels.h"

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

/* Inlined where it is called: a call's setup cost a third of a 96-value row. */
static inline __attribute__((always_inline)) int32_t kseg_i4(const uint8_t *wb, const ple_kact *a, uint32_t x0,
                                                            uint32_t n) {
    const int8_t *xe = (const int8_t *)a->lay + x0 / 2, *xo = xe + PAD16(a->cap) / 2;
    const int8_t *w = (const int8_t *)wb;
    int32_t acc = 0;
    uint32_t pairs = n / 2, full = pairs / 16; /* a counted loop: GCC sets up DLS/LE from the count directly */
    for (uint32_t j = 0; j < full; j++, w += 16, xe += 16, xo += 16) {
        int8x16_t c = vld1q_s8(w);
        acc = vmladavaq_s8(acc, vshrq_n_s8(vshlq_n_s8(c, 4), 4), vld1q_s8(xe));
        acc = vmladavaq_s8(acc, vshrq_n_s8(c, 4), vld1q_s8(xo));
    }
    pairs %= 16;
    if (pairs) {
        mve_pred16_t p = vctp8q(pairs);
        int8x16_t c = vldrbq_z_s8(w, p);
        acc = vmladavaq_s8(acc, vshrq_n_s8(vshlq_n_s8(c, 4), 4), vldrbq_z_s8(xe, p));
        acc = vmladavaq_s8(acc, vshrq_n_s8(c, 4), vldrbq_z_s8(xo, p));
    }
    return acc;
}

/* Rows of a tied head (records `stride` apart, n values from activation index 0, one scale each), two at a time:
 * each activation load serves both rows, and the row bookkeeping and tail predicate are paid once per pair. */
#define KROWS_I4 1
static inline int8x16_t lo4(int8x16_t c) { return vshrq_n_s8(vshlq_n_s8(c, 4), 4); }

static void krows_i4(float *out, const uint8_t *codes, const uint8_t *scales, size_t stride, const uint32_t *idx,
                     uint32_t rows, uint32_t n, const ple_kact *a) {
    const int8_t *xe = (const int8_t *)a->lay, *xo = xe + PAD16(a->cap) / 2;
    uint32_t pairs = n / 2, full = pairs / 16, rest = pairs % 16, r = 0;
    mve_pred16_t p = vctp8q(rest);
    float scale = a->scale;
    for (; r + 2 <= rows; r += 2) {
        size_t o0 = (idx ? idx[r] : r) * stride, o1 = (idx ? idx[r + 1] : r + 1) * stride;
        const int8_t *w0 = (const int8_t *)codes + o0, *w1 = (const int8_t *)codes + o1, *e = xe, *o = xo;
        int32_t a0 = 0, a1 = 0;
        for (uint32_t j = 0; j < full; j++, w0 += 16, w1 += 16, e += 16, o += 16) {
            int8x16_t ve = vld1q_s8(e), vo = vld1q_s8(o), c0 = vld1q_s8(w0), c1 = vld1q_s8(w1);
            a0 = vmladavaq_s8(a0, lo4(c0), ve);
            a1 = vmladavaq_s8(a1, lo4(c1), ve);
            a0 = vmladavaq_s8(a0, vshrq_n_s8(c0, 4), vo);
            a1 = vmladavaq_s8(a1, vshrq_n_s8(c1, 4), vo);
        }
        if (rest) {
            int8x16_t ve = vldrbq_z_s8(e, p), vo = vldrbq_z_s8(o, p), c0 = vldrbq_z_s8(w0, p), c1 = vldrbq_z_s8(w1, p);
            a0 = vmladavaq_s8(a0, lo4(c0), ve);
            a1 = vmladavaq_s8(a1, lo4(c1), ve);
            a0 = vmladavaq_s8(a0, vshrq_n_s8(c0, 4), vo);
            a1 = vmladavaq_s8(a1, vshrq_n_s8(c1, 4), vo);
        }
        out[r] = (float)a0 * ple_f16(scales + o0) * scale;
        out[r + 1] = (float)a1 * ple_f16(scales + o1) * scale;
    }
    if (r < rows) { /* an odd last row */
        size_t o0 = (idx ? idx[r] : r) * stride;
        const int8_t *w = (const int8_t *)codes + o0, *e = xe, *o = xo;
        int32_t acc = 0;
        for (uint32_t j = 0; j < full; j++, w += 16, e += 16, o += 16) {
            int8x16_t c = vld1q_s8(w);
            acc = vmladavaq_s8(acc, lo4(c), vld1q_s8(e));
            acc = vmladavaq_s8(acc, vshrq_n_s8(c, 4), vld1q_s8(o));
        }
        if (rest) {
            int8x16_t c = vldrbq_z_s8(w, p);
            acc = vmladavaq_s8(acc, lo4(c), vldrbq_z_s8(e, p));
            acc = vmladavaq_s8(acc, vshrq_n_s8(c, 4), vldrbq_z_s8(o, p));
        }
        out[r] = (float)acc * ple_f16(scales + o0) * scale;
    }
}

#define KROWS_I8 1
static void krows_i8(float *out, const uint8_t *codes, const uint8_t *scales, size_t stride, const uint32_t *idx,
                     uint32_t rows, uint32_t n, const ple_kact *a) {
    uint32_t full = n / 16, rest = n % 16;
    mve_pred16_t p = vctp8q(rest);
    float scale = a->scale;
    for (uint32_t r = 0; r < rows; r++) {
        size_t off = (idx ? idx[r] : r) * stride;
        const int8_t *w = (const int8_t *)codes + off, *q = a->q;
        int32_t acc = 0;
        for (uint32_t j = 0; j < full; j++, w += 16, q += 16) acc = vmladavaq_s8(acc, vld1q_s8(w), vld1q_s8(q));
        if (rest) acc = vmladavaq_s8(acc, vldrbq_z_s8(w, p), vldrbq_z_s8(q, p));
        out[r] = (float)acc * ple_f16(scales + off) * scale;
    }
}

static inline __attribute__((always_inline)) int32_t kseg_i8(const int8_t *w, const ple_kact *a, uint32_t x0,
                                                            uint32_t n) {
    const int8_t *q = a->q + x0;
    int32_t acc = 0;
    for (uint32_t j = 0, full = n / 16; j < full; j++, w += 16, q += 16)
        acc = vmladavaq_s8(acc, vld1q_s8(w), vld1q_s8(q));
    n %= 16;
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

/* Integer sum of n values (n <= PLE_KCHUNK, so it fits an int32) whose codes start at c times a->q[x0 ...]. int8:
 * c is the first value's byte; int4: the byte holding it, in its high nibble when odd. */
static int32_t run(int dtype, const uint8_t *c, uint32_t odd, uint32_t n, uint32_t x0, const ple_kact *a) {
    const int8_t *q = a->q;
    uint32_t i = 0;
    int32_t total = 0;
    if (dtype == PLE_INT8) {
        const int8_t *w = (const int8_t *)c;
        for (; i < n && (x0 + i) % ALIGN_I8; i++) total += w[i] * q[x0 + i];
        uint32_t mid = (n - i) / ALIGN_I8 * ALIGN_I8;
        if (mid) total += kseg_i8(w + i, a, x0 + i, mid);
        for (i += mid; i < n; i++) total += w[i] * q[x0 + i];
        return total;
    }
    /* int4: pairs line up with the activation's only when the first value and x0 have the same parity */
    int lined_up = ((odd ^ x0) & 1) == 0;
    for (; i < n && (!lined_up || (x0 + i) % ALIGN_I4); i++) total += nib4(c[(odd + i) / 2], (int)((odd + i) & 1)) * q[x0 + i];
    uint32_t mid = (n - i) / ALIGN_I4 * ALIGN_I4;
    if (mid) total += kseg_i4(c + (odd + i) / 2, a, x0 + i, mid);
    for (i += mid; i < n; i++) total += nib4(c[(odd + i) / 2], (int)((odd + i) & 1)) * q[x0 + i];
    return total;
}

/* The integer sum of values [s, s + n) of a vector (all in one group) times a->q[x0 ...], as a float: int32 runs of
 * at most PLE_KCHUNK values, summed in int64 when the group is longer. */
static inline float seg_sum(int dtype, const uint8_t *codes, uint64_t s, uint32_t n, uint32_t x0, const ple_kact *a) {
    const uint8_t *c = dtype == PLE_INT8 ? codes + s : codes + s / 2;
    uint32_t odd = dtype == PLE_INT8 ? 0 : (uint32_t)(s & 1);
    if (n <= PLE_KCHUNK) { /* aligned at both ends (the usual case): straight to the kernel */
        if (dtype == PLE_INT4 && !odd && x0 % ALIGN_I4 == 0 && n % ALIGN_I4 == 0) return (float)kseg_i4(c, a, x0, n);
        if (dtype == PLE_INT8 && x0 % ALIGN_I8 == 0 && n % ALIGN_I8 == 0) return (float)kseg_i8((const int8_t *)c, a, x0, n);
        return (float)run(dtype, c, odd, n, x0, a);
    }
    int64_t t = 0;
    for (uint32_t p = 0; p < n; p += PLE_KCHUNK) /* p even: an int4 run keeps the parity */
        t += run(dtype, dtype == PLE_INT8 ? c + p : c + p / 2, odd, n - p < PLE_KCHUNK ? n - p : PLE_KCHUNK, x0 + p, a);
    return (float)t;
}

float ple_kdot(int dtype, const uint8_t *codes, const uint8_t *scales, uint32_t group, uint64_t e0, uint32_t n,
               const ple_kact *a) {
    float sum = 0;
    uint64_t g = ple_group_of(e0, group), end = e0 + n;
    for (uint64_t s = e0; s < end; g++) {
        uint64_t b = (g + 1) * group < end ? (g + 1) * group : end;
        sum += seg_sum(dtype, codes, s, (uint32_t)(b - s), (uint32_t)(s - e0), a) * ple_f16(scales + 2 * g);
        s = b;
    }
    return sum * a->scale;
}

/* ple_kdot_dense for one dtype (a constant where it is called, so each copy is specialised), offsets in 32 bits. */
static inline __attribute__((always_inline)) void dense32(float *out, int dtype, const uint8_t *codes,
                                                          const uint8_t *scales, uint32_t group, uint32_t r0,
                                                          uint32_t r1, uint32_t cols, const ple_kact *a) {
    uint32_t e = r0 * cols, g = e / group, used = e - g * group; /* used: values of group g before e */
    uint32_t align = dtype == PLE_INT4 ? ALIGN_I4 : ALIGN_I8;
    if (cols % align == 0 && group % align == 0 && group <= PLE_KCHUNK) {
        /* every segment starts and ends aligned (cols and group are multiples): no checks, pointers that step */
        const uint8_t *c = dtype == PLE_INT4 ? codes + e / 2 : codes + e, *sc = scales + 2 * g;
        for (uint32_t r = r0; r < r1; r++) {
            float sum = 0;
            for (uint32_t x0 = 0; x0 < cols;) {
                uint32_t take = group - used < cols - x0 ? group - used : cols - x0;
                int32_t isum = dtype == PLE_INT4 ? kseg_i4(c, a, x0, take) : kseg_i8((const int8_t *)c, a, x0, take);
                sum += (float)isum * ple_f16(sc);
                c += dtype == PLE_INT4 ? take / 2 : take;
                x0 += take, used += take;
                if (used == group) used = 0, sc += 2;
            }
            out[r - r0] = sum * a->scale;
        }
        return;
    }
    for (uint32_t r = r0; r < r1; r++) {
        float sum = 0;
        for (uint32_t x0 = 0; x0 < cols;) { /* the same segments, in the same order, as ple_kdot */
            uint32_t take = group - used < cols - x0 ? group - used : cols - x0;
            float isum;
            if (dtype == PLE_INT4 && !(e & 1) && x0 % ALIGN_I4 == 0 && take % ALIGN_I4 == 0 && take <= PLE_KCHUNK)
                isum = (float)kseg_i4(codes + e / 2, a, x0, take);
            else if (dtype == PLE_INT8 && x0 % ALIGN_I8 == 0 && take % ALIGN_I8 == 0 && take <= PLE_KCHUNK)
                isum = (float)kseg_i8((const int8_t *)codes + e, a, x0, take);
            else
                isum = seg_sum(dtype, codes, e, take, x0, a);
            sum += isum * ple_f16(scales + 2 * g);
            e += take, x0 += take, used += take;
            if (used == group) used = 0, g++;
        }
        out[r - r0] = sum * a->scale;
    }
}

void ple_kdot_dense(float *out, int dtype, const uint8_t *codes, const uint8_t *scales, uint32_t group, uint32_t r0,
                    uint32_t r1, uint32_t cols, const ple_kact *a) {
    if ((uint64_t)r1 * cols <= UINT32_MAX) { /* every offset fits 32 bits (a 64-bit add is two instructions) */
        if (dtype == PLE_INT4) dense32(out, PLE_INT4, codes, scales, group, r0, r1, cols, a);
        else dense32(out, PLE_INT8, codes, scales, group, r0, r1, cols, a);
        return;
    }
    for (uint32_t r = r0; r < r1; r++)
        out[r - r0] = ple_kdot(dtype, codes, scales, group, (uint64_t)r * cols, cols, a);
}

/* ple_kdot_rows and ple_kdot_pick: rows idx[k] (k when idx is NULL) of records `stride` apart. */
static void rows_of(float *out, int dtype, const uint8_t *codes, const uint8_t *scales, size_t stride,
                    const uint32_t *idx, uint32_t rows, uint32_t n, const ple_kact *a) {
    /* (0 + isum * s) * scale, as ple_kdot. Rows whose length is a multiple of the kernel's alignment go straight to
     * it (the head is thousands of short rows: no per-row group walk, the kernel's setup paid once) */
    if (dtype == PLE_INT4 && n % ALIGN_I4 == 0 && n <= PLE_KCHUNK) {
#ifdef KROWS_I4
        krows_i4(out, codes, scales, stride, idx, rows, n, a);
#else
        for (uint32_t r = 0; r < rows; r++) {
            size_t off = (idx ? idx[r] : r) * stride;
            out[r] = (float)kseg_i4(codes + off, a, 0, n) * ple_f16(scales + off) * a->scale;
        }
#endif
    } else if (dtype == PLE_INT8 && n % ALIGN_I8 == 0 && n <= PLE_KCHUNK) {
#ifdef KROWS_I8
        krows_i8(out, codes, scales, stride, idx, rows, n, a);
#else
        for (uint32_t r = 0; r < rows; r++) {
            size_t off = (idx ? idx[r] : r) * stride;
            out[r] = (float)kseg_i8((const int8_t *)codes + off, a, 0, n) * ple_f16(scales + off) * a->scale;
        }
#endif
    } else {
        for (uint32_t r = 0; r < rows; r++) {
            size_t off = (idx ? idx[r] : r) * stride;
            out[r] = seg_sum(dtype, codes + off, 0, n, 0, a) * ple_f16(scales + off) * a->scale;
        }
    }
}

void ple_kdot_rows(float *out, int dtype, const uint8_t *codes, const uint8_t *scales, size_t stride, uint32_t rows,
                   uint32_t n, const ple_kact *a) {
    rows_of(out, dtype, codes, scales, stride, NULL, rows, n, a);
}

void ple_kdot_pick(float *out, int dtype, const uint8_t *codes, const uint8_t *scales, size_t stride,
                   const uint32_t *idx, uint32_t count, uint32_t n, const ple_kact *a) {
    rows_of(out, dtype, codes, scales, stride, idx, count, n, a);
}

/* ple_argmax (ple.h) lives here for its Helium version. Elsewhere a max pass in eight independent lanes (vectorised
 * by x86 compilers: the 32k-entry head made the one-lane scan cost ~4% of a token), then a search for its first
 * occurrence. With Helium (float MVE) four lanes of VMAXNM, then a vector search; v[0] NaN returns 0 as the scan
 * does (VMAXNM would skip it), any other NaN is skipped by both. */
uint32_t ple_argmax(const float *v, uint32_t n) {
#if PLE_IKERNEL == PLE_KERNEL_HELIUM && (__ARM_FEATURE_MVE & 2)
    if (!(v[0] == v[0])) return 0;
    float32x4_t m = vdupq_n_f32(v[0]);
    uint32_t i = 0;
    for (; i + 4 <= n; i += 4) m = vmaxnmq_f32(m, vld1q_f32(v + i));
    float best = vmaxnmvq_f32(v[0], m);
    for (; i < n; i++) best = v[i] > best ? v[i] : best;
    for (i = 0; i + 4 <= n; i += 4)
        if (vcmpeqq_n_f32(vld1q_f32(v + i), best)) break;
    for (; i < n && !(v[i] == best); i++) continue;
    return i < n ? i : 0;
#else
    float mx[8], best;
    uint32_t i = 0;
    for (int l = 0; l < 8; l++) mx[l] = v[0];
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) mx[l] = v[i + l] > mx[l] ? v[i + l] : mx[l];
    best = mx[0];
    for (int l = 1; l < 8; l++) best = mx[l] > best ? mx[l] : best;
    for (; i < n; i++) best = v[i] > best ? v[i] : best;
    for (i = 0; i < n && !(v[i] == best); i++) continue;
    return i < n ? i : 0;
#endif
}
