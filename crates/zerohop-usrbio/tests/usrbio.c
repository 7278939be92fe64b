/*
 * USRBIO programs against zerohop's hf3fs_usrbio.h, on host memory; run by
 * crates/zerohop-cli/tests/usrbio.rs against a real agent serving MOUNT.
 *
 *   usrbio read MOUNT FILE       sequential and random reads, bytes checked
 *   usrbio write MOUNT FILE      writes, then reads them back
 *   usrbio publish MOUNT FILE    makes an iov, prints its id, waits for a
 *                                line on stdin, checks FILE's bytes are in it
 *   usrbio open MOUNT FILE ID    reads FILE into the iov published as ID
 *   usrbio depth MOUNT FILE      io_depth > 0, = 0, < 0; wait_for_ios timing out
 *   usrbio closed MOUNT FILE     a registered fd closed before its I/O
 *   usrbio errors MOUNT FILE     the documented error returns
 *   usrbio lonely MOUNT FILE     with no agent (and no GPU): every call says no
 *
 * Exits 0 when every check passed; otherwise prints the failed check.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "hf3fs_usrbio.h"

static int failures;

#define CHECK(cond)                                                           \
    do {                                                                      \
        if (!(cond)) {                                                        \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
            failures++;                                                       \
        }                                                                     \
    } while (0)

#define MIB (1u << 20)

static unsigned char *file_bytes(const char *path, size_t *len) {
    int fd = open(path, O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        perror(path);
        exit(2);
    }
    unsigned char *buf = malloc(st.st_size + 1);
    size_t got = 0;
    while (got < (size_t)st.st_size) {
        ssize_t n = pread(fd, buf + got, st.st_size - got, got);
        if (n <= 0) exit(2);
        got += n;
    }
    close(fd);
    *len = got;
    return buf;
}

/* Reads [off, off + len) of fd into iov at iov_off through a fresh ring. */
static long one_io(const char *mount, struct hf3fs_iov *iov, bool read, int fd, size_t iov_off,
                   size_t off, size_t len) {
    struct hf3fs_ior ior;
    int rc = hf3fs_iorcreate4(&ior, mount, 4, read, 0, 0, -1, 0);
    if (rc != 0) return rc;
    rc = hf3fs_prep_io(&ior, iov, read, iov->base + iov_off, fd, off, len, (void *)0x1234);
    CHECK(rc >= 0);
    CHECK(hf3fs_submit_ios(&ior) == 0);
    struct hf3fs_cqe cqe;
    CHECK(hf3fs_wait_for_ios(&ior, &cqe, 1, 1, NULL) == 1);
    CHECK(cqe.userdata == (void *)0x1234 && cqe.index == rc);
    hf3fs_iordestroy(&ior);
    return cqe.result;
}

