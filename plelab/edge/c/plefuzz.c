/* plefuzz: in-process mutation fuzzer for the .ple parser (build with -fsanitize=address,undefined).
 *
 *   plefuzz VALID.ple [--cases N] [--seed S]      -> one JSON line of counts on stdout
 *
 * Each case mutates a copy of a valid file (ple_mutate.h: seeded bit flips, byte sets, truncations, and edits
 * of the size, offset and count fields with every checksum recomputed), opens it from memory, and when it is accepted runs two decode steps. A
 * rejection must be a non-empty one-line message; a crash, hang or sanitizer report ends the process.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ple.h"
#include "ple_mutate.h"

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "plefuzz: usage: plefuzz VALID.ple [--cases N] [--seed S]\n");
        return 2;
    }
    long cases = 10000;
    unsigned long long seed = 1;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--cases")) cases = strtol(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--seed")) seed = strtoull(argv[i + 1], NULL, 10);
    }
    FILE *fp = fopen(argv[1], "rb");
    if (!fp) {
        fprintf(stderr, "plefuzz: cannot open %s\n", argv[1]);
        return 2;
    }
    fseek(fp, 0, SEEK_END);
    size_t n = (size_t)ftell(fp);
    fseek(fp, 0, SEEK_SET);
    uint8_t *orig = malloc(n), *work = malloc(n + 64);
    if (!orig || !work || fread(orig, 1, n, fp) != n) {
        fprintf(stderr, "plefuzz: cannot read %s\n", argv[1]);
        return 2;
    }
    fclose(fp);
    char err[PLE_ERR];
    ple_storage st;
    ple_desc d;
    ple_storage_mem(&st, orig, n);
    if (ple_read_desc(&st, &d, err)) {
        fprintf(stderr, "plefuzz: the seed file is not valid: %s\n", err);
        return 2;
    }
    const ple_section *ms = ple_find_section(&d, "model");
    uint64_t model_off = ms->offset, model_len = ms->nbytes;
    ple_desc_free(&d);

    ple_rng rng;
    ple_rng_seed(&rng, seed);
    long accepted = 0, rejected = 0, bad_messages = 0, by_kind[PLE_MUT_KINDS] = {0};
    clock_t t0 = clock();
    for (long c = 0; c < cases; c++) {
        int kind, verify;
        size_t len = ple_mutate(&rng, work, orig, n, model_off, model_len, &kind, &verify);
        by_kind[kind]++;
        ple_storage_mem(&st, work, len);
        ple_options opt = {.verify = verify, .map_weights = (int)(ple_rng_next(&rng) % 2), .max_arena = 64u << 20,
                           .int8_act = (int)(ple_rng_next(&rng) % 2)};
        ple_model *m;
        err[0] = 0;
        if (ple_open(&m, &st, &opt, err)) {
            rejected++;
            if (!err[0] || strchr(err, '\n')) bad_messages++;
            continue;
        }
        accepted++;
        ple_mut_exercise(m);
        ple_close(m);
    }
    double secs = (double)(clock() - t0) / CLOCKS_PER_SEC;
    printf("{\"cases\": %ld, \"accepted\": %ld, \"rejected\": %ld, \"bad_messages\": %ld, \"crashes\": 0, "
           "\"seconds\": %.3f, \"by_kind\": {", cases, accepted, rejected, bad_messages, secs);
    for (int k = 0; k < PLE_MUT_KINDS; k++) printf("%s\"%s\": %ld", k ? ", " : "", PLE_MUT_NAMES[k], by_kind[k]);
    printf("}}\n");
    free(orig);
    free(work);
    return bad_messages ? 1 : 0;
}
