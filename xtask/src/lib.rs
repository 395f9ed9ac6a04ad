//! The README's Rust examples as doctests: `cargo test --release -p xtask --doc` compiles each
//! `rust` block of README.md and runs it (a `no_run` block, a server that serves until stopped,
//! is compiled only). They live here, not in the core, because the README also shows the tower
//! layer: this crate's dev-dependencies have both.
//!
//! The binary (`src/main.rs`) is `cargo xtask`; it uses none of the dev-dependencies, so it
//! still builds in seconds on a fresh machine.

#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct Readme;
