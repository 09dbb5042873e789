/* The PLE forward pass over a .ple file: the same computation as plelab/edge/runtime.py (docs/ple-format.md
 * section 7), weights used as stored (fp32 / fp16 / int8 / int4, 1-bit MGLU masks), one arena. Every FFN kind of
 * the format runs: SwiGLU, MGLU (masks applied bit by bit), low-rank, and MoE (only the routed experts read).
 *
 * Each matrix-vector product goes to the float SIMD paths (ple_float_simd.h) or, with int8 activations, to the
 * integer kernels (ple_int_kernels.h); this file decides which rows go where and owns everything else: the
 * arena, placement and traffic, attention, the FFN kinds, PLE, the greedy head.
 */
#include "ple.h"
#include "ple_float_simd.h"
#include "ple_int_kernels.h"
#include "ple_tanh.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#ifdef __linux__
#include <sys/mman.h>
#endif

#define ALIGN 64
#define N_SCRATCH 22 /* float buffers of maxdim values in the arena (ple_open's bufs) */
#define PAR_MIN_WORK (1 << 18) /* multiply-adds below which a product stays on one thread (fork/join costs) */
#define KROWS 256 /* rows an integer product hands its kernel at once (and a thread's share at least) */
#define HEAD_BLOCK 16 /* head rows the greedy head skip decides on at once (ple_forward_greedy) */

typedef struct {
    uint8_t dtype;
    uint32_t group, rows, cols;
    const uint8_t *codes, *scales; /* dense: the one vector of the tensor; table: record 0 + part offsets */
    const ple_table *table;        /* non-NULL: each row is its own record (the tied head) */
    int present;
    uint32_t tensor; /* index in the tensor directory (bound tensors): where a routed read is tallied */
    int plain_scales; /* a table's records: every scale normal or zero (ple_scales_plain, checked at open) */
} qmat;

typedef struct {
    qmat in_norm, post_norm, q, k, v, o, gate, up, down, w, mask, ga, gb, ua, ub, ple_gate, ple_proj, ple_norm;
    qmat router, shared[3]; /* MoE: router (E x H), shared expert gate, up, down */
    qmat *experts;          /* MoE: 3 per expert (gate, up, down), E experts */
    int slot; /* index into the PLE layers, -1 when this layer gets none */
} layer_w;

typedef struct { char name[72]; uint64_t stored, per_token, reads; int resident, tier; double density; } item;

struct ple_model {
    ple_desc d;
    ple_storage *st;
    ple_options opt;
    layer_w *L;
    qmat *expert_mats; /* every layer's experts, one allocation */
    int *tensor_tier;  /* tier of each tensor: routed expert reads are tallied there as they happen */
    qmat final_norm, head, ctx_proj, ctx_norm;
    const ple_table *ple_t, *embed_t;
    const ple_part *ple_p, *embed_in_ple, *embed_p;
    int head_tier, ple_tier, embed_tier, kv_tier, id_map_tier;
    /* the PLE records a position reads (ple_reads of them: 1, or an n-gram index's S) and their rows; an n-gram
     * index's multipliers (PLE_NGRAM_MAX_ORDER a head), the ids hashed at the last positions (a ring indexed by
     * position) and its id map's section (NULL: ids hashed as they are) */
    uint32_t ple_reads;
    uint64_t *ple_rows;
    uint32_t *hash_mult, hashed[PLE_NGRAM_MAX_ORDER];
    const ple_section *id_map;
    uint8_t *arena_raw, *arena, *rec_ple, *rec_embed;
    uint8_t *cursor[PLE_MAX_TIERS]; /* next free byte of each tier's region (of the one arena: cursor[0]) */
    int work_tier;                  /* where the working buffers are */
    uint64_t arena_bytes, weight_bytes, kv_bytes, peak;
    uint64_t placed[PLE_MAX_TIERS], tier_arena[PLE_MAX_TIERS]; /* see ple_tier_use */
    uint64_t kv_arena;       /* arena bytes of the KV cache (its parts 64-byte aligned) */
    float *kcache, *vcache;  /* float KV cache: [layer][kv head][position][head_dim] */
    int8_t *kq, *vq;         /* int8 KV cache (opt.int8_kv): codes as kcache's values ... */
    float *ks, *vs;          /* ... and one scale per [layer][kv head][position] */
    uint64_t kv_pos_bytes;   /* bytes of keys and values one position adds (plan.py's kv_bytes_per_position) */
    /* per-model constants, computed once in ple_open so the token path needs no double or transcendental call */
    float att_scale, embed_scale, ple_ident, ctx_scale, fuse;
    float *rope_inv, *rope_cos, *rope_sin; /* head_dim / 2 each: inverse frequencies; this position's cos, sin */
    float *x, *xn, *y, *q, *k, *v, *att, *h1, *h2, *h3, *lr, *raw, *pin, *ctx, *g, *t, *wv, *row, *xe, *xo, *probs, *acc;
    float *logits;
    uint32_t maxdim;
    /* the activation of the next products (act / mv) */
    const float *ax;
    uint32_t an;
    int a_split, a_quant;
    float sx;
    ple_kact ka;
    /* the greedy head (opt.head_skip): mean row, rows by descending key, each block's key; rows computed / run */
    float *head_mean, *head_key;
    uint32_t *head_perm;
    uint64_t head_rows, head_total;
    /* traffic */
    int n_tiers;
    ple_tier tiers[PLE_MAX_TIERS];
    uint64_t bytes[PLE_MAX_TIERS], reads[PLE_MAX_TIERS], dense_bytes[PLE_MAX_TIERS], dense_reads[PLE_MAX_TIERS];
    uint64_t tokens;
};

/* ---- scalar helpers --------------------------------------------------------------------------------- */

static inline float f16(const uint8_t *p) { return ple_f16(p); }

static uint64_t up64(uint64_t n) { return (n + ALIGN - 1) / ALIGN * ALIGN; }

/* Value e of a vector (dequantised exactly as the NumPy runtime does: code * fp16 scale). */
static float value_at(const qmat *w, const uint8_t *codes, const uint8_t *scales, uint64_t e) {
    switch (w->dtype) {
    case PLE_FP32: {
        float f;
        memcpy(&f, codes + 4 * e, 4);
        return f;
    }
    case PLE_FP16: return f16(codes + 2 * e);
    case PLE_INT8: return (float)(int8_t)codes[e] * f16(scales + 2 * ple_group_of(e, w->group));
    case PLE_INT4: return (float)nib(codes[e / 2], (int)(e & 1)) * f16(scales + 2 * ple_group_of(e, w->group));
    default: return (float)((codes[e / 8] >> (7 - e % 8)) & 1);
    }
}

static void row_ptrs(const qmat *w, uint32_t r, const uint8_t **codes, const uint8_t **scales, uint64_t *e0) {
    if (w->table) {
        uint64_t off = w->table->page ? ple_row_offset(w->table, r) : (uint64_t)r * w->table->stride;
        *codes = w->codes + off;
        *scales = w->scales + off;
        *e0 = 0;
    } else {
        *codes = w->codes;
        *scales = w->scales;
        *e0 = (uint64_t)r * w->cols;
    }
}

/* Row r (or the whole vector when rows == 1) as floats. Integer codes a group at a time: one scale conversion
 * per group, not per value (the PLE record every token, the whole head when the greedy head is indexed). */
static void deq_row(const qmat *w, uint32_t r, float *out) {
    const uint8_t *c, *s;
    uint64_t e0;
    row_ptrs(w, r, &c, &s, &e0);
    if (w->dtype == PLE_FP16) { /* norms' weights, every token: a pointer walk, not value_at's 64-bit offsets */
        const uint8_t *p = c + 2 * e0;
        for (uint32_t i = 0; i < w->cols; i++, p += 2) out[i] = f16(p);
        return;
    }
    if (w->dtype != PLE_INT8 && w->dtype != PLE_INT4) {
        for (uint32_t i = 0; i < w->cols; i++) out[i] = value_at(w, c, s, e0 + i);
        return;
    }
    uint64_t g = ple_group_of(e0, w->group); /* one division per row: then group by group */
    for (uint64_t e = e0, end = e0 + w->cols; e < end; g++) {
        uint64_t b = (g + 1) * w->group < end ? (g + 1) * w->group : end;
        float scale = f16(s + 2 * g), *o = out + (e - e0);
        uint32_t len = (uint32_t)(b - e), i = 0; /* 32-bit counters inside the group: 64-bit ones cost ~3x on RV32 */
        if (w->dtype == PLE_INT8) {
            const int8_t *p = (const int8_t *)c + e;
            for (; i < len; i++) o[i] = PLE_FMUL(PLE_I2F(p[i]), scale);
        } else { /* a byte (two values) a step; a group starting on a high nibble takes that one first */
            const uint8_t *p = c + e / 2;
            if (e & 1) o[i++] = PLE_FMUL(PLE_I2F(nib(*p++, 1)), scale);
            for (; i + 2 <= len; i += 2, p++) {
                o[i] = PLE_FMUL(PLE_I2F(nib(*p, 0)), scale);
                o[i + 1] = PLE_FMUL(PLE_I2F(nib(*p, 1)), scale);
            }
            if (i < len) o[i] = PLE_FMUL(PLE_I2F(nib(*p, 0)), scale);
        }
        e = b;
    }
}

/* ---- products of float activations: the float SIMD paths (ple_float_simd.h) per matrix --------------- */

