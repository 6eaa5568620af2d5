//! The placement's tests, in a file of their own so that placement.rs holds only the
//! placement (issue 24: no source file over about 600 lines, tests aside).

use super::*;

const L: Layout = Layout {
    classes: [4, 8, 4, 4],
    connections: 4,
    confined: 2,
    confined_per_class: 4,
};

fn bind(b: &mut [Binding], client: u32, rotate: usize) -> (usize, bool) {
    let r = pick(&L, b, L.class(NORMAL), client, None, rotate, &mut |_| true)
        .expect("uncapped, nothing captured");
    let x = &mut b[r.0];
    if x.refs == 0 {
        x.client = client;
    }
    x.refs += 1;
    r
}

#[test]
fn a_client_never_shares_a_queue_while_one_is_free_of_others() {
    let mut b = vec![Binding::default(); L.total()];
    let a0 = bind(&mut b, 1, 0).0;
    // Client 2's streams avoid client 1's queue, even though a stream on it is free.
    for r in 0..3 {
        let (s, shared) = bind(&mut b, 2, r);
        assert!(!shared);
        assert_ne!(
            L.queue(s),
            L.queue(a0),
            "client 2 placed on client 1's queue"
        );
    }
    // Client 2 now holds the other three queues: its fourth stream goes onto one of its
    // own queues, on a stream of its own, rather than onto client 1's queue.
    let (s, _) = bind(&mut b, 2, 0);
    assert_ne!(L.queue(s), L.queue(a0));
    assert_eq!(b[s].refs, 1, "a CUDA stream of its own");
}

#[test]
fn many_streams_of_one_client_get_a_cuda_stream_each() {
    let mut b = vec![Binding::default(); L.total()];
    let picks: Vec<usize> = L.class(NORMAL).map(|r| bind(&mut b, 7, r).0).collect();
    let mut sorted = picks.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(
        sorted.len(),
        L.classes[NORMAL],
        "one CUDA stream per client stream"
    );
    // Then it doubles up on its own streams, never reported as shared.
    let (_, shared) = bind(&mut b, 7, 0);
    assert!(!shared);
}

#[test]
fn a_busy_free_stream_is_passed_over_and_sharing_is_the_last_resort() {
    let mut b = vec![Binding::default(); L.total()];
    // Stream 0 is unbound but still runs a destroyed stream's work.
    let (s, _) = pick(&L, &b, L.class(NORMAL), 1, None, 0, &mut |i| {
        i != L.class(NORMAL).start
    })
    .unwrap();
    assert_ne!(s, L.class(NORMAL).start);
    for i in L.class(NORMAL) {
        b[i] = Binding {
            client: 9,
            refs: 1,
            exclusive: false,
        };
    }
    let (s, shared) = pick(&L, &b, L.class(NORMAL), 1, None, 3, &mut |_| true).unwrap();
    assert!(shared && L.class(NORMAL).contains(&s));
    // A stream held for a capture is never handed to anyone else.
    for i in L.class(NORMAL) {
        b[i].exclusive = i != L.class(NORMAL).start;
    }
    for r in 0..8 {
        let (s, _) = pick(&L, &b, L.class(NORMAL), 1, None, r, &mut |_| true).unwrap();
        assert_eq!(s, L.class(NORMAL).start);
    }
    // Every one held for a capture: nothing is picked, rather than a capturing stream.
    b[L.class(NORMAL).start].exclusive = true;
    for r in 0..8 {
        assert_eq!(
            pick(&L, &b, L.class(NORMAL), 1, None, r, &mut |_| true),
            None,
            "a capturing stream was handed to another client"
        );
    }
}

#[test]
fn the_last_shareable_stream_of_a_class_is_never_captured() {
    let mut b = vec![Binding::default(); L.total()];
    let class = L.class(NORMAL);
    for i in class.clone().skip(1) {
        assert!(may_capture(&L, &b, i));
        b[i] = Binding {
            client: 9,
            refs: 1,
            exclusive: true,
        };
    }
    assert!(!may_capture(&L, &b, class.start));
    // Confined ranges are kept apart from the whole device's.
    let r = L.class_in(Some(1), NORMAL);
    assert_eq!(L.range_of(r.start + 1), Some(r.clone()));
    assert!(may_capture(&L, &b, r.start));
}

