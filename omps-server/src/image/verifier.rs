//! Module images are loaded first in a process of their own (issue 23, finding 1).
//!
//! `check_image` (omps-ring) bounds what an image says of itself, but its contents go to
//! the driver's parser, inside the server: an image made to crash that parser would end
//! the server and every client of every GPU. So an image the server has not seen before
//! is loaded first by a verifier, a child process (`omps-server --verify-images`) with a
//! context of its own: an image that kills the child, or hangs it past [`DEADLINE`], is
//! refused with CUDA_ERROR_INVALID_IMAGE and never reaches the server's driver; one the
//! child's driver parses and lives through (loaded or refused) goes on to the server's,
//! which answers as it would have. Verdicts
//! are kept by the image's SHA-256, for every client and, in a file of the operator's log
//! directory, across restarts; so each image costs one load in the child, once. The
//! child's context (some hundreds of MiB of GPU memory) goes with the child, which exits
//! after [`IDLE`] without work.
//!
//! Checks run on the compile threads ([`crate::image::compile`]), never on a lane. Different
//! images are checked at once, each in a child of its own, up to [`MAX_CHILDREN`]; a check
//! beyond waits for a child to be free, and a second check of an image being checked
//! waits for that one's verdict. The last free child is kept for a *tenant* (a namespace's
//! clients together, or those of the server's own socket) that holds none: one tenant
//! checks at most MAX_CHILDREN - 1 images at once, so slow images of one (300 s each)
//! never make another's new image wait for a child (see [`State::held`]).
//!
//! A JIT link's container (cuLinkAddData inputs: cubins, objects, libraries, PTX, LTO IR)
//! goes to the driver's linker, another parser, and is linked first in the child too; PTX
//! loaded with JIT options is compiled there with those options.
//!
//! Protocol, over the child's stdin and stdout: a request is the GPU ordinal (u32 LE,
//! [`LINK`] set for a link container, [`JIT`] for a JIT load's), the bytes' length (u64 LE) and the bytes; the
//! answer is the load's or the link's CUresult (i32 LE).

use sha2::{Digest, Sha256};
use std::collections::{HashMap, HashSet};
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How long the child may take over one image before it counts as hung.
pub const DEADLINE: Duration = Duration::from_secs(60);
/// The same for a link or a JIT compile, which may take long for a large program (LTO,
/// PTX at full optimization) where a load takes little.
pub const COMPILE_DEADLINE: Duration = Duration::from_secs(300);
/// How long an idle child is kept (its context holds GPU memory).
pub const IDLE: Duration = Duration::from_secs(20);
/// Children at most at once: images of different hashes are checked concurrently, each
/// in a child of its own, up to this many; a further one waits for a child to be free.
/// Each child holds a context (some hundreds of MiB of GPU memory), and a client must not
/// be able to make the server fork without bound.
pub const MAX_CHILDREN: usize = 4;

/// How the server starts its verifier, and where it keeps verdicts.
#[derive(Clone, Debug)]
pub struct Spec {
    pub program: PathBuf,
    pub args: Vec<String>,
    /// Hashes of images found good, one hex line each (None: kept in memory only).
    pub known_file: Option<PathBuf>,
}

impl Spec {
    /// This server binary as its own verifier, verdicts in `log_dir` (None: in memory).
    pub fn this_binary(log_dir: Option<PathBuf>) -> Option<Spec> {
        Some(Spec {
            program: std::env::current_exe().ok()?,
            args: vec!["--verify-images".into()],
            known_file: log_dir.map(|d| d.join("verified-images")),
        })
    }
}

/// What the verifier says of an image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The child's driver parsed it and lived (whether it loaded it or said why not), or
    /// it was seen so before: the server's driver may have it.
    Good,
    /// It killed or hung the child: never to reach the driver here.
    Crashed,
    /// The child could not open the GPU (a compute mode of one process per GPU, or no
    /// memory for a second context): the image goes to the driver unverified, as without
    /// a verifier (said once in the log).
    Unverified,
}

