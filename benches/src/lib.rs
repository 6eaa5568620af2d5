//! Fixtures for the transport benchmarks: a memfd holding two rings, and a child process
//! (the benchmark binary itself, re-run with [`CHILD_ENV`]) that busy-polls one ring and
//! answers on the other.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::process::Command;

use omps_ring::ring::{Consumer, Producer, PushError, RingHeader, RING_HEADER_BYTES};
use omps_ring::shm::{check_segment, create_segment, Mapping};

/// Set in the child's environment to the number of the inherited segment fd.
pub const CHILD_ENV: &str = "OMPS_BENCH_CHILD_FD";
pub const CAPACITY: usize = 1 << 20;

/// The child sends the payload back.
pub const ECHO: u32 = 1;
/// The child only consumes the record.
pub const SINK: u32 = 2;
/// The child exits.
pub const STOP: u32 = 3;

// Ring A carries parent -> child, ring B child -> parent.
const HEADER_A: usize = 0;
const HEADER_B: usize = RING_HEADER_BYTES;
const DATA_A: usize = 4096;
const DATA_B: usize = DATA_A + CAPACITY;
const SEGMENT_LEN: usize = DATA_B + CAPACITY;

struct Segment {
    map: Mapping,
}

impl Segment {
    fn ring(&self, header: usize, data: usize) -> (*const RingHeader, *mut u8) {
        let base = self.map.as_ptr();
        // SAFETY: both offsets are inside the mapping (SEGMENT_LEN covers them).
        unsafe { (base.add(header).cast(), base.add(data)) }
    }

    /// # Safety
    /// Called once per segment, by the side that pushes into A and pops from B.
    unsafe fn parent_ends(&self) -> (Producer, Consumer) {
        let (a, a_data) = self.ring(HEADER_A, DATA_A);
        let (b, b_data) = self.ring(HEADER_B, DATA_B);
        // SAFETY: the mapping outlives the ends (they are dropped with it); the caller
        // promises these are the only ends on this side.
        unsafe {
            (
                Producer::new(a, a_data, CAPACITY),
                Consumer::new(b, b_data, CAPACITY),
            )
        }
    }

    /// # Safety
    /// Called once per segment, by the side that pops from A and pushes into B.
    unsafe fn child_ends(&self) -> (Consumer, Producer) {
        let (a, a_data) = self.ring(HEADER_A, DATA_A);
        let (b, b_data) = self.ring(HEADER_B, DATA_B);
        // SAFETY: as for `parent_ends`.
        unsafe {
            (
                Consumer::new(a, a_data, CAPACITY),
                Producer::new(b, b_data, CAPACITY),
            )
        }
    }
}

fn push_spinning(producer: &mut Producer, tag: u32, payload: &[u8]) {
    loop {
        match producer.try_push(tag, &[payload]) {
            Ok(()) => return,
            Err(PushError::Full) => std::hint::spin_loop(),
            Err(e) => panic!("push: {e}"),
        }
    }
}

/// The parent's handle on a child serving the two rings; stops it on drop.
pub struct Child {
    process: std::process::Child,
    to_child: Producer,
    from_child: Consumer,
    // Last: the ends above point into it.
    _segment: Segment,
}

impl Child {
    /// Re-runs the current executable as the child; its `main` must call
    /// [`serve_if_child`] first thing.
    pub fn spawn() -> io::Result<Child> {
        let fd = create_segment("omps-bench", SEGMENT_LEN)?;
        let segment = Segment {
            map: Mapping::map(fd.as_fd(), SEGMENT_LEN)?,
        };
        // SAFETY: the segment is new; this is its only parent side.
        let (to_child, from_child) = unsafe { segment.parent_ends() };
        // SAFETY: plain syscall on an fd we own; the dup lacks FD_CLOEXEC, so the
        // child inherits it.
        let raw = unsafe { libc::dup(fd.as_raw_fd()) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: dup just gave us this fd.
        let inherited = unsafe { OwnedFd::from_raw_fd(raw) };
        let process = Command::new(std::env::current_exe()?)
            .env(CHILD_ENV, raw.to_string())
            .spawn()?;
        drop(inherited);
        Ok(Child {
            process,
            to_child,
            from_child,
            _segment: segment,
        })
    }

    /// Pushes one record, spinning while the ring is full.
    pub fn push(&mut self, tag: u32, payload: &[u8]) {
        push_spinning(&mut self.to_child, tag, payload);
    }

    /// Pops one answer, spinning until it arrives.
    pub fn pop(&mut self, out: &mut Vec<u8>) -> u32 {
        loop {
            match self.from_child.pop_into(out) {
                Ok(Some(tag)) => return tag,
                Ok(None) => std::hint::spin_loop(),
                Err(e) => panic!("pop: {e}"),
            }
        }
    }

    /// Spins until the child has consumed everything pushed so far.
    pub fn wait_drained(&self) {
        while !self.to_child.is_drained() {
            std::hint::spin_loop();
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        self.push(STOP, &[]);
        let status = self.process.wait();
        if !std::thread::panicking() {
            assert!(
                status.map(|s| s.success()).unwrap_or(false),
                "bench child failed"
            );
        }
    }
}

/// If this process is a benchmark's child, serves until told to stop and exits;
/// otherwise returns at once.
pub fn serve_if_child() {
    let Ok(raw) = std::env::var(CHILD_ENV) else {
        return;
    };
    // Should the parent die without stopping us, do not spin forever.
    // SAFETY: plain syscall with integer arguments.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    // SAFETY: the parent dup'ed this fd for us to own and inherit.
    let fd = unsafe { OwnedFd::from_raw_fd(raw.parse().expect("fd number")) };
    check_segment(fd.as_fd(), SEGMENT_LEN).expect("segment");
    let segment = Segment {
        map: Mapping::map(fd.as_fd(), SEGMENT_LEN).expect("mapping"),
    };
    // SAFETY: the parent holds the other ends; these are this side's only ones.
    let (mut requests, mut answers) = unsafe { segment.child_ends() };
    let mut buf = Vec::with_capacity(CAPACITY);
    loop {
        match requests.pop_into(&mut buf).expect("corrupt request ring") {
            Some(ECHO) => push_spinning(&mut answers, ECHO, &buf),
            Some(SINK) => {}
            Some(STOP) => std::process::exit(0),
            Some(tag) => panic!("unknown tag {tag}"),
            None => std::hint::spin_loop(),
        }
    }
}
