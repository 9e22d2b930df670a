//! `leasehold config check` and `leasehold policy apply` as an operator
//! runs them: exit 0 on the example configs in `deploy/`, exit 1 with every
//! problem (text and JSON) on broken files, and a policy file applied to a
//! cluster only when it is free of problems.

use std::path::Path;
use std::process::{Command, Output};

use anyhow::{ensure, Context, Result};

use crate::harness::Cluster;

fn leasehold(args: &[&str]) -> Result<Output> {
    Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .env("LEASEHOLD_INSECURE", "true")
        .args(args)
        .output()
        .context("run leasehold")
}

fn deploy(file: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/config")
        .join(file)
        .display()
        .to_string()
}

#[test]
fn config_check_exits_0_on_the_examples_and_1_with_every_problem() -> Result<()> {
    let examples = [
        deploy("node.example.toml"),
        deploy("escrow.example.toml"),
        deploy("policies.example.toml"),
    ];
    let mut args = vec!["config", "check", "--skip-files"];
    args.extend(examples.iter().map(String::as_str));
    let ok = leasehold(&args)?;
    ensure!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stdout)
    );
    let text = String::from_utf8(ok.stdout)?;
    ensure!(text.matches(": ok (").count() == 3, "{text}");

    let dir = tempfile::tempdir()?;
    let member = dir.path().join("member.toml");
    std::fs::write(
        &member,
        "id = 1\nlisten = \"0.0.0.0:7100\"\ndata_dir = \"/d\"\nheartbeat_ms = 0\nsnapshot_evry = 5\n\
         tls_ca = \"/nope/ca.pem\"\ntls_cert = \"/nope/c.pem\"\ntls_key = \"/nope/k.pem\"\n",
    )?;
    let policies = dir.path().join("policies.toml");
    std::fs::write(
        &policies,
        "[[policy]]\nprefix = \"a/\"\nlimit = 0\nwindow_ms = 1000\n",
    )?;
    let member = member.display().to_string();
    let policies = policies.display().to_string();
    let failed = leasehold(&["config", "check", &member, &policies])?;
    ensure!(failed.status.code() == Some(1));
    let text = String::from_utf8(failed.stdout)?;
    for expected in [
        format!("{member}:5: error: snapshot_evry: unknown field"),
        format!("{member}:4: error: heartbeat_ms: must be greater than 0"),
        format!("{member}:6: error: tls_ca: /nope/ca.pem: cannot be read"),
        format!("{policies}:3: error: policy[0].limit"),
    ] {
        ensure!(
            text.contains(&expected),
            "{expected:?} missing from:\n{text}"
        );
    }
    ensure!(
        text.matches("    fix: ").count() >= 6,
        "every problem says what to do:\n{text}"
    );

    let json = leasehold(&["config", "check", "--output", "json", &policies])?;
    ensure!(json.status.code() == Some(1));
    let report: serde_json::Value = serde_json::from_slice(&json.stdout)?;
    ensure!(report["ok"] == false && report["errors"] == 1, "{report}");
    let finding = &report["files"][0]["findings"][0];
    ensure!(
        finding["field"] == "policy[0].limit" && finding["line"] == 3,
        "{finding}"
    );
    ensure!(report["files"][0]["kind"] == "policies");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_file_is_applied_only_when_it_has_no_problem() -> Result<()> {
    let cluster = Cluster::start_initialised(1, |_| {}).await?;
    let addr = cluster.addr(1);
    let dir = tempfile::tempdir()?;
    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "[[policy]]\nprefix = \"ok/\"\nlimit = 5\nwindow_ms = 1000\n\
         [[policy]]\nprefix = \"bad/\"\nlimit = 5\nwindow_ms = 0\n",
    )?;
    let bad = bad.display().to_string();
    let refused = tokio::task::spawn_blocking({
        let addr = addr.clone();
        move || leasehold(&["policy", "apply", &bad, "-e", &addr])
    })
    .await??;
    ensure!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    ensure!(
        stderr.contains("policy[1].window_ms") && stderr.contains("nothing was set"),
        "{stderr}"
    );
    let admin = cluster.client()?.admin();
    ensure!(
        admin.list_policies().await?.is_empty(),
        "a bad file sets nothing"
    );

    let example = deploy("policies.example.toml");
    let applied =
        tokio::task::spawn_blocking(move || leasehold(&["policy", "apply", &example, "-e", &addr]))
            .await??;
    ensure!(
        applied.status.success(),
        "{}",
        String::from_utf8_lossy(&applied.stderr)
    );
    let policies = admin.list_policies().await?;
    let prefixes: Vec<(&str, bool)> = policies
        .iter()
        .map(|p| (p.prefix.as_str(), p.shadow))
        .collect();
    ensure!(
        prefixes == [("api/", false), ("beta/", true), ("llm/tokens/", false)],
        "{prefixes:?}"
    );
    Ok(())
}

/// An `envoyproxy/ratelimit` configuration (YAML) is checked with every
/// problem at its line, and `policy apply` sets the policies its rules
/// stand for — one per limited rule, under the rule's prefix — only when it
/// has no problem.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ratelimit_configuration_is_checked_and_applied_as_policies() -> Result<()> {
    let example = deploy("ratelimit.example.yaml");
    let ok = leasehold(&["config", "check", &example])?;
    ensure!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stdout)
    );
    ensure!(String::from_utf8(ok.stdout)?.contains("rate limit configuration"));

    let dir = tempfile::tempdir()?;
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 5\n  - key: b\n    quota_mode: true\n",
    )?;
    let bad = bad.display().to_string();
    let refused = leasehold(&["config", "check", &bad])?;
    ensure!(!refused.status.success());
    let text = String::from_utf8(refused.stdout)?;
    ensure!(
        text.contains("bad.yaml:5")
            && text.contains("fortnight")
            && text.contains("bad.yaml:8")
            && text.contains("quota_mode"),
        "{text}"
    );

    let cluster = Cluster::start_initialised(1, |_| {}).await?;
    let addr = cluster.addr(1);
    let not_applied = tokio::task::spawn_blocking({
        let addr = addr.clone();
        move || leasehold(&["policy", "apply", &bad, "-e", &addr])
    })
    .await??;
    ensure!(!not_applied.status.success());
    let admin = cluster.client()?.admin();
    ensure!(
        admin.list_policies().await?.is_empty(),
        "a bad file sets nothing"
    );
    let applied =
        tokio::task::spawn_blocking(move || leasehold(&["policy", "apply", &example, "-e", &addr]))
            .await??;
    ensure!(
        applied.status.success(),
        "{}",
        String::from_utf8_lossy(&applied.stderr)
    );
    let mut policies: Vec<(String, u64, u64, bool)> = admin
        .list_policies()
        .await?
        .into_iter()
        .map(|p| (p.prefix, p.limit, p.window_ms, p.shadow))
        .collect();
    policies.sort();
    let day = 86_400_000;
    ensure!(
        policies
            == [
                (
                    "rls:messaging/message_type=marketing/to_number/".to_string(),
                    5,
                    day,
                    false
                ),
                (
                    "rls:messaging/remote_address/".to_string(),
                    10,
                    1_000,
                    false
                ),
                (
                    "rls:messaging/remote_address=10.1.*/".to_string(),
                    2,
                    1_000,
                    true
                ),
                ("rls:messaging/to_number/".to_string(), 100, day, false),
            ],
        "{policies:?}"
    );
    Ok(())
}
