//! The daemon against users who do not trust each other (issue 23, findings 15 and 16).
//! Most need root (the daemon's chown and setuid): run as another user, they say so and
//! pass without checking anything.

use super::*;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::time::Instant;

fn root() -> bool {
    // SAFETY: geteuid has no preconditions.
    let r = unsafe { libc::geteuid() } == 0;
    if !r {
        eprintln!("SKIPPED: this test needs root (the daemon chowns and changes uid)");
    }
    r
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("omps-mu-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
    d
}

fn chown(path: &Path, uid: u32) {
    std::os::unix::fs::lchown(path, Some(uid), Some(uid)).unwrap();
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path).unwrap().mode() & 0o7777
}

#[test]
fn a_symlink_at_a_users_directory_is_not_followed() {
    if !root() {
        return;
    }
    let base = scratch("symlink");
    let victim = base.join("victim");
    std::fs::create_dir(&victim).unwrap();
    let pipe = RootDir::open(&base.join("pipe"), 0o711).unwrap();
    std::os::unix::fs::symlink(&victim, pipe.path().join("u60001")).unwrap();
    let r = pipe.private_child("u60001", 60001, 60001);
    let md = std::fs::metadata(&victim).unwrap();
    assert_eq!(md.uid(), 0, "the symlink's target was chowned to the user");
    assert_eq!(mode(&victim), 0o755, "the symlink's target was chmodded");
    assert!(r.is_err(), "a symlink passed for the user's directory");
    // One made for another user is not handed over either; one of its own is kept.
    std::fs::create_dir(pipe.path().join("u60002")).unwrap();
    chown(&pipe.path().join("u60002"), 60003);
    let e = pipe.private_child("u60002", 60002, 60002).unwrap_err();
    assert!(e.contains("60003"), "{e}");
    let mine = pipe.private_child("u60004", 60004, 60004).unwrap();
    assert_eq!(std::fs::metadata(&mine).unwrap().uid(), 60004);
    assert_eq!(mode(&mine), 0o700);
    assert_eq!(pipe.private_child("u60004", 60004, 60004), Ok(mine));
    let _ = std::fs::remove_dir_all(&base);
}

#[test]
fn a_pipe_directory_another_user_could_change_is_refused() {
    if !root() {
        return;
    }
    let base = scratch("owner");
    // Made first by a user (as the default /tmp/omps-pipe can be).
    let theirs = base.join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    chown(&theirs, 60001);
    let e = RootDir::open(&theirs, 0o711).unwrap_err();
    assert!(e.contains("uid 60001"), "{e}");
    assert_eq!(std::fs::metadata(&theirs).unwrap().uid(), 60001);
    // Root's, but open to all.
    let open = base.join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let e = RootDir::open(&open, 0o711).unwrap_err();
    assert!(e.contains("lets others change it"), "{e}");
    // Root's, in a directory of a user's (who could move it away and put another).
    let inside = theirs.join("pipe");
    std::fs::create_dir(&inside).unwrap();
    let e = RootDir::open(&inside, 0o711).unwrap_err();
    assert!(e.contains("above"), "{e}");
    // A symlink at the pipe directory is not followed, nor its target chmodded.
    let victim = base.join("victim");
    std::fs::create_dir(&victim).unwrap();
    std::os::unix::fs::symlink(&victim, base.join("link")).unwrap();
    let e = RootDir::open(&base.join("link"), 0o711).unwrap_err();
    assert!(e.contains("symlink"), "{e}");
    assert_eq!(mode(&victim), 0o755);
    // Made fresh (and what is missing above it): root's, with the mode asked for.
    let pipe = RootDir::open(&base.join("new/fresh"), 0o711).unwrap();
    assert_eq!(mode(pipe.path()), 0o711);
    let above = std::fs::metadata(base.join("new")).unwrap();
    assert_eq!((above.uid(), above.mode() & 0o022), (0, 0));
    let _ = std::fs::remove_dir_all(&base);
}

#[test]
fn root_writes_its_files_through_no_symlink_or_link() {
    if !root() {
        return;
    }
    let base = scratch("files");
    let victim = base.join("victim");
    std::fs::write(&victim, "precious\n").unwrap();
    let dir = RootDir::open(&base.join("log"), 0o711).unwrap();
    std::os::unix::fs::symlink(&victim, dir.path().join("control.log")).unwrap();
    assert!(dir.file("control.log", true).is_err(), "a symlink followed");
    std::fs::hard_link(&victim, dir.path().join("pid")).unwrap();
    assert!(dir.file("pid", false).is_err(), "a hard link written");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
    let mut f = dir.file("fresh.pid", false).unwrap();
    writeln!(f, "1").unwrap();
    let mut f = dir.file("fresh.pid", false).unwrap();
    writeln!(f, "2").unwrap();
    assert_eq!(
        std::fs::read_to_string(dir.path().join("fresh.pid")).unwrap(),
        "2\n"
    );
    let _ = std::fs::remove_dir_all(&base);
}

