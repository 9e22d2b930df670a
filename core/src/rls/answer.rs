//! The answer to one `ShouldRateLimit` request (pure): what each request
//! descriptor asks of the escrow ([`plan_request`]), and how what the escrow
//! said becomes the descriptor's status, the overall code and the draft
//! RateLimit headers ([`DescriptorAnswer::of`], [`overall_over_limit`],
//! [`draft_headers`]).
//!
//! As `envoyproxy/ratelimit` answers, except where a Leasehold budget is
//! global:
//!
//! - a descriptor matching no limiting rule, or whose rule another matched
//!   rule `replaces`: `OK`, no `current_limit`, `limit_remaining` 0;
//! - an `unlimited` rule: `OK`, `limit_remaining` `u32::MAX`, never counted;
//! - a rule of 0 requests: `OVER_LIMIT` without asking the escrow
//!   (nothing can ever fit);
//! - a descriptor whose own `hits_addend` is 0 is **check-only**, as
//!   upstream: it spends nothing, and is `OVER_LIMIT` only when not one
//!   more hit could be admitted now (the key's window is spent);
//! - otherwise the hits are **charged**: the escrow spends all of them or,
//!   when fewer are left, what is left — recorded either way, as upstream
//!   records every hit, but never beyond the key's limit (Δ = 0) — and the
//!   descriptor is `OK` when all were spent, `OVER_LIMIT` when not (the
//!   part not spent is the charge's *unpaid* part, [`unpaid_hits`]). A
//!   stream-end charge of a token budget (`apply_on_stream_done`) thus
//!   spends what the stream used or the rest of the window, and the next
//!   check-only call at request time finds the window spent;
//! - either way `OK` or `OVER_LIMIT` comes with `current_limit` the limit of the key's
//!   policy as the cluster holds it (changed at runtime by `policy apply`;
//!   the rule's own where the escrow was not asked), the rule's unit, and
//!   `limit_remaining` the credits this escrow node still holds for the key
//!   after the answer — what it can admit without asking the coordinator, a
//!   lower bound of what the window has left across regions (0 when over);
//! - `shadow_mode`: what would be `OVER_LIMIT` is `OK`, counted as such;
//!   `limit_remaining` is always 0 (the rule's policy is a shadow policy,
//!   whose grants exceed the limit: what the node holds says nothing of
//!   what an enforced rule would have left, and 0 is always a lower bound);
//! - the overall code is `OVER_LIMIT` when any descriptor is.

use super::{apply_replaces, budget_key, rule_prefix, DomainConfig, Quota, Unit};

/// What one request descriptor asks of the escrow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// No limiting rule applies (none matches, or it was replaced).
    NoLimit,
    /// An `unlimited` rule matches.
    Unlimited,
    /// A rule with a limit matches.
    Limited(LimitedPlan),
}

/// A descriptor governed by a rule with a limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitedPlan {
    /// The Leasehold key the hits spend from.
    pub key: String,
    /// The policy prefix of the rule (what metrics name it by).
    pub rule_prefix: String,
    /// Hits to charge; 0: check-only (spend nothing, over only when the
    /// window is spent).
    pub hits: u64,
    /// The rule's requests per unit.
    pub requests_per_unit: u32,
    /// The rule's unit.
    pub unit: Unit,
    /// The rule answers `OK` where it would deny, counting it.
    pub shadow_mode: bool,
    /// The rule asked for metrics of its own.
    pub detailed_metric: bool,
}

impl LimitedPlan {
    /// Whether the escrow is asked at all: a rule of 0 requests per unit
    /// is over the limit without a call (nothing can ever fit).
    pub fn asks_escrow(&self) -> bool {
        self.requests_per_unit > 0
    }

    /// Whether the descriptor is check-only (its `hits_addend` was 0).
    pub fn check_only(&self) -> bool {
        self.hits == 0
    }
}

/// One request descriptor: its `(key, value)` entries and the hits it
/// carries (its own `hits_addend` when set — 0: check-only — else the
/// request's, where 0 means unset and counts as 1; see [`descriptor_hits`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestDescriptor<'a> {
    /// The entries, in order.
    pub entries: &'a [(&'a str, &'a str)],
    /// Hits (0: check-only).
    pub hits: u64,
}

