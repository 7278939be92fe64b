// What one large file costs to write, and what pinned staging costs to
// allocate, on the machine it runs on: the two costs behind a save of one
// large buffer and behind a first load's setup.
//
// Writes (8 GiB to DIR on a memory file system, 4 GiB to DISK):
//   pwrite from 1 thread into one file; from 16 threads into one file;
//   from 16 threads into 16 files (the raw parallel write); 16 threads
//   copying into a shared mapping of one file, with and without
//   MADV_POPULATE_WRITE first; O_DIRECT from 16 threads into one disk file,
//   sized with ftruncate or with fallocate, and into 16 disk files.
// Pinning: cuMemHostAlloc of 32 x 4 MiB from one thread, of 2 x 4 MiB from
// each of 16 threads at once, of one 128 MiB block; cuMemHostRegister of
// memory already touched. A staging pool's block (128 MiB on huge pages):
// made present by 8 threads (MADV_POPULATE_WRITE, or a write per page),
// registered in one call or in pieces of 16
// MiB (when each piece is ready), and whether host-to-device copies on
// another thread slow down while it is registered, or device allocations
// (cuMemAlloc) while it is made present or registered.
//
//   gcc -O2 -pthread -o write_and_pin bench/probe/write_and_pin.c -ldl
//   ./write_and_pin /dev/shm /var/tmp [GIB]
//   ./write_and_pin --pin-only
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "probe.h"

#define CHUNK (4UL << 20)
#define THREADS 16

// One source buffer per thread (2 chunks), filled with bytes that differ.
static uint8_t *src[THREADS];

enum mode { W_PWRITE, W_MAP_POPULATE, W_MAP_FAULT, W_DIRECT };

struct job {
    int files;
    int fds[THREADS];
    uint8_t *maps[THREADS];
    uint64_t bytes;  // per file
    int threads;
    enum mode mode;
    int id;
};

// Thread `id` writes file id % files, sharing it with the other threads of
// that file chunk by chunk (chunk k to the (k % sharing)-th of them).
static void *writer(void *arg) {
    struct job *j = arg;
    int f = j->id % j->files, sharing = j->threads / j->files, mine = j->id / j->files;
    int fd = j->fds[f];
    uint8_t *map = j->maps[f];
    uint64_t chunks = j->bytes / CHUNK;
    for (uint64_t k = mine; k < chunks; k += sharing) {
        uint8_t *from = src[j->id] + (k & 1) * CHUNK;
        off_t at = k * CHUNK;
        if (j->mode == W_PWRITE || j->mode == W_DIRECT) {
            if (pwrite(fd, from, CHUNK, at) != (ssize_t)CHUNK) die("pwrite");
        } else {
            if (j->mode == W_MAP_POPULATE && madvise(map + at, CHUNK, MADV_POPULATE_WRITE)) die("madvise");
            memcpy(map + at, from, CHUNK);
        }
    }
    return NULL;
}

static void run(const char *label, const char *dir, uint64_t bytes, int threads, int files,
                enum mode mode, int prealloc) {
    struct job jobs[THREADS];
    pthread_t tids[THREADS];
    char path[512];
    int fds[THREADS];
    uint8_t *maps[THREADS] = {0};
    int flags = O_RDWR | O_CREAT | O_TRUNC | (mode == W_DIRECT ? O_DIRECT : 0);
    double t0 = now();
    for (int f = 0; f < files; f++) {
        snprintf(path, sizeof path, "%s/zerohop-probe-%d-%d", dir, getpid(), f);
        fds[f] = open(path, flags, 0600);
        if (fds[f] < 0) die(path);
        unlink(path);
        if (prealloc ? fallocate(fds[f], 0, 0, bytes) : ftruncate(fds[f], bytes)) die("size");
        if (mode == W_MAP_POPULATE || mode == W_MAP_FAULT) {
            maps[f] = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fds[f], 0);
            if (maps[f] == MAP_FAILED) die("mmap");
        }
    }
    double t1 = now();
    for (int i = 0; i < threads; i++) {
        jobs[i] = (struct job){.files = files, .bytes = bytes, .threads = threads, .mode = mode, .id = i};
        memcpy(jobs[i].fds, fds, sizeof fds);
        memcpy(jobs[i].maps, maps, sizeof maps);
        pthread_create(&tids[i], NULL, writer, &jobs[i]);
    }
    for (int i = 0; i < threads; i++) pthread_join(tids[i], NULL);
    double t2 = now();
    for (int f = 0; f < files; f++)
        if (fdatasync(fds[f])) die("fdatasync");
    double t3 = now();
    uint64_t total = bytes * (uint64_t)files;
    printf("%-44s %6.2f GB/s  (%.3f s: size %.3f, write %.3f, sync %.3f)\n", label,
           total / (t3 - t0) / 1e9, t3 - t0, t1 - t0, t2 - t1, t3 - t2);
    fflush(stdout);
    for (int f = 0; f < files; f++) {
        if (maps[f]) munmap(maps[f], bytes);
        close(fds[f]);
    }
}

