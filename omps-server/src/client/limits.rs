//! Context limits per client (cuCtxGetLimit / cuCtxSetLimit). Under MPS each client has
//! its own stack size, printf FIFO, malloc heap and the rest; here all clients share one
//! context, so each client reads back its own values (or the context's defaults, taken
//! before any client changed them), and the context is raised to the largest value a
//! client asked for: what one client sets never shrinks another's. When the last client
//! that needed a raise goes, the context comes back down to what those left need (or
//! the default), so one client's large heap or stack does not outlive it.
//!
//! The malloc heap (and the printf FIFO) can change only until the context first loads
//! code that uses it; after that the driver refuses any change (CUDA_ERROR_INVALID_VALUE).
//! Natively each process's heap is its own, so a client sets it before its own first
//! malloc and succeeds; here one client's malloc fixes the heap for all. So the server
//! sizes the heap at start (`OMPS_MALLOC_HEAP_SIZE`, [`ContextLimits::presize`]; the
//! driver allocates it only when malloc code is first loaded): a client asking for up to
//! that much succeeds without touching the context, and reads back its own value. A
//! client asking for more gets the driver's answer, which is a refusal once the heap is
//! fixed (logged, naming the knob). Presized values are floors: lowering stops there.

/// CUlimit values the context comes back down from: stack size, printf FIFO, malloc heap
/// (the others are small, or not the client's to grow).
const LOWERED: [i32; 3] = [0, 1, 2];

use crate::gpu::{CuError, Gpu, GpuResult};
use omps_ring::wire::query;
use std::collections::HashMap;

/// The context's value of each limit before any client set it, and what each client set.
#[derive(Default)]
pub struct ContextLimits {
    defaults: HashMap<i32, u64>,
    /// What the server set at start: the context never comes down below it.
    floors: HashMap<i32, u64>,
    by_client: HashMap<u32, HashMap<i32, u64>>,
}

/// CU_LIMIT_PRINTF_FIFO_SIZE and CU_LIMIT_MALLOC_HEAP_SIZE: fixed once code using them
/// is loaded.
const FIXED_AFTER_USE: [i32; 2] = [1, 2];

impl ContextLimits {
    /// Sets `limit` of the context to `value` before any client runs; clients still read
    /// the driver's default until they set their own.
    pub fn presize(&mut self, gpu: &dyn Gpu, limit: i32, value: u64) -> GpuResult<()> {
        self.default_of(gpu, limit)?;
        gpu.query(
            query::CTX_SET_LIMIT,
            0,
            [limit as i64, value as i64, 0, 0, 0, 0, 0],
            &[],
        )?;
        // The driver may round the value; the floor is what the context holds.
        self.floors.insert(limit, context_value(gpu, limit)?);
        Ok(())
    }

    fn default_of(&mut self, gpu: &dyn Gpu, limit: i32) -> GpuResult<u64> {
        if let Some(&v) = self.defaults.get(&limit) {
            return Ok(v);
        }
        let v = context_value(gpu, limit)?;
        self.defaults.insert(limit, v);
        Ok(v)
    }

    /// What `client` (its own settings) reads for `limit`.
    pub fn get(&mut self, gpu: &dyn Gpu, client: &HashMap<i32, u64>, limit: i32) -> GpuResult<u64> {
        let default = self.default_of(gpu, limit)?;
        Ok(client.get(&limit).copied().unwrap_or(default))
    }

    /// Records `value` as `client`'s and raises the context to it if it is larger. The
    /// driver validates the limit and value whenever it is asked to change; a smaller value
    /// than the context's is checked against the limit's existence only.
    pub fn set(
        &mut self,
        gpu: &dyn Gpu,
        client: &mut HashMap<i32, u64>,
        limit: i32,
        value: u64,
    ) -> GpuResult<()> {
        self.default_of(gpu, limit)?;
        let now = context_value(gpu, limit)?;
        if value > now {
            let r = gpu.query(
                query::CTX_SET_LIMIT,
                0,
                [limit as i64, value as i64, 0, 0, 0, 0, 0],
                &[],
            );
            // Said once per limit: a client asking again and again cannot fill the log.
            static SAID: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);
            let first = |l: i32| {
                SAID.fetch_or(1 << l, std::sync::atomic::Ordering::Relaxed) & (1 << l) == 0
            };
            if let (Err(e), true) = (&r, FIXED_AFTER_USE.contains(&limit) && first(limit)) {
                tracing::warn!(
                    gpu = gpu.ordinal(),
                    "a client asked for {value} bytes of context limit {limit}; the shared \
                     context has {now} and the driver refused to change it (CUDA error {}): \
                     code using it was loaded already. Start the server with \
                     OMPS_MALLOC_HEAP_SIZE (heap) at least this large",
                    e.0
                );
            }
            r?;
        }
        client.insert(limit, value);
        Ok(())
    }

    /// The device memory `value` of `limit` costs beyond the context's default: the stack
    /// (per thread) for every thread the GPU can hold resident, the printf FIFO and the
    /// malloc heap once; the other limits take nothing a client could grow without end.
    pub fn cost(&mut self, gpu: &dyn Gpu, limit: i32, value: u64) -> GpuResult<u64> {
        const STACK_SIZE: i32 = 0;
        let per = match limit {
            STACK_SIZE => resident_threads(gpu),
            1 | 2 => 1,
            _ => return Ok(0),
        };
        let default = self.default_of(gpu, limit)?;
        Ok(value.saturating_sub(default).saturating_mul(per))
    }

    /// Records what client `id` set (its session's values), for [`ContextLimits::gone`].
    pub fn note(&mut self, id: u32, client: &HashMap<i32, u64>) {
        self.by_client.insert(id, client.clone());
    }

    /// Client `id` is gone: each limit it raised comes down to the largest value a
    /// remaining client set, or the default.
    pub fn gone(&mut self, gpu: &dyn Gpu, id: u32) {
        let Some(theirs) = self.by_client.remove(&id) else {
            return;
        };
        for (limit, _) in theirs.into_iter().filter(|(l, _)| LOWERED.contains(l)) {
            let Some(&default) = self.defaults.get(&limit) else {
                continue;
            };
            let default = default.max(self.floors.get(&limit).copied().unwrap_or(0));
            let need = self
                .by_client
                .values()
                .filter_map(|c| c.get(&limit).copied())
                .fold(default, u64::max);
            if context_value(gpu, limit).is_ok_and(|now| now > need) {
                let _ = gpu.query(
                    query::CTX_SET_LIMIT,
                    0,
                    [limit as i64, need as i64, 0, 0, 0, 0, 0],
                    &[],
                );
            }
        }
    }
}

