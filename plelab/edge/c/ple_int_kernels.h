/* Integer matrix-vector kernels for microcontrollers: int8 activations times int4 / int8 group-quantised weights.
 *
 * An activation vector x is quantised on the fly to int8 codes a with one float scale (x ~= a * scale). A weight
 * vector is stored as the .ple format keeps it (docs/ple-format.md): int8 codes, or int4 codes two per byte (element
 * 2i in the low nibble), one fp16 scale per `group` consecutive values, groups counted from the vector's start (a
 * dense matrix is one vector, so its groups may straddle rows). A dot product accumulates each group segment in
 * int32 (exact) and spends one float multiply-add per segment: sum += (float)isum * scale_g; the result is
 * sum * a.scale.
 *
 * One interface, three implementations chosen at compile time by ple.h's kernel switch, -DPLE_KERNEL=...:
 *   PLE_KERNEL_PORTABLE, PLE_KERNEL_VECTOR   plain C99 (the fallback on any target; x86 uses it)
 *   PLE_KERNEL_DSP       Arm DSP extension (Cortex-M4 / M7 / M33): SXTB16 unpacking, SMLAD dual 16-bit MACs
 *   PLE_KERNEL_HELIUM    Arm Helium / MVE (Cortex-M55 / M85): 16 int8 lanes, VMLADAVA
 * Without -DPLE_KERNEL the best the target has (__ARM_FEATURE_MVE, else __ARM_FEATURE_DSP, else portable); a
 * kernel the target cannot run is a compile error. ple_kernel_name() says which one was built.
 *
 * Where another SIMD slots in (an ESP32-S3 PIE kernel, say): an implementation is three functions in
 * ple_int_kernels.c: kact_layout (re-lay the int8 codes for its loads, once per activation and weight dtype), kseg_i4
 * and kseg_i8 (the exact int32 sum of one aligned run inside a group segment), plus its ALIGN_I4 / ALIGN_I8.
 * Add a block beside the DSP and Helium ones under a new PLE_KERNEL_ value; the driver (rows, groups, unaligned
 * heads and tails, scales, the float multiply-add per group) stays shared, so every kernel must equal the
 * portable one bit for bit, which plektest (tests/edge/test_c_mcu_kernels.py) checks on odd sizes.
 */
#ifndef PLE_KERNELS_H
#define PLE_KERNELS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "ple.h"

/* PLE_IKERNEL: the integer kernel built (PLE_KERNEL, or the target's best when it is not given) */
#if defined(PLE_KERNEL)
#define PLE_IKERNEL PLE_KERNEL
#elif defined(__ARM_FEATURE_MVE) && (__ARM_FEATURE_MVE & 1)
#define PLE_IKERNEL PLE_KERNEL_HELIUM
#elif defined(__ARM_FEATURE_DSP) && __ARM_FEATURE_DSP
#define PLE_IKERNEL PLE_KERNEL_DSP
#elif defined(__riscv) && defined(__riscv_mul) && __riscv_xlen == 32
#define PLE_IKERNEL PLE_KERNEL_RV32
#elif defined(__GNUC__)
#define PLE_IKERNEL PLE_KERNEL_VECTOR
#else
#define PLE_IKERNEL PLE_KERNEL_PORTABLE
#endif
#if PLE_IKERNEL == PLE_KERNEL_DSP && !(defined(__ARM_FEATURE_DSP) && __ARM_FEATURE_DSP)
#error "PLE_KERNEL_DSP needs a target with the Arm DSP extension (e.g. -mcpu=cortex-m7)"
#endif
#if PLE_IKERNEL == PLE_KERNEL_HELIUM && !(defined(__ARM_FEATURE_MVE) && (__ARM_FEATURE_MVE & 1))
#error "PLE_KERNEL_HELIUM needs a target with Helium (e.g. -mcpu=cortex-m55)"
#endif
#if PLE_IKERNEL == PLE_KERNEL_RV32 && !(defined(__riscv) && defined(__riscv_mul) && __riscv_xlen == 32)
#error "PLE_KERNEL_RV32 needs a 32-bit RISC-V target with the M extension (e.g. -march=rv32imac)"
#endif
#if PLE_IKERNEL < PLE_KERNEL_PORTABLE || PLE_IKERNEL > PLE_KERNEL_RV32
#error "PLE_KERNEL must be one of PLE_KERNEL_PORTABLE, _VECTOR, _DSP, _HELIUM, _RV32 (ple.h)"
#endif

/* Longest run one int32 accumulator takes: |code| <= 127 times |weight| <= 127 (x16 in the DSP int4 unpacking)
 * stays below 2^31 for this many values; longer group segments are summed in chunks (in int64). */
#define PLE_KCHUNK 4096

