//! What one client may hold, and how many clients and connections the server takes.
//! Every bound is generous for PyTorch and set by an environment variable of the server;
//! going over answers the CUDA error the driver would give (CUDA_ERROR_OUT_OF_MEMORY, or
//! CUDA_ERROR_MPS_MAX_CLIENTS_REACHED for clients), never harm to the server or others.

use std::sync::OnceLock;

pub struct Bounds {
    /// Streams and events per client and GPU (OMPS_MAX_STREAMS, OMPS_MAX_EVENTS). The shim
    /// learns them at its welcome and answers CUDA_ERROR_OUT_OF_MEMORY beyond; the server
    /// disconnects a client that goes beyond anyway.
    pub streams: u32,
    pub events: u32,
    /// Streams and events all clients together may hold, per GPU of the server
    /// (OMPS_MAX_STREAMS_TOTAL, OMPS_MAX_EVENTS_TOTAL), and the least a client is granted
    /// per GPU however many came before it (OMPS_MIN_STREAMS, OMPS_MIN_EVENTS): a client
    /// is granted its bound per GPU as far as the totals go while every client the server
    /// may still take keeps its least (crate::client::account::Totals::grant).
    pub streams_total: u64,
    pub events_total: u64,
    pub streams_least: u32,
    pub events_least: u32,
    /// Module image bytes a client may have uploaded and not yet loaded, over all its
    /// channels (OMPS_MAX_IMAGE_BYTES).
    pub image_bytes: u64,
    /// Image bytes all clients together may have uploaded and not yet loaded
    /// (OMPS_MAX_IMAGE_BYTES_TOTAL; crate::client::account::Totals).
    pub image_bytes_total: u64,
    /// Page-locked host memory a client may register: bytes and ranges
    /// (OMPS_MAX_PINNED_BYTES, OMPS_MAX_PINNED_RANGES). Each range is a mapping of the
    /// server's, and vm.max_map_count bounds those for all clients together.
    pub pinned_bytes: u64,
    pub pinned_ranges: usize,
    /// Page-locked host memory all clients together may register: bytes and ranges
    /// (OMPS_MAX_PINNED_TOTAL, OMPS_MAX_PINNED_RANGES_TOTAL; crate::client::account::Totals).
    pub pinned_total: u64,
    pub pinned_ranges_total: u64,
    /// Clients at once (OMPS_MAX_CLIENTS), and connections still in their handshake or
    /// holding a control connection (OMPS_MAX_HANDSHAKES).
    pub clients: usize,
    pub handshakes: usize,
    /// Clients one process may have at once (OMPS_MAX_CLIENTS_PER_PROCESS; a program has
    /// one connection, whatever its GPUs and threads). A namespace's clients together may
    /// have its `max_clients=`, by default [`Bounds::namespace_clients`].
    pub clients_per_process: usize,
    /// Graphs, executable graphs and conditional bodies per client and GPU
    /// (OMPS_MAX_GRAPHS), for all clients together per GPU of the server
    /// (OMPS_MAX_GRAPHS_TOTAL), and the least each is granted (OMPS_MIN_GRAPHS), as
    /// streams and events are.
    pub graphs: usize,
    pub graphs_total: u64,
    pub graphs_least: u32,
}

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

/// Half the machine's memory, from /proc/meminfo (64 GiB if it cannot be read).
fn half_of_memory() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            let line = m.lines().find(|l| l.starts_with("MemTotal:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib * 1024 / 2)
        })
        .unwrap_or(64 << 30)
}

/// The server's bounds, read from its environment once.
pub fn bounds() -> &'static Bounds {
    static B: OnceLock<Bounds> = OnceLock::new();
    B.get_or_init(Bounds::from_env)
}

impl Bounds {
    /// The clients one namespace (or, while namespaces exist, the server's own socket)
    /// may have at once unless the operator set its `max_clients=`: all but a quarter of
    /// OMPS_MAX_CLIENTS, which stays for the others (issue 23).
    pub fn namespace_clients(&self) -> usize {
        self.clients.saturating_sub(self.clients / 4).max(1)
    }

