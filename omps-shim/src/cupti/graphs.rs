//! The timed nodes of executable graphs a traced program replays (docs/design.md 12b,
//! design G): asked of the server once per executable graph (GraphProfileInfo, a page of
//! nodes a round trip) and kept; an executable graph the server cannot make a twin of is
//! remembered as untimed and said once.

use crate::state::entry::live;
use omps_ring::wire::{self, Op};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

type Nodes = Arc<Vec<wire::ProfiledNode>>;
/// (GPU, executable graph) -> its timed nodes, or None: untimed.
type Known = HashMap<(usize, u32), Option<Nodes>>;

static KNOWN: Mutex<Option<Known>> = Mutex::new(None);

/// The timed nodes of executable graph `exec` (the server's id) on GPU `dev`; None when
/// its replays cannot be timed.
pub fn timed_nodes(dev: usize, exec: u32) -> Option<Nodes> {
    if let Some(known) = KNOWN
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_or_insert_with(HashMap::new)
        .get(&(dev, exec))
    {
        return known.clone();
    }
    let asked = crate::state::profile::quiet(|| ask(dev, exec));
    if asked.is_none() {
        crate::unsupported::say_once("untimed CUDA graph", || {
            "omps: a CUDA graph's kernels are not timed for the profiler (its graph changed after it was instantiated, or the server cannot copy it); its replays run as usual".to_string()
        });
    }
    let nodes = asked.map(Arc::new);
    KNOWN
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_or_insert_with(HashMap::new)
        .insert((dev, exec), nodes.clone());
    nodes
}

fn ask(dev: usize, exec: u32) -> Option<Vec<wire::ProfiledNode>> {
    let c = live().ok()?;
    let (hdr, node) = (
        std::mem::size_of::<wire::ProfiledNodes>(),
        std::mem::size_of::<wire::ProfiledNode>(),
    );
    let mut out = Vec::new();
    loop {
        let mut ch = c.channel();
        ch.call(dev, Op::GraphProfileInfo, |call| {
            bytemuck::bytes_of(&wire::GraphProfileInfo {
                call,
                exec,
                first: out.len() as u32,
            })
            .to_vec()
        })
        .ok()?;
        let bytes = ch.reply_bytes(hdr + wire::PROFILED_PER_REPLY * node);
        let head: wire::ProfiledNodes = bytemuck::pod_read_unaligned(&bytes[..hdr]);
        let count = (head.count as usize).min(wire::PROFILED_PER_REPLY);
        out.extend(
            bytes[hdr..hdr + count * node]
                .chunks_exact(node)
                .map(bytemuck::pod_read_unaligned::<wire::ProfiledNode>),
        );
        if count == 0 || out.len() >= head.total as usize {
            return Some(out);
        }
    }
}
