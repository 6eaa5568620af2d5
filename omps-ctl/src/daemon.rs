//! Starting the server as MPS's control daemon starts: `-d` in the background, `-f` in the
//! foreground, and on demand for `omps-ctl run`.

use crate::talk::server_running;
use omps_ring::sock;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The omps-server next to this program (or OMPS_SERVER, or on PATH).
pub fn server_binary() -> PathBuf {
    std::env::var_os("OMPS_SERVER")
        .map(PathBuf::from)
        .or_else(|| sibling("omps-server"))
        .unwrap_or_else(|| "omps-server".into())
}

pub fn sibling(name: &str) -> Option<PathBuf> {
    let p = std::env::current_exe().ok()?.parent()?.join(name);
    p.exists().then_some(p)
}

fn server_command() -> Command {
    let mut cmd = Command::new(server_binary());
    cmd.stdin(Stdio::null()).env_remove("LD_PRELOAD");
    cmd
}

/// `-d`: starts the server in its own session, detached from this terminal, and returns
/// once it listens. Its messages go to server.log in the log directory (or nowhere).
pub fn start_background() -> Result<(), String> {
    if server_running() {
        return Err(format!(
            "An instance of this daemon is already running (pipe directory {})",
            sock::pipe_directory().display()
        ));
    }
    let mut cmd = server_command();
    cmd.stdout(Stdio::null()).stderr(Stdio::null());
    // SAFETY: setsid is async-signal-safe; the server outlives this program as a daemon.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    wait_listening(cmd)
}

/// Starts a server for `omps-ctl run` if none answers, telling the user on stderr.
pub fn ensure_running() -> Result<(), String> {
    if server_running() {
        return Ok(());
    }
    eprintln!(
        "omps-ctl: starting {} for pipe directory {}",
        server_binary().display(),
        sock::pipe_directory().display()
    );
    let mut cmd = server_command();
    // SAFETY: as in start_background.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    wait_listening(cmd)
}

fn wait_listening(cmd: Command) -> Result<(), String> {
    let server = server_binary();
    Starting {
        what: "omps-server",
        program: &server,
        hint: "; see server.log in the log directory, or run `omps-ctl -f` to see why",
        limit: Duration::from_secs(30),
        kill_late: false,
    }
    .run(cmd, server_running)
    .map(drop)
}

/// A program started to serve, and how long it has to start answering.
pub struct Starting<'a> {
    /// Its name in messages.
    pub what: &'a str,
    pub program: &'a std::path::Path,
    /// Added to the message when it exits at start.
    pub hint: &'a str,
    pub limit: Duration,
    /// Whether one that is not answering by the limit is killed.
    pub kill_late: bool,
}

impl Starting<'_> {
    /// Spawns `cmd` and waits until `ready`: the running child, or why not.
    pub fn run(&self, mut cmd: Command, ready: impl Fn() -> bool) -> Result<Child, String> {
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", self.program.display()))?;
        let t = Instant::now();
        while !ready() {
            if let Ok(Some(st)) = child.try_wait() {
                return Err(format!("{} exited at start ({st}){}", self.what, self.hint));
            }
            if t.elapsed() > self.limit {
                if self.kill_late {
                    let _ = child.kill();
                }
                return Err(format!(
                    "{} did not start listening within {} s",
                    self.what,
                    self.limit.as_secs()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(child)
    }
}

/// `-f -a FILE`: runs the server in the foreground as a child (its output on this
/// terminal), makes `setup` once it listens, and waits for it; a failed setup stops it.
pub fn run_foreground_then(setup: impl FnOnce() -> Result<(), String>) -> String {
    if server_running() {
        return "An instance of this daemon is already running".into();
    }
    let server = server_binary();
    let started = Starting {
        what: "omps-server",
        program: &server,
        hint: "",
        limit: Duration::from_secs(30),
        kill_late: true,
    }
    .run(server_command(), server_running);
    let mut child = match started {
        Ok(c) => c,
        Err(e) => return e,
    };
    forward_stop_signals(child.id());
    if let Err(e) = setup() {
        let _ = child.wait();
        return e;
    }
    match child.wait() {
        Ok(st) => format!("omps-server ended ({st})"),
        Err(e) => format!("waiting for omps-server: {e}"),
    }
}

/// The server child that [`forward`] passes SIGTERM and SIGINT on to.
static CHILD: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

extern "C" fn forward(sig: libc::c_int) {
    let pid = CHILD.load(std::sync::atomic::Ordering::Relaxed);
    if pid > 0 {
        // SAFETY: kill is async-signal-safe; pid is our own child's.
        unsafe { libc::kill(pid, sig) };
    }
}

/// A container stops its first process with SIGTERM (which, as PID 1 with no handler, it
/// would ignore): the server, a child here, must get it and quit as it does under `-f`.
fn forward_stop_signals(child: u32) {
    CHILD.store(child as i32, std::sync::atomic::Ordering::Relaxed);
    for sig in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: `forward` only reads an atomic and calls kill, both async-signal-safe.
        unsafe { libc::signal(sig, forward as *const () as libc::sighandler_t) };
    }
}

/// `-f`: becomes the server, in the foreground.
pub fn run_foreground() -> String {
    if server_running() {
        return "An instance of this daemon is already running".into();
    }
    let err = server_command().exec();
    format!("cannot run {}: {err}", server_binary().display())
}

/// `omps-ctl run -- PROGRAM ARGS`: the program, with the shim preloaded.
pub fn run_program(argv: &[String]) -> String {
    if let Err(e) = ensure_running() {
        return e;
    }
    let Some(shim) = std::env::var_os("OMPS_SHIM")
        .map(PathBuf::from)
        .or_else(|| sibling("libomps_shim.so"))
    else {
        return "libomps_shim.so not found next to omps-ctl (set OMPS_SHIM)".into();
    };
    let preload = match std::env::var("LD_PRELOAD") {
        Ok(p) if !p.is_empty() => format!("{}:{p}", shim.display()),
        _ => shim.display().to_string(),
    };
    let err = Command::new(&argv[0])
        .args(&argv[1..])
        .env("LD_PRELOAD", preload)
        .exec();
    format!("cannot run {}: {err}", argv[0])
}
