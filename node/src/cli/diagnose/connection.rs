//! The connection probe ([`probe`]): one connection whose
//! every step the probe controls — TCP, HTTP/2's preface (an HTTP/1
//! answer), the ClientHello and the first bytes answered (TLS on one side
//! only), the server's certificate, and what the server does after the
//! handshake (it refused this command's certificate, or talks HTTP/2).

use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use leasehold_client::tls::server_name;
use rustls_pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

use super::certificates::{
    client_config, own_certificate_out_of_date, server_certificate, webpki_verifier, Recorder,
};
use super::diagnosis::{Diagnosis, Refusal};
use crate::connection_adapter::{AdaptedConnection, ReadAdapter};

/// Bound on one endpoint's probe (connect, handshake, answer).
pub(super) const PROBE_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a server has to send its alert (or close) after the handshake
/// before the probe speaks HTTP/2 to it.
const REFUSAL_WAIT: Duration = Duration::from_millis(500);
/// HTTP/2's client connection preface, and an empty SETTINGS frame.
const HTTP2_PREFACE: &[u8] =
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

/// The CA bundle, certificate and key a command connects with over
/// mutual TLS.
pub type TlsFiles<'a> = (&'a Path, &'a Path, &'a Path);

/// What connecting to `addr` with `files` (none: in plaintext) says goes
/// wrong (see the module documentation of [`super`]), if anything.
pub async fn probe(addr: &str, files: Option<TlsFiles<'_>>) -> Option<Diagnosis> {
    if let Some(status_line) = http_one_status_line(addr).await {
        return Some(Diagnosis::HttpOneListener {
            addr: addr.to_string(),
            status_line,
        });
    }
    let tcp = TcpStream::connect(addr).await.ok()?;
    let _ = tcp.set_nodelay(true);
    if let Some((_, cert, _)) = files {
        if let Some(expired) = own_certificate_out_of_date(cert) {
            return Some(expired);
        }
    }
    let verifier = Arc::new(Recorder::new(match files {
        Some((ca, _, _)) => Some(webpki_verifier(ca)?),
        None => None,
    }));
    let config = client_config(verifier.clone(), files)?;
    let first_bytes = Arc::new(Mutex::new(Vec::new()));
    let stream = AdaptedConnection::new(tcp, KeepFirstBytes(first_bytes.clone()));
    let host = server_name(addr);
    let name = ServerName::try_from(host.clone()).ok()?;
    let handshake = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, stream)
        .await;
    let reply = first_bytes
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    let addr = addr.to_string();
    let Some((ca, cert, _)) = files else {
        // Plaintext command: only a TLS server is a diagnosis.
        return is_tls_record(&reply).then_some(Diagnosis::ServerSpeaksTls { addr });
    };
    match handshake {
        Ok(mut stream) => refusal_after_handshake(&mut stream).await.map(|why| {
            Diagnosis::ClientCertificateRefused {
                addr,
                cert: cert.to_path_buf(),
                why,
            }
        }),
        Err(error) => match rustls_error(&error) {
            Some(rustls::Error::InvalidCertificate(problem)) => Some(server_certificate(
                addr,
                &host,
                ca,
                problem,
                verifier.presented().as_deref(),
            )),
            Some(rustls::Error::AlertReceived(alert)) if is_tls_record(&reply) => {
                Some(Diagnosis::ClientCertificateRefused {
                    addr,
                    cert: cert.to_path_buf(),
                    why: Refusal::Alert(*alert),
                })
            }
            _ if !reply.is_empty() && !is_tls_record(&reply) => {
                Some(Diagnosis::ServerSpeaksPlaintext { addr })
            }
            _ => None,
        },
    }
}

/// The status line the server at `addr` answers HTTP/2's connection
/// preface with, when it answers in HTTP/1 (a gRPC server, plaintext or
/// TLS, never does: it sends a SETTINGS frame, a TLS alert, or closes).
async fn http_one_status_line(addr: &str) -> Option<String> {
    let mut tcp = TcpStream::connect(addr).await.ok()?;
    tcp.write_all(HTTP2_PREFACE).await.ok()?;
    let mut answer = Vec::new();
    let mut buf = [0u8; 256];
    let read_line = async {
        while !answer.contains(&b'\n') && answer.len() < buf.len() {
            match tcp.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(read) => answer.extend_from_slice(&buf[..read]),
            }
        }
    };
    let _ = tokio::time::timeout(REFUSAL_WAIT, read_line).await;
    http_one_status(&answer)
}

