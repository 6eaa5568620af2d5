//! Device resources for green contexts: what a client may carve (`cuDeviceGetDevResource`,
//! `cuDevSmResourceSplitByCount`, `cuDevResourceGenerateDesc`), answered in the shim from
//! the client's own view of the GPU. Its SM resource is its share (all SMs, or what its
//! thread limit or partition leaves it, as CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT reads),
//! at the granularity the server confines work at (its chunk: 8 SMs on Hopper, from the
//! driver's own split). The server never sees these: a green context made of them is only
//! its SM count (api/green.rs).
//!
//! What the driver keeps in a resource's internal bytes, the shim keeps there too: where
//! it came from (a query, or which split and which piece of it), so that a descriptor of
//! pieces of different splits, or a piece split again, is refused as the driver refuses it.

use crate::cuda::*;
use crate::handles::leak;
use crate::state::device::device;
use crate::state::entry::{entry, live, out};
use omps_ring::wire::{self, CallHdr, Op};
use std::ffi::{c_int, c_uint};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

pub const CU_DEV_RESOURCE_TYPE_SM: u32 = 1;
const IGNORE_SM_COSCHEDULING: c_uint = 1;
const MAX_POTENTIAL_CLUSTER_SIZE: c_uint = 2;

/// CUdevResource as CUDA 13.0 lays it out (12.4-12.9 have only `smCount` in the SM part;
/// 13.1 adds `flags` and, at the end, `nextResource`): 144 bytes in every version.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUdevResource {
    pub type_: u32,
    pub internal: [u8; 92],
    pub sm_count: u32,
    pub min_sm_partition_size: u32,
    pub sm_coscheduled_alignment: u32,
    pub rest: [u8; 36],
}

const _: () = assert!(std::mem::size_of::<CUdevResource>() == 144);

/// Marks the internal bytes as the shim's.
const RES_MAGIC: u32 = 0x6f6d_7073;
/// Where a resource came from.
const WHOLE: u32 = 1;
const GROUP: u32 = 2;
const REMAINDER: u32 = 3;

/// What the shim keeps in a resource's internal bytes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Origin {
    dev: u32,
    kind: u32,
    /// The split that made it (0 for a query's whole resource).
    split: u32,
    /// Its index among the split's groups (remainders: u32::MAX).
    index: u32,
}

impl CUdevResource {
    fn new(sms: u32, chunk: u32, origin: Origin) -> CUdevResource {
        let mut r = CUdevResource {
            type_: CU_DEV_RESOURCE_TYPE_SM,
            internal: [0; 92],
            sm_count: sms,
            min_sm_partition_size: chunk,
            sm_coscheduled_alignment: chunk,
            rest: [0; 36],
        };
        for (i, v) in [
            RES_MAGIC,
            origin.dev,
            origin.kind,
            origin.split,
            origin.index,
        ]
        .into_iter()
        .enumerate()
        {
            r.internal[i * 4..i * 4 + 4].copy_from_slice(&v.to_le_bytes());
        }
        r
    }

    fn word(&self, i: usize) -> u32 {
        u32::from_le_bytes(self.internal[i * 4..i * 4 + 4].try_into().expect("4 bytes"))
    }

