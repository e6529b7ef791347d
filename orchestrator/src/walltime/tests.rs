use super::*;

const BASE: &str = "\
name: t
gpu: H100-80GB-HBM3
input: {channels: 1, spatial: [8, 8, 8]}
output_channels: 1
model: {family: dit, hidden: 64, heads: 4, depth: 2, patch: 2}
sweep:
  grid:
    batch: [1, 2, 3, 4, 5]
";

fn sweep(extra: &str) -> Sweep {
    crate::sweep::parse(std::path::Path::new("t.yaml"), &format!("{BASE}{extra}"), &[]).expect("the experiment loads")
}

fn start(t: f64, job: &str, cache: Option<&str>) -> String {
    let cache = cache.map(|c| format!(",\"kernel_cache\":\"{c}\"")).unwrap_or_default();
    format!(
        "{{\"event\":\"start\",\"t\":{t},\"config\":\"c\",\"config_hash\":\"0\",\"env\":{{\"host\":\"h\",\"device\":\"d\",\
         \"backend\":\"vulkan\",\"dtype\":\"f32\",\"grad_ckpt\":false{cache},\"slurm_job_id\":\"{job}\"}}}}\n"
    )
}

fn phase(phase: &str, step: u32, seconds: f64) -> String {
    format!("{{\"event\":\"phase_end\",\"t\":1.0,\"phase\":\"{phase}\",\"peak_bytes\":1,\"seconds\":{seconds},\"step\":{step}}}\n")
}

fn result(status: &str, wall_s: f64) -> String {
    format!(
        "{{\"event\":\"result\",\"t\":2.0,\"status\":\"{status}\",\"params\":1,\"peaks\":{{}},\"peak_bytes\":1,\"wall_s\":{wall_s}}}\n"
    )
}

#[test]
fn a_gpu_task_of_k_configs_is_one_cold_and_k_minus_one_warm_by_default() {
    let s = suggest(
        &sweep("runtime: burn-vulkan\nworker: {configs_per_task: 3}\nslurm: {time: \"00:10:00\"}\n"),
        &Measured::default(),
        Some("00:10:00"),
    );
    // (400 + 2 x 90) x 1.5 = 870 s: 15 minutes (whole minutes, rounded up).
    assert_eq!((s.configs, s.limit_s), (3, 900));
    assert_eq!(s.too_short(), Some("00:10:00"));
    let text = s.to_string();
    assert!(
        text.starts_with(
            "time: suggest 00:15:00 per task (3 configs: 1 cold x 400 s + 2 warm x 90 s, +50%); \
             slurm.time 00:10:00 is too short\n"
        ),
        "{text}"
    );
    assert!(text.contains("docs/gpu.md") && text.contains("default"), "{text}");
    assert!(s.warning().is_some_and(|w| w.contains("slurm.time 00:10:00 is shorter than the 00:15:00")));
    // One config a task, and a long enough limit: no warning.
    let s = suggest(&sweep("runtime: burn-vulkan\n"), &Measured::default(), Some("1:00:00"));
    assert_eq!((s.configs, s.limit_s, s.too_short()), (1, 600, None));
    assert!(s.to_string().contains("(1 config: 1 cold x 400 s, +50%); slurm.time 1:00:00 is enough\n"), "{s}");
    // K beyond the sweep: a task runs at most every config.
    let s = suggest(&sweep("runtime: burn-vulkan\nworker: {configs_per_task: 9}\n"), &Measured::default(), None);
    assert_eq!(s.configs, 5);
    assert!(s.to_string().contains("no slurm.time set"), "{s}");
}

#[test]
fn the_cpu_backend_compiles_nothing_cold_is_warm() {
    let s = suggest(&sweep("runtime: burn-flex\nworker: {configs_per_task: 2}\n"), &Measured::default(), None);
    assert_eq!((s.cold.seconds, s.warm.seconds, s.limit_s), (60.0, 60.0, 180));
    let s = suggest(&sweep("worker: {backend: flex}\n"), &Measured::default(), None);
    assert_eq!(s.cold.seconds, 60.0, "the worker's backend decides, whatever the runtime");
}

