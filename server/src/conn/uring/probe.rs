//! What the kernel's io_uring can do here: whether it can serve at all ([`available`]), and
//! whether it ends a multishot receive at a limit ([`multishot_limit`]).

use super::bufring::BufRing;
use super::conn;
use super::{completions, token, Op, CANCEL_WAIT, TICK};
use io_uring::{cqueue, opcode, types, IoUring};
use std::io;
use std::os::fd::AsRawFd;
use std::time::Instant;

/// Why io_uring cannot serve here, or `Ok` if it can: `TURNSTILE_IO_URING=off` in the
/// environment, or a kernel (or a seccomp profile) that refuses a ring, the extended wait, a
/// ring of provided buffers (Linux 5.19) or multishot accept.
///
/// The probe runs on a thread of its own: a ring's teardown interrupts the system calls of
/// every thread that used it (a task-work "signal"), and a blocking read with a timeout on the
/// caller's thread would fail with `EINTR`.
pub(crate) fn available() -> Result<(), String> {
    match std::env::var("TURNSTILE_IO_URING") {
        Ok(v) if v.eq_ignore_ascii_case("off") => {
            return Err("turned off by TURNSTILE_IO_URING=off".into());
        }
        Ok(v) if !["on", "oneshot"].iter().any(|k| v.eq_ignore_ascii_case(k)) => {
            tracing::warn!(
                "TURNSTILE_IO_URING={v:?} is ignored: write off (RESP on tokio), oneshot (one receive armed at a time) or on"
            );
        }
        _ => {}
    }
    std::thread::Builder::new()
        .name("turnstile-probe".into())
        .spawn(probe)
        .map_err(|e| format!("probe thread: {e}"))?
        .join()
        .unwrap_or_else(|_| Err("the io_uring probe panicked".into()))
}

fn probe() -> Result<(), String> {
    let ring = IoUring::new(8).map_err(|e| format!("io_uring_setup: {e}"))?;
    if !ring.params().is_feature_ext_arg() {
        return Err("the kernel's io_uring has no timed wait (Linux 5.11)".into());
    }
    let mut probe = io_uring::Probe::new();
    ring.submitter()
        .register_probe(&mut probe)
        .map_err(|e| format!("io_uring probe: {e}"))?;
    for (code, name) in [
        (opcode::AcceptMulti::CODE, "accept"),
        (opcode::Recv::CODE, "recv"),
        (opcode::Send::CODE, "send"),
        (opcode::AsyncCancel2::CODE, "cancel"),
    ] {
        if !probe.is_supported(code) {
            return Err(format!("the kernel's io_uring has no {name}"));
        }
    }
    BufRing::new(&ring.submitter(), 2, 64, 0)
        .map(|mut b| {
            b.unregister(&ring.submitter());
        })
        .map_err(|e| format!("io_uring provided buffers (Linux 5.19): {e}"))
}

/// Whether the kernel ends a multishot receive at the limit [`conn::limited`] sets (Linux
/// 6.17), asked of a worker's own ring before it serves: eight bytes wait on a socket pair,
/// and a receive limited to four must end (no `MORE`) having read them. An older kernel
/// refuses the field (`EINVAL`); one that ignored it would leave the receive armed, which is
/// then cancelled. Without it, each receive is armed once.
pub(super) fn multishot_limit(ring: &mut IoUring, bufs: &mut BufRing) -> bool {
    const PROBE: u64 = u64::MAX;
    let Ok((a, mut b)) = std::os::unix::net::UnixStream::pair() else {
        return false;
    };
    if io::Write::write_all(&mut b, &[0; 8]).is_err() {
        return false;
    }
    let fd = types::Fd(a.as_raw_fd());
    let e = conn::limited(opcode::RecvMulti::new(fd, bufs.group()).build(), 4);
    let mut entries = vec![e.user_data(PROBE)];
    let (mut ended, mut kept) = (false, None);
    let deadline = Instant::now() + CANCEL_WAIT;
    while !ended && Instant::now() < deadline {
        for e in entries.drain(..) {
            // SAFETY: the probe's receive names no buffer of ours but the provided ones,
            // which live as long as the worker; `a` outlives the loop, which ends only
            // with the receive's last completion (or leaks `a` below).
            if unsafe { ring.submission().push(&e) }.is_err() {
                return false;
            }
        }
        let ts = types::Timespec::new().nsec(TICK.as_nanos() as u32);
        let args = types::SubmitArgs::new().timespec(&ts);
        let _ = ring.submitter().submit_with_args(1, &args);
        for (t, res, flags) in completions(ring) {
            if t != PROBE {
                continue;
            }
            if let Some(bid) = cqueue::buffer_select(flags) {
                bufs.recycle(bid);
            }
            if cqueue::more(flags) {
                // The limit was not kept: the receive stays armed until cancelled.
                kept = Some(false);
                let cancel = opcode::AsyncCancel2::new(types::CancelBuilder::user_data(PROBE))
                    .build()
                    .user_data(token(Op::Cancel, 0, 0));
                entries.push(cancel);
            } else {
                ended = true;
                kept.get_or_insert(res > 0);
            }
        }
    }
    if !ended {
        // The kernel may still receive into `a`'s buffers: keep the socket open.
        std::mem::forget(a);
        return false;
    }
    kept == Some(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel's version, `(major, minor)`, from uname(2).
    fn kernel() -> (u32, u32) {
        // SAFETY: uname(2) fills the zeroed struct it is given.
        let mut u: libc::utsname = unsafe { std::mem::zeroed() };
        assert_eq!(unsafe { libc::uname(&mut u) }, 0);
        // SAFETY: `release` is NUL-terminated by uname(2).
        let release = unsafe { std::ffi::CStr::from_ptr(u.release.as_ptr()) };
        let mut parts = release.to_str().unwrap().split(['.', '-']);
        let mut next = || parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
        (next(), next())
    }

    /// The probe finds the multishot limit on a kernel that has it (6.17 or later), and not on
    /// one before 6.0; either way the ring is left with nothing armed.
    #[test]
    fn the_multishot_limit_is_found_where_the_kernel_has_it() {
        let Ok(mut ring) = IoUring::new(8) else {
            eprintln!("no io_uring here: nothing to probe");
            return;
        };
        let Ok(mut bufs) = BufRing::new(&ring.submitter(), 2, 64, 0) else {
            eprintln!("no provided buffers here: nothing to probe");
            return;
        };
        let found = multishot_limit(&mut ring, &mut bufs);
        let version = kernel();
        if version >= (6, 17) {
            assert!(found, "kernel {version:?} has the multishot limit");
        }
        if version < (6, 0) {
            assert!(!found, "kernel {version:?}");
        }
        // A second probe on the same ring answers the same: the first left nothing behind.
        assert_eq!(multishot_limit(&mut ring, &mut bufs), found);
        bufs.unregister(&ring.submitter());
    }
}
