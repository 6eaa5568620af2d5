//! JIT linking (cuLinkCreate, cuLinkAddData, cuLinkAddFile, cuLinkComplete,
//! cuLinkDestroy). The shim collects the inputs and the options that carry values; at
//! cuLinkComplete it uploads them in one container, the server links with the driver, and
//! the shim fetches the image and the logs back. The image stays valid until
//! cuLinkDestroy, as natively; the program's log buffers are filled as the driver fills
//! them (truncated to their size, NUL-terminated), and the log sizes written back.
//! cuModuleLoadDataEx of PTX with options ([`jit_load`]) sends the same container with one
//! PTX input, which the server loads with the driver's own module load.

use crate::cuda::*;
use crate::handles::{leak, resolve, retire};
use crate::state::ctx::current_dev;
use crate::state::entry::{entry, live, out};
use crate::state::modules::upload;
use omps_ring::segment::CHUNKS_PER_CHANNEL;
use omps_ring::wire::{self, link, ChunkCopy, Op};
use std::ffi::{c_char, c_uint, c_void, CStr};
use std::sync::atomic::AtomicU32;
use std::sync::Mutex;

pub const LINK_MAGIC: u32 = 0x6c6e_6b21;

const WALL_TIME: u32 = 2;
const INFO_LOG_BUFFER: u32 = 3;
const INFO_LOG_SIZE: u32 = 4;
const ERROR_LOG_BUFFER: u32 = 5;
const ERROR_LOG_SIZE: u32 = 6;

#[derive(Default)]
struct Inputs {
    options: Vec<link::Opt>,
    pieces: Vec<(u32, String, Vec<u8>)>,
    /// Where the program wants the logs and the wall time: (option, value slot).
    outputs: Vec<(u32, *mut *mut c_void)>,
    log_room: [usize; 2],
    image: Vec<u8>,
}

#[repr(C)]
pub struct LinkState {
    magic: AtomicU32,
    dev: usize,
    inputs: Mutex<Inputs>,
}

// SAFETY: the raw pointers are the program's option slots, used only by calls on this
// state, which the program serialises as the driver requires.
unsafe impl Sync for LinkState {}
// SAFETY: as above.
unsafe impl Send for LinkState {}

fn state<'a>(s: *mut LinkState) -> Result<&'a LinkState, CUresult> {
    // SAFETY: a handle from this shim, as the API requires.
    unsafe { resolve(s, LINK_MAGIC) }
}

/// Splits the program's options into value options (forwarded) and output slots.
///
/// # Safety
/// `opts` and `vals` hold `n` entries, or are null with `n` 0.
unsafe fn read_options(
    n: c_uint,
    opts: *const u32,
    vals: *mut *mut c_void,
    into: &mut Inputs,
) -> Result<(), CUresult> {
    if n > 0 && (opts.is_null() || vals.is_null()) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    for i in 0..n as usize {
        // SAFETY: i < n entries, per the contract.
        let (o, slot) = unsafe { (*opts.add(i), vals.add(i)) };
        match o {
            INFO_LOG_BUFFER | ERROR_LOG_BUFFER | WALL_TIME => into.outputs.push((o, slot)),
            INFO_LOG_SIZE | ERROR_LOG_SIZE => {
                // SAFETY: a size option's value is the size itself, in the slot; the
                // driver writes back how much it filled, so the slot is an output too.
                into.log_room[usize::from(o == ERROR_LOG_SIZE)] = unsafe { *slot } as usize;
                into.outputs.push((o, slot));
            }
            o if link::value_option(o) => into.options.push(link::Opt {
                option: o,
                _pad: 0,
                // SAFETY: a value option's value is in the slot itself.
                value: unsafe { *slot } as u64,
            }),
            _ => {
                crate::unsupported::unsupported("cuLinkCreate with a pointer-valued JIT option");
                return Err(CUDA_ERROR_NOT_SUPPORTED);
            }
        }
    }
    Ok(())
}

