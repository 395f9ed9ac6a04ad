//! The binary's allocator: mimalloc, and, for `serve`, the pages of large freed blocks given
//! back to the system when a worker goes idle.
//!
//! An allocator returns memory to the system a whole page of its own at a time (mimalloc: 64 KiB
//! to 4 MiB), once every block in it is free. A block freed among live ones stays resident:
//! after a burst of connections, the pages their buffers shared with the buffers of the clients
//! that stayed kept every byte the burst had touched (measured by `turnstile soak`: about
//! 1 MiB of 16–256 KiB blocks after the default attack, a third of what the server kept).
//!
//! So in `serve` a freed block of [`MIN`] bytes or more waits in a bounded queue
//! ([`WAITING_MAX`] blocks, [`WAITING_MAX_BYTES`]; past either it goes straight back to
//! mimalloc, its pages kept), and an idle worker ([`give_back_waiting`], through
//! `turnstile_server::trim`, at most once a second per thread) drops the whole system pages
//! inside each (`MADV_DONTNEED`: the next touch maps a zeroed page) and then frees it. The
//! block's first page is kept: the allocator writes its free-list link there.
//!
//! Why at idle and not as the block is freed: dropping the pages at once was measured too (the
//! abuse soak of docs/service.md, three interleaved runs of each): RSS a minute after the attack
//! as low (+8.0 to +8.7 % of idle against +8.3 to +9.1 % here, +13 % with neither), but every
//! buffer a new connection took was a fresh page to fault in, in the middle of a worker's turn:
//! page faults were a fifth of the server's time under attack and the honest clients'
//! CL.THROTTLE p99 *during* the attack 5.9-6.4 ms, against 3.9-4.4 here (as with neither). The
//! cost here: up to [`WAITING_MAX_BYTES`] of freed memory held until a worker is idle (peak RSS
//! 138-151 MiB against 132-136 with neither).
//!
//! No crate does this: allocators keep a freed block's pages for the next allocation, which is
//! what a hot path wants and what a server that must shrink back after an attack does not.

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::OnceLock;

use crossbeam_queue::ArrayQueue;

use mimalloc::MiMalloc;

/// The least block whose pages are given back: three whole pages at least.
pub const MIN: usize = 16 * 1024;

/// mimalloc, giving back the pages of large freed blocks once [`give_back_freed_pages`] is
/// called.
pub struct Alloc;

static GIVE_BACK: AtomicBool = AtomicBool::new(false);
static PAGE: AtomicUsize = AtomicUsize::new(0);
static WAITING: OnceLock<Waiting> = OnceLock::new();

/// At most this many freed blocks wait to be given back.
pub const WAITING_MAX: usize = 1024;
/// At most this many bytes of freed blocks wait to be given back; past it a freed block goes
/// straight back to the allocator, its pages kept.
pub const WAITING_MAX_BYTES: usize = 16 << 20;

/// From now on, the pages inside each freed block of [`MIN`] bytes or more go back to the
/// system when a worker is idle.
pub fn give_back_freed_pages() {
    // SAFETY: sysconf reads a constant of the system.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if let Ok(page) = usize::try_from(page) {
        if page.is_power_of_two() && page <= MIN / 2 {
            // Allocated here, before the flag is set: never from inside the allocator.
            WAITING.get_or_init(|| Waiting::new(WAITING_MAX, WAITING_MAX_BYTES));
            PAGE.store(page, Ordering::Relaxed);
            GIVE_BACK.store(true, Ordering::Relaxed);
        }
    }
}

/// Gives the pages of the freed blocks that wait back to the system, then the blocks to the
/// allocator. `serve`'s idle workers call it (`turnstile_server::trim`): never on the path of
/// a request, so that a connection's next buffer is not a fresh page to fault in while other
/// clients wait.
pub fn give_back_waiting() {
    if let Some(w) = WAITING.get() {
        w.give_back(PAGE.load(Ordering::Relaxed));
    }
}

/// The whole pages of `[p + 1, p + size)`: all of the block's pages but the one its first byte
/// is on.
fn inner_pages(p: usize, size: usize, page: usize) -> Option<(usize, usize)> {
    let start = (p | (page - 1)).checked_add(1)?;
    let end = p.checked_add(size)? & !(page - 1);
    (end > start).then(|| (start, end - start))
}

