/* The CUDA emulator (see cuda_emu.h for what it covers and checks).
 *
 * Threads of a block are fibers: each has its own stack (allocated once, reused by
 * every launch, with a guard page below it) and runs a loop "run the kernel body for the
 * thread index the scheduler gave me, then yield". The first entry into a fiber goes
 * through makecontext/setcontext; every switch after that is made as fiber_switch.h
 * says (with and without AddressSanitizer). A block runs round-robin: the scheduler
 * resumes every ready fiber in thread order; a fiber runs until it waits at a barrier or
 * finishes. The last thread to reach a barrier releases the others and goes on. A round
 * in which no fiber can run while some have not finished is a deadlock.
 *
 * This file must be compiled without _FORTIFY_SOURCE (glibc's checked longjmp refuses
 * jumps between stacks); meson passes -U_FORTIFY_SOURCE. */
#include "cuda_emu.h"
#include "fiber_switch.h"

#include <chrono>
#include <climits>
#include <cstdarg>
#include <cstdlib>
#include <map>
#include <mutex>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

uint3 threadIdx, blockIdx;
dim3 blockDim, gridDim;

/* The bounds of every kernel's static __shared__ storage (cuda_emu.h puts it in this
 * section; the linker defines the symbols; weak: absent when no kernel has any). */
extern "C" __attribute__((weak)) unsigned char __start_ab_emu_shared[], __stop_ab_emu_shared[];

