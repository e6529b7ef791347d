//! Jump hosts over real SSH (issue 11): the test cluster's second sshd is a
//! bastion that only forwards to the node's sshd (`scripts/test-cluster.sh up`
//! starts it; `bastion-stop`/`bastion-start` take it away and back). The
//! cluster `sweeptest-jump` reaches the node through it with `ProxyJump` in an
//! ssh config file. The bastion logs every forwarding it opens (LogLevel
//! DEBUG1), which is how these tests know a connection really went through it.
//!
//! Also here: ProxyCommand (socat), a two-hop chain, host keys of every hop,
//! keepalives and ServerAliveCountMax against a frozen (SIGSTOPped) server, and
//! a host name that does not resolve (not retried).
//!
//! Tests share the cluster and stop its bastion, so they run one at a time.

mod common;

use orchestrator::cluster::{ClusterConfig, ClustersFile, TransportKind};
use orchestrator::submit::{self, Options, Watch};
use orchestrator::sweep;
use orchestrator::transport::ssh::{SshShell, SshTarget};
use orchestrator::transport::Shell;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{cluster, rt, Env, Use};

/// The bastion as the jump tests see it.
impl Env {
    /// Forwardings the bastion has opened to `port` so far (from its log).
    fn forwards_to(&self, port: u16) -> usize {
        let log = std::fs::read_to_string(self.get("SWEEP_TEST_BASTION_LOG")).unwrap_or_default();
        let needle = format!(", target 127.0.0.1 port {port}");
        log.lines().filter(|l| l.contains("server_request_direct_tcpip:") && l.ends_with(&needle)).count()
    }

    /// Keepalive requests the bastion has received so far.
    fn keepalives_seen(&self) -> usize {
        let log = std::fs::read_to_string(self.get("SWEEP_TEST_BASTION_LOG")).unwrap_or_default();
        log.lines().filter(|l| l.contains("keepalive@libssh2.org")).count()
    }

    /// The bastion's per-connection processes (its listener's descendants).
    fn bastion_sessions(&self) -> Vec<i32> {
        let dir = PathBuf::from(self.get("SWEEP_TEST_CLUSTER_DIR"));
        let pid: i32 = std::fs::read_to_string(dir.join("run/bastion-sshd.pid"))
            .expect("bastion pid")
            .trim()
            .parse()
            .expect("pid");
        let mut out = Vec::new();
        let mut todo = vec![pid];
        while let Some(p) = todo.pop() {
            let kids = Command::new("pgrep").arg("-P").arg(p.to_string()).output().expect("pgrep");
            for k in String::from_utf8_lossy(&kids.stdout).split_whitespace() {
                let k: i32 = k.parse().expect("pid");
                out.push(k);
                todo.push(k);
            }
        }
        out
    }
}

/// Puts the bastion back even when an assertion fails halfway.
struct BastionBack<'a>(&'a Env);

impl Drop for BastionBack<'_> {
    fn drop(&mut self) {
        self.0.script(&["bastion-start"]);
    }
}

/// An ssh config of the test's own (keys and known_hosts of the test cluster).
fn ssh_config(env: &Env, dir: &Path, body: &str) -> PathBuf {
    let p = dir.join("ssh_config");
    let text = body
        .replace("$NODE_PORT", &env.get("SWEEP_TEST_SSH_PORT"))
        .replace("$BASTION_PORT", &env.get("SWEEP_TEST_BASTION_PORT"))
        .replace("$USER", &env.get("SWEEP_TEST_SSH_USER"))
        .replace("$KEY", &env.get("SWEEP_TEST_SSH_KEY"))
        .replace("$KNOWN_HOSTS", &env.get("SWEEP_TEST_KNOWN_HOSTS"));
    std::fs::write(&p, text).expect("ssh config");
    p
}

fn shell(host: &str, ssh_config: &Path, reconnect: Duration) -> SshShell {
    let mut c = ClusterConfig::local();
    c.transport = TransportKind::Ssh;
    c.host = Some(host.into());
    c.ssh_config = Some(ssh_config.into());
    c.work_dir = Some("/tmp".into());
    SshShell::new("t", &c).expect("target resolves").reconnect_window(reconnect)
}