/// Set in a request's ordinal: the bytes are a link container, not an image.
pub const LINK: u32 = 1 << 31;
/// Set in a request's ordinal: the bytes are a JIT load's container.
pub const JIT: u32 = 1 << 30;

/// What a request asks the child to do with its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Work {
    /// cuModuleLoadData of an image.
    Load,
    /// A JIT link of a container's inputs.
    Link,
    /// cuModuleLoadDataEx of a container's one PTX input with its options.
    Jit,
}

/// The child's answer when it cannot open the GPU asked for.
pub const NO_CONTEXT: i32 = i32::MIN;

/// The driver's answers that say what an image is (so its parser read it): invalid image,
/// no binary for this GPU, invalid PTX, unsupported PTX version, JIT compiler not found,
/// invalid source.
const IMAGE_ERRORS: [i32; 6] = [200, 209, 218, 222, 221, 300];

struct Running {
    child: Child,
    stdin: ChildStdin,
    stdout: ChildStdout,
    last: Instant,
}

pub struct Verifier {
    spec: Spec,
    state: Mutex<State>,
    /// Signalled when a check ends (its hash verdicted, its child free again).
    changed: Condvar,
    /// The driver's version, part of every verdict's name.
    driver: i32,
}

#[derive(Default)]
struct State {
    good: HashSet<[u8; 32]>,
    /// Images that killed or hung the child: refused without a load.
    bad: HashSet<[u8; 32]>,
    /// Children waiting for a request, the most recently used last.
    idle: Vec<Running>,
    /// Children started and not stopped, idle or checking an image.
    children: usize,
    /// Hashes being checked now: a second check of one waits for the first's verdict.
    checking: HashSet<[u8; 32]>,
    /// Tenant -> children it checks images in now (none: absent). A check takes a child
    /// while two or more are free (idle, or not started), and the last free one only for
    /// a tenant that holds none: so one tenant holds at most MAX_CHILDREN - 1, and a
    /// tenant without a child finds one free or one freed by the next check that ends.
    held: HashMap<usize, usize>,
    /// Children started (tests read it).
    spawned: u64,
    /// Whether the log has said that images load unverified.
    warned: bool,
}

impl Verifier {
    pub fn new(spec: Spec) -> Verifier {
        let mut state = State::default();
        if let Some(f) = &spec.known_file {
            if let Ok(text) = std::fs::read_to_string(f) {
                state.good.extend(text.lines().filter_map(parse_hex));
            }
        }
        Verifier {
            spec,
            state: Mutex::new(state),
            changed: Condvar::new(),
            driver: 0,
        }
    }

    /// The same, its verdicts named for driver version `driver` too.
    pub fn for_driver(mut self, driver: i32) -> Verifier {
        self.driver = driver;
        self
    }

