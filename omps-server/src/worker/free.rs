//! What a lane hands the GPU's releaser: a release right away ([`free_on`]), or one held
//! until the client's work on every GPU it sees has passed a fence ([`hold`],
//! crate::release::peer_fence). Apart from the lane context so that work off the lanes
//! (session/compile.rs) can give back through it too.

use super::GpuShared;
use crate::client::ClientShared;
use crate::gpu::Gpu;
use crate::release::cross::CrossRelease;
use crate::release::given::Release;
use crate::release::peer_fence;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Frees what a client released once the GPU is done with it, on the GPU's releaser;
/// `generation`: the context generation its handles belong to (None: none are left).
pub fn free_on(
    shared: &Arc<GpuShared>,
    gpu: &Arc<dyn Gpu>,
    client: Arc<ClientShared>,
    mut rel: Release,
    final_for_client: bool,
    generation: Option<u64>,
) {
    // Exported allocations the owner is done with: freed now unless an importer
    // holds one open (then the last importer to close frees it, and the owner's process
    // stays charged for it until then). Openings an importer closed, now that its work
    // is done: the last user of a freed one frees it (counted as its own, since the
    // releaser takes it off the count).
    if !rel.ipc.is_empty() || !rel.ipc_close.is_empty() {
        let mut ipc = shared.ipc.lock().unwrap_or_else(|e| e.into_inner());
        for p in std::mem::take(&mut rel.ipc_close) {
            if let Some(Some((ptr, n))) = ipc.close(p, client.id) {
                client.add_mem(gpu.ordinal(), n);
                rel.allocs.push((ptr, n));
            }
        }
        for (p, n) in std::mem::take(&mut rel.ipc) {
            if ipc.owner_frees(p, client.id) {
                rel.allocs.push((p, n));
            } else {
                ipc.keep_charged(p, client.hold(gpu.ordinal(), n));
            }
        }
    }
    // Physical memory shared with other clients goes with its last user; what stays
    // stays charged to its owner's process until then.
    if !rel.vmm.handles.is_empty() {
        let mut ipc = shared.vmm_ipc.lock().unwrap_or_else(|e| e.into_inner());
        rel.vmm.handles.retain(|&(h, size)| {
            let last = ipc.release_vmm(h);
            if !last && size > 0 {
                ipc.keep_vmm(h, client.hold(gpu.ordinal(), size));
            }
            last
        });
    }
    shared
        .releaser
        .send(&**gpu, client, rel, final_for_client, generation);
}

/// Holds `release` of `client` (its session on `shared`'s GPU) until the client's work on
/// every GPU it sees has passed a fence; returns the token that this GPU's own fence must
/// pass (queue it as this GPU's part of the release).
pub fn hold(
    shared: &Arc<GpuShared>,
    gpu: &Arc<dyn Gpu>,
    generation: u64,
    client: &Arc<ClientShared>,
    release: Release,
    final_for_client: bool,
) -> Arc<CrossRelease> {
    let own = gpu.ordinal();
    shared.note_held();
    let others: Vec<usize> = client
        .visible
        .iter()
        .copied()
        .filter(|&g| g != own)
        .collect();
    let (job_shared, job_gpu, job_client) = (shared.clone(), gpu.clone(), client.clone());
    let token = Arc::new(CrossRelease::new(
        // This GPU's fence, and one per other GPU; a count of one more while they are
        // asked, so that an answer given at once cannot free it before all are asked.
        2 + others.len(),
        Box::new(move || {
            let g = job_gpu.ordinal();
            // Every copy read before the free has been queued before a fence that has
            // passed: the ranges are no longer the client's to copy from.
            for &(p, _) in release.allocs.iter().chain(&release.ipc) {
                job_client.forget_freed(g, p);
            }
            free_on(
                &job_shared,
                &job_gpu,
                job_client,
                release,
                final_for_client,
                Some(generation),
            );
            job_shared.held.fetch_sub(1, Ordering::SeqCst);
        }),
    ));
    for g in others {
        peer_fence::ask(client, g, &token);
    }
    token.done();
    token
}
