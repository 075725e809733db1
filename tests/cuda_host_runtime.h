// A CUDA execution model for the host, so that gradops' real kernel sources run on a CPU in
// tests (tests/cuda_host.py compiles them with g++ after this header).
//
// * Blocks run one after another; the threads of a block are fibers (ucontext) on one OS
//   thread, so a thread runs until it reaches a barrier or ends, then the next one runs.
//   __syncthreads() and __syncwarp() are real barriers: a thread waits until every thread of its
//   block (warp) arrives.  Warps waiting at __syncwarp are released one at a time, so warps do
//   not run in lock-step between block barriers (see release_barriers).  A barrier that some threads of the block never reach (divergent
//   __syncthreads, or threads that exited) is reported as an error instead of hanging.
// * __shared__ variables become function-local statics: one copy, shared by the block's
//   threads.  A GPU leaves shared memory undefined when a block starts (another kernel's or
//   another block's leftovers), so before each block the runtime fills every __shared__
//   variable of the launching library with a poison byte (tests/cuda_host.py registers them for
//   each launch): 0xff (NaN in every floating type, -1 in integers) in even blocks of a forward
//   launch, 0x5a (finite in every type: about 203 in float16, 1.5e16 in bfloat16 and float32)
//   in odd ones, and the other way round for the other orders.  A kernel that reads shared memory it has not
//   written in the same block gets values that differ between blocks and between orders.
// * A memory fault in a kernel (an access to an unmapped address; or a misaligned 16-byte
//   vector access, when the host compiler uses aligned SSE moves for it) ends the launch with an
//   error instead of taking the test process down.
// * The order in which blocks and threads run is a parameter (forward, reverse, or shuffled
//   with a seed, reshuffled at every barrier).  A kernel whose result depends on that order
//   has a race between threads of a block or between blocks: tests run each case in more than
//   one order and compare.
// * nvcuda::wmma is emulated with the same fragment API: a/b fragments hold their whole tile in
//   every lane; each accumulator element belongs to one lane, in the layout mma.sync uses
//   (WMMA leaves its own unspecified): element (i, j) of a 16x16 tile to lane
//   (i % 8) * 4 + (j % 8) / 2, which computes and stores only its own; the others hold NaN.  Code that relied on a fragment
//   layout would show NaN, and a lane that reads what other lanes stored without __syncwarp
//   races.  Products of half/bfloat16/TF32 inputs are exact in float; sums are in float.
// * The PTX primitives of cuda_src/tensor_core_ptx.cuh (ldmatrix, mma.sync m16n8k16/m16n8k8,
//   cp.async) are emulated with the ISA's lane ownership: see "tensor-core PTX emulation" below;
//   so are the warp vote __any_sync and the 32-bit, full-warp shuffles __shfl_up_sync and
//   __shfl_down_sync (a warp that only partly reaches one fails the launch).
// * GRADOPS_HOST_RACECHECK builds check every shared-memory access against the barriers and
//   fail a launch at the first hazard between two threads, check every access g++ emits with
//   its type's alignment for that alignment, and refuse any access to the guard bytes around
//   the launch's arrays (memcheck): see "racecheck" below.
#pragma once

// Builds take -fvisibility=hidden (tests/cuda_host.py: HOST_CXX_FLAGS), so that the kernel
// code's template statics (its __shared__ variables) are local to each library: g++ would
// otherwise emit them as STB_GNU_UNIQUE symbols, which the loader binds process-wide even under
// RTLD_LOCAL, and a second build of a kernel (a planted bug's) would use the first one's
// __shared__ memory.  This runtime stays visible: its statics (the scheduler, with its fiber
// stacks) are one copy in the process, however many libraries are loaded.
#pragma GCC visibility push(default)

// Tells the kernel headers that this runtime supplies the emulated PTX primitives.
#define GRADOPS_HOST_MODEL 1
// The entry points tests/cuda_host.py generates after the kernel sources (found with dlsym).
#define GRADOPS_HOST_EXPORT extern "C" __attribute__((visibility("default")))

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <limits>
#include <map>
#include <random>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>
#include <csetjmp>
#include <csignal>
#include <ucontext.h>

#include <cuda_fp16.h>
#include <cuda_bf16.h>

using std::fma;
using std::max;
using std::min;

struct gradops_host_dim3 { unsigned x, y, z; };
static gradops_host_dim3 threadIdx{0, 0, 0}, blockIdx{0, 0, 0}, blockDim{1, 1, 1}, gridDim{1, 1, 1};

// One copy per block (blocks run one at a time): see the header comment.
#undef __shared__
#define __shared__ static
// Occupancy hints mean nothing here.
#undef __launch_bounds__
#define __launch_bounds__(...)

