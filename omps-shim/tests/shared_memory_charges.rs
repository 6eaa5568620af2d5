//! Memory an exporter freed while another client still holds it open (an IPC opening,
//! imported VMM memory) stays charged to the exporter's process until the last holder
//! lets go, so the exporter cannot shed its limit by having it held elsewhere (issue 23,
//! finding 13). Exporter and importers are connections of this one process here, which
//! share its account and limit (crate::account), so a refused allocation shows the charge.

mod common;
use common::*;
use omps_ring::wire::{self, vmm, IpcCall, IpcHandle, IpcOpen, Op};
use omps_shim::api::vmm::call_on;
use omps_shim::conn::Conn;
use std::time::{Duration, Instant};

const OOM: i32 = 2;
const KIB: u64 = 1024;

fn free(c: &Conn, ptr: u64) {
    free_on(c, 0, ptr);
    c.ping(0).unwrap();
}

/// Allocates `size` bytes once releases in flight have come back (up to 5 s).
fn alloc_eventually(c: &Conn, size: u64) -> Result<u64, i32> {
    let t = Instant::now();
    loop {
        match try_alloc(c, size) {
            Err(OOM) if t.elapsed() < Duration::from_secs(5) => {
                std::thread::sleep(Duration::from_millis(10))
            }
            r => return r,
        }
    }
}

fn get(c: &Conn, ptr: u64) -> IpcHandle {
    let mut ch = c.channel();
    ch.call(0, Op::IpcGetMemHandle, |call| {
        bytemuck::bytes_of(&IpcCall { call, ptr }).to_vec()
    })
    .unwrap();
    ch.reply()
}

fn open(c: &Conn, handle: IpcHandle) -> u64 {
    let mut ch = c.channel();
    ch.call(0, Op::IpcOpenMemHandle, |call| {
        bytemuck::bytes_of(&IpcOpen { call, handle }).to_vec()
    })
    .unwrap();
    ch.reply::<wire::U64Reply>().value
}

fn close(c: &Conn, ptr: u64) {
    c.channel()
        .call(0, Op::IpcCloseMemHandle, |call| {
            bytemuck::bytes_of(&IpcCall { call, ptr }).to_vec()
        })
        .unwrap();
}

fn server(tag: &str) -> TestServer {
    TestServer::start_with(tag, |c| c.default_mem_limit = Some("0=1M".into()))
}

#[test]
fn ipc_memory_its_exporter_freed_counts_until_the_last_importer_closes_it() {
    let srv = server("ipc-charged");
    let a = Conn::connect_to(&srv.socket()).unwrap();
    let b = Conn::connect_to(&srv.socket()).unwrap();
    let p = try_alloc(&a, 768 * KIB).expect("within the limit");
    assert_eq!(open(&b, get(&a, p)), p);
    free(&a, p);
    assert_eq!(
        try_alloc(&a, 512 * KIB),
        Err(OOM),
        "freed by its exporter, still held open: still charged"
    );
    close(&b, p);
    b.ping(0).unwrap();
    let q = alloc_eventually(&a, 1024 * KIB).expect("the whole limit once closed");
    free(&a, q);

    // The exporting connection goes while the memory is open elsewhere: the process
    // stays charged for it.
    let p = alloc_eventually(&a, 768 * KIB).expect("within the limit");
    assert_eq!(open(&b, get(&a, p)), p);
    drop(a);
    let c = Conn::connect_to(&srv.socket()).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(try_alloc(&c, 512 * KIB), Err(OOM), "its exporter gone");
    close(&b, p);
    b.ping(0).unwrap();
    alloc_eventually(&c, 1024 * KIB).expect("the whole limit once closed");
}

#[test]
fn vmm_memory_its_exporter_released_counts_until_the_last_importer_releases_it() {
    let srv = server("vmm-charged");
    let a = Conn::connect_to(&srv.socket()).unwrap();
    let b = Conn::connect_to(&srv.socket()).unwrap();
    let size = 768 * KIB;
    let h = vmm_call(&a, vmm::CREATE, 0, [size, 0, 0]).unwrap() as u32;
    let token: [u64; 2] = call_on(&a, 0, vmm::EXPORT, h, [0; 3]).unwrap();
    let [bh, got, ..]: [u64; 4] = call_on(&b, 0, vmm::IMPORT, 0, [token[0], token[1], 0]).unwrap();
    assert_eq!(got, size);
    vmm_call(&a, vmm::RELEASE, h, [0; 3]).unwrap();
    assert_eq!(
        try_alloc(&a, 512 * KIB),
        Err(OOM),
        "released by its exporter, still imported: still charged"
    );
    // The importer maps it, then releases its handle: the mapping keeps the memory, and
    // the importer, now its only holder, is charged until it unmaps.
    let va = vmm_call(&b, vmm::RESERVE, 0, [size, 0, 0]).unwrap();
    vmm_call(&b, vmm::MAP, bh as u32, [va, size, 0]).unwrap();
    vmm_call(&b, vmm::RELEASE, bh as u32, [0; 3]).unwrap();
    assert_eq!(
        try_alloc(&a, 512 * KIB),
        Err(OOM),
        "released by both, still mapped: still charged"
    );
    vmm_call(&b, vmm::UNMAP, 0, [va, size, 0]).unwrap();
    let q = alloc_eventually(&a, 1024 * KIB).expect("the whole limit once unmapped");
    free(&a, q);

    // The exporting connection goes while the memory is imported.
    let c = Conn::connect_to(&srv.socket()).unwrap();
    let c2 = Conn::connect_to(&srv.socket()).unwrap();
    let h = loop {
        match vmm_call(&c, vmm::CREATE, 0, [size, 0, 0]) {
            Err(OOM) => std::thread::sleep(Duration::from_millis(10)),
            r => break r.expect("within the limit") as u32,
        }
    };
    let token: [u64; 2] = call_on(&c, 0, vmm::EXPORT, h, [0; 3]).unwrap();
    let [bh, ..]: [u64; 4] = call_on(&b, 0, vmm::IMPORT, 0, [token[0], token[1], 0]).unwrap();
    drop(c);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        try_alloc(&c2, 512 * KIB),
        Err(OOM),
        "its exporter gone, still imported: still charged"
    );
    vmm_call(&b, vmm::RELEASE, bh as u32, [0; 3]).unwrap();
    alloc_eventually(&c2, 1024 * KIB).expect("the whole limit once released");
}