namespace {

enum fiber_state { F_READY, F_BLOCK_WAIT, F_WARP_WAIT, F_DONE };

using namespace ab_emu_fiber;

constexpr size_t STACK_BYTES = 256 * 1024;
constexpr int MAX_THREADS = 1024;
constexpr size_t DEFAULT_SMEM_LIMIT = 48 * 1024;
constexpr size_t OPTIN_SMEM_LIMIT = 227 * 1024;

struct fiber {
    ctx_buf ctx;
    ucontext_t uc;
    unsigned char *map = nullptr; /* guard page + stack */
    void *asan_fake = nullptr;    /* AddressSanitizer's fake stack while switched out */
    bool started = false;
    int state = F_DONE;
};

struct warp_state {
    unsigned mask = 0;
    int arrived = 0;
    unsigned gen = 0;
    const char *what = nullptr;
    uint64_t slot[2][32];
};

struct emu_state {
    std::recursive_mutex mu;
    /* fibers and the running block */
    fiber *fibers[MAX_THREADS] = {};
    int n_fibers = 0;
    ctx_buf sched;
    void *sched_asan_fake = nullptr;   /* the scheduler's fake stack while a fiber runs */
    const void *sched_bottom = nullptr; /* the scheduler's stack (AddressSanitizer) */
    size_t sched_size = 0;
    int cur = -1;     /* running fiber (thread index in the block), -1 outside kernels */
    int nthreads = 0; /* threads of the running block */
    void (*body)(void *) = nullptr;
    void *body_ctx = nullptr;
    const char *kernel = nullptr;
    /* block barrier */
    int bar_arrived = 0;
    unsigned bar_gen = 0;
    int bar_count[2] = {0, 0};
    warp_state warps[MAX_THREADS / 32];
    /* wmma: each warp's mma_sync staging (A, B, C tiles) and the strict mode's element
     * permutations per kind of fragment */
    float wmma_stage[MAX_THREADS / 32][768];
    std::map<int, std::vector<int>> wmma_perm;
    /* dynamic shared memory: data pages followed by a guard page */
    unsigned char *smem_map = nullptr;
    size_t smem_cap = 0;
    unsigned char *smem = nullptr;
    size_t smem_bytes = 0;
    std::map<const void *, int> func_smem_limit;
    /* device memory */
    std::map<uintptr_t, size_t> allocs;
    /* strict mode: each allocation's own mapping (guard pages around the data pages) */
    struct mapping {
        unsigned char *base;  /* guard page, data pages, guard page */
        size_t data_bytes;    /* the data pages */
    };
    std::map<uintptr_t, mapping> maps;
    int window = 0; /* depth of device-memory windows open (strict mode) */
    size_t used = 0, limit = 0;
    bool limit_set = false;
    unsigned long long launches = 0;
    unsigned long long ops = 0; /* launches, GEMMs, copies and memsets: what a GPU's stream queues */
    unsigned long long host_copies = 0; /* copies between host and device memory */
    /* what the host hands the device: each operation queued directly, a graph's launch
     * once (its operations are in ops, not here) */
    unsigned long long submissions = 0;
};

emu_state &S() {
    static emu_state *s = new emu_state; /* never destroyed: usable from atexit handlers */
    return *s;
}

thread_local cudaError_t g_last_error = cudaSuccess;

cudaError_t set_error(cudaError_t e) {
    if (e != cudaSuccess) g_last_error = e;
    return e;
}

size_t page_size() {
    static size_t p = (size_t)sysconf(_SC_PAGESIZE);
    return p;
}

size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

bool no_device() {
    const char *e = getenv("AB_EMU_NO_DEVICE");
    return e && *e && strcmp(e, "0") != 0;
}

size_t parse_bytes(const char *s, size_t def) {
    if (!s || !*s) return def;
    char *end;
    double x = strtod(s, &end);
    if (end == s || x <= 0) return def;
    switch (*end) {
    case 'k': case 'K': x *= 1024.0; break;
    case 'm': case 'M': x *= 1048576.0; break;
    case 'g': case 'G': x *= 1073741824.0; break;
    default: break;
    }
    return (size_t)x;
}

/* AB_EMU_STRICT=1: the checks a real GPU would make fail loudly, at the price of speed
 * (see cuda_emu.h). */
int g_strict = -1; /* -1: not read from the environment yet */

bool strict() {
    if (g_strict < 0) {
        const char *e = getenv("AB_EMU_STRICT");
        g_strict = e && *e && strcmp(e, "0") != 0;
    }
    return g_strict == 1;
}

/* Strict mode: device memory is readable and writable only inside a window (a kernel,
 * a copy, a memset, a cuBLAS or CUB call); host code touching it elsewhere faults, as
 * it would on a GPU. Windows nest. */
void set_device_access(int prot) {
    emu_state &s = S();
    for (auto &m : s.maps)
        if (mprotect(m.second.base + page_size(), m.second.data_bytes, prot) != 0)
            ab_emu::fatal("mprotect of device memory failed");
}

size_t limit_bytes() {
    emu_state &s = S();
    if (!s.limit_set) {
        s.limit = parse_bytes(getenv("AB_EMU_DEVICE_MEMORY"), (size_t)4 << 30);
        s.limit_set = true;
    }
    return s.limit;
}

/* ---- fibers ---- */

SWITCHES void yield_to_scheduler() {
    emu_state &s = S();
    fiber *f = s.fibers[s.cur];
    if (!CTX_SAVE(f->ctx)) {
        asan_leaving(&f->asan_fake, s.sched_bottom, s.sched_size);
        jump_to(s.sched);
    }
    /* resumed by switch_to, perhaps from another host thread's stack */
    asan_arrived(f->asan_fake, &s.sched_bottom, &s.sched_size);
}

/* A thread that exits while others wait for it at a barrier: the barrier can never
 * complete (undefined behaviour on a GPU). */
void check_exit(int tid) {
    emu_state &s = S();
    const warp_state &W = s.warps[tid / 32];
    if (W.arrived > 0 && (W.mask & (1u << (tid & 31))))
        ab_emu::fatal("thread exited while %d lanes of its warp wait at %s with mask 0x%08x, which names it",
                      W.arrived, W.what, W.mask);
    if (s.bar_arrived > 0)
        ab_emu::fatal("thread exited while %d of the block's %d threads wait at __syncthreads", s.bar_arrived,
                      s.nthreads);
}

void fiber_main() {
    asan_arrived(nullptr, &S().sched_bottom, &S().sched_size); /* first entry, from setcontext */
    for (;;) {
        emu_state &s = S();
        s.body(s.body_ctx);
        check_exit(s.cur);
        s.fibers[s.cur]->state = F_DONE;
        yield_to_scheduler();
    }
}

void ensure_fibers(int n) {
    emu_state &s = S();
    for (; s.n_fibers < n; s.n_fibers++) {
        fiber *f = new fiber;
        size_t pg = page_size();
        void *m = mmap(nullptr, STACK_BYTES + pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                       -1, 0);
        if (m == MAP_FAILED) ab_emu::fatal("cannot map a fiber stack");
        f->map = (unsigned char *)m;
        mprotect(f->map, pg, PROT_NONE); /* stacks grow down: overflow hits the guard */
        if (getcontext(&f->uc)) ab_emu::fatal("getcontext failed");
        f->uc.uc_stack.ss_sp = f->map + pg;
        f->uc.uc_stack.ss_size = STACK_BYTES;
        f->uc.uc_link = nullptr;
        makecontext(&f->uc, fiber_main, 0);
        s.fibers[s.n_fibers] = f;
    }
}

void set_thread_index(int tid) {
    threadIdx.x = (unsigned)tid % blockDim.x;
    threadIdx.y = ((unsigned)tid / blockDim.x) % blockDim.y;
    threadIdx.z = (unsigned)tid / (blockDim.x * blockDim.y);
}

SWITCHES void switch_to(int tid) {
    emu_state &s = S();
    fiber *f = s.fibers[tid];
    s.cur = tid;
    set_thread_index(tid);
    if (!CTX_SAVE(s.sched)) {
        asan_leaving(&s.sched_asan_fake, f->uc.uc_stack.ss_sp, f->uc.uc_stack.ss_size);
        if (!f->started) {
            f->started = true;
            setcontext(&f->uc);
        }
        jump_to(f->ctx);
    }
    asan_arrived(s.sched_asan_fake, nullptr, nullptr);
}

void deadlock() {
    emu_state &s = S();
    int nb = 0, nw = 0, nd = 0;
    const char *wop = "";
    for (int t = 0; t < s.nthreads; t++) {
        int st = s.fibers[t]->state;
        if (st == F_BLOCK_WAIT) nb++;
        else if (st == F_WARP_WAIT) {
            nw++;
            wop = s.warps[t / 32].what;
        } else if (st == F_DONE)
            nd++;
    }
    s.cur = -1;
    ab_emu::fatal("deadlock in block (%u,%u,%u) of %d threads: %d wait at __syncthreads, %d at a warp operation%s%s, "
                  "%d exited (a barrier not reached by every thread it names)",
                  blockIdx.x, blockIdx.y, blockIdx.z, s.nthreads, nb, nw, nw ? " " : "", nw ? wop : "", nd);
}

void run_block() {
    emu_state &s = S();
    const int T = s.nthreads;
    for (int t = 0; t < T; t++) s.fibers[t]->state = F_READY;
    s.bar_arrived = 0;
    s.bar_count[0] = s.bar_count[1] = 0;
    for (int w = 0; w < (T + 31) / 32; w++) s.warps[w].arrived = 0;
    if (s.smem_bytes) memset(s.smem, 0xff, round_up(s.smem_bytes, 32));
    unsigned char *shared_begin = __start_ab_emu_shared, *shared_end = __stop_ab_emu_shared;
    if (shared_begin && shared_end > shared_begin) memset(shared_begin, 0xff, (size_t)(shared_end - shared_begin));
    int done = 0;
    const bool rev = strict();
    while (done < T) {
        bool progress = false;
        for (int i = 0; i < T; i++) {
            const int t = rev ? T - 1 - i : i;
            if (s.fibers[t]->state != F_READY) continue;
            switch_to(t);
            progress = true;
        }
        done = 0;
        for (int t = 0; t < T; t++) done += s.fibers[t]->state == F_DONE;
        if (!progress && done < T) deadlock();
    }
    s.cur = -1;
}

void prepare_smem(size_t bytes) {
    emu_state &s = S();
    size_t need = round_up(bytes ? bytes : 1, page_size());
    if (need > s.smem_cap) {
        if (s.smem_map) munmap(s.smem_map, s.smem_cap + page_size());
        void *m = mmap(nullptr, need + page_size(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) ab_emu::fatal("cannot map %zu bytes of shared memory", bytes);
        s.smem_map = (unsigned char *)m;
        s.smem_cap = need;
        mprotect(s.smem_map + need, page_size(), PROT_NONE); /* past the end: faults */
    }
    s.smem_bytes = bytes;
    s.smem = s.smem_map + s.smem_cap - round_up(bytes, 32); /* 32-byte aligned (wmma), as AB_DYN_SMEM */
}

fiber *current_fiber(const char *what) {
    emu_state &s = S();
    if (s.cur < 0) ab_emu::fatal("%s called outside a kernel", what);
    return s.fibers[s.cur];
}

const char *kind_name(cudaMemcpyKind k) {
    switch (k) {
    case cudaMemcpyHostToHost: return "HostToHost";
    case cudaMemcpyHostToDevice: return "HostToDevice";
    case cudaMemcpyDeviceToHost: return "DeviceToHost";
    case cudaMemcpyDeviceToDevice: return "DeviceToDevice";
    case cudaMemcpyDefault: return "Default";
    }
    return "?";
}

void check_copy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, const char *call) {
    bool dd = ab_emu::is_device_range(dst, bytes), sd = ab_emu::is_device_range(src, bytes);
    bool want_dd = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    bool want_sd = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if (kind == cudaMemcpyDefault) return;
    if (dd != want_dd || sd != want_sd)
        ab_emu::fatal("%s(%s, %zu bytes): destination is %s memory and source %s memory", call, kind_name(kind), bytes,
                      dd ? "device" : "host (or not wholly device)", sd ? "device" : "host (or not wholly device)");
}

} // namespace

