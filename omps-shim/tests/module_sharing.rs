//! Clients that load the same image share one loaded module (a load waits for every
//! running kernel and stalls every client on a GPU), unless the image holds data of its
//! own; a shared module outlives its last user for the next one.

mod common;
use common::*;
use omps_ring::wire::{self, Op};
use omps_server::testing::elf_with;
use omps_shim::conn::Conn;
use std::time::{Duration, Instant};

fn unload(c: &Conn, module: u32) {
    c.push(
        0,
        Op::ModuleUnload,
        &[bytemuck::bytes_of(&wire::Handle {
            id: module,
            _pad: 0,
        })],
    )
    .unwrap();
    c.ping(0).unwrap();
}

#[test]
fn one_load_for_every_client_of_a_data_free_image() {
    let srv = TestServer::start("share");
    let code = elf_with(&[".text._Z1kPf", ".nv.constant0._Z1kPf", ".nv.info"], &[]);
    let a = Conn::connect_to(&srv.socket()).unwrap();
    let b = Conn::connect_to(&srv.socket()).unwrap();
    let (ma, _) = load_image(&a, &code).unwrap();
    let (mb, _) = load_image(&b, &code).unwrap();
    assert_eq!(
        srv.gpu.module_loads(),
        (1, 1),
        "the second client's load cost nothing"
    );
    unload(&a, ma);
    drop(b);
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        srv.gpu.module_loads().1,
        1,
        "kept loaded after its last user"
    );
    let _ = mb;
    let c = Conn::connect_to(&srv.socket()).unwrap();
    load_image(&c, &code).unwrap();
    assert_eq!(
        srv.gpu.module_loads(),
        (1, 1),
        "and found again by the next one"
    );
}

#[test]
fn images_with_variables_are_each_clients_own() {
    let srv = TestServer::start("noshare");
    let data = elf_with(&[".text._Z1kPf", ".nv.global"], &[]);
    let a = Conn::connect_to(&srv.socket()).unwrap();
    let b = Conn::connect_to(&srv.socket()).unwrap();
    let (ma, _) = load_image(&a, &data).unwrap();
    load_image(&b, &data).unwrap();
    assert_eq!(srv.gpu.module_loads(), (2, 2), "a copy each");
    unload(&a, ma);
    drop(b);
    let t = Instant::now();
    while srv.gpu.module_loads().1 != 0 && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(
        srv.gpu.module_loads().1,
        0,
        "and unloaded when their client is done"
    );
}
