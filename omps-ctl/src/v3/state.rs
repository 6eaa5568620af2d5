//! What the running omps server has, read through its own commands, in the shape MPS v3's
//! verbs talk about: servers (directories of namespaces), namespaces with their limits,
//! clients with the namespace they came through, devices.
//!
//! An MPS v3 server `S` is, in omps, the namespaces named `S/...` (their sockets under
//! `PIPE/S/`); `S/default` holds the server's own limits and allowed devices
//! (crate::v3::exec makes it with `server create`). Namespaces made by name alone belong
//! to the implicit server `omps`, whose default namespace is the pipe directory's own
//! socket.

use crate::talk;
use std::path::PathBuf;

/// The implicit server: the pipe directory's own socket and the one-word namespaces.
pub const IMPLICIT: &str = "omps";

#[derive(Debug, Clone)]
pub struct Device {
    pub ordinal: usize,
    pub uuid: String,
    pub pci: String,
    pub name: String,
    pub sms: u32,
    pub chunks: u32,
}

#[derive(Debug, Clone, Default)]
pub struct Namespace {
    /// The server's namespace name (`S/N`, or `N` for the implicit server's).
    pub full: String,
    pub server: String,
    pub name: String,
    pub socket: PathBuf,
    /// `mem_limit=` as the server lists it: `none`, or `ORD=SIZE,...`.
    pub mem: String,
    /// `thread_percentage=`: `default` or a number.
    pub pct: String,
    pub qos: String,
    pub partition: String,
    /// `gpus=`: `all` or ordinals.
    pub gpus: String,
    pub max_clients: String,
}

impl Namespace {
    /// Its settings as `create_namespace` takes them (to make it again with a change).
    pub fn settings(&self) -> Vec<String> {
        let mut v = Vec::new();
        if self.mem != "none" {
            v.push(format!("mem_limit={}", self.mem));
        }
        if self.pct != "default" {
            v.push(format!("thread_percentage={}", self.pct));
        }
        v.push(format!("qos={}", self.qos));
        if self.partition != "none" {
            v.push(format!("partition={}", self.partition));
        }
        if self.gpus != "all" {
            v.push(format!("gpus={}", self.gpus));
        }
        if !self.max_clients.is_empty() {
            v.push(format!("max_clients={}", self.max_clients));
        }
        v
    }

    /// The pinned memory limit as v3 prints it: one size if every one of the server's
    /// `ngpus` GPUs has the same, the per-GPU list otherwise, `-` for none.
    pub fn memory_text(&self, ngpus: usize) -> String {
        if self.mem == "none" {
            return "-".into();
        }
        let sizes: Vec<&str> = self
            .mem
            .split(',')
            .filter_map(|e| e.split_once('=').map(|(_, s)| s))
            .collect();
        match sizes.first() {
            Some(first) if sizes.len() == ngpus && sizes.iter().all(|s| s == first) => {
                first.to_string()
            }
            _ => self.mem.clone(),
        }
    }

    /// The active thread percentage as v3 prints it (two decimals), `-` for none.
    pub fn pct_text(&self) -> String {
        self.pct
            .parse::<f64>()
            .map_or("-".into(), |p| format!("{p:.2}"))
    }

    /// 0 (normal) or 1 (below normal); latency-critical, omps's own class, shows as such.
    pub fn priority_text(&self) -> String {
        match self.qos.as_str() {
            "normal" => "0".into(),
            "below-normal" => "1".into(),
            other => other.into(),
        }
    }

    pub fn dir(&self) -> PathBuf {
        self.socket.parent().map(PathBuf::from).unwrap_or_default()
    }
}

#[derive(Debug, Clone)]
pub struct Client {
    pub pid: u32,
    /// The namespace's full name, `-` for the pipe directory's own socket.
    pub namespace: String,
    pub device: String,
    pub pid_ns: String,
    pub command: String,
}

impl Client {
    pub fn server(&self) -> String {
        split(&self.namespace).0
    }

    /// `SERVER/NAMESPACE` as v3's `maws-ns` column shows it.
    pub fn maws_ns(&self) -> String {
        let (s, n) = split(&self.namespace);
        format!("{s}/{n}")
    }
}

/// (server, namespace) of a namespace's full name; `-` is the implicit server's default.
pub fn split(full: &str) -> (String, String) {
    match full.split_once('/') {
        Some((s, n)) => (s.into(), n.into()),
        None if full == "-" => (IMPLICIT.into(), "default".into()),
        None => (IMPLICIT.into(), full.into()),
    }
}

