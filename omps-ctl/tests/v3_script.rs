//! An MPS v3 operator's script through omps-ctl against a server that runs protocol 3
//! (issue 26): servers, namespaces and their limits, devices, partitions and features,
//! in v3's syntax and output formats, each change seen through the legacy commands too.
//! The server runs in this process on the host GPU.

use omps_server::gpu::Gpu;
use omps_server::gpu_host::HostGpu;
use omps_server::{Server, ServerConfig};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

fn ctl(dir: &Path, args: &str, env: &[(&str, &str)]) -> (bool, String, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_omps-ctl"));
    c.args(args.split_whitespace())
        .env("CUDA_MPS_PIPE_DIRECTORY", dir)
        .env_remove("OMPS_PIPE_DIRECTORY")
        .env_remove("CUDA_MPS_PROTOCOL_VERSION");
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().expect("omps-ctl runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn ok(dir: &Path, args: &str) -> String {
    let (ok, out, err) = ctl(dir, args, &[]);
    assert!(ok, "{args}: {out}{err}");
    out
}

fn fails(dir: &Path, args: &str, why: &str) {
    let (ok, out, err) = ctl(dir, args, &[]);
    assert!(
        !ok && err.contains(why),
        "{args}: expected a failure naming {why:?}, got {out}{err}"
    );
}

#[test]
fn a_v3_operators_script_runs_against_omps() {
    let base = std::env::temp_dir().join(format!("omps-v3-script-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let dir = base.join("pipe");
    // SAFETY: set before the server (in this process) starts any thread.
    unsafe {
        std::env::set_var("OMPS_PROTOCOL", "3");
        std::env::set_var("CUDA_MPS_LOG_DIRECTORY", base.join("log"));
    }
    let gpu: Arc<dyn Gpu> = Arc::new(HostGpu::new(0, 1 << 30));
    let server =
        Server::new(ServerConfig::minimal(dir.clone()), vec![gpu], 13000).expect("server starts");
    std::thread::spawn(move || server.run().expect("server runs"));
    let me = std::process::id().to_string();
    let uid = unsafe { libc::getuid() }.to_string();
    // The daemon's protocol is followed, whatever the invocation asks for.
    let (good, out, err) = ctl(
        &dir,
        "server list --format=csv,noheader",
        &[("CUDA_MPS_PROTOCOL_VERSION", "2")],
    );
    assert!(good, "{out}{err}");
    assert_eq!(
        out,
        format!(
            "omps,{uid},{me},Ready,{},GPU-{},-\n",
            dir.display(),
            out.split(",GPU-")
                .nth(1)
                .unwrap()
                .trim_end()
                .trim_end_matches(",-")
        )
    );

    ok(&dir, "server create training --allowed-devices=0");
    fails(&dir, "server create training", "exists");
    fails(&dir, "server create other --uid=1", "serves user");
    fails(
        &dir,
        "server create other --locality-domains=true",
        "cannot be met",
    );
    fails(
        &dir,
        "server create other --allowed-devices=3",
        "no device '3'",
    );
    ok(&dir, "namespace create high_priority --server=training");
    fails(
        &dir,
        "namespace create high_priority --server=training",
        "exists",
    );
    fails(
        &dir,
        "namespace create x --server=nowhere",
        "no server 'nowhere'",
    );
    ok(&dir, "namespace set high_priority --server=training --pinned-memory-limit=5G --active-thread-percentage=25 --client-priority=1");
    ok(&dir, "server set training --pinned-memory-limit=10G");
    assert_eq!(
        ok(
            &dir,
            "namespace get high_priority training pinned-memory-limit"
        ),
        "5G\n"
    );
    assert_eq!(
        ok(
            &dir,
            "namespace get high_priority training active-thread-percentage"
        ),
        "25.00\n"
    );
    assert_eq!(
        ok(&dir, "namespace get high_priority training client-priority"),
        "1\n"
    );
    assert_eq!(
        ok(&dir, "namespace get high_priority training pipe-directory"),
        format!("{}\n", dir.join("training").join("high_priority").display())
    );
    let list = ok(&dir, "namespace list --server=training --format=csv");
    let lines: Vec<&str> = list.lines().collect();
    assert_eq!(lines[0], "name,server,server-status,pinned-memory-limit,active-thread-percentage,client-priority,pipe-directory");
    assert!(
        lines.contains(
            &format!(
                "default,training,Ready,10G,-,0,{}",
                dir.join("training/default").display()
            )
            .as_str()
        ),
        "{list}"
    );
    assert!(
        lines.contains(
            &format!(
                "high_priority,training,Ready,5G,25.00,1,{}",
                dir.join("training/high_priority").display()
            )
            .as_str()
        ),
        "{list}"
    );
    let table = ok(&dir, "namespace list");
    assert!(
        table.starts_with("NAME ") && table.contains("PINNED MEMORY LIMIT"),
        "{table}"
    );
    // The same namespaces through the legacy command: they are omps's own.
    let legacy = ok(&dir, "list_namespaces");
    assert!(
        legacy.contains("training/high_priority ") && legacy.contains("thread_percentage=25.0"),
        "{legacy}"
    );
    assert!(dir.join("training/high_priority/control").exists());

    let servers = ok(&dir, "server list --format=csv,noheader");
    assert!(
        servers.lines().any(|l| l.starts_with(&format!(
            "training,{uid},{me},Ready,{},GPU-",
            dir.join("training").display()
        ))),
        "{servers}"
    );
    assert_eq!(
        ok(&dir, "server get training pipe-directory"),
        format!("{}\n", dir.join("training").display())
    );
    let devices = ok(&dir, "device list --format=csv");
    assert!(
        devices.starts_with(
            "ordinal,server,pci-id,device-uuid,name,total-sms,total-chunks,attributes\n0,omps,"
        ),
        "{devices}"
    );
    assert_eq!(ok(&dir, "client list --format=csv,noheader"), "");
    fails(&dir, "client terminate 999999", "no client");
    let f = ok(&dir, "feature describe memacct --format=csv,noheader");
    assert!(f.starts_with("memacct,enabled (always),memacct,"), "{f}");
    fails(&dir, "feature disable context-share", "cannot be disabled");
    fails(&dir, "memacct set audit_log=true", "cannot be met");
    ok(&dir, "memacct set audit_log=false");
    // A partition on a GPU that cannot make them is refused with the server's reason.
    let (good, out, err) = ctl(
        &dir,
        "sm-partition create large --server=training --device=0 --chunks=1",
        &[],
    );
    if good {
        assert!(
            out.contains("SM partition 'large' created on device GPU-"),
            "{out}"
        );
        let parts = ok(&dir, "sm-partition list --format=csv,noheader");
        assert!(
            parts
                .lines()
                .any(|l| l.starts_with("training,GPU-") && l.contains(",large,1,")),
            "{parts}"
        );
        assert!(ok(
            &dir,
            "sm-partition delete large --server=training --device=0"
        )
        .contains("deleted"));
    } else {
        assert!(
            err.contains("SM partitions need") || err.contains("INVALID_RESOURCE"),
            "{err}"
        );
    }

    // Written back, taken down, and made again from the file: the same state.
    let saved = base.join("saved.toml");
    ok(&dir, &format!("config save {}", saved.display()));
    let text = std::fs::read_to_string(&saved).unwrap();
    assert!(
        text.contains("[servers.training]") && text.contains("pinned_memory_limit = \"10G\""),
        "{text}"
    );
    assert!(
        text.contains("[servers.training.namespaces.high_priority]")
            && text.contains("active_thread_percentage = \"25\""),
        "{text}"
    );
    let before = ok(&dir, "namespace list --format=csv");
    ok(&dir, "server delete training");
    assert_eq!(
        ok(
            &dir,
            "namespace list --server=training --format=csv,noheader"
        ),
        ""
    );
    ok(&dir, &format!("config apply {}", saved.display()));
    assert_eq!(ok(&dir, "namespace list --format=csv"), before);
    // A file that fails half-way takes back what it made: the first server is made,
    // the second names a device the server lacks.
    let bad = base.join("bad.toml");
    std::fs::write(
        &bad,
        "[servers.aa]\n[servers.bb]\nallowed_devices = \"7\"\n",
    )
    .unwrap();
    fails(
        &dir,
        &format!("config apply {}", bad.display()),
        "servers.bb.allowed_devices: no device '7'",
    );
    assert!(
        !ok(&dir, "server list").contains("aa"),
        "server aa was taken back"
    );
    fails(
        &dir,
        &format!("config apply {}", saved.display()),
        "exists already",
    );
    // The implicit server: its namespaces are omps's one-word ones (PIPE/omps/<name>),
    // its limits the server's defaults, as the legacy commands see them.
    let implicit = base.join("implicit.toml");
    std::fs::write(
        &implicit,
        "[servers.omps]\npinned_memory_limit = \"40G\"\nactive_thread_percentage = \"60\"\n\
         [servers.omps.namespaces.inference]\npinned_memory_limit = \"4G\"\nactive_thread_percentage = \"25\"\n",
    )
    .unwrap();
    ok(&dir, &format!("config apply {}", implicit.display()));
    assert!(dir.join("omps/inference/control").exists());
    assert_eq!(ok(&dir, "get_default_device_pinned_mem_limit 0"), "40G\n");
    assert_eq!(ok(&dir, "get_default_active_thread_percentage"), "60.0\n");
    assert_eq!(
        ok(&dir, "namespace get inference omps pinned-memory-limit"),
        "4G\n"
    );
    let resaved = base.join("resaved.toml");
    ok(&dir, &format!("config save {}", resaved.display()));
    let text = std::fs::read_to_string(&resaved).unwrap();
    assert!(
        text.contains(
            "[servers.omps]\npinned_memory_limit = \"40G\"\nactive_thread_percentage = \"60\""
        ),
        "{text}"
    );
    assert!(
        text.contains("[servers.omps.namespaces.inference]"),
        "{text}"
    );
    fails(
        &dir,
        "server set omps --client-priority=1",
        "legacy commands",
    );
    // As at a daemon's start over its own record of an earlier run: the file wins.
    fails(
        &dir,
        &format!("config apply {}", implicit.display()),
        "exists already",
    );
    ok(
        &dir,
        "namespace set inference --server=omps --pinned-memory-limit=8G",
    );
    ok(
        &dir,
        &format!("config apply --replace {}", implicit.display()),
    );
    assert_eq!(
        ok(&dir, "namespace get inference omps pinned-memory-limit"),
        "4G\n"
    );
    ok(&dir, "namespace delete inference --server=omps");

    fails(
        &dir,
        "namespace delete default --server=training",
        "goes with its server",
    );
    ok(&dir, "namespace delete high_priority --server=training");
    ok(&dir, "server delete training");
    assert!(!dir.join("training").exists());
    assert_eq!(
        ok(&dir, "server list --format=csv,noheader")
            .lines()
            .count(),
        1
    );
    partitions_stdin_and_what_the_file_cannot_say(&dir, &base);
    // Legacy commands keep working under protocol 3.
    assert_eq!(ok(&dir, "get_server_list"), format!("{me}\n"));
    let _ = ok(&dir, "quit");
    let _ = std::fs::remove_dir_all(&base);
}

/// A namespace in a partition keeps it through `namespace set` and `config save`; a server
/// deleted takes its partitions; `--replace` takes the file's partitions as they are;
/// several lines on standard input each run; what MPS v3's file cannot say is refused by
/// `config save` with what and why.
fn partitions_stdin_and_what_the_file_cannot_say(dir: &Path, base: &Path) {
    let uuid = ok(dir, "device list --format=csv,noheader")
        .split(',')
        .nth(3)
        .unwrap()
        .to_string();
    let file = base.join("parts.toml");
    std::fs::write(
        &file,
        format!(
            "[servers.parts]\n[[servers.parts.devices]]\nuuid = \"{uuid}\"\n\
             [[servers.parts.devices.sm_partitions]]\nname = \"half\"\nchunks = 1\n\
             [servers.parts.namespaces.inpart]\npinned_memory_limit = \"1G\"\n\
             [[servers.parts.namespaces.inpart.devices]]\nuuid = \"{uuid}\"\nsm_partition = \"half\"\n"
        ),
    )
    .unwrap();
    let (good, out, err) = ctl(dir, &format!("config apply {}", file.display()), &[]);
    if !good {
        // A host GPU that cannot be partitioned: the server's reason, nothing left made.
        assert!(
            err.contains("SM partitions need") || err.contains("INVALID_RESOURCE"),
            "{out}{err}"
        );
        assert!(!ok(dir, "server list").contains("parts"));
        return;
    }
    let legacy = ok(dir, "list_namespaces");
    let line = legacy
        .lines()
        .find(|l| l.starts_with("parts/inpart "))
        .unwrap()
        .to_string();
    assert!(line.contains(&format!("partition={uuid}/p")), "{line}");
    ok(
        dir,
        "namespace set inpart --server=parts --pinned-memory-limit=2G",
    );
    let after = ok(dir, "list_namespaces");
    let line2 = after
        .lines()
        .find(|l| l.starts_with("parts/inpart "))
        .unwrap();
    assert!(
        line2.contains("mem_limit=0=2G") && line2.contains(&format!("partition={uuid}/p")),
        "{line2}"
    );
    let saved = base.join("parts-saved.toml");
    ok(dir, &format!("config save {}", saved.display()));
    let text = std::fs::read_to_string(&saved).unwrap();
    assert!(
        text.contains("sm_partition = \"half\"") && text.contains("name = \"half\""),
        "{text}"
    );
    // The same file again, replacing: the partition is taken as it is, not made twice.
    let parts_before = ok(dir, "sm-partition list --format=csv,noheader");
    ok(dir, &format!("config apply --replace {}", file.display()));
    assert_eq!(
        ok(dir, "sm-partition list --format=csv,noheader"),
        parts_before
    );
    ok(dir, "server delete parts");
    assert!(
        !ok(dir, "sm-partition list --format=csv,noheader").contains(",half,"),
        "its partition went with it"
    );

    // Standard input: each line runs, v3 and legacy mixed.
    let mut p = Command::new(env!("CARGO_BIN_EXE_omps-ctl"))
        .env("CUDA_MPS_PIPE_DIRECTORY", dir)
        .env_remove("OMPS_PIPE_DIRECTORY")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    p.stdin
        .take()
        .unwrap()
        .write_all(b"server create lines\nnamespace create a --server=lines\nlist_namespaces\nnamespace create b --server=lines\n")
        .unwrap();
    let out = p.wait_with_output().unwrap();
    assert!(out.status.success());
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(listed.contains("lines/a "), "{listed}");
    assert!(ok(dir, "namespace list --server=lines --format=csv,noheader").contains("b,lines,"));
    ok(dir, "server delete lines");

    // What the file cannot say: omps's latency-critical class, a one-GPU limit on some GPUs.
    ok(dir, "create_namespace lc qos=latency-critical");
    let (good, _, err) = ctl(
        dir,
        &format!("config save {}", base.join("no.toml").display()),
        &[],
    );
    assert!(
        !good && err.contains("latency-critical") && err.contains("'lc'"),
        "{err}"
    );
    assert!(!base.join("no.toml").exists(), "nothing written");
    ok(dir, "delete_namespace lc");
}
