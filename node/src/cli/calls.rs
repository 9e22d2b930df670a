//! The coordinator calls: `leasehold lease | reconcile | pool-grant | window`.

use clap::Args;
use serde_json::json;

use super::args::ClientArgs;
use super::error::CliError;
use super::output::{disposition_name, emit, lease_json, window_json};

/// Options of `leasehold lease`.
#[derive(Debug, Clone, Args)]
pub struct LeaseArgs {
    /// The budget's key.
    #[arg(long)]
    pub key: String,
    /// The asking region.
    #[arg(long)]
    pub region: String,
    /// Tokens wanted (≥ 1).
    #[arg(long)]
    pub tokens: u64,
    /// Where to connect and how to print.
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Options of `leasehold reconcile`.
#[derive(Debug, Clone, Args)]
pub struct ReconcileArgs {
    /// The budget's key.
    #[arg(long)]
    pub key: String,
    /// The returning region.
    #[arg(long)]
    pub region: String,
    /// Unused tokens handed back.
    #[arg(long)]
    pub leftover: u64,
    /// Start of the window the tokens were granted in (from `lease`).
    #[arg(long)]
    pub window_start: u64,
    /// Where to connect and how to print.
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Options of `leasehold pool-grant`.
#[derive(Debug, Clone, Args)]
pub struct PoolGrantArgs {
    /// The budget's key (a `fair` policy).
    #[arg(long)]
    pub key: String,
    /// The asking region.
    #[arg(long)]
    pub region: String,
    /// The weight this caller declares for the region (≥ 1). The region
    /// weighs the sum over its nodes of each one's latest declaration in
    /// the window: a later call naming the same --node replaces this one,
    /// and is not added to it.
    #[arg(long)]
    pub weight: u64,
    /// The total grant the region would like for this window.
    #[arg(long)]
    pub want: u64,
    /// The node this call speaks for (1..=128 bytes). Default:
    /// `cli@<host name>`, so that calls from one host for one region are
    /// one node.
    #[arg(long)]
    pub node: Option<String>,
    /// Where to connect and how to print.
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Options of `leasehold window`.
#[derive(Debug, Clone, Args)]
pub struct WindowArgs {
    /// The budget's key.
    #[arg(long)]
    pub key: String,
    /// Where to connect and how to print.
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Runs `leasehold lease`.
pub async fn lease(args: LeaseArgs) -> Result<(), CliError> {
    let response = args
        .client
        .client()?
        .lease(&args.key, &args.region, args.tokens)
        .await?;
    emit(args.client.output, lease_json(&response), || {
        format!(
            "granted {} of {} (limit {}), window [{}, {}), valid for {} ms",
            response.granted,
            args.tokens,
            response.limit,
            response.window_start_ms,
            response.window_end_ms,
            response.remaining_lifetime_ms
        )
    });
    Ok(())
}

/// Runs `leasehold reconcile`.
pub async fn reconcile(args: ReconcileArgs) -> Result<(), CliError> {
    let response = args
        .client
        .client()?
        .reconcile(&args.key, &args.region, args.leftover, args.window_start)
        .await?;
    let disposition = disposition_name(&response);
    emit(
        args.client.output,
        json!({"credited": response.credited, "disposition": disposition}),
        || {
            format!(
                "credited {} of {} back ({disposition})",
                response.credited, args.leftover
            )
        },
    );
    Ok(())
}

/// Runs `leasehold pool-grant`.
pub async fn pool_grant(args: PoolGrantArgs) -> Result<(), CliError> {
    let client = args.client.client()?;
    let node = args.node.clone().unwrap_or_else(|| {
        crate::escrow::cut_to_node_name(format!("cli@{}", crate::escrow::host_name()))
    });
    client.set_node_name(&node)?;
    let response = client
        .pool_grant(leasehold_client::coordinator::PoolGrantCall::new(
            &args.key,
            &args.region,
            args.weight,
            args.want,
        ))
        .await?;
    let json = json!({
        "granted_total": response.granted_total,
        "limit": response.limit,
        "window_start_ms": response.window_start_ms,
        "window_end_ms": response.window_end_ms,
        "coordinator_now_ms": response.coordinator_now_ms,
        "remaining_lifetime_ms": response.remaining_lifetime_ms,
    });
    emit(args.client.output, json, || {
        format!(
            "region {} now holds {} of {} (wanted {}), window [{}, {}), valid for {} ms",
            args.region,
            response.granted_total,
            response.limit,
            args.want,
            response.window_start_ms,
            response.window_end_ms,
            response.remaining_lifetime_ms
        )
    });
    Ok(())
}

/// Runs `leasehold window`.
pub async fn window(args: WindowArgs) -> Result<(), CliError> {
    let window = args.client.client()?.get_window(&args.key).await?;
    emit(args.client.output, window_json(&window), || {
        let mut text = format!(
            "{}: granted {} returned {} of limit {} in window [{}, {}) (coordinator clock {})",
            window.key,
            window.granted,
            window.returned,
            window.limit,
            window.window_start_ms,
            window.window_end_ms,
            window.coordinator_now_ms
        );
        if window.policy.as_ref().is_some_and(|p| p.shadow) || window.would_deny_requests > 0 {
            text.push_str(&format!(
                "\n  shadow: would deny {} tokens in {} requests",
                window.would_deny_tokens, window.would_deny_requests
            ));
        }
        for region in &window.regions {
            text.push_str(&format!(
                "\n  {:<12} granted {:>8} returned {:>8} weight {}",
                region.region, region.granted, region.returned, region.pool_weight
            ));
        }
        text
    });
    Ok(())
}
