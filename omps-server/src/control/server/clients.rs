//! The connected clients as the control thread keeps them: the lane that serves each,
//! where they are published, and a client's retirement when it dies or leaves.

use super::*;

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
        }
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
