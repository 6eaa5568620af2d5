//! The socket side of a client: the Hello and Welcome of the handshake, the settings a
//! client's environment asks for, and the requests that follow on the socket (pinned
//! memory, device printf).

use bytemuck::{Pod, Zeroable};

pub mod kind {
    pub const CLIENT: u32 = 0;
    pub const CONTROL: u32 = 1;
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct Hello {
    pub magic: u64,
    pub version: u32,
    pub kind: u32,
}

/// What a client's environment asks of the server, sent right after a client Hello.
/// Each field is [`ClientSettings::UNSET`] when the client did not say.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct ClientSettings {
    /// 0 normal, 1 below normal (CUDA_MPS_CLIENT_PRIORITY), 2 latency-critical
    /// (OMPS_CLIENT_QOS).
    pub qos: u32,
    /// CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, in thousandths of a percent (1..=100000).
    pub thread_milli_pct: u32,
    /// CUDA_MPS_SM_PARTITION, NUL-padded text.
    pub partition: [u8; 64],
    /// CUDA_MPS_PINNED_DEVICE_MEM_LIMIT as the client gave it (checked by
    /// [`crate::memlimit::parse_limits`]), NUL-padded: the server resolves its devices.
    pub mem_limit: [u8; 512],
    /// The client's PID as it sees it (in its own PID namespace; the server learns the
    /// one in its namespace from the socket). 0: not said.
    pub ns_pid: u32,
    /// The devices it may see (CUDA_VISIBLE_DEVICES, else a container's
    /// NVIDIA_VISIBLE_DEVICES), NUL-padded; `all` or nothing: every device.
    pub visible: [u8; 256],
}

impl ClientSettings {
    pub const UNSET: u32 = u32::MAX;

    pub fn none() -> Self {
        ClientSettings {
            qos: Self::UNSET,
            thread_milli_pct: Self::UNSET,
            partition: [0; 64],
            mem_limit: [0; 512],
            ns_pid: 0,
            visible: [0; 256],
        }
    }

    /// The partition text, if any and valid UTF-8.
    pub fn partition_text(&self) -> Option<&str> {
        padded_text(&self.partition)
    }

    /// The devices it may see, if it said (`all` and nothing read as unsaid; the shim
    /// sends an empty list as `void`).
    pub fn visible_text(&self) -> Option<&str> {
        let t = std::str::from_utf8(
            &self.visible[..self
                .visible
                .iter()
                .position(|&b| b == 0)
                .unwrap_or(self.visible.len())],
        )
        .ok()?;
        (!t.is_empty() && t != "all").then_some(t)
    }

    /// The memory limit list, if any and valid UTF-8.
    pub fn mem_limit_text(&self) -> Option<&str> {
        padded_text(&self.mem_limit)
    }
}

fn padded_text(b: &[u8]) -> Option<&str> {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    std::str::from_utf8(&b[..end])
        .ok()
        .filter(|s| !s.is_empty())
}

/// A thread percentage as MPS takes it ("25", "12.5"), in thousandths of a percent,
/// within (0, 100].
pub fn parse_percentage(v: &str) -> Option<u32> {
    let p: f64 = v.trim().parse().ok()?;
    (p > 0.0 && p <= 100.0 && p.is_finite()).then(|| ((p * 1000.0).round() as u32).max(1))
}

/// The server's answer to a client Hello; with status 0 it carries, as SCM_RIGHTS, the
/// segment memfd followed by one doorbell memfd per GPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct Welcome {
    pub magic: u64,
    pub version: u32,
    /// CUresult: 0, or why the client is refused.
    pub status: i32,
    pub client_id: u32,
    pub num_devices: u32,
    pub layout: crate::segment::LayoutParams,
    pub segment_len: u64,
    /// The most streams and events the client may hold per GPU: the shim answers
    /// CUDA_ERROR_OUT_OF_MEMORY beyond, and the server disconnects a client that goes on.
    pub max_streams: u32,
    pub max_events: u32,
}

/// A request on the client's socket after the handshake. Pinned host memory: `PIN`
/// carries a memfd (SCM_RIGHTS) that the server maps at `addr` and registers; `UNPIN`
/// releases `addr` once the client's queued work is done. Device printf: `PRINTF_USE`
/// says the client loaded code that may call printf (`len`: a [`printf_use`] level);
/// `PRINTF_FLUSH` asks for the printf output of GPU `addr` so far, which follows the reply.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct HostMemRequest {
    pub kind: u32,
    pub _pad: u32,
    pub addr: u64,
    pub len: u64,
}

pub mod hostmem {
    pub const PIN: u32 = 1;
    pub const UNPIN: u32 = 2;
    pub const PRINTF_USE: u32 = 3;
    pub const PRINTF_FLUSH: u32 = 4;
}

/// How sure the shim is that a client's code calls device printf, weakest first.
pub mod printf_use {
    pub const NONE: u64 = 0;
    /// The code references `__assertfail` only: text comes with a failed kernel.
    pub const ASSERT: u64 = 1;
    /// Its images hold code the shim cannot look into; treated as ASSERT.
    pub const MAYBE: u64 = 2;
    /// The code the GPU runs references `vprintf`.
    pub const YES: u64 = 3;
}

/// The answer: a CUresult, and how many bytes of text follow it on the socket.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct HostMemReply {
    pub status: i32,
    pub text_len: u32,
}

/// Most text one `PRINTF_FLUSH` reply carries; the rest waits for the next flush.
pub const PRINTF_REPLY_MAX: usize = 4 << 20;

/// The text of a PRINTF_FLUSH answer: the length of the printf text (u32), the printf
/// text (for the client's fd 1), then the assert messages (for its fd 2).
pub fn printf_reply(out: &[u8], err: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(4 + out.len() + err.len());
    v.extend_from_slice(&(out.len() as u32).to_le_bytes());
    v.extend_from_slice(out);
    v.extend_from_slice(err);
    v
}

/// Splits a PRINTF_FLUSH answer into (printf text, assert messages); None if malformed.
pub fn split_printf_reply(text: &[u8]) -> Option<(&[u8], &[u8])> {
    let n = u32::from_le_bytes(text.get(..4)?.try_into().ok()?) as usize;
    let rest = &text[4..];
    (n <= rest.len()).then(|| rest.split_at(n))
}
