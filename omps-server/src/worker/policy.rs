//! What operators and clients decide about scheduling, and where each client's work runs
//! as a result: its QoS, its thread percentage, its static SM partition, and the reserve
//! of SMs kept for latency-critical clients. MPS's commands keep their names and meaning;
//! omps adds per-client QoS and limits that change while the client runs.
//!
//! The control thread owns this. Whenever an input changes it recomputes every client's
//! [`Placement`] per GPU and publishes it in the client's shared state; each worker moves
//! the client's streams at its next work ([`crate::session`]).

use crate::client::ClientShared;
use crate::gpu::Gpu;
use crate::sched::confine::{SmChunks, SmSet};
use crate::sched::placement::{Placement, Qos};
use omps_ring::wire::{self, ClientSettings};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The control commands this module answers.
pub const COMMANDS: &[&str] = &[
    "set_default_client_priority",
    "get_default_client_priority",
    "set_client_qos",
    "get_client_qos",
    "set_default_active_thread_percentage",
    "get_default_active_thread_percentage",
    "set_active_thread_percentage",
    "get_active_thread_percentage",
    "sm_partition",
    "lspart",
];

/// CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION, MPS's answer to a partition it cannot make
/// or a client that names one that does not exist.
pub const INVALID_RESOURCE_CONFIGURATION: i32 = 915;
const NO_LIMIT: u32 = 100_000;

/// What a connecting client gets, before it exists ([`Settled::apply`]).
pub struct Settled {
    pub qos: Qos,
    pub milli_pct: u32,
    pub partition: Option<(usize, u32)>,
}

impl Settled {
    /// What a client has now.
    fn of(c: &ClientShared) -> Settled {
        Settled {
            qos: c.qos(),
            milli_pct: c.thread_milli_pct.load(Ordering::Relaxed),
            partition: *c.partition.lock().unwrap_or_else(|e| e.into_inner()),
        }
    }

    pub fn apply(&self, c: &ClientShared) {
        c.set_qos(self.qos);
        c.thread_milli_pct.store(self.milli_pct, Ordering::Relaxed);
        *c.partition.lock().unwrap_or_else(|e| e.into_inner()) = self.partition;
    }
}

struct Partition {
    gpu: usize,
    id: u32,
    slot: usize,
    chunks: Vec<u32>,
    sms: u32,
}

pub struct Policy {
    /// For clients that do not say (MPS's `set_default_client_priority`).
    default_qos: Qos,
    /// For new clients, in thousandths of a percent (the server's
    /// CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, `set_default_active_thread_percentage`).
    default_milli_pct: u32,
    /// Per GPU: its SM chunks and UUID text.
    gpus: Vec<(SmChunks, String)>,
    /// Chunks at the start of each GPU that only latency-critical clients use, while one
    /// is connected.
    reserve: u32,
    partitions: Vec<Partition>,
    next_partition: u32,
}

impl Policy {
    /// `gpus`: each GPU's chunks and UUID; `reserve`: the chunks kept for
    /// latency-critical clients; `default_milli_pct`: the server's default thread limit.
    pub fn new(gpus: Vec<(SmChunks, String)>, reserve: u32, default_milli_pct: u32) -> Self {
        let p = Policy {
            default_qos: Qos::Normal,
            default_milli_pct: default_milli_pct.clamp(1, NO_LIMIT),
            gpus,
            reserve,
            partitions: Vec::new(),
            next_partition: 1,
        };
        if p.default_milli_pct < NO_LIMIT {
            if let Some(why) = p.limits_unenforced() {
                tracing::warn!(
                    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={}: {why}",
                    pct_text(p.default_milli_pct)
                );
            }
        }
        p
    }

    /// Whether GPU `gpu`'s SMs can be confined (it has green contexts).
    pub fn confines(&self, gpu: usize) -> bool {
        self.gpus.get(gpu).is_some_and(|g| g.0.chunks > 0)
    }

    /// Why thread-percentage limits cannot hold on some GPU, if so: the GPUs without
    /// green contexts.
    fn limits_unenforced(&self) -> Option<String> {
        let without: Vec<&str> = (0..self.gpus.len())
            .filter(|&g| !self.confines(g))
            .map(|g| self.gpus[g].1.as_str())
            .collect();
        (!without.is_empty()).then(|| {
            format!(
                "thread-percentage limits need {}, which {} lacks",
                crate::gpu::features::GREEN_NEEDS,
                without.join(" and ")
            )
        })
    }

