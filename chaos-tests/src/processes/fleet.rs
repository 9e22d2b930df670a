//! Real `leasehold` processes on loopback: coordinator members (`serve`,
//! each on its own data directory and port, with a generated config file)
//! and regional escrow nodes (`escrow`), with the faults an operator's
//! machine can inflict — `kill -9`, `SIGSTOP` / `SIGCONT`, restart on the
//! same data directory — and, on mutual TLS, the membership changes of an
//! operator: a member joining, a member retired for good. Dropping the
//! fleet kills every process it started.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use leasehold_client::coordinator::{CoordinatorClient, RetryOptions};
use leasehold_client::transport::{Dialer, TcpDialer};
use leasehold_core::principal::Principal;
use leasehold_node::NodeConfig;
use std::sync::Arc;
use tempfile::TempDir;

use super::identities::Identities;

/// `--max-holders-per-identity` of escrow nodes on mutual-TLS runs: ample
/// for the load's few holders per node, soon reached by a holder flood.
pub const MAX_HOLDERS_PER_IDENTITY: usize = 16;

/// One process the fleet manages.
#[derive(Debug)]
struct Managed {
    /// What `ps` would call it, for logs and errors.
    label: String,
    /// `host:port` it serves on.
    addr: String,
    /// Arguments after the binary.
    args: Vec<String>,
    /// Where its stdout and stderr go.
    log: PathBuf,
    child: Option<Child>,
    stopped: bool,
    /// Removed from the cluster for good: never restarted.
    retired: bool,
}

impl Managed {
    fn spawn(&mut self, binary: &Path) -> Result<()> {
        let log = File::options()
            .create(true)
            .append(true)
            .open(&self.log)
            .with_context(|| format!("opening {}", self.log.display()))?;
        let child = Command::new(binary)
            .args(&self.args)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {} ({})", self.label, binary.display()))?;
        self.child = Some(child);
        self.stopped = false;
        Ok(())
    }

    fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// `kill -9`, then reaps it.
    fn kill(&mut self) -> Result<()> {
        if let Some(mut child) = self.child.take() {
            child
                .kill()
                .with_context(|| format!("kill -9 {}", self.label))?;
            child.wait()?;
        }
        self.stopped = false;
        Ok(())
    }

    fn signal(&mut self, signal: &str) -> Result<()> {
        let Some(pid) = self.pid() else {
            bail!("{} is not running", self.label);
        };
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .status()
            .context("running kill(1)")?;
        if !status.success() {
            bail!("kill -{signal} {pid} ({}) failed: {status}", self.label);
        }
        self.stopped = signal == "STOP";
        Ok(())
    }

    /// Fails if the process exited on its own (a crash, a bad flag).
    fn check_alive(&mut self) -> Result<()> {
        if let Some(child) = self.child.as_mut() {
            if let Some(status) = child.try_wait()? {
                self.child = None;
                let tail = std::fs::read_to_string(&self.log).unwrap_or_default();
                let tail: String = tail
                    .lines()
                    .rev()
                    .take(10)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect::<Vec<_>>()
                    .join("\n");
                bail!(
                    "{} exited by itself ({status}); last log lines:\n{tail}",
                    self.label
                );
            }
        }
        Ok(())
    }
}

/// A free loopback port no other test running beside this one picks
/// ([`leasehold_node::loopback_ports`]).
fn free_port() -> Result<u16> {
    leasehold_node::loopback_ports::reserve().context("reserving a port")
}

