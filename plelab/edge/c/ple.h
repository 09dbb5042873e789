/* plelab C runtime: read a .ple file (format versions 2 and 3, docs/ple-format.md) and run its model.
 *
 * C99 + libm. Little-endian hosts only (x86, ARM, Xtensa, RISC-V as configured by ESP-IDF): weights are
 * used in place, as stored. Every allocation happens in ple_open (one arena sized from the header); the
 * decode loop (ple_forward) allocates nothing.
 */
#ifndef PLE_H
#define PLE_H

#include <stddef.h>
#include <stdint.h>

#define PLE_ERR 256           /* bytes of an error message buffer */
#define PLE_MAX_SECTIONS 16
#define PLE_MAX_PARTS 4
#define PLE_MAX_TABLES 4
#define PLE_MAX_TIERS 8

/* Format an error into err (PLE_ERR bytes) and return -1: every reader and loader reports this way. */
int ple_fail(char *err, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* The build switch, -DPLE_KERNEL=PLE_KERNEL_...: which float SIMD paths (ple_float_simd.h) and which integer kernel
 * (ple_int_kernels.h) a build compiles. PORTABLE: plain C99 loops for both; VECTOR: the GCC / clang vector
 * extensions for the float paths (their default with those compilers, except on Cortex-M), the portable integer
 * kernel; DSP: the Armv7E-M DSP integer kernel (Cortex-M4 / M7); HELIUM: the Armv8.1-M MVE integer kernel
 * (Cortex-M55); RV32: the RV32IM integer kernel (any RISC-V core with M). Without the switch each side takes the
 * best the target has. */
#define PLE_KERNEL_PORTABLE 1
#define PLE_KERNEL_VECTOR 2
#define PLE_KERNEL_DSP 3
#define PLE_KERNEL_HELIUM 4
#define PLE_KERNEL_RV32 5

enum { PLE_FP32, PLE_FP16, PLE_INT8, PLE_INT4, PLE_U1, PLE_NDTYPES };
enum { PLE_SWIGLU, PLE_MGLU, PLE_LOWRANK, PLE_MOE };
enum { PLE_GATE_INPUT, PLE_GATE_SCALAR, PLE_GATE_VECTOR };
enum { PLE_TIE = 1, PLE_EMBED_SCALE = 2, PLE_CONTEXT = 4, PLE_OUTPUT_NORM = 8, PLE_SHARED_EXPERT = 16 };
enum { PLE_INDEX_TOKEN, PLE_INDEX_NGRAM }; /* which PLE table rows a position reads (format version 3) */
#define PLE_MAX_EXPERTS 256

/* ---- the n-gram index (docs/ngram-ple.md): S = orders x heads rows per position, chosen by hashing ------ */

#define PLE_NGRAM_MAX_ORDER 8
#define PLE_NGRAM_MAX_HEADS 255 /* per order */
#define PLE_NGRAM_PAD 0xFFFFFFFFu /* the id before the sequence starts */

typedef struct {
    uint32_t n_orders, heads, seed;
    uint32_t id_map;                        /* entries of the `idmap` section: 0 (ids hashed as they are) or vocab */
    uint32_t orders[PLE_NGRAM_MAX_ORDER];  /* ascending */
    uint32_t rows[PLE_NGRAM_MAX_ORDER];    /* rows of each head of that order */
} ple_ngram;

uint32_t ple_fmix32(uint32_t h);                                                          /* MurmurHash3's */
uint32_t ple_ngram_multiplier(uint32_t seed, uint32_t order, uint32_t head, uint32_t i);  /* m(n, k, i) */
uint32_t ple_ngram_heads(const ple_ngram *g);     /* S */
uint32_t ple_ngram_max_order(const ple_ngram *g);
/* Every head's multipliers, PLE_NGRAM_MAX_ORDER per head (zero past its order), heads in table order. */
void ple_ngram_multipliers(const ple_ngram *g, uint32_t *mult);
/* The S table rows of one position: hist[i] = x[t - i] for i < max order (PLE_NGRAM_PAD before the start). */
void ple_ngram_rows(const ple_ngram *g, const uint32_t *mult, const uint32_t *hist, uint64_t *rows);

/* ---- storage: where the file's bytes come from (file/pread, mmap, memory, ESP-IDF partition) ---------- */

typedef struct ple_storage ple_storage;
struct ple_storage {
    /* Copy n bytes at offset off into dst; 0 on success, -1 on a short or failed read. */
    int (*read)(ple_storage *s, uint64_t off, void *dst, size_t n);
    /* n bytes at off, valid until close; NULL when this storage cannot map (then weights are copied). */
    const void *(*map)(ple_storage *s, uint64_t off, size_t n);
    void (*close)(ple_storage *s);
    uint64_t size; /* bytes available */
    void *ctx;
    intptr_t handle;
};

int ple_storage_file(ple_storage *s, const char *path, char *err);   /* pread, nothing mapped */
int ple_storage_mmap(ple_storage *s, const char *path, char *err);   /* whole file mapped read-only */
void ple_storage_mem(ple_storage *s, const void *buf, size_t n);     /* a buffer (tests, fuzzing) */

/* ---- the file: header, sections, binary model description ------------------------------------------ */

typedef struct { char name[17]; uint64_t offset, nbytes; uint8_t sha256[32]; } ple_section;

typedef struct {
    char name[64];
    uint8_t dtype, ndim;
    uint32_t group, shape[4];
    uint64_t numel, codes, scales, codes_bytes, scales_bytes; /* codes / scales: relative to `tensors` */
} ple_tensor;

typedef struct { char name[17]; uint8_t dtype; uint32_t group, length, codes, scales; } ple_part;

typedef struct {
    char name[17];
    uint32_t rows, record_bytes, stride, align, page, n_parts;
    ple_part parts[PLE_MAX_PARTS];
    const ple_section *section;
} ple_table;

typedef struct {
    uint32_t version, n_sections, body_crc;
    uint64_t file_bytes;
    ple_section sections[PLE_MAX_SECTIONS];
    /* MoE: inter is each expert's width, and the head's two kind fields are read as experts and top_k */
    uint32_t hidden, layers, heads, kv_heads, head_dim, vocab, max_seq, ffn_kind, inter, mask_count, rank;
    uint32_t experts, top_k;
    uint32_t ple_dim, ple_vocab, n_ple_layers, gate, flags, n_tensors, n_tables;
    uint32_t ple_index; /* PLE_INDEX_TOKEN (ple_vocab: rows, one per id) or PLE_INDEX_NGRAM (ple_vocab: all heads' rows) */
    ple_ngram *ngram;   /* the n-gram index (PLE_INDEX_NGRAM), else NULL; allocated, as the two below */
    float eps, theta;
    uint32_t *ple_layers; /* n_ple_layers sorted indices */
    ple_tensor *tensors;
    ple_table tables[PLE_MAX_TABLES];
} ple_desc;

/* Read and validate header, section table and model description (checksums of meta + model included).
 * Allocates desc->ple_layers, desc->tensors and desc->ngram (free with ple_desc_free). 0 or -1 with err set. */
int ple_read_desc(ple_storage *st, ple_desc *desc, char *err);
void ple_desc_free(ple_desc *desc);
/* SHA-256 of every other section and the body CRC-32 (the row tables, the id map, the tokenizer and their padding
 * skipped unless tables). */
int ple_verify(ple_storage *st, const ple_desc *desc, int tables, char *err);
const ple_section *ple_find_section(const ple_desc *d, const char *name);
const ple_table *ple_find_table(const ple_desc *d, const char *name);
const ple_part *ple_find_part(const ple_table *t, const char *name);
uint64_t ple_row_offset(const ple_table *t, uint32_t row);
uint32_t ple_crc32(uint32_t crc, const void *buf, size_t n);
void ple_sha256(const void *buf, size_t n, uint8_t out[32]);

/* ---- device profiles and placement (the same first-fit as plelab/edge/placement.py) ----------------------- */

typedef struct { char name[32]; int storage; uint64_t capacity; } ple_tier;
typedef struct { char name[64]; int n_tiers; ple_tier tiers[PLE_MAX_TIERS]; } ple_device;

/* A built-in profile by name (generated from devices.toml) or a profile file; 0 or -1 with err set. */
int ple_device_load(const char *name_or_file, ple_device *dev, char *err);
/* The built-in profiles' names, comma separated. */
const char *ple_device_names(void);

/* ---- the model ------------------------------------------------------------------------------------ */

/* Caller memory for one RAM tier (a microcontroller's SRAM or PSRAM: the runtime never mallocs the arena then). */
typedef struct {
    void *base;
    uint64_t bytes;
} ple_region;

typedef struct {
    int verify;                /* 0 none, 1 all but the row tables, 2 every byte */
    int map_weights;           /* use weights in place when the storage maps (not counted in the arena) */
    const ple_device *device;  /* NULL: host accounting (rows from `file`, weights in `ram`) */
    uint64_t max_arena;        /* refuse models whose arena would exceed this many bytes (0: no limit) */
    int int8_act;              /* products with int8 / int4 weights take int8 activations (ple_int_kernels.h); 0: float */
    int int8_kv;               /* keep the KV cache as int8 codes + one float scale per head vector; 0: float32 */
    int head_skip;             /* ple_forward_greedy computes only the head rows that can still win (needs int8_act) */
    /* NULL: one malloc'ed arena. Else device->n_tiers entries (storage tiers' ignored): each tensor and the
     * KV cache go to the region of the tier the placement chose, the working buffers to the fastest region
     * with room; a model that does not fit is refused naming the bytes needed and the region's size. */
    const ple_region *regions;
} ple_options;

/* Per RAM tier: what the model takes of it. */
typedef struct {
    char tier[32];
    uint64_t placed;    /* weights + KV cache placed there (plelab place's `used` at context max_seq_len) */
    uint64_t arena;     /* bytes of it the model occupies: placed, 64-byte alignment, working buffers */
    uint64_t available; /* the region's bytes, or the tier's capacity when there are no regions */
} ple_tier_use;

typedef struct {
    char tier[32];
    double bytes, reads;
} ple_traffic;

typedef struct ple_model ple_model;

int ple_open(ple_model **out, ple_storage *st, const ple_options *opt, char *err);
/* Logits (vocab floats, valid until the next call) after feeding `token` at position `pos` (0, 1, 2...). */
const float *ple_forward(ple_model *m, uint32_t token, uint32_t pos);
/* The greedy step: as ple_forward, then the id of the largest logit (the first on ties, as numpy.argmax), or -1
 * where ple_forward returns NULL. With opt.head_skip only the head rows that can still beat the best so far are
 * computed (the same id; the other logits are left stale). */
int64_t ple_forward_greedy(ple_model *m, uint32_t token, uint32_t pos);
/* The first index of the largest of v[0..n) (numpy.argmax for NaN-free input). */
uint32_t ple_argmax(const float *v, uint32_t n);
/* Head rows computed and head rows there are, summed over every step so far. */
void ple_model_head_rows(const ple_model *m, uint64_t *computed, uint64_t *total);
/* One token's record of a row table: one storage read of record_bytes into the model's record buffer. */
const uint8_t *ple_read_record(ple_model *m, const ple_table *t, uint32_t row);
const ple_desc *ple_model_desc(const ple_model *m);
/* Per-tier traffic accumulated so far; returns the tier count, fills at most max entries. */
int ple_model_traffic(const ple_model *m, ple_traffic *out, int max, uint64_t *tokens);
uint64_t ple_model_arena_bytes(const ple_model *m);
uint64_t ple_model_weight_bytes(const ple_model *m);
uint64_t ple_model_kv_bytes(const ple_model *m);
uint64_t ple_model_peak_bytes(const ple_model *m);
/* Use of each RAM tier (fills at most max entries); returns the number of RAM tiers. */
int ple_model_tier_use(const ple_model *m, ple_tier_use *out, int max);
void ple_close(ple_model *m);

#endif
