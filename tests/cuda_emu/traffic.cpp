/* Memory traffic of the emulated device (cuda_emu.h, section "memory traffic", says
 * what is counted and under which model).
 *
 * Built twice from this one file:
 * - with AB_EMU_TRAFFIC defined, into the traffic library, whose .cu sources are compiled
 *   with GCC's -fsanitize=thread (at compile time only: libtsan is never linked). GCC
 *   then calls __tsan_read4(addr), __tsan_write16(addr), ... before every load and
 *   store the compiled code makes to memory it cannot keep in registers; this file
 *   defines those hooks (it is itself compiled without instrumentation) and counts the
 *   accesses made while a kernel runs whose addresses fall in a device allocation;
 * - without it, into the plain emulated library: nothing is counted, the C entry points
 *   report zeros and ab_emu_traffic_instrumented() is 0.
 *
 * Per operation (a launch, a cuBLAS or CUB call, a memset, a device-to-device copy), each
 * touched allocation gets two bitmaps of its 32-byte sectors (read, written); a sector's
 * first access in the operation adds 32 bytes to the DRAM count. The words of the
 * bitmaps that were set are remembered and cleared when the operation ends, so the cost
 * of an operation is that of its accesses, not of the allocations' sizes. */
#include "cuda_emu.h"

#include <cstdlib>
#include <map>
#include <mutex>
#include <string>

typedef ab_emu_traffic_counts counts;

#ifdef AB_EMU_TRAFFIC

namespace {

void add(counts &a, const counts &b) {
    a.launches += b.launches;
    a.req_read += b.req_read;
    a.req_write += b.req_write;
    a.dram_read += b.dram_read;
    a.dram_write += b.dram_write;
}

constexpr unsigned SECTOR_SHIFT = 5; /* 32-byte sectors */

struct allocation {
    uintptr_t base = 0, end = 0;     /* [base, end): the bytes cudaMalloc was asked for */
    uintptr_t sector0 = 0;           /* base >> SECTOR_SHIFT */
    size_t n_words = 0;              /* 64-bit words of each bitmap */
    uint64_t *bits[2] = {nullptr, nullptr}; /* read, written sectors of the operation */
};

struct touched_word {
    allocation *a;
    size_t word;
    int write;
};

struct entry {
    std::string name;
    int kind;
    counts c;
};

struct state {
    std::mutex mu; /* allocation table and API calls (kernels run under the emulator's lock) */
    bool counting = false;
    std::map<uintptr_t, allocation *> allocs;
    /* lookup caches: the allocations hit last (most recent first) and address ranges
     * known to hold none (a fiber's stack, the shared-memory section, the host heap) */
    allocation *hit[4] = {};
    uintptr_t gap_lo[4] = {}, gap_hi[4] = {};
    int gap_next = 0;
    std::vector<touched_word> touched;
    /* the operation under way */
    bool op_open = false;
    const char *op_name = nullptr;
    int op_kind = 0;
    counts op{};
    /* since the last reset */
    counts total{};
    unsigned long long h2d = 0, d2h = 0;
    std::vector<entry> entries;
    std::map<std::string, size_t> index;
};

state &T() {
    static state *s = new state; /* never destroyed: usable from atexit handlers */
    return *s;
}

/* Set while an instrumented kernel runs with counting on, on the thread that runs it
 * (its fibers run on that thread): the hooks do nothing elsewhere. */
thread_local bool tl_kernel __attribute__((tls_model("initial-exec"))) = false;

void forget_caches(state &s) {
    for (int i = 0; i < 4; i++) {
        s.hit[i] = nullptr;
        s.gap_lo[i] = s.gap_hi[i] = 0;
    }
}

allocation *find_slow(state &s, uintptr_t a) {
    auto it = s.allocs.upper_bound(a);
    uintptr_t hi = it == s.allocs.end() ? UINTPTR_MAX : it->first;
    uintptr_t lo = 0;
    if (it != s.allocs.begin()) {
        --it;
        allocation *al = it->second;
        if (a < al->end) {
            for (int i = 3; i > 0; i--) s.hit[i] = s.hit[i - 1];
            s.hit[0] = al;
            return al;
        }
        lo = al->end;
    }
    /* [lo, hi) holds no allocation: remember it */
    s.gap_lo[s.gap_next] = lo;
    s.gap_hi[s.gap_next] = hi;
    s.gap_next = (s.gap_next + 1) & 3;
    return nullptr;
}

inline allocation *find(state &s, uintptr_t a) {
    for (int i = 0; i < 4; i++) {
        allocation *al = s.hit[i];
        if (al && a - al->base < al->end - al->base) {
            if (i) { /* to the front */
                for (int j = i; j > 0; j--) s.hit[j] = s.hit[j - 1];
                s.hit[0] = al;
            }
            return al;
        }
    }
    for (int i = 0; i < 4; i++)
        if (a - s.gap_lo[i] < s.gap_hi[i] - s.gap_lo[i]) return nullptr;
    return find_slow(s, a);
}

void ensure_bits(allocation *al) {
    if (al->bits[0]) return;
    for (int w = 0; w < 2; w++) {
        al->bits[w] = static_cast<uint64_t *>(calloc(al->n_words, sizeof(uint64_t)));
        if (!al->bits[w]) ab_emu::fatal("traffic counting: out of host memory for the sector bitmaps");
    }
}

/* `bytes` at a (inside allocation al from a to its end at most) accessed by the open
 * operation. */
inline void mark(state &s, allocation *al, uintptr_t a, size_t bytes, int write) {
    (write ? s.op.req_write : s.op.req_read) += bytes;
    ensure_bits(al);
    uintptr_t last = a + bytes - 1;
    if (last >= al->end) last = al->end - 1; /* allocator padding past the end: the last sector */
    uint64_t *bits = al->bits[write];
    unsigned long long &dram = write ? s.op.dram_write : s.op.dram_read;
    for (uintptr_t sec = (a >> SECTOR_SHIFT) - al->sector0, e = (last >> SECTOR_SHIFT) - al->sector0; sec <= e; sec++) {
        uint64_t &w = bits[sec >> 6];
        const uint64_t bit = (uint64_t)1 << (sec & 63);
        if (w & bit) continue;
        if (!w) s.touched.push_back(touched_word{al, (size_t)(sec >> 6), write});
        w |= bit;
        dram += (unsigned long long)1 << SECTOR_SHIFT;
    }
}

/* An access by a kernel (the hooks). */
inline void access(const void *p, size_t bytes, int write) {
    state &s = T();
    const uintptr_t a = (uintptr_t)p;
    allocation *al = find(s, a);
    if (al) mark(s, al, a, bytes, write);
}

void free_bits(allocation *al) {
    for (int w = 0; w < 2; w++) {
        free(al->bits[w]);
        al->bits[w] = nullptr;
    }
}

} // namespace

