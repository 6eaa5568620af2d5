#!/usr/bin/env python3
"""Writes docs/entry-points.md: every driver entry point the shim exports as
CUDA_ERROR_NOT_SUPPORTED, by family, each family with its reason.

    cargo build -p omps-shim && python3 scripts/entry-points.py

The list comes from the stubs omps-shim's build script generates (data/driver_entry_points.txt
less what src/ implements); `cargo test` checks that the document lists exactly those.
"""
import glob
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (title, reason, pattern): the first family whose pattern matches a name takes it.
FAMILIES = [
    ("The API of CUDA 3.x (32-bit sizes and pointers)",
     "Their unversioned names take `unsigned int` sizes and 32-bit device pointers; every "
     "program built with CUDA 4.0 headers or later calls the `_v2` forms instead. NVIDIA's "
     "MPS refuses such programs too (its clients must use CUDA 4.0 headers or later). The "
     "execution calls of that era (`cuLaunch`, `cuParamSet*`, `cuFuncSetBlockShape`) were "
     "replaced by `cuLaunchKernel`, which omps implements.",
     r"^(cuMemAlloc|cuMemFree|cuMemGetInfo|cuMemAllocHost|cuMemAllocPitch|cuMemGetAddressRange|"
     r"cuMemHostGetDevicePointer|cuMemHostRegister|cuDeviceTotalMem|cuModuleGetGlobal|"
     r"cuMemcpy(HtoD|DtoH|DtoD|HtoDAsync|DtoHAsync|DtoDAsync|2D|2DAsync|2DUnaligned|3D|3DAsync|"
     r"AtoD|DtoA|AtoH|HtoA|AtoA|AtoHAsync|HtoAAsync)|cuMemsetD(8|16|32|2D8|2D16|2D32)|"
     r"cuArrayCreate|cuArray3DCreate|cuArrayGetDescriptor|cuArray3DGetDescriptor|cuTexRefSetAddress|"
     r"cuTexRefSetAddress2D|cuTexRefGetAddress|cuGraphicsResourceGetMappedPointer|"
     r"cuGraphicsResourceSetMapFlags|cuGLCtxCreate|cuGLGetDevices|cuGLMapBufferObject|"
     r"cuGLMapBufferObjectAsync|cuVDPAUCtxCreate|cuEventDestroy|cuStreamDestroy|cuCtxAttach|"
     r"cuCtxDetach|cuLaunch|cuLaunchGrid|cuLaunchGridAsync|cuFuncSetBlockShape|cuFuncSetSharedSize|"
     r"cuParamSet\w*)$"),
    ("Arrays, textures and surfaces",
     "Texture and surface references (cuTexRef*, cuSurfRef*, cuModuleGetTexRef/SurfRef) left "
     "the CUDA runtime in CUDA 12: no program built with a current toolkit reaches them. "
     "Arrays, mipmapped arrays, their copies and texture and surface objects work "
     "(api/array.rs); sparse and multi-planar arrays, array mappings and memory requirements "
     "are not built (no program of the suites asks).",
     r"^(cuArray|cuMipmappedArray|cuTex|cuSurf|cuMemcpy(AtoA|AtoD|AtoH|DtoA|HtoA)|"
     r"cuModuleGet(Tex|Surf)Ref|cuDeviceGetTexture1DLinearMaxWidth|cuMemMapArrayAsync|"
     r"cuExternalMemoryGetMappedMipmappedArray|cuGraphicsResourceGetMappedMipmappedArray|"
     r"cuGraphicsSubResourceGetMappedArray)"),
    ("Graphics interoperability (OpenGL, EGL, VDPAU)",
     "A client's OpenGL, EGL and VDPAU objects belong to its own process and display "
     "connection; the server, another process, cannot register them.",
     r"^(cuGL|cuEGL|cuVDPAU|cuGraphics)"),
    ("Managed memory",
     "Managed memory works (api/managed.rs). `__managed__` variables of modules "
     "(cuLibraryGetManaged) would be the server's memory, unreachable from the client "
     "(docs/design.md, section 13); the batch prefetch and discard calls of CUDA 12.8 and "
     "cuPointerSetAttribute are not built (no program of the suites asks).",
     r"^(cuMemAllocManaged|cuMemAdvise|cuMemPrefetch|cuMemRangeGetAttribute|cuStreamAttachMemAsync|"
     r"cuMemDiscard|cuLibraryGetManaged|cuPointerSetAttribute)"),
    ("Graph nodes and graph calls not built yet",
     "Not built yet: conditional nodes (their handles must belong to the driver graph a "
     "built graph becomes at instantiation); batch memory-operation and external-semaphore "
     "nodes (their stream forms are not built either); capture into an existing graph and "
     "capture dependency updates (a capture's graph lives in the server).",
     r"^(cuGraph|cuUserObject|cuStreamBeginCaptureToGraph|cuStreamUpdateCaptureDependencies|"
     r"cuDevice(Get|Set)GraphMemAttribute|cuDeviceGraphMemTrim)"),
    ("External memory and semaphores (Vulkan, Direct3D, NvSci)",
     "The handles are the client's file descriptors or objects; passing them to the server "
     "is possible (over the socket) but not built.",
     r"^(cuImportExternal|cuDestroyExternal|cuExternalMemory|cuSignalExternalSemaphores|"
     r"cuWaitExternalSemaphores|cuDeviceGetNvSciSyncAttributes)"),
    ("Shareable memory handles",
     "Not built yet: dma-buf handles of address ranges. IPC memory and event handles, VMM "
     "memory and memory pools shared as POSIX descriptors work (api/ipc.rs, "
     "api/vmm_share.rs, api/pool_share.rs), as does access to VMM memory and pools from "
     "another GPU (api/vmm.rs, api/pool.rs).",
     r"^(cuMemExportToShareableHandle|cuMemImportFromShareableHandle|cuMemPoolExport|"
     r"cuMemPoolImport|cuMemGetHandleForAddressRange|cuMemPoolSetAccess)"),
    ("Peer access and multicast",
     "Peer access between GPUs works: the server enables it in its contexts when a client "
     "asks, and copies between GPUs run over it (api/peer.rs); 3D peer copies, "
     "multi-device cooperative launches and NVLink multicast objects are not built (no "
     "program of the suites asks; multicast can take a machine's GPUs out of service).",
     r"^(cuCtx(Enable|Disable)PeerAccess|cuDeviceCanAccessPeer|cuDeviceGetP2P|cuMemcpy(3D)?Peer|"
     r"cuMulticast|cuLaunchCooperativeKernelMultiDevice)"),
    ("Stream memory operations",
     "Not built yet: every address must be checked against the client's own memory "
     "(device and registered host); the server uses these operations itself.",
     r"^(cuStreamWaitValue|cuStreamWriteValue|cuStreamBatchMemOp)"),
    ("Settings of the one shared context",
     "Every client's work runs in one context per GPU: a cache or shared-memory "
     "configuration or context flags set by one client would change every client's. No "
     "context has an execution affinity (cuDeviceGetExecAffinitySupport answers 0 and "
     "cuCtxCreate refuses one, api/ctx_params.rs).",
     r"^(cuCtx(Get|Set)CacheConfig|cuCtx(Get|Set)SharedMemConfig|cuFuncSetSharedMemConfig|"
     r"cuCtxSetFlags|cuCtxGetExecAffinity)"),
    ("Facilities of the driver's own process",
     "Checkpoints, core dumps, the debugger's and profiler's hooks and the driver's log "
     "callbacks act on the process that holds the context, which is the server: a client "
     "asking would act on the server and every other client.",
     r"^(cuCheckpointProcess|cuCoredump|cudbg|cuProfilerInitialize|cuLogs|cuFlushGPUDirectRDMAWrites|"
     r"cuDevice(Register|Unregister)AsyncNotification)"),
    ("Batch copies (CUDA 12.8 and later)",
     "Not built yet: no program of the suites asks; each copy of a batch would be checked "
     "as a single copy is.",
     r"^(cuMemcpyBatchAsync|cuMemcpy3DBatchAsync|cuMemBatchDecompressAsync)"),
    ("Other calls not built yet",
     "No program of the GPU suites or PyTorch asks for these; each is a small addition when "
     "one does.",
     r"."),
]