/// The hits a descriptor carries: its own `hits_addend` when set (0 makes
/// it check-only), else the request's (`0`, protobuf's unset, counts as 1,
/// as Envoy sends it).
pub fn descriptor_hits(own: Option<u64>, request: u32) -> u64 {
    own.unwrap_or_else(|| u64::from(request.max(1)))
}

/// The plan of each descriptor of a request to `config` (`None`: a domain
/// no file configures, where nothing is limited), in request order.
pub fn plan_request(config: Option<&DomainConfig>, descriptors: &[RequestDescriptor]) -> Vec<Plan> {
    let Some(config) = config else {
        return vec![Plan::NoLimit; descriptors.len()];
    };
    let matches = apply_replaces(
        descriptors
            .iter()
            .map(|d| config.match_descriptor(d.entries))
            .collect(),
    );
    matches
        .into_iter()
        .zip(descriptors)
        .map(|(matched, descriptor)| {
            let Some(matched) = matched else {
                return Plan::NoLimit;
            };
            match matched.rate_limit.quota {
                Quota::Unlimited => Plan::Unlimited,
                Quota::PerUnit {
                    requests_per_unit,
                    unit,
                } => {
                    let prefix = rule_prefix(&config.domain, &matched.path);
                    Plan::Limited(LimitedPlan {
                        key: budget_key(&prefix, descriptor.entries),
                        rule_prefix: prefix,
                        hits: descriptor.hits,
                        requests_per_unit,
                        unit,
                        shadow_mode: matched.rule.shadow_mode,
                        detailed_metric: matched.rule.detailed_metric,
                    })
                }
            }
        })
        .collect()
}

/// What the escrow answered a [`LimitedPlan`] it was asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EscrowOutcome {
    /// Hits were spent (all, or what was left), or a check-only
    /// descriptor found the window not spent.
    Admitted {
        /// Hits spent (≤ the plan's; 0 for a check-only descriptor).
        spent: u64,
        /// The key's limit per window, as the cluster's policy sets it.
        limit: u64,
        /// Credits the node still holds for the key afterwards.
        held_after: u64,
        /// End of the window they were admitted in (epoch ms).
        window_end_ms: u64,
        /// Admitted only because the key's policy is in shadow mode.
        shadow_would_deny: bool,
    },
    /// Not admitted.
    Denied {
        /// The key's limit per window, as the cluster's policy sets it.
        limit: u64,
        /// End of the window the denial is about (epoch ms; 0: unknown).
        window_end_ms: u64,
    },
    /// Not asked ([`LimitedPlan::asks_escrow`] is false).
    NotAsked,
}

/// A descriptor's status code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// Allowed.
    Ok,
    /// Over the limit.
    OverLimit,
}

/// One descriptor's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DescriptorAnswer {
    /// `OK` or `OVER_LIMIT`.
    pub code: Code,
    /// The rule's limit, where one applies.
    pub current_limit: Option<(u32, Unit)>,
    /// See the module doc.
    pub limit_remaining: u32,
    /// Until the window ends, ms, where a limit applies.
    pub until_reset_ms: Option<u64>,
    /// A shadow-mode rule or policy let through what it would have denied.
    pub shadow_would_deny: bool,
}

/// The end of the `unit` window holding `now_ms` (windows start at
/// multiples of their length since the epoch).
fn window_end(unit: Unit, now_ms: u64) -> u64 {
    let window = unit.window_ms();
    now_ms - now_ms % window + window
}