namespace ab_emu {

void traffic_alloc(const void *p, size_t bytes) {
    if (!p || !bytes) return;
    state &s = T();
    std::lock_guard<std::mutex> lock(s.mu);
    allocation *al = new allocation;
    al->base = (uintptr_t)p;
    al->end = al->base + bytes;
    al->sector0 = al->base >> SECTOR_SHIFT;
    size_t sectors = ((al->end - 1) >> SECTOR_SHIFT) - al->sector0 + 1;
    al->n_words = (sectors + 63) / 64;
    s.allocs[al->base] = al;
    forget_caches(s); /* a remembered gap may hold it now */
}

void traffic_free(const void *p) {
    if (!p) return;
    state &s = T();
    std::lock_guard<std::mutex> lock(s.mu);
    auto it = s.allocs.find((uintptr_t)p);
    if (it == s.allocs.end()) return;
    free_bits(it->second);
    delete it->second;
    s.allocs.erase(it);
    forget_caches(s);
}

bool traffic_counting(void) { return T().counting; }

void traffic_begin(const char *name, int kind) {
    state &s = T();
    if (!s.counting) return;
    if (s.op_open) fatal("traffic counting: %s begins inside %s", name, s.op_name);
    s.op_open = true;
    s.op_name = name;
    s.op_kind = kind;
    s.op = counts{};
    s.op.launches = 1;
    if (kind == AB_EMU_TRAFFIC_KERNEL) tl_kernel = true;
}

void traffic_range(const void *p, size_t bytes, bool write) {
    state &s = T();
    if (!s.op_open || !bytes) return;
    const uintptr_t a = (uintptr_t)p;
    allocation *al = find(s, a);
    if (!al) fatal("traffic counting: %s: %zu bytes at %p are not device memory", s.op_name, bytes, p);
    mark(s, al, a, bytes, write ? 1 : 0);
}

void traffic_end(void) {
    state &s = T();
    if (!s.op_open) return;
    tl_kernel = false;
    s.op_open = false;
    for (const touched_word &t : s.touched) t.a->bits[t.write][t.word] = 0;
    s.touched.clear();
    add(s.total, s.op);
    auto it = s.index.find(s.op_name);
    if (it == s.index.end()) {
        it = s.index.emplace(s.op_name, s.entries.size()).first;
        s.entries.push_back(entry{s.op_name, s.op_kind, counts{}});
    }
    add(s.entries[it->second].c, s.op);
}

void traffic_transfer(size_t bytes, bool to_device) {
    state &s = T();
    if (!s.counting) return;
    (to_device ? s.h2d : s.d2h) += bytes;
}

} // namespace ab_emu

