//! The basic families of the fuzz: allocations, memsets and copies (some aimed at the
//! bystander's memory), streams, events, module loads, launches and syncs, lies, death.

use super::client::{Bytes, Client, Held};
use crate::worker::WorkerCtx;
use omps_ring::wire::{self, Op};

/// One record of the sequence: false once the client is dead (it lied, or died here).
pub(super) fn step_basic(
    me: &mut Client,
    ctx: &mut WorkerCtx,
    held: &mut Held,
    b: &mut Bytes,
    theirs: u64,
    tag: u8,
) -> bool {
    match tag % 16 {
        0 | 1 => {
            let size = (b.u8() as u64 + 1) * 64;
            if let Some(p) = me.alloc(ctx, size) {
                held.allocs.push((p, size));
            }
        }
        2 => {
            if let Some(i) = (!held.allocs.is_empty()).then(|| b.u8() as usize % held.allocs.len())
            {
                let (ptr, _) = held.allocs.swap_remove(i);
                return me.send(
                    ctx,
                    Op::MemFree,
                    &[bytemuck::bytes_of(&wire::MemFree { ptr })],
                );
            }
        }
        3 => {
            // A memset inside an allocation, or one running past its end or into the
            // other client's memory (refused).
            if let Some((p, n)) = b.pick(&held.allocs) {
                let over = b.u8().is_multiple_of(4);
                let count = if over { n / 4 + 1 } else { n / 4 };
                let dst = if b.u8().is_multiple_of(8) { theirs } else { p };
                return me.memset_words(ctx, b, held, dst, count);
            }
        }
        4 => {
            // A copy between two of its allocations, or from or into the other client's
            // memory (refused).
            if let (Some((d, dn)), Some((s, sn))) = (b.pick(&held.allocs), b.pick(&held.allocs)) {
                let (src, dst) = match b.u8() % 8 {
                    0 => (theirs, d),
                    1 => (s, theirs),
                    _ => (s, d),
                };
                let c = wire::CopyDtoD {
                    dst,
                    src,
                    len: dn.min(sn),
                    stream: 0,
                    _pad: 0,
                };
                return me.send(ctx, Op::CopyDtoD, &[bytemuck::bytes_of(&c)]);
            }
        }
        5 => {
            let id = 1000 + held.next_id;
            held.next_id += 1;
            let c = wire::StreamCreate {
                id,
                flags: (b.u8() & 1) as u32,
                priority: 0,
                _pad: 0,
            };
            held.streams.push(id);
            return me.send(ctx, Op::StreamCreate, &[bytemuck::bytes_of(&c)]);
        }
        6 => {
            if let Some(i) =
                (!held.streams.is_empty()).then(|| b.u8() as usize % held.streams.len())
            {
                let id = held.streams.swap_remove(i);
                let h = wire::Handle { id, _pad: 0 };
                return me.send(ctx, Op::StreamDestroy, &[bytemuck::bytes_of(&h)]);
            }
        }
        7 => {
            let id = 5000 + held.next_id;
            held.next_id += 1;
            held.events.push(id);
            let c = wire::EventCreate { id, flags: 0 };
            return me.send(ctx, Op::EventCreate, &[bytemuck::bytes_of(&c)]);
        }
        8 => {
            // A profiler: tracing on or off (the server then keys the work of the spans
            // events start), and its spans' times asked.
            match b.u8() % 8 {
                0 => {
                    let p = wire::Profiling {
                        call: me.call(),
                        on: (b.u8() & 1) as u32,
                        _pad: 0,
                    };
                    return me.send(ctx, Op::Profiling, &[bytemuck::bytes_of(&p)]);
                }
                1 if !held.events.is_empty() => {
                    let count = (b.u8() % 4) as u32;
                    let anchor = b.pick(&held.events).unwrap_or(1);
                    let ids: Vec<u8> = (0..2 * count)
                        .flat_map(|_| b.pick(&held.events).unwrap_or(1).to_le_bytes())
                        .collect();
                    let t = wire::EventTimes {
                        call: me.call(),
                        anchor,
                        count,
                    };
                    return me.send(ctx, Op::EventTimes, &[bytemuck::bytes_of(&t), &ids]);
                }
                _ => {}
            }
            if let Some(event) = b.pick(&held.events) {
                let op = if b.u8() & 1 == 0 {
                    Op::EventRecord
                } else {
                    Op::StreamWaitEvent
                };
                let r = wire::EventRecord {
                    event,
                    stream: b.pick(&held.streams).unwrap_or(0),
                };
                return me.send(ctx, op, &[bytemuck::bytes_of(&r)]);
            }
        }
        9 => {
            if let Some((m, f)) = me.load(ctx) {
                held.modules.push(m);
                held.functions.extend(f);
            }
        }
        10 => {
            // fill_u32 over one of its allocations, within it.
            if let (Some(func), Some((p, n))) = (b.pick(&held.functions), b.pick(&held.allocs)) {
                let l = wire::Launch {
                    func,
                    stream: b.pick(&held.streams).unwrap_or(0),
                    grid: [1; 3],
                    block: [1; 3],
                    args_len: 16,
                    ..Default::default()
                };
                let mut args = p.to_le_bytes().to_vec();
                args.extend_from_slice(&(b.u8() as u32).to_le_bytes());
                args.extend_from_slice(&((n / 4) as u32).to_le_bytes());
                return me.send(ctx, Op::Launch, &[bytemuck::bytes_of(&l), &args]);
            }
        }
        11 => {
            if let Some(i) =
                (!held.modules.is_empty()).then(|| b.u8() as usize % held.modules.len())
            {
                let id = held.modules.swap_remove(i);
                held.functions.clear();
                let h = wire::Handle { id, _pad: 0 };
                return me.send(ctx, Op::ModuleUnload, &[bytemuck::bytes_of(&h)]);
            }
        }
        12 => {
            let call = me.call();
            let stream = b.pick(&held.streams).unwrap_or(0);
            let h = wire::HandleCall {
                call,
                id: stream,
                _pad: 0,
            };
            return me.send(ctx, Op::StreamSync, &[bytemuck::bytes_of(&h)]);
        }
        13 => {
            // A record that may lie: any tag, any bytes.
            let tag = b.u8() as u32 % 64;
            let len = b.u8() as usize % 64;
            let rec: Vec<u8> = (0..len).map(|_| b.u8()).collect();
            let ok = me.s.handle(ctx, tag, &rec).is_ok();
            ctx.poll();
            return ok;
        }
        14 if b.u8().is_multiple_of(8) => return false, // dies here
        _ => {
            let call = me.call();
            return me.send(ctx, Op::Ping, &[bytemuck::bytes_of(&call)]);
        }
    }
    true
}
