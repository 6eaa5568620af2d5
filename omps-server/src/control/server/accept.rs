//! A new connection: admitted as a peer, then, when its handshake is done, a client
//! made (its segment, lanes and placement), or refused.

use super::*;

impl Server {
    /// accept() failed. Out of descriptors, the listener stays readable and poll would
    /// spin: the server pauses a moment instead, and says so once in a while.
    pub(super) fn accept_failed(&mut self, e: io::Error) {
        static LOGGED: AtomicU64 = AtomicU64::new(0);
        if LOGGED.fetch_add(1, Ordering::Relaxed).is_multiple_of(1000) {
            tracing::warn!("accepting a connection failed: {e}");
        }
        if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) {
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A new connection: checked to be of the server's user (or root, which may only
    /// control it, as an operator), then read as its bytes come (`serve_peers`). Control
    /// commands (quit, terminate_client, limits) belong to those who may open the pipe
    /// directory: the server's user and root, as with MPS's control pipe.
    pub(super) fn accept(
        &mut self,
        stream: UnixStream,
        origin: crate::control::peers::Origin,
    ) -> io::Result<()> {
        let peer = crate::control::peers::Peer::admit(stream, self.uid, &self.peers, origin)?;
        self.peers.push(peer);
        Ok(())
    }

    pub(super) fn accept_client(
        &mut self,
        stream: UnixStream,
        pid: i32,
        settings: &wire::ClientSettings,
        ns: Option<&crate::control::namespace::Limits>,
    ) -> io::Result<()> {
        // Said in the server's log and to the client, which prints it with the code.
        let refuse = |status: i32, why: &str| {
            tracing::warn!(pid, "refusing a client: {why}");
            crate::control::peers::send_refusal(&stream, status, why)
        };
        if self.draining.is_some() {
            return refuse(code::MPS_SERVER_NOT_READY, "the server is shutting down");
        }
        if self.clients.len() >= crate::client::bounds::bounds().clients {
            return refuse(
                code::MPS_MAX_CLIENTS_REACHED,
                "OMPS_MAX_CLIENTS clients are connected",
            );
        }
        if let Some(why) = self.over_share(pid, ns) {
            return refuse(code::MPS_MAX_CLIENTS_REACHED, &why);
        }
        let lc_present = crate::worker::policy::Policy::lc_present(&self.client_list());
        let mut settled = match self.policy.settle(settings) {
            Ok(s) => s,
            Err((status, why)) => {
                return refuse(status, &why);
            }
        };
        // The GPUs it sees (its device k is the server's visible[k]), as natively; in a
        // namespace, within the namespace's.
        let named = settings
            .visible_text()
            .map(|t| crate::client::visible::resolve(Some(t), &self.snapshots));
        let visible = match ns {
            Some(ns) => {
                match crate::control::namespace::visible_in(ns, named, self.snapshots.len()) {
                    Ok(v) => v,
                    Err(why) => {
                        return refuse(code::NO_DEVICE, &format!("namespace {}: {why}", ns.name));
                    }
                }
            }
            None => named.unwrap_or_else(|| crate::client::visible::resolve(None, &self.snapshots)),
        };
        if visible.is_empty() {
            return refuse(
                code::NO_DEVICE,
                "its CUDA_VISIBLE_DEVICES names no GPU of this server",
            );
        }
        let seen: Vec<DeviceSnapshot> = visible.iter().map(|&g| self.snapshots[g]).collect();
        // Its own limits name its devices: moved to the server's numbering.
        let mut own_limits =
            match crate::client::memlimit::MemLimits::own(settings.mem_limit_text(), &seen) {
                Ok(mine) => {
                    let mut l = [crate::client::NO_LIMIT; omps_ring::segment::MAX_DEVICES];
                    for (k, &g) in visible.iter().enumerate() {
                        l[g] = mine[k];
                    }
                    l
                }
                Err(why) => {
                    return refuse(code::INVALID_DEVICE, &why);
                }
            };
        if let Some(ns) = ns {
            if let Err(why) =
                crate::control::namespace::hold_to(ns, settings, &mut settled, &mut own_limits)
            {
                return refuse(
                    code::INVALID_VALUE,
                    &format!("namespace {}: {why}", ns.name),
                );
            }
        }
        // A lane that has not taken its messages (it sits in the driver) would hold the
        // client too: the next id whose lanes answer is taken (ids are never reused, so
        // one skipped is lost), and only when no lane answers is the client refused.
        let stalled = |this: &Self, id: u32| {
            visible
                .iter()
                .any(|&g| this.workers[this.lane_of(g, id)].tx.stalled())
        };
        let mut skipped = 0;
        while stalled(self, self.next_id) {
            skipped += 1;
            let next = self.next_id.checked_add(1);
            match next {
                Some(n) if skipped < self.cfg.lanes => self.next_id = n,
                _ => {
                    return refuse(code::MPS_SERVER_NOT_READY, "no worker lane is answering");
                }
            }
        }
        if self.any_fault() {
            return refuse(
                code::MPS_SERVER_NOT_READY,
                "a GPU of the server is in FAULT; it is served again once its clients are gone",
            );
        }
        let id = self.next_id;
        // Client ids are never reused: after 4 billion connections the server takes no more.
        self.next_id = id
            .checked_add(1)
            .ok_or_else(|| io::Error::other("client ids exhausted"))?;
        let crowded = self.clients.len() >= LayoutParams::CROWD;
        let params = if crowded {
            LayoutParams::for_crowd(self.gpus.len())
        } else {
            LayoutParams::for_devices(self.gpus.len())
        };
        let layout = params
            .validate()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        // Fallible steps that need no segment come first: once the segment is handed over,
        // only the ClientShared made from it unregisters it (a mapping dropped while still
        // registered left the driver a registration that refused every later segment at
        // that address: error 712).
        // Its streams and events, out of the server-wide totals: N clients may not hold N
        // times the per-client bounds (issue 23, finding 14).
        // Clients that left but whose work is still being released hold their grants
        // until then: counted, or a connect-and-leave loop behind endless work would eat
        // what the clients still to come are kept.
        let others = crate::client::bounds::bounds()
            .clients
            .saturating_sub(self.clients.len() + self.exiting.len() + 1);
        let Some(grant) = self
            .accounts
            .totals()
            .grant(visible.len(), self.gpus.len(), others)
        else {
            return refuse(
                code::MPS_MAX_CLIENTS_REACHED,
                "the server-wide totals of streams and events (OMPS_MAX_STREAMS_TOTAL, OMPS_MAX_EVENTS_TOTAL) are granted",
            );
        };
        let ours = stream.try_clone()?;
        // The first few clients' staging is registered ahead (a spare's); a later client's
        // channel by channel at its first copy, so clients that never copy through staging
        // pin next to nothing (segpool.rs).
        use crate::release::segpool::{Prepared, Staging, STAGING_AHEAD};
        let ahead = self.clients.len() < STAGING_AHEAD && !crowded;
        let spare = if ahead { self.segments.take() } else { None };
        let prepared = match spare {
            Some(p) => p,
            None => Prepared::make(
                &layout,
                self.gpus.first(),
                if ahead {
                    Staging::Ahead
                } else {
                    Staging::AtFirstCopy
                },
            )?,
        };
        let staging = prepared.staging();
        let (fd, map, registered_on) = prepared.hand_over();
        // SAFETY: the mapping is total_len bytes, page aligned, and moves into ClientShared
        // together with the view.
        let seg = unsafe { SegmentView::new(map.as_ptr(), layout) };
        {
            // SAFETY: nobody else sees this segment yet.
            let snap: &mut SnapshotTable = unsafe { seg.snapshot_mut() };
            snap.driver_version = self.driver_version;
            snap.device_count = visible.len() as u32;
            for (d, &g) in snap.devices.iter_mut().zip(&visible) {
                *d = self.snapshots[g];
                // Numbered as the client numbers its devices.
                d.p2p = Default::default();
                for (slot, &h) in d.p2p.iter_mut().zip(&visible) {
                    *slot = self.snapshots[g].p2p.get(h).copied().unwrap_or_default();
                }
                // Its compute limit's share, before it can ask (as under MPS).
                if let Some(sms) = self.policy.visible_sms_settled(&settled, g, lc_present) {
                    d.attributes[crate::worker::policy::MULTIPROCESSOR_COUNT] = sms as i32;
                }
            }
            // SAFETY: as above; the header is plain fields and atomics at offset 0.
            let h = unsafe { &mut *(seg.base() as *mut omps_ring::segment::SegmentHeader) };
            h.magic = SEGMENT_MAGIC;
            h.params = params;
            h.client_id = id;
            // How to wait, counting itself (the others are told below if that changes it).
            *h.wait_active_us.get_mut() = self.wait_for(self.clients.len() + 1);
        }
        let welcome = Welcome {
            magic: wire::HELLO_MAGIC,
            version: wire::PROTOCOL_VERSION,
            status: 0,
            client_id: id,
            num_devices: visible.len() as u32,
            layout: params,
            segment_len: layout.total_len as u64,
            max_streams: grant.streams,
            max_events: grant.events,
        };
        let name = std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .map(|s| crate::client::one_word(s.trim(), 64))
            .unwrap_or_default();
        let mut c = ClientShared::new(id, pid, name, map, seg, OwnedFd::from(ours), registered_on);
        if staging == Staging::AtFirstCopy {
            c.stage_at_first_copy();
        }
        c.identity = crate::client::Identity::of(pid, settings.ns_pid);
        let (account, first) = self.accounts.of(pid, ns.map(|n| &n.held));
        // A namespace's memory limit holds for its clients together: the process joins
        // the namespace it came through, and another connection of its must come the
        // same way (or its memory would be counted in one place and used in another).
        if !account.join(ns.map(|n| &n.held)) {
            let other = if ns.is_some() {
                "another namespace or the server's own socket"
            } else {
                "a namespace"
            };
            return refuse(
                code::INVALID_VALUE,
                &format!("another connection of this process came through {other}"),
            );
        }
        c.account = account;
        c.visible = visible.clone();
        c.printf = Some(self.printf.clone());
        c.grant = Some(grant);
        let c = Arc::new(c);
        crate::client::read_command_later(&c);
        let mut fds = vec![fd.as_raw_fd()];
        fds.extend(
            visible
                .iter()
                .map(|&g| self.workers[self.lane_of(g, id)].bell_fd.as_raw_fd()),
        );
        // A client that died meanwhile: `c` goes, and its segment with it, unregistered.
        sock::send_with_fds(stream.as_raw_fd(), bytemuck::bytes_of(&welcome), &fds)?;
        // Its placement (and everyone's, if it is latency-critical) before any worker
        // sees it, so its first work already runs where it belongs.
        settled.apply(&c);
        self.mem_limits.apply(&c, &own_limits, first);
        tracing::info!(
            client = id,
            pid,
            qos = settled.qos.name(),
            "client connected"
        );
        self.clients.insert(id, (c.clone(), stream));
        self.publish_placements();
        self.publish_wait();
        for &g in &c.visible {
            // Open before any worker starts its session: a free on one GPU then always
            // waits for the client's work on the others (crate::release::peer_fence).
            crate::release::peer_fence::open(&c, g);
        }
        for &g in &c.visible {
            let w = self.lane_of(g, id);
            self.workers[w].send(ToWorker::Add(c.clone()));
        }
        Ok(())
    }

    /// Why one more client of process `pid`, through namespace `ns` (None: the server's
    /// own socket), would take more than its share of the client slots: its process's
    /// (OMPS_MAX_CLIENTS_PER_PROCESS; PID 0, processes the server cannot see, counts per
    /// socket they came through: those share an account, `Accounts::of`) or its namespace's (`max_clients=`, else all but a quarter of OMPS_MAX_CLIENTS;
    /// the server's own socket is held to that only while namespaces exist), so that one
    /// tenant cannot lock the others out (issue 23).
    pub(super) fn over_share(
        &self,
        pid: i32,
        ns: Option<&crate::control::namespace::Limits>,
    ) -> Option<String> {
        let b = crate::client::bounds::bounds();
        let group = ns.map(|n| &n.held);
        let (mut mine, mut ours) = (0, 0);
        let bucket = (pid == 0)
            .then(|| self.accounts.pid0_bucket(group))
            .flatten();
        for (c, _) in self.clients.values() {
            mine += usize::from(match &bucket {
                Some(a) => Arc::ptr_eq(&c.account, a),
                None => pid != 0 && c.pid == pid,
            });
            ours += usize::from(c.account.joined(group));
        }
        if mine >= b.clients_per_process {
            return Some(format!(
                "process {pid} has {mine} clients (OMPS_MAX_CLIENTS_PER_PROCESS)"
            ));
        }
        // The floors of the other namespaces, less what they use, stay free for them.
        let floor = b.namespace_floor(self.namespaces.len());
        let others = self
            .namespaces
            .limits()
            .filter(|n| group.is_none_or(|mine| !Arc::ptr_eq(&n.held, mine)))
            .map(|n| {
                let used = self
                    .clients
                    .values()
                    .filter(|(c, _)| c.account.joined(Some(&n.held)))
                    .count();
                (used, n.max_clients.map_or(floor, |m| m.min(floor)))
            });
        if let Some(kept) = b.takes_kept(self.clients.len(), others) {
            return Some(format!(
                "the other namespaces keep {kept} of the free client slots (each keeps up to {floor} of OMPS_MAX_CLIENTS)"
            ));
        }
        let cap = match ns {
            Some(n) => n.max_clients.unwrap_or_else(|| b.namespace_clients()),
            None if self.namespaces.is_empty() => return None,
            None => b.namespace_clients(),
        };
        (ours >= cap).then(|| match ns {
            Some(n) if n.max_clients.is_some() => format!(
                "namespace '{}' has {ours} clients (its max_clients={cap})",
                n.name
            ),
            Some(n) => format!(
                "namespace '{}' has {ours} clients, its share (OMPS_MAX_CLIENTS less a quarter; the operator may set max_clients=)",
                n.name
            ),
            None => format!(
                "the server's own socket has {ours} clients, its share while namespaces exist (OMPS_MAX_CLIENTS less a quarter)"
            ),
        })
    }
}
