//! The state of one connected client that the control thread and every GPU worker share:
//! its segment, its memory use and limits, its allocations as peer copies see them.

use super::account::NO_LIMIT;
use super::identity::{one_word, Identity};
use crate::gpu::Gpu;
use omps_ring::futex;
use omps_ring::segment::{state, SegmentView, CHUNKS_PER_CHANNEL, MAX_DEVICES};
use omps_ring::shm::Mapping;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

/// Reads client `c`'s argv[0] into its identity, on a thread of its own: reading another
/// process's cmdline reads its memory, which a hostile client can make block.
pub fn read_command_later(c: &Arc<ClientShared>) {
    let weak = Arc::downgrade(c);
    let pid = c.pid;
    let _ = std::thread::Builder::new()
        .name("omps-cmdline".into())
        .spawn(move || {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let argv0 = cmdline.split(|&b| b == 0).next().unwrap_or_default();
            if let Some(c) = weak.upgrade() {
                let _ = c
                    .identity
                    .command
                    .set(one_word(&String::from_utf8_lossy(argv0), 200));
            }
        });
}

/// A client's allocations on one GPU, as peer copies from other GPUs see them.
#[derive(Default)]
pub struct AllocsOn {
    /// Start -> length.
    live: std::collections::BTreeMap<u64, u64>,
    /// Freed with peer access on, release held: start -> (length, per server GPU the
    /// client's ring position there when the free was read). A copy read on GPU g from
    /// before that position was queued before the free, as the client sent them.
    freed: std::collections::BTreeMap<u64, (u64, [u64; MAX_DEVICES])>,
}

/// A VMM mapping of the client's that GPUs other than its session's may reach: where
/// copies on those GPUs may name it (`ClientShared::vmm_reaches`).
struct VmmReach {
    len: u64,
    /// The server GPUs with access (bit per ordinal).
    gpus: u64,
    /// Unmapped, the unmap held for those GPUs' fences: per server GPU the client's ring
    /// position there when the unmap was read (as `AllocsOn::freed`).
    unmapped: Option<[u64; MAX_DEVICES]>,
}

/// A client's VMM memory reached from GPUs other than the one whose session maps it, as
/// its graphs use it: a reservation freed on one GPU while a graph on another writes in
/// it stays reserved until no such graph is left.
#[derive(Default)]
pub struct GraphReach {
    /// (server GPU, executable graph id) -> the ranges it uses in such memory.
    pub uses: std::collections::HashMap<(usize, u32), Vec<(u64, u64)>>,
    /// Reservations (start, size) freed while one did. At most one per distinct range
    /// above: a held reservation stays the driver's, so no other can overlap it.
    pub held: Vec<(u64, u64)>,
}

impl GraphReach {
    /// Whether an executable graph on any GPU uses a byte of `[a, a+n)`.
    pub fn used(&self, (a, n): (u64, u64)) -> bool {
        self.uses
            .values()
            .flatten()
            .any(|&(b, m)| a < b.saturating_add(m) && b < a.saturating_add(n))
    }

    /// The held reservations no graph uses any more, out of the list to be released.
    pub fn unused(&mut self) -> Vec<(u64, u64)> {
        let (still, free) = std::mem::take(&mut self.held)
            .into_iter()
            .partition(|&r| self.used(r));
        self.held = still;
        free
    }
}

/// The value of the range of `m` that holds all of `[addr, addr+len)`, if one does.
fn inside<V>(
    m: &std::collections::BTreeMap<u64, V>,
    addr: u64,
    len: u64,
    size: impl Fn(&V) -> u64,
) -> Option<&V> {
    let end = addr.checked_add(len)?;
    let (&start, v) = m.range(..=addr).next_back()?;
    (end <= start.saturating_add(size(v))).then_some(v)
}

