//! Graphs built by hand: `cuGraphCreate`, `cuGraphAdd*Node`, edges, clones. Such a graph
//! lives here, in the client, as nodes and edges. `cuGraphInstantiate` turns it into a
//! capture on the server: the nodes are issued in dependency order onto private streams
//! of this client, an edge between two streams becomes an event, and the server
//! instantiates what it captured. So the server sees only stream work it already checks
//! (launches, memsets, copies), and no new wire operation exists for graphs built by hand.
//!
//! Node kinds: kernel, memset, memcpy, empty, event record and wait, host, memory
//! allocation and free (mem_nodes.rs), child graphs built by hand (inlined), and
//! conditional nodes (cond.rs: these need a graph op of the server's).

use crate::cuda::*;
use crate::handles::{leak, GraphHandle, GRAPH_MAGIC};
use crate::state::capture::CUgraph;
use crate::state::entry::{entry, out};
use std::ffi::c_uint;

mod cond;
mod edges;
mod emit;
mod exec_source;
mod mem_nodes;
mod nodes;
mod queries;
mod registry;
mod server_child;
mod server_graph;
mod to_graph;
mod types;
pub use cond::*;
pub use edges::*;
pub(crate) use emit::capture_then;
pub(crate) use exec_source::*;
pub use mem_nodes::*;
pub use nodes::*;
pub use queries::*;
pub use registry::*;
pub(crate) use server_graph::cond_call;
pub use to_graph::*;
pub use types::*;

/// # Safety
/// `ph` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuGraphCreate(ph: *mut CUgraph, flags: c_uint) -> CUresult {
    entry(|| {
        if ph.is_null() || flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let dev = crate::state::ctx::current_dev()?;
        let h = leak(GraphHandle::new(GRAPH_MAGIC, 0, dev));
        registry::with(|r| {
            r.graphs.insert(
                h as usize,
                types::Built {
                    dev,
                    nodes: Vec::new(),
                    home: None,
                },
            )
        });
        // SAFETY: checked non-null; the caller's pointer.
        unsafe { out(ph, h) }
    })
}
