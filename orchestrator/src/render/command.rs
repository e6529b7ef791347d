//! A `command:` sweep's script parts: each config's command line, rendered
//! from the experiment's `run:` template over the config's fields, every
//! value shell-quoted; its setup lines and environment.

use facts::RunConfig;
use handlebars::Handlebars;
use serde::Serialize;
use serde_json::Value;

use super::{EnvVar, RenderFailure};
use crate::cluster::setup::env_name_ok;
use crate::experiment::{Chain, CommandRuntime};
use crate::util::shell::sh_quote;

/// What the `command` template may use: `{{#each command.setup}}`,
/// `{{#each command.env}}` and `{{#each command.tasks}}` (array task `task`
/// runs `line`, a shell command line whose values are quoted).
#[derive(Debug, Clone, Serialize)]
pub struct CommandVars {
    /// The user's own shell lines, verbatim.
    pub setup: Vec<String>,
    /// Sorted by name; names checked as shell identifiers.
    pub env: Vec<EnvVar>,
    pub tasks: Vec<TaskCommand>,
    /// `chain:`'s settings, for the `#SBATCH` lines and `worker watch --chain`.
    pub chain: Option<ChainVars>,
}

#[derive(Debug, Clone, Serialize)]
pub struct TaskCommand {
    pub task: usize,
    pub line: String,
    /// A chain's resume argument for this config, one quoted word.
    pub resume: Option<String>,
}

/// What the template needs of a chain (the values raw: it quotes them).
#[derive(Debug, Clone, Serialize)]
pub struct ChainVars {
    /// sbatch's `--signal` value, `B:USR1@120`.
    pub signal: String,
    /// `worker watch --chain-signal`: `usr1` or `usr2`.
    pub signal_name: String,
    /// `worker watch --signal-before-s`: the seconds before the limit.
    pub before_s: u32,
    pub max_segments: u32,
    pub checkpoint: String,
    pub marker: Option<String>,
    pub progress: Option<String>,
}

fn failure(message: String) -> RenderFailure {
    RenderFailure::Template { name: "command.run".into(), message }
}

/// The fields a `run:` template sees: the config as its JSON (`name`,
/// `experiment`, `model.*`, `input.*`, `batch`, `precision`, …), its `hash`
/// and `run_dir` (on the cluster); a list of plain values becomes one value,
/// `[a,b,c]` (Hydra's list); `worker`, the worker's path on the cluster.
fn context(cfg: &RunConfig, at: &Where) -> Result<Value, RenderFailure> {
    fn lists_as_text(v: &mut Value) {
        match v {
            Value::Array(items) if items.iter().all(|i| !i.is_array() && !i.is_object()) => {
                let text = serde_json::to_string(items).unwrap_or_default();
                *v = Value::String(text);
            }
            Value::Array(items) => items.iter_mut().for_each(lists_as_text),
            Value::Object(map) => map.values_mut().for_each(lists_as_text),
            _ => {}
        }
    }
    let mut v = serde_json::to_value(cfg).map_err(|e| failure(e.to_string()))?;
    lists_as_text(&mut v);
    if let Value::Object(map) = &mut v {
        map.insert("hash".into(), Value::String(cfg.hash().as_str().to_string()));
        map.insert("run_dir".into(), Value::String(run_dir(at.state_dir, cfg)));
        map.insert("worker".into(), Value::String(at.worker.to_string()));
    }
    Ok(v)
}

/// Where on the cluster: the state directory and the worker.
#[derive(Debug, Clone, Copy)]
pub struct Where<'a> {
    pub state_dir: &'a str,
    pub worker: &'a str,
}

/// The config's run directory on the cluster, where its events, its
/// command's working directory and its checkpoint are.
pub fn run_dir(state_dir: &str, cfg: &RunConfig) -> String {
    format!("{}/{}/runs/{}", state_dir.trim_end_matches('/'), cfg.experiment, cfg.hash())
}

/// `template` rendered over `ctx` in strict mode (a field that does not
/// exist is an error), each `{{value}}` put in through `escape`; one line.
fn render_line(
    what: &str,
    template: &str,
    ctx: &Value,
    cfg: &RunConfig,
    escape: fn(&str) -> String,
) -> Result<String, RenderFailure> {
    let mut hb = Handlebars::new();
    hb.set_strict_mode(true);
    hb.register_escape_fn(escape);
    let line = hb.render_template(template, ctx).map_err(|e| failure(e.to_string()))?;
    if line.contains('\n') || line.contains('\r') {
        return Err(failure(format!("the {what} of {} is not one line", cfg.name)));
    }
    Ok(line)
}

/// `cfg`'s command line, `run` rendered for the cluster `at`.
pub fn command_line(run: &str, cfg: &RunConfig, at: &Where) -> Result<String, RenderFailure> {
    // Each value one shell word.
    render_line("command line", run, &context(cfg, at)?, cfg, sh_quote)
}

/// `cfg`'s resume argument: `resume` rendered with `checkpoint`, the full
/// path of its checkpoint; one shell word.
fn resume_word(chain: &Chain, cfg: &RunConfig, at: &Where) -> Result<String, RenderFailure> {
    let dir = run_dir(at.state_dir, cfg);
    let mut ctx = context(cfg, at)?;
    if let Value::Object(map) = &mut ctx {
        map.insert("checkpoint".into(), Value::String(format!("{dir}/{}", chain.checkpoint)));
    }
    // Rendered raw, then quoted whole: one argument, whatever its values hold.
    let word = render_line("resume argument", &chain.resume, &ctx, cfg, handlebars::no_escape)?;
    Ok(sh_quote(&word))
}