/// Threads the GPU can hold resident at once: its SMs times the threads each holds.
fn resident_threads(gpu: &dyn Gpu) -> u64 {
    use crate::gpu::host::profile::attr;
    let a = gpu.snapshot().attributes;
    let of = |i: usize| a.get(i).map_or(0, |&v| v.max(0) as u64);
    (of(attr::MULTIPROCESSOR_COUNT) * of(attr::MAX_THREADS_PER_MULTIPROCESSOR)).max(1)
}

fn context_value(gpu: &dyn Gpu, limit: i32) -> GpuResult<u64> {
    gpu.query(
        query::CTX_GET_LIMIT,
        0,
        [limit as i64, 0, 0, 0, 0, 0, 0],
        &[],
    )
    .map(|v| v as u64)
    .map_err(|e| CuError(e.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::code;
    use crate::gpu::host::HostGpu;

    #[test]
    fn a_client_reads_its_own_limit_and_never_lowers_another() {
        let gpu = HostGpu::new(0, 1 << 30);
        let mut ctx = ContextLimits::default();
        let (mut a, mut b) = (HashMap::new(), HashMap::new());
        let stack = 0;
        let default = ctx.get(&gpu, &a, stack).unwrap();
        ctx.set(&gpu, &mut a, stack, default * 4).unwrap();
        assert_eq!(ctx.get(&gpu, &a, stack).unwrap(), default * 4);
        assert_eq!(
            ctx.get(&gpu, &b, stack).unwrap(),
            default,
            "b still sees its own"
        );
        ctx.set(&gpu, &mut b, stack, default / 2).unwrap();
        assert_eq!(ctx.get(&gpu, &b, stack).unwrap(), default / 2);
        assert_eq!(
            context_value(&gpu, stack).unwrap(),
            default * 4,
            "b's smaller value did not shrink the context under a"
        );
    }

    #[test]
    fn a_raise_ends_with_the_last_client_that_needed_it() {
        let gpu = HostGpu::new(0, 1 << 30);
        let mut ctx = ContextLimits::default();
        let (mut a, mut b) = (HashMap::new(), HashMap::new());
        let heap = 2;
        let default = ctx.get(&gpu, &a, heap).unwrap();
        ctx.set(&gpu, &mut a, heap, default * 8).unwrap();
        ctx.note(1, &a);
        ctx.set(&gpu, &mut b, heap, default * 2).unwrap();
        ctx.note(2, &b);
        ctx.gone(&gpu, 1);
        assert_eq!(
            context_value(&gpu, heap).unwrap(),
            default * 2,
            "down to what b needs"
        );
        ctx.gone(&gpu, 2);
        assert_eq!(
            context_value(&gpu, heap).unwrap(),
            default,
            "back to the default"
        );
    }

    #[test]
    fn a_presized_heap_serves_clients_after_it_is_fixed() {
        let gpu = HostGpu::new(0, 1 << 30);
        let mut ctx = ContextLimits::default();
        let heap = 2;
        let default = context_value(&gpu, heap).unwrap();
        ctx.presize(&gpu, heap, default * 64).unwrap();
        // Another client's malloc code is loaded: the driver fixes the heap's size.
        let malloc = b"omps-host-module\nfn k\nextern malloc\n\0";
        gpu.module_load(malloc).unwrap();
        let (mut a, b) = (HashMap::new(), HashMap::new());
        assert_eq!(
            ctx.get(&gpu, &b, heap).unwrap(),
            default,
            "the driver's default"
        );
        ctx.set(&gpu, &mut a, heap, default * 32)
            .expect("within the presized heap");
        assert_eq!(
            ctx.get(&gpu, &a, heap).unwrap(),
            default * 32,
            "a's own value"
        );
        assert_eq!(
            ctx.set(&gpu, &mut a, heap, default * 128).unwrap_err().0,
            code::INVALID_VALUE,
            "beyond it the driver's refusal"
        );
        ctx.note(1, &a);
        ctx.gone(&gpu, 1);
        assert_eq!(
            context_value(&gpu, heap).unwrap(),
            default * 64,
            "never below what the server set"
        );
    }

    #[test]
    fn an_unknown_limit_is_the_drivers_error() {
        let gpu = HostGpu::new(0, 1 << 30);
        let mut ctx = ContextLimits::default();
        assert!(ctx.set(&gpu, &mut HashMap::new(), 99, 1).is_err());
    }
}
