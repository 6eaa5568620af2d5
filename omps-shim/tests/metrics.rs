//! The metrics: per client (memory, limit, launches, commands) and per GPU, in
//! Prometheus's exposition format, from `omps-ctl metrics` and over HTTP.

mod common;
use common::*;
use omps_ring::wire::{self, Op};
use omps_shim::conn::Conn;
use std::io::{Read, Write};

fn value(text: &str, name: &str, label: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(&format!("{name}{{")) && l.contains(label))
        .and_then(|l| l.rsplit_once(' '))
        .and_then(|(_, v)| v.parse().ok())
}

#[test]
fn clients_and_gpus_are_measured_and_served_over_http() {
    let addr = free_local_addr();
    let srv = TestServer::start_with("metrics", |c| {
        c.metrics = Some(addr);
        c.default_mem_limit = Some("0=64M".into());
    });
    let c = Conn::connect_to(&srv.socket()).unwrap();
    let p = alloc(&c, 3 << 20);
    let (_, funcs) = load_image(&c, HOST_MODULE.as_bytes()).unwrap();
    let fill = funcs.iter().find(|(n, _)| n == "fill_u32").unwrap().1;
    for _ in 0..5 {
        let mut args = Vec::new();
        args.extend_from_slice(&p.to_le_bytes());
        args.extend_from_slice(&7u32.to_le_bytes());
        args.extend_from_slice(&16u32.to_le_bytes());
        let l = wire::Launch {
            func: fill,
            grid: [1, 1, 1],
            block: [16, 1, 1],
            args_len: args.len() as u32,
            ..Default::default()
        };
        c.push(0, Op::Launch, &[bytemuck::bytes_of(&l), &args])
            .unwrap();
    }
    c.ping(0).unwrap();
    let me = format!("pid=\"{}\"", std::process::id());
    let (ok, text) = srv.ctl("metrics");
    assert!(ok, "{text}");
    assert_eq!(
        value(&text, "omps_client_memory_bytes", &me),
        Some((3 << 20) as f64 + 16.0),
        "{text}"
    );
    assert_eq!(
        value(&text, "omps_client_memory_limit_bytes", &me),
        Some((64 << 20) as f64)
    );
    assert_eq!(
        value(&text, "omps_client_launches_total", &me),
        Some(5.0),
        "{text}"
    );
    assert!(value(&text, "omps_client_commands_total", &me).unwrap() >= 7.0);
    assert_eq!(value(&text, "omps_gpu_fault", "gpu=\"0\""), Some(0.0));
    assert_eq!(value(&text, "omps_gpu_clients", "gpu=\"0\""), Some(1.0));
    assert!(
        text.ends_with("# EOF\n"),
        "OpenMetrics text ends with # EOF"
    );
    // The same figures over HTTP.
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    assert!(body.starts_with("HTTP/1.1 200 OK\r\n"), "{body}");
    assert_eq!(value(&body, "omps_client_launches_total", &me), Some(5.0));
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.write_all(b"GET /other HTTP/1.1\r\n\r\n").unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    assert!(body.starts_with("HTTP/1.1 404"), "{body}");
    // A client gone is gone from the figures.
    drop(c);
    srv.wait_ps(2, |ps| ps.lines().count() == 1);
    assert_eq!(
        value(&srv.ctl("metrics").1, "omps_client_launches_total", &me),
        None
    );
}
