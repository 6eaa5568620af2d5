//! A server on the host-memory GPU in this process, and an omps-ctl stand-in.
#![allow(dead_code)]

pub mod namespaces;

use omps_ring::sock;
use omps_ring::wire::{self, Hello};
use omps_server::gpu::Gpu;
use omps_server::gpu_host::HostGpu;
use omps_server::{Server, ServerConfig};
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub struct TestServer {
    pub dir: PathBuf,
    pub gpu: Arc<HostGpu>,
    thread: Option<std::thread::JoinHandle<()>>,
}

pub fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("omps-test-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// Runs test `name` of this test binary again in a child process with `flag` set, as the
/// client of `srv` (the server then maps the client's pinned memory at the client's own
/// address, as between two processes; in one process that address is taken), and checks
/// that it passed. The test returns into its client part when it sees `flag`.
pub fn run_client_child(srv: &TestServer, name: &str, flag: &str) {
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture"])
        .env(flag, "1")
        .env("OMPS_PIPE_DIRECTORY", &srv.dir)
        .status()
        .expect("the client runs");
    assert!(status.success(), "the client failed: {status}");
}

impl TestServer {
    pub fn start(tag: &str) -> TestServer {
        Self::start_with(tag, |_| {})
    }

    /// As `start`, with `edit` changing the configuration first.
    pub fn start_with(tag: &str, edit: impl FnOnce(&mut ServerConfig)) -> TestServer {
        Self::start_on(tag, Arc::new(HostGpu::new(0, 1 << 30)), edit)
    }

    /// As `start_with`, on `gpu` (a host GPU of a chosen generation, say).
    pub fn start_on(
        tag: &str,
        gpu: Arc<HostGpu>,
        edit: impl FnOnce(&mut ServerConfig),
    ) -> TestServer {
        let dir = temp_dir(tag);
        let mut cfg = ServerConfig {
            // Two lanes, so consecutive clients land on different worker threads.
            lanes: 2,
            // Two segments made ahead, so connections take them (and some make their own).
            spare_segments: 2,
            // One of the host GPU's four one-SM chunks.
            lc_reserve_sms: 1,
            ..ServerConfig::minimal(dir.clone())
        };
        edit(&mut cfg);
        let server =
            Server::new(cfg, vec![gpu.clone() as Arc<dyn Gpu>], 13000).expect("server starts");
        let thread = std::thread::spawn(move || server.run().expect("server runs"));
        TestServer {
            dir,
            gpu,
            thread: Some(thread),
        }
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.join(sock::SOCKET_NAME)
    }

    /// The operator's socket, which takes control commands.
    pub fn operator_socket(&self) -> PathBuf {
        sock::operator_socket_in(&self.dir)
    }

    /// One omps-ctl command, through the operator's socket: (ok, text).
    pub fn ctl(&self, cmd: &str) -> (bool, String) {
        ctl_at(&self.operator_socket(), cmd)
    }

    /// Polls `ps` until `pred` holds, for up to `secs`.
    pub fn wait_ps(&self, secs: u64, pred: impl Fn(&str) -> bool) -> String {
        let t = std::time::Instant::now();
        loop {
            let (_, ps) = self.ctl("ps");
            if pred(&ps) || t.elapsed() > Duration::from_secs(secs) {
                return ps;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        let _ = self.ctl("quit");
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A server on the host GPU with this process as its client: the shim pointed at it and
/// initialized, device 0's primary context current. The shim connects once per process,
/// so each test binary that uses this has one test.
pub fn start_as_client(tag: &str) -> TestServer {
    start_as_client_with(tag, |_| {})
}

/// As `start_as_client`, with `edit` changing the server's configuration first.
pub fn start_as_client_with(tag: &str, edit: impl FnOnce(&mut ServerConfig)) -> TestServer {
    client_of(TestServer::start_with(tag, edit))
}

/// As `start_as_client`, on a host GPU playing `profile`'s generation.
pub fn start_as_client_on(tag: &str, profile: omps_server::gpu_host::HostProfile) -> TestServer {
    let gpu = Arc::new(HostGpu::with_profile(0, 1 << 30, profile));
    client_of(TestServer::start_on(tag, gpu, |_| {}))
}

/// Makes this process `srv`'s client through the shim.
pub fn client_of(srv: TestServer) -> TestServer {
    use omps_shim::api::{ctx::*, device::*};
    // SAFETY: called before the test starts threads; the shim reads this at cuInit.
    unsafe { std::env::set_var("OMPS_PIPE_DIRECTORY", &srv.dir) };
    let mut ctx = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    unsafe {
        assert_eq!(cuInit(0), 0, "cuInit");
        assert_eq!(cuDevicePrimaryCtxRetain(&mut ctx, 0), 0, "primary context");
        assert_eq!(cuCtxSetCurrent(ctx), 0, "cuCtxSetCurrent");
    }
    srv
}

pub fn ctl_at(path: &Path, cmd: &str) -> (bool, String) {
    let s = UnixStream::connect(path).expect("server socket");
    let hello = Hello {
        magic: wire::HELLO_MAGIC,
        version: wire::PROTOCOL_VERSION,
        kind: wire::kind::CONTROL,
    };
    (&s).write_all(bytemuck::bytes_of(&hello)).unwrap();
    sock::write_frame(&mut &s, cmd.as_bytes()).unwrap();
    let r = sock::read_frame(&mut &s, 1 << 20).unwrap().expect("reply");
    (r[0] == 0, String::from_utf8_lossy(&r[1..]).into_owned())
}

/// The memory column of the `ps` row of client `pid`, if listed.
pub fn ps_mem(ps: &str, pid: u32) -> Option<u64> {
    ps_field(ps, pid, "MEM_BYTES")?.parse().ok()
}

/// Column `name` (by `ps`'s header) of the first row of client `pid`, if listed.
pub fn ps_field<'a>(ps: &'a str, pid: u32, name: &str) -> Option<&'a str> {
    let mut lines = ps.lines();
    let col = lines.next()?.split_whitespace().position(|h| h == name)?;
    lines.find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.first()? == &pid.to_string().as_str()).then(|| f.get(col).copied())?
    })
}

