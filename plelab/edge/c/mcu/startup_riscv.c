/* The RISC-V board of the bare-metal harness (QEMU's `virt` machine, one hart in machine mode): reset, the trap
 * handler, semihosting's trap, the instret counter and picolibc's hooks (stdout / stderr, _exit). No OS: reset sets
 * the stack and thread pointer, guards the stack with a locked PMP region, turns the FPU on where the core has one,
 * copies .data and .tdata, zeroes .tbss and .bss and calls main; every exception prints one line through
 * semihosting and exits with status 3, so a test sees a message, never a hang. What the boards share is board.c. */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "board.h"

extern uint32_t __stack_top[], __stack_limit[], __stack_guard[], __data_start[], __data_end[], __data_load[],
    __bss_start[], __bss_end[], __tls_base[];
extern uint8_t __stack_guard_bytes[]; /* a linker symbol whose address is the guard's size */
int main(void);

/* CSR instructions, in an assembler told of Zicsr: GCC 12 does not name it in -march=rv32imac (F implies it), and
 * naming it there would leave picolibc's rv32imac libraries unselected. */
#define CSR(insn) ".option push\n .option arch, +zicsr\n " insn "\n .option pop\n"

/* ---- semihosting's trap: an ebreak between two no-op shifts, uncompressed and within one page ---------------- */

long board_semihost(int op, void *arg) {
    register long a0 __asm__("a0") = op;
    register void *a1 __asm__("a1") = arg;
    __asm__ volatile(".option push\n .option norvc\n .balign 16\n slli zero, zero, 0x1f\n ebreak\n srai zero, zero, 7\n"
                     " .option pop"
                     : "+r"(a0)
                     : "r"(a1)
                     : "memory");
    return a0;
}

/* A loop of exactly 2 * n instructions (addi, taken bnez): plemcu calibrate's yardstick for the counter. */
void board_count_loop(uint32_t n) { __asm__ volatile("1: addi %0, %0, -1\n bnez %0, 1b" : "+r"(n)); }

/* ---- the counter: instret, instructions retired (QEMU -icount shift=0 keeps it exact) ----------------------- */

static uint64_t origin;

static uint64_t instret(void) {
    uint32_t hi, lo, again;
    do {
        __asm__ volatile(CSR("csrr %0, minstreth") : "=r"(hi));
        __asm__ volatile(CSR("csrr %0, minstret") : "=r"(lo));
        __asm__ volatile(CSR("csrr %0, minstreth") : "=r"(again));
    } while (hi != again);
    return (uint64_t)hi << 32 | lo;
}

void board_timer_start(void) { origin = instret(); }
uint64_t board_timer_ticks(void) { return instret() - origin; }
uint32_t board_timer_hz(void) { return (uint32_t)(PLE_MCU_TIMER_HZ); }

/* ---- picolibc: stdout and stderr through semihosting, a line at a time; _exit ------------------------------ */

typedef struct {
    FILE file;
    int fd, used;
    char line[256];
} board_stream;

static int stream_flush(FILE *f) {
    board_stream *s = (board_stream *)f;
    if (s->used) board_write(s->fd, s->line, (size_t)s->used);
    s->used = 0;
    return 0;
}

static int stream_put(char c, FILE *f) {
    board_stream *s = (board_stream *)f;
    s->line[s->used++] = c;
    if (c == '\n' || s->used == (int)sizeof s->line) stream_flush(f);
    return (unsigned char)c;
}

static board_stream out = {FDEV_SETUP_STREAM(stream_put, NULL, stream_flush, _FDEV_SETUP_WRITE), 1, 0, {0}};
static board_stream err = {FDEV_SETUP_STREAM(stream_put, NULL, stream_flush, _FDEV_SETUP_WRITE), 2, 0, {0}};
FILE *const stdout = &out.file;
FILE *const stderr = &err.file;
FILE *const stdin = NULL;

void _exit(int status) {
    stream_flush(&out.file);
    stream_flush(&err.file);
    board_exit(status);
}

/* The POSIX calls picolibc's file streams need: there are no files here (the runtime's file storage and device
 * profile files are never opened on the board), so each refuses; the harness's output is stdout / stderr above. */
