//! A memory pool shared between two client processes, as NVIDIA's
//! streamOrderedAllocationIPC sample shares one: the exporter makes an exportable pool,
//! allocates from it and sends the pool's descriptor and an allocation's export data
//! over a Unix socket; the importer (this test binary again, as a child process) imports
//! both, reads and writes the memory, and frees it. The exporter's free leaves the memory
//! to an importer still holding it, until that importer goes. Another client reaches
//! nothing without the handles; what is not omps's, or not exported, is refused.

mod common;
use common::*;
use omps_ring::wire::vmm;
use omps_shim::api::mem::*;
use omps_shim::api::pool::*;
use omps_shim::api::pool_share::*;
use omps_shim::cuda::*;
use std::ffi::c_void;
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::{Duration, Instant};

const SIZE: usize = 1 << 20;
/// Where the importer finds the exporter's socket.
const CHILD_ENV: &str = "OMPS_TEST_POOL_IMPORTER";

/// CUmemPoolProps (88 bytes) for pinned memory on device 0 with `handle_types`.
fn props(handle_types: u32) -> [u32; 22] {
    let mut p = [0u32; 22];
    p[0] = 1; // pinned
    p[1] = handle_types;
    p[2] = 1; // on a device: 0
    p
}

fn send(s: &UnixStream, bytes: &[u8], fds: &[i32]) {
    omps_ring::sock::send_with_fds(s.as_raw_fd(), bytes, fds).unwrap();
}

fn recv(s: &UnixStream) -> (Vec<u8>, Vec<std::os::fd::OwnedFd>) {
    let mut buf = [0u8; 128];
    let (n, fds) = omps_ring::sock::recv_with_fds(s.as_raw_fd(), &mut buf).unwrap();
    (buf[..n].to_vec(), fds)
}

