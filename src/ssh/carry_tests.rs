use super::*;
use std::time::Duration;

fn target(spec: &str, addr: &str) -> Target {
    Target {
        spec: spec.into(),
        alias: spec.into(),
        hostname: addr.into(),
        user: "root".into(),
        port: 22,
        identity_files: Vec::new(),
        known_hosts: Vec::new(),
        accept_new: false,
        agent_socket: None,
    }
}

fn limits() -> crate::ssh::Limits {
    crate::ssh::Limits {
        connect: Duration::from_secs(3),
        command: Duration::from_secs(30),
        link: Duration::from_secs(2),
        accept_new: false,
    }
}

fn chosen(step: u64, path: &str, skipped: Vec<Skipped>) -> Chosen {
    Chosen {
        step,
        path: path.into(),
        manifest: Manifest {
            format: disk::FORMAT_VERSION,
            run: "parent".into(),
            step,
            world_size: 4,
            saved_ms: 1,
            loss: 2.5,
            node: String::new(),
            files: Vec::new(),
        },
        skipped,
    }
}

fn holding(spec: &str, addr: &str, chosen: Result<Chosen, String>) -> Holding {
    Holding { target: target(spec, addr), limits: limits(), chosen }
}

fn in_place(path: &str) -> Source {
    Source::InPlace { path: path.into() }
}

fn copy_from(spec: &str, addr: &str, dir: &str) -> Source {
    Source::Copy { from: Box::new(target(spec, addr)), limits: limits(), dir: dir.into() }
}

#[test]
fn the_same_hosts_read_their_own_copies_in_place() {
    let held = [
        holding("node0", "10.0.0.2", Ok(chosen(16, "/r/node-0/checkpoints/step-00000016", vec![]))),
        holding("node1", "10.0.0.3", Ok(chosen(16, "/r/node-1/checkpoints/step-00000016", vec![]))),
    ];
    let hosts = [target("node0", "10.0.0.2"), target("node1", "10.0.0.3")];
    let carry = assign(&hosts, &held, None).unwrap();
    assert_eq!(carry.step, 16);
    assert_eq!(
        carry.sources,
        vec![in_place("/r/node-0/checkpoints/step-00000016"), in_place("/r/node-1/checkpoints/step-00000016")]
    );
    assert_eq!(carry.describe(&hosts), "node0:/r/node-0/checkpoints/step-00000016");
}

#[test]
fn a_new_host_gets_the_copy_of_the_node_it_replaces_and_an_alias_of_the_same_machine_reads_in_place() {
    let held = [
        holding("node0", "10.0.0.2", Ok(chosen(16, "/r/n0/step-00000016", vec![]))),
        holding("node1", "10.0.0.3", Ok(chosen(16, "/r/n1/step-00000016", vec![]))),
    ];
    // node2 replaces node1 (index 1): carried from node1; "box0" is node0's address.
    let hosts = [target("box0", "10.0.0.2"), target("node2", "10.0.0.4")];
    let carry = assign(&hosts, &held, None).unwrap();
    assert_eq!(
        carry.sources,
        vec![in_place("/r/n0/step-00000016"), copy_from("node1", "10.0.0.3", "/r/n1/step-00000016")]
    );
}

#[test]
fn the_newest_step_any_node_verified_wins_and_a_node_behind_or_lost_is_carried_to() {
    let skipped = vec![Skipped { step: 24, reason: "model.bin: sha256 mismatch".into() }];
    let held = [
        holding("node0", "10.0.0.2", Ok(chosen(24, "/r/n0/step-00000024", vec![]))),
        // node1's copy of 24 is corrupt: it verified 16 only.
        holding("node1", "10.0.0.3", Ok(chosen(16, "/r/n1/step-00000016", skipped))),
        holding("node2", "10.0.0.4", Err("node2: cannot connect within 3 s".into())),
    ];
    let hosts = [target("node0", "10.0.0.2"), target("node1", "10.0.0.3"), target("node2", "10.0.0.4")];
    let carry = assign(&hosts, &held, None).unwrap();
    assert_eq!(carry.step, 24);
    let from0 = copy_from("node0", "10.0.0.2", "/r/n0/step-00000024");
    assert_eq!(carry.sources, vec![in_place("/r/n0/step-00000024"), from0.clone(), from0]);
    assert_eq!(carry.skipped.len(), 1);
    assert!(carry.skipped[0].reason.starts_with("on node1: model.bin"), "{:?}", carry.skipped);
}

#[test]
fn no_verified_copy_anywhere_is_refused_naming_each_nodes_reason() {
    let held = [
        holding("node0", "10.0.0.2", Err("node0: there are no checkpoints in /r/n0".into())),
        holding("node1", "10.0.0.3", Err("node1: cannot connect within 3 s".into())),
    ];
    let hosts = [target("node0", "10.0.0.2"), target("node1", "10.0.0.3")];
    let err = assign(&hosts, &held, None).unwrap_err();
    assert!(err.contains("node0: there are no checkpoints") && err.contains("node1: cannot connect"), "{err}");
    // An explicit step that no node verified is refused too, saying what each one has.
    let held = [holding("node0", "10.0.0.2", Ok(chosen(16, "/r/n0/step-00000016", vec![])))];
    let err = assign(&hosts[..1], &held, Some(24)).unwrap_err();
    assert!(err.contains("step 24") && err.contains("newest verified checkpoint is step 16"), "{err}");
}
