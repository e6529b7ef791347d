//! The clusters file: where sweeps run and how to reach them.
//!
//! ```yaml
//! clusters:
//!   idun:
//!     transport: ssh            # ssh | local-slurm | local
//!     host: idun                # a Host alias from ~/.ssh/config, or a host name
//!     work_dir: /cluster/work/me/sweeps
//!     defaults: {partition: GPUQ, account: share-ie-idi}
//!   portal:
//!     transport: rest           # SLURM through slurmrestd (the control plane)
//!     url: https://slurm.example.org:6820
//!     user: me
//!     token_file: ~/.config/sweep/slurm.jwt   # or token_env: SLURM_JWT
//!     files: sftp               # local | sftp (the data plane; sftp: host as for ssh)
//!     host: login.example.org
//!     work_dir: /cluster/work/me/sweeps
//! ```
//!
//! The built-in `local` cluster (no SLURM: scripts run as local processes)
//! exists even without a file, so a new user can run the demo at once; the
//! built-in `replay` cluster answers from `data/vram-measurements.jsonl`.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::experiment::SlurmResources;

pub mod setup;

pub use setup::JobSetup;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TransportKind {
    /// SLURM on a remote login node, over SSH (exec channels + SFTP).
    Ssh,
    /// The SLURM commands of this machine (a login node running the orchestrator).
    LocalSlurm,
    /// No SLURM: the rendered scripts run as local processes.
    Local,
    /// SLURM through its REST API (slurmrestd); files per [`FilesKind`].
    Rest,
    /// No runs at all: each config is answered with its recorded measurement
    /// from `records` (evaluation and tests; every output says it replays).
    Replay,
}

/// How job files and results move for the `rest` transport (the data plane;
/// `ssh` and `local-slurm` imply theirs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FilesKind {
    /// This machine mounts the cluster's filesystem: `work_dir` is a local path too.
    Local,
    /// SFTP to `host` (and `port`, `user`, `identity_file`, `known_hosts` as for ssh).
    Sftp,
}

/// One cluster as declared in the clusters file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    pub transport: TransportKind,
    /// SSH: a `~/.ssh/config` Host alias or a host name.
    #[serde(default)]
    pub host: Option<String>,
    /// SSH: overrides of what `~/.ssh/config` says.
    #[serde(default)]
    pub port: Option<u16>,
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub identity_file: Option<PathBuf>,
    /// SSH: known_hosts file(s) to verify the host key against (default
    /// `~/.ssh/known_hosts`, or `UserKnownHostsFile` from `~/.ssh/config`).
    #[serde(default)]
    pub known_hosts: Option<PathBuf>,
    /// SSH: the ssh config file to read (default `~/.ssh/config`).
    #[serde(default)]
    pub ssh_config: Option<PathBuf>,
    /// Directory on the cluster holding `state/` (job files, worker output) and
    /// `bin/worker`. For `local`, default: none (jobs in the state directory,
    /// kernel caches and warm-up jobs in `<state>/.local-cluster`).
    #[serde(default)]
    pub work_dir: Option<String>,
    /// The worker binary on the cluster (default `<work_dir>/bin/worker`;
    /// for `local`, the `worker` next to the orchestrator or on PATH).
    #[serde(default)]
    pub worker: Option<String>,
    /// `local`: at most this many tasks at once (default: half the CPUs, at least 1).
    #[serde(default)]
    pub max_parallel: Option<u32>,
    /// Environment for the cluster's SLURM commands (e.g. `SLURM_CONF`).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// SLURM resources used where the experiment does not set them.
    #[serde(default)]
    pub defaults: SlurmResources,
    /// What the job scripts do before the worker starts (`module load`,
    /// exported variables): see [`setup`].
    #[serde(default, skip_serializing_if = "JobSetup::is_empty")]
    pub setup: JobSetup,
    /// REST: slurmrestd's base URL (`http://host:port` or `https://…`).
    #[serde(default)]
    pub url: Option<String>,
    /// REST: a file holding the JWT (`scontrol token` output, with or without `SLURM_JWT=`).
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// REST: the environment variable holding the JWT.
    #[serde(default)]
    pub token_env: Option<String>,
    /// REST: how files reach the cluster (`local` or `sftp`).
    #[serde(default)]
    pub files: Option<FilesKind>,
    /// REST: the cluster's `MaxArraySize` (the API does not publish it; default 1001, SLURM's).
    #[serde(default)]
    pub max_array_size: Option<u32>,
    /// REST over https: a PEM file of the CA certificate(s) that signed the
    /// server's (sites often run their own CA), trusted besides the built-in roots.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// Replay: the measurements JSONL whose records answer submitted configs.
    #[serde(default)]
    pub records: Option<PathBuf>,
}

