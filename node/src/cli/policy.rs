//! `leasehold policy set | list | delete | apply`: the replicated policy
//! table (`apply` sets every policy of a policy file).

use std::path::PathBuf;

use clap::{Args, Subcommand, ValueEnum};
use leasehold_core::policy::{OutagePolicy, Policy};
use leasehold_proto::v1 as pb;
use serde_json::json;

use super::args::ClientArgs;
use super::config::report_text;
use super::error::CliError;
use super::output::{emit, policy_json, policy_text};
use crate::config_check::{check_file, CheckOptions, FileKind};
use crate::policy_file::PolicyFile;

/// Options of `leasehold policy`.
#[derive(Debug, Clone, Args)]
pub struct PolicyArgs {
    /// Which policy command.
    #[command(subcommand)]
    pub command: PolicyCommand,
}

/// The policy commands.
#[derive(Debug, Clone, Subcommand)]
pub enum PolicyCommand {
    /// Insert or replace the policy of a key prefix.
    Set(SetArgs),
    /// List every policy (linearizable).
    List(ListArgs),
    /// Remove the policy with exactly this prefix.
    Delete(DeleteArgs),
    /// Set every policy of a policy file or rate limit configuration (checked first; nothing is set if any entry is wrong).
    Apply(ApplyArgs),
}

/// Options of `policy apply`.
#[derive(Debug, Clone, Args)]
pub struct ApplyArgs {
    /// The policy file (`[[policy]]` tables; see deploy/config/policies.example.toml),
    /// or an `envoyproxy/ratelimit` configuration (`.yaml`/`.yml`: the
    /// policies its rules stand for; see docs/envoy.md).
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// Where to connect and how to print.
    #[command(flatten)]
    pub client: ClientArgs,
}

/// How a key's budget is shared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum KindArg {
    /// First-come leasing.
    Counter,
    /// Region fair pool plus in-region tenant fairness.
    Fair,
}

/// What escrow nodes do while the coordinator is unreachable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutageArg {
    /// Serve what is held, then deny (Δ = 0 holds).
    FailClosed,
    /// Admit up to --fallback-tokens per region per window.
    Fallback,
}

