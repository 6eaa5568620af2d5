//! `omps-ctl -d -a FILE` (and `-f -a FILE`): a checked configuration ([`super::config`])
//! made on the server just started, through the server's own commands; and `config save
//! FILE`, the running state written back as a configuration file (MPS v3 never writes
//! back what was changed at run time; omps can).
//!
//! Applying stops at the first step that fails (a UUID no GPU has, chunks that do not
//! fit) and takes back what it made; at daemon start the caller then stops the server
//! too, so nothing runs half-configured. `config apply FILE` (omps's own) does the same
//! on a running server. What the file
//! asked for with no effect in omps is kept in `PIPE/operator/v3-notes` and printed by
//! `get_server_status` (crate::main) beside the server's state.

use super::config::{Limits, Plan};
use super::state::{self, State};
use super::values::Device;
use crate::talk;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;

fn ask(step: &str, cmd: &str) -> Result<String, String> {
    talk::ask(cmd).map_err(|e| format!("{step}: {}", e.trim_end()))
}

fn limit_args(l: &Limits) -> Vec<String> {
    let mut v = Vec::new();
    if let Some(b) = l.pinned_memory {
        v.push(format!("mem_limit={}", omps_ring::memlimit::format_size(b)));
    }
    if let Some(p) = l.thread_percentage {
        v.push(format!("thread_percentage={p}"));
    }
    if let Some(p) = l.client_priority {
        v.push(format!(
            "qos={}",
            if p == 0 { "normal" } else { "below-normal" }
        ));
    }
    v
}

pub fn notes_path(pipe: &Path) -> std::path::PathBuf {
    pipe.join(omps_ring::sock::OPERATOR_DIR).join("v3-notes")
}

/// What one apply made, to take back if a later step fails.
#[derive(Default)]
struct Made {
    namespaces: Vec<String>,
    partitions: Vec<String>,
}

impl Made {
    fn undo(&self) {
        for n in self.namespaces.iter().rev() {
            let _ = talk::ask(&format!("delete_namespace {n}"));
        }
        for p in self.partitions.iter().rev() {
            let _ = talk::ask(&format!("sm_partition rm {p}"));
        }
    }
}

/// Makes `plan` on the running server, all of it or (a step failing) none of it: what
/// was made is taken back. Err names the file's key and the reason.
///
/// `at_start` (the daemon's `-a`, or `config apply --replace`): the file wins over what
/// the server has of what the file names (at start, what it made again from its own
/// record of an earlier run: namespaces are kept across restarts); those are made anew
/// with the file's limits. Otherwise (`config apply`) a namespace or server that exists
/// is refused, and nothing is made.
pub fn apply(plan: &Plan, at_start: bool) -> Result<(), String> {
    let mut made = Made::default();
    let r = apply_steps(plan, at_start, &mut made);
    if r.is_err() {
        made.undo();
    }
    r
}