    /// Children started so far.
    pub fn spawned(&self) -> u64 {
        self.lock().spawned
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The verdict on `image` for GPU `ordinal`, whose kind `device` names (its compute
    /// capability, say): remembered, or from a load in the child. A verdict holds for one
    /// kind of GPU under one driver: the same image may meet another parser elsewhere.
    pub fn check(&self, ordinal: usize, device: &[u8], image: &[u8]) -> Verdict {
        self.check_work(0, ordinal, device, image, Work::Load)
    }

    /// The verdict on `bytes` for `work` (an image's load, a container's link), asked by
    /// tenant `tenant` (`Account::tenant`: whose checks share the children fairly).
    pub fn check_work(
        &self,
        tenant: usize,
        ordinal: usize,
        device: &[u8],
        image: &[u8],
        work: Work,
    ) -> Verdict {
        let started = Instant::now();
        let verdict = self.check_timed(tenant, ordinal, device, image, work);
        // What verification costs a load (scripts/probe/verifier_cost.sh reads these).
        tracing::debug!(
            bytes = image.len(),
            us = started.elapsed().as_micros() as u64,
            ?verdict,
            "image verified"
        );
        verdict
    }

    fn check_timed(
        &self,
        tenant: usize,
        ordinal: usize,
        device: &[u8],
        image: &[u8],
        work: Work,
    ) -> Verdict {
        let started = Instant::now();
        // A link's verdict is not an image's of the same bytes (images keep the hashes
        // they had before links were verified, so kept verdicts stay good).
        let domain: &[u8] = match work {
            Work::Load => b"",
            Work::Link => b"omps-link",
            Work::Jit => b"omps-jit",
        };
        let hash: [u8; 32] = Sha256::new()
            .chain_update(domain)
            .chain_update(self.driver.to_le_bytes())
            .chain_update((device.len() as u64).to_le_bytes())
            .chain_update(device)
            .chain_update(image)
            .finalize()
            .into();
        tracing::debug!(us = started.elapsed().as_micros() as u64, "image hashed");
        let mut st = self.lock();
        // One check per hash at a time: a second waits for the first's verdict.
        loop {
            if st.good.contains(&hash) {
                return Verdict::Good;
            }
            if st.bad.contains(&hash) {
                return Verdict::Crashed;
            }
            if !st.checking.contains(&hash) {
                break;
            }
            st = self.wait(st);
        }
        st.checking.insert(hash);
        let checking = Checking {
            verifier: self,
            hash,
        };
        // A child of its own for this check: an idle one, else a new one while fewer than
        // MAX_CHILDREN run, else the first to be free; the last free one only for a
        // tenant that holds none (State::held).
        let child = loop {
            reap(&mut st);
            let busy = st.children.saturating_sub(st.idle.len());
            let free = MAX_CHILDREN.saturating_sub(busy);
            let mine = st.held.get(&tenant).copied().unwrap_or(0);
            if free >= 2 || (free == 1 && mine == 0) {
                if let Some(c) = st.idle.pop() {
                    break Some(c);
                }
                st.children += 1;
                break None;
            }
            st = self.wait(st);
        };
        *st.held.entry(tenant).or_default() += 1;
        drop(st);
        // The child is asked with no lock held: other images are checked meanwhile.
        let fresh = child.is_none();
        let mut child = match child {
            Some(c) => Ok(c),
            None => self.spawn().map_err(|e| format!("cannot start: {e}")),
        };
        let answer = match &mut child {
            Ok(c) => ask(c, ordinal, image, work),
            Err(why) => Err(why.clone()),
        };
        let mut st = self.lock();
        if fresh && child.is_ok() {
            st.spawned += 1;
        }
        // The tenant's child is free again (notified as `checking` goes, below).
        if let Some(n) = st.held.get_mut(&tenant) {
            *n -= 1;
            if *n == 0 {
                st.held.remove(&tenant);
            }
        }
        let verdict = match answer {
            Ok(NO_CONTEXT) => {
                if !st.warned {
                    st.warned = true;
                    tracing::warn!(
                        "the image verifier cannot open GPU {ordinal} (compute mode, or memory): images load unverified"
                    );
                }
                Verdict::Unverified
            }
            // Loaded, or refused for what the image is: the parser has seen it whole.
            Ok(code) if code == 0 || IMAGE_ERRORS.contains(&code) => Verdict::Good,
            Ok(code) => {
                // Out of memory or the like, perhaps before the parser saw the image: no
                // verdict, none kept, and the image goes on as without a verifier.
                tracing::warn!(
                    "the image verifier could not load an image (CUDA error {code}): loaded unverified"
                );
                Verdict::Unverified
            }
            Err(ref why) => {
                tracing::warn!("an image stopped the verifier ({why}): refused");
                Verdict::Crashed
            }
        };
        match (child, verdict) {
            (Ok(c), Verdict::Good | Verdict::Unverified) => st.idle.push(c),
            // Stopped: it died or hung, or its answer may still come.
            (Ok(c), Verdict::Crashed) => {
                st.children -= 1;
                stop(Some(c));
            }
            (Err(_), _) => st.children -= 1,
        }
        match verdict {
            Verdict::Good => {
                st.good.insert(hash);
                self.remember(&hash);
            }
            Verdict::Crashed => {
                st.bad.insert(hash);
            }
            Verdict::Unverified => {}
        }
        drop(st);
        drop(checking);
        verdict
    }

    fn wait<'a>(&self, st: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        self.changed.wait(st).unwrap_or_else(|e| e.into_inner())
    }

    fn spawn(&self) -> std::io::Result<Running> {
        let mut child = Command::new(&self.spec.program)
            .args(&self.spec.args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            // Not a client of anything: the real driver, never the shim.
            .env_remove("LD_PRELOAD")
            .spawn()?;
        let stdin = child.stdin.take().expect("piped");
        let stdout = child.stdout.take().expect("piped");
        Ok(Running {
            child,
            stdin,
            stdout,
            last: Instant::now(),
        })
    }

    fn remember(&self, hash: &[u8; 32]) {
        let Some(f) = &self.spec.known_file else {
            return;
        };
        let line: String = hash.iter().map(|b| format!("{b:02x}")).collect();
        let r = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(f)
            .and_then(|mut f| writeln!(f, "{line}"));
        if let Err(e) = r {
            tracing::warn!(
                "cannot keep a verified image's hash in {}: {e}",
                f.display()
            );
        }
    }
}

impl Drop for Verifier {
    fn drop(&mut self) {
        for c in std::mem::take(&mut self.lock().idle) {
            stop(Some(c));
        }
    }
}

/// A hash being checked: no longer once this goes, and whoever waits looks again.
struct Checking<'a> {
    verifier: &'a Verifier,
    hash: [u8; 32],
}

impl Drop for Checking<'_> {
    fn drop(&mut self) {
        self.verifier.lock().checking.remove(&self.hash);
        self.verifier.changed.notify_all();
    }
}