pub struct ClientShared {
    pub id: u32,
    /// Its PID in the server's PID namespace.
    pub pid: i32,
    /// Its command name (/proc/PID/comm).
    pub name: String,
    /// Who it is beyond that (its command line, PID namespace), for ps and metrics.
    pub identity: Identity,
    /// The GPUs it has sent work or questions to (bit per ordinal).
    pub used_gpus: AtomicU32,
    /// The server's GPUs it sees, in its order: its device k (and ring k) is GPU
    /// `visible[k]` (crate::client::visible).
    pub visible: Vec<usize>,
    pub seg: SegmentView,
    pub socket: OwnedFd,
    /// Device memory in use through this connection, per GPU, in bytes (ps, metrics);
    /// changed only through [`ClientShared::charge`], [`ClientShared::add_mem`] and
    /// [`ClientShared::uncharge`], which keep its process's account in step.
    pub mem_bytes: [AtomicU64; MAX_DEVICES],
    /// Its process's charges and operator limits, shared by all its connections
    /// (crate::client::account): a limit holds for the process, not per connection.
    pub account: Arc<crate::client::account::Account>,
    /// Per GPU, the limit its own CUDA_MPS_PINNED_DEVICE_MEM_LIMIT asked for; the lower
    /// of it and its process's ([`crate::client::account::Account::limit`]) holds ([`NO_LIMIT`]:
    /// none).
    pub mem_limit_own: [AtomicU64; MAX_DEVICES],
    /// Host memory pinned through this connection (its cuMemHostAlloc /
    /// cuMemHostRegister), which counts against every GPU's limit: each GPU reaches it.
    pub pinned_bytes: AtomicU64,
    /// Per GPU, whether going over its limit has been logged.
    limit_logged: [AtomicBool; MAX_DEVICES],
    /// Records served, all GPUs.
    pub commands: AtomicU64,
    /// Kernel and graph launches, all GPUs.
    pub launches: AtomicU64,
    /// Worker time spent handling its records, all GPUs.
    pub server_ns: AtomicU64,
    /// The server's printf router, told by the worker of the printf level
    /// (wire::printf_use) of each image it loads for the client, as the server read it: a
    /// client cannot hide printing code by not declaring it, and is told of before the
    /// code can run (an assert right after the load finds its client). None for a client
    /// made outside the control thread, whose text no one collects.
    pub printf: Option<Arc<crate::client::printf::PrintfRouter>>,
    /// The streams, events and graphs it may hold per GPU, taken from the server-wide totals
    /// (None: the per-client bounds, for a client made outside the control thread).
    pub grant: Option<crate::client::account::Grant>,
    /// A request of its is on the slow-request thread (crate::control): it may have one
    /// at a time, as the shim sends them (one answer per request).
    pub slow_pending: AtomicBool,
    /// Pinned ranges given back but still mapped and registered until every GPU fenced
    /// them (bytes, ranges): they count against the client's bounds until then.
    pub unpinning: std::sync::Mutex<(u64, usize)>,
    /// It enabled direct peer access: its frees wait for its work on every GPU
    /// (crate::release::peer_fence). Never cleared: disabling access leaves kernels in flight.
    pub peer_access: AtomicBool,
    /// Per server GPU: fences other GPUs' workers asked for (crate::release::peer_fence).
    pub cross: [std::sync::Mutex<crate::release::cross::CrossQueue>; MAX_DEVICES],
    /// Per server GPU: its queue in `cross` may hold requests.
    pub cross_waiting: [AtomicBool; MAX_DEVICES],
    /// Per server GPU: its allocations there, as the session there holds them, and those
    /// it freed with peer access on whose release still waits for other GPUs' fences:
    /// another GPU's worker checks the far end of a peer copy against them.
    allocs_on: [std::sync::Mutex<AllocsOn>; MAX_DEVICES],
    /// Its VMM mappings with access for a GPU other than the one whose session made them:
    /// start -> what reaches them (session/vmm.rs). Never shrinks while the unmap waits.
    vmm_reach: std::sync::Mutex<std::collections::BTreeMap<u64, VmmReach>>,
    /// It gave another GPU access to VMM memory: what it leaves behind waits for its work
    /// on every GPU (crate::release::peer_fence). Never cleared.
    pub vmm_peer: AtomicBool,
    /// While `vmm_peer`: the ranges of such memory its executable graphs on each GPU use,
    /// and the reservations freed on another GPU while one does (session/graph_memory.rs).
    pub graph_reach: std::sync::Mutex<GraphReach>,
    /// Hung up, killed, or disconnected by the server.
    pub gone: AtomicBool,
    /// Workers that have released everything this client held.
    pub released: AtomicU32,
    /// The GPU the segment is registered with (portable registration: one is enough).
    registered_on: Option<Arc<dyn Gpu>>,
    /// Which channels' staging is registered (shared/staging.rs).
    staging: pins::Pins,
    /// The client's pinned host allocations: start -> length. Each is a memfd of the
    /// client's, mapped here at the same address and registered with `registered_on`.
    pub pinned: std::sync::Mutex<std::collections::BTreeMap<u64, u64>>,
    /// Its QoS ([`crate::sched::placement::Qos`]); the control thread may change it at any time,
    /// and its workers move its streams at its next work.
    qos: AtomicU8,
    /// Its thread percentage, in thousandths (100000: no limit).
    pub thread_milli_pct: AtomicU32,
    /// The static partition it runs in: (GPU, partition id).
    pub partition: std::sync::Mutex<Option<(usize, u32)>>,
    /// Per GPU, where its work runs ([`crate::sched::placement::Placement`], packed), as the
    /// control thread decided; each worker moves the client's streams to match.
    placement: [AtomicU32; MAX_DEVICES],
    /// Taken by drop: it stays mapped until the segment is unregistered ([`crate::release::unpin`]).
    mapping: Option<Mapping>,
}

