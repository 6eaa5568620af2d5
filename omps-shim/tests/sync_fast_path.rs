//! A synchronization with nothing queued since the last one the GPU signalled completes
//! without asking the GPU; anything queued, or an error to report, sends it to the GPU.

mod common;
use common::*;
use omps_ring::wire::{CallHdr, HandleCall, Op};
use omps_shim::conn::Conn;

fn stream_sync(c: &Conn) -> Result<(), i32> {
    c.channel().call(0, Op::StreamSync, |call| {
        bytemuck::bytes_of(&HandleCall {
            call,
            id: 0,
            _pad: 0,
        })
        .to_vec()
    })
}

fn ctx_sync(c: &Conn) -> Result<(), i32> {
    c.channel().call(0, Op::CtxSync, |call: CallHdr| {
        bytemuck::bytes_of(&call).to_vec()
    })
}

#[test]
fn idle_synchronizations_skip_the_gpu_and_busy_ones_do_not() {
    let srv = TestServer::start("syncfast");
    let c = Conn::connect_to(&srv.socket()).unwrap();
    let p = alloc(&c, 4096);
    let gpu_writes = || srv.gpu.completions_written();
    let w = gpu_writes();

    stream_sync(&c).unwrap();
    assert_eq!(gpu_writes(), w, "nothing ever queued: answered at once");

    memset(&c, p);
    stream_sync(&c).unwrap();
    assert_eq!(gpu_writes(), w + 1, "work queued: the GPU signals");
    stream_sync(&c).unwrap();
    stream_sync(&c).unwrap();
    assert_eq!(
        gpu_writes(),
        w + 1,
        "nothing queued since: answered at once"
    );

    ctx_sync(&c).unwrap();
    ctx_sync(&c).unwrap();
    assert_eq!(gpu_writes(), w + 2);
    memset(&c, p);
    ctx_sync(&c).unwrap();
    assert_eq!(gpu_writes(), w + 3);

    // An error queued since the last sync is reported by the next one, then cleared. That
    // answer did not come from the GPU, so it proves nothing about the stream: the sync
    // after it asks the GPU again.
    memset(&c, p + (1 << 20));
    assert_eq!(stream_sync(&c), Err(1));
    assert_eq!(gpu_writes(), w + 3, "the error was answered at once");
    stream_sync(&c).unwrap();
    assert_eq!(
        gpu_writes(),
        w + 4,
        "after an error answer, the GPU is asked"
    );
}

/// A device-to-host copy through staging chunk 0 of a channel, waited for as the shim does.
fn d2h_chunk(c: &Conn, src: u64, len: u32) {
    let mut ch = c.channel();
    let seq = ch.claim_chunk(0);
    let rec = omps_ring::wire::ChunkCopy {
        dev: src,
        channel: ch.idx,
        chunk: 0,
        len,
        seq,
        stream: 0,
        _pad: 0,
    };
    c.push(0, Op::CopyDtoHChunk, &[bytemuck::bytes_of(&rec)])
        .unwrap();
    ch.wait_chunk(0).unwrap();
}

#[test]
fn a_sync_after_a_waited_for_staged_copy_skips_the_gpu() {
    let srv = TestServer::start("syncchunk");
    let c = Conn::connect_to(&srv.socket()).unwrap();
    let p = alloc(&c, 4096);
    let gpu_writes = || srv.gpu.completions_written();
    let w = gpu_writes();
    d2h_chunk(&c, p, 4);
    assert_eq!(gpu_writes(), w + 1, "the chunk's completion");
    stream_sync(&c).unwrap();
    assert_eq!(
        gpu_writes(),
        w + 1,
        "the chunk's word already covers the stream"
    );
    // Work queued after the copy sends the next sync to the GPU again.
    memset(&c, p);
    stream_sync(&c).unwrap();
    assert_eq!(gpu_writes(), w + 2);
}
