//! `deploy/compose/docker-compose.yml`: the names one service uses are the
//! ones the others define (services, volumes, certificate files, addresses),
//! and health checks and metrics ports are wired.

use std::collections::BTreeMap;

use anyhow::{anyhow, ensure, Context, Result};
use yaml_rust2::Yaml;

use crate::deploy_dir;
use crate::yaml::{flag_value, list, load_documents, port_of, string_map, strings};

/// The services, with `<<: *anchor` merged in (the YAML parser resolves
/// the alias, not the merge).
fn services() -> Result<BTreeMap<String, Yaml>> {
    let docs = load_documents(&deploy_dir().join("compose/docker-compose.yml"))?;
    let root = docs.first().context("an empty compose file")?;
    let declared_volumes: Vec<String> = root["volumes"]
        .as_hash()
        .map(|h| {
            h.keys()
                .filter_map(|k| k.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let mut services = BTreeMap::new();
    for (name, service) in root["services"].as_hash().context("no services")? {
        let name = name.as_str().context("a service name")?.to_string();
        let mut merged = service["<<"].as_hash().cloned().unwrap_or_default();
        for (key, value) in service.as_hash().context("a service")? {
            if key.as_str() != Some("<<") {
                merged.insert(key.clone(), value.clone());
            }
        }
        let merged = Yaml::Hash(merged);
        for volume in strings(&merged["volumes"]) {
            let source = volume.split(':').next().unwrap_or("");
            if !source.starts_with(['/', '.', '$']) {
                ensure!(
                    declared_volumes.iter().any(|v| v == source),
                    "{name} mounts volume {source}, which is not declared"
                );
            }
        }
        services.insert(name, merged);
    }
    Ok(services)
}

fn command(service: &Yaml) -> Vec<String> {
    strings(&service["command"])
}

fn env(service: &Yaml) -> BTreeMap<String, String> {
    string_map(&service["environment"]).into_iter().collect()
}

fn with_command<'a>(
    services: &'a BTreeMap<String, Yaml>,
    first: &'a str,
) -> impl Iterator<Item = (&'a String, &'a Yaml)> + 'a {
    services
        .iter()
        .filter(move |(_, s)| command(s).first().map(String::as_str) == Some(first))
}

#[test]
fn dependencies_name_services() -> Result<()> {
    let services = services()?;
    for (name, service) in &services {
        let depends: Vec<String> = match &service["depends_on"] {
            Yaml::Array(_) => strings(&service["depends_on"]),
            Yaml::Hash(h) => h
                .keys()
                .filter_map(|k| k.as_str().map(str::to_string))
                .collect(),
            _ => Vec::new(),
        };
        for dependency in depends {
            ensure!(
                services.contains_key(&dependency),
                "{name} depends on {dependency}, which is no service"
            );
        }
    }
    Ok(())
}

/// The file stems `leasehold certs mint` writes for the `certs` service.
fn minted_stems(services: &BTreeMap<String, Yaml>) -> Result<Vec<String>> {
    let args = command(services.get("certs").context("no certs service")?);
    let values = |flag: &str| -> Vec<String> {
        flag_value(&args, flag)
            .map(|v| v.split(',').map(str::to_string).collect())
            .unwrap_or_default()
    };
    let mut stems = vec!["ca".to_string()];
    stems.extend(values("--members").iter().map(|m| format!("member-{m}")));
    stems.extend(values("--regions").iter().map(|r| format!("region-{r}")));
    stems.extend(
        values("--operators")
            .iter()
            .map(|o| format!("operator-{o}")),
    );
    for service in values("--services") {
        let (name, region) = service.split_once('@').context("--services NAME@REGION")?;
        stems.push(format!("service-{name}-{region}"));
    }
    Ok(stems)
}

#[test]
fn certificate_files_are_minted_and_servers_are_named_in_them() -> Result<()> {
    let services = services()?;
    let stems = minted_stems(&services)?;
    let mut referenced = 0;
    for (name, service) in &services {
        for (key, value) in env(service) {
            if let Some(file) = value.strip_prefix("/certs/") {
                let stem = file
                    .strip_suffix(".pem")
                    .or_else(|| file.strip_suffix(".key"))
                    .ok_or_else(|| anyhow!("{name} {key}={value}: not a .pem or .key"))?;
                ensure!(
                    stems.iter().any(|s| s == stem),
                    "{name} {key}={value}: certs mint writes no {stem}"
                );
                referenced += 1;
            }
        }
    }
    ensure!(
        referenced >= 15,
        "only {referenced} certificate files referenced"
    );
    let certs = command(&services["certs"]);
    let dns: Vec<&str> = flag_value(&certs, "--dns")
        .unwrap_or("")
        .split(',')
        .collect();
    for (name, _) in with_command(&services, "serve").chain(with_command(&services, "escrow")) {
        ensure!(
            dns.contains(&name.as_str()),
            "{name} is dialled by name but its certificate would not carry it (--dns)"
        );
    }
    Ok(())
}

#[test]
fn servers_present_their_own_certificate_and_check_their_health() -> Result<()> {
    let services = services()?;
    let health = ["CMD", "/usr/local/bin/leasehold", "health"];
    let mut servers = 0;
    for (name, service) in with_command(&services, "serve").chain(with_command(&services, "escrow"))
    {
        let env = env(service);
        for key in [
            "LEASEHOLD_TLS_CA",
            "LEASEHOLD_TLS_CERT",
            "LEASEHOLD_TLS_KEY",
        ] {
            ensure!(
                env.contains_key(key),
                "{name}: no {key} (the health check presents it)"
            );
        }
        ensure!(
            strings(&service["healthcheck"]["test"]) == health,
            "{name}: the health check must run `leasehold health`"
        );
        let args = command(service);
        let listen = port_of(flag_value(&args, "--listen").context("--listen")?)?;
        if args[0] == "escrow" {
            ensure!(
                env.get("LEASEHOLD_HEALTH_ENDPOINT") == Some(&format!("127.0.0.1:{listen}")),
                "{name}: LEASEHOLD_HEALTH_ENDPOINT must be its own port {listen}"
            );
            ensure!(
                env.get("LEASEHOLD_HEALTH_SERVICE").map(String::as_str)
                    == Some("leasehold.v1.Escrow")
            );
        } else {
            // The image's defaults: 127.0.0.1:7100, leasehold.v1.Coordinator.
            ensure!(listen == 7100 && !env.contains_key("LEASEHOLD_HEALTH_ENDPOINT"));
        }
        servers += 1;
    }
    ensure!(
        servers == 7,
        "expected 3 members and 4 escrow nodes, found {servers}"
    );
    Ok(())
}

#[test]
fn metrics_ports_are_served_and_published() -> Result<()> {
    let services = services()?;
    for (name, service) in with_command(&services, "serve").chain(with_command(&services, "escrow"))
    {
        let args = command(service);
        let metrics = port_of(
            flag_value(&args, "--metrics-listen")
                .ok_or_else(|| anyhow!("{name}: no --metrics-listen"))?,
        )?;
        ensure!(
            strings(&service["ports"])
                .iter()
                .any(|p| p.ends_with(&format!(":{metrics}"))),
            "{name}: metrics port {metrics} is not published"
        );
    }
    Ok(())
}

#[test]
fn addresses_name_member_services_and_init_sets_no_policy() -> Result<()> {
    let services = services()?;
    let members: BTreeMap<String, (String, u16)> = with_command(&services, "serve")
        .map(|(name, s)| {
            let args = command(s);
            let id = flag_value(&args, "--id").unwrap_or("").to_string();
            let port = port_of(flag_value(&args, "--listen").unwrap_or(""))?;
            Ok((name.clone(), (id, port)))
        })
        .collect::<Result<_>>()?;
    let dialled = |addr: &str| -> Result<()> {
        let (host, port) = addr.rsplit_once(':').context("HOST:PORT")?;
        let (_, listen) = members
            .get(host)
            .ok_or_else(|| anyhow!("{addr} names no member service"))?;
        ensure!(
            port == listen.to_string(),
            "{addr}: {host} listens on {listen}"
        );
        Ok(())
    };
    let init = command(services.get("init").context("no init service")?);
    ensure!(init.starts_with(&["cluster".to_string(), "init".to_string()]));
    ensure!(
        !init.iter().any(|a| a == "--policy"),
        "init sets a policy: {init:?}"
    );
    let mut ids = Vec::new();
    for pair in init.windows(2).filter(|w| w[0] == "--member") {
        let (id, addr) = pair[1].split_once('=').context("--member ID=ADDR")?;
        dialled(addr)?;
        let host = addr.split(':').next().unwrap_or("");
        ensure!(
            members[host].0 == id,
            "init names {host} member {id}; it runs --id {}",
            members[host].0
        );
        ids.push(id.to_string());
    }
    ensure!(
        ids.len() == members.len(),
        "init names {ids:?}, members are {members:?}"
    );
    for (name, service) in with_command(&services, "escrow") {
        let args = command(service);
        let coordinators = flag_value(&args, "--coordinator").context("--coordinator")?;
        for addr in coordinators.split(',') {
            dialled(addr).with_context(|| format!("{name} --coordinator"))?;
        }
    }
    Ok(())
}

#[test]
fn the_compose_file_lists_its_services() -> Result<()> {
    let services = services()?;
    ensure!(
        list(&services["certs"]["command"]).len() > 2 && services.len() == 12,
        "expected certs, n1-n3, init, escrow-eu, escrow-eu-2, escrow-us, escrow-us-2, cli, cli-eu, cli-us: {:?}",
        services.keys().collect::<Vec<_>>()
    );
    Ok(())
}

/// No region has a single point of failure: every region's escrow nodes
/// are at least two, each with a server name its certificate covers.
#[test]
fn every_region_has_two_escrow_nodes() -> Result<()> {
    let services = services()?;
    let mut per_region: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for (name, service) in with_command(&services, "escrow") {
        let args = command(service);
        let region = flag_value(&args, "--region").context("--region")?;
        per_region
            .entry(region.to_string())
            .or_default()
            .push(name.to_string());
    }
    ensure!(!per_region.is_empty(), "no escrow node");
    for (region, nodes) in &per_region {
        ensure!(
            nodes.len() >= 2,
            "region {region} has one escrow node: {nodes:?}"
        );
    }
    let certs = list(&services["certs"]["command"])
        .iter()
        .filter_map(|a| a.as_str())
        .collect::<Vec<_>>()
        .join(" ");
    for node in per_region.values().flatten() {
        ensure!(
            certs.split([' ', ',']).any(|dns| dns == node),
            "{node}: no server name in the certificates"
        );
    }
    Ok(())
}
