//! The listener's side of the framed Raft transport
//! ([`super::peer_frames`]): telling framed connections from HTTP/2 ones,
//! and answering the frames.
//!
//! [`split_framed`] wraps the member's stream of accepted connections
//! (already past TLS and the connection cap): each new connection's first
//! bytes are read — at most the eight of the preface, and only until one
//! differs, so an HTTP/2 client's `P` settles it at once — and the
//! connection either goes on to tonic with those bytes put back
//! ([`SniffedConnection`]) or becomes a framed session on a task of its
//! own. A connection that sends neither within [`SNIFF_TIMEOUT`] is
//! closed.
//!
//! On a TLS listener only a member's certificate may open a framed
//! connection (as only members may call the gRPC `Raft` service); any other
//! is closed without the preface echoed, before a frame is read. A session
//! echoes the preface, then reads frames and answers each on a
//! task of its own (at most [`MAX_CALLS_IN_FLIGHT`] per connection; the
//! next frame is read once one ends), through the same
//! [`RaftService::handle`] as the gRPC `Raft` service: the same decoding,
//! the same check of the claimed sender against the certificate and the
//! membership, the same answers. A request that is refused gets a
//! refusal frame; a frame over the peer message limit, or any read error,
//! ends the session.

use std::any::Any;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, Stream, StreamExt};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{watch, Semaphore};
use tonic::transport::server::Connected;

use super::peer_frames::{
    parse_request, read_frame, write_frame, FrameKind, Sniff, Sniffed, PREFACE,
};
use super::raft_service::RaftService;
use crate::auth::PeerInfo;
use crate::connection_adapter::{AdaptedConnection, ReadBack};
use crate::net::AcceptError;

/// How long a new connection has to show which protocol it speaks.
pub const SNIFF_TIMEOUT: Duration = Duration::from_secs(5);

/// Most requests of one framed connection answered at once.
pub const MAX_CALLS_IN_FLIGHT: usize = 64;

/// What a framed session needs.
#[derive(Clone)]
pub struct FrameServer {
    /// The member's Raft handler.
    pub service: RaftService,
    /// The peer message limit in force.
    pub max_frame_bytes: usize,
    /// Turns true when the member stops: sessions end.
    pub stopped: watch::Receiver<bool>,
}

/// A connection that was not framed, with the bytes read to tell put back
/// in front of the rest.
pub type SniffedConnection<IO> = AdaptedConnection<IO, ReadBack>;

/// The stream [`split_framed`] returns.
pub struct SplitFramed<S, IO> {
    inner: Option<Pin<Box<S>>>,
    sniffing: FuturesUnordered<BoxFuture<'static, Option<SniffedConnection<IO>>>>,
    server: FrameServer,
}

/// Wraps `incoming`: framed connections are served by `server`, the others
/// come out of the returned stream for tonic.
pub fn split_framed<S, IO>(incoming: S, server: FrameServer) -> SplitFramed<S, IO>
where
    S: Stream<Item = Result<IO, AcceptError>>,
{
    SplitFramed {
        inner: Some(Box::pin(incoming)),
        sniffing: FuturesUnordered::new(),
        server,
    }
}

impl<S, IO> Stream for SplitFramed<S, IO>
where
    S: Stream<Item = Result<IO, AcceptError>>,
    IO: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static,
{
    type Item = Result<SniffedConnection<IO>, AcceptError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        while let Some(inner) = this.inner.as_mut() {
            match inner.as_mut().poll_next(cx) {
                Poll::Pending => break,
                Poll::Ready(None) => this.inner = None,
                Poll::Ready(Some(Err(error))) => return Poll::Ready(Some(Err(error))),
                Poll::Ready(Some(Ok(io))) => {
                    let server = this.server.clone();
                    this.sniffing.push(sniff(io, server).boxed());
                }
            }
        }
        loop {
            match this.sniffing.poll_next_unpin(cx) {
                Poll::Ready(Some(Some(connection))) => return Poll::Ready(Some(Ok(connection))),
                // Framed (now served elsewhere), closed or silent.
                Poll::Ready(Some(None)) => continue,
                Poll::Ready(None) if this.inner.is_none() => return Poll::Ready(None),
                Poll::Ready(None) | Poll::Pending => return Poll::Pending,
            }
        }
    }
}

