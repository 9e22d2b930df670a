//! A minimal RESP (the Redis serialization protocol, version 2) codec for
//! the load generators: commands as arrays of bulk strings, and an
//! incremental reply parser over a byte buffer, so one reader can take
//! pipelined replies off a connection in order, as many as have arrived.

use std::fmt;

/// Appends one command (an array of bulk strings) to `out`.
pub fn push_command(out: &mut Vec<u8>, parts: &[&[u8]]) {
    out.extend_from_slice(format!("*{}\r\n", parts.len()).as_bytes());
    for part in parts {
        out.extend_from_slice(format!("${}\r\n", part.len()).as_bytes());
        out.extend_from_slice(part);
        out.extend_from_slice(b"\r\n");
    }
}

/// One reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// `+OK`
    Simple(String),
    /// `-ERR …`
    Error(String),
    /// `:42`
    Integer(i64),
    /// `$3\r\nabc` (`None`: the null bulk string, `$-1`).
    Bulk(Option<Vec<u8>>),
    /// `*2\r\n…` (`None`: the null array, `*-1`).
    Array(Option<Vec<Reply>>),
}

/// A reply that is not RESP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed(pub String);

impl fmt::Display for Malformed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "malformed RESP reply: {}", self.0)
    }
}

impl std::error::Error for Malformed {}

/// Parses the first reply in `buf`: `Ok(Some((reply, bytes used)))`, or
/// `Ok(None)` while it has not arrived whole.
pub fn parse_reply(buf: &[u8]) -> Result<Option<(Reply, usize)>, Malformed> {
    let Some(end) = buf.windows(2).position(|w| w == b"\r\n") else {
        return Ok(None);
    };
    let Some((&kind, rest)) = buf[..end].split_first() else {
        return Err(Malformed("an empty line".into()));
    };
    let line = std::str::from_utf8(rest).map_err(|_| Malformed("a line not in UTF-8".into()))?;
    let after = end + 2;
    let number = |line: &str| {
        line.parse::<i64>()
            .map_err(|_| Malformed(format!("{line:?} is not a number")))
    };
    match kind {
        b'+' => Ok(Some((Reply::Simple(line.into()), after))),
        b'-' => Ok(Some((Reply::Error(line.into()), after))),
        b':' => Ok(Some((Reply::Integer(number(line)?), after))),
        b'$' => {
            let len = number(line)?;
            if len < 0 {
                return Ok(Some((Reply::Bulk(None), after)));
            }
            let len = usize::try_from(len).map_err(|_| Malformed("bulk length".into()))?;
            if buf.len() < after + len + 2 {
                return Ok(None);
            }
            if &buf[after + len..after + len + 2] != b"\r\n" {
                return Err(Malformed("a bulk string without its CRLF".into()));
            }
            let payload = buf[after..after + len].to_vec();
            Ok(Some((Reply::Bulk(Some(payload)), after + len + 2)))
        }
        b'*' => {
            let count = number(line)?;
            if count < 0 {
                return Ok(Some((Reply::Array(None), after)));
            }
            let mut used = after;
            let mut items = Vec::new();
            for _ in 0..count {
                match parse_reply(&buf[used..])? {
                    Some((item, n)) => {
                        items.push(item);
                        used += n;
                    }
                    None => return Ok(None),
                }
            }
            Ok(Some((Reply::Array(Some(items)), used)))
        }
        other => Err(Malformed(format!("unknown type byte {:?}", other as char))),
    }
}
