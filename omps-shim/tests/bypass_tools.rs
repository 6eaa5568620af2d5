//! The shim steps aside for debuggers and sanitizers (issue 26): preloaded into a program
//! with `OMPS_BYPASS=1` (what a found compute-sanitizer or cuda-gdb also does), it runs
//! the program again without itself in LD_PRELOAD and says so on stderr, once. `env`
//! shows the environment the program was run again with.

use std::path::PathBuf;
use std::process::Command;

fn shim() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let p = exe.parent().unwrap().join("libomps_shim.so");
    assert!(p.exists(), "{} was not built", p.display());
    p
}

fn run_env(extra: &[(&str, &str)]) -> (String, String) {
    let mut c = Command::new("env");
    c.env("LD_PRELOAD", shim())
        .env_remove("OMPS_BYPASSED")
        .env_remove("OMPS_BYPASS");
    for (k, v) in extra {
        c.env(k, v);
    }
    let out = c.output().expect("env runs");
    assert!(out.status.success());
    (
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

#[test]
fn asked_to_bypass_the_program_runs_again_without_the_shim() {
    let (stdout, stderr) = run_env(&[("OMPS_BYPASS", "1")]);
    assert!(
        !stdout.lines().any(|l| l.starts_with("LD_PRELOAD=")),
        "{stdout}"
    );
    assert!(stdout.lines().any(|l| l == "OMPS_BYPASSED=1"), "{stdout}");
    let said: Vec<&str> = stderr.lines().filter(|l| l.starts_with("omps:")).collect();
    assert_eq!(said.len(), 1, "{stderr}");
    assert!(
        said[0].contains("OMPS_BYPASS=1") && said[0].contains("outside omps"),
        "{stderr}"
    );

    // A sanitizer's injection path does the same.
    let (stdout, stderr) = run_env(&[(
        "CUDA_INJECTION64_PATH",
        "/nowhere/libsanitizer-collection.so",
    )]);
    assert!(
        !stdout.lines().any(|l| l.starts_with("LD_PRELOAD=")),
        "{stdout}"
    );
    assert!(stderr.contains("compute-sanitizer"), "{stderr}");

    // Nothing found: the program runs once, preloaded, and the shim says nothing.
    let (stdout, stderr) = run_env(&[]);
    assert!(
        stdout.lines().any(|l| l.starts_with("LD_PRELOAD=")),
        "{stdout}"
    );
    assert!(!stdout.contains("OMPS_BYPASSED"), "{stdout}");
    assert!(!stderr.contains("omps:"), "{stderr}");
}

/// The program run again gets its arguments whole, empty ones too.
#[test]
fn arguments_survive_the_second_run_empty_ones_included() {
    let out = Command::new("sh")
        .args(["-c", "printf '[%s]' \"$@\"", "sh", "", "x y", ""])
        .env("LD_PRELOAD", shim())
        .env("OMPS_BYPASS", "1")
        .env_remove("OMPS_BYPASSED")
        .output()
        .expect("sh runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("outside omps"), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "[][x y][]");
}
