//! The checker over good, broken and hostile files, and over every example
//! config in `deploy/`.

use std::path::{Path, PathBuf};

use proptest::prelude::*;

use super::*;

fn no_file_problems(_: &Path) -> Option<String> {
    None
}

fn check(text: &str) -> FileReport {
    check_text(
        Path::new("test.toml"),
        text,
        CheckOptions::default(),
        &no_file_problems,
    )
}

fn errors(report: &FileReport) -> Vec<(String, Option<usize>)> {
    report
        .findings
        .iter()
        .filter(|f| f.severity == Severity::Error)
        .map(|f| (f.field.clone(), f.line))
        .collect()
}

const MEMBER: &str = "id = 1\nlisten = \"0.0.0.0:7100\"\ndata_dir = \"/d\"\ninsecure = true\n";

#[test]
fn a_good_member_config_passes_and_missing_flag_settings_are_notes() {
    let report = check(MEMBER);
    assert_eq!(report.kind, Some(FileKind::Member));
    assert!(report.findings.is_empty(), "{:?}", report.findings);
    let bare = check("heartbeat_ms = 100\n");
    assert_eq!(bare.errors(), 0, "{:?}", bare.findings);
    let notes: Vec<&str> = bare.findings.iter().map(|f| f.field.as_str()).collect();
    assert_eq!(notes, ["id", "listen", "data_dir", "tls_ca"]);
}

#[test]
fn missing_tls_files_are_reported_unless_skipped() {
    let text = "id = 1\nlisten = \"a:1\"\ndata_dir = \"/d\"\ntls_ca = \"/nope/ca.pem\"\n\
                tls_cert = \"/nope/c.pem\"\ntls_key = \"/nope/k.pem\"\n";
    let path = Path::new("m.toml");
    let missing = |_: &Path| Some("cannot be read (No such file or directory)".to_string());
    let report = check_text(path, text, CheckOptions::default(), &missing);
    let fields: Vec<&str> = report.findings.iter().map(|f| f.field.as_str()).collect();
    assert_eq!(fields, ["tls_ca", "tls_cert", "tls_key"]);
    assert_eq!(report.findings[1].line, Some(5));
    let skipped = CheckOptions {
        skip_files: true,
        ..CheckOptions::default()
    };
    assert_eq!(check_text(path, text, skipped, &missing).errors(), 0);
    // The real lookup: a missing file, and a file that is not PEM.
    assert!(local_file_problem(Path::new("/nonexistent/leasehold/ca.pem")).is_some());
    let dir = tempfile::tempdir().unwrap();
    let not_pem = dir.path().join("x.pem");
    std::fs::write(&not_pem, "hello").unwrap();
    assert!(local_file_problem(&not_pem).unwrap().contains("PEM"));
}

