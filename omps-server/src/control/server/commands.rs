//! The control commands (omps-ctl, nvidia-cuda-mps-control's): what each prints.

use super::*;
use crate::base::ids::uuid_text;

impl Server {
    /// Runs one omps-ctl / nvidia-cuda-mps-control command line: (success, output).
    /// Each is written to control.log with its answer, as MPS's daemon does.
    pub fn control_command(&mut self, line: &str) -> (bool, String) {
        let (ok, out) = self.run_command(line);
        // What `omps-ctl top` and scrapers poll every second stays out of the log.
        let polled = matches!(
            line.split_whitespace().next(),
            Some("metrics" | "stats") | None
        );
        if !polled {
            self.control_log.command(line.trim(), ok, &out);
        }
        (ok, out)
    }

    fn run_command(&mut self, line: &str) -> (bool, String) {
        let words: Vec<&str> = line.split_whitespace().collect();
        let me = std::process::id().to_string();
        match words.as_slice() {
            ["status"] => (true, self.status_text()),
            ["ps"] => (true, self.ps_text(None)),
            // As under MPS, -p names a server (this one: every client); omps also takes a
            // client's PID.
            ["ps", "-p", pid] if *pid == me => (true, self.ps_text(None)),
            ["ps", "-p", pid] => match pid.parse::<i32>() {
                Ok(p)
                    if self.clients.values().any(|(c, _)| c.pid == p)
                        || self.exiting.iter().any(|c| c.pid == p) =>
                {
                    (true, self.ps_text(Some(p)))
                }
                Ok(p) => (false, format!("ps: no server or client with PID {p} (this server is {me})\n")),
                Err(_) => (false, format!("ps: '{pid}' is not a PID\n")),
            },
            ["stats"] => (true, self.stats_text()),
            ["client_namespaces"] => (true, self.client_namespaces()),
            ["device_table"] => (true, self.device_table()),
            ["metrics"] => (true, self.board.render()),
            ["terminate_client", args @ ..] => self.terminate_client(args),
            [cmd, args @ ..] if crate::client::memlimit::COMMANDS.contains(cmd) => {
                let clients = self.client_list();
                self.mem_limits.command(cmd, args, &clients, &self.snapshots)
            }
            [cmd, args @ ..] if crate::control::namespace::COMMANDS.contains(cmd) => {
                self.namespaces.command(cmd, args, &self.policy, &self.snapshots)
            }
            [cmd, args @ ..] if crate::worker::policy::COMMANDS.contains(cmd) => {
                let clients = self.client_list();
                let r = self.policy.command(cmd, args, &clients, &self.gpus);
                self.policy.publish(&clients);
                r
            }
            ["get_server_list"] => (true, format!("{me}\n")),
            ["get_server_status", pid] if *pid == me => {
                let state = if self.any_fault() { "FAULT" } else { "ACTIVE" };
                (true, format!("{state}\n"))
            }
            ["get_client_list"] => (true, self.client_pids(None)),
            ["get_client_list", pid] | ["get_device_client_list", pid] if *pid != me => {
                (false, format!("{}: no server with PID {pid} (this server is {me})\n", words[0]))
            }
            ["get_client_list", _] => (true, self.client_pids(None)),
            ["get_device_client_list"] | ["get_device_client_list", _] => {
                (true, self.device_client_list())
            }
            ["device_query", rest @ ..] => self.device_query(rest, &me),
            ["start_server", "-uid", uid] => match uid.parse::<u32>() {
                // One server per user: this one is the user's.
                Ok(u) if u == self.uid => (true, format!("{me}\n")),
                Ok(u) => (false, format!("start_server: this server serves uid {}; a server for uid {u} is an omps-server started as that user with a pipe directory of its own\n", self.uid)),
                Err(_) => (false, format!("start_server: '{uid}' is not a uid\n")),
            },
            ["shutdown_server", pid, rest @ ..] if *pid == me => match rest {
                [] => self.drain(None, "shutdown_server"),
                ["-f"] => {
                    self.terminate_all("the server was shut down (shutdown_server -f)");
                    self.quit = true;
                    (true, String::new())
                }
                _ => (false, "usage: shutdown_server <server PID> [-f]\n".into()),
            },
            ["shutdown_server", pid, ..] => (
                false,
                format!("shutdown_server: no server with PID {pid} (this server is {me})\n"),
            ),
            ["get_server_status", pid] => (
                false,
                format!("get_server_status: no server with PID {pid} (this server is {me})\n"),
            ),
            ["quit"] => {
                self.quit = true;
                (true, String::new())
            }
            ["quit", "-t", secs] => match secs.parse::<u64>() {
                Ok(t) => self.drain(Some(Duration::from_secs(t)), "quit -t"),
                Err(_) => (false, format!("quit: '{secs}' is not a number of seconds\n")),
            },
            [] => (true, String::new()),
            [_, ..] => (false, format!("unknown or malformed command '{}' (known: {})\n", words.join(" "), known_commands())),
        }
    }

