//! tonic over turmoil's simulated network: a [`Dialer`] whose connections
//! (gRPC channels, and the byte streams of the members' framed Raft
//! transport) are turmoil TCP streams, and the stream of accepted connections a
//! coordinator member serves on. turmoil TCP never retransmits, so every
//! channel has HTTP/2 keep-alive and every RPC a deadline (set by callers).

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use hyper_util::rt::TokioIo;
use leasehold_client::transport::{
    normalize_addr, ByteStream, DialError, DialFuture, Dialer, StreamDialFuture,
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;
use tonic::transport::{Endpoint, Uri};

/// Dials peers over the simulated network.
#[derive(Debug, Clone, Copy, Default)]
pub struct SimDialer;

impl Dialer for SimDialer {
    fn dial(&self, addr: &str) -> DialFuture {
        let addr = addr.to_string();
        Box::pin(async move {
            let addr = normalize_addr(&addr)?;
            let endpoint = Endpoint::from_shared(format!("http://{addr}"))
                .map_err(|e| DialError::InvalidAddress {
                    addr: addr.clone(),
                    reason: e.to_string(),
                })?
                .connect_timeout(Duration::from_millis(500))
                .http2_keep_alive_interval(Duration::from_millis(300))
                .keep_alive_timeout(Duration::from_millis(600))
                .keep_alive_while_idle(true);
            let target = addr.clone();
            let connector = tower::service_fn(move |_: Uri| {
                let target = target.clone();
                async move {
                    turmoil::net::TcpStream::connect(target.as_str())
                        .await
                        .map(TokioIo::new)
                }
            });
            Ok(endpoint.connect_with_connector_lazy(connector))
        })
    }

    fn dial_stream(&self, addr: &str) -> StreamDialFuture {
        let addr = addr.to_string();
        Box::pin(async move {
            let addr = normalize_addr(&addr)?;
            let failed = |reason: String| DialError::Connect {
                addr: addr.clone(),
                reason,
            };
            let connect = turmoil::net::TcpStream::connect(addr.as_str());
            let stream = tokio::time::timeout(Duration::from_millis(500), connect)
                .await
                .map_err(|_| failed("no connection within 500 ms".into()))?
                .map_err(|e| failed(e.to_string()))?;
            let stream: Box<dyn ByteStream> = Box::new(stream);
            Ok(stream)
        })
    }
}

/// One accepted simulated connection, as tonic's server wants it.
#[derive(Debug)]
pub struct SimConnection(turmoil::net::TcpStream);

impl Connected for SimConnection {
    type ConnectInfo = ();
    fn connect_info(&self) -> Self::ConnectInfo {}
}

impl AsyncRead for SimConnection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for SimConnection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// Accepted connections of a simulated listener bound on `0.0.0.0:port`.
pub async fn incoming(
    port: u16,
) -> std::io::Result<impl Stream<Item = std::io::Result<SimConnection>>> {
    let listener = turmoil::net::TcpListener::bind(("0.0.0.0", port)).await?;
    Ok(futures::stream::unfold(listener, |listener| async move {
        let next = listener
            .accept()
            .await
            .map(|(stream, _)| SimConnection(stream));
        Some((next, listener))
    }))
}