/// A module for the host GPU: fill_u32(ptr, value, count), trap(), set_cond(handle,
/// value), and a global.
pub const HOST_MODULE: &str =
    "omps-host-module\nfn fill_u32 0:8 8:4 12:4\nfn trap\nfn set_cond 0:8 8:4\nglobal counter 16\n\0";

/// Allocates `size` bytes of device memory on GPU 0 through a raw connection.
pub fn alloc(c: &omps_shim::conn::Conn, size: u64) -> u64 {
    alloc_on(c, 0, size)
}

/// Allocates `size` bytes of device memory on the client's device `dev`.
pub fn alloc_on(c: &omps_shim::conn::Conn, dev: usize, size: u64) -> u64 {
    try_alloc_on(c, dev, size).expect("alloc")
}

/// Allocates `size` bytes on the client's device 0: the pointer, or the CUDA error.
#[allow(dead_code)]
pub fn try_alloc(c: &omps_shim::conn::Conn, size: u64) -> Result<u64, i32> {
    try_alloc_on(c, 0, size)
}

/// Allocates `size` bytes on the client's device `dev`: the pointer, or the CUDA error.
pub fn try_alloc_on(c: &omps_shim::conn::Conn, dev: usize, size: u64) -> Result<u64, i32> {
    use omps_ring::wire::{MemAlloc, Op, U64Reply};
    let mut ch = c.channel();
    ch.call(dev, Op::MemAlloc, |call| {
        bytemuck::bytes_of(&MemAlloc { call, size }).to_vec()
    })?;
    Ok(ch.reply::<U64Reply>().value)
}

/// Queues the free of `ptr` on the client's device `dev` (no answer is waited for).
#[allow(dead_code)]
pub fn free_on(c: &omps_shim::conn::Conn, dev: usize, ptr: u64) {
    use omps_ring::wire::{MemFree, Op};
    c.push(dev, Op::MemFree, &[bytemuck::bytes_of(&MemFree { ptr })])
        .unwrap();
}

