//! An escrow node's config file ([`EscrowFile`]): unknown and mistyped
//! keys (the `[fair_throttle]` table's too), every value
//! [`EscrowFile::problems`] refuses, and the TLS files it names. A file
//! without TLS settings gets a note: the TLS flags or their environment
//! variables may give them.

use std::path::PathBuf;

use super::field_checks::{key_problems, FileLookup};
use crate::escrow::config_file::{EscrowFile, FairThrottleFile};
use crate::tls::Security;
use crate::toml_file::{FieldPath, Problem};

const EXAMPLE: &str = "deploy/config/escrow.example.toml";

/// Every problem of an escrow config.
pub fn check(table: &toml::Table, files: &FileLookup<'_>) -> Vec<Problem> {
    let mut problems = key_problems::<EscrowFile>(table, |key| FieldPath::top(key), EXAMPLE);
    if let Some(toml::Value::Table(fair)) = table.get("fair_throttle") {
        // Its keys are reported one by one instead of the table as a whole.
        problems.retain(|p| p.field.key != "fair_throttle");
        problems.extend(key_problems::<FairThrottleFile>(
            fair,
            |key| FieldPath::in_table("fair_throttle", key),
            EXAMPLE,
        ));
    }
    if !problems.is_empty() {
        // The values can only be judged once every key is readable.
        return problems;
    }
    let file = match toml::Value::Table(table.clone()).try_into::<EscrowFile>() {
        Ok(file) => file,
        Err(e) => {
            return vec![Problem::error(
                FieldPath::top(""),
                e.message().trim().to_string(),
                "fix the file",
            )]
        }
    };
    if !file.names_security() {
        problems.push(Problem::note(
            FieldPath::top("tls_ca"),
            "no TLS settings in the file",
            "give --tls-ca/--tls-cert/--tls-key (or LEASEHOLD_TLS_*) when starting, \
             set tls_ca, tls_cert and tls_key here, or insecure = true for a trusted lab",
        ));
        problems.extend(
            file.problems()
                .into_iter()
                .filter(|p| p.field.key != "tls_ca"),
        );
        return problems;
    }
    problems.extend(file.problems());
    if let Ok(Security::MutualTls(tls)) = file.security_choice() {
        let named: [(&str, PathBuf); 3] = [
            ("tls_ca", tls.ca),
            ("tls_cert", tls.cert),
            ("tls_key", tls.key),
        ];
        problems.extend(
            named
                .iter()
                .filter_map(|(key, path)| files.check(FieldPath::top(*key), path)),
        );
    }
    problems
}
