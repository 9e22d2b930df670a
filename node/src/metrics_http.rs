//! Prometheus metrics of a long-running process (`leasehold serve`,
//! `leasehold escrow`): the text exposition format, and a small plain-HTTP
//! listener answering `GET /metrics` on its own port (`--metrics-listen`),
//! with the health probes an orchestrator needs and no client certificate
//! for: `GET /healthz` (200 while the process serves) and `GET /readyz`
//! (200 while it is ready for callers, else 503 with the reason) — so the
//! gRPC port can require mutual TLS of everyone.
//!
//! The endpoint carries no secrets but is unauthenticated: bind it to a
//! private interface (docs/security.md). The listener is bounded like the
//! gRPC one: at most [`MAX_SCRAPES`] connections at once, a request head of at
//! most [`MAX_REQUEST_HEAD`] bytes read within [`REQUEST_TIMEOUT`], one
//! response per connection.
//!
//! Labels are bounded by construction: series exist per policy prefix, per
//! reason or per state — never per key, tenant or caller — and the number of
//! prefixes exported is capped at [`MAX_PREFIX_SERIES`].

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

/// Most scrapes served at once; more connections are closed at once.
pub const MAX_SCRAPES: usize = 16;
/// Most bytes of request line and headers read.
pub const MAX_REQUEST_HEAD: usize = 8 * 1024;
/// A scrape must send its request within this long.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Most policy prefixes with series of their own; the rest are summed into
/// `prefix="__other__"`.
pub const MAX_PREFIX_SERIES: usize = 256;

pub use leasehold_core::metrics::{
    escape_label_value, is_metric_name, Exposition, Histogram, HistogramSnapshot, MetricKind,
};

/// Renders the current metrics of a process.
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// Whether the process is ready for callers now; the reason when not.
pub type Readiness = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// The process's metrics and readiness, as the listener serves them.
#[derive(Clone)]
pub struct Exposed {
    /// The metrics (`/metrics`).
    pub render: Render,
    /// The readiness (`/readyz`).
    pub readiness: Readiness,
}

/// What a request head asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// `GET /metrics` (a query string is ignored).
    Metrics,
    /// `GET /healthz`: the process serves.
    Live,
    /// `GET /readyz`: the process is ready for callers.
    Ready,
    /// Another path.
    NotFound,
    /// Another method.
    MethodNotAllowed,
    /// Not an HTTP request line.
    BadRequest,
}

/// Routes a request by its first line.
pub fn route(head: &[u8]) -> Route {
    let line = head.split(|b| *b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.trim_end_matches('\r').split(' ');
    let (Some(method), Some(target), Some(version)) = (parts.next(), parts.next(), parts.next())
    else {
        return Route::BadRequest;
    };
    if !version.starts_with("HTTP/1.") {
        return Route::BadRequest;
    }
    if method != "GET" && method != "HEAD" {
        return Route::MethodNotAllowed;
    }
    let path = target.split('?').next().unwrap_or_default();
    match path {
        "/metrics" => Route::Metrics,
        "/healthz" => Route::Live,
        "/readyz" => Route::Ready,
        _ => Route::NotFound,
    }
}

/// Serves `GET /metrics`, `/healthz` and `/readyz` on `listener` from
/// `exposed`, until `stop` turns true.
pub async fn serve_metrics(
    listener: TcpListener,
    exposed: Exposed,
    mut stop: watch::Receiver<bool>,
) {
    let permits = Arc::new(Semaphore::new(MAX_SCRAPES));
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.changed() => return,
        };
        let Ok((stream, _)) = accepted else {
            // Out of descriptors or similar: do not spin.
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
            drop(stream);
            continue;
        };
        let exposed = exposed.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let _ = tokio::time::timeout(REQUEST_TIMEOUT, answer(stream, exposed)).await;
        });
    }
}

