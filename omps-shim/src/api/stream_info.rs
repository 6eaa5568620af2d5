//! What a program may ask of a stream besides work: its capture state and its attributes.
//!
//! A stream's capture state is the server's (api/graph.rs); while this process has no
//! capture going, the queries answer "none" here without asking, as the driver does for a
//! stream that is not capturing. PyTorch asks before nearly every copy.

use crate::cuda::*;
use crate::state::capture::CAPTURE_MODE;
use crate::state::entry::{entry, out};
use crate::state::streams::{per_thread, resolve_stream, CUstream};
use omps_ring::wire;
use std::collections::HashMap;
use std::ffi::{c_uint, c_void};
use std::sync::Mutex;

/// Writes stream `s`'s capture status, and its id where asked.
///
/// # Safety
/// `status` and `id` are null or writable.
unsafe fn capture_state(s: CUstream, status: *mut c_uint, id: *mut u64) -> Result<(), CUresult> {
    let (st, cid) = crate::state::capture::capture_info(s)?;
    if !id.is_null() && st != wire::graph::STATUS_NONE {
        // SAFETY: checked non-null; the caller's pointer.
        unsafe { id.write(cid) };
    }
    // SAFETY: the caller's pointer.
    unsafe { out(status, st) }
}

/// # Safety
/// `status` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuStreamIsCapturing(s: CUstream, status: *mut c_uint) -> CUresult {
    // SAFETY: forwarded contract.
    entry(|| unsafe { capture_state(s, status, std::ptr::null_mut()) })
}

/// # Safety
/// `status` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuStreamIsCapturing_ptsz(s: CUstream, status: *mut c_uint) -> CUresult {
    // SAFETY: forwarded contract.
    per_thread(|| unsafe { cuStreamIsCapturing(s, status) })
}

/// CUDA 10's form: status and capture id. The id is only defined while capturing.
///
/// # Safety
/// `status` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCaptureInfo(
    s: CUstream,
    status: *mut c_uint,
    id: *mut u64,
) -> CUresult {
    // SAFETY: forwarded contract.
    entry(|| unsafe { capture_state(s, status, id) })
}

/// # Safety
/// `status` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCaptureInfo_ptsz(
    s: CUstream,
    status: *mut c_uint,
    id: *mut u64,
) -> CUresult {
    // SAFETY: forwarded contract.
    per_thread(|| unsafe { cuStreamGetCaptureInfo(s, status, id) })
}

/// CUDA 11.3's form adds the graph and its current dependencies, defined only while
/// capturing; the dependency count reads 0 otherwise.
///
/// # Safety
/// Out-pointers are null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCaptureInfo_v2(
    s: CUstream,
    status: *mut c_uint,
    id: *mut u64,
    graph: *mut *mut c_void,
    deps: *mut *const c_void,
    num_deps: *mut usize,
) -> CUresult {
    // The graph being built and its open dependencies live in the server: a program gets
    // the handle the capture will end in (user objects and conditional handles and nodes
    // can go into it) and no dependencies; other nodes cannot be added mid-capture.
    entry(|| {
        // SAFETY: the caller's pointers.
        unsafe {
            let mut cid = 0u64;
            capture_state(s, status, &mut cid)?;
            if !id.is_null() && !status.is_null() && *status != wire::graph::STATUS_NONE {
                id.write(cid);
            }
            if !graph.is_null() {
                let active = !status.is_null() && *status == wire::graph::STATUS_ACTIVE;
                let g = if active {
                    crate::state::capture::capture_graph(cid).unwrap_or(0)
                } else {
                    0
                };
                graph.write(g as *mut c_void);
            }
            if !deps.is_null() {
                deps.write(std::ptr::null());
            }
            if !num_deps.is_null() {
                num_deps.write(0);
            }
        }
        Ok(())
    })
}

