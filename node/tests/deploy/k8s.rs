//! `deploy/k8s`: the manifests parse and agree with each other, the base
//! runs mutual TLS with certificates from Secrets and probes that need
//! none, and the overlays patch only what the base defines.

use anyhow::{anyhow, bail, ensure, Context, Result};
use yaml_rust2::Yaml;

use crate::deploy_dir;
use crate::yaml::{
    flag_value, list, load_documents, port_of, selects, string, string_map, strings,
};

/// Every document of every file the kustomization lists.
fn manifests() -> Result<Vec<Yaml>> {
    let top = load_documents(&deploy_dir().join("k8s").join("kustomization.yaml"))?;
    ensure!(
        strings(&top[0]["resources"]) == ["base"],
        "deploy/k8s applies the base"
    );
    let dir = deploy_dir().join("k8s").join("base");
    let kustomization = load_documents(&dir.join("kustomization.yaml"))?;
    let resources = strings(&kustomization[0]["resources"]);
    ensure!(
        !resources.is_empty(),
        "the kustomization lists no resources"
    );
    for entry in std::fs::read_dir(&dir)? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if name.ends_with(".yaml") && name != "kustomization.yaml" {
            ensure!(
                resources.contains(&name),
                "{name} is not listed in kustomization.yaml"
            );
        }
    }
    let mut docs = Vec::new();
    for resource in resources {
        docs.extend(
            load_documents(&dir.join(&resource))?
                .into_iter()
                .filter(|doc| !doc.is_null()),
        );
    }
    Ok(docs)
}

fn kind(doc: &Yaml) -> &str {
    doc["kind"].as_str().unwrap_or("")
}

fn name(doc: &Yaml) -> &str {
    doc["metadata"]["name"].as_str().unwrap_or("")
}

fn of_kind<'a>(docs: &'a [Yaml], wanted: &'a str) -> impl Iterator<Item = &'a Yaml> + 'a {
    docs.iter().filter(move |doc| kind(doc) == wanted)
}

/// A workload's pod template (a CronJob's is in its job template).
fn template_of(doc: &Yaml) -> &Yaml {
    if kind(doc) == "CronJob" {
        &doc["spec"]["jobTemplate"]["spec"]["template"]
    } else {
        &doc["spec"]["template"]
    }
}

/// Workloads with a pod template: (workload, template).
fn pod_templates(docs: &[Yaml]) -> Vec<(&Yaml, &Yaml)> {
    docs.iter()
        .filter(|doc| matches!(kind(doc), "StatefulSet" | "Deployment" | "Job" | "CronJob"))
        .map(|doc| (doc, template_of(doc)))
        .collect()
}

/// Long-running workloads (probes, metrics).
fn servers(docs: &[Yaml]) -> Vec<(&Yaml, &Yaml)> {
    pod_templates(docs)
        .into_iter()
        .filter(|(doc, _)| !matches!(kind(doc), "Job" | "CronJob"))
        .collect()
}

fn labels(template: &Yaml) -> Vec<(String, String)> {
    string_map(&template["metadata"]["labels"])
}

fn containers(template: &Yaml) -> &[Yaml] {
    list(&template["spec"]["containers"])
}

/// (name, containerPort) of every port of every container of a template.
fn container_ports(template: &Yaml) -> Vec<(String, i64)> {
    containers(template)
        .iter()
        .flat_map(|c| list(&c["ports"]))
        .filter_map(|p| {
            Some((
                p["name"].as_str().unwrap_or("").to_string(),
                p["containerPort"].as_i64()?,
            ))
        })
        .collect()
}

#[test]
fn every_manifest_parses_names_itself_and_is_listed() -> Result<()> {
    let docs = manifests()?;
    ensure!(
        docs.len() >= 7,
        "expected every object, found {}",
        docs.len()
    );
    let mut seen = std::collections::HashSet::new();
    for doc in &docs {
        string(&doc["apiVersion"], "apiVersion")?;
        ensure!(!kind(doc).is_empty(), "an object without kind: {doc:?}");
        ensure!(!name(doc).is_empty(), "a {} without a name", kind(doc));
        ensure!(
            seen.insert((kind(doc).to_string(), name(doc).to_string())),
            "two {} named {}",
            kind(doc),
            name(doc)
        );
    }
    Ok(())
}

