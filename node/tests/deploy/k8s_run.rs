//! `deploy/k8s/base` run as written, without Kubernetes: the Secrets of
//! `deploy/k8s/mint-secrets.sh` decoded into the directories the workloads
//! mount them at, and the StatefulSet's, escrow Deployment's and init Job's
//! arguments started as processes of the `leasehold` binary — only the
//! listen addresses, the members' DNS names and the mount paths mapped to
//! loopback and temporary directories. Every probe must answer 200, a
//! plaintext caller must be refused, and a service of eu must lease through
//! the escrow node.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use leasehold_client::coordinator::CoordinatorClient;
use leasehold_client::transport::TcpDialer;
use leasehold_core::policy::Policy;
use leasehold_node::tls::{Security, TlsFiles};
use leasehold_proto::v1 as pb;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use yaml_rust2::Yaml;

use crate::deploy_dir;
use crate::yaml::{list, load_documents, string, strings};

/// Processes killed when the test ends, however it ends.
#[derive(Default)]
struct Processes(Vec<(String, Child)>);

impl Drop for Processes {
    fn drop(&mut self) {
        for (_, child) in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Processes {
    /// Fails naming any process that exited already.
    fn ensure_running(&mut self) -> Result<()> {
        for (name, child) in &mut self.0 {
            if let Some(status) = child.try_wait()? {
                bail!("{name} exited: {status}");
            }
        }
        Ok(())
    }
}

fn free_port() -> Result<u16> {
    Ok(leasehold_node::loopback_ports::reserve()?)
}

fn base_documents() -> Result<Vec<Yaml>> {
    let dir = deploy_dir().join("k8s").join("base");
    let mut docs = Vec::new();
    for file in ["coordinator.yaml", "escrow.yaml"] {
        docs.extend(
            load_documents(&dir.join(file))?
                .into_iter()
                .filter(|d| !d.is_null()),
        );
    }
    Ok(docs)
}

fn workload<'a>(docs: &'a [Yaml], kind: &str) -> Result<&'a Yaml> {
    docs.iter()
        .find(|d| d["kind"].as_str() == Some(kind))
        .with_context(|| format!("no {kind} in deploy/k8s/base"))
}

/// The Secrets of a `secrets.yaml`: name → file name → bytes.
fn decode_secrets(path: &Path) -> Result<BTreeMap<String, BTreeMap<String, Vec<u8>>>> {
    let mut secrets = BTreeMap::new();
    for doc in load_documents(path)? {
        if doc["kind"].as_str() != Some("Secret") {
            continue;
        }
        let name = string(&doc["metadata"]["name"], "Secret name")?.to_string();
        let mut files = BTreeMap::new();
        let Yaml::Hash(data) = &doc["data"] else {
            bail!("Secret {name} has no data");
        };
        for (file, encoded) in data {
            let file = file.as_str().context("file name")?.to_string();
            let encoded = encoded.as_str().context("base64 data")?;
            files.insert(file, base64_decode(encoded)?);
        }
        secrets.insert(name, files);
    }
    Ok(secrets)
}

/// Decodes with coreutils' `base64 -d` (no decoder crate for one test).
fn base64_decode(encoded: &str) -> Result<Vec<u8>> {
    use std::io::Write;
    let mut child = Command::new("base64")
        .arg("-d")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("base64")?;
    child
        .stdin
        .take()
        .context("stdin")?
        .write_all(encoded.as_bytes())?;
    let output = child.wait_with_output()?;
    ensure!(output.status.success(), "base64 -d failed");
    Ok(output.stdout)
}

/// Writes the Secret a pod template's `certs` volume names into
/// `dir/<secret>` and returns (mount path, that directory).
fn mount_certs(
    template: &Yaml,
    secrets: &BTreeMap<String, BTreeMap<String, Vec<u8>>>,
    dir: &Path,
) -> Result<(String, PathBuf)> {
    let volume = list(&template["spec"]["volumes"])
        .iter()
        .find(|v| v["name"].as_str() == Some("certs"))
        .context("no certs volume")?;
    let secret = string(&volume["secret"]["secretName"], "certs secretName")?;
    let files = secrets
        .get(secret)
        .with_context(|| format!("mint-secrets.sh wrote no Secret {secret}"))?;
    let target = dir.join(secret);
    std::fs::create_dir_all(&target)?;
    for (name, bytes) in files {
        std::fs::write(target.join(name), bytes)?;
    }
    let container = &list(&template["spec"]["containers"])[0];
    let mount = list(&container["volumeMounts"])
        .iter()
        .find(|m| m["name"].as_str() == Some("certs"))
        .context("no certs mount")?;
    Ok((
        string(&mount["mountPath"], "mountPath")?.to_string(),
        target,
    ))
}

