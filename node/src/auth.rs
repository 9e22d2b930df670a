//! Who sent a request: the [`PeerInfo`] a listener attaches to every
//! connection, and [`caller`] to read the authenticated [`Principal`] in a
//! handler.
//!
//! The listener's connection type puts its `PeerInfo` into each request's
//! extensions (tonic's `Connected::connect_info`). A plaintext listener
//! (`--insecure`) attaches none, and every caller is
//! [`Principal::Anonymous`].
//!
//! Authorization: [`authorize_call`] (which identity may call which gRPC
//! method, enforced for every call by [`AuthLayer`]), [`authorize_region`]
//! (a region acts only for itself) and [`authorize_raft_sender`] (Raft
//! messages only from current members, under their own id). Refusals are
//! counted and logged at most once per peer per minute by [`AuthRefusals`].

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use leasehold_core::ids::RegionId;
use leasehold_core::principal::Principal;
use leasehold_proto::refusal::{refusal, Reason};
use tonic::Status;

/// What a listener knows about the other end of one connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerInfo {
    /// The peer's socket address, when the transport has one.
    pub remote_addr: Option<SocketAddr>,
    /// The identity its client certificate proved.
    pub principal: Principal,
}

/// The authenticated caller of `request` ([`Principal::Anonymous`] on a
/// plaintext listener).
pub fn caller<T>(request: &tonic::Request<T>) -> Principal {
    request
        .extensions()
        .get::<PeerInfo>()
        .map_or(Principal::Anonymous, |peer| peer.principal.clone())
}

/// Which listener's rules apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// A coordinator member: Coordinator, Admin, Monitor, Raft and health services.
    Coordinator,
    /// An escrow node of this region: Escrow, Monitor and health services.
    Escrow {
        /// The region the node serves.
        region: RegionId,
    },
}

/// Why a call was refused by identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The connection proved no identity on a listener that requires one.
    Unauthenticated(String),
    /// The identity is known and not allowed to do this (reason
    /// `NOT_PERMITTED`, `OTHER_REGION` or `NOT_A_MEMBER`).
    PermissionDenied(Reason, String),
}

impl Refusal {
    /// The gRPC status the caller sees.
    pub fn status(&self) -> Status {
        match self {
            Refusal::Unauthenticated(why) => refusal(Reason::Unauthenticated, why.clone()),
            Refusal::PermissionDenied(reason, why) => refusal(*reason, why.clone()),
        }
    }

    fn denied(who: &Principal, what: &str) -> Refusal {
        Refusal::PermissionDenied(Reason::NotPermitted, format!("{who} may not call {what}"))
    }
}

const HEALTH_SERVICE: &str = "grpc.health.v1.Health";
const REFLECTION_SERVICE: &str = "grpc.reflection.v1.ServerReflection";
const REFLECTION_V1ALPHA_SERVICE: &str = "grpc.reflection.v1alpha.ServerReflection";
const COORDINATOR_SERVICE: &str = "leasehold.v1.Coordinator";
const ADMIN_SERVICE: &str = "leasehold.v1.Admin";
const RAFT_SERVICE: &str = "leasehold.v1.Raft";
const ESCROW_SERVICE: &str = "leasehold.v1.Escrow";
const MONITOR_SERVICE: &str = "leasehold.v1.Monitor";
/// Envoy's rate limit service, served by escrow nodes given a ratelimit configuration.
pub const RATELIMIT_SERVICE: &str = "envoy.service.ratelimit.v3.RateLimitService";

/// Splits a gRPC request path `/package.Service/Method`.
fn split_path(path: &str) -> Option<(&str, &str)> {
    let rest = path.strip_prefix('/')?;
    let (service, method) = rest.split_once('/')?;
    if service.is_empty() || method.is_empty() || method.contains('/') {
        return None;
    }
    Some((service, method))
}

