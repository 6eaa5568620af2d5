//! IPC between clients of one server (`cuIpcGetMemHandle` / `cuIpcOpenMemHandle`).
//!
//! Every client's memory lives in the one shared context, so an opened handle is the same
//! device pointer: nothing is mapped. What IPC needs here is bookkeeping: a handle names an
//! allocation by an unguessable token; only a client that was given the handle can open
//! it, and the memory lives until its owner freed it and every importer closed it (a
//! killed exporter frees nothing an importer still holds open).
//!
//! Memory its owner freed while another client holds it open stays charged to the owner's
//! process (an [`Held`] in its entry) until the driver's memory goes, so that no client can
//! shed its limit by having the memory held elsewhere (issue 23, finding 13).
//!
//! Memory pools are shared the same way: a pool's token names the exporter's pool, and an
//! allocation exported from it is opened only by a client that imported that pool.

use crate::client::account::Held;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};

pub type Token = [u8; 16];

struct Entry {
    ptr: u64,
    size: u64,
    owner: u32,
    /// Importing client -> how many times it opened the handle and has not closed it.
    importers: HashMap<u32, u32>,
    /// The owner freed it (or died) while it was open elsewhere.
    owner_gone: bool,
    /// The exportable pool (its key) it was exported from: only that pool's importers
    /// may open it, and not as a plain IPC handle.
    pool: Option<u64>,
    /// The owner's charge for it once the owner freed it, until the last importer closes.
    held: Option<Held>,
}

/// An exported driver handle (an event, or VMM physical memory): shared by its owner and
/// its importers.
struct HandleEntry {
    handle: u64,
    size: u64,
    /// VMM memory the driver made compressible (its importers report it).
    compressed: bool,
    owner: u32,
    /// Clients holding it (the owner, then each opening), each release or death one less.
    users: u32,
    /// The server GPU the memory lives on (VMM memory, imported on any GPU's worker).
    home: usize,
    /// Its owner's charge for VMM memory the owner released, until the last user does.
    held: Vec<Held>,
}

/// Driver handles of one kind that clients exported: token -> entry, handle -> token.
#[derive(Default)]
struct SharedHandles {
    by_token: HashMap<Token, HandleEntry>,
    tokens: HashMap<u64, Token>,
}

impl SharedHandles {
    fn export(
        &mut self,
        owner: u32,
        handle: u64,
        size: u64,
        compressed: bool,
        home: usize,
        token: impl FnOnce() -> Token,
    ) -> Token {
        if let Some(t) = self.tokens.get(&handle) {
            return *t;
        }
        let t = token();
        self.tokens.insert(handle, t);
        self.by_token.insert(
            t,
            HandleEntry {
                handle,
                size,
                compressed,
                owner,
                users: 1,
                home,
                held: Vec::new(),
            },
        );
        t
    }

    /// Opens an exported handle; `own_too`: its owner may open it as well.
    fn open(
        &mut self,
        token: &Token,
        client: u32,
        own_too: bool,
    ) -> Result<(u64, u64, bool, usize), OpenError> {
        let e = self.by_token.get_mut(token).ok_or(OpenError::Unknown)?;
        if e.owner == client && !own_too {
            return Err(OpenError::Own);
        }
        e.users += 1;
        Ok((e.handle, e.size, e.compressed, e.home))
    }

    /// Whether the driver's handle is to go now (true for one never exported).
    fn release(&mut self, handle: u64) -> bool {
        let Some(t) = self.tokens.get(&handle).copied() else {
            return true;
        };
        let Some(e) = self.by_token.get_mut(&t) else {
            return true;
        };
        e.users -= 1;
        if e.users > 0 {
            return false;
        }
        self.by_token.remove(&t);
        self.tokens.remove(&handle);
        true
    }

    /// Keeps `held` charged while others still hold `handle`; dropped (given back) now
    /// if no one does.
    fn keep(&mut self, handle: u64, held: Held) {
        if let Some(e) = self
            .tokens
            .get(&handle)
            .and_then(|t| self.by_token.get_mut(t))
        {
            e.held.push(held);
        }
    }