/// # Safety
/// As cuLinkCreate's contract.
#[no_mangle]
pub unsafe extern "C" fn cuLinkCreate_v2(
    n: c_uint,
    opts: *mut u32,
    vals: *mut *mut c_void,
    out_state: *mut *mut LinkState,
) -> CUresult {
    entry(|| {
        let mut inputs = Inputs::default();
        // SAFETY: forwarded contract.
        unsafe { read_options(n, opts, vals, &mut inputs)? };
        let s = leak(LinkState {
            magic: AtomicU32::new(LINK_MAGIC),
            dev: current_dev()?,
            inputs: Mutex::new(inputs),
        });
        // SAFETY: the caller's pointer.
        unsafe { out(out_state, s) }
    })
}

fn add(
    s: *mut LinkState,
    kind: c_uint,
    data: Vec<u8>,
    name: *const c_char,
) -> Result<(), CUresult> {
    if kind > 5 || data.is_empty() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let name = if name.is_null() {
        String::new()
    } else {
        // SAFETY: the caller's NUL-terminated name.
        unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned()
    };
    let st = state(s)?;
    st.inputs
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .pieces
        .push((kind, name, data));
    Ok(())
}

/// Per-input options are not forwarded; most programs pass none.
///
/// # Safety
/// As cuLinkAddData's contract: `data` holds `size` bytes.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cuLinkAddData_v2(
    s: *mut LinkState,
    kind: c_uint,
    data: *const c_void,
    size: usize,
    name: *const c_char,
    _n: c_uint,
    _opts: *mut u32,
    _vals: *mut *mut c_void,
) -> CUresult {
    entry(|| {
        if data.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: `size` readable bytes, per the contract.
        let bytes = unsafe { std::slice::from_raw_parts(data as *const u8, size) }.to_vec();
        add(s, kind, bytes, name)
    })
}

/// # Safety
/// As cuLinkAddFile's contract.
#[no_mangle]
pub unsafe extern "C" fn cuLinkAddFile_v2(
    s: *mut LinkState,
    kind: c_uint,
    path: *const c_char,
    _n: c_uint,
    _opts: *mut u32,
    _vals: *mut *mut c_void,
) -> CUresult {
    entry(|| {
        if path.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the caller's NUL-terminated path.
        let p = unsafe { CStr::from_ptr(path) }
            .to_string_lossy()
            .into_owned();
        let mut bytes = std::fs::read(&p).map_err(|_| CUDA_ERROR_FILE_NOT_FOUND)?;
        if kind == 1 {
            bytes.push(0); // PTX files carry no NUL of their own
        }
        add(s, kind, bytes, path)
    })
}

fn container(inputs: &Inputs) -> Vec<u8> {
    link::encode(
        &inputs.options,
        inputs
            .pieces
            .iter()
            .map(|(kind, name, data)| (*kind, name.as_str(), data.as_slice())),
    )
}

/// Links in the server; Ok((result, image and logs)).
fn link_remote(dev: usize, blob: &[u8]) -> Result<(CUresult, wire::LinkReply, Vec<u8>), CUresult> {
    let c = live()?;
    let mut ch = c.channel();
    upload(c, &mut ch, dev, blob)?;
    let r = ch.call(dev, Op::Link, |call| {
        bytemuck::bytes_of(&wire::ModuleLoad {
            call,
            blob_len: blob.len() as u64,
        })
        .to_vec()
    });
    let result = match r {
        Ok(()) => CUDA_SUCCESS,
        Err(e) if e == CUDA_ERROR_MPS_RPC_FAILURE || e == CUDA_ERROR_MPS_CONNECTION_FAILED => {
            return Err(e)
        }
        Err(e) => e,
    };
    let reply = ch.reply::<wire::LinkReply>();
    let total = (reply.image_len + reply.info_len + reply.error_len) as usize;
    let bytes = fetch_output(c, &mut ch, dev, total)?;
    Ok((result, reply, bytes))
}

