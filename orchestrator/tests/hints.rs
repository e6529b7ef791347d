//! Every command the tool prints runs as printed, from any directory (issue
//! 52): a sweep run with `--state-dir` and `--clusters` other than the
//! defaults, stopped by Ctrl-C, prints commands that carry both (absolute),
//! and each, pasted into a shell in another directory, reaches the same
//! sweep: the active loop goes on where it stopped with no config submitted
//! twice, `status --watch` shows the configs that run, `cancel` stops them.
//! A sweep remembers the clusters file it was submitted with. And an active
//! round stopped by `cancel` is said as cancelled, not as failed, with the
//! command that runs it again.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// A sweep's directory (experiment, clusters file `mine.yaml`, state in
/// `runs/`), and another directory the printed commands run from.
struct World {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    elsewhere: PathBuf,
}

impl World {
    /// `mine.yaml` declares `rp` (the group's records replayed) and `laptop`
    /// (the local cluster running `worker.sh`, which sleeps `sleep` s a config).
    fn new(sleep: f64) -> World {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().expect("tempdir");
        let (dir, elsewhere) = (tmp.path().join("sweep"), tmp.path().join("elsewhere"));
        std::fs::create_dir_all(&dir).expect("sweep dir");
        std::fs::create_dir_all(&elsewhere).expect("another dir");
        let worker = dir.join("worker.sh");
        let script = format!(
            "#!/bin/sh\ncase \"$1\" in --version) echo 'worker 0.1.0'; exit 0;; backends) echo flex; exit 0;; esac\n\
             sleep {sleep}\n"
        );
        std::fs::write(&worker, script).expect("fake worker");
        std::fs::set_permissions(&worker, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let clusters = format!(
            "clusters:\n  laptop: {{transport: local, worker: {}, max_parallel: 8}}\n  rp: {{transport: replay, records: {}}}\n",
            worker.display(),
            root.join("data/vram-measurements.jsonl").display()
        );
        std::fs::write(dir.join("mine.yaml"), clusters).expect("clusters file");
        std::fs::copy(root.join("experiments/exp13.yaml"), dir.join("exp13.yaml")).expect("exp13");
        let tiny = "name: tiny\ndescription: hints test\ncluster: laptop\ngpu: A100-40GB\nprecision: fp32\n\
                    runtime: burn-flex\nworker: {backend: flex}\ninput: {channels: 1, spatial: [16, 16, 16]}\n\
                    output_channels: 1\nmodel: {family: unet, channels: [32, 64], attention_levels: [false, false], \
                    num_res_blocks: 1, num_head_channels: 32}\nsweep:\n  name: \"b{batch}\"\n  grid:\n    batch: [1, 2, 3, 4, 5, 6]\n";
        std::fs::write(dir.join("tiny.yaml"), tiny).expect("tiny experiment");
        World { _tmp: tmp, dir, elsewhere }
    }

    /// The orchestrator in the sweep's directory, with its state and clusters file.
    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_orchestrator"));
        c.args(args).args(["--state-dir", "runs", "--clusters", "mine.yaml", "--result-grace", "0"]);
        c.current_dir(&self.dir).stdin(Stdio::null());
        c
    }

    /// [`World::command`] run to its end, Ctrl-C sent at `signal_at` (a debug build's signal point).
    fn run(&self, args: &[&str], signal_at: Option<&str>) -> Output {
        let mut c = self.command(args);
        if let Some(step) = signal_at {
            c.env("ORCHESTRATOR_SIGNAL_AT", step);
        }
        c.output().expect("orchestrator runs")
    }

    /// How many times each config of `exp` started (`start` events in its run directory).
    fn starts(&self, exp: &str) -> Vec<usize> {
        let runs = self.dir.join("runs").join(exp).join("runs");
        let Ok(dirs) = std::fs::read_dir(&runs) else { return vec![] };
        dirs.map(|d| {
            let events = std::fs::read_to_string(d.expect("run dir").path().join("events.jsonl")).unwrap_or_default();
            events.lines().filter(|l| l.contains("\"event\":\"start\"")).count()
        })
        .collect()
    }