/// The cases of `node/testdata/config-check/`: each file is recognised as
/// its `.expect` file says, with exactly the errors it lists (field and
/// line, in order), and every finding says how to fix it.
#[test]
fn every_case_is_found_as_its_expect_file_says() {
    let folder = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/config-check");
    let mut cases: Vec<PathBuf> = std::fs::read_dir(&folder)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "toml"))
        .collect();
    cases.sort();
    assert!(cases.len() >= 7, "{cases:?}");
    for case in &cases {
        let text = std::fs::read_to_string(case).unwrap();
        let report = check(&text);
        let expect = std::fs::read_to_string(case.with_extension("expect")).unwrap();
        let mut lines = expect.lines();
        let kind = match lines.next() {
            Some("kind member") => Some(FileKind::Member),
            Some("kind escrow") => Some(FileKind::Escrow),
            Some("kind policies") => Some(FileKind::Policies),
            Some("kind unknown") => None,
            other => panic!("{}: a first line `kind …`, not {other:?}", case.display()),
        };
        assert_eq!(report.kind, kind, "{}", case.display());
        let expected: Vec<(String, Option<usize>)> = lines
            .map(|line| {
                let mut words = line.split_whitespace();
                assert_eq!(words.next(), Some("error"), "{}: {line}", case.display());
                let field = words.next().expect("a field");
                let at = words.next().expect("a line");
                (
                    if field == "-" {
                        String::new()
                    } else {
                        field.to_string()
                    },
                    (at != "-").then(|| at.parse().expect("a line number")),
                )
            })
            .collect();
        assert_eq!(errors(&report), expected, "{}", case.display());
        assert!(
            report.findings.iter().all(|f| !f.fix.is_empty()),
            "{}: a finding without a fix",
            case.display()
        );
    }
    // What the cases say in words, beyond field and line.
    let unknown = check(&std::fs::read_to_string(folder.join("member-problems.toml")).unwrap());
    let unknown = unknown
        .findings
        .iter()
        .find(|f| f.field == "haertbeat_ms")
        .unwrap();
    assert!(unknown.problem.contains("unknown field"), "{unknown:?}");
    let escrow = check(&std::fs::read_to_string(folder.join("escrow-bad-values.toml")).unwrap());
    assert!(escrow.findings.iter().any(|f| f.severity == Severity::Note));
    let syntax = check(&std::fs::read_to_string(folder.join("syntax-error.toml")).unwrap());
    assert!(syntax.findings[0].problem.starts_with("not valid TOML"));
}

#[test]
fn an_unreadable_file_is_one_error_of_no_kind() {
    let unreadable = check_file(
        Path::new("/nonexistent/leasehold.toml"),
        CheckOptions::default(),
    );
    assert_eq!(unreadable.errors(), 1);
    assert_eq!(unreadable.kind, None);
}

/// Every `.toml` under `deploy/`.
fn deploy_configs() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "toml") {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy"),
        &mut out,
    );
    out.sort();
    out
}

#[test]
fn every_example_config_in_deploy_passes() {
    let configs = deploy_configs();
    let kinds: Vec<Option<FileKind>> = configs
        .iter()
        .map(|path| {
            // The examples name files of the host they are deployed on.
            let options = CheckOptions {
                kind: None,
                skip_files: true,
            };
            let report = check_file(path, options);
            assert_eq!(
                report.errors(),
                0,
                "{}: {:#?}",
                path.display(),
                report.findings
            );
            report.kind
        })
        .collect();
    for kind in [FileKind::Member, FileKind::Escrow, FileKind::Policies] {
        assert!(
            kinds.contains(&Some(kind)),
            "no {kind} example in deploy/: {configs:?}"
        );
    }
}

/// TOML-like text: lines of known and unknown keys with values of any
/// type, table headers, and raw junk.
fn toml_like() -> impl Strategy<Value = String> {
    let key = prop_oneof![
        Just("id".to_string()),
        Just("listen".to_string()),
        Just("heartbeat_ms".to_string()),
        Just("election_timeout_min_ms".to_string()),
        Just("request_timeout_ms".to_string()),
        Just("max_batch_commands".to_string()),
        Just("tls_ca".to_string()),
        Just("insecure".to_string()),
        Just("region".to_string()),
        Just("coordinators".to_string()),
        Just("batch".to_string()),
        Just("sizer".to_string()),
        Just("prefix".to_string()),
        Just("limit".to_string()),
        Just("window_ms".to_string()),
        Just("kind".to_string()),
        Just("outage".to_string()),
        Just("prefixes".to_string()),
        "[a-z_]{1,12}",
    ];
    let value = prop_oneof![
        any::<i64>().prop_map(|v| v.to_string()),
        (0u64..3).prop_map(|v| v.to_string()),
        Just("281474976710657".to_string()),
        any::<bool>().prop_map(|v| v.to_string()),
        "[ -~]{0,12}".prop_map(|s| format!("{:?}", s)),
        Just("[\"n1:7100\", \"x\"]".to_string()),
        Just("[]".to_string()),
        Just("1.5".to_string()),
    ];
    let line = prop_oneof![
        6 => (key, value).prop_map(|(k, v)| format!("{k} = {v}")),
        1 => Just("[[policy]]".to_string()),
        1 => Just("[fair_throttle]".to_string()),
        1 => "[ -~]{0,20}",
    ];
    proptest::collection::vec(line, 0..16).prop_map(|lines| lines.join("\n"))
}

