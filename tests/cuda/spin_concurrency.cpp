// spin_concurrency: the concurrency benchmark. 500 launches of a 4-block x
// 128-thread kernel whose threads each spin 200 us on %globaltimer, on the
// default stream (stream 0), cuStreamSynchronize every 50 launches.
//
// usage: spin_concurrency [image.cubin] [--start-at NS] [--launches N]
//                         [--spin-us U] [--sync-every K]
//   --start-at NS  after init, module load and one warm-up launch+sync, sleep
//                  until this CLOCK_REALTIME instant (epoch ns), then run.
// Prints "TIMES <start_ns> <end_ns>" (CLOCK_REALTIME around the timed part)
// and PASS. If the start instant had already passed, prints "LATE <ms>" to
// stderr. A script computes makespan = max(end) - min(start) over copies.
#include "common.h"

int main(int argc, char **argv) {
    static const char *const value_opts[] = {"--start-at", "--launches", "--spin-us",
                                             "--sync-every", NULL};
    unsigned long long start_at = 0, launches = 500, spin_us = 200, sync_every = 50;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--", 2) != 0) continue;
        if (i + 1 >= argc) fail("%s needs a value", a);
        unsigned long long v = parse_u64(a, argv[++i]);
        if (strcmp(a, "--start-at") == 0) start_at = v;
        else if (strcmp(a, "--launches") == 0) launches = v;
        else if (strcmp(a, "--spin-us") == 0) spin_us = v;
        else if (strcmp(a, "--sync-every") == 0) sync_every = v;
        else fail("unknown option %s", a);
    }
    if (sync_every == 0) fail("--sync-every must be > 0");
    std::string path = image_path(argc, argv, "spin.cubin", value_opts);

    PrimaryCtx p = init_primary();
    std::vector<char> image = load_file(path);
    CUmodule mod;
    CHECK(cuModuleLoadData(&mod, image.data()));
    CUfunction fn;
    CHECK(cuModuleGetFunction(&fn, mod, "spin"));
    CUdeviceptr dcount;
    CHECK(cuMemAlloc(&dcount, sizeof(unsigned)));
    CHECK(cuMemsetD32(dcount, 0, 1));

    unsigned long long spin_ns = spin_us * 1000ull;
    void *params[] = {&spin_ns, &dcount};
    // Warm-up.
    CHECK(cuLaunchKernel(fn, 4, 1, 1, 128, 1, 1, 0, NULL, params, NULL));
    CHECK(cuStreamSynchronize(NULL));

    if (start_at) {
        uint64_t now = realtime_ns();
        if (now > start_at) {
            fprintf(stderr, "LATE %.1f ms\n", (double)(now - start_at) / 1e6);
        } else {
            struct timespec ts;
            ts.tv_sec = (time_t)(start_at / 1000000000ull);
            ts.tv_nsec = (long)(start_at % 1000000000ull);
            int e;
            while ((e = clock_nanosleep(CLOCK_REALTIME, TIMER_ABSTIME, &ts, NULL)) == EINTR) {
            }
            if (e != 0) fail("clock_nanosleep: %s", strerror(e));
        }
    }

    uint64_t t_start = realtime_ns();
    for (unsigned long long i = 0; i < launches; i++) {
        CHECK(cuLaunchKernel(fn, 4, 1, 1, 128, 1, 1, 0, NULL, params, NULL));
        if ((i + 1) % sync_every == 0) CHECK(cuStreamSynchronize(NULL));
    }
    CHECK(cuStreamSynchronize(NULL));
    uint64_t t_end = realtime_ns();

    unsigned count = 0;
    CHECK(cuMemcpyDtoH(&count, dcount, sizeof(count)));
    if (count != launches + 1)
        fail("kernel ran %u times, expected %llu", count, launches + 1);
    printf("TIMES %llu %llu\n", (unsigned long long)t_start, (unsigned long long)t_end);
    CHECK(cuMemFree(dcount));
    CHECK(cuModuleUnload(mod));
    release_primary(p);
    pass();
}
