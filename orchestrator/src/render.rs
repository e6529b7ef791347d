//! sbatch scripts from handlebars templates (`templates/<name>.sbatch.hbs`).
//!
//! Strict mode: a template naming a variable that does not exist is an error,
//! not an empty string. Values reach the script only through two helpers:
//!
//! - `{{sh x}}` quotes `x` as one shell word (single quotes), so `$(…)`,
//!   backquotes, quotes and newlines arrive as data, never as code;
//! - `{{sbatch x}}` emits `x` into an `#SBATCH` line, refusing control
//!   characters and quotes (sbatch reads one directive per line, strips quotes
//!   itself, and a newline would start a shell line);
//! - `{{envname x}}` emits an environment variable's name (`export
//!   {{envname name}}=…`), refusing anything but a shell identifier.
//!
//! The plain `{{x}}` escape is switched off (handlebars would HTML-escape); a
//! template that prints a value without a helper prints it verbatim, so the
//! shipped templates never do that with user data.

use handlebars::{Context, Handlebars, Helper, HelperResult, Output, RenderContext, RenderError, RenderErrorReason};
use serde::Serialize;
use std::path::{Path, PathBuf};

use crate::cluster::setup::env_name_ok;
use crate::cluster::JobSetup;
use crate::experiment::SlurmResources;
use crate::util::shell::sh_quote;

pub mod command;

/// The built-in templates, used when `templates/` has no file of that name.
pub const BUILTIN: &[(&str, &str)] = &[
    ("profile", include_str!("../../templates/profile.sbatch.hbs")),
    ("warm", include_str!("../../templates/warm.sbatch.hbs")),
    ("command", include_str!("../../templates/command.sbatch.hbs")),
];

#[derive(Debug, thiserror::Error)]
pub enum RenderFailure {
    #[error("template `{name}` not found (looked in {looked}); built-in: profile, warm, command")]
    NotFound { name: String, looked: String },
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("template `{name}`: {message}")]
    Template { name: String, message: String },
}

/// Whether `s` may stand in an `#SBATCH` directive.
pub fn sbatch_safe(s: &str) -> Result<(), String> {
    if let Some(c) = s.chars().find(|c| c.is_control() || c.is_whitespace() || matches!(c, '\'' | '"' | '\\' | '`')) {
        return Err(format!("value {s:?} cannot go into an #SBATCH line (contains {c:?})"));
    }
    Ok(())
}

fn value_text(h: &Helper, name: &str) -> Result<String, RenderError> {
    let p = h.param(0).ok_or_else(|| RenderErrorReason::ParamNotFoundForIndex("sh", 0))?;
    let v = p.value();
    if p.relative_path().is_some() && v.is_null() && p.is_value_missing() {
        return Err(RenderErrorReason::MissingVariable(p.relative_path().cloned()).into());
    }
    Ok(match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Number(n) => n.to_string(),
        serde_json::Value::Bool(b) => b.to_string(),
        serde_json::Value::Null => {
            return Err(RenderErrorReason::Other(format!("`{name}` of a null value: wrap it in {{{{#if}}}}")).into())
        }
        other => other.to_string(),
    })
}

fn sh_helper(h: &Helper, _: &Handlebars, _: &Context, _: &mut RenderContext, out: &mut dyn Output) -> HelperResult {
    let s = value_text(h, "sh")?;
    out.write(&sh_quote(&s))?;
    Ok(())
}

fn envname_helper(
    h: &Helper,
    _: &Handlebars,
    _: &Context,
    _: &mut RenderContext,
    out: &mut dyn Output,
) -> HelperResult {
    let s = value_text(h, "envname")?;
    env_name_ok(&s).map_err(RenderErrorReason::Other)?;
    out.write(&s)?;
    Ok(())
}

