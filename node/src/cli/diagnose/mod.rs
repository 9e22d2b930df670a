//! Why a client command's call failed underneath: when the call failed at
//! the connection (a transport error, an unreachable or silent member) or
//! was refused as if by another service (`UNIMPLEMENTED`,
//! `PERMISSION_DENIED`, `UNAUTHENTICATED`), every endpoint is probed once
//! and the first cause found (in endpoint order) replaces the error.
//!
//! The client library's own error for such a failure depends on timing:
//! which side of a TLS handshake notices first, whether the peer's alert
//! or its close arrives before the client writes, which retry ran last. The
//! probe makes one connection whose every step it controls, so the same
//! setup gets the same answer on every run:
//!
//! 1. TCP connect (nothing listening: no diagnosis, the error stands).
//!    HTTP/2's connection preface is sent on a first connection: a server
//!    that answers it in HTTP/1 (a `--metrics-listen` port, a web server)
//!    is no gRPC server at all, and is named as such whatever the TLS
//!    settings.
//! 2. With `--ca/--cert/--cert-key`: this command's certificate is read
//!    and checked for its validity period (an expired one is named before
//!    anything is sent).
//! 3. A TLS ClientHello. The first bytes of the answer tell a TLS server (a
//!    TLS record) from a plaintext one (an HTTP/2 frame, or anything that
//!    is not TLS): TLS on one side only is named as such.
//! 4. The server's certificate is verified against `--ca` for the dialled
//!    host name, as the client does (unknown issuer, expired, not valid for
//!    the name), and its SANs and expiry are read for the message.
//! 5. After the handshake the server either talks HTTP/2 (it accepted this
//!    command's certificate), or sends a TLS alert (`unknown_ca`,
//!    `certificate_expired`, `bad_certificate`, …) or closes the connection:
//!    it refused the certificate.
//!
//! A call that has not finished within [`EARLY_PROBE_AFTER`] is probed
//! meanwhile ([`early`]): a certificate or TLS mismatch is named as soon as
//! the probe finds it, instead of after the call's retries (seconds).
//!
//! Wrong service: a gRPC health check of `leasehold.v1.Coordinator` at the
//! endpoint. A member always knows that service (`SERVING` or
//! `NOT_SERVING`); anything else answers `NOT_FOUND` (an escrow node, whose
//! health knows `leasehold.v1.Escrow` instead) or has no health service at
//! all. Health answers any authenticated identity, so the check works with
//! the certificate the refused call used.

//!
//! # Layout
//! - [`diagnosis`]: what a probe finds ([`Diagnosis`]), with its code,
//!   message and hint.
//! - [`connection`]: the connection probe ([`probe_connection`]): TCP,
//!   HTTP/1, TLS on one side only, who refused whose certificate.
//! - [`certificates`]: the certificates of a probe: verifying the
//!   server's while recording why it failed, reading what they say.
//! - [`service`]: the wrong-service probe ([`probe_service`]).

pub mod certificates;
pub mod connection;
pub mod diagnosis;
pub mod service;

use std::time::Duration;

use leasehold_client::coordinator::CoordinatorError;
use leasehold_client::transport::normalize_endpoints;

use super::args::{ClientArgs, TransportArgs};
use super::error::CliError;
use connection::PROBE_TIMEOUT;
pub use diagnosis::{Diagnosis, Refusal};
pub use service::probe_service;

/// How long a client command's call runs before its endpoints are probed
/// meanwhile ([`early`]): most calls have answered by then.
pub const EARLY_PROBE_AFTER: Duration = Duration::from_millis(300);

/// What connecting to `addr` as `transport` says goes wrong (see the module
/// documentation), if anything.
pub async fn probe_connection(addr: &str, transport: &TransportArgs) -> Option<Diagnosis> {
    let files = match (&transport.ca, &transport.cert, &transport.cert_key) {
        (Some(ca), Some(cert), Some(key)) if !transport.insecure => {
            Some((ca.as_path(), cert.as_path(), key.as_path()))
        }
        _ => None,
    };
    connection::probe(addr, files).await
}

/// `error` of a command that called `client`'s endpoints, replaced by the
/// cause a probe of the endpoints finds, if any.
pub async fn explain(error: CoordinatorError, client: &ClientArgs) -> CliError {
    let Ok(endpoints) = normalize_endpoints(&client.endpoints) else {
        return error.into();
    };
    let found = match &error {
        CoordinatorError::Transport { .. }
        | CoordinatorError::Unavailable { .. }
        | CoordinatorError::DeadlineExceeded { .. } => {
            let transport = &client.transport;
            first_found(&endpoints, |addr| async move {
                probe_connection(&addr, transport).await
            })
            .await
        }
        CoordinatorError::Rpc {
            code:
                tonic::Code::Unimplemented
                | tonic::Code::PermissionDenied
                | tonic::Code::Unauthenticated,
            ..
        } => match client.transport.dialer() {
            Ok(dialer) => {
                let dialer = &dialer;
                first_found(&endpoints, |addr| async move {
                    probe_service(&addr, dialer).await
                })
                .await
            }
            Err(_) => None,
        },
        _ => None,
    };
    match found {
        Some(diagnosis) => CliError::Diagnosed(diagnosis),
        None => error.into(),
    }
}

/// What the connection probe finds at `client`'s endpoints while its call
/// is still retrying ([`probe_connection`] on each, the first cause in
/// endpoint order): a setup that cannot work is named without waiting for
/// the call's retries to give up. `None` when every endpoint connects as
/// it should (or cannot be reached at all: the call's retries decide).
pub async fn early(client: &ClientArgs) -> Option<Diagnosis> {
    let endpoints = normalize_endpoints(&client.endpoints).ok()?;
    let transport = &client.transport;
    first_found(&endpoints, |addr| async move {
        probe_connection(&addr, transport).await
    })
    .await
}

/// The first diagnosis, in endpoint order, of probes run concurrently.
async fn first_found<F, Fut>(endpoints: &[String], probe: F) -> Option<Diagnosis>
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = Option<Diagnosis>>,
{
    let probes = endpoints.iter().map(|addr| {
        let probe = probe(addr.clone());
        async move {
            tokio::time::timeout(PROBE_TIMEOUT, probe)
                .await
                .ok()
                .flatten()
        }
    });
    futures::future::join_all(probes)
        .await
        .into_iter()
        .flatten()
        .next()
}
