//! User objects: a host object whose destructor runs once the last reference to it
//! (the caller's, a graph's, an executable graph's) is gone. Executable graphs give theirs
//! up after the work they queued: the release follows their last launch on its stream.
//! The destructor runs on the shim's host-function thread, never on the releasing
//! thread, as the driver runs it on one of its own.

use crate::cuda::*;
use crate::handles::{leak, resolve, GraphHandle, GRAPH_MAGIC};
use crate::state::entry::{entry, out};
use std::collections::HashMap;
use std::ffi::{c_uint, c_void};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex};

pub const USER_OBJECT_MAGIC: u32 = 0x7573_6f21;

/// CUhostFn.
pub type Destructor = unsafe extern "C" fn(*mut c_void);

#[repr(C)]
pub struct UserObject {
    magic: AtomicU32,
    refs: AtomicU64,
    ptr: usize,
    destroy: Destructor,
    /// omps' own (a staged copy's buffers, api/staged.rs), not the program's: an
    /// executable graph made anew gives up its old ones.
    internal: bool,
}

pub type CUuserObject = *mut UserObject;

/// Graph or executable graph handle address -> (user object, references it holds).
type Held = HashMap<usize, Vec<(usize, u64)>>;
static HELD: LazyLock<Mutex<Held>> = LazyLock::new(Default::default);

fn held() -> std::sync::MutexGuard<'static, Held> {
    HELD.lock().unwrap_or_else(|e| e.into_inner())
}

fn object(o: CUuserObject) -> Result<&'static UserObject, CUresult> {
    // SAFETY: the caller passed a user object handle, as the API requires; handles stay
    // readable (never freed).
    unsafe { resolve(o as *const UserObject, USER_OBJECT_MAGIC) }
}

fn retain(o: &UserObject, n: u64) {
    o.refs.fetch_add(n, Ordering::AcqRel);
}

/// Drops `n` references; the last one runs the destructor on the host-function thread.
fn release(o: &'static UserObject, n: u64) -> Result<(), CUresult> {
    let before = o
        .refs
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| r.checked_sub(n))
        .map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
    if before == n {
        o.magic.store(0, Ordering::Release);
        let (f, p) = (o.destroy, o.ptr);
        // SAFETY: the destructor the caller gave, with its argument, once.
        let call = unsafe { crate::hostfn::Call::new(move || f(p as *mut c_void)) };
        crate::hostfn::run_detached(call);
    }
    Ok(())
}

/// Drops every reference `held` lists.
fn release_all(list: Vec<(usize, u64)>) {
    for (o, n) in list {
        // SAFETY: recorded from a live object, whose handle stays readable.
        let o = unsafe { &*(o as *const UserObject) };
        let _ = release(o, n);
    }
}

