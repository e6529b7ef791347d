//! The group's training launchers as `command:` sweeps on `idun`: `render`
//! of `experiments/train/exp9_1_ldm_4x_bravo.yaml`, `exp9_ldm_8x_bravo.yaml`,
//! `exp13_dit_4x_bravo.yaml` and `exp16_hdit_pixel_bravo.yaml` against the
//! facts of the launcher each cites (ModeS7/AIS4900_master,
//! `IDUN/train/diffusion_3d/*.slurm`, each at the commit its run ran), line by
//! line in substance: every `#SBATCH` line, the setup lines (run in `bash`,
//! `module` and `conda` stubs that log their arguments), the environment, the
//! command's words (through `bash`: the script runs up to its worker line,
//! which prints its words instead of running), the resume word, the chain's
//! settings, and `bash -n` on the whole script. Each test runs this build's
//! `orchestrator render`, which needs no connection to the cluster.
//!
//! What differs from the launchers in form, not in what the trainer is asked
//! to do (docs/training-sweeps.md, "The group's launchers"):
//! - The chain. A launcher traps SIGUSR1 in its own shell (`trap
//!   handle_timeout SIGUSR1`), passes it on to the backgrounded `python` (`&`,
//!   `wait $PID`), then resubmits itself with `sbatch --export=ALL,
//!   CHAIN_RUN_DIR=…,CHAIN_COUNT=N+1 "$0"`: a new job id each segment, and the
//!   next segment may start while the last is still ending. The rendered
//!   script `exec`s `worker watch`, which forwards the signal and, the segment
//!   over, requeues the same job (`scontrol requeue`, `--requeue`,
//!   `--open-mode=append`): one job id for the whole chain, never two
//!   segments at once, the segment count in the state directory instead of
//!   `CHAIN_COUNT` in the environment. `--chain-max` is `CHAIN_MAX` (segments
//!   0 to `CHAIN_MAX`-1: `NEXT_COUNT -ge CHAIN_MAX` stops).
//! - The run directory. A launcher makes `CHAIN_RUN_DIR` from a timestamp on
//!   its first segment and passes it on in the environment; the rendered
//!   command's `hydra.run.dir=` is the config's run directory under the
//!   cluster's state directory, the same every segment.
//! - The resume condition. A launcher adds `training.resume_from=` when the
//!   checkpoint exists and is not empty (`[ -f ] && [ -s ]`); the worker adds
//!   the resume word once the checkpoint exists.
//! - `time python …` (the shell's timing) and `nvidia-smi`, `python -c
//!   "import torch…"` and the `echo` lines are not run; for `cd
//!   ${SLURM_SUBMIT_DIR}` the command runs in its run directory (a chain's;
//!   exp9 8x in the submission's, `--chdir=`): the trainer's paths are
//!   absolute (`configs/paths/cluster.yaml`); `--nodes=1`
//!   is `--ntasks=1`; `--job-name`, `--output`, `--error` are the
//!   orchestrator's; `--mail-user=` is left to the user (SLURM mails the
//!   submitting user); `--constraint="gpu80g"` and `B:SIGUSR1` are written
//!   `gpu80g` and `B:USR1` (the same request to sbatch).
//! - A Hydra list is written without spaces (`model.channels=[128,256,512,1024]`
//!   where the launcher writes `'model.channels=[128, 256, 512, 1024]'`):
//!   the same list to Hydra's override parser.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The `idun` entry's state directory (its `work_dir` + `/state`): the run
/// directories are under it.
const STATE: &str = "/cluster/work/USERNAME/sweeps/state";
/// The worker `install --cluster idun` uploads (`<work_dir>/bin/worker`).
const WORKER: &str = "/cluster/work/USERNAME/sweeps/bin/worker";

/// One launcher's facts: each `#SBATCH` line as the launcher writes it with
/// its line number, its setup lines, its environment, the words of its
/// command as its shell makes them (`{run_dir}`: the config's run
/// directory), and its chain.
struct Launcher {
    /// `experiments/train/<file>.yaml`.
    file: &'static str,
    /// `IDUN/train/diffusion_3d/<launcher>.slurm@<commit>`.
    cite: &'static str,
    /// The precheck calls the config `risky`: render it all the same.
    risky: bool,
    sbatch: &'static [(&'static str, u32)],
    setup: &'static [(&'static str, u32)],
    env: (&'static str, u32),
    words: &'static [&'static str],
    /// `CHAIN_MAX` and its line; `None`: the launcher does not chain.
    chain_max: Option<(u32, u32)>,
}

