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

/// What one apply changed, to take back if a later step fails.
#[derive(Default)]
struct Made {
    /// Namespaces it created.
    namespaces: Vec<String>,
    /// Namespaces it set anew (`replace`), with the settings they had.
    replaced: Vec<(String, Vec<String>)>,
    partitions: Vec<String>,
}

impl Made {
    fn undo(&self) {
        for n in self.namespaces.iter().rev() {
            let _ = talk::ask(&format!("delete_namespace {n}"));
        }
        for (n, old) in self.replaced.iter().rev() {
            let _ = talk::ask(format!("set_namespace {n} {}", old.join(" ")).trim_end());
        }
        for p in self.partitions.iter().rev() {
            let _ = talk::ask(&format!("sm_partition rm {p}"));
        }
    }
}

/// Makes `plan` on the running server, all of it or (a step failing) none of it: what
/// was made is taken back, what was set anew set back. Err names the key and the reason.
///
/// `replace` (the daemon's `-a`, or `config apply --replace`): the file wins over what the
/// server has of what the file names (at start, what it made again from its own record of
/// an earlier run: namespaces are kept across restarts): those namespaces get the file's
/// settings in place (their sockets and directories stay, so pods that mount them keep
/// them; refused while one has clients), and partitions of the file's names are taken as
/// they are if their size is the file's. Otherwise (`config apply`) a namespace or server
/// that exists is refused, and nothing is changed.
pub fn apply(plan: &Plan, replace: bool) -> Result<(), String> {
    let mut made = Made::default();
    let r = apply_steps(plan, replace, &mut made);
    if r.is_err() {
        made.undo();
    }
    r
}

/// Creates namespace `full` with `args`, or under `replace` sets an existing one anew.
fn make_namespace(
    st: &State,
    key: &str,
    (server, name, full): (&str, &str, String),
    args: &[String],
    replace: bool,
    made: &mut Made,
) -> Result<(), String> {
    match st.namespace(server, name) {
        Some(_) if !replace => Err(format!(
            "{key}: a namespace '{name}' exists already (config apply --replace sets it anew)"
        )),
        Some(old) => {
            let live = st.clients_of(&old.full);
            if !live.is_empty() {
                return Err(format!(
                    "{key}: namespace '{name}' has clients ({}): its limits are not changed under them",
                    state::pid_list(&live)
                ));
            }
            ask(
                key,
                format!("set_namespace {full} {}", args.join(" ")).trim_end(),
            )?;
            made.replaced.push((full, old.settings()));
            Ok(())
        }
        None => {
            ask(
                key,
                format!("create_namespace {full} {}", args.join(" ")).trim_end(),
            )?;
            made.namespaces.push(full);
            Ok(())
        }
    }
}

