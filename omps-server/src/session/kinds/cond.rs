//! A client's conditional-node books ([`CondState`]): its homes, handles, bodies and what
//! copies of its graphs inherited. Below the session (state.rs holds them) and the family
//! that serves conditional nodes (conditional.rs).

use crate::session::record::{bad, Malformed};
use std::collections::{BTreeSet, HashMap, HashSet};

/// A client's conditional-node books.
#[derive(Default)]
pub(in crate::session) struct CondState {
    /// Home graphs (the driver's handles): those made for built graphs, and the graphs
    /// of captures that made handles.
    pub(in crate::session) homes: HashSet<u64>,
    /// Conditional handles -> the home that made them.
    pub(in crate::session) handles: HashMap<u64, u64>,
    /// Body ids -> (the driver's body graph, the home it lies in).
    pub(in crate::session) bodies: HashMap<u32, (u64, u64)>,
    /// Client streams capturing into a home or body -> that graph.
    pub(in crate::session) capture_into: HashMap<u32, u64>,
    /// Graphs (the driver's handles) that are copies of graphs with bodies, or took such
    /// graphs as child nodes: the driver copies the bodies, which the server then does not
    /// know by id (see [`Inherited`]); and graphs with host nodes, whose words it lists.
    pub(in crate::session) inherited: HashMap<u64, Inherited>,
    /// The index back of [`Inherited::from`]: a graph -> the copies that link to it, so a
    /// graph that goes unlinks its copies without a walk over every copy the client made
    /// (OMPS_MAX_GRAPHS of them: a walk each time is quadratic on the lane).
    copies_of: HashMap<u64, HashSet<u64>>,
    /// Ranges kept in all of [`Inherited::ranges`], held under [`MAX_INHERITED_RANGES`].
    inherited_ranges: usize,
    /// Entries the bookkeeping below visited (tests bound it: counts, not timings).
    #[cfg(test)]
    visits: u64,
}

/// What a copy of a graph (GRAPH_CLONE) or a graph that took one as a child node
/// (CHILD_NODE) replays that the driver may not list: its sources' conditional bodies, whose
/// copies it holds (CUDA 13.0 cannot read a conditional node's bodies).
#[derive(Default)]
pub(in crate::session) struct Inherited {
    /// The graphs copied in, while they live: their bodies are read again at each
    /// instantiation (what they know included, transitively).
    /// (A set: a graph may take many child nodes; indexed back by `CondState::copies_of`.)
    pub(in crate::session) from: BTreeSet<u64>,
    /// The ranges their bodies (and what they knew) used when copied, kept for after the
    /// sources go: the copy's bodies are its own and outlive them.
    pub(in crate::session) ranges: Vec<(u64, u64)>,
    /// The words in the client's page-locked memory its own host nodes (HostNodeAt)
    /// write and wait on at every replay: batch memory operations, which the driver's
    /// ranges leave out.
    pub(in crate::session) words: Vec<u64>,
}

/// How deep copies of graphs with conditional bodies may go (a clone of a clone of ...,
/// or child nodes alike): [`CondState::reach`] walks the chain at every instantiation and
/// update, so a client must not make it as long as it likes (review 4, finding 6). No
/// program copies a copy this often; one beyond is refused with CUDA_ERROR_NOT_SUPPORTED
/// (conditional.rs): a limit of the server that no retry or freed memory lifts, where
/// CUDA_ERROR_OUT_OF_MEMORY would invite a framework to free its caches and try again.
pub(in crate::session) const MAX_COPY_DEPTH: u32 = 16;

/// Most ranges a client's copies may keep in all (each copy keeps the union of what its
/// sources reached, so fan-in over many copies multiplies them: review 5); a copy beyond
/// is refused as one beyond [`MAX_COPY_DEPTH`] is. A million ranges is 16 MiB of books.
pub(in crate::session) const MAX_INHERITED_RANGES: usize = 1 << 20;

/// More handles than any program makes; a client asking beyond gets OUT_OF_MEMORY.
pub(in crate::session) const MAX_HANDLES: usize = 1 << 16;

impl CondState {
    /// The home graph `g` (a home or a body) lies in.
    pub(in crate::session) fn home_of(&self, g: u64) -> Option<u64> {
        if self.homes.contains(&g) {
            return Some(g);
        }
        self.bodies
            .values()
            .find(|&&(b, _)| b == g)
            .map(|&(_, home)| home)
    }

    pub(in crate::session) fn being_captured(&self, home: u64) -> bool {
        self.capture_into
            .values()
            .any(|&g| self.home_of(g) == Some(home))
    }

