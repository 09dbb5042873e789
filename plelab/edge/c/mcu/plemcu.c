/* plemcu: the plelab C runtime on a bare-metal board (Cortex-M or RISC-V), the .ple file linked into its flash.
 *
 *   plemcu run --ids 1,2,3 --steps N [--verify 0|1|2] [--act fp32|int8] [--kv fp32|int8] [--head-skip]
 *                                                        greedy decode, one JSON line: tokens, timer ticks per
 *                                                        token, storage reads, SRAM / PSRAM use
 *   plemcu fuzz --cases N [--seed S]                     mutated copies of the flashed file (ple_mutate.h)
 *                                                        through ple_open and two decode steps; one JSON line
 *   plemcu calibrate [--loops N]                         timer ticks over a loop of 2N instructions
 *   plemcu kernels [--cases N] [--seed S]                the integer kernels against their scalar reference
 *                                                        (ple_kcheck.h), bit for bit; one JSON line
 *   plemcu fault --kind bus|stack                        a deliberate fault: its message, exit status 3
 *
 * Arguments come from the semihosting command line (qemu-system-* -semihosting-config arg=...). The model
 * is placed as plelab place places it on the esp32-s3 profile: its SRAM tier in what the 512 KiB SRAM region
 * leaves after stack, data and heap, its PSRAM tier in the PSRAM region; an error is one line on stderr and
 * exit status 2, a fault one line and status 3 (startup.c). */
#include <inttypes.h>
#include <malloc.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "board.h"
#include "ple.h"
#include "ple_int_kernels.h"
#include "ple_kcheck.h"
#include "ple_mutate.h"
#include "ple_storage_flash.h"

#ifndef PLE_MCU_BOARD
#define PLE_MCU_BOARD "unknown"
#endif
#ifndef PLE_MCU_CMDLINE_BYTES
#define PLE_MCU_CMDLINE_BYTES 8192 /* the semihosting command line, terminating zero included (plelab/edge/mcu.py) */
#endif
#ifndef PLE_MCU_MAX_STEPS
#define PLE_MCU_MAX_STEPS 1024
#endif
#define MAX_ARGS 32
#define MAX_STEPS PLE_MCU_MAX_STEPS

static void die(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
static void die(const char *fmt, ...) {
    char line[PLE_ERR + 32];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "plemcu: %s\n", line);
    fflush(stderr);
    board_exit(2);
}

static int split_args(char *line, char **argv) {
    int argc = 0;
    for (char *p = strtok(line, " "); p && argc < MAX_ARGS; p = strtok(NULL, " ")) argv[argc++] = p;
    return argc;
}

static const char *arg_value(int argc, char **argv, const char *name, const char *fallback) {
    for (int i = 0; i + 1 < argc; i++)
        if (!strcmp(argv[i], name)) return argv[i + 1];
    return fallback;
}

static int arg_flag(int argc, char **argv, const char *name) {
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], name)) return 1;
    return 0;
}

/* --NAME fp32|int8 -> 0 | 1 */
static int arg_int8(int argc, char **argv, const char *name) {
    const char *v = arg_value(argc, argv, name, "fp32");
    if (strcmp(v, "fp32") && strcmp(v, "int8")) die("%s wants fp32 or int8, got '%s'", name, v);
    return !strcmp(v, "int8");
}

static long arg_long(int argc, char **argv, const char *name, long fallback) {
    const char *v = arg_value(argc, argv, name, NULL);
    if (!v) return fallback;
    char *end;
    long x = strtol(v, &end, 10);
    if (*end || end == v) die("%s wants an integer, got '%s'", name, v);
    return x;
}

/* A count that must be at least 1 (cases, loops, steps): a zero or negative one is refused, not run as none. */
static long arg_count(int argc, char **argv, const char *name, long fallback) {
    long x = arg_long(argc, argv, name, fallback);
    if (x < 1) die("%s must be at least 1, got %ld", name, x);
    return x;
}

