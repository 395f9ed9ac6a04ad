//! Zeroed allocations that the store's tables and arenas are made of: allocated at once,
//! untouched (the pages are first touched by the thread that owns the shard), and `None`
//! rather than an abort when the memory is not there (the builder reports it).

use crate::sync::{AtomicU32, AtomicU64};

/// Allocates `n` zeroed `T` without touching the pages (first touch by the user); `None` if
/// the allocation fails (the builder turns that into a `ConfigError`).
///
/// # Safety
///
/// The all-zero bit pattern must be a valid `T`.
#[cfg(not(loom))]
pub(crate) unsafe fn alloc_zeroed<T>(n: usize) -> Option<Box<[T]>> {
    let layout = std::alloc::Layout::array::<T>(n).ok()?;
    if layout.size() == 0 {
        // Only `n == 0` here (the element types are not zero-sized).
        return (n == 0).then(|| Vec::new().into_boxed_slice());
    }
    // SAFETY: the layout has non-zero size; all-zero bits are a valid T (the caller's
    // contract); the pointer is checked for null; the Box takes ownership with the same layout
    // (Layout::array of the element type) that Box<[T]> deallocates with.
    unsafe {
        let p = std::alloc::alloc_zeroed(layout) as *mut T;
        if p.is_null() {
            return None;
        }
        Some(Box::from_raw(std::ptr::slice_from_raw_parts_mut(p, n)))
    }
}

/// `n` zeroed `AtomicU64`, untouched; `None` if the allocation fails.
pub(crate) fn zeroed_u64(n: usize) -> Option<Box<[AtomicU64]>> {
    // SAFETY: all-zero bits are a valid AtomicU64 (0).
    #[cfg(not(loom))]
    return unsafe { alloc_zeroed(n) };
    #[cfg(loom)]
    Some((0..n).map(|_| AtomicU64::new(0)).collect())
}

/// `n` zeroed `AtomicU32`, untouched; `None` if the allocation fails.
pub(crate) fn zeroed_u32(n: usize) -> Option<Box<[AtomicU32]>> {
    // SAFETY: all-zero bits are a valid AtomicU32 (0).
    #[cfg(not(loom))]
    return unsafe { alloc_zeroed(n) };
    #[cfg(loom)]
    Some((0..n).map(|_| AtomicU32::new(0)).collect())
}

/// `n` zeroed `AtomicU128`, untouched; `None` if the allocation fails.
#[cfg(feature = "rules")]
pub(crate) fn zeroed_u128(n: usize) -> Option<Box<[crate::sync::AtomicU128]>> {
    // SAFETY: all-zero bits are a valid AtomicU128 (portable-atomic's is a plain u128 in an
    // UnsafeCell: 0).
    #[cfg(not(loom))]
    return unsafe { alloc_zeroed(n) };
    #[cfg(loom)]
    Some((0..n).map(|_| crate::sync::AtomicU128::new(0)).collect())
}