/* Sum over values [a, b) of one group (all sharing one scale) times x[a - e0 ...]. */
static inline float segment(const qmat *w, const uint8_t *c, uint64_t a, uint64_t b, uint64_t e0, const float *x,
                     const float *xe, const float *xo) {
    if (w->dtype == PLE_INT8) return dot_i8((const int8_t *)c + a, x + (a - e0), (uint32_t)(b - a));
    float s = 0;
    if (xe && !(a & 1) && !(e0 & 1)) { /* pairs line up with the split x */
        uint32_t pairs = (uint32_t)((b - a) / 2);
        s = dot_i4(c + a / 2, xe + (a - e0) / 2, xo + (a - e0) / 2, pairs);
        a += 2 * (uint64_t)pairs;
    }
    for (; a < b; a++) s += (float)nib(c[a / 2], (int)(a & 1)) * x[a - e0];
    return s;
}

/* Row r of W times x; xe / xo: the int4 split of x (NULL when unused), sx: the sum of x. */
static inline float dot_row(const qmat *w, uint32_t r, const float *x, const float *xe, const float *xo, float sx) {
    const uint8_t *c, *sc;
    uint64_t e0;
    row_ptrs(w, r, &c, &sc, &e0);
    if (w->dtype == PLE_FP32) return dot_f32((const float *)(const void *)c + e0, x, w->cols);
    if (w->dtype == PLE_FP16) {
        float s = 0;
        for (uint32_t i = 0; i < w->cols; i++) s += f16(c + 2 * (e0 + i)) * x[i];
        return s;
    }
    if (w->table && w->cols <= w->group && xe) /* a table row in one group (the head): no segment loop */
        return f16(sc) * (dot_i4_biased(c, xe, xo, w->cols / 2) - 8.0f * sx); /* xe: int4, even cols */
#if defined(__GNUC__) && !defined(PLE_SCALAR)
    if (xe) return row_i4(c, sc, e0, w->cols, w->group, x, xe, xo); /* xe: int4, even cols */
#endif
    float sum = 0;
    uint64_t g = ple_group_of(e0, w->group); /* one division per row: segments then step group by group */
    for (uint64_t a = e0, end = e0 + w->cols; a < end; g++) {
        uint64_t b = (g + 1) * w->group < end ? (g + 1) * w->group : end;
        sum += f16(sc + 2 * g) * segment(w, c, a, b, e0, x, xe, xo);
        a = b;
    }
    return sum;
}

/* out = W x for W (rows x cols), float activations; pe / po: the int4 split of x (NULL unless W is int4 with even
 * cols), sx: the sum of x. */
static void matvec(float *out, const qmat *w, const float *x, const float *pe, const float *po, float sx) {
    long rows = (long)w->rows;
    int packed = !w->table || !w->table->page; /* rows a fixed stride apart */
    if (packed && (w->dtype == PLE_FP32 || (w->table && pe && w->cols <= w->group))) {
        /* fp32 matrices and the int4 head: four rows per pass; the last rows % 4 go through dot_row below */
        size_t stride = w->table ? w->table->stride : (size_t)w->cols * 4;
        long blocks = rows / 4;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if ((uint64_t)w->rows * w->cols >= PAR_MIN_WORK)
#endif
        for (long b = 0; b < blocks; b++) {
            const uint8_t *c = w->codes + (size_t)(4 * b) * stride;
            float *o = out + 4 * b;
            if (w->dtype == PLE_FP32) {
                rows4_f32(c, stride, x, w->cols, o);
            } else {
                const uint8_t *sc = w->scales + (size_t)(4 * b) * stride;
                rows4_i4(c, stride, pe, po, w->cols / 2, o);
                for (int r = 0; r < 4; r++) o[r] = f16(sc + r * stride) * (o[r] - 8.0f * sx);
            }
        }
        for (long r = 4 * blocks; r < rows; r++) out[r] = dot_row(w, (uint32_t)r, x, pe, po, sx);
        return;
    }
#if defined(__GNUC__) && !defined(PLE_SCALAR)
    if (pe && !w->table) { /* dense int4: straight to row_i4, no per-row dispatch */
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if ((uint64_t)w->rows * w->cols >= PAR_MIN_WORK)
#endif
        for (long r = 0; r < rows; r++)
            out[r] = row_i4(w->codes, w->scales, (uint64_t)r * w->cols, w->cols, w->group, x, pe, po);
        return;
    }
#endif
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if ((uint64_t)w->rows * w->cols >= PAR_MIN_WORK)
#endif
    for (long r = 0; r < rows; r++) out[r] = dot_row(w, (uint32_t)r, x, pe, po, sx);
}

/* ---- the activation of the next products, float or int8 ---------------------------------------------------- */

/* x (n values) is the input of the products that follow, until the next act(). What a product needs of it is made
 * once, when the first product needs it: the int4 even / odd split and sum (float path), or the int8 codes. */
static void act(ple_model *m, const float *x, uint32_t n) {
    m->ax = x;
    m->an = n;
    m->a_split = m->a_quant = 0;
}

/* out = W x for the current activation x: int8 codes times the stored integers when the model runs integer
 * activations (opt.int8_act) and W is int8 / int4, else the float SIMD paths (ple_float_simd.h). */
static void mv(ple_model *m, float *out, const qmat *w) {
    if (m->opt.int8_act && (w->dtype == PLE_INT8 || w->dtype == PLE_INT4)) {
        if (!m->a_quant) ple_kact_quantize(&m->ka, m->ax, m->an);
        m->a_quant = 1;
        ple_kact_prepare(&m->ka, w->dtype);
        const ple_kact *a = &m->ka;
        /* blocks of rows (the threads' shares with OpenMP): the dense and tied-head kernels walk rows without a
         * division or pointer computation per row; a paged table goes row by row */
        long rows = (long)w->rows, blocks = (rows + KROWS - 1) / KROWS;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if ((uint64_t)w->rows * w->cols >= PAR_MIN_WORK)
#endif
        for (long b = 0; b < blocks; b++) {
            uint32_t r0 = (uint32_t)(b * KROWS), r1 = r0 + KROWS < w->rows ? r0 + KROWS : w->rows;
            if (!w->table) {
                ple_kdot_dense(out + r0, w->dtype, w->codes, w->scales, w->group, r0, r1, w->cols, a);
            } else if (!w->table->page && w->cols <= w->group) {
                size_t stride = w->table->stride;
                ple_kdot_rows(out + r0, w->dtype, w->codes + r0 * stride, w->scales + r0 * stride, stride, r1 - r0,
                              w->cols, w->plain_scales, a);
            } else {
                for (uint32_t r = r0; r < r1; r++) {
                    const uint8_t *c, *sc;
                    uint64_t e0;
                    row_ptrs(w, r, &c, &sc, &e0);
                    out[r] = ple_kdot(w->dtype, c, sc, w->group, e0, w->cols, a);
                }
            }
        }
        return;
    }
    if (w->dtype != PLE_INT4 || w->cols % 2) {
        matvec(out, w, m->ax, NULL, NULL, 0);
        return;
    }
    if (!m->a_split) {
        float sx = 0;
        for (uint32_t j = 0; j < m->an / 2; j++) {
            m->xe[j] = m->ax[2 * j];
            m->xo[j] = m->ax[2 * j + 1];
            sx += m->ax[2 * j] + m->ax[2 * j + 1];
        }
        m->sx = sx;
        m->a_split = 1;
    }
    matvec(out, w, m->ax, m->xe, m->xo, m->sx);
}

/* ---- elementwise -------------------------------------------------------------------------------------- */

/* out = x / sqrt(mean(x^2) + eps) * w, in float: no ESP32 has double precision in hardware. The squares go into four
 * interleaved partial sums; every term is non-negative, so nothing cancels and the computed sum is within
 * (n/4 + 3) * 2^-24 of the exact one, relatively (1.6e-6 for n = 96, 3.1e-5 for n = 2048), the norm within half
 * that: below the float32 NumPy runtime's own rounding of the same mean at those sizes. */
static void rms_norm(float *out, const float *x, const float *w, uint32_t n, float eps) {
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    uint32_t i = 0;
    for (; i + 4 <= n; i += 4) {
        s0 += PLE_FMUL(x[i], x[i]);
        s1 += PLE_FMUL(x[i + 1], x[i + 1]);
        s2 += PLE_FMUL(x[i + 2], x[i + 2]);
        s3 += PLE_FMUL(x[i + 3], x[i + 3]);
    }
    for (; i < n; i++) s0 += PLE_FMUL(x[i], x[i]);
    float r = sqrtf(((s0 + s1) + (s2 + s3)) / (float)n + eps);
    for (i = 0; i < n; i++) out[i] = PLE_FMUL(x[i] / r, w[i]);
}

/* tanh from ple_tanh.h: integer arithmetic, the same bits on every target, and cheap where float is soft. */
static float silu(float x) { return PLE_FMUL(PLE_FMUL(x, 0.5f), 1.0f + ple_tanhf(PLE_FMUL(x, 0.5f))); }

static float gelu_tanh(float x) {
    const float c = 0.7978845608028654f; /* sqrt(2 / pi) */
    return PLE_FMUL(PLE_FMUL(0.5f, x), 1.0f + ple_tanhf(PLE_FMUL(c, x + PLE_FMUL(PLE_FMUL(PLE_FMUL(0.044715f, x), x), x))));
}

/* Rotate each head's pairs (i, i + half) by the angles of this position: rope_angles' cos and sin. */
static void rope(float *x, uint32_t heads, uint32_t hd, const float *cs, const float *sn) {
    uint32_t half = hd / 2;
    for (uint32_t i = 0; i < half; i++) {
        float c = cs[i], s = sn[i];
        for (uint32_t h = 0; h < heads; h++) {
            float *v = x + h * hd, a = v[i], b = v[i + half];
            v[i] = a * c + -b * s;
            v[i + half] = b * c + a * s;
        }
    }
}

/* ---- weights: lookup with shape checks ---------------------------------------------------------------- */

static const ple_tensor *find_tensor(const ple_desc *d, const char *name) {
    for (uint32_t i = 0; i < d->n_tensors; i++)
        if (!strcmp(d->tensors[i].name, name)) return &d->tensors[i];
    return NULL;
}

