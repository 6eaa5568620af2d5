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
    if cli.daemon && multiuser::wanted() {
        return exit(multiuser::start_background().map(|()| true));
    }
    if cli.foreground && multiuser::wanted() {
        return exit(match multiuser::run_foreground() {
            e if e.is_empty() => Ok(true),
            e => Err(e),
        });
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
        Some(Cmd::Server(words)) => exit(talk::send(&[words.join(" ")])),
        None => {
            let lines: Vec<String> = std::io::stdin()
                .lock()
                .lines()
                .map_while(Result::ok)
                .collect();
            exit(talk::send(&lines))
        }
    }
}