fn sbatch_helper(h: &Helper, _: &Handlebars, _: &Context, _: &mut RenderContext, out: &mut dyn Output) -> HelperResult {
    let s = value_text(h, "sbatch")?;
    sbatch_safe(&s).map_err(RenderErrorReason::Other)?;
    out.write(&s)?;
    Ok(())
}

/// Everything a template may use. Absent SLURM settings are `null` (test
/// them with `{{#if slurm.partition}}`), so strict mode still catches typos.
#[derive(Debug, Clone, Serialize)]
pub struct JobVars {
    pub experiment: String,
    /// Free text from the experiment file: only ever through `{{sh description}}`.
    pub description: String,
    pub submission: String,
    pub job_name: String,
    pub comment: String,
    /// `0-N%K`.
    pub array: String,
    /// How many array tasks (`--array` covers them).
    pub tasks: usize,
    /// How many configs each task runs, in turn (the last task may run
    /// fewer): task `i` runs `configs[i*K .. i*K+K]` of the manifest.
    pub configs_per_task: u32,
    pub slurm: SlurmVars,
    /// Absolute paths on the cluster.
    pub work_dir: String,
    pub state_dir: String,
    pub submission_dir: String,
    pub log_dir: String,
    pub manifest: String,
    /// One config JSON per line, line `i+1` = config `i` (= task `i` when
    /// `configs_per_task` is 1; for templates without a JSON parser).
    pub manifest_jsonl: String,
    pub worker: String,
    /// Extra `worker run` arguments from the experiment's `worker:` block
    /// (`--memory-limit`, `--backend`), one word each: `{{#each worker_args}} {{sh this}}{{/each}}`.
    pub worker_args: Vec<String>,
    /// The cluster's `setup:`, run before the worker.
    pub setup: SetupVars,
    /// A `command:` sweep's setup lines, environment and each task's command
    /// line (`null` for a profiling sweep).
    pub command: Option<command::CommandVars>,
}

/// What the warm-up job's template (`warm`, `orchestrator install --warm`) may use.
#[derive(Debug, Clone, Serialize)]
pub struct WarmVars {
    pub job_name: String,
    pub slurm: SlurmVars,
    /// Absolute paths on the cluster: the work dir (the cache is
    /// `<work_dir>/cache/<host>`), the job's directory, its log, the worker.
    pub work_dir: String,
    pub job_dir: String,
    pub log: String,
    pub worker: String,
    /// `worker warm --backend` (`null`: the worker picks its first GPU backend).
    pub backend: Option<String>,
    /// The cluster's `setup:`, run before the worker.
    pub setup: SetupVars,
}

/// A cluster's `setup:` for templates: `module purge`, then `{{#each
/// setup.modules}}module load {{sh this}}`, then `{{#each setup.env}}export
/// {{envname this.name}}={{sh this.value}}`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SetupVars {
    /// Whether there is anything to run.
    pub any: bool,
    /// Whether `module` runs (a purge or a load).
    pub uses_modules: bool,
    pub module_purge: bool,
    pub modules: Vec<String>,
    /// Sorted by name.
    pub env: Vec<EnvVar>,
}

#[derive(Debug, Clone, Serialize)]
pub struct EnvVar {
    pub name: String,
    pub value: String,
}

impl From<&JobSetup> for SetupVars {
    fn from(s: &JobSetup) -> Self {
        let uses_modules = s.module_purge || !s.modules.is_empty();
        SetupVars {
            any: uses_modules || !s.env.is_empty(),
            uses_modules,
            module_purge: s.module_purge,
            modules: s.modules.clone(),
            env: s.env.iter().map(|(name, value)| EnvVar { name: name.clone(), value: value.clone() }).collect(),
        }
    }
}

/// The job's SLURM resources with every key present (`null` when unset), so
/// `{{#if slurm.qos}}` works in strict mode while `{{slurm.qso}}` is an error.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SlurmVars {
    pub partition: Option<String>,
    pub account: Option<String>,
    pub qos: Option<String>,
    pub time: Option<String>,
    pub cpus_per_task: Option<u32>,
    pub mem: Option<String>,
    pub gres: Option<String>,
    pub constraint: Option<String>,
    pub extra: Vec<String>,
}

