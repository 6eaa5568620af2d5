//! What happens on the sockets after a connection is accepted: handshakes and control
//! connections moved on as their bytes come, and a connected client's socket requests
//! (pinned memory, printf flush) answered now or handed to the slow-request thread.

use super::slow::send_within;
use super::*;

impl Server {
    /// Moves the handshakes and control connections on whose sockets something happened
    /// (`ready`, by position), and drops those past their deadline.
    pub(super) fn serve_peers(&mut self, ready: &[bool]) {
        use crate::control::peers::Progress;
        let now = Instant::now();
        let mut i = 0;
        let mut k = 0;
        while i < self.peers.len() {
            let was_ready = ready.get(k).copied().unwrap_or(false);
            k += 1;
            if self.peers[i].deadline < now {
                let p = self.peers.remove(i);
                self.slow_peers += 1;
                if self.slow_peers <= 8 || self.slow_peers.is_multiple_of(1000) {
                    tracing::warn!(
                        pid = p.pid,
                        dropped = self.slow_peers,
                        "a connection that did not finish its handshake or command in time was dropped"
                    );
                }
                continue;
            }
            if !was_ready {
                i += 1;
                continue;
            }
            match self.peers[i].progress() {
                Progress::Waiting => i += 1,
                Progress::Client(_) if self.peers[i].operator_only => {
                    let p = self.peers.remove(i);
                    tracing::warn!(
                        pid = p.pid,
                        "connection refused: root may control, not run, a user's server"
                    );
                }
                Progress::Client(_) if !self.peers[i].origin.takes_clients() => {
                    let p = self.peers.remove(i);
                    let _ =
                        crate::control::peers::send_status(&p.stream, code::MPS_CONNECTION_FAILED);
                    tracing::warn!(
                        pid = p.pid,
                        "a client refused on the operator's socket: clients connect to {}",
                        sock::SOCKET_NAME
                    );
                }
                Progress::Client(settings) => {
                    let p = self.peers.remove(i);
                    let pid = p.pid;
                    let ns = match &p.origin {
                        crate::control::peers::Origin::Namespace(ns) => Some(ns.clone()),
                        _ => None,
                    };
                    let r = p
                        .into_stream()
                        .and_then(|s| self.accept_client(s, pid, &settings, ns.as_deref()));
                    match r {
                        // Killed while it connected (the soak does this a thousand times):
                        // nothing to warn of.
                        Err(e)
                            if matches!(
                                e.kind(),
                                std::io::ErrorKind::BrokenPipe
                                    | std::io::ErrorKind::ConnectionReset
                            ) =>
                        {
                            tracing::info!(pid, "client went away while connecting: {e}")
                        }
                        Err(e) => tracing::warn!(pid, "connection refused: {e}"),
                        Ok(()) => {}
                    }
                }
                Progress::Command(line) if !self.peers[i].origin.takes_commands() => {
                    let why = format!(
                        "control commands are refused on the clients' socket; the operator sends them through {}\n",
                        sock::operator_socket_in(&self.cfg.pipe_dir).display()
                    );
                    tracing::warn!(
                        pid = self.peers[i].pid,
                        "a control command on a clients' socket refused: {}",
                        line.split_whitespace().next().unwrap_or("")
                    );
                    // One refusal, then the connection goes: it holds no slot of the
                    // handshakes clients and namespaces share.
                    let _ = self.peers[i].answer(false, &why);
                    self.peers.remove(i);
                }
                Progress::Command(line) => {
                    let (ok, text) = self.control_command(&line);
                    if self.peers[i].answer(ok, &text).is_err() {
                        self.peers.remove(i);
                    } else {
                        i += 1;
                    }
                }
                Progress::Refused(why) => {
                    let p = self.peers.remove(i);
                    let _ =
                        crate::control::peers::send_status(&p.stream, code::MPS_CONNECTION_FAILED);
                    tracing::warn!(pid = p.pid, "connection refused: {why}");
                }
                Progress::Gone(why) => {
                    let p = self.peers.remove(i);
                    tracing::debug!(pid = p.pid, "connection dropped: {why}");
                }
            }
        }
    }

