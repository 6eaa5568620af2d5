//! Which MPS protocol an invocation speaks (issue 26): 2, the legacy one-command-a-line
//! interface, or 3, MPS v3's `module verb` commands.
//!
//! As in MPS: `-p N` on the command line, `CUDA_MPS_PROTOCOL_VERSION=N` in the environment
//! (the variable wins over the option), 2 when neither is given; and once a daemon runs,
//! every later invocation follows the daemon's protocol whatever it is given. omps keeps
//! the daemon's protocol in `PIPE/operator/protocol`, which the server writes at start from
//! `OMPS_PROTOCOL` (set by `omps-ctl -d`/`-f`). Legacy commands keep
//! working under protocol 3 (omps-ctl tells the two apart by their first word).

use std::path::Path;

pub const LEGACY: u8 = 2;
pub const V3: u8 = 3;

/// The protocol asked for by `-p` and the environment; an unknown one is an error.
pub fn asked(option: Option<&str>, env: Option<&str>) -> Result<u8, String> {
    let pick = |what: &str, v: &str| match v.trim() {
        "2" => Ok(LEGACY),
        "3" => Ok(V3),
        _ => Err(format!(
            "{what}: '{v}' is not a protocol omps speaks (2 or 3)"
        )),
    };
    match (env, option) {
        (Some(e), _) => pick("CUDA_MPS_PROTOCOL_VERSION", e),
        (None, Some(o)) => pick("-p", o),
        (None, None) => Ok(LEGACY),
    }
}

/// The running daemon's protocol, from the file it wrote in `operator_dir` (None: no file,
/// or not one the daemon wrote: then the invocation's own choice stands).
pub fn of_daemon(operator_dir: &Path) -> Option<u8> {
    let text = std::fs::read_to_string(operator_dir.join("protocol")).ok()?;
    match text.trim() {
        "2" => Some(LEGACY),
        "3" => Some(V3),
        _ => None,
    }
}

/// Records the daemon's protocol for later invocations.
#[cfg(test)]
fn record(operator_dir: &Path, protocol: u8) -> std::io::Result<()> {
    std::fs::write(operator_dir.join("protocol"), format!("{protocol}\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_wins_and_bad_values_are_named() {
        assert_eq!(asked(None, None), Ok(LEGACY));
        assert_eq!(asked(Some("3"), None), Ok(V3));
        assert_eq!(asked(Some("3"), Some("2")), Ok(LEGACY));
        assert!(asked(Some("4"), None).unwrap_err().starts_with("-p"));
        assert!(asked(None, Some("x"))
            .unwrap_err()
            .starts_with("CUDA_MPS_PROTOCOL_VERSION"));
    }

    #[test]
    fn a_later_invocation_follows_the_daemon() {
        let d = std::env::temp_dir().join(format!("omps-proto-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        assert_eq!(of_daemon(&d), None);
        record(&d, V3).unwrap();
        assert_eq!(of_daemon(&d), Some(V3));
        std::fs::write(d.join("protocol"), "junk").unwrap();
        assert_eq!(of_daemon(&d), None);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
