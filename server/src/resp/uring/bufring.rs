//! A ring of provided buffers (`IORING_REGISTER_PBUF_RING`): receives name no buffer; the
//! kernel takes one from this ring when data arrives and says which in the completion. So a
//! connection waiting for its client holds no receive buffer, and a worker's receive memory is
//! [`BufRing::bytes`] whatever the number of connections.
//!
//! The ring and its buffers belong to the kernel from registration until
//! [`BufRing::unregister`]: the worker keeps them alive until then, and leaks them (never frees
//! them) if it could not unregister.

use io_uring::types::BufRingEntry;
use io_uring::Submitter;
use std::sync::atomic::{AtomicU16, Ordering};

/// Provided buffers, `count` of `size` bytes, in buffer group `group`.
pub(super) struct BufRing {
    /// The ring of entries the kernel reads (page-aligned, from `mmap`).
    ring: *mut BufRingEntry,
    ring_bytes: usize,
    /// The buffers, `count × size` bytes, never moved or resized while registered.
    bufs: Box<[u8]>,
    size: usize,
    count: u16,
    /// The next tail to publish (buffers added so far, wrapping).
    tail: u16,
    group: u16,
    registered: bool,
}

impl BufRing {
    /// Maps the ring, registers it with `submitter`'s ring as `group`, and gives the kernel every
    /// buffer. `count` is a power of two.
    pub(super) fn new(
        submitter: &Submitter<'_>,
        count: u16,
        size: usize,
        group: u16,
    ) -> std::io::Result<BufRing> {
        assert!(count.is_power_of_two() && size <= u32::MAX as usize);
        let ring_bytes = usize::from(count) * std::mem::size_of::<BufRingEntry>();
        // SAFETY: an anonymous private mapping: no file, no address hint; the result is checked.
        let ring = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                ring_bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ring == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let mut r = BufRing {
            ring: ring.cast(),
            ring_bytes,
            bufs: vec![0u8; usize::from(count) * size].into_boxed_slice(),
            size,
            count,
            tail: 0,
            group,
            registered: false,
        };
        // SAFETY: `ring` is `count` entries of mapped memory, page-aligned (mmap), that lives
        // until `Drop` unmaps it; `Drop` runs only once the ring is unregistered (or leaks it).
        unsafe { submitter.register_buf_ring_with_flags(ring as u64, count, group, 0)? };
        r.registered = true;
        for bid in 0..count {
            r.push(bid);
        }
        r.publish();
        Ok(r)
    }

    /// The buffer group receives name.
    pub(super) fn group(&self) -> u16 {
        self.group
    }

    /// Bytes of buffers.
    pub(super) fn bytes(&self) -> usize {
        self.bufs.len()
    }

    /// The first `len` bytes of buffer `bid`, which a completion just handed over.
    pub(super) fn data(&self, bid: u16, len: usize) -> &[u8] {
        let at = usize::from(bid) * self.size;
        &self.bufs[at..at + len.min(self.size)]
    }

    /// Gives buffer `bid` back to the kernel (once its data is copied out).
    pub(super) fn recycle(&mut self, bid: u16) {
        if bid < self.count {
            self.push(bid);
            self.publish();
        }
    }

    fn push(&mut self, bid: u16) {
        let i = usize::from(self.tail & (self.count - 1));
        let addr = self.bufs.as_ptr() as u64 + (usize::from(bid) * self.size) as u64;
        // SAFETY: `i < count`: within the mapping. The kernel reads entries only up to the tail
        // it was last given (`publish`), and this one is past it: no one reads it now.
        let e = unsafe { &mut *self.ring.add(i) };
        e.set_addr(addr);
        e.set_len(self.size as u32);
        e.set_bid(bid);
        self.tail = self.tail.wrapping_add(1);
    }

    fn publish(&self) {
        // SAFETY: the tail is a u16 inside the first entry of the live mapping (what
        // `BufRingEntry::tail` computes), aligned for an atomic u16.
        let tail = unsafe { &*(BufRingEntry::tail(self.ring).cast::<AtomicU16>()) };
        // Release: the kernel's acquire load of the tail sees the entries written before it.
        tail.store(self.tail, Ordering::Release);
    }

    /// Takes the ring back from the kernel. False if it refused: the memory is then leaked.
    pub(super) fn unregister(&mut self, submitter: &Submitter<'_>) -> bool {
        if self.registered && submitter.unregister_buf_ring(self.group).is_ok() {
            self.registered = false;
        }
        !self.registered
    }
}

impl Drop for BufRing {
    fn drop(&mut self) {
        if self.registered {
            // The kernel may still write into the buffers: never freed.
            std::mem::forget(std::mem::take(&mut self.bufs));
            return;
        }
        // SAFETY: the mapping made in `new`, no longer registered: no one else uses it.
        unsafe { libc::munmap(self.ring.cast(), self.ring_bytes) };
    }
}
