//! Carries out a checked MPS v3 command ([`super::verbs`]) on the running omps server,
//! through the server's own commands, and prints what MPS v3 prints.
//!
//! Where NVIDIA's reference shows no output (`server create`, `namespace set`, ...) omps
//! prints nothing on success, as those examples do; every failure is one line on stderr
//! naming what was wrong, and the exit status is 1. A limit a namespace's live clients
//! hold is not changed under them: `namespace set` and `server set` are refused while the
//! namespace has clients (as MPS 615 was seen to), naming their PIDs.

use super::state::{self, State, IMPLICIT};
use super::table::{render, Format};
use super::verbs::{Value, NAMESPACE_FIELDS, SERVER_FIELDS};
use crate::talk;
use std::collections::BTreeMap;

type Opts = BTreeMap<&'static str, Value>;

fn text(o: &Opts, k: &str) -> Option<String> {
    match o.get(k) {
        Some(Value::Text(t)) => Some(t.clone()),
        _ => None,
    }
}

fn number(o: &Opts, k: &str) -> Option<u64> {
    match o.get(k) {
        Some(Value::Number(n)) => Some(*n),
        _ => None,
    }
}

fn format(o: &Opts) -> Format {
    match o.get("format") {
        Some(Value::Format { csv, header }) => Format {
            csv: *csv,
            header: *header,
        },
        _ => Format::default(),
    }
}

/// The server's namespace name of v3 namespace `ns` of server `server`.
fn full_name(server: &str, ns: &str) -> String {
    if server == IMPLICIT {
        ns.to_string()
    } else {
        format!("{server}/{ns}")
    }
}

/// A size as `create_namespace` takes it, exactly.
fn size_arg(bytes: u64) -> String {
    omps_ring::memlimit::format_size(bytes)
}

/// The limit options of a `set` verb, over a namespace's settings.
fn with_limits(mut settings: Vec<String>, o: &Opts) -> Vec<String> {
    let mut replace = |key: &str, v: String| {
        settings.retain(|s| !s.starts_with(&format!("{key}=")));
        settings.push(format!("{key}={v}"));
    };
    if let Some(b) = number(o, "pinned-memory-limit") {
        replace("mem_limit", size_arg(b));
    }
    if let Some(p) = number(o, "active-thread-percentage") {
        replace("thread_percentage", p.to_string());
    }
    if let Some(p) = number(o, "client-priority") {
        replace("qos", if p == 0 { "normal" } else { "below-normal" }.into());
    }
    settings
}

fn ask(cmd: &str) -> Result<String, String> {
    talk::ask(cmd).map_err(|e| e.trim_end().to_string())
}

/// Gives namespace `full` these settings, in place (its socket and directory stay);
/// refused while it has clients, whose limits are not changed under them.
fn remake(st: &State, full: &str, settings: &[String], what: &str) -> Result<(), String> {
    let live = st.clients_of(full);
    if !live.is_empty() {
        return Err(format!(
            "{what}: its namespace has clients ({}); their limits are not changed under them: \
             stop them (or `client terminate`) first",
            state::pid_list(&live)
        ));
    }
    ask(format!("set_namespace {full} {}", settings.join(" ")).trim_end()).map(drop)
}

fn check_uid(st: &State, o: &Opts) -> Result<(), String> {
    match number(o, "uid") {
        Some(u) if u != u64::from(st.uid) => Err(format!(
            "--uid={u}: this omps server serves user {} (one server per pipe directory and user; \
             the multi-user daemon, -m, starts one for each user)",
            st.uid
        )),
        _ => Ok(()),
    }
}

fn check_locality(o: &Opts) -> Result<(), String> {
    match o.get("locality-domains") {
        Some(Value::Bool(true)) => Err(format!(
            "--locality-domains=true: {}",
            super::config::LOCALITY
        )),
        _ => Ok(()),
    }
}

