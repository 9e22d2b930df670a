//! What the binary's client commands say when the connection cannot work,
//! against real listeners in this process: certificates one side does not
//! trust (unknown CA either way, expired either side, the wrong server
//! name, a CA of the same name but another key), TLS on one side only, an
//! escrow node's port and a `/metrics` port given for a coordinator
//! command. Every case runs the binary several times and must
//! print the same error code, exit code and cause each time.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use leasehold_client::transport::SystemClock;
use leasehold_core::ids::RegionId;
use leasehold_core::principal::Principal;
use leasehold_node::certs::{files_for, mint, CertificateAuthority, MintPlan};
use leasehold_node::coordinator::{open_stores, run_coordinator};
use leasehold_node::tls::{ReloadingServerConfig, Security, TlsFiles, TlsIncoming};
use leasehold_node::NodeError;
use rcgen::{CertificateParams, ExtendedKeyUsagePurpose, Issuer, KeyPair, SanType};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::server::TcpIncoming;

use crate::harness::{fast_config, Cluster};

/// Runs of each case: the same setup must fail the same way every time.
const RUNS: usize = 3;

type Running = (oneshot::Sender<()>, JoinHandle<Result<(), NodeError>>);

fn operator() -> Principal {
    Principal::Operator("admin".into())
}

fn region_eu() -> Principal {
    Principal::Region(RegionId::new("eu").unwrap())
}

/// The cluster's CA (its key written too, to issue expired certificates),
/// its certificates, and another CA's operator certificate.
struct Pki {
    dir: tempfile::TempDir,
    certs: PathBuf,
    foreign: PathBuf,
    /// A second CA minted under the cluster CA's name (another key).
    twin: PathBuf,
}

impl Pki {
    fn mint() -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let certs = dir.path().join("certs");
        let ca = CertificateAuthority::generate("cluster CA", 1)?;
        // Member 1 is dialled as localhost: its certificate names nothing
        // else, so 127.0.0.1 is the wrong name for it.
        mint(
            &ca,
            &certs,
            &MintPlan {
                members: vec![1],
                operators: vec!["admin".into()],
                server_names: vec!["localhost".into()],
                ..MintPlan::default()
            },
        )?;
        ca.issue_into(
            &certs,
            &region_eu(),
            &["127.0.0.1".into(), "localhost".into()],
        )?;
        ca.write(&certs, true)?;
        let foreign = dir.path().join("foreign");
        let other = CertificateAuthority::generate("another CA", 1)?;
        other.write(&foreign, false)?;
        other.issue_into(&foreign, &operator(), &[])?;
        let twin = dir.path().join("twin");
        CertificateAuthority::generate("cluster CA", 1)?.write(&twin, false)?;
        let pki = Self {
            dir,
            certs,
            foreign,
            twin,
        };
        pki.issue_expired(&Principal::Member(2), "member-2-expired")?;
        pki.issue_expired(&operator(), "operator-expired")?;
        Ok(pki)
    }

    /// A certificate of the cluster's CA for `principal` (valid as a
    /// server for 127.0.0.1 and localhost) that expired yesterday, as
    /// `<stem>.pem` / `<stem>.key`.
    fn issue_expired(&self, principal: &Principal, stem: &str) -> Result<TlsFiles> {
        let ca_pem = std::fs::read_to_string(self.certs.join("ca.pem"))?;
        let ca_key = KeyPair::from_pem(&std::fs::read_to_string(self.certs.join("ca.key"))?)?;
        let issuer = Issuer::from_ca_cert_pem(&ca_pem, ca_key)?;
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        params.subject_alt_names = vec![
            SanType::URI(principal.to_uri().context("a principal")?.try_into()?),
            SanType::IpAddress("127.0.0.1".parse()?),
            SanType::DnsName("localhost".try_into()?),
        ];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.use_authority_key_identifier_extension = true;
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now - time::Duration::days(10);
        params.not_after = now - time::Duration::days(1);
        let cert = params.signed_by(&key, &issuer)?;
        let files = TlsFiles {
            ca: self.certs.join("ca.pem"),
            cert: self.certs.join(format!("{stem}.pem")),
            key: self.certs.join(format!("{stem}.key")),
        };
        std::fs::write(&files.cert, cert.pem())?;
        std::fs::write(&files.key, key.serialize_pem())?;
        Ok(files)
    }

    fn files(&self, principal: &Principal) -> TlsFiles {
        files_for(&self.certs, principal)
    }

    fn expired(&self, stem: &str) -> TlsFiles {
        TlsFiles {
            ca: self.certs.join("ca.pem"),
            cert: self.certs.join(format!("{stem}.pem")),
            key: self.certs.join(format!("{stem}.key")),
        }
    }
}

