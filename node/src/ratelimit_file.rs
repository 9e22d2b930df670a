//! Rate limit configuration files in the format of `envoyproxy/ratelimit`
//! (YAML: `domain`, nested `descriptors` of `key`, `value`, `rate_limit`,
//! `shadow_mode`, `detailed_metric`), read into
//! [`DomainConfig`](leasehold_core::rls::DomainConfig) with every problem
//! reported at its line, for `leasehold config check` and `leasehold
//! policy apply` (which sets the policies the file stands for:
//! [`DomainConfig::policies`](leasehold_core::rls::DomainConfig::policies)).
//!
//! Supported as `envoyproxy/ratelimit` documents them: `domain`;
//! `descriptors` (nested to any depth); `key`; `value` (a trailing `*` makes
//! it a prefix pattern); `rate_limit` with `unit` (`second`, `minute`,
//! `hour`, `day`) and `requests_per_unit`, or `unlimited: true`, and `name`
//! and `replaces: [{name}]`; `shadow_mode`; `detailed_metric`. Anything
//! else is refused by name with the list of what is supported, as are
//! duplicate rules (same key and value at one level), `replaces` naming no
//! rule, `unlimited` with a unit or count, and YAML anchors and aliases.

use std::path::Path;

use leasehold_core::rls::{
    rule_prefix, DescriptorRule, DomainConfig, Quota, RateLimit, Unit, ValueMatch,
    MAX_RULE_PREFIX_BYTES,
};
use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::Marker;

/// One problem of a file, at its line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RatelimitProblem {
    /// 1-based line (0 when the file gives none).
    pub line: usize,
    /// Where in the document (`descriptors[0].rate_limit.unit`).
    pub field: String,
    /// What is wrong.
    pub problem: String,
    /// What to do.
    pub fix: String,
}

impl std::fmt::Display for RatelimitProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "line {}: {}: {} ({})",
            self.line, self.field, self.problem, self.fix
        )
    }
}

/// A YAML node with the line it starts on.
#[derive(Debug, Clone, PartialEq)]
struct Node {
    line: usize,
    value: Value,
}

#[derive(Debug, Clone, PartialEq)]
enum Value {
    Scalar(String),
    Sequence(Vec<Node>),
    /// Keys (with their lines) and values, in file order.
    Mapping(Vec<(String, usize, Node)>),
}

/// Builds [`Node`]s from parser events.
#[derive(Default)]
struct TreeBuilder {
    /// Open collections: the node so far and, for a mapping, a key waiting
    /// for its value.
    stack: Vec<(Node, Option<(String, usize)>)>,
    documents: Vec<Node>,
    problem: Option<(usize, String)>,
}

impl TreeBuilder {
    fn push_value(&mut self, node: Node) {
        let Some((parent, pending_key)) = self.stack.last_mut() else {
            self.documents.push(node);
            return;
        };
        match &mut parent.value {
            Value::Sequence(items) => items.push(node),
            Value::Mapping(entries) => match pending_key.take() {
                Some((key, line)) => entries.push((key, line, node)),
                None => match node.value {
                    Value::Scalar(key) => *pending_key = Some((key, node.line)),
                    _ => {
                        self.problem.get_or_insert((
                            node.line,
                            "a mapping key must be a plain scalar".into(),
                        ));
                    }
                },
            },
            Value::Scalar(_) => {}
        }
    }
}

impl MarkedEventReceiver for TreeBuilder {
    fn on_event(&mut self, event: Event, mark: Marker) {
        let line = mark.line();
        match event {
            Event::Scalar(text, _, anchor, _) => {
                if anchor > 0 {
                    self.problem
                        .get_or_insert((line, "YAML anchors are not supported".into()));
                }
                self.push_value(Node {
                    line,
                    value: Value::Scalar(text),
                });
            }
            Event::SequenceStart(anchor, _) | Event::MappingStart(anchor, _) => {
                if anchor > 0 {
                    self.problem
                        .get_or_insert((line, "YAML anchors are not supported".into()));
                }
                let value = if matches!(event, Event::SequenceStart(..)) {
                    Value::Sequence(Vec::new())
                } else {
                    Value::Mapping(Vec::new())
                };
                self.stack.push((Node { line, value }, None));
            }
            Event::SequenceEnd | Event::MappingEnd => {
                if let Some((node, _)) = self.stack.pop() {
                    self.push_value(node);
                }
            }
            Event::Alias(_) => {
                self.problem
                    .get_or_insert((line, "YAML aliases are not supported".into()));
            }
            _ => {}
        }
    }
}