/// `module purge`, `module load Anaconda3/2024.02-1`, `conda activate AIS4900`.
const SETUP: [&str; 3] = ["module purge", "module load Anaconda3/2024.02-1", "conda activate AIS4900"];

/// The VQ-VAE 4x checkpoint the latent launchers set (`COMPRESSION_CHECKPOINT=`).
const VQVAE_4X: &str = "latent.compression_checkpoint=/cluster/work/modestas/AIS4900_master/runs/compression_3d/\
                        multi_modality/exp8_1_256x160_20260107-031153/checkpoint_latest.pt";

const LAUNCHERS: [Launcher; 4] = [
    Launcher {
        file: "exp9_1_ldm_4x_bravo",
        cite: "IDUN/train/diffusion_3d/exp9_1_ldm_4x_bravo.slurm@5a12385",
        risky: false,
        sbatch: &[
            ("--partition=GPUQ", 2),
            ("--account=share-ie-idi", 3),
            ("--time=0-12:00:00", 4),
            ("--nodes=1", 5),
            ("--cpus-per-task=8", 6),
            ("--mem=64G", 7),
            ("--gres=gpu:1", 8),
            ("--constraint=\"gpu80g\"", 9),
            ("--job-name=\"exp9_1_ldm_4x\"", 10),
            ("--output=IDUN/output/train/diffusion_3d/exp9_1_ldm_4x_bravo/%j.out", 11),
            ("--error=IDUN/output/train/diffusion_3d/exp9_1_ldm_4x_bravo/%j.err", 12),
            ("--mail-user=modestas@stud.ntnu.no", 13),
            ("--mail-type=ALL", 14),
            ("--signal=B:SIGUSR1@120", 15),
        ],
        setup: &[(SETUP[0], 72), (SETUP[1], 73), (SETUP[2], 74)],
        env: ("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True", 79),
        // :98-116, `${COMPRESSION_CHECKPOINT}` as :82 sets it, `${EXP_NAME}`
        // as :20, `${CHAIN_ARGS}` :29 (`training.resume_from=`, :32, is the
        // worker's resume word).
        words: &[
            "python",
            "-m",
            "medgen.scripts.train",
            "--config-name=diffusion_3d",
            "paths=cluster",
            "strategy=rflow",
            "mode=bravo_seg_cond",
            "training.epochs=500",
            "training.gradient_clip_norm=0.5",
            "training.warmup_epochs=10",
            "latent.enabled=true",
            VQVAE_4X,
            "latent.compression_type=vqvae",
            "latent.auto_encode=true",
            "latent.validate_cache=true",
            "model.channels=[128, 256, 512, 1024]",
            "model.attention_levels=[false, false, true, true]",
            "model.num_res_blocks=[2, 2, 2, 2]",
            "model.num_head_channels=32",
            "model.norm_num_groups=32",
            "training.name=exp9_1_ldm_4x_bravo_",
            "hydra.run.dir={run_dir}",
        ],
        chain_max: Some((20, 18)),
    },
    Launcher {
        file: "exp9_ldm_8x_bravo",
        cite: "IDUN/train/diffusion_3d/exp9_ldm_8x_bravo.slurm@119d4a9",
        // 69.9 GiB predicted on 79.2 (docs/training.md); the run recorded 67.7.
        risky: true,
        sbatch: &[
            ("--partition=GPUQ", 2),
            ("--account=share-ie-idi", 3),
            ("--time=7-00:00:00", 4),
            ("--nodes=1", 5),
            ("--cpus-per-task=8", 6),
            ("--mem=64G", 7),
            ("--gres=gpu:1", 8),
            ("--constraint=\"gpu80g\"", 9),
            ("--job-name=\"exp9_ldm_8x_bravo\"", 10),
            ("--output=IDUN/output/train/diffusion_3d/exp9_ldm_8x_bravo_%j.out", 11),
            ("--error=IDUN/output/train/diffusion_3d/exp9_ldm_8x_bravo_%j.err", 12),
            ("--mail-user=modestas@stud.ntnu.no", 13),
            ("--mail-type=ALL", 14),
        ],
        setup: &[(SETUP[0], 24), (SETUP[1], 25), (SETUP[2], 26)],
        env: ("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True", 31),
        // :50-73, `${COMPRESSION_CHECKPOINT}` as :34 sets it; no run
        // directory: Hydra's default names it (configs/diffusion_3d.yaml@119d4a9:60).
        words: &[
            "python",
            "-m",
            "medgen.scripts.train",
            "--config-name=diffusion_3d",
            "paths=cluster",
            "strategy=rflow",
            "mode=bravo_seg_cond",
            "training.epochs=500",
            "training.learning_rate=1e-4",
            "training.batch_size=1",
            "training.gradient_checkpointing=true",
            "latent.enabled=true",
            "latent.compression_checkpoint=/cluster/work/modestas/AIS4900_master/runs/compression_3d/\
             multi_modality/exp8_14_256x160_20260112-121110/checkpoint_latest.pt",
            "latent.compression_type=vqvae",
            "latent.auto_encode=true",
            "latent.validate_cache=true",
            "model.channels=[512, 1024, 2048]",
            "model.attention_levels=[false, true, true]",
            "model.num_res_blocks=[3, 3, 3]",
            "model.num_head_channels=64",
            "model.norm_num_groups=32",
            "training.logging.regional_losses=true",
            "training.generation_metrics.enabled=true",
            "training.generation_metrics.samples_per_epoch=1",
            "training.generation_metrics.samples_extended=4",
            "training.generation_metrics.samples_test=10",
            "training.name=exp9_ldm_8x_bravo_",
        ],
        chain_max: None,
    },
    Launcher {
        file: "exp13_dit_4x_bravo",
        cite: "IDUN/train/diffusion_3d/exp13_dit_4x_bravo.slurm@c3fee1e",
        risky: false,
        sbatch: &[
            ("--partition=GPUQ", 2),
            ("--account=share-ie-idi", 3),
            ("--time=0-12:00:00", 4),
            ("--nodes=1", 5),
            ("--cpus-per-task=8", 6),
            ("--mem=32G", 7),
            ("--gres=gpu:1", 8),
            ("--constraint=\"gpu80g\"", 9),
            ("--job-name=\"exp13_dit_4x\"", 10),
            ("--mail-user=modestas@stud.ntnu.no", 11),
            ("--mail-type=ALL", 12),
            ("--output=IDUN/output/train/diffusion_3d/exp13_dit_4x_bravo/%j.out", 13),
            ("--error=IDUN/output/train/diffusion_3d/exp13_dit_4x_bravo/%j.err", 14),
            ("--signal=B:SIGUSR1@120", 15),
            ("--exclude=idun-06-02", 16),
        ],
        setup: &[(SETUP[0], 72), (SETUP[1], 73), (SETUP[2], 74)],
        env: ("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True", 76),
        // :97-109, `${COMPRESSION_CHECKPOINT}` as :79 sets it, `${EXP_NAME}`
        // as :21, `${CHAIN_ARGS}` :30 (`training.resume_from=`, :33).
        words: &[
            "python",
            "-m",
            "medgen.scripts.train",
            "--config-name=diffusion_3d",
            "paths=cluster",
            "mode=bravo_seg_cond",
            "model=dit_3d",
            "model.variant=S",
            "model.patch_size=2",
            "latent.enabled=true",
            VQVAE_4X,
            "latent.compression_type=vqvae",
            "training.gradient_checkpointing=false",
            "training.use_compile=true",
            "training.name=exp13_dit_4x_bravo_",
            "hydra.run.dir={run_dir}",
        ],
        chain_max: Some((20, 19)),
    },
    Launcher {
        file: "exp16_hdit_pixel_bravo",
        cite: "IDUN/train/diffusion_3d/exp16_hdit_pixel_bravo.slurm@be87cde",
        risky: false,
        sbatch: &[
            ("--partition=GPUQ", 2),
            ("--account=share-ie-idi", 3),
            ("--time=5-00:00:00", 4),
            ("--nodes=1", 5),
            ("--cpus-per-task=8", 6),
            ("--mem=32G", 7),
            ("--gres=gpu:1", 8),
            ("--constraint=\"gpu80g\"", 9),
            ("--job-name=\"exp16_hdit3d\"", 10),
            ("--output=IDUN/output/train/diffusion_3d/exp16_hdit_pixel_bravo/%j.out", 11),
            ("--error=IDUN/output/train/diffusion_3d/exp16_hdit_pixel_bravo/%j.err", 12),
            ("--mail-user=modestas@stud.ntnu.no", 13),
            ("--mail-type=ALL", 14),
            ("--exclude=idun-06-02", 15),
            ("--signal=B:SIGUSR1@120", 16),
        ],
        setup: &[(SETUP[0], 72), (SETUP[1], 73), (SETUP[2], 74)],
        env: ("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True", 76),
        // :94-110, `${EXP_NAME}` as :21, `${CHAIN_ARGS}` :30
        // (`training.resume_from=`, :33).
        words: &[
            "python",
            "-m",
            "medgen.scripts.train",
            "--config-name=diffusion_3d",
            "paths=cluster",
            "strategy=rflow",
            "mode=bravo",
            "model=hdit_3d",
            "model.variant=S",
            "model.patch_size=4",
            "model.level_depths=[2,4,6,4,2]",
            "volume.height=128",
            "volume.width=128",
            "volume.pad_depth_to=160",
            "training.epochs=500",
            "training.learning_rate=1e-4",
            "training.gradient_checkpointing=true",
            "training.batch_size=1",
            "training.name=exp16_hdit_pixel_bravo_",
            "hydra.run.dir={run_dir}",
        ],
        chain_max: Some((20, 19)),
    },
];

