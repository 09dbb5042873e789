/* The Cortex-M boards of the bare-metal harness: reset, fault handlers, semihosting's trap, the board timers and
 * the newlib system calls. No OS: reset copies .data, zeroes .bss, turns the FPU (and on Armv8.1-M Helium) on and
 * calls main; every fault prints one line through semihosting and exits with status 3, so a test sees a message,
 * never a hang. What the boards share is board.c. */
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>

#include "board.h"

extern uint32_t __stack_top[], __stack_limit[], __stack_guard[], __data_start[], __data_end[], __data_load[], __bss_start[],
    __bss_end[], __heap_start[], __heap_end[];
int main(void);

/* ---- semihosting's trap: ARM's "bkpt 0xab" ------------------------------------------------------------- */

long board_semihost(int op, void *arg) {
    register long r0 __asm__("r0") = op;
    register void *r1 __asm__("r1") = arg;
    __asm__ volatile("bkpt 0xab" : "+r"(r0) : "r"(r1) : "memory");
    return r0;
}

/* A loop of exactly 2 * n instructions (subs, taken bne): plemcu calibrate's yardstick for the timer. */
void board_count_loop(uint32_t n) { __asm__ volatile("1: subs %0, %0, #1\n bne 1b" : "+r"(n) : : "cc"); }

/* ---- timer --------------------------------------------------------------------------------------------------
 * PLE_MCU_TIMER_CMSDK: the board's CMSDK APB timer 0 (CTRL, VALUE, RELOAD at +0, +4, +8), a 32-bit down counter
 * on the main clock (mps2-an500). PLE_MCU_TIMER_SSE_COUNTER: the SSE-300's System Counter, 64 bits counting up
 * on the main clock, control frame (CNTCR at +0) at PLE_MCU_TIMER_BASE, read frame (CNTCV at +0, +4) at
 * PLE_MCU_TIMER_READ (mps3-an547, whose timers are SSE system timers driven by this counter). */

#if defined(PLE_MCU_TIMER_CMSDK)
#define TIMER ((volatile uint32_t *)(uintptr_t)(PLE_MCU_TIMER_BASE))
static uint64_t high;  /* wraps of the 32-bit counter seen so far */
static uint32_t last;

void board_timer_start(void) {
    TIMER[0] = 0;
    TIMER[2] = 0xffffffffu;
    TIMER[1] = 0xffffffffu;
    TIMER[0] = 1; /* enable, no interrupt */
    high = 0;
    last = 0;
}

uint64_t board_timer_ticks(void) { /* read often enough (< 2^32 ticks apart) to see every wrap */
    uint32_t now = 0xffffffffu - TIMER[1];
    if (now < last) high += (uint64_t)1 << 32;
    last = now;
    return high | now;
}
#elif defined(PLE_MCU_TIMER_SSE_COUNTER)
#define CNTCR ((volatile uint32_t *)(uintptr_t)(PLE_MCU_TIMER_BASE))
#define CNTCV ((volatile uint32_t *)(uintptr_t)(PLE_MCU_TIMER_READ))
static uint64_t origin;

static uint64_t counter(void) {
    uint32_t hi, lo;
    do {
        hi = CNTCV[1];
        lo = CNTCV[0];
    } while (CNTCV[1] != hi);
    return (uint64_t)hi << 32 | lo;
}

void board_timer_start(void) {
    CNTCR[0] |= 1; /* EN */
    origin = counter();
}

uint64_t board_timer_ticks(void) { return counter() - origin; }
#else
#error "define PLE_MCU_TIMER_CMSDK or PLE_MCU_TIMER_SSE_COUNTER (plelab/edge/mcu.py does)"
#endif

uint32_t board_timer_hz(void) { return (uint32_t)(PLE_MCU_TIMER_HZ); }

/* ---- newlib system calls: stdout / stderr through semihosting, a fixed heap ------------------------------ */

int _write(int fd, const char *buf, int n) {
    if (fd != 1 && fd != 2) {
        errno = EBADF;
        return -1;
    }
    board_write(fd, buf, (size_t)n);
    return n;
}

void *_sbrk(ptrdiff_t incr) {
    static uint8_t *brk = (uint8_t *)__heap_start;
    if (incr < 0 || (size_t)incr > (size_t)((uint8_t *)__heap_end - brk)) { /* malloc returns NULL */
        errno = ENOMEM;
        return (void *)-1;
    }
    uint8_t *old = brk;
    brk += incr;
    return old;
}