static int test_read(const char *mount, const char *path) {
    size_t len;
    unsigned char *want = file_bytes(path, &len);
    struct hf3fs_iov iov;
    CHECK(hf3fs_iovcreate(&iov, mount, len, 0, -1) == 0);
    CHECK(hf3fs_iov_mem_type(&iov) == HF3FS_MEM_HOST && hf3fs_iov_device_id(&iov) == -1);
    int fd = open(path, O_RDONLY);
    CHECK(hf3fs_reg_fd(fd, 0) <= 0);
    struct hf3fs_ior ior;
    CHECK(hf3fs_iorcreate(&ior, mount, 64, true, 0, -1) == 0);
    CHECK(hf3fs_io_entries(&ior) == 64);
    /* Sequential: 1 MiB pieces, all at once. */
    size_t pieces = 0;
    for (size_t at = 0; at < len; at += MIB, pieces++) {
        size_t n = len - at < MIB ? len - at : MIB;
        CHECK(hf3fs_prep_io(&ior, &iov, true, iov.base + at, fd, at, n, (void *)(at + 1)) >= 0);
    }
    CHECK(hf3fs_submit_ios(&ior) == 0);
    struct hf3fs_cqe cqes[64];
    size_t done = 0;
    while (done < pieces) {
        int n = hf3fs_wait_for_ios(&ior, cqes, 64, pieces - done, NULL);
        CHECK(n > 0);
        if (n <= 0) break;
        for (int i = 0; i < n; i++) {
            size_t at = (size_t)cqes[i].userdata - 1;
            size_t want_n = len - at < MIB ? len - at : MIB;
            CHECK(cqes[i].result == (long)want_n);
        }
        done += n;
    }
    CHECK(memcmp(iov.base, want, len) == 0);
    /* Random: odd lengths at odd offsets, each into a different place. */
    memset(iov.base, 0, len);
    srand(7);
    for (int round = 0; round < 200; round++) {
        size_t off = rand() % len, n = 1 + rand() % (len - off), dst = rand() % (len - n + 1);
        CHECK(hf3fs_prep_io(&ior, &iov, true, iov.base + dst, fd, off, n, NULL) >= 0);
        CHECK(hf3fs_submit_ios(&ior) == 0);
        struct hf3fs_cqe cqe;
        CHECK(hf3fs_wait_for_ios(&ior, &cqe, 1, 1, NULL) == 1);
        CHECK(cqe.result == (long)n && memcmp(iov.base + dst, want + off, n) == 0);
    }
    hf3fs_iordestroy(&ior);
    hf3fs_dereg_fd(fd);
    close(fd);
    hf3fs_iovdestroy(&iov);
    free(want);
    return failures;
}

static int test_write(const char *mount, const char *path) {
    size_t len = 3 * MIB + 12345;
    struct hf3fs_iov iov;
    CHECK(hf3fs_iovcreate(&iov, mount, len, 0, -1) == 0);
    for (size_t i = 0; i < len; i++) iov.base[i] = (unsigned char)(i * 31 + 7);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    CHECK(hf3fs_reg_fd(fd, 0) <= 0);
    struct hf3fs_ior ior;
    CHECK(hf3fs_iorcreate2(&ior, mount, 8, false, 0, 1, -1) == 0);
    CHECK(hf3fs_prep_io(&ior, &iov, true, iov.base, fd, 0, 1, NULL) == -EINVAL); /* a write ring */
    CHECK(hf3fs_prep_io(&ior, &iov, false, iov.base, fd, 0, 2 * MIB, NULL) >= 0);
    CHECK(hf3fs_prep_io(&ior, &iov, false, iov.base + 2 * MIB, fd, 2 * MIB, len - 2 * MIB, NULL) >= 0);
    CHECK(hf3fs_submit_ios(&ior) == 0);
    struct hf3fs_cqe cqes[2];
    CHECK(hf3fs_wait_for_ios(&ior, cqes, 2, 2, NULL) == 2);
    CHECK(cqes[0].result + cqes[1].result == (long)len);
    hf3fs_iordestroy(&ior);
    /* Read back through the library, into a second iov. */
    struct hf3fs_iov back;
    CHECK(hf3fs_iovcreate(&back, mount, len, 0, -1) == 0);
    CHECK(one_io(mount, &back, true, fd, 0, 0, len) == (long)len);
    CHECK(memcmp(back.base, iov.base, len) == 0);
    size_t on_disk_len;
    unsigned char *on_disk = file_bytes(path, &on_disk_len);
    CHECK(on_disk_len == len && memcmp(on_disk, iov.base, len) == 0);
    free(on_disk);
    hf3fs_dereg_fd(fd);
    close(fd);
    hf3fs_iovdestroy(&back);
    hf3fs_iovdestroy(&iov);
    return failures;
}

