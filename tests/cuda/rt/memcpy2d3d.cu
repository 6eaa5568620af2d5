// Pitched memory: cudaMallocPitch + cudaMemcpy2D (H2D, D2D, D2H, Async), and
// cudaMalloc3D + cudaMemset3D + cudaMemcpy3D with a sub-box.
#include "rt_common.h"

int main() {
    const int W = 333, H = 97;  // elements (uint32) per row, rows
    const size_t hp = W * 4 + 20;  // host pitch with padding
    unsigned char *hsrc = (unsigned char *)malloc(hp * H), *hdst = (unsigned char *)calloc(W * 4, H);
    EXPECT(hsrc && hdst, "malloc");
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) ((uint32_t *)(hsrc + y * hp))[x] = mix32(y * W + x, 7);
    uint32_t *d1, *d2;
    size_t p1, p2;
    CHECK(cudaMallocPitch(&d1, &p1, W * 4, H));
    CHECK(cudaMallocPitch(&d2, &p2, (W + 10) * 4, H + 3));
    EXPECT(p1 >= W * 4 && p2 >= (W + 10) * 4, "pitch too small");
    CHECK(cudaMemcpy2D(d1, p1, hsrc, hp, W * 4, H, cudaMemcpyHostToDevice));
    // D2D into d2 at (x=5, y=2)
    CHECK(cudaMemset2D(d2, p2, 0, (W + 10) * 4, H + 3));
    CHECK(cudaMemcpy2D((char *)d2 + 2 * p2 + 5 * 4, p2, d1, p1, W * 4, H, cudaMemcpyDeviceToDevice));
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    CHECK(cudaMemcpy2DAsync(hdst, W * 4, (char *)d2 + 2 * p2 + 5 * 4, p2, W * 4, H, cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) {
            uint32_t got = ((uint32_t *)hdst)[y * W + x], want = mix32(y * W + x, 7);
            EXPECT(got == want, "2D (%d,%d) = %08x, want %08x", x, y, got, want);
        }
    printf("cudaMemcpy2D H2D, D2D at offset, D2H async: ok, checksum %08x\n", fnv1a(hdst, W * 4 * H));
    // a column of d2 left of the box is still zero
    uint32_t col[4];
    CHECK(cudaMemcpy2D(col, 4, (char *)d2 + 10 * p2 + 4 * 4, p2, 4, 4, cudaMemcpyDeviceToHost));
    EXPECT(col[0] == 0 && col[3] == 0, "outside the box changed");
    printf("outside the 2D box: untouched\n");

    // 3D: X x Y x Z bytes, memset, copy a host volume in, read back a sub-box
    const int X = 200, Y = 30, Z = 12;
    cudaPitchedPtr vol;
    CHECK(cudaMalloc3D(&vol, make_cudaExtent(X, Y, Z)));
    EXPECT(vol.pitch >= X && vol.xsize == X && vol.ysize == Y, "cudaMalloc3D gave xsize %zu ysize %zu", vol.xsize, vol.ysize);
    CHECK(cudaMemset3D(vol, 0x77, make_cudaExtent(X, Y, Z)));
    unsigned char *hv = (unsigned char *)malloc(X * Y * Z);
    EXPECT(hv, "malloc");
    for (int i = 0; i < X * Y * Z; i++) hv[i] = (unsigned char)mix32(i, 9);
    cudaMemcpy3DParms up = {};
    up.srcPtr = make_cudaPitchedPtr(hv, X, X, Y);
    up.dstPtr = vol;
    up.extent = make_cudaExtent(X, Y, Z - 2);  // leave the last 2 slices at 0x77
    up.kind = cudaMemcpyHostToDevice;
    CHECK(cudaMemcpy3D(&up));
    const int BX = 50, BY = 10, BZ = 12, OX = 17, OY = 3;
    unsigned char *hb = (unsigned char *)malloc(BX * BY * BZ);
    EXPECT(hb, "malloc");
    cudaMemcpy3DParms down = {};
    down.srcPtr = vol;
    down.srcPos = make_cudaPos(OX, OY, 0);
    down.dstPtr = make_cudaPitchedPtr(hb, BX, BX, BY);
    down.extent = make_cudaExtent(BX, BY, BZ);
    down.kind = cudaMemcpyDeviceToHost;
    CHECK(cudaMemcpy3DAsync(&down, s));
    CHECK(cudaStreamSynchronize(s));
    for (int z = 0; z < BZ; z++)
        for (int y = 0; y < BY; y++)
            for (int x = 0; x < BX; x++) {
                unsigned char got = hb[(z * BY + y) * BX + x];
                unsigned char want = z < Z - 2 ? hv[(z * Y + y + OY) * X + x + OX] : 0x77;
                EXPECT(got == want, "3D (%d,%d,%d) = %02x, want %02x", x, y, z, got, want);
            }
    printf("cudaMemcpy3D volume in, sub-box out: ok, checksum %08x\n", fnv1a(hb, BX * BY * BZ));
    CHECK(cudaFree(d1));
    CHECK(cudaFree(d2));
    CHECK(cudaFree(vol.ptr));
    CHECK(cudaStreamDestroy(s));
    pass();
}
