// Test driver for xxh3.cu under warp emulation. stdin: one chunk per line,
// "OFFSET:LEN ..." pieces taken from the bytes of the file named by argv[1];
// stdout: each chunk's hash in hex. Pieces may start at any byte, so the
// kernel's unaligned and cross-piece loads are exercised.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

// xxh3.cu on the host: each of a warp's 32 lanes is a thread, and
// shuffles meet at a barrier.
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

#define ZEROHOP_HOST_EMULATION
#include "xxh3.cu"

int main(int argc, char** argv) {
    if (argc != 2) return 2;
    std::ifstream f(argv[1], std::ios::binary);
    std::vector<unsigned char> data((std::istreambuf_iterator<char>(f)), {});
    std::vector<Job> jobs;
    std::vector<Piece> pieces;
    std::string line;
    while (std::getline(std::cin, line)) {
        std::istringstream words(line);
        std::string word;
        Job job = {0, pieces.size(), 0};
        while (words >> word) {
            u64 off = std::stoull(word.substr(0, word.find(':')));
            u64 len = std::stoull(word.substr(word.find(':') + 1));
            if (off + len > data.size()) return 3;
            pieces.push_back({(u64)(data.data() + off), job.len, len});
            job.len += len;
            job.count++;
        }
        jobs.push_back(job);
    }
    std::vector<u64> out(jobs.size());
    std::barrier<> meet(32);
    emulation::meet = &meet;
    for (u64 w = 0; w < jobs.size(); w++) {
        std::vector<std::thread> lanes;
        for (unsigned t = 0; t < 32; t++)
            lanes.emplace_back([&, t, w] {
                emulation::lane = t;
                emulation::warp = w;
                zerohop_xxh3_64(jobs.data(), jobs.size(), pieces.data(), out.data());
            });
        for (auto& l : lanes) l.join();
    }
    for (u64 h : out) std::printf("%016llx\n", h);
}