fn echo(sh: &SshShell) -> Result<String, orchestrator::transport::TransportError> {
    sh.run(&["echo".to_string(), "a b".to_string()], true).map(|o| o.stdout)
}

/// A state dir, the test cluster's own clusters.yaml entry `sweeptest-jump`
/// (as `scripts/test-cluster.sh up` wrote it) with a fresh remote work dir,
/// and an n-config experiment on it.
struct World {
    _tmp: tempfile::TempDir,
    opts: Options,
    exp_file: PathBuf,
    remote_work: String,
}

fn world(env: &Env, name: &str, n: usize) -> World {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let written = PathBuf::from(env.get("SWEEP_TEST_CLUSTER_DIR")).join("clusters.yaml");
    let file = ClustersFile::load(&written).expect("the test cluster's clusters.yaml");
    let (_, mut jump) = file.get("sweeptest-jump", "clusters.yaml").expect("sweeptest-jump declared");
    assert_eq!(jump.host.as_deref(), Some("sweeptest-jump"));
    let remote_work = env.remote_work(name);
    jump.work_dir = Some(remote_work.clone());
    let mine = ClustersFile { clusters: [("sweeptest-jump".to_string(), jump)].into_iter().collect() };
    std::fs::write(dir.join("clusters.yaml"), serde_yaml::to_string(&mine).expect("yaml")).expect("clusters file");
    std::fs::write(dir.join("record.sbatch.hbs"), common::RECORD_TEMPLATE).expect("template");
    let template = dir.join("record.sbatch.hbs");
    let exp = common::batch_grid_experiment(name, "jump host test", "sweeptest-jump", &template, n, n as u32);
    let exp_file = dir.join(format!("{name}.yaml"));
    std::fs::write(&exp_file, exp).expect("experiment file");
    let opts = Options {
        state_root: dir.join("state"),
        clusters_file: Some(dir.join("clusters.yaml")),
        template_dirs: vec![],
        // The record template's jobs write no worker events: an ended job's
        // missing result is not awaited for the default two minutes.
        result_grace: Duration::from_secs(2),
        ..Options::default()
    };
    World { _tmp: tmp, opts, exp_file, remote_work }
}

#[test]
fn cluster_jump_sweep_completes_through_the_bastion() {
    let Some(env) = cluster(Use::Shared) else { return };
    let node_port = env.port("SWEEP_TEST_SSH_PORT");
    let before = env.forwards_to(node_port);
    let w = world(&env, "cj-sweep", 6);
    let sweep = sweep::load(&w.exp_file, &[]).expect("experiment loads");
    let t0 = Instant::now();
    let rep = rt().block_on(submit::submit(&sweep, &w.opts, false)).expect("submit through the bastion");
    assert_eq!(rep.submitted.len(), 6);
    let watch = Watch { min: Duration::from_millis(700), max: Duration::from_secs(3), max_polls: Some(200) };
    let r = rt().block_on(submit::status("cj-sweep", &w.opts, Some(watch), &mut |_| {})).expect("status --watch");
    assert!(r.settled, "{}", r.table());
    assert_eq!(r.count("COMPLETED"), 6, "{}", r.table());
    let through = env.forwards_to(node_port) - before;
    eprintln!(
        "FIGURES: 6-config sweep through the bastion: submit {:.2} s ({} SSH connections), to completion {:.1} s; the bastion opened {through} forwardings to the node",
        rep.wall_s,
        rep.counters.connects,
        t0.elapsed().as_secs_f64()
    );
    assert!(through >= 2, "submit and status each went through the bastion ({through} forwardings)");
    // Each task got its config, read back over SFTP through the bastion.
    let sh = shell("sweeptest-jump", Path::new(&env.get("SWEEP_TEST_SSH_CONFIG")), Duration::from_secs(5));
    let sub = std::fs::read_dir(w.opts.state_root.join("cj-sweep/submissions"))
        .expect("subs")
        .next()
        .expect("one")
        .expect("entry");
    for (i, c) in sweep.configs.iter().enumerate() {
        let path =
            format!("{}/state/cj-sweep/submissions/{}/task-{i}.json", w.remote_work, sub.file_name().to_string_lossy());
        let got = sh.read_file(&path).expect("sftp through the bastion").unwrap_or_else(|| panic!("{path} missing"));
        let got: facts::RunConfig = serde_json::from_slice(&got).expect("config json");
        assert_eq!(got, c.config, "task {i}");
    }
}

