/* Integer kernels (ple_int_kernels.h): activation quantisation, the shared dot-product driver, and the four
 * compile-time implementations of its inner runs (portable C, Arm DSP, Arm Helium, RV32IM).
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

#endif

#if PLE_IKERNEL == PLE_KERNEL_PORTABLE || PLE_IKERNEL == PLE_KERNEL_VECTOR || PLE_IKERNEL == PLE_KERNEL_RV32
/* int8 weights: one product and one add per value (plain RV32 has no multiply-accumulate, nor lanes to spare: a
 * biased int8 code times an int8 activation fills a 16-bit lane on its own). */
static int32_t kseg_i8(const int8_t *w, const ple_kact *a, uint32_t x0, uint32_t n) {
    const int8_t *q = a->q + x0;
    int32_t s = 0;
    for (uint32_t i = 0; i < n; i++) s += w[i] * q[i];
    return s;
}
#endif

/* ---- RV32IM (the ESP32-P4's and C6's cores, no SIMD used): two products per 32-bit multiply ---------------------
 * int4: a word holds eight codes, code i in bits 4i..4i+3. v = w ^ 0x88888888 makes each nibble u_i = code_i + 8, in
 * [0, 15]; A_k = (v >> 4k) & 0x000F000F holds u_k and u_(k+4) in two 16-bit lanes (k = 0..3: seven shifts and
 * masks a word). The activation is laid out once as X_k = q_(k+4) + q_k * 2^16, its lanes crossed, so the low 32
 * bits of A_k * X_k are u_k q_(k+4) + (u_k q_k + u_(k+4) q_(k+4)) * 2^16: the two products sit together in the high
 * half. Sixteen products are summed before that half is read: their low halves add up to at most 8 * 15 * 127 =
 * 15,240 in magnitude and the high halves to 16 * 1,905 = 30,480, so with 2^15 added first, (sum >> 16) is the high
 * half exactly. The sum of u_i q_i is sum(code_i q_i) + 8 sum(q_i); per-8-value prefix sums of q take the second
 * term off. The head's rows (rv_rows4_total) start their sums at 2^15 - 8 sum(q) * 2^16 instead, so the high half
 * holds code * q itself, at most 8 * 127 = 1,016 a product, and 32 products go between reads.
 *
 * Words are read aligned (RISC-V cores may trap on a misaligned one, or take many cycles). A run whose codes start two
 * bytes into a word reads from the aligned word before, against a second layout of the activation shifted by four
 * values (X4, four zero values first): the four codes outside the run meet zeros there, or are masked off; a head
 * record there of 32 values or more is read as its n/8 words all the same, its first four codes and its last four
 * joined into one (rv_rows4_wrap_total). Runs that start at an odd byte (records of an odd stride) join two aligned
 * words per word. */
#if PLE_IKERNEL == PLE_KERNEL_RV32
#define ALIGN_I4 8
#define ALIGN_I8 1
#define RV_LANES 0x000F000Fu
#define RV_BIAS 0x88888888u
/* At a->lay: X0 (four words per 8 values), X4 (the same for the values shifted by four: block j holds values
 * 8j - 4 .. 8j + 3, one block more), PAD16(cap) / 8 + 1 prefix sums P[j] = q[0] + ... + q[8j - 1], and for each of
 * X0 and X4 the start of the sum of each RV_CHUNK words: 2^15 - 8 * (the sum of q over them) * 2^16. Then for rows
 * of n = a->n values (a multiple of 8) that start two bytes into a word, read whole (rv_rows4_wrap): the chunk
 * starts of their words (word 0 the row's first and last four values joined, then X4's blocks 1 .. n/8 - 1) and XW,
 * the four activation words word 0 meets. */
#define RV_CHUNK 4 /* words between reads of the high halves when sums start at a chunk value (32 products) */
static inline const uint32_t *rv_x0(const ple_kact *a) { return (const uint32_t *)a->lay; }
static inline const uint32_t *rv_x4(const ple_kact *a) { return rv_x0(a) + PAD16(a->cap) / 2; }
static inline const int32_t *rv_prefix(const ple_kact *a) { return (const int32_t *)(rv_x4(a) + PAD16(a->cap) / 2 + 4); }
static inline const uint32_t *rv_chunk(const ple_kact *a, unsigned shift) {
    return (const uint32_t *)(rv_prefix(a) + PAD16(a->cap) / 8 + 1) + (shift ? PAD16(a->cap) / 32 + 2 : 0);
}
static inline const uint32_t *rv_chunk_wrap(const ple_kact *a) { return rv_chunk(a, 16) + PAD16(a->cap) / 32 + 2; }
static inline const uint32_t *rv_xw(const ple_kact *a) { return rv_chunk_wrap(a) + PAD16(a->cap) / 32 + 2; }

static inline uint32_t rv_pair(int32_t low, int32_t high) { return (uint32_t)low + ((uint32_t)high << 16); }
static inline uint32_t rv_chunk_start(int32_t sum) { return 0x8000u - ((uint32_t)(8 * sum) << 16); }