/// Freed blocks (address and layout) that wait to be given back, bounded in count and bytes.
struct Waiting {
    blocks: ArrayQueue<(usize, Layout)>,
    bytes: AtomicUsize,
    max_bytes: usize,
}

impl Waiting {
    fn new(max: usize, max_bytes: usize) -> Self {
        Waiting {
            blocks: ArrayQueue::new(max),
            bytes: AtomicUsize::new(0),
            max_bytes,
        }
    }

    /// Keeps the freed block if there is room; `false`: the caller frees it now.
    fn keep(&self, p: *mut u8, l: Layout) -> bool {
        // Relaxed: a bound on the bytes waiting, which orders nothing; the queue orders the
        // blocks. Never past the bound, even for a moment.
        let room = self
            .bytes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
                b.checked_add(l.size()).filter(|&n| n <= self.max_bytes)
            });
        if room.is_err() {
            return false;
        }
        if self.blocks.push((p as usize, l)).is_err() {
            self.bytes.fetch_sub(l.size(), Ordering::Relaxed);
            return false;
        }
        true
    }

    /// Gives back the blocks that were waiting when it started (those freed meanwhile wait for
    /// the next call).
    fn give_back(&self, page: usize) {
        for _ in 0..self.blocks.len() {
            let Some((p, l)) = self.blocks.pop() else {
                break;
            };
            if let Some((start, len)) = inner_pages(p, l.size(), page) {
                // SAFETY: the range lies inside a freed block that only this queue held;
                // nothing reads what it held, and the next touch of each page maps a zeroed
                // one. A failure leaves the pages as they were: only a missed saving.
                unsafe { libc::madvise(start as *mut libc::c_void, len, libc::MADV_DONTNEED) };
            }
            self.bytes.fetch_sub(l.size(), Ordering::Relaxed);
            // SAFETY: `p` was allocated by mimalloc with layout `l` and freed by its owner,
            // who handed it to the queue instead; it is freed once, here.
            unsafe { MiMalloc.dealloc(p as *mut u8, l) };
        }
    }
}

/// Keeps a freed block to give back later if giving back is on and the block is large enough;
/// `false`: the caller frees it now.
fn wait(p: *mut u8, l: Layout) -> bool {
    // Relaxed: a flag set once before the server starts, ordering nothing else.
    if l.size() < MIN || !GIVE_BACK.load(Ordering::Relaxed) {
        return false;
    }
    WAITING.get().is_some_and(|w| w.keep(p, l))
}