    /// Whether anything was written in the other directory (a fresh `./state`).
    fn elsewhere_is_empty(&self) -> bool {
        std::fs::read_dir(&self.elsewhere).expect("another dir").next().is_none()
    }
}

/// The commands in backticks in `text` that start with `orchestrator `.
fn printed_commands(text: &str) -> Vec<String> {
    text.split('`').skip(1).step_by(2).filter(|c| c.starts_with("orchestrator ")).map(String::from).collect()
}

/// The printed command that starts with `orchestrator <verb> ` (the first).
fn printed(text: &str, verb: &str) -> String {
    let prefix = format!("orchestrator {verb} ");
    printed_commands(text).into_iter().find(|c| c.starts_with(&prefix)).unwrap_or_else(|| {
        panic!("no `{prefix}...` printed:\n{text}");
    })
}

/// `line` pasted into a shell in `cwd`, `orchestrator` on PATH being this build's.
fn paste(line: &str, cwd: &Path, signal_at: Option<&str>) -> Output {
    let bin = Path::new(env!("CARGO_BIN_EXE_orchestrator")).parent().expect("bin dir").to_path_buf();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let mut c = Command::new("sh");
    c.args(["-c", line]).env("PATH", path).env_remove("SWEEP_CLUSTERS").current_dir(cwd).stdin(Stdio::null());
    if let Some(step) = signal_at {
        c.env("ORCHESTRATOR_SIGNAL_AT", step);
    }
    c.output().expect("sh runs")
}

#[test]
fn an_interrupted_active_sweep_goes_on_from_another_directory_as_printed_and_submits_nothing_twice() {
    let w = World::new(0.0);
    // One config a round: the loop needs several.
    let args = ["submit", "exp13.yaml", "--cluster", "rp", "--active", "--poll-interval", "0.2", "--round-size", "1"];
    let out = w.run(&args, Some("active:submitting"));
    let text = common::text(&out);
    assert_eq!(out.status.code(), Some(130), "{text}");
    let goes_on = printed(&text, "submit");
    let state = w.dir.join("runs");
    for part in [
        format!("{}", w.dir.join("exp13.yaml").display()),
        "--active --round-size 1 --cluster rp".into(),
        format!("--state-dir {}", state.display()),
        format!("--clusters {}", w.dir.join("mine.yaml").display()),
    ] {
        assert!(goes_on.contains(&part), "`{goes_on}` lacks `{part}`");
    }
    let first = w.starts("exp13");
    assert!(!first.is_empty() && first.iter().all(|&n| n == 1), "round 1 ran each config once: {first:?}");
    // Pasted in another directory: the same sweep goes on from round 2.
    let out = paste(&goes_on, &w.elsewhere, None);
    let again = common::text(&out);
    assert!(out.status.success(), "`{goes_on}`:\n{again}");
    assert!(again.contains("round 2:") && !again.contains("round 1:"), "it goes on, not over:\n{again}");
    assert!(again.contains("active sweep exp13: stopped after"), "{again}");
    assert!(w.elsewhere_is_empty(), "nothing written where it was pasted");
    let all = w.starts("exp13");
    assert!(all.len() > first.len() && all.iter().all(|&n| n == 1), "no config started twice: {all:?}");
    // status finds the sweep's cluster without --clusters: the sweep remembers its file.
    let status = format!("orchestrator status exp13 --state-dir {}", state.display());
    let out = paste(&status, &w.elsewhere, None);
    assert!(out.status.success(), "`{status}`:\n{}", common::text(&out));
    assert!(common::text(&out).contains("COMPLETED"), "{}", common::text(&out));
}

