//! Arbitrary records into the server's decoder and validation, on the host-memory GPU.
//! Input: a sequence of (tag byte, length u16 LE, payload). A record may be refused
//! (Malformed) or fail as CUDA would; nothing may panic, and after the session is retired
//! every byte it allocated must be free again.
#![no_main]

use libfuzzer_sys::fuzz_target;
use omps_server::gpu::Gpu;
use omps_server::gpu_host::HostGpu;
use omps_server::session::Session;
use omps_server::testing::fake_client;
use omps_server::worker::WorkerCtx;
use std::sync::Arc;

fuzz_target!(|data: &[u8]| {
    let host = Arc::new(HostGpu::new(0, 1 << 26));
    let gpu: Arc<dyn Gpu> = host.clone();
    let (client, _peer) = fake_client(&gpu, 1).expect("fake client");
    let mut ctx = WorkerCtx::new(gpu).expect("worker ctx");
    // SAFETY: the fake client's segment has ring 0 and lives as long as the session.
    let mut s = unsafe { Session::new(client, 0, &mut ctx) };
    let mut rest = data;
    while rest.len() >= 3 {
        let tag = (rest[0] % 48) as u32;
        let len = (u16::from_le_bytes([rest[1], rest[2]]) as usize).min(rest.len() - 3);
        let payload = &rest[3..3 + len];
        rest = &rest[3 + len..];
        if s.handle(&mut ctx, tag, payload).is_err() {
            break;
        }
        ctx.poll();
    }
    ctx.retire(s);
    for _ in 0..4 {
        ctx.poll();
    }
    assert_eq!(host.bytes_allocated(), 0, "a retired session leaked device memory");
    assert_eq!(host.events_live(), host_scratch_events(), "a retired session leaked events");
});

/// Events the worker keeps for itself (one per work stream).
fn host_scratch_events() -> usize {
    4
}
