//! Answers the server's driver gave to stable questions (occupancy, context limits),
//! kept by question so that libraries asking before every launch get them without a
//! round trip; any change to a function's attributes or to a limit forgets them.

use crate::cuda::*;
use crate::state::entry::live;
use crate::state::streams::CUfunction;
use omps_ring::wire::{self, query, Op, Query};
use std::collections::HashMap;
use std::ffi::{c_int, c_uint};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Answers by question, for the questions whose answer only this process can change:
/// occupancy (the function, its attributes and the device decide it) and this client's
/// own context limits (the server keeps them per client). Libraries ask the same ones
/// before every launch: a round trip each, tens of microseconds while the server is busy.
/// Any change to a function's attributes or cache preference, or to a limit, clears it.
pub(crate) type AnswerKey = (usize, u32, u32, [i64; 7], Vec<u8>);

pub(crate) static ANSWERS: Mutex<Option<HashMap<AnswerKey, i64>>> = Mutex::new(None);

/// Bumped by every forget: an answer asked before one is not kept after it.
pub(crate) static FORGETS: AtomicU64 = AtomicU64::new(0);

/// Distinct questions kept before the cache starts over (a program asks a few per kernel).
pub(crate) const ANSWERS_MAX: usize = 1 << 14;

pub(crate) fn answer_is_stable(kind: u32) -> bool {
    matches!(
        kind,
        query::OCC_MAX_BLOCKS
            | query::OCC_DYN_SMEM
            | query::OCC_MAX_CLUSTERS
            | query::OCC_MAX_CLUSTER_SIZE
            | query::CTX_GET_LIMIT
    )
}

/// Forgets every cached answer: a function's attributes or a limit changed.
pub(crate) fn forget_answers() {
    let mut m = ANSWERS.lock().unwrap_or_else(|e| e.into_inner());
    FORGETS.fetch_add(1, Ordering::SeqCst);
    *m = None;
}

pub(crate) fn ask(
    dev: usize,
    kind: u32,
    func: u32,
    args: [i64; 7],
    attrs: &[u8],
) -> Result<i64, CUresult> {
    if kind == query::CTX_SET_LIMIT {
        // After it too: an answer asked before it and kept meanwhile is dropped.
        forget_answers();
        let r = ask_server(dev, kind, func, args, attrs);
        forget_answers();
        return r;
    }
    if !answer_is_stable(kind) {
        return ask_server(dev, kind, func, args, attrs);
    }
    let key = (dev, kind, func, args, attrs.to_vec());
    let cached = ANSWERS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .and_then(|m| m.get(&key).copied());
    if let Some(v) = cached {
        return Ok(v);
    }
    let forgets = FORGETS.load(Ordering::SeqCst);
    let v = ask_server(dev, kind, func, args, attrs)?;
    let mut m = ANSWERS.lock().unwrap_or_else(|e| e.into_inner());
    if FORGETS.load(Ordering::SeqCst) != forgets {
        return Ok(v);
    }
    let m = m.get_or_insert_with(HashMap::new);
    if m.len() >= ANSWERS_MAX {
        m.clear();
    }
    m.insert(key, v);
    Ok(v)
}

pub(crate) fn ask_server(
    dev: usize,
    kind: u32,
    func: u32,
    args: [i64; 7],
    attrs: &[u8],
) -> Result<i64, CUresult> {
    if crate::stats::enabled() {
        crate::stats::count_query(kind);
    }
    let c = live()?;
    let mut ch = c.channel();
    let q = |call| Query {
        call,
        kind,
        func,
        args,
        num_attrs: (attrs.len() / wire::LAUNCH_ATTR_BYTES) as u32,
        _pad: 0,
    };
    ch.call(dev, Op::Query, |call| {
        let mut v = bytemuck::bytes_of(&q(call)).to_vec();
        v.extend_from_slice(attrs);
        v
    })?;
    Ok(ch.reply::<wire::U64Reply>().value as i64)
}

pub(crate) fn occupancy(
    f: CUfunction,
    block: c_int,
    smem: usize,
    flags: c_uint,
) -> Result<i64, CUresult> {
    let func = super::modules::function_here(f)?;
    ask(
        func.dev,
        query::OCC_MAX_BLOCKS,
        func.id,
        [block as i64, smem as i64, flags as i64, 0, 0, 0, 0],
        &[],
    )
}
