//! Loaded modules and libraries: uploading an image through the staging chunks, parsing
//! the server's function table, and which function a handle names on a device (a
//! library's kernel resolves to its module there). The module entry points are
//! api/module.rs.

use super::ctx::current_dev;
use super::entry::live;
use super::streams::{function, CUfunction};
use crate::cuda::*;
use crate::handles::{leak, resolve, Function, LibraryState, Module, FUNC_MAGIC, MODULE_MAGIC};
use omps_ring::wire::{self, ChunkCopy, FunctionDesc, ModuleLoad, ModuleReply, Op, ParamDesc};
use std::ffi::CString;
use std::sync::atomic::AtomicU32;

pub type CUmodule = *mut Module;

pub(crate) fn load_on(dev: usize, image: &[u8]) -> Result<CUmodule, CUresult> {
    let c = live()?;
    let prints = crate::printf::note_image(c, dev, image);
    let mut ch = c.channel();
    upload(c, &mut ch, dev, image)?;
    // The answer lands in chunk 0: make sure no transfer still uses it.
    ch.wait_chunk(0)?;
    ch.call(dev, Op::ModuleLoad, |call| {
        bytemuck::bytes_of(&ModuleLoad {
            call,
            blob_len: image.len() as u64,
        })
        .to_vec()
    })?;
    let (p, cap) = ch.chunk_ptr(0);
    // SAFETY: the server wrote the reply into chunk 0 before completing the call.
    let reply = unsafe { std::slice::from_raw_parts(p as *const u8, cap) };
    parse_module(reply, dev, prints).ok_or(CUDA_ERROR_INVALID_IMAGE)
}

/// Uploads `bytes` into the channel's blob in the server, through its staging chunks.
pub(crate) fn upload(
    c: &crate::conn::Conn,
    ch: &mut crate::conn::ChanGuard<'_>,
    dev: usize,
    bytes: &[u8],
) -> Result<(), CUresult> {
    let chunk = c.params().chunk_bytes as usize;
    for (i, piece) in bytes.chunks(chunk).enumerate() {
        let k = i % omps_ring::segment::CHUNKS_PER_CHANNEL;
        ch.wait_chunk(k)?;
        let (p, _) = ch.chunk_ptr(k);
        // SAFETY: the chunk holds `chunk` >= piece.len() bytes and is ours until queued.
        unsafe { std::ptr::copy_nonoverlapping(piece.as_ptr(), p, piece.len()) };
        let seq = ch.claim_chunk(k);
        let rec = ChunkCopy {
            dev: 0,
            channel: ch.idx,
            chunk: k as u32,
            len: piece.len() as u32,
            seq,
            stream: 0,
            _pad: 0,
        };
        c.push(dev, Op::BlobAppend, &[bytemuck::bytes_of(&rec)])?;
    }
    Ok(())
}

/// Every function loaded, by GPU and the server's id (which a session never reuses): the
/// kernels of a graph replay a profiler traces come back from the server as ids.
/// Held as addresses: a Function's module pointer keeps it from being Sync, though it
/// is never freed and never changes after load.
static BY_ID: std::sync::Mutex<Option<std::collections::HashMap<(usize, u32), usize>>> =
    std::sync::Mutex::new(None);

/// The function the server knows as `id` on GPU `dev`.
pub(crate) fn function_by_id(dev: usize, id: u32) -> Option<&'static Function> {
    let g = BY_ID.lock().unwrap_or_else(|p| p.into_inner());
    let a = *g.as_ref()?.get(&(dev, id))?;
    // SAFETY: an address parse_module took from a leaked Function, never freed.
    Some(unsafe { &*(a as *const Function) })
}

