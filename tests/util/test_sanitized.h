/* Whether the suites run in a sanitized build (meson setup -Db_sanitize=address,undefined,
 * harness/scripts/sanitize.sh): AddressSanitizer there reports a fault (SIGSEGV) itself
 * and ends the process, and reserves terabytes of address space, so the few tests that
 * provoke a fault on purpose or need an address-space limit skip themselves. */
#ifndef AB_TEST_SANITIZED_H
#define AB_TEST_SANITIZED_H

#if defined(__SANITIZE_ADDRESS__)
#define TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TEST_SANITIZED 1
#endif
#endif
#ifndef TEST_SANITIZED
#define TEST_SANITIZED 0
#endif

/* For a test that expects a SIGSEGV: Test(suite, name, .signal = TEST_SIGSEGV) and
 * TEST_SKIP_FAULT_UNDER_SANITIZER(); at its top (a skipped test must expect no signal). */
#define TEST_SIGSEGV (TEST_SANITIZED ? 0 : SIGSEGV)
#define TEST_SKIP_FAULT_UNDER_SANITIZER()                                                                              \
    do {                                                                                                               \
        if (TEST_SANITIZED)                                                                                            \
            cr_skip_test("provokes a SIGSEGV on purpose, which AddressSanitizer reports as a finding and ends");      \
    } while (0)

#endif
