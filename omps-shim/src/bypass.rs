//! Stepping aside for CUDA debuggers and sanitizers (issue 26).
//!
//! compute-sanitizer, cuda-gdb and Nsight Compute work with the real driver in the process
//! they check: the sanitizer's injection library is loaded by libcuda itself at `cuInit`
//! (`CUDA_INJECTION64_PATH`), the debugger writes into the driver's debugger symbols, and
//! ncu replays kernels in the process's own context. None can see kernels that run in the
//! omps server's context. (Nsight Systems steps aside too until omps serves CUPTI's tables.) NVIDIA's documented way for MPS is to
//! run a debugged process outside MPS; the shim does that by itself: when it finds a
//! sanitizer's injection or a CUDA debugger at load, before the program's `main`, it runs
//! the program again (same PID, same arguments) without itself in `LD_PRELOAD` and prints
//! one line on stderr saying so. The program then loads the real libcuda and is debugged
//! or checked exactly as natively.
//!
//! `OMPS_BYPASS=1` asks for it whatever runs the program; `OMPS_BYPASS=0` turns it off (the
//! program is then served by omps and the tool sees nothing of its kernels). Only a shim
//! loaded through `LD_PRELOAD` can step aside: loaded through the `libcuda.so.1` link on
//! `LD_LIBRARY_PATH` it may be loaded by `dlopen` after the program began, when running it
//! again would run part of it twice; there it prints what to change instead.

use std::ffi::{CString, OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;

/// Set in the environment of the program run again: it never steps aside twice.
const DONE: &str = "OMPS_BYPASSED";

/// Why the shim should step aside, if it should: the tool it found.
pub fn wanted(
    var: &dyn Fn(&str) -> Option<OsString>,
    tracer: &dyn Fn() -> Option<String>,
) -> Option<String> {
    match var("OMPS_BYPASS").as_deref().map(OsStr::as_bytes) {
        Some(b"0") => return None,
        Some(b"1") => return Some("OMPS_BYPASS=1".into()),
        _ => {}
    }
    if var("NV_SANITIZER_INJECTION_PORT_BASE").is_some() {
        return Some("compute-sanitizer (NV_SANITIZER_INJECTION_PORT_BASE)".into());
    }
    if let Some(inj) = var("CUDA_INJECTION64_PATH") {
        let name = Path::new(&inj)
            .file_name()
            .map(|n| n.to_string_lossy().to_lowercase())
            .unwrap_or_default();
        if name.contains("sanitizer") {
            return Some(format!(
                "compute-sanitizer (CUDA_INJECTION64_PATH={})",
                inj.to_string_lossy()
            ));
        }
    }
    // Nsight Compute replays kernels and reads counters in the process's own context, and
    // Nsight Systems traces through the driver it injects into: neither can see kernels
    // that run in the server. They run on the real driver until omps serves them.
    if var("NV_NSIGHT_INJECTION_PORT_BASE").is_some() {
        return Some("Nsight Compute (NV_NSIGHT_INJECTION_PORT_BASE)".into());
    }
    if var("NSYS_PROFILING_SESSION_ID").is_some() {
        return Some("Nsight Systems (NSYS_PROFILING_SESSION_ID)".into());
    }
    // compute-sanitizer and ncu start their target through NVIDIA's launcher, which
    // preloads its own injection ahead of the program.
    if var("LD_PRELOAD").is_some_and(|p| {
        p.to_string_lossy()
            .contains("libTreeLauncherTargetInjection")
    }) {
        return Some(
            "an NVIDIA tool's launcher (libTreeLauncherTargetInjection in LD_PRELOAD)".into(),
        );
    }
    // cuda-gdb writes into the driver's own debugger symbols, which the shim has none of:
    // the tracer is the one sure sign (its variables are exported broadly by job scripts).
    // Last: it reads /proc, which every preloaded process would pay for otherwise.
    if let Some(t) = tracer() {
        if t.contains("cuda-gdb") {
            return Some(format!("a CUDA debugger ({t})"));
        }
    }
    None
}

/// The command name of the process tracing this one (`TracerPid` in /proc), if any.
fn tracer() -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let pid: u32 = status
        .lines()
        .find_map(|l| l.strip_prefix("TracerPid:"))?
        .trim()
        .parse()
        .ok()?;
    if pid == 0 {
        return None;
    }
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
    Some(format!("{} {}", comm.trim(), exe.display()))
}

/// `LD_PRELOAD` without the entries that name the shim (`ours` tells), in its own
/// separators (spaces or colons); None if it named no shim.
pub fn without_shim(preload: &[u8], ours: &dyn Fn(&[u8]) -> bool) -> Option<Vec<u8>> {
    let entries: Vec<&[u8]> = preload
        .split(|&b| b == b' ' || b == b':')
        .filter(|e| !e.is_empty())
        .collect();
    let kept: Vec<&[u8]> = entries.iter().copied().filter(|e| !ours(e)).collect();
    (kept.len() != entries.len()).then(|| kept.join(&b' '))
}

