/* pletanh: ple_tanhf (ple_tanh.h) against the double-precision tanh, rounded to float.
 *
 *   pletanh [--stride S]
 *
 * Walks every S-th non-negative float bit pattern (S = 1: all 2^31 of them, about a minute), each with its negative,
 * plus zeros, infinities and NaN. Prints one JSON line: checked, max_ulp (largest distance in ulps from the rounded
 * double result), exact (how many were bitwise equal to it), worst (the input with the largest distance), odd_failures
 * (inputs where tanh(-x) was not -tanh(x) bitwise), special_failures. Exit status 1 when max_ulp > 1 or any failure
 * counts, 2 on bad arguments. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ple_tanh.h"

static uint32_t bits_of(float x) {
    uint32_t b;
    memcpy(&b, &x, 4);
    return b;
}

static float float_of(uint32_t b) {
    float x;
    memcpy(&x, &b, 4);
    return x;
}

int main(int argc, char **argv) {
    unsigned long stride = 97;
    for (int i = 1; i < argc; i++) {
        if (i + 1 < argc && !strcmp(argv[i], "--stride")) stride = strtoul(argv[++i], NULL, 10);
        else stride = 0;
    }
    if (stride < 1) {
        fprintf(stderr, "pletanh: usage: pletanh [--stride S], S >= 1\n");
        return 2;
    }
    unsigned long checked = 0, exact = 0, odd_failures = 0, special_failures = 0;
    uint32_t max_ulp = 0, worst = 0;
    for (uint64_t b = 0; b < 0x7f800000u; b += stride) {
        float x = float_of((uint32_t)b);
        uint32_t got = bits_of(ple_tanhf(x)), want = bits_of((float)tanh((double)x));
        uint32_t d = got > want ? got - want : want - got; /* same sign: bit distance = ulps */
        if (d > max_ulp) max_ulp = d, worst = (uint32_t)b;
        exact += d == 0;
        odd_failures += bits_of(ple_tanhf(-x)) != (got ^ 0x80000000u);
        checked++;
    }
    special_failures += bits_of(ple_tanhf(0.0f)) != 0u;
    special_failures += bits_of(ple_tanhf(-0.0f)) != 0x80000000u;
    special_failures += ple_tanhf(INFINITY) != 1.0f;
    special_failures += ple_tanhf(-INFINITY) != -1.0f;
    special_failures += !isnan(ple_tanhf(NAN));
    special_failures += ple_tanhf(3.4e38f) != 1.0f;
    special_failures += bits_of(ple_tanhf(1e-40f)) != bits_of(1e-40f); /* subnormal: tanh(x) = x */
    printf("{\"checked\": %lu, \"stride\": %lu, \"max_ulp\": %lu, \"exact\": %lu, \"worst\": %.9g, "
           "\"odd_failures\": %lu, \"special_failures\": %lu}\n",
           checked, stride, (unsigned long)max_ulp, exact, (double)float_of(worst), odd_failures, special_failures);
    return max_ulp > 1 || odd_failures || special_failures;
}
