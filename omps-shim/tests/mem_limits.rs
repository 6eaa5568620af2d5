//! Device memory limits (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT and the control commands):
//! every allocation path counts, going over answers CUDA_ERROR_OUT_OF_MEMORY,
//! cuMemGetInfo reports the limit, a client can only lower its limit, and an operator can
//! change a running client's.

mod common;
use common::*;
use omps_ring::wire::{self, vmm, Op};
use omps_shim::conn::Conn;

const OOM: i32 = 2;
const KIB: u64 = 1024;

fn server(tag: &str, limit: &str) -> TestServer {
    let limit = limit.to_string();
    TestServer::start_with(&format!("memlimit-{tag}"), |c| {
        c.default_mem_limit = Some(limit)
    })
}

fn connect(srv: &TestServer, own: Option<&str>) -> Conn {
    let mut s = wire::ClientSettings::none();
    if let Some(v) = own {
        s.mem_limit[..v.len()].copy_from_slice(v.as_bytes());
    }
    Conn::connect_with(&srv.socket(), &s).expect("connects")
}

fn free(c: &Conn, ptr: u64) {
    free_on(c, 0, ptr);
}

fn mem_info(c: &Conn) -> (u64, u64) {
    let mut ch = c.channel();
    ch.call(0, Op::MemGetInfo, |call| bytemuck::bytes_of(&call).to_vec())
        .unwrap();
    let r = ch.reply::<wire::MemInfoReply>();
    (r.free, r.total)
}

#[test]
fn a_free_whose_fence_has_not_passed_yet_comes_back_for_the_next_allocation() {
    // PyTorch at its limit frees its cache and retries microseconds later, before the GPU
    // has reached the fence of the free: the worker must wait for it (briefly), not look
    // once. Here each fence passes 5 ms after it is recorded (the worker waits up to 20).
    let srv = server("fence-lag", "0=1M");
    srv.gpu.lag_fences(std::time::Duration::from_millis(5));
    let c = connect(&srv, None);
    let a = try_alloc(&c, 768 * KIB).expect("within the limit");
    free(&c, a);
    try_alloc(&c, 1024 * KIB).expect("the freed block is back within the wait");
}

#[test]
fn vmm_memory_released_while_mapped_counts_until_unmapped() {
    let srv = server("vmm", "0=1M");
    let c = connect(&srv, None);
    let size = 512 * KIB;
    let h = vmm_call(&c, vmm::CREATE, 0, [size, 0, 0]).unwrap() as u32;
    let va = vmm_call(&c, vmm::RESERVE, 0, [size, 0, 0]).unwrap();
    vmm_call(&c, vmm::MAP, h, [va, size, 0]).unwrap();
    // As PyTorch's expandable segments do: the handle goes, the mapping keeps the memory.
    vmm_call(&c, vmm::RELEASE, h, [0; 3]).unwrap();
    assert_eq!(mem_info(&c).0, 512 * KIB, "still held through its mapping");
    assert_eq!(try_alloc(&c, 768 * KIB), Err(OOM));
    vmm_call(&c, vmm::UNMAP, 0, [va, size, 0]).unwrap();
    assert_eq!(
        mem_info(&c).0,
        1024 * KIB,
        "given back with the last mapping"
    );
    try_alloc(&c, 768 * KIB).expect("within the limit again");
}

fn me() -> String {
    std::process::id().to_string()
}