static void kact_layout(ple_kact *a, int dtype) {
    if (dtype != PLE_INT4) return; /* int8 weights read a->q directly */
    uint32_t *x0 = (uint32_t *)rv_x0(a), *x4 = (uint32_t *)rv_x4(a), blocks = (uint32_t)PAD16(a->n) / 8, n = a->n;
    uint32_t *c0 = (uint32_t *)rv_chunk(a, 0), *c4 = (uint32_t *)rv_chunk(a, 16);
    int32_t *prefix = (int32_t *)rv_prefix(a), run = 0, s0 = 0, s4 = 0; /* s0, s4: the sums of X0's, X4's open chunk */
    const int8_t *q = a->q; /* zero from n up to PAD16(n) */
    for (uint32_t j = 0; j < blocks; j++) {
        const int8_t *b = q + 8 * j;
        int32_t lo = b[0] + b[1] + b[2] + b[3], hi = b[4] + b[5] + b[6] + b[7];
        for (int k = 0; k < 4; k++) x0[4 * j + k] = rv_pair(b[k + 4], b[k]);           /* q[8j + k + 4], q[8j + k] */
        for (int k = 0; k < 4; k++) x4[4 * j + k] = rv_pair(b[k], j ? b[k - 4] : 0); /* q[8j + k], q[8j + k - 4] */
        prefix[j] = run;
        run += lo + hi;
        s0 += lo + hi, s4 += lo; /* X4's block j: the high half of block j - 1 (in s4 already), the low half of j */
        if (j % RV_CHUNK == RV_CHUNK - 1) c0[j / RV_CHUNK] = rv_chunk_start(s0), c4[j / RV_CHUNK] = rv_chunk_start(s4);
        if (j % RV_CHUNK == RV_CHUNK - 1) s0 = s4 = 0;
        s4 += hi;
    }
    prefix[blocks] = run;
    for (int k = 0; k < 4; k++) x4[4 * blocks + k] = rv_pair(0, q[8 * blocks + k - 4]); /* X4's block past the end */
    if (blocks % RV_CHUNK) c0[blocks / RV_CHUNK] = rv_chunk_start(s0);
    c4[blocks / RV_CHUNK] = rv_chunk_start(s4);
    if (n % 8 || !n) return;
    /* rows read whole from two bytes into a word: the last four values move from the chunk of X4's block n/8 (not
     * read) into chunk 0, with word 0 */
    uint32_t words = n / 8, *cw = (uint32_t *)rv_chunk_wrap(a), *xw = (uint32_t *)rv_xw(a);
    uint32_t tail = (uint32_t)(8 * (q[n - 4] + q[n - 3] + q[n - 2] + q[n - 1])) << 16;
    for (uint32_t c = 0; c * RV_CHUNK < words; c++) cw[c] = c4[c];
    cw[0] -= tail;
    if (words % RV_CHUNK) cw[words / RV_CHUNK] += tail;
    for (int k = 0; k < 4; k++) xw[k] = rv_pair(q[n - 4 + k], q[k]); /* position k: value k; k + 4: value n - 4 + k */
}

/* Add one word's eight products (v biased) against x[0..4) to s, in its lanes. */
static inline uint32_t rv_word(uint32_t s, uint32_t v, const uint32_t *x) {
    s += (v & RV_LANES) * x[0];
    s += ((v >> 4) & RV_LANES) * x[1];
    s += ((v >> 8) & RV_LANES) * x[2];
    return s + ((v >> 12) & RV_LANES) * x[3];
}

/* The word at w[j] (biased), or for an odd byte offset (shift 8 or 24 bits) the one joined from w[j] and w[j + 1]. */
static inline uint32_t rv_load(const uint32_t *w, uint32_t j, unsigned shift) {
    return (shift == 0 || shift == 16 ? w[j] : w[j] >> shift | w[j + 1] << (32 - shift)) ^ RV_BIAS;
}

/* The sum of u_i q_i over `words` words from w[0] (biased; `head` masks the first, `tail` the last), two words per
 * read of the lanes' high halves. */
static inline __attribute__((always_inline)) int32_t rv_sum(const uint32_t *w, unsigned shift, uint32_t words,
                                                            const uint32_t *x, uint32_t head, uint32_t tail) {
    int32_t acc = 0;
    uint32_t j = 0;
    for (; j + 2 <= words; j += 2, x += 8) {
        uint32_t v0 = rv_load(w, j, shift), v1 = rv_load(w, j + 1, shift);
        if (j == 0) v0 &= head;
        if (j + 2 == words) v1 &= tail;
        acc += (int32_t)rv_word(rv_word(0x8000u, v0, x), v1, x + 4) >> 16;
    }
    if (j < words) acc += (int32_t)rv_word(0x8000u, rv_load(w, j, shift) & tail & (j ? ~0u : head), x) >> 16;
    return acc;
}

/* Codes at an odd byte offset (records of an odd stride): each word joined from two; out of line, being rare. */
static __attribute__((noinline)) int32_t rv_sum_odd(const uint32_t *w, unsigned shift, uint32_t words,
                                                    const uint32_t *x) {
    return shift == 8 ? rv_sum(w, 8, words, x, ~0u, ~0u) : rv_sum(w, 24, words, x, ~0u, ~0u);
}

/* The exact sum of code_i q[x0 + i] over n values (x0 and n multiples of 8) whose codes start at byte wb. */
static inline __attribute__((always_inline)) int32_t kseg_i4(const uint8_t *wb, const ple_kact *a, uint32_t x0,
                                                            uint32_t n) {
    const int32_t *prefix = rv_prefix(a);
    const uint32_t *w = (const uint32_t *)(const void *)((uintptr_t)wb & ~(uintptr_t)3);
    unsigned shift = 8 * (unsigned)((uintptr_t)wb & 3u);
    int32_t sum;
    if (shift == 0)
        sum = rv_sum(w, 0, n / 8, rv_x0(a) + x0 / 2, ~0u, ~0u);
    else if (shift == 16) /* from the word before, against X4; the codes outside the run masked off */
        sum = rv_sum(w, 16, n / 8 + 1, rv_x4(a) + x0 / 2, 0xFFFF0000u, 0x0000FFFFu);
    else
        sum = rv_sum_odd(w, shift, n / 8, rv_x0(a) + x0 / 2);
    return sum - 8 * (prefix[(x0 + n) / 8] - prefix[x0 / 8]);
}

/* The exact sum of code_i q[x0 + i] over any n values (x0 even) whose codes start at byte wb, first code in its low
 * nibble: the whole blocks of eight around them against X0, each word joined from two aligned ones at any byte
 * offset, the codes outside the run set to code 0 before the bias (they add 8 q, which the blocks' prefix sums take
 * out with the rest). It reads up to the end of the block of eight that holds the run's last value, and a word past
 * that, so up to 8 bytes after the run: callers keep it to rows followed by a whole row of at least 8 bytes. Rows whose length is not a multiple of eight (a SwiGLU `down` of
 * 66 columns: rows at odd byte offsets, group boundaries anywhere) took ~10 instructions a value in the scalar loop;
 * here a word of eight takes ~26. */
