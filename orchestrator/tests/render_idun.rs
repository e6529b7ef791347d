//! The scripts `render` writes for the group's cluster: the `idun` entry of
//! the repository's clusters.yaml and an experiment's `slurm:` block give
//! exactly the `#SBATCH` lines of the group's own profiling launchers
//! (ModeS7/AIS4900_master, `IDUN/profiling/*.slurm@0ee6133`); a cluster's
//! `setup:` runs before the worker, every value one quoted word; and the
//! worker line passes the experiment's backend. Each test runs this build's
//! `orchestrator render`, which needs no connection to the cluster.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A one-config experiment (a tiny DiT that fits any GPU) with `extra` appended.
fn experiment(dir: &Path, name: &str, extra: &str) -> PathBuf {
    let file = dir.join(format!("{name}.yaml"));
    let yaml = format!(
        "name: {name}\ngpu: A100-SXM4-80GB\ninput: {{channels: 1, spatial: [8, 8, 8]}}\noutput_channels: 1\n\
         model: {{family: dit, hidden: 64, heads: 4, depth: 2, patch: 2}}\n{extra}"
    );
    std::fs::write(&file, yaml).expect("write the experiment");
    file
}

/// `orchestrator render FILE --clusters CLUSTERS` in the repository, its state in `dir`.
fn render(dir: &Path, file: &Path, clusters: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_orchestrator"))
        .current_dir(root())
        .env_remove("RUST_LOG")
        .env("NO_COLOR", "1")
        .arg("render")
        .arg(file)
        .arg("--clusters")
        .arg(clusters)
        .arg("--state-dir")
        .arg(dir.join("state"))
        .output()
        .expect("orchestrator runs")
}

/// The script `render` printed (one array: one script).
fn script(out: &Output) -> String {
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert_eq!(stdout.matches("\n#!/bin/bash\n").count(), 1, "one script: {stdout}");
    stdout
}

/// The `#SBATCH` lines a script asks SLURM for, less the orchestrator's own
/// (the job's name, comment, array, log, directory and one task per config).
fn resource_lines(script: &str) -> Vec<String> {
    let own = ["--job-name=", "--comment=", "--array=", "--output=", "--chdir=", "--ntasks=1"];
    script
        .lines()
        .filter(|l| l.starts_with("#SBATCH "))
        .filter(|l| !own.iter().any(|o| l["#SBATCH ".len()..].starts_with(o)))
        .map(str::to_string)
        .collect()
}

/// The DiT launcher's resources as an experiment's `slurm:` block on `idun`
/// (docs/clusters.md, "The group's cluster", shows this block and its lines).
const DIT_SLURM: &str = "\
cluster: idun
slurm:
  time: \"01:00:00\"
  mem: 64G
  extra: [--mail-user=me@example.org, --mail-type=END]
";

/// Each launcher of `IDUN/profiling/` at 0ee6133 (ModeS7/AIS4900_master):
/// its file, the `time` and `mem` it asks for (line 4 and line 7 or 8 of
/// each), and its mail lines, which an experiment gives as `extra`.
/// Partition (line 2), account (3), `--cpus-per-task=4`, `--gres=gpu:1` and
/// `--constraint="gpu80g"` are the same in all nine: the `idun` defaults.
const LAUNCHERS: [(&str, &str, &str, &[&str]); 9] = [
    ("profile_dit_memory.slurm", "01:00:00", "64G", &["--mail-user=me@example.org", "--mail-type=END"]),
    ("profile_hdit_uvit.slurm", "02:00:00", "32G", &[]),
    ("profile_latent_3d_unet.slurm", "01:00:00", "128G", &[]),
    ("profile_mamba.slurm", "02:00:00", "64G", &[]),
    ("profile_pixel_3d_unet.slurm", "02:00:00", "32G", &[]),
    ("profile_pixel_3d_unet_v2.slurm", "03:00:00", "32G", &[]),
    ("profile_s2d_3d.slurm", "02:00:00", "32G", &[]),
    ("profile_small_unet.slurm", "0-03:00:00", "64G", &["--mail-user=me@example.org", "--mail-type=ALL"]),
    ("sweep_vae3d_architectures.slurm", "01:00:00", "128G", &[]),
];

/// What a launcher asks SLURM for, in its own order (`--nodes=1`, one task
/// per node, is the orchestrator's `--ntasks=1`; `--constraint="gpu80g"`:
/// sbatch removes the quotes).
fn launcher_lines(time: &str, mem: &str, mail: &[&str]) -> Vec<String> {
    let mut want: Vec<String> = [
        "--partition=GPUQ".to_string(),
        "--account=share-ie-idi".to_string(),
        format!("--time={time}"),
        "--cpus-per-task=4".to_string(),
        format!("--mem={mem}"),
        "--gres=gpu:1".to_string(),
        "--constraint=gpu80g".to_string(),
    ]
    .into();
    want.extend(mail.iter().map(|m| m.to_string()));
    want.into_iter().map(|l| format!("#SBATCH {l}")).collect()
}

