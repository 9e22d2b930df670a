//! Reading YAML files as trees, with the small conveniences the checks need.

use std::path::Path;

use anyhow::{anyhow, Context, Result};
use yaml_rust2::{Yaml, YamlLoader};

/// Every document of a YAML file.
pub fn load_documents(path: &Path) -> Result<Vec<Yaml>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    YamlLoader::load_from_str(&text).map_err(|e| anyhow!("{}: {e}", path.display()))
}

/// A string field, or an error naming where it was looked for.
pub fn string<'a>(node: &'a Yaml, what: &str) -> Result<&'a str> {
    node.as_str()
        .ok_or_else(|| anyhow!("{what} is not a string: {node:?}"))
}

/// The entries of a list (none when the field is absent).
pub fn list(node: &Yaml) -> &[Yaml] {
    node.as_vec().map_or(&[], Vec::as_slice)
}

/// The string entries of a list (non-strings skipped).
pub fn strings(node: &Yaml) -> Vec<String> {
    list(node)
        .iter()
        .filter_map(|item| item.as_str().map(str::to_string))
        .collect()
}

/// A mapping's string keys and values (non-string entries skipped; numbers
/// rendered as text).
pub fn string_map(node: &Yaml) -> Vec<(String, String)> {
    node.as_hash()
        .map(|hash| {
            hash.iter()
                .filter_map(|(k, v)| {
                    let value = match v {
                        Yaml::String(s) => s.clone(),
                        Yaml::Integer(i) => i.to_string(),
                        Yaml::Boolean(b) => b.to_string(),
                        _ => return None,
                    };
                    Some((k.as_str()?.to_string(), value))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Whether every label of `selector` is among `labels` with the same value.
pub fn selects(selector: &[(String, String)], labels: &[(String, String)]) -> bool {
    !selector.is_empty() && selector.iter().all(|pair| labels.contains(pair))
}

/// The value following `flag` in an argument list.
pub fn flag_value<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
}

/// The port of a `HOST:PORT` address.
pub fn port_of(addr: &str) -> Result<u16> {
    addr.rsplit_once(':')
        .and_then(|(_, port)| port.parse().ok())
        .ok_or_else(|| anyhow!("{addr:?} is not HOST:PORT"))
}

#[test]
fn selection_needs_every_label_of_the_selector() {
    let pair = |k: &str, v: &str| (k.to_string(), v.to_string());
    let labels = [pair("app", "x"), pair("tier", "db")];
    assert!(selects(&[pair("app", "x")], &labels));
    assert!(!selects(&[pair("app", "x"), pair("tier", "web")], &labels));
    assert!(
        !selects(&[], &labels),
        "an empty selector selects nothing here"
    );
}