    /// Settles a connecting client's QoS, thread limit and partition from what it asked
    /// for, or refuses it: (CUresult, why).
    pub fn settle(&self, s: &ClientSettings) -> Result<Settled, (i32, String)> {
        let qos = if s.qos == ClientSettings::UNSET {
            self.default_qos
        } else {
            u8::try_from(s.qos)
                .ok()
                .and_then(Qos::from_u8)
                .ok_or_else(|| (1, format!("client priority {} is not 0, 1 or 2", s.qos)))?
        };
        let pct = match s.thread_milli_pct {
            ClientSettings::UNSET => self.default_milli_pct,
            // A client can only lower the server's default, as under MPS.
            p if (1..=NO_LIMIT).contains(&p) => p.min(self.default_milli_pct),
            p => {
                return Err((
                    1,
                    format!(
                        "thread percentage {}% is not in (0, 100]",
                        p as f64 / 1000.0
                    ),
                ))
            }
        };
        if s.thread_milli_pct != ClientSettings::UNSET && pct < NO_LIMIT {
            if let Some(why) = self.limits_unenforced() {
                tracing::warn!(
                    "a connecting client's CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={} is not enforced: {why}",
                    pct_text(pct)
                );
            }
        }
        let partition = match s.partition_text() {
            None => None,
            Some(t) => Some(
                self.find_partition(t)
                    .map_err(|e| (INVALID_RESOURCE_CONFIGURATION, e))?,
            ),
        };
        Ok(Settled {
            qos,
            milli_pct: pct,
            partition: partition.map(|i| (self.partitions[i].gpu, self.partitions[i].id)),
        })
    }

    /// Where `c`'s work runs on GPU `gpu`, given whether a latency-critical client is
    /// connected.
    pub fn place(&self, c: &ClientShared, gpu: usize, lc_present: bool) -> Placement {
        self.place_settled(&Settled::of(c), gpu, lc_present)
    }

    fn place_settled(&self, s: &Settled, gpu: usize, lc_present: bool) -> Placement {
        let (qos, pct, part) = (s.qos, s.milli_pct, s.partition);
        let Some(&(chunks, _)) = self.gpus.get(gpu).filter(|g| g.0.chunks > 0) else {
            return Placement { qos, slot: None };
        };
        let held_off = lc_present && qos != Qos::LatencyCritical && self.reserve > 0;
        let slot = if let Some(p) = part
            .filter(|p| p.0 == gpu)
            .and_then(|(_, id)| self.partitions.iter().find(|p| p.gpu == gpu && p.id == id))
        {
            Some(p.slot)
        } else if pct < NO_LIMIT {
            let mut k = chunks.chunks_for(pct);
            if held_off {
                k = k.min(chunks.chunks.saturating_sub(self.reserve).max(1));
            }
            Some(chunks.limit_slot(k))
        } else if held_off {
            Some(chunks.shared_slot())
        } else {
            None
        };
        Placement { qos, slot }
    }

    /// The SM count `c` sees on GPU `gpu`: its limit's or partition's share, else all.
    pub fn visible_sms(&self, c: &ClientShared, gpu: usize, lc_present: bool) -> Option<u32> {
        self.visible_sms_settled(&Settled::of(c), gpu, lc_present)
    }

    /// Whether any of `clients` is latency-critical.
    pub fn lc_present(clients: &[Arc<ClientShared>]) -> bool {
        clients.iter().any(|c| c.qos() == Qos::LatencyCritical)
    }

    /// As [`Policy::visible_sms`], for a client about to exist, given whether a
    /// latency-critical client is connected: then the others see the SMs outside its
    /// reserve, which is what they can use, so that a program that sizes its grids by the
    /// SM count fills them in one wave (a grid sized for all 132 SMs on 116 takes two).
    pub fn visible_sms_settled(&self, s: &Settled, gpu: usize, lc_present: bool) -> Option<u32> {
        let (chunks, _) = *self.gpus.get(gpu)?;
        if chunks.chunks == 0 {
            return None;
        }
        let p = self.place_settled(s, gpu, lc_present);
        match p.slot {
            Some(s) if s == chunks.shared_slot() => {
                Some(chunks.total - self.reserve.min(chunks.chunks) * chunks.chunk)
            }
            Some(s) if s >= chunks.first_partition_slot() => self
                .partitions
                .iter()
                .find(|x| x.gpu == gpu && x.slot == s)
                .map(|x| x.sms),
            Some(s) => Some((s as u32 + 1) * chunks.chunk),
            None => Some(chunks.total),
        }
    }

