//! MPS v3's command line through the omps-ctl binary (issue 26): a bad configuration
//! file is refused with file, key and reason before anything starts; a v3 command is
//! checked word by word; a protocol that does not exist is named.

use std::process::Command;

fn ctl(dir: &std::path::Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_omps-ctl"))
        .args(args)
        .env("OMPS_PIPE_DIRECTORY", dir.join("pipe"))
        .env("OMPS_LOG_DIRECTORY", dir.join("log"))
        .env_remove("CUDA_MPS_PROTOCOL_VERSION")
        .env_remove("OMPS_MULTIUSER")
        .output()
        .expect("omps-ctl runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn v3_files_commands_and_protocols_are_checked_before_anything_runs() {
    let dir = std::env::temp_dir().join(format!("omps-v3-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "[servers.training]\npinned_memory_limit = \"10X\"\n").unwrap();
    let (ok, text) = ctl(&dir, &["-d", "-p", "3", "-a", bad.to_str().unwrap()]);
    assert!(!ok);
    assert!(
        text.contains("bad.toml") && text.contains("servers.training.pinned_memory_limit"),
        "{text}"
    );
    // Nothing was started: no pipe directory, no server.
    assert!(
        !dir.join("pipe").join("omps.sock").exists() && !dir.join("pipe").join("operator").exists(),
        "{text}"
    );

    let (ok, text) = ctl(&dir, &["-p", "4", "status"]);
    assert!(!ok && text.contains("'4' is not a protocol"), "{text}");

    let (ok, text) = ctl(&dir, &["namespace", "create", "Team", "--server=s"]);
    assert!(!ok && text.contains("'T'"), "{text}");
    let (ok, text) = ctl(&dir, &["client", "list", "--format=json"]);
    assert!(!ok && text.contains("'json' is not table or csv"), "{text}");
    // Well formed, but no daemon speaks protocol 3 here: said so, nothing sent.
    let (ok, text) = ctl(&dir, &["client", "list", "--all"]);
    assert!(
        !ok && text.contains("protocol 2") && text.contains("-p 3"),
        "{text}"
    );
    let (ok, text) = ctl(&dir, &["namespace", "help"]);
    assert!(
        ok && text.contains("namespace create NAME --server=VALUE"),
        "{text}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
