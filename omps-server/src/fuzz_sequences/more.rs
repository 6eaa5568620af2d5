//! The families the fuzz reached last (issue 23): virtual memory (reservations, physical
//! handles, mappings, access, and the bystander's address as a hint or a target), CUDA
//! arrays and their copies, peer copies and peer access on a GPU with no peer, host
//! functions acknowledged late or never, and conditional graphs (homes, handles, nodes,
//! captures into bodies, clones, child nodes, updates). Records name what the sequence
//! made, or lie about it; every record is one a hostile client could send.

use super::client::{Bytes, Client, Held};
use crate::gpu::host::VMM_GRANULE;
use crate::worker::WorkerCtx;
use omps_ring::segment::HOSTFN_SLOTS;
use omps_ring::wire::{self, array, graph, vmm, Op};
use std::sync::atomic::Ordering;

/// One record of these families: false once the client is dead (it lied).
pub(super) fn step_more(
    me: &mut Client,
    ctx: &mut WorkerCtx,
    held: &mut Held,
    b: &mut Bytes,
    theirs: u64,
) -> bool {
    match b.u8() % 16 {
        0..=7 => step_vmm(me, ctx, held, b, theirs),
        8..=10 => step_arrays(me, ctx, held, b, theirs),
        11 | 12 => step_host_fns(me, ctx, held, b),
        13 => step_peer(me, ctx, held, b, theirs),
        _ => step_conditional(me, ctx, held, b),
    }
}

/// A VMM call: its answer's first word when it succeeded, None when it failed, Err when
/// the server found the record a lie.
fn vmm_call(
    me: &mut Client,
    ctx: &mut WorkerCtx,
    kind: u32,
    handle: u32,
    args: [u64; 3],
) -> Result<Option<u64>, ()> {
    let v = wire::Vmm {
        call: me.call(),
        kind,
        handle,
        args,
    };
    if !me.send(ctx, Op::Vmm, &[bytemuck::bytes_of(&v)]) {
        return Err(());
    }
    Ok((me.result() == 0).then(|| me.reply_u64()))
}

fn step_vmm(
    me: &mut Client,
    ctx: &mut WorkerCtx,
    held: &mut Held,
    b: &mut Bytes,
    theirs: u64,
) -> bool {
    let g = VMM_GRANULE;
    let r = match b.u8() % 8 {
        0 => {
            // A reservation, sometimes asking for the bystander's address.
            let size = g * (1 + b.u8() as u64 % 4);
            let hint = if b.u8().is_multiple_of(4) { theirs } else { 0 };
            vmm_call(me, ctx, vmm::RESERVE, 0, [size, 0, hint]).map(|r| {
                if let Some(at) = r {
                    held.reserved.push((at, size));
                }
            })
        }
        1 => {
            let size = g * (1 + b.u8() as u64 % 2);
            vmm_call(me, ctx, vmm::CREATE, 0, [size, 0, 0]).map(|r| {
                if let Some(id) = r {
                    held.vmm_handles.push((id as u32, size));
                }
            })
        }
        2 => {
            // A mapping of a handle at a reservation: sometimes past the handle's end,
            // at an offset into the reservation, or over the bystander's memory.
            let (Some((at, rn)), Some((h, hn))) =
                (b.pick(&held.reserved), b.pick(&held.vmm_handles))
            else {
                return true;
            };
            let len = if b.u8().is_multiple_of(8) {
                hn + g
            } else {
                hn.min(rn)
            };
            let addr = match b.u8() % 8 {
                0 => theirs,
                1 => at + g,
                _ => at,
            };
            vmm_call(me, ctx, vmm::MAP, h, [addr, len, 0]).map(|r| {
                if r.is_some() {
                    held.mapped.push((addr, len));
                }
            })
        }
        3 => {
            // Access for this GPU, to a mapping or to the bystander's memory (refused).
            let (addr, len) = match b.pick(&held.mapped) {
                Some(m) if !b.u8().is_multiple_of(8) => m,
                _ => (theirs, g),
            };
            vmm_call(me, ctx, vmm::SET_ACCESS, 0, [addr, len, 0]).map(drop)
        }
        4 => {
            // A memset through a mapping, within it or running past it.
            let Some((addr, len)) = b.pick(&held.mapped) else {
                return true;
            };
            let count = len / 4 + u64::from(b.u8().is_multiple_of(4));
            return me.memset_words(ctx, b, held, addr, count);
        }
        5 => {
            // An unmap, of a whole mapping or of a part (refused).
            if held.mapped.is_empty() {
                return true;
            }
            let i = b.u8() as usize % held.mapped.len();
            let (addr, len) = held.mapped[i];
            let part = b.u8().is_multiple_of(4);
            vmm_call(
                me,
                ctx,
                vmm::UNMAP,
                0,
                [addr, if part { len / 2 } else { len }, 0],
            )
            .map(|r| {
                if r.is_some() {
                    held.mapped.swap_remove(i);
                }
            })
        }
        6 => {
            // A release, mapped or not.
            if held.vmm_handles.is_empty() {
                return true;
            }
            let i = b.u8() as usize % held.vmm_handles.len();
            let (h, _) = held.vmm_handles.swap_remove(i);
            vmm_call(me, ctx, vmm::RELEASE, h, [0; 3]).map(drop)
        }
        _ => {
            // A reservation given back, with mappings in it or not (refused then).
            if held.reserved.is_empty() {
                return true;
            }
            let i = b.u8() as usize % held.reserved.len();
            let (at, size) = held.reserved[i];
            vmm_call(me, ctx, vmm::ADDRESS_FREE, 0, [at, size, 0]).map(|r| {
                if r.is_some() {
                    held.reserved.swap_remove(i);
                }
            })
        }
    };
    r.is_ok()
}