/* ---- the emulator's interface ---- */

namespace ab_emu {

void fatal(const char *fmt, ...) {
    emu_state &s = S();
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "cuda emulator: ");
    if (s.cur >= 0 && s.kernel)
        fprintf(stderr, "kernel %s, block (%u,%u,%u), thread (%u,%u,%u): ", s.kernel, blockIdx.x, blockIdx.y,
                blockIdx.z, threadIdx.x, threadIdx.y, threadIdx.z);
    else if (s.kernel)
        fprintf(stderr, "kernel %s: ", s.kernel);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    fflush(stderr);
    abort();
}

/* A block over the limits is cudaErrorInvalidValue ("invalid argument"), as the CUDA 13
 * runtime answers a launch of 1025 threads on an H100 (older runtimes said
 * cudaErrorInvalidConfiguration); a grid over its limits stays
 * cudaErrorInvalidConfiguration. */
cudaError_t launch_config_error(dim3 grid, dim3 block) {
    const unsigned long long nt = (unsigned long long)block.x * block.y * block.z;
    if (block.x < 1 || block.y < 1 || block.z < 1 || block.x > 1024 || block.y > 1024 || block.z > 64 || nt > 1024)
        return cudaErrorInvalidValue;
    if (grid.x < 1 || grid.y < 1 || grid.z < 1 || grid.x > (unsigned)INT_MAX || grid.y > 65535 || grid.z > 65535)
        return cudaErrorInvalidConfiguration;
    return cudaSuccess;
}

void launch(const char *name, const void *func, dim3 grid, dim3 block, size_t smem_bytes, cudaStream_t stream,
            void (*body)(void *), void *ctx) {
    (void)stream;
    emu_state &s = S();
    std::lock_guard<std::recursive_mutex> lock(s.mu);
    if (s.cur >= 0) fatal("kernel %s launched from inside kernel %s (not supported)", name, s.kernel);
    if (no_device()) {
        set_error(cudaErrorNoDevice);
        return;
    }
    const unsigned long long nt = (unsigned long long)block.x * block.y * block.z;
    if (const cudaError_t e = launch_config_error(grid, block)) {
        set_error(e);
        return;
    }
    size_t smem_limit = DEFAULT_SMEM_LIMIT;
    auto it = s.func_smem_limit.find(func);
    if (it != s.func_smem_limit.end() && (size_t)it->second > smem_limit) smem_limit = (size_t)it->second;
    if (smem_bytes > smem_limit) {
        /* A real launch fails; here it is a programming error worth a clear message. */
        fatal("kernel %s: %zu bytes of dynamic shared memory requested, the limit is %zu (above 48 KiB needs "
              "cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize), at most 227 KiB)",
              name, smem_bytes, smem_limit);
    }
    ensure_fibers((int)nt);
    prepare_smem(smem_bytes);
    const char *saved_kernel = s.kernel;
    s.kernel = name;
    s.body = body;
    s.body_ctx = ctx;
    s.nthreads = (int)nt;
    gridDim = grid;
    blockDim = block;
    s.launches++;
    s.ops++;
    device_window w;
    traffic_begin(name, AB_EMU_TRAFFIC_KERNEL);
    const bool rev = strict(); /* blocks in the opposite order too */
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                blockIdx.x = rev ? grid.x - 1 - x : x;
                blockIdx.y = rev ? grid.y - 1 - y : y;
                blockIdx.z = rev ? grid.z - 1 - z : z;
                run_block();
            }
    traffic_end();
    s.kernel = saved_kernel;
}

void *dyn_smem(void) {
    current_fiber("dynamic shared memory");
    return S().smem;
}

int syncthreads_count(int pred) {
    emu_state &s = S();
    fiber *f = current_fiber("__syncthreads");
    unsigned g = s.bar_gen;
    s.bar_count[g & 1] += pred != 0;
    if (++s.bar_arrived == s.nthreads) {
        s.bar_arrived = 0;
        s.bar_gen++;
        s.bar_count[(g + 1) & 1] = 0; /* nobody has reached the next barrier yet */
        for (int t = 0; t < s.nthreads; t++)
            if (s.fibers[t]->state == F_BLOCK_WAIT) s.fibers[t]->state = F_READY;
    } else {
        f->state = F_BLOCK_WAIT;
        yield_to_scheduler();
    }
    return s.bar_count[g & 1];
}

void syncthreads(void) { syncthreads_count(0); }

int lane_id(void) {
    current_fiber("a warp operation");
    return S().cur & 31;
}

unsigned activemask(void) {
    emu_state &s = S();
    current_fiber("__activemask");
    int w = s.cur / 32;
    unsigned m = 0;
    for (int l = 0; l < 32 && w * 32 + l < s.nthreads; l++)
        if (s.fibers[w * 32 + l]->state != F_DONE) m |= 1u << l;
    return m;
}

