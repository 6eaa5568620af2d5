//! cuGetExportTable: the private tables the CUDA runtime asks the driver for. Their
//! behaviour is documented by the ZLUDA and Lupine projects and was checked against driver
//! 580 (slot counts, results); this is our own implementation of those facts.
//!
//! Slot 0 of every table but context-local storage holds the table's size in bytes. Slots
//! cudart is not known to call get a stub that names itself once; the integrity check's
//! answer covers the addresses of two tables and one function, so all are statics.

use super::table::{note_unknown, size, Table};
use crate::cuda::*;
use crate::integrity;
use crate::state::cls::{cls_delete, cls_get, cls_put, ctx_or_current};
use crate::state::ctx::{current_ctx, primary_handle};
use std::collections::HashSet;
use std::ffi::{c_uint, c_void};
use std::sync::Mutex;

macro_rules! stubs {
    ($($name:ident = $what:literal => $ret:expr;)*) => {$(
        extern "C" fn $name() -> CUresult {
            note_unknown($what);
            $ret
        }
    )*};
}

stubs! {
    cudart_3 = "cudart[3]" => CUDA_ERROR_NOT_SUPPORTED;
    cudart_4 = "cudart[4]" => CUDA_ERROR_NOT_SUPPORTED;
    cudart_5 = "cudart[5]" => CUDA_ERROR_NOT_SUPPORTED;
    cudart_9 = "cudart[9]" => CUDA_ERROR_NOT_SUPPORTED;
    cudart_11 = "cudart[11]" => CUDA_ERROR_NOT_SUPPORTED;
    hooks_other = "tools hooks[1,3,4,5]" => CUDA_SUCCESS;
    tls_1 = "tools TLS[1]" => CUDA_ERROR_NOT_SUPPORTED;
    checks_other = "context checks[1,4..14]" => CUDA_ERROR_NOT_SUPPORTED;
    integrity_2 = "integrity[2]" => CUDA_ERROR_NOT_SUPPORTED;
}

// ---- 6bd5fb6c: cudart interface

unsafe fn load_fatbin(out: *mut *mut c_void, image: *const c_void) -> CUresult {
    // SAFETY: forwarded contract: `image` is a fatbin or its wrapper.
    unsafe { crate::api::module::cuModuleLoadData(out as *mut _, image) }
}

unsafe extern "C" fn get_module_from_cubin(
    out: *mut *mut c_void,
    wrapper: *const c_void,
) -> CUresult {
    if out.is_null() || wrapper.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: cudart passes a fatbin wrapper; the image reader follows its data pointer.
    unsafe { load_fatbin(out, wrapper) }
}