    /// Handles what a client sent on its socket: a pinned-memory request, or the end of
    /// the stream (the client is gone). Anything else gets the client disconnected.
    /// Returns whether the client is gone.
    pub(super) fn client_message(&mut self, id: u32) -> bool {
        let (c, s) = &self.clients[&id];
        let mut buf = [0u8; std::mem::size_of::<wire::HostMemRequest>()];
        let fd = s.as_raw_fd();
        // SAFETY: a zero-timeout poll of one descriptor tells whether recv would block.
        let ready = unsafe {
            let mut p = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            libc::poll(&mut p, 1, 0) > 0 && p.revents & libc::POLLIN != 0
        };
        if !ready {
            return true; // hang-up or error without data
        }
        let (n, fds) = match sock::recv_with_fds(fd, &mut buf) {
            Ok(r) => r,
            Err(_) => return true,
        };
        if n == 0 {
            return true;
        }
        let Some(req) = wire::get::<wire::HostMemRequest>(&buf[..n]).filter(|_| n == buf.len())
        else {
            c.disconnect(code::MPS_CLIENT_TERMINATED, "malformed socket request");
            return true;
        };
        let slow = matches!(
            (req.kind, fds.len()),
            (wire::hostmem::PIN, 1) | (wire::hostmem::PRINTF_FLUSH, 0)
        );
        // One slow request at a time per client: the shim waits for each answer, so a
        // second one is a client flooding the slow-request thread.
        if slow && c.slow_pending.swap(true, Ordering::AcqRel) {
            c.disconnect(
                code::MPS_CLIENT_TERMINATED,
                "a second request before the first was answered",
            );
            return true;
        }
        if req.kind == wire::hostmem::PIN && fds.len() == 1 {
            // Mapped and registered on the slow-request thread, which answers.
            let fd = fds.into_iter().next().expect("one descriptor");
            let (addr, len) = (req.addr, req.len);
            return self.send_slow(c, s, |client, sock| SlowJob::Pin {
                client,
                fd,
                addr,
                len,
                sock,
            });
        }
        let status = match (req.kind, fds.as_slice()) {
            (wire::hostmem::UNPIN, []) => {
                let removed = c
                    .pinned
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&req.addr);
                match removed {
                    Some(len) => {
                        // Every GPU's worker fences the client's work there (a copy in
                        // flight on any GPU may use it); the last one unregisters it.
                        let n = self.gpus.len();
                        {
                            let mut u = c.unpinning.lock().unwrap_or_else(|e| e.into_inner());
                            u.0 += len;
                            u.1 += 1;
                        }
                        let left = Arc::new(std::sync::atomic::AtomicUsize::new(n));
                        for g in 0..n {
                            let p = crate::session::PinnedRelease {
                                addr: req.addr,
                                len,
                                left: left.clone(),
                                client: c.clone(),
                            };
                            let w = self.lane_of(g, id);
                            self.workers[w].send(ToWorker::Unpin(id, p));
                        }
                        0
                    }
                    None => code::INVALID_VALUE,
                }
            }
            // Answered, never taken: the level is what the server read from the client's
            // images. A declaration of its own would make it a second printing client and
            // send everyone's text to the log (crate::client::printf).
            (wire::hostmem::PRINTF_USE, []) if req.len <= wire::printf_use::YES => 0,
            (wire::hostmem::PRINTF_FLUSH, []) => {
                let seen = usize::try_from(req.addr)
                    .ok()
                    .and_then(|k| c.visible.get(k));
                let Some(gpu) = seen.and_then(|&g| self.gpus.get(g)) else {
                    c.slow_pending.store(false, Ordering::Release);
                    return Self::reply_now(s, code::INVALID_DEVICE);
                };
                // Answered by the slow-request thread (the client waits for this one answer).
                let gpu = gpu.clone();
                return self.send_slow(c, s, |client, sock| SlowJob::Flush { gpu, client, sock });
            }
            _ => {
                c.disconnect(code::MPS_CLIENT_TERMINATED, "malformed socket request");
                return true;
            }
        };
        Self::reply_now(s, status)
    }

    /// Hands a client's slow request to the slow-request thread, which answers it on a
    /// copy of the client's socket. Returns whether the client is gone.
    pub(super) fn send_slow(
        &self,
        c: &Arc<ClientShared>,
        s: &UnixStream,
        job: impl FnOnce(Arc<ClientShared>, UnixStream) -> SlowJob,
    ) -> bool {
        match s.try_clone() {
            Ok(sock) => self.slow.send(job(c.clone(), sock)).is_err(),
            Err(_) => {
                c.slow_pending.store(false, Ordering::Release);
                Self::reply_now(s, code::OUT_OF_MEMORY)
            }
        }
    }

    /// Answers a socket request: the status, then `text`. Returns whether the client is gone.
    /// A status-only answer from the control thread, which never waits on a peer: a client
    /// whose socket cannot take eight bytes now has stopped reading its answers, and is
    /// cut off (returns true: gone).
    pub(super) fn reply_now(s: &UnixStream, status: i32) -> bool {
        let reply = wire::HostMemReply {
            status,
            text_len: 0,
        };
        !send_within(s, bytemuck::bytes_of(&reply), Duration::ZERO)
    }
}
