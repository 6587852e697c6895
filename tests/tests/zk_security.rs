//! ZooKeeper as a trust boundary, against a real server with the digest provider and a TLS
//! port (tests/src/zk.rs, `Options::secure`): what a client without the pipeline's identity
//! can and cannot do to the lock tree, a whole pipeline over `zks://` with its identity, a
//! wrong password refused by name, and a node at a lock path that no lock service made
//! treated as an alarm (`autocomp locks`, `autocomp alerts`, a pass exiting 6), never "busy".

use std::process::{Command, Stdio};
use std::time::Duration;

use autocomp_e2e::zk::{self, PIPELINE_USER, ZooKeeper};
use autocomp_e2e::{Finished, PROBED, Pipeline, binary, finish, wait_until, without_pipeline_env};
use autocomp_framework::exit;
use autocomp_framework::locks::{LockError, LockHolder, LockPath, open_locks};
use autocomp_model::{BatchId, ComponentName, Timestamp};
use zookeeper_client as zkc;

const PROBE: &str = env!("CARGO_BIN_EXE_probe-component");

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("a runtime")
}

fn holder() -> LockHolder {
    LockHolder { agent: "probe/1@testhost#1".into(), host: "testhost".into(), pid: 1, since: Timestamp::now() }
}

fn secured() -> ZooKeeper {
    ZooKeeper::start(ZooKeeper::standalone_options().secured())
}

/// `autocomp ARGS` on the pipeline, none of the environment that would change what it does.
fn autocomp(pipeline: &Pipeline, args: &[&str]) -> Finished {
    let mut command = Command::new(binary("autocomp"));
    command.arg("--config-dir").arg(pipeline.config_dir()).args(["--as", "tester"]).args(args);
    without_pipeline_env(&mut command).env_remove("USER");
    command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    finish(command.spawn().expect("autocomp starts"), Duration::from_secs(60))
}

/// One pass of the probe, without any ZooKeeper identity from the environment.
fn pass(pipeline: &Pipeline) -> Finished {
    let mut command = pipeline.command(&[]);
    command.env_remove(autocomp_framework::locks::AUTH_ENV);
    finish(command.spawn().expect("the probe starts"), Duration::from_secs(60))
}

/// Creates a persistent node with its parents, as a person with a plain client would; the
/// server may delete an emptied container parent meanwhile, so until it is there.
async fn plant(client: &zkc::Client, node: &str, data: &[u8]) {
    let persistent = zkc::CreateMode::Persistent.with_acls(zkc::Acls::anyone_all());
    for _ in 0..50 {
        let mut parent = String::new();
        for part in node.trim_start_matches('/').split('/').collect::<Vec<_>>().split_last().unwrap().1 {
            parent = format!("{parent}/{part}");
            match client.create(&parent, b"", &persistent).await {
                Ok(_) | Err(zkc::Error::NodeExists) | Err(zkc::Error::NoNode) => {}
                Err(e) => panic!("cannot create {parent}: {e}"),
            }
        }
        match client.create(node, data, &persistent).await {
            Ok(_) => return,
            Err(zkc::Error::NoNode) => continue,
            Err(e) => panic!("cannot create {node}: {e}"),
        }
    }
    panic!("cannot create {node}: its parent keeps disappearing");
}

