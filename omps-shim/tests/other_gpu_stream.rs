//! Copies and memsets of one GPU's memory queued on another GPU's stream, as
//! cufftXtMemcpy fills each GPU's piece of a multi-GPU plan from one stream: the driver
//! runs them in that stream's order. Each GPU's session knows only its own streams, so
//! the shim puts such work in the stream's order from the host (api/exec.rs
//! `stream_for`). Before, the stream's id went to the memory's GPU, whose session did not
//! know it, and the server disconnected the program.

mod common;
use common::*;
use omps_shim::api::{ctx::*, exec::*, hostmem::*, mem::*};

#[test]
fn work_on_another_gpus_memory_runs_in_the_streams_order() {
    let (_server, [c0, c1]) = shim_on_linked_gpus("other-gpu-stream");
    // SAFETY (whole block): valid out-pointers and buffers of the sizes passed.
    unsafe {
        ok(cuCtxSetCurrent(c1));
        let (mut a1, mut b1) = (0u64, 0u64);
        ok(cuMemAlloc_v2(&mut a1, 64));
        ok(cuMemAlloc_v2(&mut b1, 64));
        ok(cuCtxSetCurrent(c0));
        let mut d0 = 0u64;
        ok(cuMemAlloc_v2(&mut d0, 64));
        let mut s0 = std::ptr::null_mut();
        ok(cuStreamCreate(&mut s0, 0));

        // On GPU 0's stream, in this order: a kernel on GPU 0, a peer copy to GPU 1, then
        // a memset, a host-to-device copy, a device-to-device copy within GPU 1 and a
        // device-to-host copy, all of GPU 1's memory.
        fill_kernel(d0, 0x11, 16, s0);
        ok(cuMemcpyAsync(a1, d0, 64, s0));
        ok(cuMemsetD32Async(a1 + 32, 0x22, 8, s0));
        let threes = [0x33u32; 16];
        ok(cuMemcpyHtoDAsync_v2(b1, threes.as_ptr().cast(), 64, s0));
        ok(cuMemcpyDtoDAsync_v2(b1, a1, 32, s0));
        let mut out = [0u32; 16];
        ok(cuMemcpyDtoHAsync_v2(out.as_mut_ptr().cast(), b1, 64, s0));
        ok(cuStreamSynchronize(s0));
        let mut want = [0x33u32; 16];
        want[..8].fill(0x11);
        assert_eq!(out, want, "each step saw the one before it");
        ok(cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), a1, 64));
        want[8..].fill(0x22);
        assert_eq!(out, want, "the memset followed the peer copy");
        // The program goes on using both GPUs: it was not disconnected.
        ok(cuCtxSetCurrent(c1));
        ok(cuCtxSynchronize());
        ok(cuMemFree_v2(a1));
        ok(cuMemFree_v2(b1));
    }
}