    /// Stops taking clients and quits once those connected have gone, or once `patience`
    /// has passed (then they are terminated).
    fn drain(&mut self, patience: Option<Duration>, why: &str) -> (bool, String) {
        tracing::info!(
            clients = self.clients.len(),
            "{why}: taking no new clients, quitting once the connected ones are gone"
        );
        // A deadline past what an Instant holds is no deadline.
        self.draining = Some(patience.and_then(|p| Instant::now().checked_add(p)));
        (true, String::new())
    }

    /// Cuts every client off (CUDA_ERROR_MPS_CLIENT_TERMINATED).
    pub(super) fn terminate_all(&mut self, why: &str) {
        for (c, _) in self.clients.values() {
            c.disconnect(code::MPS_CLIENT_TERMINATED, why);
        }
    }

    fn client_pids(&self, gpu: Option<usize>) -> String {
        let mut pids: Vec<i32> = self
            .clients
            .values()
            .map(|(c, _)| c)
            .filter(|c| gpu.is_none_or(|g| c.used_gpus.load(Ordering::Relaxed) & (1 << g) != 0))
            .map(|c| c.pid)
            .collect();
        pids.sort_unstable();
        pids.dedup();
        pids.iter().map(|p| format!("{p}\n")).collect()
    }

    /// Per GPU, a line naming it as MPS does (`[0] 06:00.0, NVIDIA H100 80GB HBM3`), then
    /// `PID.N` for each process that has used it, N its connections (MPS: contexts).
    fn device_client_list(&self) -> String {
        let mut s = String::new();
        for (g, snap) in self.snapshots.iter().enumerate() {
            let bus = text_of(&snap.pci_bus_id);
            // "0000:06:00.0" -> "06:00.0"
            let short = bus.split_once(':').map_or(bus.as_str(), |(_, rest)| rest);
            s += &format!("[{g}] {short}, {}\n", snap.name_str());
            let mut per_pid = std::collections::BTreeMap::<i32, usize>::new();
            for (c, _) in self.clients.values() {
                if c.used_gpus.load(Ordering::Relaxed) & (1 << g) != 0 {
                    *per_pid.entry(c.pid).or_default() += 1;
                }
            }
            for (pid, n) in per_pid {
                s += &format!("{pid}.{n}\n");
            }
        }
        s
    }

