/* The float SIMD paths of the C runtime: dot products of float activations with fp32, int8 and int4 weights, the
 * products of the float path (`--act fp32`, the reference). The integer kernels of the int8 path are
 * ple_int_kernels.h; the model (ple_model.c) decides per matrix which rows go where.
 *
 * Why they look as they do: a decode step is a chain of matrix-vector products, dominated by the output head
 * (vocab x hidden). Each row is a sum over contiguous codes with one fp16 scale per group, so the scale is applied
 * once per group segment and the inner loops are vector reductions (see dot_f32). int4 codes pair with the even /
 * odd halves of x, split once per matrix-vector product, so the nibble loop stays contiguous too. fp32 matrices and
 * the int4 head go four rows per pass (rows4_*): each load of x serves four rows, and their four sums share one
 * horizontal reduction; per-row overhead, not arithmetic, was what kept a 96-wide head slow.
 *
 * Static inline, included by ple_model.c alone: each path is compiled into its caller's loop, where the compiler
 * specialises it (and fuses its multiply-adds) exactly as it would code written in place.
 */
#ifndef PLE_FLOAT_SIMD_H
#define PLE_FLOAT_SIMD_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#if defined(__AVX__) || defined(__F16C__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "ple_int_kernels.h" /* ple_f16, and ple.h's build switch PLE_KERNEL */

/* PLE_SCALAR: the plain C99 loops instead of the compilers' vector extensions. */
#if defined(PLE_KERNEL) && PLE_KERNEL == PLE_KERNEL_PORTABLE && !defined(PLE_SCALAR)
#define PLE_SCALAR /* PORTABLE: the float products are the plain C99 loops too */
#endif
/* Cortex-M: GCC lowers the eight-float vectors below to scalar code with extra moves (no float SIMD on the M7;
 * MVE's four lanes on the M55), and the plain loops take ~37% fewer instructions (benchmarks/bench_mcu.py,
 * esp32-28m fp32: 52.2 M -> 32.9 M per token on the M7, 48.9 M -> 31.1 M on the M55). -DPLE_KERNEL=PLE_KERNEL_VECTOR
 * keeps the vectors. */
#if ((defined(__ARM_ARCH_PROFILE) && __ARM_ARCH_PROFILE == 'M') || (defined(__riscv) && !defined(__riscv_vector))) && \
    !defined(PLE_SCALAR) && !(defined(PLE_KERNEL) && PLE_KERNEL == PLE_KERNEL_VECTOR)
#define PLE_SCALAR /* RISC-V without its vector extension: the same, no float SIMD to lower to */
#endif

/* The signed int4 code in the low (high = 0) or high nibble of b. */
static inline int nib(uint8_t b, int high) { return ((high ? b >> 4 : b & 15) ^ 8) - 8; }

/* Dot products. With GCC / clang (ESP-IDF's toolchains included) they use the compilers' vector extensions:
 * eight-float accumulators that stay in registers, so no -ffast-math is needed to vectorise a reduction and
 * short rows (96 values) pay no store-to-load stall when the lanes are summed. Other compilers get the
 * plain C99 loops. Define PLE_SCALAR to force those. */
static float dot_f32_scalar(const float *w, const float *x, size_t n) {
    float s = 0;
    for (size_t i = 0; i < n; i++) s += PLE_FMUL(w[i], x[i]);
    return s;
}

static float dot_i8_scalar(const int8_t *c, const float *x, size_t n) {
    float s = 0;
    for (size_t i = 0; i < n; i++) s += PLE_FMUL(PLE_I2F(c[i]), x[i]);
    return s;
}

/* n byte pairs: low nibble times xe[j], high nibble times xo[j]. */
static float dot_i4_scalar(const uint8_t *c, const float *xe, const float *xo, size_t n) {
    float s = 0;
    for (size_t j = 0; j < n; j++) s += (float)nib(c[j], 0) * xe[j] + (float)nib(c[j], 1) * xo[j];
    return s;
}

#if defined(__GNUC__) && !defined(PLE_SCALAR)
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi" /* static helpers only: no vector crosses an external ABI */
#endif
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

