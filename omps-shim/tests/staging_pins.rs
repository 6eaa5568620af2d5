//! A client beyond the first few (`segpool::STAGING_AHEAD`) has its staging registered
//! channel by channel at its first copy through it, not with its segment (issue 25: 1,024
//! clients pinned 4 GB, resident in the server, mostly staging no copy ever used). Before
//! its first copy only its channel headers are registered; a pageable round trip of
//! several chunks comes back intact and registers the one channel it went through; the
//! first clients' segments are registered whole, as before. Its own binary: this process
//! becomes a client after four other connections.

mod common;
use common::*;
use omps_server::release::segpool::STAGING_AHEAD;
use omps_shim::api::mem::*;
use omps_shim::conn::Conn;
use std::ffi::c_void;

#[test]
fn a_later_clients_staging_is_registered_at_its_first_copy() {
    // No segments made ahead: every registration below is one this test makes happen.
    let srv = TestServer::start_with("staging-pins", |c| c.spare_segments = 0);
    let early: Vec<Conn> = (0..STAGING_AHEAD)
        .map(|i| Conn::connect_to(&srv.socket()).unwrap_or_else(|e| panic!("client {i}: {e:?}")))
        .collect();
    let layout = early[0].seg().layout;
    let (_, whole) = layout.registered_range();
    let (_, control) = layout.control_range();
    let (_, staging) = layout.staging_range(0).unwrap();
    assert_eq!(srv.gpu.registered_ranges(), STAGING_AHEAD);
    assert_eq!(
        srv.gpu.registered_bytes(),
        STAGING_AHEAD * whole,
        "the first clients' segments are registered whole, channel headers and staging"
    );
    // This process's own connection, through the shim, is the next one.
    let srv = client_of(srv);
    let c = omps_shim::conn::connected().expect("the shim is connected");
    assert_eq!(c.seg().layout, layout, "a full segment still");
    assert_eq!(srv.gpu.registered_ranges(), STAGING_AHEAD + 1);
    assert_eq!(
        srv.gpu.registered_bytes(),
        STAGING_AHEAD * whole + control,
        "the next one's channel headers only"
    );

    let n = (3 << 20) + 4096 + 12; // three chunks and pieces of a fourth
    let src: Vec<u8> = (0..n).map(|i| (i * 7 + i / 4096) as u8).collect();
    let mut p = 0u64;
    // SAFETY: valid out-pointer; the buffers hold n bytes.
    unsafe {
        ok(cuMemAlloc_v2(&mut p, n));
        ok(cuMemcpyHtoD_v2(p, src.as_ptr() as *const c_void, n));
    }
    let mut back = vec![0u8; n];
    // SAFETY: as above.
    ok(unsafe { cuMemcpyDtoH_v2(back.as_mut_ptr() as *mut c_void, p, n) });
    assert!(back == src, "the round trip through staging is intact");
    assert_eq!(
        srv.gpu.registered_bytes(),
        STAGING_AHEAD * whole + control + staging,
        "and the staging of the one channel this thread copied through, once"
    );
    assert_eq!(srv.gpu.registered_ranges(), STAGING_AHEAD + 2);
    drop(early);
}
