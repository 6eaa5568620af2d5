// Shared helpers for the omps end-to-end CUDA test programs.
//
// Every program here uses the CUDA driver API only (cuda.h, -lcuda), loads its
// kernels from an image file at run time, prints deterministic lines only and
// ends with "PASS" (exit 0) or "FAIL: <what>" (exit 1). The same binary is run
// natively, under NVIDIA MPS and under omps (LD_PRELOAD=libomps_shim.so), and
// the outputs of the native and omps runs are compared byte for byte.
#ifndef OMPS_TESTS_CUDA_COMMON_H
#define OMPS_TESTS_CUDA_COMMON_H

#include <cuda.h>

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <string>
#include <vector>

// Print "FAIL: <what>" and exit 1. stdout is flushed so nothing is lost when
// the output goes to a file or pipe.
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

static inline void pass(void) {
    puts("PASS");
    fflush(stdout);
    exit(0);
}

static inline const char *cu_err_name(CUresult r) {
    const char *s = NULL;
    if (cuGetErrorName(r, &s) != CUDA_SUCCESS || s == NULL) return "CUDA_ERROR_<unknown>";
    return s;
}

static inline const char *cu_err_string(CUresult r) {
    const char *s = NULL;
    if (cuGetErrorString(r, &s) != CUDA_SUCCESS || s == NULL) return "<no description>";
    return s;
}

// Check a CUDA driver call; on failure print the call, where, and the error.
#define CHECK(call)                                                                       \
    do {                                                                                  \
        CUresult check_r_ = (call);                                                       \
        if (check_r_ != CUDA_SUCCESS)                                                     \
            fail("%s at %s:%d returned %s (%d): %s", #call, __FILE__, __LINE__,           \
                 cu_err_name(check_r_), (int)check_r_, cu_err_string(check_r_));          \
    } while (0)

// Check that a call returns one specific (error) result.
#define CHECK_EQ_RESULT(call, expected)                                                   \
    do {                                                                                  \
        CUresult check_r_ = (call);                                                       \
        if (check_r_ != (expected))                                                       \
            fail("%s at %s:%d returned %s (%d), expected %s", #call, __FILE__, __LINE__,  \
                 cu_err_name(check_r_), (int)check_r_, cu_err_name(expected));            \
    } while (0)

#define EXPECT(cond, ...)                                                                 \
    do {                                                                                  \
        if (!(cond)) fail(__VA_ARGS__);                                                   \
    } while (0)

// Directory of the running executable (with a trailing '/').
static inline std::string exe_dir(void) {
    char buf[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
    if (n <= 0) return std::string("./");
    buf[n] = '\0';
    std::string s(buf);
    size_t slash = s.rfind('/');
    return slash == std::string::npos ? std::string("./") : s.substr(0, slash + 1);
}

// The kernel image path: the first argument that does not start with "--" and
// is not the value of an option listed in opts_with_value, else
// <dir of executable>/<default_name>.
static inline std::string image_path(int argc, char **argv, const char *default_name,
                                     const char *const *opts_with_value = NULL) {
    for (int i = 1; i < argc; i++) {
        if (strncmp(argv[i], "--", 2) == 0) {
            if (opts_with_value) {
                for (const char *const *o = opts_with_value; *o; o++)
                    if (strcmp(argv[i], *o) == 0) { i++; break; }
            }
            continue;
        }
        return std::string(argv[i]);
    }
    return exe_dir() + default_name;
}

// Read a whole file; append a NUL byte (PTX must be NUL-terminated; harmless
// for cubin/fatbin). The buffer from std::vector<char> is malloc-aligned (16 B).
static inline std::vector<char> load_file(const std::string &path) {
    FILE *f = fopen(path.c_str(), "rb");
    if (!f) fail("cannot open image %s: %s", path.c_str(), strerror(errno));
    std::vector<char> data;
    char chunk[65536];
    size_t n;
    while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0) data.insert(data.end(), chunk, chunk + n);
    if (ferror(f)) fail("cannot read image %s", path.c_str());
    fclose(f);
    if (data.empty()) fail("image %s is empty", path.c_str());
    data.push_back('\0');
    return data;
}

// cuInit + device 0 + its primary context made current.
struct PrimaryCtx {
    CUdevice dev;
    CUcontext ctx;
};

static inline PrimaryCtx init_primary(void) {
    PrimaryCtx p;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&p.dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&p.ctx, p.dev));
    CHECK(cuCtxSetCurrent(p.ctx));
    return p;
}

static inline void release_primary(PrimaryCtx &p) {
    CHECK(cuCtxSynchronize());
    CHECK(cuCtxSetCurrent(NULL));
    CHECK(cuDevicePrimaryCtxRelease(p.dev));
}

static inline uint64_t realtime_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline uint64_t monotonic_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

// Deterministic pseudo-random byte/word for index i under a seed.
static inline uint32_t mix32(uint64_t i, uint32_t seed) {
    uint64_t x = i * 0x9E3779B97F4A7C15ull + seed * 0xBF58476D1CE4E5B9ull + 0x94D049BB133111EBull;
    x ^= x >> 31;
    x *= 0xD6E8FEB86659FD93ull;
    x ^= x >> 29;
    return (uint32_t)x;
}

// Parse an unsigned decimal option value or fail.
static inline unsigned long long parse_u64(const char *opt, const char *s) {
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0') fail("bad value for %s: '%s'", opt, s);
    return v;
}

#endif  // OMPS_TESTS_CUDA_COMMON_H