impl DescriptorAnswer {
    /// The status of a descriptor planned `plan`, which the escrow answered
    /// `outcome` (ignored unless the plan is [`Plan::Limited`]), at `now_ms`
    /// (epoch ms).
    pub fn of(plan: &Plan, outcome: EscrowOutcome, now_ms: u64) -> DescriptorAnswer {
        let limited = match plan {
            Plan::NoLimit => {
                return DescriptorAnswer {
                    code: Code::Ok,
                    current_limit: None,
                    limit_remaining: 0,
                    until_reset_ms: None,
                    shadow_would_deny: false,
                }
            }
            Plan::Unlimited => {
                return DescriptorAnswer {
                    code: Code::Ok,
                    current_limit: None,
                    limit_remaining: u32::MAX,
                    until_reset_ms: None,
                    shadow_would_deny: false,
                }
            }
            Plan::Limited(limited) => limited,
        };
        let rule_limit = Some((limited.requests_per_unit, limited.unit));
        let policy_limit = |limit: u64| match u32::try_from(limit) {
            Ok(limit) if limit > 0 => Some((limit, limited.unit)),
            Ok(_) => rule_limit,
            Err(_) => Some((u32::MAX, limited.unit)),
        };
        let reset_in = |end_ms: u64| {
            let end = if end_ms > now_ms {
                end_ms
            } else {
                window_end(limited.unit, now_ms)
            };
            Some(end - now_ms)
        };
        match outcome {
            EscrowOutcome::Admitted {
                spent,
                limit,
                window_end_ms,
                ..
            } if spent < limited.hits => {
                DescriptorAnswer::over(limited, policy_limit(limit), reset_in(window_end_ms))
            }
            EscrowOutcome::Admitted {
                limit,
                held_after,
                window_end_ms,
                shadow_would_deny,
                ..
            } => DescriptorAnswer {
                code: Code::Ok,
                current_limit: policy_limit(limit),
                limit_remaining: if shadow_would_deny || limited.shadow_mode {
                    0
                } else {
                    u32::try_from(held_after.min(limit.max(1))).unwrap_or(u32::MAX)
                },
                until_reset_ms: reset_in(window_end_ms),
                shadow_would_deny,
            },
            EscrowOutcome::Denied {
                limit,
                window_end_ms,
            } => DescriptorAnswer::over(limited, policy_limit(limit), reset_in(window_end_ms)),
            EscrowOutcome::NotAsked => DescriptorAnswer::over(limited, rule_limit, reset_in(0)),
        }
    }

    /// Over the limit, or `OK` counted as a shadow denial.
    fn over(
        limited: &LimitedPlan,
        current_limit: Option<(u32, Unit)>,
        until_reset_ms: Option<u64>,
    ) -> DescriptorAnswer {
        DescriptorAnswer {
            code: if limited.shadow_mode {
                Code::Ok
            } else {
                Code::OverLimit
            },
            current_limit,
            limit_remaining: 0,
            until_reset_ms,
            shadow_would_deny: limited.shadow_mode,
        }
    }
}

/// The start of the window an `OK` received at `at_ms` (a caller's clock)
/// was admitted in, told by its `duration_until_reset` of `reset_ms` (until
/// the window's end as the node saw it): the window edge nearest to
/// `at_ms + reset_ms`, less one window — so an answer admitted just before
/// an edge and received after it counts in its own window, whatever the
/// answer's latency (up to half a window). For oracles summing `OK`
/// answers per window.
pub fn admitted_window_start(at_ms: u64, reset_ms: u64, window_ms: u64) -> u64 {
    let window_ms = window_ms.max(1);
    let end = at_ms.saturating_add(reset_ms);
    (end.saturating_add(window_ms / 2) / window_ms * window_ms).saturating_sub(window_ms)
}

/// The hits of a charge that were not spent: what `plan` asked less what
/// `outcome` spent (all of them when nothing was; 0 for check-only
/// descriptors and anything not limited).
pub fn unpaid_hits(plan: &Plan, outcome: EscrowOutcome) -> u64 {
    let Plan::Limited(limited) = plan else {
        return 0;
    };
    match outcome {
        EscrowOutcome::Admitted { spent, .. } => limited.hits.saturating_sub(spent),
        EscrowOutcome::Denied { .. } | EscrowOutcome::NotAsked => limited.hits,
    }
}

/// The overall code: `OVER_LIMIT` when any descriptor is.
pub fn overall_over_limit(answers: &[DescriptorAnswer]) -> bool {
    answers.iter().any(|a| a.code == Code::OverLimit)
}

