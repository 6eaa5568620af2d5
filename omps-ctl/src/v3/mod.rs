//! NVIDIA MPS v3's control interface (issue 26): what an operator of MPS 615/620 types and
//! writes, taken in and turned into the omps server's own commands.
//!
//! - [`values`]: the value forms both the command line and the TOML file use (names,
//!   sizes, percentages, priorities, device lists), each refused with its reason.
//! - [`verbs`]: the `module verb [positionals] [--key=value|key=value|--flag]` grammar,
//!   checked against what each verb takes.
//! - [`config`]: the `-a FILE` configuration file, every key of the schema, checked whole
//!   before anything is started.
//! - [`protocol`]: `-p 3` / `CUDA_MPS_PROTOCOL_VERSION`, and a later invocation following
//!   the running daemon's protocol.
//!
//! The facts behind the forms (names `[a-z0-9_]` up to 64 characters, sizes with binary
//! K/M/G units, percentages 1-100, which keys a table takes) are NVIDIA's documentation of
//! MPS v3; where it is silent the module says what omps chose.

pub mod config;
pub mod protocol;
pub mod values;
pub mod verbs;

use verbs::Command;

/// The legacy (v2) command that does what a v3 verb does, for the message of a verb omps
/// checks but does not carry out yet.
fn legacy_equivalent(module: &str, verb: &str) -> &'static str {
    match (module, verb) {
        ("server", "list") => "get_server_list",
        ("server", "create") => "start_server -uid UID",
        ("server", "delete") => "shutdown_server PID [-f]",
        ("server", "set") => "set_default_active_thread_percentage, set_default_device_pinned_mem_limit, set_default_client_priority",
        ("server", "get") => "get_server_status PID",
        ("namespace", "create") => "create_namespace NAME [mem_limit=...] [thread_percentage=...] [qos=...]",
        ("namespace", "delete") => "delete_namespace NAME",
        ("namespace", "list") | ("namespace", "get") => "list_namespaces",
        ("namespace", "set") => "delete_namespace then create_namespace",
        ("client", "list") | ("client", "get") => "ps",
        ("client", "terminate") => "terminate_client SERVER_PID CLIENT_PID",
        ("device", "list") => "device_query",
        ("sm-partition", "create") => "sm_partition add UUID CHUNKS",
        ("sm-partition", "delete") => "sm_partition rm UUID PARTITION",
        ("sm-partition", "list") => "lspart",
        _ => "none: omps always shares one context and counts all memory itself",
    }
}

/// Runs one MPS v3 command line: checked whole, refused with the word that was wrong.
pub fn run(protocol: u8, words: &[String]) -> Result<bool, String> {
    match verbs::parse(words)? {
        Command::Help(h) => {
            print!("{h}");
            Ok(true)
        }
        Command::Run { module, verb, .. } => {
            if protocol != protocol::V3 {
                return Err(format!(
                    "`{module} {verb}` is MPS v3 syntax and this daemon speaks protocol 2: start it \
                     with -p 3 (or CUDA_MPS_PROTOCOL_VERSION=3)"
                ));
            }
            Err(format!(
                "`{module} {verb}` is well formed, but omps does not carry out MPS v3 commands yet \
                 (issue 26); the legacy command that does this: {}",
                legacy_equivalent(module, verb)
            ))
        }
    }
}