/// Timings for members on one loopback host under concurrent load: quick
/// failover, but slack enough that a busy 2-core machine does not trigger
/// needless elections.
/// With links delayed by `link_delay` each way, the heartbeat (openraft's
/// per-append deadline) exceeds two round trips, and the election and
/// request timeouts grow with it.
fn member_config(
    id: u64,
    listen: String,
    data_dir: PathBuf,
    link_delay: Duration,
    tls: Option<(&Identities, u64)>,
) -> NodeConfig {
    let round_trip = u64::try_from(link_delay.as_millis())
        .unwrap_or(u64::MAX)
        .saturating_mul(2);
    let heartbeat_ms = round_trip.saturating_mul(2).saturating_add(100);
    let request_timeout_ms = round_trip.saturating_mul(10).saturating_add(2_000);
    let config = NodeConfig {
        id,
        listen,
        data_dir,
        heartbeat_ms,
        election_timeout_min_ms: heartbeat_ms.saturating_mul(5),
        election_timeout_max_ms: heartbeat_ms.saturating_mul(10),
        proposal_timeout_ms: request_timeout_ms,
        read_timeout_ms: request_timeout_ms,
        tick_interval_ms: 500,
        ..NodeConfig::default()
    };
    match tls {
        // Told to join the founding members, like a member of a real cluster.
        Some((identities, founders)) => {
            let files = identities.files(&Principal::Member(id));
            NodeConfig {
                tls_ca: Some(files.ca),
                tls_cert: Some(files.cert),
                tls_key: Some(files.key),
                join_members: (1..=founders).collect(),
                ..config
            }
        }
        // The runner's own clients dial plaintext.
        None => NodeConfig {
            insecure: true,
            ..config
        },
    }
}

/// Retries of the runner's own clients: ride out an election or a restart.
pub fn runner_retry_options() -> RetryOptions {
    RetryOptions {
        call_timeout: Duration::from_millis(1_000),
        total_timeout: Duration::from_secs(4),
        max_attempts: 40,
        backoff_base: Duration::from_millis(20),
        backoff_max: Duration::from_millis(250),
    }
}

/// The processes of one run.
#[derive(Debug)]
pub struct Fleet {
    binary: PathBuf,
    dir: TempDir,
    members: Vec<Managed>,
    escrows: Vec<Managed>,
    /// A delaying proxy in front of each member, by id − 1, when the run
    /// delays links: every address handed out for a member is its proxy's.
    proxies: Vec<super::DelayProxy>,
    /// The certificates of a mutual-TLS run (`None`: plaintext).
    identities: Option<Identities>,
    /// Members of the cluster as first formed.
    founders: u64,
    /// How long links are delayed.
    link_delay: Duration,
}

impl Fleet {
    /// Starts `members` coordinator members (ids 1..=members) from `binary`;
    /// with a `link_delay` above zero, each behind a proxy delaying each
    /// direction by it ([`super::DelayProxy`]): [`Self::member_addrs`] are
    /// then the proxies', so the cluster formed with them, the escrow nodes
    /// and the clients all reach members through them (leader hints name
    /// them too), and the members' timings allow for the round trip.
    ///
    /// With `tls`, every process of the run speaks mutual TLS with its own
    /// certificate (minted first, [`Identities`]) and members are told to
    /// join the founding members.
    pub fn start_members(
        binary: &Path,
        members: u64,
        link_delay: Duration,
        tls: bool,
    ) -> Result<Self> {
        if !binary.is_file() {
            bail!(
                "no leasehold binary at {} (build it: cargo build --release -p leasehold-node, or pass --binary)",
                binary.display()
            );
        }
        let dir = tempfile::Builder::new()
            .prefix("leasehold-chaos-")
            .tempdir()
            .context("creating the run directory")?;
        let mut fleet = Fleet {
            binary: binary.to_path_buf(),
            dir,
            members: Vec::new(),
            escrows: Vec::new(),
            proxies: Vec::new(),
            identities: None,
            founders: members,
            link_delay,
        };
        if tls {
            let certs = fleet.dir.path().join("certs");
            fleet.identities = Some(Identities::mint(binary, &certs, members)?);
        }
        for id in 1..=members {
            fleet.add_member(id)?;
        }
        Ok(fleet)
    }

