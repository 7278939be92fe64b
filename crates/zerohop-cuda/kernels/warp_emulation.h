// Runs xxh3.cu on the host for tests: each of a warp's 32 lanes is a thread,
// and shuffles meet at a barrier. Only the tests include this.
#include <barrier>
#include <cstdint>

#define __global__
#define __device__
#define __constant__

namespace emulation {
inline thread_local unsigned lane;
inline thread_local unsigned long long warp;
inline std::barrier<>* meet;
inline unsigned long long slots[32];

inline unsigned long long exchange(unsigned long long v, unsigned src) {
    meet->arrive_and_wait();
    slots[lane] = v;
    meet->arrive_and_wait();
    unsigned long long got = slots[src];
    meet->arrive_and_wait();
    return got;
}
}  // namespace emulation

static unsigned lane_id() { return emulation::lane; }
static unsigned long long global_warp() { return emulation::warp; }
static unsigned long long shfl_xor64(unsigned long long v, int mask) {
    return emulation::exchange(v, emulation::lane ^ (unsigned)mask);
}
static unsigned long long shfl64(unsigned long long v, int src) {
    return emulation::exchange(v, (unsigned)src);
}
static unsigned long long mul_hi64(unsigned long long a, unsigned long long b) {
    return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}