/// The document of `text`, or the syntax problem.
fn parse_yaml(text: &str) -> Result<Option<Node>, RatelimitProblem> {
    let mut builder = TreeBuilder::default();
    let mut parser = Parser::new_from_str(text);
    parser
        .load(&mut builder, true)
        .map_err(|e| RatelimitProblem {
            line: e.marker().line(),
            field: String::new(),
            problem: format!("not valid YAML: {}", e.info()),
            fix: "fix the syntax at that line (indentation, `key: value`, `- ` for list items)"
                .into(),
        })?;
    if let Some((line, problem)) = builder.problem {
        return Err(RatelimitProblem {
            line,
            field: String::new(),
            problem,
            fix: "write the values out where they are used".into(),
        });
    }
    if builder.documents.len() > 1 {
        return Err(RatelimitProblem {
            line: builder.documents[1].line,
            field: String::new(),
            problem: "more than one YAML document".into(),
            fix: "one domain per file (envoyproxy/ratelimit reads one document per file too)"
                .into(),
        });
    }
    Ok(builder.documents.pop())
}

/// Fields a descriptor may have.
const DESCRIPTOR_FIELDS: &[&str] = &[
    "key",
    "value",
    "rate_limit",
    "shadow_mode",
    "detailed_metric",
    "descriptors",
];
/// Fields a `rate_limit` may have.
const RATE_LIMIT_FIELDS: &[&str] = &["unit", "requests_per_unit", "unlimited", "name", "replaces"];

/// Collects problems while reading a document.
struct Reader {
    problems: Vec<RatelimitProblem>,
}

impl Reader {
    fn problem(
        &mut self,
        line: usize,
        field: &str,
        problem: impl Into<String>,
        fix: impl Into<String>,
    ) {
        self.problems.push(RatelimitProblem {
            line,
            field: field.to_string(),
            problem: problem.into(),
            fix: fix.into(),
        });
    }