static int test_publish(const char *mount, const char *path) {
    size_t len;
    unsigned char *want = file_bytes(path, &len);
    struct hf3fs_iov iov;
    CHECK(hf3fs_iovcreate(&iov, mount, len, 0, -1) == 0);
    for (int i = 0; i < 16; i++) printf("%02x", (unsigned char)iov.id[i]);
    printf("\n");
    fflush(stdout);
    char line[16];
    if (!fgets(line, sizeof line, stdin)) return 2;
    CHECK(memcmp(iov.base, want, len) == 0);
    /* hf3fs_iovwrap: the same memory, through this process's mapping. */
    struct hf3fs_iov wrapped;
    CHECK(hf3fs_iovwrap(&wrapped, iov.base, (const uint8_t *)iov.id, mount, len, 0, -1) == 0);
    CHECK(wrapped.base == iov.base);
    int fd = open(path, O_RDONLY);
    CHECK(hf3fs_reg_fd(fd, 0) <= 0);
    memset(iov.base, 0, len);
    CHECK(one_io(mount, &wrapped, true, fd, 0, 0, len) == (long)len);
    CHECK(memcmp(iov.base, want, len) == 0);
    hf3fs_iovdestroy(&wrapped);
    hf3fs_iovunlink(&iov);
    struct hf3fs_iov gone;
    CHECK(hf3fs_iovopen(&gone, (const uint8_t *)iov.id, mount, len, 0, -1) == -ENOENT);
    hf3fs_dereg_fd(fd);
    close(fd);
    hf3fs_iovdestroy(&iov);
    free(want);
    return failures;
}

static int test_open(const char *mount, const char *path, const char *hex) {
    uint8_t id[16];
    for (int i = 0; i < 16; i++) sscanf(hex + 2 * i, "%2hhx", &id[i]);
    size_t len;
    unsigned char *want = file_bytes(path, &len);
    struct hf3fs_iov iov;
    CHECK(hf3fs_iovopen(&iov, id, mount, len + 1, 0, -1) != 0); /* larger than it is */
    CHECK(hf3fs_iovopen(&iov, id, mount, len, 0, -1) == 0);
    int fd = open(path, O_RDONLY);
    CHECK(hf3fs_reg_fd(fd, 0) <= 0);
    CHECK(one_io(mount, &iov, true, fd, 0, 0, len) == (long)len);
    CHECK(memcmp(iov.base, want, len) == 0);
    hf3fs_dereg_fd(fd);
    close(fd);
    hf3fs_iovdestroy(&iov);
    free(want);
    return failures;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static struct timespec in_ms(int ms) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    t.tv_nsec += (long)ms * 1000000;
    t.tv_sec += t.tv_nsec / 1000000000;
    t.tv_nsec %= 1000000000;
    return t;
}

/* Prepares `n` 4 KiB reads and submits them. */
static void prep_reads(struct hf3fs_ior *ior, struct hf3fs_iov *iov, int fd, int n) {
    for (int i = 0; i < n; i++) CHECK(hf3fs_prep_io(ior, iov, true, iov->base + i * 4096, fd, i * 4096, 4096, NULL) >= 0);
    CHECK(hf3fs_submit_ios(ior) == 0);
}