/* One region per device tier: the board's SRAM arena for a tier named sram, its PSRAM region for psram. */
static void board_regions(const ple_device *dev, ple_region *reg, board_region psram) {
    board_region sram = board_sram_arena();
    for (int t = 0; t < dev->n_tiers; t++) {
        reg[t] = (ple_region){NULL, 0};
        if (!strcmp(dev->tiers[t].name, "sram")) reg[t] = (ple_region){sram.base, sram.bytes};
        else if (!strcmp(dev->tiers[t].name, "psram")) reg[t] = (ple_region){psram.base, psram.bytes};
        else if (!dev->tiers[t].storage) die("device %s: this board has no memory for tier %s", dev->name, dev->tiers[t].name);
    }
}

/* Calls of the compiler's double-precision and 64-bit division helpers and of libm's double functions (board.h). */
typedef struct { uint32_t soft_double, div64, double_math; } helper_calls;

static helper_calls helper_calls_now(void) {
    return (helper_calls){board_soft_double_calls, board_div64_calls, board_double_math_calls};
}

/* `"name": {...}, ` with the calls made between two snapshots. */
static void print_helper_calls(const char *name, helper_calls a, helper_calls b) {
    printf("\"%s\": {\"soft_double\": %lu, \"div64\": %lu, \"double_math\": %lu}, ", name,
           (unsigned long)(b.soft_double - a.soft_double), (unsigned long)(b.div64 - a.div64),
           (unsigned long)(b.double_math - a.double_math));
}

static void print_tiers(const ple_model *m) {
    ple_tier_use use[PLE_MAX_TIERS];
    int n = ple_model_tier_use(m, use, PLE_MAX_TIERS);
    printf("\"tiers\": {");
    for (int i = 0; i < n && i < PLE_MAX_TIERS; i++)
        printf("%s\"%s\": {\"placed\": %llu, \"arena\": %llu, \"available\": %llu}", i ? ", " : "", use[i].tier,
               (unsigned long long)use[i].placed, (unsigned long long)use[i].arena,
               (unsigned long long)use[i].available);
    printf("}");
}

