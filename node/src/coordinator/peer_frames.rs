//! The members' framed Raft transport, wire format: a connection that
//! opens with [`PREFACE`] carries length-prefixed frames instead of HTTP/2.
//!
//! Members send each other Raft's three messages (`AppendEntries`, `Vote`,
//! `InstallSnapshot`) over one long-lived connection per peer, on the same
//! listener and the same TLS as the gRPC services: the listener tells the
//! two apart by the first bytes ([`Sniff`]; an HTTP/2 client opens with
//! `PRI * HTTP/2.0`). A gRPC unary call costs a HEADERS frame each way,
//! HPACK, a stream, a spawned task on the server and a buffer task on the
//! client; a frame costs a 13-byte header (docs/benchmarks.md: "The floor
//! of a gRPC call").
//!
//! ```text
//! client → server   PREFACE (8 bytes: "LHRAFT01")
//! server → client   PREFACE (the same 8 bytes: the server speaks frames)
//! then, both ways, frames:
//!   length  u32, big-endian: the bytes after this field (≥ 9)
//!   call    u64, big-endian: chosen by the caller, echoed by the answer
//!   kind    u8:  1 AppendEntries, 2 Vote, 3 InstallSnapshot (requests
//!                to shard 0, the meta group), 0x11, 0x12, 0x13 (the same
//!                to the shard the body names), 0x80 answer, 0x81 refusal
//!   body    postcard: the openraft request; an answer carries openraft's
//!           `Result` exactly as the gRPC `Raft` service returns it; a
//!           refusal carries a UTF-8 reason. A request of kind 0x11–0x13
//!           opens with its shard id (u32, big-endian) before the postcard
//! ```
//!
//! One connection per peer carries the messages of every Raft group the
//! two members share (ADR 0025): a request names its group by its kind
//! and, past shard 0, by the shard id ahead of its body. Shard 0 keeps the
//! kinds of a member that hosts one group, byte for byte, so members of
//! either build replicate shard 0 to each other during a rolling upgrade.
//!
//! Calls are pipelined: a caller may send before earlier answers arrive,
//! and answers come back in any order. A frame longer than the peer
//! message limit closes the connection. This module is the pure part
//! (header encoding, sniffing) plus the two async helpers reading and
//! writing one frame; [`super::frame_link`] is the caller's side and
//! [`super::frame_server`] the listener's.

use std::io;

use leasehold_core::shard::ShardId;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The first bytes of a framed connection, sent by the caller and echoed
/// by a listener that speaks frames.
pub const PREFACE: [u8; 8] = *b"LHRAFT01";

/// Bytes of a frame's header: length (4), call (8), kind (1).
pub const HEADER_BYTES: usize = 13;

/// Most bytes reserved for a body before any of it has arrived.
const INITIAL_BODY_CAPACITY: usize = 64 * 1024;

/// Bytes the length field counts beyond the body: call (8) and kind (1).
const LENGTH_OVERHEAD: usize = HEADER_BYTES - 4;

/// Bytes of the shard id that opens the body of a request to a shard
/// other than 0.
pub const SHARD_ID_BYTES: usize = 4;

/// One of Raft's three peer messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RaftMessage {
    /// `AppendEntries` (heartbeats included).
    AppendEntries,
    /// `Vote`.
    Vote,
    /// `InstallSnapshot` (one chunk).
    InstallSnapshot,
}

impl RaftMessage {
    /// The call's name in refusals and logs.
    pub fn call_name(self) -> &'static str {
        match self {
            RaftMessage::AppendEntries => "Raft/AppendEntries",
            RaftMessage::Vote => "Raft/Vote",
            RaftMessage::InstallSnapshot => "Raft/InstallSnapshot",
        }
    }
}

/// What a frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameKind {
    /// An `AppendEntries` request to shard 0.
    AppendEntries,
    /// A `Vote` request to shard 0.
    Vote,
    /// An `InstallSnapshot` request (one chunk) to shard 0.
    InstallSnapshot,
    /// A request to the shard whose id opens the body.
    ToShard(RaftMessage),
    /// The answer to a request: openraft's `Result`.
    Answer,
    /// The request was refused before it reached Raft (unauthorised
    /// sender, undecodable body, unknown kind): a UTF-8 reason.
    Refusal,
}

