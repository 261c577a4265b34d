// How fast one core reads memory that another core has just prefetched, against reading it cold:
// the fact behind backend-cpu's read-ahead policy (kernels::read_ahead::Policy, docs/cpu.md).
//
//   cc -O2 -mavx512f -pthread scripts/cross-core-read.c -o /tmp/cross-core-read
//   /tmp/cross-core-read        # reader on CPU 0, toucher on CPU 1 (another core on a 2-vCPU VM
//                               # whose vCPUs are cores; check lscpu's threads per core)
//
// For 2 to 32 MiB, each of five tries evicts the caches (reads 256 MiB of other memory), lets the
// thread pinned to CPU 1 touch the buffer (nothing; prefetcht1; prefetcht2; loads; prefetcht0),
// then reads it on the thread pinned to CPU 0; prints the median GB/s of each.
#define _GNU_SOURCE
#include <immintrin.h>
#include <sched.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define EVICT (1024L << 20)
static char *evict_buf, *buf;
static size_t n;
static int mode;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void evict(void) {
    static size_t off = 0;
    __m512i a = _mm512_setzero_si512();
    for (size_t i = 0; i < (256L << 20); i += 64) a = _mm512_xor_si512(a, _mm512_load_si512(evict_buf + (off + i) % EVICT));
    off += 256L << 20;
    __asm__ volatile("" ::"v"(a));
}

static void pin(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (pthread_setaffinity_np(pthread_self(), sizeof set, &set) != 0) {
        fprintf(stderr, "cannot pin a thread to CPU %d\n", cpu);
        exit(1);
    }
}

static void *touch(void *unused) {
    (void)unused;
    pin(1);
    __m512i a = _mm512_setzero_si512();
    for (size_t i = 0; i < n; i += 64) {
        switch (mode) {
        case 1: _mm_prefetch(buf + i, _MM_HINT_T1); break;
        case 2: _mm_prefetch(buf + i, _MM_HINT_T2); break;
        case 3: a = _mm512_xor_si512(a, _mm512_load_si512(buf + i)); break;
        case 4: _mm_prefetch(buf + i, _MM_HINT_T0); break;
        }
    }
    __asm__ volatile("" ::"v"(a));
    return 0;
}

static double read_gb_s(void) {
    double t0 = now();
    __m512i a = _mm512_setzero_si512();
    for (size_t i = 0; i < n; i += 64) a = _mm512_xor_si512(a, _mm512_load_si512(buf + i));
    __asm__ volatile("" ::"v"(a));
    return n / (now() - t0) / 1e9;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(void) {
    pin(0);
    evict_buf = aligned_alloc(64, EVICT);
    buf = aligned_alloc(64, 32L << 20);
    memset(evict_buf, 1, EVICT);
    memset(buf, 1, 32L << 20);
    const char *names[] = {"cold", "prefetcht1", "prefetcht2", "loads", "prefetcht0"};
    for (size_t mib = 2; mib <= 32; mib *= 2) {
        n = mib << 20;
        printf("%2zu MiB:", mib);
        for (mode = 0; mode < 5; mode++) {
            double runs[5];
            for (int r = 0; r < 5; r++) {
                evict();
                pthread_t t;
                pthread_create(&t, 0, touch, 0);
                pthread_join(t, 0);
                runs[r] = read_gb_s();
            }
            qsort(runs, 5, sizeof runs[0], by_value);
            printf("  %s %.1f", names[mode], runs[2]);
        }
        printf(" GB/s (one reader)\n");
    }
    return 0;
}