#define KSEG_I4_ANY 1
static int32_t kseg_i4_any(const uint8_t *wb, const ple_kact *a, uint32_t x0, uint32_t n) {
    uint32_t b0 = x0 & ~7u, b1 = (x0 + n + 7) & ~7u, lead = x0 - b0, last = x0 + n - (b1 - 8);
    const uint8_t *start = wb - lead / 2;
    const uint32_t *w = (const uint32_t *)(const void *)((uintptr_t)start & ~(uintptr_t)3), *x = rv_x0(a) + b0 / 2;
    unsigned shift = 8 * (unsigned)((uintptr_t)start & 3u), back = 31 - shift; /* shift 0: (hi << 1) << 31 is 0 */
    uint32_t words = (b1 - b0) / 8, head = ~0u << (4 * lead), tail = ~0u >> (32 - 4 * last), lo = *w++, hi;
#define RV_JOINED(v) (hi = *w++, v = lo >> shift | (hi << 1) << back, lo = hi)
    int32_t acc = 0;
    uint32_t j = 0, v0, v1;
    for (; j + 2 <= words; j += 2, x += 8) {
        RV_JOINED(v0);
        RV_JOINED(v1);
        if (j == 0) v0 &= head;
        if (j + 2 == words) v1 &= tail;
        acc += (int32_t)rv_word(rv_word(0x8000u, v0 ^ RV_BIAS, x), v1 ^ RV_BIAS, x + 4) >> 16;
    }
    if (j < words) {
        RV_JOINED(v0);
        acc += (int32_t)rv_word(0x8000u, (v0 & tail & (j ? ~0u : head)) ^ RV_BIAS, x) >> 16;
    }
#undef RV_JOINED
    return acc - 8 * (rv_prefix(a)[b1 / 8] - rv_prefix(a)[b0 / 8]);
}

/* Rows four at a time: a tied head's records (krows_i4) and a dense matrix's rows (kdense_i4). Each activation word
 * loaded serves four rows, and so does the loop's bookkeeping; a sum starts at its chunk's value, 2^15 - 8 sum(q) *
 * 2^16, so its high half holds code * q itself and 32 products (RV_CHUNK words) go between reads. A head's four rows
 * must start at one offset in their words: records of a stride of 2 mod 4 alternate between offsets 0 and 2, so
 * every other row is taken, against X0, or (offset 2) joining each row's first and last four codes into one word so
 * that the row is still n/8 aligned words; rows at odd byte offsets go one by one. */
#define KROWS_I4 1
#define KDENSE_I4 1
#define RV_DENSE_MAX_CHUNKS 32 /* a dense row of up to 1,024 values goes four at a time (its chunk sums: 512 bytes) */

/* The loops are written in assembly: GCC 12 kept the four rows' pointers, sums and the activation words of a chunk
 * in too few registers and spilled (330 instructions for a chunk of 128 products, against 304 here). One step: row
 * R's word (in t0) into its sum sR (FROM: sR itself, or the chunk value) against the chunk's activation words in
 * t3..t6 (16 instructions: the bias, seven shifts and masks, four products and their sums; t1 is its scratch); with
 * the word's load, 17. */
#define RV_BODY(R, FROM)                                                                                            \
    "xor t0, t0, %[bias]\n\t"                                                                                       \
    "and t1, t0, %[lanes]\n\t"                                                                                      \
    "mul t1, t1, t3\n\t"                                                                                            \
    "add %[s" #R "], " FROM ", t1\n\t"                                                                               \
    "srli t1, t0, 4\n\t"                                                                                            \
    "and t1, t1, %[lanes]\n\t"                                                                                      \
    "mul t1, t1, t4\n\t"                                                                                            \
    "add %[s" #R "], %[s" #R "], t1\n\t"                                                                            \
    "srli t1, t0, 8\n\t"                                                                                            \
    "and t1, t1, %[lanes]\n\t"                                                                                      \
    "mul t1, t1, t5\n\t"                                                                                            \
    "add %[s" #R "], %[s" #R "], t1\n\t"                                                                            \
    "srli t0, t0, 12\n\t"                                                                                           \
    "and t0, t0, %[lanes]\n\t"                                                                                      \
    "mul t0, t0, t6\n\t"                                                                                            \
    "add %[s" #R "], %[s" #R "], t0\n\t"
#define RV_STEP(R, OFF, FROM) "lw t0, " #OFF "(%[p" #R "])\n\t" RV_BODY(R, FROM)
/* Row R's word 0 at offset 2: the high half of its first word (codes 0..3) and the low half of the word `last`
 * bytes on (codes n - 4 .. n - 1), six instructions where a load was. */
#define RV_JOIN(R)                                                                                                  \
    "add t1, %[p" #R "], %[last]\n\t"                                                                               \
    "lw t1, 0(t1)\n\t"                                                                                              \
    "lw t0, 0(%[p" #R "])\n\t"                                                                                      \
    "srli t0, t0, 16\n\t"                                                                                           \
    "slli t1, t1, 16\n\t"                                                                                           \
    "or t0, t0, t1\n\t" RV_BODY(R, "t2")
/* Word W (at byte W of each row, XOFF of the activation) for the four rows: its activation words, each row's step;
 * a chunk's first word starts each sum at the chunk value (in t2), the others add on. */
#define RV_XWORDS(X, XOFF)                                                                                          \
    "lw t3, " #XOFF "(%[" #X "])\n\t"                                                                               \
    "lw t4, " #XOFF "+4(%[" #X "])\n\t"                                                                             \
    "lw t5, " #XOFF "+8(%[" #X "])\n\t"                                                                             \
    "lw t6, " #XOFF "+12(%[" #X "])\n\t"
#define RV_FIRST(W, XOFF)                                                                                           \
    RV_XWORDS(x, XOFF) RV_STEP(0, W, "t2") RV_STEP(1, W, "t2") RV_STEP(2, W, "t2") RV_STEP(3, W, "t2")
#define RV_WORD(W, XOFF)                                                                                            \
    RV_XWORDS(x, XOFF) RV_STEP(0, W, "%[s0]") RV_STEP(1, W, "%[s1]") RV_STEP(2, W, "%[s2]") RV_STEP(3, W, "%[s3]")
/* The next chunk value, into t2. */
#define RV_INIT                                                                                                     \
    "lw t2, 0(%[c])\n\t"                                                                                            \
    "addi %[c], %[c], 4\n\t"