impl FrameKind {
    /// The kind's byte on the wire.
    pub fn byte(self) -> u8 {
        match self {
            FrameKind::AppendEntries => 1,
            FrameKind::Vote => 2,
            FrameKind::InstallSnapshot => 3,
            FrameKind::ToShard(RaftMessage::AppendEntries) => 0x11,
            FrameKind::ToShard(RaftMessage::Vote) => 0x12,
            FrameKind::ToShard(RaftMessage::InstallSnapshot) => 0x13,
            FrameKind::Answer => 0x80,
            FrameKind::Refusal => 0x81,
        }
    }

    /// The kind of a wire byte; `None` for a byte no kind has.
    pub fn from_byte(byte: u8) -> Option<Self> {
        Some(match byte {
            1 => FrameKind::AppendEntries,
            2 => FrameKind::Vote,
            3 => FrameKind::InstallSnapshot,
            0x11 => FrameKind::ToShard(RaftMessage::AppendEntries),
            0x12 => FrameKind::ToShard(RaftMessage::Vote),
            0x13 => FrameKind::ToShard(RaftMessage::InstallSnapshot),
            0x80 => FrameKind::Answer,
            0x81 => FrameKind::Refusal,
            _ => return None,
        })
    }
}

/// The kind and body of a request frame carrying `message` (postcard
/// bytes `data`) to `shard`: shard 0's kinds and body are those of a
/// member hosting one group; any other shard's body opens with its id.
pub fn request_frame(message: RaftMessage, shard: ShardId, data: &[u8]) -> (FrameKind, Vec<u8>) {
    if shard == ShardId(0) {
        let kind = match message {
            RaftMessage::AppendEntries => FrameKind::AppendEntries,
            RaftMessage::Vote => FrameKind::Vote,
            RaftMessage::InstallSnapshot => FrameKind::InstallSnapshot,
        };
        return (kind, data.to_vec());
    }
    let mut body = Vec::with_capacity(SHARD_ID_BYTES + data.len());
    body.extend_from_slice(&shard.0.to_be_bytes());
    body.extend_from_slice(data);
    (FrameKind::ToShard(message), body)
}

/// What a request frame asks: the message, the shard it is for and its
/// postcard bytes; `None` for a frame that is no request (an answer, a
/// refusal, an unknown kind, or a shard-addressed body too short for its
/// shard id).
pub fn parse_request(kind: u8, body: &[u8]) -> Option<(RaftMessage, ShardId, &[u8])> {
    match FrameKind::from_byte(kind)? {
        FrameKind::AppendEntries => Some((RaftMessage::AppendEntries, ShardId(0), body)),
        FrameKind::Vote => Some((RaftMessage::Vote, ShardId(0), body)),
        FrameKind::InstallSnapshot => Some((RaftMessage::InstallSnapshot, ShardId(0), body)),
        FrameKind::ToShard(message) => {
            let (id, data) = body.split_first_chunk::<SHARD_ID_BYTES>()?;
            Some((message, ShardId(u32::from_be_bytes(*id)), data))
        }
        FrameKind::Answer | FrameKind::Refusal => None,
    }
}

/// One decoded frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// The call it belongs to.
    pub call: u64,
    /// The kind byte as received (see [`FrameKind::from_byte`]).
    pub kind: u8,
    /// The body.
    pub body: Vec<u8>,
}

/// The header of a frame with `body_len` bytes of body; `None` when the
/// frame would exceed `max_frame_bytes` or the length field.
pub fn encode_header(
    call: u64,
    kind: FrameKind,
    body_len: usize,
    max_frame_bytes: usize,
) -> Option<[u8; HEADER_BYTES]> {
    let length = body_len.checked_add(LENGTH_OVERHEAD)?;
    if length > max_frame_bytes {
        return None;
    }
    let length = u32::try_from(length).ok()?;
    let mut header = [0u8; HEADER_BYTES];
    header[..4].copy_from_slice(&length.to_be_bytes());
    header[4..12].copy_from_slice(&call.to_be_bytes());
    header[12] = kind.byte();
    Some(header)
}