/// A lone (uninitialised) member serving mutual TLS with `files` on an
/// ephemeral port of 127.0.0.1.
async fn tls_member(pki: &Pki, id: u64, files: TlsFiles, data: &Path) -> Result<(u16, Running)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let mut config = fast_config(id, format!("127.0.0.1:{port}"), data.join(format!("m{id}")));
    config.tls_ca = Some(files.ca.clone());
    config.tls_cert = Some(files.cert.clone());
    config.tls_key = Some(files.key.clone());
    config.join_members = vec![id];
    let stores = open_stores(&config)?;
    let dialer = Security::MutualTls(pki.files(&Principal::Member(1))).dialer();
    let incoming = TlsIncoming::new(
        TcpIncoming::from(listener).with_nodelay(Some(true)),
        ReloadingServerConfig::load(files)?,
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
    Ok((port, (stop, task)))
}

async fn stop(running: Running) -> Result<()> {
    let _ = running.0.send(());
    running.1.await??;
    Ok(())
}

/// One run of the binary: exit code, stdout, stderr.
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

fn leasehold(args: &[String]) -> Result<Run> {
    let output = Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .env_remove("LEASEHOLD_INSECURE")
        .env_remove("LEASEHOLD_CA")
        .env_remove("LEASEHOLD_CERT")
        .env_remove("LEASEHOLD_KEY")
        .env_remove("LEASEHOLD_ENDPOINT")
        .env("RUST_LOG", "error")
        .args(args)
        .output()
        .context("run leasehold")?;
    Ok(Run {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8(output.stdout)?,
        stderr: String::from_utf8(output.stderr)?,
    })
}

/// `--ca/--cert/--cert-key` of `files` (the CA of `ca`).
fn tls_flags(ca: &Path, files: &TlsFiles) -> Vec<String> {
    vec![
        "--ca".into(),
        ca.display().to_string(),
        "--cert".into(),
        files.cert.display().to_string(),
        "--cert-key".into(),
        files.key.display().to_string(),
    ]
}

/// A failing case: the command, and what every run must print.
struct Case {
    name: &'static str,
    args: Vec<String>,
    code: &'static str,
    exit: i32,
    /// Words the message must contain.
    message: Vec<String>,
    /// Words the hint must contain.
    hint: Vec<&'static str>,
}

/// Runs `case` [`RUNS`] times with `--output json` and once as text; every
/// run must give the same code, exit code and message. Returns the text
/// run's first line.
fn check(case: &Case) -> Result<String> {
    let mut messages = Vec::new();
    for run in 0..RUNS {
        let mut args = case.args.clone();
        args.extend(["--output".into(), "json".into()]);
        let out = leasehold(&args)?;
        let json: serde_json::Value =
            serde_json::from_str(out.stdout.trim()).with_context(|| {
                format!(
                    "{}: run {run}: JSON error on stdout, got {:?} / {:?}",
                    case.name, out.stdout, out.stderr
                )
            })?;
        let error = &json["error"];
        let message = error["message"].as_str().unwrap_or_default().to_string();
        let hint = error["hint"].as_str().unwrap_or_default();
        ensure!(
            out.code == case.exit && error["code"] == case.code && error["exit_code"] == case.exit,
            "{}: run {run}: expected {} exit {}, got exit {}: {json}",
            case.name,
            case.code,
            case.exit,
            out.code
        );
        for word in &case.message {
            ensure!(
                message.contains(word.as_str()),
                "{}: run {run}: {word:?} missing from {message:?}",
                case.name
            );
        }
        for word in &case.hint {
            ensure!(
                hint.contains(word),
                "{}: run {run}: {word:?} missing from the hint {hint:?}",
                case.name
            );
        }
        messages.push(message);
    }
    ensure!(
        messages.iter().all(|m| *m == messages[0]),
        "{}: the message changed between runs: {messages:#?}",
        case.name
    );
    let text = leasehold(&case.args)?;
    let first = text.stderr.lines().next().unwrap_or_default().to_string();
    ensure!(
        text.code == case.exit
            && first == format!("error: {}", messages[0])
            && text.stderr.contains("\nhint: "),
        "{}: the text form differs: exit {}: {:?}",
        case.name,
        text.code,
        text.stderr
    );
    Ok(first)
}