#[test]
fn a_socket_a_user_placed_is_reached_only_if_it_is_the_users() {
    if !root() {
        return;
    }
    let base = scratch("sockets");
    let pipe = RootDir::open(&base.join("pipe"), 0o711).unwrap();
    let a = pipe.private_child("u60001", 60001, 60001).unwrap();
    let b = pipe.private_child("u60002", 60002, 60002).unwrap();
    let theirs = UnixListener::bind(b.join("omps.sock")).unwrap();
    chown(&b.join("omps.sock"), 60002);
    // User 60001 points its socket at 60002's server.
    std::os::unix::fs::symlink(b.join("omps.sock"), a.join("omps.sock")).unwrap();
    assert!(dirs::connect_owned(&a, "omps.sock", 60001).is_err());
    let mine = UnixListener::bind(a.join("omps-handoff.sock")).unwrap();
    assert!(
        dirs::connect_owned(&a, "omps-handoff.sock", 60001).is_err(),
        "a socket of root's taken for the user's"
    );
    chown(&a.join("omps-handoff.sock"), 60001);
    let s = dirs::connect_owned(&a, "omps-handoff.sock", 60001).unwrap();
    mine.accept().unwrap();
    drop((s, theirs));
    let _ = std::fs::remove_dir_all(&base);
}

/// A daemon whose users' servers run `script` (sh), with `limit` to start. Its users are
/// uids 60001 to 60009 (in no passwd file), each its own group.
fn daemon(base: &Path, script: &str, limit: Duration) -> Daemon {
    let server = base.join("server.sh");
    std::fs::write(&server, format!("#!/bin/sh\n{script}\n")).unwrap();
    std::fs::set_permissions(&server, std::fs::Permissions::from_mode(0o755)).unwrap();
    let pipe = RootDir::open(&base.join("pipe"), 0o711).unwrap();
    let mut d = Daemon::new(pipe, None, server);
    d.start_limit = limit;
    d.passwd = |uid| (60001..=60009).contains(&uid).then_some(uid);
    d
}

/// A server script that leaves `BASE/spawned/UID` behind for each server started, so a
/// test sees which ones were; then runs `rest`.
fn spawn_marking(base: &Path, rest: &str) -> String {
    let marks = base.join("spawned");
    std::fs::create_dir(&marks).unwrap();
    std::fs::set_permissions(&marks, std::fs::Permissions::from_mode(0o777)).unwrap();
    format!("touch \"{}/$(id -u)\"\n{rest}", marks.display())
}

fn spawned(base: &Path, uid: u32) -> bool {
    base.join("spawned").join(uid.to_string()).exists()
}

/// No start lock left behind, and no place among the users' servers held.
fn settled(d: &Daemon) {
    assert!(
        d.starting.lock().unwrap().is_empty(),
        "start locks kept: {:?}",
        d.starting.lock().unwrap().keys().collect::<Vec<_>>()
    );
    assert_eq!(d.launching.load(Ordering::SeqCst), 0, "places still held");
}

#[test]
fn a_slow_start_for_one_user_does_not_hold_up_another() {
    if !root() {
        return;
    }
    let base = scratch("slow");
    // User 60001's server never listens (as one stuck opening a FIFO); 60002's exits.
    let d = Arc::new(daemon(
        &base,
        "case \"$OMPS_PIPE_DIRECTORY\" in *u60001) exec sleep 30;; esac\nexit 3",
        Duration::from_secs(4),
    ));
    let slow = {
        let d = d.clone();
        std::thread::spawn(move || d.server_for(60001, Some(60001)))
    };
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    let other = d.server_for(60002, Some(60002));
    let waited = t.elapsed();
    let e = other.expect_err("the second user's server exits at start");
    assert!(e.contains("exited at start"), "{e}");
    assert!(
        waited < Duration::from_millis(1500),
        "the second user waited {waited:?} for the first one's server"
    );
    let e = slow.join().unwrap().expect_err("the first never listens");
    assert!(e.contains("did not start listening"), "{e}");
    settled(&d);
    let _ = std::fs::remove_dir_all(&base);
}

