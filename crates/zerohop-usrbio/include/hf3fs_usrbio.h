/*
 * hf3fs_usrbio.h: 3FS's USRBIO interface, served by zerohop's agent on any
 * POSIX file system (libhf3fs_api_shared.so from crates/zerohop-usrbio).
 * Names, layouts and return conventions follow 3FS's public declarations,
 * so programs written for USRBIO build and run unchanged.
 *
 * A "mount point" is a directory a zerohop agent serves
 * (`zerohop agent --serve DIR`). The library finds agents at the sockets
 * in ZEROHOP_AGENT_SOCKET (colon-separated; default: the agent's default
 * socket) and asks each which directories it serves.
 *
 * Device memory (GPU) calls return -ENOTSUP where no CUDA GPU is usable;
 * they never fall back to host memory.
 */
#ifndef HF3FS_USRBIO_H
#define HF3FS_USRBIO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#ifdef __cplusplus
extern "C" {
#endif

#define HF3FS_SUPER_MAGIC 0x8f3f5fff

typedef void *hf3fs_iov_handle;
typedef void *hf3fs_ior_handle;

/* Memory the agent reads into and writes from. Caller-allocated; filled
 * by the create, open and wrap calls. */
struct hf3fs_iov {
    uint8_t *base;          /* host address, or device address */
    hf3fs_iov_handle iovh;  /* the library's */
    char id[16];            /* another process opens the iov by it */
    char mount_point[256];
    size_t size;
    size_t block_size;
    int numa;
};

/* A ring of I/Os. Caller-allocated; filled by hf3fs_iorcreate*. */
struct hf3fs_ior {
    struct hf3fs_iov iov;
    hf3fs_ior_handle iorh;  /* the library's */
    char mount_point[256];
    bool for_read;          /* a ring takes reads only, or writes only */
    /* > 0: hand the agent exactly io_depth I/Os at a time (a partial batch
     *      waits for more, or for `timeout` ms when timeout > 0);
     * = 0: hand over every prepared I/O at hf3fs_submit_ios;
     * < 0: as 0, with at most -io_depth I/Os at the agent at once. */
    int io_depth;
    int priority;           /* accepted; the agent has one queue per ring */
    int timeout;            /* ms, see io_depth */
    uint64_t flags;         /* HF3FS_IOR_*; accepted (POSIX reads see every
                               completed write, and holes read as zeros) */
};

struct hf3fs_cqe {
    int32_t index;          /* as hf3fs_prep_io returned */
    int32_t reserved;
    int64_t result;         /* bytes moved, or -errno */
    const void *userdata;   /* as given to hf3fs_prep_io */
};

#define HF3FS_IOR_ALLOW_READ_UNCOMMITTED 1
#define HF3FS_IOR_FORBID_READ_HOLES 2

enum hf3fs_mem_type {
    HF3FS_MEM_HOST = 0,
    HF3FS_MEM_DEVICE = 1,
    HF3FS_MEM_MANAGED = 2,
};

/* Whether fd is a file under a served directory. */
bool hf3fs_is_hf3fs(int fd);
/* Writes the served directory holding `path` (which need not exist yet)
 * and returns its length + 1; -1 if no agent serves it. A return larger
 * than `size` means the buffer was too small (nothing written). */
int hf3fs_extract_mount_point(char *hf3fs_mount_point, int size, const char *path);

/* Host memory shared with the agent. 0 or -errno. */
int hf3fs_iovcreate(struct hf3fs_iov *iov, const char *hf3fs_mount_point, size_t size, size_t block_size,
                    int numa);
/* Maps another process's iov (by its id) and registers it here. */
int hf3fs_iovopen(struct hf3fs_iov *iov, const uint8_t id[16], const char *hf3fs_mount_point, size_t size,
                  size_t block_size, int numa);
/* An iov over memory this process already maps at `base`: the iov `id`
 * (published by this or another process) seen through that mapping.
 * hf3fs_iovdestroy deregisters it and leaves the mapping alone. */
int hf3fs_iovwrap(struct hf3fs_iov *iov, void *base, const uint8_t id[16], const char *hf3fs_mount_point,
                  size_t size, size_t block_size, int numa);
/* No other process can open the iov by its id any more. */
void hf3fs_iovunlink(struct hf3fs_iov *iov);
/* Deregisters and frees what the library made (not `iov` itself). */
void hf3fs_iovdestroy(struct hf3fs_iov *iov);

/* GPU memory. block_size must be 0. -ENOTSUP without a usable GPU. */
int hf3fs_iovcreate_device(struct hf3fs_iov *iov, const char *hf3fs_mount_point, size_t size,
                           size_t block_size, int device_id);
int hf3fs_iovopen_device(struct hf3fs_iov *iov, const uint8_t id[16], const char *hf3fs_mount_point,
                         size_t size, size_t block_size, int device_id);
/* device_ptr may lie anywhere inside a cudaMalloc'd allocation; the iov is
 * published under `id` for hf3fs_iovopen_device. */
int hf3fs_iovwrap_device(struct hf3fs_iov *iov, void *device_ptr, const uint8_t id[16],
                         const char *hf3fs_mount_point, size_t size, size_t block_size, int device_id);
/* Finishes this process's GPU work (either direction) before I/O. */
int hf3fs_iovsync(const struct hf3fs_iov *iov, int direction);
bool hf3fs_gdr_available(void);
int hf3fs_gdr_device_count(void);
enum hf3fs_mem_type hf3fs_iov_mem_type(const struct hf3fs_iov *iov);
/* The CUDA device of a device iov; -1 for host memory. */
int hf3fs_iov_device_id(const struct hf3fs_iov *iov);

/* Bytes of shared memory a ring of `entries` takes. */
size_t hf3fs_ior_size(int entries);
/* entries: up to 4096 (rounded up to a power of two). 0 or -errno. */
int hf3fs_iorcreate(struct hf3fs_ior *ior, const char *hf3fs_mount_point, int entries, bool for_read,
                    int io_depth, int numa);
int hf3fs_iorcreate2(struct hf3fs_ior *ior, const char *hf3fs_mount_point, int entries, bool for_read,
                     int io_depth, int priority, int numa);
int hf3fs_iorcreate3(struct hf3fs_ior *ior, const char *hf3fs_mount_point, int entries, bool for_read,
                     int io_depth, int priority, int timeout, int numa);
int hf3fs_iorcreate4(struct hf3fs_ior *ior, const char *hf3fs_mount_point, int entries, bool for_read,
                     int io_depth, int timeout, int numa, uint64_t flags);
void hf3fs_iordestroy(struct hf3fs_ior *ior);
int hf3fs_io_entries(const struct hf3fs_ior *ior);

/* 0 (<= 0) on success, a positive errno on error: EBADF for a descriptor
 * not under a served directory, EINVAL for a number registered already
 * (even if its file was closed since: the registered file stays open in
 * the agent until hf3fs_dereg_fd). */
int hf3fs_reg_fd(int fd, uint64_t flags);
void hf3fs_dereg_fd(int fd);

/* Prepares one I/O of `len` bytes between `ptr` (inside iov) and offset
 * `off` of the registered fd. Returns its index (>= 0) or -errno: EINVAL
 * (a read on a write ring or the reverse, ptr outside iov, iov and ring of
 * different agents), EBADF (fd not registered), EAGAIN (ring full). Not
 * thread-safe for one ring. */
int hf3fs_prep_io(const struct hf3fs_ior *ior, const struct hf3fs_iov *iov, bool read, void *ptr, int fd,
                  size_t off, uint64_t len, const void *userdata);
/* 0 or -errno. */
int hf3fs_submit_ios(const struct hf3fs_ior *ior);
/* Waits for at least min_results completions, or until abs_timeout
 * (CLOCK_REALTIME; NULL: no limit), and returns how many it wrote (up to
 * cqec), or -errno. Never waits for I/Os that cannot complete (not handed
 * over under io_depth > 0 without a timeout). */
int hf3fs_wait_for_ios(const struct hf3fs_ior *ior, struct hf3fs_cqe *cqes, int cqec, int min_results,
                       const struct timespec *abs_timeout);

/* link(2) and fallocate(2)'s hole punching (end exclusive) over POSIX:
 * 0 or a positive errno. */
int hf3fs_hardlink(const char *target, const char *link_name);
int hf3fs_punchhole(int fd, int n, const size_t *start, const size_t *end, size_t flags);

#ifdef __cplusplus
}
#endif

#endif
