//! A client's launches held back a moment to go to the GPU as one run ([`PendingRun`];
//! issue 25: past one context's launch ceiling, gpu/cuda/batch.rs).
//!
//! Consecutive launches without attributes on one client stream, outside captures, are
//! gathered while the lane reads the client's ring, and go out as graph launches when a
//! record of any other kind comes, a launch on another stream or with attributes, when
//! [`MAX_RUN`] are gathered, and in any case at the end of the client's turn in the pass
//! (worker/run.rs): no launch waits for a later record. Only launches of a shape (function,
//! grid, block, shared memory) this client already launched one by one and the driver took
//! are gathered, so a launch the driver would refuse goes alone and gets its own error.

use std::collections::HashSet;

/// Launches gathered at most before they go.
pub const MAX_RUN: usize = 32;
/// Shapes remembered at most (the set starts again past this).
const MAX_SHAPES: usize = 1024;

/// A launch's shape: function handle, grid, block, dynamic shared memory.
pub(in crate::session) type Shape = (u64, [u32; 3], [u32; 3], u32);

#[derive(Default)]
pub(in crate::session) struct PendingRun {
    /// The client stream and work stream of the launches gathered.
    client_stream: u32,
    work: usize,
    /// Gathered launches: shape and the range of `args` that is theirs.
    launches: Vec<(Shape, std::ops::Range<usize>)>,
    args: Vec<u8>,
    proven: HashSet<Shape>,
}

/// A run taken to be launched: its work stream, launches and their argument bytes.
pub(in crate::session) struct Run {
    pub(in crate::session) work: usize,
    pub(in crate::session) launches: Vec<(Shape, std::ops::Range<usize>)>,
    pub(in crate::session) args: Vec<u8>,
}

impl PendingRun {
    /// Whether a launch on client stream `stream` must wait for the gathered run to go
    /// first (it is on another stream, whose ordering events must follow the run).
    pub(in crate::session) fn other_stream(&self, stream: u32) -> bool {
        !self.launches.is_empty() && self.client_stream != stream
    }

    /// Whether a launch of `shape` may join a run: the driver took that shape alone.
    pub(in crate::session) fn proven(&self, shape: &Shape) -> bool {
        self.proven.contains(shape)
    }

    /// The driver took a launch of `shape` alone.
    pub(in crate::session) fn prove(&mut self, shape: Shape) {
        if self.proven.len() >= MAX_SHAPES {
            self.proven.clear();
        }
        self.proven.insert(shape);
    }

    /// Functions may have gone (a module unloaded): shapes are proven again.
    pub(in crate::session) fn forget_shapes(&mut self) {
        self.proven.clear();
    }

    /// Whether the run is gathered on another work stream than `work`.
    pub(in crate::session) fn other_work(&self, work: usize) -> bool {
        !self.launches.is_empty() && self.work != work
    }

    /// Gathers a launch; true once the run is full (it must go now).
    pub(in crate::session) fn push(
        &mut self,
        stream: u32,
        work: usize,
        shape: Shape,
        args: &[u8],
    ) -> bool {
        self.client_stream = stream;
        self.work = work;
        let at = self.args.len();
        self.args.extend_from_slice(args);
        self.launches.push((shape, at..self.args.len()));
        self.launches.len() >= MAX_RUN
    }

    /// The gathered run, taken (None when empty).
    pub(in crate::session) fn take(&mut self) -> Option<Run> {
        if self.launches.is_empty() {
            return None;
        }
        Some(Run {
            work: self.work,
            launches: std::mem::take(&mut self.launches),
            args: std::mem::take(&mut self.args),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: Shape = (0x10, [1, 1, 1], [64, 1, 1], 0);

    #[test]
    fn gathers_on_one_stream_until_full() {
        let mut p = PendingRun::default();
        assert!(p.take().is_none());
        assert!(!p.other_stream(3), "nothing gathered: nothing to wait for");
        for i in 0..MAX_RUN - 1 {
            assert!(!p.push(3, 7, A, &[i as u8; 8]));
        }
        assert!(p.other_stream(4) && !p.other_stream(3));
        assert!(p.other_work(8) && !p.other_work(7));
        assert!(p.push(3, 7, A, &[0xff; 8]), "full at MAX_RUN");
        let r = p.take().expect("a run");
        assert_eq!((r.work, r.launches.len()), (7, MAX_RUN));
        assert_eq!(&r.args[r.launches[1].1.clone()], &[1u8; 8]);
        assert_eq!(&r.args[r.launches[MAX_RUN - 1].1.clone()], &[0xff; 8]);
        assert!(p.take().is_none());
    }

    #[test]
    fn only_proven_shapes_and_the_set_is_bounded() {
        let mut p = PendingRun::default();
        assert!(!p.proven(&A));
        p.prove(A);
        assert!(p.proven(&A));
        for f in 0..MAX_SHAPES as u64 {
            p.prove((0x1000 + f, [1, 1, 1], [1, 1, 1], 0));
        }
        assert!(p.proven.len() <= MAX_SHAPES);
        p.forget_shapes();
        assert!(!p.proven(&(0x1000, [1, 1, 1], [1, 1, 1], 0)));
    }
}
