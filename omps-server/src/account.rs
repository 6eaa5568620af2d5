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
//! bounds (crate::bounds). A namespace's memory limit likewise holds for all its clients
//! together ([`Group`]): a pod that starts more processes gets no more memory.

use crate::client::NO_LIMIT;
use omps_ring::segment::MAX_DEVICES;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

/// What every client together holds, for the server-wide bounds.
#[derive(Default)]
pub struct Totals {
    /// Page-locked host memory registered for clients: bytes and ranges.
    pub pinned_bytes: AtomicU64,
    pub pinned_ranges: AtomicU64,
    /// Module image bytes clients uploaded and have not yet loaded.
    pub image_bytes: AtomicU64,
}

impl Totals {
    /// Takes `bytes` more in one more range, unless that would pass the server-wide
    /// bounds (OMPS_MAX_PINNED_TOTAL, OMPS_MAX_PINNED_RANGES_TOTAL).
    pub fn take_pinned(&self, bytes: u64) -> bool {
        let b = crate::bounds::bounds();
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
        let max = crate::bounds::bounds().image_bytes_total;
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
    /// Per GPU, the namespace's limit ([`NO_LIMIT`]: none).
    pub limit: [u64; MAX_DEVICES],
    pub mem: [AtomicU64; MAX_DEVICES],
    pub pinned: AtomicU64,
    /// Held across a limited charge's check and update, inside the process's own lock.
    lock: Mutex<()>,
}

impl Group {
    pub fn new(limit: [u64; MAX_DEVICES]) -> Group {
        Group {
            limit,
            mem: Default::default(),
            pinned: AtomicU64::new(0),
            lock: Mutex::new(()),
        }
    }

    /// Whether `n` more bytes on GPU `dev` (pinned bytes count on every GPU, as a
    /// process's do) stay within the limit: Some(limit, used) where they would not.
    fn over(&self, dev: usize, n: u64) -> Option<(u64, u64)> {
        let limit = *self.limit.get(dev)?;
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

    fn group(&self) -> Option<&Arc<Group>> {
        self.group.get().and_then(Option::as_ref)
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
    totals: Arc<Totals>,
}

impl Accounts {
    /// The account of process `pid`, and whether it is new (then its limits are still to
    /// be set). One held by no connection any more is gone, as is one of an earlier
    /// process with that PID.
    pub fn of(&mut self, pid: i32) -> (Arc<Account>, bool) {
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

    #[test]
    fn connections_of_one_process_share_an_account_while_one_lives() {
        let mut all = Accounts::default();
        let me = std::process::id() as i32;
        assert_ne!(start_time(me), 0, "this process's start time is readable");
        let (a, new) = all.of(me);
        assert!(new);
        let (b, again) = all.of(me);
        assert!(!again);
        assert!(Arc::ptr_eq(&a, &b), "one account for both connections");
        drop((a, b));
        assert!(all.of(me).1, "none left: a new one");
        let (other, new) = all.of(1);
        assert!(new && other.pid == 1);
    }

    #[test]
    fn pinned_totals_hold_for_all_clients_together() {
        let t = Totals::default();
        let max = crate::bounds::bounds().pinned_total;
        assert!(t.take_pinned(max));
        assert!(!t.take_pinned(1), "nothing beyond the total");
        t.give_pinned(max);
        assert!(t.take_pinned(1));
        assert_eq!(t.pinned_ranges.load(Ordering::Relaxed), 1);
    }
}