#[test]
fn measured_runs_are_cold_or_warm_by_cache_and_by_their_place_in_the_job() {
    let mut files = Vec::new();
    let mut write = |_run: &str, text: String| files.push(text.into_bytes());
    // Job 7 ran a, b (in turn, one process); job 8 ran c with a reused cache;
    // d was killed (no result) and then retried cold in job 9, training two steps.
    write("a", format!("{}{}", start(10.0, "7", Some("fresh")), result("ok", 300.0)));
    write("b", format!("{}{}", start(320.0, "7", Some("fresh")), result("ok", 20.0)));
    write("c", format!("{}{}", start(50.0, "8", Some("reused")), result("ok", 35.0)));
    let d_runs = format!(
        "{}{}{}{}{}{}{}",
        start(1.0, "6", None),
        start(60.0, "9", None),
        phase("fwd", 0, 100.0),
        phase("bwd", 0, 150.0),
        phase("fwd", 1, 4.0),
        phase("bwd", 1, 6.0),
        result("ok", 280.0)
    );
    write("d", d_runs);
    write("e", format!("{}{}", start(5.0, "10", None), result("oom", 999.0)));
    let replayed = start(7.0, "11", None).replace("\"backend\":\"vulkan\"", "\"backend\":\"replay\"");
    write("f", format!("{replayed}{}", result("ok", 0.0)));
    let m = measured(&files, false);
    let mut cold = m.cold.clone();
    cold.sort_by(f64::total_cmp);
    assert_eq!(cold, [280.0, 300.0], "an oom's, a killed or a replayed run's time is not a config's");
    let mut warm = m.warm.clone();
    warm.sort_by(f64::total_cmp);
    assert_eq!(warm, [20.0, 35.0]);
    // 280 s less (100 - 4) + (150 - 6) s of compiling.
    assert_eq!(m.warm_from_steps, [40.0]);
    let s = suggest(&sweep("runtime: burn-vulkan\nworker: {configs_per_task: 3}\n"), &m, Some("00:20:00"));
    assert_eq!((s.cold.seconds, s.warm.seconds), (300.0, 35.0));
    assert_eq!(s.limit_s, 600, "(300 + 2 x 35) x 1.5 = 555 s, up to 10 minutes");
    assert!(s.to_string().ends_with(
        "time: cold 300 s from the slowest of this sweep's 2 cold runs; warm 35 s from the slowest of this sweep's 2 warm runs"
    ), "{s}");
    assert_eq!(s.too_short(), None);
    // Without warm runs, the cold runs' second steps tell the warm time.
    let only_cold = Measured { warm: vec![], ..m };
    let s = suggest(&sweep("runtime: burn-vulkan\n"), &only_cold, None);
    assert_eq!(s.warm.seconds, 40.0);
    assert!(s.warm.from.contains("compile share"), "{}", s.warm.from);
}

/// A run of the CPU backend (`flex`), as the `local` cluster runs it.
fn cpu_start(t: f64, job: &str, cache: Option<&str>) -> String {
    start(t, job, cache).replace("\"backend\":\"vulkan\"", "\"backend\":\"flex\"")
}