pub(crate) fn parse_module(r: &[u8], dev: usize, prints: bool) -> Option<CUmodule> {
    let head: ModuleReply = wire::get(r)?;
    let total = (head.total_len as usize).min(r.len());
    let r = &r[..total];
    let descs_at = std::mem::size_of::<ModuleReply>();
    let fd = std::mem::size_of::<FunctionDesc>();
    let params_at = descs_at + head.num_functions as usize * fd;
    let module = leak(Module {
        magic: AtomicU32::new(0),
        id: head.module,
        dev,
        functions: Vec::new(),
        prints,
        library: Default::default(),
    });
    let mut functions = Vec::new();
    for i in 0..head.num_functions as usize {
        let d: FunctionDesc = wire::get(r.get(descs_at + i * fd..)?)?;
        let name = r.get(d.name_offset as usize..(d.name_offset + d.name_len) as usize)?;
        let params = (0..d.num_params as usize)
            .map(|j| {
                wire::get::<ParamDesc>(r.get(params_at + (d.first_param as usize + j) * 8..)?)
                    .map(|p| (p.offset, p.size))
            })
            .collect::<Option<Vec<_>>>()?;
        let args_size = params
            .iter()
            .map(|&(o, s)| (o + s) as usize)
            .max()
            .unwrap_or(0);
        let f = Function {
            magic: AtomicU32::new(FUNC_MAGIC),
            id: d.func,
            dev,
            name: CString::new(name).ok()?,
            params,
            args_size,
            max_threads_per_block: d.max_threads_per_block,
            static_shared: d.static_shared,
            max_dynamic_shared: d.max_dynamic_shared.into(),
            module,
            attrs: Default::default(),
        };
        // SAFETY: freshly leaked, never freed.
        functions.push(unsafe { &*leak(f) });
    }
    {
        let mut by_id = BY_ID.lock().unwrap_or_else(|p| p.into_inner());
        let map = by_id.get_or_insert_with(std::collections::HashMap::new);
        for &f in &functions {
            map.insert((dev, f.id), f as *const Function as usize);
        }
    }
    // SAFETY: module was just leaked and is not yet shared.
    unsafe {
        (*module).functions = functions;
        (*module)
            .magic
            .store(MODULE_MAGIC, std::sync::atomic::Ordering::Release);
    }
    Some(module)
}

pub(crate) fn module<'a>(m: CUmodule) -> Result<&'a Module, CUresult> {
    // SAFETY: the caller passed a module handle, as the API requires.
    unsafe { resolve(m as *const Module, MODULE_MAGIC) }
}

/// The device a context-independent handle (a library, a kernel) acts on now: the
/// current context's, or `own` when there is none.
pub(crate) fn here(own: usize) -> Result<usize, CUresult> {
    match current_dev() {
        Err(CUDA_ERROR_INVALID_CONTEXT) => Ok(own),
        r => r,
    }
}

/// The module of `m`'s library on `dev`, loaded there at its first use, as the driver
/// loads a library into each context that uses it. A plain module is itself (it lives in
/// one context; a use elsewhere fails where the devices are compared).
pub(crate) fn module_on(m: &'static Module, dev: usize) -> Result<&'static Module, CUresult> {
    let Some(lib) = m.library.get().filter(|_| m.dev != dev) else {
        return Ok(m);
    };
    crate::state::device::device(dev as CUdevice)?;
    let mut st = lib.state.lock().unwrap_or_else(|e| e.into_inner());
    let LibraryState { image, on } = &mut *st;
    let image = image.as_deref().ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    let slot = on.get_mut(dev).ok_or(CUDA_ERROR_INVALID_DEVICE)?;
    if *slot == 0 {
        let loaded = load_on(dev, image)?;
        // SAFETY: just made by parse_module, live and never freed.
        let _ = unsafe { &*loaded }.library.set(lib.clone());
        *slot = loaded as usize;
    }
    module(*slot as CUmodule)
}

/// Function `func` as it runs on `dev`: a library's kernel resolves to its module there.
pub(crate) fn resolve_on(
    func: &'static Function,
    dev: usize,
) -> Result<&'static Function, CUresult> {
    if func.dev == dev {
        return Ok(func);
    }
    // SAFETY: a live function's module is a leaked box, never freed.
    let md = module_on(unsafe { &*func.module }, dev)?;
    md.functions
        .iter()
        .copied()
        .find(|x| x.name == func.name)
        .ok_or(CUDA_ERROR_NOT_FOUND)
}

/// Whether `func` belongs to a library another device may load (a process of several
/// devices): only then does the device a launch runs on matter to which function runs.
pub(crate) fn in_library(func: &Function) -> bool {
    // SAFETY: a live function's module is a leaked box, never freed.
    unsafe { &*func.module }.library.get().is_some()
}

/// Function `f` as it runs on `dev`.
pub(crate) fn function_on(f: CUfunction, dev: usize) -> Result<&'static Function, CUresult> {
    let func = function(f)?;
    if !in_library(func) {
        return Ok(func);
    }
    resolve_on(func, dev)
}

/// Function `f` as it runs in the current context (a process of one device, or a plain
/// module's function: itself, with no look at the context).
pub(crate) fn function_here(f: CUfunction) -> Result<&'static Function, CUresult> {
    let func = function(f)?;
    if !in_library(func) {
        return Ok(func);
    }
    resolve_on(func, here(func.dev)?)
}