static int test_depth(const char *mount, const char *path) {
    struct hf3fs_iov iov;
    CHECK(hf3fs_iovcreate(&iov, mount, 64 * 4096, 0, -1) == 0);
    int fd = open(path, O_RDONLY);
    CHECK(hf3fs_reg_fd(fd, 0) <= 0);
    struct hf3fs_cqe cqes[16];
    struct timespec soon;

    /* io_depth 2, no timeout: 3 prepared, only a batch of 2 goes. */
    struct hf3fs_ior exact;
    CHECK(hf3fs_iorcreate(&exact, mount, 16, true, 2, -1) == 0);
    prep_reads(&exact, &iov, fd, 3);
    soon = in_ms(300);
    CHECK(hf3fs_wait_for_ios(&exact, cqes, 16, 3, &soon) == 2);
    CHECK(hf3fs_wait_for_ios(&exact, cqes, 16, 1, NULL) == 0); /* the third cannot go: no wait */
    prep_reads(&exact, &iov, fd, 1);
    CHECK(hf3fs_wait_for_ios(&exact, cqes, 16, 2, NULL) == 2);
    hf3fs_iordestroy(&exact);

    /* io_depth 4 with a 1 s timeout: a partial batch goes when it is up;
     * a wait that ends first times out with nothing. */
    struct hf3fs_ior timed;
    CHECK(hf3fs_iorcreate3(&timed, mount, 16, true, 4, 0, 1000, -1) == 0);
    prep_reads(&timed, &iov, fd, 1);
    double t0 = now_s();
    soon = in_ms(30);
    CHECK(hf3fs_wait_for_ios(&timed, cqes, 16, 1, &soon) == 0);
    CHECK(now_s() - t0 >= 0.025);
    CHECK(hf3fs_wait_for_ios(&timed, cqes, 16, 1, NULL) == 1);
    CHECK(now_s() - t0 >= 0.99 && cqes[0].result == 4096);
    hf3fs_iordestroy(&timed);

    /* io_depth 0 and < 0: everything goes; -3 caps what is at the agent. */
    int depths[2] = {0, -3};
    for (int d = 0; d < 2; d++) {
        struct hf3fs_ior ior;
        CHECK(hf3fs_iorcreate4(&ior, mount, 16, true, depths[d], 0, -1, HF3FS_IOR_FORBID_READ_HOLES) == 0);
        prep_reads(&ior, &iov, fd, 10);
        int got = 0;
        while (got < 10) {
            int n = hf3fs_wait_for_ios(&ior, cqes, 16, 10 - got, NULL);
            CHECK(n > 0);
            if (n <= 0) break;
            for (int i = 0; i < n; i++) CHECK(cqes[i].result == 4096);
            got += n;
        }
        hf3fs_iordestroy(&ior);
    }
    hf3fs_dereg_fd(fd);
    close(fd);
    hf3fs_iovdestroy(&iov);
    return failures;
}

static int test_closed(const char *mount, const char *path) {
    size_t len;
    unsigned char *want = file_bytes(path, &len);
    struct hf3fs_iov iov;
    CHECK(hf3fs_iovcreate(&iov, mount, len, 0, -1) == 0);
    int fd = open(path, O_RDONLY);
    CHECK(hf3fs_reg_fd(fd, 0) <= 0);
    close(fd);
    CHECK(one_io(mount, &iov, true, fd, 0, 0, len) == (long)len);
    CHECK(memcmp(iov.base, want, len) == 0);
    /* The number, reused by another open file, stays registered. */
    int again = open(path, O_RDONLY);
    CHECK(again == fd);
    CHECK(hf3fs_reg_fd(again, 0) == EINVAL);
    hf3fs_dereg_fd(fd);
    CHECK(hf3fs_reg_fd(again, 0) <= 0);
    hf3fs_dereg_fd(again);
    close(again);
    hf3fs_iovdestroy(&iov);
    free(want);
    return failures;
}