    /// Recomputes and publishes every client's placement, and the SM count it sees.
    pub fn publish(&self, clients: &[Arc<ClientShared>]) {
        let lc = Self::lc_present(clients);
        for c in clients {
            for g in 0..self.gpus.len() {
                c.set_placement(g, self.place(c, g, lc));
                if let Some(sms) = self.visible_sms(c, g, lc) {
                    c.seg.publish_attribute(g, MULTIPROCESSOR_COUNT, sms as i32);
                }
            }
        }
    }

    /// Runs one control command (a name in [`COMMANDS`]): (success, reply text). The
    /// caller publishes placements afterwards.
    pub fn command(
        &mut self,
        cmd: &str,
        args: &[&str],
        clients: &[Arc<ClientShared>],
        gpus: &[Arc<dyn Gpu>],
    ) -> (bool, String) {
        match (cmd, args) {
            ("set_default_client_priority", [v]) => match *v {
                "0" | "1" => {
                    self.default_qos = Qos::parse(v).expect("0 and 1 parse");
                    ok("")
                }
                _ => fail(format!(
                    "client priority '{v}' is not 0 (normal) or 1 (below normal)"
                )),
            },
            ("get_default_client_priority", []) => {
                // MPS has two levels; a latency-critical default reads as normal there.
                ok(&format!(
                    "{}\n",
                    (self.default_qos == Qos::BelowNormal) as u8
                ))
            }
            ("set_client_qos", [pid, q]) => {
                let Some(q) = Qos::parse(q) else {
                    return fail(format!(
                        "QoS '{q}' is not normal, below-normal or latency-critical (0, 1, 2)"
                    ));
                };
                of_pid(clients, pid).map_or_else(fail, |cs| {
                    cs.iter().for_each(|c| c.set_qos(q));
                    ok(&self.reserve_note(q))
                })
            }
            ("get_client_qos", [pid]) => of_pid(clients, pid)
                .map_or_else(fail, |cs| ok(&format!("{}\n", cs[0].qos().name()))),
            ("set_default_active_thread_percentage", [v]) => match wire::parse_percentage(v) {
                Some(p) if p < NO_LIMIT && self.limits_unenforced().is_some() => {
                    fail(self.limits_unenforced().unwrap_or_default())
                }
                Some(p) => {
                    // MPS's daemon answers a set with the value it now holds.
                    self.default_milli_pct = p;
                    ok(&format!("{}\n", pct_text(p)))
                }
                None => fail(format!("'{v}' is not a percentage in (0, 100]")),
            },
            ("get_default_active_thread_percentage", []) => {
                ok(&format!("{}\n", pct_text(self.default_milli_pct)))
            }
            // A client's PID sets that client's; the server's own PID (as under MPS, where
            // it names the server instance) the server's, for its clients now and to come.
            ("set_active_thread_percentage", [pid, v]) => {
                let Some(p) = wire::parse_percentage(v) else {
                    return fail(format!("'{v}' is not a percentage in (0, 100]"));
                };
                if p < NO_LIMIT {
                    if let Some(why) = self.limits_unenforced() {
                        return fail(why);
                    }
                }
                let set = |cs: &[Arc<ClientShared>]| {
                    cs.iter()
                        .for_each(|c| c.thread_milli_pct.store(p, Ordering::Relaxed))
                };
                match named(clients, pid) {
                    Ok(Named::Server) => {
                        self.default_milli_pct = p;
                        set(clients);
                    }
                    Ok(Named::Clients(cs)) => set(&cs),
                    Err(why) => return fail(why),
                }
                ok(&format!("{}\n", pct_text(p)))
            }
            ("get_active_thread_percentage", [pid]) => match named(clients, pid) {
                Ok(Named::Server) => ok(&format!("{}\n", pct_text(self.default_milli_pct))),
                Ok(Named::Clients(cs)) => ok(&format!(
                    "{}\n",
                    pct_text(cs[0].thread_milli_pct.load(Ordering::Relaxed))
                )),
                Err(why) => fail(why),
            },
            ("sm_partition", ["add", uuid, n]) => self.add_partition(uuid, n, gpus),
            ("sm_partition", ["rm", both]) => match both.split_once('/') {
                Some((uuid, id)) => self.remove_partition(uuid, id, clients),
                None => {
                    fail("usage: sm_partition rm <uuid>/<partition> | <uuid> <partition>".into())
                }
            },
            ("sm_partition", ["rm", uuid, id]) => self.remove_partition(uuid, id, clients),
            ("lspart", []) => ok(&self.lspart(clients)),
            _ => fail(format!("usage: {}", usage(cmd))),
        }
    }

