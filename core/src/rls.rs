//! Envoy's global rate limiting, as Leasehold keys and policies (pure).
//!
//! Envoy's rate limit filter sends a *domain* and *descriptors* — lists of
//! `(key, value)` entries — to a rate limit service, which matches each
//! descriptor against a configuration tree in the format of
//! `envoyproxy/ratelimit` and limits what matches. This module holds that
//! format's model ([`DomainConfig`], [`DescriptorRule`]), its matching rules
//! ([`DomainConfig::match_descriptor`], [`apply_replaces`]) and how a match
//! becomes a Leasehold key governed by a Leasehold policy
//! ([`rule_prefix`], [`budget_key`], [`DomainConfig::policies`]) — so that
//! the policies an operator applies to the coordinator and the keys an
//! escrow node admits under always agree.
//!
//! Matching, as `envoyproxy/ratelimit` does it: a descriptor's entries walk
//! the tree one level per entry; at each level an entry matches the rule
//! with its key and exactly its value first, else the rule whose value is a
//! prefix pattern (`value*`) its value starts with (the longest pattern),
//! else the rule with its key and no value. A descriptor matches only when
//! its last entry lands on a rule with a `rate_limit` (a descriptor with
//! more or fewer entries than the tree has levels matches nothing). A rule
//! without a value limits each value separately: the actual values are part
//! of the key. Across the descriptors of one request, a matched rule whose
//! `rate_limit.name` another matched rule `replaces` is dropped.
//!
//! Keys: the policy prefix of a rule is `rls:<domain>/` followed by one
//! segment per level (`key`, `key=value` or `key=value*`, then `/`); the key
//! of a match is that prefix, `|`, and the request's values joined by `/`.
//! `%`, `/`, `=`, `*` and `|` inside domains, keys and values are
//! percent-encoded, so a key's longest policy prefix is always its own
//! rule's (property `a_match_is_governed_by_its_own_rule`). A key that would
//! exceed [`MAX_KEY_BYTES`] carries a 64-bit hash of its values instead
//! (two values sharing a hash share a budget: stricter, never looser).

use std::fmt::Write as _;

pub mod answer;
pub mod refunds;

use crate::ids::MAX_KEY_BYTES;
use crate::policy::{OutagePolicy, Policy, PolicyKind};

/// The unit of a `rate_limit`: the length of its window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unit {
    /// 1 s.
    Second,
    /// 60 s.
    Minute,
    /// 1 h.
    Hour,
    /// 24 h.
    Day,
    /// 7 days (fixed, as `envoyproxy/ratelimit`: windows of 7 × 24 h
    /// counted from the Unix epoch, so each starts on a Thursday, 00:00
    /// UTC).
    Week,
    /// 30 days (fixed, not calendar months: windows of 30 × 24 h from the
    /// Unix epoch).
    Month,
    /// 365 days (fixed, not calendar years: windows of 365 × 24 h from the
    /// Unix epoch).
    Year,
}

impl Unit {
    /// Every unit, shortest first.
    pub const ALL: [Unit; 7] = [
        Unit::Second,
        Unit::Minute,
        Unit::Hour,
        Unit::Day,
        Unit::Week,
        Unit::Month,
        Unit::Year,
    ];

    /// The unit named `name` (`second`, `minute`, `hour`, `day`, `week`,
    /// `month`, `year`, any case).
    pub fn parse(name: &str) -> Option<Unit> {
        Unit::ALL
            .into_iter()
            .find(|unit| unit.name().eq_ignore_ascii_case(name))
    }

    /// Its name in the configuration format.
    pub fn name(self) -> &'static str {
        match self {
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
            Unit::Year => "year",
        }
    }

    /// The window of a policy limiting per this unit, ms.
    pub fn window_ms(self) -> u64 {
        match self {
            Unit::Second => 1_000,
            Unit::Minute => 60_000,
            Unit::Hour => 3_600_000,
            Unit::Day => 86_400_000,
            Unit::Week => 7 * 86_400_000,
            Unit::Month => 30 * 86_400_000,
            Unit::Year => 365 * 86_400_000,
        }
    }
}

/// What a rule allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quota {
    /// `requests_per_unit` per `unit` (0 refuses everything).
    PerUnit {
        /// Requests (hits) per window.
        requests_per_unit: u32,
        /// The window.
        unit: Unit,
    },
    /// `unlimited: true`: always allowed, never counted.
    Unlimited,
}

