// What bounds a save's transfer: GPU memory copied into small pinned
// slots and written from them into files of a memory file system, against
// the raw parallel write of the same bytes from host memory.
//
// 16 threads, each with a stream, DEPTH pinned slots of SLOT bytes and a
// file of its own: copy device memory into the next free slot, and once
// the oldest slot's copy has landed, pwrite it. Rows:
//   raw     pwrite from an 8 GiB host buffer (touched first), 4 MiB at a time
//   pipe    copy + pwrite, per SLOT and DEPTH
//   copy    the copies alone (no pwrite): the device-to-host ceiling
// and, at the engine's geometry (2 MiB windows, 2 slots each), the ways
// the engine's save differs from this pipeline, one at a time and then
// together:
//   huge-page slots   slots 4 MiB apart in one anonymous mapping on huge
//                     pages, registered with the driver (as the engine's
//                     staging pool), not from cuMemHostAlloc
//   shared cursor     every thread takes the next window of any file
//                     (interleaved across files), as the engine's workers
//                     do, not windows of its own file
//   O_DIRECT          writes through an O_DIRECT twin of each file, as the
//                     engine's aligned writes go where a file system
//                     takes O_DIRECT (tmpfs does since Linux 6.6)
// Smaller slots keep less copied-but-unwritten data in flight (16 x DEPTH x
// SLOT), which may stay in the CPU's last-level cache until written.
//
//   gcc -O2 -pthread -o save_pipe bench/probe/save_pipe.c -ldl
//   ./save_pipe /dev/shm [GIB] [ROUNDS]
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

#define THREADS 16
#define MAX_DEPTH 8

typedef int (*fn_i)(unsigned);
typedef int (*fn_dev)(int *, int);
typedef int (*fn_retain)(void **, int);
typedef int (*fn_ptr)(void *);
typedef int (*fn_halloc)(void **, size_t, unsigned);
typedef int (*fn_hreg)(void *, size_t, unsigned);
typedef int (*fn_malloc)(unsigned long long *, size_t);
typedef int (*fn_memset)(unsigned long long, unsigned char, size_t);
typedef int (*fn_stream)(void **, unsigned);
typedef int (*fn_d2h)(void *, unsigned long long, size_t, void *);
typedef int (*fn_event)(void **, unsigned);
typedef int (*fn_record)(void *, void *);
typedef int (*fn_void)(void);

static struct {
    fn_i init;
    fn_dev device_get;
    fn_retain retain;
    fn_ptr set_current, event_sync;
    fn_halloc host_alloc;
    fn_hreg host_register;
    fn_malloc mem_alloc;
    fn_memset memset_d8;
    fn_stream stream_create;
    fn_d2h d2h_async;
    fn_event event_create;
    fn_record event_record;
    fn_void ctx_sync;
} cu;
static void *ctx;

static void check(int rc, const char *what) {
    if (rc) {
        fprintf(stderr, "%s: CUDA error %d\n", what, rc);
        exit(1);
    }
}

static void *sym(void *lib, const char *name) {
    void *f = dlsym(lib, name);
    if (!f) {
        fprintf(stderr, "libcuda has no %s\n", name);
        exit(1);
    }
    return f;
}

static void load_cuda(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) {
        fprintf(stderr, "no libcuda.so.1: %s\n", dlerror());
        exit(1);
    }
    cu.init = sym(lib, "cuInit");
    cu.device_get = sym(lib, "cuDeviceGet");
    cu.retain = sym(lib, "cuDevicePrimaryCtxRetain");
    cu.set_current = sym(lib, "cuCtxSetCurrent");
    cu.event_sync = sym(lib, "cuEventSynchronize");
    cu.host_alloc = sym(lib, "cuMemHostAlloc");
    cu.host_register = sym(lib, "cuMemHostRegister_v2");
    cu.mem_alloc = sym(lib, "cuMemAlloc_v2");
    cu.memset_d8 = sym(lib, "cuMemsetD8_v2");
    cu.stream_create = sym(lib, "cuStreamCreate");
    cu.d2h_async = sym(lib, "cuMemcpyDtoHAsync_v2");
    cu.event_create = sym(lib, "cuEventCreate");
    cu.event_record = sym(lib, "cuEventRecord");
    cu.ctx_sync = sym(lib, "cuCtxSynchronize");
    int dev;
    check(cu.init(0), "cuInit");
    check(cu.device_get(&dev, 0), "cuDeviceGet");
    check(cu.retain(&ctx, dev), "cuDevicePrimaryCtxRetain");
    check(cu.set_current(ctx), "cuCtxSetCurrent");
}

