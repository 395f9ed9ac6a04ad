//! The descriptors the process may open: the soft `RLIMIT_NOFILE` raised to the hard one at
//! start (as nginx's `worker_rlimit_nofile` and Redis's `maxclients` do), so that the
//! connections' bounds, not a distribution's default of 1 024, decide.

/// The soft limit before, and after raising it to the hard one (the same when it cannot be
/// raised); `None` where there is no such limit to read.
pub(crate) fn raise_nofile() -> Option<(u64, u64)> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid, writable rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return None;
    }
    let before: u64 = lim.rlim_cur;
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: `raised` is a valid rlimit; raising the soft limit up to the hard one needs
        // no privilege.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            return Some((before, raised.rlim_cur));
        }
    }
    Some((before, before))
}