/// The draft RateLimit headers (draft-polli-ratelimit-headers-03, as
/// `envoyproxy/ratelimit` sends them) of the most constrained descriptor
/// with a limit — the fewest remaining, then the soonest reset:
/// `x-ratelimit-limit: <n>, <n>;w=<window s>`, `x-ratelimit-remaining`,
/// `x-ratelimit-reset` (seconds, rounded up). None when no descriptor has
/// a limit.
pub fn draft_headers(answers: &[DescriptorAnswer]) -> Vec<(&'static str, String)> {
    let Some((answer, (limit, unit))) = answers
        .iter()
        .filter_map(|a| a.current_limit.map(|limit| (a, limit)))
        .min_by_key(|(a, _)| (a.limit_remaining, a.until_reset_ms.unwrap_or(u64::MAX)))
    else {
        return Vec::new();
    };
    let window_s = unit.window_ms() / 1_000;
    let reset_s = answer.until_reset_ms.unwrap_or(0).div_ceil(1_000);
    vec![
        (
            "x-ratelimit-limit",
            format!("{limit}, {limit};w={window_s}"),
        ),
        ("x-ratelimit-remaining", answer.limit_remaining.to_string()),
        ("x-ratelimit-reset", reset_s.to_string()),
    ]
}

#[cfg(test)]
mod tests {
    use super::super::{DescriptorRule, RateLimit, ValueMatch};
    use super::*;
    use proptest::prelude::*;

    fn rule(key: &str, value: Option<&str>, quota: Option<Quota>) -> DescriptorRule {
        DescriptorRule {
            key: key.into(),
            value: ValueMatch::of(value),
            rate_limit: quota.map(|quota| RateLimit {
                name: None,
                replaces: Vec::new(),
                quota,
            }),
            shadow_mode: false,
            detailed_metric: false,
            descriptors: Vec::new(),
        }
    }

    fn per(requests_per_unit: u32, unit: Unit) -> Option<Quota> {
        Some(Quota::PerUnit {
            requests_per_unit,
            unit,
        })
    }

    fn config() -> DomainConfig {
        let mut shadow = rule("shadow", None, per(1, Unit::Second));
        shadow.shadow_mode = true;
        let mut named = rule("user", Some("vip"), per(50, Unit::Minute));
        named.rate_limit.as_mut().unwrap().name = Some("vip".into());
        let mut replacing = rule("plan", Some("gold"), per(500, Unit::Minute));
        replacing.rate_limit.as_mut().unwrap().replaces = vec!["vip".into()];
        DomainConfig {
            domain: "edge".into(),
            descriptors: vec![
                rule("remote_address", None, per(10, Unit::Minute)),
                rule("free", None, Some(Quota::Unlimited)),
                rule("closed", None, per(0, Unit::Hour)),
                shadow,
                named,
                replacing,
            ],
        }
    }

    fn limited(plan: &Plan) -> &LimitedPlan {
        match plan {
            Plan::Limited(limited) => limited,
            other => panic!("expected a limited plan, got {other:?}"),
        }
    }

    #[test]
    fn each_descriptor_is_planned_by_its_rule() {
        let config = config();
        let ip = [("remote_address", "10.0.0.1")];
        let free = [("free", "x")];
        let closed = [("closed", "x")];
        let unknown = [("nobody", "x")];
        let plans = plan_request(
            Some(&config),
            &[
                RequestDescriptor {
                    entries: &ip,
                    hits: 1,
                },
                RequestDescriptor {
                    entries: &free,
                    hits: 3,
                },
                RequestDescriptor {
                    entries: &closed,
                    hits: 1,
                },
                RequestDescriptor {
                    entries: &unknown,
                    hits: 1,
                },
                RequestDescriptor {
                    entries: &[],
                    hits: 1,
                },
            ],
        );
        let ip_plan = limited(&plans[0]);
        assert_eq!(ip_plan.key, "rls:edge/remote_address/|10.0.0.1");
        assert_eq!(ip_plan.rule_prefix, "rls:edge/remote_address/");
        assert_eq!(ip_plan.hits, 1);
        assert_eq!(
            (ip_plan.requests_per_unit, ip_plan.unit),
            (10, Unit::Minute)
        );
        assert!(ip_plan.asks_escrow());
        assert_eq!(plans[1], Plan::Unlimited);
        assert!(!limited(&plans[2]).asks_escrow(), "0 requests: never asked");
        assert_eq!(plans[3], Plan::NoLimit);
        assert_eq!(
            plans[4],
            Plan::NoLimit,
            "an empty descriptor matches nothing"
        );
        assert_eq!(
            plan_request(
                None,
                &[RequestDescriptor {
                    entries: &ip,
                    hits: 1
                }]
            ),
            vec![Plan::NoLimit],
            "an unknown domain limits nothing"
        );
    }

