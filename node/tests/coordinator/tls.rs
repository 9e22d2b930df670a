//! Mutual TLS and authorization against real in-process members: who can
//! connect at all, which identity may call what, forged Raft messages, and
//! certificate rotation without restart.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use leasehold_client::coordinator::{
    CoordinatorClient, CoordinatorError, PoolGrantCall, RetryOptions,
};
use leasehold_client::transport::{Dialer, SystemClock, TcpDialer};
use leasehold_core::ids::RegionId;
use leasehold_core::principal::Principal;
use leasehold_node::certs::{files_for, mint, CertificateAuthority, MintPlan};
use leasehold_node::coordinator::frame_link::{FrameLink, LinkError};
use leasehold_node::coordinator::peer_frames::FrameKind;
use leasehold_node::coordinator::{open_stores, run_coordinator};
use leasehold_node::tls::{ReloadingServerConfig, Security, TlsFiles, TlsIncoming};
use leasehold_node::{NodeConfig, NodeError};
use leasehold_proto::v1 as pb;
use leasehold_proto::v1::raft_client::RaftClient;
use leasehold_raft_store::AppendEntriesRequest;
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tonic::transport::server::TcpIncoming;
use tonic::Code;

use crate::harness::{counter_policy, fast_config, patient, Cluster, LONG_WINDOW_MS};

/// A running member: its stop signal and its task.
type RunningMember = (oneshot::Sender<()>, JoinHandle<Result<(), NodeError>>);

/// How often members re-check their certificate files in these tests.
const RELOAD_INTERVAL: Duration = Duration::from_millis(100);

fn region(name: &str) -> Principal {
    Principal::Region(RegionId::new(name).unwrap())
}

fn operator() -> Principal {
    Principal::Operator("admin".into())
}

fn service_eu() -> Principal {
    Principal::Service {
        name: "checkout".into(),
        region: RegionId::new("eu").unwrap(),
    }
}

/// A three-member cluster where every connection is mutual TLS, with a CA
/// that also issued certificates for regions eu/us, an operator, a service
/// and a member 99 that is not in the cluster.
struct TlsCluster {
    dir: tempfile::TempDir,
    ca: CertificateAuthority,
    addrs: Vec<String>,
    members: Vec<RunningMember>,
    _stop_reloading: watch::Sender<bool>,
}

impl TlsCluster {
    async fn start_initialised() -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let certs = dir.path().join("certs");
        let ca = CertificateAuthority::generate("test CA", 1)?;
        let plan = MintPlan {
            members: vec![1, 2, 3, 4, 5, 99],
            regions: vec![RegionId::new("eu")?, RegionId::new("us")?],
            operators: vec!["admin".into()],
            services: vec![
                ("checkout".into(), RegionId::new("eu")?),
                ("checkout".into(), RegionId::new("us")?),
                ("other".into(), RegionId::new("eu")?),
            ],
            server_names: vec!["127.0.0.1".into(), "localhost".into()],
        };
        mint(&ca, &certs, &plan)?;
        let (stop_reloading, reloading) = watch::channel(false);
        let mut listeners = Vec::new();
        let mut addrs = Vec::new();
        for _ in 1..=3 {
            let listener = TcpListener::bind("127.0.0.1:0").await?;
            addrs.push(listener.local_addr()?.to_string());
            listeners.push(listener);
        }
        let mut members = Vec::new();
        for (id, listener) in (1..=3u64).zip(listeners) {
            let files = files_for(&certs, &Principal::Member(id));
            let mut config = fast_config(
                id,
                addrs[(id - 1) as usize].clone(),
                dir.path().join(format!("node-{id}")),
            );
            config.tls_ca = Some(files.ca.clone());
            config.tls_cert = Some(files.cert.clone());
            config.tls_key = Some(files.key.clone());
            config.join_members = vec![1, 2, 3];
            members.push(spawn_tls_member(
                config,
                listener,
                files,
                reloading.clone(),
            )?);
        }
        let cluster = Self {
            dir,
            ca,
            addrs,
            members,
            _stop_reloading: stop_reloading,
        };
        let members: Vec<(u64, String)> = (1..=3u64)
            .map(|id| (id, cluster.addrs[(id - 1) as usize].clone()))
            .collect();
        cluster
            .client_as(&operator())?
            .admin()
            .init(&members)
            .await?;
        cluster.wait_for_leader().await?;
        Ok(cluster)
    }

    fn certs(&self) -> PathBuf {
        self.dir.path().join("certs")
    }

    fn files(&self, principal: &Principal) -> TlsFiles {
        files_for(&self.certs(), principal)
    }

    fn dialer_as(&self, principal: &Principal) -> Arc<dyn Dialer> {
        Security::MutualTls(self.files(principal)).dialer()
    }

    fn client_as(&self, principal: &Principal) -> Result<CoordinatorClient> {
        Ok(CoordinatorClient::with_options(
            self.addrs.clone(),
            self.dialer_as(principal),
            patient(),
        )?)
    }

    async fn wait_for_leader(&self) -> Result<u64> {
        let admin = self.client_as(&operator())?.admin();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(status) = admin.status().await {
                if let Some(leader) = status.current_leader {
                    return Ok(leader);
                }
            }
            ensure!(tokio::time::Instant::now() < deadline, "no leader in time");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Every member's own view of its term.
    async fn terms(&self) -> Result<Vec<u64>> {
        let mut terms = Vec::new();
        for addr in &self.addrs {
            let admin = CoordinatorClient::with_options(
                [addr.clone()],
                self.dialer_as(&operator()),
                patient(),
            )?
            .admin();
            terms.push(admin.status().await?.current_term);
        }
        Ok(terms)
    }

    /// Starts member `id` (TLS, its own certificate) on a fresh port, told
    /// to join the cluster of members 1–3; it is not added to the cluster.
    async fn start_member(&self, id: u64) -> Result<(String, RunningMember)> {
        self.start_member_with(id, |_| {}).await
    }

    /// [`start_member`](Self::start_member) with `adjust` applied to its
    /// configuration.
    async fn start_member_with(
        &self,
        id: u64,
        adjust: impl FnOnce(&mut NodeConfig),
    ) -> Result<(String, RunningMember)> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?.to_string();
        let files = self.files(&Principal::Member(id));
        let mut config = fast_config(id, addr.clone(), self.dir.path().join(format!("node-{id}")));
        config.tls_ca = Some(files.ca.clone());
        config.tls_cert = Some(files.cert.clone());
        config.tls_key = Some(files.key.clone());
        config.join_members = vec![1, 2, 3];
        adjust(&mut config);
        let member = spawn_tls_member(config, listener, files, self._stop_reloading.subscribe())?;
        Ok((addr, member))
    }

    /// An operator's admin client of the member at `addr` alone.
    fn admin_of(&self, addr: &str) -> Result<leasehold_client::coordinator::AdminClient> {
        Ok(CoordinatorClient::with_options(
            [addr.to_string()],
            self.dialer_as(&operator()),
            patient(),
        )?
        .admin())
    }

    async fn stop(self) -> Result<()> {
        for (stop, task) in self.members {
            let _ = stop.send(());
            task.await??;
        }
        Ok(())
    }
}