#[test]
fn without_the_pipelines_identity_a_client_can_read_the_locks_but_neither_create_nor_delete() {
    let zookeeper = secured();
    let rt = runtime();
    let url = zookeeper.secure_url("autocomp", "10s");
    let locks = rt.block_on(open_locks(&url)).unwrap_or_else(|e| panic!("cannot open {url}: {e}"));
    let batch = LockPath::Batch(ComponentName::new("probe").unwrap(), BatchId::new("B0001").unwrap());
    let poll = LockPath::Poll(ComponentName::new("probe").unwrap());
    let batch_lock = rt.block_on(locks.try_lock(&batch, &holder(), Duration::ZERO)).unwrap().expect("free");
    let poll_lock = rt.block_on(locks.try_lock(&poll, &holder(), Duration::ZERO)).unwrap().expect("free");

    // A plain client on the plain port, with no identity: the tester's attack.
    let (refused, acls) = zookeeper.with_client(|client| async move {
        let open = zkc::CreateMode::Persistent.with_acls(zkc::Acls::anyone_all());
        let ephemeral = zkc::CreateMode::Ephemeral.with_acls(zkc::Acls::anyone_all());
        let refused = vec![
            ("delete the held batch lock", client.delete("/autocomp/batch/probe/B0001", None).await.err()),
            ("delete the held poll lock", client.delete("/autocomp/poll/probe", None).await.err()),
            ("overwrite the holder", client.set_data("/autocomp/poll/probe", b"{}", None).await.err()),
            ("create a fake batch lock", client.create("/autocomp/batch/probe/B0002", b"x", &ephemeral).await.err()),
            ("create a fake poll lock", client.create("/autocomp/poll/other", b"x", &open).await.err()),
            ("create a component directory", client.create("/autocomp/batch/other", b"", &open).await.err()),
            ("create under the chroot", client.create("/autocomp/mine", b"", &open).await.err()),
            ("change the chroot's ACL", client.set_acl("/autocomp", &zkc::Acls::anyone_all(), None).await.err()),
        ];
        let mut acls = Vec::new();
        for node in ["/autocomp", "/autocomp/poll", "/autocomp/batch/probe", "/autocomp/batch/probe/B0001"] {
            let (acl, _) = client.get_acl(node).await.unwrap_or_else(|e| panic!("cannot read the ACL of {node}: {e}"));
            let entries: Vec<String> =
                acl.iter().map(|a| format!("{}:{}={}", a.scheme(), a.id(), a.permission())).collect();
            acls.push((node, entries));
        }
        // Reading stays open: what `autocomp locks` needs without the secret.
        let (data, _) = client.get_data("/autocomp/poll/probe").await.expect("the holder is readable by anyone");
        assert!(String::from_utf8_lossy(&data).contains("probe/1@testhost#1"));
        (refused, acls)
    });
    for (what, error) in refused {
        assert_eq!(error, Some(zkc::Error::NoAuth), "a client without the identity could {what}");
    }
    // ZooKeeper shows a digest id's hash as `x` to a reader without ADMIN rights.
    for (node, entries) in acls {
        assert_eq!(entries, [format!("digest:{PIPELINE_USER}:x=ALL"), "world:anyone=READ".into()], "the ACL of {node}");
    }
    assert!(rt.block_on(batch_lock.still_held()).unwrap(), "the batch lock is still ours");
    assert!(rt.block_on(poll_lock.still_held()).unwrap(), "the poll lock is still ours");

    // Another process of the pipeline (same identity, over TLS) sees them held and busy.
    let other = rt.block_on(open_locks(&url)).unwrap();
    assert!(rt.block_on(other.try_lock(&batch, &holder(), Duration::ZERO)).unwrap().is_none());
    let held = rt.block_on(other.held()).unwrap();
    assert_eq!(held.len(), 2, "{held:?}");
    assert!(held.iter().all(|lock| lock.foreign.is_none()), "our own locks are not foreign: {held:?}");

    // Someone with the identity (an operator's zkCli, say) plants a persistent node: with
    // auth on too it is an alarm to a taker and flagged to readers, not a busy lock.
    let credential = std::fs::read_to_string(zookeeper.auth_file()).unwrap();
    let planted = rt.block_on(async {
        let client = zkc::Client::connector()
            .with_auth("digest", credential.trim().as_bytes())
            .connect(&zookeeper.hosts())
            .await
            .expect("an authenticated plain client");
        let mine = zkc::CreateMode::Persistent.with_acls(zkc::Acls::creator_all());
        client.create("/autocomp/poll/planted", b"{}", &mine).await.map(|_| ())
    });
    assert_eq!(planted, Ok(()), "the identity may write under the chroot");
    let planted_path = LockPath::Poll(ComponentName::new("planted").unwrap());
    match rt.block_on(other.try_lock(&planted_path, &holder(), Duration::from_secs(1))) {
        Err(LockError::Foreign { path, reason }) => {
            assert_eq!(path, "poll/planted");
            assert!(reason.contains("persistent node"), "{reason}");
        }
        Ok(taken) => panic!("a planted persistent node was taken as a lock or busy: {:?}", taken.is_some()),
        Err(e) => panic!("{e}"),
    }
    let flagged = rt.block_on(other.held()).unwrap();
    let planted = flagged.iter().find(|lock| lock.path == "poll/planted").expect("listed");
    assert!(planted.foreign.as_deref().is_some_and(|why| why.contains("persistent node")), "{planted:?}");

    rt.block_on(batch_lock.release()).unwrap();
    rt.block_on(poll_lock.release()).unwrap();
    rt.block_on(other.close());
    rt.block_on(locks.close());
}

