//! The server's checks of a copy over peer access (Op::CopyPeer), sent over raw
//! connections: its far end must be the sender's own allocation on the other GPU, in
//! bounds and not yet freed, and the sender must have enabled peer access. A copy that
//! passes lands; one that fails is an error at the next synchronization and touches
//! nothing. Two host GPUs that reach each other stand in for a machine's.

mod common;
use common::*;
use omps_ring::wire::{self, CopyPeer, MemFree, Op};
use omps_server::gpu::Gpu;
use omps_server::gpu_host::HostGpu;
use omps_shim::conn::{settings_from, Conn};

/// Queues a copy on GPU 1's default stream with its far end (`far`) on GPU 0.
fn copy_from_gpu0(c: &Conn, dst: u64, far: u64, len: u64) {
    let rec = CopyPeer {
        dst,
        src: far,
        len,
        stream: wire::STREAM_DEFAULT,
        peer: 0,
        far_is_src: 1,
        _pad: 0,
    };
    c.push(1, Op::CopyPeer, &[bytemuck::bytes_of(&rec)])
        .unwrap();
}

fn fill(gpu: &HostGpu, c: &Conn, dev: usize, dst: u64, value: u32) {
    memset_words(c, dev, dst, value);
    sync_on(c, dev).unwrap();
    assert_eq!(gpu.peek(dst, 4).unwrap(), value.to_le_bytes());
}

#[test]
fn a_peer_copy_reaches_only_the_senders_own_live_memory() {
    let (dir, first, second, thread) = linked_gpus_server("peer-checks");
    let settings = settings_from(|_| None).expect("settings");
    let sock = dir.join(omps_ring::sock::SOCKET_NAME);
    let a = Conn::connect_with(&sock, &settings).unwrap();
    let b = Conn::connect_with(&sock, &settings).unwrap();
    assert_eq!(a.snapshot.devices[1].p2p[0][1], 1, "GPU 1 reaches GPU 0");

    let far = alloc_on(&a, 0, 64);
    let near = alloc_on(&a, 1, 64);
    let others = alloc_on(&b, 0, 64);
    fill(&first, &a, 0, far, 0x1111_1111);
    fill(&first, &b, 0, others, 0x2222_2222);
    fill(&second, &a, 1, near, 0);

    // Before the client enabled peer access, its frees on GPU 0 do not wait for GPU 1.
    copy_from_gpu0(&a, near, far, 64);
    assert_eq!(sync_on(&a, 1), Err(CUDA_ERROR_INVALID_VALUE_CODE));
    assert_eq!(second.peek(near, 4).unwrap(), [0; 4]);

    // Access from GPU 1 to the client's device 0; a device itself or one it does not
    // have is refused.
    assert!(!second.reaches(0), "enabled only when a client asks");
    assert_eq!(peer_access(&a, 1, 1), Err(CUDA_ERROR_INVALID_DEVICE_CODE));
    assert_eq!(peer_access(&a, 1, 5), Err(CUDA_ERROR_INVALID_DEVICE_CODE));
    peer_access(&a, 1, 0).expect("peer access");
    assert!(second.reaches(0));
    copy_from_gpu0(&a, near, far, 64);
    sync_on(&a, 1).expect("its own allocation on GPU 0");
    assert_eq!(second.peek(near, 4).unwrap(), 0x1111_1111u32.to_le_bytes());

    // Another client's memory, past the end of its own, and its own once freed: refused,
    // and the far end is not written either.
    copy_from_gpu0(&a, near, others, 64);
    assert_eq!(sync_on(&a, 1), Err(CUDA_ERROR_INVALID_VALUE_CODE));
    copy_from_gpu0(&a, near, far + 32, 64);
    assert_eq!(sync_on(&a, 1), Err(CUDA_ERROR_INVALID_VALUE_CODE));
    let into_others = CopyPeer {
        dst: others,
        src: near,
        len: 64,
        stream: wire::STREAM_DEFAULT,
        peer: 0,
        far_is_src: 0,
        _pad: 0,
    };
    a.push(1, Op::CopyPeer, &[bytemuck::bytes_of(&into_others)])
        .unwrap();
    assert_eq!(sync_on(&a, 1), Err(CUDA_ERROR_INVALID_VALUE_CODE));
    assert_eq!(first.peek(others, 4).unwrap(), 0x2222_2222u32.to_le_bytes());
    a.push(0, Op::MemFree, &[bytemuck::bytes_of(&MemFree { ptr: far })])
        .unwrap();
    sync_on(&a, 0).unwrap();
    copy_from_gpu0(&a, near, far, 64);
    assert_eq!(sync_on(&a, 1), Err(CUDA_ERROR_INVALID_VALUE_CODE));
    // A far end named by a device the client does not have.
    let nowhere = CopyPeer {
        peer: 7,
        ..into_others
    };
    a.push(1, Op::CopyPeer, &[bytemuck::bytes_of(&nowhere)])
        .unwrap();
    assert_eq!(sync_on(&a, 1), Err(CUDA_ERROR_INVALID_VALUE_CODE));

    // A client with peer access that dies: what it held on GPU 0 stays until its work on
    // GPU 1 has passed a fence, then goes (and nothing waits in a circle: the server
    // settles every release and quits).
    // Only the other client's 64 bytes are left on GPU 0 once `far` is back.
    let t = std::time::Instant::now();
    while first.bytes_allocated() != 64 && t.elapsed() < std::time::Duration::from_secs(5) {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let before = first.bytes_allocated();
    assert_eq!(before, 64, "the freed allocation came back");
    let kept = alloc_on(&a, 0, 1 << 20);
    assert_ne!(kept, 0);
    assert_eq!(first.bytes_allocated(), before + (1 << 20));
    second.stick_releases(true);
    drop(a);
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(
        first.bytes_allocated() >= before + (1 << 20),
        "a dead client's memory was freed before its work on GPU 1 passed its fence"
    );
    second.stick_releases(false);
    let t = std::time::Instant::now();
    let left = before;
    while first.bytes_allocated() != left && t.elapsed() < std::time::Duration::from_secs(5) {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(
        first.bytes_allocated(),
        left,
        "a dead client's memory never came back"
    );
    // A peer-copy record cut short is malformed: that client is cut off, the other goes on.
    let c = Conn::connect_with(&sock, &settings).unwrap();
    let short = bytemuck::bytes_of(&into_others);
    c.push(1, Op::CopyPeer, &[&short[..short.len() - 8]])
        .unwrap();
    assert!(wait_disconnected(&c), "a truncated peer copy was taken");
    sync_on(&b, 0).expect("the other client is served");
    assert_eq!(first.peek(others, 4).unwrap(), 0x2222_2222u32.to_le_bytes());
    drop((b, c));
    assert!(ctl_at(&omps_ring::sock::operator_socket_in(&dir), "quit").0);
    thread.join().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

const CUDA_ERROR_INVALID_VALUE_CODE: i32 = 1;
const CUDA_ERROR_INVALID_DEVICE_CODE: i32 = 101;
