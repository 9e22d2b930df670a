//! The caller's side of the framed Raft transport ([`super::peer_frames`]):
//! one connection to one peer, calls pipelined over it.
//!
//! [`FrameLink::connect`] dials a byte stream, sends the preface and waits
//! for the peer to echo it; a peer that answers anything else (a member of
//! an older version, whose listener speaks only HTTP/2) is
//! [`LinkError::NotSpoken`], and the caller falls back to gRPC. A reader
//! task hands each answer to the call waiting for it. Any failure —
//! reading, writing, a frame torn by a caller dropped mid-write — marks
//! the link broken: every call waiting on it fails, and the caller dials
//! a new one.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_client::transport::{ByteStream, DialError, Dialer};
use tokio::io::{AsyncReadExt, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::sync::oneshot;

use super::peer_frames::{read_frame, write_frame, FrameKind, PREFACE};

/// Why a framed call failed.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// The stream could not be dialled.
    #[error("{0}")]
    Dial(#[from] DialError),
    /// The peer answered the preface with something else: it does not
    /// speak frames (gRPC only).
    #[error("the peer does not speak framed Raft")]
    NotSpoken,
    /// The connection failed, closed or was torn.
    #[error("connection lost: {0}")]
    Lost(String),
    /// The message is larger than the peer message limit.
    #[error("{0}")]
    TooLarge(String),
}

/// A waiting call's answer: the frame kind byte and body.
type Answer = (u8, Vec<u8>);

/// The calls waiting for an answer, by call id; `None` once the link broke.
type Waiting = Mutex<Option<HashMap<u64, oneshot::Sender<Answer>>>>;

/// One framed connection to one peer.
pub struct FrameLink {
    writer: tokio::sync::Mutex<WriteHalf<Box<dyn ByteStream>>>,
    /// `None` once the link broke.
    waiting: Arc<Waiting>,
    next_call: AtomicU64,
    max_frame_bytes: usize,
    reader: tokio::task::JoinHandle<()>,
}

impl Drop for FrameLink {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl FrameLink {
    /// Dials `addr` and agrees on frames within `timeout`.
    pub async fn connect(
        dialer: &dyn Dialer,
        addr: &str,
        timeout: Duration,
        max_frame_bytes: usize,
    ) -> Result<Arc<Self>, LinkError> {
        let opened = async {
            let mut stream = dialer.dial_stream(addr).await?;
            stream
                .write_all(&PREFACE)
                .await
                .map_err(|e| LinkError::Lost(e.to_string()))?;
            stream
                .flush()
                .await
                .map_err(|e| LinkError::Lost(e.to_string()))?;
            let mut echo = [0u8; PREFACE.len()];
            match stream.read_exact(&mut echo).await {
                Ok(_) if echo == PREFACE => Ok(stream),
                // Closed, reset, or an HTTP/2 or HTTP/1 answer.
                Ok(_) | Err(_) => Err(LinkError::NotSpoken),
            }
        };
        let stream = tokio::time::timeout(timeout, opened).await.map_err(|_| {
            LinkError::Lost(format!("no preface within {} ms", timeout.as_millis()))
        })??;
        let (reader, writer) = tokio::io::split(stream);
        let waiting: Arc<Waiting> = Arc::new(Mutex::new(Some(HashMap::new())));
        let reader = tokio::spawn(read_answers(reader, waiting.clone(), max_frame_bytes));
        Ok(Arc::new(Self {
            writer: tokio::sync::Mutex::new(writer),
            waiting,
            next_call: AtomicU64::new(1),
            max_frame_bytes,
            reader,
        }))
    }

    /// Whether the link failed (it takes no more calls).
    pub fn is_broken(&self) -> bool {
        lock(&self.waiting).is_none()
    }

    /// Sends one request and waits for its answer: `Ok(Ok(body))` for an
    /// answer, `Ok(Err(reason))` for a refusal. The caller bounds the wait.
    pub async fn call(
        &self,
        kind: FrameKind,
        body: &[u8],
    ) -> Result<Result<Vec<u8>, String>, LinkError> {
        let call = self.next_call.fetch_add(1, Ordering::Relaxed);
        let (answer_tx, answer_rx) = oneshot::channel();
        {
            let mut waiting = lock(&self.waiting);
            let Some(waiting) = waiting.as_mut() else {
                return Err(LinkError::Lost("the link broke".into()));
            };
            waiting.insert(call, answer_tx);
        }
        let forget = ForgetOnDrop {
            waiting: &self.waiting,
            call,
        };
        {
            let mut writer = self.writer.lock().await;
            if self.is_broken() {
                return Err(LinkError::Lost("the link broke".into()));
            }
            let torn = TornWriteGuard {
                link: self,
                armed: true,
            };
            let written = write_frame(&mut *writer, call, kind, body, self.max_frame_bytes).await;
            torn.disarm();
            if let Err(error) = written {
                if error.kind() == std::io::ErrorKind::InvalidInput {
                    return Err(LinkError::TooLarge(error.to_string()));
                }
                self.break_link();
                return Err(LinkError::Lost(error.to_string()));
            }
        }
        let answer = answer_rx
            .await
            .map_err(|_| LinkError::Lost("the link broke".into()))?;
        drop(forget);
        match FrameKind::from_byte(answer.0) {
            Some(FrameKind::Answer) => Ok(Ok(answer.1)),
            Some(FrameKind::Refusal) => Ok(Err(String::from_utf8_lossy(&answer.1).into_owned())),
            _ => {
                self.break_link();
                Err(LinkError::Lost(format!("answer of kind {:#x}", answer.0)))
            }
        }
    }

    /// Marks the link broken and fails every waiting call.
    pub fn break_link(&self) {
        lock(&self.waiting).take();
        self.reader.abort();
    }
}

fn lock(
    waiting: &Waiting,
) -> std::sync::MutexGuard<'_, Option<HashMap<u64, oneshot::Sender<Answer>>>> {
    waiting
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Drops a call's waiting slot when the call ends without its answer
/// (timed out or cancelled).
struct ForgetOnDrop<'a> {
    waiting: &'a Waiting,
    call: u64,
}

impl Drop for ForgetOnDrop<'_> {
    fn drop(&mut self) {
        if let Some(waiting) = lock(self.waiting).as_mut() {
            waiting.remove(&self.call);
        }
    }
}

