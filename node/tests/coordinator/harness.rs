//! An in-process coordinator cluster on loopback ephemeral ports, with
//! stop / restart of single members on their own data directories.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use leasehold_client::coordinator::{AdminClient, CoordinatorClient, RetryOptions};
use leasehold_client::transport::{Dialer, SystemClock, TcpDialer};
use leasehold_core::policy::Policy;
use leasehold_node::coordinator::{open_stores, run_coordinator};
use leasehold_node::{NodeConfig, NodeError};
use leasehold_proto::v1 as pb;
use tempfile::TempDir;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::server::TcpIncoming;

struct Running {
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), NodeError>>,
}

struct Member {
    config: NodeConfig,
    running: Option<Running>,
}

/// A cluster of in-process members.
pub struct Cluster {
    _dir: TempDir,
    members: Vec<Member>,
    /// How members reach each other.
    dialer: Arc<dyn Dialer>,
}

/// Timings that keep tests quick on loopback.
pub fn fast_config(id: u64, listen: String, data_dir: std::path::PathBuf) -> NodeConfig {
    NodeConfig {
        id,
        listen,
        data_dir,
        heartbeat_ms: 50,
        election_timeout_min_ms: 300,
        election_timeout_max_ms: 600,
        proposal_timeout_ms: 1_500,
        read_timeout_ms: 1_500,
        tick_interval_ms: 1_000,
        ..NodeConfig::default()
    }
}

/// Retries generous enough to ride out an election.
pub fn patient() -> RetryOptions {
    RetryOptions {
        call_timeout: Duration::from_millis(2_000),
        total_timeout: Duration::from_secs(20),
        max_attempts: 200,
        backoff_base: Duration::from_millis(20),
        backoff_max: Duration::from_millis(200),
    }
}

fn spawn(config: NodeConfig, listener: TcpListener, dialer: Arc<dyn Dialer>) -> Result<Running> {
    let stores = open_stores(&config)?;
    let (stop, stopped) = oneshot::channel::<()>();
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    let task = tokio::spawn(run_coordinator(
        config,
        stores,
        incoming,
        dialer,
        Arc::new(SystemClock),
        async move {
            let _ = stopped.await;
        },
    ));
    Ok(Running { stop, task })
}

impl Cluster {
    /// Starts `n` members (ids 1..=n), not yet initialised.
    pub async fn start(n: u64, tweak: impl Fn(&mut NodeConfig)) -> Result<Self> {
        Self::start_with_dialer(n, tweak, Arc::new(TcpDialer::default())).await
    }