#[test]
fn an_exported_pool_is_imported_by_another_process() {
    let srv = start_as_client("pool-share");
    // SAFETY (whole test): every pointer passed is a valid local of the right size or a
    // handle made here.
    unsafe {
        let mut pool: CUmemoryPool = std::ptr::null_mut();
        let fabric = props(8);
        assert_eq!(
            cuMemPoolCreate(&mut pool, fabric.as_ptr().cast()),
            800,
            "fabric handles: as where no fabric is set up"
        );
        let plain = props(0);
        let mut private: CUmemoryPool = std::ptr::null_mut();
        ok(cuMemPoolCreate(&mut private, plain.as_ptr().cast()));
        let posix = props(1);
        ok(cuMemPoolCreate(&mut pool, posix.as_ptr().cast()));
        let s = std::ptr::null_mut();
        let mut data = PtrExportData { reserved: [0; 64] };
        let mut q = 0u64;
        ok(cuMemAllocFromPoolAsync(&mut q, SIZE, private, s));
        assert_eq!(
            cuMemPoolExportPointer(&mut data, q),
            CUDA_ERROR_INVALID_VALUE,
            "memory of a pool not made exportable"
        );
        ok(cuMemFreeAsync(q, s));
        ok(omps_shim::api::ctx::cuCtxSynchronize());
        let gone = |n: u64| {
            let t = Instant::now();
            while srv.gpu.bytes_allocated() > n && t.elapsed().as_secs() < 5 {
                std::thread::sleep(Duration::from_millis(10));
            }
            srv.gpu.bytes_allocated()
        };
        assert_eq!(gone(0), 0, "nothing allocated yet");
        let mut p = 0u64;
        ok(cuMemAllocFromPoolAsync(&mut p, SIZE, pool, s));
        ok(cuMemsetD8_v2(p, 7, SIZE));
        let mut fd = -1i32;
        let fd_out = &mut fd as *mut i32 as *mut c_void;
        assert_eq!(
            cuMemPoolExportToShareableHandle(fd_out, private, 1, 0),
            CUDA_ERROR_INVALID_VALUE,
            "a pool not made exportable"
        );
        ok(cuMemPoolExportToShareableHandle(fd_out, pool, 1, 0));
        ok(cuMemPoolExportPointer(&mut data, p));

        // A client given neither handle: a guessed pool token, and the allocation's token
        // through a pool it did not import, reach nothing.
        let thief = omps_shim::conn::Conn::connect_to(&srv.socket()).unwrap();
        let word = |at: usize| u64::from_le_bytes(data.reserved[at..at + 8].try_into().unwrap());
        assert_eq!(vmm_call(&thief, vmm::POOL_IMPORT, 0, [1, 2, 0]), Err(1));
        for key in [0, 1 << 32 | 1, u64::MAX] {
            let r = vmm_call(&thief, vmm::POOL_IMPORT_PTR, 0, [key, word(8), word(16)]);
            assert_eq!(r, Err(1), "pool key {key:#x}");
        }

        // The importer, a process of its own.
        let sock_path = srv.dir.join("pool-test.sock");
        let listener = UnixListener::bind(&sock_path).unwrap();
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "importer_side",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, &sock_path)
            .spawn()
            .unwrap();
        // Waits for the importer's connection, or its failure.
        listener.set_nonblocking(true).unwrap();
        let conn = loop {
            match listener.accept() {
                Ok((c, _)) => break c,
                Err(_) => {
                    if let Some(st) = child.try_wait().unwrap() {
                        panic!("the importer failed before connecting: {st}");
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        };
        conn.set_nonblocking(false).unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        send(&conn, &data.reserved, &[fd]);
        libc::close(fd);
        // The importer wrote 9s, freed its import, imported again and holds it.
        let (msg, _) = recv(&conn);
        assert_eq!(msg, b"holding");
        let mut back = vec![0u8; SIZE];
        ok(cuMemcpyDtoH_v2(back.as_mut_ptr().cast(), p, SIZE));
        assert!(back.iter().all(|&b| b == 9), "the importer's writes");
        // Freed here while the importer holds it: the memory stays for the importer.
        ok(cuMemFreeAsync(p, s));
        ok(omps_shim::api::ctx::cuCtxSynchronize());
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(
            srv.gpu.bytes_allocated(),
            SIZE as u64,
            "held by the importer"
        );
        send(&conn, b"go", &[]);
        let status = child.wait().unwrap();
        assert!(status.success(), "the importer's checks: {status}");
        // The importer left holding it: its departure frees the memory.
        assert_eq!(gone(0), 0, "freed with its last user");
        ok(cuMemPoolDestroy(pool));
        ok(cuMemPoolDestroy(private));
    }
}

/// The importing process: runs only when the exporter starts it.
#[test]
fn importer_side() {
    let Some(path) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    use omps_shim::api::{ctx::*, device::*};
    // SAFETY (whole function): every pointer passed is a valid local of the right size or
    // a handle made here; the descriptor is the one received.
    unsafe {
        // The exporter's server: OMPS_PIPE_DIRECTORY came with its environment.
        let mut ctx = std::ptr::null_mut();
        ok(cuInit(0));
        ok(cuDevicePrimaryCtxRetain(&mut ctx, 0));
        ok(cuCtxSetCurrent(ctx));
        let conn = UnixStream::connect(path).unwrap();
        let (bytes, fds) = recv(&conn);
        let mut data = PtrExportData { reserved: [0; 64] };
        data.reserved.copy_from_slice(&bytes);
        let fd = fds[0].as_raw_fd() as usize as *mut c_void;

        let mut pool: CUmemoryPool = std::ptr::null_mut();
        let stat = std::fs::File::open("/proc/self/stat").unwrap();
        let not_ours = stat.as_raw_fd() as usize as *mut c_void;
        assert_eq!(
            cuMemPoolImportFromShareableHandle(&mut pool, not_ours, 1, 0),
            CUDA_ERROR_INVALID_VALUE,
            "a descriptor that is not omps's"
        );
        ok(cuMemPoolImportFromShareableHandle(&mut pool, fd, 1, 0));
        let mut back = vec![0u8; SIZE];
        let mut ptr = 0u64;
        let mut forged = PtrExportData {
            reserved: data.reserved,
        };
        forged.reserved[9] ^= 1;
        assert_eq!(
            cuMemPoolImportPointer(&mut ptr, pool, &forged),
            CUDA_ERROR_INVALID_VALUE,
            "a forged token"
        );
        ok(cuMemPoolImportPointer(&mut ptr, pool, &data));
        ok(cuMemcpyDtoH_v2(back.as_mut_ptr().cast(), ptr, SIZE));
        assert!(back.iter().all(|&b| b == 7), "the exporter's data");
        ok(cuMemsetD8_v2(ptr, 9, SIZE));
        let mut mine = 0u64;
        assert_eq!(
            cuMemAllocFromPoolAsync(&mut mine, 64, pool, std::ptr::null_mut()),
            CUDA_ERROR_INVALID_VALUE,
            "an imported pool is its exporter's to allocate from"
        );
        // Freed: no longer this process's memory.
        ok(cuMemFreeAsync(ptr, std::ptr::null_mut()));
        ok(cuCtxSynchronize());
        assert_eq!(
            cuMemcpyDtoH_v2(back.as_mut_ptr().cast(), ptr, 64),
            CUDA_ERROR_INVALID_VALUE
        );
        // Imported again, and held until this process goes.
        let mut again = 0u64;
        ok(cuMemPoolImportPointer(&mut again, pool, &data));
        assert_eq!(again, ptr);
        send(&conn, b"holding", &[]);
        let (msg, _) = recv(&conn);
        assert_eq!(msg, b"go");
        ok(cuMemcpyDtoH_v2(back.as_mut_ptr().cast(), again, SIZE));
        assert!(
            back.iter().all(|&b| b == 9),
            "still there after the exporter's free"
        );
    }
}