impl From<&SlurmResources> for SlurmVars {
    fn from(r: &SlurmResources) -> Self {
        SlurmVars {
            partition: r.partition.clone(),
            account: r.account.clone(),
            qos: r.qos.clone(),
            time: r.time.clone(),
            cpus_per_task: r.cpus_per_task,
            mem: r.mem.clone(),
            gres: r.gres.clone(),
            constraint: r.constraint.clone(),
            extra: r.extra.clone(),
        }
    }
}

/// Loads and renders templates; one registry per command.
pub struct Renderer {
    hb: Handlebars<'static>,
    dirs: Vec<PathBuf>,
}

impl Renderer {
    /// Templates are looked for in `dirs` in order, then among the built-ins.
    pub fn new(dirs: Vec<PathBuf>) -> Self {
        let mut hb = Handlebars::new();
        hb.set_strict_mode(true);
        hb.register_escape_fn(handlebars::no_escape);
        hb.register_helper("sh", Box::new(sh_helper));
        hb.register_helper("sbatch", Box::new(sbatch_helper));
        hb.register_helper("envname", Box::new(envname_helper));
        Renderer { hb, dirs }
    }

    /// `name` is a template name (`profile`) or a path to a `.hbs` file.
    fn source(&self, name: &str) -> Result<(String, String), RenderFailure> {
        let as_path = Path::new(name);
        let mut looked = Vec::new();
        let candidates: Vec<PathBuf> = if name.ends_with(".hbs") || name.contains('/') {
            vec![as_path.to_path_buf()]
        } else {
            self.dirs.iter().map(|d| d.join(format!("{name}.sbatch.hbs"))).collect()
        };
        for c in candidates {
            match std::fs::read_to_string(&c) {
                Ok(t) => return Ok((c.display().to_string(), t)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => looked.push(c.display().to_string()),
                Err(source) => return Err(RenderFailure::Io { path: c, source }),
            }
        }
        if let Some((_, t)) = BUILTIN.iter().find(|(n, _)| *n == name) {
            return Ok((format!("built-in {name}"), t.to_string()));
        }
        Err(RenderFailure::NotFound { name: name.into(), looked: looked.join(", ") })
    }

    pub fn render(&mut self, template: &str, vars: &JobVars) -> Result<String, RenderFailure> {
        for v in [&vars.job_name, &vars.comment, &vars.array, &vars.log_dir, &vars.submission_dir] {
            sbatch_safe(v).map_err(|message| RenderFailure::Template { name: template.into(), message })?;
        }
        self.render_value(template, vars)
    }

    /// The warm-up job's script (template `warm`).
    pub fn render_warm(&mut self, vars: &WarmVars) -> Result<String, RenderFailure> {
        for v in [&vars.job_name, &vars.log, &vars.job_dir] {
            sbatch_safe(v).map_err(|message| RenderFailure::Template { name: "warm".into(), message })?;
        }
        self.render_value("warm", vars)
    }

    fn render_value<T: Serialize>(&mut self, template: &str, vars: &T) -> Result<String, RenderFailure> {
        let (label, text) = self.source(template)?;
        let key = format!("t:{label}");
        if !self.hb.has_template(&key) {
            self.hb
                .register_template_string(&key, text)
                .map_err(|e| RenderFailure::Template { name: label.clone(), message: e.to_string() })?;
        }
        self.hb.render(&key, vars).map_err(|e| RenderFailure::Template { name: label, message: e.to_string() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars() -> JobVars {
        JobVars {
            experiment: "exp9".into(),
            description: "d".into(),
            submission: "s001-abcd".into(),
            job_name: "sw-exp9-12345678-s001-abcd".into(),
            comment: "sweep,exp=exp9".into(),
            array: "0-9%4".into(),
            tasks: 10,
            configs_per_task: 1,
            slurm: SlurmVars {
                partition: Some("GPUQ".into()),
                time: Some("00:30:00".into()),
                gres: Some("gpu:1".into()),
                extra: vec!["--mail-type=END".into()],
                ..Default::default()
            },
            work_dir: "/w".into(),
            state_dir: "/w/state".into(),
            submission_dir: "/w/state/exp9/submissions/s001-abcd".into(),
            log_dir: "/w/state/exp9/logs/s001-abcd".into(),
            manifest: "/w/state/exp9/submissions/s001-abcd/manifest.json".into(),
            manifest_jsonl: "/w/state/exp9/submissions/s001-abcd/manifest.jsonl".into(),
            worker: "/w/bin/worker".into(),
            worker_args: vec![],
            setup: SetupVars::default(),
            command: None,
        }
    }

    #[test]
    fn command_template_runs_each_tasks_line_under_worker_watch() {
        let mut v = vars();
        v.command = Some(command::CommandVars {
            setup: vec!["module load Anaconda3/2024.02-1".into(), "conda activate medgen".into()],
            env: vec![EnvVar { name: "PYTORCH_CUDA_ALLOC_CONF".into(), value: "expandable_segments:True".into() }],
            tasks: vec![
                command::TaskCommand { task: 0, line: "python train.py training.batch_size=4".into(), resume: None },
                command::TaskCommand { task: 1, line: "python train.py training.name='a b'".into(), resume: None },
            ],
            chain: None,
        });
        let script = Renderer::new(vec![]).render("command", &v).unwrap();
        for line in [
            "#SBATCH --partition=GPUQ",
            "module load Anaconda3/2024.02-1\nconda activate medgen\nset -u",
            "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
            "0) set -- python train.py training.batch_size=4 ;;",
            "1) set -- python train.py training.name='a b' ;;",
            "exec /w/bin/worker watch --manifest /w/state/exp9/submissions/s001-abcd/manifest.json \
             --state-dir /w/state -- \"$@\"",
        ] {
            assert!(script.contains(line), "missing {line:?} in:\n{script}");
        }
        let out = std::process::Command::new("bash").arg("-n").arg("-c").arg(&script).output().expect("bash runs");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }

    #[test]
    fn a_chain_signals_requeues_appends_and_resumes_each_task_with_its_own_word() {
        let mut v = vars();
        v.command = Some(command::CommandVars {
            setup: vec![],
            env: vec![],
            tasks: vec![command::TaskCommand {
                task: 0,
                line: "python train.py".into(),
                resume: Some("'training.resume_from=/w/state/exp9/runs/ab/checkpoint latest.pt'".into()),
            }],
            chain: Some(command::ChainVars {
                signal: "B:USR1@120".into(),
                signal_name: "usr1".into(),
                before_s: 120,
                max_segments: 20,
                checkpoint: "checkpoint latest.pt".into(),
                marker: Some(".training_complete".into()),
                progress: Some("Epoch [0-9]+".into()),
            }),
        });
        let script = Renderer::new(vec![]).render("command", &v).unwrap();
        for line in [
            "#SBATCH --signal=B:USR1@120\n#SBATCH --requeue\n#SBATCH --open-mode=append\n",
            "0) resume='training.resume_from=/w/state/exp9/runs/ab/checkpoint latest.pt'; set -- python train.py ;;",
            "--chain-max 20 --chain-signal usr1 --signal-before-s 120 --checkpoint 'checkpoint latest.pt' --resume-arg \"$resume\"",
            "--marker .training_complete",
            "--progress 'Epoch [0-9]+'",
        ] {
            assert!(script.contains(line), "missing {line:?} in:\n{script}");
        }
        let out = std::process::Command::new("bash").arg("-n").arg("-c").arg(&script).output().expect("bash runs");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }

    #[test]
    fn quoted_values_round_trip_through_a_real_shell() {
        for v in ["$(touch /tmp/never)", "a'b\"c", "line1\nline2", "`id`", "x; rm -rf /", "*", "~", ""] {
            let out = std::process::Command::new("sh")
                .arg("-c")
                .arg(format!("printf %s {}", sh_quote(v)))
                .output()
                .expect("sh runs");
            assert_eq!(String::from_utf8_lossy(&out.stdout), v);
        }
    }

    #[test]
    fn profile_template_renders_directives_and_worker_call() {
        let mut r = Renderer::new(vec![]);
        let s = r.render("profile", &vars()).expect("renders");
        assert!(s.starts_with("#!/bin/bash"), "{s}");
        assert!(s.contains("#SBATCH --array=0-9%4"));
        assert!(s.contains("#SBATCH --partition=GPUQ"));
        assert!(s.contains("#SBATCH --mail-type=END"));
        assert!(!s.contains("--account"), "absent settings leave no directive");
        assert!(s.contains(
            "/w/bin/worker run --manifest /w/state/exp9/submissions/s001-abcd/manifest.json --state-dir /w/state --cache-dir \"$cache_dir\"\n"
        ));
        // One kernel cache per node under the work dir: never two hosts on one database.
        assert!(s.contains("\ncache_dir=/w/cache/\"$(hostname -s)\"\n"), "{s}");
    }

    #[test]
    fn worker_options_become_quoted_worker_arguments() {
        let mut v = vars();
        let opts = crate::experiment::WorkerOptions {
            backend: Some(crate::experiment::WorkerBackend::Flex),
            memory_limit: Some(512 << 20),
            configs_per_task: 3,
        };
        v.worker_args = opts.args();
        v.worker_args.push("it's $(x)".into());
        let s = Renderer::new(vec![]).render("profile", &v).expect("renders");
        assert!(
            s.contains("--state-dir /w/state --cache-dir \"$cache_dir\" --backend flex --memory-limit 536870912 'it'\\''s $(x)'\n"),
            "{s}"
        );
    }

    #[test]
    fn setup_lines_come_before_the_worker_each_name_checked_and_value_quoted() {
        let setup = JobSetup {
            module_purge: true,
            modules: vec!["CUDA/12.4.0".into(), "x;id".into()],
            env: [("VK_DRIVER_FILES".to_string(), "/a b/$(id)".to_string())].into(),
        };
        let mut v = vars();
        let s = Renderer::new(vec![]).render("profile", &v).expect("renders");
        assert!(s.contains("\nset -euo pipefail\n\n# The kernel cache"), "no setup, no lines: {s}");
        v.setup = (&setup).into();
        let s = Renderer::new(vec![]).render("profile", &v).expect("renders");
        let want = "\nset -euo pipefail\n\n\
                    # Site setup: the cluster's `setup:` (clusters.yaml), each name and value one quoted word.\n\
                    # Lmod's `module` may read unset variables (TACC/Lmod#835): `set -u` is off while it runs.\n\
                    set +u\nmodule purge\nmodule load CUDA/12.4.0\nmodule load 'x;id'\nset -u\n\
                    export VK_DRIVER_FILES='/a b/$(id)'\n\n# The kernel cache";
        assert!(s.contains(want), "{s}");
        // Variables alone: no `module`, `set -u` left on.
        v.setup = (&JobSetup { env: setup.env.clone(), ..Default::default() }).into();
        let s = Renderer::new(vec![]).render("profile", &v).expect("renders");
        assert!(!s.contains("module ") && !s.contains("set +u") && s.contains("\nexport VK_DRIVER_FILES="), "{s}");
        // A name that is no shell identifier is refused, whoever built the variables.
        v.setup.env[0].name = "A=1; id #".into();
        let e = Renderer::new(vec![]).render("profile", &v).expect_err("refused");
        assert!(e.to_string().contains("is not a shell variable name"), "{e}");
        // The warm-up job runs the same setup before its worker.
        let mut w = warm_vars();
        w.setup = (&setup).into();
        let s = Renderer::new(vec![]).render_warm(&w).expect("renders");
        let (load, exec) = (s.find("\nmodule load CUDA/12.4.0\n"), s.find("\nexec "));
        assert!(load.is_some() && load < exec && s.contains("\nexport VK_DRIVER_FILES='/a b/$(id)'\n"), "{s}");
    }

    #[test]
    fn strict_mode_rejects_unknown_variables() {
        let d = tempfile::tempdir().expect("tempdir");
        std::fs::write(d.path().join("typo.sbatch.hbs"), "#!/bin/bash\necho {{sh wroker}}\n").expect("write");
        let mut r = Renderer::new(vec![d.path().to_path_buf()]);
        let e = r.render("typo", &vars()).expect_err("strict");
        assert!(e.to_string().contains("wroker"), "{e}");
    }

    #[test]
    fn newline_in_a_directive_value_is_refused() {
        let mut v = vars();
        v.slurm.partition = Some("gpu\necho pwned".into());
        let e = Renderer::new(vec![]).render("profile", &v).expect_err("refused");
        assert!(e.to_string().contains("#SBATCH"), "{e}");
        v.slurm.partition = Some("gpu".into());
        v.slurm.extra = vec!["--x='a'".into()];
        assert!(Renderer::new(vec![]).render("profile", &v).is_err());
    }

    fn warm_vars() -> WarmVars {
        WarmVars {
            job_name: "sweep-warm-1700000000-ab12".into(),
            slurm: vars().slurm,
            work_dir: "/w".into(),
            job_dir: "/w/warm/1700000000-ab12".into(),
            log: "/w/warm/1700000000-ab12/warm.out".into(),
            worker: "/w/bin/worker".into(),
            backend: None,
            setup: SetupVars::default(),
        }
    }

    #[test]
    fn warm_template_runs_the_worker_on_the_profile_jobs_cache_with_the_clusters_settings() {
        let s = Renderer::new(vec![]).render_warm(&warm_vars()).expect("renders");
        assert!(s.starts_with("#!/bin/bash"), "{s}");
        for line in ["--partition=GPUQ", "--time=00:30:00", "--gres=gpu:1", "--mail-type=END", "--ntasks=1"] {
            assert!(s.contains(&format!("\n#SBATCH {line}\n")), "{line}: {s}");
        }
        assert!(s.contains("\n#SBATCH --output=/w/warm/1700000000-ab12/warm.out\n"), "{s}");
        assert!(!s.contains("--array"), "one task: {s}");
        assert!(s.contains("\ncache_dir=/w/cache/\"$(hostname -s)\"\n"), "{s}");
        assert!(s.ends_with("\nexec /w/bin/worker warm --cache-dir \"$cache_dir\"\n"), "no --backend: {s}");
        let mut v = warm_vars();
        v.backend = Some("vulkan; $(id)".into());
        v.worker = "/w/my bin/worker".into();
        let s = Renderer::new(vec![]).render_warm(&v).expect("renders");
        assert!(
            s.ends_with("\nexec '/w/my bin/worker' warm --cache-dir \"$cache_dir\" --backend 'vulkan; $(id)'\n"),
            "{s}"
        );
        v.log = "/w/a b/warm.out".into();
        assert!(Renderer::new(vec![]).render_warm(&v).is_err(), "a space cannot go into --output");
    }

    #[test]
    fn missing_template_names_where_it_looked() {
        let e = Renderer::new(vec![PathBuf::from("templates")]).render("nope", &vars()).expect_err("missing");
        assert!(e.to_string().contains("templates/nope.sbatch.hbs"), "{e}");
    }
}