    /// Starts `n` members reaching each other through `dialer`.
    pub async fn start_with_dialer(
        n: u64,
        tweak: impl Fn(&mut NodeConfig),
        dialer: Arc<dyn Dialer>,
    ) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let mut members = Vec::new();
        for id in 1..=n {
            let listener = TcpListener::bind("127.0.0.1:0").await?;
            let addr = listener.local_addr()?.to_string();
            let mut config = fast_config(id, addr, dir.path().join(format!("node-{id}")));
            tweak(&mut config);
            let running = spawn(config.clone(), listener, dialer.clone())?;
            members.push(Member {
                config,
                running: Some(running),
            });
        }
        Ok(Self {
            _dir: dir,
            members,
            dialer,
        })
    }

    /// Starts member `members + 1` on a new loopback port with a data
    /// directory of its own, after `prepare(data_dir, addr)` (e.g. writing
    /// a restored store into it); returns its id and address. It is not
    /// part of any cluster until its store or a leader says so.
    pub async fn add_member(
        &mut self,
        prepare: impl FnOnce(&std::path::Path, &str) -> Result<()>,
    ) -> Result<(u64, String)> {
        let id = self.members.len() as u64 + 1;
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?.to_string();
        let config = fast_config(
            id,
            addr.clone(),
            self._dir.path().join(format!("node-{id}")),
        );
        prepare(&config.data_dir, &addr)?;
        let running = spawn(config.clone(), listener, self.dialer.clone())?;
        self.members.push(Member {
            config,
            running: Some(running),
        });
        Ok((id, addr))
    }

    /// The data directory of member `id`.
    pub fn data_dir(&self, id: u64) -> std::path::PathBuf {
        self.members[(id - 1) as usize].config.data_dir.clone()
    }

    /// Starts `n` members and initialises them as one cluster.
    pub async fn start_initialised(n: u64, tweak: impl Fn(&mut NodeConfig)) -> Result<Self> {
        let cluster = Self::start(n, tweak).await?;
        cluster.admin_of(1)?.init(&cluster.member_list()).await?;
        cluster.leader().await?;
        Ok(cluster)
    }

    /// `(id, addr)` of every member.
    pub fn member_list(&self) -> Vec<(u64, String)> {
        self.members
            .iter()
            .map(|m| (m.config.id, m.config.listen.clone()))
            .collect()
    }

    /// The address of member `id`.
    pub fn addr(&self, id: u64) -> String {
        self.members[(id - 1) as usize].config.listen.clone()
    }

    /// A client of every member, patient enough for elections.
    pub fn client(&self) -> Result<CoordinatorClient> {
        let endpoints: Vec<String> = self
            .members
            .iter()
            .map(|m| m.config.listen.clone())
            .collect();
        Ok(CoordinatorClient::with_options(
            endpoints,
            Arc::new(TcpDialer::default()),
            patient(),
        )?)
    }

    /// An admin client of member `id` alone.
    pub fn admin_of(&self, id: u64) -> Result<AdminClient> {
        let options = RetryOptions {
            total_timeout: Duration::from_secs(5),
            ..patient()
        };
        Ok(CoordinatorClient::with_options(
            [self.addr(id)],
            Arc::new(TcpDialer::default()),
            options,
        )?
        .admin())
    }

    /// Member `id`'s own status.
    pub async fn status(&self, id: u64) -> Result<pb::StatusResponse> {
        Ok(self.admin_of(id)?.status().await?)
    }

    /// Waits until a running member leads and the other running members agree.
    pub async fn leader(&self) -> Result<u64> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while tokio::time::Instant::now() < deadline {
            let mut seen = Vec::new();
            for member in self.members.iter().filter(|m| m.running.is_some()) {
                if let Ok(status) = self.status(member.config.id).await {
                    seen.push(status.current_leader);
                }
            }
            if let Some(Some(leader)) = seen.first().copied() {
                let leader_running = self.members[(leader - 1) as usize].running.is_some();
                if leader_running && seen.iter().all(|s| *s == Some(leader)) {
                    return Ok(leader);
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bail!("no leader agreed on in time")
    }

    /// Stops member `id` and waits until it released its data.
    pub async fn stop(&mut self, id: u64) -> Result<()> {
        let running = self.members[(id - 1) as usize]
            .running
            .take()
            .context("member is not running")?;
        let _ = running.stop.send(());
        running.task.await??;
        Ok(())
    }

    /// Restarts a stopped member on its address and data directory.
    pub async fn restart(&mut self, id: u64) -> Result<()> {
        let member = &mut self.members[(id - 1) as usize];
        if member.running.is_some() {
            bail!("member {id} is running");
        }
        let mut attempts = 0;
        let listener = loop {
            match TcpListener::bind(&member.config.listen).await {
                Ok(listener) => break listener,
                Err(e) if attempts < 50 => {
                    attempts += 1;
                    tracing::debug!(error = %e, "rebinding");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => return Err(e.into()),
            }
        };
        member.running = Some(spawn(member.config.clone(), listener, self.dialer.clone())?);
        Ok(())
    }

    /// Stops every running member.
    pub async fn stop_all(&mut self) -> Result<()> {
        for id in 1..=self.members.len() as u64 {
            if self.members[(id - 1) as usize].running.is_some() {
                self.stop(id).await?;
            }
        }
        Ok(())
    }
}

/// A counter policy for `prefix`.
pub fn counter_policy(prefix: &str, limit: u64, window_ms: u64) -> pb::Policy {
    Policy::counter(prefix, limit, window_ms).into()
}

/// A window long enough that a test never crosses its end.
pub const LONG_WINDOW_MS: u64 = leasehold_core::policy::MAX_WINDOW_MS;