#[test]
fn a_client_holds_no_more_queues_than_its_share() {
    let mut b = vec![Binding::default(); L.total()];
    let share = Some(2);
    let bind_capped = |b: &mut [Binding], client: u32, r: usize| {
        let got = pick(&L, b, L.class(NORMAL), client, share, r, &mut |_| true);
        if let Some((s, _)) = got {
            if b[s].refs == 0 {
                b[s].client = client;
            }
            b[s].refs += 1;
        }
        got
    };
    // A client with more streams than queues (each stuck on a host function) stays on
    // two of the four queues.
    for r in 0..12 {
        bind_capped(&mut b, 1, r).expect("its own queues have room");
    }
    let held = queues_held(&L, &b, 1);
    assert_eq!(held.iter().filter(|&&h| h).count(), 2);
    // A newcomer gets a queue the first does not hold.
    let (s, shared) = bind_capped(&mut b, 2, 0).unwrap();
    assert!(
        !shared && !held[L.queue(s)],
        "the newcomer shares a blocked queue"
    );
    // Its own queues all captured, a capped client is refused rather than moved onto
    // another's queue.
    for (i, x) in b.iter_mut().enumerate() {
        if x.client == 1 && x.refs > 0 {
            x.exclusive = true;
            x.refs = 1;
        } else if held[L.queue(i)] && L.class(NORMAL).contains(&i) {
            *x = Binding {
                client: 1,
                refs: 1,
                exclusive: true,
            };
        }
    }
    assert_eq!(
        pick(&L, &b, L.class(NORMAL), 1, share, 0, &mut |_| true),
        None
    );
}

#[test]
fn classes_keep_their_order_in_cuda_priorities() {
    // An H100: 0 (least) to -5 (greatest).
    let p: Vec<i32> = (0..CLASSES).map(|c| class_priority(c, 0, -5)).collect();
    assert_eq!(p, vec![0, -2, -3, -5]);
    assert_eq!(class_priority(CRITICAL, 0, 0), 0, "no levels: all equal");
}

#[test]
fn a_kernels_own_priority_is_never_above_its_class() {
    let attr = |id: u32, v: i32| {
        let mut a = vec![0u8; omps_ring::wire::LAUNCH_ATTR_BYTES];
        a[..4].copy_from_slice(&id.to_le_bytes());
        a[8..12].copy_from_slice(&v.to_le_bytes());
        a
    };
    let prio = |b: &[u8], i: usize| {
        let a = &b[i * omps_ring::wire::LAUNCH_ATTR_BYTES..];
        i32::from_le_bytes([a[8], a[9], a[10], a[11]])
    };
    // A background client (its class at -1 of 0..=-5) asks for -5, the greatest.
    let mut attrs = attr(2, 7);
    attrs.extend(attr(LAUNCH_ATTR_PRIORITY, -5));
    let held = hold_launch_priority(&attrs, -1, 0);
    assert_eq!(prio(&held, 1), -1, "held to its class");
    assert_eq!(prio(&held, 0), 7, "other attributes untouched");
    // Less urgent than its class is its to ask; out of range is brought back.
    assert_eq!(
        prio(
            &hold_launch_priority(&attr(LAUNCH_ATTR_PRIORITY, 0), -1, 0),
            0
        ),
        0
    );
    assert_eq!(
        prio(
            &hold_launch_priority(&attr(LAUNCH_ATTR_PRIORITY, 9), -1, 0),
            0
        ),
        0
    );
    // No priority asked: the same bytes, not a copy.
    let plain = attr(2, 7);
    assert!(matches!(
        hold_launch_priority(&plain, -1, 0),
        std::borrow::Cow::Borrowed(_)
    ));
    assert_eq!(class_of(Qos::LatencyCritical, 0), CRITICAL);
    assert_eq!(class_of(Qos::BelowNormal, -5), BACKGROUND);
    assert_eq!(class_of(Qos::Normal, -1), RAISED);
    assert_eq!(class_of(Qos::Normal, 0), NORMAL);
    let l = Layout::SERVER;
    assert_eq!(l.class_at(l.class(CRITICAL).start), Some(CRITICAL));
    assert_eq!(l.class_at(0), Some(BACKGROUND));
    assert_eq!(l.class_at(l.total()), None);
    for c in 0..CLASSES {
        assert_eq!(l.class(c).start % l.connections, 0);
        let r = l.class_in(Some(3), c);
        assert_eq!(r.start % l.connections, 0);
        assert_eq!(
            (l.class_at(r.start), l.slot_at(r.end - 1)),
            (Some(c), Some(3))
        );
    }
    assert_eq!(l.slot_at(l.class(NORMAL).start), None);
    assert_eq!(
        l.class_in(Some(l.confined), NORMAL),
        l.class(NORMAL),
        "no such slot"
    );
    for p in [
        Placement::default(),
        Placement {
            qos: Qos::LatencyCritical,
            slot: Some(0),
        },
        Placement {
            qos: Qos::BelowNormal,
            slot: Some(31),
        },
    ] {
        assert_eq!(Placement::unpack(p.pack()), p);
    }
}

#[test]
fn stream_sets_hold_any_index() {
    let mut s = StreamSet::default();
    for i in [0, 63, 64, 200] {
        s.insert(i);
    }
    assert!(s.contains(200) && !s.contains(1));
    assert_eq!(s.iter().collect::<Vec<_>>(), vec![0, 63, 64, 200]);
}
