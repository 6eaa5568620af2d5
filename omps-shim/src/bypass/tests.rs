use super::*;

fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
    let owned: Vec<(String, String)> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| owned.iter().find(|(n, _)| n == k).map(|(_, v)| v.into())
}

#[test]
fn nothing_found_keeps_the_shim() {
    assert_eq!(wanted(&vars(&[("PATH", "/bin")]), &|| None), None);
    assert_eq!(
        wanted(&vars(&[]), &|| Some("gdb /usr/bin/gdb".into())),
        None
    );
    // Another tool's injection alone (a CUPTI-based tracer) is not a sanitizer.
    let other = vars(&[("CUDA_INJECTION64_PATH", "/opt/tool/libToolsInjection64.so")]);
    assert_eq!(wanted(&other, &|| None), None);
}

#[test]
fn a_sanitizer_or_debugger_is_found() {
    let san = vars(&[(
        "CUDA_INJECTION64_PATH",
        "/usr/local/cuda/compute-sanitizer/libsanitizer-collection.so",
    )]);
    assert!(wanted(&san, &|| None)
        .unwrap()
        .contains("compute-sanitizer"));
    let tl = vars(&[(
        "LD_PRELOAD",
        "/x/libInterceptorInjectionTarget.so:/x/libTreeLauncherTargetInjection.so /s/libomps_shim.so",
    )]);
    assert!(wanted(&tl, &|| None).unwrap().contains("launcher"));
    let port = vars(&[("NV_SANITIZER_INJECTION_PORT_BASE", "49152")]);
    assert!(wanted(&port, &|| None).is_some());
    let ncu = vars(&[("NV_NSIGHT_INJECTION_PORT_BASE", "49152")]);
    assert!(wanted(&ncu, &|| None).unwrap().contains("Nsight Compute"));
    // A debugger's variables alone are exported by job scripts broadly: not a sign.
    let pre = vars(&[("CUDA_DEBUGGER_SOFTWARE_PREEMPTION", "1")]);
    assert_eq!(wanted(&pre, &|| None), None);
    assert!(wanted(&vars(&[]), &|| Some(
        "cuda-gdb /usr/local/cuda/bin/cuda-gdb".into()
    ))
    .unwrap()
    .contains("debugger"));
    assert_eq!(
        wanted(&vars(&[("OMPS_BYPASS", "1")]), &|| None).as_deref(),
        Some("OMPS_BYPASS=1")
    );
}

#[test]
fn omps_bypass_0_wins_over_any_tool() {
    let v = vars(&[
        ("OMPS_BYPASS", "0"),
        ("CUDA_INJECTION64_PATH", "/x/libsanitizer-collection.so"),
    ]);
    assert_eq!(wanted(&v, &|| Some("cuda-gdb".into())), None);
}

#[test]
fn ld_preload_loses_only_the_shim() {
    let ours = |e: &[u8]| e.ends_with(b"libomps_shim.so");
    assert_eq!(without_shim(b"/a/libomps_shim.so", &ours), Some(vec![]));
    assert_eq!(
        without_shim(b"/x/libfoo.so:/a/libomps_shim.so /y/libbar.so", &ours),
        Some(b"/x/libfoo.so /y/libbar.so".to_vec())
    );
    assert_eq!(without_shim(b"/x/libfoo.so", &ours), None);
    assert_eq!(without_shim(b"", &ours), None);
}

#[test]
fn the_next_environment_marks_itself_and_drops_an_empty_preload() {
    let ours = |e: &[u8]| e == b"libomps_shim.so";
    let env = vec![
        ("LD_PRELOAD".into(), "libomps_shim.so".into()),
        ("HOME".into(), "/root".into()),
    ];
    let next = next_env(env, &ours, &|_| false).unwrap();
    assert!(!next.iter().any(|(k, _)| k == "LD_PRELOAD"));
    assert!(next.iter().any(|(k, v)| k == "HOME" && v == "/root"));
    assert!(next.iter().any(|(k, v)| k == DONE && v == "1"));
    // Not preloaded: nothing to run again with.
    assert!(next_env(vec![("HOME".into(), "/root".into())], &ours, &|_| false).is_none());
}

#[test]
fn a_bare_name_matches_the_shims_file_name() {
    let own = Path::new("/nowhere/libomps_shim.so");
    assert!(is_shim(b"libomps_shim.so", own));
    assert!(!is_shim(b"/elsewhere/libother.so", own));
}

#[test]
fn the_libcuda_directory_of_the_shim_leaves_ld_library_path() {
    let ours = |e: &[u8]| e == b"libomps_shim.so";
    let dir = |d: &[u8]| d == b"/opt/omps/lib";
    let env = vec![
        ("LD_PRELOAD".into(), "libomps_shim.so".into()),
        (
            "LD_LIBRARY_PATH".into(),
            "/usr/lib:/opt/omps/lib::/x".into(),
        ),
    ];
    let next = next_env(env, &ours, &dir).unwrap();
    let lp = next.iter().find(|(k, _)| k == "LD_LIBRARY_PATH").unwrap();
    assert_eq!(lp.1, "/usr/lib::/x");
}
