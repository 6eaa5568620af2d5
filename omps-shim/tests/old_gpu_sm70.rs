//! The server on a host GPU playing compute capability 7.0, Volta (V100): see old_gpu/mod.rs.

mod common;
mod old_gpu;

#[test]
fn serves_and_refuses_what_the_gpu_lacks() {
    old_gpu::serves_and_refuses(omps_server::gpu_host::HostProfile::Sm70);
}