/* ---- the hooks GCC's -fsanitize=thread calls ---- */

#define AB_TRAFFIC_HOOK(name, bytes, write)                                                                            \
    extern "C" void name(void *p) {                                                                                    \
        if (__builtin_expect(tl_kernel, 0)) access(p, bytes, write);                                                   \
    }
AB_TRAFFIC_HOOK(__tsan_read1, 1, 0)
AB_TRAFFIC_HOOK(__tsan_read2, 2, 0)
AB_TRAFFIC_HOOK(__tsan_read4, 4, 0)
AB_TRAFFIC_HOOK(__tsan_read8, 8, 0)
AB_TRAFFIC_HOOK(__tsan_read16, 16, 0)
AB_TRAFFIC_HOOK(__tsan_write1, 1, 1)
AB_TRAFFIC_HOOK(__tsan_write2, 2, 1)
AB_TRAFFIC_HOOK(__tsan_write4, 4, 1)
AB_TRAFFIC_HOOK(__tsan_write8, 8, 1)
AB_TRAFFIC_HOOK(__tsan_write16, 16, 1)
AB_TRAFFIC_HOOK(__tsan_unaligned_read2, 2, 0)
AB_TRAFFIC_HOOK(__tsan_unaligned_read4, 4, 0)
AB_TRAFFIC_HOOK(__tsan_unaligned_read8, 8, 0)
AB_TRAFFIC_HOOK(__tsan_unaligned_read16, 16, 0)
AB_TRAFFIC_HOOK(__tsan_unaligned_write2, 2, 1)
AB_TRAFFIC_HOOK(__tsan_unaligned_write4, 4, 1)
AB_TRAFFIC_HOOK(__tsan_unaligned_write8, 8, 1)
AB_TRAFFIC_HOOK(__tsan_unaligned_write16, 16, 1)
/* volatile accesses (only with --param=tsan-distinguish-volatile=1, which the build
 * does not set; defined so that the library links either way) */
AB_TRAFFIC_HOOK(__tsan_volatile_read1, 1, 0)
AB_TRAFFIC_HOOK(__tsan_volatile_read2, 2, 0)
AB_TRAFFIC_HOOK(__tsan_volatile_read4, 4, 0)
AB_TRAFFIC_HOOK(__tsan_volatile_read8, 8, 0)
AB_TRAFFIC_HOOK(__tsan_volatile_read16, 16, 0)
AB_TRAFFIC_HOOK(__tsan_volatile_write1, 1, 1)
AB_TRAFFIC_HOOK(__tsan_volatile_write2, 2, 1)
AB_TRAFFIC_HOOK(__tsan_volatile_write4, 4, 1)
AB_TRAFFIC_HOOK(__tsan_volatile_write8, 8, 1)
AB_TRAFFIC_HOOK(__tsan_volatile_write16, 16, 1)
#undef AB_TRAFFIC_HOOK

/* Aggregate copies and inlined memcpy/memset of known size. */
extern "C" void __tsan_read_range(void *p, unsigned long size) {
    if (__builtin_expect(tl_kernel, 0) && size) access(p, size, 0);
}
extern "C" void __tsan_write_range(void *p, unsigned long size) {
    if (__builtin_expect(tl_kernel, 0) && size) access(p, size, 1);
}

/* The compiler inserts a call to __tsan_init in every instrumented object's
 * constructors; entry and exit of functions are not instrumented
 * (--param=tsan-instrument-func-entry-exit=0) but defined for other settings. */
extern "C" void __tsan_init(void) {}
extern "C" void __tsan_func_entry(void *) {}
extern "C" void __tsan_func_exit(void) {}
extern "C" void __tsan_vptr_update(void **, void *) {}
extern "C" void __tsan_vptr_read(void **) {}

/* Atomic operations of instrumented host code (std::atomic, the guards of function-
 * local statics) become __tsan_atomicN_* calls: done here with the compiler's builtins,
 * with the order asked for (the memory-order values are the C++ ones, which the
 * builtins take), and not counted (device atomics are plain read-modify-writes in the
 * emulator, cuda_emu.h, and counted as such). */
