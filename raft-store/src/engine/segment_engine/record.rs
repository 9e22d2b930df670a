//! The format of a segment: its header, and records of write batches
//! (`payload length | crc32 | payload`, a payload one batch of
//! inserts, blob inserts and removals), encoded ([`PayloadWriter`]) and
//! decoded ([`decode_payload`]).

use crate::engine::Keyspace;

pub(super) const HEADER: &[u8; 8] = b"LHSEG\x00\x00\x01";
pub(super) const RECORD_HEADER_BYTES: u64 = 8;
/// Larger records are refused as corrupt on replay (a damaged length).
pub(super) const MAX_RECORD_BYTES: u32 = 1 << 30;

pub(super) const OP_INSERT: u8 = 1;
pub(super) const OP_INSERT_BLOB: u8 = 2;
pub(super) const OP_REMOVE: u8 = 3;

pub(super) fn keyspace_code(keyspace: Keyspace) -> u8 {
    match keyspace {
        Keyspace::Log => 0,
        Keyspace::LogMeta => 1,
        Keyspace::StateMachine => 2,
    }
}

pub(super) fn keyspace_of(code: u8) -> Option<Keyspace> {
    Keyspace::ALL.get(usize::from(code)).copied()
}

/// A value as recorded: the bytes, or a blob reference.
pub(super) enum RecordedValue<'a> {
    Bytes(&'a [u8]),
    Blob { id: u64, len: u64, crc: u32 },
}

/// One write as decoded from a record, with the offset of its value bytes
/// within the segment.
pub(super) struct DecodedOp<'a> {
    pub(super) keyspace: Keyspace,
    pub(super) key: &'a [u8],
    /// `None`: a removal.
    pub(super) value: Option<(RecordedValue<'a>, u64)>,
}

/// A little-endian reader over a record payload.
pub(super) struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    pub(super) fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.at.checked_add(n)?;
        let slice = self.bytes.get(self.at..end)?;
        self.at = end;
        Some(slice)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap_or_default()))
    }
    fn u64(&mut self) -> Option<u64> {
        self.take(8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap_or_default()))
    }
    pub(super) fn bytes(&mut self) -> Option<&'a [u8]> {
        let len = self.u32()? as usize;
        self.take(len)
    }
}

/// Decodes a record payload; `None` if it is malformed. `payload_offset`
/// is where the payload starts in the segment.
pub(super) fn decode_payload(payload: &[u8], payload_offset: u64) -> Option<Vec<DecodedOp<'_>>> {
    let mut cursor = Cursor {
        bytes: payload,
        at: 0,
    };
    let count = cursor.u32()?;
    let mut ops = Vec::with_capacity(count.min(1 << 16) as usize);
    for _ in 0..count {
        let tag = cursor.u8()?;
        let keyspace = keyspace_of(cursor.u8()?)?;
        let key = cursor.bytes()?;
        let value = match tag {
            OP_INSERT => {
                let bytes = cursor.bytes()?;
                let offset = payload_offset + (cursor.at - bytes.len()) as u64;
                Some((RecordedValue::Bytes(bytes), offset))
            }
            OP_INSERT_BLOB => {
                let (id, len, crc) = (cursor.u64()?, cursor.u64()?, cursor.u32()?);
                Some((RecordedValue::Blob { id, len, crc }, 0))
            }
            OP_REMOVE => None,
            _ => return None,
        };
        ops.push(DecodedOp {
            keyspace,
            key,
            value,
        });
    }
    (cursor.at == payload.len()).then_some(ops)
}

/// Encodes a record payload, appending to `out`.
pub(super) struct PayloadWriter {
    out: Vec<u8>,
}

impl PayloadWriter {
    pub(super) fn new(count: usize) -> Self {
        let mut out = Vec::with_capacity(64);
        out.extend_from_slice(&(count as u32).to_le_bytes());
        Self { out }
    }
    pub(super) fn bytes(&mut self, bytes: &[u8]) {
        self.out
            .extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        self.out.extend_from_slice(bytes);
    }
    pub(super) fn head(&mut self, tag: u8, keyspace: Keyspace, key: &[u8]) {
        self.out.push(tag);
        self.out.push(keyspace_code(keyspace));
        self.bytes(key);
    }
    /// Adds an insert of inline bytes; returns the value's offset within the
    /// payload.
    pub(super) fn insert(&mut self, keyspace: Keyspace, key: &[u8], value: &[u8]) -> usize {
        self.head(OP_INSERT, keyspace, key);
        self.bytes(value);
        self.out.len() - value.len()
    }
    pub(super) fn insert_blob(
        &mut self,
        keyspace: Keyspace,
        key: &[u8],
        id: u64,
        len: u64,
        crc: u32,
    ) {
        self.head(OP_INSERT_BLOB, keyspace, key);
        self.out.extend_from_slice(&id.to_le_bytes());
        self.out.extend_from_slice(&len.to_le_bytes());
        self.out.extend_from_slice(&crc.to_le_bytes());
    }
    pub(super) fn remove(&mut self, keyspace: Keyspace, key: &[u8]) {
        self.head(OP_REMOVE, keyspace, key);
    }
    /// The framed record: length, crc, payload.
    pub(super) fn into_record(self) -> Vec<u8> {
        let mut record = Vec::with_capacity(self.out.len() + RECORD_HEADER_BYTES as usize);
        record.extend_from_slice(&(self.out.len() as u32).to_le_bytes());
        record.extend_from_slice(&crc32fast::hash(&self.out).to_le_bytes());
        record.extend_from_slice(&self.out);
        record
    }
}