    /// Its origin, if it is an SM resource the shim made.
    fn origin(&self) -> Result<Origin, CUresult> {
        if self.type_ != CU_DEV_RESOURCE_TYPE_SM {
            return Err(CUDA_ERROR_INVALID_RESOURCE_TYPE);
        }
        if self.word(0) != RES_MAGIC {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        Ok(Origin {
            dev: self.word(1),
            kind: self.word(2),
            split: self.word(3),
            index: self.word(4),
        })
    }
}

/// How the server confines device `dev`'s SMs: (total SMs, SMs per chunk); None where the
/// GPU has no green contexts. Asked once per device.
pub(crate) fn granularity(dev: usize) -> Result<Option<(u32, u32)>, CUresult> {
    static KNOWN: Mutex<Vec<(usize, wire::GreenInfo)>> = Mutex::new(Vec::new());
    let known = KNOWN
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .find(|k| k.0 == dev)
        .map(|k| k.1);
    let info = match known {
        Some(i) => i,
        None => {
            let c = live()?;
            let mut ch = c.channel();
            ch.call(dev, Op::Green, |call: CallHdr| {
                bytemuck::bytes_of(&wire::GreenCall {
                    call,
                    kind: wire::green::QUERY,
                    ..Default::default()
                })
                .to_vec()
            })?;
            let i = ch.reply::<wire::GreenInfo>();
            KNOWN
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((dev, i));
            i
        }
    };
    Ok((info.chunks > 0).then_some((info.total, info.chunk.max(1))))
}

/// The SMs this client may use on `dev`: its share, as the server publishes it.
pub(crate) fn share(dev: usize) -> Result<u32, CUresult> {
    const MULTIPROCESSOR_COUNT: usize = 16;
    let d = device(dev as CUdevice)?;
    let all = d.attribute(MULTIPROCESSOR_COUNT).unwrap_or(0);
    let v = live()?
        .seg()
        .read_attribute(dev, MULTIPROCESSOR_COUNT)
        .unwrap_or(all);
    Ok(v.max(0) as u32)
}

/// The SM resource of `sms` SMs on `dev`, as a query answers it; NOT_SUPPORTED on a GPU
/// without green contexts.
pub(crate) fn whole(dev: usize, sms: u32) -> Result<CUdevResource, CUresult> {
    let (_, chunk) = granularity(dev)?.ok_or(CUDA_ERROR_NOT_SUPPORTED)?;
    Ok(CUdevResource::new(
        sms,
        chunk,
        Origin {
            dev: dev as u32,
            kind: WHOLE,
            split: 0,
            index: 0,
        },
    ))
}

/// Writes the SM resource of `sms` SMs on `dev` for a query of resource type `ty`.
///
/// # Safety
/// `res` is null or writable for a CUdevResource.
pub(crate) unsafe fn answer(
    res: *mut CUdevResource,
    ty: c_int,
    dev: usize,
    sms: u32,
) -> Result<(), CUresult> {
    if res.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if ty as u32 != CU_DEV_RESOURCE_TYPE_SM {
        return Err(CUDA_ERROR_INVALID_RESOURCE_TYPE);
    }
    let r = whole(dev, sms)?;
    // SAFETY: checked non-null; the caller's pointer.
    unsafe { out(res, r) }
}

/// # Safety
/// `res` is null or writable for a CUdevResource.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetDevResource(
    dev: CUdevice,
    res: *mut CUdevResource,
    ty: c_int,
) -> CUresult {
    entry(|| {
        device(dev)?;
        let sms = share(dev as usize)?;
        // SAFETY: forwarded contract.
        unsafe { answer(res, ty, dev as usize, sms) }
    })
}

