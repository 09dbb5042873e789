/* plerun: run a .ple model from the command line (the C engine of `plelab run --engine c`).
 *
 *   plerun MODEL.ple --ids 1,2,3 --steps N [--temperature T --top-k K --top-p P --seed S] [--threads T]
 *          [--no-verify-table] [--verify-none] [--mmap] [--device NAME_OR_PROFILE_FILE] [--dump-logits FILE]
 *          [--act fp32|int8] [--kv fp32|int8] [--head-skip] [--json]
 *
 * --steps is the number of positions run, prompt included (llama2.c's -n): positions 0..N-1 are fed, and the
 * token sampled after each position from the end of the prompt on is emitted, so `tokens` holds N + 1 ids.
 * --act int8: products with int8 / int4 weights quantise their input to int8 (ple_int_kernels.h); fp32 (the default)
 * is the reference path. --kv int8: the KV cache keeps int8 codes and one scale per head vector. --head-skip
 * (greedy, with --act int8): only the head rows that can still win are computed; the same ids.
 * Errors: one line on stderr, exit 2.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "ple.h"
#include "ple_int_kernels.h"

static void die(const char *fmt, ...) {
    va_list ap;
    fputs("plerun: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(2);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static long parse_int(const char *flag, const char *s, long lo, long hi) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *s == 0 || *end || v < lo || v > hi) die("%s wants an integer in [%ld, %ld], got '%s'", flag, lo, hi, s);
    return v;
}

static double parse_real(const char *flag, const char *s, double lo, double hi) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *s == 0 || *end || !(v >= lo && v <= hi)) die("%s wants a number in [%g, %g], got '%s'", flag, lo, hi, s);
    return v;
}

/* 0 for the first choice, 1 for the second. */
static int parse_choice(const char *flag, const char *s, const char *first, const char *second) {
    if (!strcmp(s, first)) return 0;
    if (!strcmp(s, second)) return 1;
    die("%s wants %s or %s, got '%s'", flag, first, second, s);
    return 0;
}

/* ---- sampling ------------------------------------------------------------------------------------------ */

typedef struct { float p; uint32_t i; } cand;

static uint64_t rng_state;
static float rng_uniform(void) { /* xorshift64*, top 24 bits */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (float)((rng_state * 0x2545F4914F6CDD1Dull) >> 40) / 16777216.0f;
}

static int by_prob(const void *a, const void *b) {
    float x = ((const cand *)a)->p, y = ((const cand *)b)->p;
    return x < y ? 1 : x > y ? -1 : 0;
}

static uint32_t sample(const float *logits, uint32_t n, double temp, long top_k, double top_p, cand *c) {
    uint32_t best = ple_argmax(logits, n);
    if (temp <= 0) return best;
    double sum = 0;
    for (uint32_t i = 0; i < n; i++) {
        c[i].p = (float)exp((logits[i] - logits[best]) / temp);
        c[i].i = i;
        sum += c[i].p;
    }
    uint32_t keep = n;
    if (top_k > 0 || top_p < 1) {
        qsort(c, n, sizeof *c, by_prob);
        if (top_k > 0 && (uint32_t)top_k < keep) keep = (uint32_t)top_k;
        double run = 0, kept = 0;
        for (uint32_t i = 0; i < keep; i++) kept += c[i].p;
        for (uint32_t i = 0; i < keep; i++) {
            run += c[i].p;
            if (run >= top_p * kept) {
                keep = i + 1;
                break;
            }
        }
        sum = 0;
        for (uint32_t i = 0; i < keep; i++) sum += c[i].p;
    }
    double r = rng_uniform() * sum, acc = 0;
    for (uint32_t i = 0; i < keep; i++) {
        acc += c[i].p;
        if (r < acc) return c[i].i;
    }
    return c[keep - 1].i;
}

/* ---- main ---------------------------------------------------------------------------------------------- */

