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

/// A light job template: each array task copies its manifest line to
/// `task-N.json` (no worker), then sleeps `$SWEEP_TEST_SLEEP` seconds (0 when unset).
#[allow(dead_code)] // not every cluster test file uses it
pub const RECORD_TEMPLATE: &str = r#"#!/bin/bash
#SBATCH --job-name={{sbatch job_name}}
#SBATCH --comment={{sbatch comment}}
#SBATCH --array={{sbatch array}}
#SBATCH --output={{sbatch log_dir}}/%a.out
#SBATCH --chdir={{sbatch submission_dir}}
#SBATCH --gres=gpu:1
#SBATCH --cpus-per-task=1
#SBATCH --time=00:05:00
{{#if slurm.partition}}
#SBATCH --partition={{sbatch slurm.partition}}
{{/if}}
set -eu
out={{sh submission_dir}}/task-$SLURM_ARRAY_TASK_ID.json
sed -n "$((SLURM_ARRAY_TASK_ID + 1))p" {{sh manifest_jsonl}} > "$out.tmp"
mv "$out.tmp" "$out"
sleep "${SWEEP_TEST_SLEEP:-0}"
"#;
