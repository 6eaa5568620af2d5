//! Namespaces, as MPS v3 has them: a client socket of its own per group of clients, with
//! the limits the operator set for the group, so that one server serves pods of several
//! teams and each pod mounts only its team's directory.
//!
//! The operator makes one with `create_namespace NAME [mem_limit=…] [thread_percentage=…]
//! [qos=…] [partition=…] [gpus=…] [max_clients=…]`; its socket is `PIPE/omps/NAME/control` (MPS v3's
//! `$CUDA_MPS_PIPE_DIRECTORY/<server>/<namespace>/control`, `omps` the one server of the
//! pipe directory), in a directory of the server's user alone. A client that connects
//! there gets the namespace's memory limit, thread percentage, QoS class and partition as
//! caps: what it asks for itself can lower them, never raise them, and a partition other
//! than the namespace's is refused. A namespace with a partition runs on the partition's
//! GPU only (its `gpus=`, which may name no other). It may have `max_clients=` clients at
//! once (by default all but a quarter of OMPS_MAX_CLIENTS). The definitions are kept in `PIPE/operator/namespaces`
//! (one command line each), so a server started again on the pipe directory makes them
//! again; a restart after a GPU fault keeps their sockets open (crate::control::listen).

use crate::client::NO_LIMIT;
use crate::sched::placement::Qos;
use crate::worker::policy::Policy;
use omps_ring::segment::{DeviceSnapshot, MAX_DEVICES};
use omps_ring::sock;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The control commands this module answers.
pub const COMMANDS: &[&str] = &[
    "create_namespace",
    "delete_namespace",
    "list_namespaces",
    "set_namespace",
];

/// Most namespaces one server keeps (each is a listening socket polled every pass).
pub const MAX_NAMESPACES: usize = 64;

/// What a namespace's clients are held to.
#[derive(Debug)]
pub struct Limits {
    pub name: String,
    /// Device memory per GPU, in the server's numbering ([`NO_LIMIT`]: none).
    pub mem: [u64; MAX_DEVICES],
    /// Thread percentage, in thousandths (None: the server's default caps it).
    pub milli_pct: Option<u32>,
    /// The highest QoS class its clients may have, and the one they get unasked.
    pub qos: Qos,
    /// The SM partition its clients run in (GPU, partition id), if any.
    pub partition: Option<(usize, u32)>,
    /// The server's GPUs its clients may see, in order (None: every GPU). A client that
    /// names none sees these; one that names another is refused: a pod picks its GPUs
    /// with CUDA_VISIBLE_DEVICES, and a namespace's limit on one GPU means nothing if its
    /// pods may use the others.
    pub gpus: Option<Vec<usize>>,
    /// How many clients it may have at once (None: OMPS_MAX_CLIENTS less a quarter,
    /// crate::client::bounds::Bounds::namespace_clients), so that one namespace's pods cannot
    /// take every client slot of the server.
    pub max_clients: Option<usize>,
    /// What its clients hold together, against `mem`: the limit is the namespace's, not
    /// each process's (a client may set a lower one of its own).
    pub held: Arc<crate::client::account::Group>,
}

/// The server GPUs a client of namespace `ns` sees: those its CUDA_VISIBLE_DEVICES named
/// (`named`, None where it named none), which must be the namespace's; or, where it named
/// none, the namespace's (all `every` the server has, where the namespace names none).
pub fn visible_in(
    ns: &Limits,
    named: Option<Vec<usize>>,
    every: usize,
) -> Result<Vec<usize>, String> {
    match (&ns.gpus, named) {
        (None, Some(v)) => Ok(v),
        (None, None) => Ok((0..every).collect()),
        (Some(mine), None) => Ok(mine.clone()),
        (Some(mine), Some(v)) => match v.iter().find(|g| !mine.contains(g)) {
            Some(g) => Err(format!(
                "it asks for GPU {g}, not one of its namespace '{}''s",
                ns.name
            )),
            None => Ok(v),
        },
    }
}

/// A namespace with no settings (other modules' tests).
#[cfg(test)]
pub fn test_limits(name: &str) -> Limits {
    Limits {
        name: name.into(),
        mem: [NO_LIMIT; MAX_DEVICES],
        milli_pct: None,
        qos: Qos::Normal,
        partition: None,
        gpus: None,
        max_clients: None,
        held: Arc::new(crate::client::account::Group::new([NO_LIMIT; MAX_DEVICES])),
    }
}