/// Loads `img` (smaller than a staging chunk) through a bare connection: the module id
/// and its functions (name, id), or the CUDA error.
#[allow(dead_code)]
pub fn load_image(c: &omps_shim::conn::Conn, img: &[u8]) -> Result<(u32, Vec<(String, u32)>), i32> {
    load_image_on(c, 0, img)
}

/// Uploads `img` into chunk 0 of a channel of the client's (BlobAppend on device `dev`),
/// ready for a ModuleLoad on that channel.
pub fn upload_image<'c>(
    c: &'c omps_shim::conn::Conn,
    dev: usize,
    img: &[u8],
) -> omps_shim::conn::ChanGuard<'c> {
    use omps_ring::wire::{ChunkCopy, Op};
    let mut ch = c.channel();
    ch.wait_chunk(0).unwrap();
    let (p, cap) = ch.chunk_ptr(0);
    assert!(img.len() <= cap);
    // SAFETY: the chunk is ours and at least as large as the image.
    unsafe { std::ptr::copy_nonoverlapping(img.as_ptr(), p, img.len()) };
    let seq = ch.claim_chunk(0);
    let rec = ChunkCopy {
        channel: ch.idx,
        chunk: 0,
        len: img.len() as u32,
        seq,
        ..Default::default()
    };
    c.push(dev, Op::BlobAppend, &[bytemuck::bytes_of(&rec)])
        .unwrap();
    ch.wait_chunk(0).unwrap();
    ch
}

/// Pushes a ModuleLoad of `img` on GPU 0 and never waits for its answer (a client that
/// leaves, or loads on several connections at once, while its load compiles).
pub fn push_load(c: &omps_shim::conn::Conn, img: &[u8]) {
    use omps_ring::wire::{ModuleLoad, Op};
    let mut ch = upload_image(c, 0, img);
    let load = ModuleLoad {
        call: ch.next_call(),
        blob_len: img.len() as u64,
    };
    c.push(0, Op::ModuleLoad, &[bytemuck::bytes_of(&load)])
        .unwrap();
}

/// `load_image` on the client's device `dev`.
#[allow(dead_code)]
pub fn load_image_on(
    c: &omps_shim::conn::Conn,
    dev: usize,
    img: &[u8],
) -> Result<(u32, Vec<(String, u32)>), i32> {
    use omps_ring::wire::{FunctionDesc, ModuleLoad, ModuleReply, Op};
    let mut ch = upload_image(c, dev, img);
    ch.call(dev, Op::ModuleLoad, |call| {
        bytemuck::bytes_of(&ModuleLoad {
            call,
            blob_len: img.len() as u64,
        })
        .to_vec()
    })?;
    let (p, cap) = ch.chunk_ptr(0);
    // SAFETY: the server wrote the function table into chunk 0 before answering.
    let r = unsafe { std::slice::from_raw_parts(p as *const u8, cap) };
    let head: ModuleReply = wire::get(r).unwrap();
    let funcs = (0..head.num_functions as usize)
        .map(|i| {
            let d: FunctionDesc = wire::get(&r[16 + i * 32..]).unwrap();
            let name = String::from_utf8(
                r[d.name_offset as usize..(d.name_offset + d.name_len) as usize].to_vec(),
            )
            .unwrap();
            (name, d.func)
        })
        .collect();
    Ok((head.module, funcs))
}

/// Queues a memset of 16 words of `dst` to 7 on the default stream of GPU 0.
#[allow(dead_code)]
pub fn memset(c: &omps_shim::conn::Conn, dst: u64) {
    memset_words(c, 0, dst, 7);
}

/// Queues a memset of 16 words at `dst` to `value` on the default stream of the client's
/// device `dev`.
#[allow(dead_code)]
pub fn memset_words(c: &omps_shim::conn::Conn, dev: usize, dst: u64, value: u32) {
    memset_words_on(c, 0, dst, value, dev);
}

/// As [`memset_words`], on the client's stream `stream`.
#[allow(dead_code)]
pub fn memset_words_on(c: &omps_shim::conn::Conn, stream: u32, dst: u64, value: u32, dev: usize) {
    let m = omps_ring::wire::Memset {
        dst,
        count: 16,
        value,
        elem_size: 4,
        stream,
        _pad: 0,
    };
    c.push(dev, omps_ring::wire::Op::Memset, &[bytemuck::bytes_of(&m)])
        .unwrap();
}