#[test]
fn services_select_pods_and_name_their_ports() -> Result<()> {
    let docs = manifests()?;
    let templates = pod_templates(&docs);
    for service in of_kind(&docs, "Service") {
        let selector = string_map(&service["spec"]["selector"]);
        let selected: Vec<_> = templates
            .iter()
            .filter(|(_, t)| selects(&selector, &labels(t)))
            .collect();
        ensure!(
            !selected.is_empty(),
            "Service {} selects no pod",
            name(service)
        );
        for port in list(&service["spec"]["ports"]) {
            for (workload, template) in &selected {
                let ports = container_ports(template);
                let found = match &port["targetPort"] {
                    Yaml::String(target) => ports.iter().any(|(n, _)| n == target),
                    Yaml::Integer(target) => ports.iter().any(|(_, p)| p == target),
                    Yaml::BadValue => ports.iter().any(|(_, p)| Some(*p) == port["port"].as_i64()),
                    other => bail!("Service {}: odd targetPort {other:?}", name(service)),
                };
                ensure!(
                    found,
                    "Service {} targets port {:?}, which {} {} does not declare",
                    name(service),
                    port["targetPort"],
                    kind(workload),
                    name(workload)
                );
            }
        }
    }
    Ok(())
}

#[test]
fn workloads_budgets_and_the_headless_service_select_the_members() -> Result<()> {
    let docs = manifests()?;
    for (workload, template) in servers(&docs) {
        let selector = string_map(&workload["spec"]["selector"]["matchLabels"]);
        ensure!(
            selects(&selector, &labels(template)),
            "{} {} does not select its own pods",
            kind(workload),
            name(workload)
        );
    }
    let statefulset = of_kind(&docs, "StatefulSet")
        .next()
        .context("no StatefulSet")?;
    let member_labels = labels(&statefulset["spec"]["template"]);
    // Every budget selects the pods of one workload; the members have one.
    let mut members_budgeted = false;
    for budget in of_kind(&docs, "PodDisruptionBudget") {
        let selector = string_map(&budget["spec"]["selector"]["matchLabels"]);
        members_budgeted |= selects(&selector, &member_labels);
        ensure!(
            servers(&docs)
                .iter()
                .any(|(_, template)| selects(&selector, &labels(template))),
            "PodDisruptionBudget {} selects no workload's pods",
            name(budget)
        );
    }
    ensure!(
        members_budgeted,
        "no PodDisruptionBudget selects the members"
    );
    let service_name = string(&statefulset["spec"]["serviceName"], "serviceName")?;
    let headless = of_kind(&docs, "Service")
        .find(|s| name(s) == service_name)
        .ok_or_else(|| anyhow!("serviceName {service_name} names no Service"))?;
    ensure!(
        headless["spec"]["clusterIP"].as_str() == Some("None"),
        "{service_name} must be headless (per-pod DNS names)"
    );
    ensure!(
        headless["spec"]["publishNotReadyAddresses"].as_bool() == Some(true),
        "{service_name} must publish members that are not ready: they find each other before init"
    );
    ensure!(selects(
        &string_map(&headless["spec"]["selector"]),
        &member_labels
    ));
    Ok(())
}

