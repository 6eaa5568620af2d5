//! A client without a process behind it: a real segment and socket pair, for the fuzz
//! targets and unit tests that drive a [`Session`](crate::session::Session) directly.

use crate::client::ClientShared;
use crate::gpu::Gpu;
use omps_ring::segment::{LayoutParams, SegmentView};
use omps_ring::shm::{self, Mapping};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;

/// A registered client segment for one GPU, and the peer end of its socket.
pub fn fake_client(
    gpu: &Arc<dyn Gpu>,
    id: u32,
) -> std::io::Result<(Arc<ClientShared>, UnixStream)> {
    fake_client_printing(gpu, id, None)
}

/// As [`fake_client`], with the printf router the control thread would give it.
pub fn fake_client_printing(
    gpu: &Arc<dyn Gpu>,
    id: u32,
    printf: Option<Arc<crate::client::printf::PrintfRouter>>,
) -> std::io::Result<(Arc<ClientShared>, UnixStream)> {
    let layout = LayoutParams::for_devices(1)
        .validate()
        .map_err(std::io::Error::other)?;
    let fd = shm::create_segment("omps-fake-client", layout.total_len)?;
    let map = Mapping::map(fd.as_fd(), layout.total_len)?;
    // SAFETY: the mapping is total_len bytes and moves into the ClientShared with the view.
    let seg = unsafe { SegmentView::new(map.as_ptr(), layout) };
    let (off, len) = layout.registered_range();
    // SAFETY: the range lies in the mapping, which ClientShared unregisters before unmapping.
    unsafe { gpu.register_host(seg.base().add(off), len) }
        .map_err(|e| std::io::Error::other(format!("register: {}", e.0)))?;
    let (ours, theirs) = UnixStream::pair()?;
    let mut c = ClientShared::new(
        id,
        0,
        "fake".into(),
        map,
        seg,
        OwnedFd::from(ours),
        Some(gpu.clone()),
    );
    c.printf = printf;
    Ok((Arc::new(c), theirs))
}

/// The u64 answer of the last call on channel 0 of `client` (an allocation's address).
pub fn reply_u64(client: &ClientShared) -> u64 {
    let mut b = [0u8; 8];
    client.seg.channel(0).expect("channel 0").read_reply(&mut b);
    u64::from_le_bytes(b)
}

/// The `commands` fuzz target's body, here so that CI runs it too (see the proptest below).
/// `data` is a sequence of (tag byte, length u16 LE, payload) records for one session on
/// the host-memory GPU. A record may be refused or fail as CUDA would; nothing may panic,
/// and once the session is retired every byte and event it held must be free again.
pub fn run_command_bytes(data: &[u8]) {
    use crate::gpu::host::HostGpu;
    use crate::session::Session;
    use crate::worker::WorkerCtx;
    let host = Arc::new(HostGpu::new(0, 1 << 26));
    let gpu: Arc<dyn Gpu> = host.clone();
    let (client, _peer) = fake_client(&gpu, 1).expect("fake client");
    let mut ctx = WorkerCtx::new(gpu).expect("worker ctx");
    // SAFETY: the fake client's segment has ring 0 and lives as long as the session.
    let mut s = unsafe { Session::new(client, 0) };
    let mut rest = data;
    while rest.len() >= 3 {
        let tag = (rest[0] % 64) as u32;
        let len = (u16::from_le_bytes([rest[1], rest[2]]) as usize).min(rest.len() - 3);
        let payload = &rest[3..3 + len];
        rest = &rest[3 + len..];
        if s.handle(&mut ctx, tag, payload).is_err() {
            break;
        }
        ctx.poll();
    }
    ctx.retire(s);
    for _ in 0..4 {
        ctx.poll();
    }
    assert_eq!(
        host.bytes_allocated(),
        0,
        "a retired session leaked device memory"
    );
    // The worker keeps its own events (one per work stream it used), which no client's
    // retirement frees.
    assert_eq!(
        host.events_live(),
        ctx.own_events(),
        "a retired session leaked events"
    );
}

