//! The releaser: one thread per GPU that makes the driver calls giving back what clients
//! released, once the GPU is done with it, so that no worker waits for them.
//!
//! Measured on an H100 with another stream running a 300 ms kernel
//! (`scripts/probe/blocking_calls.cu`): `cuMemFree` waited 250 ms for the GPU and held up
//! every other thread's launches meanwhile, while `cuMemFreeAsync` of the same memory
//! held up nobody; `cuModuleUnload` waited 250 ms but held up nobody either. On a worker
//! either wait stalled every client of that lane (a 111 ms unload when a PyTorch process
//! exited, docs/benchmarks.md). Here the frees are stream-ordered and the unloads wait on
//! this thread only. What still holds up the whole context (host unregistration, for one)
//! at least no longer runs on a worker.
//!
//! Module unloads run on a second thread per GPU, the unloader: cuModuleUnload waits for
//! every running kernel of the context, whatever its module (the probe above), so one
//! client's kernel that never ends would hold the releaser in the driver, and with it the
//! memory every other client of the GPU frees. Their frees go on meanwhile; only unloads,
//! which all wait for that kernel anyway, queue behind it.

use crate::client::ClientShared;
use crate::gpu::Gpu;
use crate::release::given::Release;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

struct Job {
    client: Arc<ClientShared>,
    release: Release,
    /// Counts toward `client.released` once done (the client's whole session ended).
    final_for_client: bool,
    /// The context generation the handles belong to; None, or an older generation than
    /// the current one, after a context reset: the handles died with the old context, and
    /// freeing them could hit the new one's, so only the books are settled.
    generation: Option<u64>,
}

/// A release's module unloads, and what waits for them: the modules' bytes on the
/// client's books and, for a client's last release, its being released.
struct Unload {
    client: Arc<ClientShared>,
    modules: Vec<u64>,
    module_bytes: u64,
    final_for_client: bool,
    generation: u64,
}

/// Where a release's unloads go: the unloader thread, counted while they wait.
#[derive(Clone)]
struct Unloads {
    tx: mpsc::Sender<Unload>,
    pending: Arc<AtomicUsize>,
}

