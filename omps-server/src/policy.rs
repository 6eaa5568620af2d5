//! What operators and clients decide about scheduling: each client's QoS, and the defaults
//! new clients get. MPS's commands keep their names and meaning; omps adds a per-client
//! QoS that an operator can change while the client runs.

use crate::client::ClientShared;
use crate::placement::Qos;
use omps_ring::wire::ClientSettings;
use std::sync::Arc;

/// The control commands this module answers.
pub const COMMANDS: &[&str] = &[
    "set_default_client_priority",
    "get_default_client_priority",
    "set_client_qos",
    "get_client_qos",
];

#[derive(Default)]
pub struct Policy {
    /// For clients that do not say (MPS's `set_default_client_priority`).
    default_qos: Qos,
}

impl Policy {
    /// The QoS a connecting client gets: its own request, else the default.
    pub fn client_qos(&self, s: &ClientSettings) -> Result<Qos, String> {
        if s.qos == ClientSettings::UNSET {
            return Ok(self.default_qos);
        }
        u8::try_from(s.qos)
            .ok()
            .and_then(Qos::from_u8)
            .ok_or_else(|| format!("client priority {} is not 0, 1 or 2", s.qos))
    }

    /// Runs one control command (a name in [`COMMANDS`]): (success, reply text).
    pub fn command(
        &mut self,
        cmd: &str,
        args: &[&str],
        clients: &[Arc<ClientShared>],
    ) -> (bool, String) {
        match (cmd, args) {
            ("set_default_client_priority", [v]) => match *v {
                "0" | "1" => {
                    self.default_qos = Qos::parse(v).expect("0 and 1 parse");
                    (true, String::new())
                }
                _ => fail(format!("client priority '{v}' is not 0 (normal) or 1 (below normal)")),
            },
            ("get_default_client_priority", []) => {
                // MPS has two levels; a latency-critical default reads as normal there.
                let v = (self.default_qos == Qos::BelowNormal) as u8;
                (true, format!("{v}\n"))
            }
            ("set_client_qos", [pid, q]) => {
                let Some(q) = Qos::parse(q) else {
                    return fail(format!(
                        "QoS '{q}' is not normal, below-normal or latency-critical (0, 1, 2)"
                    ));
                };
                match of_pid(clients, pid) {
                    Ok(cs) => {
                        cs.iter().for_each(|c| c.set_qos(q));
                        (true, String::new())
                    }
                    Err(e) => fail(e),
                }
            }
            ("get_client_qos", [pid]) => match of_pid(clients, pid) {
                Ok(cs) => (true, format!("{}\n", cs[0].qos().name())),
                Err(e) => fail(e),
            },
            _ => fail(format!("usage: {}", usage(cmd))),
        }
    }
}

fn usage(cmd: &str) -> &'static str {
    match cmd {
        "set_default_client_priority" => "set_default_client_priority 0|1",
        "set_client_qos" => "set_client_qos <PID> normal|below-normal|latency-critical",
        "get_client_qos" => "get_client_qos <PID>",
        _ => "a command without arguments",
    }
}

fn fail(why: String) -> (bool, String) {
    (false, format!("{why}\n"))
}

/// The connected clients of process `pid` (one process may hold several connections).
fn of_pid(clients: &[Arc<ClientShared>], pid: &str) -> Result<Vec<Arc<ClientShared>>, String> {
    let Ok(p) = pid.parse::<i32>() else {
        return Err(format!("'{pid}' is not a PID"));
    };
    let v: Vec<_> = clients.iter().filter(|c| c.pid == p).cloned().collect();
    if v.is_empty() {
        return Err(format!("no client with PID {p}"));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_gets_its_own_qos_or_the_default() {
        let mut p = Policy::default();
        let mut s = ClientSettings::none();
        assert_eq!(p.client_qos(&s), Ok(Qos::Normal));
        assert!(p.command("set_default_client_priority", &["1"], &[]).0);
        assert_eq!(p.client_qos(&s), Ok(Qos::BelowNormal));
        assert_eq!(
            p.command("get_default_client_priority", &[], &[]),
            (true, "1\n".into())
        );
        s.qos = 2;
        assert_eq!(p.client_qos(&s), Ok(Qos::LatencyCritical));
        s.qos = 9;
        assert!(p.client_qos(&s).unwrap_err().contains('9'));
    }

    #[test]
    fn bad_commands_say_what_was_wrong() {
        let mut p = Policy::default();
        let (ok, why) = p.command("set_default_client_priority", &["2"], &[]);
        assert!(!ok && why.contains("'2'"));
        let (ok, why) = p.command("set_client_qos", &["12", "urgent"], &[]);
        assert!(!ok && why.contains("urgent"));
        let (ok, why) = p.command("set_client_qos", &["x", "lc"], &[]);
        assert!(!ok && why.contains("'x' is not a PID"));
        let (ok, why) = p.command("get_client_qos", &["4242"], &[]);
        assert!(!ok && why.contains("no client with PID 4242"));
        let (ok, why) = p.command("set_client_qos", &[], &[]);
        assert!(!ok && why.contains("usage"));
    }
}