/// The `total` bytes of this channel's link output, through its staging chunks.
fn fetch_output(
    c: &crate::conn::Conn,
    ch: &mut crate::conn::ChanGuard<'_>,
    dev: usize,
    total: usize,
) -> Result<Vec<u8>, CUresult> {
    let mut bytes = vec![0u8; total];
    let chunk = c.params().chunk_bytes as usize;
    for (i, piece) in bytes.chunks_mut(chunk).enumerate() {
        let k = i % CHUNKS_PER_CHANNEL;
        ch.wait_chunk(k)?;
        let seq = ch.claim_chunk(k);
        let rec = ChunkCopy {
            dev: (i * chunk) as u64,
            channel: ch.idx,
            chunk: k as u32,
            len: piece.len() as u32,
            seq,
            stream: 0,
            _pad: 0,
        };
        c.push(dev, Op::BlobFetch, &[bytemuck::bytes_of(&rec)])?;
        ch.wait_chunk(k)?;
        let (p, _) = ch.chunk_ptr(k);
        // SAFETY: the server filled piece.len() bytes of the chunk before signalling it.
        unsafe { std::ptr::copy_nonoverlapping(p, piece.as_mut_ptr(), piece.len()) };
    }
    Ok(bytes)
}

/// Writes the logs, their sizes and the wall time into the program's option slots, as
/// the driver does: each log truncated to its buffer's room, NUL-terminated, and the
/// size slots given what was written.
///
/// # Safety
/// The slots are the program's, still valid (the API keeps them so); log buffers hold
/// the room their size options gave.
unsafe fn write_outputs(inputs: &Inputs, logs: &[Vec<u8>; 2], ms: f32) {
    for &(o, slot) in &inputs.outputs {
        // SAFETY: per the contract.
        unsafe {
            match o {
                WALL_TIME => *(slot as *mut f32) = ms,
                INFO_LOG_SIZE | ERROR_LOG_SIZE => {
                    let which = usize::from(o == ERROR_LOG_SIZE);
                    let room = inputs.log_room[which];
                    *slot = logs[which].len().min(room.saturating_sub(1)) as *mut c_void;
                }
                INFO_LOG_BUFFER | ERROR_LOG_BUFFER => {
                    let which = usize::from(o == ERROR_LOG_BUFFER);
                    let (buf, room) = (*slot as *mut u8, inputs.log_room[which]);
                    if !buf.is_null() && room > 0 {
                        let text = &logs[which];
                        let k = text.len().min(room - 1);
                        std::ptr::copy_nonoverlapping(text.as_ptr(), buf, k);
                        *buf.add(k) = 0;
                    }
                }
                _ => {}
            }
        }
    }
}