impl ClusterConfig {
    pub fn local() -> Self {
        ClusterConfig {
            transport: TransportKind::Local,
            host: None,
            port: None,
            user: None,
            identity_file: None,
            known_hosts: None,
            ssh_config: None,
            work_dir: None,
            worker: None,
            max_parallel: None,
            env: BTreeMap::new(),
            defaults: SlurmResources::default(),
            setup: JobSetup::default(),
            url: None,
            token_file: None,
            token_env: None,
            files: None,
            max_array_size: None,
            ca_file: None,
            records: None,
        }
    }

    /// The built-in `replay` cluster: the group's records (`data/vram-measurements.jsonl`).
    pub fn replay() -> Self {
        ClusterConfig {
            transport: TransportKind::Replay,
            records: Some(PathBuf::from("data/vram-measurements.jsonl")),
            ..ClusterConfig::local()
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClustersFile {
    #[serde(default)]
    pub clusters: BTreeMap<String, ClusterConfig>,
}

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{}: {message}", path.display())]
    Parse { path: PathBuf, message: String },
    #[error("unknown cluster `{name}` ({known}); clusters come from {file}")]
    Unknown { name: String, known: String, file: String },
    #[error("{}{}: cluster `{name}`: {message}", path.display(), line.map(|l| format!(":{l}")).unwrap_or_default())]
    Invalid { path: PathBuf, line: Option<usize>, name: String, message: String },
}

/// Where the clusters file is looked for when none is given: `$SWEEP_CLUSTERS`,
/// then `./clusters.yaml`.
pub fn default_path() -> PathBuf {
    std::env::var_os("SWEEP_CLUSTERS").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("clusters.yaml"))
}

impl ClustersFile {
    pub fn load(path: &Path) -> Result<Self, ClusterError> {
        let text = std::fs::read_to_string(path).map_err(|source| ClusterError::Io { path: path.into(), source })?;
        Self::parse(path, &text)
    }

    pub fn parse(path: &Path, text: &str) -> Result<Self, ClusterError> {
        let file: ClustersFile = serde_yaml::from_str(text)
            .map_err(|e| ClusterError::Parse { path: path.into(), message: e.to_string() })?;
        for (name, c) in &file.clusters {
            c.check().map_err(|message| ClusterError::Invalid {
                path: path.into(),
                line: key_line(text, name),
                name: name.clone(),
                message,
            })?;
        }
        Ok(file)
    }

    /// Loads `path` if given or present; a missing default file is an empty one.
    pub fn load_or_default(path: Option<&Path>) -> Result<(Self, String), ClusterError> {
        match path {
            Some(p) => Ok((Self::load(p)?, p.display().to_string())),
            None => {
                let p = default_path();
                if p.exists() {
                    Ok((Self::load(&p)?, p.display().to_string()))
                } else {
                    Ok((ClustersFile::default(), format!("{} (absent)", p.display())))
                }
            }
        }
    }

