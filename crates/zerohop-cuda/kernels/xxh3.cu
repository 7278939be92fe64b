// XXH3-64 (seed 0, default secret) of checkpoint chunks, on the GPU, so a
// save never reads its bytes with the CPU. One warp hashes one chunk; a chunk
// is the concatenation of device byte ranges ("pieces") and is longer than
// 240 bytes (shorter inputs take other XXH3 paths; the host hashes those).
//
// XXH3's long loop keeps eight 64-bit lanes that never mix until the final
// merge, and a lane's update within a block of 16 stripes is a plain sum. So
// lane j's block sum is split over four threads (stripes g, g+4, g+8, g+12)
// and added up with two shuffles; the scramble after each block runs on
// every thread of the lane. The values are XXH3's exactly: the host checks
// each of them when the checkpoint is restored or verified.
//
// Regenerate xxh3.ptx with scripts/build-kernels.sh. The same source runs on
// the host with emulated warps in the tests (ZEROHOP_HOST_EMULATION,
// host_harness.cc).

typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned char u8;

// Under ZEROHOP_HOST_EMULATION the test harness (host_harness.cc) has
// defined these with emulated warps before including this file.
#ifndef ZEROHOP_HOST_EMULATION
#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
#define __constant__ __attribute__((constant))
static __device__ u32 lane_id() { return __nvvm_read_ptx_sreg_laneid(); }
static __device__ u64 global_warp() {
    return ((u64)__nvvm_read_ptx_sreg_ctaid_x() * __nvvm_read_ptx_sreg_ntid_x() +
            __nvvm_read_ptx_sreg_tid_x()) / 32;
}
static __device__ u64 shfl_xor64(u64 v, int mask) {
    u32 lo = __nvvm_shfl_sync_bfly_i32(0xffffffffu, (u32)v, mask, 0x1f);
    u32 hi = __nvvm_shfl_sync_bfly_i32(0xffffffffu, (u32)(v >> 32), mask, 0x1f);
    return ((u64)hi << 32) | lo;
}
static __device__ u64 shfl64(u64 v, int src) {
    u32 lo = __nvvm_shfl_sync_idx_i32(0xffffffffu, (u32)v, src, 0x1f);
    u32 hi = __nvvm_shfl_sync_idx_i32(0xffffffffu, (u32)(v >> 32), src, 0x1f);
    return ((u64)hi << 32) | lo;
}
static __device__ u64 mul_hi64(u64 a, u64 b) { return __nvvm_mulhi_ull(a, b); }
#endif

// A byte range of device memory at `start` within its chunk.
struct Piece {
    u64 addr;
    u64 start;
    u64 len;
};

// A chunk: `count` pieces from `first`, in order, `len` bytes in all.
struct Job {
    u64 len;
    u64 first;
    u64 count;
};

static __constant__ u8 SECRET[192] = {
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
    0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
    0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
    0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
    0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
    0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
    0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
    0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
    0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
    0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
    0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
    0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
};

#define PRIME32_1 0x9E3779B1ull
#define PRIME32_2 0x85EBCA77ull
#define PRIME32_3 0xC2B2AE3Dull
#define PRIME64_1 0x9E3779B185EBCA87ull
#define PRIME64_2 0xC2B2AE3D27D4EB4Full
#define PRIME64_3 0x165667B19E3779F9ull
#define PRIME64_4 0x85EBCA77C2B2AE63ull
#define PRIME64_5 0x27D4EB2F165667C5ull

// Little-endian 64-bit word of the secret at any byte offset.
static __device__ u64 secret64(u32 at) {
    u64 v = 0;
    for (int k = 7; k >= 0; k--) v = (v << 8) | SECRET[at + k];
    return v;
}

// Reads a chunk through its pieces; each thread keeps its own position.
struct Cursor {
    const struct Piece* pieces;
    u64 count;
    u64 i;
};

static __device__ const struct Piece* seek(struct Cursor* c, u64 off) {
    while (c->i + 1 < c->count && off >= c->pieces[c->i].start + c->pieces[c->i].len) c->i++;
    while (c->i > 0 && off < c->pieces[c->i].start) c->i--;
    return &c->pieces[c->i];
}

