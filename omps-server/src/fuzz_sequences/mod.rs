//! The stateful fuzz body: byte strings decoded into sequences of well-formed client
//! records that name what the sequence made before (allocations, streams, events,
//! modules and their functions, captures, graphs and executable graphs, IPC openings of
//! the bystander's memory, link and JIT containers, VMM reservations, handles and
//! mappings, CUDA arrays, peer copies, host functions, conditional graphs), mixed with
//! records that lie and with
//! the client's death at any step. Two clients share the host GPU: the fuzzed one, and a
//! bystander whose memory holds a pattern and which synchronizes after every step.
//! Half the sequences (odd lengths) run on a GPU that takes launch runs, and consecutive
//! launches are one turn there. Whatever the sequence, nothing panics, the fuzzed client never changes the bystander's
//! memory nor stalls it (its synchronization is answered within a bounded number of
//! worker passes), and once it is retired every byte, event, module and graph it held is
//! free again (arrays and virtual memory too). Run by CI under proptest (below) and by the `sequences`
//! cargo-fuzz target.

mod basic;
mod client;
mod graphs;
#[cfg(test)]
mod launch_runs;
mod more;
#[cfg(test)]
mod quick;

use crate::gpu::host::HostGpu;
use crate::gpu::Gpu;
use crate::worker::WorkerCtx;
use client::{Bytes, Client, Held, BYSTANDER_BYTES, PATTERN, SHARED_BYTES};
use omps_ring::wire;
use std::sync::Arc;

/// What a sequence got done: allocations made, modules loaded, kernels run.
#[derive(Debug, Default)]
pub struct Done {
    pub allocs: usize,
    pub loads: usize,
    pub launches: usize,
    /// Executable graphs made, and IPC openings.
    pub execs: usize,
    pub opened: usize,
    /// VMM mappings made, arrays made, host functions queued, graphs made (captures,
    /// conditional homes, clones).
    pub mapped: usize,
    pub arrays: usize,
    pub host_fns: usize,
    pub graphs: usize,
}

/// One record of the sequence, of the family its first byte picks: false once the client
/// is dead (it lied, or died here).
fn step(
    me: &mut Client,
    ctx: &mut WorkerCtx,
    held: &mut Held,
    b: &mut Bytes,
    theirs: u64,
    exported: Option<wire::IpcHandle>,
) -> bool {
    let tag = b.u8();
    match tag % 48 {
        0..=15 => basic::step_basic(me, ctx, held, b, theirs, tag),
        16..=31 => graphs::step_graphs_ipc_link(me, ctx, held, b, exported),
        _ => more::step_more(me, ctx, held, b, theirs),
    }
}

