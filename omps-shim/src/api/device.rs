//! Initialisation, device queries (answered from the handshake's snapshot) and error text.

use crate::conn::{conn, connected};
use crate::cuda::*;
use crate::state::device::device;
use crate::state::entry::{entry, live, mark_initialized, out};
use std::ffi::{c_char, c_int, c_uint};

#[no_mangle]
pub extern "C" fn cuInit(flags: c_uint) -> CUresult {
    entry(|| {
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        conn()?;
        mark_initialized();
        Ok(())
    })
}

/// # Safety
/// `v` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuDriverGetVersion(v: *mut c_int) -> CUresult {
    // Answered before cuInit too, as the driver does; the server's driver decides.
    let version = connected()
        .or_else(|| conn().ok())
        .map_or(13000, |c| c.snapshot.driver_version);
    // SAFETY: the caller's pointer.
    entry(|| unsafe { out(v, version) })
}

/// # Safety
/// `d` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGet(d: *mut CUdevice, ordinal: c_int) -> CUresult {
    entry(|| {
        device(ordinal)?;
        // SAFETY: the caller's pointer.
        unsafe { out(d, ordinal) }
    })
}

/// # Safety
/// `n` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetCount(n: *mut c_int) -> CUresult {
    entry(|| {
        let c = live()?;
        let count = (c.snapshot.device_count as usize).min(c.num_devices());
        // SAFETY: the caller's pointer.
        unsafe { out(n, count as c_int) }
    })
}

/// # Safety
/// `name` is null or writable for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) -> CUresult {
    entry(|| {
        let d = device(dev)?;
        if name.is_null() || len <= 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let s = d.name_str().as_bytes();
        let n = s.len().min(len as usize - 1);
        // SAFETY: the caller's buffer holds len bytes; we write n + 1 <= len.
        unsafe {
            std::ptr::copy_nonoverlapping(s.as_ptr(), name as *mut u8, n);
            *name.add(n) = 0;
        }
        Ok(())
    })
}

/// # Safety
/// `bytes` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    // SAFETY: the caller's pointer.
    entry(|| unsafe { out(bytes, device(dev)?.total_mem as usize) })
}

/// # Safety
/// `uuid` is null or writable for 16 bytes.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid(uuid: *mut [u8; 16], dev: CUdevice) -> CUresult {
    // SAFETY: the caller's pointer.
    entry(|| unsafe { out(uuid, device(dev)?.uuid) })
}

/// # Safety
/// `uuid` is null or writable for 16 bytes.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid_v2(uuid: *mut [u8; 16], dev: CUdevice) -> CUresult {
    // SAFETY: forwarded contract.
    unsafe { cuDeviceGetUuid(uuid, dev) }
}

/// # Safety
/// `pi` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetAttribute(
    pi: *mut c_int,
    attrib: c_int,
    dev: CUdevice,
) -> CUresult {
    /// The one attribute the server changes while a client runs: its compute limit's
    /// share of the SMs (CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT).
    const MULTIPROCESSOR_COUNT: c_int = 16;
    /// Fabric handles (memory shared across nodes over NVLink) are not omps's to give:
    /// answered 0, so programs share memory as POSIX descriptors (api/vmm_share.rs), as
    /// PyTorch's expandable segments then do.
    const HANDLE_TYPE_FABRIC_SUPPORTED: c_int = 128;
    /// Pools share as POSIX descriptors only (api/pool_share.rs): other handle types the
    /// driver offers are left out.
    const MEMPOOL_SUPPORTED_HANDLE_TYPES: c_int = 119;
    const POSIX_FD: c_int = 1;
    entry(|| {
        let d = device(dev)?;
        if attrib == HANDLE_TYPE_FABRIC_SUPPORTED {
            // SAFETY: the caller's pointer.
            return unsafe { out(pi, 0) };
        }
        let v = usize::try_from(attrib)
            .ok()
            .and_then(|a| d.attribute(a))
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let v = match attrib {
            MEMPOOL_SUPPORTED_HANDLE_TYPES => v & POSIX_FD,
            MULTIPROCESSOR_COUNT => live()?
                .seg()
                .read_attribute(dev as usize, attrib as usize)
                .unwrap_or(v),
            _ => v,
        };
        // SAFETY: the caller's pointer.
        unsafe { out(pi, v) }
    })
}