#[test]
fn the_daemons_log_stays_under_its_cap() {
    if !root() {
        return;
    }
    let base = scratch("logcap");
    let pipe = RootDir::open(&base.join("pipe"), 0o711).unwrap();
    let log = RootDir::open(&base.join("log"), 0o755).unwrap();
    let mut d = Daemon::new(pipe, Some(log), base.join("no-server"));
    d.log_max = 4096;
    // A user's connections making lines without end (a failed start each).
    for i in 0..1000 {
        d.log(&format!("cannot start a server for uid 60001: attempt {i}"));
    }
    let size = |n: &str| std::fs::metadata(base.join("log").join(n)).map_or(0, |m| m.len());
    assert!(size("control.log") <= 4096, "{}", size("control.log"));
    assert!(size("control.log.1") <= 4096, "{}", size("control.log.1"));
    assert!(
        size("control.log.1") > 3000,
        "the full one was kept as control.log.1"
    );
    let last = std::fs::read_to_string(base.join("log").join("control.log")).unwrap();
    assert!(
        last.contains("attempt 999"),
        "the newest lines are in control.log"
    );
    let _ = std::fs::remove_dir_all(&base);
}

#[test]
fn a_command_naming_a_client_goes_to_its_users_server_only() {
    if !root() {
        return;
    }
    use std::os::unix::process::CommandExt;
    let mut theirs = std::process::Command::new("sleep")
        .arg("10")
        .uid(60001)
        .gid(60001)
        .spawn()
        .unwrap();
    let servers = vec![
        Running {
            uid: 0,
            pid: 1_000_001,
            dir: "/nonexistent/u0".into(),
        },
        Running {
            uid: 60001,
            pid: 1_000_002,
            dir: "/nonexistent/u60001".into(),
        },
    ];
    let uid_for = |pid: u32| server_of_pid(&servers, pid).map(|r| r.uid);
    assert_eq!(uid_for(theirs.id()), Ok(60001), "user 60001's client");
    assert_eq!(uid_for(std::process::id()), Ok(0), "root's own process");
    assert_eq!(uid_for(1_000_002), Ok(60001), "a server named by its PID");
    let none = server_of_pid(&servers[..1], theirs.id()).map(|r| r.uid);
    assert!(
        none.as_ref()
            .is_err_and(|e| e.contains("uid 60001, which has no omps server")),
        "{none:?}"
    );
    assert!(
        server_of_pid(&servers, u32::MAX - 1).is_err(),
        "no such process"
    );
    // Only commands that name a PID are routed by their number.
    assert!(names_a_pid(&["get_client_qos", "1234"]));
    assert!(names_a_pid(&["ps", "-p", "1234"]));
    assert!(!names_a_pid(&["get_default_device_pinned_mem_limit", "0"]));
    assert!(!names_a_pid(&["sm_partition", "add", "GPU-x", "8"]));
    assert!(!names_a_pid(&["create_namespace", "123"]));
    let _ = theirs.kill();
    let _ = theirs.wait();
}

#[test]
fn a_uid_with_no_passwd_entry_gets_no_server() {
    if !root() {
        return;
    }
    let base = scratch("nopasswd");
    let script = spawn_marking(&base, "exit 3");
    let mut d = daemon(&base, &script, Duration::from_secs(4));
    d.log = Some(RootDir::open(&base.join("log"), 0o755).unwrap());
    // A client of a subordinate uid (a user namespace's) gets what a client gets when
    // its server cannot start, and no server is started.
    let (conn, client) = UnixStream::pair().unwrap();
    let h = wire::Hello {
        magic: wire::HELLO_MAGIC,
        version: wire::PROTOCOL_VERSION,
        kind: wire::kind::CLIENT,
    };
    (&client).write_all(bytemuck::bytes_of(&h)).unwrap();
    d.serve_connection(conn, 165_536, 165_536);
    let mut w: wire::Welcome = bytemuck::Zeroable::zeroed();
    (&client)
        .read_exact(bytemuck::bytes_of_mut(&mut w))
        .unwrap();
    assert_eq!(w.status, 805, "CUDA_ERROR_MPS_CONNECTION_FAILED");
    let log = std::fs::read_to_string(base.join("log/control.log")).unwrap();
    assert!(
        log.contains("uid 165536 has no passwd entry"),
        "control.log: {log}"
    );
    assert!(!spawned(&base, 165_536), "a server was started for it");
    assert!(
        !base.join("pipe/u165536").exists(),
        "a directory was made for it"
    );
    // The operator's start_server is refused the same way.
    let (ok, text) = d.command("start_server -uid 165537");
    assert!(!ok && text.contains("no passwd entry"), "{text}");
    assert!(!spawned(&base, 165_537));
    // A known user's server is started (and here exits); root's always is.
    let e = d.server_for(60001, None).unwrap_err();
    assert!(e.contains("exited at start"), "{e}");
    assert!(spawned(&base, 60001));
    d.passwd = |_| None;
    let e = d.server_for(0, None).unwrap_err();
    assert!(e.contains("exited at start"), "{e}");
    assert!(spawned(&base, 0));
    settled(&d);
    let _ = std::fs::remove_dir_all(&base);
}