/// A minimal ELF64 with the named sections, a symbol table of `syms` (OBJECT symbols:
/// name, section index), as a cubin's layout goes: for tests of what the server reads in
/// images.
pub fn elf_with(sections: &[&str], syms: &[(&str, u16)]) -> Vec<u8> {
    use omps_ring::image;
    let mut shstr = vec![0u8];
    let mut names = Vec::new();
    let all: Vec<&str> = sections
        .iter()
        .copied()
        .chain([".shstrtab", ".symtab", ".strtab"])
        .collect();
    for n in &all {
        names.push(shstr.len() as u32);
        shstr.extend_from_slice(n.as_bytes());
        shstr.push(0);
    }
    let mut strtab = vec![0u8];
    let mut symtab = vec![0u8; 24];
    for (n, shndx) in syms {
        let mut s = [0u8; 24];
        s[0..4].copy_from_slice(&(strtab.len() as u32).to_le_bytes());
        s[4] = 1; // OBJECT
        s[6..8].copy_from_slice(&shndx.to_le_bytes());
        symtab.extend_from_slice(&s);
        strtab.extend_from_slice(n.as_bytes());
        strtab.push(0);
    }
    let mut out = vec![0u8; 0x40];
    out[..4].copy_from_slice(&image::ELF_MAGIC);
    out[4] = 2;
    out[5] = 1;
    let blobs = [shstr, symtab, strtab];
    let mut offs = Vec::new();
    for b in &blobs {
        offs.push(out.len());
        out.extend_from_slice(b);
    }
    let shoff = out.len();
    out[0x28..0x30].copy_from_slice(&(shoff as u64).to_le_bytes());
    out[0x3a..0x3c].copy_from_slice(&0x40u16.to_le_bytes());
    out[0x3c..0x3e].copy_from_slice(&(all.len() as u16).to_le_bytes());
    let n = sections.len();
    out[0x3e..0x40].copy_from_slice(&(n as u16).to_le_bytes());
    for (i, name) in names.iter().enumerate() {
        let mut h = [0u8; 0x40];
        h[0..4].copy_from_slice(&name.to_le_bytes());
        let (kind, off, size, link) = match i.checked_sub(n) {
            Some(0) => (3u32, offs[0], blobs[0].len(), 0u32),
            Some(1) => (2, offs[1], blobs[1].len(), (n + 2) as u32),
            Some(2) => (3, offs[2], blobs[2].len(), 0),
            _ => (1, 0, 0, 0),
        };
        h[4..8].copy_from_slice(&kind.to_le_bytes());
        h[0x18..0x20].copy_from_slice(&(off as u64).to_le_bytes());
        h[0x20..0x28].copy_from_slice(&(size as u64).to_le_bytes());
        h[0x28..0x2c].copy_from_slice(&link.to_le_bytes());
        out.extend_from_slice(&h);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::host::HostGpu;
    use crate::session::{Release, Session};
    use crate::worker::WorkerCtx;
    use proptest::prelude::*;
    use std::sync::atomic::Ordering;

    #[test]
    fn waits_on_one_word_keep_one_marker() {
        use omps_ring::segment::Word;
        let host = Arc::new(HostGpu::new(0, 1 << 26));
        let gpu: Arc<dyn Gpu> = host.clone();
        let (a, _pa) = fake_client(&gpu, 1).unwrap();
        let mut ctx = WorkerCtx::new(gpu.clone()).unwrap();
        // A client whose words never land (it overwrites them, or the GPU is stuck) and
        // that keeps synchronizing leaves one marker per word, not one per wait.
        for seq in 1..=1000 {
            ctx.add_marker(a.clone(), 0, Word::Done, seq, 0);
            ctx.add_marker(a.clone(), 1, Word::Chunk(2), seq, 0);
        }
        assert_eq!(ctx.marker_count(), 2);
    }

    #[test]
    fn a_freed_block_goes_back_to_its_own_client_only() {
        let host = Arc::new(HostGpu::new(0, 1 << 26));
        let gpu: Arc<dyn Gpu> = host.clone();
        let (a, _pa) = fake_client(&gpu, 1).unwrap();
        let (b, _pb) = fake_client(&gpu, 2).unwrap();
        let mut ctx = WorkerCtx::new(gpu.clone()).unwrap();
        // SAFETY: the fake clients' segments have ring 0 and outlive the sessions.
        let (mut sa, sb) = unsafe { (Session::new(a.clone(), 0), Session::new(b.clone(), 0)) };
        let p = gpu.mem_alloc(4096).unwrap();
        a.add_mem(0, 4096);
        let free = |ptr| Release {
            allocs: vec![(ptr, 4096)],
            ..Default::default()
        };
        ctx.release_later(&mut sa, free(p));
        assert_eq!(
            ctx.reuse_freed(&b, 4096),
            None,
            "never another client's memory"
        );
        assert_eq!(ctx.reuse_freed(&a, 8192), None, "only the same size");
        assert_eq!(ctx.reuse_freed(&a, 4096), Some(p));
        assert_eq!(
            a.mem_bytes[0].load(Ordering::Relaxed),
            0,
            "accounted as freed"
        );
        assert_eq!(ctx.reuse_freed(&a, 4096), None, "handed back once");
        // What is not reused is freed once its fence has passed.
        let q = gpu.mem_alloc(4096).unwrap();
        a.add_mem(0, 4096);
        ctx.release_later(&mut sa, free(q));
        ctx.poll();
        assert_eq!(ctx.reuse_freed(&a, 4096), None);
        assert_eq!(
            host.bytes_allocated(),
            4096,
            "p is the client's again, q is freed"
        );
        drop((sa, sb));
    }

    /// What cargo-fuzz found: a record that makes the worker take an event of its own,
    /// which the leak check once counted as the session's.
    #[test]
    fn a_workers_own_event_is_no_leak() {
        super::run_command_bytes(&[
            218, 10, 156, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 18, 0, 0, 0, 156, 51,
        ]);
    }

    /// Found by cargo-fuzz: a VMM reservation far larger than the (host) GPU.
    #[test]
    fn a_huge_reservation_is_refused_not_allocated() {
        super::run_command_bytes(&[
            46, 211, 255, 247, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 31, 60, 154,
            202, 0, 0, 0, 0, 0, 0, 0, 0, 0, 247, 247, 247, 247, 247, 215, 247, 247,
        ]);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        /// Random records, biased towards plausible lengths, never panic or leak.
        #[test]
        fn random_command_streams_never_panic_or_leak(
            records in proptest::collection::vec(
                (any::<u8>(), proptest::collection::vec(any::<u8>(), 0..96)), 0..24)
        ) {
            let mut data = Vec::new();
            for (tag, payload) in records {
                data.push(tag);
                data.extend_from_slice(&(payload.len() as u16).to_le_bytes());
                data.extend(payload);
            }
            super::run_command_bytes(&data);
        }
    }
}
