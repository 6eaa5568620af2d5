//! Green contexts of one GPU, one per confinement slot ([`crate::sched::confine`]), for
//! [`crate::gpu::cuda::CudaGpu`].

use crate::gpu::{code, CuError, GpuResult};
use crate::sched::confine::{SmChunks, SmSet};
use cudarc::driver::sys as cu;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::Mutex;

fn ck(r: cu::CUresult) -> GpuResult<()> {
    match r {
        cu::CUresult::CUDA_SUCCESS => Ok(()),
        e => Err(CuError(e as i32)),
    }
}

pub struct Green {
    dev: cu::CUdevice,
    pub chunks: SmChunks,
    /// The device's SMs split into chunks, and what the split left over.
    groups: Vec<cu::CUdevResource>,
    remaining: cu::CUdevResource,
    slots: Vec<AtomicPtr<cu::CUgreenCtx_st>>,
    /// What each slot was made over, to remake it after a context reset.
    sets: Mutex<Vec<Option<SmSet>>>,
}

// SAFETY: the resources are plain descriptions; green contexts may be used from any thread.
unsafe impl Send for Green {}
// SAFETY: as above; the driver API is thread safe, and the slots are atomics.
unsafe impl Sync for Green {}

impl Green {
    /// Splits the device's SMs into chunks; a device without green contexts gets none
    /// (and every confinement fails with NOT_SUPPORTED).
    pub fn open(dev: cu::CUdevice, slots: usize) -> Green {
        let mut g = Green {
            dev,
            chunks: SmChunks {
                total: 0,
                chunk: 1,
                chunks: 0,
            },
            groups: Vec::new(),
            // SAFETY: a plain C struct; all zeroes is a valid (empty) value.
            remaining: unsafe { std::mem::zeroed() },
            slots: (0..slots)
                .map(|_| AtomicPtr::new(std::ptr::null_mut()))
                .collect(),
            sets: Mutex::new(vec![None; slots]),
        };
        if let Err(e) = g.split() {
            tracing::warn!(
                "GPU {dev}: no SM confinement (green contexts: CUDA error {}); thread limits, SM partitions and the latency-critical SM reserve are refused",
                e.0
            );
        }
        g
    }

    fn split(&mut self) -> GpuResult<()> {
        // A driver older than green contexts (CUDA 12.4, R550) lacks the entry points, and
        // cudarc would panic at the first call: none, as on a GPU whose driver refuses.
        // SAFETY: only looks the symbol up; the library stays loaded (cudarc's static).
        if unsafe { cu::culib().get::<unsafe extern "C" fn()>(b"cuGreenCtxCreate\0") }.is_err() {
            return Err(CuError(code::NOT_SUPPORTED));
        }
        // SAFETY: zeroed C structs are valid out-parameters.
        let mut all: cu::CUdevResource = unsafe { std::mem::zeroed() };
        // SAFETY: valid out-pointer; dev is a device handle.
        ck(unsafe {
            cu::cuDeviceGetDevResource(
                self.dev,
                &mut all,
                cu::CUdevResourceType::CU_DEV_RESOURCE_TYPE_SM,
            )
        })?;
        // SAFETY: the SM member is the one an SM resource holds.
        let sm = unsafe { all.__bindgen_anon_1.sm };
        // MPS's chunk: 8 SMs on Hopper, which is what the device's partition minimum says.
        let chunk = sm.minSmPartitionSize.max(sm.smCoscheduledAlignment).max(1);
        let mut n: u32 = 0;
        // SAFETY: a null result asks only for the group count.
        ck(unsafe {
            cu::cuDevSmResourceSplitByCount(
                std::ptr::null_mut(),
                &mut n,
                &all,
                std::ptr::null_mut(),
                0,
                chunk,
            )
        })?;
        // SAFETY: zeroed C structs are valid out-parameters.
        let mut groups: Vec<cu::CUdevResource> = vec![unsafe { std::mem::zeroed() }; n as usize];
        // SAFETY: groups holds n entries; valid pointers.
        ck(unsafe {
            cu::cuDevSmResourceSplitByCount(
                groups.as_mut_ptr(),
                &mut n,
                &all,
                &mut self.remaining,
                0,
                chunk,
            )
        })?;
        groups.truncate(n as usize);
        self.chunks = SmChunks {
            total: sm.smCount,
            chunk,
            chunks: n,
        };
        self.groups = groups;
        Ok(())
    }

