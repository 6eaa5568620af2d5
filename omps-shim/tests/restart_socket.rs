//! Clients that arrive back to back while a faulted server restarts itself (exec, same
//! PID). On the H200 a run of CUDA samples lost every client after a device assert: each
//! came while the socket file was gone and failed with "No such file or directory". Here
//! the server is a real process on the host GPU (this test program, run again as
//! `restart_server_process`), whose resets fail, so that it restarts by exec exactly as
//! omps-server does; clients connect in a loop with no pause throughout the fault and the
//! restart. Each must be refused with CUDA_ERROR_MPS_SERVER_NOT_READY or served, and the
//! socket file must be there at every moment.

mod common;
use common::*;
use omps_shim::conn::{settings_from, Conn};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const SERVE_DIR: &str = "OMPS_TEST_SERVE_DIR";
/// How long the server process takes to "open its GPUs" (the H100 and H200 take about a
/// second to init the driver and make their contexts), so that the restart has a window.
const START_DELAY: Duration = Duration::from_millis(400);
const NOT_READY: i32 = 807;

/// The server process: what omps-server's main does, on a host GPU whose resets fail.
/// Run only as the child of the test below (it sets SERVE_DIR); it returns when the
/// server quits.
#[test]
#[ignore = "the server process of clients_arriving_during_a_restart_are_refused_or_served"]
fn restart_server_process() {
    let Some(dir) = std::env::var_os(SERVE_DIR).map(PathBuf::from) else {
        return;
    };
    let starts_file = dir.with_extension("starts");
    let open = move || {
        let mut starts = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&starts_file)
            .expect("starts file");
        std::io::Write::write_all(&mut starts, format!("{}\n", std::process::id()).as_bytes())
            .expect("starts file");
        std::thread::sleep(START_DELAY);
        let gpu = omps_server::gpu_host::HostGpu::new(0, 1 << 28);
        gpu.fail_resets(true);
        Ok::<_, String>((vec![Arc::new(gpu) as Arc<dyn omps_server::gpu::Gpu>], 13000))
    };
    let code = omps_server::restart::serve(omps_server::ServerConfig::minimal(dir), open);
    assert_eq!(code, std::process::ExitCode::SUCCESS);
}

