//! `deploy/systemd`: the units parse, run as a user the sysusers file
//! creates, and do not treat required environment as optional; where the
//! systemd tools are installed, they accept the files too.

use std::path::Path;
use std::process::Command;

use anyhow::{bail, ensure, Context, Result};

use crate::deploy_dir;

/// One `Key=Value` of a unit file, with its section.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Setting {
    section: String,
    key: String,
    value: String,
}

/// Parses a unit file: `[Section]` headers, `Key=Value` lines, `#`/`;`
/// comments, and backslash line continuations. Anything else is an error.
fn parse_unit(text: &str) -> Result<Vec<Setting>> {
    let mut settings = Vec::new();
    let mut section = String::new();
    let mut pending = String::new();
    for (number, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if pending.is_empty() && (line.is_empty() || line.starts_with('#') || line.starts_with(';'))
        {
            continue;
        }
        if let Some(continued) = line.strip_suffix('\\') {
            pending.push_str(continued);
            pending.push(' ');
            continue;
        }
        let line = format!("{pending}{line}");
        pending.clear();
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.to_string();
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            bail!(
                "line {}: neither a section nor Key=Value: {raw:?}",
                number + 1
            );
        };
        ensure!(
            !section.is_empty(),
            "line {}: a setting before any section",
            number + 1
        );
        settings.push(Setting {
            section: section.clone(),
            key: key.trim().to_string(),
            value: value.trim().to_string(),
        });
    }
    ensure!(pending.is_empty(), "the file ends inside a continued line");
    Ok(settings)
}

fn get<'a>(settings: &'a [Setting], section: &str, key: &str) -> Vec<&'a str> {
    settings
        .iter()
        .filter(|s| s.section == section && s.key == key)
        .map(|s| s.value.as_str())
        .collect()
}

const UNITS: [&str; 2] = ["leasehold.service", "leasehold-escrow.service"];

fn unit(name: &str) -> Result<Vec<Setting>> {
    let path = deploy_dir().join("systemd").join(name);
    let text = std::fs::read_to_string(&path).with_context(|| format!("{}", path.display()))?;
    parse_unit(&text).with_context(|| name.to_string())
}

/// Users (`u NAME …`) a sysusers.d file creates.
fn sysusers() -> Result<Vec<String>> {
    let text = std::fs::read_to_string(deploy_dir().join("systemd/leasehold.sysusers"))?;
    Ok(text
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|l| {
            let mut fields = l.split_whitespace();
            (fields.next() == Some("u")).then(|| fields.next().map(str::to_string))?
        })
        .collect())
}

/// The `${VAR}`s a command line uses.
fn variables(command: &str) -> Vec<String> {
    command
        .split("${")
        .skip(1)
        .filter_map(|rest| rest.split_once('}').map(|(name, _)| name.to_string()))
        .collect()
}

#[test]
fn units_parse_and_run_the_binary_as_a_created_user() -> Result<()> {
    let users = sysusers()?;
    ensure!(users == ["leasehold"], "sysusers creates {users:?}");
    for name in UNITS {
        let settings = unit(name)?;
        ensure!(
            !get(&settings, "Unit", "Description").is_empty(),
            "{name}: no Description"
        );
        ensure!(
            get(&settings, "Install", "WantedBy") == ["multi-user.target"],
            "{name}: WantedBy"
        );
        let exec = get(&settings, "Service", "ExecStart");
        ensure!(
            exec.len() == 1 && exec[0].starts_with("/usr/local/bin/leasehold "),
            "{name}: ExecStart {exec:?}"
        );
        for key in ["User", "Group"] {
            let value = get(&settings, "Service", key);
            ensure!(
                value.len() == 1 && users.iter().any(|u| u == value[0]),
                "{name}: {key}={value:?} is not created by leasehold.sysusers"
            );
        }
    }
    Ok(())
}

