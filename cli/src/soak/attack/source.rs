//! The attackers' source addresses: each kind connects from a loopback address of its own
//! (127.0.1.N for an IPv4 target), never from the honest clients' (the address the system
//! picks, 127.0.0.1). A server that slows wrong passwords per source address then holds the
//! guessers alone, as it would hold a remote attacker, and not the honest clients nor the
//! attackers that give the right password. An IPv6 target (`::1`, the only IPv6 loopback
//! address) or a system without those addresses: the system's choice, shared with everyone.

use super::Kind;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use tokio::net::{TcpSocket, TcpStream};

/// The address the attackers of `kind` connect to `to` from (`None`: the system's choice).
pub(super) fn of(kind: Kind, to: SocketAddr) -> Option<IpAddr> {
    let IpAddr::V4(ip) = to.ip() else {
        return None;
    };
    if !ip.is_loopback() {
        return None;
    }
    let i = Kind::MIX.iter().position(|(k, _)| *k == kind)? as u8;
    let from = Ipv4Addr::new(127, 0, 1, i + 1);
    (from != ip).then_some(IpAddr::V4(from))
}

/// A connection to `to` from `from` (its port the system's), or from the system's choice of
/// address when `from` is `None` or cannot be bound.
pub(super) async fn connect(to: SocketAddr, from: Option<IpAddr>) -> std::io::Result<TcpStream> {
    if let Some(from) = from {
        if let Ok(s) = bound(from) {
            return s.connect(to).await;
        }
    }
    TcpStream::connect(to).await
}

/// A socket bound to `from`, its port left to `connect` (so that every source address has the
/// whole ephemeral range for each destination).
fn bound(from: IpAddr) -> std::io::Result<TcpSocket> {
    let s = match from {
        IpAddr::V4(_) => TcpSocket::new_v4()?,
        IpAddr::V6(_) => TcpSocket::new_v6()?,
    };
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let one: libc::c_int = 1;
        // SAFETY: setsockopt(2) on a socket this function owns, reading one c_int that lives
        // across the call; its size is the one given.
        unsafe {
            libc::setsockopt(
                s.as_raw_fd(),
                libc::IPPROTO_IP,
                libc::IP_BIND_ADDRESS_NO_PORT,
                (&one as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
    }
    s.bind(SocketAddr::new(from, 0))?;
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_has_its_own_address_never_the_targets() {
        let to: SocketAddr = "127.0.0.1:6379".parse().unwrap();
        let all: Vec<_> = Kind::MIX.iter().map(|(k, _)| of(*k, to)).collect();
        assert!(all.iter().all(|a| a.is_some_and(|a| a.is_loopback())));
        let mut distinct = all.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), all.len());
        assert!(!all.contains(&Some(to.ip())));
        assert_eq!(of(Kind::Giant, "127.0.1.1:1".parse().unwrap()), None);
        assert_eq!(of(Kind::Giant, "[::1]:1".parse().unwrap()), None);
    }

    #[tokio::test]
    async fn a_connection_comes_from_its_kinds_address() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let to = l.local_addr().unwrap();
        let from = of(Kind::AuthGuess, to);
        let c = connect(to, from).await.unwrap();
        let (_, peer) = l.accept().await.unwrap();
        assert_eq!(Some(peer.ip()), from);
        assert_eq!(c.local_addr().unwrap().ip(), peer.ip());
    }
}
