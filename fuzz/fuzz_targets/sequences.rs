//! Stateful sequences of client records on the host GPU: see
//! omps-server/src/fuzz_sequences/ (CI runs the same body under proptest).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    omps_server::fuzz_sequences::run_sequence(data);
});