struct job {
    int id;
    int fd;
    int dfd;                  // the O_DIRECT twin of fd
    int direct;               // write through dfd
    int write;                // pwrite each slot (else the copies alone)
    int shared;               // take windows of any file from the shared cursor
    unsigned long long dev;   // the device memory, all threads' ranges
    const uint8_t *host;      // raw rows: this thread's host range
    uint64_t bytes;           // per thread (and per file)
    size_t slot;              // bytes per window
    size_t stride;            // bytes from one slot to the next
    int depth;
    uint8_t *slots;
    void *stream;
    void *events[MAX_DEPTH];
};

static struct job jobs[THREADS];
static uint64_t cursor;  // the shared cursor: windows handed out

static void *raw_writer(void *arg) {
    struct job *j = arg;
    for (uint64_t at = 0; at < j->bytes; at += 4UL << 20)
        if (pwrite(j->direct ? j->dfd : j->fd, j->host + at, 4UL << 20, at) != (ssize_t)(4UL << 20)) die("pwrite");
    return NULL;
}

// The next window of thread `j` as (file, offset in it), or 0 when none is left.
static int next_window(struct job *j, uint64_t *mine, int *file, uint64_t *at) {
    uint64_t per_file = j->bytes / j->slot, k;
    if (j->shared) {
        k = __atomic_fetch_add(&cursor, 1, __ATOMIC_RELAXED);
        if (k >= per_file * THREADS) return 0;
        *file = k % THREADS;
        *at = k / THREADS * j->slot;
        return 1;
    }
    if (*mine >= per_file) return 0;
    *file = j->id;
    *at = (*mine)++ * j->slot;
    return 1;
}

static void *pipe_writer(void *arg) {
    struct job *j = arg;
    check(cu.set_current(ctx), "cuCtxSetCurrent");
    int file[MAX_DEPTH];
    uint64_t at[MAX_DEPTH], mine = 0, issued = 0, done = 0;
    int more = 1;
    for (;;) {
        while (more && issued - done < (uint64_t)j->depth) {
            int s = issued % j->depth;
            if (!(more = next_window(j, &mine, &file[s], &at[s]))) break;
            unsigned long long src = j->dev + file[s] * j->bytes + at[s];
            check(cu.d2h_async(j->slots + s * j->stride, src, j->slot, j->stream), "copy");
            check(cu.event_record(j->events[s], j->stream), "record");
            issued++;
        }
        if (done == issued) break;
        int s = done % j->depth;
        check(cu.event_sync(j->events[s]), "wait");
        int fd = j->direct ? jobs[file[s]].dfd : jobs[file[s]].fd;
        if (j->write && pwrite(fd, j->slots + s * j->stride, j->slot, at[s]) != (ssize_t)j->slot)
            die("pwrite");
        done++;
    }
    return NULL;
}