// SAFETY: every call is passed to mimalloc with the caller's own arguments; a freed block kept
// to give back is freed later, once, with its layout, and nothing else touches it meanwhile.
unsafe impl GlobalAlloc for Alloc {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        unsafe { MiMalloc.alloc(l) }
    }

    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        unsafe { MiMalloc.alloc_zeroed(l) }
    }

    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        if !wait(p, l) {
            // SAFETY: the caller's contract, passed on.
            unsafe { MiMalloc.dealloc(p, l) }
        }
    }

    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        // mimalloc keeps a block that shrinks to half its size or more where it is; otherwise
        // it moves it and frees the old one itself, past `give_back`. So a large block that
        // would move is moved here, and freed through `dealloc`.
        let in_place = new <= l.size() && new >= l.size() / 2;
        if in_place || l.size() < MIN || !GIVE_BACK.load(Ordering::Relaxed) {
            // SAFETY: the caller's contract, passed on.
            return unsafe { MiMalloc.realloc(p, l, new) };
        }
        // SAFETY: `realloc`'s contract: `new` rounded up to `l.align()` does not overflow.
        let nl = unsafe { Layout::from_size_align_unchecked(new, l.align()) };
        // SAFETY: `new` is not zero (the caller's contract); `p` holds `l.size()` bytes and the
        // new block `new`, and they do not overlap; `p` is freed once, with its layout.
        unsafe {
            let q = MiMalloc.alloc(nl);
            if !q.is_null() {
                std::ptr::copy_nonoverlapping(p, q, l.size().min(new));
                self.dealloc(p, l);
            }
            q
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inner_pages_keep_the_first_page_and_whole_pages_only() {
        let pg = 4096;
        // Page-aligned 16 KiB: the three pages after the first.
        assert_eq!(inner_pages(0x10000, 16384, pg), Some((0x11000, 3 * pg)));
        // Unaligned: from the next boundary to the last whole one.
        assert_eq!(inner_pages(0x10010, 16384, pg), Some((0x11000, 3 * pg)));
        assert_eq!(
            inner_pages(0x10010, 16384 + 0x10 + 5, pg),
            Some((0x11000, 3 * pg))
        );
        // Within two pages: nothing whole after the first.
        assert_eq!(inner_pages(0x10ff0, 4096, pg), None);
        assert_eq!(inner_pages(0x10000, 4096, pg), None);
        assert_eq!(inner_pages(usize::MAX - 10, 5, pg), None);
    }

    #[test]
    fn the_blocks_given_back_read_as_new_memory_and_the_heap_stays_whole() {
        let w = Waiting::new(8, 1 << 20);
        let l = Layout::from_size_align(64 * 1024, 8).unwrap();
        for round in 0..64u8 {
            // SAFETY: a layout of non-zero size; each block is written only within its size
            // and freed once with its layout (by `give_back` when kept).
            unsafe {
                let a = MiMalloc.alloc(l);
                std::ptr::write_bytes(a, round, l.size());
                let b = MiMalloc.alloc(l);
                std::ptr::write_bytes(b, !round, l.size());
                assert!(w.keep(a, l));
                if round % 4 == 0 {
                    w.give_back(4096);
                    assert_eq!(w.bytes.load(Ordering::Relaxed), 0);
                    assert!(w.blocks.is_empty());
                }
                let c = MiMalloc.alloc(l);
                std::ptr::write_bytes(c, round, l.size());
                assert!(std::slice::from_raw_parts(b, l.size())
                    .iter()
                    .all(|&x| x == !round));
                assert!(std::slice::from_raw_parts(c, l.size())
                    .iter()
                    .all(|&x| x == round));
                MiMalloc.dealloc(b, l);
                MiMalloc.dealloc(c, l);
            }
        }
        w.give_back(4096);
        assert_eq!(w.bytes.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn what_waits_is_bounded_in_bytes_and_count() {
        let w = Waiting::new(4, 5 * 64 * 1024);
        let l = Layout::from_size_align(64 * 1024, 8).unwrap();
        // SAFETY: a layout of non-zero size; each block freed once, by `give_back` when kept
        // and here when not.
        unsafe {
            let kept: Vec<bool> = (0..6)
                .map(|_| {
                    let p = MiMalloc.alloc(l);
                    let k = w.keep(p, l);
                    if !k {
                        MiMalloc.dealloc(p, l);
                    }
                    k
                })
                .collect();
            // Four fit the count (five would fit the bytes).
            assert_eq!(kept, [true, true, true, true, false, false]);
            assert_eq!(w.bytes.load(Ordering::Relaxed), 4 * 64 * 1024);
            let big = Layout::from_size_align(2 * 64 * 1024, 8).unwrap();
            w.give_back(4096);
            let p = MiMalloc.alloc(big);
            let q = MiMalloc.alloc(big);
            let r = MiMalloc.alloc(big);
            assert!(w.keep(p, big) && w.keep(q, big));
            // A third would pass the bytes.
            assert!(!w.keep(r, big));
            MiMalloc.dealloc(r, big);
            assert_eq!(w.bytes.load(Ordering::Relaxed), 4 * 64 * 1024);
            w.give_back(4096);
        }
        assert_eq!(w.bytes.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn realloc_moves_and_keeps_the_bytes() {
        give_back_freed_pages();
        let l = Layout::from_size_align(64 * 1024, 8).unwrap();
        // SAFETY: layouts of non-zero size; each block written within its size, freed once.
        unsafe {
            let a = Alloc.alloc(l);
            std::ptr::write_bytes(a, 7, l.size());
            // Shrunk past half: moved by `Alloc`, the old block kept to give back.
            let b = Alloc.realloc(a, l, 8 * 1024);
            assert!(std::slice::from_raw_parts(b, 8 * 1024)
                .iter()
                .all(|&x| x == 7));
            let l8 = Layout::from_size_align(8 * 1024, 8).unwrap();
            let c = Alloc.realloc(b, l8, 256 * 1024);
            assert!(std::slice::from_raw_parts(c, 8 * 1024)
                .iter()
                .all(|&x| x == 7));
            Alloc.dealloc(c, Layout::from_size_align(256 * 1024, 8).unwrap());
        }
        give_back_waiting();
    }
}
