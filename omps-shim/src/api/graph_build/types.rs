//! The tables of a graph built by hand, apart from what builds and reads them: a node's
//! kind and payloads, a built graph's nodes, and a conditional home. The other files of
//! graph_build use these; they use none of those files but server_graph.rs.

use super::server_graph::ServerGraph;
use crate::api::graph_mem::GraphAlloc;
use crate::api::hostmem::Memcpy3D;
use omps_ring::wire::{self, Op};
use std::collections::HashMap;
use std::ffi::{c_uint, c_void};
use std::sync::{Arc, Mutex};

/// CUgraphNodeType values.
pub(crate) mod node_type {
    pub const KERNEL: u32 = 0;
    pub const MEMCPY: u32 = 1;
    pub const MEMSET: u32 = 2;
    pub const HOST: u32 = 3;
    pub const GRAPH: u32 = 4;
    pub const EMPTY: u32 = 5;
    pub const WAIT_EVENT: u32 = 6;
    pub const EVENT_RECORD: u32 = 7;
    pub const MEM_ALLOC: u32 = 10;
    pub const MEM_FREE: u32 = 11;
    pub const CONDITIONAL: u32 = 13;
}

#[derive(Clone)]
pub(crate) struct KernelNode {
    pub(super) func: usize,
    pub(super) grid: [u32; 3],
    pub(super) block: [u32; 3],
    pub(super) shared: u32,
    /// The packed arguments, copied when the node was made or set, as the driver does.
    pub(super) args: Vec<u8>,
    /// Launch attributes set on the node (CUlaunchAttribute records: id, value).
    pub(super) attrs: Vec<[u8; omps_ring::wire::LAUNCH_ATTR_BYTES]>,
}

/// A copy's description; the host pointers in it are the caller's, used only to issue
/// the copy, as the driver keeps them.
#[derive(Clone, Copy)]
pub(crate) struct CopyNode(pub(super) Memcpy3D);
// SAFETY: the raw pointers are addresses the caller owns; nothing here dereferences them
// except the copy issued on the caller's behalf, from whichever thread instantiates.
unsafe impl Send for CopyNode {}

#[derive(Clone)]
pub(crate) enum Kind {
    Empty,
    Kernel(KernelNode),
    Memset(MemsetNodeParams),
    Memcpy(CopyNode),
    /// A child graph: the handle address of a built graph the node owns (a copy made when
    /// the node was; cuGraphChildGraphNodeGetGraph hands it out, and changes to it are
    /// the node's).
    Child(usize),
    /// A child graph the server captured: the node holds the server's copy.
    ServerChild(std::sync::Arc<ServerGraph>),
    /// An event record or wait node: the event's handle.
    EventRecord(usize),
    EventWait(usize),
    /// A host node: the function and its argument.
    Host(HostFn, usize),
    MemAlloc(MemAllocNode),
    /// A free node: the address it frees.
    MemFree(u64),
    Conditional(CondNode),
}

/// A host node's function (CUhostFn).
pub type HostFn = unsafe extern "C" fn(*mut c_void);

impl Kind {
    /// New parameters for a node that was `old`: a kernel keeps the launch attributes set
    /// on the node, which parameters do not carry.
    pub(super) fn keeping(self, old: &Kind) -> Kind {
        match (self, old) {
            (Kind::Kernel(mut k), Kind::Kernel(o)) => {
                k.attrs = o.attrs.clone();
                Kind::Kernel(k)
            }
            (k, _) => k,
        }
    }

    pub(super) fn type_code(&self) -> u32 {
        match self {
            Kind::Empty => node_type::EMPTY,
            Kind::Kernel(_) => node_type::KERNEL,
            Kind::Memset(_) => node_type::MEMSET,
            Kind::Memcpy(_) => node_type::MEMCPY,
            Kind::Child(_) | Kind::ServerChild(_) => node_type::GRAPH,
            Kind::EventRecord(_) => node_type::EVENT_RECORD,
            Kind::EventWait(_) => node_type::WAIT_EVENT,
            Kind::Host(..) => node_type::HOST,
            Kind::MemAlloc(_) => node_type::MEM_ALLOC,
            Kind::MemFree(_) => node_type::MEM_FREE,
            Kind::Conditional(_) => node_type::CONDITIONAL,
        }
    }