/// The demo on the `local` cluster: one config a task, the first in 0.6 s;
/// the later ones found the (CPU) kernel cache "reused", yet the CPU compiles
/// nothing: every run is cold, and the slowest, 3.4 s, sizes a task.
#[test]
fn on_the_cpu_every_run_is_cold_and_the_slowest_sizes_the_task() {
    let walls = [0.6, 3.4, 0.2, 0.3, 0.4, 0.2];
    let files: Vec<Vec<u8>> = walls
        .iter()
        .enumerate()
        .map(|(i, wall)| {
            let cache = if i == 0 { "fresh" } else { "reused" };
            format!("{}{}", cpu_start(10.0 + i as f64, &format!("{}", 1001 + i), Some(cache)), result("ok", *wall))
                .into_bytes()
        })
        .collect();
    let cpu = sweep("runtime: burn-flex\n");
    let s = for_sweep(&cpu, &files, None);
    assert_eq!((s.cold.seconds, s.warm.seconds), (3.4, 3.4), "{s}");
    assert!(s.to_string().ends_with("time: cold 3.4 s from the slowest of this sweep's 6 cold runs"), "{s}");
    // Three a task: 3 x 3.4 s x 1.5 = 15.3 s, a minute.
    let s = for_sweep(&sweep("runtime: burn-flex\nworker: {configs_per_task: 3}\n"), &files, None);
    assert_eq!((s.cold.seconds, s.warm.seconds, s.limit_s), (3.4, 3.4, 60), "{s}");
}

/// A GPU sweep whose first config is its smallest: a later, larger one
/// found the kernel cache (warm) and still took longest. No config runs
/// quicker cold than warm: the cold figure is that run's.
#[test]
fn a_slow_warm_run_raises_the_cold_figure() {
    let files = vec![
        format!("{}{}", start(10.0, "7", Some("fresh")), result("ok", 30.0)).into_bytes(),
        format!("{}{}", start(50.0, "8", Some("reused")), result("ok", 200.0)).into_bytes(),
    ];
    let s = for_sweep(&sweep("runtime: burn-vulkan\n"), &files, None);
    assert_eq!(s.cold.seconds, 200.0, "{s}");
    assert_eq!(s.limit_s, 300, "200 s x 1.5, to the minute");
    assert!(s.cold.from.starts_with("the slowest of this sweep's 2 runs, a warm one (1 cold run"), "{s}");
}

/// `--cluster local` runs a `runtime: pytorch` sweep with the worker on this
/// machine's CPU: its time comes from this CPU (its default, then its own
/// runs), not an H100's 400 s, and not from the sweep's GPU runs.
#[test]
fn on_the_local_cluster_the_time_is_this_cpus() {
    let mut local = sweep("runtime: pytorch\n");
    assert!(!local.experiment.runtime.is_cpu());
    assert_eq!(for_sweep(&local, &[], None).cold.seconds, 400.0, "planned for its GPU");
    local.host_memory_gib = Some(16.0);
    let s = for_sweep(&local, &[], None);
    assert_eq!(s.cold.seconds, 60.0, "{s}");
    assert!(s.cold.from.starts_with("the CPU backend's default"), "{s}");
    let files = vec![
        format!("{}{}", start(10.0, "7", Some("fresh")), result("ok", 300.0)).into_bytes(),
        format!("{}{}", cpu_start(20.0, "8", None), result("ok", 12.0)).into_bytes(),
    ];
    let s = for_sweep(&local, &files, None);
    assert_eq!(s.cold.seconds, 12.0, "this CPU's run, not the GPU's: {s}");
}

#[test]
fn slurm_times_parse_in_every_form_slurm_takes() {
    for (text, secs) in [
        ("30", Some(1800)),
        ("30:15", Some(1815)),
        ("01:00:00", Some(3600)),
        ("2-0", Some(172_800)),
        ("1-2:30", Some(95_400)),
        ("1-00:00:05", Some(86_405)),
    ] {
        assert_eq!(parse_slurm_time(text), Some(secs), "{text}");
    }
    assert_eq!(parse_slurm_time("UNLIMITED"), Some(None));
    for bad in ["", "1h", "1:2:3:4", "-5", "a-01:00", "1-"] {
        assert_eq!(parse_slurm_time(bad), None, "{bad}");
    }
    assert_eq!(hms(780), "00:13:00");
    assert_eq!(hms(90_061), "1-01:01:01");
    let s = suggest(&sweep("runtime: burn-vulkan\n"), &Measured::default(), Some("soon"));
    assert!(s.to_string().contains("slurm.time `soon` is not a SLURM time"), "{s}");
    assert_eq!(s.too_short(), None);
}