int main(int argc, char **argv) {
    const char *model = NULL, *ids_arg = NULL, *device_arg = NULL, *dump = NULL;
    long steps = -1, top_k = 0, seed = 0, threads = 1;
    double temp = 0, top_p = 1;
    int json = 0, verify = 2, map = 0, int8_act = 0, int8_kv = 0, head_skip = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
#define VALUE() (has ? argv[++i] : (die("%s needs a value", a), ""))
        if (!strcmp(a, "--ids")) ids_arg = VALUE();
        else if (!strcmp(a, "--steps")) steps = parse_int(a, VALUE(), 1, 1L << 30);
        else if (!strcmp(a, "--temperature")) temp = parse_real(a, VALUE(), 0, 1e6);
        else if (!strcmp(a, "--top-k")) top_k = parse_int(a, VALUE(), 0, 1L << 30);
        else if (!strcmp(a, "--top-p")) top_p = parse_real(a, VALUE(), 1e-9, 1);
        else if (!strcmp(a, "--seed")) seed = parse_int(a, VALUE(), 0, 1L << 62);
        else if (!strcmp(a, "--threads")) threads = parse_int(a, VALUE(), 1, 1024);
        else if (!strcmp(a, "--device")) device_arg = VALUE();
        else if (!strcmp(a, "--dump-logits")) dump = VALUE();
        else if (!strcmp(a, "--no-verify-table")) verify = 1;
        else if (!strcmp(a, "--verify-none")) verify = 0;
        else if (!strcmp(a, "--mmap")) map = 1;
        else if (!strcmp(a, "--json")) json = 1;
        else if (!strcmp(a, "--act")) int8_act = parse_choice(a, VALUE(), "fp32", "int8");
        else if (!strcmp(a, "--kv")) int8_kv = parse_choice(a, VALUE(), "fp32", "int8");
        else if (!strcmp(a, "--head-skip")) head_skip = 1;
        else if (a[0] == '-') die("unknown option %s", a);
        else if (!model) model = a;
        else die("more than one model file given (%s)", a);
#undef VALUE
    }
    if (!model || !ids_arg) die("usage: plerun MODEL.ple --ids 1,2,3 [--steps N] [--json] (see docs/c-runtime.md)");
#ifdef _OPENMP
    omp_set_num_threads((int)threads);
#else
    if (threads != 1) die("--threads %ld needs a build with OpenMP (plelab builds it with openmp=True)", threads);
