//! omps-ctl: talks to the omps server of a pipe directory, like nvidia-cuda-mps-control.
//!
//! `omps-ctl status|ps|quit|...` sends one command; with no command it reads commands from
//! standard input, one per line (`echo ps | omps-ctl`). `omps-ctl run -- CMD ARGS...`
//! starts a server if none runs and runs CMD with the shim preloaded.

use clap::{Parser, Subcommand};
use omps_ring::sock;
use omps_ring::wire::{self, Hello};
use std::io::{BufRead, Write};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(
    version,
    about = "Control the omps server (drop-in for nvidia-cuda-mps-control)"
)]
struct Cli {
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
    /// Any server command: status, ps, quit, get_server_list, get_client_list...
    #[command(external_subcommand)]
    Server(Vec<String>),
}

fn connect() -> Result<UnixStream, String> {
    let dir = sock::pipe_directory();
    let s = UnixStream::connect(dir.join(sock::SOCKET_NAME)).map_err(|e| {
        format!(
            "no omps server is running for pipe directory {} ({e})",
            dir.display()
        )
    })?;
    let hello = Hello {
        magic: wire::HELLO_MAGIC,
        version: wire::PROTOCOL_VERSION,
        kind: wire::kind::CONTROL,
    };
    (&s).write_all(bytemuck::bytes_of(&hello))
        .map_err(|e| format!("talking to the server: {e}"))?;
    Ok(s)
}

/// Sends each command in turn; prints replies. Fails if any command failed.
fn send(commands: &[String]) -> Result<bool, String> {
    let s = connect()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok();
    let mut all_ok = true;
    for c in commands.iter().filter(|c| !c.trim().is_empty()) {
        sock::write_frame(&mut &s, c.as_bytes()).map_err(|e| format!("sending '{c}': {e}"))?;
        let reply = sock::read_frame(&mut &s, 16 << 20)
            .map_err(|e| format!("reading the reply to '{c}': {e}"))?
            .ok_or_else(|| format!("the server closed the connection after '{c}'"))?;
        let (status, text) = reply.split_first().ok_or("empty reply")?;
        let text = String::from_utf8_lossy(text);
        if *status == 0 {
            print!("{text}");
        } else {
            eprint!("omps-ctl: {text}");
            all_ok = false;
        }
    }
    Ok(all_ok)
}

fn sibling(name: &str) -> Option<PathBuf> {
    let p = std::env::current_exe().ok()?.parent()?.join(name);
    p.exists().then_some(p)
}

fn run(argv: &[String]) -> Result<ExitCode, String> {
    if connect().is_err() {
        let server = std::env::var_os("OMPS_SERVER")
            .map(PathBuf::from)
            .or_else(|| sibling("omps-server"))
            .unwrap_or_else(|| "omps-server".into());
        eprintln!(
            "omps-ctl: starting {} for pipe directory {}",
            server.display(),
            sock::pipe_directory().display()
        );
        let mut cmd = Command::new(&server);
        cmd.stdin(Stdio::null()).env_remove("LD_PRELOAD");
        // SAFETY: setsid is async-signal-safe; the server outlives this program like a daemon.
        unsafe {
            cmd.pre_exec(|| {
                libc::setsid();
                Ok(())
            });
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", server.display()))?;
        let t = Instant::now();
        while connect().is_err() {
            if let Ok(Some(st)) = child.try_wait() {
                return Err(format!(
                    "omps-server exited at start ({st}); see its message above"
                ));
            }
            if t.elapsed() > Duration::from_secs(30) {
                return Err("omps-server did not start listening within 30 s".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let shim = std::env::var_os("OMPS_SHIM")
        .map(PathBuf::from)
        .or_else(|| sibling("libomps_shim.so"))
        .ok_or("libomps_shim.so not found next to omps-ctl (set OMPS_SHIM)")?;
    let preload = match std::env::var("LD_PRELOAD") {
        Ok(p) if !p.is_empty() => format!("{}:{p}", shim.display()),
        _ => shim.display().to_string(),
    };
    let err = Command::new(&argv[0])
        .args(&argv[1..])
        .env("LD_PRELOAD", preload)
        .exec();
    Err(format!("cannot run {}: {err}", argv[0]))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.cmd {
        Some(Cmd::Run { argv }) => run(&argv),
        Some(Cmd::Server(words)) => send(&[words.join(" ")]).map(|ok| {
            if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }),
        None => {
            let lines: Vec<String> = std::io::stdin()
                .lock()
                .lines()
                .map_while(Result::ok)
                .collect();
            send(&lines).map(|ok| {
                if ok {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::FAILURE
                }
            })
        }
    };
    result.unwrap_or_else(|e| {
        eprintln!("omps-ctl: {e}");
        ExitCode::FAILURE
    })
}