#[test]
fn a_wrong_password_is_refused_naming_the_identity_and_never_shown() {
    let zookeeper = secured();
    let rt = runtime();
    // The pipeline made its lock tree first.
    let locks = rt.block_on(open_locks(&zookeeper.secure_url("autocomp", "10s"))).unwrap();
    rt.block_on(locks.close());

    let wrong = zookeeper.auth_file().with_file_name("wrong-auth");
    zk::write_secret(&wrong, &format!("{PIPELINE_USER}:not-the-password\n"));
    let url = zookeeper
        .secure_url("autocomp", "10s")
        .replace(&zookeeper.auth_file().display().to_string(), &wrong.display().to_string());
    let error = match rt.block_on(open_locks(&url)) {
        Err(e) => e,
        Ok(_) => panic!("a wrong password opened the lock service"),
    };
    let message = error.to_string();
    assert!(matches!(error, LockError::Invalid(_)), "{message}");
    assert!(message.contains("ZooKeeper identity") && message.contains("wrong-auth"), "{message}");
    assert!(message.contains("a wrong password"), "{message}");
    assert!(!message.contains("not-the-password"), "the secret is shown: {message}");

    // A secret in the URL itself is refused, and not repeated.
    let in_url = format!("zk://{PIPELINE_USER}:hunter2@{}/autocomp", zookeeper.hosts());
    let message = match rt.block_on(open_locks(&in_url)) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("a URL with credentials was accepted"),
    };
    assert!(message.contains("auth_file") && !message.contains("hunter2"), "{message}");
}

#[test]
fn an_authenticated_pipeline_works_over_tls_and_never_prints_its_secret() {
    let zookeeper = secured();
    let pipeline = Pipeline::new(PROBE);
    pipeline.use_locks(&zookeeper.secure_url("autocomp", "10s"));
    let ids = pipeline.register(3);
    let done = pass(&pipeline);
    assert_eq!(done.code, Some(0), "{}", done.show());
    for id in &ids {
        assert_eq!(pipeline.events(id, PROBED).len(), 1, "{id}: {}", done.show());
    }
    let listed = autocomp(&pipeline, &["locks"]);
    assert_eq!(listed.code, Some(0), "{}", listed.show());
    assert_eq!(listed.stdout, "no locks held\n", "{}", listed.show());
    let secret = std::fs::read_to_string(zookeeper.auth_file()).unwrap();
    let password = secret.trim().split_once(':').unwrap().1;
    for said in [&done, &listed] {
        assert!(!said.stdout.contains(password) && !said.stderr.contains(password), "{}", said.show());
    }
    // Only the chroot (persistent, ours) stays; the containers go once empty.
    let tree = zookeeper.tree("/autocomp");
    assert!(tree.iter().all(|node| node.ephemeral_owner == 0), "a lock outlived its pass: {tree:?}");
}

