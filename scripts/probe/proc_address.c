// Asks the installed driver's cuGetProcAddress_v2 for every entry point at every CUDA
// version and flag, and prints which exported symbol it resolves to (via dladdr), so the
// shim can answer the same without the driver. Input: driver entry point names, one per
// line, on stdin (suffixes _v2/_v3/_ptds/_ptsz are stripped to get the names cudart asks
// for). Output lines: NAME VERSION FLAGS SYMBOL, printed only where the answer changes.
// Build: gcc -O2 -o proc_address proc_address.c -ldl
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

typedef int (*gpa_t)(const char *, void **, int, unsigned long long, int *);

// Every CUDA version from 2.0 to 13.0 in steps of 10 (x.y0): answers change only there.
#define FIRST_VERSION 2000
#define LAST_VERSION 13000

static void strip(char *s) {
    static const char *suffixes[] = {"_v2", "_v3", "_v4", "_ptds", "_ptsz", "_v2_ptds", "_v2_ptsz", "_v3_ptds", "_v3_ptsz"};
    size_t n = strlen(s);
    for (int again = 1; again;) {
        again = 0;
        for (unsigned i = 0; i < sizeof suffixes / sizeof *suffixes; i++) {
            size_t k = strlen(suffixes[i]);
            if (n > k && strcmp(s + n - k, suffixes[i]) == 0) { s[n - k] = 0; n -= k; again = 1; }
        }
    }
}

int main(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 1; }
    gpa_t gpa = (gpa_t)dlsym(h, "cuGetProcAddress_v2");
    if (!gpa) { fprintf(stderr, "no cuGetProcAddress_v2\n"); return 1; }
    char line[256];
    while (fgets(line, sizeof line, stdin)) {
        line[strcspn(line, "\r\n")] = 0;
        if (!line[0]) continue;
        strip(line);
        for (unsigned long long flags = 0; flags <= 2; flags++) {
            char last[256] = "";
            for (int v = FIRST_VERSION; v <= LAST_VERSION; v += 10) {
                void *fn = 0; int status = -1;
                int r = gpa(line, &fn, v, flags, &status);
                char cur[256];
                Dl_info info;
                if (r == 0 && fn && dladdr(fn, &info) && info.dli_sname)
                    snprintf(cur, sizeof cur, "%s", info.dli_sname);
                else
                    snprintf(cur, sizeof cur, "- r=%d status=%d", r, status);
                if (strcmp(cur, last) != 0) {
                    printf("%s %d %llu %s\n", line, v, flags, cur);
                    strcpy(last, cur);
                }
            }
        }
    }
    // Every symbol the driver exports, so the shim can export (and stub) them all.
    return 0;
}
