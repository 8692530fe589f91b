/* How the CUDA emulator (cuda_emu.cpp, its only user) switches between the scheduler
 * and the fibers that run a block's threads, with and without AddressSanitizer.
 *
 * Plain builds: a _setjmp/_longjmp pair, which saves no signal mask (no system call per
 * switch). The file that includes this must be compiled without _FORTIFY_SOURCE
 * (glibc's checked longjmp refuses jumps between stacks); meson passes -U_FORTIFY_SOURCE.
 *
 * Under AddressSanitizer every switch is announced to it (__sanitizer_start_switch_fiber
 * before, __sanitizer_finish_switch_fiber after), so that it knows which stack runs, and
 * the switches are GCC's __builtin_setjmp/__builtin_longjmp: ASan intercepts longjmp
 * and then makes a system call (sigaltstack) and clears the shadow of its signal stack
 * on every jump, which made the emulated suites five times slower. The builtins save
 * only what a switch between two suspended calls needs (frame, stack pointer, resume
 * address; the compiler reloads every other register after the setjmp). */
#ifndef AB_EMU_FIBER_SWITCH_H
#define AB_EMU_FIBER_SWITCH_H

#include <csetjmp>
#include <cstddef>

#if defined(__SANITIZE_ADDRESS__)
#define AB_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define AB_EMU_ASAN 1
#endif
#endif
#ifdef AB_EMU_ASAN
#include <sanitizer/common_interface_defs.h>
#endif

namespace ab_emu_fiber {

/* A suspended call to switch back into: CTX_SAVE(buf) returns 0 when it saves, non-zero
 * when jump_to(buf) resumes it. A function that calls CTX_SAVE or jump_to is marked
 * SWITCHES. */
#ifdef AB_EMU_ASAN
typedef void *ctx_buf[5];
#define CTX_SAVE(b) __builtin_setjmp(b)
/* Not instrumented: the instrumentation calls __asan_handle_no_return, the cost avoided
 * here, before any call that does not return. */
#define SWITCHES __attribute__((no_sanitize_address))
/* Out of line: a function must not __builtin_longjmp to a buffer it saved itself. */
__attribute__((noinline)) SWITCHES inline void jump_to(ctx_buf b) { __builtin_longjmp(b, 1); }
#else
typedef jmp_buf ctx_buf;
#define CTX_SAVE(b) _setjmp(b)
#define SWITCHES
[[noreturn]] inline void jump_to(ctx_buf b) { _longjmp(b, 1); }
#endif

/* AddressSanitizer's view of a switch (nothing without it): `save` keeps the fake stack
 * of the side that leaves for the stack [to_bottom, to_bottom + to_size); the arriving
 * side gives back what it saved and learns where it came from. */
inline void asan_leaving(void **save, const void *to_bottom, size_t to_size) {
#ifdef AB_EMU_ASAN
    __sanitizer_start_switch_fiber(save, to_bottom, to_size);
#else
    (void)save, (void)to_bottom, (void)to_size;
#endif
}

inline void asan_arrived(void *saved, const void **from_bottom, size_t *from_size) {
#ifdef AB_EMU_ASAN
    __sanitizer_finish_switch_fiber(saved, from_bottom, from_size);
#else
    (void)saved, (void)from_bottom, (void)from_size;
#endif
}

} // namespace ab_emu_fiber

#endif
