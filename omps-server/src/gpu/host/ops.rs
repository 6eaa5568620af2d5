//! The host GPU's graph work as a captured stream records it (kept apart from its replay
//! in replay.rs, so that the GPU's state can hold recorded graphs).

/// Work a captured stream records instead of running (the host GPU's graphs).
#[derive(Clone, Debug)]
pub(super) enum HostOp {
    Launch {
        func: u64,
        args: Vec<u8>,
    },
    Memset {
        dst: u64,
        value: u32,
        elem: u32,
        count: usize,
    },
    Dtod {
        dst: u64,
        src: u64,
        len: usize,
    },
    /// A store into a registered host word (a graph's host node).
    Word {
        addr: usize,
        value: u32,
    },
    /// A wait until a registered host word holds `value` (a graph's host node): a replay
    /// waits for the client's host-function thread, as a GPU does.
    WaitEq {
        addr: usize,
        value: u32,
    },
    /// Copies between device memory and registered host memory.
    Htod {
        dst: u64,
        src: usize,
        len: usize,
    },
    Dtoh {
        dst: usize,
        src: u64,
        len: usize,
    },
    /// An event-record node of a profiling twin: `node` names it, `event` is the event a
    /// launch pointed it at (0: none yet, it records nothing).
    Record {
        node: u64,
        event: u64,
    },
    /// A conditional node: its handle, CUgraphConditionalNodeType and body graphs, whose
    /// work an instantiation copies into `run`.
    Cond {
        handle: u64,
        kind: u32,
        bodies: Vec<u64>,
        run: Vec<Vec<HostOp>>,
    },
}

/// The conditional handles of `ops`' conditional nodes, bodies included.
pub(super) fn cond_handles(ops: &[HostOp]) -> Vec<u64> {
    ops.iter()
        .flat_map(|op| match op {
            HostOp::Cond { handle, run, .. } => std::iter::once(*handle)
                .chain(run.iter().flat_map(|b| cond_handles(b)))
                .collect(),
            _ => Vec::new(),
        })
        .collect()
}