/// No region has a single point of failure: every escrow Deployment runs
/// at least two nodes — its own `replicas`, or, when an autoscaler owns the
/// count, the autoscaler's least — rolls them one at a time (never all
/// down at once), and a PodDisruptionBudget keeps at least one of them
/// through voluntary disruptions.
#[test]
fn every_region_runs_two_escrow_nodes_and_keeps_one_up() -> Result<()> {
    let docs = manifests()?;
    let mut regions = 0;
    for deployment in of_kind(&docs, "Deployment") {
        let template = &deployment["spec"]["template"];
        let args: Vec<String> = containers(template)
            .iter()
            .flat_map(|c| list(&c["args"]).iter().filter_map(|a| a.as_str()))
            .map(str::to_string)
            .collect();
        if args.first().map(String::as_str) != Some("escrow") {
            continue;
        }
        regions += 1;
        let deployment_name = name(deployment);
        let autoscaler = of_kind(&docs, "HorizontalPodAutoscaler").find(|hpa| {
            let target = &hpa["spec"]["scaleTargetRef"];
            target["kind"].as_str() == Some("Deployment")
                && target["name"].as_str() == Some(deployment_name)
        });
        let replicas = match (deployment["spec"]["replicas"].as_i64(), autoscaler) {
            (Some(_), Some(_)) => {
                bail!("{deployment_name}: `replicas` beside an autoscaler is reset by every apply")
            }
            (Some(replicas), None) => replicas,
            (None, Some(hpa)) => {
                let least = hpa["spec"]["minReplicas"].as_i64().unwrap_or(1);
                let most = hpa["spec"]["maxReplicas"].as_i64().unwrap_or(0);
                ensure!(
                    most >= least,
                    "{deployment_name}: scales to {most}, below {least}"
                );
                let down = &hpa["spec"]["behavior"]["scaleDown"];
                ensure!(
                    down["stabilizationWindowSeconds"].as_i64().unwrap_or(0) >= 60
                        && list(&down["policies"])
                            .iter()
                            .all(|p| p["type"].as_str() == Some("Pods") && p["value"].as_i64() == Some(1)),
                    "{deployment_name}: a scale-down strands what a node held: one node at a time, slowly"
                );
                least
            }
            (None, None) => 1,
        };
        ensure!(
            replicas >= 2,
            "{deployment_name}: {replicas} escrow node(s)"
        );
        let strategy = &deployment["spec"]["strategy"];
        ensure!(
            strategy["type"].as_str() == Some("RollingUpdate")
                && strategy["rollingUpdate"]["maxUnavailable"].as_i64() == Some(1),
            "{deployment_name}: must roll one node at a time"
        );
        let pods = labels(template);
        let budgeted = of_kind(&docs, "PodDisruptionBudget").any(|budget| {
            selects(
                &string_map(&budget["spec"]["selector"]["matchLabels"]),
                &pods,
            ) && budget["spec"]["minAvailable"].as_i64().unwrap_or(0) >= 1
        });
        ensure!(budgeted, "{deployment_name}: no budget keeps a node up");
    }
    ensure!(regions >= 1, "no escrow Deployment");
    Ok(())
}

/// `POD.SERVICE:PORT` member addresses in an argument, split on `,` and `=`
/// (IP addresses, such as listen addresses, are not names).
fn member_addresses(arg: &str) -> Vec<(String, String, u16)> {
    arg.split([',', '='])
        .filter_map(|addr| {
            let (host, port) = addr.rsplit_once(':')?;
            if host.parse::<std::net::IpAddr>().is_ok() {
                return None;
            }
            let (pod, service) = host.split_once('.')?;
            Some((pod.to_string(), service.to_string(), port.parse().ok()?))
        })
        .collect()
}