#[test]
fn environment_the_command_needs_is_required_and_documented() -> Result<()> {
    let mut checked = 0;
    for name in UNITS {
        let settings = unit(name)?;
        let exec = get(&settings, "Service", "ExecStart").concat();
        let needed = variables(&exec);
        if needed.is_empty() {
            continue;
        }
        let files = get(&settings, "Service", "EnvironmentFile");
        ensure!(
            !files.is_empty(),
            "{name}: ExecStart uses {needed:?} but no EnvironmentFile sets them"
        );
        for file in &files {
            ensure!(
                !file.starts_with('-'),
                "{name}: EnvironmentFile={file} is optional, but ExecStart needs {needed:?}"
            );
            let example = Path::new(file)
                .file_name()
                .map(|f| format!("{}.example", f.to_string_lossy()))
                .context("EnvironmentFile names a file")?;
            let text = std::fs::read_to_string(deploy_dir().join("systemd").join(&example))
                .with_context(|| format!("{name}: no deploy/systemd/{example} documents {file}"))?;
            for variable in &needed {
                ensure!(
                    text.lines().any(|l| l.starts_with(&format!("{variable}="))),
                    "{example} does not set {variable}"
                );
            }
            checked += needed.len();
        }
    }
    ensure!(checked >= 3, "the escrow unit's variables were not checked");
    Ok(())
}

/// Runs a systemd tool when it is installed; `None` when it is not.
fn systemd_tool(tool: &str, args: &[&std::ffi::OsStr]) -> Result<Option<std::process::Output>> {
    match Command::new(tool).args(args).output() {
        Ok(output) => Ok(Some(output)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            eprintln!("{tool} is not installed: only the static checks ran");
            Ok(None)
        }
        Err(e) => Err(e).with_context(|| format!("running {tool}")),
    }
}

#[test]
fn systemd_analyze_verify_accepts_the_units() -> Result<()> {
    // verify checks that ExecStart's binary exists: point it at the built one.
    let dir = tempfile::tempdir()?;
    let mut paths = Vec::new();
    for name in UNITS {
        let text = std::fs::read_to_string(deploy_dir().join("systemd").join(name))?;
        let path = dir.path().join(name);
        std::fs::write(
            &path,
            text.replace("/usr/local/bin/leasehold", env!("CARGO_BIN_EXE_leasehold")),
        )?;
        paths.push(path);
    }
    let mut args = vec![std::ffi::OsStr::new("verify")];
    args.extend(paths.iter().map(|p| p.as_os_str()));
    let Some(output) = systemd_tool("systemd-analyze", &args)? else {
        return Ok(());
    };
    let stderr = String::from_utf8_lossy(&output.stderr);
    ensure!(
        output.status.success() && stderr.trim().is_empty(),
        "systemd-analyze verify: {stderr}"
    );
    Ok(())
}

#[test]
fn sysusers_and_tmpfiles_create_the_user_and_directories() -> Result<()> {
    let root = tempfile::tempdir()?;
    std::fs::create_dir_all(root.path().join("etc"))?;
    let root_arg = format!("--root={}", root.path().display());
    let sysusers_file = deploy_dir().join("systemd/leasehold.sysusers");
    let Some(output) = systemd_tool(
        "systemd-sysusers",
        &[root_arg.as_ref(), sysusers_file.as_os_str()],
    )?
    else {
        return Ok(());
    };
    ensure!(
        output.status.success(),
        "systemd-sysusers: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let passwd = std::fs::read_to_string(root.path().join("etc/passwd"))?;
    ensure!(
        passwd
            .lines()
            .any(|l| l.starts_with("leasehold:") && l.contains(":/var/lib/leasehold:")),
        "no leasehold user with home /var/lib/leasehold: {passwd}"
    );
    // Creating root-owned directories with another group needs root.
    let probe = root.path().join("owner-probe");
    std::fs::write(&probe, "")?;
    if std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(&probe)?) != 0 {
        eprintln!("not root: systemd-tmpfiles not run");
        return Ok(());
    }
    let tmpfiles_file = deploy_dir().join("systemd/leasehold.tmpfiles");
    let output = Command::new("systemd-tmpfiles")
        .arg(&root_arg)
        .arg("--create")
        .arg(&tmpfiles_file)
        .output()
        .context("running systemd-tmpfiles")?;
    ensure!(
        output.status.success(),
        "systemd-tmpfiles: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    ensure!(root.path().join("etc/leasehold/certs").is_dir());
    Ok(())
}

#[test]
fn the_unit_parser_reads_continuations_and_refuses_garbage() {
    let settings = parse_unit("# c\n[Service]\nExecStart=/bin/a \\\n  --b\n; c\nUser=x\n").unwrap();
    assert_eq!(get(&settings, "Service", "ExecStart"), ["/bin/a  --b"]);
    assert_eq!(get(&settings, "Service", "User"), ["x"]);
    assert!(parse_unit("[Service]\nnot a setting\n").is_err());
    assert!(parse_unit("User=x\n").is_err());
    assert_eq!(variables("a ${X} b ${Y_Z}"), ["X", "Y_Z"]);
}