/// Marks the link broken if a write is abandoned half way (its caller
/// dropped): the peer would read the rest of the stream out of step.
struct TornWriteGuard<'a> {
    link: &'a FrameLink,
    armed: bool,
}

impl TornWriteGuard<'_> {
    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for TornWriteGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.link.break_link();
        }
    }
}

/// Reads answers until the connection fails, handing each to its call.
async fn read_answers(
    mut reader: ReadHalf<Box<dyn ByteStream>>,
    waiting: Arc<Waiting>,
    max_frame_bytes: usize,
) {
    while let Ok(frame) = read_frame(&mut reader, max_frame_bytes).await {
        let sender = lock(&waiting)
            .as_mut()
            .and_then(|waiting| waiting.remove(&frame.call));
        // An answer to a call that gave up is dropped.
        if let Some(sender) = sender {
            let _ = sender.send((frame.kind, frame.body));
        }
    }
    lock(&waiting).take();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coordinator::peer_frames::Frame;
    use leasehold_client::transport::StreamDialFuture;

    const LIMIT: usize = 1 << 16;

    /// Hands out one end of an in-memory pipe; the test holds the other.
    struct PipeDialer(Mutex<Option<tokio::io::DuplexStream>>);

    impl Dialer for PipeDialer {
        fn dial(&self, _addr: &str) -> leasehold_client::transport::DialFuture {
            unreachable!("frames only")
        }
        fn dial_stream(&self, addr: &str) -> StreamDialFuture {
            let end = self.0.lock().unwrap().take();
            let addr = addr.to_string();
            Box::pin(async move {
                let end = end.ok_or(DialError::Connect {
                    addr,
                    reason: "dialled twice".into(),
                })?;
                let end: Box<dyn ByteStream> = Box::new(end);
                Ok(end)
            })
        }
    }

    /// A link over a pipe whose far end the test plays, preface answered.
    async fn link() -> (Arc<FrameLink>, tokio::io::DuplexStream) {
        let (near, mut far) = tokio::io::duplex(1 << 16);
        let dialer = PipeDialer(Mutex::new(Some(near)));
        let connecting = FrameLink::connect(&dialer, "peer:1", Duration::from_secs(5), LIMIT);
        let answering = async {
            let mut preface = [0u8; 8];
            far.read_exact(&mut preface).await.unwrap();
            assert_eq!(preface, PREFACE);
            far.write_all(&PREFACE).await.unwrap();
        };
        let (link, ()) = tokio::join!(connecting, answering);
        (link.unwrap(), far)
    }

    #[tokio::test]
    async fn pipelined_calls_get_their_own_answers_in_any_order() {
        let (link, mut far) = link().await;
        let first = link.call(FrameKind::Vote, b"first");
        let second = link.call(FrameKind::AppendEntries, b"second");
        let peer = async {
            let a = read_frame(&mut far, LIMIT).await.unwrap();
            let b = read_frame(&mut far, LIMIT).await.unwrap();
            let mut requests = [a, b];
            requests.sort_by_key(|f| f.body.clone());
            assert_eq!(requests[0].kind, FrameKind::Vote.byte());
            assert_eq!(requests[1].kind, FrameKind::AppendEntries.byte());
            // Answer the second first; refuse the first.
            let Frame { call, body, .. } = &requests[1];
            let answer = [body.as_slice(), b"!"].concat();
            write_frame(&mut far, *call, FrameKind::Answer, &answer, LIMIT)
                .await
                .unwrap();
            write_frame(&mut far, requests[0].call, FrameKind::Refusal, b"no", LIMIT)
                .await
                .unwrap();
            far
        };
        let (first, second, _far) = tokio::join!(first, second, peer);
        assert_eq!(first.unwrap(), Err("no".to_string()));
        assert_eq!(second.unwrap(), Ok(b"second!".to_vec()));
        assert!(!link.is_broken());
    }

    #[tokio::test]
    async fn a_closed_connection_fails_waiting_calls_and_breaks_the_link() {
        let (link, mut far) = link().await;
        let call = link.call(FrameKind::Vote, b"x");
        let peer = async move {
            read_frame(&mut far, LIMIT).await.unwrap();
            drop(far);
        };
        let (answer, ()) = tokio::join!(call, peer);
        assert!(matches!(answer, Err(LinkError::Lost(_))), "{answer:?}");
        assert!(link.is_broken());
        assert!(matches!(
            link.call(FrameKind::Vote, b"y").await,
            Err(LinkError::Lost(_))
        ));
    }

    #[tokio::test]
    async fn an_answer_of_a_request_kind_breaks_the_link() {
        let (link, mut far) = link().await;
        let call = link.call(FrameKind::Vote, b"x");
        let peer = async move {
            let request = read_frame(&mut far, LIMIT).await.unwrap();
            write_frame(&mut far, request.call, FrameKind::Vote, b"?", LIMIT)
                .await
                .unwrap();
            far
        };
        let (answer, _far) = tokio::join!(call, peer);
        assert!(matches!(answer, Err(LinkError::Lost(_))), "{answer:?}");
        assert!(link.is_broken());
    }

    #[tokio::test]
    async fn a_request_over_the_limit_is_refused_without_breaking_the_link() {
        let (link, _far) = link().await;
        let answer = link.call(FrameKind::AppendEntries, &vec![0; LIMIT]).await;
        assert!(matches!(answer, Err(LinkError::TooLarge(_))), "{answer:?}");
        assert!(!link.is_broken());
    }

    #[tokio::test]
    async fn a_peer_that_answers_the_preface_otherwise_does_not_speak_frames() {
        let (near, mut far) = tokio::io::duplex(1 << 10);
        let dialer = PipeDialer(Mutex::new(Some(near)));
        let connecting = FrameLink::connect(&dialer, "peer:1", Duration::from_secs(5), LIMIT);
        let answering = async {
            let mut preface = [0u8; 8];
            far.read_exact(&mut preface).await.unwrap();
            // What an HTTP/1 server says to bytes it cannot parse.
            far.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n")
                .await
                .unwrap();
            far
        };
        let (link, _far) = tokio::join!(connecting, answering);
        assert!(matches!(link, Err(LinkError::NotSpoken)));
    }

    #[tokio::test]
    async fn a_dialer_without_streams_is_not_spoken_to_in_frames() {
        let dialer = leasehold_client::transport::TcpDialer::default();
        struct ChannelsOnly(leasehold_client::transport::TcpDialer);
        impl Dialer for ChannelsOnly {
            fn dial(&self, addr: &str) -> leasehold_client::transport::DialFuture {
                self.0.dial(addr)
            }
        }
        let link = FrameLink::connect(
            &ChannelsOnly(dialer),
            "127.0.0.1:1",
            Duration::from_secs(1),
            LIMIT,
        )
        .await;
        assert!(
            matches!(link, Err(LinkError::Dial(DialError::Unsupported { .. }))),
            "{:?}",
            link.err()
        );
    }
}