#[test]
fn member_addresses_in_arguments_name_statefulset_pods() -> Result<()> {
    let docs = manifests()?;
    let statefulset = of_kind(&docs, "StatefulSet")
        .next()
        .context("no StatefulSet")?;
    let sts_name = name(statefulset);
    let service = string(&statefulset["spec"]["serviceName"], "serviceName")?;
    let replicas = statefulset["spec"]["replicas"]
        .as_i64()
        .context("replicas")?;
    let ports = container_ports(&statefulset["spec"]["template"]);
    let mut checked = 0;
    for (workload, template) in pod_templates(&docs) {
        for container in containers(template) {
            for arg in strings(&container["args"]) {
                for (pod, svc, port) in member_addresses(&arg) {
                    let ordinal: i64 = pod
                        .strip_prefix(&format!("{sts_name}-"))
                        .and_then(|o| o.parse().ok())
                        .ok_or_else(|| {
                            anyhow!(
                                "{} {}: {pod} is no pod of {sts_name}",
                                kind(workload),
                                name(workload)
                            )
                        })?;
                    ensure!(
                        (0..replicas).contains(&ordinal),
                        "{pod}: the StatefulSet has {replicas} replicas"
                    );
                    ensure!(
                        svc == service,
                        "{pod}.{svc}: the pods' service is {service}"
                    );
                    ensure!(
                        ports.iter().any(|(_, p)| *p == i64::from(port)),
                        "{pod}.{svc}:{port}: no such container port"
                    );
                    checked += 1;
                }
            }
        }
    }
    ensure!(checked >= 6, "found only {checked} member addresses");

    // The init Job's `--member ID=ADDR`: `--id-from-hostname` gives pod N the id N + 1.
    let job = of_kind(&docs, "Job").next().context("no init Job")?;
    let args = strings(&containers(&job["spec"]["template"])[0]["args"]);
    let mut ids = Vec::new();
    for pair in args.windows(2).filter(|w| w[0] == "--member") {
        let (id, addr) = pair[1].split_once('=').context("--member ID=ADDR")?;
        let id: i64 = id.parse()?;
        ensure!(
            addr.starts_with(&format!("{sts_name}-{}.", id - 1)),
            "member {id} must be pod {sts_name}-{}, not {addr}",
            id - 1
        );
        ids.push(id);
    }
    ensure!(
        ids == (1..=replicas).collect::<Vec<_>>(),
        "init names members {ids:?}"
    );
    Ok(())
}

#[test]
fn probes_need_no_certificate_and_ask_the_metrics_port() -> Result<()> {
    let docs = manifests()?;
    for (workload, template) in servers(&docs) {
        let ports = container_ports(template);
        for container in containers(template) {
            let what = format!("{} {}", kind(workload), name(workload));
            let args = strings(&container["args"]);
            let metrics_listen =
                flag_value(&args, "--metrics-listen").context("--metrics-listen")?;
            let metrics_port = i64::from(port_of(metrics_listen)?);
            ensure!(
                ports.contains(&("metrics".to_string(), metrics_port)),
                "{what}: the metrics port is not declared as `metrics`"
            );
            for (probe, path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")] {
                let get = &container[probe]["httpGet"];
                ensure!(
                    get["path"].as_str() == Some(path),
                    "{what}: {probe} must GET {path}"
                );
                ensure!(
                    get["port"].as_str() == Some("metrics"),
                    "{what}: {probe} must ask the metrics port (plain HTTP, no certificate)"
                );
                ensure!(
                    container[probe]["grpc"].is_badvalue(),
                    "{what}: a gRPC {probe} cannot present a certificate"
                );
            }
        }
    }
    Ok(())
}

/// The `certs` volume's mount path and Secret of a pod template.
fn certs_volume(template: &Yaml) -> Result<(String, String)> {
    let volume = list(&template["spec"]["volumes"])
        .iter()
        .find(|v| v["name"].as_str() == Some("certs"))
        .context("no volume `certs`")?;
    let secret = string(&volume["secret"]["secretName"], "certs secretName")?.to_string();
    let mount = list(&containers(template)[0]["volumeMounts"])
        .iter()
        .find(|m| m["name"].as_str() == Some("certs"))
        .context("`certs` is not mounted")?;
    ensure!(
        mount["readOnly"].as_bool() == Some(true),
        "certs must mount read-only"
    );
    Ok((
        string(&mount["mountPath"], "mountPath")?.to_string(),
        secret,
    ))
}