def stub_names():
    files = glob.glob(os.path.join(ROOT, "target", "*", "build", "omps-shim-*", "out", "unsupported.rs"))
    if not files:
        sys.exit("no generated stubs: run `cargo build -p omps-shim` first")
    newest = max(files, key=os.path.getmtime)
    return sorted(set(re.findall(r'unsupported\("(\w+)"\)', open(newest).read())))


def main():
    names = stub_names()
    groups = {t: [] for t, _, _ in FAMILIES}
    for n in names:
        for title, _, pat in FAMILIES:
            if re.search(pat, n):
                groups[title].append(n)
                break
    out = ["# Driver entry points omps does not implement",
           "",
           "Each returns `CUDA_ERROR_NOT_SUPPORTED` and names itself once on standard error.",
           f"{len(names)} of them, by family, each with its reason. Generated by",
           "`scripts/entry-points.py`; `cargo test` checks that this list is the shim's.",
           ""]
    for title, reason, _ in FAMILIES:
        if not groups[title]:
            continue
        out += [f"## {title} ({len(groups[title])})", "", reason, "",
                "- " + ", ".join(f"`{n}`" for n in groups[title]), ""]
    with open(os.path.join(ROOT, "docs", "entry-points.md"), "w") as f:
        f.write("\n".join(out))
    print(f"docs/entry-points.md: {len(names)} entry points")


if __name__ == "__main__":
    main()