    /// The entries of a mapping node, with unknown keys reported.
    fn mapping<'n>(
        &mut self,
        node: &'n Node,
        field: &str,
        allowed: &[&str],
    ) -> Option<&'n [(String, usize, Node)]> {
        let Value::Mapping(entries) = &node.value else {
            self.problem(
                node.line,
                field,
                "must be a mapping (`key: value` lines)",
                "see docs/envoy.md for the format",
            );
            return None;
        };
        for (key, line, _) in entries {
            if !allowed.contains(&key.as_str()) {
                self.problem(
                    *line,
                    &join(field, key),
                    format!("unknown field {key:?}"),
                    format!("supported here: {}", allowed.join(", ")),
                );
            }
        }
        let mut seen: Vec<&str> = Vec::new();
        for (key, line, _) in entries {
            if seen.contains(&key.as_str()) {
                self.problem(*line, &join(field, key), "appears twice", "keep one");
            }
            seen.push(key);
        }
        Some(entries)
    }

    fn string(&mut self, node: &Node, field: &str) -> Option<String> {
        match &node.value {
            Value::Scalar(text) => Some(text.clone()),
            _ => {
                self.problem(node.line, field, "must be a string", "write a plain value");
                None
            }
        }
    }

    fn boolean(&mut self, node: &Node, field: &str) -> Option<bool> {
        match &node.value {
            Value::Scalar(text) if text == "true" => Some(true),
            Value::Scalar(text) if text == "false" => Some(false),
            _ => {
                self.problem(
                    node.line,
                    field,
                    "must be true or false",
                    "write true or false",
                );
                None
            }
        }
    }

    fn descriptors(&mut self, node: &Node, field: &str) -> Vec<DescriptorRule> {
        let Value::Sequence(items) = &node.value else {
            self.problem(
                node.line,
                field,
                "must be a list (`- key: …` items)",
                "start each descriptor with `- `",
            );
            return Vec::new();
        };
        let mut rules: Vec<DescriptorRule> = Vec::new();
        for (index, item) in items.iter().enumerate() {
            let field = format!("{field}[{index}]");
            if let Some(rule) = self.descriptor(item, &field) {
                if rules
                    .iter()
                    .any(|other| other.key == rule.key && other.value == rule.value)
                {
                    self.problem(
                        item.line,
                        &field,
                        format!(
                            "a second rule for key {:?} with the same value at this level",
                            rule.key
                        ),
                        "merge the two rules (only one of them could ever match)",
                    );
                }
                rules.push(rule);
            }
        }
        rules
    }

    fn descriptor(&mut self, node: &Node, field: &str) -> Option<DescriptorRule> {
        let entries = self.mapping(node, field, DESCRIPTOR_FIELDS)?;
        let get = |name: &str| {
            entries
                .iter()
                .find(|(k, _, _)| k == name)
                .map(|(_, _, n)| n)
        };
        let key = match get("key") {
            Some(node) => self.string(node, &join(field, "key")),
            None => {
                self.problem(
                    node.line,
                    &join(field, "key"),
                    "is required",
                    "add `key: <descriptor key>`",
                );
                None
            }
        };
        if key.as_deref() == Some("") {
            self.problem(
                node.line,
                &join(field, "key"),
                "must not be empty",
                "name the descriptor key",
            );
        }
        let value = match get("value") {
            Some(node) => self.string(node, &join(field, "value")),
            None => None,
        };
        let rate_limit =
            get("rate_limit").and_then(|n| self.rate_limit(n, &join(field, "rate_limit")));
        let shadow_mode = get("shadow_mode")
            .and_then(|n| self.boolean(n, &join(field, "shadow_mode")))
            .unwrap_or(false);
        let detailed_metric = get("detailed_metric")
            .and_then(|n| self.boolean(n, &join(field, "detailed_metric")))
            .unwrap_or(false);
        let descriptors = get("descriptors")
            .map(|n| self.descriptors(n, &join(field, "descriptors")))
            .unwrap_or_default();
        Some(DescriptorRule {
            key: key?,
            value: ValueMatch::of(value.as_deref()),
            rate_limit,
            shadow_mode,
            detailed_metric,
            descriptors,
        })
    }

    fn rate_limit(&mut self, node: &Node, field: &str) -> Option<RateLimit> {
        let entries = self.mapping(node, field, RATE_LIMIT_FIELDS)?;
        let get = |name: &str| {
            entries
                .iter()
                .find(|(k, _, _)| k == name)
                .map(|(_, _, n)| n)
        };
        let name = get("name").and_then(|n| self.string(n, &join(field, "name")));
        let mut replaces = Vec::new();
        if let Some(list) = get("replaces") {
            match &list.value {
                Value::Sequence(items) => {
                    for (index, item) in items.iter().enumerate() {
                        let item_field = format!("{}[{index}]", join(field, "replaces"));
                        if let Some(entries) = self.mapping(item, &item_field, &["name"]) {
                            match entries.iter().find(|(k, _, _)| k == "name") {
                                Some((_, _, n)) => {
                                    if let Some(name) = self.string(n, &join(&item_field, "name")) {
                                        replaces.push(name);
                                    }
                                }
                                None => self.problem(
                                    item.line,
                                    &item_field,
                                    "needs a name",
                                    "write `- name: <rate_limit name>`",
                                ),
                            }
                        }
                    }
                }
                _ => self.problem(
                    list.line,
                    &join(field, "replaces"),
                    "must be a list of `- name: …`",
                    "write `replaces: [{name: other}]`",
                ),
            }
        }
        let unlimited = get("unlimited")
            .and_then(|n| self.boolean(n, &join(field, "unlimited")))
            .unwrap_or(false);
        let unit = get("unit");
        let count = get("requests_per_unit");
        if unlimited {
            if unit.is_some() || count.is_some() {
                self.problem(
                    node.line,
                    field,
                    "`unlimited: true` with a unit or requests_per_unit",
                    "keep one: unlimited, or a unit and a count",
                );
            }
            return Some(RateLimit {
                name,
                replaces,
                quota: Quota::Unlimited,
            });
        }
        let unit = match unit {
            Some(n) => match self.string(n, &join(field, "unit")) {
                Some(text) => match Unit::parse(&text) {
                    Some(unit) => Some(unit),
                    None => {
                        self.problem(
                            n.line,
                            &join(field, "unit"),
                            format!("unknown unit {text:?}"),
                            "use second, minute, hour, day, week, month or year",
                        );
                        None
                    }
                },
                None => None,
            },
            None => {
                self.problem(
                    node.line,
                    &join(field, "unit"),
                    "is required",
                    "add `unit: second` (or minute, hour, day, week, month, year), or \
                     `unlimited: true`",
                );
                None
            }
        };
        let requests_per_unit = match count {
            Some(n) => match self.string(n, &join(field, "requests_per_unit")) {
                Some(text) => match text.parse::<u32>() {
                    Ok(count) => Some(count),
                    Err(_) => {
                        self.problem(
                            n.line,
                            &join(field, "requests_per_unit"),
                            format!("{text:?} is not a count of 0 to 4294967295"),
                            "write a whole number",
                        );
                        None
                    }
                },
                None => None,
            },
            None => {
                self.problem(
                    node.line,
                    &join(field, "requests_per_unit"),
                    "is required",
                    "add `requests_per_unit: <count>`",
                );
                None
            }
        };
        Some(RateLimit {
            name,
            replaces,
            quota: Quota::PerUnit {
                requests_per_unit: requests_per_unit?,
                unit: unit?,
            },
        })
    }
}