    #[test]
    fn a_replaced_rule_limits_nothing_and_hits_above_the_limit_are_still_charged() {
        let config = config();
        let vip = [("user", "vip")];
        let gold = [("plan", "gold")];
        let plans = plan_request(
            Some(&config),
            &[
                RequestDescriptor {
                    entries: &vip,
                    hits: 1,
                },
                RequestDescriptor {
                    entries: &gold,
                    hits: 501,
                },
            ],
        );
        assert_eq!(plans[0], Plan::NoLimit);
        assert!(
            limited(&plans[1]).asks_escrow(),
            "more hits than the limit spend what is left"
        );
        let alone = plan_request(
            Some(&config),
            &[RequestDescriptor {
                entries: &vip,
                hits: 50,
            }],
        );
        assert!(limited(&alone[0]).asks_escrow(), "50 of 50 may fit");
    }

    #[test]
    fn statuses_follow_the_escrow_and_shadow_mode_never_denies() {
        let config = config();
        let ip = [("remote_address", "a")];
        let shadow = [("shadow", "a")];
        let plans = plan_request(
            Some(&config),
            &[
                RequestDescriptor {
                    entries: &ip,
                    hits: 1,
                },
                RequestDescriptor {
                    entries: &shadow,
                    hits: 1,
                },
            ],
        );
        let now = 90_500;
        let admitted = DescriptorAnswer::of(
            &plans[0],
            EscrowOutcome::Admitted {
                spent: 1,
                limit: 10,
                held_after: 7,
                window_end_ms: 120_000,
                shadow_would_deny: false,
            },
            now,
        );
        assert_eq!(admitted.code, Code::Ok);
        assert_eq!(admitted.current_limit, Some((10, Unit::Minute)));
        assert_eq!(admitted.limit_remaining, 7);
        assert_eq!(admitted.until_reset_ms, Some(29_500));
        let denied = DescriptorAnswer::of(
            &plans[0],
            EscrowOutcome::Denied {
                limit: 10,
                window_end_ms: 0,
            },
            now,
        );
        assert_eq!(denied.code, Code::OverLimit);
        assert_eq!(denied.limit_remaining, 0);
        assert_eq!(
            denied.until_reset_ms,
            Some(29_500),
            "unknown end: the unit's window"
        );
        let shadowed = DescriptorAnswer::of(
            &plans[1],
            EscrowOutcome::Denied {
                limit: 1,
                window_end_ms: 91_000,
            },
            now,
        );
        assert_eq!(shadowed.code, Code::Ok);
        assert!(shadowed.shadow_would_deny);
        assert_eq!(shadowed.until_reset_ms, Some(500));
        assert!(overall_over_limit(&[admitted, denied, shadowed]));
        assert!(!overall_over_limit(&[admitted, shadowed]));
        let policy_shadow = DescriptorAnswer::of(
            &plans[0],
            EscrowOutcome::Admitted {
                spent: 1,
                limit: 10,
                held_after: 9,
                window_end_ms: 120_000,
                shadow_would_deny: true,
            },
            now,
        );
        assert_eq!(
            (policy_shadow.code, policy_shadow.limit_remaining),
            (Code::Ok, 0)
        );
        assert!(policy_shadow.shadow_would_deny);
    }

