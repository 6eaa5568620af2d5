//! The connected clients as the control thread keeps them: the lane that serves each,
//! where they are published, and a client's retirement when it dies or leaves.

use super::*;

/// Microseconds a waiting client stays on the CPU while clients outnumber the CPUs: a
/// spin long enough for an answer already on its way, then sleep.
pub const CROWDED_WAIT_US: u32 = 20;

impl Server {
    pub(super) fn retire_client(&mut self, id: u32) {
        if let Some((c, _)) = self.clients.remove(&id) {
            c.gone.store(true, Ordering::SeqCst);
            self.printf.forget(id);
            tracing::info!(
                client = id,
                pid = c.pid,
                "client gone; releasing its resources"
            );
            for g in 0..self.gpus.len() {
                let w = self.lane_of(g, id);
                self.workers[w].send(ToWorker::Remove(id));
            }
            self.exiting.push(c);
            self.publish_placements();
            self.publish_wait();
        }
    }

    /// What a waiting client is asked for (`SegmentHeader::wait_active_us`) with
    /// `clients` connected: while they outnumber the CPUs, spinning and yielding clients
    /// take the CPUs from the lanes and from each other, and the OS's time slices, not
    /// the GPU, decide when each is served (1,024 clients' times spread 200-fold, issue
    /// 25): then a short spin and sleep on the word, which the lane wakes.
    pub(super) fn wait_for(&self, clients: usize) -> u32 {
        if clients > self.cfg.crowd_cpus {
            CROWDED_WAIT_US
        } else {
            0
        }
    }

    /// Tells every client how to wait when that changes (a new client is told at its
    /// connection).
    pub(super) fn publish_wait(&mut self) {
        let want = self.wait_for(self.clients.len());
        if want == self.wait_active_us {
            return;
        }
        self.wait_active_us = want;
        for (c, _) in self.clients.values() {
            c.seg.header().wait_active_us.store(want, Ordering::Relaxed);
        }
        tracing::info!(
            clients = self.clients.len(),
            cpus = self.cfg.crowd_cpus,
            "waiting clients now {}",
            if want == 0 {
                "spin and yield first"
            } else {
                "sleep soon: more clients than CPUs"
            }
        );
    }

    pub(super) fn client_list(&self) -> Vec<Arc<ClientShared>> {
        self.clients.values().map(|(c, _)| c.clone()).collect()
    }

    /// Tells the workers where each client's work runs, and the metrics who is connected
    /// (both change as clients come and go).
    pub(super) fn publish_placements(&self) {
        let clients = self.client_list();
        self.policy.publish(&clients);
        self.board.set_clients(clients);
    }

    /// The worker (lane) of GPU `gpu` that serves client `id`.
    pub(super) fn lane_of(&self, gpu: usize, id: u32) -> usize {
        gpu * self.cfg.lanes + id as usize % self.cfg.lanes
    }

    pub(super) fn reap_exiting(&mut self) {
        // One worker per GPU it sees holds the client's session and says so when it is
        // released.
        self.exiting
            .retain(|c| (c.released.load(Ordering::SeqCst) as usize) < c.visible.len());
    }
}
