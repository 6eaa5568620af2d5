// Shared helpers for the runtime-API (cudart) test programs of tests/cuda/rt/.
//
// Each program is one .cu file built by nvcc with its default flags (static
// cudart, plus -arch=sm_90), so it reaches the driver the way unmodified
// programs do: cudart dlopens libcuda.so.1. Each prints deterministic lines
// only (no timings, pointers or free memory) and ends with "PASS" (exit 0) or
// "FAIL: <what>" (exit 1), so the native and omps outputs can be diffed.
#ifndef OMPS_TESTS_CUDA_RT_COMMON_H
#define OMPS_TESTS_CUDA_RT_COMMON_H

#include <cuda_runtime.h>

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

// Print "FAIL: <what>" and exit 1 (stdout flushed first).
static inline void fail(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
static inline void fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("FAIL: ", stdout);
    vprintf(fmt, ap);
    fputc('\n', stdout);
    va_end(ap);
    fflush(stdout);
    exit(1);
}

static inline void pass(void) __attribute__((noreturn));
static inline void pass(void) {
    puts("PASS");
    fflush(stdout);
    exit(0);
}

// Check a runtime call; on failure print the call, where, and the error.
#define CHECK(call)                                                                      \
    do {                                                                                 \
        cudaError_t check_e_ = (call);                                                   \
        if (check_e_ != cudaSuccess)                                                     \
            fail("%s at %s:%d returned %s (%d): %s", #call, __FILE__, __LINE__,          \
                 cudaGetErrorName(check_e_), (int)check_e_, cudaGetErrorString(check_e_)); \
    } while (0)

// Check that a call returns one specific error, then clear the (non-sticky)
// last error so that later launch checks do not see it.
#define CHECK_ERR(call, expected)                                                        \
    do {                                                                                 \
        cudaError_t check_e_ = (call);                                                   \
        if (check_e_ != (expected))                                                      \
            fail("%s at %s:%d returned %s (%d), expected %s", #call, __FILE__, __LINE__, \
                 cudaGetErrorName(check_e_), (int)check_e_, cudaGetErrorName(expected)); \
        (void)cudaGetLastError();                                                        \
    } while (0)

// After a <<<...>>> launch: the launch itself must have been accepted.
#define CHECK_LAUNCH() CHECK(cudaGetLastError())

#define EXPECT(cond, ...)                                                                \
    do {                                                                                 \
        if (!(cond)) fail(__VA_ARGS__);                                                  \
    } while (0)

// A call that must fail: print "<label>: <error name>" (the name is compared
// between native and omps), clear the last error, and return the error.
static inline cudaError_t report_err(const char *label, cudaError_t e) {
    printf("%s: %s\n", label, cudaGetErrorName(e));
    (void)cudaGetLastError();
    return e;
}

static inline const char *yes_no(bool b) { return b ? "yes" : "no"; }

// Deterministic pseudo-random word for index i under a seed (host and device).
__host__ __device__ static inline uint32_t mix32(uint64_t i, uint32_t seed) {
    uint64_t x = i * 0x9E3779B97F4A7C15ull + seed * 0xBF58476D1CE4E5B9ull + 0x94D049BB133111EBull;
    x ^= x >> 31;
    x *= 0xD6E8FEB86659FD93ull;
    x ^= x >> 29;
    return (uint32_t)x;
}

// FNV-1a of a buffer: printed as a checksum of results.
static inline uint32_t fnv1a(const void *p, size_t n) {
    const unsigned char *b = (const unsigned char *)p;
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 16777619u;
    return h;
}

// Device-side clock in nanoseconds (%globaltimer).
__device__ static inline uint64_t gtimer_ns(void) {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ static inline void dev_sleep_ns(uint64_t ns) {
    uint64_t t0 = gtimer_ns();
    while (gtimer_ns() - t0 < ns) __nanosleep(1000);
}

// One thread sleeps ns, then writes *p = v (with a fence).
__global__ static void sleep_then_write(int *p, int v, uint64_t ns) {
    dev_sleep_ns(ns);
    *(volatile int *)p = v;
    __threadfence_system();
}

// Spin until *flag == want or timeout_ns passes; *seen = 1 if it was seen.
__global__ static void wait_flag(const int *flag, int want, int *seen, uint64_t timeout_ns) {
    uint64_t t0 = gtimer_ns();
    int ok = 0;
    while (gtimer_ns() - t0 < timeout_ns) {
        if (*(const volatile int *)flag == want) { ok = 1; break; }
        __nanosleep(200);
    }
    *seen = ok;
    __threadfence_system();
}

// *dst = *src (one thread).
__global__ static void copy_int(int *dst, const int *src) { *dst = *(const volatile int *)src; }

static inline uint64_t host_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline void host_sleep_us(unsigned us) {
    struct timespec ts = {(time_t)(us / 1000000), (long)(us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

#endif  // OMPS_TESTS_CUDA_RT_COMMON_H