#endif
    char err[PLE_ERR];
    ple_device dev;
    if (device_arg && ple_device_load(device_arg, &dev, err)) die("%s", err);
    ple_storage st;
    if ((map ? ple_storage_mmap : ple_storage_file)(&st, model, err)) die("%s", err);
    ple_options opt = {.verify = verify, .map_weights = map, .device = device_arg ? &dev : NULL, .int8_act = int8_act,
                       .int8_kv = int8_kv, .head_skip = head_skip};
    if (head_skip && (temp > 0 || dump))
        die("--head-skip computes only the head rows that can win: it needs --temperature 0 and no --dump-logits");
    ple_model *m;
    if (ple_open(&m, &st, &opt, err)) die("%s: %s", model, err);
    const ple_desc *d = ple_model_desc(m);

    uint32_t *tokens = malloc(sizeof(uint32_t) * ((size_t)d->max_seq + 1));
    cand *cands = temp > 0 ? malloc(sizeof(cand) * d->vocab) : NULL;
    if (!tokens || (temp > 0 && !cands)) die("out of memory");
    long n_prompt = 0, n_bad = 0, too_long = 0;
    char bad[160] = ""; /* the first 5 ids outside the vocabulary, as the Python runtimes print them */
    for (const char *p = ids_arg; *p;) {
        char *end;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (end == p || errno) die("--ids wants comma-separated integers, got '%s'", ids_arg);
        if (v < 0 || v >= (long long)d->vocab) {
            if (n_bad++ < 5) {
                size_t used = strlen(bad);
                snprintf(bad + used, sizeof bad - used, "%s%lld", used ? ", " : "", v);
            }
        } else if (n_prompt >= (long)d->max_seq) {
            too_long = 1;
        } else {
            tokens[n_prompt++] = (uint32_t)v;
        }
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') die("--ids wants comma-separated integers, got '%s'", ids_arg);
    }
    if (n_bad) /* the wording of plelab.errors.token_id_message: one message whichever engine runs */
        die("token ids must lie in [0, %u); got [%s] (is the tokenizer the one this model was built for?)", d->vocab,
            bad);
    if (too_long) die("the prompt is longer than the model's context of %u tokens", d->max_seq);
    if (n_prompt == 0) die("the prompt is empty");
    if (steps < 0) steps = d->max_seq;
    if (steps > (long)d->max_seq) die("--steps %ld exceeds the model's context of %u positions", steps, d->max_seq);
    if (steps < n_prompt) die("--steps %ld is shorter than the %ld-token prompt (it counts the prompt)", steps, n_prompt);
    FILE *df = dump ? fopen(dump, "wb") : NULL;
    if (dump && !df) die("%s: cannot write (%s)", dump, strerror(errno));
    rng_state = (uint64_t)seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;

    double t0 = 0;
    for (long pos = 0; pos < steps; pos++) {
        if (pos == 1) t0 = now(); /* like llama2.c: the first position warms caches */
        if (head_skip) {
            int64_t id = ple_forward_greedy(m, tokens[pos], (uint32_t)pos);
            if (id < 0) die("%s: cannot read a record from storage", model);
            if (pos + 1 >= n_prompt) tokens[pos + 1] = (uint32_t)id;
            continue;
        }
        const float *logits = ple_forward(m, tokens[pos], (uint32_t)pos);
        if (!logits) die("%s: cannot read a record from storage", model);
        if (df && fwrite(logits, sizeof(float), d->vocab, df) != d->vocab) die("%s: write failed", dump);
        if (pos + 1 >= n_prompt) tokens[pos + 1] = sample(logits, d->vocab, temp, top_k, top_p, cands);
    }
    double elapsed = steps > 1 ? now() - t0 : 0;
    if (df && fclose(df)) die("%s: write failed", dump);
    double tps = elapsed > 0 ? (double)(steps - 1) / elapsed : 0;

    uint64_t head_done, head_total;
    ple_model_head_rows(m, &head_done, &head_total);
    ple_traffic tr[PLE_MAX_TIERS];
    uint64_t counted;
    int nt = ple_model_traffic(m, tr, PLE_MAX_TIERS, &counted);
    double per = counted ? (double)counted : 1;
    uint64_t peak = ple_model_peak_bytes(m) + sizeof(uint32_t) * ((uint64_t)d->max_seq + 1) +
                    (cands ? sizeof(cand) * (uint64_t)d->vocab : 0);
    if (json) {
        printf("{\"tokens\": [");
        for (long i = 0; i <= steps; i++) printf("%s%u", i ? ", " : "", tokens[i]);
        printf("], \"prompt_tokens\": %ld, \"positions\": %ld, \"tok_per_s\": %.3f, \"ms_per_token\": %.6f, "
               "\"threads\": %ld, \"act\": \"%s\", \"kv\": \"%s\", \"kernel\": \"%s\", \"traffic\": {", n_prompt, steps,
               tps, tps > 0 ? 1000.0 / tps : 0.0, threads, int8_act ? "int8" : "fp32", int8_kv ? "int8" : "fp32",
               ple_kernel_name());
        for (int i = 0; i < nt; i++)
            printf("%s\"%s\": {\"bytes_per_token\": %.6f, \"reads_per_token\": %.6f}", i ? ", " : "", tr[i].tier,
                   tr[i].bytes / per, tr[i].reads / per);
        ple_tier_use use[PLE_MAX_TIERS];
        int nu = ple_model_tier_use(m, use, PLE_MAX_TIERS);
        printf("}, \"tiers\": {");
        for (int i = 0; i < nu && i < PLE_MAX_TIERS; i++)
            printf("%s\"%s\": {\"placed\": %llu, \"arena\": %llu, \"available\": %llu}", i ? ", " : "", use[i].tier,
                   (unsigned long long)use[i].placed, (unsigned long long)use[i].arena,
                   (unsigned long long)use[i].available);
        printf("}, \"device\": %s%s%s, \"peak_ram_bytes\": %llu, \"arena_bytes\": %llu, \"weight_bytes\": %llu, "
               "\"kv_cache_bytes\": %llu, \"head_rows_computed\": %llu, \"head_rows\": %llu}\n",
               device_arg ? "\"" : "", device_arg ? dev.name : "null", device_arg ? "\"" : "", (unsigned long long)peak,
               (unsigned long long)ple_model_arena_bytes(m), (unsigned long long)ple_model_weight_bytes(m),
               (unsigned long long)ple_model_kv_bytes(m), (unsigned long long)head_done,
               (unsigned long long)head_total);
    } else {
        for (long i = 0; i <= steps; i++) printf("%s%u", i ? "," : "", tokens[i]);
        printf("\n");
        fprintf(stderr, "-- %ld positions, %.1f tok/s on %ld thread(s); arena %llu bytes; per token:", steps, tps,
                threads, (unsigned long long)ple_model_arena_bytes(m));
        for (int i = 0; i < nt; i++) fprintf(stderr, " %s %.0f B in %g reads", tr[i].tier, tr[i].bytes / per, tr[i].reads / per);
        fprintf(stderr, "\n");
    }
    ple_close(m);
    st.close(&st);
    free(tokens);
    free(cands);
    return 0;
}