// --- pinning, through the driver API loaded at run time ---
typedef int (*fn_init)(unsigned);
typedef int (*fn_dev)(int *, int);
typedef int (*fn_retain)(void **, int);
typedef int (*fn_set)(void *);
typedef int (*fn_halloc)(void **, size_t, unsigned);
typedef int (*fn_hfree)(void *);
typedef int (*fn_hreg)(void *, size_t, unsigned);
typedef int (*fn_hunreg)(void *);
typedef int (*fn_malloc)(unsigned long long *, size_t);
typedef int (*fn_free)(unsigned long long);
typedef int (*fn_stream)(void **, unsigned);
typedef int (*fn_h2d)(unsigned long long, const void *, size_t, void *);
typedef int (*fn_sync)(void *);
static fn_malloc cu_malloc;
static fn_free cu_free;
static fn_stream cu_stream;
static fn_h2d cu_h2d;
static fn_sync cu_sync;
static fn_set cu_set;
static fn_halloc cu_halloc;
static fn_hfree cu_hfree;
static fn_hreg cu_hreg;
static fn_hunreg cu_hunreg;
static void *ctx;

// How a slot is pinned: the driver's allocation, or an anonymous mapping
// registered (untouched, populated first, or populated as huge pages).
enum pin_way { P_ALLOC, P_REGISTER, P_POPULATE_REGISTER, P_HUGE_POPULATE_REGISTER };

struct pin_job {
    int count;
    size_t len;
    enum pin_way way;
    void *out[64];
};

static void *pinner(void *arg) {
    struct pin_job *p = arg;
    cu_set(ctx);
    for (int i = 0; i < p->count; i++) {
        if (p->way == P_ALLOC) {
            if (cu_halloc(&p->out[i], p->len, 0)) die("cuMemHostAlloc");
            continue;
        }
        uint8_t *m = mmap(NULL, p->len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) die("mmap");
        if (p->way == P_HUGE_POPULATE_REGISTER) madvise(m, p->len, MADV_HUGEPAGE);
        if (p->way != P_REGISTER && madvise(m, p->len, MADV_POPULATE_WRITE)) die("populate");
        if (cu_hreg(m, p->len, 1 /* portable */)) die("cuMemHostRegister");
        p->out[i] = m;
    }
    return NULL;
}

static void unpin(struct pin_job *p) {
    for (int k = 0; k < p->count; k++) {
        if (p->way == P_ALLOC) {
            cu_hfree(p->out[k]);
        } else {
            cu_hunreg(p->out[k]);
            munmap(p->out[k], p->len);
        }
    }
}

static void pin(const char *label, int threads, int per_thread, size_t len, enum pin_way way) {
    struct pin_job jobs[THREADS];
    pthread_t tids[THREADS];
    double t0 = now();
    for (int i = 0; i < threads; i++) {
        jobs[i] = (struct pin_job){.count = per_thread, .len = len, .way = way};
        pthread_create(&tids[i], NULL, pinner, &jobs[i]);
    }
    for (int i = 0; i < threads; i++) pthread_join(tids[i], NULL);
    double t1 = now();
    printf("%-44s %7.1f ms  (%d MiB)\n", label, (t1 - t0) * 1e3,
           (int)(threads * per_thread * len >> 20));
    fflush(stdout);
    for (int i = 0; i < threads; i++) unpin(&jobs[i]);
}

// --- a staging pool's block: populated in parallel, registered whole or in pieces ---
#define POOL (128UL << 20)
#define PIECE (16UL << 20)

struct populate_job {
    uint8_t *at;
    size_t len, call;
};

// `call` bytes per madvise(MADV_POPULATE_WRITE), or, with `call` 0, a
// byte written per page (faults, which take only the mapping's own lock
// where the kernel has per-mapping fault locks, not the whole process's).
static void *populater(void *arg) {
    struct populate_job *p = arg;
    if (p->call == 0) {
        for (size_t at = 0; at < p->len; at += 4096) ((volatile uint8_t *)p->at)[at] = 0;
        return NULL;
    }
    for (size_t at = 0; at < p->len; at += p->call)
        if (madvise(p->at + at, p->call, MADV_POPULATE_WRITE)) die("populate");
    return NULL;
}