    /// The driver's body graphs of home `home` (nested ones too: all name the outermost).
    pub(in crate::session) fn bodies_of(&self, home: u64) -> Vec<u64> {
        self.bodies
            .values()
            .filter(|&&(_, h)| h == home)
            .map(|&(b, _)| b)
            .collect()
    }

    /// Home `home` lost its nodes: its bodies are gone, and what it and they inherited.
    pub(in crate::session) fn cleared(&mut self, home: u64) {
        for b in self.bodies_of(home).into_iter().chain([home]) {
            self.forget_inherited(b);
        }
        self.bodies.retain(|_, &mut (_, h)| h != home);
    }

    /// The bodies and inherited ranges graph `graph` replays beyond what the driver lists
    /// of it: its own bodies, and those of the graphs it copied in (transitively), each
    /// once. The bodies are indexed by home once per call, and each graph of the chain
    /// visited once: linear in the client's bodies and copies, not their product.
    pub(in crate::session) fn reach(&self, graph: u64) -> (Vec<u64>, Vec<(u64, u64)>) {
        let (mut bodies, mut ranges) = (Vec::new(), Vec::new());
        let mut by_home: HashMap<u64, Vec<u64>> = HashMap::new();
        for &(b, h) in self.bodies.values() {
            by_home.entry(h).or_default().push(b);
        }
        let mut seen = std::collections::HashSet::new();
        let mut todo = vec![graph];
        while let Some(g) = todo.pop() {
            if !seen.insert(g) {
                continue;
            }
            let own = by_home.get(&g).map_or(&[][..], Vec::as_slice);
            for x in std::iter::once(g).chain(own.iter().copied()) {
                if let Some(i) = self.inherited.get(&x) {
                    ranges.extend_from_slice(&i.ranges);
                    ranges.extend(i.words.iter().map(|&w| (w, 8)));
                    todo.extend(i.from.iter().filter(|f| !seen.contains(*f)));
                }
            }
            bodies.extend_from_slice(own);
        }
        bodies.sort_unstable();
        bodies.dedup();
        ranges.sort_unstable();
        ranges.dedup();
        (bodies, ranges)
    }

    /// How many copies deep `graph`'s longest chain of sources goes (its bodies' too), as
    /// the links stand now: 0 for a graph that inherited nothing, at most
    /// `MAX_COPY_DEPTH + 1` (the walk stops there). Worked out at each copy, not kept: a
    /// source may link to more after its copies were made (review 5: copies made first,
    /// then chained through their sources' bodies, each passed a kept depth of 1).
    pub(in crate::session) fn copy_depth(&self, graph: u64) -> u32 {
        let mut by_home: HashMap<u64, Vec<u64>> = HashMap::new();
        for &(b, h) in self.bodies.values() {
            by_home.entry(h).or_default().push(b);
        }
        let mut frontier = vec![graph];
        let mut depth = 0;
        while depth <= MAX_COPY_DEPTH {
            let mut next: HashSet<u64> = HashSet::new();
            for &g in &frontier {
                let own = by_home.get(&g).map_or(&[][..], Vec::as_slice);
                for x in std::iter::once(g).chain(own.iter().copied()) {
                    if let Some(i) = self.inherited.get(&x) {
                        next.extend(i.from.iter().copied());
                    }
                }
            }
            if next.is_empty() {
                break;
            }
            depth += 1;
            frontier = next.into_iter().collect();
        }
        depth
    }

    /// Whether a copy of `source` (a clone, a child node) that keeps `adding` more ranges
    /// stays within [`MAX_COPY_DEPTH`] and [`MAX_INHERITED_RANGES`].
    pub(in crate::session) fn may_copy(&self, source: u64, adding: usize) -> bool {
        self.copy_depth(source) < MAX_COPY_DEPTH
            && self.inherited_ranges.saturating_add(adding) <= MAX_INHERITED_RANGES
    }

    /// Graph `copy` holds a copy of `source` (a clone of it, or a child node), whose
    /// bodies and what it inherited used `ranges` when copied.
    pub(in crate::session) fn inherit(&mut self, copy: u64, source: u64, ranges: Vec<(u64, u64)>) {
        let i = self.inherited.entry(copy).or_default();
        i.from.insert(source);
        self.copies_of.entry(source).or_default().insert(copy);
        let before = i.ranges.len();
        i.ranges.extend(ranges);
        i.ranges.sort_unstable();
        i.ranges.dedup();
        self.inherited_ranges = self.inherited_ranges - before + i.ranges.len();
    }