/// One sequence (see the module's documentation).
pub fn run_sequence(data: &[u8]) -> Done {
    let host = Arc::new(HostGpu::new(0, 1 << 26));
    // Half the sequences on a GPU that takes launch runs (kinds/launch_run.rs).
    host.take_runs(data.len() % 2 == 1);
    let gpu: Arc<dyn Gpu> = host.clone();
    let mut ctx = WorkerCtx::new(gpu.clone()).expect("worker ctx");
    let modules_before = host.modules_loaded();

    // The bystander: one allocation holding a pattern.
    let mut other = Client::new(&gpu, 2);
    let theirs = other
        .alloc(&mut ctx, BYSTANDER_BYTES as u64)
        .expect("bystander allocation");
    gpu.memset(theirs, PATTERN, 4, BYSTANDER_BYTES / 4, 0)
        .expect("pattern");

    // What the fuzzed client may open and write: another allocation of the bystander's,
    // exported (the pattern's is never shared).
    let shared = other
        .alloc(&mut ctx, SHARED_BYTES)
        .expect("bystander's shared allocation");
    let exported = other.export(&mut ctx, shared);

    let mut me = Client::new(&gpu, 1);
    let mut held = Held {
        next_id: 1,
        ..Default::default()
    };
    let mut b = Bytes(data);
    let mut done = Done::default();
    while !b.0.is_empty() {
        let (allocs, modules) = (held.allocs.len(), held.modules.len());
        let (execs, opened) = (held.execs.len(), held.opened.len());
        let (mapped, arrays) = (held.mapped.len(), held.arrays.len());
        let (host_fns, graphs) = (held.host_fns.len(), held.graphs.len());
        let alive = step(&mut me, &mut ctx, &mut held, &mut b, theirs, exported);
        assert!(
            other.synchronizes(&mut ctx),
            "the fuzzed client stalled the bystander"
        );
        done.allocs += held.allocs.len().saturating_sub(allocs);
        done.loads += held.modules.len().saturating_sub(modules);
        done.execs += held.execs.len().saturating_sub(execs);
        done.opened += held.opened.len().saturating_sub(opened);
        done.mapped += held.mapped.len().saturating_sub(mapped);
        done.arrays += held.arrays.len().saturating_sub(arrays);
        done.host_fns += held.host_fns.len().saturating_sub(host_fns);
        done.graphs += held.graphs.len().saturating_sub(graphs);
        if !alive {
            break;
        }
    }
    done.launches = host.launches();
    ctx.retire(me.s);
    for _ in 0..4 {
        ctx.poll();
    }
    let back = host.peek(theirs, BYSTANDER_BYTES).expect("read back");
    assert!(
        back.chunks_exact(4)
            .all(|w| u32::from_le_bytes(w.try_into().unwrap()) == PATTERN),
        "the fuzzed client changed another client's memory"
    );
    assert_eq!(
        host.bytes_allocated(),
        BYSTANDER_BYTES as u64 + SHARED_BYTES,
        "a retired session leaked device memory"
    );
    ctx.retire(other.s);
    for _ in 0..4 {
        ctx.poll();
    }
    assert_eq!(
        host.bytes_allocated(),
        0,
        "the bystander's memory was not freed"
    );
    assert_eq!(
        host.events_live(),
        ctx.own_events(),
        "a retired session leaked events"
    );
    assert_eq!(
        host.modules_loaded(),
        modules_before,
        "a retired session leaked modules"
    );
    assert_eq!(host.arrays_live(), 0, "a retired session leaked arrays");
    assert_eq!(
        host.vmm_live(),
        (0, 0, 0),
        "a retired session leaked reservations, handles or mappings"
    );
    assert_eq!(
        host.graph_count(),
        (0, 0),
        "a retired session leaked graphs"
    );
    done
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]
        /// Sequences of plausible records, lies and deaths never panic, leak or reach
        /// the other client's memory.
        #[test]
        fn sequences_never_panic_leak_or_reach_others(
            data in proptest::collection::vec(any::<u8>(), 0..400)
        ) {
            super::run_sequence(&data);
        }
    }

    /// A sequence that certainly allocates, loads, launches, copies and frees, so the
    /// checks above are not passed by doing nothing.
    #[test]
    fn a_full_sequence_does_what_it_says() {
        // alloc, alloc, load, launch, memset, copy, free, stream, event, record, sync.
        let data = [
            0, 3, 1, 5, 9, 10, 0, 0, 7, 3, 0, 0, 0, 2, 4, 0, 1, 1, 2, 0, 5, 1, 7, 8, 0, 0, 0, 12,
            0, 15,
        ];
        let done = super::run_sequence(&data);
        assert!(
            done.allocs >= 2 && done.loads == 1 && done.launches >= 1,
            "{done:?}"
        );
    }

    /// A sequence that certainly captures a memset, instantiates and launches the graph,
    /// and opens and closes the bystander's exported memory.
    #[test]
    fn a_graph_and_ipc_sequence_does_what_it_says() {
        let data = [
            0, 0, // alloc 64 bytes
            5, 0, // a stream
            16, 0, 0, 2, 0, // capture begins on it (relaxed)
            3, 0, 1, 1, 7, 0, // a memset of the allocation, captured
            16, 1, 0, 2, 1, // the capture ends: a graph
            16, 2, 0, 0, // instantiated
            16, 3, 0, 0, 0, // launched
            16, 5, 1, // the bystander's memory opened
            16, 6, 0, // and closed
        ];
        let done = super::run_sequence(&data);
        assert!(done.execs == 1 && done.opened == 1, "{done:?}");
    }

    /// A sequence that certainly reaches the last families: it maps VMM memory and sets
    /// a mapping, makes an array and copies into it, queues a host function (acknowledged
    /// later), makes a conditional home graph, and tries a peer copy into the bystander.
    #[test]
    fn a_vmm_array_host_fn_and_conditional_sequence_does_what_it_says() {
        let data = [
            0, 0, // alloc 64 bytes
            32, 0, 0, 0, 1, // a reservation of one granule, no hint
            32, 0, 1, 0, // a physical handle of one granule
            32, 0, 2, 0, 0, 1, 2, // mapped at the reservation
            32, 0, 3, 0, 1, // access for this GPU
            32, 0, 4, 0, 1, 5, 0, // a memset through the mapping
            32, 8, 0, 3, 1, 0, 1, // a 4x1 array of one 32-bit channel
            32, 8, 1, 0, 0, 1, 1, 0, 1, // a copy from the allocation into it
            32, 11, 0, 0, 0, 1, // a host function in slot 0
            32, 11, 1, 0, // acknowledged
            32, 14, 0, 0, 0, 0, 0, 0, 0, 0, // a conditional home graph
            32, 13, 1, 0, 0, 0, 0, 1,  // a peer copy out of the bystander (refused)
            15, // ping
        ];
        let done = super::run_sequence(&data);
        assert!(
            done.mapped == 1 && done.arrays == 1 && done.host_fns == 1 && done.graphs == 1,
            "{done:?}"
        );
    }

    /// Found by the fuzzer (cargo fuzz, sequences): a client that dies capturing, with
    /// conditional nodes in its capture, left graphs behind.
    #[test]
    fn a_death_mid_capture_with_conditional_nodes_leaves_no_graph() {
        let data = [
            126, 39, 5, 126, 126, 130, 75, 151, 208, 0, 0, 0, 0, 0, 0, 0, 28, 46, 46, 46, 14, 46,
            46, 43, 142, 142, 142, 142, 142, 142, 142, 142, 142, 142, 142, 14, 142, 142, 165, 142,
            236, 175, 249, 3, 142, 142, 142, 142, 142, 142, 142, 142, 142, 142, 142, 142, 142, 142,
            142, 126,
        ];
        super::run_sequence(&data);
    }

    /// The bystander check means something only if no host mapping can be device memory:
    /// the host GPU reaches registered host memory (a client's segment, page-locked memory)
    /// at its host address, so a segment over a device address would be that memory. Its
    /// addresses were once where ASLR maps, and now and then the fuzzed client's segment
    /// covered the bystander's allocation and this fuzz failed. Whatever the GPU or kind of
    /// allocation, no host page can be mapped at its address.
    #[test]
    fn no_host_mapping_can_be_made_at_a_device_address() {
        use crate::gpu::host::{HostGpu, HostProfile, VMM_GRANULE};
        use crate::gpu::Gpu;
        for ordinal in 0..4 {
            let gpu = HostGpu::with_profile(ordinal, 1 << 26, HostProfile::Sm90);
            let alloc = gpu.mem_alloc(4096).expect("alloc");
            let reserved = gpu.vmm_reserve(VMM_GRANULE, 0, 0).expect("reserve");
            for a in [alloc, reserved] {
                // SAFETY: MAP_FIXED_NOREPLACE never replaces a mapping; a page made here
                // is unmapped before the check.
                let p = unsafe {
                    libc::mmap(
                        a as *mut libc::c_void,
                        4096,
                        libc::PROT_READ | libc::PROT_WRITE,
                        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                        -1,
                        0,
                    )
                };
                let err = (p == libc::MAP_FAILED).then(std::io::Error::last_os_error);
                if p != libc::MAP_FAILED {
                    // SAFETY: the page this test just mapped, used by nothing.
                    unsafe { libc::munmap(p, 4096) };
                }
                assert!(
                    p == libc::MAP_FAILED || p as u64 != a,
                    "GPU {ordinal}: a host page was mapped at device address {a:#x}"
                );
                assert_ne!(
                    err.and_then(|e| e.raw_os_error()),
                    Some(libc::EEXIST),
                    "GPU {ordinal}: device address {a:#x} is inside a host mapping"
                );
            }
        }
    }
}