    /// `device_query [<server PID>] [--csv]`: the GPUs, as the server numbers them.
    fn device_query(&self, args: &[&str], me: &str) -> (bool, String) {
        let csv = args.contains(&"--csv");
        if let Some(pid) = args.iter().find(|a| **a != "--csv").filter(|p| **p != me) {
            return (
                false,
                format!("device_query: no server with PID {pid} (this server is {me})\n"),
            );
        }
        // MPS's daemon pads the columns to these widths (the last is not padded).
        let row = |cells: [&str; 5]| -> String {
            let line = match csv {
                true => cells.join(","),
                false => cells
                    .iter()
                    .zip([16, 15, 42, 34, 0])
                    .map(|(c, w)| format!("{c:<w$}"))
                    .collect(),
            };
            line + "\n"
        };
        let mut sections = Vec::new();
        for section in ["Default".to_string(), format!("Server {me}")] {
            let mut s = format!("{section}\n");
            s += &row(["Device Ordinal", "PCI IDs", "UUID", "Name", "Attributes"]);
            for (g, snap) in self.snapshots.iter().enumerate() {
                s += &row([
                    &g.to_string(),
                    &text_of(&snap.pci_bus_id),
                    &uuid_text(&snap.uuid),
                    snap.name_str(),
                    "N/A",
                ]);
            }
            sections.push(s);
        }
        (true, sections.join("\n"))
    }

    fn status_text(&self) -> String {
        let fault = self.any_fault();
        let mut s = format!(
            "omps-server {} pid {} {}\npipe directory: {}\ndriver version: {}\nclients: {}\n",
            env!("CARGO_PKG_VERSION"),
            std::process::id(),
            if fault { "FAULT" } else { "ACTIVE" },
            self.cfg.pipe_dir.display(),
            self.driver_version,
            self.clients.len()
        );
        for (i, snap) in self.snapshots.iter().enumerate() {
            let mem: u64 = self
                .clients
                .values()
                .map(|(c, _)| c.mem_bytes[i].load(Ordering::Relaxed))
                .sum();
            s += &format!(
                "GPU {i}: {} {} total {} MiB, clients' allocations {} MiB\n",
                snap.name_str(),
                uuid_text(&snap.uuid),
                snap.total_mem >> 20,
                mem >> 20
            );
            s += &format!(
                "  {}\n",
                crate::gpu::features::Features::of(snap, self.policy.confines(i)).summary()
            );
        }
        let unattributed = self.printf.unattributed();
        if unattributed > 0 {
            s += &format!(
                "device printf sent to the server log (no single client to give it to): {unattributed} bytes\n"
            );
        }
        s
    }

    /// `terminate_client [<server PID>] <client PID>`, as MPS's: the client is cut off
    /// (its calls fail with CUDA_ERROR_MPS_CLIENT_TERMINATED) and its resources are
    /// released once its queued work has finished. The answer comes at once; `ps` lists
    /// the client as exiting until the release is done. One shared context cannot stop a
    /// kernel that is running: a kernel that never ends keeps its client's resources,
    /// and only a context reset (which fails every client) would reclaim them.
    fn terminate_client(&mut self, args: &[&str]) -> (bool, String) {
        let me = std::process::id().to_string();
        let client = match args {
            [server, client] if *server == me => client,
            [server, _] => {
                return (
                    false,
                    format!("server PID {server} is not this server's ({me})\n"),
                )
            }
            [client] => client,
            _ => {
                return (
                    false,
                    "usage: terminate_client [<server PID>] <client PID>\n".into(),
                )
            }
        };
        let Ok(pid) = client.parse::<i32>() else {
            return (false, format!("'{client}' is not a PID\n"));
        };
        let mut found = false;
        for (c, _) in self.clients.values().filter(|(c, _)| c.pid == pid) {
            c.disconnect(code::MPS_CLIENT_TERMINATED, "terminated by the operator");
            found = true;
        }
        if !found {
            return (false, format!("no client with PID {pid}\n"));
        }
        (true, String::new())
    }

