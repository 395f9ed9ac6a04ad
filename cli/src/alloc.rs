//! The binary's allocator: mimalloc, and, for `serve`, the pages of a large freed block given
//! back to the system as it is freed.
//!
//! An allocator returns memory to the system a whole page of its own at a time (mimalloc: 64 KiB
//! to 4 MiB), once every block in it is free. A block freed among live ones stays resident:
//! after a burst of connections, the pages their buffers shared with the buffers of the clients
//! that stayed kept every byte the burst had touched (measured by `turnstile soak`: about
//! 1 MiB of 16–256 KiB blocks after the default attack, a third of what the server kept). So
//! `serve` drops the whole system pages inside each freed block of [`MIN`] bytes or more
//! (`MADV_DONTNEED`: the next touch maps a zeroed page) before the block goes back to the
//! allocator. The block's first page is kept: the allocator writes its free-list link there.
//!
//! The cost is one `madvise` per freed block of at least [`MIN`] bytes (a connection's buffers
//! when it closes or after a frame that long, never a request of an open connection) and a
//! fault on each of its pages when the block is used again. Measured by the abuse soak of
//! docs/service.md (`--seconds 40 --settle 60`, two runs, and three shorter interleaved ones):
//! RSS a minute after the attack +8.4 % of idle instead of +13 %, peak 94 MiB instead of
//! 132-136; the honest clients' CL.THROTTLE p99 *during* the attack 5.7-6.4 ms instead of
//! 3.7-4.5 (about a thousand `madvise` a second among 1 000 hostile connections, and the faults
//! after them). Deferring the give-back to idle workers through a bounded queue (16 MiB) kept
//! that p99 but caught only part of what the attackers' connections free as they all close:
//! +9.6 % and +10.7 % a minute after, peak 144-154 MiB.
//!
//! No crate does this: allocators keep a freed block's pages for the next allocation, which is
//! what a hot path wants and what a server that must shrink back after an attack does not.

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use mimalloc::MiMalloc;

/// The least block whose pages are given back: three whole pages at least.
pub const MIN: usize = 16 * 1024;

/// mimalloc, giving back the pages of large freed blocks once [`give_back_freed_pages`] is
/// called.
pub struct Alloc;

static GIVE_BACK: AtomicBool = AtomicBool::new(false);
static PAGE: AtomicUsize = AtomicUsize::new(0);

/// From now on, the pages inside each freed block of [`MIN`] bytes or more go back to the
/// system.
pub fn give_back_freed_pages() {
    // SAFETY: sysconf reads a constant of the system.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if let Ok(page) = usize::try_from(page) {
        if page.is_power_of_two() && page <= MIN / 2 {
            PAGE.store(page, Ordering::Relaxed);
            GIVE_BACK.store(true, Ordering::Relaxed);
        }
    }
}

/// The whole pages of `[p + 1, p + size)`: all of the block's pages but the one its first byte
/// is on.
fn inner_pages(p: usize, size: usize, page: usize) -> Option<(usize, usize)> {
    let start = (p | (page - 1)).checked_add(1)?;
    let end = p.checked_add(size)? & !(page - 1);
    (end > start).then(|| (start, end - start))
}

/// Drops the pages inside the block, if giving back is on and the block is large enough.
fn give_back(p: *mut u8, size: usize) {
    // Relaxed: a flag set once before the server starts, ordering nothing else.
    if size < MIN || !GIVE_BACK.load(Ordering::Relaxed) {
        return;
    }
    let page = PAGE.load(Ordering::Relaxed);
    if let Some((start, len)) = inner_pages(p as usize, size, page) {
        // SAFETY: the range lies inside a block the caller owns and is about to free; nothing
        // reads what it held, and the next touch of each page maps a zeroed one. A failure
        // leaves the pages as they were, which is only a missed saving.
        unsafe { libc::madvise(start as *mut libc::c_void, len, libc::MADV_DONTNEED) };
    }
}

