//! The board a metrics scrape reads: the connected clients and every GPU, encoded in
//! Prometheus's exposition format for `omps-ctl metrics` and `/metrics`.
//!
//! Each scrape reads the counters the workers keep (relaxed atomics) into a registry made
//! for it; nothing is kept between scrapes. Clients are labelled with their PID (in the
//! server's namespace), command, client id, QoS class and, where their cgroup names them,
//! container and pod.

use crate::client::ClientShared;
use crate::gpu::Gpu;
use crate::worker::GpuShared;
use omps_ring::segment::DeviceSnapshot;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

type Labels = Vec<(String, String)>;
type FGauge = Gauge<f64, AtomicU64>;
type FCounter = Counter<f64, AtomicU64>;

/// What a scrape reads: the connected clients (kept current by the control thread) and
/// every GPU.
pub struct Board {
    clients: Mutex<Vec<Arc<ClientShared>>>,
    gpus: Vec<(Arc<dyn Gpu>, DeviceSnapshot, Arc<GpuShared>)>,
}

impl Board {
    pub fn new(gpus: Vec<(Arc<dyn Gpu>, DeviceSnapshot, Arc<GpuShared>)>) -> Board {
        Board {
            clients: Mutex::new(Vec::new()),
            gpus,
        }
    }

    pub fn set_clients(&self, clients: Vec<Arc<ClientShared>>) {
        *self.clients.lock().unwrap_or_else(|e| e.into_inner()) = clients;
    }

    /// The exposition text of every figure now.
    pub fn render(&self) -> String {
        let mut reg = Registry::default();
        let mem: Family<Labels, Gauge> = family(&mut reg, "omps_client_memory_bytes", "Device memory a client holds on a GPU (allocations, pools, graphs, VMM, arrays, module variables)");
        let limit: Family<Labels, Gauge> = family(
            &mut reg,
            "omps_client_memory_limit_bytes",
            "A client's memory limit on a GPU, where one is set",
        );
        let pinned: Family<Labels, Gauge> = family(
            &mut reg,
            "omps_client_pinned_host_bytes",
            "Host memory pinned for a client",
        );
        let launches: Family<Labels, Counter> = family(
            &mut reg,
            "omps_client_launches",
            "Kernel and graph launches a client made",
        );
        let commands: Family<Labels, Counter> = family(
            &mut reg,
            "omps_client_commands",
            "Records the server handled for a client",
        );
        let server_s: Family<Labels, FCounter> = family(
            &mut reg,
            "omps_client_server_seconds",
            "Server worker time spent on a client's records",
        );
        let pct: Family<Labels, FGauge> = family(
            &mut reg,
            "omps_client_active_thread_percentage",
            "A client's compute limit (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE)",
        );
        let gpu_used: Family<Labels, Gauge> = family(
            &mut reg,
            "omps_gpu_memory_used_bytes",
            "A GPU's memory in use (all processes)",
        );
        let gpu_total: Family<Labels, Gauge> =
            family(&mut reg, "omps_gpu_memory_total_bytes", "A GPU's memory");
        let gpu_util: Family<Labels, Gauge> = family(
            &mut reg,
            "omps_gpu_utilization_percent",
            "Share of the last sample period a kernel ran (NVML)",
        );
        let gpu_fault: Family<Labels, Gauge> = family(
            &mut reg,
            "omps_gpu_fault",
            "1 while a GPU is in FAULT (its clients told, new ones refused)",
        );
        let gpu_clients: Family<Labels, Gauge> =
            family(&mut reg, "omps_gpu_clients", "Clients that have used a GPU");
        let lane_busy: Family<Labels, FCounter> = family(
            &mut reg,
            "omps_lane_busy_seconds",
            "Time a worker lane spent handling records",
        );
        reg.register(
            "omps_lane_busy_seconds",
            "Time a worker lane spent handling records",
            lane_busy.clone(),
        );

        let clients = self
            .clients
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        for (g, (gpu, snap, shared)) in self.gpus.iter().enumerate() {
            let uuid = crate::base::ids::uuid_text(&snap.uuid);
            let l: Labels = vec![
                ("gpu".into(), g.to_string()),
                ("uuid".into(), uuid.clone()),
                ("name".into(), snap.name_str().to_string()),
            ];
            if let Ok((free, total)) = gpu.mem_info() {
                gpu_used
                    .get_or_create(&l)
                    .set((total - free.min(total)) as i64);
                gpu_total.get_or_create(&l).set(total as i64);
            }
            if let Some((busy, _)) = crate::gpu::nvml::utilization(&uuid) {
                gpu_util.get_or_create(&l).set(busy as i64);
            }
            gpu_fault
                .get_or_create(&l)
                .set(shared.faulted.load(Ordering::Relaxed) as i64);
            let n = clients
                .iter()
                .filter(|c| c.used_gpus.load(Ordering::Relaxed) & (1 << g) != 0)
                .count();
            gpu_clients.get_or_create(&l).set(n as i64);
            for (lane, st) in shared.stats.iter().enumerate() {
                let mut ll = l.clone();
                ll.push(("lane".into(), lane.to_string()));
                lane_busy
                    .get_or_create(&ll)
                    .inc_by(st.busy_ns.load(Ordering::Relaxed) as f64 / 1e9);
            }
        }
        for c in &clients {
            let id = &c.identity;
            let l: Labels = vec![
                ("pid".into(), c.pid.to_string()),
                ("client".into(), c.id.to_string()),
                ("command".into(), c.command().to_string()),
                ("qos".into(), c.qos().name().to_string()),
                ("container".into(), id.container.clone()),
                ("pod".into(), id.pod.clone()),
            ];
            launches
                .get_or_create(&l)
                .inc_by(c.launches.load(Ordering::Relaxed));
            commands
                .get_or_create(&l)
                .inc_by(c.commands.load(Ordering::Relaxed));
            server_s
                .get_or_create(&l)
                .inc_by(c.server_ns.load(Ordering::Relaxed) as f64 / 1e9);
            pinned
                .get_or_create(&l)
                .set(c.pinned_bytes.load(Ordering::Relaxed) as i64);
            pct.get_or_create(&l)
                .set(c.thread_milli_pct.load(Ordering::Relaxed) as f64 / 1000.0);
            for (g, (_, snap, _)) in self.gpus.iter().enumerate() {
                let mut lg = l.clone();
                lg.push(("gpu".into(), g.to_string()));
                lg.push(("uuid".into(), crate::base::ids::uuid_text(&snap.uuid)));
                mem.get_or_create(&lg)
                    .set(c.mem_bytes[g].load(Ordering::Relaxed) as i64);
                if let Some(v) = c.limit(g) {
                    limit.get_or_create(&lg).set(v.min(i64::MAX as u64) as i64);
                }
            }
        }
        let mut out = String::new();
        if let Err(e) = encode(&mut out, &reg) {
            tracing::warn!("encoding the metrics failed: {e}");
        }
        out
    }
}

/// A family of metrics registered under `name`: each scrape makes its own.
fn family<M>(reg: &mut Registry, name: &str, help: &str) -> Family<Labels, M>
where
    M: Default,
    Family<Labels, M>: prometheus_client::registry::Metric + Clone,
{
    let f = Family::<Labels, M>::default();
    reg.register(name, help, f.clone());
    f
}
