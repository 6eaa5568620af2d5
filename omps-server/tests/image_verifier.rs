//! The image verifier (omps-server/src/verifier.rs) with the real server binary as its
//! child, playing the driver with the host GPU (`--verify-images --host`): an image that
//! kills the driver's parser is refused and remembered, the child is started again for
//! the next image, and images found good are known from the verdict file after a
//! restart, without a load.

use omps_server::verifier::{Spec, Verdict, Verifier};

fn spec(known: &std::path::Path) -> Spec {
    Spec {
        program: env!("CARGO_BIN_EXE_omps-server").into(),
        args: vec!["--verify-images".into(), "--host".into()],
        known_file: Some(known.to_path_buf()),
    }
}

#[test]
fn an_image_that_kills_the_parser_never_reaches_the_server() {
    let dir = std::env::temp_dir().join(format!("omps-image-verifier-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let known = dir.join("verified-images");
    let good = b"omps-host-module\nfn fill_u32 0:8 8:4 12:4\n\0".to_vec();
    let mut evil = b"omps-host-module\nfn x\n".to_vec();
    evil.extend_from_slice(omps_server::gpu_host::PARSER_CRASH);
    evil.push(0);
    let other = b"omps-host-module\nfn trap\n\0".to_vec();

    let v = Verifier::new(spec(&known));
    assert_eq!(v.check(0, b"sm90", &good), Verdict::Good);
    assert_eq!(
        v.check(0, b"sm90", &evil),
        Verdict::Crashed,
        "the child died on it"
    );
    assert_eq!(v.check(0, b"sm90", &evil), Verdict::Crashed, "remembered");
    assert_eq!(v.spawned(), 1, "no child asked twice about the same image");
    assert_eq!(
        v.check(0, b"sm90", &other),
        Verdict::Good,
        "a new child for the next image"
    );
    assert_eq!(v.spawned(), 2);
    drop(v);

    // After a restart the good images are known from the file: no child at all.
    let again = Verifier::new(spec(&known));
    assert_eq!(again.check(0, b"sm90", &good), Verdict::Good);
    assert_eq!(again.check(0, b"sm90", &other), Verdict::Good);
    assert_eq!(again.spawned(), 0);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Found in review (finding 1): a link's inputs (objects, libraries, LTO IR, cubins) went
/// to the driver's linker inside the server, checked by their headers only. A container
/// is now linked first in the child: one whose input kills the linker is refused and
/// remembered; a good one links; an image's verdict is not a container's of the same
/// bytes.
#[test]
fn a_link_that_kills_the_linker_never_reaches_the_server() {
    use omps_ring::wire::link;
    use omps_server::verifier::Work;
    let dir = std::env::temp_dir().join(format!("omps-link-verifier-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    const OBJECT: u32 = 3; // CU_JIT_INPUT_OBJECT: no header the server reads
    let good = link::encode(&[], [(OBJECT, "a.o", &b"some object"[..])]);
    let mut evil_bytes = b"an object ".to_vec();
    evil_bytes.extend_from_slice(omps_server::gpu_host::PARSER_CRASH);
    let evil = link::encode(&[], [(OBJECT, "b.o", evil_bytes.as_slice())]);
    let v = Verifier::new(spec(&dir.join("verified-images")));
    assert_eq!(
        v.check_work(0, 0, b"sm90", &good, Work::Link),
        Verdict::Good
    );
    assert_eq!(
        v.check_work(0, 0, b"sm90", &evil, Work::Link),
        Verdict::Crashed,
        "the child's linker died on it"
    );
    assert_eq!(
        v.check_work(0, 0, b"sm90", &evil, Work::Link),
        Verdict::Crashed,
        "remembered"
    );
    assert_eq!(v.spawned(), 1);
    // The same bytes as an image are another question, asked of a new child.
    assert_eq!(
        v.check_work(0, 0, b"sm90", &good, Work::Load),
        Verdict::Good
    );
    assert_eq!(v.spawned(), 2);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// PTX loaded with JIT options (cuModuleLoadDataEx) is compiled first in the child with
/// those options, as the server's driver would compile it: PTX that kills the compiler is
/// refused; the same PTX with other options is another verdict.
#[test]
fn jit_ptx_that_kills_the_compiler_never_reaches_the_server() {
    use omps_ring::wire::link;
    use omps_server::verifier::Work;
    let dir = std::env::temp_dir().join(format!("omps-jit-verifier-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    const PTX: u32 = 1;
    let opt = |option, value| link::Opt {
        option,
        _pad: 0,
        value,
    };
    let mut evil = b".version 8.0\n.target sm_90\n// ".to_vec();
    evil.extend_from_slice(omps_server::gpu_host::PARSER_CRASH);
    evil.push(0);
    let good = b".version 8.0\n.target sm_90\n\0".to_vec();
    let with = |ptx: &[u8], level: u64| link::encode(&[opt(7, level)], [(PTX, "k.ptx", ptx)]);
    let v = Verifier::new(spec(&dir.join("verified-images")));
    assert_ne!(
        v.check_work(0, 0, b"sm90", &with(&good, 3), Work::Jit),
        Verdict::Crashed
    );
    assert_eq!(
        v.check_work(0, 0, b"sm90", &with(&evil, 3), Work::Jit),
        Verdict::Crashed,
        "the child's compiler died on it"
    );
    assert_eq!(
        v.check_work(0, 0, b"sm90", &with(&evil, 0), Work::Jit),
        Verdict::Crashed,
        "other options: asked again, and refused again"
    );
    assert_eq!(
        v.spawned(),
        2,
        "one for the first two, a new one after the death"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