/// Stops idle children idle past IDLE (each leaves by itself a little later) or ended.
fn reap(st: &mut State) {
    let mut k = 0;
    while k < st.idle.len() {
        let c = &mut st.idle[k];
        if c.last.elapsed() > IDLE || !matches!(c.child.try_wait(), Ok(None)) {
            let c = st.idle.swap_remove(k);
            st.children -= 1;
            stop(Some(c));
        } else {
            k += 1;
        }
    }
}

/// One request to child `c`: its answer, or why none came.
fn ask(c: &mut Running, ordinal: usize, image: &[u8], work: Work) -> Result<i32, String> {
    c.last = Instant::now();
    let flag = match work {
        Work::Load => 0,
        Work::Link => LINK,
        Work::Jit => JIT,
    };
    let mut head = (ordinal as u32 | flag).to_le_bytes().to_vec();
    head.extend_from_slice(&(image.len() as u64).to_le_bytes());
    c.stdin
        .write_all(&head)
        .and_then(|_| c.stdin.write_all(image))
        .and_then(|_| c.stdin.flush())
        .map_err(|e| format!("writing the image: {e}"))?;
    let limit = match work {
        Work::Load => DEADLINE,
        Work::Link | Work::Jit => COMPILE_DEADLINE,
    };
    let answer = read_answer(&mut c.stdout, &mut c.child, limit);
    c.last = Instant::now();
    answer
}

fn stop(c: Option<Running>) {
    if let Some(mut c) = c {
        let _ = c.child.kill();
        let _ = c.child.wait();
    }
}

/// The child's 4-byte answer within `limit`; a child that dies or stays silent
/// gives none.
fn read_answer(out: &mut ChildStdout, child: &mut Child, limit: Duration) -> Result<i32, String> {
    use std::os::fd::AsRawFd;
    let deadline = Instant::now() + limit;
    let mut got = [0u8; 4];
    let mut n = 0;
    while n < 4 {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            let _ = child.kill();
            return Err(format!("no answer in {limit:?}"));
        }
        let mut pfd = libc::pollfd {
            fd: out.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = left.as_millis().min(1000) as libc::c_int;
        // SAFETY: one valid pollfd.
        if unsafe { libc::poll(&mut pfd, 1, ms) } <= 0 {
            continue;
        }
        match out.read(&mut got[n..]) {
            Ok(0) => {
                let status = child.wait().map(|s| s.to_string()).unwrap_or_default();
                return Err(format!("the verifier ended: {status}"));
            }
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("reading its answer: {e}")),
        }
    }
    Ok(i32::from_le_bytes(got))
}

