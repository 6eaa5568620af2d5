//! Device memory limits in NVIDIA MPS's syntax, shared by the shim (which checks a
//! client's `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` before it connects), the server (which
//! resolves devices and enforces) and omps-ctl.
//!
//! A size is a number with a unit, binary as MPS's are: `512M`, `2G`, `1.5G`, `64MB`,
//! `1T`, `4096K` (`B` and `iB` after the unit are accepted; case does not matter). A list
//! is `device=size` pairs separated by commas, where a device is an ordinal (`0`) or a
//! UUID (`GPU-8a3c…`): `"0=2G,1=512M"`.

/// A device as a limit names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceKey {
    Ordinal(u32),
    Uuid(String),
}

impl std::fmt::Display for DeviceKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceKey::Ordinal(n) => write!(f, "{n}"),
            DeviceKey::Uuid(u) => f.write_str(u),
        }
    }
}

/// Parses a device as MPS's commands and variables take it: an ordinal or a `GPU-` UUID.
pub fn parse_device(v: &str) -> Result<DeviceKey, String> {
    let v = v.trim();
    if let Ok(n) = v.parse::<u32>() {
        return Ok(DeviceKey::Ordinal(n));
    }
    let hex = v.strip_prefix("GPU-").unwrap_or("");
    let ok = hex.len() == 36
        && hex.char_indices().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => c == '-',
            _ => c.is_ascii_hexdigit(),
        });
    if ok {
        Ok(DeviceKey::Uuid(
            v.to_ascii_lowercase().replacen("gpu-", "GPU-", 1),
        ))
    } else {
        Err(format!(
            "'{v}' is not a device: give an ordinal (0) or a UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)"
        ))
    }
}

/// Parses a size with its unit (`2G`, `512M`, `1.5G`, `64MB`), in bytes.
pub fn parse_size(v: &str) -> Result<u64, String> {
    let t = v.trim();
    let lower = t.to_ascii_lowercase();
    let body = lower
        .strip_suffix("ib")
        .or_else(|| lower.strip_suffix('b'))
        .unwrap_or(&lower);
    let (num, shift) = match body.chars().last() {
        Some('k') => (&body[..body.len() - 1], 10),
        Some('m') => (&body[..body.len() - 1], 20),
        Some('g') => (&body[..body.len() - 1], 30),
        Some('t') => (&body[..body.len() - 1], 40),
        _ => {
            return Err(format!(
                "'{t}' is not a size: give a number and a unit, as in 512M or 2G (units K, M, G, T)"
            ))
        }
    };
    let x: f64 = num
        .trim()
        .parse()
        .ok()
        .filter(|x: &f64| x.is_finite() && *x >= 0.0)
        .ok_or_else(|| format!("'{t}' is not a size: '{}' is not a number", num.trim()))?;
    let bytes = x * (1u64 << shift) as f64;
    if bytes >= u64::MAX as f64 {
        return Err(format!("'{t}' is too large"));
    }
    Ok(bytes.round() as u64)
}

/// Formats a size as [`parse_size`] reads it, in the largest unit that keeps it exact
/// (`2G`, `512M`; bytes that are no whole KiB as `K` with a fraction).
pub fn format_size(bytes: u64) -> String {
    for (unit, shift) in [("T", 40), ("G", 30), ("M", 20), ("K", 10)] {
        if bytes >= 1 << shift && bytes.is_multiple_of(1 << shift) {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    if bytes == 0 {
        return "0M".into();
    }
    format!("{:.3}K", bytes as f64 / 1024.0)
}

/// Parses `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`'s list: `0=2G,1=512M` (ordinals or UUIDs).
pub fn parse_limits(spec: &str) -> Result<Vec<(DeviceKey, u64)>, String> {
    let mut out: Vec<(DeviceKey, u64)> = Vec::new();
    for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (dev, size) = item
            .split_once('=')
            .ok_or_else(|| format!("'{item}' is not device=size (as in 0=2G)"))?;
        let key = parse_device(dev)?;
        let bytes = parse_size(size)?;
        if out.iter().any(|(k, _)| *k == key) {
            return Err(format!("device {key} is given twice"));
        }
        out.push((key, bytes));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_mps_units() {
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("512MB"), Ok(512 << 20));
        assert_eq!(parse_size("1.5g"), Ok(3 << 29));
        assert_eq!(parse_size(" 4096KiB "), Ok(4 << 20));
        assert_eq!(parse_size("1T"), Ok(1 << 40));
        for bad in ["", "G", "12", "-1G", "x1G", "1Q", "nanG", "1e30T"] {
            assert!(parse_size(bad).is_err(), "{bad} parsed");
        }
    }

    #[test]
    fn sizes_format_back_exactly() {
        for b in [2u64 << 30, 512 << 20, 3 << 29, 1 << 40, 4 << 10, 0] {
            assert_eq!(parse_size(&format_size(b)), Ok(b), "{}", format_size(b));
        }
        assert_eq!(format_size(3 << 29), "1536M");
    }

    #[test]
    fn lists_name_ordinals_and_uuids() {
        let u = "GPU-8A3C1D2E-0000-1111-2222-333344445555";
        let l = parse_limits(&format!("0=2G, {u}=512M")).unwrap();
        assert_eq!(l[0], (DeviceKey::Ordinal(0), 2 << 30));
        assert_eq!(
            l[1],
            (
                DeviceKey::Uuid("GPU-8a3c1d2e-0000-1111-2222-333344445555".into()),
                512 << 20
            )
        );
        assert!(parse_limits("0=2G,0=1G").is_err());
        assert!(parse_limits("0:2G").is_err());
        assert!(parse_limits("GPU-12=1G").is_err());
        assert_eq!(parse_limits(""), Ok(vec![]));
    }
}
