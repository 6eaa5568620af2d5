//! IPC through the shim's entry points, as cudart calls them: memory another client
//! exported is usable by this process (copies, pointer queries) from the first open until
//! the last close, and not after; it is never this process's to free.

mod common;
use common::*;
use omps_shim::api::hostmem::cuMemGetAddressRange_v2;
use omps_shim::api::ipc::*;
use omps_shim::api::mem::*;
use omps_shim::conn::Conn;
use omps_shim::cuda::*;

#[test]
fn an_opened_handle_is_usable_memory_until_closed() {
    let srv = start_as_client("ipc-shim");
    let exporter = Conn::connect_to(&srv.socket()).unwrap();
    let p = alloc(&exporter, 4096);
    memset(&exporter, p);
    exporter.ping(0).unwrap();
    let h = export_mem_handle(&exporter, 0, p);
    let handle = CUipcMemHandle { reserved: h.bytes };

    let mut words = [0u32; 16];
    // SAFETY (whole test): every pointer passed is a valid local of the right size.
    unsafe {
        assert_eq!(
            cuMemcpyDtoH_v2(words.as_mut_ptr().cast(), p, 64),
            CUDA_ERROR_INVALID_VALUE,
            "not this process's memory before it opens the handle"
        );
        let mut q = 0u64;
        ok(cuIpcOpenMemHandle_v2(&mut q, handle, 1));
        assert_eq!(q, p, "one context: the exporter's own pointer");
        let mut again = 0u64;
        ok(cuIpcOpenMemHandle_v2(&mut again, handle, 1));
        assert_eq!(again, p);
        ok(cuMemcpyDtoH_v2(words.as_mut_ptr().cast(), q, 64));
        assert_eq!(words, [7; 16], "the exporter's data");
        let mut base = 0u64;
        let mut size = 0usize;
        ok(cuMemGetAddressRange_v2(&mut base, &mut size, q + 100));
        assert_eq!((base, size), (p, 4096));
        assert_eq!(
            cuMemFree_v2(q),
            CUDA_ERROR_INVALID_VALUE,
            "not ours to free"
        );
        ok(cuIpcCloseMemHandle(q));
        ok(cuMemcpyDtoH_v2(words.as_mut_ptr().cast(), q, 64));
        ok(cuIpcCloseMemHandle(q));
        assert_eq!(
            cuMemcpyDtoH_v2(words.as_mut_ptr().cast(), q, 64),
            CUDA_ERROR_INVALID_VALUE,
            "closed as often as opened: gone"
        );
        assert_eq!(cuIpcCloseMemHandle(q), CUDA_ERROR_INVALID_VALUE);

        // A process's own handle does not open (CUDA_ERROR_INVALID_CONTEXT), and that
        // failure is the call's alone: the next copy works.
        // Large enough to go through the channel's staging chunks, as cudart's copies do.
        const WORDS: usize = 1 << 18;
        let mut own = 0u64;
        ok(cuMemAlloc_v2(&mut own, 4 * WORDS));
        let fives = vec![5u32; WORDS];
        ok(cuMemcpyHtoD_v2(own, fives.as_ptr().cast(), 4 * WORDS));
        let mut h = CUipcMemHandle { reserved: [0; 64] };
        ok(cuIpcGetMemHandle(&mut h, own));
        let mut q = 0u64;
        assert_eq!(
            cuIpcOpenMemHandle_v2(&mut q, h, 1),
            CUDA_ERROR_INVALID_CONTEXT
        );
        let mut back = vec![0u32; WORDS];
        ok(cuMemcpyDtoH_v2(back.as_mut_ptr().cast(), own, 4 * WORDS));
        assert!(back.iter().all(|&w| w == 5));
        ok(cuMemFree_v2(own));
    }
}
