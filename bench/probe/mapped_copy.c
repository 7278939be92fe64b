// Copies out of a shared mapping of a file in the page cache by T threads
// into buffers of their own, as the engine's mapped route copies windows
// into staging slots: which costs more per byte, windows of many small
// pieces or of one run of bytes, and what dropping each copy's page-table
// entries afterwards (MADV_DONTNEED, as the engine does so that unmapping
// stays short) adds to each. Rows:
//   contiguous   4 MiB windows over the whole file
//   halves       the first half of each tensor of 1, 2, 3, 4, 1, ... MiB
//                (a tensor-parallel rank's rows), cut at 4 MiB boundaries
//                of the file as the engine cuts windows
// each with the pages dropped after every copy ("drop") and without
// ("keep", their teardown then in the unmapping, which the clock
// includes). Every row maps the file afresh, so each page is faulted in
// once, as in a process that just opened the file; the rate counts the
// bytes copied.
//
//     gcc -O2 -Wall -pthread -o mapped_copy bench/probe/mapped_copy.c
//     ./mapped_copy [DIR] [GIB] [THREADS] [ROUNDS]   (/dev/shm 8 16 2)
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "probe.h"

#define MIB (1UL << 20)
#define WINDOW (4 * MIB)

struct piece {
    uint64_t at, len;
};

static struct {
    const uint8_t *map;
    const struct piece *pieces;
    size_t count;
    atomic_size_t next;
    int drop;
} job;

static void *copier(void *arg) {
    (void)arg;
    uint8_t *bufs = aligned_alloc(4096, 2 * WINDOW);
    if (!bufs) die("aligned_alloc");
    memset(bufs, 0, 2 * WINDOW);
    long page = sysconf(_SC_PAGESIZE);
    for (size_t k = 0;; k++) {
        size_t i = atomic_fetch_add(&job.next, 1);
        if (i >= job.count) break;
        const struct piece *p = &job.pieces[i];
        memcpy(bufs + (k % 2) * WINDOW, job.map + p->at, p->len);
        if (job.drop) {
            uintptr_t first = ((uintptr_t)job.map + p->at + page - 1) / page * page;
            uintptr_t end = ((uintptr_t)job.map + p->at + p->len) / page * page;
            if (end > first) madvise((void *)first, end - first, MADV_DONTNEED);
        }
    }
    free(bufs);
    return NULL;
}

// `n` pieces of the file copied by `threads` threads; returns GB/s.
static double row(int fd, uint64_t size, const struct piece *pieces, size_t n, int threads, int drop) {
    const uint8_t *map = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) die("mmap");
    job.map = map;
    job.pieces = pieces;
    job.count = n;
    job.drop = drop;
    atomic_store(&job.next, 0);
    uint64_t bytes = 0;
    for (size_t i = 0; i < n; i++) bytes += pieces[i].len;
    pthread_t tids[256];
    double t0 = now();
    for (int t = 0; t < threads; t++) pthread_create(&tids[t], NULL, copier, NULL);
    for (int t = 0; t < threads; t++) pthread_join(tids[t], NULL);
    munmap((void *)map, size);  // inside the clock: a kept mapping's teardown
    double dt = now() - t0;
    return bytes / dt / 1e9;
}

// Appends [at, at + len) cut at WINDOW boundaries of the file.
static size_t cut(struct piece *out, size_t n, uint64_t at, uint64_t len) {
    while (len > 0) {
        uint64_t take = WINDOW - at % WINDOW;
        if (take > len) take = len;
        out[n++] = (struct piece){at, take};
        at += take;
        len -= take;
    }
    return n;
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "/dev/shm";
    uint64_t size = (argc > 2 ? strtoull(argv[2], NULL, 10) : 8) << 30;
    int threads = argc > 3 ? atoi(argv[3]) : 16;
    int rounds = argc > 4 ? atoi(argv[4]) : 2;
    if (threads < 1 || threads > 256) threads = 16;
    char path[512];
    snprintf(path, sizeof path, "%s/zerohop-mapped-copy-%d", dir, getpid());
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) die(path);
    unlink(path);
    uint8_t *chunk = malloc(64 * MIB);
    if (!chunk) die("malloc");
    memset(chunk, 0x5a, 64 * MIB);
    for (uint64_t at = 0; at < size; at += 64 * MIB)
        if (pwrite(fd, chunk, 64 * MIB, at) != (ssize_t)(64 * MIB)) die("pwrite");
    free(chunk);
    size_t most = size / MIB * 2 + 16;
    struct piece *whole = malloc(most * sizeof *whole), *halves = malloc(most * sizeof *halves);
    if (!whole || !halves) die("malloc");
    size_t n_whole = cut(whole, 0, 0, size), n_halves = 0;
    uint64_t at = 0;
    for (int i = 0; at < size; i++) {
        uint64_t tensor = (uint64_t)(1 + i % 4) * MIB;
        if (at + tensor > size) tensor = size - at;
        n_halves = cut(halves, n_halves, at, tensor / 2);
        at += tensor;
    }
    printf("%d threads, %.1f GiB file under %s: %zu contiguous windows, %zu half-tensor pieces\n", threads,
           size / 1073741824.0, dir, n_whole, n_halves);
    for (int r = 0; r < rounds; r++)
        for (int drop = 1; drop >= 0; drop--) {
            printf("contiguous, %s   %6.2f GB/s\n", drop ? "drop" : "keep", row(fd, size, whole, n_whole, threads, drop));
            printf("halves, %s       %6.2f GB/s\n", drop ? "drop" : "keep", row(fd, size, halves, n_halves, threads, drop));
            fflush(stdout);
        }
    close(fd);
    return 0;
}