/// May `caller` call the gRPC method at `path` on a listener of `scope`?
///
/// `caller` is `None` on a plaintext (`--insecure`) listener, where every
/// call passes this check (the Raft service still checks the claimed sender
/// with [`authorize_raft_sender`]). On a TLS listener:
///
/// | service | allowed callers |
/// |---|---|
/// | health, reflection (v1, v1alpha) | anyone authenticated |
/// | Raft | `Member` (membership and sender checked per message) |
/// | Admin `Status`, `ListPolicies` | `Operator`, `Region` |
/// | Admin, everything else | `Operator` |
/// | Coordinator `GetWindow`, `GetPlacement` | `Operator`, `Region` |
/// | Coordinator `Lease`, `LeaseBatch`, `Reconcile`, `PoolGrant`, `PoolRelease` | `Region` (its own region: [`authorize_region`]) |
/// | Monitor (`Watch`, read only) | `Operator`, `Member` |
/// | Escrow `Status` | `Operator`, `Service` of the node's region |
/// | Monitor on an escrow node | `Operator` |
/// | Escrow, everything else | `Service` of the node's region |
/// | Envoy's RateLimitService (`ShouldRateLimit`) | `Service` of the node's region |
///
/// Anything else (unknown services, another scope's services) is refused.
pub fn authorize_call(
    path: &str,
    caller: Option<&Principal>,
    scope: &Scope,
) -> Result<(), Refusal> {
    let Some(caller) = caller else {
        return Ok(());
    };
    if *caller == Principal::Anonymous {
        return Err(Refusal::Unauthenticated(
            "a client certificate naming a principal is required".into(),
        ));
    }
    let Some((service, method)) = split_path(path) else {
        return Err(Refusal::denied(caller, path));
    };
    let allowed = match (scope, service) {
        (_, HEALTH_SERVICE | REFLECTION_SERVICE | REFLECTION_V1ALPHA_SERVICE) => true,
        (Scope::Coordinator, RAFT_SERVICE) => matches!(caller, Principal::Member(_)),
        (Scope::Coordinator, ADMIN_SERVICE) => match caller {
            Principal::Operator(_) => true,
            Principal::Region(_) => matches!(method, "Status" | "ListPolicies"),
            _ => false,
        },
        (Scope::Coordinator, COORDINATOR_SERVICE) => match caller {
            Principal::Region(_) => true,
            Principal::Operator(_) => matches!(method, "GetWindow" | "GetPlacement"),
            _ => false,
        },
        (Scope::Coordinator, MONITOR_SERVICE) => {
            matches!(caller, Principal::Operator(_) | Principal::Member(_))
        }
        (Scope::Escrow { region }, ESCROW_SERVICE) => match caller {
            Principal::Service {
                region: caller_region,
                ..
            } => caller_region == region,
            Principal::Operator(_) => method == "Status",
            _ => false,
        },
        (Scope::Escrow { region }, RATELIMIT_SERVICE) => matches!(
            caller,
            Principal::Service { region: caller_region, .. } if caller_region == region
        ),
        (Scope::Escrow { .. }, MONITOR_SERVICE) => matches!(caller, Principal::Operator(_)),
        _ => false,
    };
    if allowed {
        Ok(())
    } else {
        Err(Refusal::denied(caller, &format!("{service}/{method}")))
    }
}

/// May `caller` act for `region` (Lease, Reconcile, PoolGrant, PoolRelease)? A `Region`
/// principal only for its own region; the anonymous caller of an insecure
/// listener always; nobody else.
pub fn authorize_region(caller: &Principal, region: &str) -> Result<(), Refusal> {
    match caller {
        Principal::Anonymous => Ok(()),
        Principal::Region(own) if own.as_str() == region => Ok(()),
        other => Err(Refusal::PermissionDenied(
            Reason::OtherRegion,
            format!("{other} may not act for region {region:?}"),
        )),
    }
}

/// How much of a shared table each caller identity holds (an escrow node's
/// keys, a TLS listener's connections), against one bound (pure).
/// `Anonymous` (a plaintext listener's callers, who share no identity) is
/// not counted.
#[derive(Debug, Default)]
pub struct IdentityQuota {
    counts: HashMap<Principal, usize>,
}

impl IdentityQuota {
    /// Counts one more of `who` unless it already holds `max`: whether it
    /// may.
    pub fn take(&mut self, who: &Principal, max: usize) -> bool {
        if *who == Principal::Anonymous {
            return true;
        }
        let count = self.counts.entry(who.clone()).or_default();
        if *count >= max {
            if *count == 0 {
                self.counts.remove(who);
            }
            return false;
        }
        *count += 1;
        true
    }

