//! IPC between clients of one server (omps-server/src/ipc.rs): every client's memory is in
//! the server's one context, so an opened handle is the exporter's own device pointer;
//! the server keeps the allocation alive until its owner and every importer are done.

use crate::cuda::*;
use crate::state::ctx::current_dev;
use crate::state::entry::{entry, live, out};
use omps_ring::wire::{self, IpcCall, IpcHandle, IpcOpen, Op};
use std::collections::HashMap;
use std::ffi::c_uint;
use std::sync::Mutex;

/// Opened handles: pointer -> times opened. The range is known to this process (so copies
/// and kernels may use it) from the first open until the last close, as natively.
static OPENED: Mutex<Option<HashMap<u64, u32>>> = Mutex::new(None);

/// The allocation's size as the server wrote it into the handle (bytes 24..32). Only this
/// process's own range checks use it: the server checks every use against the real size.
fn handle_size(h: &CUipcMemHandle) -> u64 {
    u64::from_le_bytes(h.reserved[24..32].try_into().expect("8 bytes"))
}

/// CUipcMemHandle: 64 opaque bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUipcMemHandle {
    pub reserved: [u8; 64],
}

/// Runs `open` on the current GPU `here`, then on this process's other GPUs until one
/// succeeds: an IPC handle names memory or an event of some GPU, and only that GPU's
/// session knows it (NCCL's legacy transport and simpleIPC open their peer's). The
/// first GPU's error is the answer when none knows the handle.
fn on_any_device<T>(
    c: &crate::conn::Conn,
    here: usize,
    mut open: impl FnMut(usize) -> Result<T, CUresult>,
) -> Result<(T, usize), CUresult> {
    let first = match open(here) {
        Ok(v) => return Ok((v, here)),
        Err(e) => e,
    };
    let devices = (c.snapshot.device_count as usize).min(c.num_devices());
    (0..devices)
        .filter(|&d| d != here)
        .find_map(|d| open(d).ok().map(|v| (v, d)))
        .ok_or(first)
}

fn ipc_call(op: Op, ptr: u64) -> Result<Option<IpcHandle>, CUresult> {
    // The session of the GPU the memory is on (an opened handle may be another GPU's);
    // memory this process does not know is the current GPU's session's to refuse.
    let dev = match crate::state::ranges::range_dev(ptr, 1) {
        Ok(d) => d,
        Err(_) => current_dev()?,
    };
    let c = live()?;
    let mut ch = c.channel();
    ch.call(dev, op, |call| {
        bytemuck::bytes_of(&IpcCall { call, ptr }).to_vec()
    })?;
    Ok((op == Op::IpcGetMemHandle).then(|| ch.reply()))
}

/// # Safety
/// `handle` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuIpcGetMemHandle(handle: *mut CUipcMemHandle, dptr: u64) -> CUresult {
    entry(|| {
        if handle.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let h = ipc_call(Op::IpcGetMemHandle, dptr)?.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: checked non-null; the caller's pointer.
        unsafe { out(handle, CUipcMemHandle { reserved: h.bytes }) }
    })
}

/// # Safety
/// `dptr` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuIpcOpenMemHandle_v2(
    dptr: *mut u64,
    handle: CUipcMemHandle,
    flags: c_uint,
) -> CUresult {
    // CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS is the one flag: memory on another GPU of the
    // process gets its GPU's peer access, as natively.
    const LAZY_ENABLE_PEER_ACCESS: c_uint = 1;
    entry(|| {
        if dptr.is_null() || flags & !LAZY_ENABLE_PEER_ACCESS != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let here = current_dev()?;
        let c = live()?;
        let open_on = |dev: usize| -> Result<u64, CUresult> {
            let mut ch = c.channel();
            ch.call(dev, Op::IpcOpenMemHandle, |call| {
                bytemuck::bytes_of(&IpcOpen {
                    call,
                    handle: IpcHandle {
                        bytes: handle.reserved,
                    },
                })
                .to_vec()
            })?;
            Ok(ch.reply::<wire::U64Reply>().value)
        };
        // The memory may live on another of this process's GPUs (NCCL's legacy transport
        // opens its peer's buffer): each GPU's session knows the handles exported there.
        let (p, dev) = on_any_device(c, here, open_on)?;
        if dev != here && flags & LAZY_ENABLE_PEER_ACCESS != 0 {
            // As the driver: the current context gets access to the memory's GPU.
            crate::state::copies::ask_server(here, dev)?;
        }
        let mut opened = OPENED.lock().unwrap_or_else(|e| e.into_inner());
        let n = opened
            .get_or_insert_with(HashMap::new)
            .entry(p)
            .or_insert(0);
        if *n == 0 {
            crate::state::ranges::add_range(p, handle_size(&handle), dev, false);
        }
        *n += 1;
        drop(opened);
        // SAFETY: checked non-null; the caller's pointer.
        unsafe { out(dptr, p) }
    })
}