static inline v8f load8(const float *p) {
    v8f v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* Sum of the eight lanes; in registers with AVX (element access makes GCC spill the vector and reload). */
static inline float hsum(v8f v) {
#ifdef __AVX__
    __m256 w;
    memcpy(&w, &v, sizeof w);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(w), _mm256_extractf128_ps(w, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)));
#else
    return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
#endif
}

static inline float dot_f32(const float *w, const float *x, size_t n) {
    v8f a = {0}, b = {0};
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        a += load8(w + i) * load8(x + i);
        b += load8(w + i + 8) * load8(x + i + 8);
    }
    for (; i + 8 <= n; i += 8) a += load8(w + i) * load8(x + i);
    return hsum(a + b) + dot_f32_scalar(w + i, x + i, n - i);
}

/* Eight codes widened to eight int32 lanes (one vpmovzxbd / vpmovsxbd with AVX2; GCC's generic byte-vector
 * widening goes through scalar inserts). */
static inline v8i widen_u8(const uint8_t *p) {
#ifdef __AVX2__
    v8i v;
    __m256i w = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)p));
    memcpy(&v, &w, sizeof v);
    return v;
#else
    v8i v = {p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7]};
    return v;
#endif
}

static inline v8i widen_s8(const int8_t *p) {
#ifdef __AVX2__
    v8i v;
    __m256i w = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)p));
    memcpy(&v, &w, sizeof v);
    return v;
#else
    v8i v = {p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7]};
    return v;
#endif
}

static inline float dot_i8(const int8_t *c, const float *x, size_t n) {
    v8f a = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8) a += __builtin_convertvector(widen_s8(c + i), v8f) * load8(x + i);
    return hsum(a) + dot_i8_scalar(c + i, x + i, n - i);
}

static inline float dot_i4(const uint8_t *c, const float *xe, const float *xo, size_t n) {
    v8f a = {0}, b = {0}; /* low and high nibbles accumulate apart: two dependency chains */
    size_t j = 0;
    for (; j + 8 <= n; j += 8) {
        v8i q = widen_u8(c + j);
        v8i lo = ((q & 15) ^ 8) - 8, hi = ((q >> 4) ^ 8) - 8;
        a += __builtin_convertvector(lo, v8f) * load8(xe + j);
        b += __builtin_convertvector(hi, v8f) * load8(xo + j);
    }
    return hsum(a + b) + dot_i4_scalar(c + j, xe + j, xo + j, n - j);
}

/* As dot_i4 with the nibbles read as unsigned n ^ 8 = code + 8: the caller subtracts 8 * sum(x). Three
 * integer operations per eight bytes instead of six, for rows that span the whole x (the head). */
static inline float dot_i4_biased(const uint8_t *c, const float *xe, const float *xo, size_t n) {
    v8f a = {0}, b = {0};
    size_t j = 0;
    for (; j + 8 <= n; j += 8) {
        v8i q = widen_u8(c + j) ^ 0x88;
        a += __builtin_convertvector(q & 15, v8f) * load8(xe + j);
        b += __builtin_convertvector(q >> 4, v8f) * load8(xo + j);
    }
    float s = hsum(a + b);
    for (; j < n; j++) s += (float)((c[j] ^ 8) & 15) * xe[j] + (float)((c[j] ^ 0x80) >> 4) * xo[j];
    return s;
}

/* One int4 row of a grouped matrix (groups may straddle rows): values [e0, e0 + cols), e0 even. Each group's
 * segment accumulates in vector lanes scaled by its fp16 scale, so a row is reduced once, not per segment. */