/* Where tensor bytes live after loading: filled by bind(). */
typedef struct { const uint8_t *codes, *scales; } placed;

static int bind(ple_model *m, qmat *w, const placed *where, const char *name, int u1, uint32_t a, uint32_t b,
                uint32_t c, char *err) {
    const ple_tensor *t = find_tensor(&m->d, name);
    uint32_t want[3] = {a, b, c};
    int ndim = c ? 3 : b ? 2 : 1;
    if (!t) return ple_fail(err, "the file lacks tensor %s this model needs", name);
    int ok = t->ndim == ndim && (u1 ? t->dtype == PLE_U1 : t->dtype != PLE_U1);
    for (int k = 0; k < ndim && ok; k++) ok = t->shape[k] == want[k];
    if (ok && t->dtype == PLE_FP32 && (uintptr_t)where[t - m->d.tensors].codes % 4) ok = 0;
    if (!ok) return ple_fail(err, "tensor %s has the wrong shape or encoding for this model", name);
    w->dtype = t->dtype;
    w->group = t->group;
    w->rows = ndim == 1 ? 1 : (uint32_t)(t->numel / t->shape[ndim - 1]);
    w->cols = t->shape[ndim - 1];
    w->codes = where[t - m->d.tensors].codes;
    w->scales = where[t - m->d.tensors].scales;
    w->present = 1;
    w->tensor = (uint32_t)(t - m->d.tensors);
    return 0;
}

static int bind_vec(ple_model *m, qmat *w, const placed *where, const char *name, uint32_t n, char *err) {
    if (bind(m, w, where, name, 0, n, 0, 0, err)) return -1;
    w->rows = 1;
    return 0;
}

/* One SwiGLU's gate, up, down named `prefix` + gate_proj / up_proj / down_proj (MoE experts, shared expert). */
static int bind_swiglu(ple_model *m, qmat *w3, const placed *pl, const char *prefix, char *err) {
    const ple_desc *d = &m->d;
    char n[96];
    static const char *names[] = {"gate_proj", "up_proj", "down_proj"};
    for (int j = 0; j < 3; j++) {
        snprintf(n, sizeof n, "%s%s", prefix, names[j]);
        if (bind(m, &w3[j], pl, n, 0, j < 2 ? d->inter : d->hidden, j < 2 ? d->hidden : d->inter, 0, err)) return -1;
    }
    return 0;
}

static int bind_moe(ple_model *m, layer_w *l, uint32_t i, const placed *pl, char *err) {
    const ple_desc *d = &m->d;
    char n[96];
    snprintf(n, sizeof n, "layers.%" PRIu32 ".mlp.router.weight", i);
    if (bind(m, &l->router, pl, n, 0, d->experts, d->hidden, 0, err)) return -1;
    l->experts = m->expert_mats + (uint64_t)i * 3 * d->experts;
    for (uint32_t e = 0; e < d->experts; e++) {
        snprintf(n, sizeof n, "layers.%" PRIu32 ".mlp.experts.%" PRIu32 ".", i, e);
        if (bind_swiglu(m, l->experts + 3 * e, pl, n, err)) return -1;
    }
    snprintf(n, sizeof n, "layers.%" PRIu32 ".mlp.shared_", i);
    return (d->flags & PLE_SHARED_EXPERT) ? bind_swiglu(m, l->shared, pl, n, err) : 0;
}

static int bind_layers(ple_model *m, const placed *pl, char *err) {
    const ple_desc *d = &m->d;
    uint32_t H = d->hidden, qd = d->heads * d->head_dim, kd = d->kv_heads * d->head_dim, I = d->inter, P = d->ple_dim;
    char n[96];
#define NAME(fmt, ...) (snprintf(n, sizeof n, fmt, __VA_ARGS__), n)
    for (uint32_t i = 0; i < d->layers; i++) {
        layer_w *l = &m->L[i];
        l->slot = -1;
        for (uint32_t s = 0; s < d->n_ple_layers; s++)
            if (d->ple_layers[s] == i) l->slot = (int)s;
        if (bind_vec(m, &l->in_norm, pl, NAME("layers.%" PRIu32 ".input_layernorm.weight", i), H, err) ||
            bind_vec(m, &l->post_norm, pl, NAME("layers.%" PRIu32 ".post_attention_layernorm.weight", i), H, err) ||
            bind(m, &l->q, pl, NAME("layers.%" PRIu32 ".self_attn.q_proj.weight", i), 0, qd, H, 0, err) ||
            bind(m, &l->k, pl, NAME("layers.%" PRIu32 ".self_attn.k_proj.weight", i), 0, kd, H, 0, err) ||
            bind(m, &l->v, pl, NAME("layers.%" PRIu32 ".self_attn.v_proj.weight", i), 0, kd, H, 0, err) ||
            bind(m, &l->o, pl, NAME("layers.%" PRIu32 ".self_attn.o_proj.weight", i), 0, H, qd, 0, err) ||
            (d->ffn_kind != PLE_MOE && bind(m, &l->down, pl, NAME("layers.%" PRIu32 ".mlp.down_proj.weight", i), 0, H, I, 0, err)))
            return -1;
        if (d->ffn_kind == PLE_MOE && bind_moe(m, l, i, pl, err)) return -1;
        if (d->ffn_kind == PLE_SWIGLU &&
            (bind(m, &l->gate, pl, NAME("layers.%" PRIu32 ".mlp.gate_proj.weight", i), 0, I, H, 0, err) ||
             bind(m, &l->up, pl, NAME("layers.%" PRIu32 ".mlp.up_proj.weight", i), 0, I, H, 0, err)))
            return -1;
        if (d->ffn_kind == PLE_MGLU &&
            (bind(m, &l->w, pl, NAME("layers.%" PRIu32 ".mlp.weight", i), 0, I, H, 0, err) ||
             bind(m, &l->mask, pl, NAME("layers.%" PRIu32 ".mlp.mask_logits", i), 1, d->mask_count, I, H, err)))
            return -1;
        if (d->ffn_kind == PLE_MGLU) { /* the bits past the last mask element must be zero (as written) */
            uint64_t bits = (uint64_t)d->mask_count * I * H;
            if (bits % 8 && (l->mask.codes[bits / 8] & ((1u << (8 - bits % 8)) - 1)))
                return ple_fail(err, "layer %" PRIu32 "'s MGLU mask has bits set past its end (corrupt mask)", i);
        }
        if (d->ffn_kind == PLE_LOWRANK &&
            (bind(m, &l->ga, pl, NAME("layers.%" PRIu32 ".mlp.gate_proj_a.weight", i), 0, d->rank, H, 0, err) ||
             bind(m, &l->gb, pl, NAME("layers.%" PRIu32 ".mlp.gate_proj_b.weight", i), 0, I, d->rank, 0, err) ||
             bind(m, &l->ua, pl, NAME("layers.%" PRIu32 ".mlp.up_proj_a.weight", i), 0, d->rank, H, 0, err) ||
             bind(m, &l->ub, pl, NAME("layers.%" PRIu32 ".mlp.up_proj_b.weight", i), 0, I, d->rank, 0, err)))
            return -1;
        if (l->slot < 0) continue;
        if (d->gate == PLE_GATE_INPUT
                ? bind(m, &l->ple_gate, pl, NAME("layers.%" PRIu32 ".ple.per_layer_input_gate.weight", i), 0, P, H, 0, err)
                : bind_vec(m, &l->ple_gate, pl, NAME("layers.%" PRIu32 ".ple.gate", i), d->gate == PLE_GATE_SCALAR ? 1 : P, err))
            return -1;
        if (bind(m, &l->ple_proj, pl, NAME("layers.%" PRIu32 ".ple.per_layer_projection.weight", i), 0, H, P, 0, err) ||
            ((d->flags & PLE_OUTPUT_NORM) &&
             bind_vec(m, &l->ple_norm, pl, NAME("layers.%" PRIu32 ".ple.post_per_layer_input_norm.weight", i), H, err)))
            return -1;
    }
#undef NAME
    if (bind_vec(m, &m->final_norm, pl, "norm.weight", H, err)) return -1;
    if (d->n_ple_layers && (d->flags & PLE_CONTEXT) &&
        (bind(m, &m->ctx_proj, pl, "per_layer_inputs.per_layer_model_projection.weight", 0, d->n_ple_layers * P, H,
              0, err) ||
         bind_vec(m, &m->ctx_norm, pl, "per_layer_inputs.per_layer_projection_norm.weight", P, err)))
        return -1;
    if (!(d->flags & PLE_TIE) && bind(m, &m->head, pl, "lm_head.weight", 0, d->vocab, H, 0, err)) return -1;
    return 0;
}

/* ---- tables -------------------------------------------------------------------------------------------- */

static int check_part(const ple_table *t, const ple_part *p, uint32_t length, char *err) {
    if (!p || p->length != length) return ple_fail(err, "row table '%s' lacks a part of %" PRIu32 " values", t->name, length);
    if (p->dtype == PLE_FP32 && (p->codes % 4 || t->stride % 4))
        return ple_fail(err, "row table '%s': fp32 records must be 4-byte aligned (re-export with --align 4)", t->name);
    return 0;
}

