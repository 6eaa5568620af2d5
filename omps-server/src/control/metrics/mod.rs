//! Live figures per client and per GPU, in Prometheus's exposition format: served by
//! `omps-ctl metrics` (which `omps-ctl top` reads) and, when the server is started with
//! `--metrics ADDR`, over HTTP at `/metrics`.
//!
//! Owns the board a scrape reads ([`board`]) and the HTTP server ([`http`]). May use the
//! clients' and GPUs' shared state (`client/`, `worker/`, `gpu/`) and `base/`.

mod board;
mod http;

pub use board::Board;
use std::sync::Arc;

/// Serves `board` at `http://ADDR/metrics` on a thread of its own (crate::control::metrics::http).
pub fn serve(addr: std::net::SocketAddr, board: Arc<Board>) -> std::io::Result<()> {
    http::serve(addr, board).map(drop)
}