/// The status line of `answer` when it opens an HTTP/1 response.
fn http_one_status(answer: &[u8]) -> Option<String> {
    if !answer.starts_with(b"HTTP/1.") {
        return None;
    }
    let line = answer.split(|b| *b == b'\n').next().unwrap_or_default();
    Some(String::from_utf8_lossy(line).trim_end().to_string())
}

/// After a handshake whose server certificate verified: `None` when the
/// server talks HTTP/2 (it accepted this certificate), else how it refused.
async fn refusal_after_handshake<S>(stream: &mut S) -> Option<Refusal>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut buf = [0u8; 64];
    // A refusing server sends its alert (or closes) at once; an accepting
    // one may wait for the client's first bytes.
    if let Ok(read) = tokio::time::timeout(REFUSAL_WAIT, stream.read(&mut buf)).await {
        return refusal_of(read);
    }
    if stream.write_all(HTTP2_PREFACE).await.is_err() || stream.flush().await.is_err() {
        // Closed in between: read what it said last.
        return refusal_of(stream.read(&mut buf).await).or(Some(Refusal::Closed));
    }
    tokio::time::timeout(PROBE_TIMEOUT, stream.read(&mut buf))
        .await
        .ok()
        .and_then(refusal_of)
}

fn refusal_of(read: io::Result<usize>) -> Option<Refusal> {
    match read {
        Ok(0) => Some(Refusal::Closed),
        Ok(_) => None,
        Err(error) => Some(match rustls_error(&error) {
            Some(rustls::Error::AlertReceived(alert)) => Refusal::Alert(*alert),
            _ => Refusal::Closed,
        }),
    }
}

/// The rustls error inside an IO error of a TLS stream.
fn rustls_error(error: &io::Error) -> Option<&rustls::Error> {
    error.get_ref()?.downcast_ref::<rustls::Error>()
}

/// Whether `bytes` open a TLS record (handshake or alert, TLS 1.x).
fn is_tls_record(bytes: &[u8]) -> bool {
    matches!(bytes, [0x15 | 0x16, 0x03, ..])
}

/// Keeps the first bytes read from a connection ([`FIRST_BYTES`] at most).
struct KeepFirstBytes(Arc<Mutex<Vec<u8>>>);

/// How many first bytes [`KeepFirstBytes`] keeps.
const FIRST_BYTES: usize = 16;

impl<S: AsyncRead + Unpin> ReadAdapter<S> for KeepFirstBytes {
    fn poll_read(
        &mut self,
        inner: Pin<&mut S>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = inner.poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            let mut seen = self
                .0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let room = FIRST_BYTES.saturating_sub(seen.len());
            let new = &buf.filled()[before..];
            seen.extend_from_slice(&new[..new.len().min(room)]);
        }
        polled
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_records_are_told_from_http2_frames() {
        assert!(is_tls_record(&[0x16, 0x03, 0x03, 0x00, 0x7a]));
        assert!(is_tls_record(&[0x15, 0x03, 0x03, 0x00, 0x02]));
        // An HTTP/2 SETTINGS frame, as a plaintext server's first bytes.
        assert!(!is_tls_record(&[0x00, 0x00, 0x12, 0x04, 0x00]));
        assert!(!is_tls_record(b"HTTP/1.1 400"));
        assert!(!is_tls_record(&[]));
    }

    #[test]
    fn http_one_answers_are_told_from_grpc_and_tls() {
        assert_eq!(
            http_one_status(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n").as_deref(),
            Some("HTTP/1.1 400 Bad Request")
        );
        assert_eq!(
            http_one_status(b"HTTP/1.0 200 OK").as_deref(),
            Some("HTTP/1.0 200 OK")
        );
        // An HTTP/2 SETTINGS frame, a TLS alert, nothing.
        assert_eq!(http_one_status(&[0, 0, 0, 4, 0, 0, 0, 0, 0]), None);
        assert_eq!(http_one_status(&[0x15, 0x03, 0x03, 0, 2, 2, 50]), None);
        assert_eq!(http_one_status(b""), None);
        assert_eq!(http_one_status(b"HTTP/2 200"), None);
    }
}
