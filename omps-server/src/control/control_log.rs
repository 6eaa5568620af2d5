//! control.log in the log directory, as MPS's control daemon keeps it: each command an
//! operator sent and its answer, and the server's start and end, one timestamped line each
//! (`[2026-11-23 10:51:18.123 Control  4242] Cmd:ps`).

use std::io::Write;

pub struct ControlLog {
    file: Option<crate::base::log_file::CappedLog>,
}

impl ControlLog {
    /// Appends to `dir`/control.log; logs nowhere when there is no log directory.
    pub fn open(dir: Option<&std::path::Path>) -> ControlLog {
        let file = dir.and_then(|d| {
            let _ = std::fs::create_dir_all(d);
            crate::base::log_file::CappedLog::open(
                d,
                "control.log",
                crate::base::log_file::max_bytes(),
            )
            .inspect_err(|e| tracing::warn!("cannot open {}/control.log: {e}", d.display()))
            .ok()
        });
        ControlLog { file }
    }

    pub fn line(&mut self, msg: &str) {
        if let Some(f) = &mut self.file {
            // One write per line: the cap moves the log between lines only.
            let line = format!(
                "[{} Control {:>5}] {msg}\n",
                timestamp(),
                std::process::id()
            );
            let _ = f.write_all(line.as_bytes());
        }
    }

    /// A command and its answer (the answer's lines, or its failure).
    pub fn command(&mut self, cmd: &str, ok: bool, out: &str) {
        self.line(&format!("Cmd:{cmd}"));
        if !ok {
            self.line(&format!("Failed: {}", out.trim_end()));
        } else {
            let lines: Vec<&str> = out.lines().collect();
            for l in lines.iter().take(8) {
                self.line(l);
            }
            if lines.len() > 8 {
                self.line(&format!("({} more lines)", lines.len() - 8));
            }
        }
    }
}

/// Local time as MPS's logs write it: `2026-11-23 10:51:18.123`.
fn timestamp() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let secs = now.as_secs() as libc::time_t;
    // SAFETY: tm is plain data, zeroed is a valid value; localtime_r writes into it and
    // reads only `secs`.
    let tm = unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        libc::localtime_r(&secs, &mut tm);
        tm
    };
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02}.{:03}",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec,
        now.subsec_millis()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_and_answers_are_logged_with_timestamps() {
        let dir = std::env::temp_dir().join(format!("omps-ctl-log-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut log = ControlLog::open(Some(&dir));
        log.command("get_server_list", true, "42\n");
        log.command("shutdown_server 1", false, "no server with PID 1\n");
        let text = std::fs::read_to_string(dir.join("control.log")).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        assert!(lines[0].ends_with("] Cmd:get_server_list"), "{text}");
        assert!(lines[1].ends_with("] 42"));
        assert!(lines[3].ends_with("] Failed: no server with PID 1"));
        let stamp = &lines[0][1..24];
        assert_eq!(
            (&stamp[4..5], &stamp[10..11], &stamp[19..20]),
            ("-", " ", "."),
            "{stamp}"
        );
        assert!(lines[0][24..].starts_with(" Control "));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
