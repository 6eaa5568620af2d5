//! Device memory limits, as NVIDIA MPS's operators set them, and beyond.
//!
//! The server's limit per GPU comes from its CUDA_MPS_PINNED_DEVICE_MEM_LIMIT
//! (`"0=2G,1=512M"`, ordinals or UUIDs) and from the control commands; a client connecting
//! gets it, lowered by its own CUDA_MPS_PINNED_DEVICE_MEM_LIMIT (a client can only lower
//! it). Unlike MPS, omps changes limits of clients already running:
//! `set_device_pinned_mem_limit <server PID> …` sets the limit of every client of the
//! server and of those to come, `set_device_pinned_mem_limit <client PID> …` that one
//! client's (its own variable still caps it). A lowered limit takes nothing away: the
//! client's next allocation fails instead. A limit is the process's, over all its
//! connections (crate::client::account).
//!
//! Everything a client holds on a GPU counts (crate::client::ClientShared::charge):
//! cuMemAlloc and pitch allocations, pools and graph memory (which the shim makes of
//! allocations), VMM handles, arrays, module variables, and the host memory pinned for it,
//! which every GPU reaches and so counts on each.

use crate::client::{ClientShared, NO_LIMIT};
use crate::worker::policy::{named, Named};
use omps_ring::memlimit::{format_size, parse_device, parse_limits, parse_size, DeviceKey};
use omps_ring::segment::DeviceSnapshot;
use omps_ring::segment::MAX_DEVICES;
use std::sync::atomic::Ordering;
use std::sync::Arc;

pub const COMMANDS: &[&str] = &[
    "set_default_device_pinned_mem_limit",
    "get_default_device_pinned_mem_limit",
    "set_device_pinned_mem_limit",
    "get_device_pinned_mem_limit",
];

/// The server's limit per GPU ([`NO_LIMIT`]: none), for clients connecting from now on.
pub struct MemLimits {
    server: [u64; MAX_DEVICES],
}

/// The GPU a limit names: an ordinal below the server's count, or one of its UUIDs.
pub fn resolve(key: &DeviceKey, gpus: &[DeviceSnapshot]) -> Result<usize, String> {
    match key {
        DeviceKey::Ordinal(n) if (*n as usize) < gpus.len() => Ok(*n as usize),
        DeviceKey::Ordinal(n) => Err(format!(
            "device {n} does not exist (this server has {} GPU{})",
            gpus.len(),
            if gpus.len() == 1 { "" } else { "s" }
        )),
        DeviceKey::Uuid(u) => gpus
            .iter()
            .position(|g| crate::base::ids::uuid_text(&g.uuid) == *u)
            .ok_or_else(|| format!("no GPU of this server has UUID {u}")),
    }
}

/// Resolves a limit list against the server's GPUs: a limit per GPU.
pub fn resolve_list(spec: &str, gpus: &[DeviceSnapshot]) -> Result<[u64; MAX_DEVICES], String> {
    let mut out = [NO_LIMIT; MAX_DEVICES];
    for (key, bytes) in parse_limits(spec)? {
        out[resolve(&key, gpus)?] = bytes;
    }
    Ok(out)
}

/// A limit as the get commands print it: nothing where none is set, as MPS's daemon.
fn shown(bytes: u64) -> String {
    match bytes {
        NO_LIMIT => String::new(),
        b => format!("{}\n", format_size(b)),
    }
}

/// A limit as the set commands take it: a size, or `none` to remove it.
fn parse_value(v: &str) -> Result<u64, String> {
    match v {
        "none" | "unlimited" => Ok(NO_LIMIT),
        _ => parse_size(v),
    }
}

impl MemLimits {
    /// The server's limits from its CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, if set.
    pub fn new(spec: Option<&str>, gpus: &[DeviceSnapshot]) -> Result<MemLimits, String> {
        let server = match spec {
            Some(s) => resolve_list(s, gpus)
                .map_err(|why| format!("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={s}: {why}"))?,
            None => [NO_LIMIT; MAX_DEVICES],
        };
        Ok(MemLimits { server })
    }

    /// The limits a connecting client's own CUDA_MPS_PINNED_DEVICE_MEM_LIMIT asks for.
    pub fn own(spec: Option<&str>, gpus: &[DeviceSnapshot]) -> Result<[u64; MAX_DEVICES], String> {
        match spec {
            Some(s) => resolve_list(s, gpus)
                .map_err(|why| format!("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={s}: {why}")),
            None => Ok([NO_LIMIT; MAX_DEVICES]),
        }
    }