/// Options of `policy set`.
#[derive(Debug, Clone, Args)]
pub struct SetArgs {
    /// Key prefix the policy applies to (longest match wins; may be empty).
    #[arg(long)]
    pub prefix: String,
    /// Tokens per window.
    #[arg(long)]
    pub limit: u64,
    /// Window length in milliseconds.
    #[arg(long)]
    pub window_ms: u64,
    /// Counter or fair.
    #[arg(long, value_enum, default_value_t = KindArg::Counter)]
    pub kind: KindArg,
    /// Outage behaviour of escrow nodes.
    #[arg(long, value_enum, default_value_t = OutageArg::FailClosed)]
    pub outage: OutageArg,
    /// With `--outage fallback`: tokens per region per window during an outage.
    #[arg(long, default_value_t = 0)]
    pub fallback_tokens: u64,
    /// Shadow mode: compute and count would-deny decisions (`leasehold
    /// window`, `cluster status`, escrow status) but never deny. The limit
    /// is NOT enforced while set; `policy set` again without `--shadow`
    /// enforces from the next decision on.
    #[arg(long)]
    pub shadow: bool,
    /// Where to connect and how to print.
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Options of `policy list`.
#[derive(Debug, Clone, Args)]
pub struct ListArgs {
    /// Where to connect and how to print.
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Options of `policy delete`.
#[derive(Debug, Clone, Args)]
pub struct DeleteArgs {
    /// The exact prefix of the policy to remove.
    #[arg(long)]
    pub prefix: String,
    /// Succeed (exit 0) when no policy has this prefix; without it that is
    /// an error (exit 1), so a typo in the prefix does not pass silently.
    #[arg(long)]
    pub if_exists: bool,
    /// Where to connect and how to print.
    #[command(flatten)]
    pub client: ClientArgs,
}

impl SetArgs {
    /// The policy these flags describe.
    pub fn policy(&self) -> Result<pb::Policy, CliError> {
        let outage = match self.outage {
            OutageArg::FailClosed if self.fallback_tokens > 0 => {
                return Err(CliError::Usage(
                    "--fallback-tokens needs --outage fallback".into(),
                ));
            }
            OutageArg::FailClosed => OutagePolicy::FailClosed,
            OutageArg::Fallback => OutagePolicy::Fallback {
                tokens_per_region: self.fallback_tokens,
            },
        };
        let policy = match self.kind {
            KindArg::Counter => Policy::counter(self.prefix.clone(), self.limit, self.window_ms),
            KindArg::Fair => Policy::fair(self.prefix.clone(), self.limit, self.window_ms),
        };
        Ok(policy.with_outage(outage).with_shadow(self.shadow).into())
    }
}

/// Runs `leasehold policy …`.
pub async fn run(args: PolicyArgs) -> Result<(), CliError> {
    match args.command {
        PolicyCommand::Set(args) => {
            let policy = args.policy()?;
            args.client
                .client()?
                .admin()
                .set_policy(policy.clone())
                .await?;
            emit(
                args.client.output,
                json!({"set": policy_json(&policy)}),
                || format!("set {}", policy_text(&policy)),
            );
        }
        PolicyCommand::List(args) => {
            let policies = args.client.client()?.admin().list_policies().await?;
            emit(
                args.client.output,
                json!({"policies": policies.iter().map(policy_json).collect::<Vec<_>>()}),
                || {
                    if policies.is_empty() {
                        "no policies".to_string()
                    } else {
                        policies
                            .iter()
                            .map(policy_text)
                            .collect::<Vec<_>>()
                            .join("\n")
                    }
                },
            );
        }
        PolicyCommand::Apply(args) => {
            let ratelimit = crate::ratelimit_file::is_ratelimit_file(&args.file);
            let options = CheckOptions {
                kind: Some(if ratelimit {
                    FileKind::Ratelimit
                } else {
                    FileKind::Policies
                }),
                skip_files: true,
            };
            let report = check_file(&args.file, options);
            if report.errors() > 0 {
                eprint!("{}", report_text(std::slice::from_ref(&report)));
                return Err(CliError::Usage(format!(
                    "{} has {} error(s); nothing was set",
                    args.file.display(),
                    report.errors()
                )));
            }
            let policies = if ratelimit {
                crate::ratelimit_file::load(&args.file)
                    .map_err(|problems| {
                        CliError::Usage(format!("{} problem(s) in the file", problems.len()))
                    })?
                    .policies()
                    .iter()
                    .map(pb::Policy::from)
                    .collect::<Vec<_>>()
            } else {
                PolicyFile::load(&args.file)
                    .map_err(|e| CliError::Usage(e.to_string()))?
                    .to_wire()
                    .map_err(|problems| {
                        CliError::Usage(format!("{} problem(s) in the file", problems.len()))
                    })?
            };
            let admin = args.client.client()?.admin();
            for policy in &policies {
                admin.set_policy(policy.clone()).await?;
            }
            emit(
                args.client.output,
                json!({"set": policies.iter().map(policy_json).collect::<Vec<_>>()}),
                || {
                    policies
                        .iter()
                        .map(|p| format!("set {}", policy_text(p)))
                        .collect::<Vec<_>>()
                        .join("\n")
                },
            );
        }
        PolicyCommand::Delete(args) => {
            let existed = args
                .client
                .client()?
                .admin()
                .delete_policy(&args.prefix)
                .await?;
            if !existed && !args.if_exists {
                return Err(CliError::NotFound(format!(
                    "no policy has the prefix {:?} (nothing deleted; `leasehold policy list` \
                     shows the prefixes, --if-exists makes this a success)",
                    args.prefix
                )));
            }
            emit(
                args.client.output,
                json!({"prefix": args.prefix, "existed": existed}),
                || {
                    if existed {
                        format!("deleted the policy {:?}", args.prefix)
                    } else {
                        format!("no policy with prefix {:?}", args.prefix)
                    }
                },
            );
        }
    }
    Ok(())
}