impl ClientShared {
    pub fn new(
        id: u32,
        pid: i32,
        name: String,
        mapping: Mapping,
        seg: SegmentView,
        socket: OwnedFd,
        registered_on: Option<Arc<dyn Gpu>>,
    ) -> Self {
        ClientShared {
            id,
            pid,
            name,
            identity: Identity::default(),
            used_gpus: AtomicU32::new(0),
            visible: (0..MAX_DEVICES).collect(),
            seg,
            socket,
            mem_bytes: Default::default(),
            account: Arc::new(crate::client::account::Account::standalone(pid)),
            mem_limit_own: std::array::from_fn(|_| AtomicU64::new(NO_LIMIT)),
            pinned_bytes: AtomicU64::new(0),
            limit_logged: Default::default(),
            commands: AtomicU64::new(0),
            launches: AtomicU64::new(0),
            server_ns: AtomicU64::new(0),
            printf: None,
            grant: None,
            slow_pending: AtomicBool::new(false),
            unpinning: Default::default(),
            peer_access: AtomicBool::new(false),
            cross: Default::default(),
            cross_waiting: Default::default(),
            allocs_on: Default::default(),
            vmm_reach: Default::default(),
            vmm_peer: AtomicBool::new(false),
            graph_reach: Default::default(),
            gone: AtomicBool::new(false),
            released: AtomicU32::new(0),
            registered_on,
            staging: pins::Pins::ahead(),
            pinned: Default::default(),
            qos: AtomicU8::new(0),
            thread_milli_pct: AtomicU32::new(100_000),
            partition: Default::default(),
            placement: Default::default(),
            mapping: Some(mapping),
        }
    }

    pub fn qos(&self) -> crate::sched::placement::Qos {
        crate::sched::placement::Qos::from_u8(self.qos.load(Ordering::Relaxed)).unwrap_or_default()
    }

    pub fn set_qos(&self, q: crate::sched::placement::Qos) {
        self.qos.store(q as u8, Ordering::Relaxed);
    }

    pub fn placement(&self, gpu: usize) -> crate::sched::placement::Placement {
        self.placement
            .get(gpu)
            .map(|p| crate::sched::placement::Placement::unpack(p.load(Ordering::Relaxed)))
            .unwrap_or_default()
    }

    pub fn set_placement(&self, gpu: usize, p: crate::sched::placement::Placement) {
        if let Some(x) = self.placement.get(gpu) {
            x.store(p.pack(), Ordering::Relaxed);
        }
    }

