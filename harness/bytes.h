/* Fixed-width integers to and from byte buffers in this machine's byte order (file
 * formats check the order once, with a tag). memcpy keeps unaligned access defined. */
#ifndef AB_BYTES_H
#define AB_BYTES_H

#include <stdint.h>
#include <string.h>

static inline void ab_put_u32(unsigned char *p, uint32_t x) { memcpy(p, &x, 4); }
static inline void ab_put_u64(unsigned char *p, uint64_t x) { memcpy(p, &x, 8); }
static inline uint32_t ab_get_u32(const unsigned char *p) {
    uint32_t x;
    memcpy(&x, p, 4);
    return x;
}
static inline uint64_t ab_get_u64(const unsigned char *p) {
    uint64_t x;
    memcpy(&x, p, 8);
    return x;
}

#endif
