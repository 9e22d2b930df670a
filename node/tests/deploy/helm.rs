//! `deploy/helm/leasehold`: the chart lints and renders with its defaults
//! and with every optional part on (cert-manager, ServiceMonitors, RLS
//! autoscaling); what it renders agrees with itself (HPAs scale existing
//! Deployments from two nodes up, PodDisruptionBudgets and Services select
//! pods it makes, ServiceMonitors find a metrics port, certificates volumes
//! name what cert-manager writes), and it refuses values that cannot work.
//! `k8s_run.rs` runs the rendered chart's workloads as processes.
//!
//! Helm comes from `LEASEHOLD_HELM`, else `target/tools/bin/helm` (put there
//! by `deploy/helm/fetch-helm.sh`, as .ci/run does), else the PATH.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, ensure, Context, Result};
use yaml_rust2::{Yaml, YamlLoader};

use crate::deploy_dir;
use crate::yaml::{list, strings};

/// The chart's directory.
pub fn chart() -> String {
    deploy_dir()
        .join("helm")
        .join("leasehold")
        .to_string_lossy()
        .into_owned()
}

fn helm_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("LEASEHOLD_HELM") {
        return PathBuf::from(path);
    }
    let fetched = deploy_dir().join("../target/tools/bin/helm");
    if fetched.exists() {
        return fetched;
    }
    PathBuf::from("helm")
}