    /// Its memory limit on GPU `dev`, if any: its process's, or its own if lower.
    pub fn limit(&self, dev: usize) -> Option<u64> {
        let (Some(a), Some(b)) = (self.account.limit.get(dev), self.mem_limit_own.get(dev)) else {
            return None;
        };
        Some(a.load(Ordering::Relaxed).min(b.load(Ordering::Relaxed))).filter(|&l| l != NO_LIMIT)
    }

    /// What counts against its limit on GPU `dev`: its process's device memory there and
    /// its pinned host memory, over all the process's connections.
    pub fn mem_use(&self, dev: usize) -> u64 {
        self.account.used(dev)
    }

    /// The most streams it may hold on one GPU (what the welcome told the shim).
    pub fn max_streams(&self) -> usize {
        self.grant
            .as_ref()
            .map_or(crate::client::bounds::bounds().streams, |g| g.streams) as usize
    }

    /// The most graphs, executable graphs and conditional bodies it may hold on one GPU.
    pub fn max_graphs(&self) -> usize {
        self.grant
            .as_ref()
            .map_or(crate::client::bounds::bounds().graphs, |g| {
                g.graphs as usize
            })
    }

    /// The most events it may hold on one GPU (what the welcome told the shim).
    pub fn max_events(&self) -> usize {
        self.grant
            .as_ref()
            .map_or(crate::client::bounds::bounds().events, |g| g.events) as usize
    }

    /// Counts `n` more bytes of device memory on GPU `dev`, unless that would take its
    /// process over its limit there: then CUDA_ERROR_OUT_OF_MEMORY, logged once per GPU.
    pub fn charge(&self, dev: usize, n: u64) -> Result<(), crate::gpu::CuError> {
        let (Some(m), Some(all)) = (self.mem_bytes.get(dev), self.account.mem.get(dev)) else {
            return Err(crate::gpu::CuError(crate::gpu::code::INVALID_DEVICE));
        };
        let oom = crate::gpu::CuError(crate::gpu::code::OUT_OF_MEMORY);
        // Pinned host memory counts too: the process's lock keeps a pin (on the
        // slow-request thread) and allocations (on workers, through any connection) from
        // all passing the check.
        let _one = self.account.lock();
        let limit = self.limit(dev).unwrap_or(NO_LIMIT);
        let pinned = self.account.pinned.load(Ordering::Relaxed);
        let cur = all.load(Ordering::Relaxed);
        let fits = cur
            .checked_add(n)
            .filter(|&u| limit == NO_LIMIT || u.saturating_add(pinned) <= limit);
        if fits.is_none() {
            if limit != NO_LIMIT {
                self.log_limit(dev, limit, cur.saturating_add(pinned), n);
            }
            return Err(oom);
        }
        // And its namespace's clients together.
        let _group = match self.account.group_fits(Some(dev), n, MAX_DEVICES) {
            Ok(g) => g,
            Err((d, l, used)) => {
                self.log_limit(d, l, used, n);
                return Err(oom);
            }
        };
        self.account.add_mem(dev, n);
        m.fetch_add(n, Ordering::Relaxed);
        Ok(())
    }

    /// Counts `n` bytes of device memory on GPU `dev` whatever its limit (memory the
    /// client holds already, moved to it).
    pub fn add_mem(&self, dev: usize, n: u64) {
        if let Some(m) = self.mem_bytes.get(dev) {
            m.fetch_add(n, Ordering::Relaxed);
            self.account.add_mem(dev, n);
        }
    }

    /// `n` bytes of device memory on GPU `dev` it was charged for are given back.
    pub fn uncharge(&self, dev: usize, n: u64) {
        if let Some(m) = self.mem_bytes.get(dev) {
            m.fetch_sub(n, Ordering::Relaxed);
            self.account.sub_mem(dev, n);
        }
    }

