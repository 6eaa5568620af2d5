//! What one client process is charged for, over all its connections, and what all clients
//! together may hold.
//!
//! A memory limit is the process's, as under MPS: a process that opens several
//! connections (one per thread that connects, or on purpose) must not get its limit once
//! per connection (issue 23, finding 12). The server knows each connection's PID from
//! SO_PEERCRED at its handshake; connections of one PID, made while one of them is still
//! charged for something, share one [`Account`]. A PID reused by a new process gets a new
//! account: the process's start time (from /proc) is part of its key.
//!
//! Bounds that are per client (page-locked memory) would still let N clients hold N
//! times as much: [`Totals`] holds what all clients hold together, against server-wide
//! bounds (crate::client::bounds). A namespace's memory limit likewise holds for all its clients
//! together ([`Group`]): a pod that starts more processes gets no more memory.

use omps_ring::segment::MAX_DEVICES;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

/// A limit that is not set.
pub const NO_LIMIT: u64 = u64::MAX;

/// What every client together holds, for the server-wide bounds.
#[derive(Default, Debug)]
pub struct Totals {
    /// Page-locked host memory registered for clients: bytes and ranges.
    pub pinned_bytes: AtomicU64,
    pub pinned_ranges: AtomicU64,
    /// Module image bytes clients uploaded and have not yet loaded.
    pub image_bytes: AtomicU64,
    /// Streams, events and graphs granted to the clients connected (what each may hold
    /// per GPU, times its GPUs): see [`Totals::grant`].
    pub streams_granted: AtomicU64,
    pub events_granted: AtomicU64,
    pub graphs_granted: AtomicU64,
}

/// What one client may hold per GPU, taken from the server-wide totals while it is
/// connected (given back when its last reference goes).
#[derive(Debug)]
pub struct Grant {
    pub streams: u32,
    pub events: u32,
    /// Graphs, executable graphs and conditional bodies.
    pub graphs: u32,
    gpus: u64,
    totals: Arc<Totals>,
}

impl Drop for Grant {
    fn drop(&mut self) {
        let t = &self.totals;
        t.streams_granted
            .fetch_sub(self.streams as u64 * self.gpus, Ordering::Relaxed);
        t.events_granted
            .fetch_sub(self.events as u64 * self.gpus, Ordering::Relaxed);
        t.graphs_granted
            .fetch_sub(self.graphs as u64 * self.gpus, Ordering::Relaxed);
    }
}

/// How much one more client with `gpus` GPUs may take per GPU, of `total` per GPU of the
/// server's `all_gpus`: at most `bound`, and never so much that the `others` clients the
/// server may still take could not each have `least` on every GPU. None when not even
/// `least` is left.
fn share(
    total: u64,
    granted: u64,
    bound: u32,
    least: u32,
    gpus: u64,
    others: u64,
    all_gpus: u64,
) -> Option<u32> {
    // A least the total cannot give every client the server may take would refuse them
    // all, the first too: it shrinks to what the total can give each.
    let least = least
        .min(bound)
        .min((total / others.saturating_add(1)).min(u32::MAX as u64) as u32);
    let keep = others.saturating_mul(least as u64).saturating_mul(all_gpus);
    let left = total
        .saturating_mul(all_gpus)
        .saturating_sub(granted)
        .saturating_sub(keep);
    let each = (left / gpus.max(1)).min(bound as u64) as u32;
    (each >= least).then_some(each)
}

impl Totals {
    /// The streams, events and graphs a client connecting now may hold per GPU (it sees `gpus` of
    /// the server's `all_gpus`; `others`: how many more clients the server may take after
    /// it). None: the totals cannot give it even the least (OMPS_MIN_STREAMS,
    /// OMPS_MIN_EVENTS); it is refused.
    pub fn grant(self: &Arc<Self>, gpus: usize, all_gpus: usize, others: usize) -> Option<Grant> {
        let b = crate::client::bounds::bounds();
        self.grant_within(b, gpus, all_gpus, others)
    }