    /// A host node of graph `g` (being captured) uses the two words at `words`.
    pub(in crate::session) fn host_words(&mut self, g: u64, words: u64) {
        let i = self.inherited.entry(g).or_default();
        if !i.words.contains(&words) {
            i.words.push(words);
        }
    }

    /// Graph `g` is gone: what it inherited, and the links to it (the driver may give its
    /// handle to a new graph), go; its copies keep the ranges they inherited from it.
    /// In time linear in its own links (to its sources, from its copies), through
    /// `copies_of`.
    pub(in crate::session) fn forget_inherited(&mut self, g: u64) {
        if let Some(i) = self.inherited.remove(&g) {
            self.visit(1 + i.from.len());
            self.inherited_ranges -= i.ranges.len();
            for f in &i.from {
                if let Some(copies) = self.copies_of.get_mut(f) {
                    copies.remove(&g);
                    if copies.is_empty() {
                        self.copies_of.remove(f);
                    }
                }
            }
        }
        if let Some(copies) = self.copies_of.remove(&g) {
            self.visit(copies.len());
            for c in copies {
                if let Some(i) = self.inherited.get_mut(&c) {
                    i.from.remove(&g);
                }
            }
        }
    }

    /// Counts `n` entries visited (tests only).
    #[cfg_attr(not(test), allow(unused_variables, clippy::unused_self))]
    fn visit(&mut self, n: usize) {
        #[cfg(test)]
        {
            self.visits += n as u64;
        }
    }

    /// Graph `g` (any of the client's) is destroyed: Err when a capture goes into it.
    pub(in crate::session) fn destroying(&mut self, g: u64) -> Result<(), Malformed> {
        if !self.homes.contains(&g) {
            self.forget_inherited(g);
            return Ok(());
        }
        if self.being_captured(g) {
            return bad("destroying a graph a capture goes into");
        }
        self.forget_home(g);
        self.forget_inherited(g);
        Ok(())
    }

    /// Home `g` is gone (destroyed, or a capture's graph the driver threw away).
    pub(in crate::session) fn forget_home(&mut self, g: u64) {
        self.cleared(g);
        self.handles.retain(|_, &mut h| h != g);
        self.homes.remove(&g);
    }

    /// Whether any home is tracked (so a capture's end must look at its graph).
    pub(in crate::session) fn any(&self) -> bool {
        !self.homes.is_empty() || !self.inherited.is_empty()
    }

    /// Client streams capturing into bodies of homes that are the graphs of captures
    /// still going (they have no id yet): a plain capture's end may throw such a home,
    /// and its bodies, away, so captures into them end first.
    pub(in crate::session) fn captures_into_capture_homes(
        &self,
        graphs: &HashMap<u32, u64>,
    ) -> Vec<u32> {
        self.capture_into
            .iter()
            .filter(|(_, &g)| {
                self.home_of(g)
                    .is_some_and(|root| !graphs.values().any(|&h| h == root))
            })
            .map(|(&s, _)| s)
            .collect()
    }

    /// After a capture ended: homes that are neither one of the client's graphs nor the
    /// graph of a capture still going are gone (the driver threw them away with a failed
    /// capture), and with them their bodies and handles, before any id of theirs could
    /// name freed memory.
    ///
    /// Linear in the books (graphs, homes, bodies, handles, inherited entries and their
    /// links): the graphs still there are a set built once, and the homes that went are
    /// forgotten in one pass over the bodies and handles, not one each.
    pub(in crate::session) fn prune(&mut self, graphs: &HashMap<u32, u64>, capturing: &[u64]) {
        let live: HashSet<u64> = graphs.values().chain(capturing).copied().collect();
        self.visit(live.len() + self.homes.len());
        let gone: HashSet<u64> = self
            .homes
            .iter()
            .copied()
            .filter(|h| !live.contains(h))
            .collect();
        if !gone.is_empty() {
            // forget_home for each, at once: their bodies, what they and their bodies
            // inherited, their handles.
            self.visit(self.bodies.len() + self.handles.len());
            let bodies: Vec<u64> = self
                .bodies
                .values()
                .filter(|(_, h)| gone.contains(h))
                .map(|&(b, _)| b)
                .collect();
            for g in bodies.into_iter().chain(gone.iter().copied()) {
                self.forget_inherited(g);
            }
            self.bodies.retain(|_, (_, h)| !gone.contains(h));
            self.handles.retain(|_, h| !gone.contains(h));
            self.homes.retain(|h| !gone.contains(h));
        }
        // And what graphs thrown away with a capture had inherited.
        let bodies: HashSet<u64> = self.bodies.values().map(|&(b, _)| b).collect();
        self.visit(self.bodies.len() + self.inherited.len());
        let gone: Vec<u64> = self
            .inherited
            .keys()
            .copied()
            .filter(|g| !live.contains(g) && !bodies.contains(g))
            .collect();
        for g in gone {
            self.forget_inherited(g);
        }
    }