/// A split of `sms` SMs into groups of at least `min_count` on a GPU confined in chunks of
/// `chunk`: (SMs per group, groups). Each group is rounded up to whole chunks (without
/// co-scheduling, to 2 SMs, as the driver lowers the alignment; the server still confines
/// such a group to whole chunks).
pub(crate) fn split_plan(
    sms: u32,
    chunk: u32,
    flags: c_uint,
    min_count: u32,
) -> Result<(u32, u32), CUresult> {
    if flags & !(IGNORE_SM_COSCHEDULING | MAX_POTENTIAL_CLUSTER_SIZE) != 0 || min_count > sms {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let align = if flags & IGNORE_SM_COSCHEDULING != 0 {
        chunk.min(2)
    } else {
        chunk
    }
    .max(1);
    let size = min_count.max(align).div_ceil(align) * align;
    Ok((size, sms / size))
}

/// # Safety
/// `result` is null or writable for `*nb` resources; `nb` is null or valid; `input` is null
/// or readable; `remainder` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuDevSmResourceSplitByCount(
    result: *mut CUdevResource,
    nb: *mut c_uint,
    input: *const CUdevResource,
    remainder: *mut CUdevResource,
    flags: c_uint,
    min_count: c_uint,
) -> CUresult {
    static SPLITS: AtomicU32 = AtomicU32::new(1);
    entry(|| {
        if nb.is_null() || input.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: checked non-null; the caller's resource.
        let input = unsafe { input.read_unaligned() };
        let from = input.origin()?;
        if from.kind != WHOLE {
            // A split's pieces are split again only once a green context holds them.
            return Err(CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
        }
        let (_, chunk) = granularity(from.dev as usize)?.ok_or(CUDA_ERROR_NOT_SUPPORTED)?;
        let (size, groups) = split_plan(input.sm_count, chunk, flags, min_count)?;
        if result.is_null() {
            // SAFETY: checked non-null; the caller's pointer.
            return unsafe { out(nb, groups) };
        }
        // SAFETY: checked non-null; the caller's pointer.
        let want = unsafe { nb.read() };
        if want == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let n = want.min(groups);
        if n == 0 {
            return Err(CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
        }
        let split = SPLITS.fetch_add(1, Ordering::Relaxed);
        let piece = |kind, index, sms| {
            CUdevResource::new(
                sms,
                chunk,
                Origin {
                    dev: from.dev,
                    kind,
                    split,
                    index,
                },
            )
        };
        for i in 0..n {
            // SAFETY: the caller's array holds `want` >= n resources.
            unsafe {
                result
                    .add(i as usize)
                    .write_unaligned(piece(GROUP, i, size))
            };
        }
        if !remainder.is_null() {
            let left = input.sm_count - n * size;
            let r = if left == 0 {
                // Nothing remains: an invalid (zeroed) resource.
                // SAFETY: a plain C struct; all zeroes is its invalid value.
                unsafe { std::mem::zeroed() }
            } else {
                piece(REMAINDER, u32::MAX, left)
            };
            // SAFETY: checked non-null; the caller's pointer.
            unsafe { remainder.write_unaligned(r) };
        }
        // SAFETY: checked non-null; the caller's pointer.
        unsafe { nb.write(n) };
        Ok(())
    })
}

pub const DESC_MAGIC: u32 = 0x6465_7363;

/// A resource descriptor: the SMs a green context made of it gets.
#[repr(C)]
pub struct ResourceDesc {
    pub magic: AtomicU32,
    pub dev: usize,
    pub sms: u32,
}

/// # Safety
/// `desc` is null or writable; `res` is null or readable for `nb` resources.
#[no_mangle]
pub unsafe extern "C" fn cuDevResourceGenerateDesc(
    desc: *mut *mut ResourceDesc,
    res: *const CUdevResource,
    nb: c_uint,
) -> CUresult {
    entry(|| {
        if desc.is_null() || res.is_null() || nb == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut seen: Vec<(Origin, u32)> = Vec::new();
        for i in 0..nb as usize {
            // SAFETY: the caller's array holds nb resources.
            let r = unsafe { res.add(i).read_unaligned() };
            seen.push((r.origin()?, r.sm_coscheduled_alignment));
            if r.sm_count == 0 {
                return Err(CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
            }
        }
        let first = seen[0].0;
        if seen.iter().any(|(o, _)| o.dev != first.dev) {
            return Err(CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
        }
        if nb > 1 {
            // Several: pieces of one split, each once, with one alignment.
            let mut idx: Vec<u32> = seen.iter().map(|(o, _)| o.index).collect();
            idx.sort_unstable();
            idx.dedup();
            if seen
                .iter()
                .any(|(o, a)| o.kind == WHOLE || o.split != first.split || *a != seen[0].1)
                || idx.len() != seen.len()
            {
                return Err(CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
            }
        }
        let mut sms = 0u32;
        for i in 0..nb as usize {
            // SAFETY: as above.
            sms = sms.saturating_add(unsafe { res.add(i).read_unaligned() }.sm_count);
        }
        let d = leak(ResourceDesc {
            magic: AtomicU32::new(DESC_MAGIC),
            dev: first.dev as usize,
            sms,
        });
        // SAFETY: checked non-null; the caller's pointer.
        unsafe { out(desc, d) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_round_up_to_the_granularity() {
        // An H100: chunks of 8.
        assert_eq!(split_plan(132, 8, 0, 16), Ok((16, 8)));
        assert_eq!(split_plan(132, 8, 0, 7), Ok((8, 16)));
        assert_eq!(split_plan(132, 8, 0, 10), Ok((16, 8)));
        assert_eq!(split_plan(132, 8, 0, 17), Ok((24, 5)));
        assert_eq!(split_plan(132, 8, 0, 0), Ok((8, 16)), "0: the minimum");
        assert_eq!(split_plan(132, 8, IGNORE_SM_COSCHEDULING, 3), Ok((4, 33)));
        // More than the input has, or unknown flags: refused.
        assert_eq!(split_plan(32, 8, 0, 33), Err(CUDA_ERROR_INVALID_VALUE));
        assert_eq!(split_plan(32, 8, 4, 8), Err(CUDA_ERROR_INVALID_VALUE));
        // Rounding past the input leaves no group.
        assert_eq!(split_plan(12, 8, 0, 12), Ok((16, 0)));
    }

    #[test]
    fn resources_say_where_they_came_from() {
        let o = Origin {
            dev: 1,
            kind: GROUP,
            split: 7,
            index: 2,
        };
        let r = CUdevResource::new(16, 8, o);
        assert_eq!(r.origin(), Ok(o));
        let mut forged = r;
        forged.internal = [0; 92];
        assert_eq!(forged.origin(), Err(CUDA_ERROR_INVALID_VALUE));
        forged.type_ = 0;
        assert_eq!(forged.origin(), Err(CUDA_ERROR_INVALID_RESOURCE_TYPE));
    }
}
