//! The lane loop ([`run`]): one worker thread's passes over its clients' rings, the
//! messages the control thread sends it, its rests and its end. Apart from the lane
//! context (ctx.rs), which the sessions use, because the loop drives the sessions.

use super::{GpuShared, ToWorker, WorkerConfig, WorkerCtx};
use crate::gpu::Gpu;
use crate::release::given::Release;
use crate::session::Session;
use omps_ring::futex::Doorbell;
use omps_ring::segment::state;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn pin_to(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is valid; sched_setaffinity reads it for this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) != 0 {
            tracing::warn!("could not pin worker to cpu {cpu}");
        }
    }
}

/// Records taken from one client's ring per pass, so one busy client can't starve others.
/// A launch costs the worker about 3.7 us of `cuLaunchKernel` (H100), so with 8 clients
/// that each queue a burst, the last one's first kernel waits 7 x BATCH launches: 64 made
/// that 1.3 ms, 8 makes it 0.2 ms. A pass's own housekeeping is well under 1 us.
const BATCH: usize = 8;

pub fn run(
    gpu: Arc<dyn Gpu>,
    mut rx: rtrb::Consumer<ToWorker>,
    bell: &Doorbell,
    cfg: WorkerConfig,
    shared: Arc<GpuShared>,
    lane: usize,
) {
    if let Some(cpu) = cfg.cpu {
        pin_to(cpu);
    }
    let dev = gpu.ordinal();
    // Module loads and links run off the lanes (crate::image::compile).
    shared.compiler.go_threaded();
    let mut ctx = match WorkerCtx::lane(gpu, shared.clone(), lane) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(gpu = dev, "worker cannot start: {}", e.0);
            return;
        }
    };
    let mut sessions: Vec<Session> = Vec::new();
    let mut buf = Vec::with_capacity(64 * 1024);
    let mut last_work = Instant::now();
    let mut quitting = false;
    let stats = &shared.stats[lane.min(shared.stats.len() - 1)];
    loop {
        stats.passes.fetch_add(1, Ordering::Relaxed);
        while let Ok(msg) = rx.pop() {
            match msg {
                ToWorker::Add(c) => {
                    shared.sessions.fetch_add(1, Ordering::SeqCst);
                    // SAFETY: every client segment holds a ring per GPU (layout from the
                    // GPU count).
                    sessions.push(unsafe { Session::new(c, dev) })
                }
                ToWorker::Remove(id) => {
                    if let Some(i) = sessions.iter().position(|s| s.client.id == id) {
                        let s = sessions.swap_remove(i);
                        ctx.retire(s);
                    }
                }
                ToWorker::Unpin(id, p) => match sessions.iter_mut().find(|s| s.client.id == id) {
                    // A graph of the client's that copies there keeps it (graph_memory.rs).
                    Some(s) => {
                        if let Err(p) = s.hold_pinned_for_graphs(p) {
                            ctx.release_later(
                                s,
                                Release {
                                    pinned: vec![p],
                                    ..Default::default()
                                },
                            )
                        }
                    }
                    None => {
                        // Its session is gone with its work: nothing here to wait for.
                        p.done();
                    }
                },
                ToWorker::Quit => quitting = true,
            }
        }
        if quitting {
            for s in sessions.drain(..) {
                ctx.retire(s);
            }
            let deadline = Instant::now() + Duration::from_secs(5);
            while ctx.deferred_len > 0 && Instant::now() < deadline {
                ctx.poll_deferred();
                std::thread::sleep(Duration::from_millis(1));
            }
            shared
                .releaser
                .wait_idle(deadline.saturating_duration_since(Instant::now()));
            return;
        }
        // A pass runs against one context: lane 0 resets it only while no lane is in a
        // pass (recover takes the write side), and a lane first catches up with a reset.
        let pass = shared.pass_lock.read().unwrap_or_else(|e| e.into_inner());
        ctx.sync_with_lanes();
        let mut busy = false;
        let mut i = 0;
        while i < sessions.len() {
            // A client whose stream is queued too deep waits on its own full ring, not
            // the worker in the driver (session/depth.rs).
            // A client whose module load or link runs off the lane waits for it the same
            // way (session/compile.rs); one done is answered first.
            // A panic in what the worker does for one client (its depth marks, its fences
            // for peers, as in its records below) ends that client, not the lane.
            let held = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let s = &mut sessions[i];
                Ok(s.compile_waiting(&mut ctx)? || s.held_back(&ctx))
            }));
            let mut outcome = match held {
                Ok(Ok(true)) => {
                    i += 1;
                    continue;
                }
                Ok(Ok(false)) => Ok(()),
                Ok(Err(e)) => Err(e),
                Err(_) => {
                    tracing::error!(
                        client = sessions[i].client.id,
                        "the server panicked over a client's depth or load: it is cut off"
                    );
                    Err(crate::session::Malformed("server failure".into()))
                }
            };
            // A client cut off above takes no records: it goes with the others below.
            let batch = if outcome.is_ok() { BATCH } else { 0 };
            for _ in 0..batch {
                match sessions[i].pop(&mut buf) {
                    Ok(Some(tag)) => {
                        busy = true;
                        let t0 = Instant::now();
                        // A panic in the server's handling of one record (a bug the client's
                        // bytes found) ends that client, not the lane and every client on it.
                        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            sessions[i].handle(&mut ctx, tag, &buf)
                        }))
                        .unwrap_or_else(|_| {
                            tracing::error!(
                                client = sessions[i].client.id,
                                tag,
                                "the server panicked handling a record: the client is cut off"
                            );
                            Err(crate::session::Malformed(format!(
                                "the server failed on record {tag}"
                            )))
                        });
                        let ns = t0.elapsed().as_nanos() as u64;
                        stats.record(tag, ns);
                        sessions[i]
                            .client
                            .server_ns
                            .fetch_add(ns, Ordering::Relaxed);
                        if let Err(e) = r {
                            outcome = Err(e);
                            break;
                        }
                        if sessions[i].is_deep() || sessions[i].compiling() {
                            break;
                        }
                    }
                    Ok(None) => break,
                    Err(e) => {
                        outcome = Err(e);
                        break;
                    }
                }
            }
            if outcome.is_ok() {
                let fenced = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    // Launches gathered in its turn go now, before any fence.
                    sessions[i].flush_run(&mut ctx);
                    ctx.fence_for_peers(&mut sessions[i]);
                }));
                if fenced.is_err() {
                    tracing::error!(
                        client = sessions[i].client.id,
                        "the server panicked fencing a client's work for its other GPUs: it is cut off"
                    );
                    outcome = Err(crate::session::Malformed("server failure".into()));
                }
            }
            if let Err(e) = outcome {
                let s = sessions.swap_remove(i);
                s.client
                    .disconnect(crate::gpu::code::MPS_CLIENT_TERMINATED, &e.0);
                ctx.retire(s);
                continue;
            }
            i += 1;
        }
        ctx.poll_markers();
        ctx.poll_deferred();
        // Blocks kept for allocations that did not come go back (worker/kept.rs).
        ctx.give_back_kept();
        ctx.sync_with_lanes();
        drop(pass);
        if let Some(e) = ctx.fault {
            // Every client of the GPU learns of the fault (MPS's contract), and once they
            // are all gone the context is recreated.
            for s in &sessions {
                if s.client.seg.header().server_state.load(Ordering::Relaxed) != state::FAULT {
                    s.client.set_state(state::FAULT, e);
                }
            }
            if sessions.is_empty()
                && ctx.deferred_len == 0
                && shared.held.load(Ordering::SeqCst) == 0
            {
                ctx.recover();
            }
        }
        if busy {
            last_work = Instant::now();
        } else if last_work.elapsed() >= cfg.spin {
            // Rest until a client rings; wake now and then while the GPU owes completions,
            // and in any case so a client that clears the shared sleep flag can delay
            // others by a few milliseconds at most.
            // A load off the lane is looked for as often as the GPU's completions are.
            let timeout =
                if ctx.has_pending() || ctx.holds_kept() || sessions.iter().any(Session::compiling)
                {
                    Duration::from_micros(50)
                } else {
                    Duration::from_millis(5)
                };
            stats.naps.fetch_add(1, Ordering::Relaxed);
            bell.sleep_unless(
                || !rx.is_empty() || sessions.iter_mut().any(|s| !s.compiling() && s.has_data()),
                Some(timeout),
            );
        } else {
            std::hint::spin_loop();
        }
    }
}
