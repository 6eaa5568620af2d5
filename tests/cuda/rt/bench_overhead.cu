// Overhead benchmark (timed, not compared): the host-side cost of the runtime
// calls that omps forwards. One line per figure: "BENCH <key> <value> <unit>",
// then PASS. After a warm-up, on a non-blocking stream, each round-trip figure is
// the median of 50 batch means (robust to a hiccup of the machine), the async launch
// and bandwidth figures a mean. See docs/benchmarks.md for what each figure means.
//   bench_overhead [--launches N] [--reps N]
#include "rt_common.h"
#include <algorithm>
#include <vector>

__global__ void empty_k(void) {}

static double now_us(void) { return (double)host_now_ns() / 1000.0; }

static void bench(const char *key, double value, const char *unit) {
    printf("BENCH %s %.3f %s\n", key, value, unit);
    fflush(stdout);
}

// Runs body(i) for i in [0, reps) in 50 batches; the median batch's mean time per call.
template <class F> static double median_batch_us(int reps, F body) {
    const int batches = 50, per = reps / batches > 0 ? reps / batches : 1;
    std::vector<double> means;
    for (int b = 0; b < batches; b++) {
        double t0 = now_us();
        for (int j = 0; j < per; j++) body(b * per + j);
        means.push_back((now_us() - t0) / per);
    }
    std::sort(means.begin(), means.end());
    return means[batches / 2];
}

int main(int argc, char **argv) {
    int launches = 20000, reps = 5000;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--launches")) launches = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else fail("unknown option %s", argv[i]);
    }
    EXPECT(launches > 0 && reps > 0, "bad counts");
    CHECK(cudaSetDevice(0));
    CHECK(cudaFree(0));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int *d;
    CHECK(cudaMalloc(&d, 1 << 20));
    int *pin;
    CHECK(cudaMallocHost(&pin, 4096));
    int pageable[16] = {0};

    // warm-up: module load, first launch, first copies
    for (int i = 0; i < 1000; i++) empty_k<<<1, 1, 0, s>>>();
    CHECK_LAUNCH();
    CHECK(cudaStreamSynchronize(s));

    // 1. async launch: host time of the launch calls alone
    double t0 = now_us();
    for (int i = 0; i < launches; i++) empty_k<<<1, 1, 0, s>>>();
    double t1 = now_us();
    CHECK_LAUNCH();
    CHECK(cudaStreamSynchronize(s));
    bench("launch_async", (t1 - t0) / launches, "us");

    // 2. launch + cudaStreamSynchronize round trip
    bench("launch_sync", median_batch_us(reps, [&](int) {
        empty_k<<<1, 1, 0, s>>>();
        CHECK(cudaStreamSynchronize(s));
    }), "us");
    CHECK_LAUNCH();

    // 3. cudaStreamSynchronize on an idle stream
    bench("sync_idle", median_batch_us(reps * 4, [&](int) { CHECK(cudaStreamSynchronize(s)); }), "us");

    // 4-6. 4-byte copies + sync
    for (int i = 0; i < 100; i++) CHECK(cudaMemcpyAsync(d, pageable, 4, cudaMemcpyHostToDevice, s));
    CHECK(cudaStreamSynchronize(s));
    int last = 0;
    bench("h2d_4b_pageable", median_batch_us(reps, [&](int i) {
        pageable[0] = last = i;
        CHECK(cudaMemcpyAsync(d, pageable, 4, cudaMemcpyHostToDevice, s));
        CHECK(cudaStreamSynchronize(s));
    }), "us");
    bench("d2h_4b_pageable", median_batch_us(reps, [&](int) {
        CHECK(cudaMemcpyAsync(pageable, d, 4, cudaMemcpyDeviceToHost, s));
        CHECK(cudaStreamSynchronize(s));
    }), "us");
    EXPECT(pageable[0] == last, "4-byte copies: got %d, want %d", pageable[0], last);
    bench("d2h_4b_pinned", median_batch_us(reps, [&](int) {
        CHECK(cudaMemcpyAsync(pin, d, 4, cudaMemcpyDeviceToHost, s));
        CHECK(cudaStreamSynchronize(s));
    }), "us");
    EXPECT(pin[0] == last, "pinned 4-byte copies: got %d, want %d", pin[0], last);

    // 7. cudaMalloc + cudaFree of 1 MiB
    for (int i = 0; i < 100; i++) {
        void *p;
        CHECK(cudaMalloc(&p, 1 << 20));
        CHECK(cudaFree(p));
    }
    bench("malloc_free_1mib", median_batch_us(reps / 2, [&](int) {
        void *p;
        CHECK(cudaMalloc(&p, 1 << 20));
        CHECK(cudaFree(p));
    }), "us");

    // 8-9. H2D bandwidth, 256 MiB, pinned and pageable (mean of 5 after a warm-up)
    const size_t big = (size_t)256 << 20;
    unsigned char *dbig, *hpin, *hpage = (unsigned char *)malloc(big);
    EXPECT(hpage, "malloc");
    memset(hpage, 1, big);  // fault the pages in
    CHECK(cudaMalloc(&dbig, big));
    CHECK(cudaMallocHost(&hpin, big));
    memset(hpin, 2, big);
    struct { const char *key; unsigned char *src; } bw[] = {{"h2d_bw_pinned", hpin}, {"h2d_bw_pageable", hpage}};
    for (auto &b : bw) {
        CHECK(cudaMemcpyAsync(dbig, b.src, big, cudaMemcpyHostToDevice, s));
        CHECK(cudaStreamSynchronize(s));
        t0 = now_us();
        for (int i = 0; i < 5; i++) {
            CHECK(cudaMemcpyAsync(dbig, b.src, big, cudaMemcpyHostToDevice, s));
            CHECK(cudaStreamSynchronize(s));
        }
        double us = (now_us() - t0) / 5;
        bench(b.key, (double)big / (us * 1e3), "GB/s");
    }
    unsigned char check = 0;
    CHECK(cudaMemcpy(&check, dbig + big - 1, 1, cudaMemcpyDeviceToHost));
    EXPECT(check == 1, "bandwidth copy: last byte %d", check);

    CHECK(cudaFree(dbig));
    CHECK(cudaFreeHost(hpin));
    CHECK(cudaFree(d));
    CHECK(cudaFreeHost(pin));
    CHECK(cudaStreamDestroy(s));
    free(hpage);
    pass();
}