/// Launcher lines the rendered script writes its own way, and why.
const NOT_THEIRS: [(&str, &str); 5] = [
    ("--nodes=", "--ntasks=1: one task is on one node"),
    ("--job-name=", "the orchestrator's: a unique name per submission"),
    ("--output=", "the orchestrator's: one log per task, appended to across segments"),
    ("--error=", "the orchestrator's: stderr goes to the task's log"),
    ("--mail-user=", "the user's own address (SLURM mails the submitting user)"),
];

/// The chain protocol's facts, the same in the three chained launchers
/// (lines of exp13_dit_4x_bravo.slurm@c3fee1e; exp9_1's are one less) and in
/// the trainer at each launcher's commit.
const CHECKPOINT: &str = "checkpoint_latest.pt"; // launcher :31 `CKPT=…/checkpoint_latest.pt`; src/medgen/pipeline/checkpoint_manager.py:395
const RESUME: &str = "training.resume_from="; // launcher :33; src/medgen/scripts/train.py@c3fee1e:675, @5a12385:740
const MARKER: &str = ".training_complete"; // launcher :44; train.py@c3fee1e:747, @5a12385:812 touches it
/// The trainer's epoch line, `f"[{timestamp}] Epoch {epoch + 1:3d}/{total_epochs} ({epoch_pct:5.1f}%) | "`
/// (src/medgen/pipeline/base_trainer.py@c3fee1e:889-890, the same line at 5a12385 and be87cde).
const EPOCH_LINE: &str = "[14:02:11] Epoch   7/500 (  1.4%) | TOTAL: 0.0123(v:0.0131) | MS-SSIM: 0.912 | Time: 812.4s";