#[test]
fn users_servers_are_capped_running_and_starting_together() {
    if !root() {
        return;
    }
    let base = scratch("cap");
    let script = spawn_marking(
        &base,
        "case \"$OMPS_PIPE_DIRECTORY\" in *u60004) exec sleep 30;; esac\nexit 3",
    );
    let mut d = daemon(&base, &script, Duration::from_secs(3));
    d.max_servers = 2;
    let d = Arc::new(d);
    // Two users' servers run (stand-ins: they need not listen to be counted).
    for uid in [60001, 60002] {
        let child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let dir = base.join(format!("u{uid}"));
        d.servers
            .lock()
            .unwrap()
            .insert(uid, UserServer { child, dir });
    }
    let e = d.server_for(60003, None).unwrap_err();
    assert!(e.contains("OMPS_MAX_USER_SERVERS=2"), "{e}");
    assert!(!spawned(&base, 60003), "a server past the cap was started");
    // Root's server is not one of them.
    let e = d.server_for(0, None).unwrap_err();
    assert!(e.contains("exited at start"), "{e}");
    // One ends: its place is free.
    {
        let mut servers = d.servers.lock().unwrap();
        let s = servers.get_mut(&60001).unwrap();
        s.child.kill().unwrap();
        s.child.wait().unwrap();
    }
    let e = d.server_for(60003, None).unwrap_err();
    assert!(e.contains("exited at start"), "{e}");
    assert!(spawned(&base, 60003));
    // A server still starting holds its place too.
    let slow = {
        let d = d.clone();
        std::thread::spawn(move || d.server_for(60004, None))
    };
    let t = Instant::now();
    while !spawned(&base, 60004) && t.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let e = d.server_for(60005, None).unwrap_err();
    assert!(e.contains("OMPS_MAX_USER_SERVERS=2"), "{e}");
    assert!(!spawned(&base, 60005));
    let e = slow.join().unwrap().unwrap_err();
    assert!(e.contains("did not start listening"), "{e}");
    let e = d.server_for(60005, None).unwrap_err();
    assert!(e.contains("exited at start"), "{e}");
    settled(&d);
    for s in d.servers.lock().unwrap().values_mut() {
        let _ = s.child.kill();
        let _ = s.child.wait();
    }
    let _ = std::fs::remove_dir_all(&base);
}

#[test]
fn uids_with_no_passwd_entry_share_one_bucket_of_connections() {
    let base = scratch("bucket");
    let d = daemon(&base, "exit 1", Duration::from_secs(1));
    assert_eq!(
        d.bucket(60001),
        60001,
        "a user the system knows has its own"
    );
    assert_eq!(d.bucket(0), 0);
    assert_eq!(d.bucket(165_536), admit::UNKNOWN_USERS);
    assert_eq!(d.bucket(165_537), admit::UNKNOWN_USERS);
    // Subordinate uids together fill one share; a known user still comes in.
    let held: Vec<_> = (0..admit::PER_USER as u32)
        .map(|k| {
            d.admission
                .admit(d.bucket(165_536 + k), admit::PER_USER)
                .unwrap()
        })
        .collect();
    assert!(d
        .admission
        .admit(d.bucket(200_000), admit::PER_USER)
        .is_none());
    assert!(d
        .admission
        .admit(d.bucket(60002), admit::PER_USER)
        .is_some());
    drop(held);
    let _ = std::fs::remove_dir_all(&base);
}

#[test]
fn users_servers_answers_reach_root_without_control_characters() {
    assert_eq!(
        plain_text("pid 7\tgpu0\n\x1b]2;owned\x07\r\u{9b}31m"),
        "pid 7\tgpu0\n?]2;owned???31m"
    );
}