    /// One of `who`'s is gone.
    pub fn give_back(&mut self, who: &Principal) {
        if let Some(count) = self.counts.get_mut(who) {
            *count -= 1;
            if *count == 0 {
                self.counts.remove(who);
            }
        }
    }

    /// How many `who` holds.
    pub fn of(&self, who: &Principal) -> usize {
        self.counts.get(who).copied().unwrap_or(0)
    }

    /// Identities holding any.
    pub fn identities(&self) -> usize {
        self.counts.len()
    }
}

/// Whose Raft messages a member may accept: its current membership, the
/// members it was told to join while it has none, and every id retired
/// from the cluster.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RaftPeers {
    /// Voters and learners of the member's membership (empty while it has
    /// none yet).
    pub members: BTreeSet<u64>,
    /// The members of the cluster it was told to join (`--join-members`).
    pub joining: BTreeSet<u64>,
    /// Ids a committed membership change removed from the cluster.
    pub retired: BTreeSet<u64>,
}

impl RaftPeers {
    /// The peers of a member whose Raft shows `members` (empty: none yet),
    /// told to join `joining`, with `retired` ids recorded — or `None` while
    /// it is still loading a log it has (`has_log` and no membership shown
    /// yet): then its join list must not stand in for the membership its
    /// log holds, and nothing is accepted until Raft has loaded it.
    pub fn current(
        members: BTreeSet<u64>,
        joining: BTreeSet<u64>,
        retired: BTreeSet<u64>,
        has_log: bool,
    ) -> Option<RaftPeers> {
        (!(members.is_empty() && has_log)).then_some(RaftPeers {
            members,
            joining,
            retired,
        })
    }
}

/// May a Raft message claiming to come from member `claimed_sender` be
/// accepted from `caller`, given the receiving member's `peers`?
///
/// - On a TLS listener (`caller` is `Some`), the caller must be
///   `Member(id)` with `id == claimed_sender`.
/// - A retired id is refused, always (`MEMBER_RETIRED`).
/// - With a membership, the sender must be in it.
/// - Without one (a member that has not joined yet), the sender must be
///   one of the members it was told to join; on TLS with none named, no
///   sender is accepted. On a plaintext listener with none named, any
///   sender is (plaintext is a guard against stray traffic, not a
///   protection: anyone can claim any id).
pub fn authorize_raft_sender(
    caller: Option<&Principal>,
    claimed_sender: u64,
    peers: &RaftPeers,
) -> Result<(), Refusal> {
    let sender = match caller {
        None => claimed_sender,
        Some(Principal::Member(id)) if *id == claimed_sender => *id,
        Some(Principal::Member(id)) => {
            return Err(Refusal::PermissionDenied(
                Reason::NotAMember,
                format!(
                    "member {id} may not send raft messages claiming to be member {claimed_sender}"
                ),
            ))
        }
        Some(Principal::Anonymous) => {
            return Err(Refusal::Unauthenticated(
                "raft messages need a member certificate".into(),
            ))
        }
        Some(other) => return Err(Refusal::denied(other, "the raft service")),
    };
    if peers.retired.contains(&sender) {
        return Err(Refusal::PermissionDenied(
            Reason::MemberRetired,
            format!(
                "member {sender} was removed from this cluster; its id is never accepted again"
            ),
        ));
    }
    if !peers.members.is_empty() {
        return if peers.members.contains(&sender) {
            Ok(())
        } else {
            Err(Refusal::PermissionDenied(
                Reason::NotAMember,
                format!("member {sender} is not in this node's membership"),
            ))
        };
    }
    if peers.joining.contains(&sender) || (peers.joining.is_empty() && caller.is_none()) {
        return Ok(());
    }
    let problem = if peers.joining.is_empty() {
        "this member has no membership yet and was not told which cluster to join \
         (start it with --join-members and the ids of the cluster's members)"
            .to_string()
    } else {
        format!(
            "this member has no membership yet and accepts raft messages only from the \
             members it was told to join ({:?})",
            peers.joining
        )
    };
    Err(Refusal::PermissionDenied(
        Reason::NotAMember,
        format!("member {sender} refused: {problem}"),
    ))
}

/// Most peers remembered for log rate limiting; beyond it the oldest
/// entries are forgotten (a peer may then be logged again early).
const MAX_LOGGED_PEERS: usize = 4_096;
/// A peer's refusals are logged at most once per this interval.
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(60);

