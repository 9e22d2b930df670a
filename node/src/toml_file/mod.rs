//! The node's TOML files — an escrow node's config
//! ([`EscrowFile`](crate::escrow::config_file::EscrowFile)) and a policy
//! file ([`PolicyFile`](crate::policy_file::PolicyFile)): one loader,
//! [`load`], whose error ([`TomlFileError`]) names the file, the line and
//! column and the field; and what a check of their values says: a
//! [`Problem`] with a [`FieldPath`], of a [`Severity`].
//!
//! - [`locate`]: the line a field is written on, and the field written at
//!   a place of the text.
//!
//! `leasehold config check` ([`crate::config_check`]) places the problems
//! of every kind of file in it.

pub mod locate;

use std::fmt;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Serialize;

use locate::Section;

/// Reads and parses the TOML file at `path` as a `T` (syntax, unknown keys
/// and types; the values are for `T`'s own checks).
pub fn load<T: DeserializeOwned>(path: &Path) -> Result<T, TomlFileError> {
    let text = std::fs::read_to_string(path).map_err(|source| TomlFileError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    toml::from_str(&text).map_err(|e| {
        let place = e.span().map(|span| {
            let (line, column) = locate::line_and_column(&text, span.start);
            let (section, key) = locate::field_at(&text, span.start);
            (line, column, FieldPath::at(section, key.unwrap_or("")))
        });
        let (line, column, field) = match place {
            Some((line, column, field)) => (Some(line), Some(column), Some(field)),
            None => (None, None, None),
        };
        TomlFileError::Invalid {
            path: path.to_path_buf(),
            line,
            column,
            field: field
                .map(|field| field.to_string())
                .filter(|field| !field.is_empty()),
            message: first_line(e.message()).to_string(),
        }
    })
}

/// Why [`load`] refused a file.
#[derive(Debug, thiserror::Error)]
pub enum TomlFileError {
    /// The file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The IO error.
        source: std::io::Error,
    },
    /// The file is not valid TOML for what it should hold.
    #[error("{}", invalid_message(path, *line, *column, field.as_deref(), message))]
    Invalid {
        /// The file.
        path: PathBuf,
        /// 1-based line of the error, when the parser says where.
        line: Option<usize>,
        /// 1-based column (in characters) of the error on its line.
        column: Option<usize>,
        /// The field written there (`fair_throttle.prefixes`,
        /// `policy[1].limit`), when there is one.
        field: Option<String>,
        /// The parser's explanation.
        message: String,
    },
}

/// `FILE:LINE:COLUMN: FIELD: MESSAGE`, and where every problem is listed.
fn invalid_message(
    path: &Path,
    line: Option<usize>,
    column: Option<usize>,
    field: Option<&str>,
    message: &str,
) -> String {
    let mut text = path.display().to_string();
    if let Some(line) = line {
        text.push_str(&format!(":{line}"));
        if let Some(column) = column {
            text.push_str(&format!(":{column}"));
        }
    }
    if let Some(field) = field {
        text.push_str(&format!(": {field}"));
    }
    format!(
        "{text}: {message} (`leasehold config check {}` lists every problem)",
        path.display()
    )
}

/// The first line of a parser's message, trimmed.
pub fn first_line(message: &str) -> &str {
    message.lines().next().unwrap_or(message).trim()
}

/// How serious a finding is: errors fail the check, notes do not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// The file cannot work as written.
    Error,
    /// Worth knowing (e.g. a setting the command line must then give).
    Note,
}

/// Where a field lives: its table and key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldPath {
    /// `None`: top level; `Some((name, None))`: `[name]`;
    /// `Some((name, Some(i)))`: the i-th `[[name]]`.
    pub table: Option<(String, Option<usize>)>,
    /// The key (empty: the table itself).
    pub key: String,
}

