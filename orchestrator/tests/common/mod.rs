//! Shared by the cluster integration tests: where the test cluster is.

use std::collections::BTreeMap;
use std::path::Path;

/// The variables `scripts/test-cluster.sh up` wrote to its `env` file, or
/// `None` when the cluster is absent and skipping was asked for explicitly.
pub fn cluster_env() -> Option<BTreeMap<String, String>> {
    let dir = std::env::var("SWEEP_TEST_CLUSTER_DIR").unwrap_or_else(|_| "/tmp/sweep-test-cluster".into());
    let path = Path::new(&dir).join("env");
    let Ok(text) = std::fs::read_to_string(&path) else {
        if std::env::var("SWEEP_SKIP_CLUSTER_TESTS").is_ok_and(|v| v == "1") {
            eprintln!("SKIPPED: no test cluster at {dir} and SWEEP_SKIP_CLUSTER_TESTS=1");
            return None;
        }
        panic!(
            "no test cluster: {} is missing. Start it with `scripts/test-cluster.sh up` \
             (or set SWEEP_SKIP_CLUSTER_TESTS=1 to skip the cluster tests explicitly)",
            path.display()
        );
    };
    Some(
        text.lines()
            .filter_map(|l| l.strip_prefix("export "))
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    )
}