fn join(field: &str, key: &str) -> String {
    if field.is_empty() {
        key.to_string()
    } else {
        format!("{field}.{key}")
    }
}

/// Reads a domain configuration from `text`: the configuration when it has
/// no problem, else every problem found, each at its line.
pub fn parse(text: &str) -> Result<DomainConfig, Vec<RatelimitProblem>> {
    let document = parse_yaml(text).map_err(|p| vec![p])?;
    let Some(document) = document else {
        return Err(vec![RatelimitProblem {
            line: 1,
            field: String::new(),
            problem: "the file is empty".into(),
            fix: "write `domain: <name>` and a `descriptors:` list".into(),
        }]);
    };
    let mut reader = Reader {
        problems: Vec::new(),
    };
    let Some(entries) = reader.mapping(&document, "", &["domain", "descriptors"]) else {
        return Err(reader.problems);
    };
    let get = |name: &str| {
        entries
            .iter()
            .find(|(k, _, _)| k == name)
            .map(|(_, _, n)| n)
    };
    let domain = match get("domain") {
        Some(node) => reader.string(node, "domain"),
        None => {
            reader.problem(
                document.line,
                "domain",
                "is required",
                "add `domain: <name>` (what Envoy's rate_limit filter sends)",
            );
            None
        }
    };
    if domain.as_deref() == Some("") {
        reader.problem(
            document.line,
            "domain",
            "must not be empty",
            "name the domain",
        );
    }
    let descriptors = get("descriptors")
        .map(|node| reader.descriptors(node, "descriptors"))
        .unwrap_or_default();
    let config = DomainConfig {
        domain: domain.unwrap_or_default(),
        descriptors,
    };
    check_semantics(&config, document.line, &mut reader);
    if reader.problems.is_empty() {
        Ok(config)
    } else {
        reader.problems.sort_by_key(|p| p.line);
        Err(reader.problems)
    }
}

/// Problems of a configuration as a whole: `replaces` naming no rule, and
/// rule prefixes too long for a key.
fn check_semantics(config: &DomainConfig, line: usize, reader: &mut Reader) {
    let rules = config.limiting_rules();
    let names: Vec<&str> = rules
        .iter()
        .filter_map(|(_, limit)| limit.name.as_deref())
        .collect();
    for (_, limit) in &rules {
        for replaced in &limit.replaces {
            if !names.contains(&replaced.as_str()) {
                reader.problem(
                    line,
                    "replaces",
                    format!("replaces {replaced:?}, which no rate_limit of this domain is named"),
                    "name the replaced rule's rate_limit (`name: …`) or fix the name",
                );
            }
        }
    }
    for (path, _) in &rules {
        let prefix = rule_prefix(&config.domain, path);
        if prefix.len() > MAX_RULE_PREFIX_BYTES {
            reader.problem(
                line,
                "descriptors",
                format!(
                    "the rule {prefix:?} makes a key prefix of {} bytes, more than {MAX_RULE_PREFIX_BYTES}",
                    prefix.len()
                ),
                "shorten the domain, keys or values of that rule",
            );
        }
    }
}

/// Reads and parses a file.
pub fn load(path: &Path) -> Result<DomainConfig, Vec<RatelimitProblem>> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        vec![RatelimitProblem {
            line: 0,
            field: String::new(),
            problem: format!("cannot read {}: {e}", path.display()),
            fix: "check the path and its permissions".into(),
        }]
    })?;
    parse(&text)
}