/// Runs helm with `args`; its stdout, or an error with its stderr.
pub fn helm(args: &[&str]) -> Result<String> {
    let binary = helm_binary();
    let output = Command::new(&binary).args(args).output().with_context(|| {
        format!(
            "running {} (none here: `bash deploy/helm/fetch-helm.sh` puts one at \
             target/tools/bin/helm, or set LEASEHOLD_HELM)",
            binary.display()
        )
    })?;
    if !output.status.success() {
        bail!(
            "helm {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(String::from_utf8(output.stdout)?)
}

fn render(sets: &[&str]) -> Result<Vec<Yaml>> {
    let chart = chart();
    let mut args = vec!["template", "leasehold", chart.as_str()];
    for set in sets {
        args.extend(["--set", set]);
    }
    let text = helm(&args)?;
    Ok(YamlLoader::load_from_str(&text)?
        .into_iter()
        .filter(|d| !d.is_null())
        .collect())
}

fn of_kind<'a>(docs: &'a [Yaml], kind: &'a str) -> impl Iterator<Item = &'a Yaml> + 'a {
    docs.iter()
        .filter(move |d| d["kind"].as_str() == Some(kind))
}

fn name(doc: &Yaml) -> &str {
    doc["metadata"]["name"].as_str().unwrap_or_default()
}

/// Whether `selector` (a label map) matches the labels `labels`.
fn matches(selector: &Yaml, labels: &Yaml) -> bool {
    let Yaml::Hash(wanted) = selector else {
        return false;
    };
    !wanted.is_empty()
        && wanted
            .iter()
            .all(|(k, v)| labels[k.as_str().unwrap_or("")] == *v)
}

fn pod_labels(docs: &[Yaml]) -> Vec<&Yaml> {
    docs.iter()
        .map(|d| match d["kind"].as_str() {
            Some("CronJob") => &d["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["labels"],
            _ => &d["spec"]["template"]["metadata"]["labels"],
        })
        .filter(|labels| !labels.is_badvalue() && !labels.is_null())
        .collect()
}

const EVERYTHING_ON: [&str; 5] = [
    "tls.source=cert-manager",
    "serviceMonitor.enabled=true",
    "escrow.autoscaling.targetRLSRequestsPerSecond=400",
    "escrow.regions[0].name=eu",
    "escrow.regions[1].name=us",
];

#[test]
fn the_chart_lints_with_its_defaults_and_everything_on() -> Result<()> {
    let chart = chart();
    helm(&["lint", "--strict", &chart])?;
    let mut args = vec!["lint", "--strict", chart.as_str()];
    for set in EVERYTHING_ON {
        args.extend(["--set", set]);
    }
    helm(&args)?;
    Ok(())
}

#[test]
fn what_the_chart_renders_agrees_with_itself() -> Result<()> {
    for sets in [&[][..], &EVERYTHING_ON[..]] {
        let docs = render(sets)?;
        let pods = pod_labels(&docs);
        // Every HPA scales a Deployment it renders, from two nodes up, and
        // that Deployment leaves its replica count to the HPA.
        let hpas: Vec<&Yaml> = of_kind(&docs, "HorizontalPodAutoscaler").collect();
        ensure!(!hpas.is_empty(), "{sets:?}: no HPA");
        for hpa in &hpas {
            let target = &hpa["spec"]["scaleTargetRef"];
            let deployment = of_kind(&docs, "Deployment")
                .find(|d| name(d) == target["name"].as_str().unwrap_or_default())
                .with_context(|| format!("{sets:?}: HPA {} scales nothing", name(hpa)))?;
            ensure!(
                hpa["spec"]["minReplicas"].as_i64().unwrap_or(0) >= 2,
                "{sets:?}: HPA {} may scale to one node",
                name(hpa)
            );
            ensure!(
                deployment["spec"]["replicas"].is_badvalue(),
                "{sets:?}: {} sets replicas under an HPA",
                name(deployment)
            );
        }
        let rls_metric = hpas.iter().any(|h| {
            list(&h["spec"]["metrics"])
                .iter()
                .any(|m| m["type"].as_str() == Some("Pods"))
        });
        ensure!(
            rls_metric != sets.is_empty(),
            "{sets:?}: RLS metric {rls_metric}"
        );
        // Budgets and Services select pods the chart makes.
        for doc in of_kind(&docs, "PodDisruptionBudget") {
            let selector = &doc["spec"]["selector"]["matchLabels"];
            ensure!(
                pods.iter().any(|labels| matches(selector, labels)),
                "{sets:?}: PDB {} selects no pod",
                name(doc)
            );
        }
        for doc in of_kind(&docs, "Service") {
            ensure!(
                pods.iter()
                    .any(|labels| matches(&doc["spec"]["selector"], labels)),
                "{sets:?}: Service {} selects no pod",
                name(doc)
            );
        }
        // A region's escrow nodes per region: a Deployment, PDB and HPA each.
        let regions = if sets.is_empty() { 1 } else { 2 };
        for kind in [
            "Deployment",
            "PodDisruptionBudget",
            "HorizontalPodAutoscaler",
        ] {
            let escrow = of_kind(&docs, kind)
                .filter(|d| name(d).starts_with("leasehold-escrow-"))
                .count();
            ensure!(escrow == regions, "{sets:?}: {escrow} escrow {kind}s");
        }
        // ServiceMonitors select Services with a metrics port.
        let monitors: Vec<&Yaml> = of_kind(&docs, "ServiceMonitor").collect();
        ensure!(monitors.len() == if sets.is_empty() { 0 } else { 2 });
        for monitor in monitors {
            let selector = &monitor["spec"]["selector"]["matchLabels"];
            let scraped = of_kind(&docs, "Service")
                .filter(|s| matches(selector, &s["metadata"]["labels"]))
                .filter(|s| {
                    list(&s["spec"]["ports"])
                        .iter()
                        .any(|p| p["name"].as_str() == Some("metrics"))
                })
                .count();
            ensure!(scraped > 0, "{sets:?}: {} scrapes nothing", name(monitor));
        }
        // With cert-manager, every projected Secret is one a Certificate
        // writes; with Secrets, none is projected.
        let written: Vec<&str> = of_kind(&docs, "Certificate")
            .filter_map(|c| c["spec"]["secretName"].as_str())
            .collect();
        for doc in &docs {
            let spec = match doc["kind"].as_str() {
                Some("CronJob") => &doc["spec"]["jobTemplate"]["spec"]["template"]["spec"],
                _ => &doc["spec"]["template"]["spec"],
            };
            for volume in list(&spec["volumes"]) {
                for source in list(&volume["projected"]["sources"]) {
                    let secret = source["secret"]["name"].as_str().unwrap_or_default();
                    ensure!(
                        written.contains(&secret),
                        "{sets:?}: {} projects {secret}, which no Certificate writes",
                        name(doc)
                    );
                }
            }
        }
        ensure!(
            written.is_empty() == sets.is_empty(),
            "{sets:?}: certificates {written:?}"
        );
        // Every pod runs as the image's unprivileged user, without a token.
        for doc in &docs {
            let spec = match doc["kind"].as_str() {
                Some("CronJob") => &doc["spec"]["jobTemplate"]["spec"]["template"]["spec"],
                Some("StatefulSet" | "Deployment" | "Job") => &doc["spec"]["template"]["spec"],
                _ => continue,
            };
            ensure!(
                spec["securityContext"]["runAsUser"].as_i64() == Some(65532)
                    && spec["automountServiceAccountToken"].as_bool() == Some(false),
                "{sets:?}: {} runs privileged or with a token",
                name(doc)
            );
        }
    }
    Ok(())
}

#[test]
fn five_members_join_and_are_initialised_as_five() -> Result<()> {
    let docs = render(&["members.replicas=5"])?;
    let statefulset = of_kind(&docs, "StatefulSet")
        .next()
        .context("StatefulSet")?;
    let args = strings(&list(&statefulset["spec"]["template"]["spec"]["containers"])[0]["args"]);
    let join = args
        .iter()
        .position(|a| a == "--join-members")
        .context("--join-members")?;
    ensure!(args[join + 1] == "1,2,3,4,5", "{args:?}");
    let job = of_kind(&docs, "Job").next().context("init Job")?;
    let args = strings(&list(&job["spec"]["template"]["spec"]["containers"])[0]["args"]);
    let members: Vec<&String> = args
        .iter()
        .zip(args.iter().skip(1))
        .filter(|(flag, _)| *flag == "--member")
        .map(|(_, member)| member)
        .collect();
    ensure!(
        members.len() == 5 && members[4] == "5=leasehold-4.leasehold:7100",
        "{members:?}"
    );
    Ok(())
}

#[test]
fn values_that_cannot_work_are_refused_with_their_reason() -> Result<()> {
    for (set, reason) in [
        ("escrow.replicas=1", "single point of failure"),
        ("tls.source=none", "tls.source must be"),
    ] {
        let error = render(&[set]).err().context(set)?;
        ensure!(format!("{error:#}").contains(reason), "{set}: {error:#}");
    }
    Ok(())
}
