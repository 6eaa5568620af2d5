//! A hostile client for the GPU script: connects to the omps server of the pipe directory,
//! proves its ring works, then writes garbage over it. Exits 0 when the server cuts it
//! off within 5 s (what must happen), 1 otherwise.

use omps_ring::ring::RingHeader;
use omps_shim::conn::Conn;
use std::time::{Duration, Instant};

fn main() {
    let c = match Conn::connect() {
        Ok(c) => c,
        Err((code, why)) => {
            eprintln!("ring_vandal: cannot connect ({code}): {why}");
            std::process::exit(2);
        }
    };
    if let Err(e) = c.ping(0) {
        eprintln!("ring_vandal: server did not answer a valid ping: {e}");
        std::process::exit(2);
    }
    let (hdr, data, cap) = c.seg().ring_parts(0);
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    // SAFETY: the ring lies in this process's own mapping of its segment; scribbling on
    // it is the point of this program.
    unsafe {
        for i in 0..cap / 8 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (data as *mut u64).add(i).write_volatile(x);
        }
        (hdr as *mut RingHeader as *mut u64).write_volatile(x | 7);
    }
    c.ring_bell(0);
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(5) {
        if c.check_alive().is_err() {
            println!(
                "ring_vandal: disconnected after {:.1} ms",
                t.elapsed().as_secs_f64() * 1e3
            );
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    eprintln!("ring_vandal: still connected after 5 s of garbage");
    std::process::exit(1);
}
