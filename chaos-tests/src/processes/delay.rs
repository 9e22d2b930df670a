//! A delaying TCP proxy on loopback: every byte sent through it in either
//! direction arrives `one_way` later, in order. This machine's kernel has no
//! netem; the runner puts one in front of each coordinator member so that
//! every link into a member — another member's Raft traffic, an escrow
//! node's or a client's calls — has a round trip of `2 · one_way`, as
//! between regions.

use std::time::Duration;

use anyhow::{Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// A running proxy; dropping it stops accepting (connections already open
/// end when either side closes).
#[derive(Debug)]
pub struct DelayProxy {
    addr: String,
    accept: JoinHandle<()>,
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

impl DelayProxy {
    /// Listens on a free loopback port and forwards each connection to
    /// `upstream`, delaying both directions by `one_way`. Must be called
    /// inside a tokio runtime.
    pub fn start(upstream: String, one_way: Duration) -> Result<Self> {
        let listener =
            std::net::TcpListener::bind("127.0.0.1:0").context("binding a delay proxy")?;
        listener.set_nonblocking(true)?;
        let listener = TcpListener::from_std(listener)?;
        let addr = listener.local_addr()?.to_string();
        let accept = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let upstream = upstream.clone();
                tokio::spawn(async move {
                    let Ok(outbound) = TcpStream::connect(&upstream).await else {
                        return; // the member is down: the caller sees a reset
                    };
                    let _ = inbound.set_nodelay(true);
                    let _ = outbound.set_nodelay(true);
                    let (in_read, in_write) = inbound.into_split();
                    let (out_read, out_write) = outbound.into_split();
                    tokio::spawn(pump(in_read, out_write, one_way));
                    tokio::spawn(pump(out_read, in_write, one_way));
                });
            }
        });
        Ok(DelayProxy { addr, accept })
    }

    /// The proxy's `host:port`.
    pub fn addr(&self) -> &str {
        &self.addr
    }
}

/// Copies `from` to `to`, each chunk written `delay` after it was read.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay: Duration,
) {
    let (sender, mut due) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let writer = tokio::spawn(async move {
        while let Some((at, chunk)) = due.recv().await {
            tokio::time::sleep_until(at).await;
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    });
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        match from.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if sender
                    .send((Instant::now() + delay, buffer[..n].to_vec()))
                    .is_err()
                {
                    break;
                }
            }
        }
    }
    drop(sender);
    let _ = writer.await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bytes_arrive_in_order_and_a_round_trip_later() -> Result<()> {
        let echo = TcpListener::bind("127.0.0.1:0").await?;
        let upstream = echo.local_addr()?.to_string();
        tokio::spawn(async move {
            if let Ok((mut socket, _)) = echo.accept().await {
                let mut buffer = [0u8; 1024];
                while let Ok(n) = socket.read(&mut buffer).await {
                    if n == 0 || socket.write_all(&buffer[..n]).await.is_err() {
                        break;
                    }
                }
            }
        });
        let proxy = DelayProxy::start(upstream, Duration::from_millis(40))?;
        let mut client = TcpStream::connect(proxy.addr()).await?;
        let sent = Instant::now();
        client.write_all(b"first").await?;
        client.write_all(b"second").await?;
        let mut got = vec![0u8; 11];
        client.read_exact(&mut got).await?;
        let round_trip = sent.elapsed();
        assert_eq!(&got, b"firstsecond");
        assert!(round_trip >= Duration::from_millis(80), "{round_trip:?}");
        assert!(round_trip < Duration::from_millis(2_000), "{round_trip:?}");
        Ok(())
    }
}