#[test]
fn allocations_stop_at_the_limit_and_mem_get_info_reports_it() {
    let srv = server("alloc", "0=1M");
    let c = connect(&srv, None);
    assert_eq!(
        mem_info(&c),
        (1024 * KIB, 1024 * KIB),
        "free and total under 1M"
    );
    let a = try_alloc(&c, 768 * KIB).expect("within the limit");
    assert_eq!(try_alloc(&c, 512 * KIB), Err(OOM), "over the limit");
    assert_eq!(mem_info(&c), (256 * KIB, 1024 * KIB));
    // Freed memory counts again at once, though its release waits for the client's work.
    free(&c, a);
    let b = try_alloc(&c, 1024 * KIB).expect("the whole limit after the free");
    // Every path counts: VMM handles too.
    assert_eq!(vmm_call(&c, vmm::CREATE, 0, [64 * KIB, 0, 0]), Err(OOM));
    free(&c, b);
    vmm_call(&c, vmm::CREATE, 0, [64 * KIB, 0, 0]).expect("a VMM handle within the limit");
    assert_eq!(mem_info(&c).0, 960 * KIB);
    // A second connection of the same process shares its count (crate::account): the
    // limit is the process's.
    let other = connect(&srv, None);
    assert_eq!(
        try_alloc(&other, 1024 * KIB),
        Err(OOM),
        "one process, one limit"
    );
    try_alloc(&other, 512 * KIB).expect("what the process has left");
    c.ping(0).unwrap();
}

#[test]
fn module_variables_count() {
    let srv = server("modules", "0=64K");
    let c = connect(&srv, None);
    let big = "omps-host-module\nfn fill_u32 0:8 8:4 12:4\nglobal table 131072\n\0";
    assert_eq!(
        load_image(&c, big.as_bytes()).err(),
        Some(OOM),
        "a module whose variables exceed the limit"
    );
    let small = "omps-host-module\nglobal counter 32768\n\0";
    load_image(&c, small.as_bytes()).expect("variables within the limit");
    assert_eq!(mem_info(&c).0, 32 * KIB);
    assert_eq!(
        try_alloc(&c, 48 * KIB),
        Err(OOM),
        "the variables took their share"
    );
    assert_eq!(
        srv.gpu.bytes_allocated(),
        32 * KIB,
        "the refused module was given back"
    );
}

#[test]
fn pinned_host_memory_counts_on_every_gpu() {
    let srv = server("pinned", "0=256K");
    let c = connect(&srv, None);
    let len = 192 * KIB as usize;
    let (addr, _fd) = pin_somewhere(&c, len);
    assert_eq!(mem_info(&c).0, 64 * KIB, "pinned host memory counts");
    assert_eq!(try_alloc(&c, 128 * KIB), Err(OOM));
    try_alloc(&c, 64 * KIB).expect("what is left");
    let fd2 = omps_ring::shm::create_segment("pin-test-2", 4096).unwrap();
    use std::os::fd::AsRawFd;
    assert_eq!(
        c.host_request(
            wire::hostmem::PIN,
            addr + len as u64 + (1 << 20),
            4096,
            Some(fd2.as_raw_fd())
        ),
        Err(OOM),
        "a pin over the limit"
    );
}

#[test]
fn a_client_can_only_lower_its_limit() {
    let srv = server("lower", "0=1M");
    let low = connect(&srv, Some("0=128K"));
    assert_eq!(mem_info(&low), (128 * KIB, 128 * KIB));
    assert_eq!(try_alloc(&low, 256 * KIB), Err(OOM));
    let high = connect(&srv, Some("0=4M"));
    assert_eq!(
        mem_info(&high).1,
        1024 * KIB,
        "asking for more gives the server's"
    );
    // A device the server does not have, or a list that does not parse, is refused.
    let mut s = wire::ClientSettings::none();
    s.mem_limit[..5].copy_from_slice(b"7=64M");
    assert!(Conn::connect_with(&srv.socket(), &s).is_err());
    // Settings a client lies with (bytes that are no text, a list that does not parse,
    // sent past the shim's checks) cost only that client its connection, or nothing.
    for junk in [&[0xff, 0xfe, b'=', 0x80][..], b"0=lots", b"0=1G,,0=2G"] {
        let mut s = wire::ClientSettings::none();
        s.mem_limit[..junk.len()].copy_from_slice(junk);
        s.visible[..junk.len()].copy_from_slice(junk);
        if let Ok(liar) = Conn::connect_with(&srv.socket(), &s) {
            liar.ping(0).unwrap();
        }
    }
    low.ping(0).expect("its neighbours go on");
    assert!(srv.ctl("status").0);
    let e = omps_shim::conn::settings_from(|k| {
        (k == "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT").then(|| "0=lots".to_string())
    })
    .unwrap_err();
    assert!(e.contains("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=lots"), "{e}");
}

