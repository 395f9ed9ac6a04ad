//! The RESP request parser over arbitrary bytes, with small bounds so that the limits are
//! reached (an inline argument fits a bulk string: max_bulk ≥ max_inline): never a panic, never a range outside the buffer; a command parsed from a prefix
//! parses the same with more bytes after it; re-encoding a command as an array parses back to
//! the same arguments.
#![no_main]

use libfuzzer_sys::fuzz_target;
use turnstile_server::resp::{parse_command, Bounds, Parsed};

fuzz_target!(|data: &[u8]| {
    // The first byte picks the bounds: small ones, or those of a client that has not
    // authenticated (whose errors are worded for that case).
    let Some((&pick, data)) = data.split_first() else {
        return;
    };
    let bounds = if pick & 1 == 0 {
        Bounds {
            max_args: 8,
            max_bulk: 128,
            max_inline: 128,
            unauthenticated: false,
        }
    } else {
        Bounds::UNAUTHENTICATED
    };
    let mut args = Vec::new();
    let mut at = 0;
    while at < data.len() {
        let buf = &data[at..];
        match parse_command(buf, &bounds, &mut args) {
            Ok(Parsed::Incomplete) => break,
            Err(e) => {
                // Errors are worded for the bounds they broke.
                use turnstile_server::resp::ProtocolError as P;
                let unauth = matches!(
                    e,
                    P::UnauthenticatedBulkLength | P::UnauthenticatedMultibulkLength
                );
                assert!(!unauth || bounds.unauthenticated);
                break;
            }
            Ok(Parsed::Command { consumed }) => {
                assert!(consumed > 0 && consumed <= buf.len());
                assert!(consumed <= bounds.max_frame());
                let parts: Vec<&[u8]> = args.iter().map(|r| &buf[r.clone()]).collect();
                assert!(args.iter().all(|r| r.start <= r.end && r.end <= consumed));
                // The same command, with the rest of the buffer cut off, parses the same.
                let mut again = Vec::new();
                assert_eq!(
                    parse_command(&buf[..consumed], &bounds, &mut again),
                    Ok(Parsed::Command { consumed })
                );
                assert_eq!(again, args);
                // Re-encoded as an array, it parses back to its arguments.
                if !parts.is_empty() {
                    let mut enc = format!("*{}\r\n", parts.len()).into_bytes();
                    for p in &parts {
                        enc.extend_from_slice(format!("${}\r\n", p.len()).as_bytes());
                        enc.extend_from_slice(p);
                        enc.extend_from_slice(b"\r\n");
                    }
                    let mut back = Vec::new();
                    assert_eq!(
                        parse_command(&enc, &bounds, &mut back),
                        Ok(Parsed::Command { consumed: enc.len() })
                    );
                    let got: Vec<&[u8]> = back.iter().map(|r| &enc[r.clone()]).collect();
                    assert_eq!(got, parts);
                }
                at += consumed;
            }
        }
    }
});
