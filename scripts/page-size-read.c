// How fast two threads read 1 GiB on 4 KiB pages against the same on transparent huge pages: the
// fact behind the benches' bandwidth pass reading memory of the packed weights' kind
// (examples/membw.rs, docs/cpu.md).
//
//   cc -O3 -march=native -fopenmp scripts/page-size-read.c -o /tmp/page-size-read
//   /tmp/page-size-read
//
// Maps two 1 GiB buffers, advises one MADV_HUGEPAGE before touching it (what THP's `madvise` mode
// needs), fills both, then five times prints the best of seven alternating passes over each and
// finally how much of the process is on huge pages (AnonHugePages).
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define BYTES (1ul << 30)
#define HUGE (2ul << 20)

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static double pass(const uint64_t *b, size_t n) {
    double t = now();
    uint64_t s = 0;
#pragma omp parallel for reduction(+ : s) num_threads(2) schedule(static)
    for (size_t i = 0; i < n; i++) s += b[i];
    t = now() - t;
    if (s == 42) puts("");
    return n * 8 / t / 1e9;
}

static uint64_t *map(int huge) {
    char *p = mmap(0, BYTES + HUGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) { perror("mmap"); return 0; }
    p = (char *)(((uintptr_t)p + HUGE - 1) & ~(uintptr_t)(HUGE - 1));
    if (huge && madvise(p, BYTES, MADV_HUGEPAGE) != 0) perror("madvise");
    return (uint64_t *)p;
}

int main(void) {
    size_t n = BYTES / 8;
    uint64_t *small = map(0), *huge = map(1);
    if (!small || !huge) return 1;
    for (size_t i = 0; i < n; i++) small[i] = huge[i] = i;
    for (int round = 0; round < 5; round++) {
        double best_small = 0, best_huge = 0;
        for (int p = 0; p < 7; p++) {
            double a = pass(small, n), b = pass(huge, n);
            if (a > best_small) best_small = a;
            if (b > best_huge) best_huge = b;
        }
        printf("4 KiB pages %.2f GB/s  huge pages %.2f GB/s  (%.2fx)\n", best_small, best_huge, best_huge / best_small);
    }
    FILE *f = fopen("/proc/self/smaps_rollup", "r");
    char line[256];
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "AnonHugePages", 13)) fputs(line, stdout);
    return 0;
}
