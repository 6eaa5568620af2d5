//! A server's log files are its user's to place: a FIFO (or a symlink) named server.log or
//! control.log in its log directory must not hold up its start. Under a root control
//! daemon a start that hangs held up other users' first connections (issue 23, finding
//! 16). The server runs here as a program, without a GPU: it gets past its logs and then
//! fails at the driver (or serves, where one is present).

use std::os::unix::net::UnixStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn a_fifo_for_a_log_file_does_not_hold_up_the_start() {
    let base = std::env::temp_dir().join(format!("omps-log-fifo-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let (pipe, log) = (base.join("pipe"), base.join("log"));
    std::fs::create_dir_all(&log).unwrap();
    for name in ["server.log", "control.log"] {
        let c = std::ffi::CString::new(log.join(name).to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    }
    let mut server = Command::new(env!("CARGO_BIN_EXE_omps-server"))
        .env("OMPS_PIPE_DIRECTORY", &pipe)
        .env("OMPS_LOG_DIRECTORY", &log)
        .env_remove("CUDA_MPS_PIPE_DIRECTORY")
        .env_remove("CUDA_MPS_LOG_DIRECTORY")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t = Instant::now();
    let mut done = false;
    while t.elapsed() < Duration::from_secs(10) {
        if server.try_wait().unwrap().is_some()
            || UnixStream::connect(pipe.join("omps.sock")).is_ok()
        {
            done = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = server.kill();
    let out = server.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(done, "the server hung at start on a FIFO log file: {err}");
    assert!(
        err.contains("server.log"),
        "no word of the refused server.log: {err}"
    );
    let _ = std::fs::remove_dir_all(&base);
}