/// # Safety
/// `major` and `minor` are null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceComputeCapability(
    major: *mut c_int,
    minor: *mut c_int,
    dev: CUdevice,
) -> CUresult {
    const MAJOR: usize = 75;
    const MINOR: usize = 76;
    entry(|| {
        let d = device(dev)?;
        // SAFETY: the caller's pointers.
        unsafe {
            out(major, d.attribute(MAJOR).unwrap_or(0))?;
            out(minor, d.attribute(MINOR).unwrap_or(0))
        }
    })
}

/// # Safety
/// `bus_id` is null or writable for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetPCIBusId(
    bus_id: *mut c_char,
    len: c_int,
    dev: CUdevice,
) -> CUresult {
    entry(|| {
        let d = device(dev)?;
        if bus_id.is_null() || len <= 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let s = &d.pci_bus_id[..d.pci_bus_id.iter().position(|&b| b == 0).unwrap_or(0)];
        let n = s.len().min(len as usize - 1);
        // SAFETY: the caller's buffer holds len bytes; we write n + 1 <= len.
        unsafe {
            std::ptr::copy_nonoverlapping(s.as_ptr(), bus_id as *mut u8, n);
            *bus_id.add(n) = 0;
        }
        Ok(())
    })
}

/// # Safety
/// `s` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuGetErrorName(e: CUresult, s: *mut *const c_char) -> CUresult {
    entry(|| {
        let (name, _) = error_text(e).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: the caller's pointer.
        unsafe { out(s, name) }
    })
}

/// # Safety
/// `s` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuGetErrorString(e: CUresult, s: *mut *const c_char) -> CUresult {
    entry(|| {
        let (_, text) = error_text(e).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: the caller's pointer.
        unsafe { out(s, text) }
    })
}

/// "domain:bus:device.function" in hex, as numbers, so case and zero padding don't matter.
fn parse_bus_id(s: &[u8]) -> Option<[u32; 4]> {
    let s = std::str::from_utf8(s).ok()?;
    let (rest, func) = s.rsplit_once('.').unwrap_or((s, "0"));
    let mut parts = rest.split(':').rev();
    let device = u32::from_str_radix(parts.next()?, 16).ok()?;
    let bus = u32::from_str_radix(parts.next()?, 16).ok()?;
    let domain = parts
        .next()
        .map_or(Some(0), |d| u32::from_str_radix(d, 16).ok())?;
    Some([domain, bus, device, u32::from_str_radix(func, 16).ok()?])
}

/// # Safety
/// `dev` is null or writable; `bus_id` is NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetByPCIBusId(
    dev: *mut CUdevice,
    bus_id: *const c_char,
) -> CUresult {
    entry(|| {
        let c = live()?;
        if bus_id.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the caller's NUL-terminated string.
        let want = parse_bus_id(unsafe { std::ffi::CStr::from_ptr(bus_id) }.to_bytes())
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let n = (c.snapshot.device_count as usize).min(c.num_devices());
        let found = c.snapshot.devices[..n].iter().position(|d| {
            let id = &d.pci_bus_id[..d.pci_bus_id.iter().position(|&b| b == 0).unwrap_or(0)];
            parse_bus_id(id) == Some(want)
        });
        // SAFETY: the caller's pointer.
        unsafe { out(dev, found.ok_or(CUDA_ERROR_INVALID_DEVICE)? as CUdevice) }
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn bus_ids_compare_as_numbers() {
        assert_eq!(super::parse_bus_id(b"0000:00:06.0"), Some([0, 0, 6, 0]));
        assert_eq!(
            super::parse_bus_id(b"00000000:1A:00.0"),
            super::parse_bus_id(b"0000:1a:00.0")
        );
        assert_eq!(super::parse_bus_id(b"1a:00.0"), Some([0, 0x1a, 0, 0]));
        assert_eq!(super::parse_bus_id(b"zz"), None);
    }
}
