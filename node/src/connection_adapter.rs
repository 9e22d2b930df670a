//! One adapter for a connection whose reads something watches or changes
//! while its writes and its [`Connected::connect_info`] pass through
//! untouched: [`AdaptedConnection`] over an inner connection and a
//! [`ReadAdapter`].
//!
//! The listeners and the CLI's probe each need one:
//! - [`crate::net`]: the first-byte deadline and connection-cap permit of
//!   every accepted connection ([`crate::net::BoundedConnection`]);
//! - the framed Raft transport's listener: the bytes read to tell a framed
//!   connection from HTTP/2, put back in front of the rest
//!   ([`ReadBack`], `coordinator::frame_server::SniffedConnection`);
//! - `leasehold`'s connection probe (`cli::diagnose`): the first bytes a
//!   server answered, kept for the diagnosis.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;

/// What an [`AdaptedConnection`] does on a read: it reads from `inner`
/// (or not) and may look at or replace what was read.
pub trait ReadAdapter<IO> {
    /// Fills `buf` as [`AsyncRead::poll_read`] does, reading from `inner`.
    fn poll_read(
        &mut self,
        inner: Pin<&mut IO>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>>;
}

/// A connection whose reads go through `adapter` and whose writes go
/// straight to `inner`.
pub struct AdaptedConnection<IO, A> {
    inner: IO,
    adapter: A,
}

impl<IO, A> AdaptedConnection<IO, A> {
    /// `inner`, read through `adapter`.
    pub fn new(inner: IO, adapter: A) -> Self {
        AdaptedConnection { inner, adapter }
    }
}

impl<IO: AsyncRead + Unpin, A: ReadAdapter<IO> + Unpin> AsyncRead for AdaptedConnection<IO, A> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        this.adapter.poll_read(Pin::new(&mut this.inner), cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin, A: Unpin> AsyncWrite for AdaptedConnection<IO, A> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

impl<IO: Connected, A> Connected for AdaptedConnection<IO, A> {
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

/// Bytes already read from a connection, handed out again before anything
/// more is read from it.
pub struct ReadBack(pub Vec<u8>);

impl<IO: AsyncRead + Unpin> ReadAdapter<IO> for ReadBack {
    fn poll_read(
        &mut self,
        inner: Pin<&mut IO>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.0.is_empty() {
            return inner.poll_read(cx, buf);
        }
        let n = self.0.len().min(buf.remaining());
        buf.put_slice(&self.0[..n]);
        self.0.drain(..n);
        Poll::Ready(Ok(()))
    }
}
