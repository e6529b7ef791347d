//! The `#SBATCH` lines of a rendered script, read into the job options a
//! REST submission carries (slurmrestd ignores the lines themselves). Reads
//! the way sbatch does: directives end at the first command line.

use super::RestError;

/// The options the shipped template writes, and the ones `slurm:` in an
/// experiment (or a cluster's `defaults`) can set.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobSpec {
    pub name: String,
    pub comment: Option<String>,
    pub array: Option<String>,
    pub output: Option<String>,
    pub chdir: Option<String>,
    pub ntasks: Option<u32>,
    pub partition: Option<String>,
    pub account: Option<String>,
    pub qos: Option<String>,
    pub time_minutes: Option<u64>,
    pub cpus_per_task: Option<u32>,
    pub mem_mb: Option<u64>,
    pub gres: Option<String>,
    pub constraint: Option<String>,
    /// `--signal=[B:]SIG@SECONDS`: a chain's warning before the time limit.
    pub signal: Option<WarnSignal>,
    /// `--requeue` (true) or `--no-requeue` (false).
    pub requeue: Option<bool>,
    /// `--open-mode=append` (true) or `truncate` (false).
    pub append: Option<bool>,
}

/// sbatch's `--signal=[B:]SIG@SECONDS`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WarnSignal {
    /// `B:`: to the batch shell only.
    pub batch: bool,
    /// Without `SIG` (`USR1`), or a number.
    pub name: String,
    pub seconds: u32,
}

impl WarnSignal {
    fn parse(v: &str) -> Result<WarnSignal, String> {
        let bad = || format!("{v:?} is not `[B:]SIG@SECONDS`");
        let (batch, rest) = match v.strip_prefix("B:") {
            Some(r) => (true, r),
            None => (false, v),
        };
        let (sig, secs) = rest.split_once('@').ok_or_else(bad)?;
        let name = sig.strip_prefix("SIG").unwrap_or(sig);
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric()) {
            return Err(bad());
        }
        Ok(WarnSignal { batch, name: name.to_string(), seconds: secs.parse().map_err(|_| bad())? })
    }

    /// As sbatch writes it (`B:USR1@120`): v0.0.38's `signal`.
    pub fn sbatch(&self) -> String {
        format!("{}{}@{}", if self.batch { "B:" } else { "" }, self.name, self.seconds)
    }
}

/// Why a script's directives cannot be sent as REST job options.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{script}:{line}: `#SBATCH {directive}`: {why}")]
pub struct DirectiveError {
    pub script: String,
    pub line: usize,
    pub directive: String,
    pub why: String,
}

impl From<DirectiveError> for RestError {
    fn from(e: DirectiveError) -> Self {
        RestError::Script(e)
    }
}

impl JobSpec {
    /// Reads the `#SBATCH` header of `text` (the script at `path`, named in errors).
    pub fn from_script(path: &str, text: &str) -> Result<JobSpec, DirectiveError> {
        let mut spec = JobSpec::default();
        for (i, line) in text.lines().enumerate() {
            let t = line.trim();
            if t.is_empty() || (t.starts_with('#') && !t.starts_with("#SBATCH")) {
                continue;
            }
            let Some(rest) = t.strip_prefix("#SBATCH") else { break };
            let directive = rest.trim();
            let err =
                |why: String| DirectiveError { script: path.into(), line: i + 1, directive: directive.into(), why };
            let (opt, value) = split_option(directive).ok_or_else(|| err("expected `--option=value`".into()))?;
            spec.set(opt, value).map_err(err)?;
        }
        if spec.name.is_empty() {
            return Err(DirectiveError {
                script: path.into(),
                line: 1,
                directive: "--job-name".into(),
                why: "missing: the job name is how a submission is found again".into(),
            });
        }
        Ok(spec)
    }

    fn set(&mut self, opt: &str, value: &str) -> Result<(), String> {
        let text = || Some(value.to_string());
        let number = || value.parse::<u32>().map(Some).map_err(|_| format!("{value:?} is not a number"));
        match opt {
            "--job-name" | "-J" => self.name = value.to_string(),
            "--comment" => self.comment = text(),
            "--array" | "-a" => self.array = text(),
            "--output" | "-o" => self.output = text(),
            "--chdir" | "-D" => self.chdir = text(),
            "--ntasks" | "-n" => self.ntasks = number()?,
            "--partition" | "-p" => self.partition = text(),
            "--account" | "-A" => self.account = text(),
            "--qos" | "-q" => self.qos = text(),
            "--time" | "-t" => self.time_minutes = minutes(value)?,
            "--cpus-per-task" | "-c" => self.cpus_per_task = number()?,
            "--mem" => self.mem_mb = Some(megabytes(value)?),
            "--gres" => self.gres = text(),
            "--constraint" | "-C" => self.constraint = text(),
            "--signal" => self.signal = Some(WarnSignal::parse(value)?),
            "--requeue" => self.requeue = Some(true),
            "--no-requeue" => self.requeue = Some(false),
            "--open-mode" => {
                self.append = Some(match value {
                    "append" => true,
                    "truncate" => false,
                    _ => return Err(format!("{value:?} is not `append` or `truncate`")),
                })
            }
            other => {
                return Err(format!(
                    "`{other}` cannot be sent through slurmrestd by this transport (it reads --job-name, --comment, \
                     --array, --output, --chdir, --ntasks, --partition, --account, --qos, --time, --cpus-per-task, \
                     --mem, --gres, --constraint, --signal, --requeue, --no-requeue, --open-mode); use the ssh \
                     transport for other options"
                ))
            }
        }
        Ok(())
    }
}

