//! MPS v3's command grammar: `MODULE VERB [POSITIONAL...] [--key=value | key=value | --flag]`,
//! each verb checked against what NVIDIA's reference says it takes, every value checked by
//! [`super::values`]. A command that does not parse is refused with the word that was wrong
//! and the verb's usage; nothing is sent to the server.

use super::values::{self, Device};
use std::collections::BTreeMap;

/// What an option's value must be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Name,
    Uid,
    Devices,
    Device,
    Bool,
    Memory,
    Percent,
    Priority,
    Chunks,
    Format,
    /// Takes no value (`--force`, `--all`).
    Flag,
}

/// A checked value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    Text(String),
    Number(u64),
    Devices(Vec<Device>),
    Device(Device),
    Bool(bool),
    Format { csv: bool, header: bool },
    Set,
}

/// One verb: its positionals (names for the usage line; a trailing `?` marks optional) and
/// its options.
struct Spec {
    module: &'static str,
    verb: &'static str,
    positionals: &'static [&'static str],
    options: &'static [(&'static str, Kind)],
    /// At least one of these options must be given (`set` verbs).
    one_of: &'static [&'static str],
}

const LIMITS: [(&str, Kind); 3] = [
    ("pinned-memory-limit", Kind::Memory),
    ("active-thread-percentage", Kind::Percent),
    ("client-priority", Kind::Priority),
];

const SPECS: &[Spec] = &[
    Spec {
        module: "server",
        verb: "create",
        positionals: &["NAME?"],
        options: &[
            ("uid", Kind::Uid),
            ("allowed-devices", Kind::Devices),
            ("locality-domains", Kind::Bool),
        ],
        one_of: &[],
    },
    Spec {
        module: "server",
        verb: "delete",
        positionals: &["NAME"],
        options: &[("force", Kind::Flag)],
        one_of: &[],
    },
    Spec {
        module: "server",
        verb: "list",
        positionals: &["NAME?"],
        options: &[("format", Kind::Format)],
        one_of: &[],
    },
    Spec {
        module: "server",
        verb: "set",
        positionals: &["NAME"],
        options: &[
            ("uid", Kind::Uid),
            LIMITS[0],
            LIMITS[1],
            ("locality-domains", Kind::Bool),
            LIMITS[2],
        ],
        one_of: &[
            "uid",
            "pinned-memory-limit",
            "active-thread-percentage",
            "locality-domains",
            "client-priority",
        ],
    },
    Spec {
        module: "server",
        verb: "get",
        positionals: &["NAME", "FIELD"],
        options: &[],
        one_of: &[],
    },
    Spec {
        module: "namespace",
        verb: "create",
        positionals: &["NAME"],
        options: &[("server", Kind::Name)],
        one_of: &["server"],
    },
    Spec {
        module: "namespace",
        verb: "delete",
        positionals: &["NAME"],
        options: &[("server", Kind::Name), ("force", Kind::Flag)],
        one_of: &["server"],
    },
    Spec {
        module: "namespace",
        verb: "list",
        positionals: &["NAME?"],
        options: &[("server", Kind::Name), ("format", Kind::Format)],
        one_of: &[],
    },
    Spec {
        module: "namespace",
        verb: "set",
        positionals: &["NAME"],
        options: &[("server", Kind::Name), LIMITS[0], LIMITS[1], LIMITS[2]],
        one_of: &[
            "pinned-memory-limit",
            "active-thread-percentage",
            "client-priority",
        ],
    },
    Spec {
        module: "namespace",
        verb: "get",
        positionals: &["NAME", "SERVER", "FIELD"],
        options: &[],
        one_of: &[],
    },
    Spec {
        module: "client",
        verb: "list",
        positionals: &[],
        options: &[
            ("server", Kind::Name),
            ("all", Kind::Flag),
            ("format", Kind::Format),
        ],
        one_of: &[],
    },
    Spec {
        module: "client",
        verb: "get",
        positionals: &["PID", "FIELD"],
        options: &[],
        one_of: &[],
    },
    Spec {
        module: "client",
        verb: "terminate",
        positionals: &["PID"],
        options: &[],
        one_of: &[],
    },
    Spec {
        module: "device",
        verb: "list",
        positionals: &[],
        options: &[("server", Kind::Name), ("format", Kind::Format)],
        one_of: &[],
    },
    Spec {
        module: "sm-partition",
        verb: "create",
        positionals: &["NAME"],
        options: &[
            ("server", Kind::Name),
            ("device", Kind::Device),
            ("chunks", Kind::Chunks),
            ("include-remainder", Kind::Bool),
        ],
        one_of: &[],
    },
    Spec {
        module: "sm-partition",
        verb: "delete",
        positionals: &["NAME"],
        options: &[("server", Kind::Name), ("device", Kind::Device)],
        one_of: &[],
    },
    Spec {
        module: "sm-partition",
        verb: "list",
        positionals: &[],
        options: &[
            ("server", Kind::Name),
            ("device", Kind::Device),
            ("all", Kind::Flag),
            ("format", Kind::Format),
        ],
        one_of: &[],
    },
    Spec {
        module: "feature",
        verb: "enable",
        positionals: &["FEATURE"],
        options: &[],
        one_of: &[],
    },
    Spec {
        module: "feature",
        verb: "disable",
        positionals: &["FEATURE"],
        options: &[],
        one_of: &[],
    },
    Spec {
        module: "feature",
        verb: "describe",
        positionals: &["FEATURE?"],
        options: &[("format", Kind::Format)],
        one_of: &[],
    },
    Spec {
        module: "memacct",
        verb: "set",
        positionals: &[],
        options: &[("audit_log", Kind::Bool)],
        one_of: &["audit_log"],
    },
    Spec {
        module: "memacct",
        verb: "describe",
        positionals: &[],
        options: &[("format", Kind::Format)],
        one_of: &[],
    },
    // omps's own: the running state written back as a configuration file, and a file
    // made on a running server (all of it or none).
    Spec {
        module: "config",
        verb: "save",
        positionals: &["FILE"],
        options: &[],
        one_of: &[],
    },
    Spec {
        module: "config",
        verb: "apply",
        positionals: &["FILE"],
        options: &[("replace", Kind::Flag)],
        one_of: &[],
    },
];