static int check_tables(ple_model *m, char *err) {
    const ple_desc *d = &m->d;
    m->ple_t = ple_find_table(d, "ple");
    m->embed_t = ple_find_table(d, "embed");
    for (uint32_t i = 0; i < d->n_tables; i++)
        if (&d->tables[i] != m->ple_t && &d->tables[i] != m->embed_t)
            return ple_fail(err, "unknown row table '%s'", d->tables[i].name);
    m->ple_reads = d->ple_index == PLE_INDEX_NGRAM ? ple_ngram_heads(d->ngram) : 1;
    m->id_map = d->ple_index == PLE_INDEX_NGRAM && d->ngram->id_map ? ple_find_section(d, "idmap") : NULL;
    if (d->n_ple_layers) {
        if (!m->ple_t || m->ple_t->rows != d->ple_vocab) return ple_fail(err, "the file lacks the PLE table this model needs");
        m->ple_p = ple_find_part(m->ple_t, "ple");
        /* a row: every PLE layer's slice of one head (of the one head of a token table: all of dP) */
        if (check_part(m->ple_t, m->ple_p, d->n_ple_layers * (d->ple_dim / m->ple_reads), err)) return -1;
        m->embed_in_ple = ple_find_part(m->ple_t, "embed");
        if (m->embed_in_ple && (check_part(m->ple_t, m->embed_in_ple, d->hidden, err) || m->ple_t->rows != d->vocab ||
                                d->ple_index != PLE_INDEX_TOKEN))
            return ple_fail(err, "PLE records carry an embedding row but not one per token id");
    } else if (m->ple_t) {
        return ple_fail(err, "the file has a PLE table but the model has no PLE layers");
    }
    if (m->embed_t) {
        m->embed_p = ple_find_part(m->embed_t, "embed");
        if (m->embed_t->rows != d->vocab || check_part(m->embed_t, m->embed_p, d->hidden, err))
            return ple_fail(err, "the embedding table does not match the vocabulary and hidden size");
    }
    if ((d->flags & PLE_TIE) && !m->embed_t) return ple_fail(err, "a tied head needs the embed table");
    if (!m->embed_t && !m->embed_in_ple) return ple_fail(err, "the file has no embedding rows");
    return 0;
}

/* ---- placement and traffic (mirrors plelab/edge/placement.py: items, first-fit decreasing by density) --------- */

static int tier_index(ple_model *m, const char *name, int storage) {
    for (int i = 0; i < m->n_tiers; i++)
        if (!strcmp(m->tiers[i].name, name)) return i;
    ple_tier *t = &m->tiers[m->n_tiers];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->storage = storage;
    t->capacity = UINT64_MAX;
    return m->n_tiers++;
}

static int place(ple_model *m, uint64_t kv_stored, char *err) {
    const ple_desc *d = &m->d;
    uint32_t n = d->n_tensors + 4, count = 0;
    item *its = calloc(n, sizeof(item));
    if (!its) return ple_fail(err, "out of memory");
    if (m->ple_t) /* ple_reads records a token, in storage */
        its[count++] = (item){"table:ple", m->ple_t->section->nbytes, (uint64_t)m->ple_reads * m->ple_t->record_bytes,
                              m->ple_reads, 0, -1, 1.0};
    if (m->id_map) /* one uint32 a token, in storage */
        its[count++] = (item){"idmap", m->id_map->nbytes, 4, 1, 0, -1, 1.0};
    if (m->embed_t) {
        uint64_t row = m->embed_in_ple ? 0 : m->embed_t->record_bytes, nb = m->embed_t->section->nbytes;
        its[count++] = (d->flags & PLE_TIE) ? (item){"table:embed", nb, nb + row, 1 + (row > 0), 1, -1, 1.0}
                                            : (item){"table:embed", nb, row, row ? 1 : 0, 0, -1, 1.0};
    }
    for (uint32_t i = 0; i < d->n_tensors; i++) {
        item *it = &its[count++];
        const ple_tensor *t = &d->tensors[i];
        snprintf(it->name, sizeof it->name, "%s", t->name);
        it->stored = it->per_token = t->codes_bytes + t->scales_bytes;
        it->reads = 1;
        it->resident = 1;
        it->tier = -1; /* unplaced (calloc's 0 would read as the first tier, skipping its capacity check) */
        it->density = 1.0;
        if (strstr(t->name, ".mlp.experts.")) { /* tallied per routed token; placed by top_k / E like plan.py */
            it->per_token = it->reads = 0;
            it->density = (double)d->top_k / d->experts;
        }
    }
    its[count++] = (item){"kv_cache", kv_stored, 0, 2 * (uint64_t)d->layers, 1, -1, 0.5};
    if (!m->opt.device) {
        m->n_tiers = 0;
        int file = tier_index(m, "file", 1), ram = tier_index(m, "ram", 0);
        for (uint32_t i = 0; i < count; i++) its[i].tier = its[i].resident ? ram : file;
    } else {
        const ple_device *dev = m->opt.device;
        m->n_tiers = dev->n_tiers;
        memcpy(m->tiers, dev->tiers, sizeof dev->tiers);
        int storage = -1;
        uint64_t used[PLE_MAX_TIERS] = {0};
        for (int i = 0; i < dev->n_tiers; i++)
            if (dev->tiers[i].storage) storage = i;
        const ple_section *tok = ple_find_section(d, "tokenizer");
        uint64_t need = d->file_bytes - (tok ? tok->nbytes : 0);
        if (need > dev->tiers[storage].capacity) {
            free(its);
            return ple_fail(err, "the model does not fit %s: the file needs %llu bytes of %s, it has %llu", dev->name,
                        (unsigned long long)need, dev->tiers[storage].name,
                        (unsigned long long)dev->tiers[storage].capacity);
        }
        /* resident items in plan.py's order: density descending, then stored bytes descending (stable) */
        uint32_t *idx = malloc(sizeof(uint32_t) * count);
        if (!idx) {
            free(its);
            return ple_fail(err, "out of memory");
        }
        uint32_t nres = 0;
        for (uint32_t i = 0; i < count; i++) {
            if (!its[i].resident) {
                its[i].tier = storage;
                continue;
            }
            uint32_t j = nres++;
            while (j > 0 && (its[idx[j - 1]].density < its[i].density ||
                             (its[idx[j - 1]].density == its[i].density && its[idx[j - 1]].stored < its[i].stored))) {
                idx[j] = idx[j - 1];
                j--;
            }
            idx[j] = i;
        }
        uint64_t missing = 0;
        const char *first = NULL;
        for (uint32_t k = 0; k < nres; k++) {
            item *it = &its[idx[k]];
            for (int t = 0; t < dev->n_tiers && it->tier < 0; t++)
                if (!dev->tiers[t].storage && used[t] + it->stored <= dev->tiers[t].capacity) {
                    it->tier = t;
                    used[t] += it->stored;
                }
            if (it->tier < 0) {
                missing += it->stored;
                if (!first) first = it->name;
            }
        }
        free(idx);
        if (first) { /* one line: what RAM the model needs, what the device has, what did not go in */
            uint64_t need_ram = 0, ram = 0;
            char tiers[160] = "";
            for (uint32_t k = 0; k < count; k++) need_ram += its[k].resident ? its[k].stored : 0;
            for (int t = 0, k = 0; t < dev->n_tiers; t++)
                if (!dev->tiers[t].storage) {
                    ram += dev->tiers[t].capacity;
                    if (k < (int)sizeof tiers)
                        k += snprintf(tiers + k, sizeof tiers - (size_t)k, "%s%s %llu", k ? " + " : "",
                                      dev->tiers[t].name, (unsigned long long)dev->tiers[t].capacity);
                }
            int rc = ple_fail(err, "the model does not fit %s: weights + KV cache need %llu bytes of RAM, %llu available "
                              "(%s); %s and %llu more bytes find no room (see plelab place)", dev->name,
                              (unsigned long long)need_ram, (unsigned long long)ram, tiers, first,
                              (unsigned long long)missing);
            free(its);
            return rc;
        }
    }
    for (uint32_t i = 0, t = 0; i < count; i++) {
        const item *it = &its[i];
        if (it->resident) m->placed[it->tier] += it->stored;
        if (t < d->n_tensors && !strcmp(it->name, d->tensors[t].name)) m->tensor_tier[t++] = it->tier;
        if (!strcmp(it->name, "table:ple")) m->ple_tier = it->tier;
        else if (!strcmp(it->name, "idmap")) m->id_map_tier = it->tier;
        else if (!strcmp(it->name, "table:embed")) m->embed_tier = it->tier;
        else if (!strcmp(it->name, "kv_cache")) m->kv_tier = it->tier;
        else {
            m->dense_bytes[it->tier] += it->per_token;
            m->dense_reads[it->tier] += it->reads;
        }
    }
    if (m->embed_t && (d->flags & PLE_TIE)) { /* the head is read whole every token */
        m->dense_bytes[m->embed_tier] += m->embed_t->section->nbytes;
        m->dense_reads[m->embed_tier] += 1;
    }
    free(its);
    return 0;
}

/* Count `reads` reads of `nbytes` bytes from tier (integers: the token path keeps no double). */
static void tally(ple_model *m, int tier, uint64_t nbytes, uint64_t reads) {
    m->bytes[tier] += nbytes;
    m->reads[tier] += reads;
}

static void head_index(ple_model *m);

/* ---- open / close -------------------------------------------------------------------------------------- */

/* Transparent huge pages for the arena where Linux gives them on request: the head is streamed whole every
 * token, and in 4 KiB pages its thousands of translations a token miss the TLB (fp32 head +5-15% tok/s).
 * Advice only: where it is refused nothing changes. */
static void advise_huge(void *p, size_t n) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    uintptr_t a = ((uintptr_t)p + 4095) & ~(uintptr_t)4095, b = ((uintptr_t)p + n) & ~(uintptr_t)4095;
    if (b > a) madvise((void *)a, b - a, MADV_HUGEPAGE);
#else
    (void)p, (void)n;
#endif
}

const uint8_t *ple_read_record(ple_model *m, const ple_table *t, uint32_t row) {
    uint8_t *buf = t == m->ple_t ? m->rec_ple : m->rec_embed;
    if (m->st->read(m->st, t->section->offset + ple_row_offset(t, row), buf, t->record_bytes)) return NULL;
    tally(m, t == m->ple_t ? m->ple_tier : m->embed_tier, t->record_bytes, 1);
    return buf;
}