    /// The workers' counters and each client's share of them, with a timestamp so that a
    /// reader can take rates between two calls.
    fn stats_text(&self) -> String {
        let mut s = format!("now_ns {}\n", self.started.elapsed().as_nanos());
        for (g, shared) in self.gpu_shared.iter().enumerate() {
            for (l, lane) in shared.stats.iter().enumerate() {
                s += &format!("lane {g}.{l} {}\n", lane.line_and_reset_max());
            }
            let (modules, users, idle) = shared.modules.census();
            s += &format!("cache {g} modules {modules} users {users} idle_bytes {idle}\n");
        }
        s += &heap_line();
        let mut rows: Vec<&Arc<ClientShared>> = self.clients.values().map(|(c, _)| c).collect();
        rows.sort_by_key(|c| c.id);
        for c in rows {
            // Per GPU, its bound work streams per priority class, least urgent first, and
            // the SM confinement slot it runs in, if any.
            let classes: Vec<String> = self
                .gpu_shared
                .iter()
                .enumerate()
                .map(|(i, g)| {
                    let n = g.bound_by_class(c.id);
                    let slot = c
                        .placement(i)
                        .slot
                        .map_or(String::new(), |s| format!("@{s}"));
                    n.map(|k| k.to_string()).join("/") + &slot
                })
                .collect();
            s += &format!(
                "client {} pid {} commands {} server_ns {} qos {} streams {} name {}\n",
                c.id,
                c.pid,
                c.commands.load(Ordering::Relaxed),
                c.server_ns.load(Ordering::Relaxed),
                c.qos().name(),
                classes.join(","),
                c.name
            );
        }
        s
    }

    /// For omps-ctl's MPS v3 `client list` (issue 26): a tab-separated row per client and
    /// GPU it has used: PID, the namespace it came through (`-`: the server's own socket),
    /// the GPU's full UUID (`-`: none used yet), its PID namespace, its command.
    fn client_namespaces(&self) -> String {
        let mut rows: Vec<&Arc<ClientShared>> = self.clients.values().map(|(c, _)| c).collect();
        rows.sort_by_key(|c| c.id);
        let mut s = String::new();
        for c in rows {
            let ns = self
                .namespaces
                .limits()
                .find(|l| c.account.joined(Some(&l.held)))
                .map_or("-".to_string(), |l| l.name.clone());
            let used = c.used_gpus.load(Ordering::Relaxed);
            let mut devices: Vec<String> = (0..self.gpus.len())
                .filter(|&g| used & (1 << g) != 0 || c.mem_bytes[g].load(Ordering::Relaxed) > 0)
                .map(|g| uuid_text(&self.snapshots[g].uuid))
                .collect();
            if devices.is_empty() {
                devices.push("-".into());
            }
            for d in devices {
                s += &format!(
                    "{}\t{ns}\t{d}\t{}\t{}\n",
                    c.pid,
                    c.identity.pid_ns,
                    crate::client::one_word(c.command(), 64)
                );
            }
        }
        s
    }

    /// For omps-ctl's MPS v3 `device list`: a tab-separated row per GPU: ordinal, UUID,
    /// PCI bus id, name, SMs, whole SM chunks (0: the GPU cannot be partitioned).
    fn device_table(&self) -> String {
        let mut s = String::new();
        for (g, snap) in self.snapshots.iter().enumerate() {
            let (sms, chunks) = self
                .policy
                .sm_chunks(g)
                .map_or((0, 0), |c| (c.total, c.chunks));
            s += &format!(
                "{g}\t{}\t{}\t{}\t{sms}\t{chunks}\n",
                uuid_text(&snap.uuid),
                text_of(&snap.pci_bus_id),
                snap.name_str()
            );
        }
        s
    }

