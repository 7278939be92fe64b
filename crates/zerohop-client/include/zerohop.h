/*
 * zerohop.h: the C client of the zerohop I/O agent (`zerohop agent`).
 * Link with -lzerohop_client. Shaped like 3FS USRBIO (hf3fs_iovcreate,
 * hf3fs_iorcreate, hf3fs_reg_fd, hf3fs_prep_io, hf3fs_submit_ios,
 * hf3fs_wait_for_ios), plus GPU memory: zh_iov_wrap_device.
 *
 *   zh_client *c;  zh_client_connect(NULL, &c);        // default socket
 *   zh_iov iov;    zh_iov_create(c, &iov, 64 << 20);   // shared host memory
 *   zh_ior *ior;   zh_ior_create(c, &ior, 64);         // a 64-entry ring
 *   int fd = open("model.safetensors", O_RDONLY);  zh_reg_fd(c, fd);
 *   zh_prep_io(ior, &iov, true, iov.base, fd, 0, 64 << 20, NULL);
 *   zh_submit_ios(ior);
 *   zh_cqe cqe;  zh_wait_for_ios(ior, &cqe, 1, 1, -1);  // cqe.result: bytes or -errno
 *
 * Every function returns 0 (or a count) on success and a negative errno on
 * failure. Completions carry the whole length or a negative errno: EBADF
 * (unregistered fd or buffer), EFAULT (outside the buffer), EINVAL (bad
 * entry, or a read past the end of the file), E2BIG (over 1 GiB), EIO,
 * ENOSPC. zh_wait_for_ios returns -ESHUTDOWN once the agent has closed the
 * session (it stopped, or the client broke the ring's rules).
 *
 * Entries submitted together run in any order (as io_uring without links);
 * writes are durable (fsync) when they complete. A client's registrations
 * end when it closes the client or its process exits.
 */
#ifndef ZEROHOP_H
#define ZEROHOP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct zh_client zh_client;
typedef struct zh_ior zh_ior;

/* A buffer registered with the agent. Filled by zh_iov_create or
 * zh_iov_wrap_device; pass it to zh_prep_io and zh_iov_destroy. */
typedef struct zh_iov {
    uint8_t *base;   /* host address, or the GPU address for device iovs */
    uint64_t size;
    uint32_t id;     /* the agent's id */
    int device;      /* -1: host memory; else the CUDA device */
    void *priv_;     /* owned by the library */
} zh_iov;

typedef struct zh_cqe {
    int64_t result;  /* bytes moved, or -errno */
    void *userdata;  /* as given to zh_prep_io */
} zh_cqe;

/* Connects to the agent at socket_path (NULL: $XDG_RUNTIME_DIR/zerohop.sock,
 * else /tmp/zerohop-UID.sock). */
int zh_client_connect(const char *socket_path, zh_client **out);
/* Ends the session: every registration is released. Destroy iors first. */
void zh_client_close(zh_client *client);

/* size bytes of host memory shared with the agent (iov->base is writable). */
int zh_iov_create(zh_client *client, zh_iov *iov, uint64_t size);
/* Registers GPU memory of this process: ptr may lie anywhere inside a
 * cudaMalloc'd allocation (the library sends the allocation's IPC handle
 * and ptr's offset in it). Finish GPU work on it before submitting I/O. */
int zh_iov_wrap_device(zh_client *client, zh_iov *iov, void *ptr, uint64_t size, int device);
/* Deregisters (and, for zh_iov_create, frees) an iov with no I/O in flight. */
void zh_iov_destroy(zh_client *client, zh_iov *iov);

/* Registers a descriptor this process opened (the agent uses the
 * descriptor, never a path); -EEXIST if it is registered already. */
int zh_reg_fd(zh_client *client, int fd);
int zh_dereg_fd(zh_client *client, int fd);

/* A ring of `entries` (a power of two up to 4096). The client must outlive it. */
int zh_ior_create(zh_client *client, zh_ior **out, int entries);
/* Deregisters and frees a ring with no I/O in flight. */
void zh_ior_destroy(zh_ior *ior);

/* Prepares one I/O: `len` bytes between `ptr` (inside iov) and offset `off`
 * of the registered `fd`; read = file to memory. Returns the number of
 * I/Os prepared and not yet completed, or -EAGAIN when the ring is full. */
int zh_prep_io(zh_ior *ior, const zh_iov *iov, bool read, void *ptr, int fd,
               uint64_t off, uint64_t len, void *userdata);
/* Hands every prepared I/O to the agent (one wake-up). */
int zh_submit_ios(zh_ior *ior);
/* Waits for at least min_results completions (timeout_ms < 0: no limit),
 * copies up to cqec into cqes, returns how many. */
int zh_wait_for_ios(zh_ior *ior, zh_cqe *cqes, int cqec, int min_results, int timeout_ms);

#ifdef __cplusplus
}
#endif

#endif /* ZEROHOP_H */