/* Each sum's high half: into its row's total (the head), or stored, chunk by chunk (a dense matrix's groups). */
#define RV_READ_TOTAL                                                                                               \
    "srai t1, %[s0], 16\n\t"                                                                                        \
    "add %[a0], %[a0], t1\n\t"                                                                                      \
    "srai t1, %[s1], 16\n\t"                                                                                        \
    "add %[a1], %[a1], t1\n\t"                                                                                      \
    "srai t1, %[s2], 16\n\t"                                                                                        \
    "add %[a2], %[a2], t1\n\t"                                                                                      \
    "srai t1, %[s3], 16\n\t"                                                                                        \
    "add %[a3], %[a3], t1\n\t"
#define RV_READ_STORE                                                                                               \
    "srai t1, %[s0], 16\n\t"                                                                                        \
    "sw t1, 0(%[h])\n\t"                                                                                            \
    "srai t1, %[s1], 16\n\t"                                                                                        \
    "sw t1, 4(%[h])\n\t"                                                                                            \
    "srai t1, %[s2], 16\n\t"                                                                                        \
    "sw t1, 8(%[h])\n\t"                                                                                            \
    "srai t1, %[s3], 16\n\t"                                                                                        \
    "sw t1, 12(%[h])\n\t"                                                                                           \
    "addi %[h], %[h], 16\n\t"
/* Every row pointer and the activation on by STEP bytes (the activation four times as far). */
#define RV_ADVANCE(STEP)                                                                                            \
    "addi %[p0], %[p0], " #STEP "\n\t"                                                                              \
    "addi %[p1], %[p1], " #STEP "\n\t"                                                                              \
    "addi %[p2], %[p2], " #STEP "\n\t"                                                                              \
    "addi %[p3], %[p3], " #STEP "\n\t"                                                                              \
    "addi %[x], %[x], 4*" #STEP "\n\t"
/* Full chunks of four words until the activation reaches `end`, then the words left, each into the last chunk's sum
 * (the first one starting it), each read as READ says. */
#define RV_ROWS4(READ, ...)                                                                                         \
    do {                                                                                                            \
        const uint32_t *end = x + 4 * (words / RV_CHUNK * RV_CHUNK);                                                \
        uint32_t s0, s1, s2, s3;                                                                                    \
        if (x != end)                                                                                               \
            __asm__ volatile("1:\n\t" RV_INIT RV_FIRST(0, 0) RV_WORD(4, 16) RV_WORD(8, 32) RV_WORD(12, 48) READ     \
                             RV_ADVANCE(16) "bne %[x], %[end], 1b\n\t" RV_OPERANDS(__VA_ARGS__));                   \
        end = x + 4 * (words % RV_CHUNK);                                                                           \
        if (x != end)                                                                                               \
            __asm__ volatile(RV_INIT RV_FIRST(0, 0) RV_ADVANCE(4) "beq %[x], %[end], 2f\n\t"                          \
                             "1:\n\t" RV_WORD(0, 0) RV_ADVANCE(4) "bne %[x], %[end], 1b\n\t"                         \
                             "2:\n\t" READ RV_OPERANDS(__VA_ARGS__));                                               \
    } while (0)
#define RV_OPERANDS(...)                                                                                            \
    : __VA_ARGS__, [p0] "+r"(p0), [p1] "+r"(p1), [p2] "+r"(p2), [p3] "+r"(p3), [x] "+r"(x), [c] "+r"(chunk),       \
      [s0] "=&r"(s0), [s1] "=&r"(s1), [s2] "=&r"(s2), [s3] "=&r"(s3)                                                \
    : [lanes] "r"(RV_LANES), [bias] "r"(RV_BIAS), [end] "r"(end)                                                    \
    : "t0", "t1", "t2", "t3", "t4", "t5", "t6", "memory"

/* total[i * apart] = the sum of code * q over `words` words of row i (codes at p0..p3 against x, sums from
 * chunk[0]). */
static inline __attribute__((always_inline)) void rv_rows4_total(int32_t *total, const uint32_t *p0, const uint32_t *p1,
                                                                 const uint32_t *p2, const uint32_t *p3,
                                                                 const uint32_t *x, uint32_t words,
                                                                 const uint32_t *chunk, uint32_t apart) {
    int32_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    RV_ROWS4(RV_READ_TOTAL, [a0] "+r"(a0), [a1] "+r"(a1), [a2] "+r"(a2), [a3] "+r"(a3));
    total[0] = a0, total[apart] = a1, total[2 * apart] = a2, total[3 * apart] = a3;
}

/* The same for rows of n = a->n values (`words` = n/8, at least RV_CHUNK) two bytes into their words, p0..p3 at the
 * aligned word that holds each row's codes 0..3 in its high half: the first chunk starts with the joined word 0
 * (against XW), then X4's blocks 1 .. words - 1 meet the words after it. */
static inline __attribute__((always_inline)) void rv_rows4_wrap_total(int32_t *total, const uint32_t *p0,
                                                                      const uint32_t *p1, const uint32_t *p2,
                                                                      const uint32_t *p3, const ple_kact *a,
                                                                      uint32_t words, uint32_t apart) {
    const uint32_t *x = rv_x4(a), *chunk = rv_chunk_wrap(a);
    uint32_t s0, s1, s2, s3;
    __asm__ volatile(RV_INIT RV_XWORDS(xw, 0) RV_JOIN(0) RV_JOIN(1) RV_JOIN(2) RV_JOIN(3) RV_WORD(4, 16)
                     RV_WORD(8, 32) RV_WORD(12, 48) RV_ADVANCE(16)
                     "srai %[s0], %[s0], 16\n\t"
                     "srai %[s1], %[s1], 16\n\t"
                     "srai %[s2], %[s2], 16\n\t"
                     "srai %[s3], %[s3], 16\n\t"
                     : [p0] "+r"(p0), [p1] "+r"(p1), [p2] "+r"(p2), [p3] "+r"(p3), [x] "+r"(x), [c] "+r"(chunk),
                       [s0] "=&r"(s0), [s1] "=&r"(s1), [s2] "=&r"(s2), [s3] "=&r"(s3)
                     : [lanes] "r"(RV_LANES), [bias] "r"(RV_BIAS), [xw] "r"(rv_xw(a)), [last] "r"(4 * words)
                     : "t0", "t1", "t2", "t3", "t4", "t5", "t6", "memory");
    int32_t a0 = (int32_t)s0, a1 = (int32_t)s1, a2 = (int32_t)s2, a3 = (int32_t)s3;
    words -= RV_CHUNK;
    RV_ROWS4(RV_READ_TOTAL, [a0] "+r"(a0), [a1] "+r"(a1), [a2] "+r"(a2), [a3] "+r"(a3));
    total[0] = a0, total[apart] = a1, total[2 * apart] = a2, total[3 * apart] = a3;
}