static int run(int argc, char **argv, const ple_device *dev) {
    size_t part_bytes;
    const uint8_t *part = board_model(&part_bytes);
    ple_storage st;
    ple_flash fl;
    ple_storage_flash(&st, &fl, part, part_bytes);
    ple_region reg[PLE_MAX_TIERS];
    board_regions(dev, reg, board_psram_arena());
    ple_options opt = {.verify = (int)arg_long(argc, argv, "--verify", 2), .device = dev, .regions = reg,
                       .int8_act = arg_int8(argc, argv, "--act"), .int8_kv = arg_int8(argc, argv, "--kv"),
                       .head_skip = arg_flag(argc, argv, "--head-skip")};
    char err[PLE_ERR];
    ple_model *m;
    board_timer_start();
    int rc = ple_open(&m, &st, &opt, err);
    uint64_t open_ticks = board_timer_ticks();
    if (rc) die("%s (storage: %llu refused reads past the file's end)", err, (unsigned long long)fl.refused);
    const ple_desc *d = ple_model_desc(m);

    static uint32_t tokens[MAX_STEPS + 1];
    static uint64_t ticks[MAX_STEPS];
    long n_prompt = 0, steps = arg_count(argc, argv, "--steps", 8);
    for (char *p = (char *)arg_value(argc, argv, "--ids", "1"); *p;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || (*end && *end != ',')) die("--ids wants comma-separated integers");
        if (v < 0 || (unsigned long)v >= d->vocab) die("token id %ld is out of range [0, %" PRIu32 ")", v, d->vocab);
        if (n_prompt >= MAX_STEPS) die("the prompt is longer than %d tokens", MAX_STEPS);
        tokens[n_prompt++] = (uint32_t)v;
        p = *end ? end + 1 : end;
    }
    if (steps < n_prompt || steps > (long)d->max_seq || steps > MAX_STEPS)
        die("--steps %ld must cover the %ld-token prompt and stay within %" PRIu32 " positions", steps, n_prompt,
            d->max_seq);
    uint64_t reads0 = fl.reads, bytes0 = fl.bytes;
    helper_calls open_calls = helper_calls_now(), calls;
    for (long pos = 0; pos < steps; pos++) {
        uint64_t t0 = board_timer_ticks();
        int64_t best = ple_forward_greedy(m, tokens[pos], (uint32_t)pos); /* the first maximum, as plerun */
        if (best < 0) die("cannot read a record from flash at position %ld", pos);
        if (pos + 1 >= n_prompt) tokens[pos + 1] = (uint32_t)best;
        ticks[pos] = board_timer_ticks() - t0;
    }
    calls = helper_calls_now();
    ple_traffic tr[PLE_MAX_TIERS];
    uint64_t counted;
    int nt = ple_model_traffic(m, tr, PLE_MAX_TIERS, &counted);
    struct mallinfo mi = mallinfo();
    board_region sram = board_sram_total(), sram_arena = board_sram_arena();
    uint64_t head_done, head_total;
    ple_model_head_rows(m, &head_done, &head_total);
    printf("{\"mode\": \"run\", \"board\": \"%s\", \"kernel\": \"%s\", \"act\": \"%s\", \"kv\": \"%s\", "
           "\"head_skip\": %s, \"head_rows_computed\": %llu, \"head_rows\": %llu, \"device\": \"%s\", \"tokens\": [",
           PLE_MCU_BOARD, ple_kernel_name(), opt.int8_act ? "int8" : "fp32", opt.int8_kv ? "int8" : "fp32",
           opt.head_skip ? "true" : "false", (unsigned long long)head_done, (unsigned long long)head_total, dev->name);
    for (long i = 0; i <= steps; i++) printf("%s%" PRIu32, i ? ", " : "", tokens[i]);
    printf("], \"prompt_tokens\": %ld, \"positions\": %ld, \"timer_hz\": %" PRIu32 ", \"open_ticks\": %llu"
           ", \"token_ticks\": [", n_prompt, steps, board_timer_hz(), (unsigned long long)open_ticks);
    for (long i = 0; i < steps; i++) printf("%s%llu", i ? ", " : "", (unsigned long long)ticks[i]);
    printf("], \"storage\": {\"reads_open\": %llu, \"bytes_open\": %llu, \"reads_decode\": %llu, \"bytes_decode\": %llu, "
           "\"refused\": %llu, \"file_bytes\": %llu, \"partition_bytes\": %llu}, ",
           (unsigned long long)reads0, (unsigned long long)bytes0, (unsigned long long)(fl.reads - reads0),
           (unsigned long long)(fl.bytes - bytes0), (unsigned long long)fl.refused, (unsigned long long)st.size,
           (unsigned long long)fl.partition);
    print_helper_calls("helper_calls_open", (helper_calls){0, 0, 0}, open_calls);
    print_helper_calls("helper_calls", open_calls, calls);
    print_tiers(m);
    printf(", \"sram_region\": {\"bytes\": %lu, \"stack_data_heap\": %lu, \"heap_used\": %lu, \"stack\": %lu, "
           "\"stack_used\": %lu}, \"arena_bytes\": %llu, "
           "\"weight_bytes\": %llu, \"kv_cache_bytes\": %llu, \"traffic_tokens\": %llu, \"traffic\": {",
           (unsigned long)sram.bytes, (unsigned long)(sram.bytes - sram_arena.bytes), (unsigned long)mi.uordblks,
           (unsigned long)board_stack_bytes(), (unsigned long)board_stack_used(),
           (unsigned long long)ple_model_arena_bytes(m), (unsigned long long)ple_model_weight_bytes(m),
           (unsigned long long)ple_model_kv_bytes(m), (unsigned long long)counted);
    for (int i = 0; i < nt; i++)
        printf("%s\"%s\": {\"bytes\": %.0f, \"reads\": %.0f}", i ? ", " : "", tr[i].tier, tr[i].bytes, tr[i].reads);
    printf("}}\n");
    ple_close(m);
    st.close(&st);
    return 0;
}