/// A rule's `rate_limit` block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimit {
    /// `name`: what other rules' `replaces` refer to.
    pub name: Option<String>,
    /// `replaces`: names of rules this one replaces when both match.
    pub replaces: Vec<String>,
    /// The limit.
    pub quota: Quota,
}

/// How a rule matches an entry's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ValueMatch {
    /// No `value`: any value, each limited separately.
    Any,
    /// `value: v`: exactly `v`.
    Exact(String),
    /// `value: v*`: any value starting with `v`.
    Prefix(String),
}

impl ValueMatch {
    /// The match a configured `value` stands for (a trailing `*` makes it a
    /// prefix pattern).
    pub fn of(value: Option<&str>) -> ValueMatch {
        match value {
            None => ValueMatch::Any,
            Some(v) => match v.strip_suffix('*') {
                Some(prefix) => ValueMatch::Prefix(prefix.to_string()),
                None => ValueMatch::Exact(v.to_string()),
            },
        }
    }
}

/// One rule of a descriptor list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescriptorRule {
    /// The entry key it matches.
    pub key: String,
    /// The entry values it matches.
    pub value: ValueMatch,
    /// Its limit, if it sets one.
    pub rate_limit: Option<RateLimit>,
    /// Never deny, only count what would have been denied.
    pub shadow_mode: bool,
    /// Metrics per actual value (bounded by the node; see the RLS docs).
    pub detailed_metric: bool,
    /// The next level.
    pub descriptors: Vec<DescriptorRule>,
}

/// One domain's configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainConfig {
    /// The domain requests name.
    pub domain: String,
    /// The top-level rules.
    pub descriptors: Vec<DescriptorRule>,
}

/// A descriptor matched to a limiting rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Matched<'a> {
    /// The rule.
    pub rule: &'a DescriptorRule,
    /// Its `rate_limit`.
    pub rate_limit: &'a RateLimit,
    /// The rules on the way, top first, the matched one last.
    pub path: Vec<&'a DescriptorRule>,
}

impl DomainConfig {
    /// The limiting rule `entries` (a request descriptor's `(key, value)`
    /// pairs, in order) match, if any (see the module doc).
    pub fn match_descriptor<'a>(&'a self, entries: &[(&str, &str)]) -> Option<Matched<'a>> {
        let mut level = &self.descriptors;
        let mut path = Vec::with_capacity(entries.len());
        for (key, value) in entries {
            let rule = best_rule(level, key, value)?;
            path.push(rule);
            level = &rule.descriptors;
        }
        let rule = *path.last()?;
        let rate_limit = rule.rate_limit.as_ref()?;
        Some(Matched {
            rule,
            rate_limit,
            path,
        })
    }

    /// Every limiting rule with the rules on its way, depth first, in file
    /// order.
    pub fn limiting_rules(&self) -> Vec<(Vec<&DescriptorRule>, &RateLimit)> {
        fn walk<'a>(
            rules: &'a [DescriptorRule],
            path: &mut Vec<&'a DescriptorRule>,
            out: &mut Vec<(Vec<&'a DescriptorRule>, &'a RateLimit)>,
        ) {
            for rule in rules {
                path.push(rule);
                if let Some(limit) = &rule.rate_limit {
                    out.push((path.clone(), limit));
                }
                walk(&rule.descriptors, path, out);
                path.pop();
            }
        }
        let mut out = Vec::new();
        walk(&self.descriptors, &mut Vec::new(), &mut out);
        out
    }

    /// The Leasehold policies the domain's limited rules stand for: one per
    /// rule with a `requests_per_unit` of at least 1 (unlimited rules and
    /// rules of 0 requests are answered without a budget), a `counter` key
    /// failing closed, in shadow mode where the rule is.
    pub fn policies(&self) -> Vec<Policy> {
        self.limiting_rules()
            .into_iter()
            .filter_map(|(path, limit)| match limit.quota {
                Quota::PerUnit {
                    requests_per_unit,
                    unit,
                } if requests_per_unit > 0 => Some(Policy {
                    prefix: rule_prefix(&self.domain, &path),
                    limit: u64::from(requests_per_unit),
                    window_ms: unit.window_ms(),
                    kind: PolicyKind::Counter,
                    outage: OutagePolicy::FailClosed,
                    shadow: path.last().is_some_and(|rule| rule.shadow_mode),
                }),
                Quota::PerUnit { .. } | Quota::Unlimited => None,
            })
            .collect()
    }
}

