//! Device text in tests: this process's fd 1 captured, and printing kernels of the host GPU.
#![allow(dead_code)]

use omps_shim::api::exec::*;
use omps_shim::api::mem::*;
use omps_shim::api::module::*;
use omps_shim::cuda::*;
use std::ffi::c_void;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::null_mut;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn ok(r: CUresult) {
    assert_eq!(r, CUDA_SUCCESS, "CUDA call failed");
}

/// This process's fd 1 (or 2), pointed at a pipe that a thread drains, until dropped.
pub struct CapturedStdout {
    fd: i32,
    saved: OwnedFd,
    seen: Arc<Mutex<Vec<u8>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl CapturedStdout {
    pub fn start() -> CapturedStdout {
        Self::fd(1)
    }

    /// Takes over `fd` (1 or 2) instead.
    pub fn fd(fd: i32) -> CapturedStdout {
        let mut fds = [0; 2];
        // SAFETY: fds has room for two descriptors; dup/dup2 on descriptors we own.
        let (saved, read_end) = unsafe {
            assert_eq!(libc::pipe(fds.as_mut_ptr()), 0);
            let saved = OwnedFd::from_raw_fd(libc::dup(fd));
            assert!(libc::dup2(fds[1], fd) >= 0);
            libc::close(fds[1]);
            (saved, std::fs::File::from_raw_fd(fds[0]))
        };
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        let reader = std::thread::spawn(move || {
            let mut r = read_end;
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) = r.read(&mut buf) {
                s.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        CapturedStdout {
            fd,
            saved,
            seen,
            reader: Some(reader),
        }
    }

    /// What fd 1 received, once `want` bytes are there or a second has passed.
    pub fn text(&self, want: usize) -> String {
        let t = Instant::now();
        while self.seen.lock().unwrap().len() < want && t.elapsed() < Duration::from_secs(1) {
            std::thread::sleep(Duration::from_millis(5));
        }
        String::from_utf8_lossy(&self.seen.lock().unwrap()).into_owned()
    }
}

impl Drop for CapturedStdout {
    fn drop(&mut self) {
        // SAFETY: puts the saved descriptor back as fd 1, which closes the pipe's last
        // write end, so the reader ends.
        unsafe { libc::dup2(self.saved.as_raw_fd(), self.fd) };
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}

/// Loads a module image, uploads `text`, and returns a launcher for `kernel(text)`.
///
/// # Safety
/// A context is current.
pub unsafe fn printer(image: &str, text: &str) -> impl Fn(CUstream) {
    // SAFETY: forwarded.
    unsafe { kernel_with_text(image, c"print", text) }
}

/// Loads a module image, uploads `text`, and returns a launcher for `kernel(ptr, len)`.
///
/// # Safety
/// A context is current.
pub unsafe fn kernel_with_text(
    image: &str,
    kernel: &std::ffi::CStr,
    text: &str,
) -> impl Fn(CUstream) {
    let mut m = null_mut();
    // SAFETY: the image is NUL-terminated text.
    ok(unsafe { cuModuleLoadData(&mut m, image.as_ptr() as *const c_void) });
    let mut f = null_mut();
    // SAFETY: valid module and out-pointer.
    ok(unsafe { cuModuleGetFunction(&mut f, m, kernel.as_ptr()) });
    let mut p = 0;
    // SAFETY: valid out-pointer; the copy reads text.len() bytes of text.
    unsafe {
        ok(cuMemAlloc_v2(&mut p, text.len()));
        ok(cuMemcpyHtoD_v2(
            p,
            text.as_ptr() as *const c_void,
            text.len(),
        ));
    }
    let len = text.len() as u32;
    move |s| {
        let (mut ptr, mut n) = (p, len);
        let mut args = [
            &mut ptr as *mut u64 as *mut c_void,
            &mut n as *mut u32 as *mut c_void,
        ];
        // SAFETY: the arguments match kernel(ptr u64, len u32).
        ok(unsafe { cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, args.as_mut_ptr(), null_mut()) });
    }
}
