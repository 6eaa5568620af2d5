//! Context limits per client (cuCtxGetLimit / cuCtxSetLimit). Under MPS each client has
//! its own stack size, printf FIFO, malloc heap and the rest; here all clients share one
//! context, so each client reads back its own values (or the context's defaults, taken
//! before any client changed them), and the context is only ever raised, to the largest
//! value a client asked for: what one client sets never shrinks another's.

use crate::gpu::{CuError, Gpu, GpuResult};
use omps_ring::wire::query;
use std::collections::HashMap;

/// The context's value of each limit before any client set it.
#[derive(Default)]
pub struct ContextLimits {
    defaults: HashMap<i32, u64>,
}

impl ContextLimits {
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
            gpu.query(
                query::CTX_SET_LIMIT,
                0,
                [limit as i64, value as i64, 0, 0, 0, 0, 0],
                &[],
            )?;
        }
        client.insert(limit, value);
        Ok(())
    }
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
    use crate::gpu_host::HostGpu;

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
    fn an_unknown_limit_is_the_drivers_error() {
        let gpu = HostGpu::new(0, 1 << 30);
        let mut ctx = ContextLimits::default();
        assert!(ctx.set(&gpu, &mut HashMap::new(), 99, 1).is_err());
    }
}
