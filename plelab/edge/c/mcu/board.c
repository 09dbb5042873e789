/* What every board of the bare-metal harness shares: semihosting's operations (each architecture supplies only
 * its trap, board_semihost), the stack's paint and high-water mark, the memory regions of the linker script, and
 * the one-line fault report. */
#include <stdint.h>
#include <string.h>

#include "board.h"

extern uint32_t __stack_top[], __stack_limit[], __stack_guard[];
extern uint8_t __sram_arena_start[], __sram_arena_end[], __psram_arena_start[], __psram_arena_end[];
extern const uint8_t ple_partition_start[], ple_partition_end[];

/* ---- semihosting (QEMU: -semihosting-config enable=on,target=native) ---------------------------------------- */

enum { SYS_OPEN = 0x01, SYS_WRITE = 0x05, SYS_GET_CMDLINE = 0x15, SYS_EXIT = 0x18, SYS_EXIT_EXTENDED = 0x20 };

static int handles[3] = {-1, -1, -1};

void board_write(int fd, const char *buf, size_t n) {
    fd = fd == 2 ? 2 : 1;
    if (handles[fd] < 0) { /* ":tt" opened for writing is the host's stdout, for appending its stderr */
        uintptr_t args[3] = {(uintptr_t)":tt", fd == 2 ? 8 /* "a" */ : 4 /* "w" */, 3};
        handles[fd] = (int)board_semihost(SYS_OPEN, args);
    }
    uintptr_t args[3] = {(uintptr_t)handles[fd], (uintptr_t)buf, (uintptr_t)n};
    board_semihost(SYS_WRITE, args);
}

int board_cmdline(char *buf, size_t n) {
    uintptr_t args[2] = {(uintptr_t)buf, (uintptr_t)n};
    return board_semihost(SYS_GET_CMDLINE, args) == 0 ? 0 : -1;
}

void board_exit(int status) {
    uintptr_t args[2] = {0x20026 /* ADP_Stopped_ApplicationExit */, (uintptr_t)status};
    board_semihost(SYS_EXIT_EXTENDED, args);
    board_semihost(SYS_EXIT, (void *)(uintptr_t)(status ? 0x20024 /* ADP_Stopped_RunTimeErrorUnknown */ : 0x20026));
    for (;;) {
    }
}

void board_fault(const char *what) {
    static const char prefix[] = "plemcu: fault: ";
    board_write(2, prefix, sizeof prefix - 1);
    board_write(2, what, strlen(what));
    board_write(2, "\n", 1);
    board_exit(3);
}

/* ---- stack use: the painted words main's calls overwrote ----------------------------------------------- */

#define STACK_PAINT 0x5ca1ab1eu

void board_paint_stack(const void *below) {
    for (uint32_t *p = __stack_limit; (const void *)p < below; p++) *p = STACK_PAINT;
}

size_t board_stack_used(void) {
    const uint32_t *p = __stack_limit;
    while (p < __stack_top && *p == STACK_PAINT) p++;
    return (size_t)((const uint8_t *)__stack_top - (const uint8_t *)p);
}

size_t board_stack_bytes(void) { return (size_t)((uint8_t *)__stack_top - (uint8_t *)__stack_limit); }

/* ---- regions ------------------------------------------------------------------------------------------- */

board_region board_sram_arena(void) {
    return (board_region){__sram_arena_start, (size_t)(__sram_arena_end - __sram_arena_start)};
}
board_region board_psram_arena(void) {
    return (board_region){__psram_arena_start, (size_t)(__psram_arena_end - __psram_arena_start)};
}
board_region board_sram_total(void) {
    return (board_region){(uint8_t *)__stack_guard, (size_t)(__sram_arena_end - (uint8_t *)__stack_guard)};
}
const uint8_t *board_model(size_t *bytes) {
    *bytes = (size_t)(ple_partition_end - ple_partition_start);
    return ple_partition_start;
}

/* ---- helper calls: incremented by the link's wrappers (plelab/edge/mcu.py writes them per architecture) ---- */

volatile uint32_t board_soft_double_calls, board_div64_calls, board_double_math_calls;