    /// Starts member `id` on a fresh port and data directory (not added to
    /// the cluster: a founding member waits for `cluster init`, a later one
    /// for the joining steps).
    fn add_member(&mut self, id: u64) -> Result<()> {
        let fleet = self;
        let link_delay = fleet.link_delay;
        {
            let addr = format!("127.0.0.1:{}", free_port()?);
            let data_dir = fleet.dir.path().join(format!("member-{id}"));
            let tls = fleet.identities.as_ref().map(|ids| (ids, fleet.founders));
            let config = member_config(id, addr.clone(), data_dir, link_delay, tls);
            if !link_delay.is_zero() {
                fleet
                    .proxies
                    .push(super::DelayProxy::start(addr.clone(), link_delay)?);
            }
            let config_path = fleet.dir.path().join(format!("member-{id}.toml"));
            std::fs::write(&config_path, toml::to_string(&config)?)
                .context("writing a member config")?;
            let mut member = Managed {
                label: format!("member {id}"),
                addr,
                args: vec![
                    "serve".into(),
                    "--config".into(),
                    config_path.display().to_string(),
                ],
                log: fleet.dir.path().join(format!("member-{id}.log")),
                child: None,
                stopped: false,
                retired: false,
            };
            member.spawn(&fleet.binary)?;
            fleet.members.push(member);
        }
        Ok(())
    }

    /// Starts the next member (id one above the highest), told to join the
    /// founding members; returns its id and address. The cluster does not
    /// know it until [`AdminClient::add_learner`].
    pub fn start_joiner(&mut self) -> Result<(u64, String)> {
        let id = self.members.len() as u64 + 1;
        self.add_member(id)?;
        Ok((id, self.member_addrs()[self.members.len() - 1].clone()))
    }

    /// Marks member `id` removed from the cluster and kills it: it is
    /// never restarted, and its certificate is a retired member's.
    pub fn retire_member(&mut self, id: u64) -> Result<()> {
        let member = self.member(id)?;
        member.kill()?;
        member.retired = true;
        Ok(())
    }

