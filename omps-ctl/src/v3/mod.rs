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
//! - [`apply`]: `-a FILE` made on the server, and `config save FILE` writing it back.
//! - [`state`], [`exec`], [`table`]: what the server has, read through its own commands;
//!   each verb carried out with them; lists printed as v3 prints them.
//!
//! The facts behind the forms (names `[a-z0-9_]` up to 64 characters, sizes with binary
//! K/M/G units, percentages 1-100, which keys a table takes) are NVIDIA's documentation of
//! MPS v3; where it is silent the module says what omps chose.

pub mod apply;
pub mod config;
pub mod exec;
pub mod protocol;
pub mod state;
pub mod table;
pub mod values;
pub mod verbs;

use verbs::Command;

/// Runs one MPS v3 command line: checked whole, refused with the word that was wrong;
/// carried out on the server only under protocol 3 (as MPS's legacy daemon knows no v3).
pub fn run(protocol: u8, words: &[String]) -> Result<bool, String> {
    match verbs::parse(words)? {
        Command::Help(h) => {
            print!("{h}");
            Ok(true)
        }
        Command::Run {
            module,
            verb,
            args,
            opts,
        } => {
            if protocol != protocol::V3 {
                return Err(format!(
                    "`{module} {verb}` is MPS v3 syntax and this daemon speaks protocol 2: start it \
                     with -p 3 (or CUDA_MPS_PROTOCOL_VERSION=3)"
                ));
            }
            let out = exec::run(module, verb, &args, &opts)?;
            print!("{out}");
            Ok(true)
        }
    }
}