#[test]
fn idun_and_a_slurm_block_render_exactly_the_sbatch_lines_of_each_group_launcher() {
    let d = tempfile::tempdir().expect("tempdir");
    let clusters = root().join("clusters.yaml");
    for (launcher, time, mem, mail) in LAUNCHERS {
        let extra = if mail.is_empty() { String::new() } else { format!("  extra: [{}]\n", mail.join(", ")) };
        let slurm = format!("cluster: idun\nslurm:\n  time: \"{time}\"\n  mem: {mem}\n{extra}");
        if launcher == "profile_dit_memory.slurm" {
            assert_eq!(slurm, DIT_SLURM);
        }
        let name = launcher.trim_end_matches(".slurm").replace('_', "-");
        let out = render(d.path(), &experiment(d.path(), &name, &slurm), &clusters);
        let got = resource_lines(&script(&out));
        assert_eq!(got, launcher_lines(time, mem, mail), "{launcher}");
    }
}

#[test]
fn docs_show_the_lines_idun_renders() {
    let d = tempfile::tempdir().expect("tempdir");
    let out = render(d.path(), &experiment(d.path(), "dit", DIT_SLURM), &root().join("clusters.yaml"));
    let lines = resource_lines(&script(&out)).join("\n");
    let docs = std::fs::read_to_string(root().join("docs/clusters.md")).expect("docs/clusters.md");
    let section = docs.split("\n## The group's cluster\n").nth(1).expect("the section").split("\n## ").next();
    let section = section.expect("its text");
    assert!(section.contains(&format!("```yaml\n{DIT_SLURM}```\n")), "the slurm: block, as rendered here");
    assert!(section.contains(&format!("```text\n{lines}\n```\n")), "the lines it renders:\n{lines}");
}

#[test]
fn the_worker_line_passes_the_experiments_backend() {
    let d = tempfile::tempdir().expect("tempdir");
    let clusters = root().join("clusters.yaml");
    let worker = "exec /cluster/work/USERNAME/sweeps/bin/worker run --manifest ";
    let cases = [
        ("worker: {backend: vulkan}\n", Some("vulkan")),
        // The runtime the precheck predicts for names the backend when `worker:` does not.
        ("runtime: burn-vulkan\n", Some("vulkan")),
        ("runtime: burn-flex\n", Some("flex")),
        // `worker.backend` wins: it is what the worker is told.
        ("runtime: burn-vulkan\nworker: {backend: cuda}\n", Some("cuda")),
        // The group's runtime names no backend: the worker picks its first GPU one.
        ("", None),
    ];
    for (n, (extra, backend)) in cases.into_iter().enumerate() {
        let file = experiment(d.path(), &format!("b{n}"), &format!("cluster: idun\n{extra}"));
        let s = script(&render(d.path(), &file, &clusters));
        let line = s.lines().find(|l| l.starts_with(worker)).unwrap_or_else(|| panic!("{extra}: no worker line: {s}"));
        match backend {
            Some(b) => {
                assert!(line.ends_with(&format!(" --cache-dir \"$cache_dir\" --backend {b}")), "{extra}: {line}")
            }
            None => assert!(!line.contains("--backend"), "{extra}: {line}"),
        }
    }
}

/// An experiment that follows one of the group's scripts (`report_layout`)
/// has its configs measured as that script measured them: the worker line
/// names the protocol; the project's own layout names none.
#[test]
fn the_worker_line_names_the_protocol_of_the_script_the_sweep_follows() {
    let d = tempfile::tempdir().expect("tempdir");
    let clusters = root().join("clusters.yaml");
    let worker = "exec /cluster/work/USERNAME/sweeps/bin/worker run --manifest ";
    for (n, (layout, protocol)) in [
        ("report_layout: latent-unet\n", Some("latent-unet")),
        ("report_layout: s2d-unet\n", Some("s2d-unet")),
        ("report_layout: dit\n", Some("transformer")),
        ("report_layout: hdit-uvit\n", Some("transformer")),
        ("", None),
    ]
    .into_iter()
    .enumerate()
    {
        let file = experiment(d.path(), &format!("p{n}"), &format!("cluster: idun\n{layout}"));
        let s = script(&render(d.path(), &file, &clusters));
        let line = s.lines().find(|l| l.starts_with(worker)).unwrap_or_else(|| panic!("{layout}: no worker line: {s}"));
        match protocol {
            Some(p) => assert!(line.ends_with(&format!(" --protocol {p}")), "{layout}: {line}"),
            None => assert!(!line.contains("--protocol"), "{layout}: {line}"),
        }
    }
}