void warp_gather(unsigned mask, uint64_t bits, uint64_t *all, const char *what) {
    emu_state &s = S();
    fiber *f = current_fiber(what);
    const int tid = s.cur, lane = tid & 31, w = tid >> 5;
    const int lanes = std::min(32, s.nthreads - w * 32);
    if (!(mask & (1u << lane))) fatal("%s: the calling lane %d is not in the mask 0x%08x", what, lane, mask);
    if (lanes < 32 && (mask >> lanes))
        fatal("%s: mask 0x%08x names lanes past the last thread of the block (warp %d has %d lanes)", what, mask, w,
              lanes);
    for (int l = 0; l < lanes; l++)
        if ((mask & (1u << l)) && s.fibers[w * 32 + l]->state == F_DONE)
            fatal("%s: mask 0x%08x names lane %d, which has exited", what, mask, l);
    warp_state &W = s.warps[w];
    if (W.arrived == 0) {
        W.mask = mask;
        W.what = what;
    } else if (W.mask != mask || strcmp(W.what, what) != 0) {
        fatal("warp %d: lanes wait at different warp operations (%s with mask 0x%08x, %s with mask 0x%08x)", w,
              W.what, W.mask, what, mask);
    }
    const unsigned g = W.gen;
    W.slot[g & 1][lane] = bits;
    if (++W.arrived == __builtin_popcount(mask)) {
        W.arrived = 0;
        W.gen++;
        for (int l = 0; l < lanes; l++)
            if ((mask & (1u << l)) && s.fibers[w * 32 + l]->state == F_WARP_WAIT) s.fibers[w * 32 + l]->state = F_READY;
    } else {
        f->state = F_WARP_WAIT;
        yield_to_scheduler();
    }
    for (int l = 0; l < 32; l++) all[l] = (mask & (1u << l)) ? W.slot[g & 1][l] : 0;
}

uint64_t warp_exchange(unsigned mask, uint64_t bits, int src_lane, const char *what) {
    uint64_t all[32];
    warp_gather(mask, bits, all, what);
    if (src_lane < 0 || src_lane > 31 || !(mask & (1u << src_lane)))
        fatal("%s: reads lane %d, which is not in the mask 0x%08x (undefined on a GPU)", what, src_lane, mask);
    return all[src_lane];
}

float *wmma_stage(void) {
    emu_state &s = S();
    current_fiber("a wmma operation");
    return s.wmma_stage[s.cur >> 5];
}

int wmma_element(int kind, int n, int lane, int i) {
    const int e = i * 32 + lane;
    if (!strict()) return e;
    /* strict: a fixed permutation of the tile per kind of fragment (Fisher-Yates over
     * a splitmix64 stream seeded by the kind), built once */
    emu_state &s = S();
    std::vector<int> &perm = s.wmma_perm[kind];
    if (perm.empty()) {
        perm.resize((size_t)n * 32);
        for (int j = 0; j < n * 32; j++) perm[(size_t)j] = j;
        uint64_t x = 0x9e3779b97f4a7c15ull * (uint64_t)(kind + 1);
        for (int j = n * 32 - 1; j > 0; j--) {
            uint64_t z = (x += 0x9e3779b97f4a7c15ull);
            z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
            z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
            z ^= z >> 31;
            std::swap(perm[(size_t)j], perm[(size_t)(z % (uint64_t)(j + 1))]);
        }
    }
    return perm[(size_t)e];
}

void syncwarp(unsigned mask, const char *what) {
    uint64_t all[32];
    warp_gather(mask, 0, all, what);
}

bool is_device_range(const void *p, size_t bytes) {
    emu_state &s = S();
    std::lock_guard<std::recursive_mutex> lock(s.mu);
    if (!p) return false;
    uintptr_t a = (uintptr_t)p;
    auto it = s.allocs.upper_bound(a);
    if (it == s.allocs.begin()) return false;
    --it;
    return a >= it->first && a - it->first <= it->second && bytes <= it->second - (a - it->first);
}

void require_device(const void *p, size_t bytes, const char *what) {
    if (bytes == 0) return;
    if (!is_device_range(p, bytes))
        fatal("%s: %zu bytes at %p are not inside one device allocation (a host pointer, or past the end)", what,
              bytes, p);
}

size_t device_memory(void) { return limit_bytes(); }

device_window::device_window() {
    if (!strict()) return;
    emu_state &s = S();
    s.mu.lock();
    if (s.window++ == 0) set_device_access(PROT_READ | PROT_WRITE);
}

device_window::~device_window() {
    if (!strict()) return;
    emu_state &s = S();
    if (--s.window == 0) set_device_access(PROT_NONE);
    s.mu.unlock();
}

void set_device_memory(size_t bytes) {
    emu_state &s = S();
    std::lock_guard<std::recursive_mutex> lock(s.mu);
    limit_bytes();
    s.limit = bytes;
}

unsigned long long launch_count(void) { return S().launches; }

} // namespace ab_emu

/* ---- runtime API ---- */

cudaError_t cudaGetLastError(void) {
    cudaError_t e = g_last_error;
    g_last_error = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void) { return g_last_error; }

const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInitializationError: return "initialization error";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInsufficientDriver: return "CUDA driver version is insufficient for CUDA runtime version";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorIllegalState: return "the operation cannot be performed in the present state";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureImplicit:
        return "operation would make the legacy stream depend on a capturing blocking stream";
    default: return "unknown error";
    }
}

const char *cudaGetErrorName(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInitializationError: return "cudaErrorInitializationError";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInsufficientDriver: return "cudaErrorInsufficientDriver";
    case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorIllegalState: return "cudaErrorIllegalState";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureImplicit: return "cudaErrorStreamCaptureImplicit";
    default: return "cudaErrorUnknown";
    }
}

cudaError_t cudaGetDeviceCount(int *n) {
    if (!n) return set_error(cudaErrorInvalidValue);
    *n = no_device() ? 0 : 1;
    return *n ? cudaSuccess : set_error(cudaErrorNoDevice);
}

cudaError_t cudaSetDevice(int dev) {
    if (no_device()) return set_error(cudaErrorNoDevice);
    return dev == 0 ? cudaSuccess : set_error(cudaErrorInvalidDevice);
}