namespace gradops_host {

enum State { RUNNABLE, AT_BLOCK_BARRIER, AT_WARP_BARRIER, DONE };
enum Order { FORWARD = 0, REVERSE = 1, SHUFFLED = 2 };

// Each fiber's stack: kernels keep register tiles and (emulated) fragments on it.
constexpr std::size_t kStackBytes = 512 * 1024;
constexpr int kWarpSize = 32;

// A fiber starts on its own stack through makecontext/swapcontext once; after that, switches
// use _setjmp/_longjmp, which (unlike swapcontext) make no signal-mask system call: the
// tiled kernels cross a barrier hundreds of thousands of times per test.
// One emulated cp.async: 16 bytes to dst, of which the first src_bytes come from src and the
// rest are zeros.  It lands when the thread's wait_group retires its group.
struct AsyncCopy {
    void* dst;
    const void* src;
    int src_bytes;
};

struct Fiber {
    ucontext_t context;
    std::jmp_buf resume;
    bool started = false;
    std::vector<char> stack;
    State state = DONE;
    unsigned x = 0, y = 0, z = 0;
    std::vector<AsyncCopy> copies_open;                 // issued since the last commit_group
    std::deque<std::vector<AsyncCopy>> copy_groups;     // committed, oldest first, not yet landed
};

// Per warp: what each lane publishes for a warp-collective primitive (see the PTX emulation).
constexpr int kExchangeBytes = 64;
struct WarpExchange {
    alignas(16) unsigned char lane[kWarpSize][kExchangeBytes];
    const void* site[kWarpSize];  // where in the kernel each lane issued a .aligned primitive
};

// Shared-memory traffic of the emulated shared-memory primitives, per kind (ldmatrix; 16-byte
// stores, st_shared_16; the shared-memory writes of 16-byte cp.async, counted as 16-byte
// stores' are; 4-byte loads, ld_shared_32; 16-byte loads, ld_shared_16), since the last reset:
// warp-level accesses, the wavefronts (bank passes) they take, and the fewest wavefronts the
// same bytes could take.  wavefronts > ideal means bank conflicts.
struct SharedStats {
    long long accesses = 0, wavefronts = 0, ideal = 0;
};
// LOAD and STORE: plain loads and stores of any width that a kernel reports itself under
// GRADOPS_HOST_MODEL (gradops_host::count_access with their width), where it wants its
// shared-memory layout's bank conflicts counted.
enum SharedKind { LDMATRIX = 0, STORE_16 = 1, CP_ASYNC = 2, LOAD_4 = 3, LOAD = 4, STORE = 5, LOAD_16 = 6, SHARED_KINDS = 7 };

// One kind of shared-memory access (16-byte writes, 4-byte loads) of one warp, grouped into
// warp-level instructions: lane l's n-th access belongs to the warp's n-th instruction of that
// kind (the accesses of converged code, which is where they are counted: a round that not all
// 32 lanes reach is never counted).
struct StoreRound {
    const void* address[kWarpSize];
    int filled = 0;
    int bytes = 16;  // the access width (LOAD and STORE; every lane's the same)
};
struct WarpStores {
    std::deque<StoreRound> rounds;  // not yet complete, oldest first
    long long done = 0;             // rounds completed and counted
    long long issued[kWarpSize] = {0};
};

struct Scheduler {
    ucontext_t home;
    std::jmp_buf back;
    std::vector<Fiber> fibers;
    int current = -1;
    int threads = 0;  // of the running block
    int running_warp = -1;  // the warp that release_barriers lets run on, -1: none yet
    std::vector<WarpExchange> exchange;
    SharedStats shared[SHARED_KINDS];
    std::vector<WarpStores> warp_stores[SHARED_KINDS];  // per kind of counted per-lane access
    // Global vector loads (cuda_src's load_vector) while count_global is set: per warp, per call
    // site (file, line), grouped into warp-level instructions as warp_stores are; their sectors.
    bool count_global = false;
    SharedStats global_loads;
    std::vector<std::map<std::pair<const char*, int>, WarpStores>> warp_global;
    void (*body)(void*) = nullptr;
    void* body_arg = nullptr;
    char error[512] = {0};
    // The launching library's __shared__ variables (address, bytes), poisoned before each block.
    std::vector<std::pair<unsigned char*, std::size_t>> shared_regions;
};

inline Scheduler& scheduler() {
    static Scheduler s;
    return s;
}

inline int lane() { return scheduler().current % kWarpSize; }

// Racecheck's state (see "racecheck" below), which the barriers advance.
#ifdef GRADOPS_HOST_RACECHECK
#define GRADOPS_HOST_UNCHECKED __attribute__((no_sanitize_thread, noinline))

struct SharedRange {
    std::uintptr_t begin, end;
    const char* name;
};
// What the current block last did to one byte of shared memory.  Epochs count the block's
// barriers (a new block starts a new one); a thread's generation, the __syncwarp barriers it has
// passed (the lanes of a warp pass each one together).
struct ByteShadow {
    unsigned long long write_epoch = 0, write_generation = 0, read_epoch = 0, read_generation = 0;
    int writer = -1;
    int reader = -1, read_warp = -1;  // the last reader, of the warp and generation last read in
    bool readers_many = false;        // another thread also read in that warp and generation
    unsigned read_warps = 0;          // the warps that read in this epoch
};
struct Racecheck {
    std::vector<SharedRange> ranges;
    std::vector<std::vector<ByteShadow>> shadow;
    unsigned long long epoch = 1;
    unsigned long long syncwarps[1024] = {};  // per thread of the block, since it started
    long long accesses = 0;  // checked byte ranges, for tests that the hooks are live
};
inline Racecheck race_state;
// The instrumented code's fast path reads only these (no guard variables, no calls).
inline std::uintptr_t race_low = ~std::uintptr_t(0), race_high = 0;
inline bool race_busy = false;

// Memcheck of global memory (racecheck builds): the guard bytes around each array of the
// launching device (tests/cuda_host.py's HostDevice), sorted by address: an access of kernel code
// that touches one is outside its allocation, which compute-sanitizer's memcheck reports on a
// GPU (where the value read may not matter to the result, so no comparison would catch it).
struct Allocation {
    std::uintptr_t buffer_begin, array_begin, array_end, buffer_end;
};
inline std::vector<Allocation> allocations;
inline std::uintptr_t guard_low = ~std::uintptr_t(0), guard_high = 0;

// scheduler()'s Scheduler is built when the library loads, while the guard range is empty.
// check_guards asks scheduler() about any access inside the range, and the Scheduler's
// constructor is instrumented: built at the first such check (arrays mapped on both sides of
// this library's own data), it came back to check_guards, which called scheduler() inside its
// own initialisation: a hang with other threads, recursive_init_error without
// (tests/test_cuda_host.py::test_racecheck_library_takes_arrays_around_its_own_data).
[[gnu::constructor, gnu::used]] GRADOPS_HOST_UNCHECKED static void build_scheduler_at_load() { (void)scheduler(); }

GRADOPS_HOST_UNCHECKED inline void race_new_epoch() { ++race_state.epoch; }
// A block starts: its threads have passed no __syncwarp (a launch that failed may have left
// some lanes of a warp one barrier ahead of others).
GRADOPS_HOST_UNCHECKED inline void race_new_block() {
    ++race_state.epoch;
    std::fill(std::begin(race_state.syncwarps), std::end(race_state.syncwarps), 0ULL);
}
// A lane passed a __syncwarp: only __syncwarp (and __syncthreads) order memory between the lanes
// of a warp; the warp barriers inside the emulated collectives (shuffles, votes, ldmatrix,
// mma.sync) do not, as on a GPU.
GRADOPS_HOST_UNCHECKED inline void race_syncwarp(int thread) { ++race_state.syncwarps[thread]; }

#else
inline void race_new_epoch() {}
inline void race_new_block() {}
inline void race_syncwarp(int) {}
#endif


inline void wait_at(State barrier) {
    Scheduler& s = scheduler();
    Fiber& f = s.fibers[s.current];
    f.state = barrier;
    if (!_setjmp(f.resume)) _longjmp(s.back, 1);
}

inline void trampoline() {
    Scheduler& s = scheduler();
    s.body(s.body_arg);
    s.fibers[s.current].state = DONE;
    _longjmp(s.back, 1);
}

// Release a barrier that every waiting thread agrees on; false (and s.error) on divergence.
// Warp barriers go first, one warp at a time, and the same warp again as long as it waits at
// one: a warp runs through its warp-collective operations (each a pair of warp barriers in the
// PTX emulation) up to the next block barrier before the next warp (the first waiting one in
// forward order, the last in reverse order, a random one when shuffled) moves.  Warps are
// independent between block barriers, and a warp that runs ahead exposes what another warp
// has not yet read or written, as threads that run to their barrier one at a time expose races
// between threads.  Releasing every waiting warp at once would march the warps in lock-step
// and hide such races.
template <class Random>
inline bool release_barriers(Scheduler& s, int threads, int order, Random& random) {
    int waiting[1024 / kWarpSize], count = 0;
    for (int w0 = 0; w0 < threads; w0 += kWarpSize) {
        int at_warp = 0, lanes = std::min(kWarpSize, threads - w0);
        for (int t = w0; t < w0 + lanes; ++t) at_warp += s.fibers[t].state == AT_WARP_BARRIER;
        if (at_warp == 0) continue;
        if (at_warp != lanes) {
            std::snprintf(s.error, sizeof s.error,
                          "__syncwarp in warp %d reached by %d of %d lanes (block %u,%u,%u)",
                          w0 / kWarpSize, at_warp, lanes, blockIdx.x, blockIdx.y, blockIdx.z);
            return false;
        }
        waiting[count++] = w0 / kWarpSize;
    }
    if (count) {
        int warp = -1;
        for (int i = 0; i < count; ++i)
            if (waiting[i] == s.running_warp) warp = s.running_warp;
        if (warp < 0) {
            const int pick = order == FORWARD ? 0 : order == REVERSE ? count - 1
                                                                     : static_cast<int>(random() % count);
            warp = s.running_warp = waiting[pick];
        }
        const int w0 = warp * kWarpSize;
        for (int t = w0; t < std::min(w0 + kWarpSize, threads); ++t) s.fibers[t].state = RUNNABLE;
        return true;
    }
    int at_block = 0, done = 0;
    for (int t = 0; t < threads; ++t) {
        at_block += s.fibers[t].state == AT_BLOCK_BARRIER;
        done += s.fibers[t].state == DONE;
    }
    if (at_block == 0) return true;  // every thread has finished
    if (done) {
        std::snprintf(s.error, sizeof s.error,
                      "__syncthreads reached by %d threads while %d had exited (block %u,%u,%u)",
                      at_block, done, blockIdx.x, blockIdx.y, blockIdx.z);
        return false;
    }
    for (int t = 0; t < threads; ++t) s.fibers[t].state = RUNNABLE;
    race_new_epoch();
    s.running_warp = -1;  // after a block barrier, the next warp is picked afresh
    return true;
}

// SIGSEGV/SIGBUS during a launch: back to launch(), which reports it.
inline sigjmp_buf& fault_return() {
    static sigjmp_buf buffer;
    return buffer;
}
inline void on_fault(int signal, siginfo_t* info, void*) {
    static_cast<void>(info);
    siglongjmp(fault_return(), signal);
}

struct FaultHandlers {  // installed for one launch, then the previous ones (Python's) restored
    struct sigaction segv, bus;
    FaultHandlers() {
        struct sigaction action {};
        action.sa_sigaction = on_fault;
        action.sa_flags = SA_SIGINFO;
        sigemptyset(&action.sa_mask);
        sigaction(SIGSEGV, &action, &segv);
        sigaction(SIGBUS, &action, &bus);
    }
    ~FaultHandlers() {
        sigaction(SIGSEGV, &segv, nullptr);
        sigaction(SIGBUS, &bus, nullptr);
    }
};

// A kernel error that the emulation detects (a misaligned ldmatrix row, a primitive a partial
// warp executes): ends the launch like a memory fault, with this message.
constexpr int kKernelError = 1000;  // sigsetjmp value; above every signal number
inline char* kernel_error() {
    static char message[400];
    return message;
}
[[noreturn]] inline void fail(const char* message) {
    std::snprintf(kernel_error(), 400, "%s", message);
    siglongjmp(fault_return(), kKernelError);
}

// An access of ``bytes`` at ``p`` by kernel code (``access`` names it in the message): a GPU
// faults on an address that is not a multiple of its size; a CPU does not, so the model checks.
inline void check_alignment(const void* p, std::size_t bytes, const char* access) {
    if (reinterpret_cast<std::uintptr_t>(p) % bytes == 0) return;
    char message[200];
    std::snprintf(message, sizeof message, "%s to an address that is not aligned to its size (misaligned address)",
                  access);
    fail(message);
}
// A vector load of global memory (cuda_src's load_vector).
inline void check_vector_alignment(const void* p, std::size_t bytes) {
    check_alignment(p, bytes, "a global vector access");
}

inline int run_blocks(const unsigned* grid, const unsigned* block, int order, unsigned seed,
               const unsigned long long* only_blocks, long long only_count, char* error, int error_size);

// Run ``body(arg)`` as a kernel over grid x block; 0 on success, else 1 with ``error`` set.
// ``only_count`` > 0: run just the blocks with these linear ids (x fastest), e.g. the few that
// touch the far end of a huge tensor.
inline int launch(void (*body)(void*), void* arg, const unsigned* grid, const unsigned* block, int order,
                  unsigned seed, const unsigned long long* only_blocks, long long only_count, char* error,
                  int error_size) {
    Scheduler& s = scheduler();
    s.body = body;
    s.body_arg = arg;
    FaultHandlers handlers;
    if (int signal = sigsetjmp(fault_return(), 1)) {  // 1: restore the signal mask on the way back
        if (signal == kKernelError)
            std::snprintf(error, error_size, "%s in block %u,%u,%u thread %u,%u,%u", kernel_error(), blockIdx.x,
                          blockIdx.y, blockIdx.z, threadIdx.x, threadIdx.y, threadIdx.z);
        else
            std::snprintf(error, error_size, "memory fault (signal %d) in block %u,%u,%u thread %u,%u,%u", signal,
                          blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x, threadIdx.y, threadIdx.z);
        s.current = -1;
        return 1;
    }
    return run_blocks(grid, block, order, seed, only_blocks, only_count, error, error_size);
}

// Fills the launching library's __shared__ variables with ``byte`` (see the header comment).
// Not an access of any thread, so racecheck builds do not see it.
__attribute__((no_sanitize_thread, noinline)) inline void poison_shared(Scheduler& s, int byte) {
    for (const auto& region : s.shared_regions) std::memset(region.first, byte, region.second);
}

inline int run_blocks(const unsigned* grid, const unsigned* block, int order, unsigned seed,
                      const unsigned long long* only_blocks, long long only_count, char* error, int error_size) {
    Scheduler& s = scheduler();
    s.error[0] = 0;
    const int threads = static_cast<int>(block[0] * block[1] * block[2]);
    s.threads = threads;
    if (static_cast<int>(s.fibers.size()) < threads) s.fibers.resize(threads);
    s.exchange.resize((threads + kWarpSize - 1) / kWarpSize);
    for (auto& f : s.fibers)
        if (f.stack.empty()) f.stack.resize(kStackBytes);
    gridDim = {grid[0], grid[1], grid[2]};
    blockDim = {block[0], block[1], block[2]};
    std::mt19937 random(seed);

    std::vector<unsigned long long> blocks;
    const unsigned long long total_blocks = 1ULL * grid[0] * grid[1] * grid[2];
    if (only_count > 0) {
        for (long long i = 0; i < only_count; ++i)
            if (only_blocks[i] < total_blocks) blocks.push_back(only_blocks[i]);
    } else {
        for (unsigned long long b = 0; b < total_blocks; ++b) blocks.push_back(b);
    }
    if (order == REVERSE) std::reverse(blocks.begin(), blocks.end());
    if (order == SHUFFLED) std::shuffle(blocks.begin(), blocks.end(), random);
    std::vector<int> sweep(threads);

    for (unsigned long long b : blocks) {
        blockIdx = {static_cast<unsigned>(b % grid[0]), static_cast<unsigned>(b / grid[0] % grid[1]),
                    static_cast<unsigned>(b / grid[0] / grid[1])};
        for (int t = 0; t < threads; ++t) {
            Fiber& f = s.fibers[t];
            f.x = t % block[0];
            f.y = t / block[0] % block[1];
            f.z = t / block[0] / block[1];
            f.state = RUNNABLE;
            f.started = false;
            s.running_warp = -1;
            if (t == 0) {
                for (auto& stores : s.warp_stores) stores.assign((threads + kWarpSize - 1) / kWarpSize, WarpStores{});
                s.warp_global.assign((threads + kWarpSize - 1) / kWarpSize, {});
            }
            f.copies_open.clear();  // copies a thread of the previous block left in flight
            f.copy_groups.clear();
            getcontext(&f.context);
            f.context.uc_stack.ss_sp = f.stack.data();
            f.context.uc_stack.ss_size = f.stack.size();
            f.context.uc_link = &s.home;
            makecontext(&f.context, trampoline, 0);
        }
        poison_shared(s, (b + (order == FORWARD ? 0 : 1)) % 2 ? 0x5a : 0xff);
        race_new_block();  // what the last block did to shared memory is ordered before this one
        for (int t = 0; t < threads; ++t) sweep[t] = order == REVERSE ? threads - 1 - t : t;
        for (;;) {
            if (order == SHUFFLED) std::shuffle(sweep.begin(), sweep.end(), random);
            for (int t : sweep) {
                Fiber& f = s.fibers[t];
                if (f.state != RUNNABLE) continue;
                s.current = t;
                threadIdx = {f.x, f.y, f.z};
                if (!_setjmp(s.back)) {
                    if (f.started) _longjmp(f.resume, 1);
                    f.started = true;
                    swapcontext(&s.home, &f.context);
                }
            }
            bool all_done = true;
            for (int t = 0; t < threads; ++t) all_done &= s.fibers[t].state == DONE;
            if (all_done) break;
            if (!release_barriers(s, threads, order, random)) {
                std::snprintf(error, error_size, "%s", s.error);
                return 1;
            }
        }
    }
    s.current = -1;
    threadIdx = {0, 0, 0};
    blockIdx = {0, 0, 0};
    return 0;
}

// Calling a kernel with arguments from two arrays: pointer parameters take the next entry of
// ``pointers``, the others the next ``long long`` of ``scalars``, in parameter order.
template <typename A> struct Arg {
    static A get(void* const*, const long long* s, int&, int& is) { return static_cast<A>(s[is++]); }
};
template <typename T> struct Arg<T*> {
    static T* get(void* const* p, const long long*, int& ip, int&) { return static_cast<T*>(p[ip++]); }
};

template <typename... Args> struct Call {
    void (*fn)(Args...);
    void* const* pointers;
    const long long* scalars;
    static void run(void* self) {
        auto* c = static_cast<Call*>(self);
        int ip = 0, is = 0;
        // A braced initializer list evaluates its elements left to right, in parameter order.
        std::tuple<Args...> args{Arg<Args>::get(c->pointers, c->scalars, ip, is)...};
        std::apply(c->fn, args);
    }
};

// A kernel's parameter list for the stand-in's argument check (CuPy passes each NumPy scalar at
// its own width, so a width that differs from the parameter's is garbage on a GPU): per
// parameter, 0 for a pointer, the byte size of an integer, minus the byte size of a float.
template <typename A> struct ParamCode {
    static constexpr int value = std::is_floating_point<A>::value ? -static_cast<int>(sizeof(A))
                                                                   : static_cast<int>(sizeof(A));
};
template <typename T> struct ParamCode<T*> { static constexpr int value = 0; };

template <typename... Args> int kernel_signature(void (*)(Args...), int* codes, int capacity) {
    const int all[] = {ParamCode<Args>::value..., 0};
    const int n = static_cast<int>(sizeof...(Args));
    for (int i = 0; i < n && i < capacity; ++i) codes[i] = all[i];
    return n;
}

template <typename... Args>
int launch_kernel(void (*fn)(Args...), void* const* pointers, const long long* scalars, const unsigned* grid,
                  const unsigned* block, int order, unsigned seed, const unsigned long long* only_blocks,
                  long long only_count, char* error, int error_size) {
    Call<Args...> call{fn, pointers, scalars};
    return launch(&Call<Args...>::run, &call, grid, block, order, seed, only_blocks, only_count, error, error_size);
}

}  // namespace gradops_host