static int fuzz(int argc, char **argv, const ple_device *dev) {
    long cases = arg_count(argc, argv, "--cases", 200), seed = arg_long(argc, argv, "--seed", 1);
    size_t n;
    const uint8_t *flash = board_model(&n);
    ple_storage st;
    ple_flash fl;
    ple_storage_flash(&st, &fl, flash, n);
    n = (size_t)st.size;
    ple_desc d;
    char err[PLE_ERR];
    if (ple_read_desc(&st, &d, err)) die("the flashed seed file is not valid: %s", err);
    const ple_section *ms = ple_find_section(&d, "model");
    uint64_t model_off = ms->offset, model_len = ms->nbytes;
    ple_desc_free(&d);
    /* the mutated copy lives at the start of the PSRAM region, the arena's PSRAM part after it */
    board_region psram = board_psram_arena();
    size_t work_bytes = (n + 63) / 64 * 64;
    if (work_bytes > psram.bytes / 2) die("the seed file (%lu bytes) is too large to fuzz here", (unsigned long)n);
    uint8_t *work = psram.base;
    ple_region reg[PLE_MAX_TIERS];
    board_regions(dev, reg, (board_region){psram.base + work_bytes, psram.bytes - work_bytes});
    ple_rng rng;
    ple_rng_seed(&rng, (uint64_t)seed);
    long accepted = 0, rejected = 0, bad_messages = 0, refused = 0, by_kind[PLE_MUT_KINDS] = {0};
    board_timer_start();
    for (long c = 0; c < cases; c++) {
        int kind, verify;
        size_t len = ple_mutate(&rng, work, flash, n, model_off, model_len, &kind, &verify);
        by_kind[kind]++;
        ple_storage_flash(&st, &fl, work, len);
        ple_options opt = {.verify = verify ? 2 : 0, .device = dev, .regions = reg,
                           .int8_act = (int)(ple_rng_next(&rng) % 2), .int8_kv = (int)(ple_rng_next(&rng) % 2)};
        ple_model *m;
        err[0] = 0;
        if (ple_open(&m, &st, &opt, err)) {
            rejected++;
            if (!err[0] || strchr(err, '\n')) bad_messages++;
        } else {
            accepted++;
            ple_mut_exercise(m);
            ple_close(m);
        }
        refused += (long)fl.refused;
    }
    printf("{\"mode\": \"fuzz\", \"board\": \"%s\", \"cases\": %ld, \"accepted\": %ld, \"rejected\": %ld, "
           "\"bad_messages\": %ld, \"faults\": 0, \"refused_reads\": %ld, \"ticks\": %llu, \"timer_hz\": %" PRIu32
           ", \"heap_used_after\": %lu, \"stack_used\": %lu, \"by_kind\": {", PLE_MCU_BOARD, cases, accepted, rejected,
           bad_messages, refused, (unsigned long long)board_timer_ticks(), board_timer_hz(),
           (unsigned long)mallinfo().uordblks, (unsigned long)board_stack_used());
    for (int k = 0; k < PLE_MUT_KINDS; k++) printf("%s\"%s\": %ld", k ? ", " : "", PLE_MUT_NAMES[k], by_kind[k]);
    printf("}}\n");
    return bad_messages ? 1 : 0;
}

/* A loop of exactly 2 * n instructions (subs, taken bne) between two timer reads: the harness's check that the
 * timer counts instructions (qemu -icount shift=0) at the clock the build says. */
