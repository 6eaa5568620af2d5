//! Review of the server core (issue 23, finding 4): a VMM reservation held for graphs was
//! held only for the graphs of the GPU whose session freed it. A graph on GPU 1 may write
//! the client's VMM memory mapped through GPU 0 with access for GPU 1, so once the client
//! unmapped and freed that reservation on GPU 0 the driver could give its addresses to
//! another client's reservation while GPU 1's graph still wrote there. It stays reserved
//! until that graph goes, as for a graph of GPU 0 (graphs.rs).

mod common;
use common::*;
use omps_ring::wire::{self, vmm, Op};
use omps_shim::api::vmm::call_on;
use omps_shim::conn::{settings_from, Conn};
use std::time::{Duration, Instant};

const S: u32 = 9;

fn vmm_on(c: &Conn, dev: usize, kind: u32, handle: u32, args: [u64; 3]) -> Result<u64, i32> {
    call_on::<wire::U64Reply>(c, dev, kind, handle, args).map(|r| r.value)
}

fn capture_on(c: &Conn, dev: usize, op: Op) -> Result<u64, i32> {
    let mut ch = c.channel();
    ch.call(dev, op, |call| {
        bytemuck::bytes_of(&wire::CaptureCall {
            call,
            stream: S,
            mode: 0,
        })
        .to_vec()
    })?;
    Ok(if op == Op::CaptureEnd {
        ch.reply::<wire::U64Reply>().value
    } else {
        0
    })
}

#[test]
fn a_reservation_a_live_graph_on_another_gpu_writes_stays_reserved_until_the_graph_goes() {
    let (dir, first, _second, thread) = linked_gpus_server("graph-vmm-other-gpu");
    let settings = settings_from(|_| None).expect("settings");
    let sock = dir.join(omps_ring::sock::SOCKET_NAME);
    let a = Conn::connect_with(&sock, &settings).unwrap();
    // Its memory on GPU 0, mapped there with access for GPU 1 too.
    let g = vmm_on(&a, 0, vmm::GRANULARITY, 0, [0; 3]).unwrap();
    let va = vmm_on(&a, 0, vmm::RESERVE, 0, [g, 0, 0]).unwrap();
    let h = vmm_on(&a, 0, vmm::CREATE, 0, [g, 0, 0]).unwrap() as u32;
    vmm_on(&a, 0, vmm::MAP, h, [va, g, 0]).unwrap();
    vmm_on(&a, 0, vmm::SET_ACCESS, 0, [va, g, 0b11]).unwrap();
    // A graph on GPU 1 that writes it.
    let sc = wire::StreamCreate {
        id: S,
        flags: 1,
        ..Default::default()
    };
    a.push(1, Op::StreamCreate, &[bytemuck::bytes_of(&sc)])
        .unwrap();
    capture_on(&a, 1, Op::CaptureBegin).unwrap();
    memset_words_on(&a, S, va, 3, 1);
    let graph = capture_on(&a, 1, Op::CaptureEnd).unwrap() as u32;
    let mut ch = a.channel();
    ch.call(1, Op::GraphInstantiate, |call| {
        bytemuck::bytes_of(&wire::GraphInstantiate {
            call,
            graph,
            _pad: 0,
            flags: 0,
        })
        .to_vec()
    })
    .expect("instantiated on GPU 1");
    let exec = ch.reply::<wire::U64Reply>().value as u32;
    // Unmapped, released and freed on GPU 0, as natively.
    vmm_on(&a, 0, vmm::UNMAP, 0, [va, g, 0]).unwrap();
    vmm_on(&a, 0, vmm::RELEASE, h, [0; 3]).unwrap();
    vmm_on(&a, 0, vmm::ADDRESS_FREE, 0, [va, g, 0]).expect("freed, as natively");
    a.ping(0).unwrap();
    a.ping(1).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        first.vmm_live().0,
        1,
        "freed while a live graph on GPU 1 writes it"
    );
    assert!(
        vmm_on(&a, 0, vmm::ADDRESS_FREE, 0, [va, g, 0]).is_err(),
        "the client's no more"
    );
    // The graph goes: the reservation with it.
    let e = wire::Handle { id: exec, _pad: 0 };
    a.push(1, Op::GraphExecDestroy, &[bytemuck::bytes_of(&e)])
        .unwrap();
    a.ping(1).unwrap();
    let t = Instant::now();
    while first.vmm_live().0 != 0 && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(first.vmm_live().0, 0, "kept after the graph went");
    drop(ch);
    drop(a);
    assert!(ctl_at(&omps_ring::sock::operator_socket_in(&dir), "quit").0);
    thread.join().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