/// # Safety
/// `obj` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuUserObjectCreate(
    obj: *mut CUuserObject,
    ptr: *mut c_void,
    destroy: Option<Destructor>,
    initial: c_uint,
    flags: c_uint,
) -> CUresult {
    // CU_USER_OBJECT_NO_DESTRUCTOR_SYNC, the one flag and a required one.
    const NO_DESTRUCTOR_SYNC: c_uint = 1;
    entry(|| {
        let destroy = destroy.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if obj.is_null() || initial == 0 || flags != NO_DESTRUCTOR_SYNC {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let h = leak(UserObject {
            magic: AtomicU32::new(USER_OBJECT_MAGIC),
            refs: AtomicU64::new(initial as u64),
            ptr: ptr as usize,
            destroy,
            internal: false,
        });
        // SAFETY: checked non-null; the caller's pointer.
        unsafe { out(obj, h) }
    })
}

#[no_mangle]
pub extern "C" fn cuUserObjectRetain(o: CUuserObject, n: c_uint) -> CUresult {
    entry(|| {
        if n == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        retain(object(o)?, n as u64);
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cuUserObjectRelease(o: CUuserObject, n: c_uint) -> CUresult {
    entry(|| {
        if n == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        release(object(o)?, n as u64)
    })
}

fn graph(g: *mut GraphHandle) -> Result<usize, CUresult> {
    // SAFETY: the caller passed a graph handle, as the API requires.
    unsafe { resolve(g as *const GraphHandle, GRAPH_MAGIC) }?;
    Ok(g as usize)
}

/// CU_GRAPH_USER_OBJECT_MOVE: the caller's references pass to the graph.
const MOVE: c_uint = 1;

#[no_mangle]
pub extern "C" fn cuGraphRetainUserObject(
    g: *mut GraphHandle,
    o: CUuserObject,
    n: c_uint,
    flags: c_uint,
) -> CUresult {
    entry(|| {
        let g = graph(g)?;
        let obj = object(o)?;
        if n == 0 || flags & !MOVE != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if flags & MOVE == 0 {
            retain(obj, n as u64);
        }
        let mut h = held();
        let list = h.entry(g).or_default();
        match list.iter_mut().find(|(x, _)| *x == o as usize) {
            Some(e) => e.1 += n as u64,
            None => list.push((o as usize, n as u64)),
        }
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cuGraphReleaseUserObject(
    g: *mut GraphHandle,
    o: CUuserObject,
    n: c_uint,
) -> CUresult {
    entry(|| {
        let g = graph(g)?;
        let obj = object(o)?;
        if n == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        {
            // A graph gives up only references it holds.
            let mut h = held();
            let list = h.get_mut(&g).ok_or(CUDA_ERROR_INVALID_VALUE)?;
            let i = list
                .iter()
                .position(|(x, k)| *x == o as usize && *k >= n as u64)
                .ok_or(CUDA_ERROR_INVALID_VALUE)?;
            list[i].1 -= n as u64;
            if list[i].1 == 0 {
                list.remove(i);
            }
        }
        release(obj, n as u64)
    })
}

/// Graph `from`'s references, taken also by `to` (an executable graph made from it, or a
/// clone).
pub(crate) fn share(from: usize, to: usize) {
    let mut h = held();
    let Some(list) = h.get(&from).cloned() else {
        return;
    };
    for &(o, n) in &list {
        // SAFETY: recorded from a live object, whose handle stays readable.
        retain(unsafe { &*(o as *const UserObject) }, n);
    }
    h.entry(to).or_default().extend(list);
}

/// Graph `g` destroyed: its references go now.
pub(crate) fn graph_gone(g: usize) {
    let list = held().remove(&g);
    release_all(list.unwrap_or_default());
}

/// An object of omps' own, whose `destroy(ptr)` runs once no graph holds it: one
/// reference, held by graph (or executable graph) `g`, which shares it as it shares the
/// program's user objects.
pub(crate) fn hold_internal(g: usize, ptr: usize, destroy: Destructor) {
    let o = leak(UserObject {
        magic: AtomicU32::new(USER_OBJECT_MAGIC),
        refs: AtomicU64::new(1),
        ptr,
        destroy,
        internal: true,
    });
    held().entry(g).or_default().push((o as usize, 1));
}

/// The references graph `g` holds, taken from it (the graph a built graph's instantiation
/// captured is only a vehicle: its references go to the executable graph).
pub(crate) fn take(g: usize) -> Vec<(usize, u64)> {
    held().remove(&g).unwrap_or_default()
}

/// References taken from a graph, held now by `to`.
pub(crate) fn give(to: usize, list: Vec<(usize, u64)>) {
    if !list.is_empty() {
        held().entry(to).or_default().extend(list);
    }
}

/// References taken from a graph that no graph is to hold: released.
pub(crate) fn drop_taken(list: Vec<(usize, u64)>) {
    release_all(list);
}

/// New references to graph `g`'s internal objects (for an executable graph updated to it).
pub(crate) fn internal_of(g: usize) -> Vec<(usize, u64)> {
    let h = held();
    let list: Vec<(usize, u64)> = h
        .get(&g)
        .into_iter()
        .flatten()
        .copied()
        // SAFETY: recorded from a live object, whose handle stays readable.
        .filter(|&(o, _)| unsafe { &*(o as *const UserObject) }.internal)
        .collect();
    for &(o, n) in &list {
        // SAFETY: as above.
        retain(unsafe { &*(o as *const UserObject) }, n);
    }
    list
}

/// Executable graph `e` made anew from its source (an update or new node parameters): the
/// internal objects of the old one go after its last launch, and `new` ones (taken from
/// the new instantiation) take their place. The program's user objects stay.
pub(crate) fn exec_remade(e: &GraphHandle, new: Vec<(usize, u64)>) {
    let key = e as *const GraphHandle as usize;
    let old = {
        let mut h = held();
        let list = h.entry(key).or_default();
        let (internal, keep): (Vec<_>, Vec<_>) = list.drain(..).partition(|&(o, _)| {
            // SAFETY: recorded from a live object, whose handle stays readable.
            unsafe { &*(o as *const UserObject) }.internal
        });
        *list = keep;
        list.extend(new);
        internal
    };
    release_after_last_launch(e, old);
}

/// Executable graph `e` destroyed: its references go once its last launch is done.
pub(crate) fn exec_gone(e: &GraphHandle) {
    let Some(list) = held().remove(&(e as *const GraphHandle as usize)) else {
        return;
    };
    release_after_last_launch(e, list);
}

/// Releases `list` once the last launch of executable graph `e` is done.
fn release_after_last_launch(e: &GraphHandle, list: Vec<(usize, u64)>) {
    if list.is_empty() {
        return;
    }
    let last = e.last_stream.load(Ordering::Acquire);
    if last != crate::handles::NEVER {
        if let Ok((id, dev)) =
            crate::state::streams::stream_dev(last as crate::state::streams::CUstream)
        {
            // SAFETY: the release touches only this shim's books and the host-function
            // thread's queue.
            let call = unsafe { crate::hostfn::Call::new(move || release_all(list)) };
            // The release runs after the last launch; if it cannot be queued, the
            // references stay (a destructor run too early would be worse).
            let _ = crate::hostfn::enqueue(dev, id, call);
            return;
        }
    }
    release_all(list);
}