    /// As [`Totals::grant`], under bounds `b`.
    pub fn grant_within(
        self: &Arc<Self>,
        b: &crate::client::bounds::Bounds,
        gpus: usize,
        all_gpus: usize,
        others: usize,
    ) -> Option<Grant> {
        let (g, all, others) = (gpus as u64, all_gpus as u64, others as u64);
        // The control thread alone grants: a check and an add need no loop.
        let kinds = [
            (
                &self.streams_granted,
                b.streams_total,
                b.streams,
                b.streams_least,
            ),
            (
                &self.events_granted,
                b.events_total,
                b.events,
                b.events_least,
            ),
            (
                &self.graphs_granted,
                b.graphs_total,
                b.graphs.min(u32::MAX as usize) as u32,
                b.graphs_least,
            ),
        ];
        let mut each = [0u32; 3];
        for (e, &(granted, total, bound, least)) in each.iter_mut().zip(&kinds) {
            *e = share(
                total,
                granted.load(Ordering::Relaxed),
                bound,
                least,
                g,
                others,
                all,
            )?;
        }
        for (&e, (granted, ..)) in each.iter().zip(&kinds) {
            granted.fetch_add(e as u64 * g, Ordering::Relaxed);
        }
        let [streams, events, graphs] = each;
        Some(Grant {
            streams,
            events,
            graphs,
            gpus: g,
            totals: self.clone(),
        })
    }