/// The certificate files a workload's arguments read, relative to its
/// certs mount, for every member id of a StatefulSet (`{id}` expanded).
fn files_read(workload: &Yaml, template: &Yaml) -> Result<Vec<String>> {
    let (mount, _) = certs_volume(template)?;
    let args = strings(&containers(template)[0]["args"]);
    let ids: Vec<i64> = match kind(workload) {
        "StatefulSet" => (1..=workload["spec"]["replicas"].as_i64().context("replicas")?).collect(),
        _ => vec![0],
    };
    let mut files = Vec::new();
    for flag in ["--tls-ca", "--tls-cert", "--tls-key"] {
        let path = flag_value(&args, flag).with_context(|| format!("no {flag}"))?;
        let file = path
            .strip_prefix(&format!("{mount}/"))
            .with_context(|| format!("{flag} {path} is not under the certs mount {mount}"))?;
        for id in &ids {
            let file = file.replace("{id}", &id.to_string());
            if !files.contains(&file) {
                files.push(file);
            }
        }
    }
    files.sort();
    Ok(files)
}

#[test]
fn the_base_speaks_mutual_tls_with_certificates_from_secrets() -> Result<()> {
    let docs = manifests()?;
    for (workload, template) in pod_templates(&docs) {
        let what = format!("{} {}", kind(workload), name(workload));
        let args = strings(&containers(template)[0]["args"]);
        ensure!(
            !args.iter().any(|a| a == "--insecure"),
            "{what} runs --insecure in the base"
        );
        let files = files_read(workload, template).with_context(|| what.clone())?;
        ensure!(files.contains(&"ca.pem".to_string()), "{what}: {files:?}");
        let (_, secret) = certs_volume(template)?;
        ensure!(secret.starts_with("leasehold-"), "{what}: secret {secret}");
        let security = &containers(template)[0]["securityContext"];
        ensure!(
            security["allowPrivilegeEscalation"].as_bool() == Some(false)
                && security["readOnlyRootFilesystem"].as_bool() == Some(true),
            "{what}: the container must not escalate and must not write its root file system"
        );
        ensure!(
            template["spec"]["automountServiceAccountToken"].as_bool() == Some(false),
            "{what}: no service account token is needed"
        );
    }
    let statefulset = of_kind(&docs, "StatefulSet")
        .next()
        .context("no StatefulSet")?;
    let args = strings(&containers(&statefulset["spec"]["template"])[0]["args"]);
    let replicas = statefulset["spec"]["replicas"]
        .as_i64()
        .context("replicas")?;
    let joined = flag_value(&args, "--join-members").context("members need --join-members")?;
    ensure!(
        joined
            == (1..=replicas)
                .map(|i| i.to_string())
                .collect::<Vec<_>>()
                .join(","),
        "--join-members {joined} must name the founding members 1..{replicas}"
    );
    Ok(())
}

/// An overlay's kustomization and its patches, parsed.
fn overlay(name: &str) -> Result<(Yaml, Vec<Yaml>)> {
    let path = deploy_dir()
        .join("k8s")
        .join(name)
        .join("kustomization.yaml");
    let kustomization = load_documents(&path)?.remove(0);
    ensure!(
        strings(&kustomization["resources"]).contains(&"../base".to_string()),
        "{name} is an overlay of the base"
    );
    let mut patches = Vec::new();
    for patch in list(&kustomization["patches"]) {
        let text = string(&patch["patch"], "patch")?;
        let mut docs = yaml_rust2::YamlLoader::load_from_str(text)?;
        ensure!(docs.len() == 1, "{name}: one object per patch");
        patches.push(docs.remove(0));
    }
    Ok((kustomization, patches))
}

/// The base object a patch names (kind and name), and the patch's names
/// of containers and volumes each defined there.
fn patched<'a>(docs: &'a [Yaml], patch: &Yaml) -> Result<&'a Yaml> {
    let target = docs
        .iter()
        .find(|d| kind(d) == kind(patch) && name(d) == name(patch))
        .with_context(|| {
            format!(
                "a patch names {} {}, not in the base",
                kind(patch),
                name(patch)
            )
        })?;
    let base = template_of(target);
    for container in containers(template_of(patch)) {
        let wanted = container["name"].as_str();
        ensure!(
            containers(base)
                .iter()
                .any(|c| c["name"].as_str() == wanted),
            "container {wanted:?} is not in {}",
            name(target)
        );
    }
    for volume in list(&template_of(patch)["spec"]["volumes"]) {
        let wanted = volume["name"].as_str();
        ensure!(
            list(&base["spec"]["volumes"])
                .iter()
                .any(|v| v["name"].as_str() == wanted),
            "volume {wanted:?} is not in {}",
            name(target)
        );
    }
    Ok(target)
}

