//! CUPTI's activity kinds and the byte layouts of its activity records, as CUDA 13.0
//! defines them (`cupti_activity.h`: facts, the code is ours). Both sides use them: the
//! shim writes records in them into a profiler's buffers, and the server reads the
//! records its own CUPTI makes of a traced client's work. `scripts/probe/cupti_layout.sh`
//! checks every number against the real headers on the GPU machine.

/// `CUpti_ActivityKind` values omps uses.
pub mod kind {
    pub const MEMCPY: u32 = 1;
    pub const MEMSET: u32 = 2;
    pub const KERNEL: u32 = 3;
    pub const DRIVER: u32 = 4;
    pub const RUNTIME: u32 = 5;
    pub const CONCURRENT_KERNEL: u32 = 10;
    pub const OVERHEAD: u32 = 17;
    pub const SYNCHRONIZATION: u32 = 38;
    pub const EXTERNAL_CORRELATION: u32 = 39;
    /// One past the largest kind CUDA 13.0 defines.
    pub const COUNT: u32 = 64;
}

/// Offsets of the fields omps writes or reads, per record.
pub mod off {
    /// `CUpti_ActivityKernel10` (CONCURRENT_KERNEL).
    pub mod kernel {
        pub const REGISTERS_PER_THREAD: usize = 6;
        pub const START: usize = 16;
        pub const END: usize = 24;
        pub const COMPLETED: usize = 32;
        pub const DEVICE_ID: usize = 40;
        pub const CONTEXT_ID: usize = 44;
        pub const STREAM_ID: usize = 48;
        pub const GRID: usize = 52;
        pub const BLOCK: usize = 64;
        pub const STATIC_SHARED: usize = 76;
        pub const DYNAMIC_SHARED: usize = 80;
        pub const CORRELATION_ID: usize = 92;
        pub const GRID_ID: usize = 96;
        pub const NAME: usize = 104;
        pub const TIMES: [usize; 3] = [START, END, COMPLETED];
    }
    /// `CUpti_ActivityMemcpy6`.
    pub mod memcpy {
        pub const COPY_KIND: usize = 4;
        /// `CUpti_ActivityFlag`: bit 0 is CUPTI_ACTIVITY_FLAG_MEMCPY_ASYNC.
        pub const FLAGS: usize = 7;
        pub const SRC_KIND: usize = 5;
        pub const DST_KIND: usize = 6;
        pub const BYTES: usize = 8;
        pub const START: usize = 16;
        pub const END: usize = 24;
        pub const DEVICE_ID: usize = 32;
        pub const CONTEXT_ID: usize = 36;
        pub const STREAM_ID: usize = 40;
        pub const CORRELATION_ID: usize = 44;
        pub const TIMES: [usize; 2] = [START, END];
    }
    /// `CUpti_ActivityMemset4`: from `bytes` to `correlationId` at the offsets
    /// `CUpti_ActivityMemcpy6` has them.
    pub mod memset {
        pub use super::memcpy::{
            BYTES, CONTEXT_ID, CORRELATION_ID, DEVICE_ID, END, START, STREAM_ID, TIMES,
        };
        pub const VALUE: usize = 4;
        pub const MEMORY_KIND: usize = 50;
    }
    /// `CUpti_ActivityAPI` (DRIVER, RUNTIME).
    pub mod api {
        pub const CBID: usize = 4;
        pub const START: usize = 8;
        pub const END: usize = 16;
        pub const PROCESS_ID: usize = 24;
        pub const THREAD_ID: usize = 28;
        pub const CORRELATION_ID: usize = 32;
        pub const RETURN_VALUE: usize = 36;
        pub const TIMES: [usize; 2] = [START, END];
    }
    /// `CUpti_ActivitySynchronization2`.
    pub mod sync {
        pub const TYPE: usize = 4;
        pub const START: usize = 8;
        pub const END: usize = 16;
        pub const CORRELATION_ID: usize = 24;
        pub const CONTEXT_ID: usize = 28;
        pub const STREAM_ID: usize = 32;
        pub const EVENT_ID: usize = 36;
        pub const RETURN_VALUE: usize = 48;
        pub const TIMES: [usize; 2] = [START, END];
    }
    /// `CUpti_ActivityExternalCorrelation`.
    pub mod external {
        pub const EXTERNAL_KIND: usize = 4;
        pub const EXTERNAL_ID: usize = 8;
        pub const CORRELATION_ID: usize = 16;
    }
}
