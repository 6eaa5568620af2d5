//! The answer to cudart's integrity check (export table d4082055, entry 1). cudart
//! verifies it and refuses to start (error 103) if it is wrong. Facts from
//! shared/reference/cuda-api-surface.md, checked against driver 580: for versions ending in
//! 0 or 1 the answer is a constant pair; otherwise it is HMAC-MD2 under a fixed key over
//! the driver version, the check's version, pid, thread, three addresses the runtime got
//! from us, the time it passed, and every device's UUID and PCI location.

use hmac::{KeyInit, Mac, SimpleHmac};
use md2::Md2;

const KEY: [u8; 16] = [
    0x14, 0x6A, 0xDD, 0xAE, 0x53, 0xA9, 0xA7, 0x52, 0xAA, 0x08, 0x41, 0x36, 0x0B, 0xF5, 0x5A, 0x9F,
];
const CONST_0: [u64; 2] = [0x3341_181C_03CB_675C, 0x8ED3_83AA_1F4C_D1E8];
const CONST_1: [u64; 2] = [0x1841_181C_03CB_675C, 0x8ED3_83AA_1F4C_D1E8];

/// What identifies one device in the message.
pub struct DeviceId {
    pub uuid: [u8; 16],
    pub pci_domain: i32,
    pub pci_bus: i32,
    pub pci_device: i32,
}

/// Everything the check covers besides its two arguments.
pub struct Context<'a> {
    pub driver_version: u32,
    pub pid: u32,
    pub thread: u32,
    pub cudart_table: usize,
    pub integrity_table: usize,
    pub check_fn: usize,
    pub devices: &'a [DeviceId],
}

pub fn answer(version: u32, unix_seconds: u64, cx: &Context) -> [u64; 2] {
    match version % 10 {
        0 => return CONST_0,
        1 => return CONST_1,
        _ => {}
    }
    let mut mac = <SimpleHmac<Md2> as KeyInit>::new_from_slice(&KEY).expect("any key length");
    mac.update(&cx.driver_version.to_le_bytes());
    mac.update(&version.to_le_bytes());
    mac.update(&cx.pid.to_le_bytes());
    mac.update(&cx.thread.to_le_bytes());
    mac.update(&(cx.cudart_table as u64).to_le_bytes());
    mac.update(&(cx.integrity_table as u64).to_le_bytes());
    mac.update(&(cx.check_fn as u64).to_le_bytes());
    mac.update(&unix_seconds.to_le_bytes());
    for d in cx.devices {
        mac.update(&d.uuid);
        mac.update(&d.pci_domain.to_le_bytes());
        mac.update(&d.pci_bus.to_le_bytes());
        mac.update(&d.pci_device.to_le_bytes());
    }
    let digest = mac.finalize().into_bytes();
    [
        u64::from_ne_bytes(digest[..8].try_into().expect("16-byte digest")),
        u64::from_ne_bytes(digest[8..16].try_into().expect("16-byte digest")),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cx(devices: &[DeviceId]) -> Context<'_> {
        Context {
            driver_version: 13000,
            pid: 42,
            thread: 7,
            cudart_table: 0x1000,
            integrity_table: 0x2000,
            check_fn: 0x3000,
            devices,
        }
    }

    #[test]
    fn versions_ending_in_0_or_1_get_the_constants() {
        assert_eq!(answer(130, 5, &cx(&[])), CONST_0);
        assert_eq!(answer(1301, 5, &cx(&[])), CONST_1);
    }

    #[test]
    fn the_hash_covers_time_thread_and_devices() {
        let d = [DeviceId {
            uuid: [1; 16],
            pci_domain: 0,
            pci_bus: 0,
            pci_device: 6,
        }];
        let a = answer(13002, 100, &cx(&d));
        assert_ne!(a, answer(13002, 101, &cx(&d)));
        assert_ne!(a, answer(13002, 100, &cx(&[])));
        let mut other = cx(&d);
        other.thread = 8;
        assert_ne!(a, answer(13002, 100, &other));
        assert_eq!(a, answer(13002, 100, &cx(&d)), "deterministic");
    }

    #[test]
    fn md2_is_the_rfc_1319_md2() {
        use md2::Digest;
        // RFC 1319 test suite: MD2("abc").
        let d = Md2::digest(b"abc");
        assert_eq!(d[..4], [0xda, 0x85, 0x3b, 0x0d]);
    }
}
