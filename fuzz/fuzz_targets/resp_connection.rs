//! One RESP connection (the sans-IO state machine of `turnstile serve`) fed arbitrary bytes,
//! with or without a password, in reads of any size, by a client that reads its replies or
//! never does: never a panic, and the connection's bounds hold after every step (the input
//! buffer within the largest frame, the output waiting for the client within the output limit
//! and one reply), and a client that reads its replies is answered as one that sends and reads
//! everything at once (when no answer depends on the time). See
//! `turnstile_server::fuzz_connection`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    turnstile_server::fuzz_connection(data);
});