/// The rule among `rules` an entry `(key, value)` lands on: exact value,
/// then the longest matching prefix pattern, then any value.
fn best_rule<'a>(
    rules: &'a [DescriptorRule],
    key: &str,
    value: &str,
) -> Option<&'a DescriptorRule> {
    let with_key = || rules.iter().filter(move |rule| rule.key == key);
    with_key()
        .find(|rule| matches!(&rule.value, ValueMatch::Exact(v) if v == value))
        .or_else(|| {
            with_key()
                .filter_map(|rule| match &rule.value {
                    ValueMatch::Prefix(p) if value.starts_with(p.as_str()) => Some((p.len(), rule)),
                    _ => None,
                })
                .max_by_key(|(len, _)| *len)
                .map(|(_, rule)| rule)
        })
        .or_else(|| with_key().find(|rule| rule.value == ValueMatch::Any))
}

/// The matches of one request that stay after `replaces`: a match whose
/// rule's `name` is replaced by another match of the same request is
/// dropped (`None` in its place, so positions still name descriptors).
pub fn apply_replaces<'a>(matches: Vec<Option<Matched<'a>>>) -> Vec<Option<Matched<'a>>> {
    let replaced: Vec<&str> = matches
        .iter()
        .flatten()
        .flat_map(|m| m.rate_limit.replaces.iter().map(String::as_str))
        .collect();
    matches
        .into_iter()
        .map(|m| {
            m.filter(|m| {
                m.rate_limit
                    .name
                    .as_deref()
                    .is_none_or(|name| !replaced.contains(&name))
            })
        })
        .collect()
}

/// Appends `text` with `%`, `/`, `=`, `*`, `|` percent-encoded.
fn encode_into(out: &mut String, text: &str) {
    for c in text.chars() {
        match c {
            '%' | '/' | '=' | '*' | '|' => {
                let _ = write!(out, "%{:02X}", c as u32);
            }
            c => out.push(c),
        }
    }
}

/// The policy prefix of the rule at the end of `path` (top rule first) in
/// `domain`: `rls:<domain>/` and one `key[=value[*]]/` segment per level.
pub fn rule_prefix(domain: &str, path: &[&DescriptorRule]) -> String {
    let mut prefix = String::from("rls:");
    encode_into(&mut prefix, domain);
    prefix.push('/');
    for rule in path {
        encode_into(&mut prefix, &rule.key);
        match &rule.value {
            ValueMatch::Any => {}
            ValueMatch::Exact(value) => {
                prefix.push('=');
                encode_into(&mut prefix, value);
            }
            ValueMatch::Prefix(value) => {
                prefix.push('=');
                encode_into(&mut prefix, value);
                prefix.push('*');
            }
        }
        prefix.push('/');
    }
    prefix
}

/// Longest rule prefix a configuration may produce: room is left for `|`
/// and a hash of the values.
pub const MAX_RULE_PREFIX_BYTES: usize = MAX_KEY_BYTES - 18;

/// The key a request descriptor with `entries` spends from, given the
/// prefix of the rule it matched: the prefix, `|`, and its values joined
/// by `/` — or `#` and a 64-bit hash of them when that would be longer
/// than [`MAX_KEY_BYTES`].
pub fn budget_key(prefix: &str, entries: &[(&str, &str)]) -> String {
    let mut values = String::new();
    for (i, (_, value)) in entries.iter().enumerate() {
        if i > 0 {
            values.push('/');
        }
        encode_into(&mut values, value);
    }
    if prefix.len() + 1 + values.len() <= MAX_KEY_BYTES {
        format!("{prefix}|{values}")
    } else {
        format!("{prefix}|#{:016x}", fnv1a64(values.as_bytes()))
    }
}