inline void __syncthreads() { gradops_host::wait_at(gradops_host::AT_BLOCK_BARRIER); }
inline void __syncwarp(unsigned = 0xffffffffu) {
    gradops_host::wait_at(gradops_host::AT_WARP_BARRIER);
    gradops_host::race_syncwarp(gradops_host::scheduler().current);
}
// A fence orders one thread's own memory accesses as others see them; it synchronises no
// threads.  A thread here runs until it waits at a barrier, its accesses in program order, so
// there is nothing to order.
inline void __threadfence_block() {}
inline void __threadfence() {}
// Blocks run one after another here, each to its end or its next barrier, so an atomic is a
// plain read-modify-write; which block takes a ticket last follows the launch's block order.
inline unsigned atomicAdd(unsigned* address, unsigned value) {
    const unsigned old = *address;
    *address = old + value;
    return old;
}
// A load through L2 (ld.global.cg): the same value here, with no cache to bypass.
template <typename T> inline T __ldcg(const T* address) { return *address; }
// A block barrier that also ORs a predicate over the block's threads.  Here three barriers
// (contribute, read, reset before anyone can contribute to the next call), one on the GPU: the
// extra two only order the threads more than the hardware would.
inline int __syncthreads_or(int predicate) {
    static int any = 0;
    if (predicate) any = 1;
    __syncthreads();
    const int result = any;
    __syncthreads();
    any = 0;
    __syncthreads();
    return result;
}