    /// The named cluster; `local` is built in unless the file redefines it.
    pub fn get(&self, name: &str, file: &str) -> Result<(String, ClusterConfig), ClusterError> {
        if let Some(c) = self.clusters.get(name) {
            return Ok((name.to_string(), c.clone()));
        }
        if name == "local" {
            return Ok(("local".into(), ClusterConfig::local()));
        }
        if name == "replay" {
            return Ok(("replay".into(), ClusterConfig::replay()));
        }
        let declared: Vec<&str> = self.clusters.keys().map(String::as_str).collect();
        let builtin: Vec<&str> = ["local", "replay"].into_iter().filter(|b| !declared.contains(b)).collect();
        let builtin = builtin.iter().map(|b| format!("`{b}`")).collect::<Vec<_>>().join(" and ");
        let known = match (declared.is_empty(), builtin.is_empty()) {
            (true, _) => format!("none declared; {builtin} built in"),
            (false, true) => format!("declared: {}", declared.join(", ")),
            (false, false) => format!("declared: {}; {builtin} built in", declared.join(", ")),
        };
        Err(ClusterError::Unknown { name: name.into(), known, file: file.into() })
    }
}

/// The 1-based line of the mapping key `name:` (where a cluster's entry starts).
fn key_line(text: &str, name: &str) -> Option<usize> {
    text.lines()
        .position(|l| {
            let t = l.trim_start().trim_start_matches(['"', '\'']);
            t.strip_prefix(name).is_some_and(|rest| rest.trim_start_matches(['"', '\'']).starts_with(':'))
        })
        .map(|i| i + 1)
}

impl ClusterConfig {
    /// Why the entry cannot work, naming the field.
    fn check(&self) -> Result<(), String> {
        let bad = |m: &str| Err(m.to_string());
        let rest = self.transport == TransportKind::Rest;
        if !rest {
            let rest_only = [
                ("url", self.url.is_some()),
                ("token_file", self.token_file.is_some()),
                ("token_env", self.token_env.is_some()),
                ("files", self.files.is_some()),
                ("max_array_size", self.max_array_size.is_some()),
                ("ca_file", self.ca_file.is_some()),
            ];
            if let Some((field, _)) = rest_only.iter().find(|(_, set)| *set) {
                return Err(format!("`{field}` is for `transport: rest` only"));
            }
        }
        if rest {
            self.check_rest()?;
        }
        match (self.transport == TransportKind::Replay, self.records.is_some()) {
            (true, false) => return bad("transport `replay` needs `records` (a measurements JSONL)"),
            (false, true) => return bad("`records` is for `transport: replay` only"),
            _ => {}
        }
        match self.transport {
            TransportKind::Ssh if self.host.is_none() => return bad("transport `ssh` needs `host`"),
            TransportKind::Ssh | TransportKind::LocalSlurm | TransportKind::Rest if self.work_dir.is_none() => {
                return bad("needs `work_dir` (the directory on the cluster for job files and results)")
            }
            _ => {}
        }
        if let Some(w) = &self.work_dir {
            if w.chars().any(char::is_control) {
                return bad("`work_dir` contains control characters");
            }
        }
        for k in self.env.keys() {
            if k.is_empty() || !k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return bad("`env` keys must be shell variable names");
            }
        }
        self.setup.check()
    }

    fn check_rest(&self) -> Result<(), String> {
        let url = self.url.as_deref().ok_or("transport `rest` needs `url` (slurmrestd's, e.g. http://host:6820)")?;
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(format!("`url` must start with http:// or https:// (got {url:?})"));
        }
        if self.user.is_none() {
            return Err("transport `rest` needs `user` (sent as X-SLURM-USER-NAME)".into());
        }
        if self.ca_file.is_some() && !url.starts_with("https://") {
            return Err(format!("`ca_file` is for an https:// `url` (got {url:?})"));
        }
        match (&self.token_file, &self.token_env) {
            (None, None) => {
                return Err("transport `rest` needs `token_file` or `token_env` (a JWT from `scontrol token`)".into())
            }
            (Some(_), Some(_)) => return Err("give one of `token_file` and `token_env`, not both".into()),
            _ => {}
        }
        if let Some(v) = &self.token_env {
            if v.is_empty() || !v.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err("`token_env` must be an environment variable name".into());
            }
        }
        match self.files {
            None => {
                Err("transport `rest` needs `files: local` or `files: sftp` (how job files reach the cluster)".into())
            }
            Some(FilesKind::Sftp) if self.host.is_none() => Err("`files: sftp` needs `host`".into()),
            Some(FilesKind::Local) if self.host.is_some() || self.port.is_some() => {
                Err("`host`/`port` are for `files: sftp`; `files: local` uses this machine's filesystem".into())
            }
            _ if self.max_array_size == Some(0) => Err("`max_array_size` must be at least 1".into()),
            _ => Ok(()),
        }
    }
}