/// The environment of the program run again: `LD_PRELOAD` less the shim, `LD_LIBRARY_PATH`
/// less the directories where `libcuda.so.1` is the shim (`our_dir`: with both ways in set,
/// the program would load it again by name), [`DONE`] set.
pub fn next_env(
    env: Vec<(OsString, OsString)>,
    ours: &dyn Fn(&[u8]) -> bool,
    our_dir: &dyn Fn(&[u8]) -> bool,
) -> Option<Vec<(OsString, OsString)>> {
    let mut found = false;
    let mut out: Vec<(OsString, OsString)> = Vec::with_capacity(env.len() + 1);
    for (k, v) in env {
        if k == "LD_LIBRARY_PATH" {
            // glibc splits it at `:` and `;`.
            let kept: Vec<&[u8]> = v
                .as_bytes()
                .split(|&b| b == b':' || b == b';')
                .filter(|d| d.is_empty() || !our_dir(d))
                .collect();
            out.push((k, OsString::from_vec(kept.join(&b':'))));
            continue;
        }
        if k == "LD_PRELOAD" {
            if let Some(rest) = without_shim(v.as_bytes(), ours) {
                found = true;
                if !rest.is_empty() {
                    out.push((k, OsString::from_vec(rest)));
                }
                continue;
            }
        }
        out.push((k, v));
    }
    out.push((DONE.into(), "1".into()));
    found.then_some(out)
}

/// Whether an `LD_PRELOAD` entry is this shim: the same file, or its file name where the
/// loader searched for it.
fn is_shim(entry: &[u8], own: &Path) -> bool {
    let p = Path::new(OsStr::from_bytes(entry));
    match (std::fs::canonicalize(p), std::fs::canonicalize(own)) {
        (Ok(a), Ok(b)) if a == b => true,
        _ => !entry.contains(&b'/') && p.file_name() == own.file_name(),
    }
}

/// The shim's own file, from the loader.
fn own_path() -> Option<std::path::PathBuf> {
    // SAFETY: dladdr only reads the loader's tables; `info` is a valid out-pointer and
    // `dli_fname`, when set, a NUL-terminated string that lives while we are loaded.
    unsafe {
        let mut info: libc::Dl_info = std::mem::zeroed();
        if libc::dladdr(own_path as *const libc::c_void, &mut info) == 0 || info.dli_fname.is_null()
        {
            return None;
        }
        let name = std::ffi::CStr::from_ptr(info.dli_fname);
        Some(Path::new(OsStr::from_bytes(name.to_bytes())).to_path_buf())
    }
}

/// Runs at load (see [`AT_LOAD`]): steps aside if a debugger or sanitizer wants the real
/// driver. Returns only if the shim stays.
fn at_load() {
    if std::env::var_os(DONE).is_some() {
        return;
    }
    let Some(why) = wanted(&|k| std::env::var_os(k), &tracer) else {
        return;
    };
    let Some(own) = own_path() else { return };
    let our_dir = |d: &[u8]| {
        is_shim(
            Path::new(OsStr::from_bytes(d))
                .join("libcuda.so.1")
                .as_os_str()
                .as_bytes(),
            &own,
        )
    };
    let env = next_env(
        std::env::vars_os().collect(),
        &|e| is_shim(e, &own),
        &our_dir,
    );
    let Some(env) = env else {
        eprintln!(
            "omps: {why} found, but the shim was not loaded through LD_PRELOAD and cannot step \
             aside; run the program without omps's libcuda.so.1 directory on LD_LIBRARY_PATH"
        );
        return;
    };
    eprintln!("omps: {why} found: this process runs on the real CUDA driver, outside omps");
    let err = reexec(env);
    eprintln!(
        "omps: could not run the program again without the shim ({err}); it stays under omps"
    );
}

/// execve of this program with its own arguments and `env`; returns only on failure.
fn reexec(env: Vec<(OsString, OsString)>) -> std::io::Error {
    let argv: Vec<CString> = match std::fs::read("/proc/self/cmdline") {
        // Each argument ends with a NUL; an empty one is kept (only the split after the
        // last NUL is not an argument).
        Ok(raw) => raw
            .strip_suffix(&[0])
            .unwrap_or(&raw)
            .split(|&b| b == 0)
            .filter_map(|a| CString::new(a).ok())
            .collect(),
        Err(e) => return e,
    };
    let envp: Vec<CString> = env
        .into_iter()
        .filter_map(|(k, v)| {
            let mut kv = k.into_vec();
            kv.push(b'=');
            kv.extend(v.into_vec());
            CString::new(kv).ok()
        })
        .collect();
    let mut argv_p: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    argv_p.push(std::ptr::null());
    let mut envp_p: Vec<*const libc::c_char> = envp.iter().map(|e| e.as_ptr()).collect();
    envp_p.push(std::ptr::null());
    // SAFETY: both arrays are NULL-terminated arrays of NUL-terminated strings that live
    // across the call; execve returns only on failure.
    unsafe { libc::execve(c"/proc/self/exe".as_ptr(), argv_p.as_ptr(), envp_p.as_ptr()) };
    std::io::Error::last_os_error()
}

extern "C" fn at_load_entry() {
    at_load();
}

/// The loader runs this before the program's `main` (an ELF constructor); in the test
/// binaries that link the shim as an rlib it runs too and finds nothing to do.
#[used]
#[link_section = ".init_array"]
static AT_LOAD: extern "C" fn() = at_load_entry;

#[cfg(test)]
mod tests;