cudaError_t cudaGetDevice(int *dev) {
    if (no_device()) return set_error(cudaErrorNoDevice);
    if (!dev) return set_error(cudaErrorInvalidValue);
    *dev = 0;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int dev) {
    if (no_device()) return set_error(cudaErrorNoDevice);
    if (!p) return set_error(cudaErrorInvalidValue);
    if (dev != 0) return set_error(cudaErrorInvalidDevice);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "attnbench CUDA emulator (CPU)");
    p->totalGlobalMem = limit_bytes();
    p->sharedMemPerBlock = DEFAULT_SMEM_LIMIT;
    p->sharedMemPerBlockOptin = OPTIN_SMEM_LIMIT;
    p->warpSize = 32;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = 1024;
    p->maxThreadsDim[1] = 1024;
    p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = INT_MAX;
    p->maxGridSize[1] = 65535;
    p->maxGridSize[2] = 65535;
    p->major = 9;
    p->minor = 0;
    p->multiProcessorCount = 1;
    return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int *v) {
    if (!v) return set_error(cudaErrorInvalidValue);
    *v = no_device() ? 0 : 13000;
    return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int *v) {
    if (!v) return set_error(cudaErrorInvalidValue);
    *v = 13000;
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
    emu_state &s = S();
    std::lock_guard<std::recursive_mutex> lock(s.mu);
    if (no_device()) return set_error(cudaErrorNoDevice);
    if (!free_bytes || !total_bytes) return set_error(cudaErrorInvalidValue);
    *total_bytes = limit_bytes();
    *free_bytes = s.used < *total_bytes ? *total_bytes - s.used : 0;
    return cudaSuccess;
}

/* Stream capture (cudaStreamBeginCapture): the streams being captured, and the refusal
 * of a call that may not run while one is (it invalidates every active capture). */
namespace {
std::vector<cudaStream_t> g_captures;
bool g_spoil_capture = false; /* ab_emu_spoil_next_capture */
cudaError_t capture_refuses(cudaError_t e);
} // namespace

cudaError_t cudaDeviceSynchronize(void) {
    if (no_device()) return set_error(cudaErrorNoDevice);
    return capture_refuses(cudaErrorStreamCaptureUnsupported);
}

cudaError_t cudaMalloc(void **p, size_t bytes) {
    emu_state &s = S();
    std::lock_guard<std::recursive_mutex> lock(s.mu);
    if (no_device()) return set_error(cudaErrorNoDevice);
    if (!p) return set_error(cudaErrorInvalidValue);
    if (const cudaError_t e = capture_refuses(cudaErrorStreamCaptureUnsupported)) return e;
    if (bytes == 0) {
        *p = nullptr;
        return cudaSuccess;
    }
    size_t rounded = round_up(bytes, 256);
    if (rounded < bytes || rounded > limit_bytes() || s.used > limit_bytes() - rounded)
        return set_error(cudaErrorMemoryAllocation);
    void *m;
    if (strict()) {
        /* Its own mapping: a guard page, the data, a guard page; the data ends exactly
         * at the trailing guard page (bytes rounded up to 4: the element size of the
         * smallest type the kernels use), so a kernel reading or writing one element
         * past the end faults. Alignment: that of the byte count (4 at least), enough
         * for every access the kernels make; not cudaMalloc's 256. */
        const size_t pg = page_size(), tail = round_up(bytes, 4), data = round_up(tail, pg);
        void *b = mmap(nullptr, data + 2 * pg, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (b == MAP_FAILED) return set_error(cudaErrorMemoryAllocation);
        unsigned char *base = (unsigned char *)b;
        if (mprotect(base + pg, data, PROT_READ | PROT_WRITE) != 0) ab_emu::fatal("mprotect of device memory failed");
        m = base + pg + data - tail;
        memset(base + pg, 0xff, data);
        if (s.window == 0 && mprotect(base + pg, data, PROT_NONE) != 0)
            ab_emu::fatal("mprotect of device memory failed");
        s.maps[(uintptr_t)m] = emu_state::mapping{base, data};
    } else {
        m = aligned_alloc(256, rounded);
        if (!m) return set_error(cudaErrorMemoryAllocation);
        memset(m, 0xff, rounded); /* fresh device memory is garbage: NaN shows reads before writes */
    }
    s.allocs[(uintptr_t)m] = bytes;
    ab_emu::traffic_alloc(m, bytes);
    s.used += rounded;
    *p = m;
    return cudaSuccess;
}

cudaError_t cudaFree(void *p) {
    emu_state &s = S();
    std::lock_guard<std::recursive_mutex> lock(s.mu);
    if (!p) return cudaSuccess;
    if (const cudaError_t e = capture_refuses(cudaErrorStreamCaptureUnsupported)) return e;
    auto it = s.allocs.find((uintptr_t)p);
    if (it == s.allocs.end()) return set_error(cudaErrorInvalidValue);
    s.used -= round_up(it->second, 256);
    s.allocs.erase(it);
    ab_emu::traffic_free(p);
    auto mit = s.maps.find((uintptr_t)p);
    if (mit != s.maps.end()) {
        munmap(mit->second.base, mit->second.data_bytes + 2 * page_size());
        s.maps.erase(mit);
    } else {
        free(p);
    }
    return cudaSuccess;
}

namespace {
cudaError_t memcpy_now(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind);
cudaError_t memset_now(void *p, int value, size_t bytes);
void record(cudaStream_t s, std::function<void()> op, void (*release)(void *) = nullptr, void *ctx = nullptr);
} // namespace

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind) {
    if (no_device()) return set_error(cudaErrorNoDevice);
    if (const cudaError_t e = capture_refuses(cudaErrorStreamCaptureImplicit)) return e;
    if (bytes) ab_emu::count_submission();
    return memcpy_now(dst, src, bytes, kind);
}