/// How QoS classes rank: a client may go down from its namespace's, not up.
pub fn qos_rank(q: Qos) -> u8 {
    match q {
        Qos::BelowNormal => 0,
        Qos::Normal => 1,
        Qos::LatencyCritical => 2,
    }
}

struct Namespace {
    limits: Arc<Limits>,
    /// The arguments it was made with, as `create_namespace` took them.
    line: String,
    listener: UnixListener,
    /// The socket file it bound, by identity, so that only that one is removed.
    bound: Option<(u64, u64)>,
    /// Whether its directory was last seen tampered with (said once, not per connection).
    tampered: std::sync::atomic::AtomicBool,
}

/// What namespace directory `dir` holds besides its `control` socket bound as `bound`
/// (None where it holds nothing else): a pod that could write it may have put a socket of
/// its own there (an `omps.sock`, which the shim takes before `control`, would catch the
/// next pods' handshakes), a link, or a `control` of its own.
fn strangers(dir: &Path, bound: Option<(u64, u64)>) -> Option<String> {
    let mut odd: Vec<String> = match std::fs::read_dir(dir) {
        Ok(rd) => rd
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n != sock::NAMESPACE_SOCKET)
            .take(8)
            .collect(),
        Err(e) => return Some(format!("{}: {e}", dir.display())),
    };
    if identity(&dir.join(sock::NAMESPACE_SOCKET)) != bound {
        odd.push(format!("{} (not the server's)", sock::NAMESPACE_SOCKET));
    }
    (!odd.is_empty()).then(|| {
        format!(
            "{} holds {} besides the server's socket",
            dir.display(),
            odd.iter()
                .map(|n| crate::client::one_word(n, 64))
                .collect::<Vec<_>>()
                .join(", ")
        )
    })
}

/// The server's namespaces.
pub struct Namespaces {
    pipe_dir: PathBuf,
    list: Vec<Namespace>,
    /// What the processes of deleted namespaces still hold, by name: a namespace made again
    /// under its name counts them with its new ones (and takes their connections), rather
    /// than letting old and new hold the limit twice over.
    deleted: std::collections::HashMap<String, std::sync::Weak<crate::client::account::Group>>,
}

fn identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

/// A name that is one plain path component: letters, digits, `-`, `_`, `.`, not leading;
/// or an MPS v3 `SERVER/NAMESPACE` (issue 26): two components of `[a-z0-9_]`, 1 to 64
/// each, the server not `omps` (the directory of the one-component names) nor `operator`
/// (the operator's), the namespace possibly `default` (that server's own).
fn check_name(name: &str) -> Result<(), String> {
    if let Some((server, ns)) = name.split_once('/') {
        let v3 = |c: &str| {
            !c.is_empty()
                && c.len() <= 64
                && c.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        };
        if !v3(server) || !v3(ns) {
            return Err(format!(
                "'{name}' is not a SERVER/NAMESPACE name (each 1 to 64 of a-z, 0-9 and _)"
            ));
        }
        if server == sock::NAMESPACE_SERVER || server == sock::OPERATOR_DIR {
            return Err(format!(
                "'{server}' is a directory of the server's own: not a server name"
            ));
        }
        return Ok(());
    }
    let plain = name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if name.is_empty() || name.len() > 64 || !plain || name.starts_with('.') {
        return Err(format!(
            "'{name}' is not a namespace name (1 to 64 letters, digits, '-', '_' or '.', not starting with '.'; or SERVER/NAMESPACE)"
        ));
    }
    if name == "default" {
        return Err(
            "'default' is the server's own namespace: its clients connect to omps.sock".into(),
        );
    }
    Ok(())
}