int open(const char *path, int flags, ...) {
    (void)path, (void)flags;
    errno = ENOSYS;
    return -1;
}
int close(int fd) {
    (void)fd;
    errno = EBADF;
    return -1;
}
ssize_t read(int fd, void *buf, size_t n) {
    (void)fd, (void)buf, (void)n;
    errno = EBADF;
    return -1;
}
ssize_t write(int fd, const void *buf, size_t n) {
    if (fd != 1 && fd != 2) {
        errno = EBADF;
        return -1;
    }
    board_write(fd, buf, n);
    return (ssize_t)n;
}
off_t lseek(int fd, off_t off, int whence) {
    (void)fd, (void)off, (void)whence;
    errno = ESPIPE;
    return -1;
}

/* ---- exceptions: one line, exit status 3 --------------------------------------------------------------------- */

/* Exceptions switch to a stack of their own first: a stack overflow must still get its message out. */
__attribute__((used, aligned(16))) static uint8_t fault_stack[1024];

__attribute__((used, noinline)) void fault_report(uint32_t cause, uint32_t addr); /* called from trap_entry */
void fault_report(uint32_t cause, uint32_t addr) {
    static const char *const what[] = {"instruction address misaligned", "instruction access fault",
                                       "illegal instruction", "breakpoint", "load address misaligned",
                                       "load access fault", "store address misaligned",
                                       "store access fault (or a stack overflow into the PMP guard)"};
    char line[120];
    if (cause & 0x80000000u)
        snprintf(line, sizeof line, "unexpected interrupt %lu", (unsigned long)(cause & 0x7fffffffu));
    else if (cause < sizeof what / sizeof what[0])
        snprintf(line, sizeof line, "%s at 0x%08lx", what[cause], (unsigned long)addr);
    else
        snprintf(line, sizeof line, "exception %lu at 0x%08lx", (unsigned long)cause, (unsigned long)addr);
    board_fault(line);
}

__attribute__((naked, aligned(4))) void trap_entry(void) {
    __asm__ volatile("la sp, fault_stack + 1024\n" CSR("csrr a0, mcause\n csrr a1, mtval") "j fault_report\n");
}

/* ---- reset --------------------------------------------------------------------------------------------------- */

__attribute__((used)) void reset_c(void);
void reset_c(void) {
    __asm__ volatile(CSR("csrw mtvec, %0") : : "r"((uintptr_t)trap_entry));
    /* The stack's guard: PMP entry 0, locked (so machine mode obeys it), no access, NAPOT over the guard (whose
     * size is a power of two, aligned to itself). An overflow is a store access fault there. */
    uintptr_t guard = (uintptr_t)__stack_guard, size = (uintptr_t)__stack_guard_bytes;
    __asm__ volatile(CSR("csrw pmpaddr0, %0") : : "r"((guard | (size / 2 - 1)) >> 2));
    __asm__ volatile(CSR("csrw pmpcfg0, %0") : : "r"(0x80u /* L */ | 0x18u /* A = NAPOT */));
#if defined(__riscv_flen)
    __asm__ volatile(CSR("csrs mstatus, %0") : : "r"(1u << 13)); /* FS = initial: the FPU is on */
#endif
    /* paint the stack below reset's own frame, so board_stack_used() can tell how deep main went */
    board_paint_stack((const void *)((uintptr_t)__stack_top - 512));
    memcpy(__data_start, __data_load, (size_t)((uint8_t *)__data_end - (uint8_t *)__data_start));
    memset(__bss_start, 0, (size_t)((uint8_t *)__bss_end - (uint8_t *)__bss_start));
    board_exit(main());
}

/* The entry (the image's first bytes): a stack and a thread pointer (picolibc keeps errno in thread-local storage,
 * the .tdata / .tbss block at __tls_base), then C. */
__attribute__((naked, section(".vectors"), used)) void reset_handler(void) {
    __asm__ volatile(".option push\n .option norelax\n la sp, __stack_top\n la tp, __tls_base\n .option pop\n"
                     " j reset_c\n");
}