#[test]
fn the_status_and_cancel_an_interrupted_sweep_prints_reach_its_running_configs_from_another_directory() {
    let w = World::new(30.0);
    let args = ["submit", "tiny.yaml", "--active", "--poll-interval", "0.2", "--round-size", "2"];
    let out = w.run(&args, Some("active:submitting"));
    let text = common::text(&out);
    assert_eq!(out.status.code(), Some(130), "{text}");
    assert!(text.contains("still running: 1 config (b6)"), "{text}");
    // `status --watch` as printed, stopped by Ctrl-C after its first poll: the running configs.
    let watch = printed(&text, "status");
    assert!(watch.contains(" --state-dir /") && watch.contains(" --clusters /"), "{watch}");
    let out = paste(&watch, &w.elsewhere, Some("watch:waiting"));
    let watched = common::text(&out);
    assert_eq!(out.status.code(), Some(130), "`{watch}`:\n{watched}");
    assert!(watched.lines().any(|l| l.starts_with("b6 ") && l.contains("RUNNING")), "`{watch}`:\n{watched}");
    // What that watch prints runs as printed too.
    let again = printed(&watched, "status");
    assert_eq!(again, watch, "{watched}");
    let cancel = printed(&watched, "cancel");
    let out = paste(&cancel, &w.elsewhere, None);
    assert!(common::text(&out).contains("cancelled 1 job array(s)"), "`{cancel}`:\n{}", common::text(&out));
    assert!(w.elsewhere_is_empty(), "nothing written where they were pasted");
}

#[test]
fn an_active_round_stopped_by_cancel_is_said_as_cancelled_with_the_command_that_runs_it_again() {
    use std::io::BufRead;
    let w = World::new(30.0);
    let args = ["submit", "tiny.yaml", "--active", "--poll-interval", "0.2", "--round-size", "2"];
    let mut child = w.command(&args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn");
    let stdout = std::io::BufReader::new(child.stdout.take().expect("stdout"));
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || stdout.lines().map_while(Result::ok).try_for_each(|l| tx.send(l)));
    let mut text = String::new();
    while !text.contains("round 1:") {
        text += &format!("{}\n", lines.recv_timeout(std::time::Duration::from_secs(60)).expect("round 1 begins"));
    }
    // Its round submitted (the state says so), `cancel`.
    let running = || common::text(&w.run(&["status", "tiny"], None)).contains("RUNNING");
    let t0 = std::time::Instant::now();
    while !running() {
        assert!(t0.elapsed() < std::time::Duration::from_secs(60), "round 1 never ran");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let cancel = w.run(&["cancel", "tiny"], None);
    assert!(common::text(&cancel).contains("cancelled 1 job array(s)"), "{}", common::text(&cancel));
    let out = child.wait_with_output().expect("the loop ends");
    text += &lines.iter().map(|l| format!("{l}\n")).collect::<String>();
    text += &common::text(&out);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("round 1: 0 measured, 1 stopped by `cancel`"), "{text}");
    assert!(text.contains("stopped after 1 round: `cancel` stopped the last round's runs"), "{text}");
    assert!(text.contains("1 config was stopped by `cancel` before it measured (b6)"), "{text}");
    assert!(!text.contains("failed") && !text.contains("could not be measured"), "cancelled is not failed:\n{text}");
    // How to run them again, as a command that runs as printed.
    let again = printed(&text, "resume");
    assert!(again.contains(" --retry-cancelled") && again.contains(" --state-dir /"), "{again}");
    let out = paste(&again, &w.elsewhere, None);
    let resumed = common::text(&out);
    assert!(out.status.success() && resumed.contains("submitted "), "`{again}`:\n{resumed}");
    assert!(!resumed.contains("cancelled by `cancel`"), "`{again}` runs the cancelled configs:\n{resumed}");
    w.run(&["cancel", "tiny"], None);
    // The report says the same.
    let out = Command::new(env!("CARGO_BIN_EXE_orchestrator"))
        .args(["report", "tiny", "--state-dir", "runs"])
        .current_dir(&w.dir)
        .output()
        .expect("report runs");
    let md = std::fs::read_to_string(w.dir.join("runs/tiny/report/report.md"))
        .unwrap_or_else(|_| panic!("{}", common::text(&out)));
    let section = md.split("## Active sweep").nth(1).expect("the active section");
    assert!(section.contains("1 config was stopped by `cancel` before it measured (b6)"), "{section}");
    assert!(!section.contains("could not be measured"), "{section}");
}
