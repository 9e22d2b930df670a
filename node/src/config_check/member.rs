//! A coordinator member's config file, as `leasehold serve --config` reads
//! it ([`NodeConfig`]): unknown and mistyped keys, then every field
//! [`NodeConfig::validate`] refuses (each refused field is reported and set
//! back to its default to look for the next, so the rules stay those of
//! `validate` alone), the TLS choice, and the TLS files.
//!
//! `id`, `listen` and `data_dir` may come from flags (`--id`,
//! `--id-from-hostname`, …) and the TLS settings from flags or
//! environment, so a file without them gets a note, not an error.

use std::path::PathBuf;

use super::field_checks::{key_problems, FileLookup};
use crate::config::{ConfigError, NodeConfig};
use crate::tls::Security;
use crate::toml_file::{FieldPath, Problem};

const EXAMPLE: &str = "deploy/config/node.example.toml";

/// Settings `serve` can take from its command line instead, with the value
/// used to check the rest of the file and the flag that gives them.
const FROM_FLAGS: [(&str, &str, &str); 3] = [
    ("id", "1", "--id N or --id-from-hostname"),
    ("listen", "0.0.0.0:7100", "--listen HOST:PORT"),
    ("data_dir", "/var/lib/leasehold", "--data-dir DIR"),
];

/// Every problem of a member config.
pub fn check(table: &toml::Table, files: &FileLookup<'_>) -> Vec<Problem> {
    let mut problems = key_problems::<NodeConfig>(table, |key| FieldPath::top(key), EXAMPLE);
    let mut usable = table.clone();
    for problem in &problems {
        usable.remove(&problem.field.key);
    }
    for (key, _, flag) in FROM_FLAGS {
        if !usable.contains_key(key) {
            problems.push(Problem::note(
                FieldPath::top(key),
                "not set in the file",
                format!("give it on the command line ({flag}) or set `{key}` here"),
            ));
            if let Some(value) = placeholder(key) {
                usable.insert(key.to_string(), value);
            }
        }
    }
    let defaults = toml::Table::try_from(NodeConfig::default()).unwrap_or_default();
    let mut last_readable = None;
    while let Ok(config) = toml::Value::Table(usable.clone()).try_into::<NodeConfig>() {
        last_readable = Some(config.clone());
        let refused = config
            .validate()
            .and_then(|()| config.raft_config().map(|_| ()));
        match refused {
            Ok(()) => break,
            Err(ConfigError::Invalid { field, problem }) => {
                let fix = if let Some((_, _, flag)) = FROM_FLAGS.iter().find(|(k, ..)| *k == field)
                {
                    format!("set a valid `{field}`, or leave it out and give {flag} when starting")
                } else if table.contains_key(field) {
                    let default = defaults
                        .get(field)
                        .map(|value| format!(" (default {value})"))
                        .unwrap_or_default();
                    format!("set a valid value, or remove `{field}` to use the default{default}")
                } else {
                    format!(
                        "the default of `{field}` does not fit the other values of the file: \
                         set `{field}` explicitly"
                    )
                };
                problems.push(Problem::error(
                    FieldPath::top(field),
                    problem.trim().to_string(),
                    fix,
                ));
                // Reset it and look for the next problem: to the value
                // used for a setting flags may give, else to its default;
                // stop when it is not a key of the file (already the
                // default, or not a field of its own).
                if let Some(value) = placeholder(field) {
                    usable.insert(field.to_string(), value);
                } else if usable.remove(field).is_none() {
                    break;
                }
            }
            Err(other) => {
                problems.push(Problem::error(
                    FieldPath::top(""),
                    other.to_string(),
                    "fix the file",
                ));
                break;
            }
        }
    }
    // TLS is judged on what was read, whatever else is wrong.
    if let Some(config) = last_readable {
        problems.extend(tls_problems(&config, table, files));
    }
    problems
}

/// The value a setting that flags may give is checked with when the file
/// leaves it out (or gets it wrong, to look for further problems).
fn placeholder(key: &str) -> Option<toml::Value> {
    let (_, value, _) = FROM_FLAGS.iter().find(|(k, _, _)| *k == key)?;
    Some(match key {
        "id" => toml::Value::Integer(1),
        _ => toml::Value::String((*value).to_string()),
    })
}

/// The TLS choice (three files or `insecure`) and the files themselves.
fn tls_problems(config: &NodeConfig, table: &toml::Table, files: &FileLookup<'_>) -> Vec<Problem> {
    let named = ["tls_ca", "tls_cert", "tls_key", "insecure"]
        .iter()
        .any(|key| table.contains_key(*key));
    if !named {
        return vec![Problem::note(
            FieldPath::top("tls_ca"),
            "no TLS settings in the file",
            "give --tls-ca/--tls-cert/--tls-key (or LEASEHOLD_TLS_*) when starting, \
             set tls_ca, tls_cert and tls_key here, or insecure = true for a trusted lab",
        )];
    }
    match config.security() {
        Err(error) => vec![Problem::error(
            FieldPath::top("tls_ca"),
            error.to_string(),
            "set all three of tls_ca, tls_cert and tls_key, or insecure = true (not both)",
        )],
        Ok(Security::Insecure) => Vec::new(),
        Ok(Security::MutualTls(_)) => [
            ("tls_ca", &config.tls_ca),
            ("tls_cert", &config.tls_cert),
            ("tls_key", &config.tls_key),
        ]
        .into_iter()
        .filter_map(|(key, path): (&str, &Option<PathBuf>)| {
            files.check(FieldPath::top(key), path.as_deref()?)
        })
        .collect(),
    }
}