#[test]
fn operators_change_limits_of_running_clients() {
    let srv = server("operators", "0=1M");
    let c = connect(&srv, Some("0=3M"));
    // The server runs in this process: its PID names the server (all its clients).
    let (ok, out) = srv.ctl(&format!("get_device_pinned_mem_limit {} 0", me()));
    assert!(ok, "{out}");
    assert_eq!(out, "1M\n");
    assert_eq!(try_alloc(&c, 2048 * KIB), Err(OOM));
    // Raised while it runs: up to its own 3M.
    assert!(
        srv.ctl(&format!("set_device_pinned_mem_limit {} 0 8G", me()))
            .0
    );
    assert_eq!(mem_info(&c).1, 3072 * KIB, "its own variable still caps it");
    let a = try_alloc(&c, 2048 * KIB).expect("the raised limit holds at once");
    // Lowered below its use: nothing is taken away, the next allocation fails.
    assert!(
        srv.ctl(&format!("set_device_pinned_mem_limit {} 0 512K", me()))
            .0
    );
    assert_eq!(mem_info(&c).0, 0);
    assert_eq!(try_alloc(&c, 4 * KIB), Err(OOM));
    free(&c, a);
    try_alloc(&c, 256 * KIB).expect("under the lowered limit after the free");
    // The default is for clients to come; `none` removes a limit.
    assert!(srv.ctl("set_default_device_pinned_mem_limit 0 2G").0);
    assert_eq!(srv.ctl("get_default_device_pinned_mem_limit 0").1, "2G\n");
    assert!(srv.ctl("set_default_device_pinned_mem_limit 0 512M").0);
    // (Connections of this process keep the process's limit: the default is for other
    // processes, which `a_memory_limit_holds_for_a_process_over_all_its_connections`
    // and the script tests see.)
    assert_eq!(
        mem_info(&connect(&srv, None)).1,
        512 * KIB,
        "a new connection of a running process gets the process's"
    );
    assert_eq!(mem_info(&c).1, 512 * KIB, "a running one keeps its own");
    assert!(srv.ctl("set_default_device_pinned_mem_limit 0 none").0);
    assert_eq!(
        srv.ctl("get_default_device_pinned_mem_limit 0").1,
        "",
        "nothing where none is set, as MPS"
    );
    // Bad input names what was wrong.
    for (cmd, says) in [
        (
            "set_default_device_pinned_mem_limit 3 1G",
            "device 3 does not exist",
        ),
        ("set_default_device_pinned_mem_limit 0 12", "not a size"),
        ("set_device_pinned_mem_limit 1 0 1G", "no client with PID 1"),
        ("get_device_pinned_mem_limit 0", "usage"),
    ] {
        let (ok, out) = srv.ctl(cmd);
        assert!(!ok && out.contains(says), "{cmd}: {out}");
    }
}

/// MPS drops every limit when one entry of CUDA_MPS_PINNED_DEVICE_MEM_LIMIT names a GPU
/// the process cannot see (issue 26: a tenant's way out of its limit); omps refuses the
/// client, naming the variable.
#[test]
fn a_limit_naming_a_gpu_the_client_cannot_see_fails_the_client() {
    let srv = server("unseen", "0=1G");
    let mut s = wire::ClientSettings::none();
    let v = "0=16M,1=16M";
    s.mem_limit[..v.len()].copy_from_slice(v.as_bytes());
    match Conn::connect_with(&srv.socket(), &s) {
        Ok(_) => panic!("a client naming GPU 1 of a one-GPU server was served"),
        Err((code, why)) => {
            assert!(
                why.contains("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"),
                "{code}: {why}"
            );
        }
    }
    connect(&srv, Some("0=16M"))
        .ping(0)
        .expect("its own GPU alone is fine");
}