/// A launcher line as sbatch takes it: quotes removed, `SIGUSR1` as `USR1`.
fn substance(line: &str) -> String {
    line.replace('"', "").replace("B:SIGUSR1@", "B:USR1@")
}

/// A Hydra override as its parser reads it: a list's spaces dropped.
fn hydra(word: &str) -> String {
    match word.split_once("=[") {
        Some((key, list)) => format!("{key}=[{}", list.replace(' ', "")),
        None => word.to_string(),
    }
}

/// `orchestrator render` of `experiments/train/<file>.yaml` on the
/// repository's clusters.yaml, its state in `dir`: the one script.
fn render(dir: &Path, l: &Launcher) -> String {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_orchestrator"));
    cmd.current_dir(root()).env_remove("RUST_LOG").env("NO_COLOR", "1");
    cmd.arg("render").arg(format!("experiments/train/{}.yaml", l.file));
    cmd.arg("--clusters").arg(root().join("clusters.yaml")).arg("--state-dir").arg(dir.join("state"));
    if l.risky {
        cmd.arg("--include-risky");
    }
    let out: Output = cmd.output().expect("orchestrator runs");
    assert!(out.status.success(), "{}: {}", l.file, text(&out.stderr));
    let stdout = text(&out.stdout);
    assert_eq!(stdout.matches("\n#!/bin/bash\n").count(), 1, "{}: one script: {stdout}", l.file);
    stdout[stdout.find("#!/bin/bash\n").expect("a script")..].to_string()
}