    /// The unsafe way out of a lost quorum (docs/operations.md, "Losing a
    /// quorum for good"): `kill -9`s members `lost` and wipes their data
    /// directories (never restarted), then runs `leasehold
    /// force-new-cluster` on the (stopped) `survivor`'s data directory —
    /// seal margin `clock_margin_ms`, every process sharing this host's
    /// clock — and starts it again. Returns the seal's `restored_at_ms`.
    pub fn force_new_cluster(
        &mut self,
        survivor: u64,
        lost: &[u64],
        clock_margin_ms: u64,
    ) -> Result<u64> {
        for id in lost {
            let member = self.member(*id)?;
            member.kill()?;
            member.retired = true;
            let data_dir = self.dir.path().join(format!("member-{id}"));
            std::fs::remove_dir_all(&data_dir)
                .with_context(|| format!("wiping {}", data_dir.display()))?;
        }
        self.member(survivor)?.kill()?;
        let addr = self
            .member_addr(survivor)
            .with_context(|| format!("no member {survivor}"))?;
        let data_dir = self.dir.path().join(format!("member-{survivor}"));
        let output = std::process::Command::new(&self.binary)
            .args(["force-new-cluster", "--data-dir"])
            .arg(&data_dir)
            .args(["--id", &survivor.to_string(), "--addr", &addr])
            .args(["--clock-margin-ms", &clock_margin_ms.to_string()])
            .args([
                "--unsafe-lose-entries-only-the-lost-members-hold",
                "--output",
                "json",
            ])
            .output()
            .context("running leasehold force-new-cluster")?;
        if !output.status.success() {
            bail!(
                "force-new-cluster failed: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        let answer: serde_json::Value =
            serde_json::from_slice(&output.stdout).context("force-new-cluster's JSON answer")?;
        let restored_at_ms = answer["restored_at_ms"]
            .as_u64()
            .context("force-new-cluster named no restored_at_ms")?;
        let binary = self.binary.clone();
        self.member(survivor)?.spawn(&binary)?;
        Ok(restored_at_ms)
    }

    /// Every member id the fleet started, retired ones included.
    pub fn member_ids(&self) -> Vec<u64> {
        (1..=self.members.len() as u64).collect()
    }

    /// The address member `id` is reached at.
    pub fn member_addr(&self, id: u64) -> Option<String> {
        let index = usize::try_from(id).ok()?.checked_sub(1)?;
        self.member_addrs().get(index).cloned()
    }

    /// Ids of members removed from the cluster.
    pub fn retired_members(&self) -> Vec<u64> {
        (1..)
            .zip(&self.members)
            .filter(|(_, m)| m.retired)
            .map(|(id, _)| id)
            .collect()
    }

    /// The certificates of a mutual-TLS run.
    pub fn identities(&self) -> Option<&Identities> {
        self.identities.as_ref()
    }

    /// A dialer presenting `principal`'s certificate on a mutual-TLS run,
    /// plaintext otherwise.
    pub fn dialer_as(&self, principal: &Principal) -> Arc<dyn Dialer> {
        match &self.identities {
            Some(identities) => identities.dialer(principal),
            None => Arc::new(TcpDialer::default()),
        }
    }

    /// Starts one escrow node per region in `regions`, leasing from the members.
    pub fn start_escrows(&mut self, regions: &[String], batch: u64) -> Result<()> {
        let coordinators = self.member_addrs().join(",");
        for (index, region) in regions.iter().enumerate() {
            let addr = format!("127.0.0.1:{}", free_port()?);
            let mut escrow = Managed {
                label: format!("escrow {index} ({region})"),
                addr: addr.clone(),
                args: vec![
                    "escrow".into(),
                    "--region".into(),
                    region.clone(),
                    "--listen".into(),
                    addr,
                    "--coordinator".into(),
                    coordinators.clone(),
                    "--batch".into(),
                    batch.to_string(),
                    "--probe-interval-ms".into(),
                    "300".into(),
                ],
                log: self.dir.path().join(format!("escrow-{index}-{region}.log")),
                child: None,
                stopped: false,
                retired: false,
            };
            match &self.identities {
                Some(identities) => {
                    let files = identities.files(&super::identities::region(region)?);
                    for (flag, path) in [
                        ("--tls-ca", files.ca),
                        ("--tls-cert", files.cert),
                        ("--tls-key", files.key),
                    ] {
                        escrow.args.push(flag.into());
                        escrow.args.push(path.display().to_string());
                    }
                    // A bound a holder flood reaches within a window.
                    escrow.args.push("--max-holders-per-identity".into());
                    escrow.args.push(MAX_HOLDERS_PER_IDENTITY.to_string());
                }
                None => escrow.args.push("--insecure".into()),
            }
            escrow.spawn(&self.binary)?;
            self.escrows.push(escrow);
        }
        Ok(())
    }

    /// Every member's `host:port` as the others and the clients reach it
    /// (its delay proxy's, when links are delayed), by id − 1.
    pub fn member_addrs(&self) -> Vec<String> {
        if !self.proxies.is_empty() {
            return self.proxies.iter().map(|p| p.addr().to_string()).collect();
        }
        self.members.iter().map(|m| m.addr.clone()).collect()
    }

    /// Every escrow node's `host:port`.
    pub fn escrow_addrs(&self) -> Vec<String> {
        self.escrows.iter().map(|e| e.addr.clone()).collect()
    }

    /// The directory holding data and logs (kept only while the fleet lives).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    fn member(&mut self, id: u64) -> Result<&mut Managed> {
        usize::try_from(id)
            .ok()
            .and_then(|id| id.checked_sub(1))
            .and_then(|i| self.members.get_mut(i))
            .with_context(|| format!("no member {id}"))
    }

    /// `kill -9` member `id`.
    pub fn kill_member(&mut self, id: u64) -> Result<()> {
        self.member(id)?.kill()
    }

    /// `SIGSTOP` member `id`: it keeps its sockets but answers nothing.
    pub fn stop_member(&mut self, id: u64) -> Result<()> {
        self.member(id)?.signal("STOP")
    }

    /// `SIGCONT` every stopped member.
    pub fn continue_members(&mut self) -> Result<()> {
        for member in self.members.iter_mut().filter(|m| m.stopped) {
            member.signal("CONT")?;
        }
        Ok(())
    }

    /// Starts every killed member again on its own data directory and port
    /// (retired ones stay down).
    pub fn restart_members(&mut self) -> Result<()> {
        let binary = self.binary.clone();
        for member in self
            .members
            .iter_mut()
            .filter(|m| m.child.is_none() && !m.retired)
        {
            member.spawn(&binary)?;
        }
        Ok(())
    }

    /// `kill -9` escrow node `index`.
    pub fn kill_escrow(&mut self, index: usize) -> Result<()> {
        self.escrows
            .get_mut(index)
            .with_context(|| format!("no escrow node {index}"))?
            .kill()
    }

    fn escrow(&mut self, index: usize) -> Result<&mut Managed> {
        self.escrows
            .get_mut(index)
            .with_context(|| format!("no escrow node {index}"))
    }

    /// `SIGTERM` escrow node `index` and waits (up to ten seconds) for it
    /// to hand back what it holds and exit; `kill -9` after that.
    pub async fn terminate_escrow(&mut self, index: usize) -> Result<()> {
        let escrow = self.escrow(index)?;
        escrow.signal("TERM")?;
        for _ in 0..200 {
            if let Some(child) = escrow.child.as_mut() {
                if child.try_wait()?.is_some() {
                    escrow.child = None;
                    return Ok(());
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        escrow.kill()
    }

    /// `SIGSTOP` escrow node `index`.
    pub fn stop_escrow(&mut self, index: usize) -> Result<()> {
        self.escrow(index)?.signal("STOP")
    }

    /// `SIGCONT` every stopped escrow node.
    pub fn continue_escrows(&mut self) -> Result<()> {
        for escrow in self.escrows.iter_mut().filter(|e| e.stopped) {
            escrow.signal("CONT")?;
        }
        Ok(())
    }

    /// Starts every killed escrow node again (same region and port).
    pub fn restart_escrows(&mut self) -> Result<()> {
        let binary = self.binary.clone();
        for escrow in self.escrows.iter_mut().filter(|e| e.child.is_none()) {
            escrow.spawn(&binary)?;
        }
        Ok(())
    }

    /// Members that are running and not stopped, by id.
    pub fn responsive_members(&self) -> Vec<u64> {
        (1..)
            .zip(&self.members)
            .filter(|(_, m)| m.child.is_some() && !m.stopped && !m.retired)
            .map(|(id, _)| id)
            .collect()
    }

    /// Fails if a process the fleet believes running has exited on its own.
    pub fn check_alive(&mut self) -> Result<()> {
        for managed in self.members.iter_mut().chain(self.escrows.iter_mut()) {
            managed.check_alive()?;
        }
        Ok(())
    }

    /// The member currently leading, asked of every responsive member.
    pub async fn leader(&self) -> Option<u64> {
        for id in self.responsive_members() {
            if let Some(status) = self.status_of(id).await {
                if status.state == "Leader" {
                    return Some(status.node_id);
                }
            }
        }
        None
    }

    /// Member `id`'s own status (one try of 300 ms), as the operator's
    /// `cluster status --endpoint` on it shows.
    pub async fn status_of(&self, id: u64) -> Option<leasehold_proto::v1::StatusResponse> {
        let addr = &self
            .members
            .get(usize::try_from(id.checked_sub(1)?).ok()?)?
            .addr;
        let client = CoordinatorClient::with_options(
            [addr],
            self.dialer_as(&super::identities::operator()),
            RetryOptions {
                call_timeout: Duration::from_millis(300),
                total_timeout: Duration::from_millis(300),
                max_attempts: 1,
                ..runner_retry_options()
            },
        )
        .ok()?;
        client.admin().status().await.ok()
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for managed in self.members.iter_mut().chain(self.escrows.iter_mut()) {
            let _ = managed.kill();
        }
    }
}
