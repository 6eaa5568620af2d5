/* What Kineto (torch.profiler) asks of CUPTI, natively: an LD_PRELOAD interposer that logs
 * each cupti* call it makes, with its key arguments, forwards it to the real libcupti, and
 * counts the activity records CUPTI hands back by kind. It answers, before omps answers
 * these calls itself (docs/design.md section 12b): does an LD_PRELOADed definition bind
 * torch's versioned references (a call logged at all says yes), in what order are the
 * calls made, and which records, how many of each, does a native trace hold.
 *
 *   gcc -shared -fPIC -O2 -o cupti_trace.so cupti_trace.c -ldl
 *   CUPTI_TRACE_LOG=/tmp/cupti.log LD_PRELOAD=./cupti_trace.so python3 prog.py
 *
 * No CUDA header is needed: the few types used are plain integers and pointers here. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int res_t;
static FILE *out;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned long kinds[64];

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
#include <stdarg.h>
static void say(const char *fmt, ...) {
    pthread_mutex_lock(&lock);
    if (!out) {
        const char *p = getenv("CUPTI_TRACE_LOG");
        out = p ? fopen(p, "a") : stderr;
        if (!out) out = stderr;
    }
    va_list ap;
    va_start(ap, fmt);
    vfprintf(out, fmt, ap);
    va_end(ap);
    fputc('\n', out);
    fflush(out);
    pthread_mutex_unlock(&lock);
}

/* RTLD_NEXT alone finds nothing when torch's libcupti was loaded as a dependency of a
 * library Python dlopened with RTLD_LOCAL (the first GPU run, 2026-11-27): then the loaded
 * libcupti itself is asked, by its soname, without loading a second copy. */
static void *real(const char *name) {
    void *f = dlsym(RTLD_NEXT, name);
    static const char *const sonames[] = {"libcupti.so.13", "libcupti.so.12", "libcupti.so"};
    for (size_t i = 0; !f && i < sizeof sonames / sizeof *sonames; i++) {
        void *h = dlopen(sonames[i], RTLD_LAZY | RTLD_NOLOAD);
        if (h) f = dlsym(h, name);
    }
    if (!f) say("%s: no real definition", name);
    return f;
}

#define FWD(name, sig, args, fmtargs, ...)                                  \
    res_t name sig {                                                       \
        static res_t(*f) sig;                                              \
        if (!f) f = (res_t(*) sig)real(#name);                             \
        res_t r = f ? f args : 999;                                        \
        say(#name fmtargs " -> %d", __VA_ARGS__, r);                       \
        return r;                                                          \
    }

FWD(cuptiGetVersion, (uint32_t *v), (v), "(%u)", v ? *v : 0)
FWD(cuptiActivityEnable, (int kind), (kind), "(kind %d)", kind)
FWD(cuptiActivityDisable, (int kind), (kind), "(kind %d)", kind)
FWD(cuptiActivityEnableRuntimeApi, (uint32_t cbid, uint8_t en), (cbid, en), "(cbid %u, %u)", cbid, en)
FWD(cuptiActivityEnableDriverApi, (uint32_t cbid, uint8_t en), (cbid, en), "(cbid %u, %u)", cbid, en)
FWD(cuptiActivitySetAttribute, (int a, size_t *sz, void *v), (a, sz, v), "(attr %d, %zu bytes)", a, sz ? *sz : 0)
FWD(cuptiActivityFlushAll, (uint32_t flag), (flag), "(flag %u)", flag)
FWD(cuptiActivityPushExternalCorrelationId, (int k, uint64_t id), (k, id), "(kind %d, id %lu)", k, (unsigned long)id)
FWD(cuptiActivityPopExternalCorrelationId, (int k, uint64_t *id), (k, id), "(kind %d)", k)
FWD(cuptiActivityRegisterTimestampCallback, (uint64_t (*cb)(void)), (cb), "(%p)", (void *)cb)
FWD(cuptiActivityEnableCudaEventDeviceTimestamps, (uint8_t en), (en), "(%u)", en)
FWD(cuptiActivityGetNumDroppedRecords, (void *ctx, uint32_t s, size_t *n), (ctx, s, n), "(stream %u, %zu)", s, n ? *n : 0)
FWD(cuptiFinalize, (void), (), "%s", "")
FWD(cuptiSubscribe, (void **h, void *cb, void *ud), (h, cb, ud), "(cb %p)", cb)
FWD(cuptiUnsubscribe, (void *h), (h), "(%p)", h)
FWD(cuptiEnableCallback, (uint32_t en, void *h, int dom, uint32_t cbid), (en, h, dom, cbid), "(%u, domain %d, cbid %u)", en, dom, cbid)
FWD(cuptiEnableDomain, (uint32_t en, void *h, int dom), (en, h, dom), "(%u, domain %d)", en, dom)
FWD(cuptiGetTimestamp, (uint64_t *t), (t), "(%lu)", t ? (unsigned long)*t : 0UL)

/* Records: Kineto's buffer-completed callback is wrapped to count what CUPTI delivered. */
typedef void (*req_cb)(uint8_t **, size_t *, size_t *);
typedef void (*done_cb)(void *, uint32_t, uint8_t *, size_t, size_t);
static done_cb kineto_done;
static res_t (*next_record)(uint8_t *, size_t, void **);

static void counted_done(void *ctx, uint32_t stream, uint8_t *buf, size_t size, size_t valid) {
    if (!next_record) next_record = (res_t(*)(uint8_t *, size_t, void **))real("cuptiActivityGetNextRecord");
    void *rec = NULL;
    unsigned long n = 0;
    while (next_record && next_record(buf, valid, &rec) == 0) {
        int kind = *(int *)rec;
        if (kind >= 0 && kind < 64) kinds[kind]++;
        n++;
    }
    say("buffer completed: %lu records, %zu bytes", n, valid);
    /* Kineto walks the buffer again itself: GetNextRecord starts over from rec = NULL. */
    kineto_done(ctx, stream, buf, size, valid);
}

res_t cuptiActivityRegisterCallbacks(req_cb req, done_cb done) {
    static res_t (*f)(req_cb, done_cb);
    if (!f) f = (res_t(*)(req_cb, done_cb))real("cuptiActivityRegisterCallbacks");
    kineto_done = done;
    res_t r = f ? f(req, counted_done) : 999;
    say("cuptiActivityRegisterCallbacks -> %d", r);
    return r;
}

__attribute__((destructor)) static void totals(void) {
    for (int k = 0; k < 64; k++)
        if (kinds[k]) say("records of kind %d: %lu", k, kinds[k]);
}