#[test]
fn the_dev_overlay_alone_is_plaintext_and_patches_every_workload() -> Result<()> {
    let docs = manifests()?;
    let (_, patches) = overlay("dev-insecure")?;
    let mut covered = Vec::new();
    for patch in &patches {
        let target = patched(&docs, patch)?;
        covered.push(name(target).to_string());
        for container in containers(template_of(patch)) {
            let args = strings(&container["args"]);
            ensure!(
                args.iter().any(|a| a == "--insecure"),
                "{}: {args:?}",
                name(target)
            );
            ensure!(
                !args.iter().any(|a| a.starts_with("--tls")),
                "{}: TLS flags with --insecure: {args:?}",
                name(target)
            );
            let base_args = strings(&containers(template_of(target))[0]["args"]);
            ensure!(
                args.first() == base_args.first(),
                "{}: the overlay runs another command",
                name(target)
            );
        }
        for volume in list(&template_of(patch)["spec"]["volumes"]) {
            ensure!(
                volume["secret"]["optional"].as_bool() == Some(true),
                "{}: plaintext needs no Secret",
                name(target)
            );
        }
    }
    for (workload, _) in pod_templates(&docs) {
        ensure!(
            covered.iter().any(|c| c == name(workload)),
            "the dev overlay leaves {} on TLS without its Secret",
            name(workload)
        );
    }
    Ok(())
}

#[test]
fn cert_manager_projects_exactly_the_files_each_workload_reads() -> Result<()> {
    let docs = manifests()?;
    let (_, patches) = overlay("cert-manager")?;
    let certificates = load_documents(
        &deploy_dir()
            .join("k8s")
            .join("cert-manager")
            .join("certificates.yaml"),
    )?;
    let uri_of = |secret: &str| -> Option<String> {
        certificates
            .iter()
            .find(|c| kind(c) == "Certificate" && c["spec"]["secretName"].as_str() == Some(secret))
            .and_then(|c| {
                list(&c["spec"]["uris"])
                    .first()
                    .and_then(|u| u.as_str().map(str::to_string))
            })
    };
    let mut covered = Vec::new();
    for patch in &patches {
        let target = patched(&docs, patch)?;
        covered.push(name(target).to_string());
        let volume = list(&template_of(patch)["spec"]["volumes"])
            .iter()
            .find(|v| v["name"].as_str() == Some("certs"))
            .context("no certs volume in the patch")?;
        let mut files = Vec::new();
        for source in list(&volume["projected"]["sources"]) {
            let secret = string(&source["secret"]["name"], "projected secret")?;
            let uri = uri_of(secret).with_context(|| format!("no Certificate writes {secret}"))?;
            for item in list(&source["secret"]["items"]) {
                let path = string(&item["path"], "item path")?.to_string();
                let key = string(&item["key"], "item key")?;
                ensure!(["tls.crt", "tls.key", "ca.crt"].contains(&key), "{key}");
                if let Some(stem) = path
                    .strip_suffix(".pem")
                    .or_else(|| path.strip_suffix(".key"))
                {
                    if stem != "ca" {
                        // member-1 ↔ spiffe://leasehold/member/1, region-eu ↔ …/region/eu.
                        let (kind_name, id) = stem.split_once('-').context("file stem")?;
                        ensure!(
                            uri == format!("spiffe://leasehold/{kind_name}/{id}"),
                            "{path} is projected from {secret}, whose certificate is {uri}"
                        );
                    }
                }
                files.push(path);
            }
        }
        files.sort();
        ensure!(
            files == files_read(target, template_of(target))?,
            "{}: projects {files:?}",
            name(target)
        );
    }
    for (workload, _) in pod_templates(&docs) {
        ensure!(
            covered.iter().any(|c| c == name(workload)),
            "cert-manager leaves {} without certificates",
            name(workload)
        );
    }
    Ok(())
}