impl Unloads {
    /// Queues `u` for the unloader; done here, waiting, if the unloader is gone.
    fn send(&self, gpu: &dyn Gpu, u: Unload, now: u64) {
        self.pending.fetch_add(1, Ordering::SeqCst);
        if let Err(mpsc::SendError(u)) = self.tx.send(u) {
            unload(gpu, u, now);
            self.pending.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

pub struct Releaser {
    tx: mpsc::Sender<Job>,
    unloads: Unloads,
    /// The GPU's context generation, bumped by a reset (shared with the workers).
    generation: Arc<AtomicU64>,
    /// Jobs sent and not yet done (their unloads apart: `unloads.pending`).
    pending: Arc<AtomicUsize>,
    /// Held while a job runs, and by a context reset, so that none runs across one; the
    /// unloader's likewise.
    running: Arc<Mutex<()>>,
    unloading: Arc<Mutex<()>>,
    /// Joined on drop, so that a server (or a fuzz run) that ends leaves nothing behind.
    thread: Option<std::thread::JoinHandle<()>>,
    unloader: Option<std::thread::JoinHandle<()>>,
}

/// Both threads kept from running jobs (a context reset).
pub struct Exclusive<'a> {
    _running: MutexGuard<'a, ()>,
    _unloading: MutexGuard<'a, ()>,
}

/// The unloader: unloads modules one release after another.
fn start_unloader(
    gpu: Arc<dyn Gpu>,
    current: Arc<AtomicU64>,
    lock: Arc<Mutex<()>>,
) -> (Unloads, Option<std::thread::JoinHandle<()>>) {
    let (tx, rx) = mpsc::channel::<Unload>();
    let pending = Arc::new(AtomicUsize::new(0));
    let p = pending.clone();
    let spawned = std::thread::Builder::new()
        .name(format!("omps-unload{}", gpu.ordinal()))
        .spawn(move || {
            for u in rx {
                let _one = lock.lock().unwrap_or_else(|e| e.into_inner());
                unload(&*gpu, u, current.load(Ordering::SeqCst));
                p.fetch_sub(1, Ordering::SeqCst);
            }
        });
    let thread = spawned
        .inspect_err(|e| {
            // The receiver is gone with the closure: unloads then run on the releaser.
            tracing::error!("cannot start the unloader thread: {e}; unloading on the releaser")
        })
        .ok();
    (Unloads { tx, pending }, thread)
}

impl Releaser {
    pub fn start(gpu: Arc<dyn Gpu>, generation: Arc<AtomicU64>) -> Releaser {
        let (tx, rx) = mpsc::channel::<Job>();
        let pending = Arc::new(AtomicUsize::new(0));
        let p = pending.clone();
        let current = generation.clone();
        let running: Arc<Mutex<()>> = Default::default();
        let lock = running.clone();
        let unloading: Arc<Mutex<()>> = Default::default();
        let (unloads, unloader) =
            start_unloader(gpu.clone(), generation.clone(), unloading.clone());
        let to_unloader = unloads.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("omps-release{}", gpu.ordinal()))
            .spawn(move || {
                // Frees queued on the release stream and not yet synchronized: the driver's
                // memory pool keeps what cuMemFreeAsync gave back until a synchronization,
                // and a server that never synchronizes never gets it back. Measured on an
                // H100 (scripts/probe/memgrow.sh): 7 clients each allocating and freeing
                // 12 MiB per loop held under 100 MiB, yet the GPU's used memory rose
                // 1 GB/s to 80 GB and their cuMemAlloc failed. Settled once the queue is
                // empty, so a burst of frees costs one synchronization.
                let mut unsettled = false;
                loop {
                    let job = match rx.try_recv() {
                        Ok(job) => job,
                        Err(mpsc::TryRecvError::Empty) if unsettled => {
                            let _one = lock.lock().unwrap_or_else(|e| e.into_inner());
                            if let Err(e) = gpu.settle_frees() {
                                tracing::warn!("settling freed memory failed: {}", e.0);
                            }
                            unsettled = false;
                            p.fetch_sub(1, Ordering::SeqCst);
                            continue;
                        }
                        Err(mpsc::TryRecvError::Empty) => match rx.recv() {
                            Ok(job) => job,
                            Err(_) => break,
                        },
                        Err(mpsc::TryRecvError::Disconnected) => break,
                    };
                    let _one = lock.lock().unwrap_or_else(|e| e.into_inner());
                    let now = current.load(Ordering::SeqCst);
                    if release(&*gpu, job, now, &to_unloader) && !unsettled {
                        // The settling counts as pending work: idle means the memory is back.
                        unsettled = true;
                        p.fetch_add(1, Ordering::SeqCst);
                    }
                    p.fetch_sub(1, Ordering::SeqCst);
                }
            });
        let thread = match spawned {
            Ok(handle) => Some(handle),
            Err(e) => {
                // The receiver is gone with the closure: `send` then releases inline.
                tracing::error!("cannot start the releaser thread: {e}; releasing on the workers");
                None
            }
        };
        Releaser {
            tx,
            unloads,
            generation,
            pending,
            running,
            unloading,
            thread,
            unloader,
        }
    }

    /// Releases `release` of `client` on the releaser thread. The GPU must be done with it;
    /// `generation` is the context generation its handles belong to (None: none left).
    pub fn send(
        &self,
        gpu: &dyn Gpu,
        client: Arc<ClientShared>,
        release: Release,
        final_for_client: bool,
        generation: Option<u64>,
    ) {
        self.pending.fetch_add(1, Ordering::SeqCst);
        let job = Job {
            client,
            release,
            final_for_client,
            generation,
        };
        if let Err(mpsc::SendError(job)) = self.tx.send(job) {
            let now = self.generation.load(Ordering::SeqCst);
            if self::release(gpu, job, now, &self.unloads) {
                let _ = gpu.settle_frees();
            }
            self.pending.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Keeps jobs from running while the caller resets the context and bumps the
    /// generation: a job then frees either before the reset or not at all.
    pub fn exclusive(&self) -> Exclusive<'_> {
        Exclusive {
            _running: self.running.lock().unwrap_or_else(|e| e.into_inner()),
            _unloading: self.unloading.lock().unwrap_or_else(|e| e.into_inner()),
        }
    }

    /// Whether every job sent so far is done, its unloads too.
    pub fn idle(&self) -> bool {
        self.memory_back() && self.unloads.pending.load(Ordering::SeqCst) == 0
    }

    /// Whether every job sent so far is done but for its module unloads, which may wait
    /// for a kernel that never ends (an allocation that ran out of memory waits for this).
    pub fn memory_back(&self) -> bool {
        self.pending.load(Ordering::SeqCst) == 0
    }

    /// Waits up to `timeout` for [`Releaser::idle`]; returns whether it is.
    pub fn wait_idle(&self, timeout: Duration) -> bool {
        self.wait_for(timeout, Self::idle)
    }

    /// Waits up to `timeout` for [`Releaser::memory_back`]; returns whether it is.
    pub fn wait_memory(&self, timeout: Duration) -> bool {
        self.wait_for(timeout, Self::memory_back)
    }

    fn wait_for(&self, timeout: Duration, done: impl Fn(&Self) -> bool) -> bool {
        let t = Instant::now();
        while !done(self) {
            if t.elapsed() > timeout {
                return false;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        true
    }
}

impl Drop for Releaser {
    /// Ends the threads once they have released everything queued (closing a channel
    /// ends its loop). An unload stuck behind a kernel that never ends is left to its
    /// thread after a few seconds: a server that quits does not wait for it.
    fn drop(&mut self) {
        let (closed, _) = mpsc::channel();
        drop(std::mem::replace(&mut self.tx, closed));
        let me = std::thread::current().id();
        if let Some(handle) = self.thread.take() {
            if handle.thread().id() != me {
                let _ = handle.join();
            }
        }
        let (closed, _) = mpsc::channel();
        drop(std::mem::replace(&mut self.unloads.tx, closed));
        if let Some(handle) = self.unloader.take() {
            let stuck = !self.wait_idle(Duration::from_secs(5));
            if stuck {
                tracing::warn!(
                    "a module unload still waits for a running kernel; not waiting for it"
                );
            } else if handle.thread().id() != me {
                let _ = handle.join();
            }
        }
    }
}

/// Frees `p` without holding up other threads where the GPU has the stream-ordered
/// allocator; where it has none (no memory pools: Pascal-like GPUs), cuMemFreeAsync is
/// refused and the plain free, which waits for the GPU, is the only one.
fn free(gpu: &dyn Gpu, p: u64) -> crate::gpu::GpuResult<()> {
    match gpu.mem_free_async(p) {
        Err(crate::gpu::CuError(crate::gpu::code::NOT_SUPPORTED)) => gpu.mem_free(p),
        r => r,
    }
}

/// Frees what a client released and settles its books; the handles only if they belong
/// to the context of generation `now`. Its modules go to `unloads`. Returns whether
/// device memory was freed (and is still to be settled).
fn release(gpu: &dyn Gpu, job: Job, now: u64, unloads: &Unloads) -> bool {
    let Job {
        client,
        release: rel,
        final_for_client,
        generation,
    } = job;
    let dev = gpu.ordinal();
    let gpu = (generation == Some(now)).then_some(gpu);
    let freed = gpu.is_some() && !rel.allocs.is_empty();
    for (p, len) in rel.allocs {
        if let Some(Err(e)) = gpu.map(|g| free(g, p)) {
            tracing::warn!(client = client.id, "freeing device memory failed: {}", e.0);
        }
        client.uncharge(dev, len);
    }
    if let (Some(g), Some(limits)) = (gpu, &rel.limits) {
        limits
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .gone(g, client.id);
    }
    // A held cuMemUnmap's result (crate::session::vmm): the driver's, or success where
    // the context it was mapped in is gone.
    let mut unmapped = 0;
    // The modules, with what waits for them, to the unloader.
    let later = match gpu {
        Some(g) if !rel.modules.is_empty() => Some((
            g,
            Unload {
                client: client.clone(),
                modules: rel.modules,
                module_bytes: rel.module_bytes,
                final_for_client,
                generation: now,
            },
        )),
        _ => None,
    };
    if let Some(g) = gpu {
        for e in rel.events {
            let _ = g.event_destroy(e);
        }
        for e in rel.execs {
            let _ = g.graph_exec_destroy(e);
        }
        for gr in rel.graphs {
            let _ = g.graph_destroy(gr);
        }
        for &t in &rel.arrays.textures {
            let _ = g.tex_destroy(t);
        }
        for &o in &rel.arrays.surfaces {
            let _ = g.surf_destroy(o);
        }
        for &(a, _) in &rel.arrays.arrays {
            let _ = g.array_destroy(a);
        }
        for &(m, _) in &rel.arrays.mipmaps {
            let _ = g.mipmap_destroy(m);
        }
        for &(p, n) in &rel.vmm.unmap {
            if let Err(e) = g.vmm_unmap(p, n) {
                unmapped = e.0;
            }
        }
        for &(h, _) in &rel.vmm.handles {
            let _ = g.vmm_release(h);
        }
        for (p, n) in rel.vmm.reservations {
            let _ = g.vmm_address_free(p, n);
        }
        // The fences passed: a graph instantiated on another GPU from a record the client
        // published before it unmapped the range there has been read, and is in the books.
        let free = client.free_unless_reached(rel.vmm.reach_reservations);
        for (p, n) in free {
            let _ = g.vmm_address_free(p, n);
        }
    }
    for start in rel.vmm.reach {
        client.forget_vmm(start);
    }
    if let Some((channel, seq)) = rel.vmm.answer {
        let done = omps_ring::wire::U64Reply { value: 0 };
        let reply = if unmapped == 0 {
            bytemuck::bytes_of(&done)
        } else {
            &[]
        };
        crate::client::answer::answer_later(&client, channel, seq, unmapped, reply);
    }
    // Module bytes are the unload thread's to give back (with the unload).
    client.uncharge(dev, rel.limit_bytes);
    client.uncharge(dev, rel.vmm.released_mapped_bytes);
    for (_, size) in rel.vmm.handles {
        client.uncharge(dev, size);
    }
    for (_, size) in rel.arrays.arrays.into_iter().chain(rel.arrays.mipmaps) {
        client.uncharge(dev, size);
    }
    for p in rel.pinned {
        p.done();
    }
    crate::release::peer_fence::passed(rel.cross, &client, dev);
    match later {
        Some((g, u)) => unloads.send(g, u, now),
        None => {
            client.uncharge(dev, rel.module_bytes);
            if final_for_client {
                released(&client);
            }
        }
    }
    freed
}

/// Unloads `u`'s modules (if they belong to the context of generation `now`), then
/// settles what waited for them.
fn unload(gpu: &dyn Gpu, u: Unload, now: u64) {
    if u.generation == now {
        for m in u.modules {
            let _ = gpu.module_unload(m);
        }
    }
    u.client.uncharge(gpu.ordinal(), u.module_bytes);
    if u.final_for_client {
        released(&u.client);
    }
}

/// A client's session on this GPU is released, all of it.
fn released(client: &ClientShared) {
    client.released.fetch_add(1, Ordering::SeqCst);
    // A client's session frees many small and some large buffers (module images,
    // staging) from several threads' arenas; glibc keeps freed arena memory mapped, so
    // without a trim the server's resident size only ever rises across clients.
    // SAFETY: malloc_trim takes no pointers; it only returns free heap pages.
    unsafe { libc::malloc_trim(0) };
}
