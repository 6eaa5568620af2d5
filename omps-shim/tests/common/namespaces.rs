//! Namespaces and client processes for the tests of how client slots are shared out
//! (issue 23): a process is a client of one namespace only, so a victim of another
//! namespace connects from a child process of the test binary.

use super::TestServer;
use omps_shim::conn::{settings_from, Conn};
use std::path::{Path, PathBuf};

/// The client socket of namespace `line` (a name and its settings), made by the operator.
pub fn ns_socket(srv: &TestServer, line: &str) -> PathBuf {
    let (ok, made) = srv.ctl(&format!("create_namespace {line}"));
    assert!(ok, "{made}");
    PathBuf::from(made.trim()).join("control")
}

/// The body of a test named `child_test` that is a victim only when run by
/// [`victim_connects`] with `var` set: connects to the socket in `var`, says how it went.
pub fn victim_child(var: &str) {
    let Some(path) = std::env::var_os(var) else {
        return;
    };
    let plain = settings_from(|_| None).unwrap();
    match Conn::connect_with(Path::new(&path), &plain) {
        Ok(c) => println!("VICTIM ok {:?}", c.ping(0)),
        Err(e) => println!("VICTIM refused {e:?}"),
    }
}

/// Runs test `child_test` of this binary (whose body is [`victim_child`]`(var)`) against
/// `path`: Ok, or the refusal it printed.
pub fn victim_connects(child_test: &str, var: &str, path: &Path) -> Result<(), String> {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", child_test, "--nocapture"])
        .env(var, path)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.starts_with("VICTIM"))
        .unwrap_or("VICTIM none");
    if line.starts_with("VICTIM ok Ok") {
        Ok(())
    } else {
        Err(line.to_string())
    }
}