static int test_errors(const char *mount, const char *path) {
    char mp[256];
    int n = hf3fs_extract_mount_point(mp, sizeof mp, path);
    CHECK(n == (int)strlen(mount) + 1 && strcmp(mp, mount) == 0);
    CHECK(hf3fs_extract_mount_point(mp, 2, path) == n); /* too small: the size it needs */
    CHECK(hf3fs_extract_mount_point(mp, sizeof mp, "/proc/self/status") == -1);
    int fd = open(path, O_RDWR);
    int outside = open("/proc/self/status", O_RDONLY);
    CHECK(hf3fs_is_hf3fs(fd) && !hf3fs_is_hf3fs(outside) && !hf3fs_is_hf3fs(-1));
    CHECK(hf3fs_reg_fd(-1, 0) == EBADF);
    CHECK(hf3fs_reg_fd(outside, 0) == EBADF);
    CHECK(hf3fs_reg_fd(fd, 0) <= 0);
    CHECK(hf3fs_reg_fd(fd, 0) == EINVAL);

    struct hf3fs_iov iov;
    CHECK(hf3fs_iovcreate(&iov, "/proc", 4096, 0, -1) == -ENOENT);
    CHECK(hf3fs_iovcreate(&iov, mount, 0, 0, -1) == -EINVAL);
    char too_long[300];
    memset(too_long, 'a', sizeof too_long - 1);
    too_long[sizeof too_long - 1] = 0;
    CHECK(hf3fs_iovcreate(&iov, too_long, 4096, 0, -1) == -ENAMETOOLONG);
    uint8_t unknown[16] = {1, 2, 3};
    CHECK(hf3fs_iovopen(&iov, unknown, mount, 4096, 0, -1) == -ENOENT);
    if (!hf3fs_gdr_available()) {
        CHECK(hf3fs_gdr_device_count() == 0);
        CHECK(hf3fs_iovcreate_device(&iov, mount, 4096, 0, 0) == -ENOTSUP);
        CHECK(hf3fs_iovopen_device(&iov, unknown, mount, 4096, 0, 0) == -ENOTSUP);
        CHECK(hf3fs_iovwrap_device(&iov, (void *)0x1000, unknown, mount, 4096, 0, 0) == -ENOTSUP);
    }
    CHECK(hf3fs_iovcreate(&iov, mount, 8192, 0, -1) == 0);

    struct hf3fs_ior ior;
    CHECK(hf3fs_iorcreate(&ior, mount, 0, true, 0, -1) == -EINVAL);
    CHECK(hf3fs_iorcreate(&ior, mount, 4097, true, 0, -1) == -EINVAL);
    CHECK(hf3fs_iorcreate(&ior, "/proc", 4, true, 0, -1) == -ENOENT);
    CHECK(hf3fs_ior_size(4) > 0 && hf3fs_ior_size(0) == 0);
    CHECK(hf3fs_iorcreate(&ior, mount, 3, true, 0, -1) == 0);
    CHECK(hf3fs_io_entries(&ior) == 4); /* rounded up to a power of two */
    CHECK(hf3fs_prep_io(&ior, &iov, false, iov.base, fd, 0, 1, NULL) == -EINVAL); /* a read ring */
    CHECK(hf3fs_prep_io(&ior, &iov, true, iov.base, outside, 0, 1, NULL) == -EBADF);
    CHECK(hf3fs_prep_io(&ior, &iov, true, iov.base + 8000, fd, 0, 200, NULL) == -EINVAL);
    CHECK(hf3fs_prep_io(&ior, &iov, true, iov.base - 1, fd, 0, 1, NULL) == -EINVAL);
    CHECK(hf3fs_prep_io(NULL, &iov, true, iov.base, fd, 0, 1, NULL) == -EINVAL);
    for (int i = 0; i < 4; i++) CHECK(hf3fs_prep_io(&ior, &iov, true, iov.base, fd, 0, 1, NULL) == i);
    CHECK(hf3fs_prep_io(&ior, &iov, true, iov.base, fd, 0, 1, NULL) == -EAGAIN);
    CHECK(hf3fs_submit_ios(&ior) == 0);
    struct hf3fs_cqe cqes[4];
    CHECK(hf3fs_wait_for_ios(&ior, cqes, -1, 1, NULL) == -EINVAL);
    CHECK(hf3fs_wait_for_ios(&ior, cqes, 4, 4, NULL) == 4);
    /* A read past the end completes with an error, and the ring goes on. */
    struct stat st;
    fstat(fd, &st);
    CHECK(hf3fs_prep_io(&ior, &iov, true, iov.base, fd, st.st_size + 4096, 100, NULL) >= 0);
    CHECK(hf3fs_submit_ios(&ior) == 0);
    CHECK(hf3fs_wait_for_ios(&ior, cqes, 4, 1, NULL) == 1 && cqes[0].result < 0);
    hf3fs_iordestroy(&ior);

    /* Holes and links over POSIX. */
    size_t start = 4096, end = 8192, bad_end = 100;
    CHECK(hf3fs_punchhole(fd, 1, &start, &bad_end, 0) == EINVAL);
    CHECK(hf3fs_punchhole(fd, 1, &start, &end, 0) == 0);
    unsigned char hole[4096], zeros[4096] = {0};
    CHECK(pread(fd, hole, sizeof hole, 4096) == 4096 && memcmp(hole, zeros, 4096) == 0);
    char link[4096];
    snprintf(link, sizeof link, "%s.link", path);
    CHECK(hf3fs_hardlink(path, link) == 0);
    CHECK(hf3fs_hardlink(path, link) == EEXIST);
    unlink(link);

    hf3fs_dereg_fd(fd);
    hf3fs_iovdestroy(&iov);
    hf3fs_iovdestroy(&iov); /* a second destroy does nothing */
    close(fd);
    close(outside);
    return failures;
}

