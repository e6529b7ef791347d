use super::*;

fn parse(text: &str) -> ConfigFile {
    ConfigFile::parse(text, Path::new("cfg"), Path::new("/nonexistent-ssh-dir")).expect("parses")
}

fn resolve(text: &str, alias: &str) -> HostSettings {
    parse(text).resolve(alias, "me").expect("resolves")
}

const CONFIG: &str = "\
# comment
Host idun idun-login
    HostName idun-login1.hpc.ntnu.no
    User alice
    IdentityFile ~/.ssh/id_idun

Host *.internal !bastion.internal
    Port 2222

Host *
    User nobody
    Port 22
    IdentityFile ~/.ssh/id_default
";

#[test]
fn first_value_wins_and_identity_files_accumulate() {
    let e = resolve(CONFIG, "idun");
    assert_eq!(e.host_name.as_deref(), Some("idun-login1.hpc.ntnu.no"));
    assert_eq!(e.user.as_deref(), Some("alice"));
    assert_eq!(e.port, Some(22));
    let files: Vec<&str> = e.identity_files.iter().map(|f| f.0.as_str()).collect();
    assert_eq!(files, vec!["~/.ssh/id_idun", "~/.ssh/id_default"]);
    let e = resolve(CONFIG, "db.internal");
    assert_eq!(e.port, Some(2222));
    assert_eq!(e.user.as_deref(), Some("nobody"));
    let e = resolve(CONFIG, "bastion.internal");
    assert_eq!(e.port, Some(22), "a negated pattern excludes the host");
}

#[test]
fn options_before_the_first_host_apply_to_every_host() {
    let e = resolve("User early\nHost x\n  User late\n", "x");
    assert_eq!(e.user.as_deref(), Some("early"));
}

#[test]
fn key_equals_value_quotes_and_trailing_comments() {
    let e = resolve("Host=a\n  HostName=\"h.example.org\"  # the login node\n  IdentityFile \"/keys/my key\"\n", "a");
    assert_eq!(e.host_name.as_deref(), Some("h.example.org"));
    assert_eq!(e.identity_files[0].0, "/keys/my key");
    assert_eq!(e.identity_files[0].1.line, 3);
}

#[test]
fn globs() {
    assert!(glob_match("*.example.org", "a.example.org"));
    assert!(glob_match("node??", "node12"));
    assert!(!glob_match("node??", "node123"));
    assert!(glob_match("*", ""));
    assert!(glob_match("IDUN*", "idun-login"), "case-insensitive");
    assert!(glob_match("a*b*c", "aXXbYYbc"));
    assert!(!glob_match("a*b*c", "aXXbYYb"));
}

#[test]
fn proxy_jump_chains_and_proxy_command_compete_first_wins() {
    let e = resolve("Host t\n  ProxyJump me@b1:2200,ssh://b2,[::1]:23\n  ProxyCommand nc %h %p\n", "t");
    let (Proxy::Jump(j), loc) = e.proxy.expect("proxy") else { panic!("jump expected") };
    assert_eq!(loc.line, 2);
    assert_eq!(
        j,
        vec![
            JumpHost { user: Some("me".into()), host: "b1".into(), port: Some(2200) },
            JumpHost { user: None, host: "b2".into(), port: None },
            JumpHost { user: None, host: "::1".into(), port: Some(23) },
        ]
    );
    let e = resolve("Host t\n  ProxyCommand socat - TCP:%h:%p # not a comment for the shell\n  ProxyJump b\n", "t");
    assert_eq!(e.proxy.map(|p| p.0), Some(Proxy::Command("socat - TCP:%h:%p # not a comment for the shell".into())));
    let e = resolve("Host t\n  ProxyJump none\nHost *\n  ProxyJump b\n", "t");
    assert_eq!(e.proxy.map(|p| p.0), Some(Proxy::None));
}

#[test]
fn bad_values_name_file_line_and_directive() {
    let e = parse("Host t\n  Port http\n").resolve("t", "me").expect_err("bad port");
    assert_eq!(e.to_string(), "ssh config cfg:2: Port: `http` is not a port number");
    let e = parse("Host t\n  ProxyJump a@:22\n").resolve("t", "me").expect_err("bad jump");
    assert!(e.to_string().starts_with("ssh config cfg:2: ProxyJump:"), "{e}");
    let e = ConfigFile::parse("Host t\n  User \"alice\n", Path::new("cfg"), Path::new("/")).expect_err("quote");
    assert_eq!(e.to_string(), "ssh config cfg:2: User: unterminated quote");
    let e = ConfigFile::parse("Match\n", Path::new("cfg"), Path::new("/")).expect_err("empty match");
    assert!(e.to_string().starts_with("ssh config cfg:1: Match:"), "{e}");
    // A bad value in a block that does not apply is not evaluated (as ssh -G).
    parse("Host other\n  Port http\n").resolve("t", "me").expect("inactive block");
}