    /// The client slots each of `namespaces` namespaces keeps for itself, which clients of
    /// other namespaces and of the server's own socket cannot take while it has fewer:
    /// OMPS_MAX_CLIENTS shared out among them and the server's own socket, at most 16
    /// each (review 4, finding 8: two namespaces of three-quarters each could lock a
    /// third out).
    pub fn namespace_floor(&self, namespaces: usize) -> usize {
        (self.clients / (namespaces + 1)).min(16)
    }

    /// With `connected` clients, the slots the other namespaces keep, when each has
    /// `others` (clients, its floor): Some(kept) if one more client would take one of them.
    pub fn takes_kept(
        &self,
        connected: usize,
        others: impl Iterator<Item = (usize, usize)>,
    ) -> Option<usize> {
        let kept: usize = others.map(|(used, floor)| floor.saturating_sub(used)).sum();
        (connected + 1 + kept > self.clients).then_some(kept)
    }

    /// The bounds the environment sets (what [`bounds`] keeps).
    pub fn from_env() -> Bounds {
        Bounds {
            streams: env("OMPS_MAX_STREAMS", 16_384),
            events: env("OMPS_MAX_EVENTS", 1 << 18),
            // A driver event and the books on it take some hundred bytes: 16M of them, about
            // 2 GB at most; 1,024 clients keep 4,096 each (PyTorch pools its events).
            streams_total: env("OMPS_MAX_STREAMS_TOTAL", 1 << 22),
            events_total: env("OMPS_MAX_EVENTS_TOTAL", 1 << 24),
            streams_least: env("OMPS_MIN_STREAMS", 1024),
            events_least: env("OMPS_MIN_EVENTS", 4096),
            image_bytes: env("OMPS_MAX_IMAGE_BYTES", 2 << 30),
            image_bytes_total: env("OMPS_MAX_IMAGE_BYTES_TOTAL", half_of_memory() / 2),
            pinned_bytes: env("OMPS_MAX_PINNED_BYTES", half_of_memory()),
            pinned_ranges: env("OMPS_MAX_PINNED_RANGES", 16_384),
            pinned_total: env("OMPS_MAX_PINNED_TOTAL", half_of_memory()),
            // vm.max_map_count is 65,530 by default, and the server maps more than pins.
            pinned_ranges_total: env("OMPS_MAX_PINNED_RANGES_TOTAL", 32_768),
            clients: env("OMPS_MAX_CLIENTS", 1024),
            handshakes: env("OMPS_MAX_HANDSHAKES", 64),
            clients_per_process: env("OMPS_MAX_CLIENTS_PER_PROCESS", 64),
            graphs: env("OMPS_MAX_GRAPHS", 1 << 16),
            // An empty graph takes the driver about a kilobyte: a million, about a gigabyte.
            graphs_total: env("OMPS_MAX_GRAPHS_TOTAL", 1 << 20),
            graphs_least: env("OMPS_MIN_GRAPHS", 256),
        }
    }
}

#[cfg(test)]
mod tests {
    /// Review 4, finding 8: two namespaces of three-quarters each locked a third out.
    #[test]
    fn each_namespace_keeps_a_floor_of_the_client_slots() {
        let mut b = super::Bounds::from_env();
        b.clients = 16;
        let floor = b.namespace_floor(3);
        assert_eq!(floor, 4, "16 shared by 3 namespaces and omps.sock");
        assert_eq!(b.namespace_floor(0), 16, "at most 16");
        b.clients = 1024;
        assert_eq!(b.namespace_floor(3), 16);
        b.clients = 16;
        // a has 8 and b 4 of 16: a takes none of c's 4; c does.
        let (a, c) = ([(4, floor), (0, floor)], [(8, floor), (4, floor)]);
        assert_eq!(b.takes_kept(12, a.into_iter()), Some(4));
        assert_eq!(b.takes_kept(11, a.into_iter()), None);
        assert_eq!(b.takes_kept(12, c.into_iter()), None, "c's own");
        // A namespace of max_clients=2 keeps 2 at most.
        assert_eq!(b.takes_kept(10, [(0, 2), (0, floor)].into_iter()), Some(6));
        assert_eq!(b.takes_kept(9, [(0, 2), (0, floor)].into_iter()), None);
        // Used up past the floor: nothing kept.
        assert_eq!(b.takes_kept(15, [(9, floor), (6, floor)].into_iter()), None);
    }
}