/// Whether `path` names a rate limit configuration (`.yaml` or `.yml`).
pub fn is_ratelimit_file(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e.eq_ignore_ascii_case("yaml") || e.eq_ignore_ascii_case("yml"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn problems(text: &str) -> Vec<RatelimitProblem> {
        parse(text).expect_err("expected problems")
    }

    /// The nine examples of the `envoyproxy/ratelimit` README
    /// (`node/testdata/ratelimit-readme/`) load unchanged, and requests
    /// match them as the README says: every case of every `.cases` file.
    #[test]
    fn every_readme_example_loads_and_matches_as_it_documents() {
        use leasehold_core::rls::answer::{plan_request, Plan, RequestDescriptor};
        let folder = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/ratelimit-readme");
        let mut examples: Vec<_> = std::fs::read_dir(&folder)
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .filter(|path| path.extension().is_some_and(|e| e == "yaml"))
            .collect();
        examples.sort();
        assert_eq!(examples.len(), 10, "nine examples, the fourth in two parts");
        let mut checked = 0;
        for example in &examples {
            let config = load(example).unwrap_or_else(|p| panic!("{}: {p:?}", example.display()));
            let cases = std::fs::read_to_string(example.with_extension("cases")).unwrap();
            for case in cases
                .lines()
                .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
            {
                let (request, expected) = case
                    .split_once("->")
                    .expect("a case reads REQUEST -> LIMITS");
                let entries: Vec<Vec<(&str, &str)>> = request
                    .split('|')
                    .map(|descriptor| {
                        descriptor
                            .split(',')
                            .map(|entry| entry.trim().split_once('=').expect("key=value"))
                            .collect()
                    })
                    .collect();
                let descriptors: Vec<RequestDescriptor> = entries
                    .iter()
                    .map(|entries| RequestDescriptor { entries, hits: 1 })
                    .collect();
                let got: Vec<String> = plan_request(Some(&config), &descriptors)
                    .into_iter()
                    .map(|plan| match plan {
                        Plan::Limited(limited) => limited.requests_per_unit.to_string(),
                        Plan::Unlimited => "unlimited".to_string(),
                        Plan::NoLimit => "none".to_string(),
                    })
                    .collect();
                let expected: Vec<&str> = expected.split_whitespace().collect();
                assert_eq!(got, expected, "{}: {case}", example.display());
                checked += 1;
            }
        }
        assert!(checked >= 12, "{checked} cases");
        let example = |name: &str| load(&folder.join(name)).unwrap();
        let policies = example("6-shadow_mode.yaml").policies();
        assert_eq!(policies.len(), 2);
        assert!(policies.iter().any(|p| p.shadow && p.limit == 10));
        assert!(policies.iter().any(|p| !p.shadow && p.limit == 20));
        assert!(example("8-detailed_metric.yaml").descriptors[0].detailed_metric);
    }

    #[test]
    fn problems_name_their_line_field_and_fix() {
        let text = "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 5\n  - key: b\n    quota_mode: true\n    rate_limit:\n      requests_per_unit: -3\n      unit: second\n";
        let found = problems(text);
        let at = |line: usize| {
            found
                .iter()
                .find(|p| p.line == line)
                .unwrap_or_else(|| panic!("line {line}: {found:?}"))
        };
        assert!(
            at(5).problem.contains("fortnight") && at(5).field == "descriptors[0].rate_limit.unit"
        );
        assert!(at(8).problem.contains("quota_mode") && at(8).fix.contains("rate_limit"));
        assert!(at(10).problem.contains("-3"));
    }

    #[test]
    fn duplicates_unknown_replaces_and_bad_shapes_are_refused() {
        let duplicate = "domain: d\ndescriptors:\n  - key: a\n    value: x\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: a\n    value: x\n    rate_limit: {unit: second, requests_per_unit: 2}\n";
        assert!(problems(duplicate)
            .iter()
            .any(|p| p.line == 6 && p.problem.contains("second rule")));
        let replaces = "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      replaces:\n        - name: nobody\n";
        assert!(problems(replaces)
            .iter()
            .any(|p| p.problem.contains("nobody")));
        let both = "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unlimited: true, unit: second}\n";
        assert!(problems(both)
            .iter()
            .any(|p| p.problem.contains("unlimited")));
        assert!(problems("descriptors: []\n")
            .iter()
            .any(|p| p.field == "domain"));
        assert!(problems("").iter().any(|p| p.problem.contains("empty")));
        assert!(problems("domain: [a\n")
            .iter()
            .any(|p| p.problem.contains("not valid YAML")));
        assert!(problems("a: &x 1\nb: *x\n")
            .iter()
            .any(|p| p.problem.contains("not supported")));
        assert!(problems("domain: d\n---\ndomain: e\n")
            .iter()
            .any(|p| p.problem.contains("document")));
        assert!(problems("domain: d\ndescriptors:\n  - value: x\n")
            .iter()
            .any(|p| p.field == "descriptors[0].key"));
    }

    proptest! {
        /// No input panics the reader; what it accepts has a domain.
        #[test]
        fn arbitrary_text_is_read_or_refused(text in "[a-z: \\-\\n{}\\[\\]*&0-9#]{0,200}") {
            if let Ok(config) = parse(&text) {
                prop_assert!(!config.domain.is_empty());
            }
        }
    }
}
