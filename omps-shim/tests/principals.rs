//! Operator and client are different principals (issue 23, finding 11): the clients'
//! socket takes no control command (a client could otherwise quit the server, lift its
//! own limit, terminate others or raise its QoS), the operator's socket, in a directory a
//! container mount leaves out, takes them, and a namespace's clients get its limits and
//! cannot raise them.

mod common;
use common::*;
use omps_ring::sock;
use omps_ring::wire::{self, Hello};
use omps_server::gpu::Gpu;
use omps_server::gpu_host::HostGpu;
use omps_server::{Server, ServerConfig};
use omps_shim::conn::{settings_from, Conn};
use std::io::Write;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;

/// A control connection to `path` sending `cmds` one after another: each answer.
fn commands_on(path: &Path, cmds: &[&str]) -> Vec<(bool, String)> {
    let s = UnixStream::connect(path).expect("socket");
    let hello = Hello {
        magic: wire::HELLO_MAGIC,
        version: wire::PROTOCOL_VERSION,
        kind: wire::kind::CONTROL,
    };
    (&s).write_all(bytemuck::bytes_of(&hello)).unwrap();
    cmds.iter()
        .map(|c| {
            sock::write_frame(&mut &s, c.as_bytes()).unwrap();
            let r = sock::read_frame(&mut &s, 1 << 20).unwrap().expect("reply");
            (r[0] == 0, String::from_utf8_lossy(&r[1..]).into_owned())
        })
        .collect()
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

#[test]
fn control_commands_on_the_clients_socket_are_refused_and_the_server_keeps_serving() {
    let srv = TestServer::start("principals-refused");
    let victim = Conn::connect_to(&srv.socket()).unwrap();
    let held = try_alloc(&victim, 1 << 20).expect("the victim allocates");
    assert_ne!(held, 0);
    let pid = std::process::id();
    let (_, me) = srv.ctl("get_server_list");
    let server = me.trim();
    let attacks = [
        "quit".to_string(),
        format!("shutdown_server {server} -f"),
        "set_default_device_pinned_mem_limit 0 none".to_string(),
        format!("set_device_pinned_mem_limit {pid} 0 none"),
        format!("terminate_client {server} {pid}"),
        format!("set_client_qos {pid} latency-critical"),
        "status".to_string(),
    ];
    for cmd in &attacks {
        let (ok, text) = commands_on(&srv.socket(), &[cmd]).remove(0);
        assert!(!ok, "'{cmd}' was taken on the clients' socket: {text}");
        assert!(
            text.contains(&srv.operator_socket().display().to_string()),
            "the refusal of '{cmd}' does not name the operator's socket: {text}"
        );
    }
    // Nothing of it happened: the victim is served, and new clients too.
    victim.ping(0).expect("the victim is still served");
    assert!(try_alloc(&victim, 1 << 20).is_ok());
    let next = Conn::connect_to(&srv.socket()).expect("a new client is served");
    next.ping(0).unwrap();
    // The operator's socket takes them, in a directory of the server's user alone.
    let operator_dir = srv.operator_socket().parent().unwrap().to_path_buf();
    assert_eq!(mode(&operator_dir), 0o700);
    let (ok, status) = srv.ctl("status");
    assert!(ok, "{status}");
    let (ok, ps) = srv.ctl("ps");
    assert!(ok && ps.contains(&pid.to_string()), "{ps}");
}

/// Found in review: connections to the clients' socket that said hello as control
/// connections held every handshake slot (their refusals kept them open, 10 s more at
/// each command), so the operator's `status` (the liveness probe) and new clients were
/// dropped. Now a refusal closes the connection, the operator's socket has slots of its
/// own, and one process holds at most a few of the clients' slots.
#[test]
fn silent_and_refused_connections_never_lock_the_operator_out() {
    let srv = TestServer::start("principals-slots");
    let hello = Hello {
        magic: wire::HELLO_MAGIC,
        version: wire::PROTOCOL_VERSION,
        kind: wire::kind::CONTROL,
    };
    // A refused command ends its connection: no second answer, no slot held.
    let s = UnixStream::connect(srv.socket()).unwrap();
    (&s).write_all(bytemuck::bytes_of(&hello)).unwrap();
    sock::write_frame(&mut &s, b"status").unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    let r = sock::read_frame(&mut &s, 1 << 20)
        .unwrap()
        .expect("a refusal");
    assert_eq!(r[0], 1, "refused");
    assert!(
        matches!(sock::read_frame(&mut &s, 1 << 20), Ok(None) | Err(_)),
        "the refused connection stayed open"
    );
    let held: Vec<UnixStream> = (0..80)
        .filter_map(|_| {
            let s = UnixStream::connect(srv.socket()).ok()?;
            (&s).write_all(bytemuck::bytes_of(&hello)).ok()?;
            Some(s)
        })
        .collect();
    assert!(!held.is_empty());
    let t = std::time::Instant::now();
    let (ok, status) = srv.ctl("status");
    assert!(ok, "{status}");
    assert!(
        t.elapsed() < std::time::Duration::from_secs(1),
        "status took {:?} behind {} silent connections",
        t.elapsed(),
        held.len()
    );
    drop(held);
    // Once they are gone (or timed out), this process is a client again.
    let c = Conn::connect_to(&srv.socket()).expect("served once its silent connections went");
    c.ping(0).unwrap();
}

#[test]
fn a_client_on_the_operators_socket_is_refused() {
    let srv = TestServer::start("principals-op-client");
    let settings = settings_from(|_| None).unwrap();
    let r = Conn::connect_with(&srv.operator_socket(), &settings);
    assert!(r.is_err(), "a client was served on the operator's socket");
    Conn::connect_to(&srv.socket()).expect("clients connect to omps.sock");
}

#[test]
fn a_namespace_client_gets_the_namespace_limit_and_cannot_raise_it() {
    let srv = TestServer::start("principals-ns");
    let (ok, made) = srv.ctl("create_namespace team-a mem_limit=64M qos=below-normal");
    assert!(ok, "{made}");
    // MPS v3's layout: PIPE/<server>/<namespace>/control, in directories of the server's
    // user alone; a pod that mounts this directory and points its pipe directory at it
    // reaches the namespace's socket.
    let ns_dir = srv.dir.join("omps").join("team-a");
    assert_eq!(made.trim(), ns_dir.display().to_string());
    let socket = ns_dir.join("control");
    assert!(std::fs::symlink_metadata(&socket)
        .unwrap()
        .file_type()
        .is_socket());
    assert_eq!(mode(&ns_dir), 0o700);
    assert_eq!(sock::client_socket_in(&ns_dir), socket);
    let (ok, list) = srv.ctl("list_namespaces");
    assert!(
        ok && list.contains("team-a") && list.contains("0=64M"),
        "{list}"
    );

    let plain = settings_from(|_| None).unwrap();
    let c = Conn::connect_with(&socket, &plain).expect("a namespace client");
    let pid = std::process::id().to_string();
    let (_, qos) = srv.ctl(&format!("get_client_qos {pid}"));
    assert_eq!(qos.trim(), "below-normal", "the namespace's QoS class");
    try_alloc(&c, 48 << 20).expect("within the namespace's limit");
    assert!(
        try_alloc(&c, 32 << 20).is_err(),
        "past the namespace's 64M limit"
    );
    // Asking for more than the namespace gives is refused; asking for less is taken.
    for (var, value) in [
        ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=1G"),
        ("OMPS_CLIENT_QOS", "latency-critical"),
        ("OMPS_CLIENT_QOS", "normal"),
    ] {
        let s = settings_from(|k| (k == var).then(|| value.to_string())).unwrap();
        assert!(
            Conn::connect_with(&socket, &s).is_err(),
            "{var}={value} raised a namespace client's limit"
        );
    }
    // Control commands are refused on a namespace's socket too.
    for cmd in ["set_default_device_pinned_mem_limit 0 none", "quit"] {
        let answers = commands_on(&socket, &[cmd]);
        assert!(answers.iter().all(|(ok, _)| !ok), "{answers:?}");
    }
    drop(c);
    // The operator's server-wide limit does not lift the namespace's cap either.
    assert!(srv.ctl("set_default_device_pinned_mem_limit 0 none").0);
    let lower =
        settings_from(|k| (k == "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT").then(|| "0=16M".to_string()))
            .unwrap();
    let c = Conn::connect_with(&socket, &lower).expect("a lower limit is the client's own");
    // The first connection's memory goes back once its release passes (the limit is
    // the process's, over its connections).
    let t = std::time::Instant::now();
    while try_alloc(&c, 8 << 20).is_err() {
        assert!(t.elapsed().as_secs() < 5, "8M within a 16M limit refused");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(
        try_alloc(&c, 16 << 20).is_err(),
        "past the client's own 16M limit"
    );
    drop(c);
    assert!(srv.ctl("delete_namespace team-a").0);
    assert!(!socket.exists(), "a deleted namespace's socket stayed");
    assert!(!srv.ctl("delete_namespace team-a").0);
}

#[test]
fn namespaces_are_made_again_by_the_next_server_on_the_pipe_directory() {
    let dir = temp_dir("principals-again");
    let start = |dir: &Path| {
        let gpu = Arc::new(HostGpu::new(0, 1 << 28)) as Arc<dyn Gpu>;
        let server = Server::new(ServerConfig::minimal(dir.to_path_buf()), vec![gpu], 13000)
            .expect("server starts");
        std::thread::spawn(move || server.run().expect("server runs"))
    };
    let op = sock::operator_socket_in(&dir);
    let t = start(&dir);
    assert!(ctl_at(&op, "create_namespace batch thread_percentage=50").0);
    assert!(!ctl_at(&op, "create_namespace batch").0, "made twice");
    assert!(!ctl_at(&op, "create_namespace ../escape").0);
    assert!(ctl_at(&op, "quit").0);
    t.join().unwrap();
    let socket = sock::namespace_dir_in(&dir, "batch").join(sock::NAMESPACE_SOCKET);
    assert!(!socket.exists(), "a quit server's namespace socket stayed");
    let t = start(&dir);
    let (ok, list) = ctl_at(&op, "list_namespaces");
    assert!(ok && list.contains("batch"), "{list}");
    let c = Conn::connect_with(&socket, &settings_from(|_| None).unwrap())
        .expect("the namespace serves again");
    c.ping(0).unwrap();
    drop(c);
    assert!(ctl_at(&op, "quit").0);
    t.join().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// The namespace-limit test's second process: its socket in OMPS_TEST_NS_SOCKET.
const NS_CHILD: &str = "OMPS_TEST_NS_CHILD";

#[test]
fn a_namespaces_limit_holds_for_its_processes_together() {
    if std::env::var_os(NS_CHILD).is_some() {
        // Another process of the namespace: 48M of its 64M are the first's already.
        let socket = std::env::var_os("OMPS_TEST_NS_SOCKET").expect("the socket");
        let c = Conn::connect_with(Path::new(&socket), &settings_from(|_| None).unwrap())
            .expect("a second client of the namespace");
        // cuMemGetInfo: the namespace's limit is the total, what its processes left of
        // it together the free (issue 26: MPS reports the whole GPU).
        let mut ch = c.channel();
        ch.call(0, wire::Op::MemGetInfo, |call| {
            bytemuck::bytes_of(&call).to_vec()
        })
        .unwrap();
        let r = ch.reply::<wire::MemInfoReply>();
        assert_eq!((r.free, r.total), (16 << 20, 64 << 20), "free and total");
        drop(ch);
        assert_eq!(
            try_alloc(&c, 32 << 20),
            Err(2),
            "32M more would take the namespace past 64M: CUDA_ERROR_OUT_OF_MEMORY"
        );
        try_alloc(&c, 8 << 20).expect("8M more stays within it");
        return;
    }
    let srv = TestServer::start("principals-ns-total");
    assert!(srv.ctl("create_namespace team-b mem_limit=64M").0);
    let socket = srv.dir.join("omps").join("team-b").join("control");
    let plain = settings_from(|_| None).unwrap();
    let c = Conn::connect_with(&socket, &plain).expect("a namespace client");
    try_alloc(&c, 48 << 20).expect("within the namespace's limit");
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_namespaces_limit_holds_for_its_processes_together",
            "--nocapture",
        ])
        .env(NS_CHILD, "1")
        .env("OMPS_TEST_NS_SOCKET", &socket)
        .status()
        .expect("the second process runs");
    assert!(status.success(), "the second process: {status}");
    // This process came through the namespace: through the server's own socket it is
    // refused, which would count its memory outside the namespace.
    let e = Conn::connect_with(&srv.socket(), &plain).err();
    assert!(e.is_some(), "one process in and out of a namespace");
    drop(c);
}

#[test]
fn a_namespace_made_again_counts_its_old_processes_with_its_new() {
    let srv = TestServer::start("principals-ns-again");
    assert!(srv.ctl("create_namespace team-c mem_limit=64M").0);
    let socket = srv.dir.join("omps").join("team-c").join("control");
    let plain = settings_from(|_| None).unwrap();
    let first = Conn::connect_with(&socket, &plain).expect("a namespace client");
    try_alloc(&first, 48 << 20).expect("within the namespace's limit");
    // Deleted and made again under its name while that client still holds its memory.
    assert!(srv.ctl("delete_namespace team-c").0);
    assert!(srv.ctl("create_namespace team-c mem_limit=64M").0);
    let again = Conn::connect_with(&socket, &plain).expect("the same process, the same namespace");
    assert_eq!(
        try_alloc(&again, 32 << 20),
        Err(2),
        "the first connection's 48M still count: CUDA_ERROR_OUT_OF_MEMORY"
    );
    try_alloc(&again, 8 << 20).expect("within what is left");
    drop((first, again));
}

/// A pod that could write its namespace's directory could put a socket of its own there
/// (an `omps.sock`, which the shim takes before `control`) and catch the next pods'
/// handshakes: the server serves no namespace directory that holds anything besides its
/// socket (issue 23 review, finding 3d).
#[test]
fn a_namespace_directory_holding_anything_else_is_not_served() {
    let srv = TestServer::start("ns-strangers");
    let (ok, made) = srv.ctl("create_namespace team-a");
    assert!(ok, "{made}");
    let dir = std::path::PathBuf::from(made.trim());
    let plain = settings_from(|_| None).unwrap();
    let control = dir.join(sock::NAMESPACE_SOCKET);
    Conn::connect_with(&control, &plain).expect("a clean namespace serves");
    let planted = std::os::unix::net::UnixListener::bind(dir.join(sock::SOCKET_NAME)).unwrap();
    match Conn::connect_with(&control, &plain) {
        Err((code, _)) => assert_eq!(code, 805, "CUDA_ERROR_MPS_CONNECTION_FAILED"),
        Ok(_) => panic!("a namespace holding a planted omps.sock served"),
    }
    drop(planted);
    std::fs::remove_file(dir.join(sock::SOCKET_NAME)).unwrap();
    Conn::connect_with(&control, &plain).expect("served again once it is removed");
    // Made with something in its directory already: refused.
    let b = sock::namespace_dir_in(&srv.dir, "team-b");
    std::fs::create_dir_all(&b).unwrap();
    std::os::unix::fs::symlink("/", b.join("link")).unwrap();
    let (ok, why) = srv.ctl("create_namespace team-b");
    assert!(!ok && why.contains("link"), "{why}");
}

/// MPS v3's layout (issue 26): a namespace `SERVER/NAMESPACE` listens at
/// `PIPE/<server>/<namespace>/control`, holds its clients to its limit like any other,
/// and its server's directory goes with its last namespace.
#[test]
fn a_v3_namespace_lives_under_its_servers_directory() {
    let srv = TestServer::start("ns-v3");
    let (ok, made) = srv.ctl("create_namespace training/high_priority mem_limit=16M");
    assert!(ok, "{made}");
    let dir = std::path::PathBuf::from(made.trim());
    assert_eq!(dir, srv.dir.join("training").join("high_priority"));
    let (ok, made) = srv.ctl("create_namespace training/default");
    assert!(ok, "{made}");
    for bad in [
        "training/High",
        "omps/x",
        "operator/x",
        "a/b/c",
        "training/../x",
    ] {
        let (ok, why) = srv.ctl(&format!("create_namespace {bad}"));
        assert!(!ok && why.contains("name"), "{bad}: {why}");
    }
    let plain = settings_from(|_| None).unwrap();
    let c = Conn::connect_with(&dir.join(sock::NAMESPACE_SOCKET), &plain).expect("served");
    assert_eq!(try_alloc(&c, 32 << 20), Err(2), "above the namespace's 16M");
    try_alloc(&c, 8 << 20).expect("within it");
    // What omps-ctl's v3 `client list` reads: the client and the namespace it came through.
    let (ok, rows) = srv.ctl("client_namespaces");
    let me = std::process::id().to_string();
    assert!(
        ok && rows
            .lines()
            .any(|l| l.starts_with(&format!("{me}\ttraining/high_priority\t"))),
        "{rows}"
    );
    drop(c);
    let (ok, list) = srv.ctl("list_namespaces");
    assert!(
        ok && list.contains("training/high_priority ") && list.contains("training/default "),
        "{list}"
    );
    // A client pointed at PIPE/training reaches training/default; a socket planted in the
    // server's directory would take it first, so default is not served while one is there.
    let default = srv
        .dir
        .join("training")
        .join("default")
        .join(sock::NAMESPACE_SOCKET);
    assert_eq!(sock::client_socket_in(&srv.dir.join("training")), default);
    // (This process joined training/high_priority above: served, it is refused as a
    // process in two namespaces, code 1; not served at all, its connection is closed, 805.)
    let reach = || match Conn::connect_with(&default, &plain) {
        Ok(_) => 0,
        Err((code, _)) => code,
    };
    assert_ne!(reach(), 805, "default serves");
    let planted =
        std::os::unix::net::UnixListener::bind(srv.dir.join("training").join(sock::SOCKET_NAME))
            .unwrap();
    assert_eq!(
        reach(),
        805,
        "not served with a socket planted in its server's directory"
    );
    drop(planted);
    std::fs::remove_file(srv.dir.join("training").join(sock::SOCKET_NAME)).unwrap();
    assert_ne!(reach(), 805, "served again once it is removed");
    // A directory a deleted namespace left behind (a pod's file kept it) routes nothing.
    let leftover = srv.dir.join("training").join("gone");
    std::fs::create_dir_all(&leftover).unwrap();
    std::fs::write(leftover.join("pod-file"), b"x").unwrap();
    assert_ne!(reach(), 805, "a leftover directory does not stop default");
    std::fs::remove_dir_all(&leftover).unwrap();
    assert!(srv.ctl("delete_namespace training/high_priority").0);
    assert!(srv.dir.join("training").exists(), "default is still there");
    assert!(srv.ctl("delete_namespace training/default").0);
    assert!(
        !srv.dir.join("training").exists(),
        "the server's directory goes with its last namespace"
    );
}
