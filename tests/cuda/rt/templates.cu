// Template kernels: type and non-type parameters, a functor argument, a struct
// template, and a variadic kernel whose mixed-type arguments test parameter layout.
#include "rt_common.h"

template <typename T, int K>
__global__ void axpyk(T a, const T *x, T *y, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) y[i] = a * x[i] * (T)K + y[i];
}

template <typename T>
struct Pair {
    T first;
    T second;
};

template <typename T>
__global__ void swap_pairs(Pair<T> *p, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        T t = p[i].first;
        p[i].first = p[i].second;
        p[i].second = t;
    }
}

struct Affine {
    int mul, add;
    __host__ __device__ int operator()(int x) const { return x * mul + add; }
};
struct Square {
    __host__ __device__ int operator()(int x) const { return x * x; }
};

template <typename Op>
__global__ void apply(Op op, int *v, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) v[i] = op(v[i]);
}

template <typename... Ts>
__global__ void sum_args(double *out, Ts... ts) {
    *out = (0.0 + ... + (double)ts);
}

template <typename T, int K>
static void test_axpyk(const char *name) {
    const int n = 10007;
    T *hx = new T[n], *hy = new T[n], *dx, *dy;
    for (int i = 0; i < n; i++) { hx[i] = (T)(i % 100); hy[i] = (T)(i % 7); }
    CHECK(cudaMalloc(&dx, n * sizeof(T)));
    CHECK(cudaMalloc(&dy, n * sizeof(T)));
    CHECK(cudaMemcpy(dx, hx, n * sizeof(T), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dy, hy, n * sizeof(T), cudaMemcpyHostToDevice));
    axpyk<T, K><<<40, 128>>>((T)3, dx, dy, n);
    CHECK_LAUNCH();
    CHECK(cudaMemcpy(hy, dy, n * sizeof(T), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i++)
        EXPECT(hy[i] == (T)((T)3 * (T)(i % 100) * (T)K + (T)(i % 7)), "%s element %d", name, i);
    printf("%s: ok, checksum %08x\n", name, fnv1a(hy, n * sizeof(T)));
    CHECK(cudaFree(dx));
    CHECK(cudaFree(dy));
    delete[] hx;
    delete[] hy;
}

template <typename Op>
static void test_apply(const char *name, Op op) {
    const int n = 5000;
    int h[n], *d;
    for (int i = 0; i < n; i++) h[i] = i - 2500;
    CHECK(cudaMalloc(&d, sizeof h));
    CHECK(cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice));
    apply<<<8, 256>>>(op, d, n);
    CHECK_LAUNCH();
    CHECK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i++) EXPECT(h[i] == op(i - 2500), "%s element %d", name, i);
    printf("%s: ok\n", name);
    CHECK(cudaFree(d));
}

int main() {
    test_axpyk<int, 3>("axpyk<int, 3>");
    test_axpyk<float, -2>("axpyk<float, -2>");
    test_axpyk<double, 7>("axpyk<double, 7>");
    test_axpyk<long long, 1000000>("axpyk<long long, 1000000>");
    test_axpyk<unsigned char, 1>("axpyk<unsigned char, 1>");
    test_apply("apply<Affine{3, -4}>", Affine{3, -4});
    test_apply("apply<Square>", Square{});

    Pair<short> hp[300];
    for (int i = 0; i < 300; i++) hp[i] = {(short)i, (short)-i};
    Pair<short> *dp;
    CHECK(cudaMalloc(&dp, sizeof hp));
    CHECK(cudaMemcpy(dp, hp, sizeof hp, cudaMemcpyHostToDevice));
    swap_pairs<<<2, 128>>>(dp, 300);
    CHECK_LAUNCH();
    CHECK(cudaMemcpy(hp, dp, sizeof hp, cudaMemcpyDeviceToHost));
    for (int i = 0; i < 300; i++) EXPECT(hp[i].first == -i && hp[i].second == i, "pair %d", i);
    printf("swap_pairs<short>: ok\n");

    double *dout, r = 0;
    CHECK(cudaMalloc(&dout, sizeof(double)));
    sum_args<<<1, 1>>>(dout, (char)1, (short)20, 300, 4000000000ll, 0.5f, 0.25, (unsigned char)200, 7u);
    CHECK_LAUNCH();
    CHECK(cudaMemcpy(&r, dout, sizeof r, cudaMemcpyDeviceToHost));
    printf("sum_args<char, short, int, long long, float, double, uchar, unsigned>: %.2f\n", r);
    EXPECT(r == 1 + 20 + 300 + 4000000000.0 + 0.5 + 0.25 + 200 + 7, "sum_args gave %f", r);
    sum_args<<<1, 1>>>(dout);
    CHECK_LAUNCH();
    CHECK(cudaMemcpy(&r, dout, sizeof r, cudaMemcpyDeviceToHost));
    printf("sum_args<>: %.2f\n", r);
    CHECK(cudaFree(dp));
    CHECK(cudaFree(dout));
    pass();
}
