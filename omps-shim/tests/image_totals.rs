//! Module images uploaded and not yet loaded are bounded for all clients together
//! (OMPS_MAX_IMAGE_BYTES_TOTAL), not only per client, so N clients at the per-client bound
//! cannot exhaust the server's memory (issue 23, finding 14). Its own test binary: the
//! bounds are read once per process.

mod common;
use common::*;
use omps_ring::wire::{ChunkCopy, ModuleLoad, Op};
use omps_shim::conn::{ChanGuard, Conn};

const OOM: i32 = 2;

/// Uploads `len` bytes into a channel of `c`, not loading them yet.
fn upload(c: &Conn, len: usize) -> ChanGuard<'_> {
    let mut ch = c.channel();
    ch.wait_chunk(0).unwrap();
    let (p, cap) = ch.chunk_ptr(0);
    assert!(len <= cap);
    // SAFETY: the chunk is ours and at least `len` bytes long.
    unsafe { std::ptr::write_bytes(p, 0x5a, len) };
    let seq = ch.claim_chunk(0);
    let rec = ChunkCopy {
        channel: ch.idx,
        chunk: 0,
        len: len as u32,
        seq,
        ..Default::default()
    };
    c.push(0, Op::BlobAppend, &[bytemuck::bytes_of(&rec)])
        .unwrap();
    ch.wait_chunk(0).unwrap();
    ch
}

/// Loads what `ch` uploaded: its error (these bytes are no image), or Ok.
fn load(mut ch: ChanGuard<'_>, len: usize) -> Result<(), i32> {
    ch.call(0, Op::ModuleLoad, |call| {
        bytemuck::bytes_of(&ModuleLoad {
            call,
            blob_len: len as u64,
        })
        .to_vec()
    })
}

#[test]
fn uploaded_images_are_bounded_for_all_clients_together() {
    std::env::set_var("OMPS_MAX_IMAGE_BYTES", "4096");
    std::env::set_var("OMPS_MAX_IMAGE_BYTES_TOTAL", "8192");
    let srv = TestServer::start("image-totals");
    let a = Conn::connect_to(&srv.socket()).unwrap();
    let b = Conn::connect_to(&srv.socket()).unwrap();
    let c = Conn::connect_to(&srv.socket()).unwrap();
    let ua = upload(&a, 3000);
    let ub = upload(&b, 3000);
    let uc = upload(&c, 3000);
    assert_eq!(
        load(uc, 3000),
        Err(OOM),
        "each within its own bound, all three past the server's"
    );
    // A's upload is taken by its load (these bytes are no image: refused otherwise),
    // which leaves room.
    assert_ne!(load(ua, 3000), Err(OOM));
    assert_ne!(load(upload(&c, 3000), 3000), Err(OOM), "room again");
    // A client that goes gives its uploads back too.
    let _ua = upload(&a, 3000);
    assert_eq!(load(upload(&c, 3000), 3000), Err(OOM), "full again");
    drop(ub);
    drop(b);
    let t = std::time::Instant::now();
    loop {
        match load(upload(&c, 3000), 3000) {
            Err(OOM) if t.elapsed() < std::time::Duration::from_secs(5) => {
                std::thread::sleep(std::time::Duration::from_millis(10))
            }
            r => break assert_ne!(r, Err(OOM), "b's upload went with it"),
        }
    }
}
