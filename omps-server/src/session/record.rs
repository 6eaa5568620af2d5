//! What every family of a session's commands needs of a record before the session itself:
//! its fixed part, the verdict on one no honest shim sends ([`Malformed`]), a device range.
//! On its own so that the session's per-family state (kinds/) can refuse a record without
//! depending on the session.

use omps_ring::wire;

/// The fixed part of a record whose length `handle` checked.
pub fn rec<T: bytemuck::Pod>(p: &[u8]) -> T {
    wire::get::<T>(p).expect("length checked above")
}

/// A record that must carry nothing after its fixed part.
pub fn fixed_only(tail: &[u8], name: &str) -> Result<(), Malformed> {
    if tail.is_empty() {
        Ok(())
    } else {
        bad(format!("{name}: trailing bytes"))
    }
}

/// Why a client is cut off.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed(pub String);

pub fn bad<T>(why: impl Into<String>) -> Result<T, Malformed> {
    Err(Malformed(why.into()))
}

/// A device range: start and length.
pub type Range = (u64, u64);