// The bit casts of CUDA's math API.
inline unsigned __float_as_uint(float v) {
    unsigned bits;
    std::memcpy(&bits, &v, 4);
    return bits;
}
inline float __uint_as_float(unsigned bits) {
    float v;
    std::memcpy(&v, &bits, 4);
    return v;
}

// __byte_perm(x, y, s) (CUDA's integer intrinsics; libdevice's __nv_byte_perm): byte n of the
// result is byte s<4n+2:4n> of the eight bytes of y:x, x's lowest first.  Bit 3 of each selector
// nibble is not used by that definition; PTX's prmt.b32, which it compiles to, would replicate the
// selected byte's sign with it set, so kernels keep it clear (the two definitions agree there).
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    const unsigned long long bytes = (static_cast<unsigned long long>(y) << 32) | x;
    unsigned result = 0;
    for (int n = 0; n < 4; ++n) {
        const unsigned index = (s >> (4 * n)) & 7u;
        result |= static_cast<unsigned>((bytes >> (8 * index)) & 0xffu) << (8 * n);
    }
    return result;
}

// ------------------------------------------------------------------ nvcuda::wmma emulation
namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };
namespace precision {
struct tf32 {};
}

template <typename T> struct element { using type = T; };
template <> struct element<precision::tf32> { using type = float; };

template <typename Use, int M, int N, int K, typename T, typename Layout = void> struct fragment {
    // matrix_a is M x K, matrix_b K x N, accumulator M x N; x is that tile, row-major.
    static constexpr int rows = std::is_same<Use, matrix_b>::value ? K : M;
    static constexpr int cols = std::is_same<Use, matrix_a>::value ? K : N;
    static constexpr int num_elements = rows * cols;
    typename element<T>::type x[rows * cols];
};

inline float to_float(float v) { return v; }
inline float to_float(__half v) { return __half2float(v); }
inline float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

// cvt.rna.tf32.f32: round to 10 mantissa bits, ties away from zero.
inline float __float_to_tf32(float v) {
    if (!std::isfinite(v)) return v;
    std::uint32_t bits;
    std::memcpy(&bits, &v, 4);
    bits = (bits + 0x1000u) & 0xffffe000u;
    std::memcpy(&v, &bits, 4);
    return v;
}

template <typename Use, int M, int N, int K, typename T, typename L, typename P>
inline void load_matrix_sync(fragment<Use, M, N, K, T, L>& f, const P* p, unsigned ldm) {
    using F = fragment<Use, M, N, K, T, L>;
    constexpr bool col = std::is_same<L, col_major>::value;
    for (int i = 0; i < F::rows; ++i)
        for (int j = 0; j < F::cols; ++j) f.x[i * F::cols + j] = col ? p[i + j * ldm] : p[i * ldm + j];
}

template <typename Use, int M, int N, int K, typename T, typename L>
inline void fill_fragment(fragment<Use, M, N, K, T, L>& f, typename element<T>::type v) {
    for (auto& e : f.x) e = v;
}

// A multiplicand as the tensor cores see it: TF32 inputs keep their top 10 mantissa bits (the
// hardware ignores the rest; kernels round with __float_to_tf32 first).
template <typename In, typename V> inline float input(V v) { return to_float(v); }
template <> inline float input<precision::tf32, float>(float v) {
    std::uint32_t bits;
    std::memcpy(&bits, &v, 4);
    bits &= 0xffffe000u;
    std::memcpy(&v, &bits, 4);
    return v;
}

// The lane that holds accumulator element (i, j).
inline int accumulator_owner(int i, int j) { return (i % 8) * 4 + (j % 8) / 2; }

template <int M, int N, int K, typename In, typename LA, typename LB>
inline void mma_sync(fragment<accumulator, M, N, K, float>& d, const fragment<matrix_a, M, N, K, In, LA>& a,
                     const fragment<matrix_b, M, N, K, In, LB>& b, const fragment<accumulator, M, N, K, float>& c) {
    static_assert(M == 16 && N == 16, "the emulated accumulator layout is that of 16x16 tiles");
    const int lane = gradops_host::lane();
    for (int e = 0; e < M * N; ++e) {
        const int i = e / N, j = e % N;
        if (accumulator_owner(i, j) != lane) {
            d.x[e] = std::numeric_limits<float>::quiet_NaN();
            continue;
        }
        float sum = 0.0f;
        for (int k = 0; k < K; ++k) sum += input<In>(a.x[i * K + k]) * input<In>(b.x[k * N + j]);
        d.x[e] = c.x[e] + sum;
    }
}

template <int M, int N, int K>
inline void store_matrix_sync(float* p, const fragment<accumulator, M, N, K, float>& f, unsigned ldm, layout_t layout) {
    const int lane = gradops_host::lane();
    for (int e = 0; e < M * N; ++e) {
        const int i = e / N, j = e % N;
        if (accumulator_owner(i, j) != lane) continue;
        p[layout == mem_row_major ? i * ldm + j : i + j * ldm] = f.x[e];
    }
}

}  // namespace wmma
}  // namespace nvcuda

