//! A ring of provided buffers (`IORING_REGISTER_PBUF_RING`): receives name no buffer; the
//! kernel takes one from this ring when data arrives and says which in the completion. So a
//! connection waiting for its client holds no receive buffer, and a worker's receive memory is
//! [`BufRing::bytes`] whatever the number of connections.
//!
//! The ring and its buffers belong to the kernel from registration until
//! [`BufRing::unregister`]: the worker keeps them alive until then, and leaks them (never frees
//! them) if it could not unregister.
//!
//! The kernel takes buffers in ring order, and each is given back at the tail at once: a worker
//! cycles through all of them, so after a burst every page of them is resident, however quiet
//! the worker is since. [`BufRing::release`] gives the pages of the buffers the kernel cannot
//! take now back to the system (they read as zeros, and are faulted in again when used).

use io_uring::types::BufRingEntry;
use io_uring::Submitter;
use std::sync::atomic::{AtomicU16, Ordering};

/// Provided buffers, `count` of `size` bytes, in buffer group `group`.
pub(super) struct BufRing {
    /// The ring of entries the kernel reads (page-aligned, from `mmap`).
    ring: *mut BufRingEntry,
    ring_bytes: usize,
    /// The buffers, `count × size` bytes (page-aligned, from `mmap`), never moved or resized
    /// while registered.
    bufs: *mut u8,
    size: usize,
    count: u16,
    /// The next tail to publish (buffers added so far, wrapping).
    tail: u16,
    /// The buffer at each ring position (`position & (count - 1)`), as pushed.
    order: Box<[u16]>,
    /// Buffers taken by the kernel (and given back) since the last [`BufRing::release`].
    taken: u32,
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
        let ring = map(ring_bytes)?;
        let bufs = match map(usize::from(count) * size) {
            Ok(b) => b,
            Err(e) => {
                // SAFETY: the mapping just made, which nothing else refers to.
                unsafe { libc::munmap(ring.cast(), ring_bytes) };
                return Err(e);
            }
        };
        let mut r = BufRing {
            ring: ring.cast(),
            ring_bytes,
            bufs: bufs.cast(),
            size,
            count,
            tail: 0,
            order: vec![0; usize::from(count)].into_boxed_slice(),
            taken: 0,
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
        usize::from(self.count) * self.size
    }

    /// The first `len` bytes of buffer `bid`, which a completion just handed over.
    pub(super) fn data(&self, bid: u16, len: usize) -> &[u8] {
        let at = usize::from(bid.min(self.count - 1)) * self.size;
        // SAFETY: buffer `bid` lies within the mapping, which lives as long as `self`; the
        // kernel wrote it before the completion and takes it again only once it is recycled.
        unsafe { std::slice::from_raw_parts(self.bufs.add(at), len.min(self.size)) }
    }

    /// Gives buffer `bid` back to the kernel (once its data is copied out).
    pub(super) fn recycle(&mut self, bid: u16) {
        if bid < self.count {
            self.push(bid);
            self.publish();
            self.taken = self.taken.saturating_add(1);
        }
    }

    /// Buffers the kernel took (and were given back) since the last [`BufRing::release`].
    pub(super) fn taken(&self) -> u32 {
        self.taken
    }

    /// Gives the pages of the buffers back to the system, but those of the next `pickable`
    /// ring positions: at most that many receives are in flight, each takes the next buffer in
    /// ring order, and every buffer taken before was given back (so the kernel's head is at
    /// most `pickable` positions past `tail - count`). Called between two submissions, by the
    /// worker that owns the ring: no receive is armed meanwhile. The pages read as zeros
    /// after, and are faulted in again when the kernel writes them.
    pub(super) fn release(&mut self, pickable: usize) {
        self.taken = 0;
        let count = usize::from(self.count);
        let mut keep = vec![false; count];
        let head = self.tail.wrapping_sub(self.count);
        for k in 0..pickable.min(count) {
            let pos = usize::from(head.wrapping_add(k as u16) & (self.count - 1));
            keep[usize::from(self.order[pos])] = true;
        }
        let mut bid = 0;
        while bid < count {
            if keep[bid] {
                bid += 1;
                continue;
            }
            let from = bid;
            while bid < count && !keep[bid] {
                bid += 1;
            }
            // SAFETY: whole buffers of the private anonymous mapping, which none of the
            // receives in flight can take (above); no reference to them is held.
            unsafe {
                libc::madvise(
                    self.bufs.add(from * self.size).cast(),
                    (bid - from) * self.size,
                    libc::MADV_DONTNEED,
                )
            };
        }
    }

    fn push(&mut self, bid: u16) {
        let i = usize::from(self.tail & (self.count - 1));
        self.order[i] = bid;
        let addr = self.bufs as u64 + (usize::from(bid) * self.size) as u64;
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
            // The kernel may still write into the buffers: never unmapped.
            return;
        }
        // SAFETY: the mappings made in `new`, no longer registered: no one else uses them.
        unsafe {
            libc::munmap(self.ring.cast(), self.ring_bytes);
            libc::munmap(self.bufs.cast(), self.bytes());
        }
    }
}

/// `len` bytes of an anonymous private mapping (page-aligned, zero, not yet resident).
fn map(len: usize) -> std::io::Result<*mut libc::c_void> {
    // SAFETY: an anonymous private mapping: no file, no address hint; the result is checked.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    Ok(p)
}
