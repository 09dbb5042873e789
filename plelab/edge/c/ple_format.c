/* The .ple container: header, section table, binary model description, checksums (docs/ple-format.md).
 *
 * Every field read from the file is checked before it is used for an offset, a size or a loop bound, so
 * that a corrupt or hostile file is rejected with one line and never read out of bounds (fuzzed by
 * plefuzz.c). The checks mirror plelab/edge/format.py plus the shapes the forward pass relies on.
 */
#include "ple.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const uint8_t MAGIC[8] = {0x89, 'P', 'L', 'E', '\r', '\n', 0x1a, '\n'};
#define HEADER_BYTES 64
#define SECTION_BYTES 64
#define MODEL_HEAD 104
#define TENSOR_DESC 44
#define NO_LAYER 0xFFFFu
#define TABLE_DESC 48
#define PART_DESC 40
#define MAX_DIM (1u << 24)      /* no dimension of a model this runtime runs comes near */
#define MAX_MODEL_SECTION (1u << 24)

int ple_fail(char *err, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, PLE_ERR, fmt, ap);
    va_end(ap);
    return -1;
}

static uint32_t rd32(const uint8_t *p) { return p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static uint64_t rd64(const uint8_t *p) { return rd32(p) | (uint64_t)rd32(p + 4) << 32; }
static double rdf64(const uint8_t *p) {
    uint64_t u = rd64(p);
    double d;
    memcpy(&d, &u, 8);
    return d;
}

/* ---- CRC-32 (zlib polynomial) and SHA-256 ----------------------------------------------------------- */

uint32_t ple_crc32(uint32_t crc, const void *buf, size_t n) {
    static uint32_t table[256];
    static int ready;
    if (!ready) {
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
            table[i] = c;
        }
        ready = 1;
    }
    const uint8_t *p = buf;
    crc = ~crc;
    while (n--) crc = table[(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return ~crc;
}

typedef struct { uint32_t h[8]; uint64_t len; uint8_t buf[64]; size_t fill; } sha256_ctx;

static const uint32_t K256[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5, 0xd807aa98,
    0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786,
    0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8,
    0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
    0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819,
    0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a,
    0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2};

#define ROR(x, n) ((x) >> (n) | (x) << (32 - (n)))

static void sha256_block(sha256_ctx *c, const uint8_t *p) {
    uint32_t w[64], s[8];
    for (int i = 0; i < 16; i++) w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ROR(w[i - 15], 7) ^ ROR(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ROR(w[i - 2], 17) ^ ROR(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    memcpy(s, c->h, sizeof s);
    uint32_t a = s[0], b = s[1], cc = s[2], d = s[3], e = s[4], f = s[5], g = s[6], h = s[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = h + (ROR(e, 6) ^ ROR(e, 11) ^ ROR(e, 25)) + ((e & f) ^ (~e & g)) + K256[i] + w[i];
        uint32_t t2 = (ROR(a, 2) ^ ROR(a, 13) ^ ROR(a, 22)) + ((a & b) ^ (a & cc) ^ (b & cc));
        h = g, g = f, f = e, e = d + t1, d = cc, cc = b, b = a, a = t1 + t2;
    }
    c->h[0] += a, c->h[1] += b, c->h[2] += cc, c->h[3] += d, c->h[4] += e, c->h[5] += f, c->h[6] += g, c->h[7] += h;
}

static void sha256_init(sha256_ctx *c) {
    static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(c->h, h0, sizeof h0);
    c->len = 0;
    c->fill = 0;
}

static void sha256_update(sha256_ctx *c, const uint8_t *p, size_t n) {
    c->len += n;
    while (n) {
        if (c->fill == 0 && n >= 64) {
            sha256_block(c, p);
            p += 64;
            n -= 64;
            continue;
        }
        size_t k = 64 - c->fill < n ? 64 - c->fill : n;
        memcpy(c->buf + c->fill, p, k);
        c->fill += k;
        p += k;
        n -= k;
        if (c->fill == 64) {
            sha256_block(c, c->buf);
            c->fill = 0;
        }
    }
}

static void sha256_final(sha256_ctx *c, uint8_t out[32]) {
    uint64_t bits = c->len * 8;
    uint8_t pad[72] = {0x80};
    size_t n = (c->fill < 56 ? 56 : 120) - c->fill;
    for (int i = 0; i < 8; i++) pad[n + i] = (uint8_t)(bits >> (56 - 8 * i));
    sha256_update(c, pad, n + 8);
    for (int i = 0; i < 8; i++)
        for (int k = 0; k < 4; k++) out[4 * i + k] = (uint8_t)(c->h[i] >> (24 - 8 * k));
}

void ple_sha256(const void *buf, size_t n, uint8_t out[32]) {
    sha256_ctx c;
    sha256_init(&c);
    sha256_update(&c, buf, n);
    sha256_final(&c, out);
}

/* ---- lookups ---------------------------------------------------------------------------------------- */

const ple_section *ple_find_section(const ple_desc *d, const char *name) {
    for (uint32_t i = 0; i < d->n_sections; i++)
        if (!strcmp(d->sections[i].name, name)) return &d->sections[i];
    return NULL;
}

const ple_table *ple_find_table(const ple_desc *d, const char *name) {
    for (uint32_t i = 0; i < d->n_tables; i++)
        if (!strcmp(d->tables[i].name, name)) return &d->tables[i];
    return NULL;
}

const ple_part *ple_find_part(const ple_table *t, const char *name) {
    for (uint32_t i = 0; t && i < t->n_parts; i++)
        if (!strcmp(t->parts[i].name, name)) return &t->parts[i];
    return NULL;
}

uint64_t ple_row_offset(const ple_table *t, uint32_t row) {
    if (t->page) {
        uint32_t per_page = t->page / t->stride;
        return (uint64_t)(row / per_page) * t->page + (uint64_t)(row % per_page) * t->stride;
    }
    return (uint64_t)row * t->stride;
}

/* ---- encodings -------------------------------------------------------------------------------------- */

static uint64_t code_bytes(int dtype, uint64_t n) {
    switch (dtype) {
    case PLE_FP32: return 4 * n;
    case PLE_FP16: return 2 * n;
    case PLE_INT8: return n;
    case PLE_INT4: return (n + 1) / 2;
    default: return (n + 7) / 8;
    }
}

static uint64_t scale_bytes(int dtype, uint32_t group, uint64_t n) {
    return dtype == PLE_INT8 || dtype == PLE_INT4 ? 2 * ((n + group - 1) / group) : 0;
}

/* Copy a NUL-padded name field; -1 when it has no terminator or non-printable bytes. */
static int name_field(char *dst, const uint8_t *src, size_t n) {
    size_t len = 0;
    while (len < n && src[len]) len++;
    if (len == n || len == 0) return -1;
    for (size_t i = len; i < n; i++)
        if (src[i]) return -1;
    for (size_t i = 0; i < len; i++)
        if (src[i] < 0x20 || src[i] > 0x7e) return -1;
    memcpy(dst, src, len);
    dst[len] = 0;
    return 0;
}

/* ---- header and section table --------------------------------------------------------------------- */

static int read_header(ple_storage *st, ple_desc *d, char *err) {
    uint8_t h[HEADER_BYTES], table[SECTION_BYTES * PLE_MAX_SECTIONS];
    if (st->size < HEADER_BYTES || st->read(st, 0, h, HEADER_BYTES))
        return ple_fail(err, "not a .ple file (only %llu bytes)", (unsigned long long)st->size);
    if (memcmp(h, MAGIC, 8)) return ple_fail(err, "not a .ple file (bad magic)");
    d->version = rd32(h + 8);
    if (d->version != 2 && d->version != 3)
        return ple_fail(err, "format version %" PRIu32 " is not supported (the C runtime reads versions 2 and 3); "
                         "re-export the model with this plelab", d->version);
    if (ple_crc32(0, h, 60) != rd32(h + 60) || rd32(h + 12) != HEADER_BYTES)
        return ple_fail(err, "header is corrupt (crc32 mismatch)");
    d->file_bytes = rd64(h + 16);
    if (st->size < d->file_bytes)
        return ple_fail(err, "truncated: %llu bytes, the header says %llu", (unsigned long long)st->size,
                    (unsigned long long)d->file_bytes);
    if (st->size > d->file_bytes)
        return ple_fail(err, "has %llu unexpected trailing bytes (corrupt copy?)",
                    (unsigned long long)(st->size - d->file_bytes));
    d->n_sections = rd32(h + 24);
    d->body_crc = rd32(h + 32);
    if (d->n_sections == 0 || d->n_sections > PLE_MAX_SECTIONS)
        return ple_fail(err, "header is corrupt (%" PRIu32 " sections)", d->n_sections);
    uint64_t body = HEADER_BYTES + (uint64_t)SECTION_BYTES * d->n_sections;
    if (body > d->file_bytes || st->read(st, HEADER_BYTES, table, SECTION_BYTES * d->n_sections))
        return ple_fail(err, "truncated section table");
    if (ple_crc32(0, table, SECTION_BYTES * d->n_sections) != rd32(h + 28))
        return ple_fail(err, "section table is corrupt (crc32 mismatch)");
    uint64_t prev_end = body;
    for (uint32_t i = 0; i < d->n_sections; i++) {
        ple_section *s = &d->sections[i];
        const uint8_t *e = table + SECTION_BYTES * i;
        if (name_field(s->name, e, 16)) return ple_fail(err, "section %" PRIu32 " has an invalid name", i);
        s->offset = rd64(e + 16);
        s->nbytes = rd64(e + 24);
        memcpy(s->sha256, e + 32, 32);
        if (s->offset < prev_end || s->offset > d->file_bytes || s->nbytes > d->file_bytes - s->offset)
            return ple_fail(err, "section '%s' lies outside the file or overlaps another", s->name);
        prev_end = s->offset + s->nbytes;
        for (uint32_t k = 0; k < i; k++)
            if (!strcmp(d->sections[k].name, s->name)) return ple_fail(err, "section '%s' appears twice", s->name);
    }
    return 0;
}

/* Read a small section whole and check its sha256 (meta and model are always verified). */
static uint8_t *read_checked(ple_storage *st, const ple_section *s, char *err) {
    if (s->nbytes > MAX_MODEL_SECTION) {
        ple_fail(err, "section '%s' is implausibly large (%llu bytes)", s->name, (unsigned long long)s->nbytes);
        return NULL;
    }
    uint8_t *buf = malloc(s->nbytes ? s->nbytes : 1), sha[32];
    if (!buf) {
        ple_fail(err, "out of memory reading section '%s'", s->name);
        return NULL;
    }
    if (st->read(st, s->offset, buf, s->nbytes)) {
        free(buf);
        ple_fail(err, "cannot read section '%s'", s->name);
        return NULL;
    }
    ple_sha256(buf, s->nbytes, sha);
    if (memcmp(sha, s->sha256, 32)) {
        free(buf);
        ple_fail(err, "section '%s' fails its sha256 checksum (file corrupt)", s->name);
        return NULL;
    }
    return buf;
}

/* ---- model description ---------------------------------------------------------------------------- */

static int parse_tables(ple_desc *d, const uint8_t *p, const uint8_t *end, char *err) {
    for (uint32_t i = 0; i < d->n_tables; i++) {
        ple_table *t = &d->tables[i];
        if (end - p < TABLE_DESC) return ple_fail(err, "model description is truncated (tables)");
        uint64_t rows = rd64(p + 16);
        if (name_field(t->name, p, 16) || rows == 0 || rows > MAX_DIM)
            return ple_fail(err, "model description: table %" PRIu32 " is invalid", i);
        t->rows = (uint32_t)rows;
        t->record_bytes = rd32(p + 24);
        t->stride = rd32(p + 28);
        t->align = rd32(p + 32);
        t->page = rd32(p + 36);
        t->n_parts = rd32(p + 40);
        p += TABLE_DESC;
        if (t->n_parts == 0 || t->n_parts > PLE_MAX_PARTS || (uint64_t)(end - p) < (uint64_t)PART_DESC * t->n_parts)
            return ple_fail(err, "model description: table '%s' has a bad part count", t->name);
        uint64_t pos = 0;
        for (uint32_t k = 0; k < t->n_parts; k++, p += PART_DESC) {
            ple_part *q = &t->parts[k];
            if (name_field(q->name, p, 16)) return ple_fail(err, "model description: table '%s' part %" PRIu32 " name", t->name, k);
            q->dtype = p[16];
            q->group = rd32(p + 20);
            q->length = rd32(p + 24);
            q->codes = rd32(p + 28);
            q->scales = rd32(p + 32);
            int is_int = q->dtype == PLE_INT8 || q->dtype == PLE_INT4;
            if (q->dtype >= PLE_U1 || q->length == 0 || q->length > MAX_DIM || (is_int && q->group == 0) ||
                (!is_int && q->group))
                return ple_fail(err, "model description: part '%s' of table '%s' has a bad encoding", q->name, t->name);
            if (q->codes != pos) return ple_fail(err, "table '%s': record layout is inconsistent", t->name);
            pos += code_bytes(q->dtype, q->length);
            if (q->scales != pos) return ple_fail(err, "table '%s': record layout is inconsistent", t->name);
            pos += scale_bytes(q->dtype, q->group, q->length);
            for (uint32_t j = 0; j < k; j++)
                if (!strcmp(t->parts[j].name, q->name)) return ple_fail(err, "table '%s': part '%s' twice", t->name, q->name);
        }
        uint64_t stride = t->align > 1 ? (pos + t->align - 1) / t->align * t->align : pos;
        if (pos != t->record_bytes || t->align == 0 || stride != t->stride || pos > MAX_DIM)
            return ple_fail(err, "table '%s': record layout is inconsistent", t->name);
        if (t->page && t->page < t->stride) return ple_fail(err, "table '%s': record larger than its page", t->name);
        t->section = ple_find_section(d, t->name);
        if (!t->section) return ple_fail(err, "the file has no '%s' section for its row table", t->name);
        if (ple_row_offset(t, t->rows - 1) + t->stride != t->section->nbytes)
            return ple_fail(err, "section '%s' has %llu bytes, its records need %llu", t->name,
                        (unsigned long long)t->section->nbytes,
                        (unsigned long long)(ple_row_offset(t, t->rows - 1) + t->stride));
        if (t->page && t->section->offset % t->page) return ple_fail(err, "table '%s' is not page aligned", t->name);
        for (uint32_t j = 0; j < i; j++)
            if (!strcmp(d->tables[j].name, t->name)) return ple_fail(err, "table '%s' appears twice", t->name);
    }
    if (p != end) return ple_fail(err, "model description has %ld unexpected trailing bytes", (long)(end - p));
    return 0;
}

/* The n-gram block (version 3, after the PLE layers): orders N, heads per order, hash seed, id-map entries, then N
 * orders and N rows per head, padded to 8 bytes. Its heads must be exactly the PLE table's rows and divide dP; the
 * id map, when there is one, is a section of one uint32 per token id (any values: they are only hashed). */
static int parse_ngram(ple_desc *d, const uint8_t **at, const uint8_t *end, char *err) {
    const uint8_t *p = *at;
    if (end - p < 16) return ple_fail(err, "model description is truncated (n-gram index)");
    ple_ngram *g = d->ngram = calloc(1, sizeof *g);
    if (!g) return ple_fail(err, "out of memory");
    g->n_orders = rd32(p);
    g->heads = rd32(p + 4);
    g->seed = rd32(p + 8);
    g->id_map = rd32(p + 12);
    if (!d->n_ple_layers || g->n_orders == 0 || g->n_orders > PLE_NGRAM_MAX_ORDER || g->heads == 0 ||
        g->heads > PLE_NGRAM_MAX_HEADS)
        return ple_fail(err, "model description: the n-gram index has %" PRIu32 " orders of %" PRIu32 " hash heads "
                        "(1-8 orders of 1-255 heads, on a model with PLE)", g->n_orders, g->heads);
    uint64_t padded = (16 + 8 * (uint64_t)g->n_orders + 7) / 8 * 8, rows = 0;
    if ((uint64_t)(end - p) < padded) return ple_fail(err, "model description is truncated (n-gram index)");
    for (uint32_t o = 0; o < g->n_orders; o++) {
        g->orders[o] = rd32(p + 16 + 4 * o);
        g->rows[o] = rd32(p + 16 + 4 * (g->n_orders + o));
        if (g->orders[o] == 0 || g->orders[o] > PLE_NGRAM_MAX_ORDER || (o && g->orders[o] <= g->orders[o - 1]) ||
            g->rows[o] < 2)
            return ple_fail(err, "model description: n-gram order %" PRIu32 " (%" PRIu32 " rows per head) is invalid: "
                            "orders ascend in 1-8, heads have 2 rows or more", g->orders[o], g->rows[o]);
        rows += (uint64_t)g->rows[o] * g->heads;
    }
    uint32_t S = ple_ngram_heads(g);
    if (rows != d->ple_vocab || d->ple_dim % S)
        return ple_fail(err, "model description: the n-gram heads' %llu rows and %" PRIu32 " heads do not fit a PLE "
                        "table of %" PRIu32 " rows and dP %" PRIu32, (unsigned long long)rows, S, d->ple_vocab,
                        d->ple_dim);
    const ple_section *ids = ple_find_section(d, "idmap");
    if ((g->id_map && g->id_map != d->vocab) || (g->id_map != 0) != (ids != NULL) ||
        (ids && ids->nbytes != 4 * (uint64_t)d->vocab))
        return ple_fail(err, "model description: the id map (%" PRIu32 " entries, section of %llu bytes) is not one "
                        "uint32 per token id of %" PRIu32, g->id_map, ids ? (unsigned long long)ids->nbytes : 0ull,
                        d->vocab);
    *at = p + padded;
    return 0;
}

static int parse_model(ple_desc *d, const uint8_t *p, uint64_t n, char *err) {
    const uint8_t *end = p + n;
    if (n < MODEL_HEAD || memcmp(p, "PLEM", 4) || rd32(p + 4) != MODEL_HEAD)
        return ple_fail(err, "model description is invalid (bad magic or size)");
    uint32_t *fields[] = {&d->hidden, &d->layers, &d->heads, &d->kv_heads, &d->head_dim, &d->vocab, &d->max_seq,
                          &d->ffn_kind, &d->inter, &d->mask_count, &d->rank, &d->ple_dim, &d->ple_vocab,
                          &d->n_ple_layers, &d->gate, &d->flags, &d->n_tensors, &d->n_tables};
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) *fields[i] = rd32(p + 8 + 4 * i);
    uint32_t n_strings = rd32(p + 80);
    d->ple_index = rd32(p + 84); /* zero in version 2 */
    double eps = rdf64(p + 88), theta = rdf64(p + 96);
    p += MODEL_HEAD;
    if (d->n_tensors == 0) /* `plelab export --hf`: a foreign checkpoint's PLE table alone, for planning */
        return ple_fail(err, "is a table-only export (no core weights); there is no core to run: use it with "
                             "`plelab place` or the record reader");
    d->eps = (float)eps;
    d->theta = (float)theta;
    if (!(eps > 0 && eps < 1) || !(theta > 1 && theta < 1e12))
        return ple_fail(err, "model description: norm_eps or rope_theta out of range");
    if (!d->hidden || !d->layers || !d->heads || !d->kv_heads || !d->head_dim || !d->vocab || !d->max_seq ||
        d->hidden > 65536 || d->layers > 1024 || d->heads > 1024 || d->head_dim > 4096 || d->vocab > MAX_DIM ||
        d->max_seq > MAX_DIM || d->heads % d->kv_heads || d->head_dim % 2 || d->inter == 0 || d->inter > MAX_DIM)
        return ple_fail(err, "model description: dimensions out of range");
    if (d->ffn_kind == PLE_MOE) { /* the kind fields hold E and k */
        d->experts = d->mask_count;
        d->top_k = d->rank;
        d->mask_count = 1;
        d->rank = 0;
    }
    if (d->ffn_kind > PLE_MOE || d->gate > PLE_GATE_VECTOR || d->flags > 31 ||
        ((d->flags & PLE_SHARED_EXPERT) && d->ffn_kind != PLE_MOE) ||
        (d->ffn_kind == PLE_MGLU && (d->mask_count == 0 || d->mask_count > 64)) ||
        (d->ffn_kind == PLE_LOWRANK && (d->rank == 0 || d->rank > MAX_DIM)) ||
        (d->ffn_kind == PLE_MOE && (d->experts == 0 || d->experts > PLE_MAX_EXPERTS || d->top_k == 0 ||
                                    d->top_k > d->experts)))
        return ple_fail(err, "model description: unknown FFN, gate or flags");
    if (d->ple_dim > 65536 || d->ple_vocab > MAX_DIM || d->n_ple_layers > d->layers ||
        (d->ple_dim == 0) != (d->n_ple_layers == 0) || (d->ple_dim && d->ple_vocab == 0))
        return ple_fail(err, "model description: PLE dimensions out of range");
    uint64_t nl = d->n_ple_layers + d->n_ple_layers % 2;
    if ((uint64_t)(end - p) < 4 * nl) return ple_fail(err, "model description is truncated (PLE layers)");
    d->ple_layers = malloc(sizeof(uint32_t) * (d->n_ple_layers + 1));
    if (!d->ple_layers) return ple_fail(err, "out of memory");
    for (uint32_t i = 0; i < d->n_ple_layers; i++) {
        d->ple_layers[i] = rd32(p + 4 * i);
        if (d->ple_layers[i] >= d->layers || (i && d->ple_layers[i] <= d->ple_layers[i - 1]))
            return ple_fail(err, "model description: PLE layer list is invalid");
    }
    p += 4 * nl;
    if (d->ple_index > PLE_INDEX_NGRAM || (d->ple_index && d->version < 3))
        return ple_fail(err, "model description: PLE index %" PRIu32 " is unknown to format version %" PRIu32,
                        d->ple_index, d->version);
    if (d->ple_index == PLE_INDEX_NGRAM && parse_ngram(d, &p, end, err)) return -1;
    /* name suffixes: NUL-terminated strings, the block ending with a NUL so every offset reads a terminated one */
    uint64_t strings_padded = ((uint64_t)n_strings + 7) / 8 * 8;
    if (n_strings == 0 || n_strings > 65536 || strings_padded > (uint64_t)(end - p) || p[n_strings - 1] != 0)
        return ple_fail(err, "model description: the name table is invalid");
    const uint8_t *strings = p;
    p += strings_padded;
    if (d->n_tensors == 0 || d->n_tensors > (uint64_t)(end - p) / TENSOR_DESC)
        return ple_fail(err, "model description is truncated (tensors)");
    if (d->n_tables == 0 || d->n_tables > PLE_MAX_TABLES) return ple_fail(err, "model description: bad table count");
    d->tensors = calloc(d->n_tensors, sizeof(ple_tensor));
    if (!d->tensors) return ple_fail(err, "out of memory");
    const ple_section *ts = ple_find_section(d, "tensors");
    if (!ts) return ple_fail(err, "the file has no 'tensors' section");
    for (uint32_t i = 0; i < d->n_tensors; i++, p += TENSOR_DESC) {
        ple_tensor *t = &d->tensors[i];
        uint32_t layer = p[0] | (uint32_t)p[1] << 8, suffix = p[2] | (uint32_t)p[3] << 8;
        const char *sfx = suffix < n_strings ? (const char *)strings + suffix : "";
        int len = layer == NO_LAYER ? snprintf(t->name, sizeof t->name, "%s", sfx)
                                    : snprintf(t->name, sizeof t->name, "layers.%" PRIu32 ".%s", layer, sfx);
        int printable = *sfx != 0;
        for (const char *c = sfx; *c && printable; c++) printable = *c > 0x20 && *c < 0x7f;
        if (!printable || len < 0 || len >= (int)sizeof t->name || (layer != NO_LAYER && layer >= d->layers))
            return ple_fail(err, "model description: tensor %" PRIu32 " has an invalid name", i);
        t->dtype = p[4];
        t->ndim = p[5];
        t->group = rd32(p + 8);
        t->codes = rd64(p + 28);
        t->scales = rd64(p + 36);
        int is_int = t->dtype == PLE_INT8 || t->dtype == PLE_INT4;
        if (t->dtype >= PLE_NDTYPES || t->ndim == 0 || t->ndim > 4 || (is_int && !t->group) || (!is_int && t->group))
            return ple_fail(err, "tensor %s: bad encoding", t->name);
        t->numel = 1;
        for (int k = 0; k < 4; k++) {
            t->shape[k] = rd32(p + 12 + 4 * k);
            if ((k < t->ndim) != (t->shape[k] != 0) || t->shape[k] > MAX_DIM)
                return ple_fail(err, "tensor %s: bad shape", t->name);
            if (k < t->ndim) t->numel *= t->shape[k];
            if (t->numel > ((uint64_t)1 << 36)) return ple_fail(err, "tensor %s: bad shape", t->name);
        }
        t->codes_bytes = code_bytes(t->dtype, t->numel);
        t->scales_bytes = scale_bytes(t->dtype, t->group, t->numel);
        if (t->codes % 8 || t->scales % 8 || t->codes > ts->nbytes || t->codes_bytes > ts->nbytes - t->codes ||
            t->scales > ts->nbytes || t->scales_bytes > ts->nbytes - t->scales)
            return ple_fail(err, "tensor %s lies outside the tensors section", t->name);
        for (uint32_t k = 0; k < i; k++)
            if (!strcmp(d->tensors[k].name, t->name)) return ple_fail(err, "tensor %s appears twice", t->name);
    }
    uint64_t pad = (8 - (uint64_t)d->n_tensors * TENSOR_DESC % 8) % 8;
    if ((uint64_t)(end - p) < pad) return ple_fail(err, "model description is truncated (tables)");
    p += pad;
    return parse_tables(d, p, end, err);
}

int ple_read_desc(ple_storage *st, ple_desc *d, char *err) {
    memset(d, 0, sizeof *d);
    if (read_header(st, d, err)) return -1;
    const ple_section *ms = ple_find_section(d, "model");
    if (!ple_find_section(d, "meta")) return ple_fail(err, "has no meta section");
    if (!ms) return ple_fail(err, "has no model section (required from format version 2)");
    uint8_t *buf = read_checked(st, ms, err);
    if (!buf) return -1;
    int rc = parse_model(d, buf, ms->nbytes, err);
    free(buf);
    if (rc) {
        ple_desc_free(d);
        return -1;
    }
    /* meta is for tools; its checksum is still part of what "verified on open" means */
    buf = read_checked(st, ple_find_section(d, "meta"), err);
    if (!buf) {
        ple_desc_free(d);
        return -1;
    }
    free(buf);
    return 0;
}

void ple_desc_free(ple_desc *d) {
    free(d->ple_layers);
    free(d->tensors);
    free(d->ngram);
    d->ple_layers = NULL;
    d->tensors = NULL;
    d->ngram = NULL;
}

int ple_verify(ple_storage *st, const ple_desc *d, int tables, char *err) {
    enum { CHUNK = 4096 };
    static uint8_t buf[CHUNK]; /* open-time only; static keeps it off a small MCU stack */
    uint32_t crc = 0;
    uint64_t pos = HEADER_BYTES + (uint64_t)SECTION_BYTES * d->n_sections;
    for (uint32_t i = 0; i < d->n_sections; i++) {
        const ple_section *s = &d->sections[i];
        int is_table = ple_find_table(d, s->name) != NULL || !strcmp(s->name, "idmap") || !strcmp(s->name, "tokenizer");
        if (is_table && !tables) continue;
        if (tables) /* the padding before this section is covered by the body crc */
            for (uint64_t off = pos; off < s->offset; off += CHUNK) {
                size_t k = s->offset - off < CHUNK ? (size_t)(s->offset - off) : CHUNK;
                if (st->read(st, off, buf, k)) return ple_fail(err, "read error at offset %llu", (unsigned long long)off);
                crc = ple_crc32(crc, buf, k);
            }
        sha256_ctx c;
        sha256_init(&c);
        for (uint64_t off = s->offset; off < s->offset + s->nbytes; off += CHUNK) {
            size_t k = s->offset + s->nbytes - off < CHUNK ? (size_t)(s->offset + s->nbytes - off) : CHUNK;
            if (st->read(st, off, buf, k)) return ple_fail(err, "read error at offset %llu", (unsigned long long)off);
            sha256_update(&c, buf, k);
            if (tables) crc = ple_crc32(crc, buf, k);
        }
        uint8_t sha[32];
        sha256_final(&c, sha);
        if (memcmp(sha, s->sha256, 32)) return ple_fail(err, "section '%s' fails its sha256 checksum (file corrupt)", s->name);
        pos = s->offset + s->nbytes;
    }
    if (!tables) return 0;
    for (uint64_t off = pos; off < d->file_bytes; off += CHUNK) {
        size_t k = d->file_bytes - off < CHUNK ? (size_t)(d->file_bytes - off) : CHUNK;
        if (st->read(st, off, buf, k)) return ple_fail(err, "read error at offset %llu", (unsigned long long)off);
        crc = ple_crc32(crc, buf, k);
    }
    if (crc != d->body_crc) return ple_fail(err, "whole-file crc32 mismatch (file corrupt)");
    return 0;
}