async fn answer(mut stream: tokio::net::TcpStream, exposed: Exposed) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(512);
    let mut buffer = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && !head.windows(2).any(|w| w == b"\n\n") {
        let read = stream.read(&mut buffer).await?;
        if read == 0 {
            break;
        }
        head.extend_from_slice(&buffer[..read]);
        if head.len() > MAX_REQUEST_HEAD {
            return respond(&mut stream, "431 Request Header Fields Too Large", "", "").await;
        }
    }
    let is_head = head.starts_with(b"HEAD ");
    match route(&head) {
        Route::Metrics => {
            let body = (exposed.render)();
            let body = if is_head { String::new() } else { body };
            respond(
                &mut stream,
                "200 OK",
                "text/plain; version=0.0.4; charset=utf-8",
                &body,
            )
            .await
        }
        Route::Live => respond(&mut stream, "200 OK", "text/plain", "ok\n").await,
        Route::Ready => match (exposed.readiness)() {
            Ok(()) => respond(&mut stream, "200 OK", "text/plain", "ready\n").await,
            Err(why) => {
                let body = format!("not ready: {why}\n");
                respond(&mut stream, "503 Service Unavailable", "text/plain", &body).await
            }
        },
        Route::NotFound => {
            respond(
                &mut stream,
                "404 Not Found",
                "text/plain",
                "metrics are at /metrics, probes at /healthz and /readyz\n",
            )
            .await
        }
        Route::MethodNotAllowed => respond(&mut stream, "405 Method Not Allowed", "", "").await,
        Route::BadRequest => respond(&mut stream, "400 Bad Request", "", "").await,
    }
}

async fn respond(
    stream: &mut tokio::net::TcpStream,
    status: &str,
    content_type: &str,
    body: &str,
) -> std::io::Result<()> {
    let mut response = format!(
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    if !content_type.is_empty() {
        let _ = write!(response, "Content-Type: {content_type}\r\n");
    }
    response.push_str("\r\n");
    response.push_str(body);
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}

/// Binds `addr` and serves metrics and probes there in the background
/// until `stop`.
pub async fn spawn_metrics_listener(
    addr: &str,
    exposed: Exposed,
    stop: watch::Receiver<bool>,
) -> Result<tokio::task::JoinHandle<()>, crate::error::NodeError> {
    let listener = crate::serving::bind(addr).await?;
    tracing::info!(listen = %addr, "serving Prometheus metrics at /metrics, probes at /healthz and /readyz");
    Ok(tokio::spawn(serve_metrics(listener, exposed, stop)))
}

/// Groups `(prefix, value…)` rows so at most [`MAX_PREFIX_SERIES`] prefixes
/// keep series of their own (the first ones in order); the rest are summed
/// into one `__other__` row.
pub fn cap_prefixes<const N: usize>(rows: Vec<(String, [f64; N])>) -> Vec<(String, [f64; N])> {
    if rows.len() <= MAX_PREFIX_SERIES {
        return rows;
    }
    let mut capped: Vec<(String, [f64; N])> = Vec::with_capacity(MAX_PREFIX_SERIES + 1);
    let mut other = [0.0; N];
    for (i, (prefix, values)) in rows.into_iter().enumerate() {
        if i < MAX_PREFIX_SERIES {
            capped.push((prefix, values));
        } else {
            for (sum, value) in other.iter_mut().zip(values) {
                *sum += value;
            }
        }
    }
    capped.push(("__other__".into(), other));
    capped
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn requests_are_routed_by_method_and_path() {
        assert_eq!(
            route(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
            Route::Metrics
        );
        assert_eq!(route(b"GET /metrics?x=1 HTTP/1.0\r\n\r\n"), Route::Metrics);
        assert_eq!(route(b"GET / HTTP/1.1\r\n\r\n"), Route::NotFound);
        assert_eq!(route(b"GET /healthz HTTP/1.1\r\n\r\n"), Route::Live);
        assert_eq!(route(b"HEAD /readyz HTTP/1.1\r\n\r\n"), Route::Ready);
        assert_eq!(route(b"GET /readyz/x HTTP/1.1\r\n\r\n"), Route::NotFound);
        assert_eq!(
            route(b"PUT /healthz HTTP/1.1\r\n\r\n"),
            Route::MethodNotAllowed
        );
        assert_eq!(
            route(b"POST /metrics HTTP/1.1\r\n\r\n"),
            Route::MethodNotAllowed
        );
        assert_eq!(route(b"\x16\x03\x01garbage"), Route::BadRequest);
    }

    #[test]
    fn prefixes_beyond_the_cap_are_summed_into_other() {
        let rows: Vec<(String, [f64; 1])> = (0..MAX_PREFIX_SERIES + 10)
            .map(|i| (format!("p{i}/"), [1.0]))
            .collect();
        let capped = cap_prefixes(rows);
        assert_eq!(capped.len(), MAX_PREFIX_SERIES + 1);
        assert_eq!(
            capped.last().map(|(p, v)| (p.as_str(), v[0])),
            Some(("__other__", 10.0))
        );
    }

    proptest! {
        #[test]
        fn no_request_bytes_panic_the_router(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = route(&bytes);
        }
    }
}