/// # Safety
/// Out-pointers are null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCaptureInfo_v2_ptsz(
    s: CUstream,
    status: *mut c_uint,
    id: *mut u64,
    graph: *mut *mut c_void,
    deps: *mut *const c_void,
    num_deps: *mut usize,
) -> CUresult {
    // SAFETY: forwarded contract.
    per_thread(|| unsafe { cuStreamGetCaptureInfo_v2(s, status, id, graph, deps, num_deps) })
}

/// CUDA 12.3's form adds edge data.
///
/// # Safety
/// Out-pointers are null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCaptureInfo_v3(
    s: CUstream,
    status: *mut c_uint,
    id: *mut u64,
    graph: *mut *mut c_void,
    deps: *mut *const c_void,
    _edges: *mut *const c_void,
    num_deps: *mut usize,
) -> CUresult {
    // SAFETY: forwarded contract.
    unsafe { cuStreamGetCaptureInfo_v2(s, status, id, graph, deps, num_deps) }
}

/// # Safety
/// Out-pointers are null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCaptureInfo_v3_ptsz(
    s: CUstream,
    status: *mut c_uint,
    id: *mut u64,
    graph: *mut *mut c_void,
    deps: *mut *const c_void,
    edges: *mut *const c_void,
    num_deps: *mut usize,
) -> CUresult {
    // SAFETY: forwarded contract.
    per_thread(|| unsafe { cuStreamGetCaptureInfo_v3(s, status, id, graph, deps, edges, num_deps) })
}

/// Swaps the calling thread's capture mode (global, thread-local, relaxed), which decides
/// what the captures of this client forbid the thread (capture::unsafe_call_allowed).
///
/// # Safety
/// `mode` is null or valid for reads and writes.
#[no_mangle]
pub unsafe extern "C" fn cuThreadExchangeStreamCaptureMode(mode: *mut c_uint) -> CUresult {
    entry(|| {
        if mode.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: checked non-null; the caller's pointer.
        let new = unsafe { mode.read() };
        if new > 2 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: as above.
        unsafe { mode.write(CAPTURE_MODE.replace(new)) };
        Ok(())
    })
}

// ---- stream attributes (CUstreamAttrID, values in a 64-byte CUlaunchAttributeValue)

const ATTR_ACCESS_POLICY_WINDOW: c_uint = 1;
const ATTR_SYNCHRONIZATION_POLICY: c_uint = 3;
const ATTR_PRIORITY: c_uint = 8;
const ATTR_MEM_SYNC_DOMAIN_MAP: c_uint = 9;
const ATTR_MEM_SYNC_DOMAIN: c_uint = 10;
const VALUE_BYTES: usize = 64;

/// Attribute values a program set, per (stream handle, attribute). They are hints about L2
/// persistence, host-wait policy and memory-sync domains: kept and read back, not applied
/// to the server's streams, which other clients' work shares (see docs/design.md).
type AttrMap = HashMap<(usize, c_uint), [u8; VALUE_BYTES]>;
static ATTRS: Mutex<Option<AttrMap>> = Mutex::new(None);

fn known(attr: c_uint) -> bool {
    matches!(
        attr,
        ATTR_ACCESS_POLICY_WINDOW
            | ATTR_SYNCHRONIZATION_POLICY
            | ATTR_PRIORITY
            | ATTR_MEM_SYNC_DOMAIN_MAP
            | ATTR_MEM_SYNC_DOMAIN
    )
}

fn stream_key(s: CUstream) -> Result<usize, CUresult> {
    Ok(resolve_stream(s)?.map_or(0, |st| st as *const _ as usize))
}

fn attr_value(s: CUstream, attr: c_uint) -> Result<[u8; VALUE_BYTES], CUresult> {
    if !known(attr) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut v = [0u8; VALUE_BYTES];
    if attr == ATTR_PRIORITY {
        let p = resolve_stream(s)?.map_or(0, |st| st.priority);
        v[..4].copy_from_slice(&p.to_le_bytes());
        return Ok(v);
    }
    let key = stream_key(s)?;
    let map = ATTRS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(saved) = map.as_ref().and_then(|m| m.get(&(key, attr))) {
        v = *saved;
    } else if attr == ATTR_SYNCHRONIZATION_POLICY {
        v[..4].copy_from_slice(&1u32.to_le_bytes()); // CU_SYNC_POLICY_AUTO
    } else if attr == ATTR_MEM_SYNC_DOMAIN_MAP {
        v[1] = 1; // default domain 0, remote domain 1
    }
    Ok(v)
}