// One row: every thread's job run at once into fresh files under `dir`.
static void row(const char *dir, const char *label, uint64_t per_thread, void *(*fn)(void *)) {
    char path[512];
    for (int i = 0; i < THREADS; i++) {
        snprintf(path, sizeof path, "%s/zerohop-save-pipe-%d-%d", dir, getpid(), i);
        jobs[i].fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
        if (jobs[i].fd < 0) die(path);
        // A file system that refuses O_DIRECT (tmpfs before Linux 6.6)
        // gets its O_DIRECT rows written through the plain descriptor.
        jobs[i].dfd = open(path, O_WRONLY | O_DIRECT);
        if (jobs[i].dfd < 0 && (jobs[i].dfd = dup(jobs[i].fd)) < 0) die("dup");
        unlink(path);
        if (ftruncate(jobs[i].fd, per_thread)) die("ftruncate");
    }
    pthread_t tids[THREADS];
    cursor = 0;
    double t0 = now();
    for (int i = 0; i < THREADS; i++) pthread_create(&tids[i], NULL, fn, &jobs[i]);
    for (int i = 0; i < THREADS; i++) pthread_join(tids[i], NULL);
    for (int i = 0; i < THREADS; i++)
        if (jobs[i].write && fdatasync(jobs[i].fd)) die("fdatasync");
    double t = now() - t0;
    printf("%-38s %6.2f GB/s  (%.3f s)\n", label, per_thread * THREADS / t / 1e9, t);
    fflush(stdout);
    for (int i = 0; i < THREADS; i++) {
        close(jobs[i].fd);
        close(jobs[i].dfd);
    }
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s DIR [GIB] [ROUNDS]\n", argv[0]);
        return 2;
    }
    const char *dir = argv[1];
    uint64_t total = (argc > 2 ? strtoull(argv[2], NULL, 10) : 8) << 30;
    int rounds = argc > 3 ? atoi(argv[3]) : 2;
    uint64_t per_thread = total / THREADS;
    load_cuda();
    unsigned long long dev;
    check(cu.mem_alloc(&dev, total), "cuMemAlloc");
    check(cu.memset_d8(dev, 0x5a, total), "cuMemsetD8");
    uint8_t *host = malloc(total);
    if (!host) die("malloc");
    memset(host, 0x5a, total);
    uint8_t *slots, *block;
    const size_t max_slots = 32UL << 20;  // per thread: DEPTH x SLOT at most
    check(cu.host_alloc((void **)&slots, max_slots * THREADS, 0), "cuMemHostAlloc");
    memset(slots, 0, max_slots * THREADS);
    // The engine's way: 2 slots of 4 MiB per thread in one block on huge
    // pages, made present, then registered.
    const size_t block_bytes = (8UL << 20) * THREADS;
    block = mmap(NULL, block_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (block == MAP_FAILED) die("mmap");
    madvise(block, block_bytes, MADV_HUGEPAGE);
    memset(block, 0, block_bytes);
    check(cu.host_register(block, block_bytes, 0), "cuMemHostRegister");
    for (int i = 0; i < THREADS; i++) {
        jobs[i].id = i;
        jobs[i].dev = dev;
        jobs[i].host = host + i * per_thread;
        jobs[i].bytes = per_thread;
        jobs[i].slots = slots + i * max_slots;
        check(cu.stream_create(&jobs[i].stream, 1), "cuStreamCreate");
        for (int e = 0; e < MAX_DEPTH; e++) check(cu.event_create(&jobs[i].events[e], 2), "cuEventCreate");
    }
    check(cu.ctx_sync(), "cuCtxSynchronize");
    static const struct { size_t slot_kib; int depth; int write; } pipes[] = {
        {4096, 2, 1}, {2048, 2, 1}, {1024, 4, 1}, {4096, 2, 0},
    };
    // At the engine's geometry: window KiB, slot stride KiB, shared cursor,
    // O_DIRECT, huge-page slots.
    static const struct { const char *label; size_t kib, stride_kib; int shared, direct, block; } engine_like[] = {
        {"own files, 2048 KiB x 2", 2048, 2048, 0, 0, 0},
        {"+ huge-page slots 4 MiB apart", 2048, 4096, 0, 0, 1},
        {"+ shared cursor", 2048, 2048, 1, 0, 0},
        {"+ O_DIRECT", 2048, 2048, 0, 1, 0},
        {"all three (the engine's save)", 2048, 4096, 1, 1, 1},
        {"all three, 4096 KiB windows", 4096, 4096, 1, 1, 1},
    };
    printf("%d threads, %.1f GiB, each into a file of its own under %s\n", THREADS, total / 1073741824.0, dir);
    for (int r = 0; r < rounds; r++) {
        for (int direct = 0; direct < 2; direct++) {
            for (int i = 0; i < THREADS; i++) {
                jobs[i].write = 1;
                jobs[i].direct = direct;
            }
            row(dir, direct ? "raw: pwrite from host memory, O_DIRECT" : "raw: pwrite from host memory", per_thread,
                raw_writer);
        }
        for (size_t p = 0; p < sizeof pipes / sizeof pipes[0]; p++) {
            char label[64];
            snprintf(label, sizeof label, "%s: %zu KiB slots x %d", pipes[p].write ? "pipe" : "copy",
                     pipes[p].slot_kib, pipes[p].depth);
            for (int i = 0; i < THREADS; i++) {
                jobs[i].slot = jobs[i].stride = pipes[p].slot_kib << 10;
                jobs[i].depth = pipes[p].depth;
                jobs[i].write = pipes[p].write;
                jobs[i].direct = 0;
            }
            row(dir, label, per_thread, pipe_writer);
        }
        for (size_t v = 0; v < sizeof engine_like / sizeof engine_like[0]; v++) {
            for (int i = 0; i < THREADS; i++) {
                jobs[i].slot = engine_like[v].kib << 10;
                jobs[i].stride = engine_like[v].stride_kib << 10;
                jobs[i].depth = 2;
                jobs[i].write = 1;
                jobs[i].shared = engine_like[v].shared;
                jobs[i].direct = engine_like[v].direct;
                jobs[i].slots = engine_like[v].block ? block + i * (8UL << 20) : slots + i * max_slots;
            }
            char label[80];
            snprintf(label, sizeof label, "engine-like: %s", engine_like[v].label);
            row(dir, label, per_thread, pipe_writer);
        }
        for (int i = 0; i < THREADS; i++) {
            jobs[i].shared = 0;
            jobs[i].slots = slots + i * max_slots;
        }
    }
    return 0;
}