#[test]
fn cluster_jump_fails_naming_the_bastion_when_it_is_down() {
    let Some(env) = cluster(Use::Alone) else { return };
    let bport = env.port("SWEEP_TEST_BASTION_PORT");
    let cfg = PathBuf::from(env.get("SWEEP_TEST_SSH_CONFIG"));
    let sh = shell("sweeptest-jump", &cfg, Duration::from_secs(2));
    assert_eq!(echo(&sh).expect("through the bastion"), "a b\n");
    let w = world(&env, "cj-down", 2);
    let sweep = sweep::load(&w.exp_file, &[]).expect("experiment loads");
    rt().block_on(submit::submit(&sweep, &w.opts, false)).expect("submit");

    let back = BastionBack(&env);
    env.script(&["bastion-stop"]);
    // The open session died with the bastion; reconnecting fails on the bastion.
    let t0 = Instant::now();
    let e = echo(&sh).expect_err("no bastion").to_string();
    eprintln!("FIGURES: bastion down: the shell gave up after {:.1} s: {e}", t0.elapsed().as_secs_f64());
    let want = format!("cannot reach bastion {}@127.0.0.1:{bport} (ProxyJump for sweeptest-jump): 127.0.0.1:{bport}: Connection refused", env.get("SWEEP_TEST_SSH_USER"));
    assert!(e.starts_with(&want), "{e}\nwanted: {want}");
    // And the command a researcher runs says the same.
    let out = Command::new(env!("CARGO_BIN_EXE_orchestrator"))
        .args(["status", "cj-down", "--state-dir"])
        .arg(&w.opts.state_root)
        .arg("--clusters")
        .arg(w.opts.clusters_file.as_ref().expect("file"))
        .env("SWEEP_SSH_RECONNECT_SECS", "2")
        .output()
        .expect("status runs");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(text.contains(&want), "status output names the bastion:\n{text}");
    drop(back);
    assert_eq!(echo(&sh).expect("the bastion is back"), "a b\n");
}

#[test]
fn cluster_jump_verifies_every_hops_host_key() {
    let Some(env) = cluster(Use::Shared) else { return };
    let tmp = tempfile::tempdir().expect("tempdir");
    let all = std::fs::read_to_string(env.get("SWEEP_TEST_KNOWN_HOSTS")).expect("known_hosts");
    let node_line = format!("[127.0.0.1]:{} ", env.get("SWEEP_TEST_SSH_PORT"));
    let bastion_line = format!("[127.0.0.1]:{} ", env.get("SWEEP_TEST_BASTION_PORT"));
    let only =
        |prefix: &str| all.lines().filter(|l| l.starts_with(prefix)).map(|l| format!("{l}\n")).collect::<String>();
    std::fs::write(tmp.path().join("kh_node"), only(&node_line)).expect("write");
    std::fs::write(tmp.path().join("kh_bastion"), only(&bastion_line)).expect("write");
    let body = |kh_bastion: &str, kh_node: &str| {
        format!(
            "Host b\n  HostName 127.0.0.1\n  Port $BASTION_PORT\n  UserKnownHostsFile {}\n\
             Host n\n  HostName 127.0.0.1\n  Port $NODE_PORT\n  ProxyJump b\n  UserKnownHostsFile {}\n\
             Host *\n  User $USER\n  IdentityFile $KEY\n  IdentitiesOnly yes\n  GlobalKnownHostsFile none\n",
            tmp.path().join(kh_bastion).display(),
            tmp.path().join(kh_node).display()
        )
    };
    // The bastion's key unknown: refused at the bastion, before any forwarding.
    let cfg = ssh_config(&env, tmp.path(), &body("kh_node", "kh_node"));
    let e = echo(&shell("n", &cfg, Duration::from_secs(1))).expect_err("bastion key unknown").to_string();
    assert!(
        e.starts_with(&format!(
            "UNKNOWN HOST KEY for [127.0.0.1]:{} (the bastion ",
            env.get("SWEEP_TEST_BASTION_PORT")
        )),
        "{e}"
    );
    // The node's key unknown: the bastion is trusted, the node behind it is not.
    let cfg = ssh_config(&env, tmp.path(), &body("kh_bastion", "kh_bastion"));
    let e = echo(&shell("n", &cfg, Duration::from_secs(1))).expect_err("node key unknown").to_string();
    assert!(e.starts_with(&format!("UNKNOWN HOST KEY for [127.0.0.1]:{}:", env.get("SWEEP_TEST_SSH_PORT"))), "{e}");
    // Both known: through.
    let cfg = ssh_config(&env, tmp.path(), &body("kh_bastion", "kh_node"));
    assert_eq!(echo(&shell("n", &cfg, Duration::from_secs(1))).expect("both keys known"), "a b\n");
}

