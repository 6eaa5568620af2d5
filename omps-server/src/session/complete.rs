//! How a session answers its client's calls: from the CPU at once, or by having the GPU
//! write a completion word in stream order. Apart from state.rs, which holds the session,
//! as one more family of its methods that every other family uses.

use super::*;

impl Session {
    /// Answers a call from the CPU: reply bytes, then result, then `done` (Release).
    pub(super) fn complete(
        &self,
        call: CallHdr,
        result: i32,
        reply: &[u8],
    ) -> Result<(), Malformed> {
        let ch = self.channel(call.channel)?;
        ch.write_reply(reply);
        ch.reply_len.store(reply.len() as u32, Ordering::Relaxed);
        ch.result.store(result, Ordering::Relaxed);
        // SYNC POINT: pairs with the client's Acquire load of `done`.
        ch.done.store(call.seq, Ordering::Release);
        wake_if_waiting(ch, &ch.done);
        Ok(())
    }

    pub(super) fn complete_pod<T: bytemuck::Pod>(
        &self,
        call: CallHdr,
        r: Result<T, CuError>,
    ) -> Result<(), Malformed> {
        match r {
            Ok(v) => self.complete(call, 0, bytemuck::bytes_of(&v)),
            Err(e) => self.complete(call, e.0, &[]),
        }
    }

    /// Answers a call once stream `s` reaches this point: the GPU writes `done`. Ok(true)
    /// when the GPU will; Ok(false) when the call was answered at once with an error.
    pub(super) fn complete_on_gpu(
        &mut self,
        ctx: &mut WorkerCtx,
        call: CallHdr,
        s: usize,
    ) -> Result<bool, Malformed> {
        let pending = self.take_pending(ctx);
        if pending != 0 {
            return self.complete(call, pending, &[]).map(|_| false);
        }
        self.signal_on_gpu(ctx, call.channel, Word::Done, call.seq, s)
    }

    /// Has the GPU store `seq` into a completion word in stream order. Ok(true) when it
    /// will; Ok(false) when the word was set at once with the error that prevented it.
    pub(super) fn signal_on_gpu(
        &mut self,
        ctx: &mut WorkerCtx,
        channel: u32,
        word: Word,
        seq: u32,
        s: usize,
    ) -> Result<bool, Malformed> {
        let ch = self.channel(channel)?;
        ch.result.store(0, Ordering::Relaxed);
        ch.reply_len.store(0, Ordering::Relaxed);
        let w = ch
            .word(word)
            .ok_or_else(|| Malformed("chunk index out of range".into()))?;
        // SAFETY: the word lies in the registered part of the segment, which stays mapped and
        // registered while this client's Arc is held by the marker below.
        let r = unsafe { ctx.gpu.write_u32(w.as_ptr(), seq, s) };
        match r {
            Ok(()) => {
                ctx.add_marker(self.client.clone(), channel, word, seq, s);
                Ok(true)
            }
            Err(e) => {
                ctx.fault_if_sticky(e.0);
                self.note_error(e);
                self.signal_now(channel, word, seq, e.0).map(|_| false)
            }
        }
    }

    /// Sets a completion word from the CPU, with `result` for the client to see.
    pub(super) fn signal_now(
        &self,
        channel: u32,
        word: Word,
        seq: u32,
        result: i32,
    ) -> Result<(), Malformed> {
        let ch = self.channel(channel)?;
        if result != 0 {
            ch.result.store(result, Ordering::Relaxed);
        }
        let w = ch
            .word(word)
            .ok_or_else(|| Malformed("chunk index out of range".into()))?;
        // SYNC POINT: pairs with the client's Acquire load of the word.
        w.store(seq, Ordering::Release);
        wake_if_waiting(ch, w);
        Ok(())
    }
}