/* h[4c + i] = the sum of code * q over chunk c (RV_CHUNK words) of row i, for every chunk of `words` words. */
static void rv_rows4_chunks(int32_t *h, const uint32_t *p0, const uint32_t *p1, const uint32_t *p2, const uint32_t *p3,
                            const uint32_t *x, uint32_t words, const uint32_t *chunk) {
    RV_ROWS4(RV_READ_STORE, [h] "+r"(h));
}

static inline const uint32_t *rv_words_at(const uint8_t *p) { return (const uint32_t *)(const void *)p; }

/* The sums of four records at byte offsets off[0..4) of codes, each `shift` bits into its word (0 or 16; n = a->n
 * values), into isum[at[0..4)]. */
static inline __attribute__((always_inline)) void rv_sums4(int32_t *isum, const uint32_t *at, const uint8_t *codes,
                                                           const size_t *off, unsigned shift, uint32_t n,
                                                           const ple_kact *a) {
    int32_t sum[4];
    const uint8_t *c = codes - shift / 8;
    if (shift && n >= 8 * RV_CHUNK)
        rv_rows4_wrap_total(sum, rv_words_at(c + off[0]), rv_words_at(c + off[1]), rv_words_at(c + off[2]),
                            rv_words_at(c + off[3]), a, n / 8, 1);
    else /* offset 0 against X0; short rows at offset 2 read one word more, against X4 */
        rv_rows4_total(sum, rv_words_at(c + off[0]), rv_words_at(c + off[1]), rv_words_at(c + off[2]),
                       rv_words_at(c + off[3]), shift ? rv_x4(a) : rv_x0(a), n / 8 + shift / 16, rv_chunk(a, shift), 1);
    for (int k = 0; k < 4; k++) isum[at[k]] = sum[k];
}

#define RV_HEAD_ROWS 256 /* rows whose sums one pass keeps (1 KiB of stack), then scales them all */

/* Up to RV_HEAD_ROWS rows (n = a->n values each) into isum: four at a time within each offset class of their words
 * (0 or 2 bytes in), rows at odd byte offsets and the last of a class one by one. */
static void rv_head_sums(int32_t *isum, const uint8_t *codes, size_t stride, const uint32_t *idx, uint32_t rows,
                         uint32_t n, const ple_kact *a) {
    if (!idx) { /* the tied head in order: records of a stride of 2 mod 4 alternate between offsets 0 and 2 */
        uint32_t period = stride % 4 == 0 ? 1 : stride % 4 == 2 ? 2 : 4;
        size_t step = period * stride;
        for (uint32_t first = 0; first < period && first < rows; first++) {
            unsigned shift = 8 * (unsigned)(((uintptr_t)codes + first * stride) & 3u);
            uint32_t r = first;
            const uint8_t *c = codes + first * stride - shift / 8;
            if (shift == 0 || (shift == 16 && n < 8 * RV_CHUNK)) { /* short rows at offset 2: one word more, X4 */
                const uint32_t *x = shift ? rv_x4(a) : rv_x0(a), *chunk = rv_chunk(a, shift);
                uint32_t words = n / 8 + shift / 16;
                for (; r + 3 * period < rows; r += 4 * period, c += 4 * step)
                    rv_rows4_total(isum + r, rv_words_at(c), rv_words_at(c + step), rv_words_at(c + 2 * step),
                                   rv_words_at(c + 3 * step), x, words, chunk, period);
            } else if (shift == 16) {
                for (; r + 3 * period < rows; r += 4 * period, c += 4 * step)
                    rv_rows4_wrap_total(isum + r, rv_words_at(c), rv_words_at(c + step), rv_words_at(c + 2 * step),
                                        rv_words_at(c + 3 * step), a, n / 8, period);
            }
            for (; r < rows; r += period) isum[r] = kseg_i4(codes + r * stride, a, 0, n);
        }
        return;
    }
    uint32_t wait[2][4], waiting[2] = {0, 0}; /* picked rows (the greedy head's blocks): grouped by offset class */
    for (uint32_t r = 0; r < rows; r++) {
        size_t off = idx[r] * stride;
        unsigned shift = 8 * (unsigned)(((uintptr_t)codes + off) & 3u);
        if (shift % 16) {
            isum[r] = kseg_i4(codes + off, a, 0, n);
            continue;
        }
        uint32_t *w = wait[shift / 16];
        w[waiting[shift / 16]++] = r;
        if (waiting[shift / 16] == 4) {
            size_t offs[4] = {idx[w[0]] * stride, idx[w[1]] * stride, idx[w[2]] * stride, idx[w[3]] * stride};
            rv_sums4(isum, w, codes, offs, shift, n, a);
            waiting[shift / 16] = 0;
        }
    }
    for (int k = 0; k < 2; k++)
        for (uint32_t j = 0; j < waiting[k]; j++) isum[wait[k][j]] = kseg_i4(codes + idx[wait[k][j]] * stride, a, 0, n);
}

#ifndef PLE_SOFT_FLOAT
/* out[r] = PLE_SCALED_X(isum[r], the fp16 at sc[r], xs), bit for bit, with the fp16 read in one halfword load (sc[r]
 * even) and no rescaling: its bits placed as a float's are its value times 2^-112 (exactly, and the product with isum
 * still a normal float, for an fp16 exponent of 1..30), and xs times 2^112 (exact for |xs| < 2^16) gives that back,
 * so the two products are the same real numbers, rounded alike. Other scales go the plain way. */
static inline __attribute__((always_inline)) float rv_scaled_x(int32_t isum, const uint8_t *sc, float xs,
                                                               float xs112, int plain) {
    uint16_t h;
    memcpy(&h, __builtin_assume_aligned(sc, 2), 2);
    /* exponent 0 or 31; a zero scale (the one exponent-0 case `plain` admits) comes out exactly either way */
    if (!plain && ((uint32_t)h << 17) - (1u << 27) >= (30u << 27)) return PLE_SCALED_X(isum, sc, xs);
    uint32_t u = (uint32_t)((int32_t)((uint32_t)h << 16) >> 3) & 0x8fffffffu; /* sign, then the exponent and mantissa */
    float f;
    memcpy(&f, &u, 4);
    return (float)isum * f * xs112;
}
#endif

