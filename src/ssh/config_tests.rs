//! Host specs and ssh_config resolution.
use super::*;

const CONFIG: &str = r#"
# global lines apply to every host
IdentityFile ~/.ssh/global_key

Host gpu-* !gpu-bad
    HostName %h.cluster.example
    User trainer
    IdentityFile /keys/%r-%h

Host node-a
    HostName=10.213.0.2
    Port 2222
    User alice
    UserKnownHostsFile /tmp/kh1 /tmp/kh2
    StrictHostKeyChecking accept-new

Host node-a
    Port 9999

Match host node-a
    User mallory

Host *
    User fallback
"#;

fn ctx() -> ClientEnv {
    ClientEnv { home: Some(PathBuf::from("/home/tester")), ..Default::default() }
}

fn home() -> PathBuf {
    ctx().home_dir()
}

fn resolve_in(spec: &str) -> Target {
    resolve_with(spec, Some((CONFIG, Path::new("/test/ssh_config"))), &ctx()).unwrap()
}

#[test]
fn specs_parse_into_user_host_port() {
    assert_eq!(parse_spec("node").unwrap(), (None, "node".into(), None));
    assert_eq!(parse_spec("bob@node:2222").unwrap(), (Some("bob".into()), "node".into(), Some(2222)));
    assert_eq!(parse_spec("[::1]:22").unwrap(), (None, "::1".into(), Some(22)));
    assert_eq!(parse_spec("fe80::1").unwrap(), (None, "fe80::1".into(), None));
    for bad in ["", "@node", "node:0", "node:x", "[::1", "a b", "node:70000"] {
        let e = parse_spec(bad).unwrap_err().to_string();
        assert!(e.contains(&format!("{bad:?}")) && e.contains("user@node-b:2222"), "{e}");
    }
}

#[test]
fn aliases_resolve_with_first_value_winning() {
    let t = resolve_in("node-a");
    assert_eq!(t.hostname, "10.213.0.2");
    assert_eq!(t.port, 2222, "the first Port wins over the later block");
    assert_eq!(t.user, "alice", "Match blocks never apply");
    assert_eq!(t.known_hosts, vec![PathBuf::from("/tmp/kh1"), PathBuf::from("/tmp/kh2")]);
    assert!(t.accept_new);
    assert_eq!(t.identity_files, vec![home().join(".ssh/global_key")]);
    assert_eq!(t.display(), "node-a (alice@10.213.0.2:2222)");
}

#[test]
fn the_spec_overrides_the_config_and_patterns_match() {
    let t = resolve_in("root@node-a:22");
    assert_eq!((t.user.as_str(), t.port), ("root", 22));
    let g = resolve_in("gpu-7");
    assert_eq!(g.hostname, "gpu-7.cluster.example");
    assert_eq!(g.user, "trainer");
    assert_eq!(g.identity_files[1], PathBuf::from("/keys/trainer-gpu-7.cluster.example"));
    assert!(!g.accept_new);
    let bad = resolve_in("gpu-bad");
    assert_eq!(bad.hostname, "gpu-bad", "a negated pattern excludes the host");
    assert_eq!(bad.user, "fallback");
    assert_eq!(bad.known_hosts, vec![home().join(".ssh/known_hosts")]);
}

#[test]
fn no_config_means_defaults() {
    let t = resolve_with("10.0.0.5", None, &ctx()).unwrap();
    assert_eq!((t.hostname.as_str(), t.port), ("10.0.0.5", 22));
    assert_eq!(t.user, local_user());
    assert_eq!(t.identity_files.len(), 3);
}

#[test]
fn a_bad_port_names_the_file_and_line() {
    let e = resolve_with("x", Some(("Host x\n  Port many\n", Path::new("/c"))), &ctx()).unwrap_err().to_string();
    assert!(e.starts_with("/c:2:") && e.contains("\"many\""), "{e}");
}

#[test]
fn globs() {
    assert!(glob("*", "anything"));
    assert!(glob("n?de-*", "node-12"));
    assert!(!glob("node-?", "node-12"));
    assert!(glob("*.example", "a.b.example"));
    assert!(!glob("a*b", "acbd"));
}