/* Bytes of the working buffers: scratch vectors, logits, record buffers (always in one piece). */
static uint64_t work_bytes(const ple_model *m) {
    const ple_desc *d = &m->d;
    uint64_t n = N_SCRATCH * up64(4 * (uint64_t)m->maxdim) + up64(4 * (uint64_t)d->vocab) +
                 up64(6 * (uint64_t)d->head_dim) + /* rope: inverse frequencies, this position's cos and sin */
                 (m->opt.int8_act ? up64(ple_kact_bytes(m->maxdim)) : 0) +
                 (m->ple_t ? up64(m->ple_t->record_bytes) : 0) + (m->embed_t ? up64(m->embed_t->record_bytes) : 0);
    if (m->ple_t) /* the rows a position reads; an n-gram index's multipliers */
        n += up64(8 * (uint64_t)m->ple_reads) +
             (d->ple_index == PLE_INDEX_NGRAM ? up64(4 * (uint64_t)m->ple_reads * PLE_NGRAM_MAX_ORDER) : 0);
    if (m->opt.head_skip) /* the head's mean row, block keys, row order */
        n += up64(4 * (uint64_t)d->hidden) + up64(4 * (((uint64_t)d->vocab + HEAD_BLOCK - 1) / HEAD_BLOCK)) +
             up64(4 * (uint64_t)d->vocab);
    return n;
}

/* The next `n` bytes (64-byte aligned) of tier t's memory: its region, or the one malloc'ed arena. */
static uint8_t *carve(ple_model *m, int t, uint64_t n) {
    uint8_t *p = m->cursor[m->opt.regions ? t : 0];
    m->cursor[m->opt.regions ? t : 0] += up64(n);
    m->tier_arena[t] += up64(n);
    return p;
}

/* Size the arena per tier (with regions: check each against its region) and point the cursors at it. */
static int make_arena(ple_model *m, int map, int tied, char *err) {
    const ple_desc *d = &m->d;
    uint64_t need[PLE_MAX_TIERS] = {0};
    if (!map) {
        for (uint32_t i = 0; i < d->n_tensors; i++)
            need[m->tensor_tier[i]] += up64(d->tensors[i].codes_bytes) + up64(d->tensors[i].scales_bytes);
        if (tied) need[m->embed_tier] += up64(m->embed_t->section->nbytes);
    }
    need[m->kv_tier] += m->kv_arena;
    uint64_t work = work_bytes(m), total = work;
    for (int t = 0; t < m->n_tiers; t++) total += need[t];
    m->arena_bytes = total;
    const ple_region *reg = m->opt.regions;
    if (!reg) {
        if ((m->opt.max_arena && total > m->opt.max_arena) || total > ((uint64_t)1 << 40) ||
            (uint64_t)(size_t)(total + ALIGN) != total + ALIGN)
            return ple_fail(err, "the model needs an arena of %llu bytes, %llu available", (unsigned long long)total,
                            (unsigned long long)(m->opt.max_arena ? m->opt.max_arena : (uint64_t)SIZE_MAX));
        m->work_tier = m->kv_tier;
        m->arena_raw = calloc(1, (size_t)(total + ALIGN));
        if (!m->arena_raw)
            return ple_fail(err, "out of memory: the model needs an arena of %llu bytes", (unsigned long long)total);
        m->arena = m->arena_raw + (ALIGN - (uintptr_t)m->arena_raw % ALIGN) % ALIGN;
        advise_huge(m->arena_raw, (size_t)(total + ALIGN));
        m->cursor[0] = m->arena;
        return 0;
    }
    uint64_t avail[PLE_MAX_TIERS] = {0};
    for (int t = 0; t < m->n_tiers; t++) {
        uint64_t skip = (ALIGN - (uintptr_t)reg[t].base % ALIGN) % ALIGN;
        avail[t] = m->tiers[t].storage || reg[t].bytes < skip ? 0 : reg[t].bytes - skip;
        m->cursor[t] = (uint8_t *)reg[t].base + skip;
    }
    for (int t = 0; t < m->n_tiers; t++)
        if (need[t] > avail[t])
            return ple_fail(err, "the model needs %llu bytes of %s (weights + KV cache %llu, alignment %llu), "
                            "the %s region has %llu", (unsigned long long)need[t], m->tiers[t].name,
                            (unsigned long long)m->placed[t], (unsigned long long)(need[t] - m->placed[t]),
                            m->tiers[t].name, (unsigned long long)avail[t]);
    m->work_tier = -1;
    for (int t = 0; t < m->n_tiers && m->work_tier < 0; t++)
        if (!m->tiers[t].storage && need[t] + work <= avail[t]) m->work_tier = t;
    if (m->work_tier < 0) {
        char free_list[160] = "";
        for (int t = 0, k = 0; t < m->n_tiers; t++)
            if (!m->tiers[t].storage && k < (int)sizeof free_list)
                k += snprintf(free_list + k, sizeof free_list - (size_t)k, "%s%s %llu", k ? ", " : "", m->tiers[t].name,
                              (unsigned long long)(avail[t] - need[t]));
        return ple_fail(err, "the model needs %llu bytes of working buffers in one region, free: %s",
                        (unsigned long long)work, free_list);
    }
    return 0;
}

