//! What a client asks of the server from its environment (priority, QoS, thread
//! percentage, SM partition, memory limits), read before it connects: apart from the
//! connection itself (conn.rs).

use omps_ring::wire;

/// What the environment asks of the server, as MPS's clients read it:
/// `CUDA_MPS_CLIENT_PRIORITY` (0 normal, 1 below normal), omps's `OMPS_CLIENT_QOS`
/// (`normal`, `below-normal`, `latency-critical`; it wins over the former),
/// `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` (a percentage, can only lower the server's default),
/// `CUDA_MPS_SM_PARTITION` and `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` (can only lower limits). A value that makes no sense is an error naming it.
pub fn settings_from_env() -> Result<wire::ClientSettings, String> {
    settings_from(|k| std::env::var(k).ok())
}

pub fn settings_from(var: impl Fn(&str) -> Option<String>) -> Result<wire::ClientSettings, String> {
    let mut s = wire::ClientSettings::none();
    s.ns_pid = std::process::id();
    if let Some(v) = var("CUDA_MPS_CLIENT_PRIORITY") {
        s.qos = match v.trim() {
            "0" => 0,
            "1" => 1,
            _ => {
                return Err(format!(
                    "CUDA_MPS_CLIENT_PRIORITY={v}: must be 0 (normal) or 1 (below normal)"
                ))
            }
        };
    }
    if let Some(v) = var("OMPS_CLIENT_QOS") {
        s.qos = match v.trim() {
            "normal" | "0" => 0,
            "below-normal" | "1" => 1,
            "latency-critical" | "2" => 2,
            _ => {
                return Err(format!(
                    "OMPS_CLIENT_QOS={v}: must be normal, below-normal or latency-critical"
                ))
            }
        };
    }
    if let Some(v) = var("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") {
        s.thread_milli_pct = wire::parse_percentage(&v)
            .ok_or_else(|| format!("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={v}: must be a percentage above 0 and at most 100"))?;
    }
    if let Some(v) = var("CUDA_MPS_SM_PARTITION") {
        let v = v.trim();
        if v.is_empty() || v.len() >= s.partition.len() {
            return Err(format!(
                "CUDA_MPS_SM_PARTITION={v}: must be a partition as lspart names it (UUID/ID)"
            ));
        }
        s.partition[..v.len()].copy_from_slice(v.as_bytes());
    }
    // The devices it may see, as natively: CUDA_VISIBLE_DEVICES, else (in a container,
    // where the runtime mounts only these GPUs) NVIDIA_VISIBLE_DEVICES. Empty or `void`
    // there means none; the server resolves the list against its GPUs.
    let visible = var("CUDA_VISIBLE_DEVICES").or_else(|| {
        var("NVIDIA_VISIBLE_DEVICES").map(|v| match v.trim() {
            "none" | "void" | "" => "void".to_string(),
            v => v.to_string(),
        })
    });
    if let Some(v) = visible {
        let v = v.trim();
        if v.len() >= s.visible.len() {
            return Err(format!(
                "CUDA_VISIBLE_DEVICES={v}: longer than {} bytes",
                s.visible.len() - 1
            ));
        }
        // An empty list is the server's "none": marked so it is not read as unsaid.
        let v = if v.is_empty() { "void" } else { v };
        s.visible[..v.len()].copy_from_slice(v.as_bytes());
    }
    if let Some(v) = var("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT") {
        let v = v.trim();
        omps_ring::memlimit::parse_limits(v)
            .map_err(|why| format!("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={v}: {why}"))?;
        if v.len() >= s.mem_limit.len() {
            return Err(format!(
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={v}: longer than {} bytes",
                s.mem_limit.len() - 1
            ));
        }
        s.mem_limit[..v.len()].copy_from_slice(v.as_bytes());
    }
    Ok(s)
}
