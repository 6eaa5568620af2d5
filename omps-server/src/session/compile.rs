//! A module load, JIT compile or link run off the lane ([`crate::image::compile`]): what the
//! session keeps of it meanwhile, how the lane completes its record once it is done, and
//! what is given back of one whose client left before.
//!
//! The lane checks the record, takes the image and charges its variables, then hands the
//! rest (the verifier's check and the driver's load, compile or link) to the GPU's
//! compile threads. Until it is done the client's ring is left alone
//! ([`Session::compile_waiting`], read by the worker before anything else of the client):
//! its next records wait, as they would behind the load natively. Done, the lane
//! registers the module and answers the record as it did when it ran the work itself.
//! A client gone meanwhile leaves its work's result to the thread that ran it: a module
//! loaded is unloaded (through the releaser, as the client's own would be) and the
//! charge given back.
//!
//! A process has one such job at a time, over all its connections and GPUs
//! ([`Turn`]; crate::image::compile): a load of a process with one running (or queued)
//! waits in its session, the ring held, until the process's turn comes, and takes it
//! then. The work itself asks again whether its client still waits before the driver
//! ([`Wanted`]): a client that left after the verifier's check costs no driver load.

use super::kinds::compile::{Job, Leftover, Outcome, Pending, Slot, State, Turn, Wanted};
use super::*;
use crate::image::verifier::Work;
use std::sync::Mutex;

impl Session {
    /// Runs `work` off the lane, and answers `call` with what it comes to once done;
    /// `charged`: what the module's variables were charged (given back if none comes of
    /// it). Without compile threads (tests), at once.
    pub(super) fn compile(
        &mut self,
        ctx: &mut WorkerCtx,
        call: CallHdr,
        charged: u64,
        work: impl FnOnce(&Wanted) -> Outcome + Send + 'static,
    ) -> Result<(), Malformed> {
        let compiler = &ctx.shared.compiler;
        let slot = Arc::new(Slot {
            state: Mutex::new(State::Running),
            leftover: Leftover {
                client: self.client.clone(),
                gpu: ctx.gpu.clone(),
                shared: ctx.shared.clone(),
                generation: ctx.shared.generation().load(Ordering::SeqCst),
                charged,
            },
        });
        if !compiler.threaded() {
            let out = work(&Wanted(slot));
            return self.finish_compile(ctx, call, charged, out);
        }
        self.compile = Some(Pending {
            call,
            slot,
            waiting: Some(Box::new(work)),
        });
        self.hand_on(ctx);
        Ok(())
    }

    /// Hands the work waiting in the session to the compile threads, if its process's
    /// turn is free and the queue has room; else it waits on (till the next pass).
    fn hand_on(&mut self, ctx: &WorkerCtx) {
        let Some(p) = self.compile.as_mut() else {
            return;
        };
        if p.waiting.is_none() {
            return;
        }
        let compiler = &ctx.shared.compiler;
        if !compiler.has_room() {
            return;
        }
        let Some(turn) = Turn::take(&self.client.account) else {
            return;
        };
        let job = Job {
            slot: p.slot.clone(),
            turn: Some(turn),
            work: p.waiting.take(),
        };
        let wanted = Wanted(p.slot.clone());
        compiler.submit(move || !wanted.gone(), move || job.run());
    }

    /// Whether the client waits for work off the lane (then none of its records is taken
    /// this pass). Work done is completed first: its record answered, its module the
    /// client's.
    pub fn compile_waiting(&mut self, ctx: &mut WorkerCtx) -> Result<bool, Malformed> {
        if self.compile.as_ref().is_some_and(|p| p.waiting.is_some()) {
            self.hand_on(ctx);
            return Ok(true);
        }
        let Some(p) = &self.compile else {
            return Ok(false);
        };
        let out = {
            let mut st = p.slot.lock();
            match std::mem::replace(&mut *st, State::Over) {
                State::Done(out) => out,
                other => {
                    *st = other;
                    return Ok(true);
                }
            }
        };
        let p = self.compile.take().expect("looked at above");
        let charged = p.slot.leftover.charged;
        self.finish_compile(ctx, p.call, charged, out)?;
        Ok(false)
    }

    /// Whether work of this client runs off the lane now.
    pub fn compiling(&self) -> bool {
        self.compile.is_some()
    }

    /// Answers `call` with `out`, as the lane did when it ran the work itself.
    fn finish_compile(
        &mut self,
        ctx: &mut WorkerCtx,
        call: CallHdr,
        charged: u64,
        out: Outcome,
    ) -> Result<(), Malformed> {
        match out {
            Outcome::Refused(work) => {
                self.client.uncharge(self.dev, charged);
                match work {
                    Work::Load => {
                        self.log_refusal(format_args!(
                            "module image refused: it stopped the verifier"
                        ));
                        self.complete(call, code::INVALID_IMAGE, &[])
                    }
                    Work::Jit => {
                        self.log_refusal(format_args!("PTX refused: it stopped the verifier"));
                        self.complete(call, code::INVALID_IMAGE, &[])
                    }
                    Work::Link => {
                        self.log_refusal(format_args!("link refused: it stopped the verifier"));
                        self.refuse_link(call)
                    }
                }
            }
            Outcome::Load {
                r,
                defaults,
                printf,
                blob,
            } => match r {
                Ok(loaded) => {
                    // Whether its code prints, read by the server: the client's own word
                    // for it is not taken (crate::printf routes by it).
                    self.uses_printf(printf);
                    if let Some(d) = &defaults {
                        ctx.shared
                            .modules
                            .insert(blob, loaded.clone(), d.clone(), printf);
                    }
                    self.finish_module_load(ctx, call, loaded, defaults, charged, None)
                }
                Err(e) => {
                    self.client.uncharge(self.dev, charged);
                    self.complete(call, e.0, &[])
                }
            },
            Outcome::Jit {
                r,
                info,
                error,
                printf,
            } => {
                let answer = wire::LinkReply {
                    image_len: 0,
                    info_len: info.len() as u64,
                    error_len: error.len() as u64,
                };
                let mut logs = info.into_bytes();
                logs.extend_from_slice(error.as_bytes());
                self.link_out[call.channel as usize] = logs;
                match r {
                    Ok(loaded) => {
                        self.uses_printf(printf);
                        self.finish_module_load(ctx, call, loaded, None, charged, Some(answer))
                    }
                    Err(e) => {
                        self.client.uncharge(self.dev, charged);
                        self.complete(call, e.0, bytemuck::bytes_of(&answer))
                    }
                }
            }
            Outcome::Link { r, info, error } => {
                let (r, image) = match r {
                    Ok(img) => (0, img),
                    Err(e) => (e.0, Vec::new()),
                };
                let reply = wire::LinkReply {
                    image_len: image.len() as u64,
                    info_len: info.len() as u64,
                    error_len: error.len() as u64,
                };
                let mut out = image;
                out.extend_from_slice(info.as_bytes());
                out.extend_from_slice(error.as_bytes());
                self.link_out[call.channel as usize] = out;
                // The logs come back even when the link failed, as the driver fills them
                // then too.
                self.complete(call, r, bytemuck::bytes_of(&reply))
            }
            Outcome::Panicked => {
                self.client.uncharge(self.dev, charged);
                bad("the server failed loading or linking a module")
            }
            // Only for a session that had gone (or threads dropped with the server).
            Outcome::Abandoned => {
                self.client.uncharge(self.dev, charged);
                self.complete(call, code::UNKNOWN, &[])
            }
        }
    }
}
