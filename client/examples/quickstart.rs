//! Quick start: a leased limiter talking to a regional escrow node.
//!
//! Start a local cluster with escrow nodes first (`cargo run --release --
//! dev` prints their addresses), then:
//!
//! ```sh
//! cargo run -p leasehold-client --example quickstart -- <escrow-addr> [key] [requests] [mode]
//! # e.g.
//! cargo run -p leasehold-client --example quickstart -- 127.0.0.1:7201 demo/api 50 leased
//! ```
//!
//! - `escrow-addr`: `host:port` of an escrow node (required).
//! - `key`: a key some policy covers (default `demo/api`).
//! - `requests`: how many checks of cost 1 to make (default 20).
//! - `mode`: `leased` (default), `strict` or `cached-deny`.
//!
//! With `LEASEHOLD_CA`, `LEASEHOLD_CERT` and `LEASEHOLD_KEY` set (a service
//! certificate of the escrow node's region; `leasehold dev` prints them) it
//! connects over mutual TLS, otherwise in plaintext (`--insecure` nodes).
//!
//! It prints every decision, then the limiter's counters: in leased mode
//! most checks are answered in-process, with one `Acquire` per batch.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use leasehold_client::tls::{ClientTlsFiles, TlsDialer};
use leasehold_client::transport::{Dialer, TcpDialer};
use leasehold_client::{
    ClientId, EscrowSource, EscrowSourceOptions, LeaseOptions, LeaseSizing, Limiter, LimiterConfig,
    Mode,
};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(addr) = args.first() else {
        bail!("usage: quickstart <escrow-addr> [key] [requests] [leased|strict|cached-deny]");
    };
    let key = args.get(1).map_or("demo/api", String::as_str);
    let requests: u64 = match args.get(2) {
        Some(n) => n.parse().context("requests must be a number")?,
        None => 20,
    };
    let mode = match args.get(3).map_or("leased", String::as_str) {
        "leased" => Mode::Leased(
            LeaseOptions::default()
                .with_sizing(LeaseSizing::Fixed(8))
                .with_low_water(2)
                .with_return_idle_after(Duration::from_secs(5)),
        ),
        "strict" => Mode::Strict,
        "cached-deny" => Mode::CachedDeny,
        other => bail!("unknown mode {other:?}: use leased, strict or cached-deny"),
    };

    let env = |name: &str| std::env::var_os(name).map(std::path::PathBuf::from);
    let dialer: Arc<dyn Dialer> = match (
        env("LEASEHOLD_CA"),
        env("LEASEHOLD_CERT"),
        env("LEASEHOLD_KEY"),
    ) {
        (Some(ca), Some(cert), Some(key)) => {
            Arc::new(TlsDialer::new(ClientTlsFiles { ca, cert, key }))
        }
        _ => Arc::new(TcpDialer::default()),
    };
    let source = EscrowSource::new(addr, dialer, EscrowSourceOptions::default())?;
    let client_id = ClientId::new(format!("quickstart-{}", std::process::id()))?;
    let limiter = Limiter::new(source, LimiterConfig::new(mode, client_id))?;

    for i in 1..=requests {
        let admission = limiter.check_labelled(key, 1).await?;
        let d = admission.decision;
        if d.allowed {
            println!(
                "#{i:>3} allowed  remaining={:<5} window={:?} reset_at_ms={}",
                d.remaining, admission.window_start_ms, d.reset_at_ms
            );
        } else {
            println!(
                "#{i:>3} denied   retry_after_ms={} reset_at_ms={}",
                d.retry_after_ms, d.reset_at_ms
            );
        }
    }
    let returned = limiter
        .return_idle_credits(Duration::ZERO)
        .await
        .unwrap_or(0);
    println!("returned {returned} unused credits");
    println!("{:#?}", limiter.stats());
    Ok(())
}
