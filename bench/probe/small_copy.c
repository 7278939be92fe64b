// How fast one small read (0.25 - 4 MiB) of a file in the page cache gets
// into host memory on this machine, as a get_slice of one tensor needs it:
// copied out of a mapping of the file (then its page-table entries dropped,
// as the engine does), or read with pread, on the calling thread alone or
// cut across K helper threads that wait, parked, between reads (woken by a
// futex: no thread is started per read). Each read is of bytes this
// process has not mapped before, in a file written just before, as a
// freshly loaded model's file is.
//
//     gcc -O2 -Wall -pthread -o small_copy bench/probe/small_copy.c
//     ./small_copy [DIR]        (default /dev/shm)
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "probe.h"

enum { MAX_HELPERS = 16, READS = 200 };

static long futex(atomic_int *word, int op, int val) {
    return syscall(SYS_futex, word, op, val, NULL, NULL, 0);
}

// One read's parts: helper h copies part h + 1, the caller part 0.
static struct {
    int fd;
    const char *map;
    char *dst;
    size_t offset, part, len;
    int use_pread;
    atomic_int left;
} job;

// Each helper's own wake-up word: a read wakes only the helpers it uses.
static atomic_int generation[MAX_HELPERS];

static void copy_part(int i) {
    size_t begin = i * job.part, end = begin + job.part < job.len ? begin + job.part : job.len;
    if (begin >= end)
        return;
    if (job.use_pread) {
        if (pread(job.fd, job.dst + begin, end - begin, job.offset + begin) != (ssize_t)(end - begin))
            abort();
        return;
    }
    memcpy(job.dst + begin, job.map + job.offset + begin, end - begin);
    madvise((void *)(job.map + job.offset + begin), end - begin, MADV_DONTNEED);
}

static void *helper(void *arg) {
    int me = (int)(long)arg, seen = 0;
    for (;;) { // until the process exits
        int g;
        while ((g = atomic_load(&generation[me])) == seen)
            futex(&generation[me], FUTEX_WAIT_PRIVATE, seen);
        seen = g;
        copy_part(me + 1);
        if (atomic_fetch_sub(&job.left, 1) == 1)
            futex(&job.left, FUTEX_WAKE_PRIVATE, 1);
    }
    return NULL;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "/dev/shm";
    size_t sizes[] = {256 << 10, 1 << 20, 2 << 20, 4 << 20};
    int helper_counts[] = {0, 1, 3, 7};
    pthread_t threads[MAX_HELPERS];
    int started = 0;
    char path[4096];
    snprintf(path, sizeof path, "%s/zerohop-small-copy-%d", dir, getpid());
    printf("%-8s %-22s %8s %8s %8s\n", "read", "how", "median", "best", "GB/s");
    for (unsigned s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        size_t len = sizes[s], total = len * READS;
        for (int use_pread = 0; use_pread < 2; use_pread++) {
            for (unsigned h = 0; h < sizeof helper_counts / sizeof *helper_counts; h++) {
                int helpers = helper_counts[h];
                // A fresh file for every row: pages in the page cache, none
                // mapped here yet.
                int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
                if (fd < 0 || ftruncate(fd, total))
                    return perror(path), 1;
                char *fill = malloc(1 << 20);
                memset(fill, 7, 1 << 20);
                for (size_t o = 0; o < total; o += 1 << 20)
                    if (pwrite(fd, fill, 1 << 20, o) != 1 << 20)
                        return perror("pwrite"), 1;
                free(fill);
                char *map = mmap(NULL, total, PROT_READ, MAP_SHARED, fd, 0);
                if (map == MAP_FAILED)
                    return perror("mmap"), 1;
                madvise(map, total, MADV_SEQUENTIAL);
                char *dst = aligned_alloc(4096, len);
                memset(dst, 0, len);
                while (started < helpers) {
                    pthread_create(&threads[started], NULL, helper, (void *)(long)started);
                    started++;
                }
                job.fd = fd, job.map = map, job.dst = dst, job.len = len, job.use_pread = use_pread;
                job.part = (len / (helpers + 1) + 4095) / 4096 * 4096;
                double took[READS];
                for (int r = 0; r < READS; r++) {
                    job.offset = (size_t)r * len;
                    double t = now();
                    atomic_store(&job.left, helpers);
                    for (int i = 0; i < helpers; i++) {
                        atomic_fetch_add(&generation[i], 1);
                        futex(&generation[i], FUTEX_WAKE_PRIVATE, 1);
                    }
                    copy_part(0);
                    int left;
                    while (helpers > 0 && (left = atomic_load(&job.left)) != 0)
                        futex(&job.left, FUTEX_WAIT_PRIVATE, left);
                    took[r] = now() - t;
                }
                qsort(took, READS, sizeof *took, cmp);
                char how[64];
                snprintf(how, sizeof how, "%s, %d thread%s", use_pread ? "pread" : "mapping",
                         helpers + 1, helpers ? "s" : "");
                printf("%-8zu %-22s %6.0f us %6.0f us %8.2f\n", len >> 10, how, took[READS / 2] * 1e6,
                       took[0] * 1e6, len / took[READS / 2] / 1e9);
                munmap(map, total);
                close(fd);
                unlink(path);
                free(dst);
            }
        }
    }
    return 0;
}