/// The config's run directory on `idun`: `<state>/<experiment>/runs/<hash>`,
/// the hash as `plan --json` gives it.
fn run_dir(l: &Launcher) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_orchestrator"))
        .current_dir(root())
        .env_remove("RUST_LOG")
        .args(["plan", &format!("experiments/train/{}.yaml", l.file), "--json"])
        .output()
        .expect("orchestrator runs");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let row: serde_json::Value = serde_json::from_str(text(&out.stdout).lines().next().expect("a row")).expect("JSON");
    format!("{STATE}/{}/runs/{}", l.file, row["hash"].as_str().expect("its hash"))
}

/// The `#SBATCH` lines a script asks SLURM for, less the orchestrator's own.
fn resource_lines(script: &str) -> BTreeSet<String> {
    let own = ["--job-name=", "--comment=", "--array=", "--output=", "--chdir=", "--ntasks=1"];
    script
        .lines()
        .filter_map(|l| l.strip_prefix("#SBATCH "))
        .filter(|l| !own.iter().any(|o| l.starts_with(o)))
        .map(str::to_string)
        .collect()
}

/// What the script does on a node, run in `bash` in `dir` as array task 0:
/// `module` and `conda` log their arguments to `setup.log`, the environment
/// goes to `env.log`, and the worker line prints its words (one a line)
/// instead of running.
fn run_on_a_node(dir: &Path, script: &str) -> (Vec<String>, Vec<String>, Vec<String>) {
    let exec = script.find("\nexec ").expect("the worker line");
    let job = format!(
        "{}\nprintf 'PYTORCH_CUDA_ALLOC_CONF=%s\\n' \"$PYTORCH_CUDA_ALLOC_CONF\" > env.log\nprintf '%s\\n' {}",
        &script[..exec],
        &script[exec + "\nexec ".len()..]
    );
    std::fs::write(dir.join("job.sh"), job).expect("write");
    let out = Command::new("bash")
        .current_dir(dir)
        .env("SLURM_ARRAY_TASK_ID", "0")
        .arg("-c")
        .arg(
            "module() { printf 'module %s\\n' \"$*\" >> setup.log; }; conda() { printf 'conda %s\\n' \"$*\" >> setup.log; }; \
             source ./job.sh",
        )
        .output()
        .expect("bash runs");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let lines = |f: &str| std::fs::read_to_string(dir.join(f)).expect(f).lines().map(String::from).collect::<Vec<_>>();
    (lines("setup.log"), lines("env.log"), text(&out.stdout).lines().map(String::from).collect())
}

