//! The binary's log lines as an operator's collector sees them: with
//! `--log-format json` every stderr line is a JSON object, and with stderr
//! not a terminal no ANSI escape is written, even at debug level with
//! openraft's own lines on. A fresh member says it waits for `cluster init`.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};

/// Runs a fresh `leasehold serve` until it has said it waits for
/// `cluster init` (or 20 s), kills it, and returns its stderr lines.
fn fresh_member_stderr(format: &str) -> Result<Vec<String>> {
    let dir = tempfile::tempdir()?;
    let mut child = Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args([
            "serve",
            "--insecure",
            "--id",
            "1",
            "--listen",
            "127.0.0.1:0",
        ])
        .arg("--data-dir")
        .arg(dir.path())
        .args(["--log-format", format])
        .env("RUST_LOG", "debug,openraft=debug")
        .env_remove("NO_COLOR")
        .env_remove("LEASEHOLD_LOG_FORMAT")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("start leasehold serve")?;
    let stderr = child.stderr.take().context("stderr is piped")?;
    let (lines, received) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen = Vec::new();
    while Instant::now() < deadline {
        match received.recv_timeout(Duration::from_millis(100)) {
            Ok(line) => {
                let waiting = line.contains("waiting for `leasehold cluster init`");
                seen.push(line);
                if waiting {
                    break;
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let _ = reader.join();
    seen.extend(received.try_iter());
    ensure!(
        seen.iter()
            .any(|line| line.contains("waiting for `leasehold cluster init`")),
        "a fresh member says it waits for cluster init; stderr was:\n{}",
        seen.join("\n")
    );
    Ok(seen)
}

#[test]
fn json_logs_are_one_object_per_line() -> Result<()> {
    let lines = fresh_member_stderr("json")?;
    ensure!(
        lines.len() > 5,
        "debug logging writes more than this: {lines:?}"
    );
    for line in &lines {
        let value: serde_json::Value =
            serde_json::from_str(line).with_context(|| format!("not a JSON line: {line}"))?;
        for field in ["timestamp", "level", "target", "message"] {
            ensure!(value.get(field).is_some(), "{field} missing in {line}");
        }
        ensure!(
            line.len() < 16 * 1024,
            "field values are cut, so no line runs to {} bytes",
            line.len()
        );
    }
    Ok(())
}

#[test]
fn no_ansi_escape_when_stderr_is_not_a_terminal() -> Result<()> {
    let lines = fresh_member_stderr("text")?;
    ensure!(
        lines.len() > 5,
        "debug logging writes more than this: {lines:?}"
    );
    for line in &lines {
        ensure!(!line.contains('\u{1b}'), "ANSI escape in {line:?}");
    }
    Ok(())
}