#[test]
fn match_host_all_user_and_negation() {
    let text = "\
Host login
    HostName login1.cluster.org
Match host *.cluster.org !user root
    User researcher
Match originalhost login
    Port 2022
Match all
    ServerAliveInterval 1m
    ServerAliveCountMax 5
";
    let e = resolve(text, "login");
    assert_eq!(e.user.as_deref(), Some("researcher"), "Match host sees the HostName");
    assert_eq!(e.port, Some(2022));
    assert_eq!(e.server_alive_interval, Some(60));
    assert_eq!(e.server_alive_count_max, Some(5));
    let e = resolve(text, "elsewhere");
    assert_eq!(e.user, None);
    assert_eq!(e.port, None);
    assert_eq!(e.server_alive_interval, Some(60));
    let e = resolve("User root\nMatch host a !user root\n  Port 9\n", "a");
    assert_eq!(e.port, None, "negated criterion");
    let e = resolve("Match localuser me host a,b\n  Port 9\n", "b");
    assert_eq!(e.port, Some(9));
}

#[test]
fn unsupported_match_criteria_skip_the_block_and_are_reported() {
    let e = resolve("Match exec \"test -f /x\" host a\n  Port 9\nHost a\n  Port 10\n", "a");
    assert_eq!(e.port, Some(10));
    assert_eq!(e.unhonoured.len(), 1);
    assert_eq!(e.unhonoured[0].1, "Match exec");
    assert_eq!(e.unhonoured[0].0.line, 1);
}

#[test]
fn unhonoured_directives_are_reported_only_where_they_apply() {
    let e = resolve(
        "Host a\n  ForwardAgent yes\n  StrictHostKeyChecking no\n  BatchMode yes\nHost b\n  Compression yes\n",
        "a",
    );
    let keys: Vec<&str> = e.unhonoured.iter().map(|u| u.1.as_str()).collect();
    assert_eq!(keys, vec!["ForwardAgent", "StrictHostKeyChecking"]);
    let e = resolve("StrictHostKeyChecking yes\n", "a");
    assert!(e.unhonoured.is_empty(), "strict checking is what the tool does");
}

#[test]
fn known_hosts_keepalive_and_timeouts() {
    let e = resolve(
        "Host a\n  UserKnownHostsFile ~/kh1 /etc/kh2\n  GlobalKnownHostsFile none\n  UserKnownHostsFile /ignored\n  ConnectTimeout 1m30s\n  IdentitiesOnly yes\n  HostKeyAlias alias-a\n",
        "a",
    );
    assert_eq!(e.user_known_hosts.map(|k| k.0), Some(vec!["~/kh1".to_string(), "/etc/kh2".to_string()]));
    assert_eq!(e.global_known_hosts.map(|k| k.0), Some(vec![]));
    assert_eq!(e.connect_timeout, Some(90));
    assert_eq!(e.identities_only, Some(true));
    assert_eq!(e.host_key_alias.as_deref(), Some("alias-a"));
}

#[test]
fn include_applies_inside_its_block_and_relative_paths_are_in_the_ssh_dir() {
    let d = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(d.path().join("conf.d")).expect("mkdir");
    std::fs::write(d.path().join("conf.d/10-a.conf"), "Port 1010\nHost inner\n  User in\n").expect("write");
    std::fs::write(d.path().join("conf.d/20-b.conf"), "User from-b\n").expect("write");
    std::fs::write(d.path().join("conf.d/notes.txt"), "Port 1\n").expect("write");
    let main = d.path().join("config");
    std::fs::write(
        &main,
        "Host a\n  Include conf.d/*.conf\n  HostName after-include\nHost other\n  Include conf.d/10-a.conf\n",
    )
    .expect("write");
    let f = ConfigFile::load(&main, d.path()).expect("loads");
    let e = f.resolve("a", "me").expect("a");
    assert_eq!(e.port, Some(1010), "the included file's first lines apply in the including block");
    assert_eq!(e.user.as_deref(), Some("from-b"), "the second file starts active again");
    assert_eq!(e.host_name.as_deref(), Some("after-include"), "the Host inside the include does not leak out");
    let e = f.resolve("inner", "me").expect("inner");
    assert_eq!(e.user, None, "an include inside an inactive block never applies");
    assert_eq!(e.port, None);
}

#[test]
fn include_loops_are_refused_with_the_file_named() {
    let d = tempfile::tempdir().expect("tempdir");
    let p = d.path().join("config");
    std::fs::write(&p, "Include config\n").expect("write");
    let e = ConfigFile::load(&p, d.path()).expect_err("loop");
    assert!(e.to_string().contains("config:1: Include: nested more than 16"), "{e}");
}

#[test]
fn times() {
    assert_eq!(seconds("30"), Some(30));
    assert_eq!(seconds("2m"), Some(120));
    assert_eq!(seconds("1h5s"), Some(3605));
    assert_eq!(seconds("x"), None);
    assert_eq!(seconds(""), None);
}