/// Reads `io`'s first bytes: a framed connection is handed to a session
/// task (`None`), any other comes back with the bytes put back; one that
/// closes, fails or stays silent is dropped (`None`).
async fn sniff<IO>(mut io: IO, server: FrameServer) -> Option<SniffedConnection<IO>>
where
    IO: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static,
{
    match tokio::time::timeout(SNIFF_TIMEOUT, read_preface(&mut io)).await {
        Ok(Some(Told::Frames)) => {
            let peer = peer_info(&io);
            // A certificate that is not a member's gets no preface back (and
            // no frame read): the connection is closed.
            if server
                .service
                .admit_framed_connection(peer.as_ref())
                .is_ok()
            {
                tokio::spawn(serve_session(io, peer, server));
            }
            None
        }
        Ok(Some(Told::Other(read_back))) => Some(AdaptedConnection::new(io, ReadBack(read_back))),
        Ok(None) | Err(_) => None,
    }
}

/// What a connection's first bytes said.
enum Told {
    /// The preface: framed.
    Frames,
    /// Something else; the bytes read so far.
    Other(Vec<u8>),
}

/// Reads one byte at a time until the bytes leave the preface or complete
/// it: at most eight reads, and nothing past the preface (the first frame
/// stays in the stream). `None` when the connection closes or fails first.
async fn read_preface<IO: AsyncRead + Unpin>(io: &mut IO) -> Option<Told> {
    let mut sniff = Sniff::default();
    let mut byte = [0u8; 1];
    loop {
        if io.read(&mut byte).await.ok()? == 0 {
            return None;
        }
        match sniff.feed(&byte).0 {
            Sniffed::Undecided => {}
            Sniffed::Frames => return Some(Told::Frames),
            Sniffed::Other => {
                let mut read_back = sniff.seen().to_vec();
                read_back.push(byte[0]);
                return Some(Told::Other(read_back));
            }
        }
    }
}

/// Who is on the other end: the certificate's identity on a TLS listener,
/// `None` on a plaintext one (as for the gRPC services).
fn peer_info<IO: Connected>(io: &IO) -> Option<PeerInfo> {
    let info = io.connect_info();
    (&info as &dyn Any).downcast_ref::<PeerInfo>().cloned()
}

/// Serves one framed connection until it fails or the member stops.
async fn serve_session<IO>(io: IO, peer: Option<PeerInfo>, server: FrameServer)
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut reader, mut writer) = tokio::io::split(io);
    if writer.write_all(&PREFACE).await.is_err() || writer.flush().await.is_err() {
        return;
    }
    let writer = Arc::new(tokio::sync::Mutex::new(writer));
    let calls = Arc::new(Semaphore::new(MAX_CALLS_IN_FLIGHT));
    let mut stopped = server.stopped.clone();
    loop {
        let permit = tokio::select! {
            permit = calls.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => return,
            },
            _ = stopped.wait_for(|stopped| *stopped) => return,
        };
        // Not cancel-safe, but a stop ends the whole connection.
        let frame = tokio::select! {
            frame = read_frame(&mut reader, server.max_frame_bytes) => match frame {
                Ok(frame) => frame,
                Err(error) => {
                    tracing::debug!(%error, "framed Raft connection ended");
                    return;
                }
            },
            _ = stopped.wait_for(|stopped| *stopped) => return,
        };
        let (service, writer, peer) = (server.service.clone(), writer.clone(), peer.clone());
        let max_frame_bytes = server.max_frame_bytes;
        tokio::spawn(async move {
            let _permit = permit;
            let (kind, body) = match parse_request(frame.kind, &frame.body) {
                Some((message, shard, data)) => match service
                    .handle_for(message, shard, data, peer.as_ref())
                    .await
                {
                    Ok(answer) => (FrameKind::Answer, answer),
                    Err(status) => (
                        FrameKind::Refusal,
                        format!("{:?}: {}", status.code(), status.message()).into_bytes(),
                    ),
                },
                None => (
                    FrameKind::Refusal,
                    format!("no request has kind {:#x}", frame.kind).into_bytes(),
                ),
            };
            let mut writer = writer.lock().await;
            if write_frame(&mut *writer, frame.call, kind, &body, max_frame_bytes)
                .await
                .is_err()
            {
                // The caller sees the connection end and dials again.
                let _ = writer.shutdown().await;
            }
        });
    }
}
