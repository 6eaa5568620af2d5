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
//! (session/compile.rs). Each job runs on a thread of its own, up to [`MAX_THREADS`] per
//! GPU: a compile that takes long, even one the driver never ends, holds one thread and
//! its own client, never another client's load.
//!
//! A *process* (its account, crate::client::account, shared by all its connections) has
//! at most one job queued or running, over all its connections and GPUs, and keeps it
//! after it disconnects, until the job ends (review 4): its further loads wait, their
//! rings held, until it ends. So one process cannot hold more than one thread, nor fill
//! the queue, and as the queue holds at most one job per process, taking them in order
//! serves processes round robin: a process's next load goes behind every other process's
//! waiting one. Only [`MAX_THREADS`] processes compiling at once make the next one wait
//! for a thread.
//!
//! A job whose client is gone is not run: its thread drops it when it comes to it, and a
//! new job clears such jobs (and their image bytes) from the queue; the work itself looks
//! again between the verifier and the driver (session/compile.rs). The queue holds at
//! most [`MAX_QUEUED`] jobs besides; a load beyond waits, its ring held, for room.
//!
//! Unit tests and the fuzz targets drive sessions without lanes: there the work runs on
//! the caller's thread, as before ([`Compiler::threaded`] is set by the lanes).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// Compile threads per GPU: at most this many clients' loads run at once.
pub const MAX_THREADS: usize = 8;
/// Jobs queued at most per GPU (each of a different process: see the module's notes); a
/// load beyond waits for room, its ring held.
pub const MAX_QUEUED: usize = 256;
/// How often an idle compile thread looks whether its GPU's Compiler is gone (then it ends).
/// While the Compiler lives its threads stay, however long idle: threads that ended after
/// 10 s idle and were started again for the next loads left the server's anonymous memory
/// 31 MB higher after 4 PyTorch clients were killed in the soak, 66 MB after 16 (1.6 MB
/// when loads ran on the lanes, which never end). Per-thread state of the driver, or the
/// new threads' malloc arenas, is the likely holder (not yet confirmed on a GPU: the soak
/// with `SOAK_KILLS=40` and 16 PyTorch kills tells, docs/benchmarks.md).
const IDLE: Duration = if cfg!(test) {
    Duration::from_millis(50)
} else {
    Duration::from_secs(10)
};

/// A job, and whether it is still wanted (false once its client is gone: then it is
/// dropped unrun, which gives back what it holds).
struct Job {
    wanted: Box<dyn Fn() -> bool + Send>,
    run: Box<dyn FnOnce() + Send>,
}

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

    /// Whether the queue has room for another job ([`MAX_QUEUED`]); jobs no longer
    /// wanted are cleared from it first.
    pub fn has_room(&self) -> bool {
        let mut q = self.inner.lock();
        let gone = q.clear_unwanted();
        let room = q.jobs.len() < MAX_QUEUED;
        drop(q);
        drop(gone);
        room
    }

    /// Runs `job` on a compile thread, a new one if none is idle and fewer than
    /// [`MAX_THREADS`] run; else it waits for the first thread free, and is dropped unrun
    /// if `wanted` no longer holds by then. Run at once on this thread while not
    /// [`Compiler::threaded`].
    pub fn submit(
        &self,
        wanted: impl Fn() -> bool + Send + 'static,
        job: impl FnOnce() + Send + 'static,
    ) {
        if !self.threaded() {
            job();
            return;
        }
        let mut q = self.inner.lock();
        // Dropped once the lock is let go (a job's drop gives back what it holds).
        let gone = q.clear_unwanted();
        q.jobs.push_back(Job {
            wanted: Box::new(wanted),
            run: Box::new(job),
        });
        if q.idle >= q.jobs.len() {
            self.inner.ready.notify_one();
            return;
        }
        if q.threads < MAX_THREADS {
            let inner = self.inner.clone();
            let started = std::thread::Builder::new()
                .name("omps-compile".into())
                .spawn(move || Inner::serve(&inner));
            match started {
                Ok(_) => q.threads += 1,
                // No thread to be had: an idle one, or one done with its job, takes it.
                Err(e) => tracing::warn!("cannot start a compile thread: {e}"),
            }
        }
        if q.threads == 0 {
            // Not one thread: the work runs here, as without compile threads.
            if let Some(job) = q.jobs.pop_back() {
                drop(q);
                (job.run)();
            }
        }
        drop(gone);
    }
}

