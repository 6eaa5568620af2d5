//! Costs inside the shim that sit on every runtime call: cudart looks up its state in the
//! context-local-storage table (export table c693336e, entry 2) on each API call, and
//! resolves entry points once at start-up through cuGetProcAddress.

use criterion::{criterion_group, criterion_main, Criterion};
use omps_shim::dark::CONTEXT_LOCAL_STORAGE;
use std::ffi::c_void;
use std::hint::black_box;

type Put = unsafe extern "C" fn(*mut c_void, *mut c_void, *mut c_void, *mut c_void) -> i32;
type Get = unsafe extern "C" fn(*mut *mut c_void, *mut c_void, *mut c_void) -> i32;

fn context_local_storage(c: &mut Criterion) {
    // SAFETY: slots 0 and 2 of the table are put and get with these signatures.
    let (put, get): (Put, Get) = unsafe {
        (
            std::mem::transmute::<*const c_void, Put>(CONTEXT_LOCAL_STORAGE.0[0]),
            std::mem::transmute::<*const c_void, Get>(CONTEXT_LOCAL_STORAGE.0[2]),
        )
    };
    let (ctx, key) = (0x1000 as *mut c_void, 0x2000 as *mut c_void);
    // SAFETY: a non-null context handle is only used as a key; no destructor.
    assert_eq!(
        unsafe { put(ctx, key, 0x3000 as *mut c_void, std::ptr::null_mut()) },
        0
    );
    c.bench_function("context-local storage get (hit)", |b| {
        b.iter(|| {
            let mut v = std::ptr::null_mut();
            // SAFETY: valid out-pointer; the key was stored above.
            let r = unsafe { get(&mut v, black_box(ctx), black_box(key)) };
            debug_assert_eq!(r, 0);
            v
        })
    });
}

fn proc_address(c: &mut Criterion) {
    c.bench_function("cuGetProcAddress table lookup", |b| {
        b.iter(|| omps_shim::api::proc::resolve(black_box("cuMemcpyHtoDAsync"), 13000, 0))
    });
}

criterion_group!(benches, context_local_storage, proc_address);
criterion_main!(benches);
