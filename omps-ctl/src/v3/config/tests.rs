use super::*;

/// NVIDIA's 620 example file, as far as its documentation shows it, with the 615 file's
/// context-share table at the end.
const EXAMPLE: &str = r#"
schema_version = "1.0"

[compute_policy]
timeslice             = "long"
timeslice_yield_level = 2

[servers.training]
allowed_devices          = "GPU-74d43ed3-cdf7-e667-3644-bf5b4f46ed65"
pinned_memory_limit      = "10G"
active_thread_percentage = "50"
client_priority          = "0"
uid                      = 1000
locality_domains         = false
timeslice_pct            = "50"

[servers.training.namespaces.high_priority]
pinned_memory_limit      = "5G"
active_thread_percentage = "25"
cgroup                   = "/sys/fs/cgroup/training"
cgroup_depth             = 1

[[servers.training.namespaces.high_priority.devices]]
uuid         = "GPU-74d43ed3-cdf7-e667-3644-bf5b4f46ed65"
sm_partition = "large"

[[servers.training.devices]]
uuid = "GPU-74d43ed3-cdf7-e667-3644-bf5b4f46ed65"

  [[servers.training.devices.sm_partitions]]
  name              = "large"
  chunks            = 4
  include_remainder = false
  shareable         = true
  max_chunks        = 6

[features.memacct]
enabled       = true
audit_log     = true
force_polling = false

[features.context-share]
enabled        = true
default_socket = "on"
"#;

const UUID: &str = "GPU-74d43ed3-cdf7-e667-3644-bf5b4f46ed65";

#[test]
fn nvidias_example_reads_whole() {
    let p = parse(EXAMPLE).unwrap();
    assert_eq!(p.servers.len(), 1);
    let s = &p.servers[0];
    assert_eq!(s.name, "training");
    assert_eq!(s.uid, Some(1000));
    assert_eq!(s.allowed_devices, Some(vec![Device::Uuid(UUID.into())]));
    assert_eq!(
        s.default_limits,
        Limits {
            pinned_memory: Some(10 << 30),
            thread_percentage: Some(50),
            client_priority: Some(0)
        }
    );
    assert_eq!(s.namespaces.len(), 1);
    let n = &s.namespaces[0];
    assert_eq!(n.name, "high_priority");
    assert_eq!(n.limits.pinned_memory, Some(5 << 30));
    assert_eq!(n.limits.thread_percentage, Some(25));
    assert_eq!(n.partitions, vec![(UUID.to_string(), "large".to_string())]);
    assert_eq!(
        s.partitions[0].1[0],
        Partition {
            name: "large".into(),
            chunks: 4,
            include_remainder: false,
            shareable: true,
            max_chunks: Some(6),
        }
    );
    let inert: Vec<&str> = p.inert.iter().map(|(k, _)| k.as_str()).collect();
    for k in [
        "compute_policy.timeslice",
        "compute_policy.timeslice_yield_level",
        "servers.training.timeslice_pct",
        "servers.training.namespaces.high_priority.cgroup",
        "features.memacct",
        "features.context-share",
        "servers.training.devices.sm_partitions.large.max_chunks",
    ] {
        assert!(inert.contains(&k), "{k} not reported as inert: {inert:?}");
    }
}

#[test]
fn a_bare_server_and_integers_for_strings() {
    let p = parse("[servers.shared]\n").unwrap();
    assert_eq!(p.servers[0].default_limits, Limits::default());
    let p = parse("[servers.s]\nactive_thread_percentage = 30\nclient_priority = 1\n").unwrap();
    assert_eq!(p.servers[0].default_limits.thread_percentage, Some(30));
    assert_eq!(p.servers[0].default_limits.client_priority, Some(1));
    assert!(parse("").unwrap().servers.is_empty());
}