#[test]
fn cluster_jump_chain_of_two_hops_and_proxy_command() {
    let Some(env) = cluster(Use::Shared) else { return };
    let tmp = tempfile::tempdir().expect("tempdir");
    let (bport, nport) = (env.port("SWEEP_TEST_BASTION_PORT"), env.port("SWEEP_TEST_SSH_PORT"));
    let cfg = ssh_config(
        &env,
        tmp.path(),
        "Host chain\n  HostName 127.0.0.1\n  Port $NODE_PORT\n  ProxyJump sweep-b1,sweep-b2\n  ServerAliveInterval 0\n\
         Host sweep-b1 sweep-b2\n  HostName 127.0.0.1\n  Port $BASTION_PORT\n  ServerAliveInterval 1\n\
         Host viasocat\n  HostName 127.0.0.1\n  Port $NODE_PORT\n  ProxyCommand socat - TCP:%h:%p\n\
         Host deadproxy\n  HostName 127.0.0.1\n  Port 1\n  ProxyCommand socat - TCP:%h:%p\n\
         Host *\n  User $USER\n  IdentityFile $KEY\n  IdentitiesOnly yes\n  UserKnownHostsFile $KNOWN_HOSTS\n",
    );
    // sweep-b2 is the same bastion, reached through itself: two real hops.
    let (to_b, to_n) = (env.forwards_to(bport), env.forwards_to(nport));
    let sh = shell("chain", &cfg, Duration::from_secs(1));
    assert_eq!(
        sh.describe(),
        format!(
            "ssh {u}@127.0.0.1:{nport} via {u}@127.0.0.1:{bport}, {u}@127.0.0.1:{bport}",
            u = env.get("SWEEP_TEST_SSH_USER")
        )
    );
    assert_eq!(echo(&sh).expect("through two hops"), "a b\n");
    assert_eq!((env.forwards_to(bport) - to_b, env.forwards_to(nport) - to_n), (1, 1), "b1 → b2, b2 → node");
    // A larger transfer through both hops: 3 MiB up and back down over SFTP.
    let data: Vec<u8> = (0..3 << 20).map(|i: u32| (i.wrapping_mul(2_654_435_761) >> 24) as u8).collect();
    let path = format!("{}/cj-chain-{}.bin", env.get("SWEEP_TEST_WORK_DIR"), std::process::id());
    let t0 = Instant::now();
    sh.write_file(&path, &data, false).expect("upload");
    let back = sh.read_file(&path).expect("download").expect("exists");
    eprintln!("FIGURES: 3 MiB up and down through two hops: {:.2} s", t0.elapsed().as_secs_f64());
    assert!(back == data, "bytes intact through two hops");
    sh.run(&["rm".to_string(), path], true).expect("rm");
    // The bastions' keepalives come from the threads that carry the next hop.
    let ka = env.keepalives_seen();
    std::thread::sleep(Duration::from_millis(4500));
    let ka = env.keepalives_seen() - ka;
    eprintln!("FIGURES: bastion keepalives while idle: {ka} in 4.5 s (two hops at ServerAliveInterval 1)");
    assert!(ka >= 2, "keepalives from the bastion hops: {ka}");
    assert_eq!(echo(&sh).expect("still up"), "a b\n");

    let sh = shell("viasocat", &cfg, Duration::from_secs(1));
    assert_eq!(echo(&sh).expect("through socat"), "a b\n");
    let e = echo(&shell("deadproxy", &cfg, Duration::from_secs(1))).expect_err("nothing listens on port 1").to_string();
    assert!(e.contains("through ProxyCommand `socat - TCP:127.0.0.1:1`") && e.contains("Connection refused"), "{e}");
}

