//! The value forms of MPS v3, shared by the command line ([`super::verbs`]) and the TOML
//! file ([`super::config`]): each parser returns the value or the reason it is not one,
//! for the caller to put beside the option or key it came from.

/// Longest server or namespace name MPS v3 takes.
pub const MAX_NAME: usize = 64;

/// A server, namespace or partition name: `[a-z0-9_]`, 1 to 64 characters (MPS v3's rule;
/// it also keeps names safe as directory names under the pipe directory).
pub fn name(v: &str) -> Result<String, String> {
    if v.is_empty() {
        return Err("a name cannot be empty".into());
    }
    if v.len() > MAX_NAME {
        return Err(format!("'{v}' is longer than {MAX_NAME} characters"));
    }
    if let Some(c) = v
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_'))
    {
        return Err(format!("'{v}' has '{c}': names take a-z, 0-9 and _ only"));
    }
    Ok(v.to_string())
}

/// A memory size as MPS v3 writes it: a whole number with K, M or G (binary units), in
/// bytes. Fractions and other units (omps's own commands take them) are refused here so
/// that a file valid for omps is valid for MPS.
pub fn memory(v: &str) -> Result<u64, String> {
    let t = v.trim();
    let (num, shift) = match t.char_indices().last() {
        Some((i, 'K' | 'k')) => (&t[..i], 10),
        Some((i, 'M' | 'm')) => (&t[..i], 20),
        Some((i, 'G' | 'g')) => (&t[..i], 30),
        _ => {
            return Err(format!(
                "'{v}' is not a size: a whole number with K, M or G, as in 512M or 10G"
            ))
        }
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("'{v}' is not a size: '{num}' is not a whole number"))?;
    if n == 0 {
        return Err(format!(
            "'{v}' is no memory at all: a limit must be above 0"
        ));
    }
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("'{v}' is too large"))
}

/// An active thread percentage, 1 to 100 (MPS v3 takes no fraction on its command line;
/// the TOML file writes it as a string).
pub fn percentage(v: &str) -> Result<u32, String> {
    match v.trim().parse::<u32>() {
        Ok(p) if (1..=100).contains(&p) => Ok(p),
        Ok(p) => Err(format!("'{p}' is outside 1-100")),
        Err(_) => Err(format!("'{v}' is not a whole percentage (1-100)")),
    }
}

/// A client priority: 0 (normal) or 1 (below normal).
pub fn priority(v: &str) -> Result<u8, String> {
    match v.trim() {
        "0" => Ok(0),
        "1" => Ok(1),
        _ => Err(format!(
            "'{v}' is not a client priority: 0 (normal) or 1 (below normal)"
        )),
    }
}

/// true or false, as the command line writes booleans.
pub fn boolean(v: &str) -> Result<bool, String> {
    match v {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(format!("'{v}' is not true or false")),
    }
}

/// A device: an ordinal, or a GPU or MIG UUID as nvidia-smi prints it (the type omps's
/// memory limits name devices with).
pub use omps_ring::memlimit::DeviceKey as Device;

/// A device as v3 takes it: an ordinal, or a `GPU-`/`MIG-` UUID (NVIDIA's examples shorten
/// them, so any length of hex groups is taken here; the server says whether one exists).
pub fn device(v: &str) -> Result<Device, String> {
    let t = v.trim();
    if let Ok(n) = t.parse::<u32>() {
        return Ok(Device::Ordinal(n));
    }
    let hex_part = t.strip_prefix("GPU-").or_else(|| t.strip_prefix("MIG-"));
    match hex_part {
        Some(h) if !h.is_empty() && h.chars().all(|c| c.is_ascii_hexdigit() || c == '-') => {
            Ok(Device::Uuid(t.to_string()))
        }
        _ => Err(format!(
            "'{v}' is not a device: an ordinal, or a UUID such as GPU-74d43ed3-..."
        )),
    }
}

/// A comma-separated device list, none repeated.
pub fn devices(v: &str) -> Result<Vec<Device>, String> {
    let mut out: Vec<Device> = Vec::new();
    for part in v.split(',') {
        let d = device(part)?;
        if out.contains(&d) {
            return Err(format!("'{d}' is named twice"));
        }
        out.push(d);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(name("high_priority").unwrap(), "high_priority");
        assert!(name("").is_err());
        assert!(name("Team").unwrap_err().contains("'T'"));
        assert!(name("a-b").unwrap_err().contains("'-'"));
        assert!(name("../etc").is_err());
        assert!(name(&"a".repeat(65)).unwrap_err().contains("64"));
        assert!(name(&"a".repeat(64)).is_ok());
    }

    #[test]
    fn sizes() {
        assert_eq!(memory("10G").unwrap(), 10 << 30);
        assert_eq!(memory("512M").unwrap(), 512 << 20);
        assert_eq!(memory("1024K").unwrap(), 1 << 20);
        for bad in ["10", "1.5G", "10T", "G", "-1G", "0G", "10 GB", ""] {
            assert!(memory(bad).is_err(), "{bad}");
        }
        assert!(memory("99999999999999999G")
            .unwrap_err()
            .contains("too large"));
    }

    #[test]
    fn percentages_priorities_booleans() {
        assert_eq!(percentage("50").unwrap(), 50);
        assert_eq!(percentage("100").unwrap(), 100);
        assert!(percentage("0").unwrap_err().contains("1-100"));
        assert!(percentage("101").is_err());
        assert!(percentage("12.5").is_err());
        assert_eq!(priority("1").unwrap(), 1);
        assert!(priority("2").is_err());
        assert!(boolean("yes").is_err());
        assert!(boolean("false").is_ok_and(|b| !b));
    }

    #[test]
    fn device_lists() {
        assert_eq!(
            devices("0,1").unwrap(),
            vec![Device::Ordinal(0), Device::Ordinal(1)]
        );
        assert_eq!(
            device("GPU-74d43ed3-cdf7-e667-3644-bf5b4f46ed65").unwrap(),
            Device::Uuid("GPU-74d43ed3-cdf7-e667-3644-bf5b4f46ed65".into())
        );
        assert!(device("GPU-").is_err());
        assert!(device("GPU-xyz").is_err());
        assert!(device("gpu0").is_err());
        assert!(devices("0,0").unwrap_err().contains("twice"));
        assert!(devices("0,").is_err());
    }
}