fn step_arrays(
    me: &mut Client,
    ctx: &mut WorkerCtx,
    held: &mut Held,
    b: &mut Bytes,
    theirs: u64,
) -> bool {
    match b.u8() % 3 {
        0 => {
            // A 1D or 2D array of 32-bit texels, 1, 2 or 4 channels (or a format the
            // server does not know).
            let width = 1 + b.u8() as u64 % 64;
            let height = b.u8() as u64 % 4;
            let channels = [1u64, 2, 4][b.u8() as usize % 3];
            let format = if b.u8().is_multiple_of(8) { 0x7f } else { 0x03 };
            let c = wire::ArrayCall {
                call: me.call(),
                kind: array::CREATE,
                id: 0,
                args: [width, height, 0, format, channels, 0, 0],
            };
            if !me.send(ctx, Op::Array, &[bytemuck::bytes_of(&c)]) {
                return false;
            }
            if me.result() == 0 {
                held.arrays
                    .push((me.reply_u64() as u32, width * channels * 4, height.max(1)));
            }
        }
        1 => {
            // A copy between an array and device memory (its own, or the bystander's:
            // refused), or out of one array into another.
            let Some((id, row, rows)) = b.pick(&held.arrays) else {
                return true;
            };
            let arr = wire::CopySide {
                array: id,
                ..Default::default()
            };
            let dev = match (b.pick(&held.allocs), b.u8() % 8) {
                (_, 0) | (None, _) => theirs,
                (Some((p, _)), _) => p,
            };
            let mem = wire::CopySide {
                dev,
                pitch: row,
                height: rows,
                ..Default::default()
            };
            let (src, dst) = match b.u8() % 3 {
                0 => (arr, mem),
                1 => (mem, arr),
                _ => {
                    let other = b.pick(&held.arrays).map_or(arr, |(o, ..)| wire::CopySide {
                        array: o,
                        ..Default::default()
                    });
                    (arr, other)
                }
            };
            let c = wire::ArrayCopy {
                stream: b.pick(&held.streams).unwrap_or(0),
                _pad: 0,
                src,
                dst,
                width: row + u64::from(b.u8().is_multiple_of(8)),
                height: rows,
                depth: 1,
            };
            return me.send(ctx, Op::ArrayCopy, &[bytemuck::bytes_of(&c)]);
        }
        _ => {
            if held.arrays.is_empty() {
                return true;
            }
            let (id, ..) = held.arrays.swap_remove(b.u8() as usize % held.arrays.len());
            let c = wire::ArrayCall {
                call: me.call(),
                kind: array::DESTROY,
                id,
                args: [0; 7],
            };
            return me.send(ctx, Op::Array, &[bytemuck::bytes_of(&c)]);
        }
    }
    true
}