    /// A charge spends what is left and is over when that is less than its
    /// hits; a check-only descriptor spends nothing and is over only when
    /// the window is spent; the hits of a request default to 1.
    #[test]
    fn charges_spend_what_is_left_and_checks_spend_nothing() {
        let config = config();
        let ip = [("remote_address", "a")];
        let plan = |hits| {
            plan_request(Some(&config), &[RequestDescriptor { entries: &ip, hits }]).remove(0)
        };
        let admitted = |spent| EscrowOutcome::Admitted {
            spent,
            limit: 10,
            held_after: 0,
            window_end_ms: 60_000,
            shadow_would_deny: false,
        };
        let charge = plan(1_234);
        let part = DescriptorAnswer::of(&charge, admitted(7), 1);
        assert_eq!(part.code, Code::OverLimit, "7 of 1 234 spent");
        assert_eq!(unpaid_hits(&charge, admitted(7)), 1_227);
        let whole = DescriptorAnswer::of(&plan(7), admitted(7), 1);
        assert_eq!(whole.code, Code::Ok);
        let check = plan(0);
        assert!(limited(&check).check_only() && limited(&check).asks_escrow());
        assert_eq!(DescriptorAnswer::of(&check, admitted(0), 1).code, Code::Ok);
        assert_eq!(unpaid_hits(&check, admitted(0)), 0);
        let spent = EscrowOutcome::Denied {
            limit: 10,
            window_end_ms: 60_000,
        };
        assert_eq!(DescriptorAnswer::of(&check, spent, 1).code, Code::OverLimit);
        assert_eq!(
            descriptor_hits(Some(0), 5),
            0,
            "a descriptor's own 0: check-only"
        );
        assert_eq!(descriptor_hits(None, 0), 1, "the request's 0 is unset: 1");
        assert_eq!(descriptor_hits(None, 3), 3);
        assert_eq!(descriptor_hits(Some(9), 3), 9);
    }

    #[test]
    fn remaining_never_exceeds_the_limit_and_unlimited_is_the_maximum() {
        let config = config();
        let ip = [("remote_address", "a")];
        let free = [("free", "a")];
        let plans = plan_request(
            Some(&config),
            &[
                RequestDescriptor {
                    entries: &ip,
                    hits: 1,
                },
                RequestDescriptor {
                    entries: &free,
                    hits: 1,
                },
            ],
        );
        let answer = DescriptorAnswer::of(
            &plans[0],
            EscrowOutcome::Admitted {
                spent: 1,
                limit: 10,
                held_after: u64::MAX,
                window_end_ms: 60_000,
                shadow_would_deny: false,
            },
            1,
        );
        assert_eq!(answer.limit_remaining, 10);
        let free = DescriptorAnswer::of(&plans[1], EscrowOutcome::NotAsked, 1);
        assert_eq!(
            (free.code, free.limit_remaining, free.current_limit),
            (Code::Ok, u32::MAX, None)
        );
    }

    #[test]
    fn the_policys_limit_is_reported_where_the_escrow_was_asked() {
        let config = config();
        let ip = [("remote_address", "a")];
        let plans = plan_request(
            Some(&config),
            &[RequestDescriptor {
                entries: &ip,
                hits: 1,
            }],
        );
        // The file says 10 a minute; the cluster's policy was raised to 40.
        let raised = DescriptorAnswer::of(
            &plans[0],
            EscrowOutcome::Admitted {
                spent: 1,
                limit: 40,
                held_after: 25,
                window_end_ms: 60_000,
                shadow_would_deny: false,
            },
            1,
        );
        assert_eq!(raised.current_limit, Some((40, Unit::Minute)));
        assert_eq!(raised.limit_remaining, 25);
        let denied = DescriptorAnswer::of(
            &plans[0],
            EscrowOutcome::Denied {
                limit: u64::MAX,
                window_end_ms: 60_000,
            },
            1,
        );
        assert_eq!(denied.current_limit, Some((u32::MAX, Unit::Minute)));
        let unknown = DescriptorAnswer::of(
            &plans[0],
            EscrowOutcome::Denied {
                limit: 0,
                window_end_ms: 60_000,
            },
            1,
        );
        assert_eq!(
            unknown.current_limit,
            Some((10, Unit::Minute)),
            "no policy limit: the rule's"
        );
    }

    #[test]
    fn the_reset_is_the_escrows_window_end_else_the_units() {
        let config = config();
        let ip = [("remote_address", "a")];
        let plans = plan_request(
            Some(&config),
            &[RequestDescriptor {
                entries: &ip,
                hits: 1,
            }],
        );
        let reset = |window_end_ms| {
            DescriptorAnswer::of(
                &plans[0],
                EscrowOutcome::Denied {
                    limit: 10,
                    window_end_ms,
                },
                90_500,
            )
            .until_reset_ms
        };
        // The coordinator's window ends at 100 000 (its clock, not this
        // node's minute): that end is reported.
        assert_eq!(reset(100_000), Some(9_500));
        // An end not after now says nothing: the unit's window (one minute).
        assert_eq!(reset(90_500), Some(29_500));
        assert_eq!(reset(1), Some(29_500));
    }