    /// The built graphs the node owns: a child node's graph, a conditional node's bodies.
    pub(super) fn owned(&self) -> Vec<usize> {
        match self {
            &Kind::Child(c) => vec![c],
            Kind::Conditional(c) => c.bodies.to_vec(),
            _ => Vec::new(),
        }
    }
}

#[derive(Clone)]
pub(super) struct Node {
    pub(super) kind: Kind,
    /// Indices of the nodes this one waits for.
    pub(super) deps: Vec<usize>,
    /// Disabled in an executable graph (cuGraphNodeSetEnabled): it orders as an empty node.
    pub(super) disabled: bool,
}

/// A graph built by hand. A destroyed node leaves a hole, so indices stay stable.
#[derive(Clone)]
pub(crate) struct Built {
    pub(super) dev: usize,
    pub(super) nodes: Vec<Option<Node>>,
    /// The server graph its conditional handles belong to, once it made one.
    pub(super) home: Option<std::sync::Arc<Home>>,
}

impl Built {
    pub(super) fn live(&self) -> impl Iterator<Item = (usize, &Node)> {
        self.nodes
            .iter()
            .enumerate()
            .filter_map(|(i, n)| n.as_ref().map(|n| (i, n)))
    }

    /// Node kinds and edges, the nodes by their rank among the live ones and each node's
    /// dependencies sorted: what an executable graph's update must keep.
    pub(super) fn topology(&self) -> Vec<(u32, Vec<usize>)> {
        let rank: HashMap<usize, usize> =
            self.live().enumerate().map(|(r, (i, _))| (i, r)).collect();
        self.live()
            .map(|(_, n)| {
                let mut deps: Vec<usize> = n.deps.iter().map(|d| rank[d]).collect();
                deps.sort_unstable();
                (n.kind.type_code(), deps)
            })
            .collect()
    }
}

/// CUDA_MEMSET_NODE_PARAMS.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct MemsetNodeParams {
    pub dst: u64,
    pub pitch: usize,
    pub value: c_uint,
    pub elem: c_uint,
    pub width: usize,
    pub height: usize,
}

/// CUmemPoolProps: 88 bytes, of which omps reads the first four fields.
pub type PoolPropsBytes = [u8; 88];

#[derive(Clone)]
pub(crate) struct MemAllocNode {
    pub alloc: Arc<GraphAlloc>,
    pub props: PoolPropsBytes,
}

/// A built graph's server graph, which makes its conditional handles and which every
/// instantiation captures into. Its bodies and copies share it.
pub(crate) struct Home {
    pub(super) dev: usize,
    pub(super) id: u32,
    /// Held while an instantiation captures into the home and clears it again.
    pub(super) busy: Mutex<()>,
    pub(super) handles: Mutex<Vec<u64>>,
}

impl Drop for Home {
    fn drop(&mut self) {
        let h = wire::Handle {
            id: self.id,
            _pad: 0,
        };
        let _ = crate::state::entry::live()
            .and_then(|c| c.push(self.dev, Op::GraphDestroy, &[bytemuck::bytes_of(&h)]));
    }
}

/// A conditional node: its handle, CUgraphConditionalNodeType, and the bodies it owns
/// (built graph handles; the array is what `phGraph_out` points at, as long as the node
/// lives).
#[derive(Clone)]
pub(crate) struct CondNode {
    pub(super) handle: u64,
    pub(super) ty: u32,
    pub(super) bodies: Arc<[usize]>,
}

impl CondNode {
    /// The same node with its own copies of the bodies (see `deep`).
    pub(super) fn with_bodies(&self, bodies: Vec<usize>) -> CondNode {
        CondNode {
            bodies: bodies.into(),
            ..self.clone()
        }
    }
}