/// Counts refusals by identity and logs them at most once per peer per
/// minute.
#[derive(Debug, Default)]
pub struct AuthRefusals {
    unauthenticated: AtomicU64,
    permission_denied: AtomicU64,
    last_logged: Mutex<HashMap<String, Instant>>,
}

impl AuthRefusals {
    /// Counts and (rate-limited) logs `refusal` of a call to `what` by
    /// `peer`, and returns the status to answer with.
    pub fn refuse(&self, peer: Option<&PeerInfo>, what: &str, refusal: Refusal) -> Status {
        let counter = match refusal {
            Refusal::Unauthenticated(_) => &self.unauthenticated,
            Refusal::PermissionDenied(..) => &self.permission_denied,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        let key = match peer {
            Some(peer) if peer.principal != Principal::Anonymous => peer.principal.to_string(),
            Some(PeerInfo {
                remote_addr: Some(addr),
                ..
            }) => addr.ip().to_string(),
            _ => "anonymous".to_string(),
        };
        if self.should_log(key, Instant::now()) {
            let reason = match &refusal {
                Refusal::Unauthenticated(why) | Refusal::PermissionDenied(_, why) => why.as_str(),
            };
            tracing::warn!(
                peer = ?peer.map(|p| &p.principal),
                remote = ?peer.and_then(|p| p.remote_addr),
                call = what,
                reason,
                "call refused (logged once per peer per minute)"
            );
        }
        refusal.status()
    }

    fn should_log(&self, key: String, now: Instant) -> bool {
        let mut seen = match self.last_logged.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        if let Some(last) = seen.get(&key) {
            if now.saturating_duration_since(*last) < REFUSAL_LOG_INTERVAL {
                return false;
            }
        }
        if seen.len() >= MAX_LOGGED_PEERS {
            seen.retain(|_, last| now.saturating_duration_since(*last) < REFUSAL_LOG_INTERVAL);
            if seen.len() >= MAX_LOGGED_PEERS {
                seen.clear();
            }
        }
        seen.insert(key, now);
        true
    }

    /// Calls refused for lack of an identity.
    pub fn unauthenticated(&self) -> u64 {
        self.unauthenticated.load(Ordering::Relaxed)
    }

    /// Calls refused to an identity not allowed to make them.
    pub fn permission_denied(&self) -> u64 {
        self.permission_denied.load(Ordering::Relaxed)
    }
}

/// A tower layer that refuses, before any handler runs, gRPC calls the
/// caller may not make ([`authorize_call`]).
#[derive(Debug, Clone)]
pub struct AuthLayer {
    scope: Arc<Scope>,
    refusals: Arc<AuthRefusals>,
}

impl AuthLayer {
    /// Enforces `scope`'s rules, counting refusals in `refusals`.
    pub fn new(scope: Scope, refusals: Arc<AuthRefusals>) -> Self {
        Self {
            scope: Arc::new(scope),
            refusals,
        }
    }
}

impl<S> tower::Layer<S> for AuthLayer {
    type Service = AuthService<S>;