#[test]
fn a_node_at_a_lock_path_that_no_lock_service_made_is_an_alarm_not_busy() {
    // No identity: the tree is open (with a warning), as the tester found it, so a plain
    // client can plant what the framework must not take for a busy lock.
    let zookeeper = ZooKeeper::standalone();
    let pipeline = Pipeline::new(PROBE);
    pipeline.use_locks(&zookeeper.url("autocomp", "10s"));
    let ids = pipeline.register(3);
    let first = pass(&pipeline);
    assert_eq!(first.code, Some(0), "{}", first.show());
    assert!(first.stderr.contains("lock nodes this process creates are open to anyone"), "{}", first.show());
    let more = [pipeline.register_one("B0004", true), pipeline.register_one("B0005", true)];

    // A persistent fake poll lock, and a batch "lock" holding junk.
    zookeeper.with_client(|client| async move {
        plant(&client, "/autocomp/poll/probe", b"{\"agent\":\"me\"}").await;
        plant(&client, "/autocomp/batch/probe/B0004", b"junk").await;
    });

    let blocked = pass(&pipeline);
    assert_eq!(blocked.code, Some(i32::from(exit::FOREIGN_LOCK)), "not busy (3): {}", blocked.show());
    assert!(blocked.stderr.contains("poll/probe is not a lock autocomp made"), "{}", blocked.show());
    assert!(blocked.stderr.contains("persistent node"), "{}", blocked.show());

    let listed = autocomp(&pipeline, &["locks"]);
    assert_eq!(listed.code, Some(0), "{}", listed.show());
    for path in ["poll/probe", "batch/probe/B0004"] {
        assert!(listed.stdout.contains(&format!("FOREIGN {path}: not a lock autocomp made")), "{}", listed.show());
    }
    let stale = autocomp(&pipeline, &["locks", "--stale", "1h"]);
    assert!(
        stale.stdout.contains("FOREIGN poll/probe"),
        "foreign nodes are listed whatever their age: {}",
        stale.show()
    );
    let json = autocomp(&pipeline, &["locks", "--format", "json"]);
    let listed: serde_json::Value = serde_json::from_str(&json.stdout).expect("JSON");
    let poll = listed.as_array().unwrap().iter().find(|l| l["path"] == "poll/probe").expect("poll/probe listed");
    assert!(poll["foreign"].as_str().unwrap().contains("persistent node"), "{poll}");

    let alerts = autocomp(&pipeline, &["alerts"]);
    for path in ["poll/probe", "batch/probe/B0004"] {
        assert!(alerts.stdout.contains(&format!("locks: {path} is not a lock autocomp made")), "{}", alerts.show());
    }

    // The fake poll lock removed: every batch is done. A batch's claim is its lock (the
    // process keeps a liveness record, no batch node), so junk at a batch's old lock path
    // keeps nobody off it; `autocomp locks` and `alerts` above still show it to a person.
    zookeeper.with_client(|client| async move { client.delete("/autocomp/poll/probe", None).await.unwrap() });
    let done = pass(&pipeline);
    assert_eq!(done.code, Some(0), "{}", done.show());
    for id in ids.iter().chain(&more) {
        assert_eq!(pipeline.events(id, PROBED).len(), 1, "{id}: {}", done.show());
    }
}

/// Waits until the server has reaped the emptied containers under `/autocomp` (the pass's
/// `poll` and `batch`): the state between passes, when only persistent nodes are left (the
/// chroot, its anchor and `live`).
fn between_passes(zookeeper: &ZooKeeper) {
    let persistent = || {
        let tree = zookeeper.tree("/autocomp");
        tree.iter().all(|node| ["/autocomp", "/autocomp/anchor", "/autocomp/live"].contains(&node.path.as_str()))
    };
    let reaped = wait_until(std::time::Instant::now() + Duration::from_secs(30), persistent);
    assert!(reaped, "containers not reaped: {:?}", zookeeper.tree("/autocomp"));
}