/// # Safety
/// As [`cuIpcOpenMemHandle_v2`].
#[no_mangle]
pub unsafe extern "C" fn cuIpcOpenMemHandle(
    dptr: *mut u64,
    handle: CUipcMemHandle,
    flags: c_uint,
) -> CUresult {
    // SAFETY: forwarded contract.
    unsafe { cuIpcOpenMemHandle_v2(dptr, handle, flags) }
}

#[no_mangle]
pub extern "C" fn cuIpcCloseMemHandle(dptr: u64) -> CUresult {
    entry(|| {
        ipc_call(Op::IpcCloseMemHandle, dptr)?;
        let mut opened = OPENED.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = opened.as_mut().and_then(|m| m.get_mut(&dptr)) {
            *n -= 1;
            if *n == 0 {
                opened.as_mut().expect("present").remove(&dptr);
                crate::state::ranges::remove_opened_range(dptr);
            }
        }
        Ok(())
    })
}

/// CUipcEventHandle: 64 opaque bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUipcEventHandle {
    pub reserved: [u8; 64],
}

/// CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS: what an exportable event must be.
const INTERPROCESS_FLAGS: c_uint = 0x2 | 0x4;

/// # Safety
/// `handle` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuIpcGetEventHandle(
    handle: *mut CUipcEventHandle,
    e: crate::state::streams::CUevent,
) -> CUresult {
    entry(|| {
        if handle.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let ev = crate::state::streams::event(e)?;
        if ev.flags & INTERPROCESS_FLAGS != INTERPROCESS_FLAGS {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let c = live()?;
        let mut ch = c.channel();
        ch.call(ev.dev, Op::IpcGetEventHandle, |call| {
            bytemuck::bytes_of(&wire::HandleCall {
                call,
                id: ev.id,
                _pad: 0,
            })
            .to_vec()
        })?;
        let h: IpcHandle = ch.reply();
        // SAFETY: checked non-null; the caller's pointer.
        unsafe { out(handle, CUipcEventHandle { reserved: h.bytes }) }
    })
}

/// # Safety
/// `ph` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuIpcOpenEventHandle(
    ph: *mut crate::state::streams::CUevent,
    handle: CUipcEventHandle,
) -> CUresult {
    use crate::handles::{leak, next_id, Event, EVENT_MAGIC};
    entry(|| {
        if ph.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let here = current_dev()?;
        let id = next_id();
        let c = live()?;
        c.events.take()?;
        let opened = on_any_device(c, here, |dev| {
            c.channel().call(dev, Op::IpcOpenEventHandle, |call| {
                bytemuck::bytes_of(&wire::IpcOpenEvent {
                    call,
                    id,
                    _pad: 0,
                    handle: IpcHandle {
                        bytes: handle.reserved,
                    },
                })
                .to_vec()
            })
        });
        let dev = match opened {
            Ok(((), dev)) => dev,
            Err(e) => {
                c.events.give_back();
                return Err(e);
            }
        };
        let h = leak(Event {
            magic: std::sync::atomic::AtomicU32::new(EVENT_MAGIC),
            id,
            dev,
            flags: INTERPROCESS_FLAGS,
            opened: true,
        });
        // SAFETY: checked non-null; the caller's pointer.
        unsafe { out(ph, h) }
    })
}