fn parse_hex(line: &str) -> Option<[u8; 32]> {
    let line = line.trim();
    if line.len() != 64 {
        return None;
    }
    let mut h = [0u8; 32];
    for (i, b) in h.iter_mut().enumerate() {
        *b = u8::from_str_radix(line.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(h)
}

/// The server's verifier, set by [`crate::Server::new`] from its configuration (None in
/// servers that tests run in their own process).
static INSTALLED: Mutex<Option<std::sync::Arc<Verifier>>> = Mutex::new(None);

pub fn install(v: Option<Verifier>) {
    *INSTALLED.lock().unwrap_or_else(|e| e.into_inner()) = v.map(std::sync::Arc::new);
}

/// The installed verifier's verdict on `bytes` for `work` (an image's load, a container's
/// link or JIT compile); Good where none is installed.
/// `tenant`: whose checks these are ([`Verifier::check_work`]).
pub fn check(tenant: usize, ordinal: usize, device: &[u8], bytes: &[u8], work: Work) -> Verdict {
    let v = INSTALLED.lock().unwrap_or_else(|e| e.into_inner()).clone();
    v.map_or(Verdict::Good, |v| {
        v.check_work(tenant, ordinal, device, bytes, work)
    })
}

/// The child's side: answers requests until its stdin closes or it has been idle for
/// [`IDLE`]. `load` loads an image on GPU `ordinal` and unloads it, or links a container
/// there: the CUresult.
pub fn child_main(mut load: impl FnMut(usize, &[u8], Work) -> i32) -> std::process::ExitCode {
    // What the server keeps open across its restart (listening sockets, the pipe
    // directory's lock) is not the child's to hold should it outlive the server.
    // SAFETY: close_range on descriptors this process does not use (only 0-2 are).
    unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) };
    let mut input = std::io::stdin().lock();
    let mut output = std::io::stdout().lock();
    loop {
        // Idle past what the server waits before it starts another child: gone, and its
        // context's GPU memory with it, even if the server never asks again.
        let mut pfd = libc::pollfd {
            fd: 0,
            events: libc::POLLIN,
            revents: 0,
        };
        let idle_ms = (IDLE + Duration::from_secs(10)).as_millis() as libc::c_int;
        // SAFETY: one valid pollfd, on this process's stdin.
        if unsafe { libc::poll(&mut pfd, 1, idle_ms) } == 0 {
            return std::process::ExitCode::SUCCESS;
        }
        let mut head = [0u8; 12];
        if input.read_exact(&mut head).is_err() {
            return std::process::ExitCode::SUCCESS;
        }
        let word = u32::from_le_bytes(head[..4].try_into().expect("4 bytes"));
        let work = match (word & LINK != 0, word & JIT != 0) {
            (true, _) => Work::Link,
            (_, true) => Work::Jit,
            _ => Work::Load,
        };
        let ordinal = (word & !(LINK | JIT)) as usize;
        let len = u64::from_le_bytes(head[4..].try_into().expect("8 bytes"));
        let Ok(len) = usize::try_from(len) else {
            return std::process::ExitCode::FAILURE;
        };
        let mut image = vec![0u8; len];
        if input.read_exact(&mut image).is_err() {
            return std::process::ExitCode::FAILURE;
        }
        let r = load(ordinal, &image, work);
        if output
            .write_all(&r.to_le_bytes())
            .and_then(|_| output.flush())
            .is_err()
        {
            return std::process::ExitCode::FAILURE;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_read_back_as_written() {
        let h: [u8; 32] = Sha256::digest(b"image").into();
        let line: String = h.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(parse_hex(&line), Some(h));
        assert_eq!(parse_hex("zz"), None);
        assert_eq!(parse_hex(&line[..62]), None);
    }

    #[test]
    fn an_answer_that_says_nothing_of_the_image_is_no_verdict() {
        // A stand-in that answers every request with CUDA_ERROR_OUT_OF_MEMORY (2).
        let v = Verifier::new(Spec {
            program: "/bin/sh".into(),
            args: vec![
                "-c".into(),
                "while head -c 15 > /dev/null && [ -n x ]; do printf '\\002\\000\\000\\000'; done"
                    .into(),
            ],
            known_file: None,
        });
        assert_eq!(v.check(0, b"", b"one"), Verdict::Unverified);
        assert_eq!(
            v.check(0, b"", b"one"),
            Verdict::Unverified,
            "not kept as good: asked again"
        );
        // Verdicts are per kind of GPU: the same bytes for another device are asked anew.
        let dir = std::env::temp_dir().join(format!("omps-verifier-dev-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let dying = Verifier::new(Spec {
            program: "/bin/sh".into(),
            args: vec!["-c".into(), "exit 3".into()],
            known_file: None,
        });
        assert_eq!(dying.check(0, b"sm90", b"x"), Verdict::Crashed);
        assert_eq!(dying.check(0, b"sm90", b"x"), Verdict::Crashed);
        assert_eq!(dying.spawned(), 1);
        assert_eq!(dying.check(0, b"sm80", b"x"), Verdict::Crashed);
        assert_eq!(dying.spawned(), 2, "another device's verdict is its own");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A stand-in child that takes `secs` over each 3-byte image and finds it good.
    fn slow_spec(secs: &str) -> Spec {
        Spec {
            program: "/bin/sh".into(),
            args: vec![
                "-c".into(),
                format!(
                    "while head -c 15 > /dev/null && [ -n x ]; do sleep {secs}; printf '\\000\\000\\000\\000'; done"
                ),
            ],
            known_file: None,
        }
    }

    /// Checks `images` on a thread each: their verdicts, and how long all took.
    fn check_at_once(
        v: &std::sync::Arc<Verifier>,
        images: &[&'static [u8]],
    ) -> (Vec<Verdict>, Duration) {
        let t = Instant::now();
        let threads: Vec<_> = images
            .iter()
            .map(|&img| {
                let v = v.clone();
                std::thread::spawn(move || v.check(0, b"", img))
            })
            .collect();
        let verdicts = threads.into_iter().map(|t| t.join().unwrap()).collect();
        (verdicts, t.elapsed())
    }

    /// Found in review: one lock over every check made a client loading a new image wait
    /// behind any other client's, on every GPU. Different images are checked at once,
    /// each in a child of its own (at most MAX_CHILDREN); the same image once.
    #[test]
    fn different_images_are_checked_at_once_and_the_same_once() {
        // The same new image asked by several at once: one check, one verdict for all.
        let v = std::sync::Arc::new(Verifier::new(slow_spec("0.4")));
        let (verdicts, _) = check_at_once(&v, &[b"ten", b"ten", b"ten"]);
        assert_eq!(verdicts, vec![Verdict::Good; 3]);
        assert_eq!(v.spawned(), 1, "the image checked once");
        let (verdicts, took) = check_at_once(&v, &[b"one", b"two", b"six"]);
        assert_eq!(verdicts, vec![Verdict::Good; 3]);
        assert!(
            took < Duration::from_millis(1100),
            "one after another: {took:?}"
        );
        assert_eq!(v.spawned(), 3, "the idle child and two more");
        // More images than children: the rest wait for a child, none is forked beyond.
        // One tenant's take MAX_CHILDREN - 1 children at most (the last is kept back).
        let many: Vec<&'static [u8]> = vec![b"a01", b"a02", b"a03", b"a04", b"a05", b"a06"];
        let (verdicts, _) = check_at_once(&v, &many);
        assert_eq!(verdicts, vec![Verdict::Good; 6]);
        assert_eq!(v.spawned() as usize, MAX_CHILDREN - 1);
        assert!(v.lock().held.is_empty(), "every child given back");
    }

    /// Hostile review: one tenant's slow images (distinct, as a compile each: 300 s) held
    /// every child, and another tenant's new image waited for one. The last free child is
    /// kept for a tenant that holds none: its image is checked at once.
    #[test]
    fn one_tenants_slow_images_leave_a_child_for_another() {
        let v = std::sync::Arc::new(Verifier::new(slow_spec("1")));
        let check = |tenant: usize, img: &'static [u8]| {
            let v = v.clone();
            std::thread::spawn(move || {
                let t = Instant::now();
                let verdict = v.check_work(tenant, 0, b"", img, Work::Jit);
                (verdict, t.elapsed())
            })
        };
        let hostile: Vec<_> = [b"h01", b"h02", b"h03", b"h04", b"h05"]
            .into_iter()
            .map(|img| check(7, img))
            .collect();
        std::thread::sleep(Duration::from_millis(200));
        {
            let st = v.lock();
            assert_eq!(st.held.get(&7), Some(&(MAX_CHILDREN - 1)), "one kept back");
        }
        let (verdict, took) = check(8, b"new").join().unwrap();
        assert_eq!(verdict, Verdict::Good);
        assert!(
            took < Duration::from_millis(1700),
            "waited behind the other tenant's: {took:?}"
        );
        for t in hostile {
            assert_eq!(t.join().unwrap().0, Verdict::Good);
        }
        assert_eq!(v.spawned() as usize, MAX_CHILDREN);
        assert!(v.lock().held.is_empty());
    }

    #[test]
    fn a_child_that_left_while_idle_is_replaced_not_blamed() {
        // A stand-in that answers one request (12-byte head and 3 bytes) and leaves, as an
        // idle child does.
        let v = Verifier::new(Spec {
            program: "/bin/sh".into(),
            args: vec![
                "-c".into(),
                "head -c 15 > /dev/null; printf '\\000\\000\\000\\000'".into(),
            ],
            known_file: None,
        });
        assert_eq!(v.check(0, b"", b"one"), Verdict::Good);
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(
            v.check(0, b"", b"two"),
            Verdict::Good,
            "a new child, not a crash"
        );
        assert_eq!(v.spawned(), 2);
    }

    #[test]
    fn a_verifier_that_dies_refuses_the_image_and_remembers() {
        // A stand-in child that reads nothing and dies at once: every image it is asked
        // about counts as one that killed the parser.
        let v = Verifier::new(Spec {
            program: "/bin/sh".into(),
            args: vec!["-c".into(), "exit 3".into()],
            known_file: None,
        });
        assert_eq!(v.check(0, b"", b"one"), Verdict::Crashed);
        assert_eq!(v.spawned(), 1);
        assert_eq!(v.check(0, b"", b"one"), Verdict::Crashed, "remembered");
        assert_eq!(v.spawned(), 1, "no second child for a known image");
        // A stand-in that answers every request with 0 after reading it: good, and kept.
        let dir = std::env::temp_dir().join(format!("omps-verifier-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let known = dir.join("verified-images");
        let _ = std::fs::remove_file(&known);
        let answering = Spec {
            program: "/bin/sh".into(),
            args: vec![
                "-c".into(),
                // 12-byte head (ordinal, length 3) and the 3 bytes, then answer 0.
                "while head -c 15 > /dev/null && [ -n x ]; do printf '\\000\\000\\000\\000'; done"
                    .into(),
            ],
            known_file: Some(known.clone()),
        };
        let ok = Verifier::new(answering.clone());
        assert_eq!(ok.check(0, b"", b"two"), Verdict::Good);
        drop(ok);
        let again = Verifier::new(answering);
        assert_eq!(
            again.check(0, b"", b"two"),
            Verdict::Good,
            "known from the file"
        );
        assert_eq!(again.spawned(), 0, "without a load");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