/* The fp16 value at p (little-endian), exactly: one instruction with F16C (x86) or an Arm FPU's half-precision
 * conversion (-mfp16-format=ieee), else bit manipulation. */
static inline float ple_f16(const uint8_t *p) {
#if defined(__F16C__)
    return _cvtsh_ss((unsigned short)(p[0] | p[1] << 8));
#elif defined(__ARM_FP16_FORMAT_IEEE) && defined(__ARM_FP) && (__ARM_FP & 2)
    __fp16 h;
    memcpy(&h, p, 2);
    return (float)h;
#elif defined(__riscv) && defined(__riscv_flen)
    /* RISC-V F computes subnormals and never flushes them: the fp16 bits placed in a float's (exponent 112 short,
     * subnormals included) times 2^112 is the value exactly, with no branch for the common cases */
    uint32_t h = p[0] | (uint32_t)p[1] << 8, em = h & 0x7fffu, u = (h & 0x8000u) << 16;
    float f;
    if (em >= 0x7c00u) { /* infinity or NaN */
        u |= 0x7f800000u | (em & 0x3ffu) << 13;
        memcpy(&f, &u, 4);
        return f;
    }
    u |= em << 13;
    memcpy(&f, &u, 4);
    return f * 0x1p112f;
#else
    uint32_t h = p[0] | (uint32_t)p[1] << 8, em = h & 0x7fffu, u; /* em: exponent and mantissa */
    float f;
    if (em - 0x0400u < 0x7800u) { /* normal (exponent 1..30, the common case first): rebias the exponent by 112 */
        u = (em << 13) + 0x38000000u;
    } else if (em < 0x0400u) { /* zero or subnormal: em * 2^-24, exact */
        f = (float)em * (1.0f / 16777216.0f);
        memcpy(&u, &f, 4);
    } else { /* infinity or NaN */
        u = 0x7f800000u | (em & 0x3ffu) << 13;
    }
    u |= (h & 0x8000u) << 16;
    memcpy(&f, &u, 4);
    return f;
#endif
}

/* Cores without a float unit (RISC-V without F: the ESP32-C6 class; Arm soft-float): the two float operations every
 * integer product ends in, (float)isum * fp16 scale and then * the activation's scale, done in integers and rounded
 * exactly as IEEE single precision rounds them (to nearest, ties to even), so every build gives the same bits.
 * libgcc's generic __mulsf3 takes about 100 instructions a call and __floatsisf 40, and the head makes two and one a
 * row; these take about 35 and 30 for the numbers the products meet, and hand anything else (zeros, subnormals,
 * infinities, NaN, sums of 2^17 or more) to the compiler's own. The model's own hot products (norms, activations,
 * attention) use PLE_FMUL and PLE_I2F too. PLE_SCALED / PLE_FMUL / PLE_I2F are plain float arithmetic elsewhere, so
 * builds with an FPU keep their fused multiply-adds. */
