//! A policy file ([`PolicyFile`]): unknown and mistyped keys of the file and
//! of each `[[policy]]` table, then every value [`PolicyFile::problems`]
//! refuses (the rules of `leasehold policy set`).

use super::field_checks::key_problems;
use crate::policy_file::{PolicyEntry, PolicyFile};
use crate::toml_file::{FieldPath, Problem};

const EXAMPLE: &str = "deploy/config/policies.example.toml";

/// Every problem of a policy file.
pub fn check(table: &toml::Table) -> Vec<Problem> {
    let mut problems = Vec::new();
    for key in table.keys().filter(|key| *key != "policy") {
        problems.push(Problem::error(
            FieldPath::top(key.as_str()),
            "unknown field; a policy file holds only [[policy]] tables",
            format!("remove it, or move it into a [[policy]] table (see {EXAMPLE})"),
        ));
    }
    match table.get("policy") {
        None => {}
        Some(toml::Value::Array(entries)) => {
            for (index, entry) in entries.iter().enumerate() {
                match entry {
                    toml::Value::Table(entry) => problems.extend(key_problems::<PolicyEntry>(
                        entry,
                        |key| FieldPath::in_entry("policy", index, key),
                        EXAMPLE,
                    )),
                    _ => problems.push(Problem::error(
                        FieldPath::in_entry("policy", index, ""),
                        "is not a table",
                        "write each policy as a [[policy]] table",
                    )),
                }
            }
        }
        Some(_) => problems.push(Problem::error(
            FieldPath::top("policy"),
            "is not a list of tables",
            "write each policy as a [[policy]] table",
        )),
    }
    if !problems.is_empty() {
        return problems;
    }
    match toml::Value::Table(table.clone()).try_into::<PolicyFile>() {
        Ok(file) => file.problems(),
        Err(e) => vec![Problem::error(
            FieldPath::top(""),
            e.message().trim().to_string(),
            "fix the file",
        )],
    }
}