/* out[r] for `take` rows from their sums, the r-th scale at sc + r * stride (or at scales + idx[r] * stride). Out of
 * line with a float unit (the greedy head's blocks of 16 rows took ~0.1 M instructions a token fewer so), inline
 * without (there the call cost as much). */
#ifdef PLE_SOFT_FLOAT
#define RV_SCALE_LINKAGE static inline __attribute__((always_inline))
#else
#define RV_SCALE_LINKAGE static
#endif
#ifndef PLE_SOFT_FLOAT
/* rv_scale_rows' fast loops, for `plain` a constant where it is called (so each copy is specialised) */
static inline __attribute__((always_inline)) void rv_scale_fast(float *out, const int32_t *isum, const uint8_t *sc,
                                                                size_t stride, const uint32_t *idx, uint32_t take,
                                                                float xs, float xs112, int plain) {
    if (idx)
        for (uint32_t r = 0; r < take; r++) out[r] = rv_scaled_x(isum[r], sc + idx[r] * stride, xs, xs112, plain);
    else { /* four a pass: the loop's bookkeeping once */
        uint32_t r = 0;
        for (; r + 4 <= take; r += 4, sc += 4 * stride) {
            out[r] = rv_scaled_x(isum[r], sc, xs, xs112, plain);
            out[r + 1] = rv_scaled_x(isum[r + 1], sc + stride, xs, xs112, plain);
            out[r + 2] = rv_scaled_x(isum[r + 2], sc + 2 * stride, xs, xs112, plain);
            out[r + 3] = rv_scaled_x(isum[r + 3], sc + 3 * stride, xs, xs112, plain);
        }
        for (; r < take; r++, sc += stride) out[r] = rv_scaled_x(isum[r], sc, xs, xs112, plain);
    }
}
#endif

RV_SCALE_LINKAGE void rv_scale_rows(float *out, const int32_t *isum, const uint8_t *sc, size_t stride,
                                    const uint32_t *idx, uint32_t take, float xs, int plain) {
#ifndef PLE_SOFT_FLOAT
    if (xs < 0x1p16f && xs > -0x1p16f && !(((uintptr_t)sc | stride) & 1)) {
        float xs112 = xs * 0x1p112f;
        if (plain) /* the caller checked every scale (ple_scales_plain): no test per row */
            rv_scale_fast(out, isum, sc, stride, idx, take, xs, xs112, 1);
        else
            rv_scale_fast(out, isum, sc, stride, idx, take, xs, xs112, 0);
        return;
    }
#else
    (void)plain;
#endif
    if (idx)
        for (uint32_t r = 0; r < take; r++) out[r] = PLE_SCALED_X(isum[r], sc + idx[r] * stride, xs);
    else
        for (uint32_t r = 0; r < take; r++, sc += stride) out[r] = PLE_SCALED_X(isum[r], sc, xs);
}

static void krows_i4(float *out, const uint8_t *codes, const uint8_t *scales, size_t stride, const uint32_t *idx,
                     uint32_t rows, uint32_t n, int plain, const ple_kact *a) {
    if (n != a->n) { /* shorter than the activation (X4's zeros and XW are laid out for a->n): one by one */
        for (uint32_t r = 0; r < rows; r++) {
            size_t off = (idx ? idx[r] : r) * stride;
            out[r] = PLE_SCALED_X(kseg_i4(codes + off, a, 0, n), scales + off, a->scale);
        }
        return;
    }
    int32_t isum[RV_HEAD_ROWS];
    float scale = a->scale; /* as the driver: (float)sum * its scale * the activation's */
    for (uint32_t r0 = 0; r0 < rows; r0 += RV_HEAD_ROWS) {
        uint32_t take = rows - r0 < RV_HEAD_ROWS ? rows - r0 : RV_HEAD_ROWS;
        if (idx) {
            rv_head_sums(isum, codes, stride, idx + r0, take, n, a);
            rv_scale_rows(out + r0, isum, scales, stride, idx + r0, take, scale, plain);
        } else {
            rv_head_sums(isum, codes + r0 * stride, stride, NULL, take, n, a);
            rv_scale_rows(out + r0, isum, scales + r0 * stride, stride, NULL, take, scale, plain);
        }
    }
}

/* Rows r0, r0 + 1, ... of a dense int4 matrix, four at a time, when its rows and groups are whole chunks (cols and
 * group multiples of 32, words aligned): each row's chunk sums, then its group segments as the driver sums them
 * (one float multiply-add per segment, in the same order). Returns how many rows it did (a multiple of four). */
static uint32_t kdense_i4(float *out, const uint8_t *codes, const uint8_t *scales, uint32_t group, uint32_t r0,
                          uint32_t r1, uint32_t cols, const ple_kact *a) {
    if (cols % (8 * RV_CHUNK) || group % (8 * RV_CHUNK) || cols > 8 * RV_CHUNK * RV_DENSE_MAX_CHUNKS ||
        ((uintptr_t)codes + r0 * cols / 2) % 4 || cols > a->n)
        return 0;
    int32_t h[4 * RV_DENSE_MAX_CHUNKS];
    uint32_t r = r0, e = r0 * cols, g = e / group, used = e - g * group; /* used: values of group g before row r */
    const uint8_t *c = codes + e / 2;
    for (; r + 4 <= r1; r += 4, c += 2 * cols) {
        rv_rows4_chunks(h, rv_words_at(c), rv_words_at(c + cols / 2), rv_words_at(c + cols),
                        rv_words_at(c + 3 * cols / 2), rv_x0(a), cols / 8, rv_chunk(a, 0));
        for (uint32_t k = 0; k < 4; k++) { /* the segments in the driver's order: chunk sums, one scale each */
            const int32_t *hk = h + k;
            float sum = 0;
            for (uint32_t x0 = 0; x0 < cols;) {
                uint32_t take = group - used < cols - x0 ? group - used : cols - x0;
                int32_t isum = 0;
                for (uint32_t m = take / (8 * RV_CHUNK); m; m--, hk += 4) isum += *hk;
#ifdef PLE_SOFT_FLOAT /* no float add for a row's first segment: 0 + v is v */
                float v = PLE_SCALED(isum, scales + 2 * g);
                sum = x0 ? sum + v : ple_add0(v);
#else
                sum += PLE_SCALED(isum, scales + 2 * g);
#endif
                x0 += take, used += take;
                if (used == group) used = 0, g++;
            }
            out[r + k - r0] = PLE_FMUL(sum, a->scale);
        }
    }
    return r - r0;
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
                     uint32_t rows, uint32_t n, int plain, const ple_kact *a) {
    (void)plain; /* each row's scale goes through ple_f16 */
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
                     uint32_t rows, uint32_t n, int plain, const ple_kact *a) {
    (void)plain;
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
#elif PLE_IKERNEL == PLE_KERNEL_RV32
    return "rv32";
#elif PLE_IKERNEL == PLE_KERNEL_HELIUM
    return "helium";
#elif PLE_IKERNEL == PLE_KERNEL_VECTOR
    return "vector";
#else
    return "portable";
#endif
}

