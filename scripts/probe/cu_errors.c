// Prints every CUresult the installed driver names: code, name, string (tab separated).
// Output is committed as omps-shim/data/cu_errors.tsv so the shim answers exactly as the
// driver does. Build: gcc -O2 -o cu_errors cu_errors.c -I$CUDA_HOME/include -lcuda
#include <cuda.h>
#include <stdio.h>

int main(void) {
    for (int c = 0; c < 100000; c++) {
        const char *name = 0, *str = 0;
        if (cuGetErrorName((CUresult)c, &name) != CUDA_SUCCESS || !name) continue;
        if (cuGetErrorString((CUresult)c, &str) != CUDA_SUCCESS || !str) str = "";
        printf("%d\t%s\t%s\n", c, name, str);
    }
    return 0;
}
