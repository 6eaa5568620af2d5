// Virtual memory management and stream-ordered allocation, as PyTorch's
// expandable_segments and cudaMallocAsync allocators use them: data written through one
// mapping reads back, memsets reach mapped memory, pools hand memory out in stream order
// and report their use. Prints only facts that are the same natively and under omps.
#include "common.h"

int main() {
    PrimaryCtx primary = init_primary();
    CUdevice dev = primary.dev;
    CUstream s;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));

    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    size_t gran = 0, rec = 0;
    CHECK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    CHECK(cuMemGetAllocationGranularity(&rec, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
    printf("granularity %zu recommended %zu\n", gran, rec);

    // Reserve 8 granules, back granules 2..5 with one handle, write and read through it.
    CUdeviceptr va;
    CHECK(cuMemAddressReserve(&va, 8 * gran, 0, 0, 0));
    CUmemGenericAllocationHandle h;
    CHECK(cuMemCreate(&h, 4 * gran, &prop, 0));
    CUmemAllocationProp back = {};
    CHECK(cuMemGetAllocationPropertiesFromHandle(&back, h));
    printf("handle: type %d location %d/%d\n", back.type, back.location.type, back.location.id);
    CUdeviceptr at = va + 2 * gran;
    CHECK(cuMemMap(at, 4 * gran, 0, h, 0));
    CUmemAccessDesc acc = {};
    acc.location = prop.location;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CHECK(cuMemSetAccess(at, 4 * gran, &acc, 1));
    unsigned long long flags = 0;
    CHECK(cuMemGetAccess(&flags, &prop.location, at + 100));
    printf("access flags %llu\n", flags);
    std::vector<unsigned> host(gran / 4), out(gran / 4);
    for (size_t i = 0; i < host.size(); i++) host[i] = (unsigned)(i * 2654435761u);
    CHECK(cuMemcpyHtoD(at + gran + 12, host.data(), gran));
    CHECK(cuMemsetD32(at, 0xabcdef01u, gran / 4));
    CHECK(cuMemcpyDtoH(out.data(), at + gran + 12, gran));
    EXPECT(out == host, "data read back through the mapping differs");
    unsigned first = 0;
    CHECK(cuMemcpyDtoH(&first, at + 4, 4));
    printf("memset word %08x\n", first);
    CUmemGenericAllocationHandle h2;
    CHECK(cuMemRetainAllocationHandle(&h2, (void *)(at + 3 * gran)));
    EXPECT(h2 == h, "retained handle is not the one mapped there");
    CHECK(cuMemRelease(h2));
    CHECK(cuMemRelease(h));
    CHECK(cuCtxSynchronize());
    CHECK(cuMemUnmap(at, 4 * gran));
    CHECK(cuMemAddressFree(va, 8 * gran));
    printf("vmm ok\n");

    // Pools: the default pool, a release threshold, stream-ordered reuse, statistics.
    CUmemoryPool pool;
    CHECK(cuDeviceGetDefaultMemPool(&pool, dev));
    cuuint64_t thr = ~0ull;
    CHECK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &thr));
    CUdeviceptr a, b;
    CHECK(cuMemAllocAsync(&a, 1 << 20, s));
    CHECK(cuMemsetD8Async(a, 7, 1 << 20, s));
    CHECK(cuMemFreeAsync(a, s));
    CHECK(cuMemAllocAsync(&b, 1 << 20, s));
    unsigned char byte = 0;
    CHECK(cuMemsetD8Async(b, 9, 1 << 20, s));
    CHECK(cuMemcpyDtoHAsync(&byte, b + 12345, 1, s));
    CHECK(cuStreamSynchronize(s));
    printf("pool byte %d\n", byte);
    cuuint64_t used = 0;
    CHECK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used));
    printf("pool used %llu\n", (unsigned long long)used);
    CHECK(cuMemFreeAsync(b, s));
    CHECK(cuStreamSynchronize(s));
    CHECK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used));
    printf("pool used after free %llu\n", (unsigned long long)used);
    CHECK(cuMemPoolTrimTo(pool, 0));

    CUmemPoolProps pp = {};
    pp.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    pp.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    pp.location.id = 0;
    CUmemoryPool mine;
    CHECK(cuMemPoolCreate(&mine, &pp));
    CUdeviceptr c;
    CHECK(cuMemAllocFromPoolAsync(&c, 4096, mine, s));
    CHECK(cuMemsetD32Async(c, 5, 1024, s));
    unsigned w = 0;
    CHECK(cuMemcpyDtoHAsync(&w, c + 4092, 4, s));
    CHECK(cuStreamSynchronize(s));
    printf("own pool word %u\n", w);
    CHECK(cuMemFreeAsync(c, s));
    CHECK(cuStreamSynchronize(s));
    CHECK(cuMemPoolDestroy(mine));
    CHECK_EQ_RESULT(cuMemPoolDestroy(pool), CUDA_ERROR_INVALID_VALUE);

    // Context limits: what this process set is what it reads back.
    size_t stack = 0;
    CHECK(cuCtxGetLimit(&stack, CU_LIMIT_STACK_SIZE));
    CHECK(cuCtxSetLimit(CU_LIMIT_STACK_SIZE, 4096));
    CHECK(cuCtxGetLimit(&stack, CU_LIMIT_STACK_SIZE));
    printf("stack limit %zu\n", stack);
    pass();
}