namespace {
cudaError_t memcpy_now(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind) {
    if ((int)kind < 0 || (int)kind > 4) return set_error(cudaErrorInvalidMemcpyDirection);
    if (bytes == 0) return cudaSuccess;
    if (!dst || !src) return set_error(cudaErrorInvalidValue);
    check_copy(dst, src, bytes, kind, "cudaMemcpy");
    ab_emu::device_window w;
    const bool dd = ab_emu::is_device_range(dst, bytes), sd = ab_emu::is_device_range(src, bytes);
    if (ab_emu::traffic_counting()) {
        if (dd && sd) {
            ab_emu::traffic_begin("cudaMemcpy(DeviceToDevice)", AB_EMU_TRAFFIC_MEMCPY);
            ab_emu::traffic_range(src, bytes, false);
            ab_emu::traffic_range(dst, bytes, true);
            ab_emu::traffic_end();
        } else if (dd || sd) {
            ab_emu::traffic_transfer(bytes, dd);
        }
    }
    memmove(dst, src, bytes);
    S().ops++;
    if (dd != sd) S().host_copies++;
    return cudaSuccess;
}

} // namespace

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s) {
    if (no_device()) return set_error(cudaErrorNoDevice);
    if (!ab_emu::capturing(s)) {
        if (bytes) ab_emu::count_submission();
        return memcpy_now(dst, src, bytes, kind);
    }
    /* captured: only copies within device memory (a copy from or to pageable host
     * memory cannot be part of a graph) */
    if (bytes == 0) return cudaSuccess;
    if (!dst || !src) return set_error(cudaErrorInvalidValue);
    if (!ab_emu::is_device_range(dst, bytes) || !ab_emu::is_device_range(src, bytes))
        return capture_refuses(cudaErrorStreamCaptureUnsupported);
    record(s, [=]() { memcpy_now(dst, src, bytes, kind); });
    return cudaSuccess;
}

cudaError_t cudaMemset(void *p, int value, size_t bytes) {
    if (no_device()) return set_error(cudaErrorNoDevice);
    if (const cudaError_t e = capture_refuses(cudaErrorStreamCaptureImplicit)) return e;
    if (bytes) ab_emu::count_submission();
    return memset_now(p, value, bytes);
}

namespace {
cudaError_t memset_now(void *p, int value, size_t bytes) {
    if (bytes == 0) return cudaSuccess;
    ab_emu::require_device(p, bytes, "cudaMemset");
    ab_emu::device_window w;
    if (ab_emu::traffic_counting()) {
        ab_emu::traffic_begin("cudaMemset", AB_EMU_TRAFFIC_MEMSET);
        ab_emu::traffic_range(p, bytes, true);
        ab_emu::traffic_end();
    }
    memset(p, value, bytes);
    S().ops++;
    return cudaSuccess;
}

} // namespace

cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t s) {
    if (no_device()) return set_error(cudaErrorNoDevice);
    if (!ab_emu::capturing(s)) {
        if (bytes) ab_emu::count_submission();
        return memset_now(p, value, bytes);
    }
    if (bytes == 0) return cudaSuccess;
    ab_emu::require_device(p, bytes, "cudaMemsetAsync");
    record(s, [=]() { memset_now(p, value, bytes); });
    return cudaSuccess;
}

/* One recorded operation of a capture: run() queues it again (a launch's closure is
 * freed by release(ctx) when the last graph holding it goes). */
struct emu_op {
    std::function<void()> run;
    std::shared_ptr<void> hold;
};
struct ab_emu_graph {
    std::vector<emu_op> ops;
};
struct ab_emu_stream {
    ab_emu_graph *capture; /* the graph being recorded, or NULL */
    bool invalidated;      /* a refused call ended the capture's use */
};

bool ab_emu::capturing(cudaStream_t s) { return s && s->capture; }

void ab_emu::count_submission() { S().submissions++; }

namespace {
cudaError_t capture_refuses(cudaError_t e) {
    if (g_captures.empty()) return cudaSuccess;
    for (cudaStream_t c : g_captures) c->invalidated = true;
    return set_error(e);
}

void record(cudaStream_t s, std::function<void()> op, void (*release)(void *), void *ctx) {
    emu_op o;
    o.run = std::move(op);
    if (release) o.hold = std::shared_ptr<void>(ctx, release);
    s->capture->ops.push_back(std::move(o));
}
} // namespace

void ab_emu::record_launch(const char *name, const void *func, dim3 grid, dim3 block, size_t smem_bytes,
                           cudaStream_t s, void (*body)(void *), void *ctx, void (*release)(void *)) {
    std::shared_ptr<void> hold(ctx, release);
    if (const cudaError_t e = launch_config_error(grid, block)) {
        s->invalidated = true;
        set_error(e);
        return;
    }
    emu_op o;
    o.run = [=]() { launch(name, func, grid, block, smem_bytes, nullptr, body, ctx); };
    o.hold = hold;
    s->capture->ops.push_back(std::move(o));
}

cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode) {
    if (no_device()) return set_error(cudaErrorNoDevice);
    if (!s) return set_error(cudaErrorStreamCaptureUnsupported); /* the legacy null stream */
    if ((int)mode < 0 || (int)mode > 2) return set_error(cudaErrorInvalidValue);
    if (s->capture) return set_error(cudaErrorIllegalState);
    s->capture = new ab_emu_graph;
    s->invalidated = g_spoil_capture;
    g_spoil_capture = false;
    g_captures.push_back(s);
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph) {
    if (!graph) return set_error(cudaErrorInvalidValue);
    *graph = nullptr;
    if (!s || !s->capture) return set_error(cudaErrorIllegalState);
    g_captures.erase(std::find(g_captures.begin(), g_captures.end(), s));
    ab_emu_graph *g = s->capture;
    s->capture = nullptr;
    if (s->invalidated) {
        delete g;
        return set_error(cudaErrorStreamCaptureInvalidated);
    }
    *graph = g;
    return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus *status) {
    if (!status) return set_error(cudaErrorInvalidValue);
    *status = !s || !s->capture ? cudaStreamCaptureStatusNone
              : s->invalidated  ? cudaStreamCaptureStatusInvalidated
                                : cudaStreamCaptureStatusActive;
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long flags) {
    if (!exec || !graph || flags != 0) return set_error(cudaErrorInvalidValue);
    *exec = new ab_emu_graph(*graph);
    return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
    if (no_device()) return set_error(cudaErrorNoDevice);
    if (!exec) return set_error(cudaErrorInvalidResourceHandle);
    if (ab_emu::capturing(s)) return capture_refuses(cudaErrorStreamCaptureUnsupported);
    cudaGetLastError(); /* the graph's own errors only */
    ab_emu::count_submission();
    for (const emu_op &o : exec->ops) {
        o.run();
        if (const cudaError_t e = cudaPeekAtLastError()) return e;
    }
    return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
    if (!exec) return set_error(cudaErrorInvalidResourceHandle);
    delete exec;
    return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
    if (!graph) return set_error(cudaErrorInvalidResourceHandle);
    delete graph;
    return cudaSuccess;
}
struct ab_emu_event {
    std::chrono::steady_clock::time_point t;
    bool recorded;
};

cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithFlags(s, 0); }

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags) {
    (void)flags;
    if (no_device()) return set_error(cudaErrorNoDevice);
    if (!s) return set_error(cudaErrorInvalidValue);
    *s = new ab_emu_stream{nullptr, false};
    return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s) {
    if (!s) return set_error(cudaErrorInvalidResourceHandle);
    if (s->capture) {
        g_captures.erase(std::find(g_captures.begin(), g_captures.end(), s));
        delete s->capture;
    }
    delete s;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    if (no_device()) return set_error(cudaErrorNoDevice);
    return ab_emu::capturing(s) || (!s && !g_captures.empty()) ? capture_refuses(cudaErrorStreamCaptureUnsupported)
                                                               : cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *e) {
    if (!e) return set_error(cudaErrorInvalidValue);
    *e = new ab_emu_event{std::chrono::steady_clock::now(), false};
    return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t e) {
    if (!e) return set_error(cudaErrorInvalidResourceHandle);
    delete e;
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    (void)s;
    if (!e) return set_error(cudaErrorInvalidResourceHandle);
    e->t = std::chrono::steady_clock::now();
    e->recorded = true;
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) { return e ? cudaSuccess : set_error(cudaErrorInvalidResourceHandle); }

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
    if (!ms || !start || !end) return set_error(cudaErrorInvalidValue);
    if (!start->recorded || !end->recorded) return set_error(cudaErrorInvalidResourceHandle);
    *ms = std::chrono::duration<float, std::milli>(end->t - start->t).count();
    return cudaSuccess;
}

cudaError_t ab_emu_func_set_attribute(const void *func, cudaFuncAttribute attr, int value) {
    emu_state &s = S();
    std::lock_guard<std::recursive_mutex> lock(s.mu);
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 || (size_t)value > OPTIN_SMEM_LIMIT)
        return set_error(cudaErrorInvalidValue);
    s.func_smem_limit[func] = value;
    return cudaSuccess;
}

/* ---- cuBLAS ---- */

struct ab_emu_cublas {
    cudaStream_t stream;
    cublasMath_t math;
};

cublasStatus_t cublasCreate(cublasHandle_t *h) {
    if (!h) return CUBLAS_STATUS_INVALID_VALUE;
    if (no_device()) return CUBLAS_STATUS_NOT_INITIALIZED;
    *h = new ab_emu_cublas{nullptr, CUBLAS_DEFAULT_MATH};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t h) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    h->stream = s;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t mode) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (mode != CUBLAS_DEFAULT_MATH && mode != CUBLAS_PEDANTIC_MATH && mode != CUBLAS_TF32_TENSOR_OP_MATH)
        return CUBLAS_STATUS_INVALID_VALUE;
    h->math = mode;
    return CUBLAS_STATUS_SUCCESS;
}

const char *cublasGetStatusString(cublasStatus_t st) {
    switch (st) {
    case CUBLAS_STATUS_SUCCESS: return "the operation completed successfully";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "an absent device architectural feature is required";
    case CUBLAS_STATUS_MAPPING_ERROR: return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    }
    return "unknown error";
}

namespace {

bool valid_op(cublasOperation_t t) { return t == CUBLAS_OP_N || t == CUBLAS_OP_T || t == CUBLAS_OP_C; }

/* Elements spanned by a column-major rows x cols matrix with leading dimension ld. */
size_t span(int rows, int cols, int ld) {
    if (rows <= 0 || cols <= 0) return 0;
    return (size_t)(cols - 1) * (size_t)ld + (size_t)rows;
}

/* C = alpha op(A) op(B) + beta C for `batch` matrices, column-major, as cuBLAS. */
cublasStatus_t gemm(const char *call, cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                    int k, const float *alpha, const float *A, int lda, long long sa, const float *B, int ldb,
                    long long sb, const float *beta, float *C, int ldc, long long sc, int batch) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!valid_op(ta) || !valid_op(tb) || m < 0 || n < 0 || k < 0 || batch < 0) return CUBLAS_STATUS_INVALID_VALUE;
    const bool tra = ta != CUBLAS_OP_N, trb = tb != CUBLAS_OP_N;
    const int ra = tra ? k : m, ca = tra ? m : k; /* A as stored: ra x ca */
    const int rb = trb ? n : k, cb = trb ? k : n;
    if (lda < std::max(1, ra) || ldb < std::max(1, rb) || ldc < std::max(1, m)) return CUBLAS_STATUS_INVALID_VALUE;
    if (!alpha || !beta) return CUBLAS_STATUS_INVALID_VALUE;
    if (m == 0 || n == 0 || batch == 0) return CUBLAS_STATUS_SUCCESS;
    const float al = *alpha, be = *beta;
    const bool tf32 = h->math == CUBLAS_TF32_TENSOR_OP_MATH;
    ab_emu::device_window w;
    const bool use_ab = al != 0.0f && k > 0;
    char what[96];
    /* Traffic: one launch; A and B read once, column by column (the elements, not the
     * gaps between columns when ld exceeds the rows), C read when beta != 0, C written. */
    const bool count = ab_emu::traffic_counting();
    if (count) ab_emu::traffic_begin(call, AB_EMU_TRAFFIC_CUBLAS);
    for (int b = 0; b < batch; b++) {
        const float *Ab = A + (ptrdiff_t)b * sa, *Bb = B + (ptrdiff_t)b * sb;
        float *Cb = C + (ptrdiff_t)b * sc;
        if (use_ab) {
            snprintf(what, sizeof what, "%s: A of batch entry %d", call, b);
            ab_emu::require_device(Ab, span(ra, ca, lda) * sizeof(float), what);
            snprintf(what, sizeof what, "%s: B of batch entry %d", call, b);
            ab_emu::require_device(Bb, span(rb, cb, ldb) * sizeof(float), what);
        }
        snprintf(what, sizeof what, "%s: C of batch entry %d", call, b);
        ab_emu::require_device(Cb, span(m, n, ldc) * sizeof(float), what);
        if (count) {
            if (use_ab) {
                for (int j = 0; j < ca; j++) ab_emu::traffic_range(Ab + (size_t)j * lda, sizeof(float) * ra, false);
                for (int j = 0; j < cb; j++) ab_emu::traffic_range(Bb + (size_t)j * ldb, sizeof(float) * rb, false);
            }
            for (int j = 0; j < n; j++) {
                if (be != 0.0f) ab_emu::traffic_range(Cb + (size_t)j * ldc, (size_t)m * sizeof(float), false);
                ab_emu::traffic_range(Cb + (size_t)j * ldc, (size_t)m * sizeof(float), true);
            }
        }
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                double acc = 0.0;
                if (use_ab)
                    for (int l = 0; l < k; l++) {
                        float fa = tra ? Ab[(size_t)l + (size_t)i * lda] : Ab[(size_t)i + (size_t)l * lda];
                        float fx = trb ? Bb[(size_t)j + (size_t)l * ldb] : Bb[(size_t)l + (size_t)j * ldb];
                        if (tf32) fa = nvcuda::wmma::__float_to_tf32(fa), fx = nvcuda::wmma::__float_to_tf32(fx);
                        const double a = fa, x = fx;
                        acc += a * x;
                    }
                float *c = &Cb[(size_t)i + (size_t)j * ldc];
                /* beta == 0: C is output only, never read (NaN there does not propagate) */
                double prev = be == 0.0f ? 0.0 : (double)be * (double)*c;
                *c = (float)((double)al * acc + prev);
            }
    }
    if (count) ab_emu::traffic_end();
    return CUBLAS_STATUS_SUCCESS;
}

} // namespace