/// Options every verb with them must have (besides `one_of`).
const REQUIRED: &[(&str, &str, &[&str])] = &[
    ("sm-partition", "create", &["server", "device", "chunks"]),
    ("sm-partition", "delete", &["server", "device"]),
];

/// The columns of `server list` and `namespace list`, which are also the fields their
/// `get` verbs print.
pub const SERVER_FIELDS: [&str; 7] = [
    "name",
    "uid",
    "pid",
    "status",
    "pipe-directory",
    "allowed-devices",
    "context-ids",
];
pub const NAMESPACE_FIELDS: [&str; 7] = [
    "name",
    "server",
    "server-status",
    "pinned-memory-limit",
    "active-thread-percentage",
    "client-priority",
    "pipe-directory",
];
pub const CLIENT_FIELDS: &[&str] = &[
    "pid", "server", "device", "pci-id", "linux-ns", "maws-ns", "cmd",
];
pub const FEATURES: &[&str] = &["memacct", "context-share"];

/// The modules of MPS v3 (`context-share` is named by NVIDIA's reference with no verbs).
pub const MODULES: &[&str] = &[
    "server",
    "namespace",
    "client",
    "device",
    "sm-partition",
    "feature",
    "memacct",
    "config",
];

/// A parsed command.
#[derive(Debug, PartialEq, Eq)]
pub enum Command {
    Run {
        module: &'static str,
        verb: &'static str,
        args: Vec<String>,
        opts: BTreeMap<&'static str, Value>,
    },
    /// `MODULE help`, `MODULE VERB help`, `help`: the usage text.
    Help(String),
}

#[cfg(test)]
impl Command {
    /// An option's value, if given.
    pub fn opt(&self, k: &str) -> Option<&Value> {
        match self {
            Command::Run { opts, .. } => opts.get(k),
            Command::Help(_) => None,
        }
    }
}

/// Whether `word` starts an MPS v3 command (the first word of a line or of the arguments).
pub fn is_v3(word: &str) -> bool {
    MODULES.contains(&word) || word == "context-share"
}

