//! The wrong-service probe: a gRPC health check of
//! `leasehold.v1.Coordinator` tells a coordinator member from an escrow
//! node or another gRPC server.

use std::sync::Arc;

use leasehold_client::transport::Dialer;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

use super::diagnosis::{Diagnosis, COORDINATOR_SERVICE, ESCROW_SERVICE};

/// Whether the endpoint at `addr` is a coordinator member, by its gRPC
/// health (see the module documentation).
pub async fn probe_service(addr: &str, dialer: &Arc<dyn Dialer>) -> Option<Diagnosis> {
    let channel = dialer.dial(addr).await.ok()?;
    let mut health = HealthClient::new(channel);
    let check = |service: &str| HealthCheckRequest {
        service: service.to_string(),
    };
    match health.check(check(COORDINATOR_SERVICE)).await {
        Ok(_) => None,
        Err(status) if status.code() == tonic::Code::NotFound => {
            let escrow = health.check(check(ESCROW_SERVICE)).await.is_ok();
            Some(Diagnosis::WrongService {
                addr: addr.to_string(),
                escrow,
            })
        }
        Err(status) if status.code() == tonic::Code::Unimplemented => {
            Some(Diagnosis::WrongService {
                addr: addr.to_string(),
                escrow: false,
            })
        }
        Err(_) => None,
    }
}
