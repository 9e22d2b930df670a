//! Every scenario on a fixed set of seeds keeps every promise; and the suite
//! does fail when a safety mechanism is deliberately broken.

use leasehold_chaos::scenario::{self, replay_command, run_seeds};
use leasehold_chaos::sim::Weakening;

const SEEDS: u64 = 2;

fn assert_scenario_holds(name: &str) {
    let scenario = scenario::by_name(name).expect("known scenario");
    let report = run_seeds(&scenario, SEEDS, 1, Weakening::None);
    let problems: Vec<String> = report
        .violations
        .iter()
        .map(|(seed, v)| {
            format!(
                "{}: {} (replay: {})",
                v.invariant,
                v.detail,
                replay_command(name, *seed)
            )
        })
        .chain(report.errors.iter().map(|(seed, e)| {
            format!(
                "simulation error {e} (replay: {})",
                replay_command(name, *seed)
            )
        }))
        .collect();
    assert!(problems.is_empty(), "{name}:\n{}", problems.join("\n"));
    assert!(report.admissions > 0, "{name}: no admission at all");
    if scenario.shape.escrow_nodes == 0 {
        assert!(
            report.duplicates_checked > 0,
            "{name}: no duplicated request to check exactly-once on"
        );
    }
    assert!(
        report.max_ratio <= 1.0,
        "{name}: max ratio {}",
        report.max_ratio
    );
    if scenario.shape.limit <= 200 {
        // Saturating load: the healthy stretch uses (nearly) all of L.
        assert!(
            report.utilisation >= 0.9,
            "{name}: utilisation {}",
            report.utilisation
        );
    }
}

macro_rules! scenario_tests {
    ($($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                assert_scenario_holds(stringify!($name));
            }
        )*
    };
}

scenario_tests!(
    healthy,
    leader_isolation,
    follower_isolation,
    leader_one_way,
    lossy_network,
    leader_power_loss,
    full_power_loss,
    leader_pause,
    clock_skew,
    clock_drift,
    light_load,
    power_loss_mid_window,
    escrow_healthy,
    region_cut,
    escrow_leader_power_loss,
);

#[test]
fn every_scenario_has_a_test() {
    let tested = [
        "healthy",
        "leader_isolation",
        "follower_isolation",
        "leader_one_way",
        "lossy_network",
        "leader_power_loss",
        "full_power_loss",
        "leader_pause",
        "clock_skew",
        "clock_drift",
        "light_load",
        "power_loss_mid_window",
        "escrow_healthy",
        "region_cut",
        "escrow_leader_power_loss",
    ];
    for s in scenario::all() {
        assert!(tested.contains(&s.name), "scenario {} has no test", s.name);
    }
}

#[test]
fn credits_outliving_their_window_are_caught() {
    let scenario = scenario::by_name("light_load").expect("known scenario");
    let report = run_seeds(&scenario, 1, 1, Weakening::CreditsOutliveWindow);
    assert!(
        report
            .violations
            .iter()
            .any(|(_, v)| v.invariant == "credits_die_with_window"),
        "the suite missed credits spent after their window: {:?}",
        report.violations.first()
    );
}

#[test]
fn acknowledging_before_durable_is_caught() {
    let scenario = scenario::by_name("power_loss_mid_window").expect("known scenario");
    let report = run_seeds(&scenario, 4, 1, Weakening::AcknowledgeBeforeDurable);
    assert!(
        report
            .violations
            .iter()
            .any(|(_, v)| v.invariant == "no_forgotten_grant" || v.invariant == "delta"),
        "the suite missed grants lost by a disk that acknowledges before it is durable"
    );
}