fn apply_steps(plan: &Plan, at_start: bool, made: &mut Made) -> Result<(), String> {
    let st = State::read()?;
    if at_start {
        // The server's record of an earlier run, for the servers and namespaces the file
        // names: the file's limits replace them (no client has come yet).
        for n in &st.namespaces {
            let named = plan.servers.iter().any(|s| {
                s.name == n.server
                    && (s.name != state::IMPLICIT || s.namespaces.iter().any(|x| x.name == n.name))
            });
            if named {
                ask(
                    &format!("servers.{}", n.server),
                    &format!("delete_namespace {}", n.full),
                )?;
            }
        }
        return apply_steps(plan, false, made);
    }
    let live = talk::ask("lspart").unwrap_or_default();
    let mut names: Vec<state::PartitionName> = state::read_partition_names(&st.pipe)
        .into_iter()
        .filter(|(_, _, _, id)| {
            live.lines()
                .any(|l| l.split_whitespace().nth(1) == Some(id))
        })
        .collect();
    for s in &plan.servers {
        let key = format!("servers.{}", s.name);
        if let Some(u) = s.uid {
            if u != st.uid {
                return Err(format!(
                    "{key}.uid: {u} cannot be met: this omps server serves user {} (the multi-user daemon, -m, serves each user)",
                    st.uid
                ));
            }
        }
        // `omps`, the implicit server (the pipe directory's own socket): its namespaces
        // are the one-word ones (`PIPE/omps/<namespace>`), its limits the defaults.
        let implicit = s.name == state::IMPLICIT;
        if implicit && s.allowed_devices.is_some() {
            return Err(format!(
                "{key}.allowed_devices: the implicit server serves the GPUs it was started with \
                 (CUDA_VISIBLE_DEVICES on the daemon); name the devices on a server of its own"
            ));
        }
        if !implicit && st.server_exists(&s.name) {
            return Err(format!("{key}: a server '{}' exists already", s.name));
        }
        let prefix = if implicit {
            String::new()
        } else {
            format!("{}/", s.name)
        };
        let gpus = match &s.allowed_devices {
            Some(ds) => {
                let ords: Result<Vec<String>, String> = ds
                    .iter()
                    .map(|d| {
                        st.device(d)
                            .map(|x| x.ordinal.to_string())
                            .map_err(|e| format!("{key}.allowed_devices: {e}"))
                    })
                    .collect();
                vec![format!("gpus={}", ords?.join(","))]
            }
            None => Vec::new(),
        };
        // Partitions first: the namespaces name them.
        let mut ids: BTreeMap<(String, String), String> = BTreeMap::new();
        for (uuid, parts) in &s.partitions {
            let dev = st
                .device(&Device::Uuid(uuid.clone()))
                .map_err(|e| format!("{key}.devices: {e}"))?;
            for p in parts {
                if p.include_remainder {
                    return Err(format!(
                        "{key}.devices.sm_partitions.{}.include_remainder: true cannot be met yet: omps partitions whole chunks",
                        p.name
                    ));
                }
                let step = format!("{key}.devices.sm_partitions.{}", p.name);
                let id = ask(
                    &step,
                    &format!("sm_partition add {} {}", dev.uuid, p.chunks),
                )?
                .trim()
                .to_string();
                made.partitions.push(id.clone());
                names.push((s.name.clone(), dev.uuid.clone(), p.name.clone(), id.clone()));
                ids.insert((uuid.clone(), p.name.clone()), id);
            }
        }
        if !implicit {
            let mut args = limit_args(&s.default_limits);
            args.extend(gpus.iter().cloned());
            let line = format!("create_namespace {}/default {}", s.name, args.join(" "));
            ask(&key, line.trim_end())?;
            made.namespaces.push(format!("{}/default", s.name));
        }
        for n in &s.namespaces {
            let mut args = limit_args(&n.limits);
            args.extend(gpus.iter().cloned());
            if let Some((u, p)) = n.partitions.first() {
                args.retain(|a| !a.starts_with("gpus="));
                args.push(format!("partition={}", ids[&(u.clone(), p.clone())]));
            }
            let nkey = format!("{key}.namespaces.{}", n.name);
            if st.namespace(&s.name, &n.name).is_some() {
                return Err(format!("{nkey}: a namespace '{}' exists already", n.name));
            }
            let line = format!("create_namespace {prefix}{} {}", n.name, args.join(" "));
            ask(&nkey, line.trim_end())?;
            made.namespaces.push(format!("{prefix}{}", n.name));
        }
    }
    // The implicit server's defaults last: nothing after them can fail and take them back.
    for s in plan.servers.iter().filter(|s| s.name == state::IMPLICIT) {
        let key = format!("servers.{}", s.name);
        let l = &s.default_limits;
        if let Some(b) = l.pinned_memory {
            let size = omps_ring::memlimit::format_size(b);
            for d in &st.devices {
                let cmd = format!("set_default_device_pinned_mem_limit {} {size}", d.ordinal);
                ask(&format!("{key}.pinned_memory_limit"), &cmd)?;
            }
        }
        if let Some(p) = l.thread_percentage {
            let cmd = format!("set_default_active_thread_percentage {p}");
            ask(&format!("{key}.active_thread_percentage"), &cmd)?;
        }
        if let Some(p) = l.client_priority {
            ask(
                &format!("{key}.client_priority"),
                &format!("set_default_client_priority {p}"),
            )?;
        }
    }
    state::write_partition_names(&st.pipe, &names)?;
    let notes: String = plan
        .inert
        .iter()
        .map(|(k, why)| format!("{k}: accepted, no effect: {why}\n"))
        .collect();
    std::fs::write(notes_path(&st.pipe), notes)
        .map_err(|e| format!("{}: {e}", notes_path(&st.pipe).display()))
}

#[derive(Serialize)]
struct OutFile {
    schema_version: &'static str,
    servers: BTreeMap<String, OutServer>,
}

/// The limits a server's default namespace and a named one write alike.
#[derive(Serialize, Default)]
struct OutLimits {
    #[serde(skip_serializing_if = "Option::is_none")]
    pinned_memory_limit: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    active_thread_percentage: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    client_priority: Option<String>,
}

#[derive(Serialize, Default)]
struct OutServer {
    #[serde(skip_serializing_if = "Option::is_none")]
    allowed_devices: Option<String>,
    #[serde(flatten)]
    limits: OutLimits,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    namespaces: BTreeMap<String, OutNamespace>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    devices: Vec<OutDevice>,
}

#[derive(Serialize, Default)]
struct OutNamespace {
    #[serde(flatten)]
    limits: OutLimits,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    devices: Vec<OutNamespaceDevice>,
}

#[derive(Serialize)]
struct OutNamespaceDevice {
    uuid: String,
    sm_partition: String,
}