    fn shared(&self, handle: u64) -> bool {
        self.tokens.contains_key(&handle)
    }
}

#[derive(Default)]
pub struct Registry {
    by_token: HashMap<Token, Entry>,
    by_ptr: HashMap<u64, Token>,
    events: SharedHandles,
    vmm: SharedHandles,
    pools: SharedHandles,
    keys: std::collections::hash_map::RandomState,
    counter: u64,
}

/// What an importer learns from opening a handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Opened {
    pub ptr: u64,
    pub size: u64,
}

#[derive(Debug, PartialEq, Eq)]
pub enum OpenError {
    /// No allocation behind the token (never exported, or freed and closed by all).
    Unknown,
    /// The owner opening its own handle (CUDA refuses a process its own handle).
    Own,
    /// The client holds [`MAX_OPENINGS`] openings of it already.
    TooMany,
}

/// Openings one client may hold of one allocation: each is counted, and given back one by
/// one at its exit (a client opening the same handle billions of times would overflow
/// the count and build one entry per opening when it leaves).
pub const MAX_OPENINGS: u32 = 1 << 16;

impl Registry {
    fn new_token(&mut self) -> Token {
        self.counter += 1;
        let mut t = [0u8; 16];
        for (i, half) in t.chunks_exact_mut(8).enumerate() {
            let mut h = self.keys.build_hasher();
            h.write_u64(self.counter);
            h.write_usize(i);
            half.copy_from_slice(&h.finish().to_le_bytes());
        }
        t
    }

    /// The token for `owner`'s allocation at `ptr` (`size` bytes): the same one each time.
    pub fn export(&mut self, owner: u32, ptr: u64, size: u64) -> Token {
        if let Some(t) = self.by_ptr.get(&ptr) {
            if self
                .by_token
                .get(t)
                .is_some_and(|e| e.owner == owner && !e.owner_gone)
            {
                return *t;
            }
        }
        let t = self.new_token();
        self.by_ptr.insert(ptr, t);
        self.by_token.insert(
            t,
            Entry {
                ptr,
                size,
                owner,
                importers: HashMap::new(),
                owner_gone: false,
                pool: None,
                held: None,
            },
        );
        t
    }

    /// Whether `owner` exported its allocation at `ptr`.
    pub fn exported(&self, ptr: u64, owner: u32) -> bool {
        self.by_ptr
            .get(&ptr)
            .and_then(|t| self.by_token.get(t))
            .is_some_and(|e| e.owner == owner && !e.owner_gone)
    }

    pub fn open(&mut self, token: &Token, client: u32) -> Result<Opened, OpenError> {
        self.open_from(token, client, None)
    }

    /// Opens an allocation exported from pool `pool` (None: a plain IPC handle's).
    fn open_from(
        &mut self,
        token: &Token,
        client: u32,
        pool: Option<u64>,
    ) -> Result<Opened, OpenError> {
        let e = self.by_token.get_mut(token).ok_or(OpenError::Unknown)?;
        if e.owner_gone || e.pool != pool {
            return Err(OpenError::Unknown);
        }
        if e.owner == client {
            return Err(OpenError::Own);
        }
        let n = e.importers.entry(client).or_default();
        if *n >= MAX_OPENINGS {
            return Err(OpenError::TooMany);
        }
        *n += 1;
        Ok(Opened {
            ptr: e.ptr,
            size: e.size,
        })
    }

    /// `client` closes one opening of the allocation at `ptr`: None if it had none open;
    /// else the allocation to free now, if this was the last user.
    pub fn close(&mut self, ptr: u64, client: u32) -> Option<Option<(u64, u64)>> {
        let t = *self.by_ptr.get(&ptr)?;
        let e = self.by_token.get_mut(&t)?;
        let n = e.importers.get_mut(&client)?;
        *n -= 1;
        if *n == 0 {
            e.importers.remove(&client);
        }
        Some(self.settle(t))
    }