int ple_open(ple_model **out, ple_storage *st, const ple_options *opt, char *err) {
    *out = NULL;
    ple_model *m = calloc(1, sizeof *m);
    if (!m) return ple_fail(err, "out of memory");
    m->st = st;
    m->opt = *opt;
    placed *pl = NULL;
    if (ple_read_desc(st, &m->d, err)) {
        free(m);
        return -1;
    }
    const ple_desc *d = &m->d;
    if (opt->verify && ple_verify(st, d, opt->verify > 1, err)) goto fail;
    if (check_tables(m, err)) goto fail;
    if (opt->regions && !opt->device) {
        ple_fail(err, "memory regions need a device profile (its tiers say which region is which)");
        goto fail;
    }
    /* arena: weights that are not mapped, KV cache, scratch, record buffers, each in its placed tier */
    int map = opt->map_weights && st->map(st, 0, 1) != NULL;
    const ple_section *ts = ple_find_section(d, "tensors");
    uint64_t weights = 0;
    for (uint32_t i = 0; i < d->n_tensors; i++) weights += d->tensors[i].codes_bytes + d->tensors[i].scales_bytes;
    int tied = (d->flags & PLE_TIE) != 0;
    if (tied) weights += m->embed_t->section->nbytes;
    m->weight_bytes = weights;
    uint64_t kv_vectors = (uint64_t)d->layers * d->kv_heads * d->max_seq, kv_values = kv_vectors * d->head_dim;
    m->kv_bytes = opt->int8_kv ? 2 * (kv_values + 4 * kv_vectors) : 2 * kv_values * 4;
    m->kv_pos_bytes = 2ull * d->layers * d->kv_heads * (opt->int8_kv ? d->head_dim + 4ull : 4ull * d->head_dim);
    m->kv_arena = opt->int8_kv ? 2 * (up64(kv_values) + up64(4 * kv_vectors)) : up64(m->kv_bytes);
    uint32_t dims[] = {d->hidden, d->heads * d->head_dim, d->inter, d->rank, d->n_ple_layers * d->ple_dim,
                       d->max_seq, d->experts, 2};
    m->maxdim = 0;
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
        if (dims[i] > m->maxdim) m->maxdim = dims[i];
    if (opt->head_skip) {
        const ple_tensor *lm = find_tensor(d, "lm_head.weight");
        int head_dtype = tied ? m->embed_p->dtype : lm ? lm->dtype : -1;
        if (!opt->int8_act || (head_dtype != PLE_INT8 && head_dtype != PLE_INT4)) {
            ple_fail(err, "the greedy head skip needs int8 activations and an int8 or int4 head");
            goto fail;
        }
    }
    m->L = calloc(d->layers, sizeof(layer_w));
    m->expert_mats = calloc((size_t)d->layers * 3 * d->experts + 1, sizeof(qmat));
    m->tensor_tier = calloc((size_t)d->n_tensors + 1, sizeof(int));
    pl = calloc(d->n_tensors + 1, sizeof(placed));
    if (!m->L || !m->expert_mats || !m->tensor_tier || !pl) {
        ple_fail(err, "out of memory for the model description (%" PRIu32 " layers, %" PRIu32 " tensors)", d->layers,
                 d->n_tensors);
        goto fail;
    }
    if (place(m, m->kv_bytes, err) || make_arena(m, map, tied, err)) goto fail;
    /* the storage's "call for dense tensors": each tensor's codes and scales, mapped or copied in */
    for (uint32_t i = 0; i < d->n_tensors; i++) {
        const ple_tensor *t = &d->tensors[i];
        uint64_t base = ts->offset;
        if (map) {
            pl[i].codes = st->map(st, base + t->codes, (size_t)t->codes_bytes);
            pl[i].scales = st->map(st, base + t->scales, (size_t)t->scales_bytes);
        } else {
            uint8_t *c = carve(m, m->tensor_tier[i], t->codes_bytes), *s = carve(m, m->tensor_tier[i], t->scales_bytes);
            if (st->read(st, base + t->codes, c, (size_t)t->codes_bytes) ||
                st->read(st, base + t->scales, s, (size_t)t->scales_bytes))
                goto read_error;
            pl[i].codes = c;
            pl[i].scales = s;
        }
        if (!pl[i].codes || !pl[i].scales) goto read_error;
    }
    if (tied) {
        const ple_section *es = m->embed_t->section;
        const uint8_t *rows;
        if (map) {
            rows = st->map(st, es->offset, (size_t)es->nbytes);
        } else {
            uint8_t *p = carve(m, m->embed_tier, es->nbytes);
            if (st->read(st, es->offset, p, (size_t)es->nbytes)) goto read_error;
            rows = p;
        }
        if (!rows) goto read_error;
        m->head = (qmat){m->embed_p->dtype, m->embed_p->group, d->vocab, d->hidden, rows + m->embed_p->codes,
                         rows + m->embed_p->scales, m->embed_t, 1, 0, 0};
        if ((m->head.dtype == PLE_INT4 || m->head.dtype == PLE_INT8) && !m->embed_t->page)
            m->head.plain_scales = ple_scales_plain(m->head.scales, m->embed_t->stride, d->vocab);
        if (m->embed_p->dtype == PLE_FP32 && (uintptr_t)rows % 4) {
            ple_fail(err, "the embedding table is not 4-byte aligned");
            goto fail;
        }
    }
    if (bind_layers(m, pl, err)) goto fail;
    uint8_t *kv = carve(m, m->kv_tier, m->kv_arena);
    if (opt->int8_kv) {
        m->kq = (int8_t *)kv;
        m->vq = (int8_t *)kv + up64(kv_values);
        m->ks = (float *)(void *)(kv + 2 * up64(kv_values));
        m->vs = m->ks + up64(4 * kv_vectors) / 4;
    } else {
        m->kcache = (float *)(void *)kv;
        m->vcache = m->kcache + kv_values;
    }
    uint8_t *p = carve(m, m->work_tier, work_bytes(m));
    float **bufs[] = {&m->x, &m->xn, &m->y, &m->q, &m->k, &m->v, &m->att, &m->h1, &m->h2, &m->h3,
                      &m->lr, &m->raw, &m->pin, &m->ctx, &m->g, &m->t, &m->wv, &m->row, &m->xe, &m->xo,
                      &m->probs, &m->acc};
    _Static_assert(sizeof bufs / sizeof bufs[0] == N_SCRATCH, "N_SCRATCH counts the scratch buffers");
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        *bufs[i] = (float *)(void *)p;
        p += up64(4 * (uint64_t)m->maxdim);
    }
    m->logits = (float *)(void *)p;
    p += up64(4 * (uint64_t)d->vocab);
    m->rope_inv = (float *)(void *)p;
    m->rope_cos = m->rope_inv + d->head_dim / 2;
    m->rope_sin = m->rope_cos + d->head_dim / 2;
    p += up64(6 * (uint64_t)d->head_dim);
    for (uint32_t i = 0; i < d->head_dim / 2; i++)
        m->rope_inv[i] = 1.0f / powf(d->theta, (float)(2 * i) / (float)d->head_dim);
    m->att_scale = (float)pow((double)d->head_dim, -0.5);
    m->embed_scale = (float)sqrt((double)d->hidden);
    m->ple_ident = (float)sqrt((double)d->ple_dim);
    m->ctx_scale = (float)pow((double)d->hidden, -0.5);
    m->fuse = (float)pow(2.0, -0.5);
    if (opt->int8_act) {
        ple_kact_init(&m->ka, p, m->maxdim);
        p += up64(ple_kact_bytes(m->maxdim));
    }
    if (opt->head_skip) {
        m->head_mean = (float *)(void *)p;
        p += up64(4 * (uint64_t)d->hidden);
        m->head_key = (float *)(void *)p;
        p += up64(4 * (((uint64_t)d->vocab + HEAD_BLOCK - 1) / HEAD_BLOCK));
        m->head_perm = (uint32_t *)(void *)p;
        p += up64(4 * (uint64_t)d->vocab);
    }
    if (m->ple_t) {
        m->rec_ple = p;
        p += up64(m->ple_t->record_bytes);
        m->ple_rows = (uint64_t *)(void *)p;
        p += up64(8 * (uint64_t)m->ple_reads);
        if (d->ple_index == PLE_INDEX_NGRAM) {
            m->hash_mult = (uint32_t *)(void *)p;
            p += up64(4 * (uint64_t)m->ple_reads * PLE_NGRAM_MAX_ORDER);
            ple_ngram_multipliers(d->ngram, m->hash_mult);
        }
    }
    if (m->embed_t) m->rec_embed = p;
    if (opt->head_skip) head_index(m);
    free(pl);
    m->peak = (opt->regions ? 0 : m->arena_bytes + ALIGN) + sizeof *m + d->layers * sizeof(layer_w) +
              d->n_tensors * sizeof(ple_tensor) + (d->n_ple_layers + 1) * sizeof(uint32_t) +
              ((uint64_t)d->layers * 3 * d->experts + 1) * sizeof(qmat) + (d->n_tensors + 1) * sizeof(int);
    *out = m;
    return 0;
read_error:
    ple_fail(err, "cannot read the model's weights from storage");
fail:
    free(pl);
    ple_close(m);
    return -1;
}

void ple_close(ple_model *m) {
    if (!m) return;
    ple_desc_free(&m->d);
    free(m->L);
    free(m->expert_mats);
    free(m->tensor_tier);
    free(m->arena_raw);
    free(m);
}

/* ---- forward ------------------------------------------------------------------------------------------- */

static void attention(ple_model *m, const layer_w *l, uint32_t layer, uint32_t pos) {
    const ple_desc *d = &m->d;
    uint32_t hd = d->head_dim, kvh = d->kv_heads, rep = d->heads / kvh;
    act(m, m->xn, d->hidden);
    mv(m, m->q, &l->q);
    mv(m, m->k, &l->k);
    mv(m, m->v, &l->v);
    rope(m->q, d->heads, hd, m->rope_cos, m->rope_sin);
    rope(m->k, kvh, hd, m->rope_cos, m->rope_sin);
    uint64_t vbase = (uint64_t)layer * kvh * d->max_seq; /* head vectors before this layer's */
    int q8 = m->opt.int8_kv;
    for (uint32_t h = 0; h < kvh; h++) {
        uint64_t at = vbase + (uint64_t)h * d->max_seq + pos;
        if (q8) { /* one scale per head vector */
            m->ks[at] = ple_quantize_i8(m->k + h * hd, hd, m->kq + at * hd);
            m->vs[at] = ple_quantize_i8(m->v + h * hd, hd, m->vq + at * hd);
        } else {
            memcpy(m->kcache + at * hd, m->k + h * hd, 4 * hd);
            memcpy(m->vcache + at * hd, m->v + h * hd, 4 * hd);
        }
    }
    const float scale = m->att_scale;
    for (uint32_t h = 0; h < d->heads; h++) {
        uint64_t v0 = vbase + (uint64_t)(h / rep) * d->max_seq; /* this head's kv head, position 0 */
        const float *q = m->q + h * hd;
        float mx = -INFINITY, sum = 0;
        for (uint32_t t = 0; t <= pos; t++) {
            m->att[t] = (q8 ? dot_i8(m->kq + (v0 + t) * hd, q, hd) * m->ks[v0 + t]
                            : dot_f32(q, m->kcache + (v0 + t) * hd, hd)) * scale;
            if (m->att[t] > mx) mx = m->att[t];
        }
        for (uint32_t t = 0; t <= pos; t++) {
            m->att[t] = expf(m->att[t] - mx);
            sum += m->att[t];
        }
        float *y = m->y + h * hd;
        memset(y, 0, 4 * hd);
        for (uint32_t t = 0; t <= pos; t++) {
            float w = m->att[t] / sum;
            if (q8) {
                const int8_t *vc = m->vq + (v0 + t) * hd;
                w *= m->vs[v0 + t];
                for (uint32_t i = 0; i < hd; i++) y[i] += PLE_FMUL(w, PLE_I2F(vc[i]));
            } else {
                const float *vc = m->vcache + (v0 + t) * hd;
                for (uint32_t i = 0; i < hd; i++) y[i] += PLE_FMUL(w, vc[i]);
            }
        }
    }
    act(m, m->y, d->heads * hd);
    mv(m, m->h3, &l->o);
    for (uint32_t i = 0; i < d->hidden; i++) m->x[i] += m->h3[i];
}

/* Sum of v[c] over the set bits c of an MSB-first bit string starting at bit b0 (np.packbits order): a bit
 * loop that reads the packed mask in place, a byte at a time, skipping zero bytes. */
static float masked_sum(const float *v, const uint8_t *bits, uint64_t b0, uint32_t n) {
    float s = 0;
    uint32_t c = 0;
    for (; c < n && ((b0 + c) & 7); c++) /* up to the first byte boundary */
        if ((bits[(b0 + c) >> 3] >> (7 - ((b0 + c) & 7))) & 1) s += v[c];
    for (const uint8_t *p = bits + ((b0 + c) >> 3); c + 8 <= n; c += 8, p++) {
        uint8_t byte = *p;
        for (int k = 0; byte; k++, byte = (uint8_t)(byte << 1))
            if (byte & 0x80) s += v[c + k];
    }
    for (; c < n; c++)
        if ((bits[(b0 + c) >> 3] >> (7 - ((b0 + c) & 7))) & 1) s += v[c];
    return s;
}

/* MGLU: per row r, wx = W[r] * x once; for each mask k, gate = sum over mask bits of wx and up = sum(wx) - gate
 * (W * (1 - m) x without a second pass). Bytes read: W once plus n_m bits per element; W*m never exists. */
static void mglu(ple_model *m, const layer_w *l) {
    const ple_desc *d = &m->d;
    uint32_t H = d->hidden, I = d->inter;
    for (uint32_t r = 0; r < I; r++) {
        deq_row(&l->w, r, m->row);
        float total = 0;
        for (uint32_t c = 0; c < H; c++) total += (m->row[c] *= m->xn[c]);
        float acc = 0;
        for (uint32_t k = 0; k < d->mask_count; k++) {
            float g = masked_sum(m->row, l->mask.codes, ((uint64_t)k * I + r) * H, H);
            acc += silu(g) * (total - g);
        }
        m->h1[r] = acc;
    }
    act(m, m->h1, I);
    mv(m, m->h3, &l->down);
}

