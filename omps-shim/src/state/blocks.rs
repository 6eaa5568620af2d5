//! Plain device allocations in the server (cuMemAlloc's blocks, and those arrays, graph
//! memory and pools are made of), and allocations imported from other processes' pools:
//! below the memory families that allocate and free them.

use crate::cuda::*;
use crate::state::entry::live;
use crate::state::ranges::*;
use omps_ring::wire::{self, IpcCall, MemAlloc, MemFree, Op};
use std::collections::HashMap;
use std::sync::Mutex;

pub(crate) fn alloc(dev: usize, size: usize) -> Result<u64, CUresult> {
    if size == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let c = live()?;
    let mut ch = c.channel();
    ch.call(dev, Op::MemAlloc, |call| {
        bytemuck::bytes_of(&MemAlloc {
            call,
            size: size as u64,
        })
        .to_vec()
    })?;
    let p = ch.reply::<wire::U64Reply>().value;
    add_range(p, size as u64, dev, true);
    Ok(p)
}

/// Frees allocation `ptr`: the server frees it once the GPU is done with this client's
/// queued work. A pool's allocation leaves its pool's books first (pool::free).
pub(crate) fn free_block(ptr: u64) -> Result<(), CUresult> {
    let c = live()?;
    let (_, dev, _) = {
        let mut r = RANGES.lock().unwrap_or_else(|p| p.into_inner());
        match r.get(&ptr) {
            Some(&(_, _, true)) => r.remove(&ptr).expect("present"),
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
    };
    c.push(dev, Op::MemFree, &[bytemuck::bytes_of(&MemFree { ptr })])
}

/// Allocations imported from other processes' pools: pointer -> (device, times imported).
pub(crate) static IMPORTED: Mutex<Option<HashMap<u64, (usize, u32)>>> = Mutex::new(None);

/// Frees `ptr` if it is an imported allocation: this process's hold on it is given up
/// once its queued work is done. None for any other pointer.
pub(crate) fn free_imported(ptr: u64) -> Option<Result<(), CUresult>> {
    let dev = {
        let mut m = IMPORTED.lock().unwrap_or_else(|e| e.into_inner());
        let e = m.as_mut()?.get_mut(&ptr)?;
        e.1 -= 1;
        let dev = e.0;
        if e.1 == 0 {
            m.as_mut().expect("present").remove(&ptr);
            crate::state::ranges::remove_opened_range(ptr);
        }
        dev
    };
    Some(live().and_then(|c| {
        c.channel().call(dev, Op::IpcCloseMemHandle, |call| {
            bytemuck::bytes_of(&IpcCall { call, ptr }).to_vec()
        })
    }))
}