impl FieldPath {
    /// A top-level key.
    pub fn top(key: impl Into<String>) -> Self {
        FieldPath {
            table: None,
            key: key.into(),
        }
    }

    /// A key of the `[table]`.
    pub fn in_table(table: &str, key: impl Into<String>) -> Self {
        FieldPath {
            table: Some((table.to_string(), None)),
            key: key.into(),
        }
    }

    /// A key of the `index`-th `[[table]]`.
    pub fn in_entry(table: &str, index: usize, key: impl Into<String>) -> Self {
        FieldPath {
            table: Some((table.to_string(), Some(index))),
            key: key.into(),
        }
    }

    /// The field `key` of `section` (an empty key: the table itself).
    pub fn at(section: Section<'_>, key: &str) -> Self {
        match section {
            Section::Top => FieldPath::top(key),
            Section::Table(name) => FieldPath::in_table(name, key),
            Section::ArrayEntry(name, index) => FieldPath::in_entry(name, index, key),
        }
    }

    fn section(&self) -> Section<'_> {
        match &self.table {
            None => Section::Top,
            Some((name, None)) => Section::Table(name),
            Some((name, Some(index))) => Section::ArrayEntry(name, *index),
        }
    }

    /// The line where the field (or its table) is written in `text`.
    pub fn line_in(&self, text: &str) -> Option<usize> {
        let key = (!self.key.is_empty()).then_some(self.key.as_str());
        locate::line_of(text, self.section(), key)
            .or_else(|| locate::line_of(text, self.section(), None))
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.table {
            None => write!(f, "{}", self.key),
            Some((name, index)) => {
                write!(f, "{name}")?;
                if let Some(index) = index {
                    write!(f, "[{index}]")?;
                }
                if !self.key.is_empty() {
                    write!(f, ".{}", self.key)?;
                }
                Ok(())
            }
        }
    }
}

/// One problem of a file's content, before it is placed in the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The field it is about.
    pub field: FieldPath,
    /// What is wrong.
    pub problem: String,
    /// What to do about it.
    pub fix: String,
    /// Error or note.
    pub severity: Severity,
}

impl Problem {
    /// An error about `field`.
    pub fn error(field: FieldPath, problem: impl Into<String>, fix: impl Into<String>) -> Self {
        Problem {
            field,
            problem: problem.into(),
            fix: fix.into(),
            severity: Severity::Error,
        }
    }

    /// A note about `field`.
    pub fn note(field: FieldPath, problem: impl Into<String>, fix: impl Into<String>) -> Self {
        Problem {
            severity: Severity::Note,
            ..Problem::error(field, problem, fix)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Sample {
        region: Option<String>,
        fair_throttle: Option<SampleTable>,
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct SampleTable {
        prefixes: Vec<String>,
    }

    fn refusal(text: &str) -> String {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.toml");
        std::fs::write(&path, text).unwrap();
        let error = load::<Sample>(&path).unwrap_err().to_string();
        error.replace(&path.display().to_string(), "FILE")
    }

    #[test]
    fn a_refused_file_is_named_with_its_line_column_and_field() {
        let wrong_type = refusal("region = \"eu\"\n[fair_throttle]\nprefixes = 3\n");
        assert!(
            wrong_type.starts_with("FILE:3:12: fair_throttle.prefixes: invalid type"),
            "{wrong_type}"
        );
        assert!(
            wrong_type.ends_with("(`leasehold config check FILE` lists every problem)"),
            "{wrong_type}"
        );
        let unknown = refusal("regoin = \"eu\"\n");
        assert!(
            unknown.starts_with("FILE:1:1: regoin: unknown field `regoin`"),
            "{unknown}"
        );
        let missing = std::path::Path::new("/nonexistent/leasehold.toml");
        let unreadable = load::<Sample>(missing).unwrap_err().to_string();
        assert!(
            unreadable.starts_with("cannot read /nonexistent/leasehold.toml: "),
            "{unreadable}"
        );
    }
}