    /// `n` bytes of device memory on GPU `dev` it freed but another client holds open:
    /// off this connection's own use, still charged to its process until the hold goes.
    pub fn hold(&self, dev: usize, n: u64) -> crate::client::account::Held {
        if let Some(m) = self.mem_bytes.get(dev) {
            m.fetch_sub(n, Ordering::Relaxed);
        }
        crate::client::account::Held::new(self.account.clone(), dev, n)
    }

    /// Counts `n` more bytes of pinned host memory, unless that would take its process
    /// over its limit on any GPU.
    pub fn charge_pinned(&self, n: u64, gpus: usize) -> Result<(), i32> {
        let a = &self.account;
        let _one = a.lock();
        let pinned = a.pinned.load(Ordering::Relaxed);
        let over = (0..gpus.min(MAX_DEVICES)).find_map(|d| {
            let l = self.limit(d)?;
            let used = a.mem[d].load(Ordering::Relaxed).saturating_add(pinned);
            (used.saturating_add(n) > l).then_some((d, l, used))
        });
        if let Some((d, l, used)) = over {
            self.log_limit(d, l, used, n);
            return Err(crate::gpu::code::OUT_OF_MEMORY);
        }
        let _group = match a.group_fits(None, n, gpus) {
            Ok(g) => g,
            Err((d, l, used)) => {
                self.log_limit(d, l, used, n);
                return Err(crate::gpu::code::OUT_OF_MEMORY);
            }
        };
        a.add_pinned(n);
        self.pinned_bytes.fetch_add(n, Ordering::Relaxed);
        Ok(())
    }

    /// `n` bytes of pinned host memory in one range are given back.
    pub fn unpinned(&self, n: u64) {
        self.pinned_bytes.fetch_sub(n, Ordering::Relaxed);
        self.account.sub_pinned(n);
        self.account.totals.give_pinned(n);
    }

    fn log_limit(&self, dev: usize, limit: u64, used: u64, n: u64) {
        if !self.limit_logged[dev].swap(true, Ordering::Relaxed) {
            tracing::warn!(
                client = self.id,
                pid = self.pid,
                gpu = dev,
                limit,
                used,
                asked = n,
                "allocation refused: over the client's memory limit (logged once per GPU)"
            );
        }
    }

    /// Its program for ps and the metrics: argv[0] once read, else its comm.
    pub fn command(&self) -> &str {
        self.identity
            .command
            .get()
            .filter(|c| !c.is_empty())
            .map_or(&self.name, |c| c)
    }

    /// The ring (its device number) through which it reaches the server's GPU `gpu`.
    pub fn ring_of(&self, gpu: usize) -> Option<usize> {
        self.visible.iter().position(|&g| g == gpu)
    }

