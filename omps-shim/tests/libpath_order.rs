//! The shim found by name as libcuda.so.1 (LD_LIBRARY_PATH) by a program whose link line
//! names libc before libcuda, as nvcc's does for samples linked with -lcuda: nothing after
//! the shim in the load order defines dlopen, and the shim must still find libc's rather
//! than abort (simpleDrvRuntime and ptxjit did, through LD_LIBRARY_PATH only).

use std::path::PathBuf;
use std::process::Command;

/// The cdylib cargo built for this test run: beside the test binary in deps/ (cargo
/// test builds it there and does not copy it up to target/<profile>/).
fn shim() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let p = exe.parent().unwrap().join("libomps_shim.so");
    assert!(p.exists(), "{} was not built", p.display());
    p
}

#[test]
fn a_program_linking_libc_first_loads_the_shim_by_name() {
    let dir = std::env::temp_dir().join(format!("omps-libpath-order-{}", std::process::id()));
    let lib = dir.join("lib");
    std::fs::create_dir_all(&lib).unwrap();
    let _ = std::fs::remove_file(lib.join("libcuda.so.1"));
    let _ = std::fs::remove_file(lib.join("libcuda.so"));
    std::os::unix::fs::symlink(shim(), lib.join("libcuda.so.1")).unwrap();
    std::os::unix::fs::symlink(shim(), lib.join("libcuda.so")).unwrap();
    let src = dir.join("prog.c");
    std::fs::write(
        &src,
        r#"#include <stdio.h>
int cuDriverGetVersion(int *v);
int cuGetProcAddress_v2(const char *name, void **fn, int version, unsigned long long flags, int *status);
int main(void) {
    int v = -1, st = -1;
    void *fn = 0;
    int r1 = cuDriverGetVersion(&v);
    int r2 = cuGetProcAddress_v2("cuInit", &fn, 13000, 0, &st);
    printf("version %d %d lookup %d %d found %d\n", r1, v, r2, st, fn != 0);
    return 0;
}
"#,
    )
    .unwrap();
    let exe = dir.join("prog");
    let cc = Command::new("cc")
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .args(["-Wl,--no-as-needed", "-lc"])
        .arg(format!("-L{}", lib.display()))
        .arg("-l:libcuda.so.1")
        .status()
        .expect("cc runs");
    assert!(cc.success(), "the test program builds");
    let needed = Command::new("readelf").arg("-d").arg(&exe).output();
    if let Ok(out) = needed {
        let text = String::from_utf8_lossy(&out.stdout);
        let libc_at = text.find("libc.so.6");
        let cuda_at = text.find("libcuda.so");
        assert!(
            libc_at < cuda_at,
            "the program must name libc before libcuda:\n{text}"
        );
    }
    let dead = dir.join("no-server");
    let out = Command::new(&exe)
        .env("LD_LIBRARY_PATH", &lib)
        .env_remove("LD_PRELOAD")
        .env("OMPS_PIPE_DIRECTORY", &dead)
        .env("OMPS_CONNECT_WAIT", "0")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the program ended with {} (stderr: {err})",
        out.status
    );
    assert!(
        text.contains("found 1"),
        "cuGetProcAddress found cuInit: {text} {err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