fn usage(s: &Spec) -> String {
    let mut u = format!("{} {}", s.module, s.verb);
    for p in s.positionals {
        match p.strip_suffix('?') {
            Some(p) => u += &format!(" [{p}]"),
            None => u += &format!(" {p}"),
        }
    }
    for (o, k) in s.options {
        let shown = match k {
            Kind::Flag => format!("--{o}"),
            Kind::Format => "--format=table|csv[,noheader]".into(),
            _ => format!("--{o}=VALUE"),
        };
        if s.one_of.contains(o) && s.one_of.len() == 1
            || REQUIRED
                .iter()
                .any(|r| r.0 == s.module && r.1 == s.verb && r.2.contains(o))
        {
            u += &format!(" {shown}");
        } else {
            u += &format!(" [{shown}]");
        }
    }
    u
}

/// The usage of a module's verbs (or of every module's).
pub fn help(module: Option<&str>) -> String {
    SPECS
        .iter()
        .filter(|s| module.is_none_or(|m| s.module == m))
        .map(|s| format!("  {}\n", usage(s)))
        .collect()
}

fn value(opt: &str, kind: Kind, v: Option<&str>) -> Result<Value, String> {
    fn need<'a>(opt: &str, v: Option<&'a str>) -> Result<&'a str, String> {
        v.ok_or_else(|| format!("--{opt} needs a value (--{opt}=...)"))
    }
    let named = |r: Result<Value, String>| r.map_err(|e| format!("--{opt}: {e}"));
    match kind {
        Kind::Flag => match v {
            None => Ok(Value::Set),
            Some(x) => Err(format!("--{opt} takes no value (given '{x}')")),
        },
        Kind::Name => named(values::name(need(opt, v)?).map(Value::Text)),
        Kind::Uid => named(
            need(opt, v)?
                .parse::<u32>()
                .map(|u| Value::Number(u.into()))
                .map_err(|_| format!("'{}' is not a user id", v.unwrap_or(""))),
        ),
        Kind::Devices => named(values::devices(need(opt, v)?).map(Value::Devices)),
        Kind::Device => named(values::device(need(opt, v)?).map(Value::Device)),
        Kind::Bool => named(values::boolean(need(opt, v)?).map(Value::Bool)),
        Kind::Memory => named(values::memory(need(opt, v)?).map(Value::Number)),
        Kind::Percent => named(values::percentage(need(opt, v)?).map(|p| Value::Number(p.into()))),
        Kind::Priority => named(values::priority(need(opt, v)?).map(|p| Value::Number(p.into()))),
        Kind::Chunks => named(match need(opt, v)?.parse::<u32>() {
            Ok(n) if n >= 1 => Ok(Value::Number(n.into())),
            _ => Err(format!(
                "'{}' is not a positive whole number",
                v.unwrap_or("")
            )),
        }),
        Kind::Format => {
            let mut parts = need(opt, v)?.split(',');
            let csv = match parts.next() {
                Some("table") => false,
                Some("csv") => true,
                other => {
                    return Err(format!(
                        "--format: '{}' is not table or csv",
                        other.unwrap_or("")
                    ))
                }
            };
            let mut header = true;
            for p in parts {
                match p {
                    "noheader" if header => header = false,
                    _ => return Err(format!("--format: '{p}' is not noheader")),
                }
            }
            Ok(Value::Format { csv, header })
        }
    }
}