/// Reads a namespace's settings from `create_namespace`'s arguments after its name.
fn parse(
    name: &str,
    args: &[&str],
    policy: &Policy,
    gpus: &[DeviceSnapshot],
) -> Result<Limits, String> {
    check_name(name)?;
    let mut l = Limits {
        name: name.to_string(),
        mem: [NO_LIMIT; MAX_DEVICES],
        milli_pct: None,
        qos: Qos::Normal,
        partition: None,
        gpus: None,
        max_clients: None,
        held: Arc::new(crate::client::account::Group::new([NO_LIMIT; MAX_DEVICES])),
    };
    for a in args {
        let (key, value) = a
            .split_once('=')
            .ok_or_else(|| format!("'{a}' is not key=value"))?;
        match key {
            // A bare size is every GPU's; a list names them as the server's variable does.
            "mem_limit" => match omps_ring::memlimit::parse_size(value) {
                Ok(b) => l.mem[..gpus.len().min(MAX_DEVICES)].fill(b),
                Err(_) => l.mem = crate::client::memlimit::resolve_list(value, gpus)?,
            },
            "thread_percentage" => {
                l.milli_pct = Some(omps_ring::wire::parse_percentage(value).ok_or_else(|| {
                    format!("thread_percentage={value}: not a percentage in (0, 100]")
                })?)
            }
            "qos" => {
                l.qos = Qos::parse(value).ok_or_else(|| {
                    format!("qos={value}: not normal, below-normal or latency-critical")
                })?
            }
            "partition" => l.partition = Some(policy.partition_named(value)?),
            "gpus" => {
                let mut list = Vec::new();
                for item in value.split(',') {
                    let g = omps_ring::memlimit::parse_device(item.trim())
                        .and_then(|k| crate::client::memlimit::resolve(&k, gpus))
                        .map_err(|e| format!("gpus={value}: {e}"))?;
                    if list.contains(&g) {
                        return Err(format!("gpus={value}: GPU {g} named twice"));
                    }
                    list.push(g);
                }
                l.gpus = Some(list);
            }
            // As list_namespaces prints an unset one (`default:N`, the server's share).
            "max_clients" if value == "default" || value.starts_with("default:") => l.max_clients = None,
            "max_clients" => {
                let n = value
                    .parse::<usize>()
                    .ok()
                    .filter(|&n| n >= 1)
                    .ok_or_else(|| format!("max_clients={value}: not a number of clients"))?;
                l.max_clients = Some(n);
            }
            _ => {
                return Err(format!(
                    "unknown setting '{key}' (mem_limit, thread_percentage, qos, partition, gpus, max_clients)"
                ))
            }
        }
    }
    confine_to_partition(&mut l)?;
    l.held = Arc::new(crate::client::account::Group::new(l.mem));
    Ok(l)
}

/// A partition is of one GPU, and its namespace's clients run on that GPU alone (as an MPS
/// client of an SM partition does): with no `gpus=` the namespace gets that GPU's; a
/// `gpus=` naming any other is refused (its clients would run unconfined there).
fn confine_to_partition(l: &mut Limits) -> Result<(), String> {
    let Some((pg, id)) = l.partition else {
        return Ok(());
    };
    match &l.gpus {
        None => l.gpus = Some(vec![pg]),
        Some(g) if g.iter().all(|&x| x == pg) => {}
        Some(_) => {
            return Err(format!(
                "partition gpu{pg}/p{id} is on GPU {pg}: gpus= may name that GPU only"
            ))
        }
    }
    Ok(())
}

