//! An IPC handle of memory on another of the process's GPUs, as NCCL's legacy transport
//! opens its peer's buffer (`cudaIpcOpenMemHandle` with lazy peer access, the peer's
//! buffer on the peer's GPU): each GPU's session knows the handles exported there, so the
//! shim asks the others when the current GPU's does not know it, and the current GPU gets
//! access to the memory's GPU. A kernel on GPU 0 then writes the memory of GPU 1.
//! Events likewise: simpleIPC's process on GPU 1 opens the event its sibling exported on
//! GPU 0, then waits for it.

mod common;
use common::*;
use omps_shim::api::ipc::*;
use omps_shim::api::{ctx::*, device::*, exec::*, mem::*};
use omps_shim::conn::Conn;
use omps_shim::cuda::*;

#[test]
fn a_handle_of_another_gpus_memory_opens_and_is_reached() {
    let (dir, _first, _second, _thread) = linked_gpus_server("ipc-other-gpu");
    // SAFETY: set before this test starts threads that read it; the shim reads it at cuInit.
    unsafe { std::env::set_var("OMPS_PIPE_DIRECTORY", &dir) };
    // The exporter, another client: 4 KiB on its GPU 1, filled with 7s, exported.
    let exporter = Conn::connect_to(&dir.join("omps.sock")).unwrap();
    let p = alloc_on(&exporter, 1, 4096);
    memset_words(&exporter, 1, p, 7);
    exporter.ping(1).unwrap();
    let h = export_mem_handle(&exporter, 1, p);
    let handle = CUipcMemHandle { reserved: h.bytes };
    // And an interprocess event (CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS) on GPU 1.
    let ev = omps_ring::wire::EventCreate {
        id: 0x7e1,
        flags: 0x6,
    };
    exporter
        .push(
            1,
            omps_ring::wire::Op::EventCreate,
            &[bytemuck::bytes_of(&ev)],
        )
        .unwrap();
    let mut ch = exporter.channel();
    ch.call(1, omps_ring::wire::Op::IpcGetEventHandle, |call| {
        bytemuck::bytes_of(&omps_ring::wire::HandleCall {
            call,
            id: ev.id,
            _pad: 0,
        })
        .to_vec()
    })
    .unwrap();
    let eh: omps_ring::wire::IpcHandle = ch.reply();
    drop(ch);

    // SAFETY (whole block): valid out-pointers and buffers of the sizes passed.
    unsafe {
        ok(cuInit(0));
        let mut c0 = std::ptr::null_mut();
        ok(cuDevicePrimaryCtxRetain(&mut c0, 0));
        ok(cuCtxSetCurrent(c0));
        let mut q = 0u64;
        ok(cuIpcOpenMemHandle_v2(&mut q, handle, 1));
        assert_eq!(q, p, "the exporter's pointer, on GPU 1");
        let mut words = [0u32; 16];
        ok(cuMemcpyDtoH_v2(words.as_mut_ptr().cast(), q, 64));
        assert_eq!(words, [7; 16], "the exporter's data");
        // A kernel on GPU 0 (the current one) writes GPU 1's memory through peer access.
        let mut s0 = std::ptr::null_mut();
        ok(cuStreamCreate(&mut s0, 0));
        fill_kernel(q, 0x5eed, 16, s0);
        ok(cuStreamSynchronize(s0));
        ok(cuMemcpyDtoH_v2(words.as_mut_ptr().cast(), q, 64));
        assert_eq!(words, [0x5eed; 16], "GPU 0's kernel wrote GPU 1's memory");
        ok(cuIpcCloseMemHandle(q));
        assert_eq!(
            cuMemcpyDtoH_v2(words.as_mut_ptr().cast(), q, 64),
            CUDA_ERROR_INVALID_VALUE,
            "closed: gone"
        );
        // The event exported on GPU 1 opens with GPU 0 current; a GPU 0 stream waits for
        // it and the host synchronizes with it, as natively.
        let mut e = std::ptr::null_mut();
        ok(cuIpcOpenEventHandle(
            &mut e,
            CUipcEventHandle { reserved: eh.bytes },
        ));
        ok(cuStreamWaitEvent(s0, e, 0));
        ok(cuEventSynchronize(e));
        ok(cuEventQuery(e));
        // simpleIPC then records it on its own GPU's stream after a kernel: waiting for
        // the event covers the kernel.
        let q2 = {
            let mut q2 = 0u64;
            ok(cuMemAlloc_v2(&mut q2, 64));
            q2
        };
        fill_kernel(q2, 0xabc, 16, s0);
        ok(cuEventRecord(e, s0));
        ok(cuEventSynchronize(e));
        ok(cuMemcpyDtoH_v2(words.as_mut_ptr().cast(), q2, 64));
        assert_eq!(words, [0xabc; 16], "the kernel before the record has run");
        ok(cuEventDestroy_v2(e));
        // An event this process created on GPU 0 stays GPU 0's: a GPU 1 stream cannot
        // record it, as natively (another context's event).
        let mut mine = std::ptr::null_mut();
        ok(cuEventCreate(&mut mine, 0));
        let mut c1 = std::ptr::null_mut();
        ok(cuDevicePrimaryCtxRetain(&mut c1, 1));
        ok(cuCtxSetCurrent(c1));
        let mut s1 = std::ptr::null_mut();
        ok(cuStreamCreate(&mut s1, 0));
        assert_eq!(cuEventRecord(mine, s1), CUDA_ERROR_INVALID_HANDLE);
        ok(cuCtxSetCurrent(c0));
        let mut bogus_event = CUipcEventHandle { reserved: eh.bytes };
        bogus_event.reserved[8] ^= 0xff;
        assert_eq!(
            cuIpcOpenEventHandle(&mut e, bogus_event),
            CUDA_ERROR_INVALID_VALUE,
            "an event handle no GPU knows"
        );
        // A handle no GPU knows is still refused.
        let mut bogus = handle;
        bogus.reserved[8] ^= 0xff;
        assert_eq!(
            cuIpcOpenMemHandle_v2(&mut q, bogus, 1),
            CUDA_ERROR_INVALID_VALUE
        );
    }
}