/// A cluster whose `setup:` tries every way a value could become code.
const SETUP_CLUSTERS: &str = r#"clusters:
  site:
    transport: ssh
    host: login.example.org
    work_dir: /w
    setup:
      module_purge: true
      modules: [CUDA/12.4.0, "x;id>pwned-module", "$(id>pwned-sub)"]
      env:
        VK_DRIVER_FILES: /opt/icd dir/nvidia_icd.json
        TRAP: "$(touch pwned-env)'`touch pwned-tick`\"\n; touch pwned-line"
        OMP_NUM_THREADS: 4
"#;

#[test]
fn site_setup_runs_before_the_worker_and_its_values_stay_data_in_bash() {
    let d = tempfile::tempdir().expect("tempdir");
    let clusters = d.path().join("clusters.yaml");
    std::fs::write(&clusters, SETUP_CLUSTERS).expect("write");
    let s = script(&render(d.path(), &experiment(d.path(), "setup", "cluster: site\n"), &clusters));
    let want = "\nset +u\nmodule purge\nmodule load CUDA/12.4.0\nmodule load 'x;id>pwned-module'\nmodule load '$(id>pwned-sub)'\nset -u\n\
                export OMP_NUM_THREADS=4\n";
    assert!(s.contains(want), "{s}");
    let (setup, exec) = (s.find("\nmodule purge\n").expect("setup"), s.find("\nexec ").expect("the worker line"));
    assert!(setup < exec, "{s}");

    // Run the script up to the worker in bash, `module` a function that logs
    // its arguments: the modules arrive as written, the values as data.
    let job = &s[s.find("#!/bin/bash\n").expect("a script")..];
    let head = &job[..job.find("\ncache_dir=").expect("the cache line")];
    let run = d.path().join("run");
    std::fs::create_dir(&run).expect("mkdir");
    let check = "printf '%s\\n' \"$VK_DRIVER_FILES\" \"$TRAP\" \"$OMP_NUM_THREADS\" > values";
    std::fs::write(run.join("job.sh"), format!("{head}\n{check}\n")).expect("write");
    let out = Command::new("bash")
        .current_dir(&run)
        .arg("-c")
        .arg("module() { printf '%s|' \"$@\" >> modules; echo >> modules; }; source ./job.sh")
        .output()
        .expect("bash runs");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let read = |f: &str| std::fs::read_to_string(run.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
    assert_eq!(read("modules"), "purge|\nload|CUDA/12.4.0|\nload|x;id>pwned-module|\nload|$(id>pwned-sub)|\n");
    let values = "/opt/icd dir/nvidia_icd.json\n$(touch pwned-env)'`touch pwned-tick`\"\n; touch pwned-line\n4\n";
    assert_eq!(read("values"), values);
    let pwned: Vec<_> = std::fs::read_dir(&run).expect("ls").filter_map(|e| e.ok()).map(|e| e.file_name()).collect();
    assert!(!pwned.iter().any(|f| f.to_string_lossy().starts_with("pwned")), "{pwned:?}");
}

#[test]
fn a_bad_setup_is_an_error_naming_the_file_the_cluster_and_the_field() {
    let d = tempfile::tempdir().expect("tempdir");
    let clusters = d.path().join("clusters.yaml");
    let file = experiment(d.path(), "bad", "cluster: site\n");
    let bad = SETUP_CLUSTERS.replace("OMP_NUM_THREADS: 4", "VK-ICD: x");
    std::fs::write(&clusters, &bad).expect("write");
    let out = render(d.path(), &file, &clusters);
    assert!(!out.status.success());
    let want = format!(
        "{}:2: cluster `site`: `setup.env`: \"VK-ICD\" is not a shell variable name (ASCII letters, digits and `_`, \
         not starting with a digit)",
        clusters.display()
    );
    assert!(text(&out.stderr).contains(&want), "{}", text(&out.stderr));
    std::fs::write(&clusters, SETUP_CLUSTERS.replace("[CUDA/12.4.0,", "[\"CUDA/12.4.0 Vulkan\",")).expect("write");
    let err = text(&render(d.path(), &file, &clusters).stderr);
    assert!(err.contains("cluster `site`: `setup.modules`: \"CUDA/12.4.0 Vulkan\" is not one module name"), "{err}");
    assert!(!d.path().join("state/bad/render").exists(), "nothing rendered");
}