/* A GEMM queued on a stream being captured: its arguments and the handle's math mode as
 * they are now (the scalars are host values, read at the call). */
bool gemm_recorded(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float al,
                   const float *A, int lda, long long sa, const float *B, int ldb, long long sb, float be, float *C,
                   int ldc, long long sc, int batch, const char *call, cublasStatus_t *st) {
    if (!h || !ab_emu::capturing(h->stream)) return false;
    const ab_emu_cublas hc{nullptr, h->math};
    /* the arguments' checks now, as the call's (a product of no entries checks them only) */
    *st = gemm(call, h, ta, tb, m, n, k, &al, A, lda, sa, B, ldb, sb, &be, C, ldc, sc, batch < 0 ? batch : 0);
    if (*st != CUBLAS_STATUS_SUCCESS) return true;
    record(h->stream, [=]() {
        ab_emu_cublas hh = hc;
        std::lock_guard<std::recursive_mutex> lock(S().mu);
        if (gemm(call, &hh, ta, tb, m, n, k, &al, A, lda, sa, B, ldb, sb, &be, C, ldc, sc, batch) ==
            CUBLAS_STATUS_SUCCESS)
            S().ops++;
        else
            set_error(cudaErrorLaunchFailure); /* the graph's launch reports it */
    });
    return true;
}

cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                           const float *alpha, const float *A, int lda, const float *B, int ldb, const float *beta,
                           float *C, int ldc) {
    cublasStatus_t rst = CUBLAS_STATUS_SUCCESS;
    if (alpha && beta &&
        gemm_recorded(h, ta, tb, m, n, k, *alpha, A, lda, 0, B, ldb, 0, *beta, C, ldc, 0, 1, "cublasSgemm", &rst))
        return rst;
    std::lock_guard<std::recursive_mutex> lock(S().mu);
    S().submissions++;
    const cublasStatus_t st = gemm("cublasSgemm", h, ta, tb, m, n, k, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1);
    if (st == CUBLAS_STATUS_SUCCESS) S().ops++;
    return st;
}

cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                         int k, const float *alpha, const float *A, int lda, long long strideA,
                                         const float *B, int ldb, long long strideB, const float *beta, float *C,
                                         int ldc, long long strideC, int batchCount) {
    cublasStatus_t rst = CUBLAS_STATUS_SUCCESS;
    if (alpha && beta &&
        gemm_recorded(h, ta, tb, m, n, k, *alpha, A, lda, strideA, B, ldb, strideB, *beta, C, ldc, strideC,
                      batchCount, "cublasSgemmStridedBatched", &rst))
        return rst;
    std::lock_guard<std::recursive_mutex> lock(S().mu);
    S().submissions++;
    const cublasStatus_t st = gemm("cublasSgemmStridedBatched", h, ta, tb, m, n, k, alpha, A, lda, strideA, B, ldb,
                                   strideB, beta, C, ldc, strideC, batchCount);
    if (st == CUBLAS_STATUS_SUCCESS) S().ops++;
    return st;
}

/* ---- C entry points for tests written in C ---- */

extern "C" size_t ab_emu_device_memory(void) { return ab_emu::device_memory(); }
extern "C" void ab_emu_set_device_memory(size_t bytes) { ab_emu::set_device_memory(bytes); }
extern "C" unsigned long long ab_emu_launch_count(void) { return ab_emu::launch_count(); }
extern "C" unsigned long long ab_emu_op_count(void) { return S().ops; }
extern "C" unsigned long long ab_emu_host_copy_count(void) { return S().host_copies; }
extern "C" unsigned long long ab_emu_submission_count(void) { return S().submissions; }
extern "C" void ab_emu_spoil_next_capture(void) { g_spoil_capture = true; }
extern "C" void ab_emu_set_strict(int on) {
    std::lock_guard<std::recursive_mutex> lock(S().mu);
    if (S().window) ab_emu::fatal("ab_emu_set_strict inside a device operation");
    /* Allocations made before keep the layout they were made with; strict ones become
     * accessible for good when strict mode ends (no window will open them). */
    if (!on && strict()) set_device_access(PROT_READ | PROT_WRITE);
    g_strict = on != 0;
}
