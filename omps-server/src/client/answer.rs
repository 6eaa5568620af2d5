//! Answering a client's call from the server side: reply bytes, result, then the done
//! word, and a wake if the client sleeps on it. On its own, below the sessions that answer
//! calls as they run them and the releaser that answers a call once what it waited for is
//! given back.

use crate::client::ClientShared;
use omps_ring::futex;
use omps_ring::segment::Channel;
use std::sync::atomic::Ordering;

/// Answers `client`'s call (`channel`, `seq`) off its session, once what it waited for
/// is done (a VMM unmap held for other GPUs' fences, session/vmm.rs): as
/// `Session::complete` does.
pub fn answer_later(client: &ClientShared, channel: u32, seq: u32, result: i32, reply: &[u8]) {
    let Some(ch) = client.seg.channel(channel as usize) else {
        return;
    };
    ch.write_reply(reply);
    ch.reply_len.store(reply.len() as u32, Ordering::Relaxed);
    ch.result.store(result, Ordering::Relaxed);
    // SYNC POINT: pairs with the client's Acquire load of `done`.
    ch.done.store(seq, Ordering::Release);
    wake_if_waiting(ch, &ch.done);
}

pub fn wake_if_waiting(ch: &Channel, w: &std::sync::atomic::AtomicU32) {
    if ch.waiting.load(Ordering::SeqCst) != 0 {
        futex::wake(w, u32::MAX);
    }
}
