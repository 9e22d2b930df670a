//! Static checks of `deploy/`: the files parse, and what one object names
//! another object defines (no container can pull, no probe can run here, so
//! consistency is what a test can hold them to). `deploy/test-compose.sh`
//! runs the compose file for real; these run in every `cargo test`.
//!
//! - `k8s`: every manifest parses; selectors, service names, ports, probes,
//!   Prometheus annotations and the member addresses in arguments match
//!   the objects they name; members are spread over nodes; the init Job
//!   sets no policy; the base is mutual TLS with probes that need no
//!   certificate; the overlays patch only what the base defines.
//! - `k8s_run`: the base's arguments run as processes with the Secrets of
//!   `deploy/k8s/mint-secrets.sh`: probes answer, a lease goes through.
//! - `compose`: services, volumes and certificate files referenced exist;
//!   health checks and metrics ports are wired.
//! - `systemd`: the units parse, their user is created by the sysusers
//!   file, required environment is not optional; `systemd-analyze verify`,
//!   `systemd-sysusers` and `systemd-tmpfiles` accept them where installed.

mod compose;
mod helm;
mod k8s;
mod k8s_run;
mod systemd;
mod yaml;

use std::path::PathBuf;

/// The repository's `deploy/` directory.
pub fn deploy_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("deploy")
}
