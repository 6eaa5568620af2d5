//! omps-ctl as a drop-in for nvidia-cuda-mps-control: commands on standard input and on
//! argv, MPS's formats, failures that name what was wrong, control.log, and `quit` that
//! returns once the server is gone. The server runs in this process on the host GPU.

use omps_server::gpu::Gpu;
use omps_server::gpu_host::HostGpu;
use omps_server::{Server, ServerConfig};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

fn start(dir: &Path) -> std::thread::JoinHandle<()> {
    let cfg = ServerConfig {
        default_mem_limit: Some("0=4G".into()),
        ..ServerConfig::minimal(dir.to_path_buf())
    };
    let gpu: Arc<dyn Gpu> = Arc::new(HostGpu::new(0, 1 << 30));
    let server = Server::new(cfg, vec![gpu], 13000).expect("server starts");
    std::thread::spawn(move || server.run().expect("server runs"))
}

/// omps-ctl with `args`, `stdin` fed in: (exit status ok, stdout, stderr).
fn ctl(dir: &Path, logs: &Path, args: &[&str], stdin: &str) -> (bool, String, String) {
    let mut p = Command::new(env!("CARGO_BIN_EXE_omps-ctl"))
        .args(args)
        .env("CUDA_MPS_PIPE_DIRECTORY", dir)
        .env("CUDA_MPS_LOG_DIRECTORY", logs)
        .env_remove("OMPS_PIPE_DIRECTORY")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("omps-ctl runs");
    p.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    let out = p.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn an_mps_script_runs_unchanged() {
    let base = std::env::temp_dir().join(format!("omps-ctl-script-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let (dir, logs): (PathBuf, PathBuf) = (base.join("pipe"), base.join("log"));
    // SAFETY: set before the server (in this process) starts threads that read it.
    unsafe { std::env::set_var("CUDA_MPS_LOG_DIRECTORY", &logs) };
    let server = start(&dir);
    let me = std::process::id().to_string();
    let pid_file = dir.join("nvidia-cuda-mps-control.pid");
    assert_eq!(
        std::fs::read_to_string(&pid_file).unwrap(),
        format!("{me}\n")
    );

    // As MPS scripts talk to the daemon: a command per line on standard input.
    let (ok, out, err) = ctl(&dir, &logs, &[], "get_server_list\n");
    assert!(ok, "{err}");
    assert_eq!(out, format!("{me}\n"));
    let script =
        "set_default_device_pinned_mem_limit 0 2G\nget_default_device_pinned_mem_limit 0\n\
                  set_default_active_thread_percentage 50\nget_default_active_thread_percentage\n\
                  get_server_status ME\nget_client_list ME\n\
                  get_active_thread_percentage ME\nget_device_pinned_mem_limit ME 0\n"
            .replace("ME", &me);
    let (ok, out, err) = ctl(&dir, &logs, &[], &script);
    assert!(ok, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    // The server's PID names the server, as under MPS, with no client connected.
    assert_eq!(
        lines,
        ["2G", "50.0", "50.0", "ACTIVE", "50.0", "2G"],
        "{out}"
    );
    // And on argv.
    let (ok, out, _) = ctl(&dir, &logs, &["ps"], "");
    assert!(ok);
    // MPS's columns at its widths (as its daemon printed them on the H100), then omps's.
    assert!(
        out.starts_with(
            "PID       ID        SERVER         DEVICE                    NAMESPACE      COMMAND        MEM_BYTES"
        ),
        "{out}"
    );
    let (ok, out, _) = ctl(&dir, &logs, &["device_query"], "");
    assert!(ok);
    assert!(
        out.starts_with(
            "Default\nDevice Ordinal  PCI IDs        UUID                                      Name                              Attributes\n0               "
        ),
        "{out}"
    );
    assert!(out.contains(&format!("N/A\n\nServer {me}\n")), "{out}");
    // -p names a server, as under MPS.
    let (ok, out, err) = ctl(&dir, &logs, &["ps", "-p", &me], "");
    assert!(ok && out.starts_with("PID "), "{err}");
    let (ok, out, _) = ctl(&dir, &logs, &["get_device_client_list"], "");
    assert!(ok);
    assert!(
        out.starts_with("[0] ") && out.ends_with(", omps host test device 0\n"),
        "{out}"
    );
    // A failure names what was wrong, and the exit status says so.
    for (cmd, says) in [
        ("get_server_status 1", "no server with PID 1"),
        ("set_default_device_pinned_mem_limit 0 lots", "not a size"),
        ("frobnicate", "unknown or malformed command 'frobnicate'"),
        ("shutdown_server 1", "no server with PID 1"),
        ("ps -p 1", "no server or client with PID 1"),
    ] {
        let (ok, _, err) = ctl(&dir, &logs, &cmd.split(' ').collect::<Vec<_>>(), "");
        assert!(!ok && err.contains(says), "{cmd}: {err}");
    }
    // The live view, one frame.
    let (ok, out, err) = ctl(&dir, &logs, &["top", "--once"], "");
    assert!(ok, "{err}");
    assert!(
        out.contains("GPU 0 ACTIVE  omps host test device 0"),
        "{out}"
    );
    assert!(
        out.contains("LAUNCH/S") && out.contains(" 0 clients "),
        "{out}"
    );
    let (ok, _, err) = ctl(&dir, &logs, &["-d"], "");
    assert!(!ok && err.contains("already running"), "{err}");
    // quit returns once the server has gone (a deadline past any clock is none).
    let (ok, _, err) = ctl(&dir, &logs, &[], "quit -t 18446744073709551615\n");
    assert!(ok, "{err}");
    assert!(
        !dir.join(omps_ring::sock::SOCKET_NAME).exists(),
        "the socket outlived quit"
    );
    server.join().unwrap();
    assert!(!pid_file.exists(), "the PID file outlived quit");
    let (ok, _, err) = ctl(&dir, &logs, &["ps"], "");
    assert!(!ok && err.contains("no omps server is running"), "{err}");
    // control.log: the commands and their answers.
    let log = std::fs::read_to_string(logs.join("control.log")).unwrap();
    assert!(
        log.contains("] Cmd:set_default_device_pinned_mem_limit 0 2G\n"),
        "{log}"
    );
    assert!(log.contains("] Cmd:get_server_list\n"), "{log}");
    assert!(log.contains(&format!("] {me}\n")), "{log}");
    assert!(
        log.contains("] Failed: get_server_status: no server with PID 1"),
        "{log}"
    );
    assert!(log.contains("] Server exited\n"), "{log}");
    let _ = std::fs::remove_dir_all(&base);
}