// SAFETY: every call is passed to mimalloc with the caller's own arguments; `give_back` touches
// only the pages of a block being freed, before mimalloc takes it back.
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
        give_back(p, l.size());
        // SAFETY: the caller's contract, passed on.
        unsafe { MiMalloc.dealloc(p, l) }
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

/// Has the child `cmd` starts hold its memory in 4 KiB pages: mimalloc asks for no huge pages,
/// and the kernel gives the child none even where transparent huge pages are on for every
/// mapping (the flag survives exec). What a measurement of resident bytes per key wants.
pub fn without_huge_pages(cmd: &mut std::process::Command) {
    cmd.env("MIMALLOC_ALLOW_THP", "0");
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: the hook runs in the forked child before exec and only makes one system
        // call (prctl is async-signal-safe); it touches no memory of ours.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
                Ok(())
            });
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

    /// Which pages of `[start, start + len)` are resident (`mincore` reads the page tables only).
    fn resident(start: usize, len: usize) -> Vec<bool> {
        let mut v = vec![0u8; len / 4096];
        // SAFETY: `start` is page-aligned and `v` has a byte per page of the range; mincore
        // writes only `v`.
        let r = unsafe { libc::mincore(start as *mut libc::c_void, len, v.as_mut_ptr()) };
        assert_eq!(r, 0, "mincore: {}", std::io::Error::last_os_error());
        v.into_iter().map(|b| b & 1 == 1).collect()
    }

    #[test]
    fn a_freed_block_leaves_no_inner_page_resident() {
        give_back_freed_pages();
        let l = Layout::from_size_align(64 * 1024, 4096).unwrap();
        // SAFETY: a layout of non-zero size; the block is written within it and freed once.
        unsafe {
            let p = Alloc.alloc(l);
            std::ptr::write_bytes(p, 1, l.size());
            let (start, len) = inner_pages(p as usize, l.size(), 4096).unwrap();
            assert_eq!(len, 15 * 4096);
            assert!(resident(start, len).iter().all(|&r| r));
            Alloc.dealloc(p, l);
            // The allocator's own page stays mapped: asking about it touches nothing.
            assert!(resident(start, len).iter().all(|&r| !r));
        }
    }

    #[test]
    fn a_freed_block_reads_back_as_new_memory_and_the_heap_stays_whole() {
        give_back_freed_pages();
        let l = Layout::from_size_align(64 * 1024, 8).unwrap();
        for round in 0..64u8 {
            // SAFETY: a layout of non-zero size; each block is written only within its size and
            // freed once with its layout.
            unsafe {
                let a = Alloc.alloc(l);
                assert!(!a.is_null());
                std::ptr::write_bytes(a, round, l.size());
                let b = Alloc.alloc(l);
                std::ptr::write_bytes(b, !round, l.size());
                Alloc.dealloc(a, l);
                let c = Alloc.alloc(l);
                std::ptr::write_bytes(c, round, l.size());
                assert!(std::slice::from_raw_parts(b, l.size())
                    .iter()
                    .all(|&x| x == !round));
                assert!(std::slice::from_raw_parts(c, l.size())
                    .iter()
                    .all(|&x| x == round));
                // Moved by a shrink past half: the bytes kept, the old block given back.
                let d = Alloc.realloc(b, l, 8 * 1024);
                assert!(std::slice::from_raw_parts(d, 8 * 1024)
                    .iter()
                    .all(|&x| x == !round));
                // Grown: moved, the bytes kept.
                let e = Alloc.realloc(c, l, 128 * 1024);
                assert!(std::slice::from_raw_parts(e, l.size())
                    .iter()
                    .all(|&x| x == round));
                Alloc.dealloc(d, Layout::from_size_align(8 * 1024, 8).unwrap());
                Alloc.dealloc(e, Layout::from_size_align(128 * 1024, 8).unwrap());
            }
        }
    }
}