    /// Makes slot `slot` a green context over `set` (replacing what it was).
    pub fn create(&self, slot: usize, set: &SmSet) -> GpuResult<u32> {
        let Some(cell) = self.slots.get(slot) else {
            return Err(CuError(code::INVALID_VALUE));
        };
        if self.chunks.chunks == 0 {
            return Err(CuError(code::NOT_SUPPORTED));
        }
        let mut res: Vec<cu::CUdevResource> = Vec::new();
        for &c in &set.chunks {
            res.push(
                *self
                    .groups
                    .get(c as usize)
                    .ok_or(CuError(code::INVALID_VALUE))?,
            );
        }
        if set.remainder && self.chunks.remainder() > 0 {
            res.push(self.remaining);
        }
        if res.is_empty() {
            return Err(CuError(code::INVALID_VALUE));
        }
        let mut desc: cu::CUdevResourceDesc = std::ptr::null_mut();
        let mut g: cu::CUgreenCtx = std::ptr::null_mut();
        // SAFETY: res holds res.len() SM resources from one split; valid out-pointers.
        unsafe {
            ck(cu::cuDevResourceGenerateDesc(
                &mut desc,
                res.as_mut_ptr(),
                res.len() as u32,
            ))?;
            ck(cu::cuGreenCtxCreate(
                &mut g,
                desc,
                self.dev,
                cu::CUgreenCtxCreate_flags::CU_GREEN_CTX_DEFAULT_STREAM as u32,
            ))?;
        }
        // SAFETY: a zeroed C struct is a valid out-parameter; g was just made.
        let mut got: cu::CUdevResource = unsafe { std::mem::zeroed() };
        // SAFETY: valid green context and out-pointer.
        ck(unsafe {
            cu::cuGreenCtxGetDevResource(
                g,
                &mut got,
                cu::CUdevResourceType::CU_DEV_RESOURCE_TYPE_SM,
            )
        })?;
        // SAFETY: an SM resource's SM member.
        let sms = unsafe { got.__bindgen_anon_1.sm.smCount };
        let old = cell.swap(g, Ordering::AcqRel);
        if !old.is_null() {
            // SAFETY: the old green context of this slot; its streams were dropped first.
            unsafe { cu::cuGreenCtxDestroy(old) };
        }
        self.sets.lock().unwrap_or_else(|e| e.into_inner())[slot] = Some(set.clone());
        Ok(sms)
    }

    /// A new stream of slot `slot`'s green context, at `priority`.
    pub fn stream(&self, slot: usize, priority: i32) -> GpuResult<cu::CUstream> {
        let g = self
            .slots
            .get(slot)
            .map(|c| c.load(Ordering::Acquire))
            .filter(|g| !g.is_null())
            .ok_or(CuError(code::INVALID_HANDLE))?;
        let mut s = std::ptr::null_mut();
        // SAFETY: g is a live green context; non-blocking as every work stream is.
        ck(unsafe { cu::cuGreenCtxStreamCreate(&mut s, g, 1, priority) })?;
        Ok(s)
    }

    /// After the primary context was reset (no client is left): remakes every slot.
    pub fn remake(&self) {
        let sets = self.sets.lock().unwrap_or_else(|e| e.into_inner()).clone();
        for (slot, set) in sets.iter().enumerate() {
            if let Some(set) = set {
                if let Err(e) = self.create(slot, set) {
                    tracing::error!(
                        "confinement slot {slot} after the reset: CUDA error {}",
                        e.0
                    );
                }
            }
        }
    }
}