#[derive(Serialize)]
struct OutDevice {
    uuid: String,
    sm_partitions: Vec<OutPartition>,
}

#[derive(Serialize)]
struct OutPartition {
    name: String,
    chunks: u32,
}

/// The limits of a namespace as the file writes them (None: not set).
fn out_limits(n: &state::Namespace) -> OutLimits {
    let dash = |s: String| (s != "-").then_some(s);
    OutLimits {
        pinned_memory_limit: dash(n.memory_text()),
        active_thread_percentage: n
            .pct
            .parse::<f64>()
            .ok()
            .map(|p| format!("{}", p.round() as u32)),
        client_priority: dash(n.priority_text()).filter(|p| p == "0" || p == "1"),
    }
}

/// The running state as a configuration file's text: every v3 server (`S/...`
/// namespaces) with its limits, namespaces and named partitions.
pub fn save_text() -> Result<String, String> {
    let st = State::read()?;
    let names = state::read_partition_names(&st.pipe);
    let lspart = talk::ask("lspart")?;
    let chunks_of = |id: &str| -> u32 {
        lspart
            .lines()
            .find_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.len() >= 3 && f[1] == id)
                    .then(|| f[2].parse().ok())
                    .flatten()
            })
            .unwrap_or(0)
    };
    let mut servers: BTreeMap<String, OutServer> = BTreeMap::new();
    // The implicit server's defaults, where set.
    let mut implicit = OutServer::default();
    let mems: Vec<String> = st
        .devices
        .iter()
        .filter_map(|d| {
            talk::ask(&format!(
                "get_default_device_pinned_mem_limit {}",
                d.ordinal
            ))
            .ok()
        })
        .map(|t| t.trim().to_string())
        .collect();
    if mems.len() == st.devices.len()
        && mems
            .first()
            .is_some_and(|m| !m.is_empty() && mems.iter().all(|x| x == m))
    {
        implicit.limits.pinned_memory_limit = Some(mems[0].clone());
    }
    if let Ok(p) = talk::ask("get_default_active_thread_percentage") {
        let p: f64 = p.trim().parse().unwrap_or(100.0);
        if p < 100.0 {
            implicit.limits.active_thread_percentage =
                Some(format!("{}", p.round().max(1.0) as u32));
        }
    }
    if talk::ask("get_default_client_priority").is_ok_and(|p| p.trim() == "1") {
        implicit.limits.client_priority = Some("1".into());
    }
    servers.insert(state::IMPLICIT.to_string(), implicit);
    for n in &st.namespaces {
        let s = servers.entry(n.server.clone()).or_default();
        let limits = out_limits(n);
        if n.name == "default" && n.server != state::IMPLICIT {
            s.limits = limits;
            if n.gpus != "all" {
                let uuids: Vec<String> = n
                    .gpus
                    .split(',')
                    .filter_map(|g| {
                        st.devices
                            .iter()
                            .find(|d| d.ordinal.to_string() == g)
                            .map(|d| d.uuid.clone())
                    })
                    .collect();
                s.allowed_devices = Some(uuids.join(","));
            }
            continue;
        }
        let mut devices = Vec::new();
        if n.partition != "none" {
            if let Some((_, u, pname, _)) = names.iter().find(|x| x.3 == n.partition) {
                devices.push(OutNamespaceDevice {
                    uuid: u.clone(),
                    sm_partition: pname.clone(),
                });
            }
        }
        s.namespaces
            .insert(n.name.clone(), OutNamespace { limits, devices });
    }
    for (server, uuid, name, id) in &names {
        let Some(s) = servers.get_mut(server) else {
            continue;
        };
        let chunks = chunks_of(id);
        if chunks == 0 {
            continue;
        }
        let part = OutPartition {
            name: name.clone(),
            chunks,
        };
        match s.devices.iter_mut().find(|d| d.uuid == *uuid) {
            Some(d) => d.sm_partitions.push(part),
            None => s.devices.push(OutDevice {
                uuid: uuid.clone(),
                sm_partitions: vec![part],
            }),
        }
    }
    let file = OutFile {
        schema_version: "1.0",
        servers,
    };
    let body = toml::to_string(&file).map_err(|e| format!("writing TOML: {e}"))?;
    Ok(format!(
        "# Written by omps-ctl config save: the servers, namespaces and partitions this omps\n\
         # server had. Read back with omps-ctl -d -a FILE (or NVIDIA MPS v3's -a).\n{body}"
    ))
}

/// `config save FILE`: written whole or not at all; the text is checked to read back.
pub fn save(path: &Path) -> Result<(), String> {
    let text = save_text()?;
    super::config::parse(&text)
        .map_err(|e| format!("the saved text does not read back ({e}); nothing written"))?;
    let tmp = path.with_extension("omps-new");
    std::fs::write(&tmp, &text)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| format!("{}: {e}", path.display()))
}
