//! `leasehold escrow`: run a regional escrow node (L2).

use clap::Args;
use leasehold_core::ids::RegionId;

use super::{shutdown_signal, CliError};
use crate::escrow::{serve_escrow, EscrowConfig};

/// Arguments of `leasehold escrow`.
#[derive(Debug, Clone, Args)]
pub struct EscrowArgs {
    /// The region this node serves (1..=64 bytes).
    #[arg(long)]
    pub region: String,
    /// HOST:PORT to listen on.
    #[arg(long, default_value = "127.0.0.1:7201")]
    pub listen: String,
    /// Coordinator member(s) as HOST:PORT; repeat or comma-separate.
    #[arg(long = "coordinator", value_delimiter = ',', required = true)]
    pub coordinators: Vec<String>,
    /// Tokens per coordinator lease (the starting size with --eoq).
    #[arg(long, default_value_t = 16)]
    pub batch: u64,
    /// Learn each key's lease size online (EOQ) instead of a fixed batch.
    #[arg(long)]
    pub eoq: bool,
    /// Most keys tracked at once.
    #[arg(long, default_value_t = 100_000)]
    pub max_keys: usize,
    /// While the coordinator is unreachable, probe it this often (ms).
    #[arg(long, default_value_t = 1_000)]
    pub probe_interval_ms: u64,
    /// Release a key's credits after it has been idle this long (ms).
    #[arg(long, default_value_t = 30_000)]
    pub idle_evict_ms: u64,
}

impl EscrowArgs {
    /// The node configuration these arguments describe.
    pub fn config(&self) -> Result<EscrowConfig, CliError> {
        let region =
            RegionId::new(self.region.clone()).map_err(|e| CliError::Usage(e.to_string()))?;
        let mut config = EscrowConfig::new(region, self.listen.clone(), self.coordinators.clone());
        config.batch = self.batch;
        config.eoq = self.eoq;
        config.max_keys = self.max_keys;
        config.probe_interval_ms = self.probe_interval_ms;
        config.idle_evict_ms = self.idle_evict_ms;
        config.validate()?;
        Ok(config)
    }
}

/// Runs the escrow node until Ctrl-C or SIGTERM.
pub async fn run(args: EscrowArgs) -> Result<(), CliError> {
    let config = args.config()?;
    serve_escrow(config, shutdown_signal()).await?;
    Ok(())
}
