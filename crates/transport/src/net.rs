//! Opening TCP connections from a chosen local address: a daemon that listens on one address
//! of a host with several sends from that address too, so its traffic can be told apart
//! (firewall rules, the partition tests).

use std::io;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};

/// Resolves `addr` (`ip:port` or `host:port`) to its first socket address.
fn resolve(addr: &str) -> io::Result<SocketAddr> {
    addr.to_socket_addrs()?.next().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{addr} resolves to no address"),
        )
    })
}

/// Connects to `addr`, from `from` (any port) when given.
pub async fn connect(addr: &str, from: Option<IpAddr>) -> io::Result<tokio::net::TcpStream> {
    let Some(ip) = from else {
        return tokio::net::TcpStream::connect(addr).await;
    };
    let to = resolve(addr)?;
    let socket = match to {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.bind(SocketAddr::new(ip, 0))?;
    socket.connect(to).await
}

/// The address to send from for a daemon listening on `listen`: its IP unless it listens
/// on every address.
pub fn source_for(listen: SocketAddr) -> Option<IpAddr> {
    (!listen.ip().is_unspecified()).then_some(listen.ip())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_come_from_the_chosen_address() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
        let addr = l.local_addr().expect("addr").to_string();
        let from: IpAddr = "127.0.0.3".parse().expect("ip");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let _c = rt.block_on(connect(&addr, Some(from))).expect("connect");
        let (_, peer) = l.accept().expect("accept");
        assert_eq!(peer.ip(), from);
        assert!(rt.block_on(connect("nowhere", Some(from))).is_err());
        assert_eq!(source_for("0.0.0.0:1".parse().expect("sa")), None);
    }
}