/* out = down(silu(gate xn) * up xn) for one SwiGLU (w3: gate, up, down); uses h1, h2. */
static void swiglu(ple_model *m, const qmat *w3, float *out) {
    act(m, m->xn, m->d.hidden);
    mv(m, m->h1, &w3[0]);
    mv(m, m->h2, &w3[1]);
    for (uint32_t i = 0; i < m->d.inter; i++) m->h1[i] = PLE_FMUL(silu(m->h1[i]), m->h2[i]);
    act(m, m->h1, m->d.inter);
    mv(m, out, &w3[2]);
}

/* MoE: router softmax, the top_k experts (ties: lower index), their renormalised weights; only those experts
 * are read, each tallied in its tier as it is, then the shared expert. Result in h3. */
static void moe(ple_model *m, const layer_w *l) {
    const ple_desc *d = &m->d;
    uint32_t E = d->experts, H = d->hidden, pick[PLE_MAX_EXPERTS];
    act(m, m->xn, H);
    mv(m, m->probs, &l->router);
    float mx = -INFINITY, sum = 0, kept = 0;
    for (uint32_t e = 0; e < E; e++) mx = m->probs[e] > mx ? m->probs[e] : mx;
    for (uint32_t e = 0; e < E; e++) sum += (m->probs[e] = expf(m->probs[e] - mx));
    for (uint32_t e = 0; e < E; e++) m->probs[e] /= sum;
    for (uint32_t k = 0; k < d->top_k; k++) { /* k passes of a max: k and E are small */
        uint32_t best = E;
        for (uint32_t e = 0; e < E; e++) {
            int taken = 0;
            for (uint32_t j = 0; j < k; j++) taken |= pick[j] == e;
            if (!taken && (best == E || m->probs[e] > m->probs[best])) best = e;
        }
        pick[k] = best;
        kept += m->probs[best];
    }
    memset(m->acc, 0, 4 * H);
    for (uint32_t e = 0; e < E; e++) /* ascending expert order, as the NumPy runtime sums */
        for (uint32_t k = 0; k < d->top_k; k++) {
            if (pick[k] != e) continue;
            const qmat *w3 = l->experts + 3 * e;
            swiglu(m, w3, m->h3);
            float w = m->probs[e] / kept;
            for (uint32_t i = 0; i < H; i++) m->acc[i] += w * m->h3[i];
            for (int j = 0; j < 3; j++) {
                const ple_tensor *t = &d->tensors[w3[j].tensor];
                tally(m, m->tensor_tier[w3[j].tensor], t->codes_bytes + t->scales_bytes, 1);
            }
        }
    if (d->flags & PLE_SHARED_EXPERT) {
        swiglu(m, l->shared, m->h3);
        for (uint32_t i = 0; i < H; i++) m->acc[i] += m->h3[i];
    }
    memcpy(m->h3, m->acc, 4 * H);
}

static void ffn(ple_model *m, const layer_w *l) {
    const ple_desc *d = &m->d;
    if (d->ffn_kind == PLE_MGLU) {
        mglu(m, l);
    } else if (d->ffn_kind == PLE_MOE) {
        moe(m, l);
    } else {
        if (d->ffn_kind == PLE_SWIGLU) {
            act(m, m->xn, d->hidden);
            mv(m, m->h1, &l->gate);
            mv(m, m->h2, &l->up);
        } else {
            act(m, m->xn, d->hidden);
            mv(m, m->lr, &l->ga);
            act(m, m->lr, d->rank);
            mv(m, m->h1, &l->gb);
            act(m, m->xn, d->hidden);
            mv(m, m->lr, &l->ua);
            act(m, m->lr, d->rank);
            mv(m, m->h2, &l->ub);
        }
        for (uint32_t i = 0; i < d->inter; i++) m->h1[i] = PLE_FMUL(silu(m->h1[i]), m->h2[i]);
        act(m, m->h1, d->inter);
        mv(m, m->h3, &l->down);
    }
    for (uint32_t i = 0; i < d->hidden; i++) m->x[i] += m->h3[i];
}

static void inject(ple_model *m, const layer_w *l) {
    const ple_desc *d = &m->d;
    uint32_t P = d->ple_dim;
    if (d->gate == PLE_GATE_INPUT) {
        act(m, m->x, d->hidden);
        mv(m, m->g, &l->ple_gate);
        for (uint32_t j = 0; j < P; j++) m->g[j] = gelu_tanh(m->g[j]);
    } else {
        deq_row(&l->ple_gate, 0, m->g);
    }
    const float *p = m->pin + (uint64_t)l->slot * P;
    for (uint32_t j = 0; j < P; j++) m->t[j] = m->g[d->gate == PLE_GATE_SCALAR ? 0 : j] * p[j];
    act(m, m->t, P);
    mv(m, m->h3, &l->ple_proj);
    if (d->flags & PLE_OUTPUT_NORM) {
        deq_row(&l->ple_norm, 0, m->wv);
        rms_norm(m->h3, m->h3, m->wv, d->hidden, d->eps);
    }
    for (uint32_t i = 0; i < d->hidden; i++) m->x[i] += m->h3[i];
}

/* The PLE table rows `token` reads at `pos` (into ple_rows): its own (row 0 past a token table), or one per hash
 * head of the n-grams that end at pos, the ids before it from the ring the calls for the earlier positions filled
 * (with an id map, the token's compressed id: one 4-byte read). 0, or -1 on a failed read. */
static int table_rows(ple_model *m, uint32_t token, uint32_t pos) {
    const ple_desc *d = &m->d;
    if (d->ple_index != PLE_INDEX_NGRAM) {
        m->ple_rows[0] = token < d->ple_vocab ? token : 0;
        return 0;
    }
    uint32_t id = token, hist[PLE_NGRAM_MAX_ORDER];
    if (m->id_map) {
        uint8_t b[4];
        if (m->st->read(m->st, m->id_map->offset + 4 * (uint64_t)token, b, 4)) return -1;
        id = b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
        tally(m, m->id_map_tier, 4, 1);
    }
    m->hashed[pos % PLE_NGRAM_MAX_ORDER] = id;
    for (uint32_t i = 0; i < PLE_NGRAM_MAX_ORDER; i++)
        hist[i] = i <= pos ? m->hashed[(pos - i) % PLE_NGRAM_MAX_ORDER] : PLE_NGRAM_PAD;
    ple_ngram_rows(d->ngram, m->hash_mult, hist, m->ple_rows);
    return 0;
}

/* Input row and PLE inputs of `token` at `pos`: one record read per table (none for a resident tied head), an
 * n-gram table's S. Each of its records holds one head's slice of every PLE layer: layer l's values are the
 * heads' slices l side by side. */
static int inputs(ple_model *m, uint32_t token, uint32_t pos) {
    const ple_desc *d = &m->d;
    const uint8_t *rec = NULL;
    if (m->ple_t) {
        if (table_rows(m, token, pos)) return -1;
        uint32_t S = m->ple_reads, w = d->ple_dim / S;
        for (uint32_t j = 0; j < S; j++) {
            rec = ple_read_record(m, m->ple_t, (uint32_t)m->ple_rows[j]);
            if (!rec) return -1;
            qmat part = {m->ple_p->dtype, m->ple_p->group, 1, m->ple_p->length, rec + m->ple_p->codes,
                         rec + m->ple_p->scales, NULL, 1, 0, 0};
            deq_row(&part, 0, S == 1 ? m->raw : m->row);
            for (uint32_t l = 0; S > 1 && l < d->n_ple_layers; l++)
                memcpy(m->raw + (uint64_t)l * d->ple_dim + (uint64_t)j * w, m->row + (uint64_t)l * w, 4 * (size_t)w);
        }
    }
    if (m->embed_in_ple) {
        qmat part = {m->embed_in_ple->dtype, m->embed_in_ple->group, 1, d->hidden, rec + m->embed_in_ple->codes,
                     rec + m->embed_in_ple->scales, NULL, 1, 0, 0};
        deq_row(&part, 0, m->x);
    } else if (d->flags & PLE_TIE) {
        deq_row(&m->head, token, m->x);
        tally(m, m->embed_tier, m->embed_t->record_bytes, 1);
    } else {
        const uint8_t *e = ple_read_record(m, m->embed_t, token);
        if (!e) return -1;
        qmat part = {m->embed_p->dtype, m->embed_p->group, 1, d->hidden, e + m->embed_p->codes,
                     e + m->embed_p->scales, NULL, 1, 0, 0};
        deq_row(&part, 0, m->x);
    }
    if (d->flags & PLE_EMBED_SCALE) {
        for (uint32_t i = 0; i < d->hidden; i++) m->x[i] *= m->embed_scale;
    }
    if (!m->ple_t) return 0;
    uint32_t P = d->ple_dim, n = d->n_ple_layers * P;
    for (uint32_t j = 0; j < n; j++) m->pin[j] = m->raw[j] * m->ple_ident;
    if (!(d->flags & PLE_CONTEXT)) return 0;
    act(m, m->x, d->hidden);
    mv(m, m->ctx, &m->ctx_proj);
    float hs = m->ctx_scale, fuse = m->fuse;
    deq_row(&m->ctx_norm, 0, m->wv);
    for (uint32_t j = 0; j < n; j++) m->ctx[j] *= hs;
    for (uint32_t s = 0; s < d->n_ple_layers; s++) rms_norm(m->ctx + s * P, m->ctx + s * P, m->wv, P, d->eps);
    for (uint32_t j = 0; j < n; j++) m->pin[j] = (m->ctx[j] + m->pin[j]) * fuse;
    return 0;
}