/// Runs `module verb`: what to print on success.
pub fn run(module: &str, verb: &str, args: &[String], o: &Opts) -> Result<String, String> {
    match module {
        "feature" | "memacct" => return features(module, verb, args, o),
        "config" => {
            let path = std::path::Path::new(&args[0]);
            return match verb {
                "save" => super::apply::save(path),
                _ => super::config::load(path).and_then(|plan| {
                    super::apply::apply(&plan, o.contains_key("replace"))
                        .map_err(|e| format!("{}: {e}; nothing was applied", path.display()))
                }),
            }
            .map(|()| String::new());
        }
        _ => {}
    }
    let st = State::read()?;
    match (module, verb) {
        ("server", "create") => {
            let name = args
                .first()
                .cloned()
                .unwrap_or_else(|| format!("uid_{}", number(o, "uid").unwrap_or(0)));
            check_uid(&st, o)?;
            check_locality(o)?;
            if st.server_exists(&name) {
                return Err(format!("server '{name}' exists"));
            }
            let mut settings = Vec::new();
            if let Some(Value::Devices(ds)) = o.get("allowed-devices") {
                let ords: Result<Vec<String>, String> = ds
                    .iter()
                    .map(|d| st.device(d).map(|x| x.ordinal.to_string()))
                    .collect();
                settings.push(format!("gpus={}", ords?.join(",")));
            }
            ask(format!("create_namespace {name}/default {}", settings.join(" ")).trim_end())
                .map(|_| String::new())
        }
        ("server", "delete") => {
            let name = &args[0];
            if name == IMPLICIT {
                return Err("server 'omps' is the pipe directory's own: stop it with quit".into());
            }
            let mine: Vec<&state::Namespace> =
                st.namespaces.iter().filter(|n| n.server == *name).collect();
            if mine.is_empty() {
                return Err(format!("no server '{name}'"));
            }
            let live: Vec<u32> = mine.iter().flat_map(|n| st.clients_of(&n.full)).collect();
            if !live.is_empty() && !o.contains_key("force") {
                return Err(format!(
                    "server '{name}' has clients ({}): --force terminates them",
                    state::pid_list(&live)
                ));
            }
            for p in &live {
                // One gone by itself meanwhile is not an error.
                let _ = ask(&format!("terminate_client {} {p}", st.server_pid));
            }
            // Terminating is asynchronous: their partitions are in use until they are gone.
            let full: Vec<String> = mine.iter().map(|n| n.full.clone()).collect();
            for _ in 0..100 {
                let now = State::read()?;
                if full.iter().all(|f| now.clients_of(f).is_empty()) {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            for n in mine {
                ask(&format!("delete_namespace {}", n.full))?;
            }
            // Its SM partitions go with it: those the server still has under that name
            // (ids start again with each server, so a stale line names nothing of it).
            let lspart = state::live_partitions().unwrap_or_default();
            let live_id = |id: &str| lspart.iter().any(|p| p.id == id);
            let mut names = state::read_partition_names(&st.pipe);
            names.retain(|x| live_id(&x.3));
            for (_, _, _, id) in names.iter().filter(|x| x.0 == *name) {
                if let Err(e) = ask(&format!("sm_partition rm {id}")) {
                    eprintln!("omps-ctl: server '{name}' deleted, its partition {id} not: {e}");
                }
            }
            names.retain(|x| x.0 != *name);
            state::write_partition_names(&st.pipe, &names)?;
            Ok(String::new())
        }
        ("server", "list") | ("server", "get") => {
            let rows: Vec<Vec<String>> = st
                .servers()
                .into_iter()
                .filter(|s| args.first().is_none_or(|a| a == s))
                .map(|s| server_row(&st, &s))
                .collect();
            if let Some(a) = args.first() {
                if rows.is_empty() {
                    return Err(format!("no server '{a}'"));
                }
            }
            if verb == "get" {
                let i = SERVER_FIELDS
                    .iter()
                    .position(|c| *c == args[1])
                    .unwrap_or(0);
                return Ok(format!("{}\n", rows[0][i]));
            }
            Ok(render(&SERVER_FIELDS, &rows, format(o)))
        }
        ("server", "set") => {
            let name = &args[0];
            check_uid(&st, o)?;
            check_locality(o)?;
            if name == IMPLICIT {
                return Err("server 'omps' takes the legacy commands for its defaults \
                            (set_default_active_thread_percentage, set_default_device_pinned_mem_limit, \
                             set_default_client_priority)"
                    .into());
            }
            let Some(d) = st.namespace(name, "default") else {
                return Err(format!("no server '{name}'"));
            };
            if number(o, "pinned-memory-limit")
                .or(number(o, "active-thread-percentage"))
                .or(number(o, "client-priority"))
                .is_none()
            {
                return Ok(String::new());
            }
            remake(
                &st,
                &d.full,
                &with_limits(d.settings(), o),
                &format!("server set {name}"),
            )?;
            Ok(String::new())
        }
        ("namespace", "create") => {
            let server = text(o, "server").unwrap_or_default();
            let name = &args[0];
            if !st.server_exists(&server) {
                return Err(format!("no server '{server}' (server create makes one)"));
            }
            if name == "default" || st.namespace(&server, name).is_some() {
                return Err(format!("namespace '{name}' of server '{server}' exists"));
            }
            // The server's allowed devices hold for every namespace of it.
            let gpus = st
                .namespace(&server, "default")
                .filter(|d| d.gpus != "all")
                .map(|d| format!(" gpus={}", d.gpus));
            ask(&format!(
                "create_namespace {}{}",
                full_name(&server, name),
                gpus.unwrap_or_default()
            ))
            .map(|_| String::new())
        }
        ("namespace", "delete") => {
            let server = text(o, "server").unwrap_or_default();
            let name = &args[0];
            let Some(n) = st.namespace(&server, name) else {
                return Err(format!("no namespace '{name}' of server '{server}'"));
            };
            if name == "default" {
                return Err("the default namespace goes with its server (server delete)".into());
            }
            let live = st.clients_of(&n.full);
            if !live.is_empty() && !o.contains_key("force") {
                return Err(format!(
                    "namespace '{name}' has clients ({}): --force deletes it under them (they keep \
                     running, held to its limits until they exit)",
                    state::pid_list(&live)
                ));
            }
            ask(&format!("delete_namespace {}", n.full)).map(|_| String::new())
        }
        ("namespace", "list") | ("namespace", "get") => {
            let (want_name, want_server) = match verb {
                "get" => (args.first().cloned(), args.get(1).cloned()),
                _ => (args.first().cloned(), text(o, "server")),
            };
            let mut rows = Vec::new();
            if want_server.as_deref().is_none_or(|s| s == IMPLICIT)
                && want_name.as_deref().is_none_or(|n| n == "default")
            {
                rows.push(vec![
                    "default".into(),
                    IMPLICIT.into(),
                    st.status_word().into(),
                    "-".into(),
                    "-".into(),
                    "-".into(),
                    st.pipe.display().to_string(),
                ]);
            }
            // By server, its default first, then by name: the same list whatever order
            // the namespaces were made in.
            let mut sorted: Vec<&state::Namespace> = st.namespaces.iter().collect();
            sorted.sort_by(|a, b| {
                (&a.server, a.name != "default", &a.name).cmp(&(
                    &b.server,
                    b.name != "default",
                    &b.name,
                ))
            });
            for n in sorted {
                if want_server.as_ref().is_some_and(|s| *s != n.server)
                    || want_name.as_ref().is_some_and(|w| *w != n.name)
                {
                    continue;
                }
                rows.push(vec![
                    n.name.clone(),
                    n.server.clone(),
                    st.status_word().into(),
                    n.memory_text(st.devices.len()),
                    n.pct_text(),
                    n.priority_text(),
                    n.dir().display().to_string(),
                ]);
            }
            if verb == "get" {
                let Some(r) = rows.first() else {
                    return Err(format!(
                        "no namespace '{}' of server '{}'",
                        args[0], args[1]
                    ));
                };
                let i = NAMESPACE_FIELDS
                    .iter()
                    .position(|c| *c == args[2])
                    .unwrap_or(0);
                return Ok(format!("{}\n", r[i]));
            }
            Ok(render(&NAMESPACE_FIELDS, &rows, format(o)))
        }
        ("namespace", "set") => {
            let server = text(o, "server").unwrap_or_default();
            let name = &args[0];
            let Some(n) = st.namespace(&server, name) else {
                return Err(format!("no namespace '{name}' of server '{server}'"));
            };
            remake(
                &st,
                &n.full,
                &with_limits(n.settings(), o),
                &format!("namespace set {name}"),
            )?;
            Ok(String::new())
        }
        ("client", "list") | ("client", "get") => {
            let only = text(o, "server");
            let rows: Vec<Vec<String>> = st
                .clients
                .iter()
                .filter(|c| only.as_ref().is_none_or(|s| *s == c.server()))
                .filter(|c| verb != "get" || c.pid.to_string() == args[0])
                .map(|c| {
                    let pci = st
                        .devices
                        .iter()
                        .find(|d| d.uuid == c.device)
                        .map_or("-".into(), |d| d.pci.clone());
                    vec![
                        c.pid.to_string(),
                        c.server(),
                        c.device.clone(),
                        c.maws_ns(),
                        c.command.clone(),
                        pci,
                        c.pid_ns.clone(),
                    ]
                })
                .collect();
            if verb == "get" {
                let Some(r) = rows.first() else {
                    return Err(format!("no client with PID {}", args[0]));
                };
                let i = [
                    "pid", "server", "device", "maws-ns", "cmd", "pci-id", "linux-ns",
                ]
                .iter()
                .position(|c| *c == args[1])
                .unwrap_or(0);
                return Ok(format!("{}\n", r[i]));
            }
            let rows: Vec<Vec<String>> = rows
                .into_iter()
                .map(|mut r| {
                    r.truncate(5);
                    r
                })
                .collect();
            Ok(render(
                &["pid", "server", "device", "maws-ns", "cmd"],
                &rows,
                format(o),
            ))
        }
        ("client", "terminate") => {
            let pid: u32 = args[0]
                .parse()
                .map_err(|_| format!("'{}' is not a PID", args[0]))?;
            if !st.clients.iter().any(|c| c.pid == pid) {
                return Err(format!("no client with PID {pid}"));
            }
            ask(&format!("terminate_client {} {pid}", st.server_pid)).map(|_| String::new())
        }
        ("device", "list") => {
            if let Some(s) = text(o, "server") {
                if !st.server_exists(&s) {
                    return Err(format!("no server '{s}'"));
                }
            }
            let rows: Vec<Vec<String>> = st
                .devices
                .iter()
                .map(|d| {
                    vec![
                        d.ordinal.to_string(),
                        text(o, "server").unwrap_or_else(|| IMPLICIT.into()),
                        d.pci.clone(),
                        d.uuid.clone(),
                        d.name.clone(),
                        d.sms.to_string(),
                        d.chunks.to_string(),
                        "M".into(),
                    ]
                })
                .collect();
            Ok(render(
                &[
                    "ordinal",
                    "server",
                    "pci-id",
                    "device-uuid",
                    "name",
                    "total-sms",
                    "total-chunks",
                    "attributes",
                ],
                &rows,
                format(o),
            ))
        }
        ("sm-partition", _) => partitions(&st, verb, args, o),
        _ => Err(format!("{module} {verb}: not known")),
    }
}

fn server_row(st: &State, s: &str) -> Vec<String> {
    let dir = if s == IMPLICIT {
        st.pipe.clone()
    } else {
        st.pipe.join(s)
    };
    let gpus = st
        .namespace(s, "default")
        .map_or("all".to_string(), |d| d.gpus.clone());
    let allowed: Vec<String> = st
        .devices
        .iter()
        .filter(|d| gpus == "all" || gpus.split(',').any(|g| g == d.ordinal.to_string()))
        .map(|d| d.uuid.clone())
        .collect();
    vec![
        s.to_string(),
        st.uid.to_string(),
        st.server_pid.clone(),
        st.status_word().into(),
        dir.display().to_string(),
        allowed.join(";"),
        "-".into(),
    ]
}

/// `feature` and `memacct`: omps's answers, without the server.
fn features(module: &str, verb: &str, args: &[String], o: &Opts) -> Result<String, String> {
    let rows = vec![
        vec![
            "memacct".to_string(),
            "enabled (always)".into(),
            "memacct".into(),
            super::config::MEMACCT.into(),
        ],
        vec![
            "context-share".to_string(),
            "enabled (always)".into(),
            "context-share".into(),
            super::config::CONTEXT_SHARE.into(),
        ],
    ];
    match (module, verb) {
        ("feature", "describe") => {
            let rows: Vec<Vec<String>> = rows.into_iter().filter(|r| args.first().is_none_or(|a| *a == r[0])).collect();
            Ok(render(&["feature", "state", "module", "covers"], &rows, format(o)))
        }
        ("feature", "enable") => Ok(format!("{} is always enabled in omps\n", args[0])),
        ("feature", "disable") => Err(format!("{} cannot be disabled in omps: {}", args[0], if args[0] == "memacct" { super::config::MEMACCT } else { super::config::CONTEXT_SHARE })),
        ("memacct", "describe") => Ok(render(&["key", "value", "covers"], &[vec!["audit_log".into(), "false".into(), "omps logs every refused allocation (once per client and GPU) in server.log; no audit log besides".into()]], format(o))),
        ("memacct", "set") => match o.get("audit_log") {
            Some(Value::Bool(false)) => Ok(String::new()),
            _ => Err("audit_log=true cannot be met: omps keeps no allocation audit log (server.log names refused allocations)".into()),
        },
        _ => Err(format!("{module} {verb}: not known")),
    }
}

/// `sm-partition`: omps's partitions (`sm_partition add UUID CHUNKS`, named `UUID/pN`),
/// with the v3 name kept in the partition's record (`PIPE/operator/v3-partitions`).
fn partitions(st: &State, verb: &str, args: &[String], o: &Opts) -> Result<String, String> {
    let read_names = || state::read_partition_names(&st.pipe);
    let write_names = |v: &[state::PartitionName]| state::write_partition_names(&st.pipe, v);
    let live = state::live_partitions()?;
    // Names of partitions the server no longer has (a restart) are forgotten.
    let mut names: Vec<_> = read_names()
        .into_iter()
        .filter(|(_, _, _, id)| live.iter().any(|l| l.id == *id))
        .collect();
    let server = text(o, "server");
    if let Some(s) = &server {
        if !st.server_exists(s) {
            return Err(format!("no server '{s}'"));
        }
    }
    let device = match o.get("device") {
        Some(Value::Device(d)) => Some(st.device(d)?.clone()),
        _ => None,
    };
    match verb {
        "create" => {
            let (s, d) = (
                server.unwrap_or_default(),
                device.ok_or("--device is required")?,
            );
            let name = &args[0];
            if names
                .iter()
                .any(|(ns, u, n, _)| *ns == s && *u == d.uuid && n == name)
            {
                return Err(format!("SM partition '{name}' exists on device {}", d.uuid));
            }
            if let Some(Value::Bool(true)) = o.get("include-remainder") {
                return Err(
                    "--include-remainder=true cannot be met yet: omps partitions whole chunks"
                        .into(),
                );
            }
            let chunks = number(o, "chunks").unwrap_or(0);
            let id = ask(&format!("sm_partition add {} {chunks}", d.uuid))?
                .trim()
                .to_string();
            let sms = state::live_partitions()?
                .into_iter()
                .find(|p| p.id == id)
                .map_or_else(|| "?".into(), |p| p.sms);
            names.push((s, d.uuid.clone(), name.clone(), id.clone()));
            write_names(&names)?;
            Ok(format!("SM partition '{name}' created on device {} (sm-count={sms})\nCUDA_MPS_SM_PARTITION={id}\n", d.uuid))
        }
        "delete" => {
            let (s, d) = (
                server.unwrap_or_default(),
                device.ok_or("--device is required")?,
            );
            let name = &args[0];
            let Some(i) = names
                .iter()
                .position(|(ns, u, n, _)| *ns == s && *u == d.uuid && n == name)
            else {
                return Err(format!(
                    "no SM partition '{name}' of server '{s}' on device {}",
                    d.uuid
                ));
            };
            let id = names[i].3.clone();
            ask(&format!("sm_partition rm {id}"))?;
            names.remove(i);
            write_names(&names)?;
            Ok(format!(
                "SM partition '{name}' deleted from device {}\n",
                d.uuid
            ))
        }
        _ => {
            let mut rows = Vec::new();
            for p in &live {
                let (s, u, n) = match names.iter().find(|x| x.3 == p.id) {
                    Some((s, u, n, _)) => (s.clone(), u.clone(), n.clone()),
                    // Made with the legacy command: no v3 name, the implicit server's.
                    None => {
                        let uuid = p.id.split('/').next().unwrap_or("").to_string();
                        (IMPLICIT.to_string(), uuid, "-".to_string())
                    }
                };
                let unnamed = n == "-";
                if (unnamed && server.is_some())
                    || (!unnamed && server.as_ref().is_some_and(|x| *x != s))
                    || device.as_ref().is_some_and(|d| d.uuid != u)
                {
                    continue;
                }
                let row = [
                    &s,
                    &u,
                    &n,
                    &p.chunks.to_string(),
                    &p.sms,
                    "false",
                    "created",
                    &p.id,
                ];
                rows.push(row.iter().map(|c| c.to_string()).collect::<Vec<String>>());
            }
            Ok(render(
                &[
                    "server",
                    "device",
                    "name",
                    "chunks",
                    "sm-count",
                    "include-remainder",
                    "status",
                    "visible-uuid",
                ],
                &rows,
                format(o),
            ))
        }
    }
}