// ------------------------------------------------------------------ tensor-core PTX emulation
// The functions of cuda_src/tensor_core_ptx.cuh, on the host.  Warp-collective instructions
// (ldmatrix, mma.sync) keep the ISA's lane ownership: each lane passes only its own registers
// and gets only its own results.  A lane publishes its operands in its warp's exchange area,
// waits at a warp barrier (every lane of the warp must arrive, as .sync.aligned requires), builds
// its own outputs from every lane's operands, and waits at a second barrier before the area is
// reused.  A fragment layout that a kernel gets wrong therefore gives wrong numbers here, as on a
// GPU, instead of being papered over by an emulation that hands every lane the whole tile.
namespace gradops_host {

// Where in a kernel's code the calling lane is: the return address of this never-inlined call.
// The .aligned primitives (ldmatrix, mma.sync) call it from their always-inlined bodies, and
// cuda_src's helpers around them are __forceinline__ (always_inline for g++), so each place in a
// kernel that issues such an instruction has its own address.  Lanes of one warp that reach the
// primitive through different branches (a divergent warp, where the ISA leaves the result
// undefined and a GPU can hang) present different addresses, and the emulation fails the launch.
// A helper that is not inlined hides its callers' branches from this check (no false alarm, a
// missed one).
__attribute__((noinline)) inline const void* call_site() { return __builtin_return_address(0); }

// Publish ``mine``, then call ``compute(all, lane)`` with every lane's published value.  ``site``
// (from call_site()): every lane must have issued the primitive from the same instruction, as
// .sync.aligned requires; nullptr for primitives without .aligned (vote.sync on sm_70+).
template <typename In, typename Compute>
__attribute__((always_inline)) inline void warp_collective(const In& mine, const char* what, Compute&& compute,
                                                           const void* site = nullptr) {
    static_assert(sizeof(In) <= kExchangeBytes, "a lane's operands must fit its exchange slot");
    Scheduler& s = scheduler();
    const int warp = s.current / kWarpSize, l = s.current % kWarpSize;
    if ((warp + 1) * kWarpSize > s.threads) fail(what);  // a partial warp: the ISA needs all 32 lanes
    std::memcpy(s.exchange[warp].lane[l], &mine, sizeof(In));
    s.exchange[warp].site[l] = site;
    wait_at(AT_WARP_BARRIER);
    for (int q = 0; q < kWarpSize; ++q)
        if (s.exchange[warp].site[q] != site)
            fail("a .sync.aligned primitive (ldmatrix, mma.sync) reached by the lanes of a warp from "
                 "different places in the kernel: a divergent warp (undefined; a GPU can hang)");
    In all[kWarpSize];
    for (int q = 0; q < kWarpSize; ++q) std::memcpy(&all[q], s.exchange[warp].lane[q], sizeof(In));
    compute(all, l);
    wait_at(AT_WARP_BARRIER);  // nobody overwrites a slot while another lane still reads it
}

// Wavefronts of one warp-level shared-memory access made of ``phases`` phases of 8 lanes, each
// reading 16 bytes at rows[phase * 8 + i]: a phase is one pass when its 32 words fall in 32
// distinct banks (4-byte banks, 32 of them); each extra distinct word in a bank costs a pass.
inline void count_wavefronts(const void* const* rows, int phases, SharedKind kind) {
    constexpr int kBanks = 32, kRowWords = 4;
    SharedStats& stats = scheduler().shared[kind];
    ++stats.accesses;
    for (int phase = 0; phase < phases; ++phase) {
        std::uintptr_t words[kBanks][8 * kRowWords];
        int count[kBanks] = {0};
        for (int i = 0; i < 8; ++i)
            for (int w = 0; w < kRowWords; ++w) {
                const std::uintptr_t word = reinterpret_cast<std::uintptr_t>(rows[phase * 8 + i]) / 4 + w;
                const int bank = static_cast<int>(word % kBanks);
                bool seen = false;  // the same word twice is a broadcast, not a conflict
                for (int j = 0; j < count[bank]; ++j) seen |= words[bank][j] == word;
                if (!seen) words[bank][count[bank]++] = word;
            }
        stats.wavefronts += *std::max_element(count, count + kBanks);
        stats.ideal += 1;  // 8 rows x 16 bytes = 128 bytes, one pass of 32 banks
    }
}

// Wavefronts of one warp-level shared-memory access of ``bytes`` (2, 4, 8 or 16) a lane, lane l
// at addresses[l]: served in phases of 128 bytes (32 lanes for up to 4 bytes, 16 for 8, 8 for
// 16), each one pass over the 32 banks plus one for each further distinct 4-byte word in its
// busiest bank (the same word twice is a broadcast).  A null address is an idle lane (a
// predicated-off store): a phase of idle lanes takes no pass, an instruction of them none.
inline void count_width_wavefronts(const void* const* addresses, int bytes, SharedKind kind) {
    constexpr int kBanks = 32;
    SharedStats& stats = scheduler().shared[kind];
    if (std::all_of(addresses, addresses + kWarpSize, [](const void* a) { return a == nullptr; })) return;
    ++stats.accesses;
    const int lanes = bytes <= 4 ? kWarpSize : 128 / bytes;
    const int words = (bytes + 3) / 4;
    for (int first = 0; first < kWarpSize; first += lanes) {
        if (std::all_of(addresses + first, addresses + first + lanes, [](const void* a) { return a == nullptr; }))
            continue;
        std::uintptr_t seen[kBanks][kWarpSize * 4];
        int count[kBanks] = {0};
        for (int l = first; l < first + lanes; ++l)
            for (int w = 0; w < words && addresses[l] != nullptr; ++w) {
                const std::uintptr_t word = reinterpret_cast<std::uintptr_t>(addresses[l]) / 4 + w;
                const int bank = static_cast<int>(word % kBanks);
                bool again = false;
                for (int j = 0; j < count[bank]; ++j) again |= seen[bank][j] == word;
                if (!again) seen[bank][count[bank]++] = word;
            }
        stats.wavefronts += *std::max_element(count, count + kBanks);
        stats.ideal += 1;
    }
}

// Lane l's access at p of ``bytes`` joins the warp's oldest round it has not been in (its n-th
// access, the warp's n-th instruction); ``count(round)`` runs once a round holds all 32 lanes.
template <typename Count>
inline void add_to_round(WarpStores& w, int l, const void* p, int bytes, Count count) {
    const long long round = w.issued[l]++ - w.done;
    while (static_cast<long long>(w.rounds.size()) <= round) w.rounds.emplace_back();
    StoreRound& r = w.rounds[round];
    r.address[l] = p;
    r.bytes = bytes;
    if (++r.filled == kWarpSize) count(r);
    while (!w.rounds.empty() && w.rounds.front().filled == kWarpSize) {
        w.rounds.pop_front();
        ++w.done;
    }
}

// One lane's shared-memory access of ``kind`` (16-byte writes: st.shared.v4, cp.async's write
// side; 4-byte loads: ld.shared.b32; 16-byte loads: ld.shared.v4; LOAD and STORE of
// ``bytes``): the warp's accesses of a kind are counted per warp-level instruction, 16-byte
// ones in 4 phases of 8 lanes as the hardware serves them, 4-byte ones in one phase of 32
// (count_width_wavefronts).
inline void count_access(const void* dst, SharedKind kind, int bytes = 16) {
    Scheduler& s = scheduler();
    const int warp = s.current / kWarpSize, l = s.current % kWarpSize;
    if ((warp + 1) * kWarpSize > s.threads) return;  // a partial warp: not counted
    add_to_round(s.warp_stores[kind][warp], l, dst, bytes,
                 [kind](const StoreRound& r) { count_width_wavefronts(r.address, r.bytes, kind); });
}

// The 32-byte sectors of one warp-level global load, lane l reading ``bytes`` at addresses[l]:
// ``wavefronts`` counts the distinct sectors the lanes touch (what the L1/TEX unit requests),
// ``ideal`` the fewest sectors the distinct bytes they read could fill (bytes / 32, rounded up);
// sectors > ideal means partly used sectors (Nsight Compute's "excess sectors").
inline void count_sectors(const void* const* addresses, int bytes) {
    SharedStats& stats = scheduler().global_loads;
    ++stats.accesses;
    std::uintptr_t start[kWarpSize];
    for (int l = 0; l < kWarpSize; ++l) start[l] = reinterpret_cast<std::uintptr_t>(addresses[l]);
    std::sort(start, start + kWarpSize);
    std::vector<std::uintptr_t> sectors;
    long long distinct = 0;
    std::uintptr_t covered = 0;  // the end of the bytes counted so far (starts are sorted)
    for (int l = 0; l < kWarpSize; ++l) {
        const std::uintptr_t begin = l == 0 ? start[l] : std::max(start[l], covered), end = start[l] + bytes;
        if (begin < end) distinct += static_cast<long long>(end - begin);
        covered = std::max(covered, end);
        for (std::uintptr_t sector = start[l] / 32; sector <= (end - 1) / 32; ++sector) sectors.push_back(sector);
    }
    std::sort(sectors.begin(), sectors.end());
    stats.wavefronts += std::unique(sectors.begin(), sectors.end()) - sectors.begin();
    stats.ideal += (distinct + 31) / 32;
}

// One lane's global vector load of ``bytes`` at ``p`` from (file, line), counted per warp-level
// instruction (the lanes' n-th loads from one call site; a round that not all 32 lanes reach,
// e.g. a predicated last slot, is never counted) while counting is on (HostKernels.
// count_global_loads).  Lanes that skip a load of a site before a later one of the same site
// would be grouped wrongly: count only launches whose lanes make the same loads.
inline void count_global_load(const void* p, int bytes, const char* file, int line) {
    Scheduler& s = scheduler();
    if (!s.count_global || s.current < 0) return;
    const int warp = s.current / kWarpSize, l = s.current % kWarpSize;
    if ((warp + 1) * kWarpSize > s.threads) return;  // a partial warp: not counted
    add_to_round(s.warp_global[warp][{file, line}], l, p, bytes,
                 [](const StoreRound& r) { count_sectors(r.address, r.bytes); });
}

// ------------------------------------------------------------------ racecheck
// GRADOPS_HOST_RACECHECK (tests/cuda_host.py: HostKernels(racecheck=True)): the build is
// instrumented by g++'s -fsanitize=thread, which calls __tsan_readN / __tsan_writeN (defined
// below, in place of ThreadSanitizer's run-time library, which is not linked) before each
// memory access of the kernel code.  Accesses inside the block's __shared__ variables (the
// ranges that register_shared names) are checked as compute-sanitizer's racecheck checks them
// on a GPU: two accesses to one byte by different threads of a block, at least one a write,
// with no __syncthreads between them (nor a __syncwarp, for two lanes of one warp), are a
// hazard (read-after-write, write-after-read, write-after-write), and the launch fails with
// the first one.  The emulated primitives (ldmatrix, st.shared, ld.shared, cp.async, whose
// copies are memcpy calls that g++ does not instrument) report their accesses themselves.
// This holds for any order the threads run in: it needs no wrong result to find a race.
#ifdef GRADOPS_HOST_RACECHECK
// An access of ``bytes`` (2, 4, 8 or 16) by a kernel thread to an address g++ assumed aligned to
// its size (see __tsan_readN below): a GPU's misaligned address error.
GRADOPS_HOST_UNCHECKED inline void check_access_alignment(const void* p, std::size_t bytes) {
    if (bytes < 2 || reinterpret_cast<std::uintptr_t>(p) % bytes == 0 || scheduler().current < 0 || race_busy) return;
    char access[32];
    std::snprintf(access, sizeof access, "a %zu-byte access", bytes);
    check_alignment(p, bytes, access);
}

GRADOPS_HOST_UNCHECKED inline void check_guards(const void* p, std::size_t n, bool write) {
    const std::uintptr_t begin = reinterpret_cast<std::uintptr_t>(p), end = begin + n;
    if (end <= guard_low || begin >= guard_high || race_busy || scheduler().current < 0) return;
    // Busy while searching, as race_access is: the library code it calls is instrumented, and
    // its accesses must not come back here.
    race_busy = true;
    const Allocation* const first = allocations.data();
    std::size_t lo = 0, hi = allocations.size();  // the first allocation whose buffer starts past ``begin``
    while (lo < hi) {
        const std::size_t mid = (lo + hi) / 2;
        if (first[mid].buffer_begin <= begin) lo = mid + 1; else hi = mid;
    }
    const Allocation* hit = nullptr;
    for (std::size_t i = lo > 0 ? lo - 1 : 0; i < allocations.size() && i <= lo && !hit; ++i) {
        const Allocation& a = first[i];
        if (end > a.buffer_begin && begin < a.buffer_end && (begin < a.array_begin || end > a.array_end)) hit = &a;
    }
    race_busy = false;
    if (!hit) return;
    char message[240];
    const bool before = begin < hit->array_begin;
    std::snprintf(message, sizeof message, "memcheck: a %zu-byte %s %llu bytes %s an array of %llu bytes (out of bounds)",
                  n, write ? "write" : "read",
                  static_cast<unsigned long long>(before ? hit->array_begin - begin : end - hit->array_end),
                  before ? "before the start of" : "past the end of",
                  static_cast<unsigned long long>(hit->array_end - hit->array_begin));
    fail(message);
}

GRADOPS_HOST_UNCHECKED inline void race_hazard(const char* kind, const SharedRange& range, std::uintptr_t byte,
                                               int first, int second) {
    const auto where = [](int t, char* out, std::size_t n) {
        std::snprintf(out, n, "(%u,%u,%u)", t % blockDim.x, t / blockDim.x % blockDim.y,
                      t / blockDim.x / blockDim.y);
    };
    char a[48], b[48], message[400];
    where(first, a, sizeof a);
    where(second, b, sizeof b);
    std::snprintf(message, sizeof message,
                  "racecheck: %s hazard on __shared__ %s, byte %zu: thread %s then thread %s with no barrier "
                  "between", kind, range.name, static_cast<std::size_t>(byte - range.begin), a, b);
    race_busy = false;
    fail(message);
}

GRADOPS_HOST_UNCHECKED inline void race_access(const void* p, std::size_t n, bool write) {
    const std::uintptr_t begin = reinterpret_cast<std::uintptr_t>(p), end = begin + n;
    if (end <= race_low || begin >= race_high || race_busy) return;
    Scheduler& s = scheduler();
    const int t = s.current;
    if (t < 0) return;
    race_busy = true;
    Racecheck& r = race_state;
    ++r.accesses;
    const int warp = t / kWarpSize;
    const unsigned long long e = r.epoch, g = r.syncwarps[t];
    // Ordered before this access: an earlier epoch, or the same warp before one of its __syncwarp.
    const auto ordered = [&](unsigned long long epoch, int other, unsigned long long generation) {
        return epoch != e || other == t || (other / kWarpSize == warp && generation < g);
    };
    // The ranges are sorted and disjoint: from the last one that starts at or before ``begin``.
    std::size_t i = static_cast<std::size_t>(
        std::upper_bound(r.ranges.begin(), r.ranges.end(), begin,
                         [](std::uintptr_t a, const SharedRange& x) { return a < x.begin; }) - r.ranges.begin());
    for (i = i > 0 ? i - 1 : 0; i < r.ranges.size() && r.ranges[i].begin < end; ++i) {
        const SharedRange& range = r.ranges[i];
        const std::uintptr_t lo = std::max(begin, range.begin), hi = std::min(end, range.end);
        if (lo < hi && r.shadow[i].empty()) r.shadow[i].resize(range.end - range.begin);  // most are never launched
        for (std::uintptr_t byte = lo; byte < hi; ++byte) {
            ByteShadow& b = r.shadow[i][byte - range.begin];
            if (b.writer >= 0 && !ordered(b.write_epoch, b.writer, b.write_generation))
                race_hazard(write ? "write-after-write" : "read-after-write", range, byte, b.writer, t);
            if (write) {
                if (b.read_epoch == e && b.read_warps & ~(1u << warp))  // another warp read it
                    race_hazard("write-after-read", range, byte, b.reader, t);
                if (b.read_epoch == e && b.read_warp == warp && b.read_generation == g &&
                    (b.readers_many || b.reader != t))  // another lane read it since the last __syncwarp
                    race_hazard("write-after-read", range, byte, b.reader, t);
                b.writer = t;
                b.write_epoch = e;
                b.write_generation = g;
            } else {
                if (b.read_epoch != e) {
                    b.read_epoch = e;
                    b.read_warps = 0;
                    b.read_warp = -1;
                }
                if (b.read_warp != warp || b.read_generation != g) {
                    b.read_warp = warp;
                    b.read_generation = g;
                    b.reader = t;
                    b.readers_many = false;
                } else if (b.reader != t) {
                    b.readers_many = true;
                }
                b.read_warps |= 1u << warp;
            }
        }
    }
    race_busy = false;
}
#else
inline void race_access(const void*, std::size_t, bool) {}
inline void check_guards(const void*, std::size_t, bool) {}
#endif

inline float b16_to_float(std::uint16_t bits, const __half*) {
    __half h;
    std::memcpy(&h, &bits, 2);
    return __half2float(h);
}
inline float b16_to_float(std::uint16_t bits, const __nv_bfloat16*) {
    __nv_bfloat16 h;
    std::memcpy(&h, &bits, 2);
    return __bfloat162float(h);
}
// The low (element 2i) or high (element 2i + 1) half of a packed register, as a float.
template <typename T> inline float half_of(unsigned r, int high) {
    return b16_to_float(static_cast<std::uint16_t>(high ? r >> 16 : r & 0xffffu), static_cast<const T*>(nullptr));
}
// A TF32 operand as the tensor cores read it: sign, exponent and the top 10 mantissa bits.
inline float tf32_operand(unsigned r) {
    r &= 0xffffe000u;
    float v;
    std::memcpy(&v, &r, 4);
    return v;
}

struct MmaOperands {
    unsigned a[4], b[2];
};

// D = A B + C for one lane: d[r] at row g + 8 (r / 2), column 2 t + r % 2 (the C/D fragment of
// m16n8kK).  The sum is emulated as float(0) + A[row][0] B[0][col] + ... + A[row][K-1] B[K-1][col],
// left to right, then C + sum: each product of f16/bf16/TF32 inputs is exact in float (at most
// 2 x 11 significant bits), and the hardware's own order of additions is unspecified, so tests
// compare with a tolerance of a few float roundings per term.
template <int K> inline void mma_lane_result(const float (&A)[16][K], const float (&B)[K][8], int l,
                                             float (&d)[4], const float (&c)[4]) {
    const int g = l / 4, t = l % 4;
    float out[4];
    for (int r = 0; r < 4; ++r) {
        const int row = g + 8 * (r / 2), col = 2 * t + r % 2;
        float sum = 0.0f;
        for (int k = 0; k < K; ++k) sum += A[row][k] * B[k][col];
        out[r] = c[r] + sum;
    }
    for (int r = 0; r < 4; ++r) d[r] = out[r];  // after reading c: d and c may be one array
}

}  // namespace gradops_host