/* The same for every kernel (the arena, and so the memory plan, does not depend on which one is built): codes
 * plus the largest layout (RV32: two shifted copies in int16 pairs and prefix sums). */
size_t ple_kact_bytes(uint32_t cap) { return 6 * PAD16(cap) + 64; }

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

#ifdef PLE_SOFT_FLOAT
/* Without a float unit: the same codes, the product x * inv rounded by ple_fmul and rounded half away from zero in
 * integers (|x * inv| <= 127.00002, so the float path's +-0.5 is exact and its truncation is floor(|v| + 0.5)). 0 when
 * a value is not finite (the float path's rules for those). */
static int quantize_soft(const float *x, uint32_t n, float inv, int8_t *q) {
    for (uint32_t i = 0; i < n; i++)
        if ((ple_fbits(x[i]) & 0x7fffffffu) >= 0x7f800000u) return 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t m = ple_fbits(x[i]) & 0x7fffffffu, vb = m ? ple_fbits(ple_fmul(x[i], inv)) : 0, e = (vb >> 23) & 255;
        int c = 0;
        if (e >= 126) { /* |v| >= 0.5 */
            unsigned shift = 150 - e; /* 17..24 */
            c = (int)((((vb & 0x7fffffu) | 0x800000u) + (1u << (shift - 1))) >> shift);
        }
        c = c > 127 ? 127 : c;
        q[i] = (int8_t)(vb >> 31 ? -c : c);
    }
    return 1;
}
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
#ifdef PLE_SOFT_FLOAT
    if (quantize_soft(x, n, inv, q)) return mx / 127.0f;
#endif
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
    return PLE_FMUL(sum, a->scale);
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
                sum += PLE_SCALED(isum, sc);
                c += dtype == PLE_INT4 ? take / 2 : take;
                x0 += take, used += take;
                if (used == group) used = 0, sc += 2;
            }
            out[r - r0] = PLE_FMUL(sum, a->scale);
        }
        return;
    }
#ifdef KSEG_I4_ANY
    uint32_t any_end = cols >= 16 ? r1 - 1 : r0; /* rows kseg_i4_any may take (see there) */
#endif
    for (uint32_t r = r0; r < r1; r++) {
        float sum = 0;
        for (uint32_t x0 = 0; x0 < cols;) { /* the same segments, in the same order, as ple_kdot */
            uint32_t take = group - used < cols - x0 ? group - used : cols - x0;
            float isum;
            if (dtype == PLE_INT4 && !(e & 1) && x0 % ALIGN_I4 == 0 && take % ALIGN_I4 == 0 && take <= PLE_KCHUNK)
                isum = (float)kseg_i4(codes + e / 2, a, x0, take);
            else if (dtype == PLE_INT8 && x0 % ALIGN_I8 == 0 && take % ALIGN_I8 == 0 && take <= PLE_KCHUNK)
                isum = (float)kseg_i8((const int8_t *)codes + e, a, x0, take);
#ifdef KSEG_I4_ANY /* any other piece of a row followed by a row of 16 values or more (it reads 8 bytes on) */
            else if (dtype == PLE_INT4 && !(e & 1) && !(x0 & 1) && take <= PLE_KCHUNK && r < any_end)
                isum = (float)kseg_i4_any(codes + e / 2, a, x0, take);
#endif
            else
                isum = seg_sum(dtype, codes, e, take, x0, a);
            sum += isum * ple_f16(scales + 2 * g);
            e += take, x0 += take, used += take;
            if (used == group) used = 0, g++;
        }
        out[r - r0] = PLE_FMUL(sum, a->scale);
    }
}

void ple_kdot_dense(float *out, int dtype, const uint8_t *codes, const uint8_t *scales, uint32_t group, uint32_t r0,
                    uint32_t r1, uint32_t cols, const ple_kact *a) {
    if ((uint64_t)r1 * cols <= UINT32_MAX) { /* every offset fits 32 bits (a 64-bit add is two instructions) */
#ifdef KDENSE_I4
        if (dtype == PLE_INT4) { /* rows four at a time where the kernel can; the rest below */
            uint32_t done = kdense_i4(out, codes, scales, group, r0, r1, cols, a);
            out += done, r0 += done;
        }
#endif
        if (dtype == PLE_INT4) dense32(out, PLE_INT4, codes, scales, group, r0, r1, cols, a);
        else dense32(out, PLE_INT8, codes, scales, group, r0, r1, cols, a);
        return;
    }
    for (uint32_t r = r0; r < r1; r++)
        out[r - r0] = ple_kdot(dtype, codes, scales, group, (uint64_t)r * cols, cols, a);
}

