// A probe of the hot route's ceiling on the GPU machine, one knob at a time:
// threads copy chunks of an mmap'ed (page-cache) file into pinned slots of
// their own and queue each slot's copy to the device on their own stream.
// zerohop's engine does the same with more around it; where the two differ,
// this says which knob explains it. Built and run by `scripts/gpu.sh device
// probe` (nvcc on that machine); not part of the product.
//
//   hot_copy FILE [--threads N] [--chunk MiB] [--slots N] [--dontneed]
//            [--wait block|poll|auto] [--register] [--populate] [--reps N]
//
// Prints GB/s timed from the first copy to the last completion (the mapping,
// device memory and slots are made before the clock), and GB/s as a caller
// would wait: mmap and munmap included. Checks a sample of the bytes.
#include <cuda_runtime.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#define CK(x)                                                              \
    do {                                                                   \
        cudaError_t e_ = (x);                                              \
        if (e_ != cudaSuccess) {                                           \
            fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_));       \
            exit(1);                                                       \
        }                                                                  \
    } while (0)

struct Options {
    const char *file = nullptr;
    int threads = 16, slots = 4, reps = 3;
    size_t chunk = 2 << 20;
    bool dontneed = false, reg = false, populate = false;
    std::string wait = "block";
};

static double now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

static double cpu_seconds() {
    rusage r;
    getrusage(RUSAGE_SELF, &r);
    return r.ru_utime.tv_sec + r.ru_stime.tv_sec + (r.ru_utime.tv_usec + r.ru_stime.tv_usec) / 1e6;
}

static void wait_event(cudaEvent_t ev, const std::string &mode) {
    if (mode == "poll") {
        while (cudaEventQuery(ev) == cudaErrorNotReady) {
            __builtin_ia32_pause();
        }
    }
    CK(cudaEventSynchronize(ev));
}

int main(int argc, char **argv) {
    Options o;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        auto next = [&]() { return std::string(argv[++i]); };
        if (a == "--threads") o.threads = std::stoi(next());
        else if (a == "--chunk") o.chunk = std::stoul(next()) << 20;
        else if (a == "--slots") o.slots = std::stoi(next());
        else if (a == "--reps") o.reps = std::stoi(next());
        else if (a == "--wait") o.wait = next();
        else if (a == "--dontneed") o.dontneed = true;
        else if (a == "--register") o.reg = true;
        else if (a == "--populate") o.populate = true;
        else o.file = argv[i];
    }
    int fd = open(o.file, O_RDONLY);
    if (fd < 0) { perror(o.file); return 1; }
    struct stat st;
    fstat(fd, &st);
    size_t size = st.st_size;
    CK(cudaSetDevice(0));
    char *dev;
    CK(cudaMalloc(&dev, size));
    unsigned ev_flags = cudaEventDisableTiming | (o.wait == "block" ? cudaEventBlockingSync : 0);
    struct Lane {
        cudaStream_t stream;
        std::vector<char *> slot;
        std::vector<cudaEvent_t> done;
    };
    std::vector<Lane> lanes(o.threads);
    for (auto &l : lanes) {
        CK(cudaStreamCreateWithFlags(&l.stream, cudaStreamNonBlocking));
        for (int s = 0; s < o.slots; s++) {
            char *p;
            if (o.reg) {
                p = static_cast<char *>(aligned_alloc(4096, o.chunk));
                memset(p, 0, o.chunk);
                CK(cudaHostRegister(p, o.chunk, cudaHostRegisterPortable));
            } else {
                CK(cudaHostAlloc(reinterpret_cast<void **>(&p), o.chunk, cudaHostAllocPortable));
                memset(p, 0, o.chunk);
            }
            cudaEvent_t ev;
            CK(cudaEventCreateWithFlags(&ev, ev_flags));
            l.slot.push_back(p);
            l.done.push_back(ev);
        }
    }
    for (int rep = 0; rep < o.reps; rep++) {
        CK(cudaMemset(dev, 0, size));
        CK(cudaDeviceSynchronize());
        double t0 = now(), c0 = cpu_seconds();
        char *map = static_cast<char *>(mmap(nullptr, size, PROT_READ, MAP_SHARED | (o.populate ? MAP_POPULATE : 0), fd, 0));
        if (map == MAP_FAILED) { perror("mmap"); return 1; }
        double t1 = now();
        std::atomic<size_t> cursor{0};
        std::vector<std::thread> workers;
        for (int t = 0; t < o.threads; t++) {
            workers.emplace_back([&, t]() {
                Lane &l = lanes[t];
                std::vector<bool> busy(o.slots, false);
                for (int k = 0;; k++) {
                    size_t off = cursor.fetch_add(o.chunk);
                    if (off >= size) break;
                    size_t len = std::min(o.chunk, size - off);
                    int s = k % o.slots;
                    if (busy[s]) wait_event(l.done[s], o.wait);
                    memcpy(l.slot[s], map + off, len);
                    if (o.dontneed) {
                        size_t a = (off + 4095) & ~size_t(4095), b = (off + len) & ~size_t(4095);
                        if (b > a) madvise(map + a, b - a, MADV_DONTNEED);
                    }
                    CK(cudaMemcpyAsync(dev + off, l.slot[s], len, cudaMemcpyHostToDevice, l.stream));
                    CK(cudaEventRecord(l.done[s], l.stream));
                    busy[s] = true;
                }
                for (int s = 0; s < o.slots; s++)
                    if (busy[s]) wait_event(l.done[s], o.wait);
            });
        }
        for (auto &w : workers) w.join();
        double t2 = now();
        munmap(map, size);
        double t3 = now(), c3 = cpu_seconds();
        // Check 64 KiB at 32 places, the last chunk among them.
        size_t bad = 0;
        std::vector<char> want(64 << 10), got(64 << 10);
        for (int i = 0; i < 32; i++) {
            size_t off = i == 31 ? size - want.size() : (size / 32) * i + i * 4097 % 65536;
            if (pread(fd, want.data(), want.size(), off) != (ssize_t)want.size()) { perror("pread"); return 1; }
            CK(cudaMemcpy(got.data(), dev + off, got.size(), cudaMemcpyDeviceToHost));
            bad += memcmp(want.data(), got.data(), want.size()) != 0;
        }
        printf("probe  %6.2f GB/s transfer  %6.2f GB/s with mmap+munmap (mmap %.3f s, munmap %.3f s)  cpu %.2f s  %s"
               "  threads %d chunk %zuMiB slots %d wait %s%s%s%s\n",
               size / (t2 - t1) / 1e9, size / (t3 - t0) / 1e9, t1 - t0, t3 - t2, c3 - c0,
               bad ? "BYTES WRONG" : "bytes ok", o.threads, o.chunk >> 20, o.slots, o.wait.c_str(),
               o.dontneed ? " dontneed" : "", o.reg ? " register" : "", o.populate ? " populate" : "");
        fflush(stdout);
        if (bad) return 1;
    }
    return 0;
}