// A warp vote: whether any lane's predicate is non-zero (every lane of the warp must call it,
// as the .sync form requires of the lanes in the mask, here always the whole warp).
inline int __any_sync(unsigned, int predicate) {
    int result = 0;
    gradops_host::warp_collective(predicate, "__any_sync executed by a partial warp", [&](const int* all, int) {
        for (int q = 0; q < gradops_host::kWarpSize; ++q) result |= all[q] != 0;
    });
    return result;
}

// Warp shuffles, shfl.sync.up / .down with the whole warp in the mask and width 32 (the only
// forms gradops' kernels use; others fail the launch): lane l gets the value of lane l - delta
// (up) or l + delta (down), and its own where that lane is outside the warp (PTX ISA, shfl.sync:
// the source lane is checked against 0 for .up, against 31 for .down, and the lane's own value
// kept where out of range).  Every lane must call it, as the full mask requires.
namespace gradops_host {
template <typename V> inline V shuffle(unsigned mask, V value, unsigned delta, int width, int direction) {
    static_assert(sizeof(V) == 4, "32-bit shuffles");
    if (mask != 0xffffffffu || width != kWarpSize || delta >= static_cast<unsigned>(kWarpSize))
        fail("a warp shuffle with a partial mask, a width other than 32 or a delta past the warp (not emulated)");
    V result = value;
    warp_collective(value, "a warp shuffle executed by a partial warp", [&](const V* all, int l) {
        const int from = l + direction * static_cast<int>(delta);
        if (from >= 0 && from < kWarpSize) result = all[from];
    });
    return result;
}
}  // namespace gradops_host

