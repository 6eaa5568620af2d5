//! The records of one piece of work, built field by field from what the shim knows of
//! it (a launch's function and shape, a copy's kinds and size, the ids CUPTI gives a
//! device, context and stream), and where each kind keeps its times. Split from
//! activity.rs, which decides when records are made and delivered.

use super::abi::{self, kind, off, Record};
use crate::cuda::*;
use crate::handles::Function;
use crate::state::profile::{self, Work};
use crate::state::streams::CUstream;
use std::collections::HashMap;
use std::ffi::CStr;
use std::sync::atomic::Ordering;
use std::sync::Mutex;

pub(super) fn thread_id() -> u32 {
    // SAFETY: gettid takes nothing and cannot fail.
    unsafe { libc::gettid() as u32 }
}

pub(super) fn context_id(dev: usize) -> u32 {
    dev as u32 + 1
}

pub(super) fn stream_id(stream: CUstream) -> u32 {
    let mut id = 0u64;
    // SAFETY: a valid out-pointer.
    let r = profile::quiet(|| unsafe { crate::api::exec::cuStreamGetId(stream, &mut id) });
    if r == CUDA_SUCCESS {
        id as u32
    } else {
        abi::INVALID_ID
    }
}

/// Kernel names live for the process: a record's name pointer must outlive the trace.
pub(super) fn interned(name: &CStr) -> u64 {
    static NAMES: Mutex<Option<HashMap<Vec<u8>, &'static CStr>>> = Mutex::new(None);
    let mut g = NAMES.lock().unwrap_or_else(|p| p.into_inner());
    let map = g.get_or_insert_with(HashMap::new);
    let s = map
        .entry(name.to_bytes().to_vec())
        .or_insert_with(|| Box::leak(name.to_owned().into_boxed_c_str()));
    s.as_ptr() as u64
}

pub(super) fn work_record(
    work: &Work,
    k: u32,
    dev: usize,
    stream: CUstream,
    correlation: u32,
) -> Record {
    let (devf, ctxf, streamf, corrf, mut r) = match *work {
        Work::Kernel {
            func,
            grid,
            block,
            dynamic_shared,
            ..
        } => {
            let mut r = Record::new(k);
            kernel_fields(&mut r, Some(func), grid, block, dynamic_shared);
            use off::kernel::*;
            (DEVICE_ID, CONTEXT_ID, STREAM_ID, CORRELATION_ID, r)
        }
        Work::Copy {
            copy_kind,
            src_kind,
            dst_kind,
            bytes,
            asynchronous,
        } => {
            use off::memcpy::*;
            let mut r = Record::new(kind::MEMCPY);
            r.u8(COPY_KIND, copy_kind)
                .u8(SRC_KIND, src_kind)
                .u8(DST_KIND, dst_kind)
                .u8(FLAGS, asynchronous as u8)
                .u64(BYTES, bytes);
            (DEVICE_ID, CONTEXT_ID, STREAM_ID, CORRELATION_ID, r)
        }
        Work::Memset { value, bytes } => {
            use off::memset::*;
            let mut r = Record::new(kind::MEMSET);
            r.u32(VALUE, value)
                .u64(BYTES, bytes)
                .u16(MEMORY_KIND, abi::memory_kind::DEVICE as u16);
            (DEVICE_ID, CONTEXT_ID, STREAM_ID, CORRELATION_ID, r)
        }
    };
    r.u32(devf, dev as u32)
        .u32(ctxf, context_id(dev))
        .u32(streamf, stream_id(stream))
        .u32(corrf, correlation);
    r
}

/// A kernel record's own fields: shape, shared memory, registers where known, name
/// (`func` None: a graph node whose function this process does not know).
pub(super) fn kernel_fields(
    r: &mut Record,
    func: Option<&Function>,
    grid: [u32; 3],
    block: [u32; 3],
    shared: u32,
) {
    use off::kernel::*;
    static GRID_IDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    for i in 0..3 {
        r.u32(GRID + 4 * i, grid[i]).u32(BLOCK + 4 * i, block[i]);
    }
    r.u32(DYNAMIC_SHARED, shared)
        .u64(GRID_ID, GRID_IDS.fetch_add(1, Ordering::Relaxed) + 1);
    match func {
        Some(f) => {
            r.u32(STATIC_SHARED, f.static_shared as u32)
                .u64(NAME, interned(&f.name))
                .u16(REGISTERS_PER_THREAD, f.attrs.known(4).unwrap_or(0) as u16);
        }
        None => {
            r.u64(
                NAME,
                interned(c"(a graph node's kernel this process did not load)"),
            );
        }
    }
}

/// A kernel record's device, context, stream and correlation.
pub(super) fn ids_fields(r: &mut Record, dev: usize, stream: CUstream, correlation: u32) {
    use off::kernel::*;
    r.u32(DEVICE_ID, dev as u32)
        .u32(CONTEXT_ID, context_id(dev))
        .u32(STREAM_ID, stream_id(stream))
        .u32(CORRELATION_ID, correlation);
}

pub(super) fn times_of(k: u32) -> &'static [usize] {
    match k {
        kind::CONCURRENT_KERNEL | kind::KERNEL => &off::kernel::TIMES,
        kind::MEMCPY => &off::memcpy::TIMES,
        kind::MEMSET => &off::memset::TIMES,
        kind::DRIVER | kind::RUNTIME => &off::api::TIMES,
        kind::SYNCHRONIZATION => &off::sync::TIMES,
        _ => &[],
    }
}

/// A graph's memcpy node as CUPTI records it, from its sides' CUmemorytype (1 host, 2
/// device, 3 array, 4 unified): host memory in a graph is page-locked.
pub(super) fn graph_copy(src: u8, dst: u8, bytes: u64) -> Work<'static> {
    use abi::{copy_kind as ck, memory_kind as mk};
    let side = |t: u8| match t {
        1 => (b'h', mk::PINNED),
        3 => (b'a', ARRAY),
        _ => (b'd', mk::DEVICE),
    };
    let ((s, src_kind), (d, dst_kind)) = (side(src), side(dst));
    let copy_kind = match (s, d) {
        (b'h', b'd') => ck::HTOD,
        (b'd', b'h') => ck::DTOH,
        (b'd', b'd') => ck::DTOD,
        (b'h', b'h') => HTOH,
        (b'h', b'a') => HTOA,
        (b'a', b'h') => ATOH,
        (b'a', b'a') => ATOA,
        (b'a', b'd') => ATOD,
        _ => DTOA,
    };
    Work::Copy {
        copy_kind,
        src_kind,
        dst_kind,
        bytes,
        asynchronous: true,
    }
}

/// `CUpti_ActivityMemcpyKind` and `CUpti_ActivityMemoryKind` values only graph copies use.
const HTOA: u8 = 3;
const ATOH: u8 = 4;
const ATOA: u8 = 5;
const ATOD: u8 = 6;
const DTOA: u8 = 7;
const HTOH: u8 = 9;
const ARRAY: u8 = 4;
