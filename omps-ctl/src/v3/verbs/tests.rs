use super::*;

fn ok(line: &str) -> Command {
    let w: Vec<&str> = line.split_whitespace().collect();
    parse(&w).unwrap_or_else(|e| panic!("{line}: {e}"))
}

fn err(line: &str) -> String {
    let w: Vec<&str> = line.split_whitespace().collect();
    parse(&w).expect_err(line)
}

#[test]
fn nvidias_examples_parse() {
    for line in [
        "server create --uid=1000",
        "server create training --allowed-devices=GPU-abcd-1234,0 --locality-domains=false",
        "server delete training --force",
        "server list --format=csv,noheader",
        "server list training",
        "server set training --pinned-memory-limit=10G --active-thread-percentage=50",
        "server get training pipe-directory",
        "namespace create high_priority --server=training",
        "namespace delete high_priority --server=training --force",
        "namespace list --server=training --format=table",
        "namespace set high_priority --server=training --client-priority=1",
        "namespace get high_priority training pinned-memory-limit",
        "client list --all",
        "client list --server=training --format=csv",
        "client get 51023 maws-ns",
        "client terminate 51023",
        "device list",
        "sm-partition create large --server=training --device=GPU-74d43ed3-cdf7 --chunks=4 --include-remainder=true",
        "sm-partition delete large --server=training --device=0",
        "sm-partition list --all",
        "feature enable memacct",
        "feature describe context-share --format=csv",
        "memacct set audit_log=true",
        "memacct describe",
    ] {
        assert!(matches!(ok(line), Command::Run { .. }), "{line}");
    }
}

#[test]
fn values_come_out_checked() {
    let c = ok("server set t --pinned-memory-limit=10G --client-priority=1");
    assert_eq!(c.opt("pinned-memory-limit"), Some(&Value::Number(10 << 30)));
    assert_eq!(c.opt("client-priority"), Some(&Value::Number(1)));
    let c = ok("client list --all --format=csv,noheader");
    assert_eq!(c.opt("all"), Some(&Value::Set));
    assert_eq!(
        c.opt("format"),
        Some(&Value::Format {
            csv: true,
            header: false
        })
    );
    let c = ok("memacct set audit_log=false");
    assert_eq!(c.opt("audit_log"), Some(&Value::Bool(false)));
}

#[test]
fn help_in_every_place() {
    assert!(matches!(ok("help"), Command::Help(h) if h.contains("namespace create")));
    assert!(
        matches!(ok("namespace help"), Command::Help(h) if h.contains("namespace set") && !h.contains("server create"))
    );
    assert!(
        matches!(ok("namespace create help"), Command::Help(h) if h.contains("--server=VALUE"))
    );
}

/// Each refusal names what was wrong.
#[test]
fn bad_commands_name_the_wrong_word() {
    let cases: &[(&str, &str)] = &[
        ("", "no command"),
        ("servers list", "'servers' is not a module"),
        ("server", "no verb"),
        ("server start x", "'start' is not a verb"),
        ("server create", "give a name or --uid"),
        ("server create Training", "'T'"),
        ("server create t --uid=-5", "user id"),
        ("server create t --bogus=1", "'--bogus=1' is not an option"),
        ("server delete", "0 argument(s) given, it takes 1"),
        ("server delete a b", "2 argument(s)"),
        ("server delete t --force=yes", "takes no value"),
        ("server set t", "give --uid or"),
        (
            "server set t --active-thread-percentage=0",
            "--active-thread-percentage: '0' is outside 1-100",
        ),
        (
            "server set t --pinned-memory-limit=1.5G",
            "--pinned-memory-limit",
        ),
        ("server set t --client-priority=2", "below normal"),
        ("server set t --client-priority", "needs a value"),
        ("server get t color", "'color' is not one of"),
        ("server list --format=json", "'json' is not table or csv"),
        ("server list --format=csv,noheader,noheader", "not noheader"),
        ("namespace create n", "give --server"),
        ("namespace create ../n --server=s", "NAME"),
        (
            "namespace set n --server=s",
            "give --pinned-memory-limit or",
        ),
        (
            "namespace set n --server=s --client-priority=0 --client-priority=1",
            "given twice",
        ),
        ("namespace get n s", "2 argument(s) given, it takes 3"),
        ("client get abc cmd", "'abc' is not a process id"),
        ("client terminate 0", "not a process id"),
        (
            "sm-partition create p --server=s --device=0",
            "--chunks is required",
        ),
        (
            "sm-partition create p --server=s --device=0 --chunks=0",
            "positive",
        ),
        (
            "sm-partition create p --server=s --device=gpu --chunks=1",
            "not a device",
        ),
        ("feature enable gpus", "'gpus' is not one of"),
        ("memacct set audit_log=maybe", "not true or false"),
        ("memacct set", "give --audit_log"),
        ("context-share list", "no verbs"),
    ];
    for (line, why) in cases {
        let e = err(line);
        assert!(e.contains(why), "{line:?}: {e}");
    }
}

#[test]
fn v3_words_are_told_from_legacy_commands() {
    assert!(is_v3("server") && is_v3("sm-partition") && is_v3("context-share"));
    for legacy in [
        "ps",
        "quit",
        "get_server_list",
        "start_server",
        "status",
        "create_namespace",
    ] {
        assert!(!is_v3(legacy), "{legacy}");
    }
}