    /// Gives a connecting client its limits: its process's (the server's, for a process's
    /// first connection: `first`), and `own` ([`MemLimits::own`]). A later connection
    /// keeps what the operator set for the process since.
    pub fn apply(&self, c: &ClientShared, own: &[u64; MAX_DEVICES], first: bool) {
        for (d, &mine) in own.iter().enumerate() {
            if first {
                c.account.limit[d].store(self.server[d], Ordering::Relaxed);
            }
            c.mem_limit_own[d].store(mine, Ordering::Relaxed);
        }
    }

    /// Runs one of [`COMMANDS`]: (success, output).
    pub fn command(
        &mut self,
        cmd: &str,
        args: &[&str],
        clients: &[Arc<ClientShared>],
        gpus: &[DeviceSnapshot],
    ) -> (bool, String) {
        match self.run(cmd, args, clients, gpus) {
            Ok(out) => (true, out),
            Err(why) => (false, format!("{cmd}: {why}\n")),
        }
    }

    fn run(
        &mut self,
        cmd: &str,
        args: &[&str],
        clients: &[Arc<ClientShared>],
        gpus: &[DeviceSnapshot],
    ) -> Result<String, String> {
        let dev = |d: &str| parse_device(d).and_then(|k| resolve(&k, gpus));
        match (cmd, args) {
            ("set_default_device_pinned_mem_limit", [d, v]) => {
                self.server[dev(d)?] = parse_value(v)?;
                Ok(String::new())
            }
            ("get_default_device_pinned_mem_limit", [d]) => Ok(shown(self.server[dev(d)?])),
            ("set_device_pinned_mem_limit", [pid, d, v]) => {
                let (d, bytes) = (dev(d)?, parse_value(v)?);
                match named(clients, pid)? {
                    Named::Server => {
                        self.server[d] = bytes;
                        clients
                            .iter()
                            .for_each(|c| c.account.limit[d].store(bytes, Ordering::Relaxed));
                    }
                    Named::Clients(v) => v
                        .iter()
                        .for_each(|c| c.account.limit[d].store(bytes, Ordering::Relaxed)),
                }
                Ok(String::new())
            }
            ("get_device_pinned_mem_limit", [pid, d]) => {
                let d = dev(d)?;
                Ok(shown(match named(clients, pid)? {
                    Named::Server => self.server[d],
                    Named::Clients(v) => v[0].limit(d).unwrap_or(NO_LIMIT),
                }))
            }
            _ => Err(format!("usage: {}", usage(cmd))),
        }
    }
}

fn usage(cmd: &str) -> &'static str {
    match cmd {
        "set_default_device_pinned_mem_limit" => {
            "set_default_device_pinned_mem_limit <device> <size, as 2G or 512M, or none>"
        }
        "get_default_device_pinned_mem_limit" => "get_default_device_pinned_mem_limit <device>",
        "set_device_pinned_mem_limit" => {
            "set_device_pinned_mem_limit <server or client PID> <device> <size, as 2G or 512M, or none>"
        }
        _ => "get_device_pinned_mem_limit <server or client PID> <device>",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytemuck::Zeroable;

    fn gpus() -> Vec<DeviceSnapshot> {
        let mut a = DeviceSnapshot::zeroed();
        a.uuid = [0x8a; 16];
        let mut b = DeviceSnapshot::zeroed();
        b.uuid = [0x11; 16];
        vec![a, b]
    }

    #[test]
    fn lists_resolve_ordinals_and_uuids() {
        let g = gpus();
        let u = crate::base::ids::uuid_text(&g[1].uuid).to_uppercase();
        let l = resolve_list(&format!("0=2G,{u}=512M"), &g).unwrap();
        assert_eq!((l[0], l[1], l[2]), (2 << 30, 512 << 20, NO_LIMIT));
        assert!(resolve_list("2=1G", &g)
            .unwrap_err()
            .contains("device 2 does not exist"));
        let other = "GPU-00000000-0000-0000-0000-000000000000=1G";
        assert!(resolve_list(other, &g).unwrap_err().contains("no GPU"));
    }

    #[test]
    fn a_bad_server_variable_stops_the_start() {
        let e = MemLimits::new(Some("0=lots"), &gpus()).err().unwrap();
        assert!(
            e.starts_with("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=lots:"),
            "{e}"
        );
        assert!(MemLimits::new(None, &gpus()).is_ok());
    }
}
