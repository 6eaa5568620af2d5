//! A client's green context as its session holds it ([`GreenCtx`]): below the session
//! (state.rs holds them) and the family that serves them (green.rs).

pub(in crate::session) struct GreenCtx {
    pub(in crate::session) sms: u32,
    /// Its legacy default stream's id.
    pub(in crate::session) legacy: u32,
}