    #[test]
    fn an_ok_counts_in_the_window_it_was_admitted_in() {
        // Admitted at 999 ms with 1 ms left, received at 1 002 ms.
        assert_eq!(admitted_window_start(1_002, 1, 1_000), 0);
        assert_eq!(admitted_window_start(1_003, 0, 1_000), 0);
        assert_eq!(admitted_window_start(1_002, 998, 1_000), 1_000);
        assert_eq!(admitted_window_start(60_500, 500, 1_000), 60_000);
        assert_eq!(admitted_window_start(59_990, 10, 60_000), 0);
        assert_eq!(admitted_window_start(u64::MAX, u64::MAX, 0), u64::MAX - 1);
    }

    #[test]
    fn headers_name_the_most_constrained_descriptor() {
        let a = DescriptorAnswer {
            code: Code::Ok,
            current_limit: Some((100, Unit::Minute)),
            limit_remaining: 40,
            until_reset_ms: Some(1_001),
            shadow_would_deny: false,
        };
        let b = DescriptorAnswer {
            current_limit: Some((10, Unit::Second)),
            limit_remaining: 3,
            until_reset_ms: Some(200),
            ..a
        };
        let none = DescriptorAnswer {
            current_limit: None,
            limit_remaining: 0,
            until_reset_ms: None,
            ..a
        };
        assert_eq!(
            draft_headers(&[a, b, none]),
            vec![
                ("x-ratelimit-limit", "10, 10;w=1".to_string()),
                ("x-ratelimit-remaining", "3".to_string()),
                ("x-ratelimit-reset", "1".to_string()),
            ]
        );
        assert_eq!(draft_headers(&[a])[2].1, "2", "1001 ms rounds up to 2 s");
        assert_eq!(draft_headers(&[a])[0].1, "100, 100;w=60");
        assert!(draft_headers(&[none]).is_empty());
    }

    proptest! {
        /// Whatever the escrow says, a descriptor is over the limit only
        /// when a limited, non-shadow rule governs it and the escrow did
        /// not admit it; never more remaining than the rule's limit.
        #[test]
        fn over_limit_only_where_a_live_rule_was_not_admitted(
            requests in 0u32..20,
            hits in 0u64..25,
            shadow in any::<bool>(),
            admitted in any::<bool>(),
            held_after in any::<u64>(),
            now in 0u64..1_000_000_000,
            end_offset in 0u64..120_000,
        ) {
            let mut governing = rule("k", None, per(requests, Unit::Minute));
            governing.shadow_mode = shadow;
            let config = DomainConfig { domain: "d".into(), descriptors: vec![governing] };
            let entries = [("k", "v")];
            let plans = plan_request(Some(&config), &[RequestDescriptor { entries: &entries, hits }]);
            let plan = limited(&plans[0]);
            let outcome = if !plan.asks_escrow() {
                EscrowOutcome::NotAsked
            } else if admitted {
                EscrowOutcome::Admitted { spent: hits, limit: u64::from(requests), held_after, window_end_ms: now + end_offset, shadow_would_deny: false }
            } else {
                EscrowOutcome::Denied { limit: u64::from(requests), window_end_ms: now + end_offset }
            };
            let answer = DescriptorAnswer::of(&plans[0], outcome, now);
            let was_admitted = matches!(outcome, EscrowOutcome::Admitted { .. });
            prop_assert_eq!(answer.code == Code::OverLimit, !shadow && !was_admitted);
            prop_assert_eq!(answer.shadow_would_deny, shadow && !was_admitted);
            prop_assert!(answer.limit_remaining <= requests);
            prop_assert!(!shadow || answer.limit_remaining == 0, "a shadow rule reports nothing left");
            prop_assert!(plan.asks_escrow() == (requests > 0));
            prop_assert_eq!(unpaid_hits(&plans[0], outcome), if was_admitted { 0 } else { hits });
            let reset = answer.until_reset_ms.expect("a limited rule has a reset");
            prop_assert!((1..=120_000).contains(&reset));
        }
    }
}
