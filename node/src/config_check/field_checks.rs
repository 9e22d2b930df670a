//! The checks every kind of file shares: the keys a file's type refuses
//! ([`key_problems`]) and the files a config names ([`FileLookup`]).

use std::path::Path;

use serde::de::DeserializeOwned;

use crate::toml_file::{first_line, FieldPath, Problem};

/// How the checks look at files a config names.
pub struct FileLookup<'a> {
    /// Whether files are not looked at (`--skip-files`).
    pub skip: bool,
    /// What is wrong with a file, if anything.
    pub problem: &'a dyn Fn(&Path) -> Option<String>,
}

impl FileLookup<'_> {
    /// An error for `field` when the file it names is unusable here.
    pub fn check(&self, field: FieldPath, path: &Path) -> Option<Problem> {
        if self.skip {
            return None;
        }
        (self.problem)(path).map(|why| {
            Problem::error(
                field,
                format!("{}: {why}", path.display()),
                "fix the path, or make the file (`leasehold certs mint`); \
                 --skip-files checks a config meant for another host",
            )
        })
    }
}

/// What is wrong with a PEM file on this host, if anything.
pub fn local_file_problem(path: &Path) -> Option<String> {
    match std::fs::read(path) {
        Err(e) => Some(format!("cannot be read ({e})")),
        Ok(bytes) if !bytes.windows(10).any(|w| w == b"-----BEGIN") => {
            Some("is not a PEM file (no -----BEGIN line)".into())
        }
        Ok(_) => None,
    }
}

/// The keys of `table` that `T` (every field optional, unknown fields
/// refused) does not accept on their own — unknown keys and values of the
/// wrong type — with the deserializer's explanation.
pub fn rejected_keys<T: DeserializeOwned>(table: &toml::Table) -> Vec<(String, String)> {
    table
        .iter()
        .filter_map(|(key, value)| {
            let mut alone = toml::Table::new();
            alone.insert(key.clone(), value.clone());
            toml::Value::Table(alone)
                .try_into::<T>()
                .err()
                .map(|e| (key.clone(), first_line(e.message()).to_string()))
        })
        .collect()
}

/// An error for each key [`rejected_keys`] found, placed by `place`.
pub fn key_problems<T: DeserializeOwned>(
    table: &toml::Table,
    place: impl Fn(&str) -> FieldPath,
    example: &str,
) -> Vec<Problem> {
    rejected_keys::<T>(table)
        .into_iter()
        .map(|(key, message)| {
            let unknown = message.starts_with("unknown field");
            let problem = if unknown {
                let known = message
                    .split_once("expected")
                    .map(|(_, rest)| format!("; known fields: {}", rest.trim()))
                    .unwrap_or_default();
                format!("unknown field{known}")
            } else {
                message
            };
            let fix = if unknown {
                format!("remove it or fix its spelling (see {example})")
            } else {
                format!("give it a value of the right type (see {example})")
            };
            Problem::error(place(&key), problem, fix)
        })
        .collect()
}
