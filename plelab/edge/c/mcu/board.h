/* The bare-metal harness's board interface: semihosting (the only I/O), the hardware timer, the memory
 * regions the linker script lays out. Implemented by board.c (what every board shares) and one startup file per
 * architecture (startup_arm.c, startup_riscv.c); the board's numbers come from the build (plelab/edge/mcu.py
 * passes the timer's kind, address and clock). */
#ifndef PLE_MCU_BOARD_H
#define PLE_MCU_BOARD_H

#include <stddef.h>
#include <stdint.h>

/* Semihosting: write to the host's stdout (fd 1) or stderr (fd 2), read the command line QEMU was given, exit
 * with a status. */
void board_write(int fd, const char *buf, size_t n);
int board_cmdline(char *buf, size_t n); /* 0, or -1 when the host gives none */
void board_exit(int status) __attribute__((noreturn));
/* The architecture's semihosting trap: operation `op`, its argument block, the host's answer. */
long board_semihost(int op, void *arg);
/* "plemcu: fault: WHAT" on stderr, exit status 3. */
void board_fault(const char *what) __attribute__((noreturn));

/* The board's counter (startup_*.c), counting PLE_MCU_TIMER_HZ: a hardware timer on virtual time on the Cortex-M
 * boards, where under QEMU's `-icount shift=0` one instruction is one nanosecond, so ticks count instructions; the
 * instret CSR on RISC-V, which counts them directly (its "Hz" is 10^9: one tick per nanosecond of virtual time). */
void board_timer_start(void);
uint64_t board_timer_ticks(void); /* ticks since board_timer_start */
uint32_t board_timer_hz(void);
/* A loop of exactly 2 * n instructions, for `plemcu calibrate` to time. */
void board_count_loop(uint32_t n);

/* Deepest stack use so far (the stack is painted at reset) and the stack's size. An overflow faults at the guard
 * below the stack: MSPLIM on Armv8-M, an MPU region on Armv7-M, a locked PMP region on RISC-V. */
size_t board_stack_used(void);
size_t board_stack_bytes(void);
void board_paint_stack(const void *below); /* at reset: paint the stack from its limit up to `below` */

/* Calls, since reset, of the compiler's helpers for double precision and 64-bit division, and of libm's double
 * functions: the link wraps each (helper_count.c). A runtime whose token path needs none of them counts 0. */
extern volatile uint32_t board_soft_double_calls, board_div64_calls, board_double_math_calls;

/* Memory regions (linker script symbols): the ESP32-S3's SRAM and PSRAM stand-ins and the flashed model. */
typedef struct { uint8_t *base; size_t bytes; } board_region;
board_region board_sram_arena(void);  /* what the stack, data and heap leave of the 512 KiB SRAM */
board_region board_psram_arena(void);
board_region board_sram_total(void);  /* the whole SRAM region */
/* The flash partition the .ple file was written to: the file, then erased flash (0xff) to a 4 KiB boundary. */
const uint8_t *board_model(size_t *bytes);

#endif
