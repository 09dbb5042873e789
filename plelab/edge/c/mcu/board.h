/* The bare-metal harness's board interface: semihosting (the only I/O), the hardware timer, the memory
 * regions the linker script lays out. Implemented by startup.c; the board's numbers come from the build
 * (plelab/edge/mcu.py passes the timer's kind, address and clock). */
#ifndef PLE_MCU_BOARD_H
#define PLE_MCU_BOARD_H

#include <stddef.h>
#include <stdint.h>

/* Semihosting: write to the host's stdout (fd 1) or stderr (fd 2), read the command line QEMU was given, exit
 * with a status. */
void board_write(int fd, const char *buf, size_t n);
int board_cmdline(char *buf, size_t n); /* 0, or -1 when the host gives none */
void board_exit(int status) __attribute__((noreturn));

/* The board's hardware timer (startup.c), counting PLE_MCU_TIMER_HZ of virtual time. Under
 * `qemu-system-arm -icount shift=0` one instruction is one nanosecond, so ticks count instructions. */
void board_timer_start(void);
uint64_t board_timer_ticks(void); /* ticks since board_timer_start */
uint32_t board_timer_hz(void);

/* Deepest stack use so far (the stack is painted at reset) and the stack's size. Armv8-M cores also stop an
 * overflow with MSPLIM (UsageFault); Armv7-M has no stack limit, there an overflow locks the core up. */
size_t board_stack_used(void);
size_t board_stack_bytes(void);

/* Memory regions (linker script symbols): the ESP32-S3's SRAM and PSRAM stand-ins and the flashed model. */
typedef struct { uint8_t *base; size_t bytes; } board_region;
board_region board_sram_arena(void);  /* what the stack, data and heap leave of the 512 KiB SRAM */
board_region board_psram_arena(void);
board_region board_sram_total(void);  /* the whole SRAM region */
/* The flash partition the .ple file was written to: the file, then erased flash (0xff) to a 4 KiB boundary. */
const uint8_t *board_model(size_t *bytes);

#endif
