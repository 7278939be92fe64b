// What the C probes share: a monotonic clock in seconds, and an exit that
// says which call failed.
#ifndef ZEROHOP_PROBE_H
#define ZEROHOP_PROBE_H

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static inline double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static inline void die(const char *what) {
    perror(what);
    exit(1);
}

#endif