#define AB_TSAN_ATOMICS(N, T)                                                                                          \
    extern "C" T __tsan_atomic##N##_load(const volatile T *a, int mo) { return __atomic_load_n(a, mo); }              \
    extern "C" void __tsan_atomic##N##_store(volatile T *a, T v, int mo) { __atomic_store_n(a, v, mo); }             \
    extern "C" T __tsan_atomic##N##_exchange(volatile T *a, T v, int mo) { return __atomic_exchange_n(a, v, mo); }   \
    extern "C" T __tsan_atomic##N##_fetch_add(volatile T *a, T v, int mo) { return __atomic_fetch_add(a, v, mo); }   \
    extern "C" T __tsan_atomic##N##_fetch_sub(volatile T *a, T v, int mo) { return __atomic_fetch_sub(a, v, mo); }   \
    extern "C" T __tsan_atomic##N##_fetch_and(volatile T *a, T v, int mo) { return __atomic_fetch_and(a, v, mo); }   \
    extern "C" T __tsan_atomic##N##_fetch_or(volatile T *a, T v, int mo) { return __atomic_fetch_or(a, v, mo); }     \
    extern "C" T __tsan_atomic##N##_fetch_xor(volatile T *a, T v, int mo) { return __atomic_fetch_xor(a, v, mo); }   \
    extern "C" T __tsan_atomic##N##_fetch_nand(volatile T *a, T v, int mo) { return __atomic_fetch_nand(a, v, mo); } \
    extern "C" int __tsan_atomic##N##_compare_exchange_strong(volatile T *a, T *c, T v, int mo, int fmo) {           \
        return __atomic_compare_exchange_n(a, c, v, false, mo, fmo);                                                   \
    }                                                                                                                  \
    extern "C" int __tsan_atomic##N##_compare_exchange_weak(volatile T *a, T *c, T v, int mo, int fmo) {             \
        return __atomic_compare_exchange_n(a, c, v, true, mo, fmo);                                                    \
    }                                                                                                                  \
    extern "C" T __tsan_atomic##N##_compare_exchange_val(volatile T *a, T c, T v, int mo, int fmo) {                 \
        __atomic_compare_exchange_n(a, &c, v, false, mo, fmo);                                                         \
        return c;                                                                                                      \
    }
AB_TSAN_ATOMICS(8, char)
AB_TSAN_ATOMICS(16, short)
AB_TSAN_ATOMICS(32, int)
AB_TSAN_ATOMICS(64, long)
#undef AB_TSAN_ATOMICS
extern "C" void __tsan_atomic_thread_fence(int mo) { __atomic_thread_fence(mo); }
extern "C" void __tsan_atomic_signal_fence(int mo) { __atomic_signal_fence(mo); }

/* ---- C entry points ---- */

extern "C" int ab_emu_traffic_instrumented(void) { return 1; }

extern "C" void ab_emu_traffic_reset(void) {
    state &s = T();
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.op_open) ab_emu::fatal("ab_emu_traffic_reset inside %s", s.op_name);
    s.total = counts{};
    s.h2d = s.d2h = 0;
    s.entries.clear();
    s.index.clear();
}

extern "C" void ab_emu_traffic_enable(int on) {
    state &s = T();
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.op_open) ab_emu::fatal("ab_emu_traffic_enable inside %s", s.op_name);
    s.counting = on != 0;
}

extern "C" void ab_emu_traffic_total(ab_emu_traffic_counts *c, unsigned long long *h2d, unsigned long long *d2h) {
    state &s = T();
    std::lock_guard<std::mutex> lock(s.mu);
    if (c) *c = s.total;
    if (h2d) *h2d = s.h2d;
    if (d2h) *d2h = s.d2h;
}

extern "C" int ab_emu_traffic_entries(void) {
    state &s = T();
    std::lock_guard<std::mutex> lock(s.mu);
    return (int)s.entries.size();
}

extern "C" const char *ab_emu_traffic_entry(int i, int *kind, ab_emu_traffic_counts *c) {
    state &s = T();
    std::lock_guard<std::mutex> lock(s.mu);
    if (i < 0 || (size_t)i >= s.entries.size()) return nullptr;
    const entry &e = s.entries[(size_t)i];
    if (kind) *kind = e.kind;
    if (c) *c = e.c;
    return e.name.c_str();
}

#else /* the plain emulated library: nothing counted */

namespace ab_emu {
void traffic_alloc(const void *, size_t) {}
void traffic_free(const void *) {}
bool traffic_counting(void) { return false; }
void traffic_begin(const char *, int) {}
void traffic_range(const void *, size_t, bool) {}
void traffic_end(void) {}
void traffic_transfer(size_t, bool) {}
} // namespace ab_emu

extern "C" int ab_emu_traffic_instrumented(void) { return 0; }
extern "C" void ab_emu_traffic_reset(void) {}
extern "C" void ab_emu_traffic_enable(int) {}
extern "C" void ab_emu_traffic_total(ab_emu_traffic_counts *c, unsigned long long *h2d, unsigned long long *d2h) {
    if (c) *c = counts{};
    if (h2d) *h2d = 0;
    if (d2h) *d2h = 0;
}
extern "C" int ab_emu_traffic_entries(void) { return 0; }
extern "C" const char *ab_emu_traffic_entry(int, int *, ab_emu_traffic_counts *) { return nullptr; }

#endif