#[test]
fn each_launcher_renders_its_sbatch_lines_setup_command_and_chain() {
    let d = tempfile::tempdir().expect("tempdir");
    for l in &LAUNCHERS {
        let what = format!("{} ({})", l.file, l.cite);
        let script = render(d.path(), l);
        let dir = run_dir(l);

        // Every #SBATCH line of the launcher, in substance, and no other:
        // the chain's own `--requeue` and `--open-mode=append` besides.
        let mut want = BTreeSet::new();
        for (line, n) in l.sbatch {
            if NOT_THEIRS.iter().any(|(p, _)| line.starts_with(p)) {
                continue;
            }
            assert!(want.insert(substance(line)), "{what}:{n}: twice");
        }
        if l.chain_max.is_some() {
            assert!(want.contains("--signal=B:USR1@120"), "{what}: a chain is signalled");
            want.extend(["--requeue".to_string(), "--open-mode=append".to_string()]);
        } else {
            assert!(!script.contains("#SBATCH --signal") && !script.contains("#SBATCH --requeue"), "{what}: no chain");
        }
        assert_eq!(resource_lines(&script), want, "{what}");

        // The whole script is bash, and it runs on a node up to the worker.
        let syntax = Command::new("bash").arg("-n").arg("-c").arg(&script).output().expect("bash runs");
        assert!(syntax.status.success(), "{what}: {}", text(&syntax.stderr));
        let node = d.path().join(l.file);
        std::fs::create_dir(&node).expect("mkdir");
        let (setup, env, exec) = run_on_a_node(&node, &script);
        assert_eq!(setup, l.setup.iter().map(|(s, _)| s.to_string()).collect::<Vec<_>>(), "{what}");
        assert_eq!(env, [l.env.0], "{what}:{}", l.env.1);

        // The worker line: `worker watch`, its options, `--`, the command.
        let split = exec.iter().position(|w| w == "--").unwrap_or_else(|| panic!("{what}: no `--`: {exec:?}"));
        let (worker, command) = (&exec[..split], &exec[split + 1..]);
        assert_eq!(worker[..2], [WORKER, "watch"], "{what}");
        let opts: BTreeMap<&str, &str> =
            worker[2..].chunks(2).map(|kv| (kv[0].as_str(), kv.get(1).map_or("", String::as_str))).collect();
        assert_eq!(opts["--state-dir"], STATE, "{what}");
        let want_words: Vec<String> = l.words.iter().map(|w| hydra(&w.replace("{run_dir}", &dir))).collect();
        let got_words: Vec<String> = command.iter().map(|w| hydra(w)).collect();
        assert_eq!(got_words, want_words, "{what}: the command's words");

        match l.chain_max {
            Some((max, n)) => {
                assert_eq!(opts["--chain-max"], max.to_string(), "{what}:{n} CHAIN_MAX");
                assert_eq!(opts["--checkpoint"], CHECKPOINT, "{what}");
                // The resume word names the checkpoint in the directory the
                // trainer saves to: Hydra's run directory, `hydra.run.dir=`.
                assert_eq!(opts["--resume-arg"], format!("{RESUME}{dir}/{CHECKPOINT}"), "{what}");
                assert!(command.contains(&format!("hydra.run.dir={dir}")), "{what}");
                assert_eq!(opts["--marker"], MARKER, "{what}");
                // `--signal=B:SIGUSR1@120`: the worker takes USR1 as the chain's signal.
                assert_eq!(opts["--chain-signal"], "usr1", "{what}");
                // The worker sends it itself where SLURM has not by 120 s before the limit.
                assert_eq!(opts["--signal-before-s"], "120", "{what}");
                let progress = regex_lite::Regex::new(opts["--progress"]).expect("a regular expression");
                let last = progress.find_iter(EPOCH_LINE).last().map(|m| m.as_str());
                assert_eq!(last, Some("Epoch   7/500"), "{what}: the trainer's epoch line");
                assert_eq!(opts.len(), 9, "{what}: {opts:?}");
            }
            None => assert_eq!(opts.keys().copied().collect::<Vec<_>>(), ["--manifest", "--state-dir"], "{what}"),
        }
    }
}

/// docs/training-sweeps.md's table of the group's launchers holds the lines
/// this test checks: each fact's launcher line and the line `render` writes.
#[test]
fn the_docs_table_shows_the_rendered_lines() {
    let page = std::fs::read_to_string(root().join("docs/training-sweeps.md")).expect("docs/training-sweeps.md");
    let section = page.split("\n## The group's launchers\n").nth(1).expect("the section").split("\n## ").next();
    let section = section.expect("its text");
    let d = tempfile::tempdir().expect("tempdir");
    let exp13 = &LAUNCHERS[2];
    let script = render(d.path(), exp13);
    let dir = run_dir(exp13);
    for rendered in [
        "#SBATCH --signal=B:USR1@120".to_string(),
        "#SBATCH --requeue".to_string(),
        "#SBATCH --constraint=gpu80g".to_string(),
        "#SBATCH --cpus-per-task=8".to_string(),
        "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True".to_string(),
        "--chain-max 20".to_string(),
        "--marker .training_complete".to_string(),
    ] {
        assert!(script.contains(&rendered), "render writes {rendered:?}");
        assert!(section.contains(&format!("`{rendered}`")), "the table shows {rendered:?}");
    }
    let resume = format!("{RESUME}{dir}/{CHECKPOINT}");
    let shown = resume.replace(&dir, "<run_dir>");
    assert!(script.contains(&resume), "{script}");
    assert!(section.contains(&format!("`{shown}`")), "the table shows {shown:?}");
    for (launcher, _) in NOT_THEIRS {
        assert!(section.contains(&format!("`#SBATCH {launcher}")), "the table says where {launcher} went");
    }
}
