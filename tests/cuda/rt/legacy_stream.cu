// The legacy default stream (default build): work on it waits for all blocking
// streams and blocking streams wait for it; non-blocking streams and two
// blocking streams do not wait for each other. Sleeps make a missing implicit
// synchronisation visible as a stale value; spins with a timeout make a
// missing concurrency visible as "not seen".
#include "rt_common.h"

static const uint64_t MS = 1000 * 1000ull;

int main() {
    int *v, *out, *flag, *seen, h = -1;
    CHECK(cudaMalloc(&v, sizeof(int)));
    CHECK(cudaMalloc(&out, sizeof(int)));
    CHECK(cudaMalloc(&flag, sizeof(int)));
    CHECK(cudaMalloc(&seen, sizeof(int)));
    cudaStream_t blk, blk2, nb;
    CHECK(cudaStreamCreate(&blk));
    CHECK(cudaStreamCreateWithFlags(&blk2, cudaStreamDefault));
    CHECK(cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking));

    // 1. blocking stream then legacy stream
    CHECK(cudaMemset(v, 0, sizeof(int)));
    CHECK(cudaMemset(out, 0xff, sizeof(int)));
    CHECK(cudaDeviceSynchronize());
    sleep_then_write<<<1, 1, 0, blk>>>(v, 1, 100 * MS);
    CHECK_LAUNCH();
    copy_int<<<1, 1>>>(out, v);  // legacy default stream
    CHECK_LAUNCH();
    CHECK(cudaMemcpy(&h, out, sizeof h, cudaMemcpyDeviceToHost));
    printf("legacy stream waited for the blocking stream: %s\n", yes_no(h == 1));
    EXPECT(h == 1, "legacy stream read %d", h);

    // 2. legacy stream (explicit handle) then blocking stream
    CHECK(cudaMemset(v, 0, sizeof(int)));
    CHECK(cudaDeviceSynchronize());
    sleep_then_write<<<1, 1, 0, cudaStreamLegacy>>>(v, 2, 100 * MS);
    CHECK_LAUNCH();
    copy_int<<<1, 1, 0, blk>>>(out, v);
    CHECK_LAUNCH();
    CHECK(cudaStreamSynchronize(blk));
    CHECK(cudaMemcpy(&h, out, sizeof h, cudaMemcpyDeviceToHost));
    printf("blocking stream waited for the legacy stream: %s\n", yes_no(h == 2));
    EXPECT(h == 2, "blocking stream read %d", h);

    // 3. a memcpy on the legacy stream waits for a blocking stream's kernel
    CHECK(cudaMemset(v, 0, sizeof(int)));
    CHECK(cudaDeviceSynchronize());
    sleep_then_write<<<1, 1, 0, blk2>>>(v, 3, 100 * MS);
    CHECK_LAUNCH();
    CHECK(cudaMemcpy(&h, v, sizeof h, cudaMemcpyDeviceToHost));
    printf("cudaMemcpy waited for the blocking stream: %s\n", yes_no(h == 3));
    EXPECT(h == 3, "cudaMemcpy read %d", h);

    // 4. a non-blocking stream does not wait for the legacy stream
    CHECK(cudaMemset(flag, 0, sizeof(int)));
    CHECK(cudaMemset(seen, 0, sizeof(int)));
    CHECK(cudaDeviceSynchronize());
    wait_flag<<<1, 1, 0, nb>>>(flag, 1, seen, 5000 * MS);
    CHECK_LAUNCH();
    sleep_then_write<<<1, 1>>>(flag, 1, 20 * MS);  // legacy
    CHECK_LAUNCH();
    CHECK(cudaStreamSynchronize(nb));
    CHECK(cudaMemcpy(&h, seen, sizeof h, cudaMemcpyDeviceToHost));
    printf("non-blocking stream ran beside the legacy stream: %s\n", yes_no(h == 1));
    EXPECT(h == 1, "non-blocking stream's kernel never saw the flag");

    // 5. two blocking streams do not wait for each other
    CHECK(cudaMemset(flag, 0, sizeof(int)));
    CHECK(cudaMemset(seen, 0, sizeof(int)));
    CHECK(cudaDeviceSynchronize());
    wait_flag<<<1, 1, 0, blk>>>(flag, 1, seen, 5000 * MS);
    CHECK_LAUNCH();
    sleep_then_write<<<1, 1, 0, blk2>>>(flag, 1, 20 * MS);
    CHECK_LAUNCH();
    CHECK(cudaStreamSynchronize(blk));
    CHECK(cudaMemcpy(&h, seen, sizeof h, cudaMemcpyDeviceToHost));
    printf("two blocking streams ran side by side: %s\n", yes_no(h == 1));
    EXPECT(h == 1, "blocking stream's kernel never saw the other's flag");

    CHECK(cudaStreamDestroy(blk));
    CHECK(cudaStreamDestroy(blk2));
    CHECK(cudaStreamDestroy(nb));
    CHECK(cudaFree(v));
    CHECK(cudaFree(out));
    CHECK(cudaFree(flag));
    CHECK(cudaFree(seen));
    pass();
}