// A fresh 128 MiB mapping (on huge pages, or small ones), made present by 8
// threads, `call` bytes per madvise (0: by touching each page).
static uint8_t *pool_pages(double *populate_ms, int huge, size_t call) {
    uint8_t *m = mmap(NULL, POOL, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) die("mmap");
    madvise(m, POOL, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    struct populate_job jobs[8];
    pthread_t tids[8];
    double t0 = now();
    for (int i = 0; i < 8; i++) {
        jobs[i] = (struct populate_job){m + i * (POOL / 8), POOL / 8, call};
        pthread_create(&tids[i], NULL, populater, &jobs[i]);
    }
    for (int i = 0; i < 8; i++) pthread_join(tids[i], NULL);
    *populate_ms = (now() - t0) * 1e3;
    return m;
}

static uint8_t *pool_block(double *populate_ms) { return pool_pages(populate_ms, 1, POOL / 8); }

// Registers `m` in pieces of `piece`; the time each is ready, from the start.
static void register_pieces(uint8_t *m, size_t piece, double *ready_ms) {
    double t0 = now();
    for (size_t at = 0, k = 0; at < POOL; at += piece, k++) {
        if (cu_hreg(m + at, piece, 1)) die("cuMemHostRegister");
        ready_ms[k] = (now() - t0) * 1e3;
    }
}

static void unregister_pieces(uint8_t *m, size_t piece) {
    for (size_t at = 0; at < POOL; at += piece) cu_hunreg(m + at);
    munmap(m, POOL);
}

// Copies on another thread: 4 MiB host-to-device copies of one pinned
// buffer, synchronized every 16, with the time of each synchronization.
struct copier {
    volatile int stop;
    int n;
    double at[100000];
};

static void *copy_loop(void *arg) {
    struct copier *c = arg;
    cu_set(ctx);
    void *stream, *src;
    unsigned long long dst;
    if (cu_stream(&stream, 1) || cu_halloc(&src, 64UL << 20, 0) || cu_malloc(&dst, 64UL << 20))
        die("copier setup");
    while (!c->stop && c->n < 100000) {
        for (int i = 0; i < 16; i++)
            if (cu_h2d(dst + (i % 16) * CHUNK, (uint8_t *)src + (i % 16) * CHUNK, CHUNK, stream)) die("copy");
        if (cu_sync(stream)) die("sync");
        c->at[c->n++] = now();
    }
    cu_hfree(src);
    return NULL;
}

// GB/s of the copier's rounds that ended inside [from, to].
static double copy_rate(struct copier *c, double from, double to) {
    int first = -1, last = -1;
    for (int i = 0; i < c->n; i++) {
        if (c->at[i] >= from && first < 0) first = i;
        if (c->at[i] <= to) last = i;
    }
    if (first < 0 || last <= first) return 0.0;
    return (last - first) * 16.0 * CHUNK / (c->at[last] - c->at[first]) / 1e9;
}

// A framework allocating a model's device memory: 8 x 1 GiB, in ms (freed
// after).
static double device_allocations(void) {
    unsigned long long d[8];
    double t0 = now();
    for (int i = 0; i < 8; i++)
        if (cu_malloc(&d[i], 1UL << 30)) die("cuMemAlloc");
    double ms = (now() - t0) * 1e3;
    for (int i = 0; i < 8; i++) cu_free(d[i]);
    return ms;
}

// A pool made ready beside those allocations: made present by 8 threads
// (in 2 MiB madvise calls, or by touching its pages), or registered in
// pieces (`call` -1).
struct beside {
    long call;
    uint8_t *m;
    double ms;
};

static void *pool_beside(void *arg) {
    struct beside *b = arg;
    cu_set(ctx);
    double t0 = now(), ready[64];
    if (b->call < 0)
        register_pieces(b->m, PIECE, ready);
    else
        b->m = pool_pages(&b->ms, 1, (size_t)b->call);
    b->ms = (now() - t0) * 1e3;
    return NULL;
}

// The allocations' ms while `b` runs on another thread; `b->ms` its own.
static double allocations_while(struct beside *b) {
    pthread_t tid;
    pthread_create(&tid, NULL, pool_beside, b);
    usleep(300);
    double ms = device_allocations();
    pthread_join(tid, NULL);
    return ms;
}

// Whether a pool being made ready holds up another thread's device
// allocations: alone, while the pool is made present each way, while it
// is registered.
static void allocations_beside_pool(int round) {
    double alone = device_allocations();
    struct beside madvised = {2L << 20, NULL, 0}, touched = {0, NULL, 0};
    double during_madvise = allocations_while(&madvised);
    munmap(madvised.m, POOL);
    double during_touch = allocations_while(&touched);
    struct beside registered = {-1, touched.m, 0};
    double during_register = allocations_while(&registered);
    unregister_pieces(touched.m, PIECE);
    printf("pool: cuMemAlloc 8 x 1 GiB (round %d): alone %.1f ms; while a pool is made present by "
           "madvise %.1f ms (it took %.1f ms), by touching %.1f ms (it took %.1f ms); while registered in "
           "pieces %.1f ms (it took %.1f ms)\n",
           round, alone, during_madvise, madvised.ms, during_touch, touched.ms, during_register,
           registered.ms);
    fflush(stdout);
}

static void staging_pool(int round) {
    allocations_beside_pool(round);
    double populate_ms, ready[64];
    uint8_t *m = pool_block(&populate_ms);
    register_pieces(m, POOL, ready);
    printf("pool: populate 128 MiB, 8 threads (round %d)  %7.1f ms\n", round, populate_ms);
    printf("pool: register 128 MiB, one call (round %d)    %7.1f ms\n", round, ready[0]);
    unregister_pieces(m, POOL);
    m = pool_pages(&populate_ms, 1, 2UL << 20);
    printf("pool: populate 128 MiB in 2 MiB calls, 8 threads (round %d)  %7.1f ms\n", round, populate_ms);
    munmap(m, POOL);
    m = pool_pages(&populate_ms, 1, 0);
    printf("pool: populate 128 MiB by touching its pages, 8 threads (round %d)  %7.1f ms\n", round, populate_ms);
    munmap(m, POOL);
    m = pool_pages(&populate_ms, 0, POOL / 8);
    register_pieces(m, POOL, ready);
    printf("pool: small pages: populate 128 MiB, 8 threads %.1f ms, register %.1f ms (round %d)\n",
           populate_ms, ready[0], round);
    unregister_pieces(m, POOL);
    m = pool_block(&populate_ms);
    register_pieces(m, PIECE, ready);
    printf("pool: register 8 x 16 MiB (round %d): first %.1f ms, all %.1f ms\n", round, ready[0],
           ready[POOL / PIECE - 1]);
    unregister_pieces(m, PIECE);
    // Copies alone, then while a pool is registered in pieces.
    static struct copier c;
    c.stop = 0;
    c.n = 0;
    pthread_t tid;
    pthread_create(&tid, NULL, copy_loop, &c);
    usleep(60000);
    m = pool_block(&populate_ms);
    double t0 = now();
    register_pieces(m, PIECE, ready);
    double t1 = now();
    usleep(40000);
    c.stop = 1;
    pthread_join(tid, NULL);
    printf("pool: copies on another thread (round %d): %.1f GB/s before, %.1f GB/s while registering "
           "(%.1f ms), %.1f GB/s after\n",
           round, copy_rate(&c, t0 - 0.04, t0), copy_rate(&c, t0, t1), (t1 - t0) * 1e3,
           copy_rate(&c, t1, t1 + 0.04));
    fflush(stdout);
    unregister_pieces(m, PIECE);
}

static int pinning(int pool_only) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) {
        printf("pinning: skipped (no libcuda.so.1)\n");
        return 0;
    }
    fn_init init = (fn_init)dlsym(lib, "cuInit");
    fn_dev dev = (fn_dev)dlsym(lib, "cuDeviceGet");
    fn_retain retain = (fn_retain)dlsym(lib, "cuDevicePrimaryCtxRetain");
    cu_set = (fn_set)dlsym(lib, "cuCtxSetCurrent");
    cu_halloc = (fn_halloc)dlsym(lib, "cuMemHostAlloc");
    cu_hfree = (fn_hfree)dlsym(lib, "cuMemFreeHost");
    cu_hreg = (fn_hreg)dlsym(lib, "cuMemHostRegister_v2");
    cu_hunreg = (fn_hunreg)dlsym(lib, "cuMemHostUnregister");
    cu_malloc = (fn_malloc)dlsym(lib, "cuMemAlloc_v2");
    cu_free = (fn_free)dlsym(lib, "cuMemFree_v2");
    cu_stream = (fn_stream)dlsym(lib, "cuStreamCreate");
    cu_h2d = (fn_h2d)dlsym(lib, "cuMemcpyHtoDAsync_v2");
    cu_sync = (fn_sync)dlsym(lib, "cuStreamSynchronize");
    int d;
    double t0 = now();
    if (init(0) || dev(&d, 0) || retain(&ctx, d) || cu_set(ctx)) die("CUDA context");
    printf("%-44s %7.1f ms\n", "context (no other user of the GPU)", (now() - t0) * 1e3);
    for (int round = 0; round < 3; round++) staging_pool(round);
    if (pool_only) return 0;
    for (int round = 0; round < 2; round++) {
        printf("-- pinning, round %d\n", round);
        static const char *ways[] = {"cuMemHostAlloc", "register", "populate+register",
                                     "huge+populate+register"};
        for (int w = 0; w < 4; w++) {
            char label[128];
            snprintf(label, sizeof label, "%s 32 x 4 MiB, 1 thread", ways[w]);
            pin(label, 1, 32, CHUNK, w);
            snprintf(label, sizeof label, "%s 2 x 4 MiB each, 16 threads", ways[w]);
            pin(label, 16, 2, CHUNK, w);
            snprintf(label, sizeof label, "%s 1 x 4 MiB, 1 thread", ways[w]);
            pin(label, 1, 1, CHUNK, w);
        }
        size_t len = 128UL << 20;
        uint8_t *mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        memset(mem, 1, len);
        double a = now();
        if (cu_hreg(mem, len, 0)) die("cuMemHostRegister");
        printf("%-44s %7.1f ms\n", "cuMemHostRegister 128 MiB, touched", (now() - a) * 1e3);
        cu_hunreg(mem);
        munmap(mem, len);
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "--pin-only") == 0) return pinning(1);
    if (argc < 3) {
        fprintf(stderr, "usage: %s MEMORY_DIR DISK_DIR [GIB] | --pin-only\n", argv[0]);
        return 2;
    }
    for (int i = 0; i < THREADS; i++) {
        if (posix_memalign((void **)&src[i], 4096, 2 * CHUNK)) die("alloc");
        for (size_t k = 0; k < 2 * CHUNK; k++) src[i][k] = (uint8_t)(k * 131 + i * 7 + (k >> 12));
    }
    pinning(0);
    // A third argument shrinks both sizes (GiB in memory; disk gets half).
    uint64_t mem = (argc > 3 ? strtoull(argv[3], NULL, 10) : 8) << 30, disk = mem / 2;
    printf("-- writes into %s (%lu GiB)\n", argv[1], (unsigned long)(mem >> 30));
    for (int round = 0; round < 2; round++) {
        run("pwrite, 1 thread, 1 file", argv[1], mem, 1, 1, W_PWRITE, 0);
        run("pwrite, 16 threads, 1 file", argv[1], mem, 16, 1, W_PWRITE, 0);
        run("pwrite, 16 threads, 16 files (raw parallel)", argv[1], mem / 16, 16, 16, W_PWRITE, 0);
        run("mapping + populate, 16 threads, 1 file", argv[1], mem, 16, 1, W_MAP_POPULATE, 0);
        run("mapping, faults, 16 threads, 1 file", argv[1], mem, 16, 1, W_MAP_FAULT, 0);
        run("pwrite, 16 threads, 4 files", argv[1], mem / 4, 16, 4, W_PWRITE, 0);
        run("mapping + populate, 16 threads, 4 files", argv[1], mem / 4, 16, 4, W_MAP_POPULATE, 0);
        run("mapping + populate, 16 threads, 16 files", argv[1], mem / 16, 16, 16, W_MAP_POPULATE, 0);
    }
    printf("-- O_DIRECT writes into %s (%lu GiB)\n", argv[2], (unsigned long)(disk >> 30));
    run("O_DIRECT, 16 threads, 1 file, ftruncate", argv[2], disk, 16, 1, W_DIRECT, 0);
    run("O_DIRECT, 16 threads, 1 file, fallocate", argv[2], disk, 16, 1, W_DIRECT, 1);
    run("O_DIRECT, 16 threads, 16 files", argv[2], disk / 16, 16, 16, W_DIRECT, 1);
    run("O_DIRECT, 16 threads, 1 file, ftruncate", argv[2], disk, 16, 1, W_DIRECT, 0);
    run("O_DIRECT, 16 threads, 1 file, fallocate", argv[2], disk, 16, 1, W_DIRECT, 1);
    return 0;
}
