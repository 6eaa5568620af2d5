//! The operator's commands in the root daemon: root's control connection reaches the
//! daemon, which answers for all servers (the server list, starting one, `quit`), keeps
//! defaults for servers started later, and routes the rest to the one server they are for.

use super::{ask, hello, Daemon, Running};
use omps_ring::sock;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

impl Daemon {
    /// Root's control connection: commands one per frame, answered by the daemon.
    pub(super) fn operator(&self, conn: UnixStream) {
        if hello::consume(&conn).is_err() {
            return;
        }
        while let Ok(Some(cmd)) = sock::read_frame(&mut &conn, 1 << 16) {
            let cmd = String::from_utf8_lossy(&cmd).trim().to_string();
            self.log(&format!("Cmd:{cmd}"));
            let (ok, text) = self.command(&cmd);
            let mut frame = vec![u8::from(!ok)];
            frame.extend_from_slice(text.as_bytes());
            if sock::write_frame(&mut &conn, &frame).is_err() {
                return;
            }
            if ok && cmd.split_whitespace().next() == Some("quit") {
                self.log("Daemon exited");
                self.pipe.remove(sock::SOCKET_NAME);
                self.pipe.remove(sock::PID_FILE);
                std::process::exit(0);
            }
        }
    }

    pub(super) fn command(&self, cmd: &str) -> (bool, String) {
        let words: Vec<&str> = cmd.split_whitespace().collect();
        let servers = self.all();
        match words.as_slice() {
            ["get_server_list"] => (
                true,
                servers.iter().map(|r| format!("{}\n", r.pid)).collect(),
            ),
            ["start_server", "-uid", uid] => match uid.parse::<u32>() {
                Ok(u) => match self.server_for(u, None) {
                    Ok(_) => (true, String::new()),
                    Err(e) => (false, format!("start_server: {e}\n")),
                },
                Err(_) => (false, format!("start_server: '{uid}' is not a uid\n")),
            },
            ["quit", ..] => {
                for r in servers.iter().rev() {
                    let _ = ask(&r.dir, r.uid, cmd);
                }
                let t = Instant::now();
                let limit = match words.as_slice() {
                    ["quit", "-t", s] => s.parse().map_or(10, |s: u64| s.saturating_add(10)),
                    _ => 10,
                };
                while !self.all().is_empty() && t.elapsed() < Duration::from_secs(limit) {
                    std::thread::sleep(Duration::from_millis(20));
                }
                (true, String::new())
            }
            [set, ..] if set.starts_with("set_default_") => {
                {
                    let mut d = self.defaults.lock().unwrap_or_else(|e| e.into_inner());
                    // The last one per setting (and device) holds.
                    let key = |c: &str| {
                        let w: Vec<&str> = c.split_whitespace().collect();
                        w[..w.len().saturating_sub(1)].join(" ")
                    };
                    d.0.retain(|c| key(c) != key(cmd));
                    d.0.push(cmd.to_string());
                    d.1 += 1;
                }
                // Listed after the default is in: a server starting now is not listed
                // yet, and replays it before it is.
                self.each(&self.all(), cmd, false)
            }
            ["ps", ..] => self.each(&servers, cmd, true),
            _ => {
                // A PID the command names: a server's, or a client's of some server.
                let pid = names_a_pid(&words)
                    .then(|| words.iter().skip(1).find_map(|w| w.parse::<u32>().ok()))
                    .flatten();
                match pid {
                    Some(p) => match server_of_pid(&servers, p) {
                        Ok(r) => ask(&r.dir, r.uid, cmd),
                        Err(e) => (false, e),
                    },
                    None => {
                        let mut last = (false, "no omps server runs\n".to_string());
                        for r in &servers {
                            last = ask(&r.dir, r.uid, cmd);
                            if last.0 {
                                break;
                            }
                        }
                        last
                    }
                }
            }
        }
    }

    /// `cmd` sent to every server; their answers together (for `ps`, one header).
    fn each(&self, servers: &[Running], cmd: &str, table: bool) -> (bool, String) {
        let mut ok = servers.is_empty();
        let mut out = String::new();
        let mut last_err = String::new();
        for r in servers {
            match ask(&r.dir, r.uid, cmd) {
                (true, text) => {
                    let skip = usize::from(table && ok && !out.is_empty());
                    for line in text.lines().skip(skip) {
                        out.push_str(line);
                        out.push('\n');
                    }
                    ok = true;
                }
                (false, text) => last_err = text,
            }
        }
        if ok {
            (true, out)
        } else {
            (false, last_err)
        }
    }
}

/// Whether the command's first number is a PID (a server's or a client's), as in MPS's
/// commands that name one; other numbers (a device, a partition's size, a namespace's
/// name) are no one's, and such commands go to every server in turn.
pub(super) fn names_a_pid(words: &[&str]) -> bool {
    const PID_COMMANDS: &[&str] = &[
        "terminate_client",
        "get_server_status",
        "shutdown_server",
        "get_client_list",
        "get_device_client_list",
        "ps",
        "set_client_qos",
        "get_client_qos",
        "set_active_thread_percentage",
        "get_active_thread_percentage",
        "set_device_pinned_mem_limit",
        "get_device_pinned_mem_limit",
    ];
    words.first().is_some_and(|c| PID_COMMANDS.contains(c))
}

/// The server a command naming `pid` is for: the server with that PID, else the server
/// of the user the process runs as (its effective uid, from /proc: the one its
/// connection's credentials carry, by which the daemon handed it to a server), since a
/// user's clients are served by that user's server alone. Not the first server to answer ok: a user can make
/// their own server say anything, and would take root's commands for others' clients.
pub(super) fn server_of_pid(servers: &[Running], pid: u32) -> Result<&Running, String> {
    if let Some(r) = servers.iter().find(|r| r.pid == pid) {
        return Ok(r);
    }
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map_err(|_| format!("no process {pid}\n"))?;
    // Uid: real, effective, saved, filesystem.
    let uid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|u| u.parse::<u32>().ok())
        .ok_or_else(|| format!("cannot read the uid of process {pid}\n"))?;
    servers
        .iter()
        .find(|r| r.uid == uid)
        .ok_or_else(|| format!("process {pid} runs as uid {uid}, which has no omps server\n"))
}