/// Well-formed TOML (so every case reaches the value checks): tables of
/// known and unknown keys with values of every type, `[[policy]]` entries
/// and a `[fair_throttle]` table.
fn well_formed() -> impl Strategy<Value = String> {
    let key = prop_oneof![
        4 => proptest::sample::select(vec![
            "id", "listen", "data_dir", "heartbeat_ms", "election_timeout_min_ms",
            "election_timeout_max_ms", "request_timeout_ms", "max_batch_commands",
            "batch_queue_capacity", "snapshot_chunk_bytes", "tls_ca", "tls_cert", "tls_key",
            "insecure", "region", "coordinators", "batch", "sizer", "max_keys", "prefix",
            "limit", "window_ms", "kind", "outage", "fallback_tokens_per_region", "shadow",
            "prefixes", "levels", "buckets", "increment", "retry_after_ms",
        ]).prop_map(str::to_string),
        1 => "[a-z_]{1,10}",
    ];
    let scalar = prop_oneof![
        any::<i64>().prop_map(toml::Value::Integer),
        (0i64..4).prop_map(toml::Value::Integer),
        Just(toml::Value::Integer(1 << 48)),
        Just(toml::Value::Integer((1 << 48) + 1)),
        any::<bool>().prop_map(toml::Value::Boolean),
        any::<f64>().prop_map(toml::Value::Float),
        "[ -~]{0,16}".prop_map(toml::Value::String),
        proptest::collection::vec("[a-z0-9:./]{0,10}", 0..3)
            .prop_map(|v| toml::Value::Array(v.into_iter().map(toml::Value::String).collect())),
    ];
    let table = proptest::collection::btree_map(key, scalar, 0..10)
        .prop_map(|map| map.into_iter().collect::<toml::Table>());
    (
        table.clone(),
        proptest::collection::vec(table.clone(), 0..3),
        proptest::option::of(table),
    )
        .prop_map(|(mut top, entries, fair)| {
            if !entries.is_empty() {
                let entries = entries.into_iter().map(toml::Value::Table).collect();
                top.insert("policy".into(), toml::Value::Array(entries));
            }
            if let Some(fair) = fair {
                top.insert("fair_throttle".into(), toml::Value::Table(fair));
            }
            toml::to_string(&top).unwrap_or_default()
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Well-formed files get a verdict from the value checks (never a
    /// syntax error), and no panic.
    #[test]
    fn well_formed_files_reach_the_value_checks(text in well_formed()) {
        let missing = |_: &Path| Some("missing".to_string());
        let report = check_text(Path::new("x.toml"), &text, CheckOptions::default(), &missing);
        prop_assert!(report.kind.is_some());
        prop_assert!(
            report.findings.iter().all(|f| !f.problem.starts_with("not valid TOML")),
            "{:?}\n{}", report.findings, text
        );
    }

    /// No input panics the checker; every finding says what to do, and a
    /// line it names exists in the file.
    #[test]
    fn arbitrary_input_is_reported_never_a_panic(
        text in prop_oneof![toml_like(), well_formed(), any::<String>()],
        kind in proptest::option::of(prop_oneof![
            Just(FileKind::Member), Just(FileKind::Escrow), Just(FileKind::Policies)
        ]),
    ) {
        let options = CheckOptions { kind, skip_files: false };
        let missing = |_: &Path| Some("missing".to_string());
        let report = check_text(Path::new("x.toml"), &text, options, &missing);
        let lines = text.lines().count().max(1) + 1;
        for finding in &report.findings {
            prop_assert!(!finding.problem.is_empty() && !finding.fix.is_empty());
            if let Some(line) = finding.line {
                prop_assert!(line >= 1 && line <= lines, "line {} of {}", line, lines);
            }
        }
    }
}