pub struct State {
    pub server_pid: String,
    pub status: String,
    pub uid: u32,
    pub pipe: PathBuf,
    pub devices: Vec<Device>,
    pub namespaces: Vec<Namespace>,
    pub clients: Vec<Client>,
}

impl State {
    pub fn read() -> Result<State, String> {
        let server_pid = talk::ask("get_server_list")?.trim().to_string();
        if server_pid.lines().count() != 1 {
            // The multi-user daemon answers with each user's server.
            return Err(format!(
                "this daemon runs {} servers (one per user): MPS v3 commands go to one user's \
                 server, through its pipe directory (PIPE/u<uid>)",
                server_pid.lines().count()
            ));
        }
        let status = talk::ask(&format!("get_server_status {server_pid}"))?
            .trim()
            .to_string();
        Ok(State {
            status,
            server_pid,
            // SAFETY: getuid cannot fail and touches no memory.
            uid: unsafe { libc::getuid() },
            pipe: omps_ring::sock::pipe_directory(),
            devices: parse_devices(&talk::ask("device_table")?),
            namespaces: parse_namespaces(&talk::ask("list_namespaces")?),
            clients: parse_clients(&talk::ask("client_namespaces")?),
        })
    }

    /// The v3 servers: the implicit one, then each `S` of an `S/...` namespace.
    pub fn servers(&self) -> Vec<String> {
        let mut v = vec![IMPLICIT.to_string()];
        for n in &self.namespaces {
            if n.full.contains('/') && !v.contains(&n.server) {
                v.push(n.server.clone());
            }
        }
        v
    }

    pub fn namespace(&self, server: &str, name: &str) -> Option<&Namespace> {
        self.namespaces
            .iter()
            .find(|n| n.server == server && n.name == name)
    }

    pub fn server_exists(&self, s: &str) -> bool {
        s == IMPLICIT || self.namespaces.iter().any(|n| n.server == s)
    }

    /// The clients of a namespace (by its full name).
    pub fn clients_of(&self, full: &str) -> Vec<u32> {
        let mut v: Vec<u32> = self
            .clients
            .iter()
            .filter(|c| c.namespace == full)
            .map(|c| c.pid)
            .collect();
        v.dedup();
        v
    }

    /// Ready or Fault, as v3 lists a server's status.
    pub fn status_word(&self) -> &'static str {
        if self.status == "ACTIVE" {
            "Ready"
        } else {
            "Fault"
        }
    }

    /// A device named by ordinal or UUID: its ordinal.
    pub fn device(&self, d: &super::values::Device) -> Result<&Device, String> {
        use super::values::Device as D;
        let found = match d {
            D::Ordinal(o) => self.devices.iter().find(|x| x.ordinal == *o as usize),
            D::Uuid(u) => self.devices.iter().find(|x| x.uuid.eq_ignore_ascii_case(u)),
        };
        found.ok_or_else(|| format!("no device '{d}' on this server (`device list` shows them)"))
    }
}

/// A partition the server has now, as `lspart` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LivePartition {
    /// omps's name for it, `UUID/pN`.
    pub id: String,
    pub chunks: u32,
    pub sms: String,
}

/// The server's partitions now (`lspart`; its free-capacity rows left out).
pub fn live_partitions() -> Result<Vec<LivePartition>, String> {
    Ok(parse_lspart(&talk::ask("lspart")?))
}

fn parse_lspart(text: &str) -> Vec<LivePartition> {
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 4 && f[1] != "-").then(|| LivePartition {
                id: f[1].to_string(),
                chunks: f[2].parse().unwrap_or(0),
                sms: f[3].to_string(),
            })
        })
        .collect()
}

/// Clients' PIDs as messages list them.
pub fn pid_list(pids: &[u32]) -> String {
    pids.iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// A v3 partition's name: (server, device UUID, name, omps's `UUID/pN`). omps names its
/// partitions by id; the v3 names live in the operator's directory
/// (`PIPE/operator/v3-partitions`), a line each, and a name whose partition the server no
/// longer has (after a restart) is dropped when read against `lspart`.
pub type PartitionName = (String, String, String, String);

fn partition_names_path(pipe: &std::path::Path) -> PathBuf {
    pipe.join(omps_ring::sock::OPERATOR_DIR)
        .join("v3-partitions")
}

pub fn read_partition_names(pipe: &std::path::Path) -> Vec<PartitionName> {
    std::fs::read_to_string(partition_names_path(pipe))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let [s, u, n, id] = f[..] else { return None };
            Some((s.into(), u.into(), n.into(), id.into()))
        })
        .collect()
}