/// `args` with every `from` replaced by `to`, for each pair in order.
fn mapped(args: &[String], replacements: &[(String, String)]) -> Vec<String> {
    args.iter()
        .map(|arg| {
            replacements
                .iter()
                .fold(arg.clone(), |arg, (from, to)| arg.replace(from, to))
        })
        .collect()
}

fn spawn(
    processes: &mut Processes,
    name: &str,
    args: &[String],
    env: &[(&str, String)],
    log: &Path,
) -> Result<()> {
    let log = std::fs::File::create(log)?;
    let child = Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(args)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .env("RUST_LOG", "warn")
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .with_context(|| format!("start {name}"))?;
    processes.0.push((name.to_string(), child));
    Ok(())
}

/// GET `path` on `addr` over plain HTTP: (status line, body).
async fn http_get(addr: &str, path: &str) -> Result<(String, String)> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream
        .write_all(format!("GET {path} HTTP/1.1\r\nHost: probe\r\n\r\n").as_bytes())
        .await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    let (head, body) = response.split_once("\r\n\r\n").context("response head")?;
    Ok((
        head.lines().next().unwrap_or_default().to_string(),
        body.to_string(),
    ))
}

/// Waits until GET `path` on `addr` answers 200 (`what` names it).
async fn until_ok(addr: &str, path: &str, what: &str, processes: &mut Processes) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        processes.ensure_running()?;
        let last = http_get(addr, path).await;
        if matches!(&last, Ok((status, _)) if status.contains(" 200 ")) {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "{what}: {path} never answered 200: {last:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The probe paths of a container, checked to be on its `metrics` port.
fn probe_paths(container: &Yaml) -> Result<Vec<String>> {
    let mut paths = Vec::new();
    for probe in ["readinessProbe", "livenessProbe"] {
        let get = &container[probe]["httpGet"];
        ensure!(
            get["port"].as_str() == Some("metrics"),
            "{probe} is not on the metrics port"
        );
        paths.push(string(&get["path"], "probe path")?.to_string());
    }
    Ok(paths)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_base_runs_with_mutual_tls_as_written() -> Result<()> {
    run_as_written(base_documents()?).await
}

/// The Helm chart rendered with its defaults as the release `leasehold`
/// (the names of the base and of mint-secrets.sh's Secrets), run the same
/// way, its backup CronJob included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_runs_with_mutual_tls_as_rendered() -> Result<()> {
    let rendered = crate::helm::helm(&["template", "leasehold", &crate::helm::chart()])?;
    let docs: Vec<Yaml> = yaml_rust2::YamlLoader::load_from_str(&rendered)?
        .into_iter()
        .filter(|d| !d.is_null())
        .collect();
    ensure!(
        docs.iter().any(|d| d["kind"].as_str() == Some("CronJob")),
        "the chart renders no backup CronJob"
    );
    run_as_written(docs).await
}

/// Runs `docs`' workloads as processes (see the module documentation).
async fn run_as_written(docs: Vec<Yaml>) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mint = dir.path().join("mint");
    let status = Command::new("bash")
        .arg(deploy_dir().join("k8s").join("mint-secrets.sh"))
        .args(["--out", &mint.to_string_lossy()])
        .args(["--binary", env!("CARGO_BIN_EXE_leasehold")])
        .args(["--ip", "127.0.0.1"])
        .stdout(Stdio::null())
        .status()?;
    ensure!(status.success(), "mint-secrets.sh failed: {status}");
    let secrets = decode_secrets(&mint.join("secrets.yaml"))?;
    let statefulset = workload(&docs, "StatefulSet")?;
    let escrow = workload(&docs, "Deployment")?;
    let job = workload(&docs, "Job")?;
    let replicas = statefulset["spec"]["replicas"]
        .as_i64()
        .context("replicas")?;

    let mut processes = Processes::default();
    let mut member_ports = Vec::new();
    let mut replacements = Vec::new();
    for ordinal in 0..replicas {
        let (grpc, metrics) = (free_port()?, free_port()?);
        member_ports.push((grpc, metrics));
        replacements.push((
            format!("leasehold-{ordinal}.leasehold:7100"),
            format!("127.0.0.1:{grpc}"),
        ));
    }

    // The members: the StatefulSet's arguments, one process per pod.
    let template = &statefulset["spec"]["template"];
    let container = &list(&template["spec"]["containers"])[0];
    let (mount, certs) = mount_certs(template, &secrets, dir.path())?;
    let member_args = strings(&container["args"]);
    ensure!(!member_args.iter().any(|a| a == "--insecure"));
    for (ordinal, (grpc, metrics)) in member_ports.iter().enumerate() {
        let data = dir.path().join(format!("data-{ordinal}"));
        let mut own = vec![
            ("0.0.0.0:7100".to_string(), format!("127.0.0.1:{grpc}")),
            ("0.0.0.0:7101".to_string(), format!("127.0.0.1:{metrics}")),
            ("/data".to_string(), data.to_string_lossy().into_owned()),
            (format!("{mount}/"), format!("{}/", certs.to_string_lossy())),
        ];
        own.extend(replacements.iter().cloned());
        spawn(
            &mut processes,
            &format!("leasehold-{ordinal}"),
            &mapped(&member_args, &own),
            &[("HOSTNAME", format!("leasehold-{ordinal}"))],
            &dir.path().join(format!("member-{ordinal}.log")),
        )?;
    }

    // The init Job, as operator admin.
    let job_template = &job["spec"]["template"];
    let (job_mount, job_certs) = mount_certs(job_template, &secrets, dir.path())?;
    let mut job_map = replacements.clone();
    job_map.push((
        format!("{job_mount}/"),
        format!("{}/", job_certs.to_string_lossy()),
    ));
    let job_args = mapped(
        &strings(&list(&job_template["spec"]["containers"])[0]["args"]),
        &job_map,
    );
    let init = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_leasehold"))
            .args(&job_args)
            .output()
    })
    .await??;
    ensure!(
        init.status.success(),
        "the init Job failed: {}",
        String::from_utf8_lossy(&init.stderr)
    );

    // The escrow node of eu.
    let escrow_template = &escrow["spec"]["template"];
    let escrow_container = &list(&escrow_template["spec"]["containers"])[0];
    let (escrow_mount, escrow_certs) = mount_certs(escrow_template, &secrets, dir.path())?;
    let (escrow_grpc, escrow_metrics) = (free_port()?, free_port()?);
    let mut escrow_map = vec![
        (
            "0.0.0.0:7200".to_string(),
            format!("127.0.0.1:{escrow_grpc}"),
        ),
        (
            "0.0.0.0:7201".to_string(),
            format!("127.0.0.1:{escrow_metrics}"),
        ),
        (
            format!("{escrow_mount}/"),
            format!("{}/", escrow_certs.to_string_lossy()),
        ),
    ];
    escrow_map.extend(replacements.iter().cloned());
    let escrow_args = strings(&escrow_container["args"]);
    ensure!(!escrow_args.iter().any(|a| a == "--insecure"));
    spawn(
        &mut processes,
        "escrow-eu",
        &mapped(&escrow_args, &escrow_map),
        &[],
        &dir.path().join("escrow.log"),
    )?;

    // Every probe answers 200, with no certificate.
    for (ordinal, (_, metrics)) in member_ports.iter().enumerate() {
        for path in probe_paths(container)? {
            until_ok(
                &format!("127.0.0.1:{metrics}"),
                &path,
                &format!("member pod {ordinal}"),
                &mut processes,
            )
            .await?;
        }
    }
    for path in probe_paths(escrow_container)? {
        until_ok(
            &format!("127.0.0.1:{escrow_metrics}"),
            &path,
            "escrow-eu",
            &mut processes,
        )
        .await?;
    }

    // The gRPC ports refuse a caller without a certificate.
    let member_addrs: Vec<String> = member_ports
        .iter()
        .map(|(grpc, _)| format!("127.0.0.1:{grpc}"))
        .collect();
    let plaintext =
        CoordinatorClient::with_options(member_addrs.clone(), Arc::new(TcpDialer::default()), {
            leasehold_client::coordinator::RetryOptions {
                total_timeout: Duration::from_secs(2),
                max_attempts: 2,
                ..Default::default()
            }
        })?;
    ensure!(
        plaintext.admin().status().await.is_err(),
        "a member answered a plaintext caller"
    );

    // An operator sets a policy; a service of eu leases through the node.
    let operator = Security::MutualTls(TlsFiles {
        ca: job_certs.join("ca.pem"),
        cert: job_certs.join("operator-admin.pem"),
        key: job_certs.join("operator-admin.key"),
    });
    CoordinatorClient::new(member_addrs, operator.dialer())?
        .admin()
        .set_policy(Policy::counter("k8s/", 1_000, 3_600_000))
        .await?;
    let services = dir.path().join("services");
    let minted = Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(["certs", "mint", "--out", &services.to_string_lossy()])
        .args(["--ca-cert", &mint.join("certs/ca.pem").to_string_lossy()])
        .args(["--ca-key", &mint.join("certs/ca.key").to_string_lossy()])
        .args(["--services", "app@eu"])
        .output()?;
    ensure!(
        minted.status.success(),
        "{}",
        String::from_utf8_lossy(&minted.stderr)
    );
    let service = Security::MutualTls(TlsFiles {
        ca: services.join("ca.pem"),
        cert: services.join("service-app-eu.pem"),
        key: services.join("service-app-eu.key"),
    });
    let escrow_addr = format!("127.0.0.1:{escrow_grpc}");
    let channel = service.dialer().dial(&escrow_addr).await?;
    let granted = pb::escrow_client::EscrowClient::new(channel)
        .acquire(pb::AcquireRequest {
            key: "k8s/checkout".into(),
            tenant: String::new(),
            weight: 0,
            tokens: 3,
            request_id: None,
        })
        .await?
        .into_inner()
        .granted;
    ensure!(granted == 3, "the escrow node granted {granted} of 3");

    // The backup CronJob, where there is one: twice, its volume mapped.
    if let Some(cron) = docs.iter().find(|d| d["kind"].as_str() == Some("CronJob")) {
        let template = &cron["spec"]["jobTemplate"]["spec"]["template"];
        let container = &list(&template["spec"]["containers"])[0];
        let (mount, certs) = mount_certs(template, &secrets, dir.path())?;
        let backups = dir.path().join("backups");
        std::fs::create_dir_all(&backups)?;
        let mut map = replacements.clone();
        map.push((format!("{mount}/"), format!("{}/", certs.to_string_lossy())));
        map.push(("/backups".into(), backups.to_string_lossy().into_owned()));
        let args = mapped(&strings(&container["args"]), &map);
        for _ in 0..2 {
            let args = args.clone();
            let run = tokio::task::spawn_blocking(move || {
                Command::new(env!("CARGO_BIN_EXE_leasehold"))
                    .args(&args)
                    .output()
            })
            .await??;
            ensure!(
                run.status.success(),
                "the backup CronJob failed: {}",
                String::from_utf8_lossy(&run.stderr)
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let written: Vec<PathBuf> = std::fs::read_dir(&backups)?
            .map(|e| e.map(|e| e.path()))
            .collect::<Result<_, _>>()?;
        ensure!(written.len() == 2, "backups written: {written:?}");
        for backup in &written {
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt;
                let mode = std::fs::metadata(backup)?.permissions().mode() & 0o777;
                ensure!(mode == 0o600, "{} has mode {mode:o}", backup.display());
            }
            let inspect = Command::new(env!("CARGO_BIN_EXE_leasehold"))
                .args(["snapshot", "inspect"])
                .arg(backup)
                .output()?;
            ensure!(
                inspect.status.success(),
                "{}: {}",
                backup.display(),
                String::from_utf8_lossy(&inspect.stderr)
            );
        }
    }
    processes.ensure_running()
}