fn spawn_tls_member(
    config: NodeConfig,
    listener: TcpListener,
    files: TlsFiles,
    reloading: watch::Receiver<bool>,
) -> Result<RunningMember> {
    let stores = open_stores(&config)?;
    let dialer = config.security()?.dialer();
    let tls = ReloadingServerConfig::load(files)?;
    tokio::spawn(tls.clone().watch(RELOAD_INTERVAL, reloading));
    let incoming = TlsIncoming::new(
        TcpIncoming::from(listener).with_nodelay(Some(true)),
        tls,
        Duration::from_secs(5),
    );
    let (stop, stopped) = oneshot::channel::<()>();
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
    Ok((stop, task))
}

/// A client that gives up at once (refusals are not retried anyway).
fn impatient() -> RetryOptions {
    RetryOptions {
        call_timeout: Duration::from_secs(2),
        total_timeout: Duration::from_secs(3),
        max_attempts: 2,
        ..patient()
    }
}

fn code_of<T: std::fmt::Debug>(result: Result<T, CoordinatorError>) -> Code {
    match result {
        Ok(value) => panic!("expected a refusal, got {value:?}"),
        Err(error) => error.code(),
    }
}

/// A forged AppendEntries from `claimed_leader` at a term far ahead.
fn forged_append_entries(claimed_leader: u64, term: u64) -> Result<pb::RaftPayload> {
    let request = AppendEntriesRequest {
        vote: openraft::Vote::new_committed(term, claimed_leader),
        prev_log_id: None,
        entries: Vec::new(),
        leader_commit: None,
    };
    Ok(pb::RaftPayload {
        data: postcard::to_allocvec(&request)?,
        shard: 0,
    })
}

async fn send_append_entries(
    dialer: &dyn Dialer,
    addr: &str,
    payload: pb::RaftPayload,
) -> Result<Code> {
    let channel = dialer.dial(addr).await?;
    match RaftClient::new(channel).append_entries(payload).await {
        Ok(_) => Ok(Code::Ok),
        Err(status) => Ok(status.code()),
    }
}

/// The same message as a frame of the members' framed transport: `Ok` for
/// an answer, else the refusal's reason (it starts with the status code),
/// or "no framed connection" when the member would not open one.
async fn send_framed_append_entries(
    dialer: &dyn Dialer,
    addr: &str,
    payload: &pb::RaftPayload,
) -> Result<String> {
    let link = match FrameLink::connect(dialer, addr, Duration::from_secs(5), 1 << 20).await {
        Err(LinkError::NotSpoken) => return Ok("no framed connection".to_string()),
        link => link?,
    };
    match link.call(FrameKind::AppendEntries, &payload.data).await? {
        Ok(_) => Ok("Ok".to_string()),
        Err(reason) => Ok(reason),
    }
}

/// The refusal reason (`leasehold-reason`) of a Raft message, or `None`
/// when it was accepted.
async fn raft_refusal(
    dialer: &dyn Dialer,
    addr: &str,
    message: leasehold_node::coordinator::raft_service::RaftMessage,
    payload: pb::RaftPayload,
) -> Result<Option<String>> {
    use leasehold_node::coordinator::raft_service::RaftMessage;
    let mut client = RaftClient::new(dialer.dial(addr).await?);
    let answer = match message {
        RaftMessage::AppendEntries => client.append_entries(payload).await,
        RaftMessage::Vote => client.vote(payload).await,
        RaftMessage::InstallSnapshot => client.install_snapshot(payload).await,
    };
    Ok(answer.err().map(|status| {
        status
            .metadata()
            .get("leasehold-reason")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("no reason")
            .to_string()
    }))
}

/// A vote request from `candidate` at `term`.
fn forged_vote(candidate: u64, term: u64) -> Result<pb::RaftPayload> {
    let request = leasehold_raft_store::VoteRequest {
        vote: openraft::Vote::new(term, candidate),
        last_log_id: None,
    };
    Ok(pb::RaftPayload {
        data: postcard::to_allocvec(&request)?,
        shard: 0,
    })
}