/// A host function queued on a stream (its slot sometimes out of range), or one queued
/// before acknowledged now. One never acknowledged holds its stream until the client dies.
fn step_host_fns(me: &mut Client, ctx: &mut WorkerCtx, held: &mut Held, b: &mut Bytes) -> bool {
    if b.u8() & 1 == 0 {
        let slot = b.u8() as u32 % (HOSTFN_SLOTS as u32 + 2);
        let seq = me.call().seq;
        let h = wire::HostFunc {
            stream: b.pick(&held.streams).unwrap_or(0),
            slot,
            seq,
            _pad: 0,
        };
        let op = if b.u8().is_multiple_of(4) {
            Op::HostNode
        } else {
            Op::HostFunc
        };
        if !me.send(ctx, op, &[bytemuck::bytes_of(&h)]) {
            return false;
        }
        held.host_fns.push((slot, seq));
    } else if !held.host_fns.is_empty() {
        let (slot, seq) = held
            .host_fns
            .swap_remove(b.u8() as usize % held.host_fns.len());
        if let Some(w) = me.client.seg.hostfn(slot as usize) {
            // The client's thread ran the function: it acknowledges, as the shim does.
            w.ack.store(seq, Ordering::Release);
        }
        ctx.poll();
    }
    true
}

/// Peer copies and peer access on a GPU that has no peer: the far end its own memory,
/// a mapping, or the bystander's memory. Every one must be refused.
fn step_peer(
    me: &mut Client,
    ctx: &mut WorkerCtx,
    held: &mut Held,
    b: &mut Bytes,
    theirs: u64,
) -> bool {
    if b.u8().is_multiple_of(4) {
        let a = wire::PeerAccess {
            call: me.call(),
            peer: b.u8() as u32 % 3,
            _pad: 0,
        };
        return me.send(ctx, Op::PeerAccess, &[bytemuck::bytes_of(&a)]);
    }
    let near = b.pick(&held.allocs).map_or(theirs, |(p, _)| p);
    let far = match b.u8() % 3 {
        0 => theirs,
        1 => b.pick(&held.mapped).map_or(theirs, |(p, _)| p),
        _ => b.pick(&held.allocs).map_or(theirs, |(p, _)| p),
    };
    let far_is_src = u32::from(b.u8() & 1 == 0);
    let (dst, src) = if far_is_src == 1 {
        (near, far)
    } else {
        (far, near)
    };
    let c = wire::CopyPeer {
        dst,
        src,
        len: 64,
        stream: b.pick(&held.streams).unwrap_or(0),
        peer: b.u8() as u32 % 3,
        far_is_src,
        _pad: 0,
    };
    me.send(ctx, Op::CopyPeer, &[bytemuck::bytes_of(&c)])
}

/// Conditional graphs, as the shim builds them: any kind, naming graphs, streams and
/// handles the sequence made (or others).
fn step_conditional(me: &mut Client, ctx: &mut WorkerCtx, held: &mut Held, b: &mut Bytes) -> bool {
    let kind = b.u8() as u32 % (graph::CHILD_NODE + 2);
    let graph_id = b.pick(&held.graphs).unwrap_or(b.u8() as u32);
    let handle = match kind {
        graph::EXEC_UPDATE => b.pick(&held.execs).map_or(7, u64::from),
        _ => b.u8() as u64 % 4,
    };
    let c = wire::GraphCond {
        call: me.call(),
        kind,
        stream: b.pick(&held.streams).unwrap_or(0),
        graph: graph_id,
        size: b.u8() as u32 % 4,
        handle,
        value: b.u8() as u32 % 3,
        flags: b.u8() as u32 % 2,
    };
    if !me.send(ctx, Op::GraphCond, &[bytemuck::bytes_of(&c)]) {
        return false;
    }
    if me.result() == 0 && matches!(kind, graph::COND_HOME | graph::GRAPH_CLONE) {
        held.graphs.push(me.reply_u64() as u32);
    }
    true
}