/// `--opt=value`, `--opt value`, `-p value`, `-pvalue`.
fn split_option(d: &str) -> Option<(&str, &str)> {
    if let Some((o, v)) = d.split_once('=').filter(|(o, _)| o.starts_with("--") && !o.contains(' ')) {
        return Some((o, v.trim()));
    }
    if let Some((o, v)) = d.split_once(char::is_whitespace) {
        return Some((o, v.trim()));
    }
    if d.starts_with("--") {
        return Some((d, ""));
    }
    if d.starts_with('-') && d.len() > 2 {
        return d.is_char_boundary(2).then(|| (&d[..2], &d[2..]));
    }
    None
}

/// SLURM's time syntax (`M`, `M:S`, `H:M:S`, `D-H`, `D-H:M`, `D-H:M:S`) in
/// whole minutes, rounded up; `None` for UNLIMITED/INFINITE (the partition's limit).
fn minutes(t: &str) -> Result<Option<u64>, String> {
    if matches!(t.to_ascii_uppercase().as_str(), "UNLIMITED" | "INFINITE") {
        return Ok(None);
    }
    let bad = || format!("{t:?} is not a SLURM time (M, M:S, H:M:S, D-H, D-H:M or D-H:M:S)");
    let n = |s: &str| s.parse::<u64>().map_err(|_| bad());
    let (days, clock) = match t.split_once('-') {
        Some((d, c)) => (n(d)?, Some(c)),
        None => (0, None),
    };
    let secs = match clock {
        Some(c) => {
            let f: Vec<&str> = c.split(':').collect();
            match f.as_slice() {
                [h] => n(h)? * 3600,
                [h, m] => n(h)? * 3600 + n(m)? * 60,
                [h, m, s] => n(h)? * 3600 + n(m)? * 60 + n(s)?,
                _ => return Err(bad()),
            }
        }
        None => {
            let f: Vec<&str> = t.split(':').collect();
            match f.as_slice() {
                [m] => n(m)? * 60,
                [m, s] => n(m)? * 60 + n(s)?,
                [h, m, s] => n(h)? * 3600 + n(m)? * 60 + n(s)?,
                _ => return Err(bad()),
            }
        }
    };
    Ok(Some((days * 86_400 + secs).div_ceil(60)))
}

/// `--mem` (`500`, `500M`, `8G`, `1T`, `1024K`; megabytes by default) in MB, rounded up.
fn megabytes(m: &str) -> Result<u64, String> {
    let bad = || format!("{m:?} is not a memory size (a number with an optional K, M, G or T)");
    let (digits, unit) = m.split_at(m.find(|c: char| !c.is_ascii_digit()).unwrap_or(m.len()));
    let v: u64 = digits.parse().map_err(|_| bad())?;
    let mb = match unit.to_ascii_uppercase().as_str() {
        "K" | "KB" => v.div_ceil(1024),
        "" | "M" | "MB" => v,
        "G" | "GB" => v.checked_mul(1024).ok_or_else(bad)?,
        "T" | "TB" => v.checked_mul(1024 * 1024).ok_or_else(bad)?,
        _ => return Err(bad()),
    };
    Ok(mb)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_templates_header_is_read() {
        let script = "#!/bin/bash\n# Profiling job array\n#SBATCH --job-name=sweep-e-s1\n#SBATCH --comment=exp:ab\n\
            #SBATCH --array=0-23%4\n#SBATCH --output=/w/logs/%a.out\n#SBATCH --chdir=/w/sub\n#SBATCH --ntasks=1\n\
            #SBATCH --partition=gpu\n#SBATCH --time=1-02:30:00\n#SBATCH --mem=8G\n#SBATCH --gres=gpu:1\n\
            #SBATCH --cpus-per-task=4\nset -euo pipefail\n#SBATCH --qos=ignored-after-the-first-command\n";
        let s = JobSpec::from_script("/w/sub/job.sbatch", script).expect("reads");
        assert_eq!(s.name, "sweep-e-s1");
        assert_eq!(s.array.as_deref(), Some("0-23%4"));
        assert_eq!(s.output.as_deref(), Some("/w/logs/%a.out"));
        assert_eq!(s.time_minutes, Some(24 * 60 + 150));
        assert_eq!(s.mem_mb, Some(8192));
        assert_eq!((s.ntasks, s.cpus_per_task), (Some(1), Some(4)));
        assert_eq!(s.qos, None);
    }

    #[test]
    fn times_and_sizes() {
        assert_eq!(minutes("90"), Ok(Some(90)));
        assert_eq!(minutes("1:30"), Ok(Some(2)));
        assert_eq!(minutes("2:00:00"), Ok(Some(120)));
        assert_eq!(minutes("1-0"), Ok(Some(1440)));
        assert_eq!(minutes("UNLIMITED"), Ok(None));
        assert!(minutes("soon").is_err());
        assert_eq!(megabytes("500"), Ok(500));
        assert_eq!(megabytes("1500K"), Ok(2));
        assert!(megabytes("8Q").is_err());
    }

    #[test]
    fn an_option_the_api_cannot_carry_names_script_line_and_option() {
        let e = JobSpec::from_script("job.sbatch", "#!/bin/sh\n#SBATCH --job-name=a\n#SBATCH --exclusive\n")
            .expect_err("unsupported");
        assert_eq!((e.line, e.directive.as_str()), (3, "--exclusive"));
        assert!(e.to_string().starts_with("job.sbatch:3: `#SBATCH --exclusive`"), "{e}");
        let e = JobSpec::from_script("job.sbatch", "#!/bin/sh\n#SBATCH --time=soon\n").expect_err("bad time");
        assert!(e.to_string().contains("not a SLURM time"), "{e}");
    }
}