inline unsigned __shfl_up_sync(unsigned mask, unsigned v, unsigned delta, int width = 32) {
    return gradops_host::shuffle(mask, v, delta, width, -1);
}
inline unsigned __shfl_down_sync(unsigned mask, unsigned v, unsigned delta, int width = 32) {
    return gradops_host::shuffle(mask, v, delta, width, 1);
}
inline float __shfl_up_sync(unsigned mask, float v, unsigned delta, int width = 32) {
    return gradops_host::shuffle(mask, v, delta, width, -1);
}
inline float __shfl_down_sync(unsigned mask, float v, unsigned delta, int width = 32) {
    return gradops_host::shuffle(mask, v, delta, width, 1);
}

namespace gradops {
namespace ptx {

// ldmatrix.sync.aligned.m8n8.xX{.trans}.shared.b16 (layout: see tensor_core_ptx.cuh).
template <int X, bool TRANS> __attribute__((always_inline)) inline void ldmatrix(unsigned (&d)[X], const void* row) {
    static_assert(X == 1 || X == 2 || X == 4, "ldmatrix loads 1, 2 or 4 matrices");
    // Only lanes 0 .. 8X-1 supply addresses; only theirs must be aligned.
    if (gradops_host::lane() < 8 * X && reinterpret_cast<std::uintptr_t>(row) % 16 != 0)
        gradops_host::fail("ldmatrix: a row address that is not 16-byte aligned");
    if (gradops_host::lane() < 8 * X) gradops_host::race_access(row, 16, false);
    gradops_host::warp_collective(row, "ldmatrix executed by a partial warp", [&](const void* const* rows, int l) {
        for (int i = 0; i < X; ++i) {
            std::uint16_t e[2];
            for (int h = 0; h < 2; ++h) {
                // Matrix i's row R, column C element, row R's address from lane 8 i + R.
                const int R = TRANS ? 2 * (l % 4) + h : l / 4, C = TRANS ? l / 4 : 2 * (l % 4) + h;
                std::memcpy(&e[h], static_cast<const unsigned char*>(rows[8 * i + R]) + 2 * C, 2);
            }
            d[i] = static_cast<unsigned>(e[0]) | static_cast<unsigned>(e[1]) << 16;
        }
        if (l == 0) gradops_host::count_wavefronts(rows, X, gradops_host::LDMATRIX);
    }, gradops_host::call_site());
}

// mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32.
template <typename T>
__attribute__((always_inline)) inline void mma_m16n8k16(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2], const float (&c)[4]) {
    static_assert(std::is_same<T, __half>::value || std::is_same<T, __nv_bfloat16>::value,
                  "m16n8k16 takes __half or __nv_bfloat16");
    gradops_host::MmaOperands mine{{a[0], a[1], a[2], a[3]}, {b[0], b[1]}};
    gradops_host::warp_collective(mine, "mma.sync executed by a partial warp",
                                  [&](const gradops_host::MmaOperands* all, int l) {
        float A[16][16], B[16][8];
        for (int q = 0; q < gradops_host::kWarpSize; ++q) {
            const int g = q / 4, t = q % 4;
            for (int r = 0; r < 4; ++r)
                for (int h = 0; h < 2; ++h)
                    A[g + 8 * (r % 2)][2 * t + 8 * (r / 2) + h] = gradops_host::half_of<T>(all[q].a[r], h);
            for (int r = 0; r < 2; ++r)
                for (int h = 0; h < 2; ++h) B[2 * t + 8 * r + h][g] = gradops_host::half_of<T>(all[q].b[r], h);
        }
        gradops_host::mma_lane_result<16>(A, B, l, d, c);
    }, gradops_host::call_site());
}

// mma.sync.aligned.m16n8k8.row.col.f32.{f16,bf16}.{f16,bf16}.f32.
template <typename T>
__attribute__((always_inline)) inline void mma_m16n8k8(float (&d)[4], const unsigned (&a)[2], unsigned b, const float (&c)[4]) {
    static_assert(std::is_same<T, __half>::value || std::is_same<T, __nv_bfloat16>::value,
                  "m16n8k8 takes __half or __nv_bfloat16");
    gradops_host::MmaOperands mine{{a[0], a[1], 0u, 0u}, {b, 0u}};
    gradops_host::warp_collective(mine, "mma.sync executed by a partial warp",
                                  [&](const gradops_host::MmaOperands* all, int l) {
        float A[16][8], B[8][8];
        for (int q = 0; q < gradops_host::kWarpSize; ++q) {
            const int g = q / 4, t = q % 4;
            for (int r = 0; r < 2; ++r)
                for (int h = 0; h < 2; ++h) A[g + 8 * r][2 * t + h] = gradops_host::half_of<T>(all[q].a[r], h);
            for (int h = 0; h < 2; ++h) B[2 * t + h][g] = gradops_host::half_of<T>(all[q].b[0], h);
        }
        gradops_host::mma_lane_result<8>(A, B, l, d, c);
    }, gradops_host::call_site());
}

// mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32.
__attribute__((always_inline)) inline void mma_m16n8k8_tf32(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2], const float (&c)[4]) {
    gradops_host::MmaOperands mine{{a[0], a[1], a[2], a[3]}, {b[0], b[1]}};
    gradops_host::warp_collective(mine, "mma.sync executed by a partial warp",
                                  [&](const gradops_host::MmaOperands* all, int l) {
        float A[16][8], B[8][8];
        for (int q = 0; q < gradops_host::kWarpSize; ++q) {
            const int g = q / 4, t = q % 4;
            for (int r = 0; r < 4; ++r) A[g + 8 * (r % 2)][t + 4 * (r / 2)] = gradops_host::tf32_operand(all[q].a[r]);
            for (int r = 0; r < 2; ++r) B[t + 4 * r][g] = gradops_host::tf32_operand(all[q].b[r]);
        }
        gradops_host::mma_lane_result<8>(A, B, l, d, c);
    }, gradops_host::call_site());
}

// cp.async.cg.shared.global [dst], [src], 16, (fill ? 16 : 0): queued; lands at wait_group.
inline void cp_async_16(void* dst, const void* src, bool fill) {
    if (reinterpret_cast<std::uintptr_t>(dst) % 16 || (fill && reinterpret_cast<std::uintptr_t>(src) % 16))
        gradops_host::fail("cp.async: a 16-byte copy with an address that is not 16-byte aligned");
    gradops_host::Scheduler& s = gradops_host::scheduler();
    s.fibers[s.current].copies_open.push_back({dst, src, fill ? 16 : 0});
    if (fill) gradops_host::check_guards(src, 16, false);  // the global read, which memcpy makes unseen
    gradops_host::race_access(dst, 16, true);  // it may land at any time until its wait_group
    gradops_host::count_access(dst, gradops_host::CP_ASYNC);
}

inline void cp_async_commit_group() {
    gradops_host::Fiber& f = gradops_host::scheduler().fibers[gradops_host::scheduler().current];
    f.copy_groups.push_back(std::move(f.copies_open));
    f.copies_open.clear();
}

// Every committed group but the newest N lands now, oldest first.  Until then the destination
// keeps what it held, so a kernel that reads before waiting reads stale data, as it may on a GPU.
template <int N> inline void cp_async_wait_group() {
    static_assert(N >= 0, "wait_group takes a non-negative constant");
    gradops_host::Fiber& f = gradops_host::scheduler().fibers[gradops_host::scheduler().current];
    while (static_cast<int>(f.copy_groups.size()) > N) {
        for (const gradops_host::AsyncCopy& c : f.copy_groups.front()) {
            gradops_host::race_access(c.dst, 16, true);
            if (c.src_bytes) std::memcpy(c.dst, c.src, c.src_bytes);
            std::memset(static_cast<unsigned char*>(c.dst) + c.src_bytes, 0, 16 - c.src_bytes);
        }
        f.copy_groups.pop_front();
    }
}

