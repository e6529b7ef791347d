use super::*;
use crate::cluster::TransportKind;

fn cluster(cfg_text: &str, host: &str) -> (tempfile::TempDir, ClusterConfig) {
    let d = tempfile::tempdir().expect("tempdir");
    let cfg = d.path().join("config");
    std::fs::write(&cfg, cfg_text).expect("write");
    let mut c = ClusterConfig::local();
    c.transport = TransportKind::Ssh;
    c.host = Some(host.into());
    c.ssh_config = Some(cfg);
    c.user = None;
    (d, c)
}

const JUMPS: &str = "\
Host node
    HostName node.internal
    User alice
    Port 2200
    ProxyJump bastion
    IdentityFile /keys/%r@%h
    UserKnownHostsFile /kh/%n /kh/shared
    ServerAliveInterval 5
    ServerAliveCountMax 2
Host bastion
    HostName 192.0.2.10
    User bob
    IdentitiesOnly yes
    IdentityFile /keys/bastion
    ConnectTimeout 3
Host deep
    ProxyJump carol@hop1:2022,hop2
Host hop1
    ProxyCommand socat - TCP:%h:%p
Host hop2
    ProxyJump ignored-because-listed
    User dave
Host loop
    ProxyJump loop
Host cmd
    HostName 10.0.0.5
    ProxyCommand socat - TCP:%h:%p,user=%r
Host evil
    HostName a;rm
    ProxyCommand nc %h %p
";

#[test]
fn clusters_file_overrides_the_ssh_config_for_the_target() {
    let (_d, mut c) = cluster(JUMPS, "node");
    c.port = Some(2201);
    c.user = Some("ann".into());
    c.known_hosts = Some("/kh/override".into());
    let t = resolve_target(&c).expect("resolves");
    let node = t.target();
    assert_eq!(node.host, "node.internal");
    assert_eq!(node.port, 2201);
    assert_eq!(node.user, "ann");
    assert_eq!(node.known_hosts, vec![PathBuf::from("/kh/override")]);
    assert_eq!(node.identity_files, vec![PathBuf::from("/keys/ann@node.internal")], "%r and %h expanded");
    assert!(node.explicit_identity);
    assert_eq!(node.keepalive, Keepalive { interval: 5, count_max: 2 });
}

#[test]
fn proxy_jump_puts_the_bastion_first_with_its_own_settings() {
    let (_d, c) = cluster(JUMPS, "node");
    let t = resolve_target(&c).expect("resolves");
    assert_eq!(t.hops.len(), 2);
    let (b, n) = (&t.hops[0], &t.hops[1]);
    assert_eq!((b.host.as_str(), b.port, b.user.as_str(), &b.via), ("192.0.2.10", 22, "bob", &Via::Direct));
    assert!(b.identities_only);
    assert_eq!(b.connect_timeout, Duration::from_secs(3));
    assert_eq!(b.keepalive, DEFAULT_KEEPALIVE);
    assert_eq!((n.host.as_str(), n.port, n.user.as_str(), &n.via), ("node.internal", 2200, "alice", &Via::Jump));
    assert_eq!(
        n.known_hosts,
        vec![
            PathBuf::from("/kh/node"),
            PathBuf::from("/kh/shared"),
            "/etc/ssh/ssh_known_hosts".into(),
            "/etc/ssh/ssh_known_hosts2".into()
        ]
    );
    assert_eq!(t.role(0), "bastion bob@192.0.2.10 (ProxyJump for node)");
    assert_eq!(t.label(), "alice@node.internal:2200 via bob@192.0.2.10");
}

#[test]
fn a_jump_list_chains_and_its_first_host_keeps_its_own_proxy() {
    let (_d, c) = cluster(JUMPS, "deep");
    let t = resolve_target(&c).expect("resolves");
    let hops: Vec<(&str, u16, &str)> = t.hops.iter().map(|h| (h.host.as_str(), h.port, h.user.as_str())).collect();
    let me = local_user_name();
    assert_eq!(hops, vec![("hop1", 2022, "carol"), ("hop2", 22, "dave"), ("deep", 22, me.as_str())]);
    assert_eq!(t.hops[0].via, Via::Command("socat - TCP:hop1:2022".into()), "hop1 keeps its ProxyCommand");
    assert_eq!(t.hops[1].via, Via::Jump, "hop2's own ProxyJump is overridden by the list");
    assert_eq!(t.hops[2].via, Via::Jump);
}

#[test]
fn proxy_command_tokens_are_expanded_and_unsafe_values_refused() {
    let (_d, mut c) = cluster(JUMPS, "cmd");
    c.user = Some("ann".into());
    let t = resolve_target(&c).expect("resolves");
    assert_eq!(t.hops.len(), 1);
    assert_eq!(t.hops[0].via, Via::Command("socat - TCP:10.0.0.5:22,user=ann".into()));
    let (_d, c) = cluster(JUMPS, "evil");
    let e = resolve_target(&c).expect_err("shell metacharacter in %h");
    let msg = e.to_string();
    assert!(msg.contains("config:30: ProxyCommand: %h expands to `a;rm`"), "{msg}");
}

#[test]
fn a_proxy_jump_loop_is_refused() {
    let (_d, c) = cluster(JUMPS, "loop");
    let e = resolve_target(&c).expect_err("loop");
    assert!(e.to_string().contains("a loop in the ssh config"), "{e}");
}

#[test]
fn a_missing_explicit_ssh_config_is_an_error() {
    let (d, mut c) = cluster("", "x");
    c.ssh_config = Some(d.path().join("nope"));
    let e = resolve_target(&c).expect_err("missing");
    assert!(e.to_string().contains("nope: cannot read"), "{e}");
}

#[test]
fn unknown_tokens_name_the_line() {
    let (_d, c) = cluster("Host x\n  IdentityFile ~/.ssh/%q\n", "x");
    let e = resolve_target(&c).expect_err("unknown token");
    assert!(e.to_string().ends_with("config:2: IdentityFile: unknown token %q in `~/.ssh/%q`"), "{e}");
}

#[test]
fn unhonoured_directives_warn_once_per_keyword() {
    assert!(first_time("SomeDirectiveForThisTest"));
    assert!(!first_time("somedirectivefortHISTEST"));
}