/// The text of a domain, key or value as Envoy sent its bytes: the bytes
/// themselves when they are UTF-8; otherwise each byte of every invalid
/// sequence is written as U+FFFD followed by the byte's two hex digits.
/// A header value that is not UTF-8 is then limited like any other value,
/// under a key of its own, where decoding the request as protobuf strings
/// would fail the whole call (and an Envoy that fails open would let the
/// request through unlimited). Two byte strings share a text only when
/// one of them holds U+FFFD and two hex digits literally: they then share
/// a budget — stricter, never looser.
pub fn wire_text(bytes: Vec<u8>) -> String {
    match String::from_utf8(bytes) {
        Ok(text) => text,
        Err(error) => {
            let bytes = error.into_bytes();
            let mut text = String::with_capacity(bytes.len() + 8);
            let mut rest = &bytes[..];
            while !rest.is_empty() {
                match std::str::from_utf8(rest) {
                    Ok(valid) => {
                        text.push_str(valid);
                        break;
                    }
                    Err(e) => {
                        let (valid, after) = rest.split_at(e.valid_up_to());
                        // The prefix is valid UTF-8 by `valid_up_to`.
                        text.push_str(std::str::from_utf8(valid).unwrap_or_default());
                        let bad = e.error_len().unwrap_or(after.len()).max(1);
                        for byte in &after[..bad] {
                            text.push('\u{FFFD}');
                            let _ = write!(text, "{byte:02X}");
                        }
                        rest = &after[bad..];
                    }
                }
            }
            text
        }
    }
}