/// Parses one v3 command from its words.
pub fn parse<S: AsRef<str>>(words: &[S]) -> Result<Command, String> {
    let words: Vec<&str> = words.iter().map(AsRef::as_ref).collect();
    let Some(&module) = words.first() else {
        return Err(format!("no command; modules: {}", MODULES.join(", ")));
    };
    if module == "help" || module == "--help" || module == "-h" {
        return Ok(Command::Help(help(None)));
    }
    if module == "context-share" {
        return Err(
            "context-share has no verbs: omps always shares one context per GPU among its clients"
                .into(),
        );
    }
    let Some(&module) = MODULES.iter().find(|m| **m == module) else {
        return Err(format!(
            "'{module}' is not a module; modules: {}",
            MODULES.join(", ")
        ));
    };
    let Some(&verb) = words.get(1) else {
        return Err(format!(
            "{module}: no verb; it takes:\n{}",
            help(Some(module))
        ));
    };
    if verb == "help" || verb == "--help" {
        return Ok(Command::Help(help(Some(module))));
    }
    let Some(spec) = SPECS.iter().find(|s| s.module == module && s.verb == verb) else {
        return Err(format!(
            "{module}: '{verb}' is not a verb; it takes:\n{}",
            help(Some(module))
        ));
    };
    let rest = &words[2..];
    if rest.iter().any(|w| *w == "help" || *w == "--help") {
        return Ok(Command::Help(format!("  {}\n", usage(spec))));
    }
    let mut args = Vec::new();
    let mut opts = BTreeMap::new();
    for w in rest {
        // `--key=value`, `--flag`, or bare `key=value` (as `memacct set audit_log=true`).
        let (key, v) = if let Some(o) = w.strip_prefix("--") {
            match o.split_once('=') {
                Some((k, v)) => (k, Some(v)),
                None => (o, None),
            }
        } else if let Some((k, v)) = w.split_once('=') {
            (k, Some(v))
        } else {
            args.push(w.to_string());
            continue;
        };
        let Some(&(name, kind)) = spec.options.iter().find(|(n, _)| *n == key) else {
            return Err(format!(
                "{module} {verb}: '{w}' is not an option of this verb\nusage: {}",
                usage(spec)
            ));
        };
        if opts.insert(name, value(name, kind, v)?).is_some() {
            return Err(format!("{module} {verb}: --{name} is given twice"));
        }
    }
    let max = spec.positionals.len();
    let min = spec
        .positionals
        .iter()
        .filter(|p| !p.ends_with('?'))
        .count();
    if args.len() < min || args.len() > max {
        return Err(format!(
            "{module} {verb}: {} argument(s) given, it takes {}\nusage: {}",
            args.len(),
            if min == max {
                format!("{min}")
            } else {
                format!("{min} to {max}")
            },
            usage(spec)
        ));
    }
    if !spec.one_of.is_empty() && !spec.one_of.iter().any(|o| opts.contains_key(o)) {
        let list: Vec<String> = spec.one_of.iter().map(|o| format!("--{o}")).collect();
        return Err(format!(
            "{module} {verb}: give {}\nusage: {}",
            list.join(" or "),
            usage(spec)
        ));
    }
    if let Some((_, _, req)) = REQUIRED.iter().find(|r| r.0 == module && r.1 == verb) {
        if let Some(o) = req.iter().find(|o| !opts.contains_key(*o)) {
            return Err(format!(
                "{module} {verb}: --{o} is required\nusage: {}",
                usage(spec)
            ));
        }
    }
    check_args(spec, &args, &opts)?;
    Ok(Command::Run {
        module,
        verb: spec.verb,
        args,
        opts,
    })
}

/// What the positionals must be, verb by verb.
fn check_args(
    s: &Spec,
    args: &[String],
    opts: &BTreeMap<&'static str, Value>,
) -> Result<(), String> {
    let bad = |what: &str, e: String| -> Result<(), String> {
        Err(format!("{} {}: {what}: {e}", s.module, s.verb))
    };
    let field = |v: &str, fields: &[&str]| {
        if fields.contains(&v) {
            Ok(())
        } else {
            bad(
                "FIELD",
                format!("'{v}' is not one of {}", fields.join(", ")),
            )
        }
    };
    let pid = |v: &str| match v.parse::<u32>() {
        Ok(p) if p > 0 => Ok(()),
        _ => bad("PID", format!("'{v}' is not a process id")),
    };
    match (s.module, s.verb) {
        ("server", "create") => {
            if args.is_empty() && !opts.contains_key("uid") {
                return bad("NAME", "give a name or --uid=UID".into());
            }
            args.iter()
                .try_for_each(|a| values::name(a).map(drop).or_else(|e| bad("NAME", e)))
        }
        ("server", "get") => {
            values::name(&args[0])
                .map(drop)
                .or_else(|e| bad("NAME", e))?;
            field(&args[1], &SERVER_FIELDS)
        }
        ("namespace", "get") => {
            values::name(&args[0])
                .map(drop)
                .or_else(|e| bad("NAME", e))?;
            values::name(&args[1])
                .map(drop)
                .or_else(|e| bad("SERVER", e))?;
            field(&args[2], &NAMESPACE_FIELDS)
        }
        ("client", "get") => {
            pid(&args[0])?;
            field(&args[1], CLIENT_FIELDS)
        }
        ("client", "terminate") => pid(&args[0]),
        ("feature", _) => args.iter().try_for_each(|a| field(a, FEATURES)),
        ("config", _) => Ok(()),
        _ => args
            .iter()
            .try_for_each(|a| values::name(a).map(drop).or_else(|e| bad("NAME", e))),
    }
}

#[cfg(test)]
mod tests;
