// CUDA arrays, textures and surfaces: cudaMallocArray with cudaMemcpy2DToArray/FromArray
// and cudaArrayGetInfo; a 3D array with cudaMemcpy3D (whole and a sub-box); texture objects
// over a 2D array (point and linear filtering, unnormalized and normalized coordinates,
// clamp and wrap), over linear memory and over pitched memory, their descriptors read
// back; a surface object written and read by kernels; a mipmapped array sampled at level 1
// with tex2DLod; cudaMemcpy2DArrayToArray. Point samples are checked exactly; linear ones
// against a host bilinear filter (the hardware uses 8-bit weights) and printed as sums.
#include "rt_common.h"
#include <math.h>
#include <vector>

static const int W = 64, H = 32;

__global__ void sample2d(cudaTextureObject_t t, float *out, int w, int h, float sx, float ox,
                         float sy, float oy) {
    int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y;
    if (x < w && y < h) out[y * w + x] = tex2D<float>(t, x * sx + ox, y * sy + oy);
}

__global__ void fetch1d(cudaTextureObject_t t, float *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = tex1Dfetch<float>(t, i);
}

__global__ void sample_lod(cudaTextureObject_t t, float *out, int w, int h, float lod) {
    int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y;
    if (x < w && y < h) out[y * w + x] = tex2DLod<float>(t, (x + 0.5f) / w, (y + 0.5f) / h, lod);
}

__global__ void surf_write(cudaSurfaceObject_t s, int w, int h) {
    int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y;
    if (x < w && y < h) surf2Dwrite((float)(x * 1000 + y), s, x * (int)sizeof(float), y);
}

__global__ void surf_double(cudaSurfaceObject_t s, float *out, int w, int h) {
    int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y;
    if (x < w && y < h) out[y * w + x] = 2.0f * surf2Dread<float>(s, x * (int)sizeof(float), y);
}

static float src_val(int x, int y) { return (float)((x * 7 + y * 13) % 64) / 64.0f; }

static float texel(const std::vector<float> &d, int w, int h, int x, int y, bool wrap) {
    if (wrap) {
        x = ((x % w) + w) % w;
        y = ((y % h) + h) % h;
    } else {
        x = x < 0 ? 0 : x >= w ? w - 1 : x;
        y = y < 0 ? 0 : y >= h ? h - 1 : y;
    }
    return d[y * w + x];
}

// Reference sample at texel coordinates (xc, yc): point or bilinear.
static double ref(const std::vector<float> &d, int w, int h, float xc, float yc, bool linear, bool wrap) {
    if (!linear) return texel(d, w, h, (int)floorf(xc), (int)floorf(yc), wrap);
    double xb = xc - 0.5, yb = yc - 0.5;
    int i = (int)floor(xb), j = (int)floor(yb);
    double a = xb - i, b = yb - j;
    return (1 - a) * (1 - b) * texel(d, w, h, i, j, wrap) + a * (1 - b) * texel(d, w, h, i + 1, j, wrap) +
           (1 - a) * b * texel(d, w, h, i, j + 1, wrap) + a * b * texel(d, w, h, i + 1, j + 1, wrap);
}

static cudaTextureObject_t make_tex(const cudaResourceDesc &rd, cudaTextureFilterMode f,
                                    cudaTextureAddressMode am, int normalized) {
    cudaTextureDesc td = {};
    td.addressMode[0] = td.addressMode[1] = td.addressMode[2] = am;
    td.filterMode = f;
    td.readMode = cudaReadModeElementType;
    td.normalizedCoords = normalized;
    cudaTextureObject_t t;
    CHECK(cudaCreateTextureObject(&t, &rd, &td, nullptr));
    return t;
}

