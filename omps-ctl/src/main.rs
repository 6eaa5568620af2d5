//! omps-ctl: the omps server's control program, a drop-in for nvidia-cuda-mps-control.
//!
//! `omps-ctl -d` starts the server in the background, `-f` in the foreground (with
//! OMPS_MULTIUSER=1, as root: a daemon that starts one server per user, `multiuser`). With a
//! command (`omps-ctl ps`) it sends that one; with none it reads commands from standard
//! input, one per line (`echo ps | omps-ctl`), as MPS's does. `omps-ctl run -- CMD ARGS...`
//! starts a server if none runs and runs CMD with the shim preloaded.

mod daemon;
mod multiuser;
mod talk;
mod top;
mod v3;

use clap::{ArgAction, Parser, Subcommand};
use std::io::BufRead;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Parser)]
#[command(
    version,
    disable_version_flag = true,
    about = "Control the omps server (drop-in for nvidia-cuda-mps-control)",
    after_help = "Commands (as arguments or one per line on standard input): status, ps [-p PID], \
get_server_list, get_server_status PID, start_server -uid UID, shutdown_server PID [-f], \
get_client_list [PID], get_device_client_list [PID], terminate_client SERVER_PID CLIENT_PID, \
device_query [--csv], quit [-t SECONDS], set/get_default_active_thread_percentage, \
set/get_active_thread_percentage, set/get_default_client_priority, set/get_client_qos, \
set/get_default_device_pinned_mem_limit, set/get_device_pinned_mem_limit, sm_partition, \
lspart, stats, metrics; and `omps-ctl top` for a live view."
)]
struct Cli {
    /// Start the server in the background (as `nvidia-cuda-mps-control -d`).
    #[arg(short = 'd', conflicts_with = "foreground")]
    daemon: bool,
    /// Run the server in the foreground (as `nvidia-cuda-mps-control -f`).
    #[arg(short = 'f')]
    foreground: bool,
    /// Print the version.
    #[arg(short = 'v', long = "version", action = ArgAction::Version)]
    version: Option<bool>,
    /// MPS protocol: 2 (legacy, the default) or 3 (MPS v3's `module verb` commands);
    /// CUDA_MPS_PROTOCOL_VERSION wins over it, and a running daemon's protocol over both.
    #[arg(short = 'p', long = "protocol")]
    protocol: Option<String>,
    /// With -d or -f: an MPS v3 configuration file (TOML), checked whole before anything
    /// starts.
    #[arg(short = 'a', long = "apply")]
    apply: Option<std::path::PathBuf>,
    /// Stop the daemon and every server (as `quit`).
    #[arg(short = 'q', long = "quit")]
    quit: bool,
    /// Multi-user mode (as OMPS_MULTIUSER=1).
    #[arg(short = 'm', long = "multiuser")]
    multiuser: bool,
    #[command(subcommand)]
    cmd: Option<Cmd>,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a CUDA program through omps, starting a server for the pipe directory if needed.
    Run {
        #[arg(trailing_var_arg = true, required = true, allow_hyphen_values = true)]
        argv: Vec<String>,
    },
    /// A live view: a row per client, a line per GPU (q quits).
    Top {
        /// Print one frame as text and exit.
        #[arg(long)]
        once: bool,
        /// Seconds between samples.
        #[arg(long, default_value_t = 1.0)]
        interval: f64,
    },
    /// Any server command: status, ps, quit, get_server_list, get_client_list...
    #[command(external_subcommand)]
    Server(Vec<String>),
}