static float row_i4(const uint8_t *c, const uint8_t *sc, uint64_t e0, uint32_t cols, uint32_t group, const float *x,
                    const float *xe, const float *xo) {
    v8f acc = {0};
    float rest = 0;
    uint64_t g = ple_group_of(e0, group);
    for (uint64_t a = e0, end = e0 + cols; a < end; g++) {
        uint64_t b = (g + 1) * group < end ? (g + 1) * group : end, n = a & 1 ? 0 : (b - a) / 16 * 8; /* bytes */
        const uint8_t *cp = c + a / 2;
        const float *pe = xe + (a - e0) / 2, *po = xo + (a - e0) / 2;
        float s = ple_f16(sc + 2 * g);
        v8f lo = {0}, hi = {0};
        for (uint64_t j = 0; j < n; j += 8) {
            v8i q = widen_u8(cp + j) ^ 0x88;
            lo += __builtin_convertvector((q & 15) - 8, v8f) * load8(pe + j);
            hi += __builtin_convertvector((q >> 4) - 8, v8f) * load8(po + j);
        }
        acc += s * (lo + hi);
        for (a += 2 * n; a < b; a++) rest += s * ((float)nib(c[a / 2], (int)(a & 1)) * x[a - e0]);
    }
    return hsum(acc) + rest;
}
#else
#define dot_f32 dot_f32_scalar
#define dot_i8 dot_i8_scalar
#define dot_i4 dot_i4_scalar
static float dot_i4_biased(const uint8_t *c, const float *xe, const float *xo, size_t n) {
    float s = 0;
    for (size_t j = 0; j < n; j++) s += (float)((c[j] ^ 8) & 15) * xe[j] + (float)((c[j] ^ 0x80) >> 4) * xo[j];
    return s;
}
#endif

/* rows4_*: rows r .. r + 3 of a matrix whose rows lie `stride` bytes apart (a dense matrix, or the tied head's
 * records) times x, each row fp32 or one int4 group; the four rows share each load of x and one reduction. */
#if defined(__GNUC__) && !defined(PLE_SCALAR)
/* The lane sums of four vectors into out[0..3]. */
static inline void hsum4(v8f a, v8f b, v8f c, v8f d, float *out) {
#ifdef __AVX__
    __m256 A, B, C, D;
    memcpy(&A, &a, sizeof A);
    memcpy(&B, &b, sizeof B);
    memcpy(&C, &c, sizeof C);
    memcpy(&D, &d, sizeof D);
    __m256 s = _mm256_hadd_ps(_mm256_hadd_ps(A, B), _mm256_hadd_ps(C, D)); /* lanes: a b c d | a b c d */
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1)));
#else
    out[0] = hsum(a), out[1] = hsum(b), out[2] = hsum(c), out[3] = hsum(d);
#endif
}

static void rows4_f32(const uint8_t *c, size_t stride, const float *x, size_t n, float *out) {
    const float *w0 = (const float *)(const void *)c, *w1 = (const float *)(const void *)(c + stride),
                *w2 = (const float *)(const void *)(c + 2 * stride), *w3 = (const float *)(const void *)(c + 3 * stride);
    v8f a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, b0 = {0}, b1 = {0}, b2 = {0}, b3 = {0};
    size_t i = 0;
    for (; i + 16 <= n; i += 16) { /* two accumulators per row: the FMA latency chains stay short */
        v8f xa = load8(x + i), xb = load8(x + i + 8);
        /* the pass after next: +5-10% on an fp32 head streamed from memory (a prefetch never faults, so
         * running past the last row is harmless) */
        for (int r = 0; r < 4; r++) __builtin_prefetch(c + (8 + r) * stride + 4 * i);
        a0 += load8(w0 + i) * xa, b0 += load8(w0 + i + 8) * xb;
        a1 += load8(w1 + i) * xa, b1 += load8(w1 + i + 8) * xb;
        a2 += load8(w2 + i) * xa, b2 += load8(w2 + i + 8) * xb;
        a3 += load8(w3 + i) * xa, b3 += load8(w3 + i + 8) * xb;
    }
    for (; i + 8 <= n; i += 8) {
        v8f xa = load8(x + i);
        a0 += load8(w0 + i) * xa, a1 += load8(w1 + i) * xa, a2 += load8(w2 + i) * xa, a3 += load8(w3 + i) * xa;
    }
    hsum4(a0 + b0, a1 + b1, a2 + b2, a3 + b3, out);
    out[0] += dot_f32_scalar(w0 + i, x + i, n - i), out[1] += dot_f32_scalar(w1 + i, x + i, n - i);
    out[2] += dot_f32_scalar(w2 + i, x + i, n - i), out[3] += dot_f32_scalar(w3 + i, x + i, n - i);
}