    /// MPS's columns (PID ID SERVER DEVICE NAMESPACE COMMAND), a row per client and GPU it
    /// has used, then omps's: its memory on that GPU, its limit there, the records the
    /// server handled for it, the server's time on them, its QoS class and its PID in its
    /// own namespace. Clients still being torn down end in "(exiting)".
    fn ps_text(&self, only: Option<i32>) -> String {
        let mut s = ps_row(&[
            "PID",
            "ID",
            "SERVER",
            "DEVICE",
            "NAMESPACE",
            "COMMAND",
            "MEM_BYTES",
            "LIMIT",
            "COMMANDS",
            "SERVER_MS",
            "QOS",
            "NS_PID",
        ]);
        let mut rows: Vec<&Arc<ClientShared>> = self
            .clients
            .values()
            .map(|(c, _)| c)
            .chain(self.exiting.iter())
            .filter(|c| only.is_none_or(|p| c.pid == p))
            .collect();
        rows.sort_by_key(|c| c.id);
        let me = std::process::id();
        for c in rows {
            let used = c.used_gpus.load(Ordering::Relaxed);
            let gpus: Vec<usize> = (0..self.gpus.len())
                .filter(|&g| used & (1 << g) != 0 || c.mem_bytes[g].load(Ordering::Relaxed) > 0)
                .collect();
            let exiting = if c.gone.load(Ordering::Relaxed) {
                " (exiting)"
            } else {
                ""
            };
            let id = &c.identity;
            let command = c.command();
            let devices: Vec<Option<usize>> = match gpus.is_empty() {
                true => vec![None],
                false => gpus.into_iter().map(Some).collect(),
            };
            for g in devices {
                let (device, mem, limit) = match g {
                    Some(g) => (
                        short_uuid(&self.snapshots[g].uuid),
                        c.mem_bytes[g].load(Ordering::Relaxed),
                        c.limit(g)
                            .map_or("-".into(), omps_ring::memlimit::format_size),
                    ),
                    None => ("-".into(), 0, "-".into()),
                };
                s += &ps_row(&[
                    &c.pid.to_string(),
                    &c.id.to_string(),
                    &me.to_string(),
                    &device,
                    &id.pid_ns.to_string(),
                    command,
                    &mem.to_string(),
                    &limit,
                    &c.commands.load(Ordering::Relaxed).to_string(),
                    &(c.server_ns.load(Ordering::Relaxed) / 1_000_000).to_string(),
                    c.qos().name(),
                    &format!("{}{exiting}", id.ns_pid),
                ]);
            }
        }
        s
    }
}

/// One line of `ps`: MPS's six columns at the widths its daemon pads them to, so that a
/// script cutting them by position reads the same, then omps's, at least a space apart.
fn ps_row(cells: &[&str]) -> String {
    const WIDTHS: [usize; 12] = [10, 10, 15, 26, 15, 15, 12, 8, 10, 10, 17, 0];
    let mut line = String::new();
    for (i, (cell, w)) in cells.iter().zip(WIDTHS).enumerate() {
        if i > 0 && !line.ends_with(' ') {
            line.push(' ');
        }
        line += &format!("{cell:<w$}");
    }
    line.truncate(line.trim_end().len());
    line + "\n"
}

/// Every command the server knows, for the error that names an unknown one.
fn known_commands() -> String {
    let own = [
        "status",
        "ps [-p PID]",
        "stats",
        "metrics",
        "terminate_client",
        "get_server_list",
        "get_server_status",
        "start_server -uid UID",
        "shutdown_server PID [-f]",
        "get_client_list",
        "get_device_client_list",
        "device_query [--csv]",
        "quit [-t SECONDS]",
        "client_namespaces",
        "device_table",
    ];
    own.iter()
        .copied()
        .chain(crate::worker::policy::COMMANDS.iter().copied())
        .chain(crate::client::memlimit::COMMANDS.iter().copied())
        .chain(crate::control::namespace::COMMANDS.iter().copied())
        .collect::<Vec<_>>()
        .join(", ")
}

/// A GPU's UUID as MPS's ps shows it: its first three groups.
fn short_uuid(u: &[u8; 16]) -> String {
    uuid_text(u)
        .splitn(5, '-')
        .take(4)
        .collect::<Vec<_>>()
        .join("-")
}

fn text_of(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

/// glibc's own account of the server's heap: what is allocated, what is free but kept
/// mapped, and what sits in large mmapped blocks. The soak reads it to tell a leak (in use
/// grows) from memory the allocator keeps (free grows) and from memory that never came
/// through malloc at all (resident grows, neither does).
fn heap_line() -> String {
    // SAFETY: mallinfo2 takes no arguments and only reads the allocator's counters.
    let m = unsafe { libc::mallinfo2() };
    format!(
        "heap in_use {} free {} mmapped {} arena {}\n",
        m.uordblks, m.fordblks, m.hblkhd, m.arena
    )
}