fn args(command: &[&str], endpoint: &str, rest: Vec<String>) -> Vec<String> {
    let mut args: Vec<String> = command.iter().map(|a| a.to_string()).collect();
    args.extend([
        "-e".into(),
        endpoint.to_string(),
        "--timeout-ms".into(),
        "1500".into(),
    ]);
    args.extend(rest);
    args
}

fn check_all(cases: Vec<Case>) -> Result<()> {
    let mut failed = Vec::new();
    for case in &cases {
        match check(case) {
            Ok(first) => eprintln!("{}: {first}", case.name),
            Err(error) => failed.push(format!("{error:#}")),
        }
    }
    ensure!(failed.is_empty(), "{}", failed.join("\n"));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_problems_name_their_cause_the_same_way_every_time() -> Result<()> {
    let pki = Pki::mint()?;
    let data = pki.dir.path().join("data");
    let (port, member) = tls_member(&pki, 1, pki.files(&Principal::Member(1)), &data).await?;
    let (expired_port, expired_member) =
        tls_member(&pki, 2, pki.expired("member-2-expired"), &data).await?;
    let ca = pki.certs.join("ca.pem");
    let foreign_ca = pki.foreign.join("ca.pem");
    let twin_ca = pki.twin.join("ca.pem");
    let good = format!("localhost:{port}");
    let wrong_name = format!("127.0.0.1:{port}");
    let expired = format!("localhost:{expired_port}");
    let status = ["cluster", "status"];
    let operator_files = pki.files(&operator());
    let cases = vec![
        Case {
            name: "the server's certificate from a CA the client does not trust",
            args: args(&status, &good, tls_flags(&foreign_ca, &operator_files)),
            code: "server_certificate_untrusted",
            exit: 2,
            message: vec![
                format!("the certificate of the server at {good}"),
                "not signed by a CA in --ca".into(),
                foreign_ca.display().to_string(),
            ],
            hint: vec!["--ca"],
        },
        Case {
            name: "the server's certificate from another CA of the same name",
            args: args(&status, &good, tls_flags(&twin_ca, &operator_files)),
            code: "server_certificate_untrusted",
            exit: 2,
            message: vec![
                format!("the certificate of the server at {good}"),
                "not signed by a CA in --ca".into(),
                twin_ca.display().to_string(),
            ],
            hint: vec!["--ca"],
        },
        Case {
            name: "the client's certificate from a CA the server does not trust",
            args: args(
                &status,
                &good,
                tls_flags(&ca, &files_for(&pki.foreign, &operator())),
            ),
            code: "client_certificate_refused",
            exit: 2,
            message: vec![
                format!("the server at {good} refused this command's certificate"),
                "unknown_ca".into(),
            ],
            hint: vec!["cluster's CA"],
        },
        Case {
            name: "the client's certificate expired",
            args: args(
                &status,
                &good,
                tls_flags(&ca, &pki.expired("operator-expired")),
            ),
            code: "client_certificate_expired",
            exit: 2,
            message: vec![
                "operator-expired.pem is not valid now".into(),
                "until".into(),
            ],
            hint: vec!["renew"],
        },
        Case {
            name: "the server's certificate expired",
            args: args(&status, &expired, tls_flags(&ca, &operator_files)),
            code: "server_certificate_expired",
            exit: 2,
            message: vec![
                format!("the certificate of the server at {expired} expired"),
                "valid until".into(),
            ],
            hint: vec!["renew the member's certificate"],
        },
        Case {
            name: "the server's certificate does not name the host dialled",
            args: args(&status, &wrong_name, tls_flags(&ca, &operator_files)),
            code: "server_certificate_wrong_name",
            exit: 2,
            message: vec![
                "is not valid for the name 127.0.0.1".into(),
                "it names localhost".into(),
            ],
            hint: vec!["--ip"],
        },
        Case {
            name: "a plaintext client against a TLS member",
            args: args(&status, &good, vec!["--insecure".into()]),
            code: "server_speaks_tls",
            exit: 2,
            message: vec![
                format!("the server at {good} speaks TLS"),
                "plaintext (--insecure)".into(),
            ],
            hint: vec!["drop --insecure", "--ca"],
        },
    ];
    let control = args(&status, &good, tls_flags(&ca, &operator_files));
    let (checked, control) = tokio::task::spawn_blocking(move || {
        let checked = check_all(cases);
        (checked, leasehold(&control))
    })
    .await?;
    let control = control?;
    ensure!(
        control.code == 0,
        "the member's own CA and an operator certificate work: {} {}",
        control.stdout,
        control.stderr
    );
    stop(member).await?;
    stop(expired_member).await?;
    checked
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_client_against_a_plaintext_member_says_so_every_time() -> Result<()> {
    let pki = Pki::mint()?;
    let mut cluster = Cluster::start_initialised(1, |_| {}).await?;
    let endpoint = cluster.addr(1);
    let ca = pki.certs.join("ca.pem");
    let case = Case {
        name: "a TLS client against a plaintext member",
        args: args(
            &["cluster", "status"],
            &endpoint,
            tls_flags(&ca, &pki.files(&operator())),
        ),
        code: "server_speaks_plaintext",
        exit: 2,
        message: vec![
            format!("the server at {endpoint} speaks plaintext"),
            "connected with TLS".into(),
        ],
        hint: vec!["--insecure"],
    };
    let checked = tokio::task::spawn_blocking(move || check_all(vec![case])).await?;
    cluster.stop_all().await?;
    checked
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coordinator_command_at_an_escrow_node_says_it_is_one_every_time() -> Result<()> {
    let pki = Pki::mint()?;
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?.to_string();
    let files = pki.files(&region_eu());
    let config = leasehold_node::escrow::EscrowConfig::new(
        RegionId::new("eu")?,
        addr.clone(),
        // No member needs to answer: the call never gets that far.
        vec!["127.0.0.1:1".into()],
    );
    let incoming = TlsIncoming::new(
        TcpIncoming::from(listener),
        ReloadingServerConfig::load(files.clone())?,
        Duration::from_secs(5),
    );
    let (stop_escrow, stopped) = oneshot::channel::<()>();
    let escrow = tokio::spawn(leasehold_node::escrow::run_escrow(
        config,
        incoming,
        Security::MutualTls(files.clone()).dialer(),
        Arc::new(SystemClock),
        async move {
            let _ = stopped.await;
        },
    ));
    let ca = pki.certs.join("ca.pem");
    let case = Case {
        name: "lease at an escrow node's port with the region's certificate",
        args: args(
            &["lease", "--key", "k", "--region", "eu", "--tokens", "1"],
            &addr,
            tls_flags(&ca, &files),
        ),
        code: "wrong_service",
        exit: 2,
        message: vec![
            format!("the server at {addr} is an escrow node"),
            "not a coordinator member".into(),
        ],
        hint: vec!["coordinator member", "escrow node"],
    };
    let checked = tokio::task::spawn_blocking(move || check_all(vec![case])).await?;
    let _ = stop_escrow.send(());
    escrow.await??;
    checked
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coordinator_command_at_a_metrics_port_names_it_before_its_timeout() -> Result<()> {
    let pki = Pki::mint()?;
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?.to_string();
    let (stop_metrics, stopped) = tokio::sync::watch::channel(false);
    let exposed = leasehold_node::metrics_http::Exposed {
        render: Arc::new(String::new),
        readiness: Arc::new(|| Ok(())),
    };
    let metrics = tokio::spawn(leasehold_node::metrics_http::serve_metrics(
        listener, exposed, stopped,
    ));
    // A call budget far beyond what a named cause needs: the probe must
    // name the listener instead of the call's retries running it out.
    let patient = |rest: Vec<String>| {
        let mut args = args(&["cluster", "status"], &addr, rest);
        let budget = args.iter().position(|a| a == "1500").expect("the budget");
        args[budget] = "60000".into();
        args
    };
    let expect = |name, rest| Case {
        name,
        args: patient(rest),
        code: "http1_listener",
        exit: 2,
        message: vec![
            format!("the server at {addr} answers HTTP/1"),
            "HTTP/1.1 400 Bad Request".into(),
            "not gRPC".into(),
        ],
        hint: vec!["leasehold serve --listen", "--metrics-listen"],
    };
    let cases = vec![
        expect("plaintext at a metrics port", vec!["--insecure".into()]),
        expect(
            "mutual TLS at a metrics port",
            tls_flags(&pki.certs.join("ca.pem"), &pki.files(&operator())),
        ),
    ];
    let started = std::time::Instant::now();
    let checked = tokio::task::spawn_blocking(move || check_all(cases)).await?;
    let elapsed = started.elapsed();
    let _ = stop_metrics.send(true);
    metrics.await?;
    checked?;
    // 8 runs of the binary; a single one waiting out its budget takes 60 s.
    ensure!(
        elapsed < Duration::from_secs(55),
        "the runs took {elapsed:?}: a call waited for its timeout"
    );
    Ok(())
}