impl Namespaces {
    /// The namespaces recorded for `pipe_dir`, on the sockets a restart kept (`kept`)
    /// or on new ones. One that cannot be made again (a partition gone with the last
    /// server) is left out, and said so.
    pub fn start(
        pipe_dir: &Path,
        kept: Vec<UnixListener>,
        policy: &Policy,
        gpus: &[DeviceSnapshot],
    ) -> Namespaces {
        let mut ns = Namespaces {
            pipe_dir: pipe_dir.to_path_buf(),
            list: Vec::new(),
            deleted: Default::default(),
        };
        let mut kept: Vec<Option<UnixListener>> = kept.into_iter().map(Some).collect();
        let text = std::fs::read_to_string(ns.record_path()).unwrap_or_default();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let words: Vec<&str> = line.split_whitespace().collect();
            let socket = sock::namespace_dir_in(pipe_dir, words[0]).join(sock::NAMESPACE_SOCKET);
            let listener = kept
                .iter_mut()
                .find(|k| {
                    k.as_ref().is_some_and(|l| {
                        crate::control::listen::bound_path(l.as_raw_fd()).as_deref()
                            == Some(&socket)
                    })
                })
                .and_then(Option::take);
            if let Err(why) = ns.add(&words, listener, policy, gpus) {
                tracing::warn!("namespace '{line}' not made again: {why}");
            }
        }
        ns.record();
        ns
    }

    fn record_path(&self) -> PathBuf {
        self.pipe_dir.join(sock::OPERATOR_DIR).join("namespaces")
    }

    /// Writes the definitions down (in the operator's directory), replacing the old file
    /// in one step.
    fn record(&self) {
        let text: String = self.list.iter().map(|n| format!("{}\n", n.line)).collect();
        let path = self.record_path();
        let tmp = path.with_extension("new");
        let written = std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, &path));
        if let Err(e) = written {
            tracing::warn!("namespaces not recorded in {}: {e}", path.display());
        }
    }

    /// Makes a namespace: `words` its name and settings; `kept` its socket if a restart
    /// kept it open.
    fn add(
        &mut self,
        words: &[&str],
        kept: Option<UnixListener>,
        policy: &Policy,
        gpus: &[DeviceSnapshot],
    ) -> Result<(), String> {
        let [name, args @ ..] = words else {
            return Err("usage: create_namespace NAME [mem_limit=SIZE or DEV=SIZE,...] [thread_percentage=PCT] [qos=normal|below-normal|latency-critical] [partition=UUID/pN] [gpus=DEV,...] [max_clients=N]".into());
        };
        let mut limits = parse(name, args, policy, gpus)?;
        if self.list.iter().any(|n| n.limits.name == *name) {
            return Err(format!("namespace '{name}' exists"));
        }
        if self.list.len() >= MAX_NAMESPACES {
            return Err(format!("{MAX_NAMESPACES} namespaces exist already"));
        }
        let dir = sock::namespace_dir_in(&self.pipe_dir, name);
        let socket = dir.join(sock::NAMESPACE_SOCKET);
        let listener = match kept {
            Some(l) => l,
            None => {
                let parent = dir.parent().unwrap_or(&self.pipe_dir).to_path_buf();
                let existed = dir.exists();
                let made = crate::control::listen::private_dir(&parent)
                    .and_then(|()| crate::control::listen::private_dir(&dir))
                    .and_then(|()| {
                        // Under the pipe directory's lock no other server owns the path:
                        // what is there is left from one that died.
                        let _ = std::fs::remove_file(&socket);
                        UnixListener::bind(&socket)
                    });
                made.map_err(|e| {
                    // A directory made for a socket that could not be bound goes again.
                    if !existed {
                        let _ = std::fs::remove_dir(&dir);
                    }
                    format!("{}: {e}", socket.display())
                })?
            }
        };
        listener
            .set_nonblocking(true)
            .map_err(|e| format!("{}: {e}", socket.display()))?;
        if let Some(why) = strangers(&dir, identity(&socket)) {
            return Err(format!("{why}: not served until it is removed"));
        }
        self.deleted.retain(|_, g| g.strong_count() > 0);
        if let Some(held) = self.deleted.remove(*name).and_then(|g| g.upgrade()) {
            held.set_limit(limits.mem);
            limits.held = held;
        }
        self.list.push(Namespace {
            limits: Arc::new(limits),
            line: words.join(" "),
            listener,
            bound: identity(&socket),
            tampered: Default::default(),
        });
        Ok(())
    }

    /// `set_namespace NAME [key=value...]`: the namespace's settings are these now, all of
    /// them (what is not named goes back to its default), in place: its socket, directory
    /// and what its processes hold stay, so that pods which mount the directory keep it.
    /// A lower memory limit holds for its processes together at once (their shared
    /// count); a higher one, as thread percentage, QoS and partition, for the clients
    /// that connect from now on (each connected client keeps the limit it came with).
    fn set(
        &mut self,
        name: &str,
        settings: &[&str],
        policy: &Policy,
        gpus: &[DeviceSnapshot],
    ) -> Result<(), String> {
        let Some(n) = self.list.iter_mut().find(|n| n.limits.name == name) else {
            return Err(format!("no namespace '{name}'"));
        };
        let mut limits = parse(name, settings, policy, gpus)?;
        n.limits.held.set_limit(limits.mem);
        limits.held = n.limits.held.clone();
        n.limits = Arc::new(limits);
        n.line = std::iter::once(name)
            .chain(settings.iter().copied())
            .collect::<Vec<_>>()
            .join(" ");
        Ok(())
    }

    /// Runs one of [`COMMANDS`]: (success, output).
    pub fn command(
        &mut self,
        cmd: &str,
        args: &[&str],
        policy: &Policy,
        gpus: &[DeviceSnapshot],
    ) -> (bool, String) {
        match (cmd, args) {
            ("create_namespace", _) => match self.add(args, None, policy, gpus) {
                Ok(()) => {
                    self.record();
                    let dir = sock::namespace_dir_in(&self.pipe_dir, args[0]);
                    (true, format!("{}\n", dir.display()))
                }
                Err(why) => (false, format!("create_namespace: {why}\n")),
            },
            ("delete_namespace", [name]) => {
                let Some(i) = self.list.iter().position(|n| n.limits.name == *name) else {
                    return (false, format!("delete_namespace: no namespace '{name}'\n"));
                };
                let n = self.list.remove(i);
                self.deleted
                    .insert(n.limits.name.clone(), Arc::downgrade(&n.limits.held));
                self.remove_files(&n);
                self.record();
                (true, String::new())
            }
            ("list_namespaces", []) => (true, self.list_text(gpus)),
            ("set_namespace", [name, settings @ ..]) => match self.set(name, settings, policy, gpus) {
                Ok(()) => {
                    self.record();
                    (true, String::new())
                }
                Err(why) => (false, format!("set_namespace: {why}\n")),
            },
            _ => (
                false,
                format!("usage: create_namespace NAME [key=value...], set_namespace NAME [key=value...], delete_namespace NAME, list_namespaces (not '{cmd} {}')\n", args.join(" ")),
            ),
        }
    }

    fn list_text(&self, snapshots: &[DeviceSnapshot]) -> String {
        let ngpus = snapshots.len();
        let mut s = String::new();
        for n in &self.list {
            let l = &n.limits;
            let mem: Vec<String> = (0..ngpus.min(MAX_DEVICES))
                .filter(|&d| l.mem[d] != NO_LIMIT)
                .map(|d| format!("{d}={}", omps_ring::memlimit::format_size(l.mem[d])))
                .collect();
            let gpus = l.gpus.as_ref().map_or("all".into(), |g| {
                g.iter()
                    .map(|d| d.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            });
            s.push_str(&format!(
                "{} {} mem_limit={} thread_percentage={} qos={} partition={} gpus={gpus} max_clients={}\n",
                l.name,
                sock::namespace_dir_in(&self.pipe_dir, &l.name)
                    .join(sock::NAMESPACE_SOCKET)
                    .display(),
                if mem.is_empty() {
                    "none".into()
                } else {
                    mem.join(",")
                },
                l.milli_pct
                    .map_or("default".into(), |p| format!("{:.1}", p as f64 / 1000.0)),
                l.qos.name(),
                l.partition
                    // As create_namespace takes it: the GPU's UUID and the partition.
                    .map_or("none".into(), |(g, id)| match snapshots.get(g) {
                        Some(d) => format!("{}/p{id}", crate::base::ids::uuid_text(&d.uuid)),
                        None => format!("gpu{g}/p{id}"),
                    }),
                // Unset: the share it has now, marked as the default (create_namespace and
                // set_namespace take the text back as unset).
                l.max_clients.map_or_else(
                    || format!("default:{}", crate::client::bounds::bounds().namespace_clients()),
                    |n| n.to_string()
                ),
            ));
        }
        s
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// Each namespace's limits, in order.
    pub fn limits(&self) -> impl Iterator<Item = &Arc<Limits>> + '_ {
        self.list.iter().map(|n| &n.limits)
    }

    /// One pollfd per namespace, in order ([`Namespaces::accept`] takes the position).
    pub fn pollfds(&self) -> impl Iterator<Item = libc::pollfd> + '_ {
        self.list.iter().map(|n| libc::pollfd {
            fd: n.listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
    }

    /// A connection on the `i`th namespace's socket, with what it is held to.
    /// One whose namespace directory holds anything besides the server's socket is
    /// closed at once, and that said (once until the directory is clean again).
    pub fn accept(&self, i: usize) -> Option<io::Result<(UnixStream, Arc<Limits>)>> {
        use std::sync::atomic::Ordering::Relaxed;
        let n = self.list.get(i)?;
        match n.listener.accept() {
            Ok((s, _)) => {
                let dir = sock::namespace_dir_in(&self.pipe_dir, &n.limits.name);
                match strangers(&dir, n.bound).or_else(|| self.server_dir_strangers(&n.limits.name))
                {
                    Some(why) => {
                        if !n.tampered.swap(true, Relaxed) {
                            tracing::warn!(
                                namespace = n.limits.name,
                                "{why}: its connections are refused until it is removed"
                            );
                        }
                        None
                    }
                    None => {
                        n.tampered.store(false, Relaxed);
                        Some(Ok((s, n.limits.clone())))
                    }
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => None,
            Err(e) => Some(Err(e)),
        }
    }

    /// For an MPS v3 server's `default` namespace: what its server's directory holds
    /// besides its namespaces' directories. Clients pointed at `PIPE/<server>` are routed
    /// to `default/control` unless a socket sits in the server's directory itself
    /// (omps-ring `client_socket_in`); one planted there would take them, so `default`
    /// is not served while anything else is there.
    fn server_dir_strangers(&self, name: &str) -> Option<String> {
        let (server, "default") = name.split_once('/')? else {
            return None;
        };
        let dir = self.pipe_dir.join(server);
        // Only what routing could take: a socket, file or link (`omps.sock`, `control`, a
        // `default` that is no directory). A directory a deleted namespace left behind (a
        // pod's file kept it) or one being made holds nothing routing reaches.
        let odd: Vec<String> = match std::fs::read_dir(&dir) {
            Ok(rd) => rd
                .filter_map(Result::ok)
                .filter(|e| !e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| crate::client::one_word(&e.file_name().to_string_lossy(), 64))
                .take(8)
                .collect(),
            Err(e) => return Some(format!("{}: {e}", dir.display())),
        };
        (!odd.is_empty()).then(|| {
            format!(
                "{} holds {} besides its namespaces' directories",
                dir.display(),
                odd.join(", ")
            )
        })
    }

    /// Copies of the sockets, for a restart to keep open.
    pub fn listeners(&self) -> Vec<UnixListener> {
        self.list
            .iter()
            .filter_map(|n| n.listener.try_clone().ok())
            .collect()
    }

    fn remove_files(&self, n: &Namespace) {
        let dir = sock::namespace_dir_in(&self.pipe_dir, &n.limits.name);
        let socket = dir.join(sock::NAMESPACE_SOCKET);
        if n.bound.is_some() && identity(&socket) == n.bound {
            let _ = std::fs::remove_file(&socket);
        }
        // Only if empty: a pod's files are not ours to remove.
        let _ = std::fs::remove_dir(&dir);
        // An MPS v3 server's directory goes with its last namespace (if empty too).
        if n.limits.name.contains('/') {
            if let Some(server_dir) = dir.parent() {
                let _ = std::fs::remove_dir(server_dir);
            }
        }
    }

    /// The server quits: the sockets go (the record stays, for the next server).
    pub fn remove_all(&self) {
        for n in &self.list {
            self.remove_files(n);
        }
        let _ = std::fs::remove_dir(self.pipe_dir.join(sock::NAMESPACE_SERVER));
    }
}

/// Holds a connecting client of namespace `ns` to it: what it asked for itself
/// (`settings`, already settled against the server's defaults as `settled`, and its own
/// memory limits `own`, in the server's numbering) may lower the namespace's limits;
/// asking for more is refused: Err(why). On success `settled` and `own` hold what the
/// client gets.
pub fn hold_to(
    ns: &Limits,
    settings: &omps_ring::wire::ClientSettings,
    settled: &mut crate::worker::policy::Settled,
    own: &mut [u64; MAX_DEVICES],
) -> Result<(), String> {
    use omps_ring::wire::ClientSettings;
    let name = &ns.name;
    if settings.qos == ClientSettings::UNSET {
        settled.qos = ns.qos;
    } else if qos_rank(settled.qos) > qos_rank(ns.qos) {
        return Err(format!(
            "it asks for QoS {}, above its namespace '{name}''s {}",
            settled.qos.name(),
            ns.qos.name()
        ));
    }
    if let Some(cap) = ns.milli_pct {
        if settings.thread_milli_pct != ClientSettings::UNSET && settings.thread_milli_pct > cap {
            return Err(format!(
                "it asks for {:.1}% of the threads, above its namespace '{name}''s {:.1}%",
                settings.thread_milli_pct as f64 / 1000.0,
                cap as f64 / 1000.0
            ));
        }
        settled.milli_pct = settled.milli_pct.min(cap);
    }
    if settled.partition.is_some() && settled.partition != ns.partition {
        return Err(format!(
            "it names an SM partition its namespace '{name}' does not give it"
        ));
    }
    settled.partition = ns.partition;
    for (d, mine) in own.iter_mut().enumerate() {
        if *mine != NO_LIMIT && *mine > ns.mem[d] {
            return Err(format!(
                "its memory limit on GPU {d} is above its namespace '{name}''s"
            ));
        }
        *mine = (*mine).min(ns.mem[d]);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_one_plain_component() {
        for bad in [
            "",
            ".",
            "..",
            ".x",
            "a/",
            "/b",
            "a/b/c",
            "a/../b",
            "A/b",
            "a/b-c",
            "omps/b",
            "operator/b",
            "a b",
            "default",
            &"x".repeat(65),
            &format!("a/{}", "x".repeat(65)),
        ] {
            assert!(check_name(bad).is_err(), "{bad:?} taken");
        }
        for good in [
            "team-a",
            "t_1",
            "a.b",
            "X9",
            "training/high_priority",
            "s/default",
        ] {
            assert!(check_name(good).is_ok(), "{good:?} refused");
        }
    }

    fn ns(gpus: Option<Vec<usize>>) -> Limits {
        Limits {
            name: "team".into(),
            mem: [NO_LIMIT; MAX_DEVICES],
            milli_pct: None,
            qos: Qos::Normal,
            partition: None,
            gpus,
            max_clients: None,
            held: Arc::new(crate::client::account::Group::new([NO_LIMIT; MAX_DEVICES])),
        }
    }

    /// Found in review: a namespace could cap GPU 0, and its pods pick any GPU.
    #[test]
    fn a_namespaces_clients_see_its_gpus_only() {
        let two = ns(Some(vec![2, 1]));
        assert_eq!(
            visible_in(&two, None, 4),
            Ok(vec![2, 1]),
            "its GPUs, its order"
        );
        assert_eq!(
            visible_in(&two, Some(vec![1]), 4),
            Ok(vec![1]),
            "fewer is theirs"
        );
        let e = visible_in(&two, Some(vec![1, 0]), 4).unwrap_err();
        assert!(e.contains("GPU 0") && e.contains("team"), "{e}");
        assert_eq!(visible_in(&ns(None), Some(vec![0, 3]), 4), Ok(vec![0, 3]));
        assert_eq!(
            visible_in(&ns(None), None, 2),
            Ok(vec![0, 1]),
            "no names: every GPU"
        );
    }

    #[test]
    fn a_partitions_namespace_runs_on_the_partitions_gpu_only() {
        let mut l = ns(None);
        l.partition = Some((1, 3));
        confine_to_partition(&mut l).unwrap();
        assert_eq!(l.gpus, Some(vec![1]), "no gpus=: the partition's GPU");
        assert_eq!(visible_in(&l, None, 4), Ok(vec![1]));
        assert!(visible_in(&l, Some(vec![0]), 4).is_err());
        let mut l = ns(Some(vec![1]));
        l.partition = Some((1, 3));
        assert!(confine_to_partition(&mut l).is_ok());
        let mut l = ns(Some(vec![0, 1]));
        l.partition = Some((1, 3));
        assert!(
            confine_to_partition(&mut l).is_err(),
            "GPU 0 would be unconfined"
        );
        let mut l = ns(None);
        confine_to_partition(&mut l).unwrap();
        assert_eq!(l.gpus, None, "no partition: every GPU, as before");
    }

    #[test]
    fn qos_ranks_put_latency_critical_highest() {
        assert!(qos_rank(Qos::LatencyCritical) > qos_rank(Qos::Normal));
        assert!(qos_rank(Qos::Normal) > qos_rank(Qos::BelowNormal));
    }
}