    /// The owner frees `ptr`: true when nothing holds it open (free it now), false when
    /// an importer does (it is freed when the last one closes). Not exported: true.
    pub fn owner_frees(&mut self, ptr: u64, owner: u32) -> bool {
        let Some(&t) = self.by_ptr.get(&ptr) else {
            return true;
        };
        match self.by_token.get_mut(&t) {
            Some(e) if e.owner == owner => {
                e.owner_gone = true;
                self.settle(t).is_some()
            }
            _ => true,
        }
    }

    /// The owner's charge for `ptr`, which it freed while others hold it open
    /// ([`Registry::owner_frees`] said false): kept until the last importer closes it,
    /// given back now if none holds it any more.
    pub fn keep_charged(&mut self, ptr: u64, held: Held) {
        if let Some(e) = self.by_ptr.get(&ptr).and_then(|t| self.by_token.get_mut(t)) {
            if e.owner_gone {
                e.held = Some(held);
            }
        }
    }

    /// The token for `owner`'s event `handle`: the same one each time.
    pub fn export_event(&mut self, owner: u32, handle: u64) -> Token {
        let t = self.new_token();
        self.events.export(owner, handle, 0, false, 0, || t)
    }

    /// Another client opens an exported event: the driver's handle, now shared with it.
    pub fn open_event(&mut self, token: &Token, client: u32) -> Result<u64, OpenError> {
        self.events.open(token, client, false).map(|(h, ..)| h)
    }

    /// A client is done with event `handle` (destroyed it, or died): whether to destroy
    /// it now (true for an event never exported).
    pub fn release_event(&mut self, handle: u64) -> bool {
        self.events.release(handle)
    }

    /// The token for `owner`'s VMM physical memory `handle` of `size` bytes on server GPU
    /// `home`.
    pub fn export_vmm(
        &mut self,
        owner: u32,
        handle: u64,
        size: u64,
        compressed: bool,
        home: usize,
    ) -> Token {
        let t = self.new_token();
        self.vmm.export(owner, handle, size, compressed, home, || t)
    }

    /// A client imports exported physical memory (its owner may too, as natively): the
    /// driver's handle, its size, whether it is compressible and the GPU it lives on.
    pub fn open_vmm(
        &mut self,
        token: &Token,
        client: u32,
    ) -> Result<(u64, u64, bool, usize), OpenError> {
        self.vmm.open(token, client, true)
    }

    /// A client released physical memory `handle` (or died): whether to release it with
    /// the driver now (true for memory never exported).
    pub fn release_vmm(&mut self, handle: u64) -> bool {
        self.vmm.release(handle)
    }

    /// Its owner's charge for VMM memory `handle` it released, kept until the last
    /// importer releases it too; given back now if none holds it (or it was never
    /// exported).
    pub fn keep_vmm(&mut self, handle: u64, held: Held) {
        self.vmm.keep(handle, held);
    }

    /// Whether event `handle` was exported (its owner's or an opener's view of it).
    pub fn event_shared(&self, handle: u64) -> bool {
        self.events.shared(handle)
    }

    /// Whether another client still holds VMM memory `handle` its owner released.
    pub fn vmm_shared(&self, handle: u64) -> bool {
        self.vmm.shared(handle)
    }

    /// The token for `owner`'s pool `key` (the same one each time): whoever is given it
    /// may import the pool. `again`: the owner had released its export, which importers
    /// still hold; it holds the pool once more (one more release to come).
    pub fn export_pool(&mut self, owner: u32, key: u64, again: bool) -> Token {
        let t = self.new_token();
        let had = self.pools.tokens.contains_key(&key);
        let token = self.pools.export(owner, key, 0, false, 0, || t);
        if again && had {
            if let Some(e) = self.pools.by_token.get_mut(&token) {
                e.users += 1;
            }
        }
        token
    }

    /// Another client imports an exported pool: its key. The pool's entry lives until its
    /// owner and every importer released it.
    pub fn open_pool(&mut self, token: &Token, client: u32) -> Result<u64, OpenError> {
        self.pools.open(token, client, false).map(|(key, ..)| key)
    }

    /// A client is done with pool `key` it exported or imported.
    pub fn release_pool(&mut self, key: u64) {
        self.pools.release(key);
    }

