//! `leasehold config check FILE...`: checks member configs, escrow configs
//! and policy files without starting anything or touching the network
//! (see [`crate::config_check`]). Prints every problem with its file, line,
//! field and fix (or one JSON document with `--output json`); exits 1 when
//! any file has an error, 0 otherwise (notes do not fail).

use std::path::PathBuf;

use clap::{Args, Subcommand};
use serde_json::json;

use super::error::CliError;
use super::output::OutputFormat;
use crate::config_check::{check_file, CheckOptions, FileKind, FileReport, Severity};

/// Options of `leasehold config`.
#[derive(Debug, Clone, Args)]
pub struct ConfigArgs {
    /// Which config command.
    #[command(subcommand)]
    pub command: ConfigCommand,
}

/// The config commands.
#[derive(Debug, Clone, Subcommand)]
pub enum ConfigCommand {
    /// Check member configs, escrow configs and policy files; exit 1 on any error.
    Check(CheckArgs),
}

/// Options of `config check`.
#[derive(Debug, Clone, Args)]
pub struct CheckArgs {
    /// The files to check.
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
    /// Check every file as this kind (default: guessed from each file's content).
    #[arg(long, value_enum)]
    pub kind: Option<FileKind>,
    /// Do not look for the files a config names (TLS material): it is meant for another host.
    #[arg(long)]
    pub skip_files: bool,
    /// Output format.
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
}

/// Runs `leasehold config …`.
pub fn run(args: ConfigArgs) -> Result<(), CliError> {
    match args.command {
        ConfigCommand::Check(args) => check(args),
    }
}

fn check(args: CheckArgs) -> Result<(), CliError> {
    let options = CheckOptions {
        kind: args.kind,
        skip_files: args.skip_files,
    };
    let reports: Vec<FileReport> = args
        .files
        .iter()
        .map(|file| check_file(file, options))
        .collect();
    let errors: usize = reports.iter().map(FileReport::errors).sum();
    let failed = reports.iter().filter(|r| r.errors() > 0).count();
    match args.output {
        OutputFormat::Json => println!("{}", report_json(&reports, errors)),
        OutputFormat::Text => print!("{}", report_text(&reports)),
    }
    if errors > 0 {
        return Err(CliError::Failed(format!(
            "{errors} error(s) in {failed} of {} file(s)",
            reports.len()
        )));
    }
    Ok(())
}

/// The reports as one JSON document.
pub fn report_json(reports: &[FileReport], errors: usize) -> serde_json::Value {
    json!({
        "ok": errors == 0,
        "errors": errors,
        "files": reports.iter().map(|r| json!({
            "file": r.file,
            "kind": r.kind,
            "errors": r.errors(),
            "findings": r.findings,
        })).collect::<Vec<_>>(),
    })
}

/// The reports as text: each finding, then one line per file.
pub fn report_text(reports: &[FileReport]) -> String {
    let mut text = String::new();
    for report in reports {
        for finding in &report.findings {
            text.push_str(&format!("{finding}\n"));
        }
        let kind = report
            .kind
            .map(|k| k.to_string())
            .unwrap_or_else(|| "file".into());
        let notes = report
            .findings
            .iter()
            .filter(|f| f.severity == Severity::Note)
            .count();
        let verdict = match report.errors() {
            0 => "ok".to_string(),
            n => format!("{n} error(s)"),
        };
        let notes = if notes > 0 {
            format!(", {notes} note(s)")
        } else {
            String::new()
        };
        text.push_str(&format!(
            "{}: {verdict} ({kind}{notes})\n",
            report.file.display()
        ));
    }
    text
}