/// FNV-1a, 64 bits: a stable hash (the same in every process and release).
fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::PolicyTable;
    use proptest::prelude::*;

    proptest! {
        /// UTF-8 reads as itself; any other bytes read as valid text,
        /// different for different bytes (when neither holds U+FFFD).
        #[test]
        fn wire_bytes_read_as_text_of_their_own(
            a in proptest::collection::vec(any::<u8>(), 0..24),
            b in proptest::collection::vec(any::<u8>(), 0..24),
        ) {
            if let Ok(text) = std::str::from_utf8(&a) {
                prop_assert_eq!(wire_text(a.clone()), text);
            }
            let (text_a, text_b) = (wire_text(a.clone()), wire_text(b.clone()));
            let marker = |text: &str| text.contains('\u{FFFD}');
            // U+FFFD's own bytes, written literally.
            let literal = |bytes: &[u8]| bytes.windows(3).any(|w| w == [0xEF, 0xBF, 0xBD]);
            if a != b && !literal(&a) && !literal(&b) {
                prop_assert_ne!(&text_a, &text_b);
            }
            prop_assert!(std::str::from_utf8(&a).is_ok() || marker(&text_a));
        }
    }

    #[test]
    fn long_units_are_fixed_lengths_within_a_policys_window() {
        let day = Unit::Day.window_ms();
        for (name, unit, days) in [
            ("week", Unit::Week, 7),
            ("MONTH", Unit::Month, 30),
            ("Year", Unit::Year, 365),
        ] {
            assert_eq!(Unit::parse(name), Some(unit));
            assert_eq!(unit.name(), name.to_ascii_lowercase());
            assert_eq!(unit.window_ms(), days * day);
            assert!(unit.window_ms() <= crate::policy::MAX_WINDOW_MS);
        }
        assert_eq!(Unit::parse("fortnight"), None);
        // Shortest first, every window within what a policy accepts.
        for pair in Unit::ALL.windows(2) {
            assert!(pair[0].window_ms() < pair[1].window_ms());
        }
    }

    #[test]
    fn an_invalid_byte_reads_as_a_marked_hex_pair() {
        assert_eq!(wire_text(b"ab\xffc".to_vec()), "ab\u{FFFD}FFc");
        assert_eq!(wire_text(vec![0xe2, 0x82]), "\u{FFFD}E2\u{FFFD}82");
        assert_eq!(wire_text("é".as_bytes().to_vec()), "é");
    }

    fn limit(requests_per_unit: u32, unit: Unit) -> Option<RateLimit> {
        Some(RateLimit {
            name: None,
            replaces: Vec::new(),
            quota: Quota::PerUnit {
                requests_per_unit,
                unit,
            },
        })
    }

    fn rule(key: &str, value: Option<&str>, rate_limit: Option<RateLimit>) -> DescriptorRule {
        DescriptorRule {
            key: key.into(),
            value: ValueMatch::of(value),
            rate_limit,
            shadow_mode: false,
            detailed_metric: false,
            descriptors: Vec::new(),
        }
    }

    fn nested(mut parent: DescriptorRule, children: Vec<DescriptorRule>) -> DescriptorRule {
        parent.descriptors = children;
        parent
    }

    /// `envoyproxy/ratelimit`'s README, example 2: a placeholder with a
    /// nested per-number limit, and a per-number limit of its own.
    fn messaging() -> DomainConfig {
        DomainConfig {
            domain: "messaging".into(),
            descriptors: vec![
                nested(
                    rule("message_type", Some("marketing"), None),
                    vec![rule("to_number", None, limit(5, Unit::Day))],
                ),
                rule("to_number", None, limit(100, Unit::Day)),
            ],
        }
    }

    fn requests_per_unit(matched: Option<Matched<'_>>) -> Option<u32> {
        match matched?.rate_limit.quota {
            Quota::PerUnit {
                requests_per_unit, ..
            } => Some(requests_per_unit),
            Quota::Unlimited => None,
        }
    }

    #[test]
    fn nested_lists_match_level_by_level_and_each_value_alone() {
        let config = messaging();
        let marketing = [("message_type", "marketing"), ("to_number", "2061111111")];
        assert_eq!(
            requests_per_unit(config.match_descriptor(&marketing)),
            Some(5)
        );
        assert_eq!(
            requests_per_unit(config.match_descriptor(&[("to_number", "2061111111")])),
            Some(100)
        );
        // A placeholder sets no limit; other values of the first level
        // match nothing; more entries than levels match nothing.
        assert!(config
            .match_descriptor(&[("message_type", "marketing")])
            .is_none());
        assert!(config
            .match_descriptor(&[("message_type", "alerts"), ("to_number", "1")])
            .is_none());
        assert!(config
            .match_descriptor(&[("to_number", "1"), ("extra", "x")])
            .is_none());
        assert!(config.match_descriptor(&[]).is_none());
        // Each number is its own budget.
        let prefix = rule_prefix(
            "messaging",
            &config.match_descriptor(&marketing).unwrap().path,
        );
        assert_eq!(prefix, "rls:messaging/message_type=marketing/to_number/");
        assert_ne!(
            budget_key(&prefix, &marketing),
            budget_key(
                &prefix,
                &[("message_type", "marketing"), ("to_number", "2")]
            )
        );
    }

    #[test]
    fn a_value_beats_a_pattern_beats_any_value() {
        let config = DomainConfig {
            domain: "edge".into(),
            descriptors: vec![
                rule("remote_address", None, limit(10, Unit::Second)),
                rule("remote_address", Some("50.0.0.5"), limit(0, Unit::Second)),
                rule("remote_address", Some("50.*"), limit(3, Unit::Second)),
                rule("remote_address", Some("50.0.*"), limit(2, Unit::Second)),
            ],
        };
        let of = |ip| requests_per_unit(config.match_descriptor(&[("remote_address", ip)]));
        assert_eq!(of("50.0.0.5"), Some(0));
        assert_eq!(of("50.0.0.6"), Some(2), "the longest pattern");
        assert_eq!(of("50.1.0.6"), Some(3));
        assert_eq!(of("10.0.0.1"), Some(10));
    }

    #[test]
    fn a_replaced_rule_is_dropped_only_when_its_replacer_matches_too() {
        let named = |name: &str, replaces: &[&str], n| {
            Some(RateLimit {
                name: Some(name.into()),
                replaces: replaces.iter().map(|s| s.to_string()).collect(),
                quota: Quota::PerUnit {
                    requests_per_unit: n,
                    unit: Unit::Second,
                },
            })
        };
        let config = DomainConfig {
            domain: "example7".into(),
            descriptors: vec![
                nested(
                    rule("key_1", Some("value_1"), None),
                    vec![rule(
                        "user",
                        Some("bkthomps"),
                        named("specific_limit", &[], 5),
                    )],
                ),
                nested(
                    rule("key_2", Some("value_2"), None),
                    vec![rule(
                        "user",
                        Some("bkthomps"),
                        named("other", &["specific_limit"], 10),
                    )],
                ),
            ],
        };
        let first = [("key_1", "value_1"), ("user", "bkthomps")];
        let second = [("key_2", "value_2"), ("user", "bkthomps")];
        let both = apply_replaces(vec![
            config.match_descriptor(&first),
            config.match_descriptor(&second),
        ]);
        assert!(both[0].is_none(), "replaced");
        assert_eq!(requests_per_unit(both[1].clone()), Some(10));
        let alone = apply_replaces(vec![config.match_descriptor(&first)]);
        assert_eq!(requests_per_unit(alone[0].clone()), Some(5));
    }

    #[test]
    fn policies_stand_for_limited_rules_only() {
        let mut config = messaging();
        config.descriptors.push(DescriptorRule {
            rate_limit: Some(RateLimit {
                name: None,
                replaces: Vec::new(),
                quota: Quota::Unlimited,
            }),
            ..rule("ldap", None, None)
        });
        config.descriptors[1].shadow_mode = true;
        let policies = config.policies();
        let summary: Vec<(&str, u64, u64, bool)> = policies
            .iter()
            .map(|p| (p.prefix.as_str(), p.limit, p.window_ms, p.shadow))
            .collect();
        assert_eq!(
            summary,
            vec![
                (
                    "rls:messaging/message_type=marketing/to_number/",
                    5,
                    86_400_000,
                    false
                ),
                ("rls:messaging/to_number/", 100, 86_400_000, true),
            ]
        );
        for policy in &policies {
            assert_eq!(policy.kind, PolicyKind::Counter);
            assert_eq!(policy.outage, OutagePolicy::FailClosed);
        }
    }

    #[test]
    fn separators_inside_names_and_values_are_encoded() {
        let config = DomainConfig {
            domain: "a/b".into(),
            descriptors: vec![rule("k=|", Some("v/*x"), limit(1, Unit::Minute))],
        };
        let matched = config.match_descriptor(&[("k=|", "v/*x")]).unwrap();
        let prefix = rule_prefix(&config.domain, &matched.path);
        assert_eq!(prefix, "rls:a%2Fb/k%3D%7C=v%2F%2Ax/");
        assert_eq!(
            budget_key(&prefix, &[("k=|", "v/*x")]),
            format!("{prefix}|v%2F%2Ax")
        );
    }

    #[test]
    fn long_values_are_hashed_within_the_key_limit() {
        let long = "x".repeat(400);
        let other = "y".repeat(400);
        let prefix = "rls:d/k/";
        let key = budget_key(prefix, &[("k", &long)]);
        assert!(
            key.len() <= MAX_KEY_BYTES && key.starts_with("rls:d/k/|#"),
            "{key}"
        );
        assert_eq!(key, budget_key(prefix, &[("k", &long)]), "stable");
        assert_ne!(key, budget_key(prefix, &[("k", &other)]));
    }

    #[test]
    fn keys_are_hashed_exactly_beyond_the_key_limit() {
        // The longest rule prefix still leaves room for `|#` and the hash.
        assert_eq!(MAX_RULE_PREFIX_BYTES + "|#".len() + 16, MAX_KEY_BYTES);
        let longest = format!("rls:{}/", "p".repeat(MAX_RULE_PREFIX_BYTES - 5));
        assert_eq!(longest.len(), MAX_RULE_PREFIX_BYTES);
        assert_eq!(
            budget_key(&longest, &[("k", &"v".repeat(300))]).len(),
            MAX_KEY_BYTES
        );
        // A key of exactly the limit keeps its values; one byte more is hashed.
        let prefix = "rls:d/k/";
        let fits = "v".repeat(MAX_KEY_BYTES - prefix.len() - 1);
        let key = budget_key(prefix, &[("k", &fits)]);
        assert_eq!(key, format!("{prefix}|{fits}"));
        assert_eq!(key.len(), MAX_KEY_BYTES);
        let over = format!("{fits}v");
        assert!(budget_key(prefix, &[("k", &over)]).starts_with("rls:d/k/|#"));
    }

    #[test]
    fn values_of_several_entries_are_kept_apart() {
        let prefix = "rls:d/a/b/";
        assert_eq!(
            budget_key(prefix, &[("a", "x"), ("b", "yz")]),
            "rls:d/a/b/|x/yz"
        );
        assert_ne!(
            budget_key(prefix, &[("a", "x"), ("b", "yz")]),
            budget_key(prefix, &[("a", "xy"), ("b", "z")])
        );
    }

    #[test]
    fn the_hash_is_fnv_1a_64() {
        // Published test vectors: keys hashed by one release are the same
        // budgets in the next.
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn units_name_their_windows() {
        for unit in Unit::ALL {
            assert_eq!(Unit::parse(unit.name()), Some(unit));
            assert_eq!(Unit::parse(&unit.name().to_uppercase()), Some(unit));
        }
        assert_eq!(Unit::parse("fortnight"), None);
        assert_eq!(Unit::Minute.window_ms(), 60 * Unit::Second.window_ms());
    }

    /// Small trees over a small alphabet, so requests often match.
    fn arb_rules(depth: u32) -> BoxedStrategy<Vec<DescriptorRule>> {
        let value = prop_oneof![Just(None), "[a/*|]{0,2}".prop_map(Some)];
        let leaf = ("[k=|]", value, proptest::option::of(0u32..5), any::<bool>()).prop_map(
            |(key, value, n, shadow)| DescriptorRule {
                shadow_mode: shadow,
                ..rule(
                    &key,
                    value.as_deref(),
                    n.and_then(|n| limit(n, Unit::Second)),
                )
            },
        );
        if depth == 0 {
            proptest::collection::vec(leaf, 0..4).boxed()
        } else {
            proptest::collection::vec((leaf, arb_rules(depth - 1)), 0..4)
                .prop_map(|rules| {
                    rules
                        .into_iter()
                        .map(|(rule, children)| nested(rule, children))
                        .collect()
                })
                .boxed()
        }
    }

    /// A request walking `rules`: at each level the entry of the rule
    /// `choices` picks, with a value that rule accepts (`suffix` after a
    /// pattern, `suffix` itself for any value), as deep as `choices` goes —
    /// so most requests match something (perhaps a more specific rule).
    fn walk_request(
        rules: &[DescriptorRule],
        choices: &[usize],
        suffix: &str,
    ) -> Vec<(String, String)> {
        let mut level = rules;
        let mut request = Vec::new();
        for choice in choices {
            let Some(rule) = level.get(choice % level.len().max(1)) else {
                break;
            };
            let value = match &rule.value {
                ValueMatch::Any => suffix.to_string(),
                ValueMatch::Exact(v) => v.clone(),
                ValueMatch::Prefix(p) => format!("{p}{suffix}"),
            };
            request.push((rule.key.clone(), value));
            level = &rule.descriptors;
        }
        request
    }

    proptest! {
        /// Whatever the tree and the request: the key of a match starts with
        /// its rule's prefix, and among every policy the domain stands for
        /// (and another domain's) the longest prefix of that key is its own
        /// rule's — the coordinator charges a match to the rule that matched.
        #[test]
        fn a_match_is_governed_by_its_own_rule(
            rules in arb_rules(2),
            choices in proptest::collection::vec(0usize..4, 1..4),
            suffix in "[a/*|%]{0,2}",
        ) {
            let request = walk_request(&rules, &choices, &suffix);
            let config = DomainConfig { domain: "d".into(), descriptors: rules.clone() };
            let other = DomainConfig { domain: "d/".into(), descriptors: rules };
            let mut table = PolicyTable::default();
            for policy in config.policies().into_iter().chain(other.policies()) {
                prop_assert!(table.set(policy).is_ok(), "every policy is valid");
            }
            let entries: Vec<(&str, &str)> =
                request.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            let budgeted = config.match_descriptor(&entries).filter(|m| {
                matches!(m.rate_limit.quota, Quota::PerUnit { requests_per_unit, .. } if requests_per_unit > 0)
            });
            if let Some(matched) = budgeted {
                prop_assert_eq!(matched.path.len(), entries.len());
                let prefix = rule_prefix(&config.domain, &matched.path);
                let key = budget_key(&prefix, &entries);
                prop_assert!(key.starts_with(&prefix));
                prop_assert!(key.len() <= MAX_KEY_BYTES);
                let governing = table.lookup(&key).map(|p| p.prefix.clone());
                prop_assert_eq!(governing, Some(prefix));
            }
        }

        /// Distinct values of a request are distinct budgets (while keys
        /// are not hashed).
        #[test]
        fn distinct_values_are_distinct_budgets(
            a in "[ab/=*|%]{0,4}",
            b in "[ab/=*|%]{0,4}",
        ) {
            prop_assume!(a != b);
            let prefix = "rls:d/k/";
            prop_assert_ne!(budget_key(prefix, &[("k", &a)]), budget_key(prefix, &[("k", &b)]));
        }
    }
}