void _exit(int status) { board_exit(status); }
int _close(int fd) { (void)fd; errno = EBADF; return -1; }
int _read(int fd, char *buf, int n) { (void)fd, (void)buf, (void)n; errno = EBADF; return -1; }
int _lseek(int fd, int off, int whence) { (void)fd, (void)off, (void)whence; errno = ESPIPE; return -1; }
int _isatty(int fd) { return fd <= 2; }
int _fstat(int fd, struct stat *st) {
    (void)fd;
    memset(st, 0, sizeof *st);
    st->st_mode = S_IFCHR;
    return 0;
}
int _getpid(void) { return 1; }
int _kill(int pid, int sig) { (void)pid, (void)sig; errno = EINVAL; return -1; }

/* ---- reset and faults -------------------------------------------------------------------------------------- */

/* Faults switch to a stack of their own first: a stack overflow must still get its message out. */
__attribute__((used, aligned(8))) static uint8_t fault_stack[1024];

__attribute__((used, noinline)) void fault_report(int which); /* called from the handlers below (asm) */
void fault_report(int which) {
    static const char *const what[] = {"HardFault", "MemManage", "BusFault",
                                       "UsageFault (or a stack overflow past MSPLIM)", "unexpected exception"};
    board_fault(what[which]);
}

#if defined(__ARM_ARCH_8M_MAIN__) || defined(__ARM_ARCH_8_1M_MAIN__)
#define CLEAR_STACK_LIMIT "movs r1, #0\n msr msplim, r1\n"
#else
#define CLEAR_STACK_LIMIT ""
#endif
#define FAULT_HANDLER(name, which)                                                                         \
    __attribute__((naked)) void name(void) {                                                               \
        __asm__ volatile(CLEAR_STACK_LIMIT "ldr r1, =fault_stack + 1024\n mov sp, r1\n movs r0, #" #which \
                         "\n b fault_report\n");                                                           \
    }
FAULT_HANDLER(hard_fault_handler, 0)
FAULT_HANDLER(mem_fault_handler, 1)
FAULT_HANDLER(bus_fault_handler, 2)
FAULT_HANDLER(usage_fault_handler, 3)
FAULT_HANDLER(other_handler, 4)

void reset_handler(void) {
#if defined(__ARM_ARCH_8M_MAIN__) || defined(__ARM_ARCH_8_1M_MAIN__)
    __asm__ volatile("msr msplim, %0" : : "r"(__stack_limit)); /* a stack overflow is a UsageFault */
#endif
    /* paint the stack below reset's own frame, so board_stack_used() can tell how deep main went */
    board_paint_stack((const void *)((uintptr_t)__stack_top - 512));
#if !defined(__ARM_ARCH_8M_MAIN__) && !defined(__ARM_ARCH_8_1M_MAIN__)
    /* Armv7-M has no stack limit register, and without a guard a deliberate overflow on QEMU's mps2-an500 ran
     * on below the RAM over code and data. MPU region 0 makes the 256-byte guard no-access (the default map
     * stays for the rest), so the overflow is a MemManage fault there. */
    volatile uint32_t *mpu = (volatile uint32_t *)0xE000ED94u; /* CTRL, RNR, RBAR, RASR */
    mpu[1] = 0;
    mpu[2] = (uint32_t)(uintptr_t)__stack_guard;
    mpu[3] = 1u << 28 /* XN */ | 0u << 24 /* AP: no access */ | 7u << 1 /* 2^(7+1) bytes */ | 1u /* enable */;
    mpu[0] = 1u << 2 /* default map for the rest */ | 1u;
#endif
    volatile uint32_t *cpacr = (volatile uint32_t *)0xE000ED88u, *shcsr = (volatile uint32_t *)0xE000ED24u;
    *cpacr |= 0xFu << 20; /* CP10, CP11 full access: the FPU (and MVE, which shares them) */
    *shcsr |= 7u << 16;   /* MemManage, BusFault, UsageFault get their own handlers */
    __asm__ volatile("dsb\n isb" ::: "memory");
    memcpy(__data_start, __data_load, (size_t)((uint8_t *)__data_end - (uint8_t *)__data_start));
    memset(__bss_start, 0, (size_t)((uint8_t *)__bss_end - (uint8_t *)__bss_start));
    board_exit(main());
}

typedef void (*handler)(void);
__attribute__((section(".vectors"), used)) static const handler vectors[16] = {
    (handler)(uintptr_t)__stack_top, reset_handler, other_handler /* NMI */, hard_fault_handler, mem_fault_handler,
    bus_fault_handler, usage_fault_handler, other_handler /* SecureFault */, 0, 0, 0, other_handler /* SVC */,
    other_handler /* DebugMon */, 0, other_handler /* PendSV */, other_handler /* SysTick */,
};
