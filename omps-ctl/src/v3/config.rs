//! The MPS v3 configuration file (`omps-ctl -d -a FILE`): every key of NVIDIA's schema
//! (615 and the keys 620 added), read with `toml` and `serde`, then checked whole.
//!
//! A file with an unknown key, a value of the wrong form, or a reference that goes nowhere
//! (a namespace's partition no device defines, a device outside `allowed_devices`) is
//! refused with the file, the key and the reason, before anything is started. What can
//! only be checked against the GPUs (does a UUID exist, do the chunks fit) is checked when
//! the plan is applied, and a failure there stops the server again (daemon start, issue 26:
//! nothing runs half-configured).
//!
//! Keys that have no meaning in omps's one shared context (`[compute_policy]`'s time
//! slices, `timeslice_pct`, `[features]`, a namespace's `cgroup`)
//! are accepted, as MPS accepts them, and listed in [`Plan::inert`] with the reason, so
//! that `get_server_status` and the documentation can say so: never silently dropped.

use super::values::{self, Device};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;

/// The schema versions this reader knows.
pub const SCHEMA_VERSIONS: &[&str] = &["1.0"];

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct File {
    schema_version: Option<String>,
    compute_policy: Option<ComputePolicy>,
    #[serde(default)]
    servers: BTreeMap<String, Server>,
    features: Option<Features>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct ComputePolicy {
    timeslice: Option<String>,
    timeslice_yield_level: Option<i64>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct Server {
    allowed_devices: Option<String>,
    pinned_memory_limit: Option<String>,
    active_thread_percentage: Option<toml::Value>,
    client_priority: Option<toml::Value>,
    uid: Option<i64>,
    locality_domains: Option<bool>,
    timeslice_pct: Option<toml::Value>,
    #[serde(default)]
    namespaces: BTreeMap<String, Namespace>,
    #[serde(default)]
    devices: Vec<DeviceTable>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct Namespace {
    pinned_memory_limit: Option<String>,
    active_thread_percentage: Option<toml::Value>,
    client_priority: Option<toml::Value>,
    cgroup: Option<String>,
    cgroup_depth: Option<i64>,
    #[serde(default)]
    devices: Vec<NamespaceDevice>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct NamespaceDevice {
    uuid: String,
    sm_partition: Option<String>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct DeviceTable {
    uuid: String,
    #[serde(default)]
    sm_partitions: Vec<SmPartition>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct SmPartition {
    name: String,
    chunks: i64,
    include_remainder: Option<bool>,
    shareable: Option<bool>,
    max_chunks: Option<i64>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct Features {
    memacct: Option<Memacct>,
    #[serde(rename = "context-share")]
    context_share: Option<ContextShare>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct Memacct {
    enabled: Option<bool>,
    audit_log: Option<bool>,
    force_polling: Option<bool>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct ContextShare {
    enabled: Option<bool>,
    default_socket: Option<String>,
}

/// What a namespace (or a server's `default` namespace) holds its clients to.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Bytes per GPU.
    pub pinned_memory: Option<u64>,
    /// 1-100.
    pub thread_percentage: Option<u32>,
    /// 0 normal, 1 below normal.
    pub client_priority: Option<u8>,
}

/// A partition of one device's SMs, in chunks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    pub name: String,
    pub chunks: u32,
    pub include_remainder: bool,
    pub shareable: bool,
    pub max_chunks: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespacePlan {
    pub name: String,
    pub limits: Limits,
    /// (device UUID, partition name) the namespace's clients run in.
    pub partitions: Vec<(String, String)>,
    /// The devices it names without a partition: its clients' GPUs (none named: the
    /// server's). omps's reading of a devices entry with no `sm_partition`.
    pub devices: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerPlan {
    pub name: String,
    pub uid: Option<u32>,
    /// None: every GPU.
    pub allowed_devices: Option<Vec<Device>>,
    /// The server's `default` namespace (its own keys, or a `namespaces.default` table).
    pub default_limits: Limits,
    pub namespaces: Vec<NamespacePlan>,
    /// Per device UUID, its partitions.
    pub partitions: Vec<(String, Vec<Partition>)>,
}

/// A checked file: what to create, and what was accepted but has no effect in omps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub servers: Vec<ServerPlan>,
    /// (key, why it changes nothing in omps).
    pub inert: Vec<(String, String)>,
}

/// Reads and checks `path`; the error names the file, the key and the reason.
pub fn load(path: &Path) -> Result<Plan, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("{}: cannot read: {e}", path.display()))?;
    parse(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// Checks a file's text; the error names the key (or line) and the reason.
pub fn parse(text: &str) -> Result<Plan, String> {
    let file: File = toml::from_str(text).map_err(|e| one_line(&e.to_string()))?;
    check(file)
}

/// toml's message spans lines (position, the offending line quoted, a caret under it,
/// the reason): put position, line and reason on one line for a log or a terminal.
fn one_line(msg: &str) -> String {
    let mut head = "not TOML";
    let mut source = None;
    let mut reason = Vec::new();
    for (i, l) in msg.lines().enumerate() {
        let t = l.trim();
        if i == 0 {
            head = t
                .trim_start_matches("TOML parse error at ")
                .trim_end_matches(':');
        } else if let Some((n, text)) = t
            .split_once(" | ")
            .filter(|(n, _)| n.trim().parse::<u32>().is_ok())
        {
            let _ = n;
            source = Some(text.trim());
        } else if !t.is_empty() && !t.starts_with('|') {
            reason.push(t);
        }
    }
    match source {
        Some(src) => format!("{head} (`{src}`): {}", reason.join(" ")),
        None => format!("{head}: {}", reason.join(" ")),
    }
}

fn at(key: &str, why: String) -> String {
    format!("{key}: {why}")
}

/// A key written as a string (as NVIDIA's examples do) or a bare integer.
fn text_of(v: &toml::Value) -> Result<String, String> {
    match v {
        toml::Value::String(s) => Ok(s.clone()),
        toml::Value::Integer(i) => Ok(i.to_string()),
        other => Err(format!(
            "a {} where a string or an integer belongs",
            other.type_str()
        )),
    }
}

fn limits(
    key: &str,
    mem: &Option<String>,
    atp: &Option<toml::Value>,
    prio: &Option<toml::Value>,
) -> Result<Limits, String> {
    let mut l = Limits::default();
    if let Some(m) = mem {
        l.pinned_memory =
            Some(values::memory(m).map_err(|e| at(&format!("{key}.pinned_memory_limit"), e))?);
    }
    if let Some(v) = atp {
        let k = format!("{key}.active_thread_percentage");
        l.thread_percentage =
            Some(values::percentage(&text_of(v).map_err(|e| at(&k, e))?).map_err(|e| at(&k, e))?);
    }
    if let Some(v) = prio {
        let k = format!("{key}.client_priority");
        l.client_priority =
            Some(values::priority(&text_of(v).map_err(|e| at(&k, e))?).map_err(|e| at(&k, e))?);
    }
    Ok(l)
}

fn uuid(key: &str, u: &str) -> Result<String, String> {
    match values::device(u) {
        Ok(Device::Uuid(u)) => Ok(u),
        Ok(Device::Ordinal(_)) => Err(at(
            key,
            format!("'{u}': the file names devices by UUID (GPU-...)"),
        )),
        Err(e) => Err(at(key, e)),
    }
}

fn count(key: &str, v: i64, min: i64) -> Result<u32, String> {
    u32::try_from(v)
        .ok()
        .filter(|&n| i64::from(n) >= min)
        .ok_or_else(|| at(key, format!("{v} is not a whole number of at least {min}")))
}

fn check(f: File) -> Result<Plan, String> {
    let mut inert = Vec::new();
    if let Some(v) = &f.schema_version {
        if !SCHEMA_VERSIONS.contains(&v.as_str()) {
            return Err(at(
                "schema_version",
                format!(
                    "'{v}' is not a schema omps reads ({})",
                    SCHEMA_VERSIONS.join(", ")
                ),
            ));
        }
    }
    if let Some(cp) = &f.compute_policy {
        if let Some(t) = &cp.timeslice {
            if !["default", "short", "medium", "long"].contains(&t.as_str()) {
                return Err(at(
                    "compute_policy.timeslice",
                    format!("'{t}' is not default, short, medium or long"),
                ));
            }
            inert.push(("compute_policy.timeslice".into(), TIMESLICE.into()));
        }
        if let Some(y) = cp.timeslice_yield_level {
            count("compute_policy.timeslice_yield_level", y, 0)?;
            inert.push((
                "compute_policy.timeslice_yield_level".into(),
                TIMESLICE.into(),
            ));
        }
    }
    if let Some(feat) = &f.features {
        if let Some(m) = &feat.memacct {
            if m.enabled.is_some() || m.audit_log.is_some() || m.force_polling.is_some() {
                inert.push(("features.memacct".into(), MEMACCT.into()));
            }
        }
        if let Some(c) = &feat.context_share {
            if c.enabled == Some(false) {
                return Err(at(
                    "features.context-share.enabled",
                    "false cannot be met: omps runs every client of a GPU in one shared context"
                        .into(),
                ));
            }
            if let Some(s) = &c.default_socket {
                if s != "on" && s != "off" {
                    return Err(at(
                        "features.context-share.default_socket",
                        format!("'{s}' is not on or off"),
                    ));
                }
            }
            inert.push(("features.context-share".into(), CONTEXT_SHARE.into()));
        }
    }
    let mut servers = Vec::new();
    for (sname, s) in &f.servers {
        let key = format!("servers.{sname}");
        values::name(sname).map_err(|e| at(&key, e))?;
        let uid = match s.uid {
            Some(u) => Some(
                u32::try_from(u)
                    .ok()
                    .filter(|&u| u != u32::MAX)
                    .ok_or_else(|| at(&format!("{key}.uid"), format!("{u} is not a user id")))?,
            ),
            None => None,
        };
        let allowed = match &s.allowed_devices {
            Some(d) => {
                Some(values::devices(d).map_err(|e| at(&format!("{key}.allowed_devices"), e))?)
            }
            None => None,
        };
        if s.locality_domains == Some(true) {
            return Err(at(&format!("{key}.locality_domains"), LOCALITY.into()));
        }
        if let Some(v) = &s.timeslice_pct {
            let k = format!("{key}.timeslice_pct");
            values::percentage(&text_of(v).map_err(|e| at(&k, e))?).map_err(|e| at(&k, e))?;
            inert.push((k, TIMESLICE.into()));
        }
        let mut default_limits = limits(
            &key,
            &s.pinned_memory_limit,
            &s.active_thread_percentage,
            &s.client_priority,
        )?;
        // Devices and their partitions first: namespaces refer to them.
        let mut partitions: Vec<(String, Vec<Partition>)> = Vec::new();
        for (i, d) in s.devices.iter().enumerate() {
            let dkey = format!("{key}.devices[{i}]");
            let u = uuid(&format!("{dkey}.uuid"), &d.uuid)?;
            if partitions.iter().any(|(x, _)| *x == u) {
                return Err(at(
                    &format!("{dkey}.uuid"),
                    format!("'{u}' has a devices entry already"),
                ));
            }
            if let Some(a) = &allowed {
                if a.iter().all(|x| matches!(x, Device::Uuid(_)))
                    && !a.contains(&Device::Uuid(u.clone()))
                {
                    return Err(at(
                        &format!("{dkey}.uuid"),
                        format!("'{u}' is not among {key}.allowed_devices"),
                    ));
                }
            }
            let mut parts: Vec<Partition> = Vec::new();
            for (j, p) in d.sm_partitions.iter().enumerate() {
                let pkey = format!("{dkey}.sm_partitions[{j}]");
                let name = values::name(&p.name).map_err(|e| at(&format!("{pkey}.name"), e))?;
                if parts.iter().any(|q| q.name == name) {
                    return Err(at(
                        &format!("{pkey}.name"),
                        format!("'{name}' is defined twice on {u}"),
                    ));
                }
                let chunks = count(&format!("{pkey}.chunks"), p.chunks, 1)?;
                let max_chunks = match p.max_chunks {
                    Some(m) => {
                        let m = count(&format!("{pkey}.max_chunks"), m, 1)?;
                        if m < chunks {
                            return Err(at(
                                &format!("{pkey}.max_chunks"),
                                format!("{m} is below chunks ({chunks})"),
                            ));
                        }
                        Some(m)
                    }
                    None => None,
                };
                parts.push(Partition {
                    name,
                    chunks,
                    include_remainder: p.include_remainder.unwrap_or(false),
                    shareable: p.shareable.unwrap_or(false),
                    max_chunks,
                });
            }
            let remainders = parts.iter().filter(|p| p.include_remainder).count();
            if remainders > 1 {
                return Err(at(
                    &dkey,
                    format!("{remainders} partitions of '{u}' ask for the remainder; one may"),
                ));
            }
            partitions.push((u, parts));
        }
        let mut namespaces = Vec::new();
        for (nname, n) in &s.namespaces {
            let nkey = format!("{key}.namespaces.{nname}");
            values::name(nname).map_err(|e| at(&nkey, e))?;
            let l = limits(
                &nkey,
                &n.pinned_memory_limit,
                &n.active_thread_percentage,
                &n.client_priority,
            )?;
            if let Some(c) = &n.cgroup {
                if !Path::new(c).starts_with("/sys/fs/cgroup") || c.split('/').any(|p| p == "..") {
                    return Err(at(
                        &format!("{nkey}.cgroup"),
                        format!("'{c}' is not a directory under /sys/fs/cgroup"),
                    ));
                }
                inert.push((format!("{nkey}.cgroup"), CGROUP.into()));
            }
            if let Some(d) = n.cgroup_depth {
                count(&format!("{nkey}.cgroup_depth"), d, 0)?;
            }
            let mut nparts = Vec::new();
            let mut ndevices: Vec<String> = Vec::new();
            for (i, d) in n.devices.iter().enumerate() {
                let dkey = format!("{nkey}.devices[{i}]");
                let u = uuid(&format!("{dkey}.uuid"), &d.uuid)?;
                if nparts.iter().any(|(x, _): &(String, String)| *x == u) || ndevices.contains(&u) {
                    return Err(at(&format!("{dkey}.uuid"), format!("'{u}' is named twice")));
                }
                if let Some(p) = &d.sm_partition {
                    let defined = partitions
                        .iter()
                        .find(|(x, _)| *x == u)
                        .is_some_and(|(_, ps)| ps.iter().any(|q| q.name == *p));
                    if !defined {
                        return Err(at(
                            &format!("{dkey}.sm_partition"),
                            format!("'{p}' is not a partition of {key}.devices with uuid '{u}'"),
                        ));
                    }
                    nparts.push((u, p.clone()));
                } else {
                    ndevices.push(u);
                }
            }
            if !nparts.is_empty() && !ndevices.is_empty() {
                return Err(at(
                    &format!("{nkey}.devices"),
                    "a namespace in a partition runs on the partition's device only: name no other"
                        .into(),
                ));
            }
            if nname == "default" {
                // The server's own default namespace: its keys beside the server's would
                // say the same thing twice; refuse a contradiction rather than pick one.
                merge_default(&nkey, &mut default_limits, &l)?;
                if !nparts.is_empty() {
                    return Err(at(&nkey, "the default namespace takes no partition in omps (give it a named namespace)".into()));
                }
                if !ndevices.is_empty() {
                    return Err(at(
                        &format!("{nkey}.devices"),
                        format!("the default namespace's devices are {key}.allowed_devices"),
                    ));
                }
                continue;
            }
            if nparts.len() > 1 {
                return Err(at(
                    &format!("{nkey}.devices"),
                    format!(
                        "{} partitions cannot be met: an omps namespace runs in one SM partition",
                        nparts.len()
                    ),
                ));
            }
            namespaces.push(NamespacePlan {
                name: nname.clone(),
                limits: l,
                partitions: nparts,
                devices: ndevices,
            });
        }
        // A partition that is not shareable may be named by one namespace only.
        for (u, parts) in &partitions {
            for p in parts {
                let users: Vec<&str> = namespaces
                    .iter()
                    .filter(|n| n.partitions.iter().any(|(x, q)| x == u && *q == p.name))
                    .map(|n| n.name.as_str())
                    .collect();
                if !p.shareable && users.len() > 1 {
                    return Err(at(
                        &format!("{key}.devices"),
                        format!(
                            "partition '{}' of '{u}' is not shareable but namespaces {} name it",
                            p.name,
                            users.join(" and ")
                        ),
                    ));
                }
                if p.max_chunks.is_some() {
                    inert.push((
                        format!("{key}.devices.sm_partitions.{}.max_chunks", p.name),
                        MAX_CHUNKS.into(),
                    ));
                }
            }
        }
        servers.push(ServerPlan {
            name: sname.clone(),
            uid,
            allowed_devices: allowed,
            default_limits,
            namespaces,
            partitions,
        });
    }
    Ok(Plan { servers, inert })
}

fn merge_default(key: &str, base: &mut Limits, ns: &Limits) -> Result<(), String> {
    fn one<T: PartialEq + Copy + std::fmt::Debug>(
        key: &str,
        what: &str,
        a: &mut Option<T>,
        b: Option<T>,
    ) -> Result<(), String> {
        match (*a, b) {
            (Some(x), Some(y)) if x != y => Err(at(
                &format!("{key}.{what}"),
                format!("{y:?} differs from the server's own {x:?}"),
            )),
            (None, Some(y)) => {
                *a = Some(y);
                Ok(())
            }
            _ => Ok(()),
        }
    }
    one(
        key,
        "pinned_memory_limit",
        &mut base.pinned_memory,
        ns.pinned_memory,
    )?;
    one(
        key,
        "active_thread_percentage",
        &mut base.thread_percentage,
        ns.thread_percentage,
    )?;
    one(
        key,
        "client_priority",
        &mut base.client_priority,
        ns.client_priority,
    )
}

/// Why the inert keys change nothing (the same words go to get_server_status).
pub const TIMESLICE: &str = "omps runs every client in one context: kernels share SMs at once and no time slice exists to set (use thread percentages, partitions or QoS classes)";
pub const MEMACCT: &str = "omps counts every client's device memory itself, always, against the namespace's pinned_memory_limit; the driver's cgroup accounting is not used";
pub const CONTEXT_SHARE: &str =
    "omps always shares one context per GPU among all clients; nothing to turn on or off";
pub const LOCALITY: &str = "true cannot be met: omps does not split a GPU into locality domains (MLOPart); it serves whole GPUs";
pub const MAX_CHUNKS: &str =
    "omps partitions keep the size they were made with; a partition does not grow into free chunks";
pub const CGROUP: &str =
    "omps routes clients by the namespace socket they connect to, not by cgroup";

#[cfg(test)]
mod tests;