    fn allocs_on(&self, gpu: usize) -> Option<std::sync::MutexGuard<'_, AllocsOn>> {
        self.allocs_on
            .get(gpu)
            .map(|m| m.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Its session on `gpu` allocated `len` bytes at `ptr`.
    pub fn note_alloc(&self, gpu: usize, ptr: u64, len: u64) {
        if let Some(mut m) = self.allocs_on(gpu) {
            m.live.insert(ptr, len);
        }
    }

    /// Its session on `gpu` freed `ptr`. With `held` (peer access on, the release waits
    /// for other GPUs' fences), copies the client sent to other GPUs before the free may
    /// still read it: they pass until `forget_freed`.
    pub fn note_free(&self, gpu: usize, ptr: u64, held: bool) {
        let Some(mut m) = self.allocs_on(gpu) else {
            return;
        };
        if let Some(len) = m.live.remove(&ptr).filter(|_| held) {
            let tails = std::array::from_fn(|g| self.ring_tail(g));
            m.freed.insert(ptr, (len, tails));
        }
    }

    /// The held release of `ptr` on `gpu` goes ahead.
    pub fn forget_freed(&self, gpu: usize, ptr: u64) {
        if let Some(mut m) = self.allocs_on(gpu) {
            m.freed.remove(&ptr);
        }
    }

    /// Its session on `gpu` has ended: none of its allocations there is its any more.
    pub fn forget_allocs(&self, gpu: usize) {
        if let Some(mut m) = self.allocs_on(gpu) {
            *m = AllocsOn::default();
        }
    }

    /// Whether `[addr, addr+len)` on `gpu` is the client's to copy from or to, for a
    /// copy that GPU `reader`'s worker read with its ring at `read`.
    pub fn holds_on(&self, gpu: usize, addr: u64, len: u64, reader: usize, read: u64) -> bool {
        let Some(m) = self.allocs_on(gpu) else {
            return false;
        };
        inside(&m.live, addr, len, |&n| n).is_some()
            || inside(&m.freed, addr, len, |v| v.0).is_some_and(|(_, tails)| {
                tails
                    .get(reader)
                    .is_some_and(|&t| read.wrapping_sub(t) as i64 <= 0)
            })
    }

    fn vmm_reach(&self) -> std::sync::MutexGuard<'_, std::collections::BTreeMap<u64, VmmReach>> {
        self.vmm_reach.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Its mapping at `start` (`len` bytes) has access for the server GPUs `gpus` (bits)
    /// besides its session's own.
    pub fn note_vmm_access(&self, start: u64, len: u64, gpus: u64) {
        let mut m = self.vmm_reach();
        let e = m.entry(start).or_insert(VmmReach {
            len,
            gpus: 0,
            unmapped: None,
        });
        e.gpus |= gpus;
    }

    /// Its mapping at `start` is unmapped; `held`: the unmap waits for other GPUs' fences,
    /// and copies read on them before the client's positions now still pass.
    pub fn note_vmm_unmap(&self, start: u64, held: bool) {
        let tails = std::array::from_fn(|g| self.ring_tail(g));
        let mut m = self.vmm_reach();
        match (m.get_mut(&start), held) {
            (Some(e), true) => e.unmapped = Some(tails),
            _ => drop(m.remove(&start)),
        }
    }

    /// The held unmap of `start` went ahead.
    pub fn forget_vmm(&self, start: u64) {
        self.vmm_reach().remove(&start);
    }

    /// Whether `[addr, addr+len)` lies in one mapping of the client's with access for
    /// server GPU `gpu`, for a copy `gpu`'s worker read with its ring at `read`.
    pub fn vmm_reaches(&self, gpu: usize, addr: u64, len: u64, read: u64) -> bool {
        let m = self.vmm_reach();
        gpu < 64
            && inside(&m, addr, len, |v| v.len).is_some_and(|v| {
                v.gpus & (1 << gpu) != 0
                    && v.unmapped.is_none_or(|tails| {
                        tails
                            .get(gpu)
                            .is_some_and(|&t| read.wrapping_sub(t) as i64 <= 0)
                    })
            })
    }

    /// Of reservations `rs` it freed (their release fenced on every GPU), those no
    /// executable graph of its uses, to be freed now; the rest are held in `graph_reach`
    /// until none does (session/graph_memory.rs gives them back then).
    pub fn free_unless_reached(&self, rs: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
        if rs.is_empty() {
            return rs;
        }
        let mut reach = self.graph_reach.lock().unwrap_or_else(|e| e.into_inner());
        let (used, free): (Vec<_>, Vec<_>) = rs.into_iter().partition(|&r| reach.used(r));
        reach.held.extend(used);
        free
    }

    /// Whether what it leaves behind waits for its work on every GPU it sees (it enabled
    /// peer access or gave another GPU access to its VMM memory).
    pub fn leaves_wait_everywhere(&self) -> bool {
        (self.peer_access.load(Ordering::SeqCst) || self.vmm_peer.load(Ordering::SeqCst))
            && self.visible.len() > 1
    }

    /// Whether what it frees waits for its work on every GPU it sees (it enabled peer
    /// access and sees more than one: crate::release::peer_fence).
    pub fn frees_wait_everywhere(&self) -> bool {
        self.peer_access.load(Ordering::SeqCst) && self.visible.len() > 1
    }

    /// How far the client says it has written its ring for `gpu` (0 if it has none).
    pub fn ring_tail(&self, gpu: usize) -> u64 {
        let Some(ring) = self.ring_of(gpu) else {
            return 0;
        };
        if ring >= self.seg.layout.params.num_rings as usize {
            return 0;
        }
        let (hdr, _, _) = self.seg.ring_parts(ring);
        // SAFETY: the header lies in the segment, mapped while this client lives; its
        // counters are atomics, valid for any bit pattern the client writes.
        unsafe { &*hdr }.published_tail()
    }

    pub fn total_mem(&self) -> u64 {
        self.mem_bytes
            .iter()
            .map(|m| m.load(Ordering::Relaxed))
            .sum()
    }

    /// Tells the client it is cut off and hangs up its socket; the control thread then sees
    /// the hang-up and retires the client everywhere.
    pub fn disconnect(&self, code: i32, why: &str) {
        if self.gone.swap(true, Ordering::SeqCst) {
            return;
        }
        tracing::warn!(
            client = self.id,
            pid = self.pid,
            "disconnecting client: {why}"
        );
        self.set_state(state::DISCONNECTED, code);
        // SAFETY: shutting down a socket we own; the fd stays open until drop.
        unsafe { libc::shutdown(self.socket.as_raw_fd(), libc::SHUT_RDWR) };
    }

    /// Publishes a server state change and wakes every thread of the client that sleeps.
    /// A client cut off stays cut off: a fault after it (or any later state) does not
    /// replace the code it was told (CUDA_ERROR_MPS_CLIENT_TERMINATED for a terminated one).
    pub fn set_state(&self, new_state: u32, code: i32) {
        let h = self.seg.header();
        if new_state != state::DISCONNECTED
            && h.server_state.load(Ordering::SeqCst) == state::DISCONNECTED
        {
            return;
        }
        h.state_code.store(code, Ordering::SeqCst);
        h.server_state.store(new_state, Ordering::SeqCst);
        futex::wake(&h.server_state, u32::MAX);
        for c in 0..self.seg.layout.params.num_channels as usize {
            if let Some(ch) = self.seg.channel(c) {
                futex::wake(&ch.done, u32::MAX);
                for w in ch.chunk_done.iter().take(CHUNKS_PER_CHANNEL) {
                    futex::wake(w, u32::MAX);
                }
            }
        }
    }
}

mod pinned;
mod pins;
mod staging;

#[cfg(test)]
mod tests {
    #[test]
    fn a_peer_copy_read_before_a_held_free_passes_and_none_read_after() {
        let gpu: std::sync::Arc<dyn crate::gpu::Gpu> =
            std::sync::Arc::new(crate::gpu::host::HostGpu::new(0, 1 << 20));
        let (c, _peer) = crate::testing::fake_client(&gpu, 1).expect("fake client");
        c.note_alloc(1, 0x1000, 256);
        assert!(c.holds_on(1, 0x1000, 256, 0, 0));
        assert!(!c.holds_on(1, 0x1000, 257, 0, 0), "past its end");
        assert!(!c.holds_on(1, u64::MAX - 8, 16, 0, 0), "wrapping");
        // Freed with its release held; the client had written ring 0 up to 0 by then.
        c.note_free(1, 0x1000, true);
        assert!(c.holds_on(1, 0x1080, 16, 0, 0), "read before the free");
        assert!(!c.holds_on(1, 0x1080, 16, 0, 8), "read after the free");
        c.forget_freed(1, 0x1000);
        assert!(!c.holds_on(1, 0x1080, 16, 0, 0), "its release went ahead");
        c.note_alloc(1, 0x2000, 64);
        c.note_free(1, 0x2000, false);
        assert!(
            !c.holds_on(1, 0x2000, 8, 0, 0),
            "freed without peer access: gone at once"
        );
        c.note_alloc(2, 0x3000, 64);
        c.forget_allocs(2);
        assert!(!c.holds_on(2, 0x3000, 8, 0, 0), "its session there ended");
        assert!(!c.holds_on(super::MAX_DEVICES, 0x3000, 8, 0, 0));
    }
}