/// Every refusal names the key (or the line) and the reason.
#[test]
fn bad_files_are_refused_with_key_and_reason() {
    let cases: &[(&str, &str, &str)] = &[
        ("[servers.s]\nmemory = \"1G\"\n", "memory", "unknown field"),
        ("[servers.s.namespaces.n]\nqos = 1\n", "qos", "unknown field"),
        ("[servers.s]\npinned_memory_limit = \"1.5G\"\n", "servers.s.pinned_memory_limit", "whole number"),
        ("[servers.s]\npinned_memory_limit = \"10\"\n", "servers.s.pinned_memory_limit", "K, M or G"),
        ("[servers.s]\nactive_thread_percentage = \"0\"\n", "servers.s.active_thread_percentage", "1-100"),
        ("[servers.s]\nactive_thread_percentage = true\n", "servers.s.active_thread_percentage", "boolean"),
        ("[servers.s]\nclient_priority = \"2\"\n", "servers.s.client_priority", "below normal"),
        ("[servers.s]\nlocality_domains = \"false\"\n", "locality_domains", "boolean"),
        ("[servers.s]\nlocality_domains = true\n", "servers.s.locality_domains", "cannot be met"),
        ("[servers.s]\nuid = -1\n", "servers.s.uid", "user id"),
        ("[servers.Team]\n", "servers.Team", "a-z"),
        ("[servers.s.namespaces.bad-name]\n", "servers.s.namespaces.bad-name", "'-'"),
        ("[servers.s]\nallowed_devices = \"0,0\"\n", "servers.s.allowed_devices", "twice"),
        ("[servers.s]\nallowed_devices = \"gpu0\"\n", "servers.s.allowed_devices", "not a device"),
        ("schema_version = \"2.0\"\n", "schema_version", "1.0"),
        ("[compute_policy]\ntimeslice = \"forever\"\n", "compute_policy.timeslice", "long"),
        ("[features.context-share]\ndefault_socket = \"maybe\"\n", "default_socket", "on or off"),
        ("[features.other]\nx = 1\n", "other", "unknown field"),
        ("[features.context-share]\nenabled = false\n", "features.context-share.enabled", "cannot be met"),
        ("[[servers.s.devices]]\nuuid = \"0\"\n", "servers.s.devices[0].uuid", "by UUID"),
        (
            "[[servers.s.devices]]\nuuid = \"GPU-ab\"\n[[servers.s.devices.sm_partitions]]\nname = \"p\"\nchunks = 0\n",
            "servers.s.devices[0].sm_partitions[0].chunks",
            "at least 1",
        ),
        (
            "[[servers.s.devices]]\nuuid = \"GPU-ab\"\n[[servers.s.devices.sm_partitions]]\nname = \"p\"\nchunks = 4\nmax_chunks = 2\n",
            "max_chunks",
            "below chunks",
        ),
        (
            "[[servers.s.devices]]\nuuid = \"GPU-ab\"\n[[servers.s.devices.sm_partitions]]\nname = \"p\"\nchunks = 1\n[[servers.s.devices.sm_partitions]]\nname = \"p\"\nchunks = 1\n",
            "sm_partitions[1].name",
            "twice",
        ),
        (
            "[servers.s]\nallowed_devices = \"GPU-aa\"\n[[servers.s.devices]]\nuuid = \"GPU-bb\"\n",
            "servers.s.devices[0].uuid",
            "allowed_devices",
        ),
        (
            "[servers.s.namespaces.n]\n[[servers.s.namespaces.n.devices]]\nuuid = \"GPU-ab\"\nsm_partition = \"nowhere\"\n",
            "servers.s.namespaces.n.devices[0].sm_partition",
            "not a partition",
        ),
        ("[servers.s.namespaces.n]\ncgroup = \"/etc\"\n", "servers.s.namespaces.n.cgroup", "/sys/fs/cgroup"),
        ("[servers.s.namespaces.n]\ncgroup = \"/sys/fs/cgroup/../../etc\"\n", "cgroup", "/sys/fs/cgroup"),
        (
            "[servers.s]\npinned_memory_limit = \"1G\"\n[servers.s.namespaces.default]\npinned_memory_limit = \"2G\"\n",
            "servers.s.namespaces.default.pinned_memory_limit",
            "differs",
        ),
        ("[servers.s\n", "line 1", "unclosed table"),
        (
            "[[servers.s.devices]]\nuuid = \"GPU-ab\"\n[[servers.s.devices.sm_partitions]]\nname = \"p\"\nchunks = 1\n\
             [servers.s.namespaces.a]\n[[servers.s.namespaces.a.devices]]\nuuid = \"GPU-ab\"\nsm_partition = \"p\"\n\
             [servers.s.namespaces.b]\n[[servers.s.namespaces.b.devices]]\nuuid = \"GPU-ab\"\nsm_partition = \"p\"\n",
            "servers.s.devices",
            "not shareable",
        ),
        (
            "[[servers.s.devices]]\nuuid = \"GPU-ab\"\n[[servers.s.devices.sm_partitions]]\nname = \"p\"\nchunks = 1\n\
             [[servers.s.devices]]\nuuid = \"GPU-cd\"\n[[servers.s.devices.sm_partitions]]\nname = \"q\"\nchunks = 1\n\
             [servers.s.namespaces.a]\n[[servers.s.namespaces.a.devices]]\nuuid = \"GPU-ab\"\nsm_partition = \"p\"\n\
             [[servers.s.namespaces.a.devices]]\nuuid = \"GPU-cd\"\nsm_partition = \"q\"\n",
            "servers.s.namespaces.a.devices",
            "one SM partition",
        ),
    ];
    for (text, key, why) in cases {
        let e = parse(text).expect_err(text);
        assert!(
            e.contains(key) && e.to_lowercase().contains(&why.to_lowercase()),
            "for {text:?}: {e}"
        );
    }
}

#[test]
fn the_default_namespace_table_sets_the_servers_default() {
    let p = parse("[servers.s.namespaces.default]\npinned_memory_limit = \"2G\"\n").unwrap();
    assert_eq!(p.servers[0].default_limits.pinned_memory, Some(2 << 30));
    assert!(p.servers[0].namespaces.is_empty());
}

#[test]
fn load_names_the_file() {
    let dir = std::env::temp_dir().join(format!("omps-v3-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("bad.toml");
    std::fs::write(&f, "[servers.s]\nbogus = 1\n").unwrap();
    let e = load(&f).unwrap_err();
    assert!(
        e.starts_with(&f.display().to_string()) && e.contains("bogus"),
        "{e}"
    );
    let e = load(&dir.join("absent.toml")).unwrap_err();
    assert!(e.contains("cannot read"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}