/* The int4 head pass is bound by widening and converting codes, so it takes the widest vectors there are:
 * sixteen lanes with AVX-512 (+11-14% tok/s over eight), else eight (sixteen would not fit eight
 * accumulators in sixteen AVX2 registers). */
#ifdef __AVX512F__
#define HEAD_LANES 16
#else
#define HEAD_LANES 8
#endif
typedef float vhf __attribute__((vector_size(4 * HEAD_LANES)));
typedef int32_t vhi __attribute__((vector_size(4 * HEAD_LANES)));

static inline vhf load_h(const float *p) {
    vhf v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* HEAD_LANES codes, as code + 8 (nibble pairs read with n ^ 8), in int32 lanes. */
static inline vhi widen_h(const uint8_t *p) {
#if HEAD_LANES == 16
    vhi v;
    __m512i w = _mm512_xor_si512(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)p)),
                                 _mm512_set1_epi32(0x88));
    memcpy(&v, &w, sizeof v);
    return v;
#else
    return widen_u8(p) ^ 0x88;
#endif
}

/* v as eight lanes with the same total. */
static inline v8f fold8(vhf v) {
#if HEAD_LANES == 16
    v8f a, b;
    memcpy(&a, &v, sizeof a);
    memcpy(&b, (const char *)&v + sizeof a, sizeof b);
    return a + b;
#else
    return v;
#endif
}

/* int4: as dot_i4_biased (codes read as code + 8, the caller subtracts 8 * sum(x)); n bytes per row. */
static void rows4_i4(const uint8_t *c, size_t stride, const float *xe, const float *xo, size_t n, float *out) {
    const uint8_t *c0 = c, *c1 = c + stride, *c2 = c + 2 * stride, *c3 = c + 3 * stride;
    vhf a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, b0 = {0}, b1 = {0}, b2 = {0}, b3 = {0};
    size_t j = 0;
    for (; j + HEAD_LANES <= n; j += HEAD_LANES) {
        vhf e = load_h(xe + j), o = load_h(xo + j);
        vhi q0 = widen_h(c0 + j), q1 = widen_h(c1 + j), q2 = widen_h(c2 + j), q3 = widen_h(c3 + j);
        a0 += __builtin_convertvector(q0 & 15, vhf) * e, b0 += __builtin_convertvector(q0 >> 4, vhf) * o;
        a1 += __builtin_convertvector(q1 & 15, vhf) * e, b1 += __builtin_convertvector(q1 >> 4, vhf) * o;
        a2 += __builtin_convertvector(q2 & 15, vhf) * e, b2 += __builtin_convertvector(q2 >> 4, vhf) * o;
        a3 += __builtin_convertvector(q3 & 15, vhf) * e, b3 += __builtin_convertvector(q3 >> 4, vhf) * o;
    }
    hsum4(fold8(a0 + b0), fold8(a1 + b1), fold8(a2 + b2), fold8(a3 + b3), out);
    for (int r = 0; r < 4; r++)
        for (size_t k = j; k < n; k++) {
            uint8_t b = c[r * stride + k];
            out[r] += (float)((b ^ 8) & 15) * xe[k] + (float)((b ^ 0x80) >> 4) * xo[k];
        }
}
#else
static void rows4_f32(const uint8_t *c, size_t stride, const float *x, size_t n, float *out) {
    for (int r = 0; r < 4; r++) out[r] = dot_f32((const float *)(const void *)(c + r * stride), x, n);
}

static void rows4_i4(const uint8_t *c, size_t stride, const float *xe, const float *xo, size_t n, float *out) {
    for (int r = 0; r < 4; r++) out[r] = dot_i4_biased(c + r * stride, xe, xo, n);
}
#endif

#endif