/// # Safety
/// `value` is null or valid for a 64-byte write.
#[no_mangle]
pub unsafe extern "C" fn cuStreamGetAttribute(
    s: CUstream,
    attr: c_uint,
    value: *mut [u8; VALUE_BYTES],
) -> CUresult {
    // SAFETY: the caller's pointer.
    entry(|| unsafe { out(value, attr_value(s, attr)?) })
}

/// # Safety
/// `value` is null or valid for a 64-byte read.
#[no_mangle]
pub unsafe extern "C" fn cuStreamSetAttribute(
    s: CUstream,
    attr: c_uint,
    value: *const [u8; VALUE_BYTES],
) -> CUresult {
    entry(|| {
        if value.is_null() || !known(attr) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if attr == ATTR_PRIORITY {
            // A stream's priority picks its server stream set at creation; changing it
            // later would move queued work between streams.
            crate::unsupported::unsupported("cuStreamSetAttribute(PRIORITY)");
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        }
        let key = stream_key(s)?;
        // SAFETY: checked non-null; the caller's 64-byte value.
        let v = unsafe { value.read() };
        ATTRS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert_with(HashMap::new)
            .insert((key, attr), v);
        Ok(())
    })
}

/// # Safety
/// Both are stream handles from this shim (or the default stream).
#[no_mangle]
pub unsafe extern "C" fn cuStreamCopyAttributes(dst: CUstream, src: CUstream) -> CUresult {
    entry(|| {
        let (from, to) = (stream_key(src)?, stream_key(dst)?);
        let mut guard = ATTRS.lock().unwrap_or_else(|e| e.into_inner());
        let map = guard.get_or_insert_with(HashMap::new);
        let copied: Vec<_> = map
            .iter()
            .filter(|((k, _), _)| *k == from)
            .map(|((_, a), v)| (*a, *v))
            .collect();
        for (a, v) in copied {
            map.insert((to, a), v);
        }
        Ok(())
    })
}

/// # Safety
/// As cuStreamGetAttribute.
#[no_mangle]
pub unsafe extern "C" fn cuStreamGetAttribute_ptsz(
    s: CUstream,
    attr: c_uint,
    value: *mut [u8; VALUE_BYTES],
) -> CUresult {
    // SAFETY: forwarded contract.
    per_thread(|| unsafe { cuStreamGetAttribute(s, attr, value) })
}

/// # Safety
/// As cuStreamSetAttribute.
#[no_mangle]
pub unsafe extern "C" fn cuStreamSetAttribute_ptsz(
    s: CUstream,
    attr: c_uint,
    value: *const [u8; VALUE_BYTES],
) -> CUresult {
    // SAFETY: forwarded contract.
    per_thread(|| unsafe { cuStreamSetAttribute(s, attr, value) })
}

/// # Safety
/// As cuStreamCopyAttributes.
#[no_mangle]
pub unsafe extern "C" fn cuStreamCopyAttributes_ptsz(dst: CUstream, src: CUstream) -> CUresult {
    // SAFETY: forwarded contract.
    per_thread(|| unsafe { cuStreamCopyAttributes(dst, src) })
}

/// No profiler is attached to a client (it owns no context), and with none attached the
/// driver answers success, which is what a program that brackets a region expects.
#[no_mangle]
pub extern "C" fn cuProfilerStart() -> CUresult {
    CUDA_SUCCESS
}

#[no_mangle]
pub extern "C" fn cuProfilerStop() -> CUresult {
    CUDA_SUCCESS
}