/// Kills the server process when the test ends, however it ends.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_server(dir: &Path) -> Child {
    let exe = std::env::current_exe().expect("own path");
    Child(
        std::process::Command::new(exe)
            .args([
                "restart_server_process",
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(SERVE_DIR, dir)
            .stdin(std::process::Stdio::null())
            .spawn()
            .expect("server process starts"),
    )
}

/// What the clients that arrived one after another met.
#[derive(Default)]
struct Seen {
    /// Refused with NOT_READY by the faulted server, and while the new process started.
    refused: u32,
    refused_starting: u32,
    /// Served once the new process was up.
    served_after: u32,
    /// What else happened to a client (none may).
    bad: Vec<String>,
    /// A second server's attempt to take the pipe directory during the restart.
    second_server: Option<std::io::Result<()>>,
}

fn client(sock: &Path) -> Result<Conn, (i32, String)> {
    Conn::connect_with(sock, &settings_from(|_| None).unwrap())
}

fn starts(dir: &Path) -> Vec<u32> {
    std::fs::read_to_string(dir.with_extension("starts"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

#[test]
fn clients_arriving_during_a_restart_are_refused_or_served() {
    let dir = temp_dir("restart-socket");
    let _ = std::fs::remove_file(dir.with_extension("starts"));
    let sock = dir.join(omps_ring::sock::SOCKET_NAME);
    let mut server = start_server(&dir);
    let t = Instant::now();
    let culprit = loop {
        match client(&sock) {
            Ok(c) => break c,
            Err(e) => {
                assert!(
                    t.elapsed() < Duration::from_secs(20),
                    "server never served: {e:?}"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    };
    // From here on the socket file must always be there.
    let stop = Arc::new(AtomicBool::new(false));
    let missing = Arc::new(AtomicU64::new(0));
    let watcher = {
        let (stop, missing, sock) = (stop.clone(), missing.clone(), sock.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if std::fs::symlink_metadata(&sock).is_err() {
                    missing.fetch_add(1, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_micros(200));
            }
        })
    };
    launch_trap(&culprit);
    assert!(sync_default_stream(&culprit).is_err(), "the fault surfaces");
    // Clients come back to back from now on, through the fault, the end of the faulted
    // server, the exec and the new process's start.
    let arrivals = {
        let (dir, sock) = (dir.clone(), sock.clone());
        std::thread::spawn(move || {
            let mut seen = Seen::default();
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(20) && seen.served_after < 30 {
                // The new process is under way (its doorman answers) once it wrote its start.
                let restarted = starts(&dir).len() >= 2;
                if restarted && seen.served_after == 0 && seen.second_server.is_none() {
                    // A second server started now must fail, and take nothing.
                    seen.second_server = Some(omps_server::listen::lock(&dir).map(drop));
                }
                match client(&sock) {
                    Ok(c) => match c.ping(0) {
                        Ok(()) if restarted => seen.served_after += 1,
                        Ok(()) => seen.bad.push("served by the faulted server".to_string()),
                        Err(e) => seen
                            .bad
                            .push(format!("accepted, then a call failed with {e}")),
                    },
                    Err((NOT_READY, _)) if restarted => seen.refused_starting += 1,
                    Err((NOT_READY, _)) => seen.refused += 1,
                    Err((code, why)) => {
                        let at = t.elapsed().as_secs_f64();
                        seen.bad.push(format!("{at:.3}s: {code}: {why}"))
                    }
                }
            }
            seen
        })
    };
    // A program's first call arriving now waits for the new process (as an MPS client
    // waits for its server) and is served by it, where a bare handshake is refused.
    let patient = {
        let (dir, sock) = (dir.clone(), sock.clone());
        std::thread::spawn(move || {
            let c = omps_shim::conn::connect_waiting(&sock, Duration::from_secs(20))?;
            let by_new = starts(&dir).len() >= 2;
            c.ping(0).map_err(|e| (e, "ping".to_string()))?;
            Ok::<bool, (i32, String)>(by_new)
        })
    };
    std::thread::sleep(Duration::from_millis(50));
    drop(culprit);
    let seen = arrivals.join().unwrap();
    assert_eq!(
        patient.join().unwrap(),
        Ok(true),
        "a waiting client is served by the restarted server"
    );
    stop.store(true, Ordering::Relaxed);
    watcher.join().unwrap();
    let pid = server.0.id();
    assert!(
        server.0.try_wait().unwrap().is_none(),
        "the server process ended"
    );
    assert_eq!(
        starts(&dir),
        vec![pid, pid],
        "one restart, by exec (same PID)"
    );
    let bad = &seen.bad;
    assert!(
        bad.is_empty(),
        "{} clients neither refused with {NOT_READY} nor served, the first: {:?}",
        bad.len(),
        &bad[..bad.len().min(5)]
    );
    assert_eq!(
        missing.load(Ordering::Relaxed),
        0,
        "the socket file was missing during the restart"
    );
    assert!(seen.refused > 0, "no client arrived during the fault");
    assert!(
        seen.refused_starting > 0,
        "no client arrived while the new process started"
    );
    assert_eq!(
        seen.served_after, 30,
        "clients after the restart were not served"
    );
    match seen.second_server {
        Some(Err(e)) => assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse, "{e}"),
        other => panic!("a second server during the restart: {other:?}"),
    }
    assert_eq!(
        std::fs::read_to_string(dir.join(omps_ring::sock::PID_FILE))
            .unwrap()
            .trim(),
        pid.to_string(),
        "the PID file names the server"
    );
    drop(server);
}
