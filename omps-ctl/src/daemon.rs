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
    pub fn run(&self, cmd: Command, ready: impl Fn() -> bool) -> Result<Child, String> {
        self.run_then(cmd, ready, |_| {})
    }

    /// As [`Starting::run`], telling `spawned` the child's PID as soon as it runs.
    pub fn run_then(
        &self,
        mut cmd: Command,
        ready: impl Fn() -> bool,
        spawned: impl FnOnce(u32),
    ) -> Result<Child, String> {
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", self.program.display()))?;
        spawned(child.id());
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
/// terminal, in a process group of its own so that a terminal's Ctrl-C reaches it once,
/// through this process), makes `setup` once it listens, and waits for it; a failed
/// setup stops it. SIGTERM and SIGINT to this process go on to the server. Ok when the
/// server ended with status 0.
pub fn run_foreground_then(setup: impl FnOnce() -> Result<(), String>) -> Result<(), String> {
    if server_running() {
        return Err("An instance of this daemon is already running".into());
    }
    forward_stop_signals();
    let server = server_binary();
    let mut cmd = server_command();
    // SAFETY: setpgid is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::setpgid(0, 0);
            Ok(())
        });
    }
    let mut child = Starting {
        what: "omps-server",
        program: &server,
        hint: "",
        limit: Duration::from_secs(30),
        kill_late: true,
    }
    .run_then(cmd, server_running, child_started)?;
    if let Err(e) = setup() {
        let _ = child.wait();
        return Err(e);
    }
    match child.wait() {
        Ok(st) if st.success() => Ok(()),
        Ok(st) => Err(format!("omps-server ended ({st})")),
        Err(e) => Err(format!("waiting for omps-server: {e}")),
    }
}

/// The server child that [`forward`] passes SIGTERM and SIGINT on to.
static CHILD: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// A signal that came before the child ran, for [`child_started`] to pass on.
static PENDING: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

extern "C" fn forward(sig: libc::c_int) {
    let pid = CHILD.load(std::sync::atomic::Ordering::SeqCst);
    if pid > 0 {
        // SAFETY: kill is async-signal-safe; pid is our own child's.
        unsafe { libc::kill(pid, sig) };
    } else {
        PENDING.store(sig, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The server child runs as `pid`: signals go to it from now on, and one that came
/// while it was being started goes to it now.
fn child_started(pid: u32) {
    CHILD.store(pid as i32, std::sync::atomic::Ordering::SeqCst);
    let sig = PENDING.swap(0, std::sync::atomic::Ordering::SeqCst);
    if sig != 0 {
        // SAFETY: kill takes plain integers; pid is our own child's.
        unsafe { libc::kill(pid as i32, sig) };
    }
}

/// A container stops its first process with SIGTERM (which, as PID 1 with no handler, it
/// would ignore): the server, a child here, must get it as it does under `-f`. Set before
/// the child starts, so that no signal falls between; [`CHILD`] names it once it runs.
fn forward_stop_signals() {
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