    /// What a client made latency-critical gets without the SM reserve: a note naming the
    /// GPUs that cannot keep one (its streams still run at the greatest priority there).
    fn reserve_note(&self, q: Qos) -> String {
        if q != Qos::LatencyCritical || self.reserve == 0 {
            return String::new();
        }
        let without: Vec<&str> = (0..self.gpus.len())
            .filter(|&g| !self.confines(g))
            .map(|g| self.gpus[g].1.as_str())
            .collect();
        match without.is_empty() {
            true => String::new(),
            false => format!(
                "note: no latency-critical SM reserve on {} (it needs {}); the client's streams run at the greatest priority only\n",
                without.join(" and "),
                crate::gpu::features::GREEN_NEEDS
            ),
        }
    }

    fn gpu_of(&self, uuid: &str) -> Result<usize, String> {
        let hits: Vec<usize> = (0..self.gpus.len())
            .filter(|&g| self.gpus[g].1.starts_with(uuid) || self.gpus[g].1[4..].starts_with(uuid))
            .collect();
        match hits[..] {
            [g] if !uuid.is_empty() => Ok(g),
            [] | [_] => Err(format!("no GPU with UUID '{uuid}'")),
            _ => Err(format!("UUID '{uuid}' names more than one GPU")),
        }
    }

    /// The partition `text` (`<GPU UUID>/p<N>`) names: (GPU, partition id).
    /// GPU `g`'s SMs and whole chunks as partitions count them (None: no such GPU).
    pub fn sm_chunks(&self, g: usize) -> Option<SmChunks> {
        self.gpus.get(g).map(|(c, _)| *c)
    }

    pub fn partition_named(&self, text: &str) -> Result<(usize, u32), String> {
        let i = self.find_partition(text)?;
        Ok((self.partitions[i].gpu, self.partitions[i].id))
    }

    fn find_partition(&self, text: &str) -> Result<usize, String> {
        let (uuid, id) = text
            .split_once('/')
            .ok_or_else(|| format!("CUDA_MPS_SM_PARTITION={text}: not <GPU UUID>/<partition>"))?;
        let g = self.gpu_of(uuid)?;
        self.partitions
            .iter()
            .position(|p| p.gpu == g && format!("p{}", p.id) == id)
            .ok_or_else(|| format!("no SM partition '{text}' (lspart lists them)"))
    }

    fn add_partition(&mut self, uuid: &str, n: &str, gpus: &[Arc<dyn Gpu>]) -> (bool, String) {
        let g = match self.gpu_of(uuid) {
            Ok(g) => g,
            Err(e) => return fail(e),
        };
        let Ok(want) = n.parse::<u32>() else {
            return fail(format!("'{n}' is not a chunk count"));
        };
        let chunks = self.gpus[g].0;
        if chunks.chunks == 0 {
            return fail(format!(
                "SM partitions need {}, which {} lacks; error CUDA_ERROR_NOT_SUPPORTED",
                crate::gpu::features::GREEN_NEEDS,
                self.gpus[g].1
            ));
        }
        let used: Vec<u32> = self
            .partitions
            .iter()
            .filter(|p| p.gpu == g)
            .flat_map(|p| p.chunks.iter().copied())
            .collect();
        let free: Vec<u32> = (0..chunks.chunks).filter(|c| !used.contains(c)).collect();
        let slots = gpus.get(g).map_or(0, |x| x.layout().confined);
        let slot = (chunks.first_partition_slot()..slots)
            .find(|s| !self.partitions.iter().any(|p| p.gpu == g && p.slot == *s));
        if want == 0 || want as usize > free.len() || chunks.chunks == 0 {
            return fail(format!(
                "Failed to fulfill the requested SM partition of {want} chunks ({} of {} SMs free), error CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION",
                free.len() as u32 * chunks.chunk,
                chunks.total
            ));
        }
        let Some(slot) = slot else {
            return fail("no partition slot left: remove one first".into());
        };
        let set = SmSet {
            chunks: free[..want as usize].to_vec(),
            remainder: false,
        };
        match gpus[g].confine(slot, &set) {
            Ok(sms) => {
                let id = self.next_partition;
                self.next_partition += 1;
                self.partitions.push(Partition {
                    gpu: g,
                    id,
                    slot,
                    chunks: set.chunks,
                    sms,
                });
                ok(&format!("{}/p{id}\n", self.gpus[g].1))
            }
            Err(e) => fail(format!(
                "making the partition's green context: CUDA error {}",
                e.0
            )),
        }
    }