#[test]
fn prometheus_scrapes_the_metrics_ports() -> Result<()> {
    let docs = manifests()?;
    for (workload, template) in servers(&docs) {
        let what = format!("{} {}", kind(workload), name(workload));
        let annotations = string_map(&template["metadata"]["annotations"]);
        let annotation = |key: &str| {
            annotations
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.as_str())
        };
        ensure!(
            annotation("prometheus.io/scrape") == Some("true"),
            "{what}: no prometheus.io/scrape"
        );
        ensure!(annotation("prometheus.io/path") == Some("/metrics"));
        let port: i64 = annotation("prometheus.io/port")
            .context("prometheus.io/port")?
            .parse()?;
        ensure!(
            container_ports(template).contains(&("metrics".to_string(), port)),
            "{what}: prometheus.io/port {port} is not its `metrics` port"
        );
        let args = strings(&containers(template)[0]["args"]);
        let listen = flag_value(&args, "--metrics-listen")
            .ok_or_else(|| anyhow!("{what}: no --metrics-listen"))?;
        ensure!(
            i64::from(port_of(listen)?) == port,
            "{what}: metrics on {listen}, annotation says {port}"
        );
    }
    Ok(())
}

#[test]
fn members_are_spread_over_nodes() -> Result<()> {
    let docs = manifests()?;
    let statefulset = of_kind(&docs, "StatefulSet")
        .next()
        .context("no StatefulSet")?;
    let template = &statefulset["spec"]["template"];
    let spread = list(&template["spec"]["topologySpreadConstraints"])
        .iter()
        .find(|c| c["topologyKey"].as_str() == Some("kubernetes.io/hostname"))
        .context("no topology spread over kubernetes.io/hostname")?;
    ensure!(spread["maxSkew"].as_i64() == Some(1));
    ensure!(spread["whenUnsatisfiable"].as_str() == Some("DoNotSchedule"));
    ensure!(
        selects(
            &string_map(&spread["labelSelector"]["matchLabels"]),
            &labels(template)
        ),
        "the spread constraint does not select the members"
    );
    Ok(())
}

#[test]
fn the_init_job_forms_the_cluster_and_sets_no_policy() -> Result<()> {
    let docs = manifests()?;
    let job = of_kind(&docs, "Job").next().context("no init Job")?;
    let args = strings(&containers(&job["spec"]["template"])[0]["args"]);
    ensure!(args.starts_with(&["cluster".to_string(), "init".to_string()]));
    ensure!(
        !args.iter().any(|a| a == "--policy"),
        "policies are set separately, not by the init Job: {args:?}"
    );
    Ok(())
}

#[test]
fn volume_mounts_name_volumes_or_claims() -> Result<()> {
    let docs = manifests()?;
    for (workload, template) in pod_templates(&docs) {
        let mut volumes: Vec<String> = list(&template["spec"]["volumes"])
            .iter()
            .filter_map(|v| v["name"].as_str().map(str::to_string))
            .collect();
        volumes.extend(
            list(&workload["spec"]["volumeClaimTemplates"])
                .iter()
                .filter_map(|v| v["metadata"]["name"].as_str().map(str::to_string)),
        );
        for container in containers(template) {
            for mount in list(&container["volumeMounts"]) {
                let mount = string(&mount["name"], "volumeMount name")?;
                ensure!(
                    volumes.iter().any(|v| v == mount),
                    "{} {}: volume {mount} is not defined",
                    kind(workload),
                    name(workload)
                );
            }
        }
    }
    Ok(())
}

#[test]
fn member_addresses_are_read_from_lists_and_member_pairs() {
    assert_eq!(
        member_addresses("2=leasehold-1.leasehold:7100"),
        vec![("leasehold-1".into(), "leasehold".into(), 7100)]
    );
    assert_eq!(member_addresses("a-0.s:1,a-1.s:2").len(), 2);
    assert!(member_addresses("0.0.0.0:7100").is_empty());
    assert!(member_addresses("--coordinator").is_empty());
}