pub fn write_partition_names(pipe: &std::path::Path, v: &[PartitionName]) -> Result<(), String> {
    let path = partition_names_path(pipe);
    let text: String = v
        .iter()
        .map(|(s, u, n, id)| format!("{s} {u} {n} {id}\n"))
        .collect();
    std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))
}

fn parse_devices(text: &str) -> Vec<Device> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            let [o, uuid, pci, name, sms, chunks] = f[..] else {
                return None;
            };
            Some(Device {
                ordinal: o.parse().ok()?,
                uuid: uuid.into(),
                pci: pci.into(),
                name: name.into(),
                sms: sms.parse().ok()?,
                chunks: chunks.parse().ok()?,
            })
        })
        .collect()
}

pub fn parse_namespaces(text: &str) -> Vec<Namespace> {
    text.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let full = w.next()?.to_string();
            let socket = PathBuf::from(w.next()?);
            let mut n = Namespace {
                socket,
                ..Default::default()
            };
            for kv in w {
                let (k, v) = kv.split_once('=')?;
                let v = v.to_string();
                match k {
                    "mem_limit" => n.mem = v,
                    "thread_percentage" => n.pct = v,
                    "qos" => n.qos = v,
                    "partition" => n.partition = v,
                    "gpus" => n.gpus = v,
                    "max_clients" => n.max_clients = v,
                    _ => {}
                }
            }
            (n.server, n.name) = split(&full);
            n.full = full;
            Some(n)
        })
        .collect()
}

fn parse_clients(text: &str) -> Vec<Client> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.splitn(5, '\t').collect();
            let [pid, ns, dev, pid_ns, cmd] = f[..] else {
                return None;
            };
            Some(Client {
                pid: pid.parse().ok()?,
                namespace: ns.into(),
                device: dev.into(),
                pid_ns: pid_ns.into(),
                command: cmd.into(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces_are_read_as_the_server_lists_them() {
        let ns = parse_namespaces(
            "team /p/omps/team/control mem_limit=0=16M,1=16M thread_percentage=50.0 qos=below-normal partition=none gpus=all max_clients=768\n\
             training/default /p/training/default/control mem_limit=none thread_percentage=default qos=normal partition=none gpus=0 max_clients=768\n",
        );
        assert_eq!(ns.len(), 2);
        assert_eq!(
            (ns[0].server.as_str(), ns[0].name.as_str()),
            ("omps", "team")
        );
        assert_eq!(ns[0].memory_text(2), "16M");
        assert_eq!(
            ns[0].memory_text(3),
            "0=16M,1=16M",
            "a GPU without the limit"
        );
        assert_eq!(ns[0].pct_text(), "50.00");
        assert_eq!(ns[0].priority_text(), "1");
        assert_eq!(
            ns[0].settings(),
            vec![
                "mem_limit=0=16M,1=16M",
                "thread_percentage=50.0",
                "qos=below-normal",
                "max_clients=768"
            ]
        );
        assert_eq!(
            (ns[1].server.as_str(), ns[1].name.as_str()),
            ("training", "default")
        );
        assert_eq!(ns[1].memory_text(2), "-");
        assert_eq!(
            ns[1].settings(),
            vec!["qos=normal", "gpus=0", "max_clients=768"]
        );
        assert_eq!(ns[1].dir(), PathBuf::from("/p/training/default"));
    }

    #[test]
    fn lspart_rows_are_partitions_only() {
        let p = parse_lspart(
            "GPU PARTITION CHUNKS SMS CLIENTS\nGPU-a - 14 free 112 free -\nGPU-a GPU-a/p1 2 16 0\n",
        );
        assert_eq!(
            p,
            vec![LivePartition {
                id: "GPU-a/p1".into(),
                chunks: 2,
                sms: "16".into()
            }]
        );
    }

    #[test]
    fn clients_and_devices() {
        let c =
            parse_clients("42\ttraining/hp\tGPU-1\t4026531836\tpython train.py\n7\t-\t-\t1\tx\n");
        assert_eq!(c[0].maws_ns(), "training/hp");
        assert_eq!(c[1].maws_ns(), "omps/default");
        assert_eq!(c[1].server(), "omps");
        let d = parse_devices("0\tGPU-ab\t0000:01:00.0\tNVIDIA H100\t132\t16\nbad\n");
        assert_eq!(d.len(), 1);
        assert_eq!((d[0].sms, d[0].chunks), (132, 16));
    }
}