fn apply_steps(plan: &Plan, replace: bool, made: &mut Made) -> Result<(), String> {
    let st = State::read()?;
    let live = state::live_partitions().unwrap_or_default();
    let live_part = |id: &str| live.iter().find(|p| p.id == id).map(|p| p.chunks);
    let mut names: Vec<state::PartitionName> = state::read_partition_names(&st.pipe)
        .into_iter()
        .filter(|(_, _, _, id)| live_part(id).is_some())
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
        if !implicit && !replace && st.server_exists(&s.name) {
            return Err(format!(
                "{key}: a server '{}' exists already (config apply --replace sets it anew)",
                s.name
            ));
        }
        let full = |n: &str| {
            if implicit {
                n.to_string()
            } else {
                format!("{}/{n}", s.name)
            }
        };
        let ordinal = |k: &str, d: &Device| {
            st.device(d)
                .map(|x| x.ordinal.to_string())
                .map_err(|e| format!("{k}: {e}"))
        };
        let gpus = match &s.allowed_devices {
            Some(ds) => {
                let ords: Result<Vec<String>, String> = ds
                    .iter()
                    .map(|d| ordinal(&format!("{key}.allowed_devices"), d))
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
                let step = format!("{key}.devices.sm_partitions.{}", p.name);
                if p.include_remainder {
                    return Err(format!("{step}.include_remainder: true cannot be met yet: omps partitions whole chunks"));
                }
                let existing = names
                    .iter()
                    .find(|x| x.0 == s.name && x.1 == dev.uuid && x.2 == p.name);
                if let Some((_, _, _, id)) = existing {
                    let have = live_part(id).unwrap_or(0);
                    if !replace || have != p.chunks {
                        return Err(format!(
                            "{step}: partition '{}' exists already ({have} chunks)",
                            p.name
                        ));
                    }
                    ids.insert((uuid.clone(), p.name.clone()), id.clone());
                    continue;
                }
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
            make_namespace(
                &st,
                &key,
                (&s.name, "default", full("default")),
                &args,
                replace,
                made,
            )?;
        }
        for n in &s.namespaces {
            let nkey = format!("{key}.namespaces.{}", n.name);
            let mut args = limit_args(&n.limits);
            if let Some((u, p)) = n.partitions.first() {
                args.push(format!("partition={}", ids[&(u.clone(), p.clone())]));
            } else if !n.devices.is_empty() {
                // Its own devices, within the server's.
                let ords: Result<Vec<String>, String> = n
                    .devices
                    .iter()
                    .map(|u| ordinal(&format!("{nkey}.devices"), &Device::Uuid(u.clone())))
                    .collect();
                args.push(format!("gpus={}", ords?.join(",")));
            } else {
                args.extend(gpus.iter().cloned());
            }
            make_namespace(
                &st,
                &nkey,
                (&s.name, &n.name, full(&n.name)),
                &args,
                replace,
                made,
            )?;
        }
    }
    // The implicit server's defaults last: nothing after them can fail and take them back.
    for s in plan.servers.iter().filter(|s| s.name == state::IMPLICIT) {
        let key = format!("servers.{}", s.name);
        for (cmd, what) in default_commands(&s.default_limits, st.devices.len()) {
            ask(&format!("{key}.{what}"), &cmd)?;
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

/// The legacy commands that make `l` the server's defaults (on `ngpus` GPUs), each with
/// the key it comes from.
fn default_commands(l: &Limits, ngpus: usize) -> Vec<(String, &'static str)> {
    let mut v = Vec::new();
    if let Some(b) = l.pinned_memory {
        let size = omps_ring::memlimit::format_size(b);
        for d in 0..ngpus {
            v.push((
                format!("set_default_device_pinned_mem_limit {d} {size}"),
                "pinned_memory_limit",
            ));
        }
    }
    if let Some(p) = l.thread_percentage {
        v.push((
            format!("set_default_active_thread_percentage {p}"),
            "active_thread_percentage",
        ));
    }
    if let Some(p) = l.client_priority {
        v.push((
            format!("set_default_client_priority {p}"),
            "client_priority",
        ));
    }
    v
}

/// The implicit server's thread percentage as the server's environment gives it at start
/// (MPS's variable on the daemon), so that its first clients are held to it before the
/// file is applied. (Its memory limit cannot go that way: the server's variable names
/// each GPU, and their number is not known before it starts; clients of the pipe
/// directory's own socket that come in the moment before the file is applied have none.)
pub fn default_env(plan: &Plan) -> Vec<(&'static str, String)> {
    plan.servers
        .iter()
        .filter(|s| s.name == state::IMPLICIT)
        .filter_map(|s| s.default_limits.thread_percentage)
        .map(|p| ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", p.to_string()))
        .collect()
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
    #[serde(skip_serializing_if = "Option::is_none")]
    sm_partition: Option<String>,
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

/// A size as the file writes it (a whole number of K, M or G): None where it has none.
fn file_size(bytes: u64) -> Option<String> {
    [("G", 30), ("M", 20), ("K", 10)]
        .iter()
        .find(|(_, shift)| bytes >= 1 << shift && bytes.is_multiple_of(1 << shift))
        .map(|(unit, shift)| format!("{}{unit}", bytes >> shift))
}

/// The limits of a namespace as the file writes them (None: not set); Err for what v3's
/// file cannot say (per-GPU limits, the latency-critical class, a name it does not take).
fn out_limits(n: &state::Namespace, ngpus: usize) -> Result<OutLimits, String> {
    let what = format!("namespace '{}' of server '{}'", n.name, n.server);
    super::values::name(&n.name)
        .map_err(|e| format!("{what}: MPS v3's file cannot name it: {e}"))?;
    let mem = match n.memory_text(ngpus) {
        m if m == "-" => None,
        m => {
            let bytes = omps_ring::memlimit::parse_size(&m)
                .map_err(|_| format!("{what}: its per-GPU memory limits ({m}) cannot be written in MPS v3's file, which has one limit for every GPU"))?;
            Some(file_size(bytes).ok_or_else(|| {
                format!("{what}: its memory limit {m} is not a whole number of K")
            })?)
        }
    };
    let prio = match n.qos.as_str() {
        "normal" => Some("0".to_string()),
        "below-normal" => Some("1".to_string()),
        q => {
            return Err(format!(
                "{what}: QoS class {q} is omps's own and cannot be written in MPS v3's file"
            ))
        }
    };
    let pct = match n.pct.parse::<f64>() {
        Ok(p) if p.fract() != 0.0 => {
            return Err(format!("{what}: thread percentage {p} cannot be written in MPS v3's file, which takes whole percentages"))
        }
        Ok(p) => Some(format!("{}", p as u32)),
        Err(_) => None,
    };
    if !n.max_clients.starts_with("default") && !n.max_clients.is_empty() {
        return Err(format!(
            "{what}: max_clients={} is omps's own and cannot be written in MPS v3's file",
            n.max_clients
        ));
    }
    Ok(OutLimits {
        pinned_memory_limit: mem,
        active_thread_percentage: pct,
        client_priority: prio,
    })
}

/// The running state as a configuration file's text: every v3 server (`S/...`
/// namespaces) with its limits, namespaces and named partitions.
pub fn save_text() -> Result<String, String> {
    let st = State::read()?;
    let names = state::read_partition_names(&st.pipe);
    let live = state::live_partitions()?;
    let chunks_of = |id: &str| live.iter().find(|p| p.id == id).map_or(0, |p| p.chunks);
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
        let bytes = omps_ring::memlimit::parse_size(&mems[0])
            .map_err(|e| format!("the server's default limit: {e}"))?;
        implicit.limits.pinned_memory_limit = file_size(bytes);
    } else if mems.iter().any(|m| !m.is_empty()) {
        return Err(format!(
            "the server's default memory limits differ per GPU ({}): MPS v3's file has one for every GPU",
            mems.join(", ")
        ));
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
    let uuids_of = |gpus: &str| -> Vec<String> {
        gpus.split(',')
            .filter_map(|g| {
                st.devices
                    .iter()
                    .find(|d| d.ordinal.to_string() == g)
                    .map(|d| d.uuid.clone())
            })
            .collect()
    };
    for n in &st.namespaces {
        let server_gpus = st
            .namespace(&n.server, "default")
            .map_or("all".to_string(), |d| d.gpus.clone());
        let s = servers.entry(n.server.clone()).or_default();
        let limits = out_limits(n, st.devices.len())?;
        if n.name == "default" && n.server != state::IMPLICIT {
            if n.partition != "none" {
                return Err(format!(
                    "namespace '{}' runs in partition {}: MPS v3's file gives a server's default namespace none",
                    n.full, n.partition
                ));
            }
            s.limits = limits;
            if n.gpus != "all" {
                s.allowed_devices = Some(uuids_of(&n.gpus).join(","));
            }
            continue;
        }
        let mut devices = Vec::new();
        if n.partition != "none" {
            let Some((_, u, pname, _)) = names.iter().find(|x| x.3 == n.partition) else {
                return Err(format!(
                    "namespace '{}' runs in partition {}, which has no MPS v3 name (made with sm_partition add): \
                     make it with sm-partition create to save it",
                    n.full, n.partition
                ));
            };
            devices.push(OutNamespaceDevice {
                uuid: u.clone(),
                sm_partition: Some(pname.clone()),
            });
        } else if n.gpus != "all" && n.gpus != server_gpus {
            // Its own GPUs: devices without a partition.
            for u in uuids_of(&n.gpus) {
                devices.push(OutNamespaceDevice {
                    uuid: u,
                    sm_partition: None,
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
