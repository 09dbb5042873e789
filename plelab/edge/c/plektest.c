/* plektest: the integer kernels' self-check (ple_kcheck.h) on the host.
 *
 *   plektest [--cases N] [--seed S] [--emit FILE]
 *
 * Prints one JSON line: kernel, cases, mismatches (against the in-binary scalar reference, bit for bit), first_bad,
 * digest. --emit writes every case's inputs and result as JSON lines (tests/edge/test_c_mcu_kernels.py recomputes
 * them with NumPy). Exit status 1 when any case differs, 2 on bad arguments. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ple_kcheck.h"
#include "ple_int_kernels.h"

int main(int argc, char **argv) {
    unsigned long cases = 2000, seed = 1;
    const char *emit_path = NULL;
    for (int i = 1; i < argc; i++) {
        if (i + 1 < argc && !strcmp(argv[i], "--cases")) cases = strtoul(argv[++i], NULL, 10);
        else if (i + 1 < argc && !strcmp(argv[i], "--seed")) seed = strtoul(argv[++i], NULL, 10);
        else if (i + 1 < argc && !strcmp(argv[i], "--emit")) emit_path = argv[++i];
        else {
            fprintf(stderr, "plektest: usage: plektest [--cases N] [--seed S] [--emit FILE]\n");
            return 2;
        }
    }
    FILE *emit = emit_path ? fopen(emit_path, "w") : NULL;
    unsigned char *raw = malloc(PLE_KCHECK_BYTES + 16);
    void *mem = raw ? raw + (16 - (size_t)raw % 16) % 16 : NULL;
    if ((emit_path && !emit) || !mem) {
        fprintf(stderr, "plektest: cannot open %s or allocate memory\n", emit_path ? emit_path : "-");
        return 2;
    }
    ple_kcheck_result r;
    ple_kcheck((uint32_t)seed, (uint32_t)cases, emit, mem, &r);
    if (emit && fclose(emit)) {
        fprintf(stderr, "plektest: writing %s failed\n", emit_path);
        return 2;
    }
    printf("{\"kernel\": \"%s\", \"cases\": %lu, \"mismatches\": %lu, \"first_bad\": %lu, \"digest\": \"%08lx\"}\n",
           ple_kernel_name(), (unsigned long)r.cases, (unsigned long)r.mismatches, (unsigned long)r.first_bad,
           (unsigned long)r.digest);
    free(raw);
    return r.mismatches ? 1 : 0;
}
