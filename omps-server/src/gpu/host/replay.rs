//! The host GPU's graphs: the work a captured stream records instead of running, and
//! its replay on a stream when an executable graph is launched (conditional nodes read
//! their handles when their turn comes). Kept apart from the device calls in
//! `gpu_host.rs`, which record into a capture or run at once.

use super::ops::HostOp;
use super::state::{HostGpu, State};
use crate::gpu::{code, CuError, Gpu, GpuResult};
use std::sync::atomic::{AtomicU32, Ordering};

impl State {
    /// Drops the bodies of `ops`' conditional nodes (and theirs), as the driver frees a
    /// conditional node's bodies with the graph that holds it.
    pub(super) fn drop_bodies(&mut self, ops: &[HostOp]) {
        for op in ops {
            if let HostOp::Cond { bodies, .. } = op {
                for b in bodies {
                    if let Some(inner) = self.graphs.remove(b) {
                        self.drop_bodies(&inner);
                    }
                }
            }
        }
    }

    /// `ops` as a copy of their graph has them (cuGraphClone, a child node): conditional
    /// nodes get bodies of their own, copies of theirs, as the driver copies them.
    pub(super) fn copy_ops(&mut self, ops: &[HostOp]) -> GpuResult<Vec<HostOp>> {
        ops.iter()
            .map(|op| match op {
                HostOp::Cond {
                    handle,
                    kind,
                    bodies,
                    run,
                } => {
                    let mut copies = Vec::with_capacity(bodies.len());
                    for b in bodies {
                        let body = self
                            .graphs
                            .get(b)
                            .cloned()
                            .ok_or(CuError(code::INVALID_VALUE))?;
                        let body = self.copy_ops(&body)?;
                        let g = self.next_handle;
                        self.next_handle += 1;
                        self.graphs.insert(g, body);
                        copies.push(g);
                    }
                    Ok(HostOp::Cond {
                        handle: *handle,
                        kind: *kind,
                        bodies: copies,
                        run: run.clone(),
                    })
                }
                op => Ok(op.clone()),
            })
            .collect()
    }

    /// The capture stream `s` records into: its own, or the one it forked from.
    pub(super) fn origin(&self, s: usize) -> usize {
        match self.joined.get(&s) {
            Some(&o) if self.capturing.contains_key(&o) => o,
            _ => s,
        }
    }

    /// `ops` as an instantiation copies them: conditional bodies' work included.
    pub(super) fn resolve(&self, ops: &[HostOp]) -> GpuResult<Vec<HostOp>> {
        ops.iter()
            .map(|op| match op {
                HostOp::Cond {
                    handle,
                    kind,
                    bodies,
                    ..
                } => {
                    let run = bodies
                        .iter()
                        .map(|b| {
                            let body = self.graphs.get(b).ok_or(CuError(code::INVALID_VALUE))?;
                            self.resolve(body)
                        })
                        .collect::<GpuResult<_>>()?;
                    Ok(HostOp::Cond {
                        handle: *handle,
                        kind: *kind,
                        bodies: bodies.clone(),
                        run,
                    })
                }
                op => Ok(op.clone()),
            })
            .collect()
    }

    /// Records `op` if stream `s` is being captured; false when it is not.
    pub(super) fn captured(&mut self, s: usize, op: HostOp) -> bool {
        let origin = self.origin(s);
        match self.capturing.get_mut(&origin) {
            Some(c) => {
                c.2.push(op);
                true
            }
            None => false,
        }
    }
}

impl HostGpu {
    /// Runs a graph's work on stream `s`; a conditional node reads its handle when its
    /// turn comes, after the work before it ran (everything here runs at once).
    pub(super) fn run_ops(&self, ops: &[HostOp], s: usize) -> GpuResult<()> {
        for op in ops {
            match op {
                HostOp::Launch { func, args } => {
                    self.launch(*func, [1; 3], [1; 3], 0, s, &[], args)?
                }
                &HostOp::Memset {
                    dst,
                    value,
                    elem,
                    count,
                } => self.memset(dst, value, elem, count, s)?,
                &HostOp::Dtod { dst, src, len } => self.copy_dtod(dst, src, len, s)?,
                &HostOp::Record { event, .. } => {
                    if event != 0 {
                        super::streams::event_record(self, event, s)?;
                    }
                }
                // SAFETY: a word of registered memory, as when it was captured.
                &HostOp::Word { addr, value } => unsafe {
                    self.write_u32(addr as *mut u32, value, s)?
                },
                &HostOp::WaitEq { addr, value } => {
                    // The host GPU runs a launch on the server's thread: it waits there,
                    // for a while (a client that never answers fails the launch).
                    let t = std::time::Instant::now();
                    // SAFETY: a word of registered memory, as when it was captured.
                    let word = unsafe { &*(addr as *const AtomicU32) };
                    while word.load(Ordering::Acquire) != value {
                        if t.elapsed() > std::time::Duration::from_secs(10) {
                            return Err(CuError(code::LAUNCH_FAILED));
                        }
                        std::thread::sleep(std::time::Duration::from_micros(20));
                    }
                }
                // SAFETY: registered host memory, as when it was captured.
                &HostOp::Htod { dst, src, len } => unsafe {
                    self.copy_htod(dst, src as *const u8, len, s)?
                },
                // SAFETY: as above.
                &HostOp::Dtoh { dst, src, len } => unsafe {
                    self.copy_dtoh(dst as *mut u8, src, len, s)?
                },
                HostOp::Cond {
                    handle, kind, run, ..
                } => {
                    let value = || {
                        let st = self.state.lock().unwrap();
                        st.conds.get(handle).map_or(0, |c| c.2)
                    };
                    match kind {
                        // IF (with an else body when there are two), WHILE, SWITCH.
                        0 => match (value() != 0, run.len()) {
                            (true, _) => self.run_ops(&run[0], s)?,
                            (false, 2) => self.run_ops(&run[1], s)?,
                            _ => {}
                        },
                        1 => {
                            while value() != 0 {
                                self.run_ops(&run[0], s)?;
                            }
                        }
                        _ => {
                            if let Some(body) = run.get(value() as usize) {
                                self.run_ops(body, s)?;
                            }
                        }
                    }
                }
            }
        }
        Ok(())
    }
}
