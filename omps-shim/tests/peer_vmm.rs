//! VMM memory reached from another GPU, as NCCL's cuMem transport uses it, over raw
//! connections to a server of two linked host GPUs: access set for GPU 1 on memory mapped
//! on GPU 0 lets the client's kernels and copies on GPU 1 reach it (and nothing else of
//! it before); another client imports the memory on GPU 1, maps it and sees the same
//! bytes; another client's memory, part of a mapping and a device the client does not
//! have are refused, a record naming such a device cuts off only its sender; and the
//! unmap of such memory waits for the client's work on GPU 1 (R14).

mod common;
use common::*;
use omps_ring::wire::{self, vmm};
use omps_shim::api::vmm::call_on;
use omps_shim::conn::{settings_from, Conn};
use std::time::{Duration, Instant};

const INVALID_VALUE: i32 = 1;

fn vmm_on(c: &Conn, dev: usize, kind: u32, handle: u32, args: [u64; 3]) -> Result<u64, i32> {
    call_on::<wire::U64Reply>(c, dev, kind, handle, args).map(|r| r.value)
}

fn word(v: u32) -> Vec<u8> {
    v.to_le_bytes().to_vec()
}

#[test]
fn vmm_memory_is_reached_from_another_gpu_only_as_granted() {
    let (dir, first, second, thread) = linked_gpus_server("peer-vmm");
    let settings = settings_from(|_| None).expect("settings");
    let sock = dir.join(omps_ring::sock::SOCKET_NAME);
    let a = Conn::connect_with(&sock, &settings).unwrap();
    let b = Conn::connect_with(&sock, &settings).unwrap();

    // Client A's memory on GPU 0, mapped there with access for GPU 0 only.
    let g = vmm_on(&a, 0, vmm::GRANULARITY, 0, [0; 3]).unwrap();
    let va = vmm_on(&a, 0, vmm::RESERVE, 0, [2 * g, 0, 0]).unwrap();
    let h = vmm_on(&a, 0, vmm::CREATE, 0, [g, 0, 0]).unwrap() as u32;
    vmm_on(&a, 0, vmm::MAP, h, [va, g, 0]).unwrap();
    vmm_on(&a, 0, vmm::SET_ACCESS, 0, [va, g, 0]).unwrap();
    memset_words(&a, 0, va, 0x1111_1111);
    sync_on(&a, 0).unwrap();
    assert_eq!(first.peek(va, 4).unwrap(), word(0x1111_1111));
    // GPU 1 may not reach it yet: the server refuses a memset there, the GPU a read.
    memset_words(&a, 1, va, 0x2222_2222);
    assert_eq!(sync_on(&a, 1), Err(INVALID_VALUE));
    assert_eq!(second.peek(va, 4), None, "GPU 1 reaches it without access");

    // Access for GPU 1 is for whole mappings; then GPU 1's copies and kernels reach it.
    assert_eq!(
        vmm_on(&a, 0, vmm::SET_ACCESS, 0, [va, g / 2, 0b11]),
        Err(INVALID_VALUE),
        "part of a mapping"
    );
    vmm_on(&a, 0, vmm::SET_ACCESS, 0, [va, g, 0b11]).unwrap();
    memset_words(&a, 1, va, 0x2222_2222);
    sync_on(&a, 1).expect("a memset on GPU 1 of memory with access for it");
    assert_eq!(first.peek(va, 4).unwrap(), word(0x2222_2222));
    let fill = load_image_on(&a, 1, HOST_MODULE.as_bytes()).unwrap().1;
    let fill = fill.iter().find(|f| f.0 == "fill_u32").unwrap().1;
    launch_fill_words(&a, 1, fill, 0, va + 64, 0x3333_3333);
    sync_on(&a, 1).expect("a kernel on GPU 1 writes GPU 0's memory");
    assert_eq!(first.peek(va + 64, 4).unwrap(), word(0x3333_3333));
    assert_eq!(second.peek(va + 64, 4).unwrap(), word(0x3333_3333));

    // Another client can neither grant access to A's memory nor reach it on GPU 1.
    assert_eq!(
        vmm_on(&b, 0, vmm::SET_ACCESS, 0, [va, g, 0b11]),
        Err(INVALID_VALUE)
    );
    memset_words(&b, 1, va, 0x4444_4444);
    assert_eq!(sync_on(&b, 1), Err(INVALID_VALUE));
    assert_eq!(first.peek(va, 4).unwrap(), word(0x2222_2222));

    // B imports A's memory on GPU 1 (NCCL's peer), maps it in its own reservation there
    // with access for GPU 1, and sees A's bytes; what it writes A sees.
    let token: [u64; 2] = call_on(&a, 0, vmm::EXPORT, h, [0; 3]).unwrap();
    let [bh, size, _, home]: [u64; 4] =
        call_on(&b, 1, vmm::IMPORT, 0, [token[0], token[1], 0]).unwrap();
    assert_eq!((size, home), (g, 0), "its size, and the device it lives on");
    let bva = vmm_on(&b, 1, vmm::RESERVE, 0, [g, 0, 0]).unwrap();
    vmm_on(&b, 1, vmm::MAP, bh as u32, [bva, g, 0]).unwrap();
    assert_eq!(second.peek(bva, 4), None, "no access before it is set");
    vmm_on(&b, 1, vmm::SET_ACCESS, 0, [bva, g, 0]).unwrap();
    assert_eq!(second.peek(bva + 64, 4).unwrap(), word(0x3333_3333));
    memset_words(&b, 1, bva + 128, 0x5555_5555);
    sync_on(&b, 1).unwrap();
    assert_eq!(first.peek(va + 128, 4).unwrap(), word(0x5555_5555));

    // A device the client does not have, in the record: that client is cut off only.
    let c = Conn::connect_with(&sock, &settings).unwrap();
    let cva = vmm_on(&c, 0, vmm::RESERVE, 0, [g, 0, 0]).unwrap();
    let ch = vmm_on(&c, 0, vmm::CREATE, 0, [g, 0, 0]).unwrap() as u32;
    vmm_on(&c, 0, vmm::MAP, ch, [cva, g, 0]).unwrap();
    let _ = vmm_on(&c, 0, vmm::SET_ACCESS, 0, [cva, g, 1 << 5]);
    assert!(wait_disconnected(&c), "a lie about its devices was taken");
    sync_on(&a, 0).expect("the others are served");
    sync_on(&b, 1).expect("the others are served");

    // R14: A's unmap waits for its work on GPU 1, whose kernels may still use the memory.
    second.stick_releases(true);
    let unmapped = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            vmm_on(&a, 0, vmm::UNMAP, 0, [va, g, 0]).expect("unmapped");
            unmapped.store(true, std::sync::atomic::Ordering::SeqCst);
        });
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            !unmapped.load(std::sync::atomic::Ordering::SeqCst),
            "the unmap did not wait for GPU 1's fence"
        );
        assert!(first.peek(va, 4).is_some(), "unmapped before GPU 1's fence");
        second.stick_releases(false);
    });
    assert!(unmapped.load(std::sync::atomic::Ordering::SeqCst));
    assert_eq!(first.peek(va, 4), None, "still mapped");
    // Copies on GPU 1 sent after the unmap are refused; B's mapping still holds the bytes.
    memset_words(&a, 1, va, 0x6666_6666);
    assert_eq!(sync_on(&a, 1), Err(INVALID_VALUE));
    assert_eq!(second.peek(bva + 128, 4).unwrap(), word(0x5555_5555));

    // Everything goes with the clients: B's mapping and import, then A's memory.
    let t = Instant::now();
    drop((a, b));
    while (first.bytes_allocated() != 0 || second.bytes_allocated() != 0)
        && t.elapsed() < Duration::from_secs(5)
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        (first.bytes_allocated(), second.bytes_allocated()),
        (0, 0),
        "the clients' mappings are gone"
    );
    assert!(ctl_at(&omps_ring::sock::operator_socket_in(&dir), "quit").0);
    thread.join().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
