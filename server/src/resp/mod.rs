//! RESP, the Redis protocol, and nothing above it: [`parse`] reads commands (a pure function
//! over a byte buffer), [`encode`] writes replies in RESP2 or RESP3. The commands are
//! [`crate::cmd`]'s; a connection, its state machine and its drivers, [`crate::conn`]'s.

pub mod encode;
pub mod parse;

pub use encode::{Out, Proto};
pub use parse::{parse_command, Bounds, Parsed, ProtocolError};
