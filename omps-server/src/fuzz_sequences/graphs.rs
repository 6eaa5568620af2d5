//! Captures and graphs, IPC openings of the bystander's memory, link and JIT containers.

use super::client::{Bytes, Client, Held};
use crate::worker::WorkerCtx;
use omps_ring::wire::{self, Op};

/// The families past the basic ones: captures and graphs, IPC, link and JIT containers.
pub(super) fn step_graphs_ipc_link(
    me: &mut Client,
    ctx: &mut WorkerCtx,
    held: &mut Held,
    b: &mut Bytes,
    exported: Option<wire::IpcHandle>,
) -> bool {
    match b.u8() % 10 {
        0 | 1 => {
            // A capture begins or ends on one of its streams (or the default one).
            let c = wire::CaptureCall {
                call: me.call(),
                stream: b.pick(&held.streams).unwrap_or(0),
                mode: (b.u8() % 4) as u32,
            };
            let begin = b.u8() & 1 == 0;
            let op = if begin {
                Op::CaptureBegin
            } else {
                Op::CaptureEnd
            };
            if !me.send(ctx, op, &[bytemuck::bytes_of(&c)]) {
                return false;
            }
            if !begin && me.result() == 0 {
                held.graphs.push(me.reply_u64() as u32);
            }
        }
        2 => {
            // Instantiation, with flags the driver knows or not.
            if let Some(graph) = b.pick(&held.graphs) {
                let flags = [0u64, 1, 4, 8, 2, 1 << 40][b.u8() as usize % 6];
                let g = wire::GraphInstantiate {
                    call: me.call(),
                    graph,
                    _pad: 0,
                    flags,
                };
                if !me.send(ctx, Op::GraphInstantiate, &[bytemuck::bytes_of(&g)]) {
                    return false;
                }
                if me.result() == 0 {
                    held.execs.push(me.reply_u64() as u32);
                }
            }
        }
        3 => {
            if let Some(exec) = b.pick(&held.execs) {
                let stream = b.pick(&held.streams).unwrap_or(0);
                match b.u8() % 4 {
                    // A profiler's questions and replays: a twin's nodes, then a replay
                    // with a count and event ids that may not fit it.
                    2 => {
                        let q = wire::GraphProfileInfo {
                            call: me.call(),
                            exec,
                            first: b.u8() as u32 % 4,
                        };
                        return me.send(ctx, Op::GraphProfileInfo, &[bytemuck::bytes_of(&q)]);
                    }
                    3 => {
                        let count = (b.u8() % 4) as u32;
                        let ids: Vec<u8> = (0..2 * count)
                            .flat_map(|_| b.pick(&held.events).unwrap_or(1).to_le_bytes())
                            .collect();
                        let l = wire::GraphLaunchProfiled {
                            exec,
                            stream,
                            count,
                            _pad: 0,
                        };
                        return me.send(
                            ctx,
                            Op::GraphLaunchProfiled,
                            &[bytemuck::bytes_of(&l), &ids],
                        );
                    }
                    k => {
                        let l = wire::GraphLaunch { exec, stream };
                        let op = if k == 0 {
                            Op::GraphLaunch
                        } else {
                            Op::GraphUpload
                        };
                        return me.send(ctx, op, &[bytemuck::bytes_of(&l)]);
                    }
                }
            }
        }
        4 => {
            let (list, op) = if b.u8() & 1 == 0 {
                (&mut held.graphs, Op::GraphDestroy)
            } else {
                (&mut held.execs, Op::GraphExecDestroy)
            };
            if !list.is_empty() {
                let id = list.swap_remove(b.u8() as usize % list.len());
                let h = wire::Handle { id, _pad: 0 };
                return me.send(ctx, op, &[bytemuck::bytes_of(&h)]);
            }
        }
        5 => {
            // The bystander's memory opened, or a handle with a byte changed.
            if let Some(mut handle) = exported {
                if b.u8().is_multiple_of(4) {
                    let i = b.u8() as usize % 64;
                    handle.bytes[i] ^= b.u8() | 1;
                }
                let o = wire::IpcOpen {
                    call: me.call(),
                    handle,
                };
                if !me.send(ctx, Op::IpcOpenMemHandle, &[bytemuck::bytes_of(&o)]) {
                    return false;
                }
                if me.result() == 0 {
                    held.opened.push(me.reply_u64());
                }
            }
        }
        6 => {
            if !held.opened.is_empty() {
                let ptr = held.opened.swap_remove(b.u8() as usize % held.opened.len());
                let c = wire::IpcCall {
                    call: me.call(),
                    ptr,
                };
                return me.send(ctx, Op::IpcCloseMemHandle, &[bytemuck::bytes_of(&c)]);
            }
        }
        7 | 8 => {
            // A link or JIT container of fuzzed bytes through channel 0's first chunk.
            let len = b.u8() as usize % 96;
            let blob: Vec<u8> = (0..len).map(|_| b.u8()).collect();
            match me.upload(ctx, &blob) {
                None => return true,
                Some(false) => return false,
                Some(true) => {}
            }
            let load = wire::ModuleLoad {
                call: me.call(),
                blob_len: blob.len() as u64,
            };
            let op = if b.u8() & 1 == 0 {
                Op::Link
            } else {
                Op::ModuleLoadJit
            };
            return me.send(ctx, op, &[bytemuck::bytes_of(&load)]);
        }
        _ => {
            // A memory query: the client's own view.
            let call = me.call();
            return me.send(ctx, Op::Ping, &[bytemuck::bytes_of(&call)]);
        }
    }
    true
}