#[test]
fn a_client_without_the_identity_can_neither_delete_nor_take_the_lock_root_between_passes() {
    let zookeeper = secured();
    let pipeline = Pipeline::new(PROBE);
    pipeline.use_locks(&zookeeper.auth_url("autocomp", "10s"));
    pipeline.register(2);
    let first = pass(&pipeline);
    assert_eq!(first.code, Some(0), "{}", first.show());

    // `/` as ZooKeeper ships it (the world may create and delete there), the tree between
    // passes: the tester deleted `/autocomp` and made it again as his own here.
    zookeeper.open_the_root(true);
    between_passes(&zookeeper);
    let attempts = zookeeper.with_client(|client| async move {
        let open = zkc::CreateMode::Persistent.with_acls(zkc::Acls::anyone_all());
        vec![
            ("delete the lock tree", client.delete("/autocomp", None).await.err()),
            ("delete its anchor", client.delete("/autocomp/anchor", None).await.err()),
            ("delete its liveness directory", client.delete("/autocomp/live", None).await.err()),
            ("plant a liveness node", client.create("/autocomp/live/deadbeef", b"", &open).await.err()),
            ("make the lock tree again as its own", client.create("/autocomp", b"", &open).await.err()),
            ("change the lock tree's ACL", client.set_acl("/autocomp", &zkc::Acls::anyone_all(), None).await.err()),
        ]
    });
    let refused: Vec<_> = attempts.iter().map(|(what, error)| (*what, error.clone())).collect();
    assert_eq!(
        refused,
        [
            ("delete the lock tree", Some(zkc::Error::NotEmpty)),
            ("delete its anchor", Some(zkc::Error::NoAuth)),
            ("delete its liveness directory", Some(zkc::Error::NoAuth)),
            ("plant a liveness node", Some(zkc::Error::NoAuth)),
            ("make the lock tree again as its own", Some(zkc::Error::NodeExists)),
            ("change the lock tree's ACL", Some(zkc::Error::NoAuth)),
        ],
        "what a client without the pipeline's identity could do to the lock tree"
    );

    // The pipeline refuses to go on under a `/` the world may write (exit 2, with the fix)...
    let refused = pass(&pipeline);
    assert_eq!(refused.code, Some(i32::from(exit::USAGE)), "{}", refused.show());
    assert!(refused.stderr.contains("setAcl /"), "{}", refused.show());
    // ... and once `/` is closed again, the next pass works on the same tree.
    zookeeper.open_the_root(false);
    let more = pipeline.register_one("B0003", true);
    let next = pass(&pipeline);
    assert_eq!(next.code, Some(0), "{}", next.show());
    assert_eq!(pipeline.events(&more, PROBED).len(), 1, "{}", next.show());

    // `/` closed to everyone but readers (`setAcl / world:anyone:r`, once the tree exists):
    // the pipeline may not even ask to create its chroot there, and still works.
    zookeeper.with_pipeline_client(|client| async move {
        client.set_acl("/", &zkc::Acls::anyone_read(), None).await.expect("setAcl / world:anyone:r")
    });
    let last = pipeline.register_one("B0004", true);
    let closed = pass(&pipeline);
    assert_eq!(closed.code, Some(0), "{}", closed.show());
    assert_eq!(pipeline.events(&last, PROBED).len(), 1, "{}", closed.show());
}

/// The `locks` line of `autocomp doctor`'s report.
fn doctor_locks_line(pipeline: &Pipeline) -> String {
    let finished = autocomp(pipeline, &["doctor"]);
    let line = finished.stdout.lines().find(|line| line.get(6..).is_some_and(|rest| rest.starts_with("locks  ")));
    line.unwrap_or_else(|| panic!("no locks line:\n{}", finished.show())).to_owned()
}

#[test]
fn a_lock_tree_under_a_parent_anyone_may_write_is_refused_naming_the_fix_and_a_deeper_one_works() {
    let zookeeper = secured();
    zookeeper.open_the_root(true);
    let pipeline = Pipeline::new(PROBE);
    pipeline.register(2);

    // One level under a world-writable `/`, with an identity: a configuration error.
    pipeline.use_locks(&zookeeper.auth_url("autocomp", "10s"));
    let refused = pass(&pipeline);
    assert_eq!(refused.code, Some(i32::from(exit::USAGE)), "{}", refused.show());
    for fix in ["world:anyone", "/autocomp/pipeline", "setAcl / world:anyone:r"] {
        assert!(refused.stderr.contains(fix), "the message names `{fix}`: {}", refused.show());
    }
    assert!(zookeeper.tree("/autocomp").is_empty(), "a refused lock tree was made: {:?}", zookeeper.tree("/autocomp"));
    let listed = autocomp(&pipeline, &["locks"]);
    assert_eq!(listed.code, Some(i32::from(exit::USAGE)), "{}", listed.show());
    let doctor = doctor_locks_line(&pipeline);
    assert!(doctor.starts_with("FAIL") && doctor.contains("setAcl /"), "{doctor}");

    // One level deeper: autocomp makes `/autocomp` itself, with the pipeline's ACL.
    pipeline.use_locks(&zookeeper.auth_url("autocomp/pipeline", "10s"));
    let worked = pass(&pipeline);
    assert_eq!(worked.code, Some(0), "{}", worked.show());
    let doctor = doctor_locks_line(&pipeline);
    assert!(doctor.starts_with("ok"), "{doctor}");
    let attempts = zookeeper.with_client(|client| async move {
        [client.delete("/autocomp/pipeline", None).await.err(), client.delete("/autocomp", None).await.err()]
    });
    assert_eq!(attempts, [Some(zkc::Error::NoAuth), Some(zkc::Error::NotEmpty)], "deleting the lock tree");
}