// Sample a W x H grid at (x * sx + ox, y * sy + oy) and compare with the reference.
static void run_2d(const char *what, cudaTextureObject_t t, const std::vector<float> &src, float *dout,
                   float sx, float ox, float sy, float oy, bool linear, bool wrap, bool normalized) {
    sample2d<<<dim3(1, H), W>>>(t, dout, W, H, sx, ox, sy, oy);
    CHECK_LAUNCH();
    std::vector<float> out(W * H);
    CHECK(cudaMemcpy(out.data(), dout, W * H * sizeof(float), cudaMemcpyDeviceToHost));
    double sum = 0, maxerr = 0;
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) {
            float u = x * sx + ox, v = y * sy + oy;
            if (normalized) { u *= W; v *= H; }
            double e = fabs(out[y * W + x] - ref(src, W, H, u, v, linear, wrap));
            if (e > maxerr) maxerr = e;
            sum += out[y * W + x];
        }
    bool ok = linear ? maxerr < 0.01 : maxerr == 0;
    printf("%s: sum %.6f, %s\n", what, sum, ok ? (linear ? "within 0.01 of bilinear" : "exact") : "WRONG");
    EXPECT(ok, "%s: max error %g", what, maxerr);
}

static void print_array_info(const char *what, cudaArray_t a) {
    cudaChannelFormatDesc d;
    cudaExtent e;
    unsigned flags;
    CHECK(cudaArrayGetInfo(&d, &e, &flags, a));
    printf("%s: channel %d/%d/%d/%d kind %d, extent %zu x %zu x %zu, flags %u\n", what, d.x, d.y, d.z,
           d.w, (int)d.f, e.width, e.height, e.depth, flags);
}

