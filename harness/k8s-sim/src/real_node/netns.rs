//! The only ways into and out of the test node's network namespace: TCP forwarders the
//! test process holds. A listener is made inside the namespace (a socket belongs to the
//! namespace it was created in, whichever thread later accepts on it) and each
//! connection is joined to a socket made outside, on this machine's loopback. Nothing
//! routes between the namespaces: no veth, no route, no address outside 198.18.0.0/15
//! inside it.

use std::fs::File;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

/// Binds `addr` inside the network namespace `netns` (an open `/proc/PID/ns/net`), from a
/// thread that enters it and ends; retried until the address exists there (the node's
/// script adds it), for at most `limit`.
pub fn listen_in(netns: &File, addr: SocketAddr, limit: Duration) -> Result<std::net::TcpListener, String> {
    let start = Instant::now();
    loop {
        let fd = netns.as_raw_fd();
        let bound = std::thread::scope(|s| {
            s.spawn(|| {
                // SAFETY: setns on this thread alone (a network namespace may be entered
                // by one thread of a multi-threaded process); `fd` is an open namespace
                // file. The thread ends right after binding.
                if unsafe { libc::setns(fd, libc::CLONE_NEWNET) } != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                std::net::TcpListener::bind(addr)
            })
            .join()
            .unwrap_or_else(|_| Err(std::io::Error::other("the binding thread panicked")))
        });
        match bound {
            Ok(l) => return Ok(l),
            Err(e) if e.kind() == std::io::ErrorKind::AddrNotAvailable && start.elapsed() < limit => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => return Err(format!("listening on {addr} in the node's network namespace: {e}")),
        }
    }
}

/// Forwards every connection accepted on `listener` to `target` until the returned task
/// is aborted (its connections end with it).
pub fn forward(listener: std::net::TcpListener, target: SocketAddr) -> Result<JoinHandle<()>, String> {
    listener.set_nonblocking(true).map_err(|e| format!("forwarder: {e}"))?;
    let listener = TcpListener::from_std(listener).map_err(|e| format!("forwarder: {e}"))?;
    Ok(tokio::spawn(async move {
        let mut connections = JoinSet::new();
        while let Ok((mut inside, _)) = listener.accept().await {
            connections.spawn(async move {
                if let Ok(mut outside) = TcpStream::connect(target).await {
                    let _ = tokio::io::copy_bidirectional(&mut inside, &mut outside).await;
                }
            });
            while connections.try_join_next().is_some() {}
        }
    }))
}