/// Why a frame could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The connection failed or closed.
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The length field is below the header or above the limit.
    #[error("frame of {length} bytes (at least {LENGTH_OVERHEAD}, at most {limit})")]
    BadLength {
        /// The length field.
        length: u64,
        /// The limit in force.
        limit: usize,
    },
}

/// The frame length a length field announces, if it is acceptable.
pub fn check_length(length: u32, max_frame_bytes: usize) -> Result<usize, FrameError> {
    let bad = || FrameError::BadLength {
        length: u64::from(length),
        limit: max_frame_bytes,
    };
    let length = usize::try_from(length).map_err(|_| bad())?;
    if length < LENGTH_OVERHEAD || length > max_frame_bytes {
        return Err(bad());
    }
    Ok(length)
}

/// Reads one frame of at most `max_frame_bytes` (length field included in
/// neither). Not cancel-safe: a caller that drops it mid-frame must drop
/// the connection.
pub async fn read_frame<R: AsyncRead + Unpin>(
    reader: &mut R,
    max_frame_bytes: usize,
) -> Result<Frame, FrameError> {
    let length = check_length(reader.read_u32().await?, max_frame_bytes)?;
    let call = reader.read_u64().await?;
    let kind = reader.read_u8().await?;
    // Grown as the bytes arrive: a length field alone reserves little.
    let body_len = length - LENGTH_OVERHEAD;
    let mut body = Vec::with_capacity(body_len.min(INITIAL_BODY_CAPACITY));
    let read = reader.take(body_len as u64).read_to_end(&mut body).await?;
    if read < body_len {
        return Err(FrameError::Io(io::ErrorKind::UnexpectedEof.into()));
    }
    Ok(Frame { call, kind, body })
}

/// Writes one frame and flushes it. Not cancel-safe: a caller dropped
/// mid-write leaves a torn frame, and the connection must be dropped.
pub async fn write_frame<W: AsyncWrite + Unpin>(
    writer: &mut W,
    call: u64,
    kind: FrameKind,
    body: &[u8],
    max_frame_bytes: usize,
) -> io::Result<()> {
    let header = encode_header(call, kind, body.len(), max_frame_bytes).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "a frame of {} bytes exceeds the peer message limit of {max_frame_bytes}",
                body.len() + LENGTH_OVERHEAD
            ),
        )
    })?;
    // One buffer, so a small frame is one write (and one TLS record).
    let mut frame = Vec::with_capacity(HEADER_BYTES + body.len());
    frame.extend_from_slice(&header);
    frame.extend_from_slice(body);
    writer.write_all(&frame).await?;
    writer.flush().await
}

/// Classifies a connection by its first bytes, fed as they arrive.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Sniff {
    seen: Vec<u8>,
}

/// What the first bytes of a connection say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sniffed {
    /// Not yet known: every byte so far matches [`PREFACE`].
    Undecided,
    /// The whole [`PREFACE`]: a framed Raft connection.
    Frames,
    /// A byte that differs from [`PREFACE`]: anything else (HTTP/2).
    Other,
}

impl Sniff {
    /// Feeds bytes read from the connection; returns the verdict and how
    /// many of `bytes` it consumed (after [`Sniffed::Frames`], the bytes
    /// past the preface belong to the first frame).
    pub fn feed(&mut self, bytes: &[u8]) -> (Sniffed, usize) {
        for (used, byte) in bytes.iter().enumerate() {
            if PREFACE[self.seen.len()] != *byte {
                return (Sniffed::Other, used);
            }
            self.seen.push(*byte);
            if self.seen.len() == PREFACE.len() {
                return (Sniffed::Frames, used + 1);
            }
        }
        (Sniffed::Undecided, bytes.len())
    }