/// Launches HOST_MODULE's `fill_u32` (function id `fill`: 16 words of `value` at `ptr`)
/// on stream `stream` of the client's device `dev`.
#[allow(dead_code)]
pub fn launch_fill_words(
    c: &omps_shim::conn::Conn,
    dev: usize,
    fill: u32,
    stream: u32,
    ptr: u64,
    value: u32,
) {
    let mut args = ptr.to_le_bytes().to_vec();
    args.extend_from_slice(&value.to_le_bytes());
    args.extend_from_slice(&16u32.to_le_bytes());
    let launch = omps_ring::wire::Launch {
        func: fill,
        stream,
        grid: [1; 3],
        block: [1; 3],
        args_len: args.len() as u32,
        ..Default::default()
    };
    c.push(
        dev,
        omps_ring::wire::Op::Launch,
        &[bytemuck::bytes_of(&launch), &args],
    )
    .unwrap();
}

/// Launches HOST_MODULE's `fill_u32` through the shim's cuLaunchKernel: `count` words at
/// `p` set to `value`, on stream `s`; returns the launch's result.
///
/// # Safety
/// `s` is a live stream of the current context.
#[allow(dead_code)]
pub unsafe fn try_fill_kernel(
    p: u64,
    value: u32,
    count: u32,
    s: omps_shim::state::streams::CUstream,
) -> omps_shim::cuda::CUresult {
    let f = host_function(c"fill_u32");
    let (mut ptr, mut val, mut n) = (p, value, count);
    let mut args = [
        &mut ptr as *mut _ as *mut std::ffi::c_void,
        &mut val as *mut _ as *mut std::ffi::c_void,
        &mut n as *mut _ as *mut std::ffi::c_void,
    ];
    // SAFETY: the arguments match fill_u32's; the caller's stream.
    unsafe {
        omps_shim::api::exec::cuLaunchKernel(
            f,
            1,
            1,
            1,
            1,
            1,
            1,
            0,
            s,
            args.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    }
}

/// As try_fill_kernel, asserting the launch succeeded.
///
/// # Safety
/// `s` is a live stream of the current context.
#[allow(dead_code)]
pub unsafe fn fill_kernel(p: u64, value: u32, count: u32, s: omps_shim::state::streams::CUstream) {
    // SAFETY: the caller's contract.
    ok(unsafe { try_fill_kernel(p, value, count, s) });
}

/// Launches `print(ptr, len)` (the host GPU's printf) of module function `f`.
#[allow(dead_code)]
pub fn launch_print(c: &omps_shim::conn::Conn, f: u32, ptr: u64, len: u32) {
    let l = omps_ring::wire::Launch {
        func: f,
        grid: [1; 3],
        block: [1; 3],
        args_len: 12,
        ..Default::default()
    };
    let mut args = ptr.to_le_bytes().to_vec();
    args.extend_from_slice(&len.to_le_bytes());
    c.push(
        0,
        omps_ring::wire::Op::Launch,
        &[bytemuck::bytes_of(&l), &args],
    )
    .unwrap();
}

/// Asserts a CUDA call through the shim's entry points succeeded.
#[allow(dead_code)]
pub fn ok(r: omps_shim::cuda::CUresult) {
    assert_eq!(r, omps_shim::cuda::CUDA_SUCCESS, "CUDA call failed");
}

/// Function `name` of the host test module, loaded through the shim's entry points (the
/// process's own connection: `start_as_client` first).
#[allow(dead_code)]
pub fn host_function(name: &std::ffi::CStr) -> omps_shim::state::streams::CUfunction {
    use omps_shim::api::module::{cuModuleGetFunction, cuModuleLoadData};
    let (mut m, mut f) = (std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: valid out-pointers; the image is NUL-terminated text.
    unsafe {
        ok(cuModuleLoadData(
            &mut m,
            HOST_MODULE.as_ptr() as *const std::ffi::c_void,
        ));
        ok(cuModuleGetFunction(&mut f, m, name.as_ptr()));
    }
    f
}

/// Whether the server cuts `c` off within 5 s.
#[allow(dead_code)]
pub fn wait_disconnected(c: &omps_shim::conn::Conn) -> bool {
    let t = std::time::Instant::now();
    while t.elapsed() < Duration::from_secs(5) {
        if c.check_alive().is_err() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    false
}

/// Creates client stream `id` (non-blocking) on GPU 0 through a raw connection.
#[allow(dead_code)]
pub fn stream_create(c: &omps_shim::conn::Conn, id: u32) {
    let sc = omps_ring::wire::StreamCreate {
        id,
        flags: 1,
        ..Default::default()
    };
    c.push(
        0,
        omps_ring::wire::Op::StreamCreate,
        &[bytemuck::bytes_of(&sc)],
    )
    .unwrap();
}

/// A capture call (CaptureBegin, CaptureEnd: then the graph's id) on `stream`.
#[allow(dead_code)]
pub fn capture(
    c: &omps_shim::conn::Conn,
    op: omps_ring::wire::Op,
    stream: u32,
) -> Result<u64, i32> {
    let mut ch = c.channel();
    ch.call(0, op, |call| {
        bytemuck::bytes_of(&omps_ring::wire::CaptureCall {
            call,
            stream,
            mode: 0,
        })
        .to_vec()
    })?;
    Ok(if op == omps_ring::wire::Op::CaptureEnd {
        ch.reply::<omps_ring::wire::U64Reply>().value
    } else {
        0
    })
}

/// One virtual-memory call through a raw connection: Ok(value) or the CUDA error.
#[allow(dead_code)]
pub fn vmm_call(
    c: &omps_shim::conn::Conn,
    kind: u32,
    handle: u32,
    args: [u64; 3],
) -> Result<u64, i32> {
    omps_shim::api::vmm::call_on::<omps_ring::wire::U64Reply>(c, 0, kind, handle, args)
        .map(|r| r.value)
}

/// Pins `len` bytes of a new memfd for client `c` at an address nothing is mapped at (the
/// server maps the client's memfd there; in a test both live in one process, whose other
/// tests may map there meanwhile: retried). Returns the address and the memfd.
pub fn pin_somewhere(c: &omps_shim::conn::Conn, len: usize) -> (u64, std::os::fd::OwnedFd) {
    use std::os::fd::AsRawFd;
    const NOT_SUPPORTED: i32 = 801;
    let fd = omps_ring::shm::create_segment("pin-test", len).unwrap();
    let free_address = || {
        // SAFETY: an anonymous reservation, given back at once; only its address is used.
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            libc::munmap(p, len);
            p as u64
        }
    };
    for _ in 0..20 {
        let addr = free_address();
        match c.host_request(
            omps_ring::wire::hostmem::PIN,
            addr,
            len as u64,
            Some(fd.as_raw_fd()),
        ) {
            Err(NOT_SUPPORTED) => continue,
            r => {
                r.expect("pinned");
                return (addr, fd);
            }
        }
    }
    panic!("no free address to pin at");
}

/// Launches HOST_MODULE's `trap` on client `c`'s default stream: a kernel fault, which
/// surfaces at its next synchronization.
pub fn launch_trap(c: &omps_shim::conn::Conn) {
    let funcs = load_image(c, HOST_MODULE.as_bytes()).unwrap().1;
    let trap = funcs.iter().find(|f| f.0 == "trap").unwrap().1;
    let launch = omps_ring::wire::Launch {
        func: trap,
        grid: [1; 3],
        block: [1; 3],
        ..Default::default()
    };
    c.push(
        0,
        omps_ring::wire::Op::Launch,
        &[bytemuck::bytes_of(&launch)],
    )
    .unwrap();
}

/// Synchronizes client `c`'s default stream on GPU 0: the first error since, if any.
pub fn sync_default_stream(c: &omps_shim::conn::Conn) -> Result<(), i32> {
    sync_on(c, 0)
}

/// Synchronizes client `c`'s default stream on its device `dev`: the first error since.
pub fn sync_on(c: &omps_shim::conn::Conn, dev: usize) -> Result<(), i32> {
    let mut ch = c.channel();
    ch.call(dev, omps_ring::wire::Op::StreamSync, |call| {
        bytemuck::bytes_of(&omps_ring::wire::HandleCall {
            call,
            id: 0,
            _pad: 0,
        })
        .to_vec()
    })
    .map(drop)
}

/// A server of two host GPUs of one machine that reach each other directly (peer access),
/// running on a thread: its pipe directory, the two GPUs, the thread.
pub fn linked_gpus_server(tag: &str) -> LinkedServer {
    let dir = temp_dir(tag);
    let first = Arc::new(HostGpu::new(0, 1 << 28));
    let second = Arc::new(HostGpu::beside(&first, 1, 1 << 28));
    HostGpu::link_peers(&[first.clone(), second.clone()]);
    let gpus: Vec<Arc<dyn Gpu>> = vec![first.clone(), second.clone()];
    let server =
        Server::new(ServerConfig::minimal(dir.clone()), gpus, 13000).expect("server starts");
    let thread = std::thread::spawn(move || server.run().expect("server runs"));
    (dir, first, second, thread)
}

/// Waits up to 5 s for `done`: whether it came.
#[allow(dead_code)]
pub fn eventually(done: impl Fn() -> bool) -> bool {
    let end = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while std::time::Instant::now() < end {
        if done() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    done()
}

/// Exports `ptr` (an allocation of `c`'s on its device `dev`) as an IPC handle.
#[allow(dead_code)]
pub fn export_mem_handle(
    c: &omps_shim::conn::Conn,
    dev: usize,
    ptr: u64,
) -> omps_ring::wire::IpcHandle {
    let mut ch = c.channel();
    ch.call(dev, omps_ring::wire::Op::IpcGetMemHandle, |call| {
        bytemuck::bytes_of(&omps_ring::wire::IpcCall { call, ptr }).to_vec()
    })
    .expect("exported");
    ch.reply()
}

/// What [`linked_gpus_server`] returns: its pipe directory, the two GPUs, its thread.
#[allow(dead_code)]
pub type LinkedServer = (
    PathBuf,
    Arc<HostGpu>,
    Arc<HostGpu>,
    std::thread::JoinHandle<()>,
);

/// A server on two linked host GPUs (as [`linked_gpus_server`]) with this process's shim
/// its client: initialized, both primary contexts retained (GPU 0's, GPU 1's).
#[allow(dead_code)]
pub fn shim_on_linked_gpus(tag: &str) -> (LinkedServer, [omps_shim::state::ctx::CUcontext; 2]) {
    use omps_shim::api::{ctx::*, device::*};
    let server = linked_gpus_server(tag);
    // SAFETY: set before this test starts threads that read it; the shim reads it at cuInit.
    unsafe { std::env::set_var("OMPS_PIPE_DIRECTORY", &server.0) };
    let mut c = [std::ptr::null_mut(); 2];
    // SAFETY: valid out-pointers.
    unsafe {
        ok(cuInit(0));
        ok(cuDevicePrimaryCtxRetain(&mut c[0], 0));
        ok(cuDevicePrimaryCtxRetain(&mut c[1], 1));
    }
    (server, c)
}

/// A stream of the shim's, and an executable graph captured on it that sets the 16 words
/// at `p` to `value` (a memset node over device memory).
///
/// # Safety
/// The shim is this process's client of a server, and a context is current.
#[allow(dead_code)]
pub unsafe fn memset_graph(
    p: u64,
    value: u32,
) -> (
    omps_shim::state::streams::CUstream,
    omps_shim::api::graph::CUgraphExec,
) {
    use omps_shim::api::{capture::*, exec::*, graph::*, mem::*};
    let (mut s, mut g, mut e) = (
        std::ptr::null_mut(),
        std::ptr::null_mut(),
        std::ptr::null_mut(),
    );
    // SAFETY: valid out-pointers; handles made here.
    unsafe {
        ok(cuStreamCreate(&mut s, 1));
        ok(cuStreamBeginCapture_v2(s, 2));
        ok(cuMemsetD32Async(p, value, 16, s));
        ok(cuStreamEndCapture(s, &mut g));
        ok(cuGraphInstantiateWithFlags(&mut e, g, 0));
        ok(cuGraphDestroy(g));
    }
    (s, e)
}

/// Launches `e` on `s` and checks that it wrote `value` into the 16 words at `p` of `gpu`.
#[allow(dead_code)]
pub fn replay_writes(
    gpu: &HostGpu,
    e: omps_shim::api::graph::CUgraphExec,
    s: omps_shim::state::streams::CUstream,
    p: u64,
    value: u32,
) {
    use omps_shim::api::{exec::*, graph::*};
    ok(cuGraphLaunch(e, s));
    ok(cuStreamSynchronize(s));
    let words = gpu.peek(p, 64).expect("still there");
    assert!(
        words.chunks(4).all(|w| w == value.to_le_bytes()),
        "the replay wrote it"
    );
}

/// Instantiates the client's graph `graph` on its device 0 with `flags`: the executable
/// graph's id, or the CUDA error.
#[allow(dead_code)]
pub fn instantiate_graph(c: &omps_shim::conn::Conn, graph: u32, flags: u64) -> Result<u64, i32> {
    use omps_ring::wire;
    let mut ch = c.channel();
    ch.call(0, wire::Op::GraphInstantiate, |call| {
        bytemuck::bytes_of(&wire::GraphInstantiate {
            call,
            graph,
            _pad: 0,
            flags,
        })
        .to_vec()
    })?;
    Ok(ch.reply::<wire::U64Reply>().value)
}

/// Asks for access from the client's device `dev` to its device `peer`.
#[allow(dead_code)]
pub fn peer_access(c: &omps_shim::conn::Conn, dev: usize, peer: u32) -> Result<(), i32> {
    use omps_ring::wire;
    let mut ch = c.channel();
    ch.call(dev, wire::Op::PeerAccess, |call| {
        bytemuck::bytes_of(&wire::PeerAccess {
            call,
            peer,
            _pad: 0,
        })
        .to_vec()
    })
    .map(drop)
}

/// A local address no one listens on, for a test's metrics endpoint.
#[allow(dead_code)]
pub fn free_local_addr() -> std::net::SocketAddr {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    format!("127.0.0.1:{port}").parse().unwrap()
}

/// The graph stream `s`'s capture goes into (cuStreamGetCaptureInfo), with the capture's
/// status (1: active).
///
/// # Safety
/// `s` is a stream of this process's shim.
#[allow(dead_code)]
pub unsafe fn capture_graph_of(
    s: omps_shim::state::streams::CUstream,
) -> (u32, omps_shim::state::capture::CUgraph) {
    let (mut status, mut g) = (0u32, std::ptr::null_mut());
    // SAFETY: valid out-pointers; the stream is the caller's.
    let r = unsafe {
        omps_shim::api::stream_info::cuStreamGetCaptureInfo_v2(
            s,
            &mut status,
            std::ptr::null_mut(),
            &mut g,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    };
    assert_eq!(r, 0, "cuStreamGetCaptureInfo");
    (status, g as omps_shim::state::capture::CUgraph)
}

/// Creates event `id` (timing on) on GPU 0 through a raw connection.
#[allow(dead_code)]
pub fn event_create_raw(c: &omps_shim::conn::Conn, id: u32) {
    let ec = omps_ring::wire::EventCreate { id, flags: 0 };
    c.push(
        0,
        omps_ring::wire::Op::EventCreate,
        &[bytemuck::bytes_of(&ec)],
    )
    .unwrap();
}

/// Records event `id` on the legacy default stream of GPU 0 through a raw connection.
#[allow(dead_code)]
pub fn event_record_raw(c: &omps_shim::conn::Conn, id: u32) {
    let r = omps_ring::wire::EventRecord {
        event: id,
        stream: omps_ring::wire::STREAM_DEFAULT,
    };
    c.push(
        0,
        omps_ring::wire::Op::EventRecord,
        &[bytemuck::bytes_of(&r)],
    )
    .unwrap();
}