// st.shared.v4.b32: the store lands at once; counted (gradops_host::count_access).
inline void st_shared_16(void* dst, const void* src) {
    if (reinterpret_cast<std::uintptr_t>(dst) % 16)
        gradops_host::fail("st.shared.v4: a 16-byte store to an address that is not 16-byte aligned");
    gradops_host::race_access(dst, 16, true);
    std::memcpy(dst, src, 16);
    gradops_host::count_access(dst, gradops_host::STORE_16);
}

// @p st.shared.v4.b32: as st_shared_16 where ``store`` holds; where not, nothing is stored or
// checked and the lane takes part in the warp-level store's count as an idle lane.
inline void st_shared_16_if(void* dst, const void* src, bool store) {
    if (store)
        st_shared_16(dst, src);
    else
        gradops_host::count_access(nullptr, gradops_host::STORE_16);
}

// ld.shared of a V (4 or 16 bytes) at src (V-aligned, else the launch fails naming ``what``) as
// it is now; counted under ``kind`` (gradops_host::count_access).
template <typename V> inline V ld_shared(const void* src, gradops_host::SharedKind kind, const char* what) {
    static_assert(sizeof(V) == 4 || sizeof(V) == 16, "the widths the kernels load");
    if (reinterpret_cast<std::uintptr_t>(src) % sizeof(V)) gradops_host::fail(what);
    V v;
    gradops_host::race_access(src, sizeof(V), false);
    std::memcpy(&v, src, sizeof(V));
    gradops_host::count_access(src, kind, sizeof(V));
    return v;
}

// ld.shared.b32: the 4 bytes at src (4-byte aligned), as raw bits.
inline unsigned ld_shared_32(const void* src) {
    return ld_shared<unsigned>(src, gradops_host::LOAD_4,
                               "ld.shared.b32: a 4-byte load from an address that is not 4-byte aligned");
}

// ld.volatile.shared.b32: on the host the same as ld_shared_32 (what .volatile changes is only
// what the compiler may do with the load).
inline unsigned ld_shared_32_volatile(const void* src) { return ld_shared_32(src); }

// ld.shared.v4.f32: the 16 bytes at src (16-byte aligned).
inline float4 ld_shared_16(const void* src) {
    return ld_shared<float4>(src, gradops_host::LOAD_16,
                             "ld.shared.v4: a 16-byte load from an address that is not 16-byte aligned");
}

// cvt.rna.tf32.f32 on a float's bits: rounded to 10 mantissa bits, ties away from zero (the
// low 13 bits cleared); Inf and NaN pass unchanged.
inline unsigned round_tf32(unsigned bits) {
    if ((bits & 0x7f800000u) == 0x7f800000u) return bits;
    return (bits + 0x1000u) & 0xffffe000u;
}

}  // namespace ptx
}  // namespace gradops

#ifdef GRADOPS_HOST_RACECHECK
// -fsanitize=thread's entry points (see "racecheck"): only accesses to registered shared memory
// are looked at; the others return at the first comparison.
extern "C" {
GRADOPS_HOST_UNCHECKED void gradops_register_shared(const void* p, std::size_t n, const char* name) {
    using namespace gradops_host;
    const std::uintptr_t begin = reinterpret_cast<std::uintptr_t>(p);
    std::size_t i = 0;  // kept sorted by address, for race_access's search
    while (i < race_state.ranges.size() && race_state.ranges[i].begin < begin) ++i;
    if (i < race_state.ranges.size() && race_state.ranges[i].begin == begin) return;  // the library loaded again
    race_state.ranges.insert(race_state.ranges.begin() + static_cast<std::ptrdiff_t>(i), {begin, begin + n, strdup(name)});
    race_state.shadow.emplace(race_state.shadow.begin() + static_cast<std::ptrdiff_t>(i));  // sized at first use
    race_low = std::min(race_low, begin);
    race_high = std::max(race_high, begin + n);
}
GRADOPS_HOST_UNCHECKED long long gradops_race_accesses() { return gradops_host::race_state.accesses; }
GRADOPS_HOST_UNCHECKED void __tsan_init() {}
GRADOPS_HOST_UNCHECKED void __tsan_func_entry(void*) {}
GRADOPS_HOST_UNCHECKED void __tsan_func_exit() {}
GRADOPS_HOST_UNCHECKED void __tsan_vptr_update(void**, void*) {}
GRADOPS_HOST_UNCHECKED void __tsan_vptr_read(void**) {}
GRADOPS_HOST_UNCHECKED void gradops_set_allocations(const unsigned long long* bounds, long long count) {
    using namespace gradops_host;
    allocations.clear();
    guard_low = ~std::uintptr_t(0), guard_high = 0;
    for (long long i = 0; i < count; ++i) {
        const unsigned long long* b = bounds + 4 * i;
        allocations.push_back({b[0], b[1], b[2], b[3]});
        guard_low = std::min<std::uintptr_t>(guard_low, b[0]);
        guard_high = std::max<std::uintptr_t>(guard_high, b[3]);
    }
    std::sort(allocations.begin(), allocations.end(),
              [](const Allocation& a, const Allocation& b) { return a.buffer_begin < b.buffer_begin; });
}
GRADOPS_HOST_UNCHECKED void __tsan_read_range(void* p, std::size_t n) {
    gradops_host::check_guards(p, n, false);
    gradops_host::race_access(p, n, false);
}
GRADOPS_HOST_UNCHECKED void __tsan_write_range(void* p, std::size_t n) {
    gradops_host::check_guards(p, n, true);
    gradops_host::race_access(p, n, true);
}
// The aligned hooks also check the alignment g++ assumed from the access's type (its
// unaligned ones are called where g++ knows less): a GPU faults on an N-byte access (LDG, STG,
// LDS, STS of N bytes) whose address is not a multiple of N, a CPU does not.
#define GRADOPS_HOST_TSAN_WIDTH(N)                                                                          \
    GRADOPS_HOST_UNCHECKED void __tsan_read##N(void* p) {                                                   \
        gradops_host::check_access_alignment(p, N);                                                         \
        gradops_host::check_guards(p, N, false);                                                            \
        gradops_host::race_access(p, N, false);                                                             \
    }                                                                                                       \
    GRADOPS_HOST_UNCHECKED void __tsan_write##N(void* p) {                                                  \
        gradops_host::check_access_alignment(p, N);                                                         \
        gradops_host::check_guards(p, N, true);                                                             \
        gradops_host::race_access(p, N, true);                                                              \
    }                                                                                                       \
    GRADOPS_HOST_UNCHECKED void __tsan_unaligned_read##N(void* p) {                                         \
        gradops_host::check_guards(p, N, false);                                                            \
        gradops_host::race_access(p, N, false);                                                             \
    }                                                                                                       \
    GRADOPS_HOST_UNCHECKED void __tsan_unaligned_write##N(void* p) {                                        \
        gradops_host::check_guards(p, N, true);                                                             \
        gradops_host::race_access(p, N, true);                                                              \
    }
GRADOPS_HOST_TSAN_WIDTH(1)
GRADOPS_HOST_TSAN_WIDTH(2)
GRADOPS_HOST_TSAN_WIDTH(4)
GRADOPS_HOST_TSAN_WIDTH(8)
GRADOPS_HOST_TSAN_WIDTH(16)
#undef GRADOPS_HOST_TSAN_WIDTH
// Atomic loads and stores (g++ emits them for the guard variables of function-local statics):
// the fibers share one OS thread, so plain ones; never on shared memory.
#define GRADOPS_HOST_TSAN_ATOMIC(N, TYPE)                                                             \
    GRADOPS_HOST_UNCHECKED TYPE __tsan_atomic##N##_load(const volatile TYPE* p, int) { return *p; } \
    GRADOPS_HOST_UNCHECKED void __tsan_atomic##N##_store(volatile TYPE* p, TYPE v, int) { *p = v; }
GRADOPS_HOST_TSAN_ATOMIC(8, std::uint8_t)
GRADOPS_HOST_TSAN_ATOMIC(16, std::uint16_t)
GRADOPS_HOST_TSAN_ATOMIC(32, std::uint32_t)
GRADOPS_HOST_TSAN_ATOMIC(64, std::uint64_t)
#undef GRADOPS_HOST_TSAN_ATOMIC
GRADOPS_HOST_UNCHECKED void __tsan_atomic_thread_fence(int) {}
GRADOPS_HOST_UNCHECKED void __tsan_atomic_signal_fence(int) {}
}
#endif

#pragma GCC visibility pop
