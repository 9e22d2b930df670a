//! Certificates of a mutual-TLS run: one CA and every identity a run may
//! speak as, minted once by the `leasehold` binary under test (`leasehold
//! certs mint`) — the members (those that serve, one that joins later, and
//! stranger 99 that never does), the regions of escrow nodes and of clients
//! that lease directly, the services calling escrow nodes (the load's and a
//! flooder's), and the runner's operator.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use leasehold_client::transport::Dialer;
use leasehold_core::ids::RegionId;
use leasehold_core::principal::Principal;
use leasehold_node::certs::files_for;
use leasehold_node::tls::{Security, TlsFiles};

/// Regions of escrow nodes a run may have (`region-0` …).
pub const ESCROW_REGIONS: usize = 8;
/// Clients leasing directly a run may have (`direct-0` …).
pub const DIRECT_CLIENTS: usize = 32;
/// A member id that never joins.
pub const STRANGER: u64 = 99;
/// The runner's operator name.
pub const OPERATOR: &str = "chaos";
/// The service name of the load's clients behind escrow nodes.
pub const LOAD_SERVICE: &str = "load";
/// The service name of the holder flooder.
pub const FLOOD_SERVICE: &str = "flood";

/// The certificates of one run, in one directory.
#[derive(Debug, Clone)]
pub struct Identities {
    dir: PathBuf,
}

impl Identities {
    /// Mints a CA and the certificates of members `1..=members + 1` (the
    /// last one joins later) and [`STRANGER`], every region and service
    /// of [`ESCROW_REGIONS`] and [`DIRECT_CLIENTS`], and the operator, into
    /// `dir`, with `binary`; server names: 127.0.0.1 and localhost.
    pub fn mint(binary: &Path, dir: &Path, members: u64) -> Result<Self> {
        let member_ids: Vec<String> = (1..=members + 1)
            .chain([STRANGER])
            .map(|id| id.to_string())
            .collect();
        let escrow_regions: Vec<String> =
            (0..ESCROW_REGIONS).map(|i| format!("region-{i}")).collect();
        let regions: Vec<String> = escrow_regions
            .iter()
            .cloned()
            .chain((0..DIRECT_CLIENTS).map(|i| format!("direct-{i}")))
            .collect();
        let services: Vec<String> = escrow_regions
            .iter()
            .flat_map(|r| {
                [
                    format!("{LOAD_SERVICE}@{r}"),
                    format!("{FLOOD_SERVICE}@{r}"),
                ]
            })
            .collect();
        let output = Command::new(binary)
            .args(["certs", "mint", "--out"])
            .arg(dir)
            .args(["--members", &member_ids.join(",")])
            .args(["--regions", &regions.join(",")])
            .args(["--operators", OPERATOR])
            .args(["--services", &services.join(",")])
            .args(["--ip", "127.0.0.1", "--dns", "localhost"])
            .output()
            .context("running leasehold certs mint")?;
        if !output.status.success() {
            bail!(
                "leasehold certs mint failed: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(Self {
            dir: dir.to_path_buf(),
        })
    }

    /// The CA bundle, certificate and key of `principal`.
    pub fn files(&self, principal: &Principal) -> TlsFiles {
        files_for(&self.dir, principal)
    }

    /// A dialer presenting `principal`'s certificate.
    pub fn dialer(&self, principal: &Principal) -> Arc<dyn Dialer> {
        Security::MutualTls(self.files(principal)).dialer()
    }
}

/// The operator the runner acts as.
pub fn operator() -> Principal {
    Principal::Operator(OPERATOR.into())
}

/// Service `name` of `region`.
pub fn service(name: &str, region: &str) -> Result<Principal> {
    Ok(Principal::Service {
        name: name.into(),
        region: RegionId::new(region)?,
    })
}

/// Region `name`.
pub fn region(name: &str) -> Result<Principal> {
    Ok(Principal::Region(RegionId::new(name)?))
}
