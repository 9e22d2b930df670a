//! `leasehold config check FILE...`: validates coordinator member configs,
//! escrow node configs and policy files without starting anything or
//! touching the network, and reports every problem with its file, field,
//! line (where the file says it) and what to do.
//!
//! - [`member`]: a member's TOML (`leasehold serve --config`, [`NodeConfig`](crate::NodeConfig)).
//! - [`escrow`](mod@escrow): an escrow node's TOML (`leasehold escrow --config`,
//!   [`EscrowFile`](crate::escrow::config_file::EscrowFile)).
//! - [`policies`]: a policy file (`leasehold policy apply`,
//!   [`PolicyFile`](crate::policy_file::PolicyFile)).
//! - a rate limit configuration in the format of `envoyproxy/ratelimit`
//!   (YAML; `leasehold policy apply`, [`crate::ratelimit_file`]).
//!
//! The words of every finding — the [`FieldPath`] of a field, a
//! [`Problem`] with it, its [`Severity`] — and the line a field is written
//! on come from [`crate::toml_file`], which the files' own parsers use too.
//!
//! Which kind a file is: `--kind`, or else its name and content — a
//! `.yaml` or `.yml` file is a rate limit configuration; in TOML a
//! `[[policy]]` table makes a policy file, a `region` or `coordinators` key
//! an escrow config, anything else a member config. A file is read once; the checks
//! are pure functions of its text (property-tested: no input panics).
//! Files the config names (TLS material) are looked for on this host unless
//! `--skip-files` (checking a config meant for another host).

pub mod escrow;
pub mod field_checks;
pub mod member;
pub mod policies;

pub use field_checks::{key_problems, local_file_problem, rejected_keys, FileLookup};

use std::fmt;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::toml_file::{first_line, locate};
pub use crate::toml_file::{FieldPath, Problem, Severity};

/// Which format a file is checked as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum FileKind {
    /// A coordinator member's config (`leasehold serve --config`).
    Member,
    /// An escrow node's config (`leasehold escrow --config`).
    Escrow,
    /// A policy file (`leasehold policy apply`).
    Policies,
    /// A rate limit configuration of `envoyproxy/ratelimit` (YAML).
    Ratelimit,
}

impl fmt::Display for FileKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FileKind::Member => "member config",
            FileKind::Escrow => "escrow config",
            FileKind::Policies => "policy file",
            FileKind::Ratelimit => "rate limit configuration",
        })
    }
}

/// One finding of the check, placed in its file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// The file.
    pub file: PathBuf,
    /// The field (`""` for the file as a whole), e.g. `policy[1].limit`.
    pub field: String,
    /// The line, when the file says where.
    pub line: Option<usize>,
    /// Error or note.
    pub severity: Severity,
    /// What is wrong.
    pub problem: String,
    /// What to do.
    pub fix: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        let severity = match self.severity {
            Severity::Error => "error",
            Severity::Note => "note",
        };
        write!(f, ": {severity}")?;
        if !self.field.is_empty() {
            write!(f, ": {}", self.field)?;
        }
        write!(f, ": {}\n    fix: {}", self.problem, self.fix)
    }
}

/// What the check found in one file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FileReport {
    /// The file.
    pub file: PathBuf,
    /// What it was checked as (`None` when it could not be read).
    pub kind: Option<FileKind>,
    /// Every finding, errors and notes.
    pub findings: Vec<Finding>,
}

impl FileReport {
    /// Number of errors.
    pub fn errors(&self) -> usize {
        self.findings
            .iter()
            .filter(|f| f.severity == Severity::Error)
            .count()
    }
}

/// Options of a check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CheckOptions {
    /// Check every file as this kind instead of guessing from its content.
    pub kind: Option<FileKind>,
    /// Do not look for the files a config names (TLS material): the config
    /// is meant for another host.
    pub skip_files: bool,
}

/// Reads and checks one file.
pub fn check_file(path: &Path, options: CheckOptions) -> FileReport {
    match std::fs::read_to_string(path) {
        Ok(text) => check_text(path, &text, options, &|file| local_file_problem(file)),
        Err(e) => FileReport {
            file: path.to_path_buf(),
            kind: None,
            findings: vec![Finding {
                file: path.to_path_buf(),
                field: String::new(),
                line: None,
                severity: Severity::Error,
                problem: format!("cannot read the file: {e}"),
                fix: "check the path and its permissions".into(),
            }],
        },
    }
}

/// Checks the text of a file named `path`; `file_problem` says what is
/// wrong with a file the config names (`None`: fine). Pure given it.
pub fn check_text(
    path: &Path,
    text: &str,
    options: CheckOptions,
    file_problem: &dyn Fn(&Path) -> Option<String>,
) -> FileReport {
    let files = FileLookup {
        skip: options.skip_files,
        problem: file_problem,
    };
    let ratelimit = match options.kind {
        Some(kind) => kind == FileKind::Ratelimit,
        None => crate::ratelimit_file::is_ratelimit_file(path),
    };
    if ratelimit {
        let findings = match crate::ratelimit_file::parse(text) {
            Ok(_) => Vec::new(),
            Err(problems) => problems
                .into_iter()
                .map(|p| Finding {
                    file: path.to_path_buf(),
                    field: p.field,
                    line: (p.line > 0).then_some(p.line),
                    severity: Severity::Error,
                    problem: p.problem,
                    fix: p.fix,
                })
                .collect(),
        };
        return FileReport {
            file: path.to_path_buf(),
            kind: Some(FileKind::Ratelimit),
            findings,
        };
    }
    let (kind, problems) = match toml::from_str::<toml::Table>(text) {
        Err(e) => {
            let kind = options.kind;
            let line = e
                .span()
                .map(|span| locate::line_of_offset(text, span.start));
            let finding = Finding {
                file: path.to_path_buf(),
                field: String::new(),
                line,
                severity: Severity::Error,
                problem: format!("not valid TOML: {}", first_line(e.message())),
                fix: "fix the syntax at that line (strings in double quotes, one key = value per line)"
                    .into(),
            };
            return FileReport {
                file: path.to_path_buf(),
                kind,
                findings: vec![finding],
            };
        }
        Ok(table) => {
            let kind = options.kind.unwrap_or_else(|| guess_kind(&table));
            let problems = match kind {
                FileKind::Member => member::check(&table, &files),
                FileKind::Escrow => escrow::check(&table, &files),
                FileKind::Policies => policies::check(&table),
                FileKind::Ratelimit => Vec::new(),
            };
            (kind, problems)
        }
    };
    let findings = problems
        .into_iter()
        .map(|p| Finding {
            file: path.to_path_buf(),
            line: p.field.line_in(text),
            field: p.field.to_string(),
            severity: p.severity,
            problem: p.problem,
            fix: p.fix,
        })
        .collect();
    FileReport {
        file: path.to_path_buf(),
        kind: Some(kind),
        findings,
    }
}

/// The kind a parsed file looks like (see the module doc).
pub fn guess_kind(table: &toml::Table) -> FileKind {
    if table.contains_key("policy") {
        FileKind::Policies
    } else if table.contains_key("region") || table.contains_key("coordinators") {
        FileKind::Escrow
    } else {
        FileKind::Member
    }
}

#[cfg(test)]
mod tests;