fn exit(r: Result<bool, String>) -> ExitCode {
    match r {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("omps-ctl: {e}");
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let env_protocol = std::env::var("CUDA_MPS_PROTOCOL_VERSION").ok();
    let asked = match v3::protocol::asked(cli.protocol.as_deref(), env_protocol.as_deref()) {
        Ok(p) => p,
        Err(e) => return exit(Err(e)),
    };
    let operator_dir = omps_ring::sock::pipe_directory().join(omps_ring::sock::OPERATOR_DIR);
    if cli.multiuser {
        // SAFETY: single-threaded here, before anything reads the environment concurrently.
        unsafe { std::env::set_var("OMPS_MULTIUSER", "1") };
    }
    let plan = match &cli.apply {
        Some(_) if !(cli.daemon || cli.foreground) => {
            return exit(Err("-a FILE goes with -d or -f".into()))
        }
        Some(_) if multiuser::wanted() => {
            return exit(Err(
                "-a FILE with the multi-user daemon: not yet (a file per user's server)".into(),
            ))
        }
        // Checked whole before anything starts.
        Some(file) => match v3::config::load(file) {
            Ok(plan) => Some((file.clone(), plan)),
            Err(e) => return exit(Err(e)),
        },
        None => None,
    };
    if cli.quit {
        return exit(talk::send(&["quit".to_string()]));
    }
    if cli.daemon || cli.foreground {
        // SAFETY: single-threaded here; the server started below inherits it.
        unsafe { std::env::set_var("OMPS_PROTOCOL", asked.to_string()) };
    }
    // A protocol file left by a daemon that is gone is not followed.
    let protocol = match talk::server_running() {
        true => v3::protocol::of_daemon(&operator_dir).unwrap_or(asked),
        false => asked,
    };
    if (cli.daemon || cli.foreground) && cli.apply.is_none() && !talk::server_running() {
        // Notes of a configuration an earlier daemon applied are not this one's.
        let _ = std::fs::remove_file(v3::apply::notes_path(&omps_ring::sock::pipe_directory()));
    }
    if cli.daemon && multiuser::wanted() {
        return exit(multiuser::start_background().map(|()| true));
    }
    if cli.foreground && multiuser::wanted() {
        return exit(match multiuser::run_foreground() {
            e if e.is_empty() => Ok(true),
            e => Err(e),
        });
    }
    if let Some((file, plan)) = plan {
        for (k, v) in v3::apply::default_env(&plan) {
            // SAFETY: single-threaded here; the server started below inherits it.
            unsafe { std::env::set_var(k, v) };
        }
        let applied = |plan: &v3::config::Plan| {
            v3::apply::apply(plan, true).map_err(|e| {
                let _ = talk::send(&["quit".to_string()]);
                format!(
                    "{}: {e}; the server was stopped, nothing is left configured",
                    file.display()
                )
            })
        };
        if cli.daemon {
            return exit(
                daemon::start_background()
                    .and_then(|()| applied(&plan))
                    .map(|()| true),
            );
        }
        return exit(daemon::run_foreground_then(|| applied(&plan)).map(|()| true));
    }
    if cli.daemon {
        return exit(daemon::start_background().map(|()| true));
    }
    if cli.foreground {
        return exit(Err(daemon::run_foreground()));
    }
    match cli.cmd {
        Some(Cmd::Run { argv }) => exit(Err(daemon::run_program(&argv))),
        Some(Cmd::Top { once: true, .. }) => exit(top::once(120).map(|t| {
            print!("{t}");
            true
        })),
        Some(Cmd::Top { interval, .. }) => {
            exit(top::run(Duration::from_secs_f64(interval.clamp(0.1, 60.0))).map(|()| true))
        }
        Some(Cmd::Server(words)) if v3::verbs::is_v3(&words[0]) => exit(v3::run(protocol, &words)),
        Some(Cmd::Server(words))
            if words[0] == "get_server_status" && protocol == v3::protocol::V3 =>
        {
            let r = talk::send(&[words.join(" ")]);
            // What an applied configuration asked for with no effect in omps, said where
            // an operator looks for the server's state.
            let notes = v3::apply::notes_path(&omps_ring::sock::pipe_directory());
            if let (Ok(true), Ok(text)) = (&r, std::fs::read_to_string(notes)) {
                print!("{text}");
            }
            exit(r)
        }
        Some(Cmd::Server(words)) => exit(talk::send(&[words.join(" ")])),
        None => {
            let lines: Vec<String> = std::io::stdin()
                .lock()
                .lines()
                .map_while(Result::ok)
                .collect();
            if !lines
                .iter()
                .any(|l| l.split_whitespace().next().is_some_and(v3::verbs::is_v3))
            {
                return exit(talk::send(&lines));
            }
            // v3 and legacy lines mixed: each in turn, as a script runs them.
            let mut all = Ok(true);
            for l in lines.iter().filter(|l| !l.trim().is_empty()) {
                let words: Vec<String> = l.split_whitespace().map(String::from).collect();
                let r = match v3::verbs::is_v3(&words[0]) {
                    true => v3::run(protocol, &words),
                    false => talk::send(std::slice::from_ref(l)),
                };
                all = match (all, r) {
                    (Err(e), _) => Err(e),
                    (Ok(a), Ok(b)) => Ok(a && b),
                    (Ok(_), Err(e)) => {
                        eprintln!("omps-ctl: {e}");
                        Ok(false)
                    }
                };
            }
            exit(all)
        }
    }
}
