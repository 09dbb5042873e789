/* Row-wise softmax cross-entropy and its logit gradient, in place, at vector speed (plelab/model/softmax_xent.py).
 *
 * For each row r of `x` (rows x V floats, row stride ld) with target t = targets[r]:
 *     nll[r] = logsumexp(x_r) - x_r[t]                      (fp32, from the row max: no underflow)
 *     x_r    = softmax(x_r) - onehot(t)                      (rounded to bf16 values when round_bf16)
 * and a row whose target is `ignore` becomes zeros with nll 0. A row holding NaN or inf gives nll NaN and a
 * NaN gradient row (so a training loop sees a non-finite loss, as it would from torch's softmax).
 *
 * Three passes over a row (max, exp + sum, scale), each over data already in L1/L2 after the first. exp is a
 * Cody-Waite reduction with a degree-6 polynomial (relative error ~2e-7, as good as fp32 libm), written with
 * GCC/clang vector extensions so one source compiles to AVX-512, AVX2 or NEON at -march=native.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__AVX512F__)
#define W 16
#elif defined(__AVX__)
#define W 8
#else
#define W 4
#endif

typedef float vf __attribute__((vector_size(W * 4)));
typedef int32_t vi __attribute__((vector_size(W * 4)));
typedef uint32_t vu __attribute__((vector_size(W * 4)));

static inline vf splat(float a) {
    vf v;
    for (int i = 0; i < W; i++) v[i] = a;
    return v;
}

static inline vf load(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void store(float *p, vf v) { memcpy(p, &v, sizeof v); }

static inline vf vmax(vf a, vf b) {
    vi m = a > b;
    return (vf)(((vi)a & m) | ((vi)b & ~m));
}

/* exp(x) for x <= 0; below -87 (where expf leaves the normal range) it returns exp(-87) ~ 1.6e-38. */
static inline vf vexp_neg(vf x) {
    x = vmax(x, splat(-87.0f));
    vf z = x * splat(1.44269504088896341f) + splat(12582912.0f); /* + 1.5 * 2^23 rounds x / ln2 to an integer n */
    vu n_bits = (vu)z;
    vf n = z - splat(12582912.0f);
    vf r = x - n * splat(0.693359375f); /* x - n ln2 in two steps (ln2 = hi + lo) */
    r = r - n * splat(-2.12194440e-4f);
    vf p = splat(1.9875691500e-4f);
    p = p * r + splat(1.3981999507e-3f);
    p = p * r + splat(8.3334519073e-3f);
    p = p * r + splat(4.1665795894e-2f);
    p = p * r + splat(1.6666665459e-1f);
    p = p * r + splat(5.0000001201e-1f);
    p = p * r * r + r + splat(1.0f);
    vu scale = (n_bits - 0x4B400000u + 127u) << 23; /* 2^n */
    return p * (vf)scale;
}

/* Nearest bf16 value (ties to even), as torch's float -> bfloat16 conversion rounds (finite inputs). */
static inline vf vround_bf16(vf x) {
    vu u = (vu)x;
    u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
    return (vf)u;
}

static inline float round_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
    memcpy(&x, &u, 4);
    return x;
}

static inline float exp_neg(float x) { return vexp_neg(splat(x))[0]; }

static void one_row(float *row, int64_t V, int64_t t, float *nll, int round) {
    int64_t Vv = V - V % W, i;
    float xt = row[t];
    /* max, and a NaN detector: v - v is 0 for finite v, NaN for NaN and inf */
    vf vm = splat(-INFINITY), bad = splat(0.0f);
    for (i = 0; i < Vv; i += W) {
        vf v = load(row + i);
        vm = vmax(v, vm);
        bad += v - v;
    }
    float m = -INFINITY, nonfinite = 0.0f;
    for (int k = 0; k < W; k++) {
        m = vm[k] > m ? vm[k] : m;
        nonfinite += bad[k];
    }
    for (; i < V; i++) {
        m = row[i] > m ? row[i] : m;
        nonfinite += row[i] - row[i];
    }
    if (nonfinite != 0.0f) { /* NaN != 0 */
        for (i = 0; i < V; i++) row[i] = NAN;
        *nll = NAN;
        return;
    }
    vf vs = splat(0.0f), vmv = splat(m);
    for (i = 0; i < Vv; i += W) {
        vf e = vexp_neg(load(row + i) - vmv);
        vs += e;
        store(row + i, e);
    }
    float s = 0.0f;
    for (int k = 0; k < W; k++) s += vs[k];
    for (; i < V; i++) {
        row[i] = exp_neg(row[i] - m);
        s += row[i];
    }
    float inv = 1.0f / s, et = row[t];
    vf vinv = splat(inv);
    if (round) {
        for (i = 0; i < Vv; i += W) store(row + i, vround_bf16(load(row + i) * vinv));
        for (; i < V; i++) row[i] = round_bf16(row[i] * inv);
        row[t] = round_bf16(et * inv - 1.0f);
    } else {
        for (i = 0; i < Vv; i += W) store(row + i, load(row + i) * vinv);
        for (; i < V; i++) row[i] = row[i] * inv;
        row[t] = et * inv - 1.0f;
    }
    *nll = (m - xt) + logf(s);
}

/* Returns 0, or -1 when a target lies outside [0, V) and is not `ignore` (nothing after that row is done). */
int ple_softmax_xent(float *x, int64_t rows, int64_t V, int64_t ld, const int64_t *targets, int64_t ignore,
                     float *nll, int round_bf16_values) {
    for (int64_t r = 0; r < rows; r++) {
        float *row = x + r * ld;
        int64_t t = targets[r];
        if (t == ignore) {
            memset(row, 0, (size_t)V * sizeof(float));
            nll[r] = 0.0f;
            continue;
        }
        if (t < 0 || t >= V) return -1;
        one_row(row, V, t, nll + r, round_bf16_values);
    }
    return 0;
}