/// The backup CronJob saves snapshots as an operator from the members
/// (every member named: the CLI finds the leader), into a claim of its
/// own, keeping a bounded number, never two runs at once, each run bounded
/// in time.
#[test]
fn backups_are_scheduled_from_the_members_into_their_own_claim() -> Result<()> {
    let docs = manifests()?;
    let cron = of_kind(&docs, "CronJob")
        .next()
        .context("no backup CronJob")?;
    ensure!(cron["spec"]["concurrencyPolicy"].as_str() == Some("Forbid"));
    ensure!(cron["spec"]["jobTemplate"]["spec"]["activeDeadlineSeconds"]
        .as_i64()
        .is_some());
    let template = template_of(cron);
    let args = strings(&containers(template)[0]["args"]);
    ensure!(
        args.starts_with(&["snapshot".to_string(), "save".to_string()]),
        "{args:?}"
    );
    let keep: i64 = flag_value(&args, "--keep").context("--keep")?.parse()?;
    ensure!(keep >= 1, "--keep {keep}");
    let statefulset = of_kind(&docs, "StatefulSet")
        .next()
        .context("no StatefulSet")?;
    let replicas = statefulset["spec"]["replicas"]
        .as_i64()
        .context("replicas")?;
    let endpoints = member_addresses(flag_value(&args, "--endpoint").context("--endpoint")?);
    ensure!(
        endpoints.len() as i64 == replicas,
        "the backup names {endpoints:?}"
    );
    ensure!(
        flag_value(&args, "--tls-cert").is_some_and(|c| c.contains("operator-")),
        "backups are taken as an operator"
    );
    let out = flag_value(&args, "--out-dir").context("--out-dir")?;
    let mount = list(&containers(template)[0]["volumeMounts"])
        .iter()
        .find(|m| m["mountPath"].as_str() == Some(out))
        .context("--out-dir is not a mount")?;
    let volume = list(&template["spec"]["volumes"])
        .iter()
        .find(|v| v["name"] == mount["name"])
        .context("the backups volume")?;
    let claim = string(&volume["persistentVolumeClaim"]["claimName"], "claimName")?;
    ensure!(
        of_kind(&docs, "PersistentVolumeClaim").any(|c| name(c) == claim),
        "no claim {claim}"
    );
    Ok(())
}

/// The Prometheus Operator overlay scrapes each component's Services on
/// their `metrics` port: every ServiceMonitor selects Services of the base,
/// some of which have that port.
#[test]
fn service_monitors_select_services_with_a_metrics_port() -> Result<()> {
    let docs = manifests()?;
    let (kustomization, _) = overlay("prometheus-operator")?;
    let mut monitors = Vec::new();
    for resource in strings(&kustomization["resources"]) {
        if resource != "../base" {
            monitors.extend(load_documents(
                &deploy_dir().join("k8s/prometheus-operator").join(resource),
            )?);
        }
    }
    ensure!(
        monitors.len() >= 2,
        "a monitor for the members and one for the escrow nodes"
    );
    for monitor in &monitors {
        ensure!(kind(monitor) == "ServiceMonitor", "{}", kind(monitor));
        let wanted = string_map(&monitor["spec"]["selector"]["matchLabels"]);
        let ports: Vec<&str> = list(&monitor["spec"]["endpoints"])
            .iter()
            .filter_map(|e| e["port"].as_str())
            .collect();
        ensure!(!ports.is_empty(), "{}: no endpoint", name(monitor));
        let scraped = of_kind(&docs, "Service")
            .filter(|service| selects(&wanted, &string_map(&service["metadata"]["labels"])))
            .filter(|service| {
                list(&service["spec"]["ports"])
                    .iter()
                    .any(|p| ports.contains(&p["name"].as_str().unwrap_or("")))
            })
            .count();
        ensure!(scraped >= 1, "{} scrapes no Service", name(monitor));
    }
    Ok(())
}