unsafe extern "C" fn get_module_from_cubin_ext1(
    out: *mut *mut c_void,
    wrapper: *const c_void,
    a3: *mut c_void,
    a4: *mut c_void,
    a5: c_uint,
) -> CUresult {
    if !a3.is_null() || !a4.is_null() || a5 != 0 {
        note_unknown("cudart[6] with extra arguments");
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    // SAFETY: as get_module_from_cubin.
    unsafe { get_module_from_cubin(out, wrapper) }
}

unsafe extern "C" fn get_module_from_cubin_ext2(
    header: *const c_void,
    out: *mut *mut c_void,
    a3: *mut c_void,
    a4: *mut c_void,
    a5: c_uint,
) -> CUresult {
    if !a3.is_null() || !a4.is_null() || a5 != 0 {
        note_unknown("cudart[8] with extra arguments");
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    if out.is_null() || header.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: a fatbin header, per the table's contract.
    unsafe { load_fatbin(out, header) }
}

/// The device's primary context, neither retained nor made current (as the driver does).
unsafe extern "C" fn get_primary_context(pctx: *mut *mut c_void, dev: CUdevice) -> CUresult {
    if pctx.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if let Err(e) = crate::state::device::device(dev) {
        return e;
    }
    // SAFETY: checked non-null; cudart's out-pointer.
    unsafe { pctx.write(primary_handle(dev as usize)) };
    CUDA_SUCCESS
}

extern "C" fn cudart_7(_: usize) {}

extern "C" fn load_compilers() -> CUresult {
    CUDA_SUCCESS
}

pub static CUDART_INTERFACE: Table<13> = Table([
    size(13),
    get_module_from_cubin as *const c_void,
    get_primary_context as *const c_void,
    cudart_3 as *const c_void,
    cudart_4 as *const c_void,
    cudart_5 as *const c_void,
    get_module_from_cubin_ext1 as *const c_void,
    cudart_7 as *const c_void,
    get_module_from_cubin_ext2 as *const c_void,
    cudart_9 as *const c_void,
    std::ptr::null(),
    cudart_11 as *const c_void,
    load_compilers as *const c_void,
]);

// ---- a094798c: tools runtime callback hooks

static HOOK_BUF_1: [u64; 1024] = [0; 1024];
static HOOK_BUF_2: [u64; 16] = [0; 16];

/// Hands out a static buffer and its size, as the driver's hooks [2] and [6] do.
///
/// # Safety
/// `ptr` and `size` are null or writable.
unsafe fn hook_buffer(buf: *const c_void, len: usize, ptr: *mut *const c_void, size: *mut usize) {
    // SAFETY: cudart's out-pointers (checked for null).
    unsafe {
        if !ptr.is_null() {
            ptr.write(buf);
        }
        if !size.is_null() {
            size.write(len);
        }
    }
}

unsafe extern "C" fn hook_buffer_1(ptr: *mut *const c_void, size: *mut usize) {
    // SAFETY: forwarded contract.
    unsafe { hook_buffer(HOOK_BUF_1.as_ptr() as *const c_void, 1024, ptr, size) }
}

unsafe extern "C" fn hook_buffer_2(ptr: *mut *const c_void, size: *mut usize) {
    // SAFETY: forwarded contract.
    unsafe { hook_buffer(HOOK_BUF_2.as_ptr() as *const c_void, 14, ptr, size) }
}

pub static TOOLS_HOOKS: Table<7> = Table([
    size(7),
    hooks_other as *const c_void,
    hook_buffer_1 as *const c_void,
    hooks_other as *const c_void,
    hooks_other as *const c_void,
    hooks_other as *const c_void,
    hook_buffer_2 as *const c_void,
]);

// ---- 42d85a81: tools TLS

unsafe extern "C" fn tls_current_context(out: *mut *mut c_void) -> CUresult {
    if !out.is_null() {
        // SAFETY: cudart's out-pointer.
        unsafe { out.write(current_ctx()) };
    }
    CUDA_SUCCESS
}

pub static TOOLS_TLS: Table<3> = Table([
    size(3),
    tls_1 as *const c_void,
    tls_current_context as *const c_void,
]);

// ---- c693336e: context-local storage (no size header). `get` runs on every runtime
// call, so a thread caches its last answer until a put or delete changes the generation.

pub static CONTEXT_LOCAL_STORAGE: Table<4> = Table([
    cls_put as *const c_void,
    cls_delete as *const c_void,
    cls_get as *const c_void,
    std::ptr::null(),
]);

// ---- 263e8860: context checks

unsafe extern "C" fn context_check(
    ctx: *mut c_void,
    result1: *mut u32,
    _result2: *mut *const c_void,
) -> CUresult {
    if let Err(e) = ctx_or_current(ctx) {
        return e;
    }
    if !result1.is_null() {
        // SAFETY: cudart's out-pointer.
        unsafe { result1.write(0) };
    }
    CUDA_SUCCESS
}

extern "C" fn check_fn3() -> u32 {
    0
}

pub static CONTEXT_CHECKS: Table<15> = Table([
    size(15),
    checks_other as *const c_void,
    context_check as *const c_void,
    check_fn3 as *const c_void,
    checks_other as *const c_void,
    checks_other as *const c_void,
    checks_other as *const c_void,
    checks_other as *const c_void,
    checks_other as *const c_void,
    checks_other as *const c_void,
    checks_other as *const c_void,
    checks_other as *const c_void,
    checks_other as *const c_void,
    checks_other as *const c_void,
    checks_other as *const c_void,
]);

// ---- d4082055: integrity check

unsafe extern "C" fn integrity_check(
    version: u32,
    unix_seconds: u64,
    out: *mut [u64; 2],
) -> CUresult {
    if out.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let conn = crate::conn::conn().ok();
    let devices: Vec<integrity::DeviceId> = conn
        .map(|c| {
            let snap = &c.snapshot;
            snap.devices[..(snap.device_count as usize).min(c.num_devices())]
                .iter()
                .map(|d| integrity::DeviceId {
                    uuid: d.uuid,
                    pci_domain: d.attribute(50).unwrap_or(0),
                    pci_bus: d.attribute(33).unwrap_or(0),
                    pci_device: d.attribute(34).unwrap_or(0),
                })
                .collect()
        })
        .unwrap_or_default();
    let cx = integrity::Context {
        driver_version: conn.map_or(13000, |c| c.snapshot.driver_version as u32),
        pid: std::process::id(),
        // SAFETY: pthread_self has no preconditions.
        thread: unsafe { libc::pthread_self() } as u32,
        cudart_table: &CUDART_INTERFACE as *const _ as usize,
        integrity_table: &INTEGRITY as *const _ as usize,
        check_fn: integrity_check as *const c_void as usize,
        devices: &devices,
    };
    // SAFETY: checked non-null; cudart's 16-byte out buffer.
    unsafe { out.write(integrity::answer(version, unix_seconds, &cx)) };
    CUDA_SUCCESS
}

pub static INTEGRITY: Table<3> = Table([
    size(3),
    integrity_check as *const c_void,
    integrity_2 as *const c_void,
]);

// ---- the lookup

const UUIDS: [([u8; 16], &str); 10] = [
    (
        [
            0x6b, 0xd5, 0xfb, 0x6c, 0x5b, 0xf4, 0xe7, 0x4a, 0x89, 0x87, 0xd9, 0x39, 0x12, 0xfd,
            0x9d, 0xf9,
        ],
        "cudart",
    ),
    (
        [
            0xa0, 0x94, 0x79, 0x8c, 0x2e, 0x74, 0x2e, 0x74, 0x93, 0xf2, 0x08, 0x00, 0x20, 0x0c,
            0x0a, 0x66,
        ],
        "hooks",
    ),
    (
        [
            0x42, 0xd8, 0x5a, 0x81, 0x23, 0xf6, 0xcb, 0x47, 0x82, 0x98, 0xf6, 0xe7, 0x8a, 0x3a,
            0xec, 0xdc,
        ],
        "tls",
    ),
    (
        [
            0xc6, 0x93, 0x33, 0x6e, 0x11, 0x21, 0xdf, 0x11, 0xa8, 0xc3, 0x68, 0xf3, 0x55, 0xd8,
            0x95, 0x93,
        ],
        "cls",
    ),
    (
        [
            0x26, 0x3e, 0x88, 0x60, 0x7c, 0xd2, 0x61, 0x43, 0x92, 0xf6, 0xbb, 0xd5, 0x00, 0x6d,
            0xfa, 0x7e,
        ],
        "checks",
    ),
    (
        [
            0xd4, 0x08, 0x20, 0x55, 0xbd, 0xe6, 0x70, 0x4b, 0x8d, 0x34, 0xba, 0x12, 0x3c, 0x66,
            0xe1, 0xf2,
        ],
        "integrity",
    ),
    (
        [
            0x21, 0x31, 0x8c, 0x60, 0x97, 0x14, 0x32, 0x48, 0x8c, 0xa6, 0x41, 0xff, 0x73, 0x24,
            0xc8, 0xf2,
        ],
        "tools context",
    ),
    (
        [
            0x17, 0x34, 0xdc, 0x26, 0x80, 0x0d, 0x47, 0x45, 0x87, 0x26, 0xc0, 0xf1, 0xe7, 0xdd,
            0x8b, 0xca,
        ],
        "cluster",
    ),
    (
        [
            0x6e, 0x16, 0x3f, 0xbe, 0xb9, 0x58, 0x44, 0x4d, 0x83, 0x5c, 0xe1, 0x82, 0xaf, 0xf1,
            0x99, 0x1e,
        ],
        "tools module",
    ),
    (
        [
            0xf8, 0xcf, 0xf9, 0x51, 0x21, 0x46, 0x8b, 0x4e, 0xb9, 0xe2, 0xfb, 0x46, 0x9e, 0x7c,
            0x0d, 0xd9,
        ],
        "runtime first",
    ),
];

fn table(uuid: &[u8; 16]) -> Option<*const c_void> {
    let name = UUIDS.iter().find(|(u, _)| u == uuid)?.1;
    Some(match name {
        "cudart" => &CUDART_INTERFACE as *const _ as *const c_void,
        "hooks" => &TOOLS_HOOKS as *const _ as *const c_void,
        "tls" => &TOOLS_TLS as *const _ as *const c_void,
        "cls" => &CONTEXT_LOCAL_STORAGE as *const _ as *const c_void,
        "checks" => &CONTEXT_CHECKS as *const _ as *const c_void,
        "tools context" => &super::tools::TOOLS_CONTEXT as *const _ as *const c_void,
        "cluster" => &super::tools::CLUSTER as *const _ as *const c_void,
        "tools module" => &super::tools::TOOLS_MODULE as *const _ as *const c_void,
        "runtime first" => &super::tools::RUNTIME_FIRST as *const _ as *const c_void,
        _ => &INTEGRITY as *const _ as *const c_void,
    })
}

/// Tables the driver has that omps refuses on purpose, because the caller does better
/// without them; they are refused without a word (OMPS_TRACE names them).
/// 69a28e9f: NVML's init asks for it; refused, NVML works as natively (init, devices,
/// names, memory: `scripts/probe/nvml_under_omps.py` on the H100). da9151d3: NVRTC's
/// attempt to compile through the driver; refused, NVRTC compiles itself, as it does when
/// the driver's own attempt fails.
const REFUSED: [[u8; 4]; 2] = [[0x69, 0xa2, 0x8e, 0x9f], [0xda, 0x91, 0x51, 0xd3]];

/// Unknown tables get what the driver gives for them: INVALID_VALUE and a NULL table;
/// each unknown UUID is logged once.
///
/// # Safety
/// `pp` is null or writable; `id` is null or 16 readable bytes.
#[no_mangle]
pub unsafe extern "C" fn cuGetExportTable(pp: *mut *const c_void, id: *const [u8; 16]) -> CUresult {
    if pp.is_null() || id.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: 16 readable bytes, per the contract.
    let uuid = unsafe { *id };
    if crate::trace_enabled() {
        let hex: String = uuid.iter().map(|b| format!("{b:02x}")).collect();
        eprintln!(
            "omps trace: cuGetExportTable({hex}) -> {}",
            table(&uuid).is_some()
        );
    }
    match table(&uuid) {
        Some(t) => {
            // SAFETY: checked non-null.
            unsafe { pp.write(t) };
            CUDA_SUCCESS
        }
        None => {
            static SEEN: Mutex<Option<HashSet<[u8; 16]>>> = Mutex::new(None);
            let on_purpose = REFUSED.iter().any(|p| uuid.starts_with(p));
            if !on_purpose
                && SEEN
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get_or_insert_with(HashSet::new)
                    .insert(uuid)
            {
                let hex: String = uuid.iter().map(|b| format!("{b:02x}")).collect();
                eprintln!("omps: export table {hex} is not provided");
            }
            // SAFETY: checked non-null.
            unsafe { pp.write(std::ptr::null()) };
            CUDA_ERROR_INVALID_VALUE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_have_the_drivers_sizes_and_unknown_ones_are_refused() {
        let mut p = std::ptr::null();
        // SAFETY: valid out-pointer and UUIDs.
        unsafe {
            assert_eq!(cuGetExportTable(&mut p, &UUIDS[0].0), CUDA_SUCCESS);
            assert_eq!(*(p as *const usize), 0x68);
            assert_eq!(cuGetExportTable(&mut p, &UUIDS[4].0), CUDA_SUCCESS);
            assert_eq!(*(p as *const usize), 0x78);
            assert_eq!(
                cuGetExportTable(&mut p, &[0u8; 16]),
                CUDA_ERROR_INVALID_VALUE
            );
            assert!(p.is_null());
        }
    }
}

#[cfg(test)]
mod cls_tests {
    use super::*;
    use crate::state::cls::cls_reset;
    use std::sync::atomic::AtomicUsize;
    use std::sync::atomic::Ordering;

    static DESTROYED: AtomicUsize = AtomicUsize::new(0);

    unsafe extern "C" fn dtor(_ctx: *mut c_void, _key: *mut c_void, value: *mut c_void) {
        DESTROYED.fetch_add(value as usize, Ordering::SeqCst);
    }

    #[test]
    fn put_get_delete_and_reset_behave_as_the_driver() {
        let (ctx, key) = (0x51 as *mut c_void, 0x52 as *mut c_void);
        let mut v = 7 as *mut c_void;
        // SAFETY: valid out-pointers; a non-null context is only used as a key here.
        unsafe {
            assert_eq!(cls_get(&mut v, ctx, key), CUDA_ERROR_INVALID_HANDLE);
            assert_eq!(v as usize, 7, "a miss leaves the value untouched");
            assert_eq!(
                cls_put(ctx, key, 40 as *mut c_void, Some(dtor)),
                CUDA_SUCCESS
            );
            assert_eq!(cls_get(&mut v, ctx, key), CUDA_SUCCESS);
            assert_eq!(v as usize, 40);
            // The thread's cached answer must not survive an overwrite.
            assert_eq!(
                cls_put(ctx, key, 2 as *mut c_void, Some(dtor)),
                CUDA_SUCCESS
            );
            assert_eq!(cls_get(&mut v, ctx, key), CUDA_SUCCESS);
            assert_eq!(v as usize, 2);
            assert_eq!(cls_delete(ctx, key), CUDA_SUCCESS);
            assert_eq!(cls_get(&mut v, ctx, key), CUDA_ERROR_INVALID_HANDLE);
            assert_eq!(
                cls_put(ctx, key, 3 as *mut c_void, Some(dtor)),
                CUDA_SUCCESS
            );
        }
        cls_reset(ctx);
        assert_eq!(
            DESTROYED.load(Ordering::SeqCst),
            3,
            "reset runs the destructor of what is stored"
        );
        // SAFETY: as above.
        let r = unsafe { cls_get(&mut v, ctx, key) };
        assert_eq!(r, CUDA_ERROR_INVALID_HANDLE);
    }

    #[test]
    fn integrity_answer_for_version_ending_in_zero_is_the_drivers_constant() {
        let mut out = [0u64; 2];
        // SAFETY: valid out-pointer.
        assert_eq!(unsafe { integrity_check(13000, 1, &mut out) }, CUDA_SUCCESS);
        assert_eq!(out, [0x3341_181C_03CB_675C, 0x8ED3_83AA_1F4C_D1E8]);
    }
}