#[test]
fn cluster_keepalives_are_sent_and_a_frozen_server_is_dropped() {
    let Some(env) = cluster(Use::Shared) else { return };
    let tmp = tempfile::tempdir().expect("tempdir");
    // The bastion as the target itself, so its log shows our keepalives.
    let cfg = ssh_config(
        &env,
        tmp.path(),
        "Host frozen\n  HostName 127.0.0.1\n  Port $BASTION_PORT\n  User $USER\n  IdentityFile $KEY\n  IdentitiesOnly yes\n\
           UserKnownHostsFile $KNOWN_HOSTS\n  ServerAliveInterval 1\n  ServerAliveCountMax 2\n",
    );
    let sh = shell("frozen", &cfg, Duration::from_secs(10));
    let before_sessions = env.bastion_sessions();
    assert_eq!(echo(&sh).expect("connects"), "a b\n");
    let before = env.keepalives_seen();
    std::thread::sleep(Duration::from_millis(5500));
    let sent = env.keepalives_seen() - before;
    assert!(
        sent >= 2,
        "keepalives while idle: {sent} in 5.5 s at ServerAliveInterval 1 (libssh2: at most one per 2 s)"
    );
    // Freeze the server process of our session (not the listener): it stops answering.
    let ours: Vec<i32> = env.bastion_sessions().into_iter().filter(|p| !before_sessions.contains(p)).collect();
    assert!(!ours.is_empty(), "our session's sshd processes");
    for p in &ours {
        // SAFETY: plain kill(2) on processes of the test cluster's bastion.
        unsafe { libc::kill(*p, libc::SIGSTOP) };
    }
    // Two unanswered keepalives (libssh2 sends one per 2 s at most), then the next tick drops the link.
    std::thread::sleep(Duration::from_secs(10));
    let t0 = Instant::now();
    let r = echo(&sh);
    let took = t0.elapsed();
    for p in &ours {
        // SAFETY: as above; the frozen session is ended for good.
        unsafe {
            libc::kill(*p, libc::SIGCONT);
            libc::kill(*p, libc::SIGTERM);
        }
    }
    eprintln!(
        "FIGURES: {sent} keepalives in 5.5 s idle; after the server froze, the next command took {:.2} s (reconnected)",
        took.as_secs_f64()
    );
    assert_eq!(r.expect("a fresh session after the frozen one was dropped"), "a b\n");
    assert!(took < Duration::from_secs(10), "the dead session was already dropped, not waited on: {took:?}");
    assert_eq!(sh.counters().snapshot().connects, 2, "one reconnect");
}

#[test]
fn cluster_a_host_that_does_not_resolve_fails_at_once() {
    let Some(env) = cluster(Use::Shared) else { return };
    let tmp = tempfile::tempdir().expect("tempdir");
    let cfg = ssh_config(
        &env,
        tmp.path(),
        "Host viabastion\n  HostName 127.0.0.1\n  Port $NODE_PORT\n  ProxyJump nobastion.invalid\n  ForwardAgent yes\n\
         Host *\n  User $USER\n  IdentityFile $KEY\n  UserKnownHostsFile $KNOWN_HOSTS\n  ForwardAgent no\n",
    );
    std::fs::write(
        tmp.path().join("clusters.yaml"),
        format!(
            "clusters:\n  nowhere:\n    transport: ssh\n    host: sweep-nowhere.invalid\n    ssh_config: {c}\n    work_dir: /tmp/w\n\
             \x20 viabastion:\n    transport: ssh\n    host: viabastion\n    ssh_config: {c}\n    work_dir: /tmp/w\n",
            c = cfg.display()
        ),
    )
    .expect("clusters file");
    for (cluster, host) in [("nowhere", "sweep-nowhere.invalid"), ("viabastion", "nobastion.invalid")] {
        let t0 = Instant::now();
        let out = Command::new(env!("CARGO_BIN_EXE_orchestrator"))
            .args(["install", "--cluster", cluster, "--worker", "/bin/true", "--clusters"])
            .arg(tmp.path().join("clusters.yaml"))
            .arg("--state-dir")
            .arg(tmp.path().join("state"))
            .env_remove("SWEEP_SSH_RECONNECT_SECS")
            .output()
            .expect("install runs");
        let took = t0.elapsed();
        let err = String::from_utf8_lossy(&out.stderr);
        eprintln!("FIGURES: install --cluster {cluster} (host {host}): failed after {:.2} s", took.as_secs_f64());
        assert!(!out.status.success());
        assert!(err.contains(&format!("host name `{host}` does not resolve")) && err.contains("not retried"), "{err}");
        if cluster == "viabastion" {
            assert!(err.contains("bastion") && err.contains("ProxyJump for viabastion"), "names the bastion: {err}");
        }
        // Applies to both hops (and twice to `viabastion`), warned about once.
        assert_eq!(err.matches("`ForwardAgent` ignored").count(), 1, "{err}");
        assert!(took < Duration::from_secs(10), "not retried for the 60 s reconnect window: {took:?}");
    }
}