    /// Client stream `id`'s capture ended (or the stream stopped capturing).
    pub(in crate::session) fn capture_over(&mut self, id: u32) {
        self.capture_into.remove(&id);
    }

    /// Whether client stream `id` captures into a home or body.
    pub(in crate::session) fn is_capturing_into(&self, id: u32) -> bool {
        self.capture_into.contains_key(&id)
    }

    /// The id a graph handle a capture ended in already has (a home or body).
    pub(in crate::session) fn known_id(&self, graphs: &HashMap<u32, u64>, g: u64) -> Option<u32> {
        graphs
            .iter()
            .chain(self.bodies.iter().map(|(id, (b, _))| (id, b)))
            .find(|(_, &h)| h == g)
            .map(|(&id, _)| id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Review 4, finding 6: a chain of copies stops at MAX_COPY_DEPTH, and what a copy
    /// reaches is found once per graph and range, in time linear in the books.
    #[test]
    fn copy_chains_stop_at_the_cap_and_reach_is_linear() {
        let mut c = CondState::default();
        // A home with 30k bodies, each of which inherited a range.
        let home = 1u64;
        c.homes.insert(home);
        for k in 0..30_000u32 {
            let b = 1_000_000 + k as u64;
            c.bodies.insert(k, (b, home));
        }
        c.inherit(1_000_000, 77, vec![(0x1000, 8)]);
        // Clones of clones: graph n copies graph n - 1.
        let mut g = home;
        let mut made = 0;
        for n in 2..100u64 {
            if !c.may_copy(g, 0) {
                break;
            }
            let r = c.reach(g).1;
            c.inherit(n, g, r);
            g = n;
            made += 1;
        }
        // The home is one copy deep already (a body of it inherited from graph 77).
        assert_eq!(
            made,
            MAX_COPY_DEPTH as usize - 1,
            "the chain stops at the cap"
        );
        assert_eq!(c.copy_depth(g), MAX_COPY_DEPTH);
        assert!(!c.may_copy(g, 0));
        let t = std::time::Instant::now();
        let (bodies, ranges) = c.reach(g);
        assert_eq!(bodies.len(), 30_000, "each body once");
        assert_eq!(ranges, vec![(0x1000, 8)], "each range once");
        assert!(
            t.elapsed() < std::time::Duration::from_secs(1),
            "reach took {:?}",
            t.elapsed()
        );
        // A graph that inherited nothing copies freely.
        assert!(c.may_copy(5_000_000, 0));
    }

    /// Hostile review: a client's many copies cost what they link, not their square. Each
    /// of N copies inherits from its own source and from one shared source; destroying
    /// every graph, then a prune after captures threw N graphs away, visit a number of
    /// entries linear in N (counts, not timings).
    #[test]
    fn forgetting_and_pruning_copies_is_linear() {
        const N: u64 = 20_000;
        let mut c = CondState::default();
        let shared = 1u64;
        for k in 0..N {
            let (copy, source) = (1_000_000 + k, 2_000_000 + k);
            c.inherit(copy, source, vec![(0x1000 + 8 * k, 8)]);
            c.inherit(copy, shared, vec![]);
        }
        assert_eq!(c.copies_of[&shared].len(), N as usize);
        // The shared source goes: its N copies unlink in one visit each.
        c.visits = 0;
        c.destroying(shared).unwrap();
        assert!(c.visits <= 2 * N, "visited {}", c.visits);
        assert!(c.inherited.values().all(|i| !i.from.contains(&shared)));
        // Each source goes, then each copy: a few visits each.
        c.visits = 0;
        for k in 0..N {
            c.destroying(2_000_000 + k).unwrap();
            c.destroying(1_000_000 + k).unwrap();
        }
        assert!(c.visits <= 4 * N, "visited {}", c.visits);
        assert!(c.inherited.is_empty() && c.copies_of.is_empty());

        // A prune: N graphs the client holds, N copies a capture threw away, N homes
        // (one body each) of which half are gone.
        let graphs: HashMap<u32, u64> = (0..N).map(|k| (k as u32, 3_000_000 + k)).collect();
        for k in 0..N {
            c.inherit(4_000_000 + k, 3_000_000 + k, vec![]);
            let home = if k % 2 == 0 {
                3_000_000 + k
            } else {
                5_000_000 + k
            };
            c.homes.insert(home);
            c.bodies.insert(k as u32, (6_000_000 + k, home));
            c.handles.insert(7_000_000 + k, home);
            c.inherit(6_000_000 + k, 3_000_000 + k, vec![]);
        }
        c.visits = 0;
        c.prune(&graphs, &[]);
        assert!(c.visits <= 12 * N, "visited {}", c.visits);
        assert_eq!(c.homes.len(), N as usize / 2, "the homes still held stay");
        assert_eq!(c.bodies.len(), N as usize / 2);
        assert_eq!(c.handles.len(), N as usize / 2);
        // The thrown-away copies went; the bodies of homes still held keep their links.
        assert_eq!(c.inherited.len(), N as usize / 2);
        assert!(c
            .inherited
            .keys()
            .all(|g| (6_000_000..7_000_000).contains(g)));
        assert_eq!(c.copies_of.len(), N as usize / 2);
    }

    /// Review 5: a depth kept at copy time was never
    /// raised when a graph upstream later copies more in. A client that clones every
    /// home first (each copy depth 1) and only then links each body to the previous
    /// copy (a child node of a copy of depth 1: depth 2) passes every `may_copy`, while
    /// `reach` walks the whole chain and each body stores the union of every range below
    /// it: n links, ~n^2/2 stored ranges, all walked (and sorted) at every
    /// instantiation or copy of the last copy. Wire order: COND_HOME/COND_NODE per home,
    /// GRAPH_CLONE of every home, then CAPTURE_TO body i + CHILD_NODE(copy i-1).
    #[test]
    fn copies_made_first_then_chained_stop_at_the_cap() {
        let mut c = CondState::default();
        let n: u64 = 300;
        let (home, body, copy) = (
            |i: u64| 10_000_000 + i,
            |i: u64| 20_000_000 + i,
            |i: u64| 30_000_000 + i,
        );
        // A distinct range per body, as the driver would list a memset of i+1 bytes there.
        let own = |i: u64| (0x7000_0000_0000u64, i + 1);
        for i in 0..n {
            c.homes.insert(home(i));
            c.bodies.insert(i as u32, (body(i), home(i)));
        }
        // GRAPH_CLONE of every home, while its body holds only its own memset.
        for i in 0..n {
            assert!(c.may_copy(home(i), 0));
            let (bodies, mut r) = c.reach(home(i));
            r.extend(bodies.iter().map(|&b| own(b - 20_000_000)));
            c.inherit(copy(i), home(i), r);
        }
        // CHILD_NODE of copy i-1 into a capture of body i, in order.
        let mut refused_at = None;
        for i in 1..n {
            if !c.may_copy(copy(i - 1), 0) {
                refused_at = Some(i);
                break;
            }
            let (bodies, mut r) = c.reach(copy(i - 1));
            r.extend(bodies.iter().map(|&b| own(b - 20_000_000)));
            c.inherit(body(i), copy(i - 1), r);
        }
        let stored: usize = c.inherited.values().map(|i| i.ranges.len()).sum();
        let t = std::time::Instant::now();
        let (bodies, _) = c.reach(copy(n - 1));
        let took = t.elapsed();
        assert!(
            bodies.len() <= MAX_COPY_DEPTH as usize + 1,
            "a chain of {} copies passed a cap of {MAX_COPY_DEPTH} (refused at {refused_at:?}, {stored} ranges stored, one reach {took:?})",
            bodies.len()
        );
    }

    /// Review 5: copies keep the union of what their sources reach, so many copies of a
    /// copy that reaches much multiply it; what all of a client's copies keep is bounded,
    /// and given back as they go.
    #[test]
    fn the_ranges_copies_keep_in_all_are_bounded_and_given_back() {
        let mut c = CondState::default();
        let big: Vec<(u64, u64)> = (0..MAX_INHERITED_RANGES as u64 - 10)
            .map(|i| (i << 12, 8))
            .collect();
        assert!(c.may_copy(1, big.len()));
        c.inherit(2, 1, big);
        assert!(c.may_copy(2, 10), "within the bound");
        assert!(!c.may_copy(2, 11), "a copy keeping more is refused");
        c.forget_inherited(2);
        assert_eq!(c.inherited_ranges, 0);
        assert!(c.may_copy(1, MAX_INHERITED_RANGES));
    }
}