    fn remove_partition(
        &mut self,
        uuid: &str,
        id: &str,
        clients: &[Arc<ClientShared>],
    ) -> (bool, String) {
        let text = format!("{uuid}/{id}");
        let i = match self.find_partition(&text) {
            Ok(i) => i,
            Err(e) => return fail(e),
        };
        let p = &self.partitions[i];
        let users = clients
            .iter()
            .filter(|c| {
                *c.partition.lock().unwrap_or_else(|e| e.into_inner()) == Some((p.gpu, p.id))
            })
            .count();
        let name = format!("{}/p{}", self.gpus[p.gpu].1, p.id);
        if users > 0 {
            return fail(format!(
                "Partition {name} in use. Terminate all clients before removing."
            ));
        }
        self.partitions.remove(i);
        ok(&format!("Partition {name} removed\n"))
    }

    fn lspart(&self, clients: &[Arc<ClientShared>]) -> String {
        let mut s = String::from("GPU PARTITION CHUNKS SMS CLIENTS\n");
        for (g, (chunks, uuid)) in self.gpus.iter().enumerate() {
            let mine: Vec<&Partition> = self.partitions.iter().filter(|p| p.gpu == g).collect();
            let used: u32 = mine.iter().map(|p| p.chunks.len() as u32).sum();
            s += &format!(
                "{uuid} - {} free {} free -\n",
                chunks.chunks - used,
                chunks.total - used * chunks.chunk
            );
            for p in mine {
                let n = clients
                    .iter()
                    .filter(|c| {
                        *c.partition.lock().unwrap_or_else(|e| e.into_inner()) == Some((g, p.id))
                    })
                    .count();
                s += &format!("{uuid} {uuid}/p{} {} {} {n}\n", p.id, p.chunks.len(), p.sms);
            }
        }
        s
    }
}

/// CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT.
pub const MULTIPROCESSOR_COUNT: usize = 16;

fn pct_text(milli: u32) -> String {
    format!("{:.1}", milli as f64 / 1000.0)
}

fn usage(cmd: &str) -> &'static str {
    match cmd {
        "set_default_client_priority" => "set_default_client_priority 0|1",
        "set_client_qos" => "set_client_qos <PID> normal|below-normal|latency-critical",
        "get_client_qos" => "get_client_qos <PID>",
        "set_default_active_thread_percentage" => "set_default_active_thread_percentage <pct>",
        "set_active_thread_percentage" => "set_active_thread_percentage <PID> <pct>",
        "get_active_thread_percentage" => "get_active_thread_percentage <PID>",
        "sm_partition" => {
            "sm_partition add <GPU UUID> <chunks> | sm_partition rm <GPU UUID>/<partition>"
        }
        _ => "a command without arguments",
    }
}

fn ok(text: &str) -> (bool, String) {
    (true, text.to_string())
}

fn fail(why: String) -> (bool, String) {
    (false, format!("{why}\n"))
}

/// What a PID in a control command names.
pub enum Named {
    /// This server: all its clients, and those to come.
    Server,
    /// The connected clients of one process (one process may hold several connections).
    Clients(Vec<Arc<ClientShared>>),
}

/// What `pid` names: the server's own PID, or a client's.
pub fn named(clients: &[Arc<ClientShared>], pid: &str) -> Result<Named, String> {
    let me = std::process::id();
    match pid.parse::<u32>() {
        Ok(p) if p == me => Ok(Named::Server),
        Ok(_) => of_pid(clients, pid)
            .map(Named::Clients)
            .map_err(|why| format!("{why}, and {pid} is not this server ({me})")),
        Err(_) => Err(format!("'{pid}' is not a PID")),
    }
}

/// The connected clients of process `pid` (one process may hold several connections).
fn of_pid(clients: &[Arc<ClientShared>], pid: &str) -> Result<Vec<Arc<ClientShared>>, String> {
    let Ok(p) = pid.parse::<i32>() else {
        return Err(format!("'{pid}' is not a PID"));
    };
    let v: Vec<_> = clients.iter().filter(|c| c.pid == p).cloned().collect();
    if v.is_empty() {
        return Err(format!("no client with PID {p}"));
    }
    Ok(v)
}
