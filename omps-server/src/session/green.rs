//! A client's green contexts (`cuGreenCtxCreate` in the shim, `api/green.rs`). The shim
//! keeps them; the server needs two things of each: how many SMs it has, so that the work
//! of its streams runs in the confinement slot ([`crate::sched::confine`]) of that many chunks,
//! never wider than the client's own share; and which stream is its legacy default stream,
//! which orders against the green context's blocking streams only, as a context's does.

use super::kinds::green::GreenCtx;
use super::*;
use wire::green;

/// Where work of `sms` SMs runs for a client placed at `place`, on a GPU split as `chunks`:
/// the slot of the last `ceil(sms / chunk)` chunks, if that is inside the client's share
/// and narrower than it; else the client's own placement. Thread limits' slots are the
/// last `k` chunks, so any narrower one lies inside them. The slot outside the
/// latency-critical reserve and static partitions hold other chunks than the last: work
/// there keeps the client's whole share (never another's SMs).
pub fn narrowed(
    place: placement::Placement,
    sms: u32,
    chunks: crate::sched::confine::SmChunks,
) -> placement::Placement {
    if chunks.chunks == 0 {
        return place;
    }
    let k = sms.div_ceil(chunks.chunk.max(1)).max(1);
    let share = match place.slot {
        None => chunks.chunks,
        Some(s) if s < chunks.chunks as usize => s as u32 + 1,
        Some(_) => return place,
    };
    if k >= share {
        return place;
    }
    placement::Placement {
        qos: place.qos,
        slot: Some(chunks.limit_slot(k)),
    }
}

impl Session {
    /// The placement of the streams of green context `green` (0: the client's own), and
    /// the id of the legacy stream they order against.
    pub(super) fn green_place(&self, ctx: &WorkerCtx, green: u32) -> (placement::Placement, u32) {
        match self.greens.get(&green) {
            Some(g) => (
                narrowed(self.placement, g.sms, ctx.gpu.sm_chunks()),
                g.legacy,
            ),
            None => (self.placement, wire::STREAM_DEFAULT),
        }
    }

    pub(super) fn handle_green(
        &mut self,
        ctx: &mut WorkerCtx,
        g: wire::GreenCall,
    ) -> Result<(), Malformed> {
        let chunks = ctx.gpu.sm_chunks();
        match g.kind {
            green::QUERY => self.complete_pod(
                g.call,
                Ok(wire::GreenInfo {
                    total: chunks.total,
                    chunk: chunks.chunk,
                    chunks: chunks.chunks,
                    _pad: 0,
                }),
            ),
            green::CREATE => {
                if g.green == 0 || self.greens.contains_key(&g.green) {
                    return bad(format!("green context id {} reused", g.green));
                }
                if chunks.chunks == 0 {
                    // The shim asked first; an honest one that raced a reset learns here.
                    return self.complete(g.call, code::NOT_SUPPORTED, &[]);
                }
                if g.sms == 0 || g.sms > chunks.total {
                    return bad(format!(
                        "green context of {} SMs on a GPU of {}",
                        g.sms, chunks.total
                    ));
                }
                // Its legacy stream is no blocking stream of anyone's: it is the one
                // they order against.
                self.new_stream(g.stream, 1, 0, g.green)?;
                self.greens.insert(
                    g.green,
                    GreenCtx {
                        sms: g.sms,
                        legacy: g.stream,
                    },
                );
                self.complete(g.call, 0, &[])
            }
            green::STREAM => {
                if !self.greens.contains_key(&g.green) {
                    return bad(format!("stream in unknown green context {}", g.green));
                }
                if g.flags > 1 {
                    return bad(format!("stream flags {:#x}", g.flags));
                }
                self.new_stream(g.stream, g.flags, g.priority, g.green)?;
                self.complete(g.call, 0, &[])
            }
            green::DESTROY => {
                if self.greens.remove(&g.green).is_none() {
                    return bad(format!("destroying unknown green context {}", g.green));
                }
                let mut ids: Vec<u32> = self
                    .streams
                    .iter()
                    .filter(|(_, s)| s.green == g.green)
                    .map(|(&id, _)| id)
                    .collect();
                ids.sort_unstable();
                for id in ids {
                    self.destroy_stream(ctx, id)?;
                }
                self.complete(g.call, 0, &[])
            }
            k => bad(format!("green context call of kind {k}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sched::confine::SmChunks;
    use crate::sched::placement::{Placement, Qos};

    const H100: SmChunks = SmChunks {
        total: 132,
        chunk: 8,
        chunks: 15,
    };

    fn at(slot: Option<usize>) -> Placement {
        Placement {
            qos: Qos::Normal,
            slot,
        }
    }

    #[test]
    fn a_green_context_narrows_within_the_clients_share_only() {
        // 16 SMs on the whole device: the last two chunks.
        assert_eq!(narrowed(at(None), 16, H100), at(Some(1)));
        // Rounded up to whole chunks: 17 SMs take three.
        assert_eq!(narrowed(at(None), 17, H100), at(Some(2)));
        // All SMs: the client's own placement.
        assert_eq!(narrowed(at(None), 132, H100), at(None));
        // A client limited to 4 chunks that asks for 9 keeps its 4.
        assert_eq!(narrowed(at(Some(3)), 72, H100), at(Some(3)));
        assert_eq!(narrowed(at(Some(3)), 8, H100), at(Some(0)));
        // Outside the reserve, or in a partition: the client's own SMs.
        assert_eq!(narrowed(at(Some(15)), 8, H100), at(Some(15)));
        assert_eq!(narrowed(at(Some(17)), 8, H100), at(Some(17)));
        let none = SmChunks {
            total: 132,
            chunk: 1,
            chunks: 0,
        };
        assert_eq!(narrowed(at(None), 16, none), at(None));
    }
}