int main() {
    const cudaChannelFormatDesc fdesc = cudaCreateChannelDesc<float>();
    const size_t row = W * sizeof(float);
    std::vector<float> src(W * H), back(W * H);
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) src[y * W + x] = src_val(x, y);
    float *dout;
    CHECK(cudaMalloc(&dout, W * H * sizeof(float)));

    // 2D array.
    cudaArray_t arr;
    CHECK(cudaMallocArray(&arr, &fdesc, W, H, 0));
    print_array_info("2D array", arr);
    CHECK(cudaMemcpy2DToArray(arr, 0, 0, src.data(), row, row, H, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy2DFromArray(back.data(), row, arr, 0, 0, row, H, cudaMemcpyDeviceToHost));
    printf("2D array round trip: %s\n", yes_no(back == src));
    EXPECT(back == src, "2D array round trip differs");
    std::vector<float> sub(8 * 4);
    CHECK(cudaMemcpy2DFromArray(sub.data(), 8 * sizeof(float), arr, 5 * sizeof(float), 3, 8 * sizeof(float), 4,
                                cudaMemcpyDeviceToHost));
    bool sub_ok = true;
    for (int y = 0; y < 4; y++)
        for (int x = 0; x < 8; x++) sub_ok &= sub[y * 8 + x] == src_val(x + 5, y + 3);
    printf("2D array sub-rectangle at (5, 3): %s\n", yes_no(sub_ok));
    EXPECT(sub_ok, "sub-rectangle differs");

    // 3D array.
    const int X3 = 16, Y3 = 8, Z3 = 4;
    std::vector<float> h3(X3 * Y3 * Z3), b3(X3 * Y3 * Z3, -1.0f);
    for (size_t i = 0; i < h3.size(); i++) h3[i] = (float)(mix32(i, 3) % 1000);
    cudaArray_t a3;
    CHECK(cudaMalloc3DArray(&a3, &fdesc, make_cudaExtent(X3, Y3, Z3), 0));
    print_array_info("3D array", a3);
    cudaMemcpy3DParms p = {};
    p.srcPtr = make_cudaPitchedPtr(h3.data(), X3 * sizeof(float), X3, Y3);
    p.dstArray = a3;
    p.extent = make_cudaExtent(X3, Y3, Z3);
    p.kind = cudaMemcpyHostToDevice;
    CHECK(cudaMemcpy3D(&p));
    p = {};
    p.srcArray = a3;
    p.dstPtr = make_cudaPitchedPtr(b3.data(), X3 * sizeof(float), X3, Y3);
    p.extent = make_cudaExtent(X3, Y3, Z3);
    p.kind = cudaMemcpyDeviceToHost;
    CHECK(cudaMemcpy3D(&p));
    printf("3D array round trip: %s, checksum %08x\n", yes_no(b3 == h3), fnv1a(b3.data(), b3.size() * 4));
    EXPECT(b3 == h3, "3D array round trip differs");
    std::vector<float> box(8 * 4 * 2);
    p = {};
    p.srcArray = a3;
    p.srcPos = make_cudaPos(4, 2, 1);
    p.dstPtr = make_cudaPitchedPtr(box.data(), 8 * sizeof(float), 8, 4);
    p.extent = make_cudaExtent(8, 4, 2);
    p.kind = cudaMemcpyDeviceToHost;
    CHECK(cudaMemcpy3D(&p));
    bool box_ok = true;
    for (int z = 0; z < 2; z++)
        for (int y = 0; y < 4; y++)
            for (int x = 0; x < 8; x++)
                box_ok &= box[(z * 4 + y) * 8 + x] == h3[((z + 1) * Y3 + y + 2) * X3 + x + 4];
    printf("3D array sub-box at (4, 2, 1): %s\n", yes_no(box_ok));
    EXPECT(box_ok, "3D sub-box differs");

    // Textures over the 2D array.
    cudaResourceDesc rd = {};
    rd.resType = cudaResourceTypeArray;
    rd.res.array.array = arr;
    const float iw = 1.0f / W, ih = 1.0f / H;
    cudaTextureObject_t t = make_tex(rd, cudaFilterModePoint, cudaAddressModeClamp, 0);
    run_2d("point, unnormalized, clamp, texel centres", t, src, dout, 1, 0.5f, 1, 0.5f, false, false, false);
    run_2d("point, unnormalized, clamp, shifted out of range", t, src, dout, 1, -7.5f, 1, -3.5f, false, false, false);
    cudaResourceDesc rd_back = {};
    CHECK(cudaGetTextureObjectResourceDesc(&rd_back, t));
    printf("array texture resource desc: type %d, same array %s\n", (int)rd_back.resType,
           yes_no(rd_back.res.array.array == arr));
    EXPECT(rd_back.resType == cudaResourceTypeArray && rd_back.res.array.array == arr, "wrong resource desc");
    CHECK(cudaDestroyTextureObject(t));
    t = make_tex(rd, cudaFilterModeLinear, cudaAddressModeClamp, 0);
    run_2d("linear, unnormalized, clamp", t, src, dout, 1, 0.8f, 1, 1.2f, true, false, false);
    cudaTextureDesc td_back = {};
    CHECK(cudaGetTextureObjectTextureDesc(&td_back, t));
    printf("linear texture desc: filter %d, address %d, normalized %d, read mode %d\n", (int)td_back.filterMode,
           (int)td_back.addressMode[0], td_back.normalizedCoords, (int)td_back.readMode);
    CHECK(cudaDestroyTextureObject(t));
    t = make_tex(rd, cudaFilterModePoint, cudaAddressModeWrap, 1);
    run_2d("point, normalized, wrap, one period up", t, src, dout, iw, 1.0f + 0.5f * iw, ih, 1.0f + 0.5f * ih,
           false, true, true);
    run_2d("point, normalized, wrap, shifted", t, src, dout, iw, -2.0f + 10.5f * iw, ih, 5.5f * ih, false, true,
           true);
    CHECK(cudaDestroyTextureObject(t));
    t = make_tex(rd, cudaFilterModeLinear, cudaAddressModeWrap, 1);
    run_2d("linear, normalized, wrap", t, src, dout, iw, -1.0f + 0.3f * iw, ih, 0.7f * ih, true, true, true);
    CHECK(cudaDestroyTextureObject(t));

    // A texture over linear memory.
    const int NL = 4096;
    std::vector<float> hl(NL), bl(NL);
    for (int i = 0; i < NL; i++) hl[i] = (float)(mix32(i, 9) % 4096) - 2048.0f;
    float *lin;
    CHECK(cudaMalloc(&lin, NL * sizeof(float)));
    CHECK(cudaMemcpy(lin, hl.data(), NL * sizeof(float), cudaMemcpyHostToDevice));
    cudaResourceDesc rl = {};
    rl.resType = cudaResourceTypeLinear;
    rl.res.linear.devPtr = lin;
    rl.res.linear.desc = fdesc;
    rl.res.linear.sizeInBytes = NL * sizeof(float);
    t = make_tex(rl, cudaFilterModePoint, cudaAddressModeClamp, 0);
    float *dl;
    CHECK(cudaMalloc(&dl, NL * sizeof(float)));
    fetch1d<<<NL / 256, 256>>>(t, dl, NL);
    CHECK_LAUNCH();
    CHECK(cudaMemcpy(bl.data(), dl, NL * sizeof(float), cudaMemcpyDeviceToHost));
    printf("linear-memory texture tex1Dfetch: %s, checksum %08x\n", yes_no(bl == hl), fnv1a(bl.data(), NL * 4));
    EXPECT(bl == hl, "tex1Dfetch differs");
    CHECK(cudaGetTextureObjectResourceDesc(&rd_back, t));
    bool lin_ok = rd_back.resType == cudaResourceTypeLinear && rd_back.res.linear.devPtr == lin &&
                  rd_back.res.linear.sizeInBytes == NL * sizeof(float) && rd_back.res.linear.desc.x == 32;
    printf("linear texture resource desc round trip: %s\n", yes_no(lin_ok));
    EXPECT(lin_ok, "linear resource desc differs");
    CHECK(cudaDestroyTextureObject(t));

    // A texture over pitched memory.
    float *pitched;
    size_t pitch;
    CHECK(cudaMallocPitch(&pitched, &pitch, row, H));
    CHECK(cudaMemcpy2D(pitched, pitch, src.data(), row, row, H, cudaMemcpyHostToDevice));
    cudaResourceDesc rp = {};
    rp.resType = cudaResourceTypePitch2D;
    rp.res.pitch2D.devPtr = pitched;
    rp.res.pitch2D.desc = fdesc;
    rp.res.pitch2D.width = W;
    rp.res.pitch2D.height = H;
    rp.res.pitch2D.pitchInBytes = pitch;
    t = make_tex(rp, cudaFilterModePoint, cudaAddressModeClamp, 0);
    run_2d("pitch2D texture, point", t, src, dout, 1, 0.5f, 1, 0.5f, false, false, false);
    CHECK(cudaGetTextureObjectResourceDesc(&rd_back, t));
    bool pitch_ok = rd_back.resType == cudaResourceTypePitch2D && rd_back.res.pitch2D.devPtr == pitched &&
                    rd_back.res.pitch2D.width == (size_t)W && rd_back.res.pitch2D.height == (size_t)H &&
                    rd_back.res.pitch2D.pitchInBytes == pitch;
    printf("pitch2D texture resource desc round trip: %s\n", yes_no(pitch_ok));
    EXPECT(pitch_ok, "pitch2D resource desc differs");
    CHECK(cudaDestroyTextureObject(t));
    t = make_tex(rp, cudaFilterModeLinear, cudaAddressModeClamp, 0);
    run_2d("pitch2D texture, linear", t, src, dout, 1, 0.8f, 1, 1.2f, true, false, false);
    CHECK(cudaDestroyTextureObject(t));

    // A surface.
    cudaArray_t sarr;
    CHECK(cudaMallocArray(&sarr, &fdesc, W, H, cudaArraySurfaceLoadStore));
    print_array_info("surface array", sarr);
    cudaResourceDesc rs = {};
    rs.resType = cudaResourceTypeArray;
    rs.res.array.array = sarr;
    cudaSurfaceObject_t surf;
    CHECK(cudaCreateSurfaceObject(&surf, &rs));
    surf_write<<<dim3(1, H), W>>>(surf, W, H);
    CHECK_LAUNCH();
    CHECK(cudaMemcpy2DFromArray(back.data(), row, sarr, 0, 0, row, H, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) bad += back[y * W + x] != (float)(x * 1000 + y);
    printf("surf2Dwrite read back: %s\n", bad == 0 ? "all as expected" : "WRONG");
    EXPECT(bad == 0, "%d surface values wrong", bad);
    surf_double<<<dim3(1, H), W>>>(surf, dout, W, H);
    CHECK_LAUNCH();
    CHECK(cudaMemcpy(back.data(), dout, W * H * sizeof(float), cudaMemcpyDeviceToHost));
    bad = 0;
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) bad += back[y * W + x] != 2.0f * (x * 1000 + y);
    printf("surf2Dread doubled: %s\n", bad == 0 ? "all as expected" : "WRONG");
    EXPECT(bad == 0, "%d surface reads wrong", bad);
    cudaResourceDesc rs_back = {};
    CHECK(cudaGetSurfaceObjectResourceDesc(&rs_back, surf));
    printf("surface resource desc: same array %s\n", yes_no(rs_back.res.array.array == sarr));
    CHECK(cudaDestroySurfaceObject(surf));

    // Array to array: all of arr, then an 16 x 8 block of the surface array at (40, 20).
    cudaArray_t dst;
    CHECK(cudaMallocArray(&dst, &fdesc, W, H, 0));
    CHECK(cudaMemcpy2DArrayToArray(dst, 0, 0, arr, 0, 0, row, H, cudaMemcpyDeviceToDevice));
    CHECK(cudaMemcpy2DArrayToArray(dst, 40 * sizeof(float), 20, sarr, 8 * sizeof(float), 4, 16 * sizeof(float), 8,
                                   cudaMemcpyDeviceToDevice));
    CHECK(cudaMemcpy2DFromArray(back.data(), row, dst, 0, 0, row, H, cudaMemcpyDeviceToHost));
    bad = 0;
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) {
            bool in = x >= 40 && x < 56 && y >= 20 && y < 28;
            bad += back[y * W + x] != (in ? (float)((x - 32) * 1000 + y - 16) : src_val(x, y));
        }
    printf("cudaMemcpy2DArrayToArray whole and block: %s, checksum %08x\n", bad == 0 ? "all as expected" : "WRONG",
           fnv1a(back.data(), W * H * 4));
    EXPECT(bad == 0, "%d values wrong after array-to-array copies", bad);

    // A mipmapped array: level 1 filled and sampled with tex2DLod.
    cudaMipmappedArray_t mm;
    CHECK(cudaMallocMipmappedArray(&mm, &fdesc, make_cudaExtent(W, H, 0), 3, 0));
    char name[32];
    cudaArray_t lvl[3];
    for (int l = 0; l < 3; l++) {
        CHECK(cudaGetMipmappedArrayLevel(&lvl[l], mm, l));
        snprintf(name, sizeof name, "mipmap level %d", l);
        print_array_info(name, lvl[l]);
    }
    const int W1 = W / 2, H1 = H / 2;
    std::vector<float> l1(W1 * H1), b1(W1 * H1);
    for (int i = 0; i < W1 * H1; i++) l1[i] = (float)i / 1024.0f;
    CHECK(cudaMemcpy2DToArray(lvl[1], 0, 0, l1.data(), W1 * sizeof(float), W1 * sizeof(float), H1,
                              cudaMemcpyHostToDevice));
    cudaResourceDesc rm = {};
    rm.resType = cudaResourceTypeMipmappedArray;
    rm.res.mipmap.mipmap = mm;
    cudaTextureDesc tdm = {};
    tdm.addressMode[0] = tdm.addressMode[1] = cudaAddressModeClamp;
    tdm.filterMode = cudaFilterModePoint;
    tdm.mipmapFilterMode = cudaFilterModePoint;
    tdm.readMode = cudaReadModeElementType;
    tdm.normalizedCoords = 1;
    tdm.minMipmapLevelClamp = 0;
    tdm.maxMipmapLevelClamp = 2;
    CHECK(cudaCreateTextureObject(&t, &rm, &tdm, nullptr));
    sample_lod<<<dim3(1, H1), W1>>>(t, dout, W1, H1, 1.0f);
    CHECK_LAUNCH();
    CHECK(cudaMemcpy(b1.data(), dout, W1 * H1 * sizeof(float), cudaMemcpyDeviceToHost));
    printf("tex2DLod at level 1: %s, checksum %08x\n", b1 == l1 ? "exact" : "WRONG", fnv1a(b1.data(), b1.size() * 4));
    EXPECT(b1 == l1, "tex2DLod differs");
    CHECK(cudaDestroyTextureObject(t));

    CHECK(cudaFreeMipmappedArray(mm));
    CHECK(cudaFreeArray(dst));
    CHECK(cudaFreeArray(sarr));
    CHECK(cudaFreeArray(a3));
    CHECK(cudaFreeArray(arr));
    CHECK(cudaFree(pitched));
    CHECK(cudaFree(dl));
    CHECK(cudaFree(lin));
    CHECK(cudaFree(dout));
    pass();
}
