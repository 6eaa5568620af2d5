//! The client's device memory ranges as the shim knows them (allocations, mappings,
//! module globals, opened IPC memory): bad pointers get their error synchronously, as
//! from the driver, and every family that takes a device pointer looks it up here.

use crate::cuda::*;
use std::collections::BTreeMap;
use std::sync::Mutex;

/// Start -> (length, device, freeable). Module globals are ranges too, but not freeable.
pub(crate) static RANGES: Mutex<BTreeMap<u64, (u64, usize, bool)>> = Mutex::new(BTreeMap::new());

pub(crate) fn add_range(ptr: u64, len: u64, dev: usize, freeable: bool) {
    RANGES
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(ptr, (len, dev, freeable));
}

/// Forgets an IPC-opened range, but not an allocation of this process's own that took
/// its address meanwhile.
pub(crate) fn remove_opened_range(ptr: u64) {
    let mut r = RANGES.lock().unwrap_or_else(|p| p.into_inner());
    if matches!(r.get(&ptr), Some(&(_, _, false))) {
        r.remove(&ptr);
    }
}

pub(crate) fn remove_range(ptr: u64) {
    RANGES
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&ptr);
}

/// The allocation holding `addr`: (start, length, device).
pub(crate) fn range_info(addr: u64) -> Option<(u64, u64, usize)> {
    let r = RANGES.lock().unwrap_or_else(|p| p.into_inner());
    let (&start, &(n, dev, _)) = r.range(..=addr).next_back()?;
    (addr < start + n).then_some((start, n, dev))
}

/// Whether `[addr, addr+len)` lies inside one allocation of cuMemAlloc's (not a module
/// variable, VMM mapping or another process's memory).
pub(crate) fn plain_alloc(addr: u64, len: u64) -> bool {
    let r = RANGES.lock().unwrap_or_else(|p| p.into_inner());
    r.range(..=addr)
        .next_back()
        .is_some_and(|(&start, &(n, _, freeable))| {
            freeable && addr.checked_add(len).is_some_and(|end| end <= start + n)
        })
}

/// The device of the memory holding `[addr, addr+len)`, or INVALID_VALUE. The range may
/// run across adjacent ranges of one device: PyTorch's expandable segments map a
/// reservation piece by piece and place tensors across the seams.
pub(crate) fn range_dev(addr: u64, len: u64) -> Result<usize, CUresult> {
    let found = range_dev_in(&RANGES.lock().unwrap_or_else(|p| p.into_inner()), addr, len);
    if found.is_err() && crate::trace_enabled() {
        // Which memory a program names that this process never allocated (or freed) is
        // the first thing to know when a copy or memset is refused.
        let r = RANGES.lock().unwrap_or_else(|p| p.into_inner());
        let below = r.range(..=addr).next_back().map(|(s, v)| (*s, v.0));
        let above = r
            .range(addr.saturating_add(1)..)
            .next()
            .map(|(s, v)| (*s, v.0));
        eprintln!(
            "omps trace: [{addr:#x}, +{len}) is no allocation of this process (below: {below:x?}, above: {above:x?})"
        );
    }
    found
}

pub(crate) fn range_dev_in(
    r: &BTreeMap<u64, (u64, usize, bool)>,
    addr: u64,
    len: u64,
) -> Result<usize, CUresult> {
    let end = addr.checked_add(len).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let (&start, &(n, dev, _)) = r
        .range(..=addr)
        .next_back()
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let mut covered = start + n;
    if covered <= addr {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    while covered < end {
        match r.get(&covered) {
            Some(&(n, d, _)) if d == dev => covered += n,
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
    }
    Ok(dev)
}