    /// Takes `bytes` more in one more range, unless that would pass the server-wide
    /// bounds (OMPS_MAX_PINNED_TOTAL, OMPS_MAX_PINNED_RANGES_TOTAL).
    pub fn take_pinned(&self, bytes: u64) -> bool {
        let b = crate::client::bounds::bounds();
        let took = self
            .pinned_bytes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
                t.checked_add(bytes).filter(|&n| n <= b.pinned_total)
            })
            .is_ok();
        if !took {
            return false;
        }
        let ranged = self
            .pinned_ranges
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |r| {
                (r < b.pinned_ranges_total).then_some(r + 1)
            })
            .is_ok();
        if !ranged {
            self.pinned_bytes.fetch_sub(bytes, Ordering::Relaxed);
        }
        ranged
    }

    /// `bytes` more of uploaded image, unless all clients' would pass
    /// OMPS_MAX_IMAGE_BYTES_TOTAL.
    pub fn take_image(&self, bytes: u64) -> bool {
        let max = crate::client::bounds::bounds().image_bytes_total;
        self.image_bytes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
                t.checked_add(bytes).filter(|&n| n <= max)
            })
            .is_ok()
    }

    pub fn give_image(&self, bytes: u64) {
        self.image_bytes.fetch_sub(bytes, Ordering::Relaxed);
    }

    /// A range [`Totals::take_pinned`] took is given back.
    pub fn give_pinned(&self, bytes: u64) {
        self.pinned_bytes.fetch_sub(bytes, Ordering::Relaxed);
        self.pinned_ranges.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One client process's charges and limits.
/// What the clients of one namespace hold together, against its memory limit: every
/// change to a member process's [`Account`] is made here too.
#[derive(Debug)]
pub struct Group {
    /// Per GPU, the namespace's limit ([`NO_LIMIT`]: none); set again when the namespace
    /// is made again under its name while processes of it are still connected.
    limit: [AtomicU64; MAX_DEVICES],
    pub mem: [AtomicU64; MAX_DEVICES],
    pub pinned: AtomicU64,
    /// Held across a limited charge's check and update, inside the process's own lock.
    lock: Mutex<()>,
}

impl Group {
    pub fn new(limit: [u64; MAX_DEVICES]) -> Group {
        Group {
            limit: limit.map(AtomicU64::new),
            mem: Default::default(),
            pinned: AtomicU64::new(0),
            lock: Mutex::new(()),
        }
    }

    /// Whether `n` more bytes on GPU `dev` (pinned bytes count on every GPU, as a
    /// process's do) stay within the limit: Some(limit, used) where they would not.
    /// The namespace's limits are now `limit`.
    pub fn set_limit(&self, limit: [u64; MAX_DEVICES]) {
        for (l, v) in self.limit.iter().zip(limit) {
            l.store(v, Ordering::Relaxed);
        }
    }

    /// GPU `dev`'s limit and what is left of it for all the namespace's processes
    /// together (None: no limit there).
    pub fn headroom(&self, dev: usize) -> Option<(u64, u64)> {
        let limit = self.limit.get(dev)?.load(Ordering::Relaxed);
        let used = self.mem[dev]
            .load(Ordering::Relaxed)
            .saturating_add(self.pinned.load(Ordering::Relaxed));
        (limit != NO_LIMIT).then_some((limit, limit.saturating_sub(used)))
    }

    fn over(&self, dev: usize, n: u64) -> Option<(u64, u64)> {
        let limit = self.limit.get(dev)?.load(Ordering::Relaxed);
        let used = self.mem[dev]
            .load(Ordering::Relaxed)
            .saturating_add(self.pinned.load(Ordering::Relaxed));
        (limit != NO_LIMIT && used.saturating_add(n) > limit).then_some((limit, used))
    }
}

pub struct Account {
    pub pid: i32,
    /// Device memory its connections hold, per GPU.
    pub mem: [AtomicU64; MAX_DEVICES],
    /// Host memory pinned for its connections (counts on every GPU).
    pub pinned: AtomicU64,
    /// Per GPU, the limit the operator gave the process (the server's default when its
    /// first connection came, or `set_device_pinned_mem_limit` since; [`NO_LIMIT`]: none).
    pub limit: [AtomicU64; MAX_DEVICES],
    /// Held across a limited charge's check and update, by every connection of the
    /// process: two connections' charges cannot both pass one check.
    lock: Mutex<()>,
    pub totals: Arc<Totals>,
    /// The namespace its connections came through, set by the first (a process is a
    /// client of one namespace, or of none).
    group: std::sync::OnceLock<Option<Arc<Group>>>,
    /// Whether a module load, JIT compile or link of the process is queued or running
    /// off the lanes: one at a time, over all its connections and GPUs
    /// (crate::image::compile).
    pub compiling: std::sync::atomic::AtomicBool,
}

impl Account {
    /// An account of its own, with totals of its own (tests, and clients made outside a
    /// server's registry).
    pub fn standalone(pid: i32) -> Account {
        Account::new(pid, Arc::default())
    }

    fn new(pid: i32, totals: Arc<Totals>) -> Account {
        Account {
            pid,
            mem: Default::default(),
            pinned: AtomicU64::new(0),
            limit: std::array::from_fn(|_| AtomicU64::new(NO_LIMIT)),
            lock: Mutex::new(()),
            totals,
            group: std::sync::OnceLock::new(),
            compiling: Default::default(),
        }
    }

    /// Joins the process to `group` (None: no namespace's), or checks that a connection
    /// after its first came the same way: false where it did not.
    pub fn join(&self, group: Option<&Arc<Group>>) -> bool {
        let mine = self.group.get_or_init(|| group.cloned());
        match (mine, group) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }

    /// Whose image checks share the verifier's children fairly (crate::image::verifier):
    /// its namespace's clients together (the group's address, which lives while any of
    /// its accounts does), or 0 for those of the server's own socket.
    pub fn tenant(&self) -> usize {
        self.group().map_or(0, |g| Arc::as_ptr(g) as usize)
    }

    /// Its namespace's limit on GPU `dev` and what the namespace has left of it (None:
    /// no namespace, or no limit there): `cuMemGetInfo` reports them.
    pub fn namespace_headroom(&self, dev: usize) -> Option<(u64, u64)> {
        self.group().and_then(|g| g.headroom(dev))
    }

    fn group(&self) -> Option<&Arc<Group>> {
        self.group.get().and_then(Option::as_ref)
    }

    /// Whether the process joined `group` (None: the server's own socket, no namespace).
    pub fn joined(&self, group: Option<&Arc<Group>>) -> bool {
        match (self.group(), group) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }

    /// Whether `n` more bytes on GPU `dev` (None: pinned, on every one of `gpus`) keep its
    /// namespace within its limit: Err(dev, limit, used) where they would not. Called
    /// under [`Account::lock`]; the group's lock is held until [`Account::add_mem`] or
    /// [`Account::add_pinned`] took the bytes, through the guard returned.
    pub fn group_fits(
        &self,
        dev: Option<usize>,
        n: u64,
        gpus: usize,
    ) -> Result<Option<MutexGuard<'_, ()>>, (usize, u64, u64)> {
        let Some(g) = self.group() else {
            return Ok(None);
        };
        let guard = g.lock.lock().unwrap_or_else(|e| e.into_inner());
        let over = match dev {
            Some(d) => g.over(d, n).map(|(l, u)| (d, l, u)),
            None => (0..gpus.min(MAX_DEVICES)).find_map(|d| g.over(d, n).map(|(l, u)| (d, l, u))),
        };
        match over {
            Some(o) => Err(o),
            None => Ok(Some(guard)),
        }
    }

    /// Device memory on GPU `dev`: `n` bytes more, for the process and its namespace.
    pub fn add_mem(&self, dev: usize, n: u64) {
        if let Some(m) = self.mem.get(dev) {
            m.fetch_add(n, Ordering::Relaxed);
        }
        if let Some(m) = self.group().and_then(|g| g.mem.get(dev)) {
            m.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// `n` bytes of device memory on GPU `dev` given back.
    pub fn sub_mem(&self, dev: usize, n: u64) {
        if let Some(m) = self.mem.get(dev) {
            m.fetch_sub(n, Ordering::Relaxed);
        }
        if let Some(m) = self.group().and_then(|g| g.mem.get(dev)) {
            m.fetch_sub(n, Ordering::Relaxed);
        }
    }

    /// Pinned host memory: `n` bytes more.
    pub fn add_pinned(&self, n: u64) {
        self.pinned.fetch_add(n, Ordering::Relaxed);
        if let Some(g) = self.group() {
            g.pinned.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// `n` bytes of pinned host memory given back.
    pub fn sub_pinned(&self, n: u64) {
        self.pinned.fetch_sub(n, Ordering::Relaxed);
        if let Some(g) = self.group() {
            g.pinned.fetch_sub(n, Ordering::Relaxed);
        }
    }

    pub fn lock(&self) -> MutexGuard<'_, ()> {
        self.lock.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Device memory on GPU `dev` plus pinned memory: what counts against its limit there.
    pub fn used(&self, dev: usize) -> u64 {
        self.mem
            .get(dev)
            .map_or(0, |m| m.load(Ordering::Relaxed))
            .saturating_add(self.pinned.load(Ordering::Relaxed))
    }
}

/// Device memory a process freed that another client still holds open (an IPC opening,
/// imported VMM memory): the driver keeps it, so it stays charged to the process's
/// account, against its limit, until the last holder lets go and this is dropped (issue
/// 23, finding 13). No connection of the process shows it as its own any more.
pub struct Held {
    account: Arc<Account>,
    dev: usize,
    bytes: u64,
}

impl Held {
    /// `bytes` already counted in `account.mem[dev]`, kept there until dropped.
    pub fn new(account: Arc<Account>, dev: usize, bytes: u64) -> Held {
        Held {
            account,
            dev,
            bytes,
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.account.sub_mem(self.dev, self.bytes);
    }
}

/// The accounts of the processes connected, by PID (the control thread's).
#[derive(Default)]
pub struct Accounts {
    by_pid: HashMap<i32, (u64, Weak<Account>)>,
    /// Connections of PID 0 (processes the server cannot see), by the socket they came
    /// through ([`Accounts::bucket_key`]): one account per socket.
    pid0: HashMap<usize, Weak<Account>>,
    totals: Arc<Totals>,
}

impl Accounts {
    /// The account of process `pid`, come through namespace `group` (None: the server's
    /// own socket), and whether it is new (then its limits are still to be set). One held
    /// by no connection any more is gone, as is one of an earlier process with that PID.
    /// PID 0, a process the server cannot see (of another PID namespace), is many
    /// processes: those that came through one socket share one account, and with it one
    /// process's limits and caps (review 4, finding 7: an account each let them pass the
    /// per-process caps); those of different namespaces never share one, so that one
    /// namespace's cannot lock another's out.
    pub fn of(&mut self, pid: i32, group: Option<&Arc<Group>>) -> (Arc<Account>, bool) {
        if pid == 0 {
            let key = Self::bucket_key(group);
            if let Some(a) = self.pid0.get(&key).and_then(Weak::upgrade) {
                return (a, false);
            }
            self.pid0.retain(|_, w| w.strong_count() > 0);
            let a = Arc::new(Account::new(0, self.totals.clone()));
            self.pid0.insert(key, Arc::downgrade(&a));
            return (a, true);
        }
        let started = start_time(pid);
        if let Some(a) = self
            .by_pid
            .get(&pid)
            .filter(|(s, _)| *s == started)
            .and_then(|(_, w)| w.upgrade())
        {
            return (a, false);
        }
        // Dead entries go now and then, so the map stays as large as the clients.
        if self.by_pid.len() > 64 {
            self.by_pid.retain(|_, (_, w)| w.strong_count() > 0);
        }
        let a = Arc::new(Account::new(pid, self.totals.clone()));
        self.by_pid.insert(pid, (started, Arc::downgrade(&a)));
        (a, true)
    }

    /// The account PID-0 connections through namespace `group` share, while one lives.
    pub fn pid0_bucket(&self, group: Option<&Arc<Group>>) -> Option<Arc<Account>> {
        self.pid0
            .get(&Self::bucket_key(group))
            .and_then(Weak::upgrade)
    }

    /// A namespace's socket by its group (0: the server's own). An account of the bucket
    /// holds its group, so no other group has that address while the bucket lives.
    fn bucket_key(group: Option<&Arc<Group>>) -> usize {
        group.map_or(0, |g| Arc::as_ptr(g) as usize)
    }

    pub fn totals(&self) -> &Arc<Totals> {
        &self.totals
    }
}

/// When process `pid` started (clock ticks after boot, /proc/PID/stat field 22), 0 if it
/// cannot be read. Its name, which may hold spaces and parentheses, ends at the last ')'.
fn start_time(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let after = &s[s.rfind(')')? + 1..];
            after.split_whitespace().nth(19)?.parse().ok()
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The server's bounds with streams and events as given: (bound, least, total).
    fn bounds_with(
        streams: (u32, u32, u64),
        events: (u32, u32, u64),
    ) -> crate::client::bounds::Bounds {
        let mut b = crate::client::bounds::Bounds::from_env();
        (b.streams, b.streams_least, b.streams_total) = streams;
        (b.events, b.events_least, b.events_total) = events;
        (b.graphs, b.graphs_least, b.graphs_total) = (64, 8, 1 << 20);
        b
    }

    #[test]
    fn grants_keep_the_least_for_every_client_still_to_come() {
        // Up to 10 clients of one GPU; 300 events in all, 100 at most and 10 at least each.
        let b = bounds_with((50, 5, 1 << 20), (100, 10, 300));
        let totals = Arc::new(Totals::default());
        let mut grants = Vec::new();
        for n in 0..10 {
            let g = totals.grant_within(&b, 1, 1, 10 - n - 1).expect("granted");
            grants.push(g);
        }
        let events: Vec<u32> = grants.iter().map(|g| g.events).collect();
        assert_eq!(events, [100, 100, 30, 10, 10, 10, 10, 10, 10, 10]);
        assert!(events.iter().sum::<u32>() as u64 <= 300, "within the total");
        assert!(grants.iter().all(|g| g.streams == 50), "streams had room");
        // A client with two GPUs takes per GPU, twice over.
        drop(grants.pop());
        drop(grants.pop());
        assert_eq!(totals.grant_within(&b, 2, 1, 0).map(|g| g.events), Some(10));
        // Given back when they go.
        drop(grants);
        assert_eq!(totals.events_granted.load(Ordering::Relaxed), 0);
        assert_eq!(totals.streams_granted.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn totals_are_per_gpu_of_the_server() {
        // Eight GPUs, 1,024 clients to come each keeping the least on all of them: the
        // defaults' proportions still grant the first client its whole bound.
        let b = bounds_with((16_384, 1024, 1 << 22), (1 << 18, 4096, 1 << 24));
        let totals = Arc::new(Totals::default());
        let g = totals.grant_within(&b, 8, 8, 1023).expect("granted");
        assert_eq!((g.streams, g.events), (16_384, 1 << 18));
    }

    #[test]
    fn a_least_the_total_cannot_give_every_client_shrinks() {
        // 5,000 clients to come, each kept 4,096 of a 16M total: more than it holds.
        let b = bounds_with((16_384, 1024, 1 << 22), (1 << 18, 4096, 1 << 24));
        let totals = Arc::new(Totals::default());
        let g = totals.grant_within(&b, 1, 1, 4999).expect("granted");
        assert!(g.events >= 3000, "{}", g.events);
    }

    #[test]
    fn graphs_are_granted_as_streams_and_events_are() {
        // Two clients of a server that takes two, 100 graphs in all, 64 at most each and 8
        // at least: the first cannot take what the second must keep.
        let mut b = bounds_with((50, 5, 1 << 20), (100, 10, 1 << 20));
        (b.graphs, b.graphs_least, b.graphs_total) = (64, 8, 100);
        let totals = Arc::new(Totals::default());
        let first = totals.grant_within(&b, 1, 1, 1).expect("first");
        let second = totals.grant_within(&b, 1, 1, 0).expect("second");
        assert_eq!((first.graphs, second.graphs), (64, 36));
        drop((first, second));
        assert_eq!(totals.graphs_granted.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_client_the_totals_cannot_give_its_least_is_refused() {
        let b = bounds_with((50, 5, 1 << 20), (100, 10, 25));
        let totals = Arc::new(Totals::default());
        let first = totals.grant_within(&b, 1, 1, 0).expect("25 of 25");
        assert_eq!(first.events, 25);
        assert!(totals.grant_within(&b, 1, 1, 0).is_none(), "nothing left");
        assert_eq!(
            totals.events_granted.load(Ordering::Relaxed),
            25,
            "untouched"
        );
        drop(first);
        assert!(totals.grant_within(&b, 1, 1, 0).is_some(), "room again");
    }

    #[test]
    fn connections_of_one_process_share_an_account_while_one_lives() {
        let mut all = Accounts::default();
        let me = std::process::id() as i32;
        assert_ne!(start_time(me), 0, "this process's start time is readable");
        let (a, new) = all.of(me, None);
        assert!(new);
        let (b, again) = all.of(me, None);
        assert!(!again);
        assert!(Arc::ptr_eq(&a, &b), "one account for both connections");
        drop((a, b));
        assert!(all.of(me, None).1, "none left: a new one");
        let (other, new) = all.of(1, None);
        assert!(new && other.pid == 1);
    }

    /// Review 4, finding 7: each PID-0 connection had an account of its own, so the
    /// per-process limits and caps never held for them.
    #[test]
    fn connections_of_pid_0_share_an_account_per_socket() {
        let mut all = Accounts::default();
        let (ns_a, ns_b) = (
            Arc::new(Group::new([0; MAX_DEVICES])),
            Arc::new(Group::new([0; MAX_DEVICES])),
        );
        let (a, new_a) = all.of(0, Some(&ns_a));
        assert!(a.join(Some(&ns_a)));
        let (b, new_b) = all.of(0, Some(&ns_a));
        assert!(new_a && !new_b, "the second shares the first's limits");
        assert!(Arc::ptr_eq(&a, &b), "one account per namespace's socket");
        assert!(all
            .pid0_bucket(Some(&ns_a))
            .is_some_and(|x| Arc::ptr_eq(&x, &a)));
        let (c, new_c) = all.of(0, Some(&ns_b));
        assert!(new_c && !Arc::ptr_eq(&a, &c), "another namespace's: apart");
        let (d, new_d) = all.of(0, None);
        assert!(new_d && !Arc::ptr_eq(&a, &d) && !Arc::ptr_eq(&c, &d));
        drop((a, b));
        assert!(all.pid0_bucket(Some(&ns_a)).is_none());
        assert!(all.of(0, Some(&ns_a)).1, "none left: a new one");
    }

    #[test]
    fn pinned_totals_hold_for_all_clients_together() {
        let t = Totals::default();
        let max = crate::client::bounds::bounds().pinned_total;
        assert!(t.take_pinned(max));
        assert!(!t.take_pinned(1), "nothing beyond the total");
        t.give_pinned(max);
        assert!(t.take_pinned(1));
        assert_eq!(t.pinned_ranges.load(Ordering::Relaxed), 1);
    }
}
