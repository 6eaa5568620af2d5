//! Arbitrary records into the server's decoder and validation, on the host-memory GPU
//! (see `omps_server::testing::run_command_bytes`, which CI also runs under proptest).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| omps_server::testing::run_command_bytes(data));
