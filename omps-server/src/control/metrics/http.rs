//! The metrics over HTTP (`--metrics ADDR`): one thread serves every connection at once,
//! each socket non-blocking and polled, so that idle or slow connections cost a scrape
//! nothing. Once each scrape waited for the connection before it (2 s for an idle one),
//! and a liveness probe on this port had the kubelet restart a server that a few idle
//! sockets held up.

use super::Board;
use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Connections kept at once; a new one beyond closes the oldest (a scraper's, made last,
/// is kept).
pub const MAX_CONNECTIONS: usize = 64;
/// The whole exchange, request in and answer out, must be done within this.
pub const EXCHANGE_TIME: Duration = Duration::from_secs(2);
/// The longest request head read.
const MAX_REQUEST: usize = 8192;

/// Serves `board` at `http://ADDR/metrics` on a thread of its own; the address bound
/// (its port, where ADDR asked for any).
pub fn serve(addr: std::net::SocketAddr, board: Arc<Board>) -> io::Result<std::net::SocketAddr> {
    let listener = TcpListener::bind(addr)?;
    listener.set_nonblocking(true)?;
    let bound = listener.local_addr()?;
    tracing::info!(addr = %bound, "metrics served at /metrics");
    std::thread::Builder::new()
        .name("omps-metrics".into())
        .spawn(move || run(listener, &board))?;
    Ok(bound)
}

struct Exchange {
    s: TcpStream,
    req: Vec<u8>,
    /// The answer, once the request is in, and how much of it has been sent.
    out: Vec<u8>,
    sent: usize,
    deadline: Instant,
}

/// Where an exchange stands after a step.
enum Step {
    Going,
    Done,
}

impl Exchange {
    /// Reads what has come and sends what the socket takes, without waiting.
    fn step(&mut self, board: &Board) -> io::Result<Step> {
        if self.out.is_empty() {
            let mut buf = [0u8; 1024];
            loop {
                if self.req.windows(4).any(|w| w == b"\r\n\r\n") || self.req.len() >= MAX_REQUEST {
                    break;
                }
                match self.s.read(&mut buf) {
                    Ok(0) if self.req.is_empty() => return Ok(Step::Done),
                    Ok(0) => break,
                    Ok(n) => self.req.extend_from_slice(&buf[..n]),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Step::Going),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            self.out = answer(&self.req, board);
        }
        while self.sent < self.out.len() {
            match self.s.write(&self.out[self.sent..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => self.sent += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Step::Going),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(Step::Done)
    }
}

/// The HTTP answer to request head `req`.
fn answer(req: &[u8], board: &Board) -> Vec<u8> {
    let line = String::from_utf8_lossy(req);
    let (status, body) = match line.split_whitespace().take(2).collect::<Vec<_>>()[..] {
        ["GET", "/metrics"] => ("200 OK", board.render()),
        ["GET", _] => ("404 Not Found", "only /metrics is served\n".to_string()),
        _ => ("405 Method Not Allowed", "GET /metrics\n".to_string()),
    };
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/openmetrics-text; version=1.0.0; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn run(listener: TcpListener, board: &Board) {
    let mut conns: VecDeque<Exchange> = VecDeque::new();
    loop {
        let mut fds = vec![libc::pollfd {
            fd: listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        fds.extend(conns.iter().map(|c| libc::pollfd {
            fd: c.s.as_raw_fd(),
            events: if c.out.is_empty() {
                libc::POLLIN | libc::POLLRDHUP
            } else {
                libc::POLLOUT
            },
            revents: 0,
        }));
        // Wake for the earliest deadline, and at least once a second.
        let now = Instant::now();
        let wait = conns
            .iter()
            .map(|c| c.deadline.saturating_duration_since(now))
            .min()
            .unwrap_or(Duration::from_secs(1))
            .min(Duration::from_secs(1));
        let ms = wait.as_millis().max(1) as libc::c_int;
        // SAFETY: fds is a valid array of pollfd of the given length.
        if unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) } < 0 {
            continue;
        }
        let now = Instant::now();
        let mut ready = fds[1..].iter().map(|p| p.revents != 0);
        conns.retain_mut(|c| {
            if ready.next().unwrap_or(false) {
                match c.step(board) {
                    Ok(Step::Going) => {}
                    Ok(Step::Done) | Err(_) => return false,
                }
            }
            c.deadline >= now
        });
        if fds[0].revents & libc::POLLIN != 0 {
            accept_all(&listener, &mut conns);
        }
    }
}

/// Takes every connection waiting on `listener`.
fn accept_all(listener: &TcpListener, conns: &mut VecDeque<Exchange>) {
    loop {
        match listener.accept() {
            Ok((s, _)) => {
                if s.set_nonblocking(true).is_err() {
                    continue;
                }
                if conns.len() >= MAX_CONNECTIONS {
                    conns.pop_front();
                }
                conns.push_back(Exchange {
                    s,
                    req: Vec::new(),
                    out: Vec::new(),
                    sent: 0,
                    deadline: Instant::now() + EXCHANGE_TIME,
                });
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                // Out of descriptors the listener stays readable: pause rather than spin.
                tracing::warn!("metrics endpoint: accepting a connection failed: {e}");
                std::thread::sleep(Duration::from_millis(20));
                return;
            }
        }
    }
}
