//! How many connections the root daemon serves at once, in all and per user (issue 23,
//! finding 16). Each connection has a thread while its hello comes (up to 2 s) and while
//! its user's server starts (up to a minute), so a user opening connections without end
//! would otherwise take threads without end, and the users after it would wait. A user
//! at its share has further connections closed at once; at the total the daemon stops
//! accepting until one ends (only several users together reach it).
//!
//! Servers are admitted too. A user is a uid the system knows: one with 65,536
//! subordinate uids (/etc/subuid, rootless containers) connects from its user namespace as
//! that many host uids, which have no passwd entry, and would otherwise be as many users,
//! each with a server holding every GPU's context and a share of the connections. And
//! only so many users' servers run at once (OMPS_MAX_USER_SERVERS), root's aside.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};

/// Connections served at once, all users together.
pub const TOTAL: usize = 256;
/// Connections of one user served at once.
pub const PER_USER: usize = 32;
/// The share all uids with no passwd entry have together (uid (uid_t)-1, which no process
/// has): each counts against it, not against one of its own.
pub const UNKNOWN_USERS: u32 = u32::MAX;
/// How long a uid's passwd lookup stands for the accepting thread, and how many are kept.
pub const KNOWN_FOR: std::time::Duration = std::time::Duration::from_secs(60);
pub const KNOWN_KEPT: usize = 4096;

/// Users' servers running or starting at once, root's not counted (OMPS_MAX_USER_SERVERS).
pub fn max_user_servers() -> usize {
    std::env::var("OMPS_MAX_USER_SERVERS")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(64)
}

/// The primary group of `uid` in the user database, or None if it has no entry there (or
/// the database cannot be read: the daemon then starts no server for it).
pub fn passwd_gid(uid: u32) -> Option<u32> {
    // getpwuid's record is shared by every thread; connections look users up at once.
    let mut buf = vec![0u8; 4096];
    loop {
        // SAFETY: passwd is plain data; all zeroes is a valid value to be overwritten.
        let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
        let mut found: *mut libc::passwd = std::ptr::null_mut();
        // SAFETY: pw and buf outlive the call, buf.len() is its size; the strings the
        // record points to (in buf) are not read.
        let r = unsafe {
            libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr().cast(), buf.len(), &mut found)
        };
        if r == libc::ERANGE && buf.len() < 1 << 20 {
            buf.resize(buf.len() * 4, 0);
            continue;
        }
        return (r == 0 && !found.is_null()).then_some(pw.pw_gid);
    }
}

#[derive(Default)]
pub struct Admission {
    counts: Mutex<(usize, HashMap<u32, usize>)>,
    freed: Condvar,
}

/// One admitted connection; dropping it frees its place.
pub struct Ticket {
    of: Arc<Admission>,
    uid: u32,
}

impl Admission {
    /// Waits until fewer than `total` connections are served.
    pub fn wait_room(&self, total: usize) {
        let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        while c.0 >= total {
            c = self.freed.wait(c).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// A place for a connection of `uid`, unless that user has `per_user` already.
    pub fn admit(self: &Arc<Self>, uid: u32, per_user: usize) -> Option<Ticket> {
        let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let mine = c.1.entry(uid).or_default();
        if *mine >= per_user {
            return None;
        }
        *mine += 1;
        c.0 += 1;
        Some(Ticket {
            of: self.clone(),
            uid,
        })
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut c = self.of.counts.lock().unwrap_or_else(|e| e.into_inner());
        c.0 -= 1;
        if let Some(n) = c.1.get_mut(&self.uid) {
            *n -= 1;
            if *n == 0 {
                c.1.remove(&self.uid);
            }
        }
        self.of.freed.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn one_user_at_its_share_leaves_room_for_others() {
        let a = Arc::new(Admission::default());
        let mine: Vec<Ticket> = (0..3).map(|_| a.admit(1000, 3).unwrap()).collect();
        assert!(
            a.admit(1000, 3).is_none(),
            "a fourth connection of one user"
        );
        let other = a.admit(1001, 3).expect("another user refused");
        drop(mine);
        assert!(a.admit(1000, 3).is_some(), "its places did not come back");
        drop(other);
        assert!(
            a.counts.lock().unwrap().1.len() <= 1,
            "counts of gone users kept"
        );
        // At the total, accepting waits for a connection to end.
        let held: Vec<Ticket> = (0..4).map(|u| a.admit(u, 3).unwrap()).collect();
        let t = Instant::now();
        let freer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            drop(held);
        });
        a.wait_room(4);
        assert!(t.elapsed() >= Duration::from_millis(150));
        freer.join().unwrap();
    }

    #[test]
    fn the_user_database_is_read() {
        assert_eq!(passwd_gid(0), Some(0), "root");
        let none = (60_000..u32::MAX).step_by(7919).find(|&u| {
            // SAFETY: getpwuid's record is not read, only whether there is one.
            unsafe { libc::getpwuid(u) }.is_null()
        });
        if let Some(u) = none {
            assert_eq!(passwd_gid(u), None, "uid {u} has no entry");
        }
    }
}