// The little-endian word at chunk offset `off`. Inside one piece it takes
// the aligned words holding it (each holds a byte of the piece, so it lies
// in a mapped page); across pieces, byte by byte.
static __device__ u64 load64(struct Cursor* c, u64 off) {
    const struct Piece* p = seek(c, off);
    if (off + 8 <= p->start + p->len) {
        u64 a = p->addr + (off - p->start);
        u32 shift = (u32)(a & 7) * 8;
        const u64* w = (const u64*)(a & ~7ull);
        if (shift == 0) return w[0];
        return (w[0] >> shift) | (w[1] << (64 - shift));
    }
    u64 v = 0;
    for (u32 k = 0; k < 8; k++) {
        const struct Piece* q = seek(c, off + k);
        v |= (u64) * (const u8*)(q->addr + (off + k - q->start)) << (8 * k);
    }
    return v;
}

// Lane j's share of one stripe: input words j^1 and j, secret word `key`.
static __device__ u64 stripe_lane(struct Cursor* c, u64 stripe_at, u32 j, u64 key) {
    u64 swapped = load64(c, stripe_at + 8 * (j ^ 1));
    u64 dk = load64(c, stripe_at + 8 * j) ^ key;
    return swapped + (dk & 0xffffffffull) * (dk >> 32);
}

static __device__ u64 fold_mul128(u64 a, u64 b) { return a * b ^ mul_hi64(a, b); }

extern "C" __global__ void zerohop_xxh3_64(const struct Job* jobs, u64 njobs,
                                           const struct Piece* pieces, u64* out) {
    u64 w = global_warp();
    if (w >= njobs) return;  // uniform across the warp
    struct Job job = jobs[w];
    struct Cursor c = {pieces + job.first, job.count, 0};
    u32 t = lane_id(), j = t & 7, g = t >> 3;
    const u64 init[8] = {PRIME32_3, PRIME64_1, PRIME64_2, PRIME64_3,
                         PRIME64_4, PRIME32_2, PRIME64_5, PRIME32_1};
    u64 acc = init[j];
    u64 key[4];
    #pragma unroll
    for (u32 q = 0; q < 4; q++) key[q] = secret64(8 * (g + 4 * q + j));
    u64 scramble = secret64(128 + 8 * j);

    u64 blocks = (job.len - 1) / 1024;
    for (u64 b = 0; b < blocks; b++) {
        u64 sum = 0;
        #pragma unroll
        for (u32 q = 0; q < 4; q++) sum += stripe_lane(&c, b * 1024 + 64 * (g + 4 * q), j, key[q]);
        sum += shfl_xor64(sum, 8);
        sum += shfl_xor64(sum, 16);
        acc += sum;
        acc ^= acc >> 47;
        acc ^= scramble;
        acc *= PRIME32_1;
    }
    u64 stripes = ((job.len - 1) - blocks * 1024) / 64;
    u64 sum = 0;
    #pragma unroll
    for (u32 q = 0; q < 4; q++)
        if (g + 4 * q < stripes) sum += stripe_lane(&c, blocks * 1024 + 64 * (g + 4 * q), j, key[q]);
    sum += shfl_xor64(sum, 8);
    sum += shfl_xor64(sum, 16);
    acc += sum + stripe_lane(&c, job.len - 64, j, secret64(121 + 8 * j));

    u64 lanes[8];
    #pragma unroll
    for (u32 i = 0; i < 8; i++) lanes[i] = shfl64(acc, i);
    if (t != 0) return;
    u64 h = job.len * PRIME64_1;
    #pragma unroll
    for (u32 i = 0; i < 4; i++)
        h += fold_mul128(lanes[2 * i] ^ secret64(11 + 16 * i), lanes[2 * i + 1] ^ secret64(19 + 16 * i));
    h ^= h >> 37;
    h *= 0x165667919E3779F9ull;
    h ^= h >> 32;
    out[w] = h;
}
