"""Builds the CUDA test programs with nvcc, once a run, all at once in the background:
the driver-API programs of tests/cuda into $BUILD/bin (host code with -cudart none, kernels
as fatbin/cubin/PTX images loaded at run time) and the runtime-API programs of
tests/cuda/rt into $BUILD/rt (nvcc's default flags, static cudart, plus -arch). It exists
so that the lists in programs.py are the only thing a new program touches; the commands
are those of scripts/gpu-e2e.sh before issue 24, and $OUT/build.log is written as it was.
"""

import os
import subprocess

import programs
from e2e import H, RTSRC, SRC, find_nvcc, indented, lines_of, log, section

IMAGE_FLAGS = {
    ".fatbin": ["-fatbin", "-gencode", "arch=compute_90,code=[sm_90,compute_90]"],
    ".cubin": ["-cubin", "-arch=sm_90"],
    ".ptx": ["-ptx", "-arch=compute_90"],
}


def _start(jobs, name, argv, first_line=""):
    """One build in the background, its output in $WORK/build-NAME.log after first_line."""
    with open(H.work / f"build-{name}.log", "wb") as f:
        f.write(first_line.encode())
        f.flush()
        jobs.append((name, subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT)))


def _unlink(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def build_rt(nvcc, jobs):
    for p in programs.rt_all() + programs.RT_TOOLS:
        flags = [f"-arch={H.rt_arch}", *programs.RT_FLAGS.get(p, [])]
        libs = programs.RT_LIBS.get(p, [])
        _unlink(H.rtbin / p)
        argv = [nvcc, *flags, "-o", str(H.rtbin / p), str(RTSRC / f"{p}.cu"), *libs]
        # the command first, as gpu-e2e.sh's `echo "$NVCC $flags -o ... $libs"` (a space before empty libs)
        _start(jobs, f"rt-{p}", argv,
               f"{nvcc} {' '.join(flags)} -o {H.rtbin / p} {RTSRC / (p + '.cu')} {' '.join(libs)}\n")
    log(f"runtime-API programs: nvcc -arch={H.rt_arch} (per_thread_stream: + --default-stream per-thread)")


def build_driver(nvcc, jobs):
    cuda_home = os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))
    libs = [f"-L{cuda_home}/lib64/stubs", f"-L{cuda_home}/targets/x86_64-linux/lib/stubs", "-lcuda"]
    for src, img in programs.KERNEL_IMAGES:
        flags = IMAGE_FLAGS[os.path.splitext(img)[1]]
        _unlink(H.bin / img)
        _start(jobs, img, [nvcc, *flags, "-O3", "-o", str(H.bin / img), str(SRC / f"{src}.cu")])
    for p, _kind in programs.DRIVER_PROGRAMS:
        _unlink(H.bin / p)
        _start(jobs, p, [nvcc, "-cudart", "none", "-O2", "-std=c++17", "-Xcompiler", "-Wall", f"-I{SRC}",
                         "-o", str(H.bin / p), str(SRC / f"{p}.cpp"), *libs])


def wait_builds(jobs):
    failed = False
    with open(H.out / "build.log", "wb") as blog:
        for name, p in jobs:
            if p.wait() == 0:
                log(f"built {name}")
            else:
                log(f"BUILD FAILED: {name}")
                failed = True
            blog.write(f"=== {name}\n".encode() + (H.work / f"build-{name}.log").read_bytes())
    if failed:
        log("see build.log")
        indented(lines_of(H.out / "build.log"), 80)
    return not failed


def build_all():
    """True if every program built (the runtime-API ones unless --no-rt, the driver-API
    ones unless --rt-only; none for --serving-only)."""
    if not (H.rt or H.cuda):
        return True
    section("build")
    nvcc = find_nvcc()
    if not nvcc:
        log("nvcc not found (set NVCC=...)")
        return False
    log(f"nvcc: {nvcc}")
    r = subprocess.run([nvcc, "--version"], stdout=subprocess.PIPE, text=True, errors="replace")
    for line in r.stdout.splitlines()[-2:]:
        log(line)
    jobs = []
    if H.rt:
        build_rt(nvcc, jobs)
    if H.cuda:
        build_driver(nvcc, jobs)
    return wait_builds(jobs)
