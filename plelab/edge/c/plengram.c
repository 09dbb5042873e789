/* plengram: the n-gram hash of ple_ngram.c on given inputs, one JSON line out; on the host (argv) and, built with
 * -DPLE_BARE_METAL into a board image (plelab/edge/mcu.py), bare metal (the semihosting command line).
 *
 *   plengram [fmix X,Y,...] [mult SEED:ORDER:HEAD:I,...] [case ORDERS HEADS ROWS SEED IDS]...
 *       ORDERS, ROWS (one per order) and IDS comma-separated uint32s
 *   -> {"fmix": [...], "mult": [...], "cases": [[[rows of position 0], ...], ...]}
 *      bare metal adds "helper_calls": the double-precision and 64-bit division helpers (and libm's double
 *      functions) the hash functions called, parsing and printing apart
 *
 * What tests/edge/test_ngram_hash.py compares with docs/ngram-ple-vectors.json. Bad input: one line on stderr, exit
 * status 2. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ple.h"

#ifdef PLE_BARE_METAL
#include "board.h"
#ifndef PLE_MCU_CMDLINE_BYTES
#define PLE_MCU_CMDLINE_BYTES 8192
#endif
#endif

#define MAX_ARGS 64
#define MAX_IDS 256
#define MAX_VALUES 64

/* Helper calls made inside the hash functions (bare metal: board.h's counters, read around each call). */
static uint32_t hash_helpers[3];
#ifdef PLE_BARE_METAL
static void helpers_now(uint32_t *c) {
    c[0] = board_soft_double_calls;
    c[1] = board_div64_calls;
    c[2] = board_double_math_calls;
}
#else
static void helpers_now(uint32_t *c) { c[0] = c[1] = c[2] = 0; }
#endif
#define COUNTED(call)                                                   \
    do {                                                                \
        uint32_t before_[3], after_[3];                                 \
        helpers_now(before_);                                           \
        call;                                                           \
        helpers_now(after_);                                            \
        for (int k_ = 0; k_ < 3; k_++) hash_helpers[k_] += after_[k_] - before_[k_]; \
    } while (0)

static void die(const char *what, const char *arg) {
    fprintf(stderr, "plengram: %s: '%s'\n", what, arg);
    fflush(stderr);
#ifdef PLE_BARE_METAL
    board_exit(2);
#else
    exit(2);
#endif
}

/* Comma-separated uint32s (sep ',') or colon-separated ones (sep ':') into out; returns how many. */
static uint32_t parse_u32s(const char *text, char sep, uint32_t *out, uint32_t max) {
    uint32_t n = 0;
    for (const char *p = text; *p;) {
        char *end;
        unsigned long long v = strtoull(p, &end, 10);
        if (end == p || v > 0xFFFFFFFFull || (*end && *end != sep) || n == max) die("not a list of uint32s", text);
        out[n++] = (uint32_t)v;
        p = *end ? end + 1 : end;
    }
    return n;
}

static void print_list(const uint32_t *v, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) printf("%s%lu", i ? ", " : "", (unsigned long)v[i]);
}