    fn layer(&self, inner: S) -> AuthService<S> {
        AuthService {
            inner,
            scope: self.scope.clone(),
            refusals: self.refusals.clone(),
        }
    }
}

/// The service [`AuthLayer`] wraps around the server's routes.
#[derive(Debug, Clone)]
pub struct AuthService<S> {
    inner: S,
    scope: Arc<Scope>,
    refusals: Arc<AuthRefusals>,
}

impl<S, B> tower::Service<http::Request<B>> for AuthService<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = futures::future::BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let peer = request.extensions().get::<PeerInfo>();
        let path = request.uri().path();
        match authorize_call(path, peer.map(|p| &p.principal), &self.scope) {
            Ok(()) => Box::pin(self.inner.call(request)),
            Err(refusal) => {
                let status = self.refusals.refuse(peer, path, refusal);
                Box::pin(std::future::ready(Ok(status.into_http())))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn region(name: &str) -> RegionId {
        RegionId::new(name).unwrap()
    }

    fn operator() -> Principal {
        Principal::Operator("alice".into())
    }

    fn service(region_name: &str) -> Principal {
        Principal::Service {
            name: "checkout".into(),
            region: region(region_name),
        }
    }

    fn is_denied(result: Result<(), Refusal>) -> bool {
        matches!(result, Err(Refusal::PermissionDenied(..)))
    }

    #[test]
    fn who_may_call_what_on_a_coordinator() {
        let eu = Principal::Region(region("eu"));
        let member = Principal::Member(1);
        // (path, allowed callers among [operator, region eu, member 1, service eu])
        let table: [(&str, [bool; 4]); 16] = [
            ("/leasehold.v1.Admin/SetPolicy", [true, false, false, false]),
            (
                "/leasehold.v1.Admin/SaveSnapshot",
                [true, false, false, false],
            ),
            (
                "/leasehold.v1.Admin/ChangeMembership",
                [true, false, false, false],
            ),
            ("/leasehold.v1.Admin/StepDown", [true, false, false, false]),
            ("/leasehold.v1.Admin/Init", [true, false, false, false]),
            (
                "/leasehold.v1.Admin/ListPolicies",
                [true, true, false, false],
            ),
            ("/leasehold.v1.Admin/Status", [true, true, false, false]),
            (
                "/leasehold.v1.Coordinator/Lease",
                [false, true, false, false],
            ),
            (
                "/leasehold.v1.Coordinator/Reconcile",
                [false, true, false, false],
            ),
            (
                "/leasehold.v1.Coordinator/PoolGrant",
                [false, true, false, false],
            ),
            (
                "/leasehold.v1.Coordinator/PoolRelease",
                [false, true, false, false],
            ),
            (
                "/leasehold.v1.Coordinator/GetWindow",
                [true, true, false, false],
            ),
            (
                "/leasehold.v1.Raft/AppendEntries",
                [false, false, true, false],
            ),
            ("/grpc.health.v1.Health/Check", [true, true, true, true]),
            ("/leasehold.v1.Escrow/Acquire", [false, false, false, false]),
            ("/leasehold.v1.Monitor/Watch", [true, false, true, false]),
        ];
        for (path, allowed) in table {
            for (who, allowed) in [operator(), eu.clone(), member.clone(), service("eu")]
                .iter()
                .zip(allowed)
            {
                let result = authorize_call(path, Some(who), &Scope::Coordinator);
                assert_eq!(result.is_ok(), allowed, "{who} calling {path}: {result:?}");
                if !allowed {
                    assert!(is_denied(result), "{who} calling {path}");
                }
            }
        }
    }

    #[test]
    fn escrow_nodes_serve_their_own_regions_services() {
        let scope = Scope::Escrow {
            region: region("eu"),
        };
        for method in ["Acquire", "Check", "Return", "Forecast", "Status"] {
            let path = format!("/leasehold.v1.Escrow/{method}");
            assert!(authorize_call(&path, Some(&service("eu")), &scope).is_ok());
            assert!(is_denied(authorize_call(
                &path,
                Some(&service("us")),
                &scope
            )));
            assert!(is_denied(authorize_call(
                &path,
                Some(&Principal::Region(region("eu"))),
                &scope
            )));
            assert_eq!(
                authorize_call(&path, Some(&operator()), &scope).is_ok(),
                method == "Status"
            );
        }
        assert!(is_denied(authorize_call(
            "/leasehold.v1.Admin/Status",
            Some(&operator()),
            &scope
        )));
        assert!(authorize_call("/leasehold.v1.Monitor/Watch", Some(&operator()), &scope).is_ok());
        let should = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
        assert!(authorize_call(should, Some(&service("eu")), &scope).is_ok());
        for who in [
            service("us"),
            operator(),
            Principal::Region(region("eu")),
            Principal::Member(1),
        ] {
            assert!(
                is_denied(authorize_call(should, Some(&who), &scope)),
                "{who}"
            );
        }
        assert!(
            is_denied(authorize_call(
                should,
                Some(&service("eu")),
                &Scope::Coordinator
            )),
            "a coordinator member serves no RLS"
        );
        for who in [
            service("eu"),
            Principal::Region(region("eu")),
            Principal::Member(1),
        ] {
            assert!(is_denied(authorize_call(
                "/leasehold.v1.Monitor/Watch",
                Some(&who),
                &scope
            )));
        }
    }

    #[test]
    fn no_identity_on_a_tls_listener_is_unauthenticated() {
        assert!(matches!(
            authorize_call(
                "/leasehold.v1.Admin/Status",
                Some(&Principal::Anonymous),
                &Scope::Coordinator
            ),
            Err(Refusal::Unauthenticated(_))
        ));
        assert_eq!(
            Refusal::Unauthenticated("x".into()).status().code(),
            tonic::Code::Unauthenticated
        );
        assert_eq!(
            Refusal::PermissionDenied(Reason::NotPermitted, "x".into())
                .status()
                .code(),
            tonic::Code::PermissionDenied
        );
    }

    #[test]
    fn regions_act_only_for_themselves() {
        let eu = Principal::Region(region("eu"));
        assert!(authorize_region(&eu, "eu").is_ok());
        assert!(is_denied(authorize_region(&eu, "us")));
        assert!(is_denied(authorize_region(&operator(), "eu")));
        assert!(is_denied(authorize_region(&service("eu"), "eu")));
        assert!(authorize_region(&Principal::Anonymous, "us").is_ok());
    }

    fn peers(members: &[u64], joining: &[u64], retired: &[u64]) -> RaftPeers {
        RaftPeers {
            members: members.iter().copied().collect(),
            joining: joining.iter().copied().collect(),
            retired: retired.iter().copied().collect(),
        }
    }

    #[test]
    fn raft_senders_must_be_current_members_under_their_own_id() {
        let members = peers(&[1, 2, 3], &[], &[]);
        let m = Principal::Member;
        assert!(authorize_raft_sender(Some(&m(2)), 2, &members).is_ok());
        assert!(is_denied(authorize_raft_sender(Some(&m(2)), 3, &members)));
        assert!(is_denied(authorize_raft_sender(Some(&m(99)), 99, &members)));
        assert!(is_denied(authorize_raft_sender(
            Some(&operator()),
            1,
            &members
        )));
        assert!(authorize_raft_sender(None, 3, &members).is_ok());
        assert!(is_denied(authorize_raft_sender(None, 99, &members)));
    }

    #[test]
    fn a_member_without_membership_hears_only_the_cluster_it_joins() {
        let m = Principal::Member;
        let told = peers(&[], &[1, 2, 3], &[]);
        assert!(authorize_raft_sender(Some(&m(1)), 1, &told).is_ok());
        assert!(is_denied(authorize_raft_sender(Some(&m(4)), 4, &told)));
        assert!(is_denied(authorize_raft_sender(None, 4, &told)));
        let untold = peers(&[], &[], &[]);
        assert!(is_denied(authorize_raft_sender(Some(&m(1)), 1, &untold)));
        assert!(
            authorize_raft_sender(None, 99, &untold).is_ok(),
            "plaintext without a join list hears anyone"
        );
    }

    #[test]
    fn a_member_loading_its_log_hears_nobody_not_even_its_join_list() {
        let set = |ids: &[u64]| ids.iter().copied().collect::<BTreeSet<u64>>();
        assert_eq!(
            RaftPeers::current(set(&[]), set(&[1, 2, 3]), set(&[]), true),
            None,
            "a restarted member before Raft shows its membership"
        );
        let fresh = RaftPeers::current(set(&[]), set(&[1, 2, 3]), set(&[]), false).unwrap();
        assert!(authorize_raft_sender(Some(&Principal::Member(2)), 2, &fresh).is_ok());
        let loaded = RaftPeers::current(set(&[1, 3, 4]), set(&[1, 2, 3]), set(&[2]), true).unwrap();
        assert!(authorize_raft_sender(Some(&Principal::Member(2)), 2, &loaded).is_err());
        assert!(authorize_raft_sender(Some(&Principal::Member(4)), 4, &loaded).is_ok());
    }

    #[test]
    fn a_retired_id_is_refused_even_if_listed_elsewhere() {
        let m = Principal::Member;
        for listed in [peers(&[1, 4], &[], &[4]), peers(&[], &[1, 4], &[4])] {
            let refusal = authorize_raft_sender(Some(&m(4)), 4, &listed).unwrap_err();
            assert!(
                matches!(refusal, Refusal::PermissionDenied(Reason::MemberRetired, _)),
                "{refusal:?}"
            );
            assert!(authorize_raft_sender(None, 4, &listed).is_err());
            assert!(authorize_raft_sender(Some(&m(1)), 1, &listed).is_ok());
        }
    }

    #[test]
    fn refusals_are_counted_and_logged_once_per_peer_per_minute() {
        let refusals = AuthRefusals::default();
        let peer = PeerInfo {
            remote_addr: None,
            principal: operator(),
        };
        let status = refusals.refuse(
            Some(&peer),
            "x",
            Refusal::PermissionDenied(Reason::NotPermitted, "no".into()),
        );
        assert_eq!(status.code(), tonic::Code::PermissionDenied);
        refusals.refuse(None, "x", Refusal::Unauthenticated("no".into()));
        assert_eq!(refusals.permission_denied(), 1);
        assert_eq!(refusals.unauthenticated(), 1);
        let start = Instant::now();
        assert!(refusals.should_log("p".into(), start + Duration::from_secs(120)));
        assert!(!refusals.should_log("p".into(), start + Duration::from_secs(150)));
        assert!(refusals.should_log("p".into(), start + Duration::from_secs(181)));
    }

    fn any_principal() -> impl Strategy<Value = Principal> {
        prop_oneof![
            Just(Principal::Anonymous),
            (0u64..6).prop_map(Principal::Member),
            "[a-z]{1,6}".prop_map(Principal::Operator),
            "(eu|us|ap)".prop_map(|r| Principal::Region(RegionId::new(r).unwrap())),
            ("[a-z]{1,6}", "(eu|us|ap)").prop_map(|(name, r)| Principal::Service {
                name,
                region: RegionId::new(r).unwrap()
            }),
        ]
    }

    proptest! {
        /// A plaintext listener lets every call through; a TLS listener lets
        /// Admin writes through only for operators, and never panics.
        #[test]
        fn only_operators_write_admin_over_tls(
            who in any_principal(),
            path in "/[a-zA-Z./]{0,30}",
            method in "(SetPolicy|DeletePolicy|Init|AddLearner|ChangeMembership|StepDown)",
        ) {
            prop_assert!(authorize_call(&path, None, &Scope::Coordinator).is_ok());
            let _ = authorize_call(&path, Some(&who), &Scope::Coordinator);
            let admin = format!("/leasehold.v1.Admin/{method}");
            let allowed = authorize_call(&admin, Some(&who), &Scope::Coordinator).is_ok();
            prop_assert_eq!(allowed, matches!(who, Principal::Operator(_)));
        }

        /// Any sequence of takes and give-backs keeps every identity within
        /// the bound and counts what is held, nothing more; `Anonymous` is
        /// never counted (an escrow node's keys, a listener's connections).
        #[test]
        fn identity_quota_stays_within_the_bound(
            steps in proptest::collection::vec((0u8..4, any::<bool>()), 0..200),
        ) {
            let bound = 3;
            let mut quota = IdentityQuota::default();
            let mut model = [0usize; 4];
            for (who, take) in steps {
                let principal = match who {
                    3 => Principal::Anonymous,
                    n => Principal::Operator(format!("op{n}")),
                };
                let counted = who != 3;
                let held = &mut model[usize::from(who)];
                if take {
                    let taken = quota.take(&principal, bound);
                    prop_assert_eq!(taken, !counted || *held < bound);
                    if taken && counted {
                        *held += 1;
                    }
                } else if *held > 0 {
                    quota.give_back(&principal);
                    *held -= 1;
                }
                prop_assert_eq!(quota.of(&principal), *held);
            }
            prop_assert_eq!(quota.identities(), model.iter().filter(|h| **h > 0).count());
        }

        /// A Raft message over TLS passes only when the certificate's member
        /// id is the claimed sender, not retired, and in the membership —
        /// or, without one, among the members it was told to join.
        #[test]
        fn raft_sender_law(
            who in any_principal(),
            claimed in 0u64..6,
            members in proptest::collection::btree_set(0u64..6, 0..4),
            joining in proptest::collection::btree_set(0u64..6, 0..4),
            retired in proptest::collection::btree_set(0u64..6, 0..3),
        ) {
            let peers = RaftPeers { members, joining, retired };
            let allowed = authorize_raft_sender(Some(&who), claimed, &peers).is_ok();
            let listed = if peers.members.is_empty() { &peers.joining } else { &peers.members };
            let expected = who == Principal::Member(claimed)
                && !peers.retired.contains(&claimed)
                && listed.contains(&claimed);
            prop_assert_eq!(allowed, expected);
        }
    }
}