    /// The token for `owner`'s allocation at `ptr` from its pool `pool`: None if the
    /// allocation was exported from another pool, or as a plain IPC handle.
    pub fn export_pool_ptr(&mut self, owner: u32, ptr: u64, size: u64, pool: u64) -> Option<Token> {
        let t = self.export(owner, ptr, size);
        let e = self.by_token.get_mut(&t)?;
        match e.pool {
            None if e.importers.is_empty() => e.pool = Some(pool),
            Some(p) if p == pool => {}
            _ => return None,
        }
        Some(t)
    }

    /// Opens an allocation exported from pool `pool`, which the caller checked `client`
    /// imported.
    pub fn open_pool_ptr(
        &mut self,
        token: &Token,
        client: u32,
        pool: u64,
    ) -> Result<Opened, OpenError> {
        self.open_from(token, client, Some(pool))
    }

    /// Forgets an entry whose owner is gone and that no one holds open: the allocation to
    /// free.
    fn settle(&mut self, t: Token) -> Option<(u64, u64)> {
        let e = self.by_token.get(&t)?;
        if !e.owner_gone || !e.importers.is_empty() {
            return None;
        }
        let e = self.by_token.remove(&t)?;
        if self.by_ptr.get(&e.ptr) == Some(&t) {
            self.by_ptr.remove(&e.ptr);
        }
        Some((e.ptr, e.size))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openings_of_one_allocation_are_bounded_per_client() {
        let mut r = Registry::default();
        let t = r.export(1, 0x1000, 64);
        for _ in 0..MAX_OPENINGS {
            r.open(&t, 2).expect("within the bound");
        }
        assert_eq!(r.open(&t, 2), Err(OpenError::TooMany));
        assert!(r.open(&t, 3).is_ok(), "another client's count is its own");
        assert!(r.close(0x1000, 2).is_some());
        assert!(r.open(&t, 2).is_ok(), "one closed, one more");
    }

    #[test]
    fn a_pools_allocation_opens_only_through_that_pool() {
        let mut r = Registry::default();
        let pool = r.export_pool(1, 7, true);
        assert_eq!(r.open_pool(&pool, 1), Err(OpenError::Own));
        assert_eq!(r.open_pool(&[0; 16], 2), Err(OpenError::Unknown));
        assert_eq!(r.open_pool(&pool, 2), Ok(7));
        let t = r.export_pool_ptr(1, 0x1000, 64, 7).unwrap();
        assert_eq!(
            r.export_pool_ptr(1, 0x1000, 64, 7),
            Some(t),
            "the same token"
        );
        assert_eq!(r.export_pool_ptr(1, 0x1000, 64, 8), None, "another pool's");
        assert_eq!(
            r.open(&t, 2),
            Err(OpenError::Unknown),
            "not a plain IPC handle"
        );
        assert_eq!(r.open_pool_ptr(&t, 2, 8), Err(OpenError::Unknown));
        assert_eq!(r.open_pool_ptr(&t, 2, 7).unwrap().ptr, 0x1000);
        // Freed by its owner while imported: it stays until the importer frees it.
        assert!(!r.owner_frees(0x1000, 1));
        assert_eq!(r.open_pool_ptr(&t, 3, 7), Err(OpenError::Unknown));
        assert_eq!(r.close(0x1000, 2), Some(Some((0x1000, 64))));
        // A plain IPC handle's allocation is not a pool's.
        let plain = r.export(1, 0x2000, 64);
        assert_eq!(r.open_pool_ptr(&plain, 2, 7), Err(OpenError::Unknown));
        r.open(&plain, 2).unwrap();
        assert_eq!(r.export_pool_ptr(1, 0x2000, 64, 7), None, "already open");
        // The pool goes with its last user.
        r.release_pool(7);
        assert_eq!(r.open_pool(&pool, 3), Ok(7), "its importer still holds it");
        r.release_pool(7);
        r.release_pool(7);
        assert_eq!(r.open_pool(&pool, 3), Err(OpenError::Unknown));
    }

    #[test]
    fn a_pool_exported_again_after_its_release_is_held_again() {
        let mut r = Registry::default();
        let t = r.export_pool(1, 7, true);
        assert_eq!(r.open_pool(&t, 2), Ok(7));
        // The owner lets go while client 2 holds it, then exports it once more: the same
        // token, and one more hold, so its next release leaves client 2's in place.
        r.release_pool(7);
        assert_eq!(r.export_pool(1, 7, true), t);
        r.release_pool(7);
        assert_eq!(r.open_pool(&t, 3), Ok(7), "client 2 still holds it");
        r.release_pool(7);
        r.release_pool(7);
        assert_eq!(r.open_pool(&t, 4), Err(OpenError::Unknown));
    }

    #[test]
    fn exported_physical_memory_goes_with_its_last_user() {
        let mut r = Registry::default();
        let t = r.export_vmm(1, 0xabc, 4096, true, 1);
        assert_eq!(
            r.export_vmm(1, 0xabc, 4096, true, 1),
            t,
            "the same token again"
        );
        assert_eq!(r.open_vmm(&t, 2), Ok((0xabc, 4096, true, 1)));
        assert_eq!(
            r.open_vmm(&t, 1),
            Ok((0xabc, 4096, true, 1)),
            "its owner may import it too"
        );
        assert!(!r.release_vmm(0xabc), "the importers still hold it");
        assert!(!r.release_vmm(0xabc), "an importer still holds it");
        assert!(r.release_vmm(0xabc), "the last user releases it");
        assert_eq!(r.open_vmm(&t, 3), Err(OpenError::Unknown), "gone");
        assert!(r.release_vmm(0xdef), "never exported: released at once");
        // An event and physical memory with the same value are different things.
        let e = r.export_event(1, 0xabc);
        assert_eq!(r.open_vmm(&e, 2), Err(OpenError::Unknown));
    }

    #[test]
    fn memory_lives_until_its_owner_and_every_importer_are_done() {
        let mut r = Registry::default();
        let t = r.export(1, 0x1000, 64);
        assert_eq!(r.export(1, 0x1000, 64), t, "one token per allocation");
        assert_eq!(r.open(&t, 1), Err(OpenError::Own));
        assert_eq!(
            r.open(&[0; 16], 2),
            Err(OpenError::Unknown),
            "a guessed token"
        );
        assert_eq!(r.open(&t, 2).unwrap().ptr, 0x1000);
        r.open(&t, 2).unwrap();
        r.open(&t, 3).unwrap();
        assert!(!r.owner_frees(0x1000, 1), "still open: not freed");
        assert_eq!(
            r.open(&t, 4),
            Err(OpenError::Unknown),
            "no new openings once freed"
        );
        assert_eq!(r.close(0x1000, 2), Some(None));
        assert_eq!(r.close(0x1000, 2), Some(None));
        assert_eq!(
            r.close(0x1000, 2),
            None,
            "client 2 has nothing open any more"
        );
        assert_eq!(
            r.close(0x1000, 3),
            Some(Some((0x1000, 64))),
            "the last user frees it"
        );
        assert!(r.owner_frees(0x2000, 1), "never exported: free at once");
    }

    #[test]
    fn a_shared_event_is_destroyed_by_its_last_user() {
        let mut r = Registry::default();
        assert!(r.release_event(7), "never exported: destroyed at once");
        let t = r.export_event(1, 7);
        assert_eq!(r.export_event(1, 7), t);
        assert_eq!(r.open_event(&t, 1), Err(OpenError::Own));
        assert_eq!(r.open_event(&t, 2), Ok(7));
        assert!(
            !r.release_event(7),
            "the owner destroys it: still open in client 2"
        );
        assert!(r.release_event(7), "client 2 too: gone");
        assert_eq!(r.open_event(&t, 3), Err(OpenError::Unknown));
    }

    #[test]
    fn an_owner_that_frees_what_no_one_opened_frees_it() {
        let mut r = Registry::default();
        let t = r.export(1, 0x1000, 64);
        assert!(r.owner_frees(0x1000, 1));
        assert_eq!(r.open(&t, 2), Err(OpenError::Unknown));
        let t2 = r.export(5, 0x1000, 64);
        assert_ne!(t, t2, "a reused address gets a new token");
    }
}