/* The S rows of every position of ids (T of them), as a JSON list of lists. */
static void print_case(char **argv) {
    ple_ngram g;
    memset(&g, 0, sizeof g);
    uint32_t heads[1], seed[1], rows[PLE_NGRAM_MAX_ORDER], ids[MAX_IDS], hist[PLE_NGRAM_MAX_ORDER];
    g.n_orders = parse_u32s(argv[0], ',', g.orders, PLE_NGRAM_MAX_ORDER);
    if (parse_u32s(argv[1], ',', heads, 1) != 1 || heads[0] == 0 || heads[0] > PLE_NGRAM_MAX_HEADS)
        die("heads must be 1-255", argv[1]);
    if (parse_u32s(argv[2], ',', rows, PLE_NGRAM_MAX_ORDER) != g.n_orders) die("one rows count per order", argv[2]);
    if (parse_u32s(argv[3], ',', seed, 1) != 1) die("one seed", argv[3]);
    uint32_t T = parse_u32s(argv[4], ',', ids, MAX_IDS);
    for (uint32_t o = 0; o < g.n_orders; o++) {
        if (!g.orders[o] || g.orders[o] > PLE_NGRAM_MAX_ORDER || (o && g.orders[o] <= g.orders[o - 1]) || rows[o] < 2)
            die("orders ascend in 1-8, heads have 2 rows or more", argv[0]);
        g.rows[o] = rows[o];
    }
    g.heads = heads[0];
    g.seed = seed[0];
    static uint32_t mult[PLE_NGRAM_MAX_ORDER * PLE_NGRAM_MAX_ORDER * PLE_NGRAM_MAX_HEADS];
    static uint64_t out[PLE_NGRAM_MAX_ORDER * PLE_NGRAM_MAX_HEADS];
    COUNTED(ple_ngram_multipliers(&g, mult));
    printf("[");
    for (uint32_t t = 0; t < T; t++) {
        for (uint32_t i = 0; i < PLE_NGRAM_MAX_ORDER; i++) hist[i] = i <= t ? ids[t - i] : PLE_NGRAM_PAD;
        COUNTED(ple_ngram_rows(&g, mult, hist, out));
        printf("%s[", t ? ", " : "");
        for (uint32_t j = 0; j < ple_ngram_heads(&g); j++) printf("%s%llu", j ? ", " : "", (unsigned long long)out[j]);
        printf("]");
    }
    printf("]");
}

static int run(int argc, char **argv) {
    uint32_t v[MAX_VALUES], n, cases = 0;
    printf("{");
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "fmix") && i + 1 < argc) {
            n = parse_u32s(argv[++i], ',', v, MAX_VALUES);
            for (uint32_t k = 0; k < n; k++) COUNTED(v[k] = ple_fmix32(v[k]));
            printf("\"fmix\": [");
            print_list(v, n);
            printf("], ");
        } else if (!strcmp(argv[i], "mult") && i + 1 < argc) {
            printf("\"mult\": [");
            n = 0;
            for (char *p = argv[++i]; *p; n++) { /* SEED:ORDER:HEAD:I entries, comma-separated */
                char *comma = strchr(p, ','), *next = comma ? comma + 1 : p + strlen(p);
                uint32_t q[4];
                if (comma) *comma = 0;
                if (parse_u32s(p, ':', q, 4) != 4) die("mult entries are SEED:ORDER:HEAD:I", p);
                uint32_t m;
                COUNTED(m = ple_ngram_multiplier(q[0], q[1], q[2], q[3]));
                printf("%s%lu", n ? ", " : "", (unsigned long)m);
                p = next;
            }
            printf("], ");
        } else if (!strcmp(argv[i], "case") && i + 5 < argc) {
            printf("%s", cases++ ? ", " : "\"cases\": [");
            print_case(argv + i + 1);
            i += 5;
        } else {
            die("usage: plengram [fmix X,...] [mult S:N:K:I,...] [case ORDERS HEADS ROWS SEED IDS]..., got", argv[i]);
        }
    }
    printf("%s", cases ? "], " : "");
#ifdef PLE_BARE_METAL
    printf("\"helper_calls\": {\"soft_double\": %lu, \"div64\": %lu, \"double_math\": %lu}, ",
           (unsigned long)hash_helpers[0], (unsigned long)hash_helpers[1], (unsigned long)hash_helpers[2]);
#endif
    printf("\"done\": true}\n");
    fflush(stdout);
    return 0;
}

#ifdef PLE_BARE_METAL
int main(void) {
    static char line[PLE_MCU_CMDLINE_BYTES];
    char *argv[MAX_ARGS];
    int argc = 0;
    if (board_cmdline(line, sizeof line)) die("no command line (run under QEMU with -semihosting-config)", "");
    for (char *p = strtok(line, " "); p && argc < MAX_ARGS; p = strtok(NULL, " ")) argv[argc++] = p;
    return run(argc - 1, argv + 1); /* argv[0]: the program's name */
}
#else
int main(int argc, char **argv) { return run(argc - 1, argv + 1); }
#endif