/* ple_kdot_rows and ple_kdot_pick: rows idx[k] (k when idx is NULL) of records `stride` apart. */
static void rows_of(float *out, int dtype, const uint8_t *codes, const uint8_t *scales, size_t stride,
                    const uint32_t *idx, uint32_t rows, uint32_t n, int plain, const ple_kact *a) {
    (void)plain; /* used by the kernels that take rows whole */
    /* (0 + isum * s) * scale, as ple_kdot. Rows whose length is a multiple of the kernel's alignment go straight to
     * it (the head is thousands of short rows: no per-row group walk, the kernel's setup paid once) */
    if (dtype == PLE_INT4 && n % ALIGN_I4 == 0 && n <= PLE_KCHUNK) {
#ifdef KROWS_I4
        krows_i4(out, codes, scales, stride, idx, rows, n, plain, a);
#else
        for (uint32_t r = 0; r < rows; r++) {
            size_t off = (idx ? idx[r] : r) * stride;
            out[r] = PLE_SCALED_X(kseg_i4(codes + off, a, 0, n), scales + off, a->scale);
        }
#endif
    } else if (dtype == PLE_INT8 && n % ALIGN_I8 == 0 && n <= PLE_KCHUNK) {
#ifdef KROWS_I8
        krows_i8(out, codes, scales, stride, idx, rows, n, plain, a);
#else
        for (uint32_t r = 0; r < rows; r++) {
            size_t off = (idx ? idx[r] : r) * stride;
            out[r] = PLE_SCALED_X(kseg_i8((const int8_t *)codes + off, a, 0, n), scales + off, a->scale);
        }
#endif
    } else {
        for (uint32_t r = 0; r < rows; r++) {
            size_t off = (idx ? idx[r] : r) * stride;
            out[r] = PLE_FMUL(seg_sum(dtype, codes + off, 0, n, 0, a) * ple_f16(scales + off), a->scale);
        }
    }
}

void ple_kdot_rows(float *out, int dtype, const uint8_t *codes, const uint8_t *scales, size_t stride, uint32_t rows,
                   uint32_t n, int plain_scales, const ple_kact *a) {
    rows_of(out, dtype, codes, scales, stride, NULL, rows, n, plain_scales, a);
}

void ple_kdot_pick(float *out, int dtype, const uint8_t *codes, const uint8_t *scales, size_t stride,
                   const uint32_t *idx, uint32_t count, uint32_t n, int plain_scales, const ple_kact *a) {
    rows_of(out, dtype, codes, scales, stride, idx, count, n, plain_scales, a);
}

int ple_scales_plain(const uint8_t *scales, size_t stride, uint32_t rows) {
    for (uint32_t r = 0; r < rows; r++, scales += stride) {
        uint32_t h = scales[0] | (uint32_t)scales[1] << 8, e = (h >> 10) & 31;
        if (e == 31 || (e == 0 && (h & 0x3ffu))) return 0;
    }
    return 1;
}

/* ple_argmax (ple.h) lives here for its Helium version. On hosts a max pass in eight independent lanes (vectorised
 * by x86 compilers: the 32k-entry head made the one-lane scan cost ~4% of a token), then a search for its first
 * occurrence; on cores without float vectors (RISC-V, Cortex-M without Helium) one scan. With Helium (float MVE) four lanes of VMAXNM, then a vector search; v[0] NaN returns 0 as the scan
 * does (VMAXNM would skip it), any other NaN is skipped by both. */
#if defined(__riscv) && defined(__riscv_flen)
static inline float rv_fmax(float a, float b) { /* GCC 12 makes fmaxf a library call */
    float r;
    __asm__("fmax.s %0, %1, %2" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
#endif

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
#elif defined(__riscv) && defined(__riscv_flen)
    /* RISC-V with a float unit, no lanes: each block of 16 values' maximum by FMAX.S (it returns the other operand for
     * a NaN, as the scan's compare skips one), the first block whose maximum is the largest, and in it the first value
     * equal to that; about two instructions a value, where a compare-and-branch scan takes four. -0 and +0 compare
     * equal, so the first zero of a block is found whichever FMAX kept. A NaN at v[0] returns 0, as the scan does. */
    if (!(v[0] == v[0])) return 0;
    float best = v[0];
    uint32_t block = 0, i = 0;
    for (; i + 16 <= n; i += 16) {
        const float *p = v + i;
        float m0 = rv_fmax(p[0], p[1]), m1 = rv_fmax(p[2], p[3]), m2 = rv_fmax(p[4], p[5]), m3 = rv_fmax(p[6], p[7]);
        m0 = rv_fmax(m0, rv_fmax(p[8], p[9])), m1 = rv_fmax(m1, rv_fmax(p[10], p[11]));
        m2 = rv_fmax(m2, rv_fmax(p[12], p[13])), m3 = rv_fmax(m3, rv_fmax(p[14], p[15]));
        float top = rv_fmax(rv_fmax(m0, m1), rv_fmax(m2, m3));
        if (top > best) best = top, block = i;
    }
    uint32_t at = 0;
    int in_tail = 0;
    for (; i < n; i++) /* the values after the last whole block: a plain scan */
        if (v[i] > best) best = v[i], at = i, in_tail = 1;
    if (in_tail) return at;
    for (i = block; !(v[i] == best); i++) continue;
    return i;
#elif defined(__riscv) || (defined(__ARM_ARCH_PROFILE) && __ARM_ARCH_PROFILE == 'M')
    /* no vector unit to give the lanes to: one pass, the first maximum kept (a NaN never compares greater) */
#ifdef PLE_SOFT_FLOAT
    /* no float unit either: the floats' bits compared as integers (magnitude, negated for a negative float, so -0 and
     * +0 are equal), which orders them as the float comparison does; a NaN is skipped, or wins nothing at v[0] */
    uint32_t at = 0;
    if ((ple_fbits(v[0]) & 0x7fffffffu) > 0x7f800000u) return 0;
    int32_t best = (int32_t)(ple_fbits(v[0]) & 0x7fffffffu);
    if (ple_fbits(v[0]) >> 31) best = -best;
    for (uint32_t i = 1; i < n; i++) {
        uint32_t b = ple_fbits(v[i]), m = b & 0x7fffffffu;
        int32_t k = b >> 31 ? -(int32_t)m : (int32_t)m;
        if (k > best && m <= 0x7f800000u) best = k, at = i;
    }
    return at;
#else
    float best = v[0];
    uint32_t at = 0, i = 1;
    for (; i + 4 <= n; i += 4) { /* four compares a pass: the loop's bookkeeping once */
        if (v[i] > best) best = v[i], at = i;
        if (v[i + 1] > best) best = v[i + 1], at = i + 1;
        if (v[i + 2] > best) best = v[i + 2], at = i + 2;
        if (v[i + 3] > best) best = v[i + 3], at = i + 3;
    }
    for (; i < n; i++)
        if (v[i] > best) best = v[i], at = i;
    return at;
#endif
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