#if (defined(__riscv) && !defined(__riscv_flen)) || defined(__SOFTFP__)
#define PLE_SOFT_FLOAT 1
static inline uint32_t ple_fbits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float ple_bitsf(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* The position of x's highest set bit (x > 0). */
static inline int ple_log2(uint32_t x) {
    int n = 0;
    if (x >> 16) x >>= 16, n = 16;
    if (x >> 8) x >>= 8, n += 8;
    if (x >> 4) x >>= 4, n += 4;
    if (x >> 2) x >>= 2, n += 2;
    return n + (int)(x >> 1);
}

/* m >> sh rounded to nearest, ties to even (1 <= sh < 32). */
static inline uint32_t ple_round_shift(uint32_t m, unsigned sh) {
    uint32_t q = m >> sh, rem = m & ((1u << sh) - 1), half = 1u << (sh - 1);
    return q + (rem > half || (rem == half && (q & 1)));
}

/* isum * the fp16 h, for 0 < |isum| = av < 2^17 and a normal h: the exact product (under 2^28) rounded once, as its
 * 24-bit mantissa; *exp its biased float exponent (always a normal float: 113 <= *exp <= 160). */
static inline uint32_t ple_scaled_mant(uint32_t av, uint32_t h, int *exp) {
    uint32_t prod = av * ((h & 0x3ffu) | 0x400u), mant; /* the value is prod * 2^(e - 25) */
    int top = ple_log2(prod);
    *exp = top + (int)((h >> 10) & 31) - 25 + 127;
    if (top > 23) {
        mant = ple_round_shift(prod, (unsigned)(top - 23));
        if (mant >> 24) mant >>= 1, ++*exp;
    } else {
        mant = prod << (23 - top);
    }
    return mant;
}

/* (float)isum * (the fp16 at p), for |isum| < 2^17 and a normal scale. */
static inline float ple_scaled(int32_t isum, const uint8_t *p) {
    uint32_t h = p[0] | (uint32_t)p[1] << 8, e = (h >> 10) & 31, av = isum < 0 ? 0u - (uint32_t)isum : (uint32_t)isum;
    if (e == 0 || e == 31 || av == 0 || av >= (1u << 17)) return (float)isum * ple_f16(p);
    int exp;
    uint32_t mant = ple_scaled_mant(av, h, &exp), sign = ((uint32_t)isum ^ h << 16) & 0x80000000u; /* either's */
    return ple_bitsf(sign | (uint32_t)exp << 23 | (mant & 0x7fffffu));
}

/* The product of two 24-bit mantissas rounded to 24 bits (nearest, ties to even); *exp goes up by one when it
 * carries past them (the caller's exponent is the product's for a product below 2^47). */
static inline uint32_t ple_mul_mant(uint32_t ma, uint32_t mb, int *exp) {
    uint64_t p = (uint64_t)ma * mb; /* in [2^46, 2^48) */
    uint32_t hi = (uint32_t)(p >> 23), lo = (uint32_t)p & 0x7fffffu, mant; /* hi: 24 or 25 bits */
    if (hi >> 24) { /* p >= 2^47: one more bit to round away */
        lo |= (hi & 1u) << 23, hi >>= 1, ++*exp;
        mant = hi + ((lo > 0x800000u || (lo == 0x800000u && (hi & 1))) ? 1u : 0u);
    } else {
        mant = hi + ((lo > 0x400000u || (lo == 0x400000u && (hi & 1))) ? 1u : 0u);
    }
    if (mant >> 24) mant >>= 1, ++*exp;
    return mant;
}

/* a * b for normal a and b with a normal product; anything else the compiler's. */
static inline float ple_fmul(float a, float b) {
    uint32_t x = ple_fbits(a), y = ple_fbits(b), ex = (x >> 23) & 255, ey = (y >> 23) & 255;
    if (ex - 1u >= 254u || ey - 1u >= 254u) return a * b;
    int exp = (int)(ex + ey) - 127;
    uint32_t mant = ple_mul_mant((x & 0x7fffffu) | 0x800000u, (y & 0x7fffffu) | 0x800000u, &exp);
    if (exp <= 0 || exp >= 255) return a * b; /* overflow or underflow: the compiler's rounding, its infinities */
    return ple_bitsf(((x ^ y) & 0x80000000u) | (uint32_t)exp << 23 | (mant & 0x7fffffu));
}

/* (float)v for |v| < 2^24 (exact): the bits put together, without __floatsisf's call. */
static inline float ple_i2f(int32_t v) {
    if (!v) return 0.0f;
    uint32_t av = v < 0 ? 0u - (uint32_t)v : (uint32_t)v;
    int top = ple_log2(av);
    return ple_bitsf((v < 0 ? 0x80000000u : 0u) | (uint32_t)(top + 127) << 23 | ((av << (23 - top)) & 0x7fffffu));
}

/* 0.0f + v without the float add: v, but +0 for -0 (and the add itself for infinities and NaN). */
static inline float ple_add0(float v) {
    uint32_t u = ple_fbits(v);
    return (u << 1) == 0 || (u & 0x7f800000u) == 0x7f800000u ? 0.0f + v : v;
}

/* ple_fmul(ple_scaled(isum, p), xs), the first product kept as its mantissa and exponent (a head row's result: no
 * float packed only to be taken apart again). */
static inline __attribute__((always_inline)) float ple_scaled_x(int32_t isum, const uint8_t *p, float xs) {
    uint32_t h = p[0] | (uint32_t)p[1] << 8, e = (h >> 10) & 31, av = isum < 0 ? 0u - (uint32_t)isum : (uint32_t)isum;
    uint32_t y = ple_fbits(xs), ey = (y >> 23) & 255;
    if (e == 0 || e == 31 || av == 0 || av >= (1u << 17) || ey - 1u >= 254u) return ple_fmul(ple_scaled(isum, p), xs);
    int exp;
    uint32_t m1 = ple_scaled_mant(av, h, &exp);
    exp += (int)ey - 127;
    uint32_t mant = ple_mul_mant(m1, (y & 0x7fffffu) | 0x800000u, &exp);
    if (exp <= 0 || exp >= 255) return ple_fmul(ple_scaled(isum, p), xs);
    return ple_bitsf((((uint32_t)isum ^ h << 16 ^ y) & 0x80000000u) | (uint32_t)exp << 23 | (mant & 0x7fffffu));
}
#define PLE_SCALED(isum, p) ple_scaled(isum, p)
#define PLE_FMUL(a, b) ple_fmul(a, b)
#define PLE_SCALED_X(isum, p, xs) ple_scaled_x(isum, p, xs)
#define PLE_I2F(v) ple_i2f(v)
#else
#define PLE_SCALED(isum, p) ((float)(isum) * ple_f16(p))
#define PLE_FMUL(a, b) ((a) * (b))
#define PLE_I2F(v) ((float)(v)) /* v: |v| < 2^24 */
/* A row of one group: (float)isum * its fp16 scale * the activation's scale xs, each product rounded. */
#define PLE_SCALED_X(isum, p, xs) PLE_FMUL(PLE_SCALED(isum, p), xs)
#endif

/* The group of value e: e / group, in 32 bits whenever e fits them. A 64-bit division is a library call on a 32-bit
 * core (__udivdi3: hundreds of instructions), and no model a microcontroller holds has offsets past 2^32. */
static inline uint64_t ple_group_of(uint64_t e, uint32_t group) {
    return e <= UINT32_MAX ? (uint32_t)e / group : e / group;
}

/* A quantised activation vector. Its memory (ple_kact_bytes(cap)) comes from the caller's arena. */
typedef struct {
    uint32_t n, cap;
    float scale;      /* x[i] ~= q[i] * scale; 0 when x is all zeros */
    int8_t *q;        /* codes in [-127, 127]; zero from n up to the padded capacity */
    void *lay;        /* the kernel's own layouts of q (DSP: int16 pairs; MVE: even / odd halves) */
    unsigned ready;   /* layouts built for the current codes (bit per weight dtype) */
} ple_kact;

const char *ple_kernel_name(void);
/* Bytes of arena one activation of up to cap values needs (codes + the kernel's layouts, 16-byte aligned). */
size_t ple_kact_bytes(uint32_t cap);
/* Point a at mem (ple_kact_bytes(cap) bytes, 16-byte aligned). */
void ple_kact_init(ple_kact *a, void *mem, uint32_t cap);
/* q[0..n) = int8 codes of x, returned: the scale (x ~= q * scale). scale = max|x| / 127 and q[i] = x[i] * (127 /
 * max|x|) (a float product, never fused with the rounding) rounded half away from zero; a vector of zeros, or one
 * that is not finite, gets zero codes and scale 0. plelab/edge/runtime.py's quantize_i8 is the same function. */
float ple_quantize_i8(const float *x, uint32_t n, int8_t *q);
/* a = the int8 codes of x[0..n) (ple_quantize_i8). */
void ple_kact_quantize(ple_kact *a, const float *x, uint32_t n);
/* Build the layout the kernel needs for weights of `dtype` (PLE_INT4 / PLE_INT8); call before ple_kdot, once per
 * quantisation and dtype (ple_kdot only reads a, so rows may run on several threads after this). */
void ple_kact_prepare(ple_kact *a, int dtype);
/* Values [e0, e0 + n) of one group-quantised vector (int4 / int8 `codes`, fp16 `scales`, `group` values per scale)
 * times a.q[0..n), times the scales: the float dot product. */
float ple_kdot(int dtype, const uint8_t *codes, const uint8_t *scales, uint32_t group, uint64_t e0, uint32_t n,
               const ple_kact *a);
/* out[r - r0] = ple_kdot of row r of a dense (rows x cols) matrix stored as one vector, for r in [r0, r1): the
 * same result, without a division per row. */
void ple_kdot_dense(float *out, int dtype, const uint8_t *codes, const uint8_t *scales, uint32_t group, uint32_t r0,
                    uint32_t r1, uint32_t cols, const ple_kact *a);
/* out[r] = ple_kdot of `rows` vectors of n <= group values each (one scale), the r-th at codes + r * stride with its
 * scale at scales + r * stride: a tied head's records, without the per-row group walk. plain_scales: 1 only when
 * ple_scales_plain holds for these records (checked once, at open), which spares a kernel a test per row; 0 is
 * always right. */
void ple_kdot_rows(float *out, int dtype, const uint8_t *codes, const uint8_t *scales, size_t stride, uint32_t rows,
                   uint32_t n, int plain_scales, const ple_kact *a);
/* out[k] = ple_kdot_rows' result for row idx[k], k < count (the greedy head's blocks of sorted rows). */
void ple_kdot_pick(float *out, int dtype, const uint8_t *codes, const uint8_t *scales, size_t stride,
                   const uint32_t *idx, uint32_t count, uint32_t n, int plain_scales, const ple_kact *a);
/* 1 when each of `rows` fp16 scales, `stride` bytes apart, is a normal number or +-0 (no subnormal, infinity or
 * NaN). */
int ple_scales_plain(const uint8_t *scales, size_t stride, uint32_t rows);

#endif
