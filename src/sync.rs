//! The one place that names the atomics.
//!
//! Every other module reaches atomics, `Arc`, spin hints and threads through this shim, so that
//! compiling with `RUSTFLAGS="--cfg loom"` swaps in loom's model-checked versions everywhere at
//! once (the pattern of tokio's `loom/mod.rs` and crossbeam's `primitive` module).
//!
//! 16-byte atomics: loom has no `AtomicU128`, so under `cfg(loom)` it is modelled by a loom
//! mutex around a `u128`. That is exactly the abstraction a hardware `cmpxchg16b` gives (one
//! indivisible load or compare-exchange of 16 bytes), so the protocols built on it are checked
//! as written. In normal builds it is `portable_atomic::AtomicU128`, which is lock-free on
//! x86-64 (runtime-detected `cmpxchg16b`); the `atomic` crate's `Atomic<u128>` is a spinlock
//! there and is never used.

#[cfg(not(loom))]
#[allow(unused_imports)]
pub(crate) use std::sync::atomic::{
    fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};
#[cfg(not(loom))]
#[allow(unused_imports)]
pub(crate) use std::sync::Arc;

#[cfg(loom)]
#[allow(unused_imports)]
pub(crate) use loom::sync::atomic::{
    fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};
#[cfg(loom)]
#[allow(unused_imports)]
pub(crate) use loom::sync::Arc;

/// Spin-loop hint, or a loom yield so that the model explores the other threads.
#[inline]
pub(crate) fn spin_hint() {
    #[cfg(not(loom))]
    std::hint::spin_loop();
    #[cfg(loom)]
    loom::thread::yield_now();
}

#[cfg(not(loom))]
pub(crate) use portable_atomic::AtomicU128;

#[cfg(loom)]
mod loom_u128 {
    use super::Ordering;

    /// Model of a lock-free 16-byte atomic for loom (see the module docs).
    #[derive(Debug)]
    pub(crate) struct AtomicU128(loom::sync::Mutex<u128>);

    impl AtomicU128 {
        pub(crate) fn new(v: u128) -> Self {
            Self(loom::sync::Mutex::new(v))
        }
        pub(crate) fn load(&self, _order: Ordering) -> u128 {
            *self.0.lock().unwrap()
        }
        pub(crate) fn store(&self, v: u128, _order: Ordering) {
            *self.0.lock().unwrap() = v;
        }
        pub(crate) fn compare_exchange(
            &self,
            current: u128,
            new: u128,
            _success: Ordering,
            _failure: Ordering,
        ) -> Result<u128, u128> {
            let mut g = self.0.lock().unwrap();
            if *g == current {
                *g = new;
                Ok(current)
            } else {
                Err(*g)
            }
        }
    }
}
#[cfg(loom)]
pub(crate) use loom_u128::AtomicU128;
