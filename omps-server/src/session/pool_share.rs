//! Memory pools shared between clients (cuMemPoolExportToShareableHandle,
//! cuMemPoolImportFromShareableHandle, cuMemPoolExportPointer, cuMemPoolImportPointer).
//!
//! A pool is the client's own (the shim keeps it, omps-shim/src/api/pool.rs); what the
//! server keeps is who may reach what. A pool's key is its owner's client id and the
//! owner's number for it, so no client can name another's pool but through a token it
//! was given (crate::client::ipc). An allocation is exported as a member of one pool of its
//! owner's, and opened only by a client that imported that pool; it is then one of the
//! importer's IPC openings (`Session::imported`), closed when the importer frees it or
//! goes, and the owner's free leaves it to the last importer, as with IPC handles.

use super::kinds::pool_share::{MAX_IMPORTS, MAX_POOLS};
use super::{bad, Malformed, Session};
use crate::client::ipc::OpenError;
use crate::gpu::{code, CuError};
use crate::worker::WorkerCtx;
use omps_ring::wire::{self, vmm};

fn token_of(lo: u64, hi: u64) -> crate::client::ipc::Token {
    let mut t = [0u8; 16];
    t[..8].copy_from_slice(&lo.to_le_bytes());
    t[8..].copy_from_slice(&hi.to_le_bytes());
    t
}

/// A token and a word, as the shim reads them: [u8; 16] then a u64.
fn token_and(t: crate::client::ipc::Token, w: u64) -> [u64; 3] {
    [
        u64::from_le_bytes(t[..8].try_into().expect("8 bytes")),
        u64::from_le_bytes(t[8..].try_into().expect("8 bytes")),
        w,
    ]
}

impl Session {
    pub(super) fn pool_share(
        &mut self,
        ctx: &mut WorkerCtx,
        v: wire::Vmm,
    ) -> Result<(), Malformed> {
        let me = self.client.id;
        let own_key = (u64::from(me) << 32) | u64::from(v.handle);
        let [a0, a1, a2] = v.args;
        let mut reg = ctx.shared.ipc.lock().unwrap_or_else(|e| e.into_inner());
        let st = &mut self.vmm.pools;
        let full = st.exported.len() + st.imported.len() >= MAX_POOLS;
        let r: Result<[u64; 3], CuError> = match v.kind {
            vmm::POOL_EXPORT if full && !st.exported.contains(&own_key) => {
                Err(CuError(code::OUT_OF_MEMORY))
            }
            vmm::POOL_EXPORT => {
                // Exported again after its release: the owner holds it once more.
                let again = st.exported.insert(own_key);
                Ok(token_and(reg.export_pool(me, own_key, again), own_key))
            }
            vmm::POOL_IMPORT if full => Err(CuError(code::OUT_OF_MEMORY)),
            vmm::POOL_IMPORT => match reg.open_pool(&token_of(a0, a1), me) {
                Ok(key) => {
                    let n = st.imported.entry(key).or_default();
                    if *n >= MAX_IMPORTS {
                        reg.release_pool(key);
                        Err(CuError(code::OUT_OF_MEMORY))
                    } else {
                        *n += 1;
                        Ok([key, 0, 0])
                    }
                }
                // Its own pool, a token it was not given, or a pool all have let go of.
                Err(OpenError::Own | OpenError::Unknown) => Err(CuError(code::INVALID_VALUE)),
                Err(OpenError::TooMany) => Err(CuError(code::OUT_OF_MEMORY)),
            },
            vmm::POOL_RELEASE => {
                let released = if st.exported.remove(&a0) {
                    true
                } else if let Some(n) = st.imported.get_mut(&a0) {
                    *n -= 1;
                    if *n == 0 {
                        st.imported.remove(&a0);
                    }
                    true
                } else {
                    false
                };
                if released {
                    reg.release_pool(a0);
                    Ok([0; 3])
                } else {
                    Err(CuError(code::INVALID_VALUE))
                }
            }
            vmm::POOL_EXPORT_PTR => match self.allocs.get(&a0) {
                // Only the start of an allocation of its own, as natively.
                Some(&size) => reg
                    .export_pool_ptr(me, a0, size, own_key)
                    .map(|t| token_and(t, size))
                    .ok_or(CuError(code::INVALID_VALUE)),
                None => Err(CuError(code::INVALID_VALUE)),
            },
            vmm::POOL_IMPORT_PTR if !st.imported.contains_key(&a0) => {
                // Not a pool it imported: no other client's memory is reachable so.
                Err(CuError(code::INVALID_VALUE))
            }
            vmm::POOL_IMPORT_PTR => match reg.open_pool_ptr(&token_of(a1, a2), me, a0) {
                Ok(x) => {
                    self.imported.entry(x.ptr).or_insert((x.size, 0)).1 += 1;
                    Ok([x.ptr, x.size, 0])
                }
                Err(OpenError::TooMany) => Err(CuError(code::OUT_OF_MEMORY)),
                Err(_) => Err(CuError(code::INVALID_VALUE)),
            },
            k => return bad(format!("unknown pool call {k}")),
        };
        drop(reg);
        self.complete_pod(v.call, r)
    }
}
