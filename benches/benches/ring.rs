//! The ring across two processes: round-trip latency and one-way throughput.
//!
//! The child (this binary again, see `omps_benches::Child`) busy-polls, as the server's
//! hot loop does while it has clients, so these are the no-syscall figures.

use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput};
use omps_benches::{Child, ECHO, SINK};

fn round_trip(c: &mut Criterion, child: &mut Child) {
    let payload = [0xA5u8; 64];
    let mut out = Vec::with_capacity(64);
    c.bench_function("ring/round_trip/64B", |b| {
        b.iter(|| {
            child.push(ECHO, &payload);
            let tag = child.pop(&mut out);
            assert_eq!((tag, out.len()), (ECHO, 64));
        })
    });
}

fn one_way(c: &mut Criterion, child: &mut Child) {
    let mut group = c.benchmark_group("ring/one_way");
    for size in [64usize, 4096] {
        let payload = vec![0x5Au8; size];
        group.throughput(Throughput::Bytes(size as u64));
        group.bench_with_input(
            BenchmarkId::from_parameter(format!("{size}B")),
            &size,
            |b, _| {
                // Timed until the child has consumed the last record, so a full ring
                // cannot flatter the figure.
                b.iter_custom(|iters| {
                    let start = Instant::now();
                    for _ in 0..iters {
                        child.push(SINK, &payload);
                    }
                    child.wait_drained();
                    start.elapsed()
                })
            },
        );
    }
    group.finish();
}

fn main() {
    omps_benches::serve_if_child();
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();
    let mut child = Child::spawn().expect("spawning the bench child");
    round_trip(&mut c, &mut child);
    one_way(&mut c, &mut child);
    drop(child);
    c.final_summary();
}