/// SLURM resources of a job: the experiment's, falling back to the cluster's defaults.
pub fn merge_resources(exp: &SlurmResources, defaults: &SlurmResources) -> SlurmResources {
    SlurmResources {
        partition: exp.partition.clone().or_else(|| defaults.partition.clone()),
        account: exp.account.clone().or_else(|| defaults.account.clone()),
        qos: exp.qos.clone().or_else(|| defaults.qos.clone()),
        time: exp.time.clone().or_else(|| defaults.time.clone()),
        cpus_per_task: exp.cpus_per_task.or(defaults.cpus_per_task),
        mem: exp.mem.clone().or_else(|| defaults.mem.clone()),
        gres: exp.gres.clone().or_else(|| defaults.gres.clone()),
        constraint: exp.constraint.clone().or_else(|| defaults.constraint.clone()),
        extra: defaults.extra.iter().chain(exp.extra.iter()).cloned().collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_example_clusters_file() {
        let text = include_str!("../../clusters.yaml");
        let f = ClustersFile::parse(Path::new("clusters.yaml"), text).expect("example parses");
        let (_, idun) = f.get("idun", "clusters.yaml").expect("idun declared");
        assert_eq!(idun.transport, TransportKind::Ssh);
        assert!(idun.defaults.partition.is_some());
        let (_, local) = f.get("local", "clusters.yaml").expect("local always exists");
        assert_eq!(local.transport, TransportKind::Local);
    }

    #[test]
    fn unknown_cluster_lists_the_known_ones() {
        let f = ClustersFile::default();
        let e = f.get("idun", "x.yaml").expect_err("unknown");
        assert!(e.to_string().contains("(none declared; `local` and `replay` built in)"), "{e}");
        let f = ClustersFile::parse(
            Path::new("c.yaml"),
            "clusters:\n  local: {transport: local}\n  idun: {transport: ssh, host: h, work_dir: /w}\n",
        )
        .expect("parses");
        let e = f.get("idun2", "c.yaml").expect_err("unknown");
        assert!(e.to_string().contains("(declared: idun, local; `replay` built in)"), "`local` once: {e}");
    }

    #[test]
    fn ssh_without_host_is_refused() {
        let e = ClustersFile::parse(Path::new("c.yaml"), "clusters:\n  a: {transport: ssh, work_dir: /w}\n")
            .expect_err("no host");
        assert!(e.to_string().contains("needs `host`"), "{e}");
        let e = ClustersFile::parse(Path::new("c.yaml"), "clusters:\n  a: {transport: tcp}\n").expect_err("bad kind");
        assert!(e.to_string().contains("c.yaml"), "{e}");
    }

    #[test]
    fn rest_entries_with_either_data_plane_parse() {
        let text = include_str!("../../clusters.yaml");
        let f = ClustersFile::parse(Path::new("clusters.yaml"), text).expect("example parses");
        let (_, portal) = f.get("portal", "clusters.yaml").expect("portal declared");
        assert_eq!((portal.transport, portal.files), (TransportKind::Rest, Some(FilesKind::Sftp)));
        assert!(portal.token_file.is_some() && portal.token_env.is_none());
        let (_, mounted) = f.get("portal-mounted", "clusters.yaml").expect("declared");
        assert_eq!((mounted.files, mounted.token_env.as_deref()), (Some(FilesKind::Local), Some("SLURM_JWT")));
    }

    #[test]
    fn bad_rest_entries_name_file_line_and_field() {
        let head = "clusters:\n  local: {transport: local}\n  portal:\n    transport: rest\n    work_dir: /w\n";
        let cases = [
            ("    user: me\n    token_env: T\n    files: local\n", "needs `url`"),
            ("    url: ftp://x\n    user: me\n    token_env: T\n    files: local\n", "`url` must start with http"),
            ("    url: http://x:6820\n    token_env: T\n    files: local\n", "needs `user`"),
            ("    url: http://x:6820\n    user: me\n    files: local\n", "needs `token_file` or `token_env`"),
            (
                "    url: http://x:6820\n    user: me\n    token_env: T\n    token_file: /t\n    files: local\n",
                "not both",
            ),
            ("    url: http://x:6820\n    user: me\n    token_env: T\n", "needs `files: local` or `files: sftp`"),
            ("    url: http://x:6820\n    user: me\n    token_env: T\n    files: sftp\n", "`files: sftp` needs `host`"),
            ("    url: http://x:6820\n    user: me\n    token_env: \"A B\"\n    files: local\n", "`token_env` must be"),
            (
                "    url: http://x:6820\n    ca_file: /ca.pem\n    user: me\n    token_env: T\n    files: local\n",
                "`ca_file` is for an https:// `url`",
            ),
        ];
        for (rest, want) in cases {
            let e = ClustersFile::parse(Path::new("c.yaml"), &format!("{head}{rest}")).expect_err(want).to_string();
            assert!(e.starts_with("c.yaml:3: cluster `portal`: ") && e.contains(want), "{want}: {e}");
        }
        let e = ClustersFile::parse(
            Path::new("c.yaml"),
            "clusters:\n  a: {transport: ssh, host: h, work_dir: /w, files: sftp}\n",
        )
        .expect_err("files is rest-only");
        assert!(e.to_string().contains("c.yaml:2: cluster `a`: `files` is for `transport: rest` only"), "{e}");
        let e = ClustersFile::parse(Path::new("c.yaml"), "clusters:\n  a:\n    transport: rest\n    files: ftp\n")
            .expect_err("unknown data plane");
        assert!(e.to_string().contains("c.yaml") && e.to_string().contains("line 4"), "{e}");
    }

    #[test]
    fn a_bad_setup_names_file_line_and_field() {
        let text = "clusters:\n  idun:\n    transport: ssh\n    host: idun\n    work_dir: /w\n    setup:\n      env: {9LIVES: x}\n";
        let e = ClustersFile::parse(Path::new("c.yaml"), text).expect_err("not a variable name").to_string();
        assert!(e.starts_with("c.yaml:2: cluster `idun`: `setup.env`: \"9LIVES\" is not a shell variable name"), "{e}");
        let e = ClustersFile::parse(Path::new("c.yaml"), &text.replace("env: {9LIVES: x}", "modules: [\"a b\"]"))
            .expect_err("two names in one item")
            .to_string();
        assert!(e.starts_with("c.yaml:2: cluster `idun`: `setup.modules`: \"a b\" is not one module name"), "{e}");
    }

    #[test]
    fn experiment_resources_win_over_defaults() {
        let exp = SlurmResources { partition: Some("a100".into()), extra: vec!["--x".into()], ..Default::default() };
        let def = SlurmResources {
            partition: Some("GPUQ".into()),
            account: Some("acct".into()),
            extra: vec!["--y".into()],
            ..Default::default()
        };
        let m = merge_resources(&exp, &def);
        assert_eq!(m.partition.as_deref(), Some("a100"));
        assert_eq!(m.account.as_deref(), Some("acct"));
        assert_eq!(m.extra, vec!["--y".to_string(), "--x".to_string()]);
    }
}