/// OpenSSH as the oracle: `ssh -G` (which connects nowhere) and the
/// orchestrator must read the same settings from the same files, the test
/// cluster's own config (Include, Match host, ProxyJump) and one that uses
/// negated patterns, `Match` on HostName and user, globbed includes and
/// first-value-wins across blocks.
#[test]
fn cluster_ssh_config_reads_as_openssh_does() {
    let Some(env) = cluster(Use::Shared) else { return };
    let tmp = tempfile::tempdir().expect("tempdir");
    let inc = tmp.path().join("inc");
    std::fs::create_dir(&inc).expect("mkdir");
    std::fs::write(inc.join("10-login.conf"), "Host login*\n  User researcher\n  Port 2022\n").expect("write");
    std::fs::write(inc.join("20-all.conf"), "Port 2200\nServerAliveCountMax 7\n").expect("write");
    let own = ssh_config(
        &env,
        tmp.path(),
        &format!(
            "Host login1 login2 !login3\n  HostName %h.cluster.example.org\n\
             Host *.internal !db.internal\n  ProxyJump me@gw.example.org:2222,gw2\n  User ops\n\
             Match host *.cluster.example.org\n  ServerAliveInterval 42\n  IdentityFile ~/.ssh/id_%r\n\
             Match !user nobody originalhost login3\n  ProxyCommand socat - TCP:%h:%p\n\
             Host *\n  Include {}/*.conf\n  User fallback\n  UserKnownHostsFile /kh/%h /kh/shared\n  IdentityFile ~/.ssh/id_%h\n",
            inc.display()
        ),
    );
    let cluster_cfg = PathBuf::from(env.get("SWEEP_TEST_SSH_CONFIG"));
    let cases = [
        (&cluster_cfg, "sweeptest"),
        (&cluster_cfg, "sweeptest-bastion"),
        (&cluster_cfg, "sweeptest-jump"),
        (&own, "login1"),
        (&own, "login3"),
        (&own, "web.internal"),
        (&own, "db.internal"),
        (&own, "elsewhere"),
    ];
    for (cfg, alias) in cases {
        let g = ssh_g(cfg, alias);
        let mut c = ClusterConfig::local();
        c.transport = TransportKind::Ssh;
        c.host = Some(alias.into());
        c.ssh_config = Some(cfg.clone());
        let t = orchestrator::transport::ssh::resolve_target(&c).expect("resolves");
        target_hop_reads_as(alias, &t, &g);
        proxy_reads_as(alias, &t, &g);
        eprintln!("{alias}: {} = ssh -G", t.label());
    }
}

/// OpenSSH's own reading of `alias` in `cfg` (`ssh -G`): keyword → values.
fn ssh_g(cfg: &Path, alias: &str) -> BTreeMap<String, Vec<String>> {
    let out = Command::new("ssh").arg("-F").arg(cfg).arg("-G").arg(alias).output().expect("ssh -G runs");
    assert!(out.status.success(), "ssh -G {alias}: {}", String::from_utf8_lossy(&out.stderr));
    let mut g: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for l in String::from_utf8_lossy(&out.stdout).lines() {
        if let Some((k, v)) = l.split_once(' ') {
            g.entry(k.to_string()).or_default().push(v.to_string());
        }
    }
    g
}

