/*
 * Reads a file through the zerohop agent into shared memory, 1 MiB per I/O,
 * writes it back out to a second file through the agent, and checks both.
 *
 *   cc -I crates/zerohop-client/include copy_file.c -L target/debug -lzerohop_client
 *   ./a.out SOCKET SRC DST
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "zerohop.h"

#define CHUNK (1u << 20)

static int fail(const char *what, int rc) {
    fprintf(stderr, "%s failed: %s\n", what, strerror(-rc));
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s SOCKET SRC DST\n", argv[0]);
        return 2;
    }
    int src = open(argv[2], O_RDONLY);
    int dst = open(argv[3], O_RDWR | O_CREAT | O_TRUNC, 0644);
    struct stat st;
    if (src < 0 || dst < 0 || fstat(src, &st) != 0) {
        perror("open");
        return 1;
    }
    uint64_t size = (uint64_t)st.st_size;

    zh_client *c;
    zh_iov iov;
    zh_ior *ior;
    int rc;
    if ((rc = zh_client_connect(argv[1], &c)) < 0) return fail("connect", rc);
    if ((rc = zh_iov_create(c, &iov, size ? size : 1)) < 0) return fail("iov_create", rc);
    if ((rc = zh_ior_create(c, &ior, 64)) < 0) return fail("ior_create", rc);
    if ((rc = zh_reg_fd(c, src)) < 0) return fail("reg_fd", rc);
    if ((rc = zh_reg_fd(c, dst)) < 0) return fail("reg_fd", rc);

    for (int pass = 0; pass < 2; pass++) {  /* 0: read src, 1: write dst */
        uint64_t at = 0;
        while (at < size) {
            int prepared = 0;
            while (at < size && prepared < 64) {
                uint64_t len = size - at < CHUNK ? size - at : CHUNK;
                rc = zh_prep_io(ior, &iov, pass == 0, iov.base + at, pass == 0 ? src : dst, at, len,
                                (void *)(uintptr_t)at);
                if (rc < 0) return fail("prep_io", rc);
                at += len;
                prepared++;
            }
            if ((rc = zh_submit_ios(ior)) < 0) return fail("submit_ios", rc);
            zh_cqe cqes[64];
            int got = 0;
            while (got < prepared) {
                rc = zh_wait_for_ios(ior, cqes, 64, 1, 10000);
                if (rc <= 0) return fail("wait_for_ios", rc ? rc : -110);
                for (int i = 0; i < rc; i++)
                    if (cqes[i].result < 0) return fail("an I/O", (int)cqes[i].result);
                got += rc;
            }
        }
    }

    /* Check: the shared memory and the new file hold the source's bytes. */
    unsigned char *want = malloc(size ? size : 1), *copy = malloc(size ? size : 1);
    if (pread(src, want, size, 0) != (ssize_t)size || pread(dst, copy, size, 0) != (ssize_t)size ||
        memcmp(want, iov.base, size) != 0 || memcmp(want, copy, size) != 0) {
        fprintf(stderr, "contents differ\n");
        return 1;
    }
    printf("copied %llu bytes through the agent\n", (unsigned long long)size);
    zh_dereg_fd(c, src);
    zh_dereg_fd(c, dst);
    zh_ior_destroy(ior);
    zh_iov_destroy(c, &iov);
    zh_client_close(c);
    free(want);
    free(copy);
    return 0;
}
