//! Which of the server's GPUs a client sees, and in what order: its CUDA_VISIBLE_DEVICES
//! (or, in a container, the NVIDIA_VISIBLE_DEVICES its runtime set), as a native process
//! would see them. The client's device k is the server's GPU `visible[k]`: its snapshot,
//! its ring k and doorbell go to that GPU's worker.

use omps_ring::segment::DeviceSnapshot;

/// The server GPUs `spec` names, in its order, as CUDA reads CUDA_VISIBLE_DEVICES: entries
/// are ordinals or UUIDs (`GPU-…`, a unique prefix being enough), and the list ends at the
/// first entry that names no GPU or one already named. None (no spec): every GPU.
pub fn resolve(spec: Option<&str>, gpus: &[DeviceSnapshot]) -> Vec<usize> {
    let Some(spec) = spec else {
        return (0..gpus.len()).collect();
    };
    let uuids: Vec<String> = gpus
        .iter()
        .map(|g| crate::base::ids::uuid_text(&g.uuid))
        .collect();
    let mut out: Vec<usize> = Vec::new();
    for entry in spec.split(',').map(str::trim) {
        let found = if let Ok(n) = entry.parse::<usize>() {
            (n < gpus.len()).then_some(n)
        } else {
            let e = entry.to_ascii_lowercase();
            let e = e.strip_prefix("gpu-").unwrap_or(&e);
            let hits: Vec<usize> = (0..gpus.len())
                .filter(|&g| !e.is_empty() && uuids[g][4..].starts_with(e))
                .collect();
            match hits[..] {
                [g] => Some(g),
                _ => None,
            }
        };
        match found {
            Some(g) if !out.contains(&g) => out.push(g),
            _ => break,
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytemuck::Zeroable;

    fn gpus() -> Vec<DeviceSnapshot> {
        [[0x8a; 16], [0x8b; 16], [0x11; 16]]
            .into_iter()
            .map(|u| {
                let mut d = DeviceSnapshot::zeroed();
                d.uuid = u;
                d
            })
            .collect()
    }

    #[test]
    fn lists_read_as_cuda_reads_them() {
        let g = gpus();
        assert_eq!(resolve(None, &g), vec![0, 1, 2]);
        assert_eq!(resolve(Some("2,0"), &g), vec![2, 0]);
        assert_eq!(
            resolve(Some("GPU-8b8b8b8b-8b8b-8b8b-8b8b-8b8b8b8b8b8b"), &g),
            vec![1]
        );
        assert_eq!(resolve(Some("GPU-11,1"), &g), vec![2, 1], "a unique prefix");
        assert_eq!(
            resolve(Some("GPU-8"), &g),
            Vec::<usize>::new(),
            "an ambiguous prefix ends it"
        );
        assert_eq!(
            resolve(Some("1,7,0"), &g),
            vec![1],
            "the first invalid entry ends it"
        );
        assert_eq!(resolve(Some("0,0"), &g), vec![0], "a repeat ends it");
        assert_eq!(resolve(Some(""), &g), Vec::<usize>::new());
        assert_eq!(resolve(Some("void"), &g), Vec::<usize>::new());
    }
}