/// A refusal counter of member `addr` (from its Status metrics).
async fn refusals(cluster: &TlsCluster, addr: &str, name: &str) -> Result<u64> {
    let admin = CoordinatorClient::with_options(
        [addr.to_string()],
        cluster.dialer_as(&operator()),
        patient(),
    )?
    .admin();
    let status = admin.status().await?;
    status
        .counters
        .get(name)
        .copied()
        .with_context(|| format!("no metric {name}"))
}

/// The cluster still grants: an operator sets a policy and region eu
/// leases one token of it.
async fn ensure_still_granting(cluster: &TlsCluster) -> Result<()> {
    cluster
        .client_as(&operator())?
        .admin()
        .set_policy(counter_policy("tls/", 100, LONG_WINDOW_MS))
        .await?;
    let granted = cluster
        .client_as(&region("eu"))?
        .lease("tls/k", "eu", 1)
        .await?
        .granted;
    ensure!(granted == 1, "the cluster stopped granting: {granted}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_without_a_certificate_or_with_another_cas_certificate_cannot_connect() -> Result<()>
{
    let cluster = TlsCluster::start_initialised().await?;
    let addr = cluster.addrs[0].clone();

    // Plaintext against a TLS listener.
    let plaintext = CoordinatorClient::with_options(
        [addr.clone()],
        Arc::new(TcpDialer::default()),
        impatient(),
    )?;
    ensure!(
        plaintext.admin().status().await.is_err(),
        "plaintext was served"
    );

    // TLS trusting the right CA, but presenting no certificate.
    let ca = std::fs::read(cluster.files(&operator()).ca)?;
    let channel = tonic::transport::Endpoint::from_shared(format!("https://{addr}"))?
        .tls_config(
            tonic::transport::ClientTlsConfig::new()
                .ca_certificate(tonic::transport::Certificate::from_pem(ca))
                .domain_name("127.0.0.1"),
        )?
        .connect_timeout(Duration::from_secs(2))
        .connect_lazy();
    let no_cert = leasehold_proto::v1::admin_client::AdminClient::new(channel)
        .status(pb::StatusRequest {})
        .await;
    ensure!(
        no_cert.is_err(),
        "a client without a certificate was served"
    );

    // An operator certificate from another CA (trusting the cluster's CA).
    let rogue_dir = cluster.dir.path().join("rogue");
    let rogue_ca = CertificateAuthority::generate("rogue CA", 1)?;
    let rogue = rogue_ca.issue_into(&rogue_dir, &operator(), &[])?;
    let rogue_files = leasehold_client::tls::ClientTlsFiles {
        ca: cluster.files(&operator()).ca,
        cert: rogue.cert,
        key: rogue.key,
    };
    let rogue_client = CoordinatorClient::with_options(
        [addr.clone()],
        Arc::new(leasehold_client::tls::TlsDialer::new(rogue_files)),
        impatient(),
    )?;
    ensure!(
        rogue_client.admin().status().await.is_err(),
        "a certificate from another CA was accepted"
    );

    // The same call with the cluster's operator certificate works.
    let status = cluster.client_as(&operator())?.admin().status().await?;
    ensure!(status.initialized);
    cluster.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_changes_need_an_operator_certificate() -> Result<()> {
    let cluster = TlsCluster::start_initialised().await?;
    let policy = counter_policy("tls/", 100, LONG_WINDOW_MS);
    for who in [region("eu"), service_eu(), Principal::Member(1)] {
        let admin = CoordinatorClient::with_options(
            cluster.addrs.clone(),
            cluster.dialer_as(&who),
            impatient(),
        )?
        .admin();
        ensure!(
            code_of(admin.set_policy(policy.clone()).await) == Code::PermissionDenied,
            "{who} set a policy"
        );
        ensure!(
            code_of(admin.change_membership(&[1, 2], false).await) == Code::PermissionDenied,
            "{who} changed the membership"
        );
        ensure!(
            code_of(admin.step_down(None).await) == Code::PermissionDenied,
            "{who} stepped the leader down"
        );
        ensure!(
            code_of(admin.save_snapshot(false).await) == Code::PermissionDenied,
            "{who} took a backup of the whole state"
        );
    }
    // Regions may read policies and status (escrow nodes do).
    let as_region = cluster.client_as(&region("eu"))?.admin();
    as_region.list_policies().await?;
    as_region.status().await?;

    let admin = cluster.client_as(&operator())?.admin();
    admin.set_policy(policy).await?;
    let (info, bytes) = admin.save_snapshot(false).await?;
    ensure!(
        info.linearizable && info.bytes == bytes.len() as u64,
        "{info:?}"
    );
    ensure!(admin
        .list_policies()
        .await?
        .iter()
        .any(|p| p.prefix == "tls/"));
    let before = cluster.wait_for_leader().await?;
    let after = admin.step_down(None).await?;
    ensure!(after != before, "the operator's step-down moved leadership");
    let mut denied = 0;
    for addr in &cluster.addrs {
        denied += refusals(&cluster, addr, "refused_permission_denied").await?;
    }
    ensure!(denied >= 9, "refusals are counted: {denied}");
    cluster.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_region_leases_only_for_itself() -> Result<()> {
    let cluster = TlsCluster::start_initialised().await?;
    cluster
        .client_as(&operator())?
        .admin()
        .set_policy(counter_policy("tls/", 100, LONG_WINDOW_MS))
        .await?;
    let eu = CoordinatorClient::with_options(
        cluster.addrs.clone(),
        cluster.dialer_as(&region("eu")),
        impatient(),
    )?;
    ensure!(code_of(eu.lease("tls/k", "us", 5).await) == Code::PermissionDenied);
    ensure!(code_of(eu.reconcile("tls/k", "us", 5, 0).await) == Code::PermissionDenied);
    ensure!(
        code_of(
            eu.pool_grant(PoolGrantCall::new("tls/k", "us", 1, 10))
                .await
        ) == Code::PermissionDenied
    );
    let operator_client = CoordinatorClient::with_options(
        cluster.addrs.clone(),
        cluster.dialer_as(&operator()),
        impatient(),
    )?;
    ensure!(code_of(operator_client.lease("tls/k", "eu", 5).await) == Code::PermissionDenied);

    let eu = cluster.client_as(&region("eu"))?;
    ensure!(eu.lease("tls/k", "eu", 5).await?.granted == 5);
    // In a batch, each item is authorized alone: us's item is refused,
    // eu's is granted.
    let item = |region: &str| leasehold_client::coordinator::LeaseItem {
        key: "tls/k".into(),
        region: region.into(),
        tokens: 3,
    };
    let answers = eu.lease_batch(&[item("us"), item("eu")]).await?;
    ensure!(
        matches!(&answers[0], Err(e) if e.code() == Code::PermissionDenied),
        "{answers:?}"
    );
    ensure!(
        matches!(&answers[1], Ok(grant) if grant.granted == 3),
        "{answers:?}"
    );
    let window = cluster.client_as(&operator())?.get_window("tls/k").await?;
    ensure!(
        window.granted == 8,
        "only eu's own leases counted: {window:?}"
    );
    cluster.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_raft_messages_from_non_members_or_impostors_leave_terms_unchanged() -> Result<()> {
    let cluster = TlsCluster::start_initialised().await?;
    let terms_before = cluster.terms().await?;
    let far_term = terms_before.iter().max().copied().unwrap_or(0) + 100;

    // Member 99 has a valid certificate from the cluster's CA but is not in
    // the membership.
    let outsider = cluster.dialer_as(&Principal::Member(99));
    for addr in &cluster.addrs {
        let code =
            send_append_entries(&*outsider, addr, forged_append_entries(99, far_term)?).await?;
        ensure!(
            code == Code::PermissionDenied,
            "member 99 got {code:?} from {addr}"
        );
        let framed =
            send_framed_append_entries(&*outsider, addr, &forged_append_entries(99, far_term)?)
                .await?;
        ensure!(
            framed == "no framed connection",
            "member 99 got {framed} in frames from {addr}: a non-member may not even open one"
        );
    }
    // Member 2 is in the membership but claims to be member 3.
    let impostor = cluster.dialer_as(&Principal::Member(2));
    for addr in &cluster.addrs {
        let code =
            send_append_entries(&*impostor, addr, forged_append_entries(3, far_term)?).await?;
        ensure!(
            code == Code::PermissionDenied,
            "member 2 posing as 3 got {code:?} from {addr}"
        );
        let framed =
            send_framed_append_entries(&*impostor, addr, &forged_append_entries(3, far_term)?)
                .await?;
        ensure!(
            framed.starts_with("PermissionDenied"),
            "member 2 posing as 3 got {framed} in frames from {addr}"
        );
    }
    // An operator certificate is not a member at all.
    let code = send_append_entries(
        &*cluster.dialer_as(&operator()),
        &cluster.addrs[0],
        forged_append_entries(1, far_term)?,
    )
    .await?;
    ensure!(code == Code::PermissionDenied, "an operator got {code:?}");
    let framed = send_framed_append_entries(
        &*cluster.dialer_as(&operator()),
        &cluster.addrs[0],
        &forged_append_entries(1, far_term)?,
    )
    .await?;
    ensure!(
        framed == "no framed connection",
        "an operator got {framed} in frames"
    );

    let terms_after = cluster.terms().await?;
    ensure!(
        terms_after.iter().all(|t| *t < far_term),
        "a forged term was adopted: {terms_after:?}"
    );
    ensure!(
        terms_after == terms_before,
        "terms moved: {terms_before:?} -> {terms_after:?}"
    );
    ensure_still_granting(&cluster).await?;
    cluster.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn insecure_members_refuse_raft_messages_from_outside_the_membership() -> Result<()> {
    let cluster = Cluster::start_initialised(3, |config| config.insecure = true).await?;
    let client = cluster.client()?;
    client
        .admin()
        .set_policy(counter_policy("plain/", 1_000, LONG_WINDOW_MS))
        .await?;
    let mut terms_before = Vec::new();
    for id in 1..=3 {
        terms_before.push(cluster.status(id).await?.current_term);
    }
    let far_term = terms_before.iter().max().copied().unwrap_or(0) + 100;
    let dialer = TcpDialer::default();
    for id in 1..=3 {
        let code = send_append_entries(
            &dialer,
            &cluster.addr(id),
            forged_append_entries(99, far_term)?,
        )
        .await?;
        ensure!(
            code == Code::PermissionDenied,
            "node 99 got {code:?} from member {id}"
        );
        let framed = send_framed_append_entries(
            &dialer,
            &cluster.addr(id),
            &forged_append_entries(99, far_term)?,
        )
        .await?;
        ensure!(
            framed.starts_with("PermissionDenied"),
            "node 99 got {framed} in frames from member {id}"
        );
    }
    for id in 1..=3 {
        let term = cluster.status(id).await?.current_term;
        ensure!(
            term == terms_before[(id - 1) as usize],
            "member {id} moved to term {term}"
        );
    }
    ensure!(
        client.lease("plain/k", "eu", 3).await?.granted == 3,
        "the cluster keeps granting"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_member_certificate_is_served_without_restart() -> Result<()> {
    let cluster = TlsCluster::start_initialised().await?;
    let addr = cluster.addrs[0].clone();
    let member = cluster.files(&Principal::Member(1));
    let served_before = served_certificate(&cluster, &addr).await?;
    ensure!(served_before == first_certificate(&member.cert)?);

    // Rotate member 1's certificate and key (same CA, new key).
    cluster.ca.issue_into(
        &cluster.certs(),
        &Principal::Member(1),
        &["127.0.0.1".into()],
    )?;
    let rotated = first_certificate(&member.cert)?;
    ensure!(
        rotated != served_before,
        "the rotation made a new certificate"
    );
    wait_until_served(&cluster, &addr, &rotated).await?;

    // A broken certificate file keeps the rotated configuration.
    std::fs::write(&member.cert, "not a certificate")?;
    tokio::time::sleep(RELOAD_INTERVAL * 5).await;
    ensure!(
        served_certificate(&cluster, &addr).await? == rotated,
        "a broken file replaced the configuration"
    );
    // And the cluster still works through member 1.
    let admin =
        CoordinatorClient::with_options([addr.clone()], cluster.dialer_as(&operator()), patient())?
            .admin();
    ensure!(admin.status().await?.initialized);
    cluster.stop().await
}

fn first_certificate(path: &Path) -> Result<Vec<u8>> {
    use rustls_pki_types::pem::PemObject;
    let der = rustls_pki_types::CertificateDer::from_pem_file(path)?;
    Ok(der.to_vec())
}

/// The leaf certificate a member presents to a new connection.
async fn served_certificate(cluster: &TlsCluster, addr: &str) -> Result<Vec<u8>> {
    let files = cluster.files(&operator());
    let roots = leasehold_node::tls::load_roots(&files.ca)?;
    let chain = leasehold_node::tls::load_certificates(&files.cert)?;
    let key = leasehold_node::tls::load_private_key(&files.key)?;
    let config =
        rustls::ClientConfig::builder_with_provider(leasehold_node::tls::crypto_provider())
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let name = rustls_pki_types::ServerName::try_from("127.0.0.1")?.to_owned();
    let tls = connector.connect(name, tcp).await?;
    let leaf = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|chain| chain.first())
        .context("no server certificate")?;
    Ok(leaf.to_vec())
}

async fn wait_until_served(cluster: &TlsCluster, addr: &str, expected: &[u8]) -> Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if served_certificate(cluster, addr).await? == expected {
            return Ok(());
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "the rotated certificate was not picked up"
        );
        tokio::time::sleep(RELOAD_INTERVAL).await;
    }
}

/// An escrow node of region eu on TLS with the region's certificate,
/// leasing from `cluster` as region eu, configured by `configure`: its
/// address, its stop signal and its task.
async fn start_tls_escrow(
    cluster: &TlsCluster,
    configure: impl FnOnce(&mut leasehold_node::escrow::EscrowConfig),
) -> Result<(
    String,
    oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<(), leasehold_node::NodeError>>,
)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?.to_string();
    let files = cluster.files(&region("eu"));
    let mut config = leasehold_node::escrow::EscrowConfig::new(
        RegionId::new("eu")?,
        addr.clone(),
        cluster.addrs.clone(),
    );
    config.security = Some(Security::MutualTls(files.clone()));
    configure(&mut config);
    let tls = ReloadingServerConfig::load(files.clone())?;
    let incoming = TlsIncoming::new(TcpIncoming::from(listener), tls, Duration::from_secs(5));
    let (stop, stopped) = oneshot::channel::<()>();
    let escrow = tokio::spawn(leasehold_node::escrow::run_escrow(
        config,
        incoming,
        Security::MutualTls(files).dialer(),
        Arc::new(SystemClock),
        async move {
            let _ = stopped.await;
        },
    ));
    Ok((addr, stop, escrow))
}

/// One `Acquire` of `tokens` of `key` at the escrow node at `addr`, as
/// `principal` (under `client_id`, seq 1, when given): the tokens granted,
/// or the refusal's code.
async fn acquire_at(
    cluster: &TlsCluster,
    addr: &str,
    principal: &Principal,
    (key, tokens): (&str, u64),
    client_id: Option<&str>,
) -> Result<Result<u64, Code>> {
    let channel = cluster.dialer_as(principal).dial(addr).await?;
    let reply = leasehold_proto::v1::escrow_client::EscrowClient::new(channel)
        .acquire(pb::AcquireRequest {
            key: key.into(),
            tenant: String::new(),
            weight: 0,
            tokens,
            request_id: client_id.map(|client_id| pb::RequestId {
                client_id: client_id.into(),
                seq: 1,
            }),
        })
        .await;
    Ok(reply.map(|r| r.into_inner().granted).map_err(|s| s.code()))
}

/// The status of the escrow node at `addr`, read by an operator.
async fn escrow_status_at(cluster: &TlsCluster, addr: &str) -> Result<pb::EscrowStatusResponse> {
    let channel = cluster.dialer_as(&operator()).dial(addr).await?;
    Ok(
        leasehold_proto::v1::escrow_client::EscrowClient::new(channel)
            .status(pb::EscrowStatusRequest {})
            .await?
            .into_inner(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn escrow_nodes_serve_only_their_regions_services() -> Result<()> {
    let cluster = TlsCluster::start_initialised().await?;
    cluster
        .client_as(&operator())?
        .admin()
        .set_policy(counter_policy("tls/", 100, LONG_WINDOW_MS))
        .await?;

    // An escrow node of region eu, on TLS with the region's certificate,
    // leasing from the cluster as region eu.
    let (addr, stop, escrow) = start_tls_escrow(&cluster, |_| {}).await?;

    let us_service = Principal::Service {
        name: "checkout".into(),
        region: RegionId::new("us")?,
    };
    ensure!(
        acquire_at(&cluster, &addr, &us_service, ("tls/k", 2), Some("tls-test")).await?
            == Err(Code::PermissionDenied),
        "a us service acquired in eu"
    );
    ensure!(
        acquire_at(
            &cluster,
            &addr,
            &region("eu"),
            ("tls/k", 2),
            Some("tls-test")
        )
        .await?
            == Err(Code::PermissionDenied),
        "a region certificate acquired"
    );
    ensure!(
        acquire_at(&cluster, &addr, &operator(), ("tls/k", 2), Some("tls-test")).await?
            == Err(Code::PermissionDenied),
        "an operator acquired"
    );
    let granted = acquire_at(
        &cluster,
        &addr,
        &service_eu(),
        ("tls/k", 2),
        Some("tls-test"),
    )
    .await?;
    ensure!(granted == Ok(2), "eu's own service is served: {granted:?}");

    // Operators may read the status, which counts the refusals.
    let status = escrow_status_at(&cluster, &addr).await?;
    ensure!(status.refused_permission_denied == 3, "{status:?}");

    let _ = stop.send(());
    escrow.await??;
    cluster.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_operators_and_members_may_watch() -> Result<()> {
    use leasehold_proto::v1::monitor_client::MonitorClient;
    use leasehold_proto::v1::watch_request::Target;

    let cluster = TlsCluster::start_initialised().await?;
    cluster
        .client_as(&operator())?
        .admin()
        .set_policy(counter_policy("tls/", 100, LONG_WINDOW_MS))
        .await?;
    cluster
        .client_as(&region("eu"))?
        .lease("tls/k", "eu", 5)
        .await?;
    let watch = |who: Principal| {
        let dialer = cluster.dialer_as(&who);
        let addr = cluster.addrs[0].clone();
        async move {
            let channel = dialer.dial(&addr).await?;
            let request = pb::WatchRequest {
                target: Some(Target::Key("tls/k".into())),
            };
            anyhow::Ok(MonitorClient::new(channel).watch(request).await)
        }
    };
    for who in [region("eu"), service_eu()] {
        let refused = watch(who.clone()).await?;
        ensure!(
            refused.as_ref().err().map(|s| s.code()) == Some(Code::PermissionDenied),
            "{who} was let watch: {:?}",
            refused.map(|_| ())
        );
    }
    // A member certificate of a member the cluster does not have (a
    // removed member's, which nothing revokes) reads nothing.
    let stranger = watch(Principal::Member(99)).await?;
    ensure!(
        stranger.as_ref().err().map(|s| s.code()) == Some(Code::PermissionDenied),
        "member 99 (not in the membership) was let watch"
    );
    for who in [operator(), Principal::Member(2)] {
        let mut stream = watch(who.clone()).await??.into_inner();
        let first = tokio::time::timeout(Duration::from_secs(5), stream.message())
            .await??
            .context("an update")?;
        ensure!(
            first.windows.len() == 1 && first.windows[0].granted == 5,
            "{who} sees the grant: {first:?}"
        );
    }
    cluster.stop().await
}

/// One service minting client ids against a key is refused beyond its
/// bound of the key's holders on the escrow node — and only it: another
/// service of the region keeps being served, and the status counts the
/// refusals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_identity_beyond_its_holders_refuses_only_itself() -> Result<()> {
    let cluster = TlsCluster::start_initialised().await?;
    cluster
        .client_as(&operator())?
        .admin()
        .set_policy(counter_policy("bound/", 100, LONG_WINDOW_MS))
        .await?;
    let (addr, stop, escrow) = start_tls_escrow(&cluster, |config| {
        config.holder_limits.max_holders_per_principal = 3;
    })
    .await?;
    let checkout = service_eu();
    let other = Principal::Service {
        name: "other".into(),
        region: RegionId::new("eu")?,
    };
    for i in 0..3 {
        let granted = acquire_at(
            &cluster,
            &addr,
            &checkout,
            ("bound/k", 1),
            Some(&format!("flood-{i}")),
        )
        .await?;
        ensure!(granted == Ok(1), "holder {i}: {granted:?}");
    }
    for i in 3..6 {
        let refused = acquire_at(
            &cluster,
            &addr,
            &checkout,
            ("bound/k", 1),
            Some(&format!("flood-{i}")),
        )
        .await?;
        ensure!(
            refused == Err(Code::ResourceExhausted),
            "holder {i}: {refused:?}"
        );
    }
    let served = acquire_at(&cluster, &addr, &other, ("bound/k", 1), Some("other-1")).await?;
    ensure!(served == Ok(1), "the other service is served: {served:?}");
    let status = escrow_status_at(&cluster, &addr).await?;
    ensure!(status.refused_identity_holders == 3, "{status:?}");
    ensure!(status.refused_holders_exhausted == 0, "{status:?}");
    let _ = stop.send(());
    escrow.await??;
    cluster.stop().await
}

/// A member's own certificate — one that may leak, or a removed member's
/// while a new member has no membership yet — cannot push a term absurdly
/// far ahead nor to the edge of its type: such a message is refused
/// (`TERM_OUT_OF_RANGE`) over gRPC and in frames, terms stay where they
/// were, and the cluster keeps granting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raft_messages_cannot_push_a_term_out_of_range() -> Result<()> {
    let cluster = TlsCluster::start_initialised().await?;
    let terms_before = cluster.terms().await?;
    let current = terms_before.iter().max().copied().unwrap_or(0);
    let member = cluster.dialer_as(&Principal::Member(2));
    for term in [
        current + leasehold_node::coordinator::raft_service::MAX_TERM_STEP + 1,
        u64::MAX - 4,
    ] {
        for addr in &cluster.addrs {
            let code = send_append_entries(&*member, addr, forged_append_entries(2, term)?).await?;
            ensure!(
                code == Code::FailedPrecondition,
                "term {term} got {code:?} from {addr}"
            );
            let framed =
                send_framed_append_entries(&*member, addr, &forged_append_entries(2, term)?)
                    .await?;
            ensure!(
                framed.starts_with("FailedPrecondition"),
                "term {term} got {framed} in frames from {addr}"
            );
        }
    }
    let terms_after = cluster.terms().await?;
    ensure!(
        terms_after.iter().all(|t| *t <= current + 1),
        "terms moved: {terms_before:?} -> {terms_after:?}"
    );
    ensure_still_granting(&cluster).await?;
    cluster.stop().await
}

/// One service creating keys on an escrow node is refused beyond its
/// bound of the node's keys — and only it: another service of the region
/// still opens new keys, and the status counts the refusals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_identity_beyond_its_keys_refuses_only_itself() -> Result<()> {
    let cluster = TlsCluster::start_initialised().await?;
    cluster
        .client_as(&operator())?
        .admin()
        .set_policy(counter_policy("keys/", 100, LONG_WINDOW_MS))
        .await?;
    let (addr, stop, escrow) = start_tls_escrow(&cluster, |config| {
        config.max_keys_per_identity = 2;
    })
    .await?;
    let other = Principal::Service {
        name: "other".into(),
        region: RegionId::new("eu")?,
    };
    for key in ["keys/a", "keys/b"] {
        ensure!(
            acquire_at(&cluster, &addr, &service_eu(), (key, 1), None).await? == Ok(1),
            "{key}"
        );
    }
    let refused = acquire_at(&cluster, &addr, &service_eu(), ("keys/c", 1), None).await?;
    ensure!(refused == Err(Code::ResourceExhausted), "{refused:?}");
    // A key it created is still served; another service opens new keys,
    // and may use the first service's keys.
    ensure!(acquire_at(&cluster, &addr, &service_eu(), ("keys/a", 1), None).await? == Ok(1));
    ensure!(acquire_at(&cluster, &addr, &other, ("keys/c", 1), None).await? == Ok(1));
    ensure!(acquire_at(&cluster, &addr, &other, ("keys/a", 1), None).await? == Ok(1));
    let status = escrow_status_at(&cluster, &addr).await?;
    ensure!(status.refused_identity_keys == 1, "{status:?}");
    let _ = stop.send(());
    escrow.await??;
    cluster.stop().await
}

/// The issue's scenario, replayed: member 4 serves and is removed; its
/// certificate stays valid (nothing revokes it). It cannot have a Raft
/// message accepted by member 5, which is started to join but not added
/// yet (nor can member 99, which never was a member), nor by any member of
/// the cluster (`MEMBER_RETIRED`, over both transports), and it cannot be
/// added back. The routine steps — AddLearner(5), ChangeMembership(1, 2,
/// 3, 5), a step-down — then work, the cluster grants, and member 5 holds
/// the replicated record of retired ids too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retired_member_is_never_heard_again_not_even_by_a_joining_member() -> Result<()> {
    use leasehold_node::coordinator::raft_service::RaftMessage;
    let cluster = TlsCluster::start_initialised().await?;
    let admin = cluster.client_as(&operator())?.admin();
    let (addr4, (stop4, task4)) = cluster.start_member(4).await?;
    admin.add_learner(4, &addr4).await?;
    admin.change_membership(&[1, 2, 3, 4], false).await?;
    let removal = admin.change_membership(&[1, 2, 3], false).await?;
    ensure!(removal.lagging_member_ids.is_empty(), "{removal:?}");
    let _ = stop4.send(());
    task4.await??;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    for addr in &cluster.addrs {
        while cluster.admin_of(addr)?.status().await?.retired_member_ids != vec![4] {
            ensure!(
                tokio::time::Instant::now() < deadline,
                "{addr} never recorded member 4 as retired"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    let (addr5, (stop5, task5)) = cluster.start_member(5).await?;
    let term = cluster.terms().await?.into_iter().max().unwrap_or(0) + 5;
    let retired = cluster.dialer_as(&Principal::Member(4));
    let stranger = cluster.dialer_as(&Principal::Member(99));
    for (dialer, id) in [(&retired, 4), (&stranger, 99)] {
        for (message, payload) in [
            (RaftMessage::Vote, forged_vote(id, term)?),
            (RaftMessage::AppendEntries, forged_append_entries(id, term)?),
        ] {
            let refused = raft_refusal(&**dialer, &addr5, message, payload).await?;
            ensure!(
                refused.as_deref() == Some("NOT_A_MEMBER"),
                "member {id}'s {message:?} to the joining member: {refused:?}"
            );
        }
        let framed =
            send_framed_append_entries(&**dialer, &addr5, &forged_append_entries(id, term)?)
                .await?;
        ensure!(
            framed == "no framed connection",
            "member {id} framed to member 5: {framed}"
        );
    }
    ensure!(
        cluster.admin_of(&addr5)?.status().await?.current_term == 0,
        "the joining member's term moved"
    );
    for addr in &cluster.addrs {
        let refused = raft_refusal(
            &*retired,
            addr,
            RaftMessage::AppendEntries,
            forged_append_entries(4, term)?,
        )
        .await?;
        ensure!(
            refused.as_deref() == Some("MEMBER_RETIRED"),
            "member 4 to {addr}: {refused:?}"
        );
        let framed =
            send_framed_append_entries(&*retired, addr, &forged_append_entries(4, term)?).await?;
        ensure!(
            framed == "no framed connection",
            "member 4 framed to {addr}: {framed}"
        );
    }
    ensure!(
        code_of(admin.add_learner(4, &addr4).await) == Code::FailedPrecondition,
        "a retired id was added back"
    );

    admin.add_learner(5, &addr5).await?;
    admin.change_membership(&[1, 2, 3, 5], false).await?;
    admin.step_down(None).await?;
    cluster.wait_for_leader().await?;
    ensure_still_granting(&cluster).await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while raft_refusal(
        &*retired,
        &addr5,
        RaftMessage::AppendEntries,
        forged_append_entries(4, term)?,
    )
    .await?
    .as_deref()
        != Some("MEMBER_RETIRED")
    {
        ensure!(
            tokio::time::Instant::now() < deadline,
            "member 5 never learned that 4 retired"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = stop5.send(());
    task5.await??;
    cluster.stop().await
}

/// The probes an orchestrator uses need no certificate while the gRPC port
/// requires one: `/healthz` and `/readyz` answer over plain HTTP on the
/// metrics port of a mutual-TLS member — not ready (503, with the reason)
/// before it joins, ready once it has — and a client without a certificate
/// still cannot call the gRPC port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_probes_need_no_certificate_and_open_nothing_else() -> Result<()> {
    use crate::metrics::{free_addr, get};
    let cluster = TlsCluster::start_initialised().await?;
    let metrics_addr = free_addr()?;
    let listen = metrics_addr.clone();
    let (addr5, (stop5, task5)) = cluster
        .start_member_with(5, move |config| config.metrics_listen = Some(listen))
        .await?;
    let (status, _) = get(&metrics_addr, "/healthz").await?;
    ensure!(status.contains("200"), "liveness before joining: {status}");
    let (status, body) = get(&metrics_addr, "/readyz").await?;
    ensure!(
        status.contains("503") && body.contains("not initialised"),
        "readiness before joining: {status} {body}"
    );
    let plaintext = CoordinatorClient::with_options(
        [addr5.clone()],
        Arc::new(TcpDialer::default()),
        impatient(),
    )?;
    ensure!(
        plaintext.admin().status().await.is_err(),
        "the gRPC port answered a caller without a certificate"
    );

    let admin = cluster.client_as(&operator())?.admin();
    admin.add_learner(5, &addr5).await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body) = get(&metrics_addr, "/readyz").await?;
        if status.contains("200") {
            ensure!(body.contains("ready"), "{body}");
            break;
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "never ready: {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, _) = get(&metrics_addr, "/anything-else").await?;
    ensure!(status.contains("404"), "{status}");
    let _ = stop5.send(());
    task5.await??;
    cluster.stop().await
}

/// The runbook's "add a member" with one step left out: member 5 is
/// started without `--join-members`, so on mutual TLS it refuses the
/// leader and takes nothing of the log. `cluster add-learner` must say so
/// (exit 1, not 0), `change-membership` must refuse to make it a voter
/// (nothing changes: the quorum stays 2 of 3), and with the step done the
/// same commands succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_cannot_join_is_neither_reported_added_nor_promoted() -> Result<()> {
    let cluster = TlsCluster::start_initialised().await?;
    let admin = cluster.client_as(&operator())?.admin();
    let (addr5, (stop5, task5)) = cluster
        .start_member_with(5, |config| config.join_members = vec![])
        .await?;
    let operator_files = cluster.files(&operator());
    let cli = |args: &[&str]| -> Result<(i32, String)> {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_leasehold"))
            .args(args)
            .args(["--endpoint", &cluster.addrs.join(",")])
            .args(["--ca", &operator_files.ca.to_string_lossy()])
            .args(["--cert", &operator_files.cert.to_string_lossy()])
            .args(["--cert-key", &operator_files.key.to_string_lossy()])
            .env_remove("LEASEHOLD_INSECURE")
            .env("RUST_LOG", "error")
            .output()?;
        Ok((
            output.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&output.stderr).into_owned()
                + &String::from_utf8_lossy(&output.stdout),
        ))
    };
    let member5 = format!("5={addr5}");
    let (code, said) = cli(&[
        "cluster",
        "add-learner",
        "--member",
        &member5,
        "--timeout-ms",
        "3000",
    ])?;
    ensure!(
        code == 1
            && said.contains("has taken nothing of the log")
            && said.contains("--join-members"),
        "add-learner of a member that cannot join: exit {code}: {said}"
    );
    let refused = admin.change_membership(&[1, 2, 3, 5], false).await;
    ensure!(
        matches!(&refused, Err(e) if e.code() == Code::FailedPrecondition),
        "a member holding nothing was made a voter: {refused:?}"
    );
    let voter_flags = |last: &'static str| {
        let mut flags = vec!["cluster", "change-membership"];
        for id in ["1", "2", "3", last] {
            flags.extend(["--voter", id]);
        }
        flags
    };
    let (code, said) = cli(&voter_flags("5"))?;
    ensure!(
        code != 0 && said.contains("cannot be made a voter"),
        "change-membership of a member holding nothing: exit {code}: {said}"
    );
    let voters: Vec<u64> = admin.status().await?.voters.iter().map(|m| m.id).collect();
    ensure!(voters == vec![1, 2, 3], "the voters changed: {voters:?}");
    let _ = stop5.send(());
    task5.await??;

    // The id is taken at that address: adding it elsewhere is refused,
    // not silently kept at the old one.
    let moved = admin.add_learner(5, "127.0.0.1:1").await;
    ensure!(
        code_of(moved) == Code::FailedPrecondition,
        "member 5 was re-added at another address"
    );

    // Started as the runbook says, the same steps work.
    let (addr4, (stop4, task4)) = cluster.start_member(4).await?;
    let member4 = format!("4={addr4}");
    let (code, said) = cli(&["cluster", "add-learner", "--member", &member4])?;
    ensure!(
        code == 0 && said.contains("it holds the log"),
        "exit {code}: {said}"
    );
    let (code, said) = cli(&voter_flags("4"))?;
    ensure!(code == 0, "exit {code}: {said}");
    ensure_still_granting(&cluster).await?;
    let _ = stop4.send(());
    task4.await??;
    cluster.stop().await
}
