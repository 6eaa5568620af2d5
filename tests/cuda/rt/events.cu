// Events: default, blocking-sync and disable-timing flags; query before record,
// while pending and after; cudaEventSynchronize; elapsed time (only bounds
// checked); the errors for timing a disable-timing event and an unfinished one.
#include "rt_common.h"

int main() {
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaEvent_t start, stop, blocking, notiming;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreateWithFlags(&stop, cudaEventDefault));
    CHECK(cudaEventCreateWithFlags(&blocking, cudaEventBlockingSync));
    CHECK(cudaEventCreateWithFlags(&notiming, cudaEventDisableTiming | cudaEventBlockingSync));
    printf("query never recorded: %s\n", cudaGetErrorName(cudaEventQuery(stop)));

    int *v;
    CHECK(cudaMalloc(&v, sizeof(int)));
    CHECK(cudaEventRecord(start, s));
    sleep_then_write<<<1, 1, 0, s>>>(v, 5, 200 * 1000 * 1000ull);
    CHECK_LAUNCH();
    CHECK(cudaEventRecord(stop, s));
    CHECK(cudaEventRecord(blocking, s));
    CHECK(cudaEventRecord(notiming, s));
    cudaError_t q = cudaEventQuery(stop);
    printf("query pending: %s\n", cudaGetErrorName(q));
    EXPECT(q == cudaErrorNotReady, "query of a pending event gave %s", cudaGetErrorName(q));
    (void)cudaGetLastError();
    float ms = -1;
    q = cudaEventElapsedTime(&ms, start, stop);
    printf("elapsed with stop pending: %s\n", cudaGetErrorName(q));
    EXPECT(q == cudaErrorNotReady, "elapsed time of a pending event gave %s", cudaGetErrorName(q));
    (void)cudaGetLastError();

    CHECK(cudaEventSynchronize(blocking));  // blocking-sync wait
    printf("query after blocking-sync wait: %s\n", cudaGetErrorName(cudaEventQuery(stop)));
    CHECK(cudaEventSynchronize(notiming));
    CHECK(cudaEventSynchronize(stop));
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    printf("elapsed >= 150 ms and < 60 s: %s\n", yes_no(ms >= 150.0f && ms < 60000.0f));
    EXPECT(ms >= 150.0f && ms < 60000.0f, "elapsed %f ms", ms);
    float rev = 0;
    CHECK(cudaEventElapsedTime(&rev, stop, start));
    printf("reversed elapsed is negative: %s\n", yes_no(rev < 0));

    q = cudaEventElapsedTime(&ms, start, notiming);
    EXPECT(q != cudaSuccess, "timing a disable-timing event succeeded");
    report_err("elapsed with a disable-timing event", q);

    // re-record the same event: it now marks later work
    CHECK(cudaEventRecord(start, s));
    sleep_then_write<<<1, 1, 0, s>>>(v, 6, 20 * 1000 * 1000ull);
    CHECK_LAUNCH();
    CHECK(cudaEventRecord(stop, s));
    CHECK(cudaEventSynchronize(stop));
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    printf("re-recorded elapsed >= 15 ms: %s\n", yes_no(ms >= 15.0f));
    int h = 0;
    CHECK(cudaMemcpy(&h, v, sizeof h, cudaMemcpyDeviceToHost));
    printf("value: %d\n", h);
    EXPECT(h == 6, "value %d", h);

    // an event recorded on the legacy default stream
    CHECK(cudaEventRecord(blocking, 0));
    CHECK(cudaEventSynchronize(blocking));
    printf("query legacy-stream event: %s\n", cudaGetErrorName(cudaEventQuery(blocking)));

    CHECK(cudaEventDestroy(start));
    CHECK(cudaEventDestroy(stop));
    CHECK(cudaEventDestroy(blocking));
    CHECK(cudaEventDestroy(notiming));
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(v));
    pass();
}