impl Queue {
    /// Takes the jobs no longer wanted out of the queue, to be dropped without the lock.
    fn clear_unwanted(&mut self) -> VecDeque<Job> {
        if self.jobs.iter().all(|j| (j.wanted)()) {
            return VecDeque::new();
        }
        let (keep, gone): (VecDeque<Job>, VecDeque<Job>) = std::mem::take(&mut self.jobs)
            .into_iter()
            .partition(|j| (j.wanted)());
        self.jobs = keep;
        gone
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A compile thread: runs jobs until its Compiler is gone (looked at every [`IDLE`]).
    fn serve(this: &Arc<Inner>) {
        let mut q = this.lock();
        loop {
            if let Some(job) = q.jobs.pop_front() {
                q.running += 1;
                drop(q);
                // A job whose client is gone is dropped unrun (its drop gives back).
                if (job.wanted)() {
                    // A panic in a job (a bug) ends that job, not the thread's count: the
                    // job's client learns through its slot's drop (session/compile.rs).
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job.run));
                } else {
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(job)));
                }
                q = this.lock();
                q.running -= 1;
                continue;
            }
            q.idle += 1;
            let (next, waited) = this
                .ready
                .wait_timeout(q, IDLE)
                .unwrap_or_else(|e| e.into_inner());
            q = next;
            q.idle -= 1;
            // Only the threads hold the queue now: its Compiler (its GPU) is gone.
            if waited.timed_out() && q.jobs.is_empty() && Arc::strong_count(this) <= q.threads {
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
    fn idle_threads_stay_while_the_compiler_lives_and_end_after() {
        let c = Compiler::default();
        c.go_threaded();
        let (tx, rx) = std::sync::mpsc::channel();
        c.submit(|| true, move || tx.send(()).unwrap());
        rx.recv_timeout(Duration::from_secs(5)).unwrap();
        std::thread::sleep(IDLE * 4);
        assert_eq!(c.inner.lock().threads, 1, "an idle thread stays");
        let inner = Arc::downgrade(&c.inner);
        drop(c);
        let t = Instant::now();
        while inner.upgrade().is_some() {
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "the thread ended with its Compiler"
            );
            std::thread::sleep(IDLE);
        }
    }

    #[test]
    fn a_long_job_does_not_hold_up_the_next() {
        let c = Compiler::default();
        c.go_threaded();
        let (tx, rx) = std::sync::mpsc::channel();
        let slow = tx.clone();
        c.submit(
            || true,
            move || {
                std::thread::sleep(Duration::from_millis(500));
                let _ = slow.send("slow");
            },
        );
        let t = Instant::now();
        c.submit(
            || true,
            move || {
                let _ = tx.send("quick");
            },
        );
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
    fn a_job_no_longer_wanted_is_dropped_unrun() {
        let c = Compiler::default();
        c.go_threaded();
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        // Every thread held, so the next job queues.
        for _ in 0..MAX_THREADS {
            let gate = gate.clone();
            c.submit(
                || true,
                move || {
                    let (m, cv) = &*gate;
                    drop(cv.wait_while(m.lock().unwrap(), |open| !*open).unwrap());
                },
            );
        }
        struct Dropped(Arc<AtomicBool>);
        impl Drop for Dropped {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let (ran, dropped, wanted) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(true)),
        );
        let (r, d, w) = (ran.clone(), Dropped(dropped.clone()), wanted.clone());
        c.submit(
            move || w.load(Ordering::SeqCst),
            move || {
                let _d = d;
                r.store(true, Ordering::SeqCst);
            },
        );
        assert!(c.has_room());
        wanted.store(false, Ordering::SeqCst);
        // Cleared from the queue, its bytes given back, before a thread is free.
        assert!(c.has_room());
        assert!(dropped.load(Ordering::SeqCst), "dropped from the queue");
        let (m, cv) = &*gate;
        *m.lock().unwrap() = true;
        cv.notify_all();
        let end = Instant::now() + Duration::from_secs(2);
        while c.busy() && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(!ran.load(Ordering::SeqCst), "never run");
    }

    #[test]
    fn without_lanes_work_runs_at_once() {
        let c = Compiler::default();
        let ran = Arc::new(AtomicBool::new(false));
        let r = ran.clone();
        c.submit(|| true, move || r.store(true, Ordering::SeqCst));
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
            c.submit(
                || true,
                move || {
                    let (m, cv) = &*gate;
                    drop(cv.wait_while(m.lock().unwrap(), |open| !*open).unwrap());
                    let _ = tx.send(k);
                },
            );
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