static int calibrate(int argc, char **argv) {
    uint32_t n = (uint32_t)arg_count(argc, argv, "--loops", 1000000);
    board_timer_start();
    uint64_t t0 = board_timer_ticks();
    board_count_loop(n);
    uint64_t t1 = board_timer_ticks();
    printf("{\"mode\": \"calibrate\", \"board\": \"%s\", \"loop_instructions\": %llu, \"ticks\": %llu, "
           "\"timer_hz\": %" PRIu32 "}\n", PLE_MCU_BOARD, 2ull * (unsigned long long)arg_long(argc, argv, "--loops", 1000000),
           (unsigned long long)(t1 - t0), board_timer_hz());
    return 0;
}

/* The built integer kernel against ple_kcheck's scalar reference, working memory from the PSRAM region. */
static int kernels(int argc, char **argv) {
    board_region psram = board_psram_arena();
    if (psram.bytes < PLE_KCHECK_BYTES + 16) die("the PSRAM region is smaller than the kernel check needs");
    uint8_t *mem = psram.base + (16 - (uintptr_t)psram.base % 16) % 16;
    ple_kcheck_result r;
    board_timer_start();
    ple_kcheck((uint32_t)arg_long(argc, argv, "--seed", 1), (uint32_t)arg_count(argc, argv, "--cases", 2000), NULL,
               mem, &r);
    printf("{\"mode\": \"kernels\", \"board\": \"%s\", \"kernel\": \"%s\", \"cases\": %" PRIu32
           ", \"mismatches\": %" PRIu32 ", \"first_bad\": %" PRIu32 ", \"digest\": \"%08" PRIx32 "\", \"ticks\": %llu}\n",
           PLE_MCU_BOARD, ple_kernel_name(), r.cases, r.mismatches, r.first_bad, r.digest,
           (unsigned long long)board_timer_ticks());
    return r.mismatches ? 1 : 0;
}

/* Deliberate faults, so a test can see that a fault ends in a message and status 3, not a hang. */
static volatile int stop_depth = -1; /* never reached: the recursion only ends in the fault */

static int deep(volatile uint8_t *up, int depth) {
    volatile uint8_t pad[256];
    pad[0] = (uint8_t)depth;
    pad[255] = up ? up[0] : 0;
    if (depth == stop_depth) return pad[0];
    return deep(pad, depth + 1) + pad[255]; /* not a tail call: every level keeps its frame */
}

static int fault(int argc, char **argv) {
    const char *kind = arg_value(argc, argv, "--kind", "bus");
    if (!strcmp(kind, "bus")) return (int)*(volatile uint32_t *)(uintptr_t)0xF0000000u; /* nothing is mapped */
    if (!strcmp(kind, "stack")) return deep(NULL, 0);
    die("--kind wants bus or stack");
}

int main(void) {
    static char line[PLE_MCU_CMDLINE_BYTES];
    char *argv[MAX_ARGS];
    if (board_cmdline(line, sizeof line)) die("no command line (run under QEMU with -semihosting-config)");
    int argc = split_args(line, argv);
    int first = argc && strncmp(argv[0], "--", 2) && strcmp(argv[0], "run") && strcmp(argv[0], "fuzz") &&
                strcmp(argv[0], "calibrate") && strcmp(argv[0], "fault") &&
                strcmp(argv[0], "kernels"); /* skip argv[0], the program name */
    if (argc <= first) die("usage: plemcu run --ids 1,2,3 --steps N | fuzz --cases N --seed S | calibrate --loops N");
    ple_device dev;
    char err[PLE_ERR];
    if (ple_device_load(arg_value(argc, argv, "--device", "esp32-s3"), &dev, err)) die("%s", err);
    const char *mode = argv[first];
    int rc = !strcmp(mode, "run")         ? run(argc, argv, &dev)
             : !strcmp(mode, "fuzz")      ? fuzz(argc, argv, &dev)
             : !strcmp(mode, "calibrate") ? calibrate(argc, argv)
             : !strcmp(mode, "fault")     ? fault(argc, argv)
             : !strcmp(mode, "kernels")   ? kernels(argc, argv)
                                          : -1;
    if (rc < 0) die("unknown mode '%s' (run, fuzz, calibrate, fault or kernels)", mode);
    fflush(stdout);
    return rc;
}
