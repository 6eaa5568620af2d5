//! IPC handles (crate::client::ipc): exporting an allocation, opening another client's, closing.

use super::*;
use crate::client::ipc::{OpenError, Token};
use omps_ring::wire::ipc::MAGIC;

/// CUDA_ERROR_INVALID_CONTEXT: a process opening its own handle, as CUDA answers.
const INVALID_CONTEXT: i32 = 201;

impl Session {
    pub(super) fn handle_ipc(
        &mut self,
        ctx: &mut WorkerCtx,
        op: Op,
        p: &[u8],
        tail: &[u8],
    ) -> Result<(), Malformed> {
        fixed_only(tail, "ipc")?;
        let me = self.client.id;
        match op {
            Op::IpcGetMemHandle => {
                let c = rec::<wire::IpcCall>(p);
                let Some(&size) = self.allocs.get(&c.ptr) else {
                    // Only the base of an allocation of its own, as natively.
                    return self.complete(c.call, code::INVALID_VALUE, &[]);
                };
                let token = ctx
                    .shared
                    .ipc
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .export(me, c.ptr, size);
                self.complete_pod(c.call, Ok(handle_bytes(&token, size)))?;
            }
            Op::IpcOpenMemHandle => {
                let o = rec::<wire::IpcOpen>(p);
                let r = if let Some(token) = ours(&o.handle) {
                    let opened = ctx
                        .shared
                        .ipc
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .open(&token, me);
                    match opened {
                        Ok(x) => {
                            self.imported.entry(x.ptr).or_insert((x.size, 0)).1 += 1;
                            Ok(wire::U64Reply { value: x.ptr })
                        }
                        Err(OpenError::Own) => Err(CuError(INVALID_CONTEXT)),
                        Err(OpenError::Unknown) => Err(CuError(code::INVALID_VALUE)),
                        Err(OpenError::TooMany) => Err(CuError(code::OUT_OF_MEMORY)),
                    }
                } else {
                    Err(CuError(code::INVALID_VALUE))
                };
                self.complete_pod(o.call, r)?;
            }
            Op::IpcCloseMemHandle => {
                let c = rec::<wire::IpcCall>(p);
                let Some(e) = self.imported.get_mut(&c.ptr) else {
                    return self.complete(c.call, code::INVALID_VALUE, &[]);
                };
                e.1 -= 1;
                let size = e.0;
                if e.1 == 0 {
                    self.imported.remove(&c.ptr);
                    // The last opening stays while an executable graph of the client uses
                    // the memory (session/graph_memory.rs): closed, the exporter's free
                    // would let the driver give it to someone else under the graph.
                    let held =
                        crate::session::kinds::graph_held::HeldForGraphs::IpcClose(c.ptr, size);
                    if self.hold_other_for_graphs(held) {
                        return self.complete(c.call, 0, &[]);
                    }
                }
                // The opening is given back once this client's work on it is done: until
                // then the owner's free cannot release the memory under it.
                ctx.release_later(
                    self,
                    Release {
                        ipc_close: vec![c.ptr],
                        ..Default::default()
                    },
                );
                self.complete(c.call, 0, &[])?;
            }
            Op::IpcGetEventHandle => {
                let c = rec::<wire::HandleCall>(p);
                let Some(&e) = self.events.get(&c.id) else {
                    return bad(format!("unknown event {}", c.id));
                };
                // Its last record is in a capture: another process's wait on it would fork
                // the capture into its stream (as recording a shared event in one would).
                if self.captured_events.contains(&c.id) {
                    return self.complete(c.call, code::STREAM_CAPTURE_UNSUPPORTED, &[]);
                }
                let token = ctx
                    .shared
                    .ipc
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .export_event(me, e);
                self.complete_pod(c.call, Ok(handle_bytes(&token, 0)))?;
            }
            Op::IpcOpenEventHandle => {
                let o = rec::<wire::IpcOpenEvent>(p);
                if self.events.contains_key(&o.id) {
                    return bad(format!("event id {} reused", o.id));
                }
                if self.events.len() >= self.client.max_events() {
                    return bad("more events than its welcome allowed (OMPS_MAX_EVENTS)");
                }
                let r = match ours(&o.handle) {
                    None => Err(CuError(code::INVALID_VALUE)),
                    Some(token) => match ctx
                        .shared
                        .ipc
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .open_event(&token, me)
                    {
                        Ok(h) => {
                            self.events.insert(o.id, h);
                            Ok(())
                        }
                        Err(OpenError::Own) => Err(CuError(INVALID_CONTEXT)),
                        Err(OpenError::Unknown) => Err(CuError(code::INVALID_VALUE)),
                        Err(OpenError::TooMany) => Err(CuError(code::OUT_OF_MEMORY)),
                    },
                };
                self.complete(o.call, r.err().map_or(0, |e| e.0), &[])?;
            }
            _ => unreachable!("dispatched to the IPC family: {op:?}"),
        }
        Ok(())
    }
}

/// A handle's 64 bytes: magic, token, size (0 for an event), this server's PID.
fn handle_bytes(token: &Token, size: u64) -> wire::IpcHandle {
    let mut h = wire::IpcHandle { bytes: [0; 64] };
    h.bytes[..8].copy_from_slice(&MAGIC);
    h.bytes[8..24].copy_from_slice(token);
    h.bytes[24..32].copy_from_slice(&size.to_le_bytes());
    h.bytes[32..36].copy_from_slice(&std::process::id().to_le_bytes());
    h
}

/// The token of a handle this server made, None for anything else.
fn ours(h: &wire::IpcHandle) -> Option<Token> {
    let b = &h.bytes;
    (b[..8] == MAGIC && b[32..36] == std::process::id().to_le_bytes())
        .then(|| b[8..24].try_into().expect("16 bytes"))
}
