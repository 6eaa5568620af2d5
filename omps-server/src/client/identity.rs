//! Who a client is, as ps, top and the metrics show it: its PID namespace, container and
//! pod (read from /proc), and the command it runs, made one word.

/// Who a client is, as ps, top and the metrics show it.
#[derive(Clone, Debug, Default)]
pub struct Identity {
    /// Its program (argv[0]), without whitespace; read off the control thread (a client's
    /// argv lies in its own memory, which it could make slow to read), so unset at first.
    pub command: std::sync::OnceLock<String>,
    /// The inode of its PID namespace (0: unknown).
    pub pid_ns: u64,
    /// Its PID in its own namespace, as it said (0: not said).
    pub ns_pid: u32,
    /// The container it runs in, read from its cgroup (empty: none found).
    pub container: String,
    /// The Kubernetes pod UID, read from its cgroup (empty: none found).
    pub pod: String,
}

impl Identity {
    /// Reads what the kernel says of process `pid` (as the server sees it): its PID
    /// namespace and cgroup, never the process's own memory.
    pub fn of(pid: i32, ns_pid: u32) -> Identity {
        let pid_ns = std::fs::read_link(format!("/proc/{pid}/ns/pid"))
            .ok()
            .and_then(|l| {
                let l = l.to_string_lossy().into_owned();
                l.strip_prefix("pid:[")?.strip_suffix(']')?.parse().ok()
            })
            .unwrap_or(0);
        let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
        let (container, pod) = container_of(&cgroup);
        Identity {
            command: Default::default(),
            pid_ns,
            ns_pid,
            container,
            pod,
        }
    }
}

/// Text a client chose (its argv[0], its comm), made one word: at most `max` characters,
/// whitespace and control characters replaced, so ps rows and log lines stay whole.
pub fn one_word(text: &str, max: usize) -> String {
    text.chars()
        .take(max)
        .map(|c| {
            if c.is_whitespace() || c.is_control() {
                '_'
            } else {
                c
            }
        })
        .collect()
}

/// The container id (64 hex digits) and Kubernetes pod UID a cgroup path names, as
/// Docker, containerd, CRI-O and the kubelet lay them out (`…/docker-<id>.scope`,
/// `…/kubepods-…-pod<uid>.slice/cri-containerd-<id>.scope`, `/kubepods/…/pod<uid>/<id>`).
pub fn container_of(cgroup: &str) -> (String, String) {
    let path = cgroup
        .lines()
        .find_map(|l| l.splitn(3, ':').nth(2))
        .unwrap_or("");
    let mut container = String::new();
    let mut pod = String::new();
    for part in path.split('/') {
        let stem = part
            .strip_suffix(".scope")
            .or_else(|| part.strip_suffix(".slice"))
            .unwrap_or(part);
        if let Some(p) = stem.rsplit("-pod").next().filter(|_| stem.contains("-pod")) {
            pod = p.replace('_', "-");
        } else if let Some(p) = stem.strip_prefix("pod") {
            pod = p.to_string();
        }
        let id = stem.rsplit(['-', ':']).next().unwrap_or(stem);
        if id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit()) {
            container = id.to_string();
        }
    }
    (container, pod)
}

#[cfg(test)]
mod tests {
    use super::container_of;

    #[test]
    fn containers_and_pods_are_read_from_cgroup_paths() {
        let id = "4f2a".repeat(16);
        let docker = format!("0::/system.slice/docker-{id}.scope\n");
        assert_eq!(container_of(&docker), (id.clone(), String::new()));
        let k8s = format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1c2d_3e4f.slice/cri-containerd-{id}.scope\n"
        );
        assert_eq!(container_of(&k8s), (id.clone(), "1c2d-3e4f".into()));
        let v1 = format!("12:memory:/kubepods/besteffort/pod77aa-bb/{id}\n");
        assert_eq!(container_of(&v1), (id, "77aa-bb".into()));
        assert_eq!(
            container_of("0::/user.slice/session-3.scope\n"),
            (String::new(), String::new())
        );
    }
}