    /// The bytes consumed so far (a prefix of [`PREFACE`]).
    pub fn seen(&self) -> &[u8] {
        &self.seen
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const LIMIT: usize = 1 << 20;

    #[test]
    fn an_http2_preface_is_told_apart_at_its_first_byte() {
        let mut sniff = Sniff::default();
        assert_eq!(
            sniff.feed(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"),
            (Sniffed::Other, 0)
        );
        assert!(sniff.seen().is_empty());
    }

    #[test]
    fn the_preface_in_pieces_is_frames_and_what_follows_is_left() {
        let mut sniff = Sniff::default();
        assert_eq!(sniff.feed(b"LHR"), (Sniffed::Undecided, 3));
        assert_eq!(sniff.feed(b"AFT0"), (Sniffed::Undecided, 4));
        assert_eq!(sniff.feed(b"1\x00\x00"), (Sniffed::Frames, 1));
        assert_eq!(sniff.seen(), PREFACE);
        let mut sniff = Sniff::default();
        assert_eq!(sniff.feed(b"LHRAFT02"), (Sniffed::Other, 7));
        assert_eq!(sniff.seen(), b"LHRAFT0");
    }

    #[test]
    fn kinds_round_trip_and_unknown_bytes_have_none() {
        for kind in [
            FrameKind::AppendEntries,
            FrameKind::Vote,
            FrameKind::InstallSnapshot,
            FrameKind::Answer,
            FrameKind::Refusal,
        ] {
            assert_eq!(FrameKind::from_byte(kind.byte()), Some(kind));
        }
        assert_eq!(FrameKind::from_byte(0), None);
        assert_eq!(FrameKind::from_byte(4), None);
        assert_eq!(FrameKind::from_byte(0x14), None);
        assert_eq!(FrameKind::from_byte(0xff), None);
    }

    /// Shard 0's requests are the bytes a member hosting one group sends
    /// (kinds 1–3, the postcard alone), so a rolling upgrade keeps
    /// replicating it.
    #[test]
    fn shard_zero_requests_keep_the_single_group_wire() {
        for (message, byte) in [
            (RaftMessage::AppendEntries, 1u8),
            (RaftMessage::Vote, 2),
            (RaftMessage::InstallSnapshot, 3),
        ] {
            let (kind, body) = request_frame(message, ShardId(0), b"postcard");
            assert_eq!(kind.byte(), byte);
            assert_eq!(body, b"postcard");
        }
    }

    #[test]
    fn a_shard_addressed_body_too_short_for_its_id_is_no_request() {
        assert_eq!(parse_request(0x11, &[0, 0, 1]), None);
        assert_eq!(
            parse_request(0x12, &[0, 0, 0, 7]),
            Some((RaftMessage::Vote, ShardId(7), &[][..]))
        );
        assert_eq!(parse_request(0x80, b"answer"), None);
        assert_eq!(parse_request(0x42, b"what"), None);
    }

    #[test]
    fn a_frame_over_the_limit_is_neither_written_nor_read() {
        assert!(encode_header(1, FrameKind::Vote, 100 - LENGTH_OVERHEAD, 100).is_some());
        assert!(encode_header(1, FrameKind::Vote, 101 - LENGTH_OVERHEAD, 100).is_none());
        assert!(encode_header(1, FrameKind::Vote, usize::MAX, usize::MAX).is_none());
        assert!(check_length(100, 100).is_ok());
        assert!(matches!(
            check_length(101, 100),
            Err(FrameError::BadLength { length: 101, .. })
        ));
        assert!(matches!(
            check_length(8, 100),
            Err(FrameError::BadLength { length: 8, .. })
        ));
    }

    #[tokio::test]
    async fn a_frame_cut_short_is_an_error_not_a_shorter_frame() {
        let mut wire = Vec::new();
        write_frame(&mut wire, 3, FrameKind::Vote, &[1; 100], LIMIT)
            .await
            .unwrap();
        wire.truncate(HEADER_BYTES + 40);
        let read = read_frame(&mut wire.as_slice(), LIMIT).await;
        assert!(
            matches!(&read, Err(FrameError::Io(e)) if e.kind() == io::ErrorKind::UnexpectedEof),
            "{read:?}"
        );
    }

    #[tokio::test]
    async fn a_written_oversized_frame_is_refused_before_any_byte() {
        let mut out = Vec::new();
        let refused = write_frame(&mut out, 1, FrameKind::Answer, &[0; 200], 100).await;
        assert_eq!(refused.unwrap_err().kind(), io::ErrorKind::InvalidInput);
        assert!(out.is_empty());
    }

    fn message() -> impl Strategy<Value = RaftMessage> {
        prop_oneof![
            Just(RaftMessage::AppendEntries),
            Just(RaftMessage::Vote),
            Just(RaftMessage::InstallSnapshot),
        ]
    }

    proptest! {
        /// Every request frame reads back as the message, shard and bytes
        /// it was made from, whatever the shard.
        #[test]
        fn requests_round_trip_to_any_shard(
            message in message(),
            shard in any::<u32>(),
            data in proptest::collection::vec(any::<u8>(), 0..64),
        ) {
            let (kind, body) = request_frame(message, ShardId(shard), &data);
            prop_assert_eq!(
                parse_request(kind.byte(), &body),
                Some((message, ShardId(shard), data.as_slice()))
            );
        }

        #[test]
        fn frames_round_trip_back_to_back(
            frames in proptest::collection::vec(
                (any::<u64>(), prop_oneof![Just(1u8), Just(2), Just(3), Just(0x11), Just(0x12),
                                           Just(0x13), Just(0x80), Just(0x81)],
                 proptest::collection::vec(any::<u8>(), 0..300)),
                1..8,
            )
        ) {
            let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
            rt.block_on(async {
                let mut wire = Vec::new();
                for (call, kind, body) in &frames {
                    let kind = FrameKind::from_byte(*kind).unwrap();
                    write_frame(&mut wire, *call, kind, body, LIMIT).await.unwrap();
                }
                let mut reader = wire.as_slice();
                for (call, kind, body) in &frames {
                    let frame = read_frame(&mut reader, LIMIT).await.unwrap();
                    prop_assert_eq!(frame, Frame { call: *call, kind: *kind, body: body.clone() });
                }
                prop_assert!(reader.is_empty());
                Ok(())
            })?;
        }

        /// Whatever arrives, reading ends in a frame within the limit or an
        /// error — never a panic, never an allocation past the limit.
        #[test]
        fn any_bytes_read_as_frames_within_the_limit_or_an_error(
            bytes in proptest::collection::vec(any::<u8>(), 0..200),
            limit in 9usize..150,
        ) {
            let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
            rt.block_on(async {
                let mut reader = bytes.as_slice();
                while let Ok(frame) = read_frame(&mut reader, limit).await {
                    prop_assert!(frame.body.len() + LENGTH_OVERHEAD <= limit);
                }
                Ok(())
            })?;
        }

        /// The sniffer says `Frames` exactly for input starting with the
        /// preface, however it is split, and `Other` at the first byte
        /// that differs.
        #[test]
        fn sniffing_agrees_with_a_prefix_test(
            bytes in proptest::collection::vec(
                prop_oneof![Just(b'L'), Just(b'H'), Just(b'R'), Just(b'A'), Just(b'F'),
                            Just(b'T'), Just(b'0'), Just(b'1'), any::<u8>()], 0..12),
            cut in 0usize..12,
        ) {
            let mut sniff = Sniff::default();
            let cut = cut.min(bytes.len());
            let (first, rest) = bytes.split_at(cut);
            let (mut verdict, _) = sniff.feed(first);
            if verdict == Sniffed::Undecided {
                verdict = sniff.feed(rest).0;
            }
            let expected = if bytes.starts_with(&PREFACE) {
                Sniffed::Frames
            } else if PREFACE.starts_with(&bytes) {
                Sniffed::Undecided
            } else {
                Sniffed::Other
            };
            prop_assert_eq!(verdict, expected);
        }
    }
}
