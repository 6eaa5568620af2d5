//! Module loads, JIT compiles and links off the lanes (issue 23: no client can stall
//! another).
//!
//! A load of an image the server has not seen goes first to the image verifier's child
//! ([`crate::image::verifier`], up to a minute; five for a link or a JIT compile), and then to
//! the driver, which parses, compiles PTX or links again, with no deadline at all. On a
//! lane that held up every other client of the lane for as long: PTX made to compile
//! slowly, one byte changed each time, stopped them for minutes.
//!
//! So a lane hands that work to its GPU's [`Compiler`]: worker threads of their own
//! (the driver is thread-safe; each call makes the GPU's context current on its thread).
//! The client waits, its ring untouched, as a client held back for its depth does; the
//! lane serves its other clients and completes the record when the work is done
//! (session/compile.rs). A client has at most one such record in flight per GPU (its ring
//! is held meanwhile), and each runs on a thread of its own up to [`MAX_THREADS`] per
//! GPU: a compile that takes long, even one the driver never ends, holds one thread and
//! its own client, never another client's load. Only [`MAX_THREADS`] clients compiling at
//! once make the next one wait for a thread.
//!
//! Unit tests and the fuzz targets drive sessions without lanes: there the work runs on
//! the caller's thread, as before ([`Compiler::threaded`] is set by the lanes).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// Compile threads per GPU: at most this many clients' loads run at once.
pub const MAX_THREADS: usize = 8;
/// How long an idle compile thread waits for work before it ends.
const IDLE: Duration = Duration::from_secs(10);

type Job = Box<dyn FnOnce() + Send>;

/// One GPU's compile threads.
#[derive(Default)]
pub struct Compiler {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    queue: Mutex<Queue>,
    ready: Condvar,
    /// Set by the lanes: work goes to threads (else it runs on the caller's thread).
    threaded: AtomicBool,
}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    /// Threads started and not ended, and those of them waiting for a job.
    threads: usize,
    idle: usize,
    /// Jobs taken and not yet done.
    running: usize,
}

impl Compiler {
    /// From now on, work runs on compile threads (a lane calls it as it starts).
    pub fn go_threaded(&self) {
        self.inner.threaded.store(true, Ordering::SeqCst);
    }

    /// Whether work runs on compile threads.
    pub fn threaded(&self) -> bool {
        self.inner.threaded.load(Ordering::SeqCst)
    }

    /// Whether work is queued or running (the context is not reset meanwhile: the work
    /// is in the driver, or holds a module of the context).
    pub fn busy(&self) -> bool {
        let q = self.inner.lock();
        !q.jobs.is_empty() || q.running > 0
    }

    /// Runs `job` on a compile thread, a new one if none is idle and fewer than
    /// [`MAX_THREADS`] run; else it waits for the first thread free. Run at once on this
    /// thread while not [`Compiler::threaded`].
    pub fn submit(&self, job: impl FnOnce() + Send + 'static) {
        if !self.threaded() {
            job();
            return;
        }
        let mut q = self.inner.lock();
        q.jobs.push_back(Box::new(job));
        if q.idle >= q.jobs.len() {
            self.inner.ready.notify_one();
            return;
        }
        if q.threads < MAX_THREADS {
            let inner = self.inner.clone();
            let started = std::thread::Builder::new()
                .name("omps-compile".into())
                .spawn(move || inner.serve());
            match started {
                Ok(_) => q.threads += 1,
                // No thread to be had: an idle one, or one done with its job, takes it.
                Err(e) => tracing::warn!("cannot start a compile thread: {e}"),
            }
        }
        if q.threads == 0 {
            // Not one thread: the work runs here, as without compile threads.
            let job = q.jobs.pop_back().expect("pushed above");
            drop(q);
            job();
        }
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A compile thread: runs jobs until idle for [`IDLE`].
    fn serve(&self) {
        let mut q = self.lock();
        loop {
            if let Some(job) = q.jobs.pop_front() {
                q.running += 1;
                drop(q);
                // A panic in a job (a bug) ends that job, not the thread's count: the
                // job's client learns through its slot's drop (session/compile.rs).
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                q = self.lock();
                q.running -= 1;
                continue;
            }
            q.idle += 1;
            let (next, waited) = self
                .ready
                .wait_timeout(q, IDLE)
                .unwrap_or_else(|e| e.into_inner());
            q = next;
            q.idle -= 1;
            if waited.timed_out() && q.jobs.is_empty() {
                q.threads -= 1;
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn a_long_job_does_not_hold_up_the_next() {
        let c = Compiler::default();
        c.go_threaded();
        let (tx, rx) = std::sync::mpsc::channel();
        let slow = tx.clone();
        c.submit(move || {
            std::thread::sleep(Duration::from_millis(500));
            let _ = slow.send("slow");
        });
        let t = Instant::now();
        c.submit(move || {
            let _ = tx.send("quick");
        });
        assert_eq!(rx.recv().unwrap(), "quick");
        assert!(t.elapsed() < Duration::from_millis(400));
        assert!(c.busy(), "the slow one still runs");
        assert_eq!(rx.recv().unwrap(), "slow");
        let end = Instant::now() + Duration::from_secs(2);
        while c.busy() && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(!c.busy());
    }

    #[test]
    fn without_lanes_work_runs_at_once() {
        let c = Compiler::default();
        let ran = Arc::new(AtomicBool::new(false));
        let r = ran.clone();
        c.submit(move || r.store(true, Ordering::SeqCst));
        assert!(ran.load(Ordering::SeqCst));
        assert!(!c.busy());
    }

    #[test]
    fn threads_stop_at_the_cap_and_the_rest_wait() {
        let c = Compiler::default();
        c.go_threaded();
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        for k in 0..MAX_THREADS + 2 {
            let (gate, tx) = (gate.clone(), tx.clone());
            c.submit(move || {
                let (m, cv) = &*gate;
                drop(cv.wait_while(m.lock().unwrap(), |open| !*open).unwrap());
                let _ = tx.send(k);
            });
        }
        assert_eq!(c.inner.lock().threads, MAX_THREADS);
        let (m, cv) = &*gate;
        *m.lock().unwrap() = true;
        cv.notify_all();
        let mut got: Vec<usize> = (0..MAX_THREADS + 2).map(|_| rx.recv().unwrap()).collect();
        got.sort();
        assert_eq!(got, (0..MAX_THREADS + 2).collect::<Vec<_>>());
    }
}
