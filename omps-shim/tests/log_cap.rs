//! The server's log stays under its cap (OMPS_LOG_MAX_BYTES) however many diagnostics a
//! client provokes (issue 23, finding 14): a full server.log moves to server.log.1, so the
//! two together never pass twice the cap. Its own test binary: it installs the server's
//! logging for the whole process.

mod common;
use common::*;
use omps_shim::conn::Conn;

const CAP: u64 = 16 << 10;

#[test]
fn a_client_provoking_diagnostics_in_a_loop_cannot_grow_the_log_past_its_cap() {
    let logs = temp_dir("log-cap-logs");
    std::fs::create_dir_all(&logs).unwrap();
    std::env::set_var("OMPS_LOG_DIRECTORY", &logs);
    std::env::set_var("OMPS_LOG_MAX_BYTES", CAP.to_string());
    omps_server::log_file::init_logging();
    let srv = TestServer::start("log-cap");
    let c = Conn::connect_to(&srv.socket()).unwrap();
    // More than the GPU has: refused, and logged, every time.
    for _ in 0..1000 {
        assert_eq!(try_alloc(&c, 1 << 40), Err(2));
    }
    c.ping(0).unwrap();
    let size = |name: &str| std::fs::metadata(logs.join(name)).map_or(0, |m| m.len());
    let (now, old) = (size("server.log"), size("server.log.1"));
    assert!(
        old > 0,
        "1000 refusals filled the log once at least ({now} bytes)"
    );
    assert!(
        now <= CAP && old <= CAP,
        "server.log {now}, server.log.1 {old}"
    );
    let text = std::fs::read_to_string(logs.join("server.log")).unwrap();
    assert!(
        text.lines().last().unwrap_or("").contains("out of memory"),
        "the newest lines are kept: {text}"
    );
    let _ = std::fs::remove_dir_all(&logs);
}