fn first_of(g: &BTreeMap<String, Vec<String>>, k: &str) -> String {
    g.get(k).and_then(|v| v.first()).cloned().unwrap_or_default()
}

/// The target hop's address, user, identity and known_hosts files and
/// keepalives are what `ssh -G` (`g`) says for `alias`.
fn target_hop_reads_as(alias: &str, t: &SshTarget, g: &BTreeMap<String, Vec<String>>) {
    let one = |k: &str| first_of(g, k);
    let hop = t.target();
    let home = std::env::var("HOME").unwrap_or_default();
    // ssh -G prints paths before their %-tokens are expanded (ssh does that later).
    let tilde = |p: &str| {
        p.replace("%h", &hop.host)
            .replace("%r", &hop.user)
            .replace("%p", &hop.port.to_string())
            .replace("%n", alias)
            .replace(&home, "~")
    };
    assert_eq!(hop.host, one("hostname"), "{alias}: HostName");
    assert_eq!(hop.port.to_string(), one("port"), "{alias}: Port");
    assert_eq!(hop.user, one("user"), "{alias}: User");
    let files: Vec<String> = hop.identity_files.iter().map(|p| tilde(&p.display().to_string())).collect();
    let want: Vec<String> = g.get("identityfile").cloned().unwrap_or_default().iter().map(|p| tilde(p)).collect();
    assert_eq!(files, want, "{alias}: IdentityFile");
    let kh: Vec<String> = hop.known_hosts.iter().map(|p| tilde(&p.display().to_string())).collect();
    let mut want_kh: Vec<String> = one("userknownhostsfile").split(' ').map(tilde).collect();
    want_kh.extend(one("globalknownhostsfile").split(' ').map(tilde));
    assert_eq!(kh, want_kh, "{alias}: known_hosts files");
    let interval = one("serveraliveinterval");
    if interval != "0" {
        assert_eq!(hop.keepalive.interval.to_string(), interval, "{alias}: ServerAliveInterval");
    }
    assert_eq!(hop.keepalive.count_max.to_string(), one("serveralivecountmax"), "{alias}: ServerAliveCountMax");
}

/// The way to the target (bastions of a ProxyJump, a ProxyCommand, or
/// direct) is what `ssh -G` (`g`) says for `alias`.
fn proxy_reads_as(alias: &str, t: &SshTarget, g: &BTreeMap<String, Vec<String>>) {
    let hop = t.target();
    match (g.get("proxyjump"), g.get("proxycommand"), &hop.via) {
        (Some(j), _, orchestrator::transport::ssh::Via::Jump) => {
            let bastions = &t.hops[..t.hops.len() - 1];
            let specs: Vec<&str> = j[0].split(',').collect();
            assert_eq!(specs.len(), bastions.len(), "{alias}: ProxyJump {}", j[0]);
            for (spec, h) in specs.iter().zip(bastions) {
                let (user, rest) = spec.split_once('@').map_or((None, *spec), |(u, r)| (Some(u), r));
                let (name, port) = rest.split_once(':').map_or((rest, None), |(n, p)| (n, Some(p)));
                assert_eq!(h.alias, name, "{alias}: ProxyJump {}", j[0]);
                if let Some(u) = user {
                    assert_eq!(h.user, u, "{alias}: ProxyJump user");
                }
                if let Some(p) = port {
                    assert_eq!(h.port.to_string(), p, "{alias}: ProxyJump port");
                }
            }
        }
        (None, Some(cmd), orchestrator::transport::ssh::Via::Command(ours)) => {
            // ssh -G prints the command before token expansion.
            assert_eq!(
                &cmd[0].replace("%h", &hop.host).replace("%p", &hop.port.to_string()),
                ours,
                "{alias}: ProxyCommand"
            );
        }
        (None, None, orchestrator::transport::ssh::Via::Direct) => {}
        (j, c, via) => panic!("{alias}: OpenSSH says ProxyJump {j:?} / ProxyCommand {c:?}, we say {via:?}"),
    }
}