/// # Safety
/// `image` and `size` are null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuLinkComplete(
    s: *mut LinkState,
    image: *mut *mut c_void,
    size: *mut usize,
) -> CUresult {
    entry(|| {
        let st = state(s)?;
        if image.is_null() || size.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut inputs = st.inputs.lock().unwrap_or_else(|e| e.into_inner());
        if inputs.pieces.is_empty() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let t = std::time::Instant::now();
        let (r, reply, mut bytes) = link_remote(st.dev, &container(&inputs))?;
        let ms = t.elapsed().as_secs_f32() * 1e3;
        let n = reply.image_len as usize;
        let logs = [
            bytes[n..n + reply.info_len as usize].to_vec(),
            bytes[n + reply.info_len as usize..].to_vec(),
        ];
        bytes.truncate(n);
        // SAFETY: the program's option slots from cuLinkCreate, still valid for the
        // state's life per the API; log buffers hold the room it gave.
        unsafe { write_outputs(&inputs, &logs, ms) };
        if r != CUDA_SUCCESS {
            return Err(r);
        }
        inputs.image = bytes;
        // SAFETY: checked non-null; the image lives in the state until cuLinkDestroy.
        unsafe {
            image.write(inputs.image.as_mut_ptr() as *mut c_void);
            size.write(inputs.image.len());
        }
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cuLinkDestroy(s: *mut LinkState) -> CUresult {
    entry(|| {
        let st = state(s)?;
        retire(&st.magic, LINK_MAGIC)?;
        // The box stays (handles are never freed); its inputs and image go.
        *st.inputs.lock().unwrap_or_else(|e| e.into_inner()) = Inputs::default();
        Ok(())
    })
}

/// # Safety
/// As cuLinkCreate_v2 (the pre-6.5 name has the same arguments).
#[no_mangle]
pub unsafe extern "C" fn cuLinkCreate(
    n: c_uint,
    opts: *mut u32,
    vals: *mut *mut c_void,
    out_state: *mut *mut LinkState,
) -> CUresult {
    // SAFETY: forwarded contract.
    unsafe { cuLinkCreate_v2(n, opts, vals, out_state) }
}

/// # Safety
/// As cuLinkAddData_v2.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cuLinkAddData(
    s: *mut LinkState,
    kind: c_uint,
    data: *const c_void,
    size: usize,
    name: *const c_char,
    n: c_uint,
    opts: *mut u32,
    vals: *mut *mut c_void,
) -> CUresult {
    // SAFETY: forwarded contract.
    unsafe { cuLinkAddData_v2(s, kind, data, size, name, n, opts, vals) }
}

/// # Safety
/// As cuLinkAddFile_v2.
#[no_mangle]
pub unsafe extern "C" fn cuLinkAddFile(
    s: *mut LinkState,
    kind: c_uint,
    path: *const c_char,
    n: c_uint,
    opts: *mut u32,
    vals: *mut *mut c_void,
) -> CUresult {
    // SAFETY: forwarded contract.
    unsafe { cuLinkAddFile_v2(s, kind, path, n, opts, vals) }
}

/// PTX with JIT options, as cuModuleLoadDataEx gets it: the server's driver loads it
/// with those options (op ModuleLoadJit), compiling it as a whole program as natively (a
/// one-input link would compile relocatable code, which PTX as old as the samples'
/// `.version 1.4` cannot be), and the logs, their sizes and the wall time come back into
/// the program's slots, on failure too. `parse` reads the function table from chunk 0.
///
/// # Safety
/// `ptx` is NUL-terminated PTX; `opts` and `vals` hold `n` entries.
pub(crate) unsafe fn jit_load<T>(
    dev: usize,
    ptx: &[u8],
    n: c_uint,
    opts: *mut u32,
    vals: *mut *mut c_void,
    parse: impl FnOnce(&[u8]) -> Option<T>,
) -> Result<T, CUresult> {
    let mut inputs = Inputs::default();
    // SAFETY: forwarded contract.
    unsafe { read_options(n, opts, vals, &mut inputs)? };
    inputs.pieces.push((1, String::new(), ptx.to_vec()));
    let blob = container(&inputs);
    let c = live()?;
    let t = std::time::Instant::now();
    let mut ch = c.channel();
    upload(c, &mut ch, dev, &blob)?;
    // The function table lands in chunk 0: make sure no transfer still uses it.
    ch.wait_chunk(0)?;
    let r = ch.call(dev, Op::ModuleLoadJit, |call| {
        bytemuck::bytes_of(&wire::ModuleLoad {
            call,
            blob_len: blob.len() as u64,
        })
        .to_vec()
    });
    let ms = t.elapsed().as_secs_f32() * 1e3;
    let loaded = match r {
        Ok(()) => {
            let (p, cap) = ch.chunk_ptr(0);
            // SAFETY: the server wrote the function table into chunk 0 before answering.
            let table = unsafe { std::slice::from_raw_parts(p as *const u8, cap) };
            Ok(parse(table).ok_or(CUDA_ERROR_INVALID_IMAGE)?)
        }
        Err(e) if e == CUDA_ERROR_MPS_RPC_FAILURE || e == CUDA_ERROR_MPS_CONNECTION_FAILED => {
            return Err(e)
        }
        Err(e) => Err(e),
    };
    let reply = ch.reply::<wire::LinkReply>();
    let info = reply.info_len as usize;
    let mut bytes = fetch_output(c, &mut ch, dev, info + reply.error_len as usize)?;
    let error = bytes.split_off(info);
    // SAFETY: the program's option slots, valid for this call; log buffers hold the room
    // their size options gave.
    unsafe { write_outputs(&inputs, &[bytes, error], ms) };
    loaded
}
