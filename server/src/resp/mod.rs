//! RESP, the Redis protocol: [`parse`] reads commands (a pure function over a byte buffer),
//! [`encode`] writes replies in RESP2 or RESP3.

pub mod encode;
pub mod parse;

pub use encode::{Out, Proto};
pub use parse::{parse_command, Bounds, Parsed, ProtocolError};