/// The script parts of `configs`, array task `i` running `configs[i]`, their
/// run directories under the cluster's state directory (`at`).
pub fn command_vars(c: &CommandRuntime, configs: &[&RunConfig], at: &Where) -> Result<CommandVars, RenderFailure> {
    if let Some(problem) = c.problem() {
        return Err(failure(problem));
    }
    for name in c.env.keys() {
        env_name_ok(name).map_err(failure)?;
    }
    let tasks = configs
        .iter()
        .enumerate()
        .map(|(task, cfg)| {
            let resume = c.chain.as_ref().map(|ch| resume_word(ch, cfg, at)).transpose()?;
            Ok(TaskCommand { task, line: command_line(&c.run, cfg, at)?, resume })
        })
        .collect::<Result<_, RenderFailure>>()?;
    Ok(CommandVars {
        setup: c.setup.clone(),
        env: c.env.iter().map(|(name, value)| EnvVar { name: name.clone(), value: value.clone() }).collect(),
        tasks,
        chain: c.chain.as_ref().map(|ch| ChainVars {
            signal: ch.signal.sbatch(),
            signal_name: ch.signal.name.to_lowercase(),
            before_s: ch.signal.before_s,
            max_segments: ch.max_segments,
            checkpoint: ch.checkpoint.clone(),
            marker: ch.marker.clone(),
            progress: ch.progress.clone(),
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use facts::{Input, ModelSpec, PerLevel, Spatial, UnetSpec};

    fn cfg(name: &str, batch: u32) -> RunConfig {
        let unet = UnetSpec {
            channels: vec![64, 128, 256],
            attention_levels: vec![false, false, true],
            num_res_blocks: PerLevel::All(2),
            num_head_channels: PerLevel::All(32),
            norm_num_groups: 32,
        };
        let input = Input { channels: 2, spatial: Spatial::new(64, 64, 32) };
        let mut c = RunConfig::profile("exp9", name, ModelSpec::Unet(unet), input);
        c.batch = batch;
        c
    }

    const W: Where = Where { state_dir: "/w/state", worker: "/w/bin/worker" };

    const RUN: &str = "python -m medgen.scripts.train --config-name=diffusion_3d \
        model.channels={{model.channels}} training.batch_size={{batch}} training.name={{name}}";

    /// The words a real shell makes of `line` (its arguments, one a line).
    fn words(line: &str) -> Vec<String> {
        let script = format!("set -- {line}\nprintf '%s\\n' \"$@\"");
        let out = std::process::Command::new("sh").arg("-c").arg(&script).output().expect("sh runs");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap().lines().map(String::from).collect()
    }

    #[test]
    fn each_config_gets_its_own_quoted_command_line() {
        let a = cfg("ch64_bs4", 4);
        let b = cfg("ch64_bs24", 24);
        let c = CommandRuntime { run: RUN.into(), setup: vec![], env: Default::default(), chain: None };
        let vars = command_vars(&c, &[&a, &b], &W).unwrap();
        assert_eq!(vars.tasks.len(), 2);
        assert_eq!(
            vars.tasks[0].line,
            "python -m medgen.scripts.train --config-name=diffusion_3d \
             model.channels='[64,128,256]' training.batch_size=4 training.name=ch64_bs4"
        );
        assert_eq!(vars.tasks[1].task, 1);
        assert!(
            vars.tasks[1].line.contains("training.batch_size=24 training.name=ch64_bs24"),
            "{}",
            vars.tasks[1].line
        );
        assert_eq!(words(&vars.tasks[0].line)[4], "model.channels=[64,128,256]");
    }

    #[test]
    fn a_hostile_value_arrives_as_one_word_of_data() {
        let dir = tempfile::tempdir().unwrap();
        let canary = dir.path().join("pwned");
        let name = format!("a b'c\"d $(touch {0}) `touch {0}` ;touch {0}", canary.display());
        let line = command_line("train --name {{name}} --batch {{batch}}", &cfg(&name, 2), &W).unwrap();
        assert_eq!(words(&line), ["train", "--name", name.as_str(), "--batch", "2"]);
        assert!(!canary.exists(), "a value ran as code: {line}");
    }

    #[test]
    fn unknown_fields_unquoted_values_and_bad_names_are_refused() {
        let one = |run: &str| CommandRuntime { run: run.into(), setup: vec![], env: Default::default(), chain: None };
        let err = command_line("train {{model.chanels}}", &cfg("x", 1), &W).unwrap_err().to_string();
        assert!(err.contains("chanels"), "{err}");
        assert!(command_vars(&one("train {{{name}}}"), &[&cfg("x", 1)], &W).is_err());
        assert!(command_vars(&one("train\nrm -rf /"), &[&cfg("x", 1)], &W).is_err());
        let mut bad_env = one("train");
        bad_env.env.insert("A B".into(), "1".into());
        assert!(command_vars(&bad_env, &[&cfg("x", 1)], &W).is_err());
    }
}