static int test_lonely(const char *mount, const char *path) {
    char mp[256];
    CHECK(hf3fs_extract_mount_point(mp, sizeof mp, path) == -1);
    int fd = open(path, O_RDWR);
    CHECK(!hf3fs_is_hf3fs(fd));
    CHECK(hf3fs_reg_fd(fd, 0) == EBADF);
    hf3fs_dereg_fd(fd);
    struct hf3fs_iov iov;
    memset(&iov, 0, sizeof iov);
    uint8_t id[16] = {0};
    CHECK(hf3fs_iovcreate(&iov, mount, 4096, 0, -1) == -ENOENT);
    CHECK(hf3fs_iovopen(&iov, id, mount, 4096, 0, -1) == -ENOENT);
    CHECK(!hf3fs_gdr_available() && hf3fs_gdr_device_count() == 0);
    CHECK(hf3fs_iovcreate_device(&iov, mount, 4096, 0, 0) == -ENOTSUP);
    CHECK(iov.iovh == NULL && hf3fs_iov_mem_type(&iov) == HF3FS_MEM_HOST && hf3fs_iovsync(&iov, 0) == -EINVAL);
    hf3fs_iovunlink(&iov);
    hf3fs_iovdestroy(&iov);
    struct hf3fs_ior ior;
    memset(&ior, 0, sizeof ior);
    CHECK(hf3fs_iorcreate4(&ior, mount, 4, true, 0, 0, -1, 0) == -ENOENT);
    CHECK(hf3fs_prep_io(&ior, &iov, true, NULL, fd, 0, 1, NULL) == -EINVAL);
    CHECK(hf3fs_submit_ios(&ior) == -EINVAL && hf3fs_io_entries(&ior) == -EINVAL);
    struct hf3fs_cqe cqe;
    CHECK(hf3fs_wait_for_ios(&ior, &cqe, 1, 1, NULL) == -EINVAL);
    hf3fs_iordestroy(&ior);
    size_t start = 0, end = 4096;
    CHECK(hf3fs_punchhole(fd, 1, &start, &end, 0) == 0);
    close(fd);
    return failures;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: usrbio read|write|publish|open|depth|closed|errors|lonely MOUNT FILE [ID]\n");
        return 2;
    }
    const char *what = argv[1], *mount = argv[2], *file = argv[3];
    int failed = !strcmp(what, "read")      ? test_read(mount, file)
                 : !strcmp(what, "write")   ? test_write(mount, file)
                 : !strcmp(what, "publish") ? test_publish(mount, file)
                 : !strcmp(what, "open") && argc == 5 ? test_open(mount, file, argv[4])
                 : !strcmp(what, "depth")   ? test_depth(mount, file)
                 : !strcmp(what, "closed")  ? test_closed(mount, file)
                 : !strcmp(what, "errors")  ? test_errors(mount, file)
                 : !strcmp(what, "lonely")  ? test_lonely(mount, file)
                                            : -1;
    if (failed < 0) {
        fprintf(stderr, "unknown test %s\n", what);
        return 2;
    }
    return failed ? 1 : 0;
}