/* Everything up to the head: feed `token` at `pos`; the normed final state is in xn. 0, or -1 on a bad id /
 * position or a failed record read. */
static int body(ple_model *m, uint32_t token, uint32_t pos) {
    const ple_desc *d = &m->d;
    if (token >= d->vocab || pos >= d->max_seq) return -1;
    m->tokens++;
    for (int t = 0; t < m->n_tiers; t++) tally(m, t, m->dense_bytes[t], m->dense_reads[t]);
    tally(m, m->kv_tier, m->kv_pos_bytes * (pos + 1), 2ull * d->layers);
    if (inputs(m, token, pos)) return -1;
    for (uint32_t i = 0; i < d->head_dim / 2; i++) { /* this position's rotation, shared by every layer */
        float ang = (float)pos * m->rope_inv[i];
        m->rope_cos[i] = cosf(ang);
        m->rope_sin[i] = sinf(ang);
    }
    for (uint32_t i = 0; i < d->layers; i++) {
        const layer_w *l = &m->L[i];
        deq_row(&l->in_norm, 0, m->wv);
        rms_norm(m->xn, m->x, m->wv, d->hidden, d->eps);
        attention(m, l, i, pos);
        deq_row(&l->post_norm, 0, m->wv);
        rms_norm(m->xn, m->x, m->wv, d->hidden, d->eps);
        ffn(m, l);
        if (l->slot >= 0) inject(m, l);
    }
    deq_row(&m->final_norm, 0, m->wv);
    rms_norm(m->xn, m->x, m->wv, d->hidden, d->eps);
    act(m, m->xn, d->hidden);
    return 0;
}

const float *ple_forward(ple_model *m, uint32_t token, uint32_t pos) {
    if (body(m, token, pos)) return NULL;
    mv(m, m->logits, &m->head);
    m->head_rows += m->head.rows;
    m->head_total += m->head.rows;
    return m->logits;
}

/* ---- the greedy head: only the rows that can still win -------------------------------------------------
 * Every head row w_r is w_r = mu + (w_r - mu) for mu, the mean row (stored), so for the activation x (its int8
 * codes times their scale, exactly what the products see) w_r . x <= mu . x + |w_r - mu| |x|. Rows are visited in
 * descending order of |w_r - mu| (sorted once in ple_open, in blocks of HEAD_BLOCK): a block whose bound is below
 * the best logit found so far cannot hold the maximum, and neither can any block after it. The computed logits
 * are exact integer sums with a few float roundings: the stored key adds a margin for those (HEAD_EPS), so the
 * id returned is the full head's argmax (first maximum), never an approximation. Needs int8 activations: the
 * float paths' rounding (biased int4 codes, vector lanes) has no such simple bound. */
/* The relative margin: covers the float roundings of a logit (one per group, the scale products) and of the bound
 * (a sum over cols, a square root, a product), with room to spare. */
static float head_eps(const qmat *w) { return (float)(w->cols / w->group + w->cols + 32) * (1.0f / 8388608.0f); }

/* Sift-down of a heap over perm[0..n) keyed by key[perm[i]], smallest key first out (so the sort is descending),
 * ties by id (ascending ids after the sort). */
static int head_before(const float *key, uint32_t a, uint32_t b) { return key[a] < key[b] || (key[a] == key[b] && a > b); }

static void sift(uint32_t *perm, const float *key, uint32_t i, uint32_t n) {
    for (;;) {
        uint32_t c = 2 * i + 1;
        if (c >= n) return;
        if (c + 1 < n && head_before(key, perm[c + 1], perm[c])) c++;
        if (!head_before(key, perm[c], perm[i])) return;
        uint32_t t = perm[c];
        perm[c] = perm[i];
        perm[i] = t;
        i = c;
    }
}

/* Mean row, per-row keys |w_r - mu| (1 + eps) + eps (|w_r| + |mu|) rounded up, rows sorted by key descending, each
 * block's key (its first row's). Uses the logits buffer for the keys. */
static void head_index(ple_model *m) {
    const qmat *w = &m->head;
    uint32_t V = w->rows, H = w->cols;
    float *key = m->logits, *row = m->row, eps = head_eps(w);
    memset(m->head_mean, 0, 4 * (size_t)H);
    for (uint32_t r = 0; r < V; r++) {
        deq_row(w, r, row);
        for (uint32_t i = 0; i < H; i++) m->head_mean[i] += row[i];
    }
    double mnorm = 0;
    for (uint32_t i = 0; i < H; i++) {
        m->head_mean[i] /= (float)V;
        mnorm += (double)m->head_mean[i] * m->head_mean[i];
    }
    mnorm = sqrt(mnorm);
    for (uint32_t r = 0; r < V; r++) {
        deq_row(w, r, row);
        double res = 0, norm = 0;
        for (uint32_t i = 0; i < H; i++) {
            double dv = (double)row[i] - m->head_mean[i];
            res += dv * dv;
            norm += (double)row[i] * row[i];
        }
        double k = sqrt(res) * (1.0 + eps) + eps * (sqrt(norm) + mnorm);
        key[r] = (float)k;
        if ((double)key[r] < k) key[r] = nextafterf(key[r], INFINITY);
        m->head_perm[r] = r;
    }
    for (uint32_t i = V / 2; i-- > 0;) sift(m->head_perm, key, i, V);
    for (uint32_t n = V; n-- > 1;) { /* the smallest key goes to the end: descending order */
        uint32_t t = m->head_perm[0];
        m->head_perm[0] = m->head_perm[n];
        m->head_perm[n] = t;
        sift(m->head_perm, key, 0, n);
    }
    for (uint32_t b = 0; b * HEAD_BLOCK < V; b++) m->head_key[b] = key[m->head_perm[b * HEAD_BLOCK]];
}

static uint32_t head_argmax(ple_model *m) {
    const qmat *w = &m->head;
    const ple_kact *a = &m->ka;
    if (!m->a_quant) ple_kact_quantize(&m->ka, m->ax, m->an);
    m->a_quant = 1;
    ple_kact_prepare(&m->ka, w->dtype);
    int32_t sq = 0;
    float mx = 0;
    for (uint32_t i = 0; i < w->cols; i++) {
        sq += a->q[i] * a->q[i];
        mx += m->head_mean[i] * (float)a->q[i];
    }
    float nx = sqrtf((float)sq) * a->scale, mux = mx * a->scale, best = -INFINITY;
    uint32_t best_id = 0, V = w->rows, done = 0;
    int records = w->table && !w->table->page && w->cols <= w->group; /* the tied head: one kernel call a block */
    for (uint32_t b = 0; b * HEAD_BLOCK < V; b++) {
        if (mux + m->head_key[b] * nx < best) break; /* sorted: no later block can win either */
        const uint32_t *rows = m->head_perm + b * HEAD_BLOCK;
        uint32_t count = V - b * HEAD_BLOCK < HEAD_BLOCK ? V - b * HEAD_BLOCK : HEAD_BLOCK;
        float v[HEAD_BLOCK];
        if (records) {
            ple_kdot_pick(v, w->dtype, w->codes, w->scales, w->table->stride, rows, count, w->cols, w->plain_scales,
                          a);
        } else {
            for (uint32_t k = 0; k < count; k++) {
                const uint8_t *c, *sc;
                uint64_t e0;
                row_ptrs(w, rows[k], &c, &sc, &e0);
                v[k] = ple_kdot(w->dtype, c, sc, w->group, e0, w->cols, a);
            }
        }
        for (uint32_t k = 0; k < count; k++) {
            uint32_t r = rows[k];
            m->logits[r] = v[k];
            if (v[k] > best || (v[k] == best && r < best_id)) best = v[k], best_id = r;
        }
        done += count;
    }
    m->head_rows += done;
    m->head_total += V;
    return best_id;
}

int64_t ple_forward_greedy(ple_model *m, uint32_t token, uint32_t pos) {
    if (body(m, token, pos)) return -1;
    if (m->opt.head_skip) return head_argmax(m);
    mv(m, m->logits, &m->head);
    m->head_rows += m->head.rows;
    m->head_total += m->head.rows;
    return ple_argmax(m->logits, m->head.rows);
}

void ple_model_head_rows(const ple_model *m, uint64_t *computed, uint64_t *total) {
    *computed = m->head_rows;
    *total = m->head_total;
}

/* ---- accessors ----------------------------------------------------------------------------------------- */

const ple_desc *ple_model_desc(const ple_model *m) { return &m->d; }
uint64_t ple_model_arena_bytes(const ple_model *m) { return m->arena_bytes; }
uint64_t ple_model_weight_bytes(const ple_model *m) { return m->weight_bytes; }
uint64_t ple_model_kv_bytes(const ple_model *m) { return m->kv_bytes; }
uint64_t ple_model_peak_bytes(const ple_model *m) { return m->peak; }

int ple_model_tier_use(const ple_model *m, ple_tier_use *out, int max) {
    int n = 0;
    for (int t = 0; t < m->n_tiers; t++) {
        if (m->tiers[t].storage) continue;
        if (n < max) {
            ple_tier_use *u = &out[n];
            snprintf(u->tier, sizeof u->tier, "%s", m->tiers[t].name);
            u->placed = m->placed[t];
            u->arena = m->tier_arena[t];
            u->available = m->opt.regions ? m->opt.regions[t].bytes : m->tiers[t].capacity;
        }
        n++;
    }
    return n;
}

int ple_model_traffic(const ple_model *m, ple_traffic *out, int max, uint64_t *tokens) {
    for (int i = 0; i < m->n_tiers && i < max; i++) {
        snprintf(out[i].tier, sizeof out[i].tier, "%s", m->tiers[i].name);
        out[i].bytes = (double)m->bytes[i];
        out[i].reads = (double)m->reads[i];
    }
    *tokens = m->tokens;
    return m->n_tiers;
}
