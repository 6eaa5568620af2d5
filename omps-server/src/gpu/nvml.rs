//! GPU utilization from NVML (libnvidia-ml.so.1, installed with the driver), loaded at run
//! time: the driver API has no utilization counter. Without NVML the figure is absent, and
//! nothing else depends on it.

use std::ffi::{c_char, c_int, c_void, CString};
use std::sync::OnceLock;

#[repr(C)]
#[derive(Default)]
struct Utilization {
    gpu: u32,
    memory: u32,
}

type Init = unsafe extern "C" fn() -> c_int;
type ByUuid = unsafe extern "C" fn(*const c_char, *mut *mut c_void) -> c_int;
type Rates = unsafe extern "C" fn(*mut c_void, *mut Utilization) -> c_int;

struct Nvml {
    by_uuid: ByUuid,
    rates: Rates,
}

fn nvml() -> Option<&'static Nvml> {
    static LIB: OnceLock<Option<Nvml>> = OnceLock::new();
    LIB.get_or_init(|| {
        // SAFETY: dlopen/dlsym with NUL-terminated names; the symbols are NVML's documented
        // entry points with these signatures, and the library stays loaded (never closed).
        unsafe {
            let h = libc::dlopen(
                c"libnvidia-ml.so.1".as_ptr(),
                libc::RTLD_NOW | libc::RTLD_LOCAL,
            );
            if h.is_null() {
                return None;
            }
            let sym = |n: &std::ffi::CStr| libc::dlsym(h, n.as_ptr());
            let (init, by_uuid, rates) = (
                sym(c"nvmlInit_v2"),
                sym(c"nvmlDeviceGetHandleByUUID"),
                sym(c"nvmlDeviceGetUtilizationRates"),
            );
            if init.is_null() || by_uuid.is_null() || rates.is_null() {
                return None;
            }
            let init: Init = std::mem::transmute::<*mut c_void, Init>(init);
            if init() != 0 {
                return None;
            }
            Some(Nvml {
                by_uuid: std::mem::transmute::<*mut c_void, ByUuid>(by_uuid),
                rates: std::mem::transmute::<*mut c_void, Rates>(rates),
            })
        }
    })
    .as_ref()
}

/// The percentage of the last sample period in which a kernel ran on the GPU of `uuid`
/// (`GPU-…`), and the percentage in which its memory was read or written.
pub fn utilization(uuid: &str) -> Option<(u32, u32)> {
    let n = nvml()?;
    let id = CString::new(uuid).ok()?;
    let mut dev = std::ptr::null_mut();
    let mut u = Utilization::default();
    // SAFETY: NUL-terminated UUID, valid out-pointers; the handle comes from NVML.
    unsafe {
        if (n.by_uuid)(id.as_ptr(), &mut dev) != 0 || (n.rates)(dev, &mut u) != 0 {
            return None;
        }
    }
    Some((u.gpu, u.memory))
}
