/* ple_tanh.h: tanh for float in 32-bit integer arithmetic, the same bits on every target.
 *
 * SiLU and GELU call tanh ~1,200 times a token in a small model. On a core without a float unit (ESP32-C6/C3 class)
 * the C library's tanhf (via expm1f) is ~3,300 instructions of soft-float calls a call, a fifth of the token; with a
 * float unit it is a few hundred. This one works on the float's bits with 32x32->64 multiplies, which every target
 * core has in hardware (RV32 M, Armv7-M and later), and no division:
 *   |x| < 2^-13: tanh(x) = x (the next term, x^3 / 3, is below a quarter of an ulp);
 *   |x| < 0.625: tanh(a) = a * G(a^2), G a degree-6 polynomial (Chebyshev fit, Q1.30);
 *   |x| < 9: tanh(a) = 1 - 2E / (1 + E), E = exp(-2a) = 2^-n * 2^-f, 2^-f a degree-7 polynomial in f - 1/2, the
 *            reciprocal by a quadratic start and two Newton steps;
 *   otherwise +-1 (tanh(9) is within an ulp of 1), NaN stays NaN.
 * Every intermediate is kept to ~2^-28 absolute, so the result is within one ulp of the correctly rounded tanh:
 * pletanh.c checks it against the double-precision tanh rounded to float (`make pletanh && ./pletanh --stride 1`:
 * all 2^31 non-negative floats, at most 1 ulp apart, 691,020 of them 1 ulp, the rest equal, ~25 s on an x86 core;
 * tests/edge/test_c_tanh.py runs every 97th). Being integer arithmetic, it gives the same bits on x86, Cortex-M and
 * RISC-V, soft float or not. */
#ifndef PLE_TANH_H
#define PLE_TANH_H

#include <stdint.h>
#include <string.h>

/* acc * x / 2^32 for a signed Q1.30 accumulator and a signed Q0.32 (or smaller) argument: Horner's step. */
static inline int32_t ple_tanh_mulh(int32_t a, int32_t b) { return (int32_t)(((int64_t)a * (int64_t)b) >> 32); }

static inline int32_t ple_tanh_poly(const int32_t *c, int deg, int32_t x) {
    int32_t acc = c[deg];
    for (int k = deg - 1; k >= 0; k--) acc = c[k] + ple_tanh_mulh(acc, x);
    return acc;
}

static inline float ple_tanhf(float x) {
    /* tanh(sqrt(t)) / sqrt(t) on t in [0, 0.625^2], Q1.30 */
    static const int32_t G[7] = {1073741824, -357913902, 143163949, -57922557, 23290819, -8759428, 2284316};
    /* 2^-(f + 1/2) on f in [-1/2, 1/2], Q1.30 */
    static const int32_t X[8] = {759250125, -526272083, 182392009, -42141502, 7302487, -1012345, 117454, -11619};
    /* 1 / (1 + E) on E in [0, exp(-1.25)], Q1.30: the Newton steps' start, within 5e-4 */
    static const int32_t R[3] = {1073207427, -1039633339, 727139785};
    const uint32_t K = 3098164009u; /* 2 / ln 2, Q2.30 */
    uint32_t bits;
    memcpy(&bits, &x, 4);
    uint32_t sign = bits & 0x80000000u, ab = bits & 0x7fffffffu;
    if (ab < 0x39000000u) return x;                /* |x| < 2^-13, zeros and subnormals included */
    if (ab > 0x7f800000u) return x + x;            /* NaN */
    uint32_t out;
    if (ab >= 0x41100000u) {                       /* |x| >= 9, infinities included */
        out = 0x3f800000u;
    } else {
        int32_t e = (int32_t)(ab >> 23) - 127;
        uint32_t m = (ab & 0x7fffffu) | 0x800000u; /* |x| = m * 2^(e - 23) */
        if (ab < 0x3f200000u) {                    /* |x| < 0.625 */
            uint32_t a32 = e >= -9 ? m << (e + 9) : m >> (-9 - e);            /* |x|, Q0.32 */
            int32_t t = (int32_t)(((uint64_t)a32 * a32) >> 32);               /* x^2 < 0.4, Q0.32 */
            uint64_t p = (uint64_t)m * (uint32_t)ple_tanh_poly(G, 6, t);   /* m * G, 2^30 m at most */
            int hi = p >= (1ull << 53);                                       /* G > 1/2: one bit either way */
            unsigned sh = hi ? 30 : 29;
            uint32_t mant = (uint32_t)((p + (1ull << (sh - 1))) >> sh);
            out = ((uint32_t)(e - !hi + 127) << 23) + mant - 0x800000u;       /* a carry into 2^24 bumps the exponent */
        } else {
            uint64_t y = (uint64_t)(m << (e + 5)) * K;                       /* 2|x| / ln 2 = y / 2^58 */
            uint32_t n = (uint32_t)(y >> 58);                                 /* 1 .. 25 */
            int32_t f = (int32_t)((uint32_t)(y >> 26) ^ 0x80000000u);         /* frac - 1/2, Q0.32 */
            uint32_t q = (uint32_t)ple_tanh_poly(X, 7, f);                    /* 2^-frac, Q1.30 */
            uint32_t E = n >= 2 ? q >> (n - 2) : q << 1;                      /* exp(-2|x|) < 0.29, Q0.32 */
            uint32_t D = 0x80000000u + (E >> 1);                              /* 1 + E, Q1.31 */
            uint32_t r = (uint32_t)ple_tanh_poly(R, 2, (int32_t)E) << 1;      /* 1 / D, Q1.31 */
            for (int k = 0; k < 2; k++) {
                uint32_t dr = (uint32_t)(((uint64_t)D * r) >> 31);           /* D r ~ 1, Q1.31 */
                r = (uint32_t)(((uint64_t)r * (0u - dr)) >> 31);               /* r (2 - D r) */
            }
            uint32_t one_minus = 0u - (uint32_t)(((uint64_t)E * r) >> 30);    /* 1 - 2E / D, Q0.32, >= 0.55 */
            out = 0x3e800000u + ((one_minus >> 8) + ((one_minus >> 7) & 1u)); /* round; 2^24 becomes 1.0f */
        }
    }
    out |= sign;
    float y;
    memcpy(&y, &out, 4);
    return y;
}

#endif
