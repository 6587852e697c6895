//! The lock tree's ACLs: with an identity, the chroot and its directories are brought to
//! the pipeline's ACL at connect, a parent open to strangers is refused, and the chroot's
//! anchor keeps it from being deleted and taken over; `inspect` says what that would change.

use autocomp_model::InvalidInput;
use tracing::info;
use zookeeper_client as zk;

use super::LIVE;
use super::identity::pipeline_acl;
use super::session::Shared;
use super::{AUTH_ENV, parent_of};
use crate::locks::LockError;

/// The persistent child that keeps the chroot from ever being empty, so ZooKeeper refuses to
/// delete it (NotEmpty) whatever its parent's ACL, and only the pipeline's identities (the
/// chroot's ACL) may delete the child. Not `poll`, `batch` or `slot`: no lock lives under it.
const ANCHOR: &str = "anchor";

/// What the anchor holds, for whoever lists the tree with zkCli.
const ANCHOR_DATA: &[u8] = b"autocomp: keeps this lock tree from being deleted or taken over; leave it";

impl Shared {
    /// With an identity: creates the chroot if missing, then brings the ACLs of the chroot,
    /// `poll`, `batch`, `slot`, `live`, every `batch/<component>` and every `slot/<pool>` to ours: each
    /// of our identities with all rights, the world with no more than read (other identities'
    /// entries are left: during a secret rotation both are ours). A directory whose ACL we
    /// cannot change while it lets others write (or keeps us out) is an alarm: locks under it
    /// cannot be trusted.
    pub(super) async fn protect_tree(&self) -> Result<(), LockError> {
        if let Some(problem) = self.open_parent().await? {
            return Err(InvalidInput::new("locks url", self.url.clone(), problem).into());
        }
        let probe = format!("{}/poll", self.root);
        self.create_parents(&probe).await?;
        let ours = pipeline_acl(&self.digests);
        let client = self.client()?;
        let dirs = self.tree_acls().await?;
        let anchor = self.node_of(ANCHOR);
        // Made once: a create refused as NodeExists would cost a write at every pass.
        let anchored = dirs.iter().any(|(dir, ..)| *dir == anchor);
        for (dir, acl, stat) in dirs {
            let dir = &dir;
            let wanted = wanted_acl(&acl, &ours);
            if same_entries(&acl, &wanted) {
                continue;
            }
            match client.set_acl(dir, &wanted, Some(stat.aversion)).await {
                Ok(_) => info!(node = dir, "set the lock tree's ACL: {}", describe_acl(&wanted)),
                // Someone else (another host of the pipeline) changed it meanwhile.
                Err(zk::Error::BadVersion | zk::Error::NoNode) => {}
                Err(zk::Error::NoAuth) if !lets_the_world_write(&acl) => {
                    // Protected, by identities that are not ours: a wrong password, or a tree
                    // another pipeline's identity made. Configuration, not an intruder.
                    let source = self.identity.as_deref().unwrap_or("the configured identity");
                    let reason = format!(
                        "is not one the ACL of {dir} names ({}), so this process may not take locks there \
                         ({}): a wrong password, or a lock tree made with another identity",
                        describe_acl(&acl),
                        self.url
                    );
                    return Err(InvalidInput::new("ZooKeeper identity", source, reason).into());
                }
                Err(zk::Error::NoAuth) => {
                    let path = dir.strip_prefix(&self.root).unwrap_or(dir).trim_start_matches('/');
                    let path = if path.is_empty() { "(the chroot)".to_owned() } else { path.to_owned() };
                    return Err(LockError::Foreign {
                        path,
                        reason: format!(
                            "the lock tree's node {dir} has the ACL {} ({}), which this process's ZooKeeper \
                             identity may not change",
                            describe_acl(&acl),
                            self.url
                        ),
                    });
                }
                Err(e) => return Err(self.failed("ACL change", dir, e)),
            }
        }
        if anchored { Ok(()) } else { self.create_anchor().await }
    }

    /// Creates the chroot's anchor (`ANCHOR`) with our ACL if it is missing.
    async fn create_anchor(&self) -> Result<(), LockError> {
        let anchor = self.node_of(ANCHOR);
        let anchor = anchor.as_str();
        let (answer, _) = self
            .call(|client| async move {
                client.create(anchor, ANCHOR_DATA, &self.options(zk::CreateMode::Persistent)).await
            })
            .await?;
        match answer {
            Ok(_) => {
                info!(node = anchor, "made the lock tree's anchor: the chroot can no longer be deleted");
                Ok(())
            }
            Err(zk::Error::NodeExists) => Ok(()),
            Err(e) => Err(self.failed("create", anchor, e)),
        }
    }

    /// Why the chroot's parent lets someone without an identity take the lock tree (create
    /// or delete its children: the chroot itself), with the two ways out; `None` if it does
    /// not, or if it does not exist yet (then `create_parents` makes it, with our ACL, and a
    /// node of ours is under each ancestor it makes, so none of them can be deleted).
    async fn open_parent(&self) -> Result<Option<String>, LockError> {
        let parent = parent_of(&self.root);
        let (answer, _) = self.call(|client| async move { client.get_acl(parent).await }).await?;
        let acl = match answer {
            Ok((acl, _)) => acl,
            // Neither read nor admin for us: the world cannot read it either, closed enough
            // for us not to judge.
            Err(zk::Error::NoNode | zk::Error::NoAuth) => return Ok(None),
            Err(e) => return Err(self.failed("ACL read", parent, e)),
        };
        let open: Vec<zk::Acl> = acl.iter().filter(|entry| lets_strangers_add_or_remove(entry)).cloned().collect();
        if open.is_empty() {
            return Ok(None);
        }
        let root = &self.root;
        let deeper = format!("{root}/pipeline");
        Ok(Some(format!(
            "the lock tree {root} is a child of {parent}, whose ACL ({}) lets anyone who reaches ZooKeeper, \
             without an identity, create or delete its children: delete the lock tree or make it first as \
             theirs, and stop every pass. Either move the lock tree one level down, into a node autocomp \
             makes with the pipeline's ACL (chroot {deeper} instead of {root} in the locks URL), or take create \
             and delete on {parent} from the world: in zkCli, `addauth digest <user>:<password>` as the \
             pipeline (or an admin identity) then `setAcl {parent} world:anyone:r,auth::cdrwa` (keep \
             world:anyone:r: clients read {parent}, and /zookeeper below it)",
            describe_acl(&open)
        )))
    }

    /// What `protect_tree` would change, read and not changed: one line per directory whose
    /// ACL differs from ours (or lets anyone write), and one when no identity is configured.
    pub(super) async fn inspect_tree(&self) -> Result<Vec<String>, LockError> {
        let mut problems = Vec::new();
        if self.identity.is_none() {
            problems.push(format!(
                "no ZooKeeper identity is configured (?auth_file= in the locks URL, or ${AUTH_ENV}): anyone who \
                 reaches {} can delete or fake the pipeline's locks; give every host the same identity file",
                self.url
            ));
        }
        if self.identity.is_some() {
            problems.extend(self.open_parent().await?);
            let anchor = self.node_of(ANCHOR);
            if self.owner_of(&self.root).await?.is_some() && self.owner_of(&anchor).await?.is_none() {
                problems.push(format!(
                    "{anchor} is missing, so {} can be deleted once empty: the next pass on a host with this \
                     identity makes it",
                    self.root
                ));
            }
        }
        let ours = pipeline_acl(&self.digests);
        for (dir, acl, _) in self.tree_acls().await? {
            let wanted = if self.identity.is_some() { wanted_acl(&acl, &ours) } else { ours.clone() };
            if self.identity.is_none() && !lets_the_world_write(&acl) && !same_entries(&acl, &wanted) {
                problems.push(format!(
                    "{dir} has the ACL {}: protected by an identity this host does not have; configure it \
                     (?auth_file=)",
                    describe_acl(&acl)
                ));
            } else if self.identity.is_some() && !same_entries(&acl, &wanted) {
                let fix = if lets_the_world_write(&acl) || self.holds_an_entry_of(&acl) {
                    "the next pass on a host with this identity sets it"
                } else {
                    "this identity is not in it (a wrong password, or a tree another pipeline made): check \
                     auth_file against the other hosts'"
                };
                problems.push(format!(
                    "{dir} has the ACL {}, not {}: {fix}",
                    describe_acl(&acl),
                    describe_acl(&wanted)
                ));
            }
        }
        Ok(problems)
    }

    /// The ACL of each directory of the lock tree that exists: the chroot, its anchor, `poll`,
    /// `batch`, `slot`, `live` (whose ACL keeps strangers from deleting a liveness node, which
    /// would make a live process look dead), every `batch/<component>` and every `slot/<pool>`.
    async fn tree_acls(&self) -> Result<Vec<(String, Vec<zk::Acl>, zk::Stat)>, LockError> {
        let mut dirs = vec![self.root.clone(), self.node_of(ANCHOR)];
        dirs.extend(["poll", "batch", "slot", LIVE].map(|dir| self.node_of(dir)));
        for parent in ["batch", "slot"] {
            dirs.extend(self.children(parent).await?.into_iter().map(|c| self.node_of(&format!("{parent}/{c}"))));
        }
        let client = self.client()?;
        // Every read is sent when its future is made: one round trip for all of them.
        let reads: Vec<_> = dirs.iter().map(|dir| client.get_acl(dir)).collect();
        let mut found = Vec::with_capacity(dirs.len());
        for (dir, read) in dirs.iter().zip(reads) {
            match read.await {
                Ok((acl, stat)) => found.push((dir.clone(), acl, stat)),
                Err(zk::Error::NoNode) => {}
                Err(e) => return Err(self.failed("ACL read", dir, e)),
            }
        }
        Ok(found)
    }

    /// Whether one of our identities has rights on a node with this ACL.
    fn holds_an_entry_of(&self, acl: &[zk::Acl]) -> bool {
        acl.iter().any(|entry| entry.scheme() == "digest" && self.digests.iter().any(|d| d == entry.id()))
    }
}

/// `acl` with every entry of `ours` (`pipeline_acl`) in and the world cut down to read; other
/// digest identities are kept (during a rotation the old one is still ours), others dropped.
fn wanted_acl(acl: &[zk::Acl], ours: &[zk::Acl]) -> Vec<zk::Acl> {
    let mut wanted: Vec<zk::Acl> = acl
        .iter()
        .filter(|entry| entry.scheme() == "digest" && !ours.iter().any(|our| our.auth_id() == entry.auth_id()))
        .cloned()
        .collect();
    wanted.extend(ours.iter().cloned());
    wanted
}

/// Whether the world may do more than read.
fn lets_the_world_write(acl: &[zk::Acl]) -> bool {
    acl.iter().any(|entry| entry.scheme() == "world" && entry.permission() != zk::Permission::READ)
}

/// Whether an ACL entry lets a client with no identity create or delete children: the world,
/// or an address (every local user of a host shares its address).
fn lets_strangers_add_or_remove(entry: &zk::Acl) -> bool {
    let changes_children =
        entry.permission().has(zk::Permission::CREATE) || entry.permission().has(zk::Permission::DELETE);
    changes_children && matches!(entry.scheme(), "world" | "ip")
}

fn same_entries(a: &[zk::Acl], b: &[zk::Acl]) -> bool {
    a.len() == b.len() && a.iter().all(|entry| b.contains(entry))
}

/// `digest:ops:…=ALL, world:anyone=READ` (ids are hashes, never passwords).
fn describe_acl(acl: &[zk::Acl]) -> String {
    let entries: Vec<String> =
        acl.iter().map(|entry| format!("{}:{}={}", entry.scheme(), entry.id(), entry.permission())).collect();
    entries.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_parent_is_open_when_the_world_or_an_address_may_create_or_delete_children() {
        let entry = |permission, scheme, id| zk::Acl::new(permission, zk::AuthId::new(scheme, id));
        let (all, read) = (zk::Permission::ALL, zk::Permission::READ);
        assert!(lets_strangers_add_or_remove(&entry(all, "world", "anyone")), "ZooKeeper's default for /");
        assert!(lets_strangers_add_or_remove(&entry(zk::Permission::CREATE, "world", "anyone")));
        assert!(lets_strangers_add_or_remove(&entry(read | zk::Permission::DELETE, "ip", "127.0.0.1")));
        assert!(!lets_strangers_add_or_remove(&entry(read, "world", "anyone")), "setAcl / world:anyone:r");
        assert!(!lets_strangers_add_or_remove(&entry(read | zk::Permission::ADMIN, "world", "anyone")));
        assert!(!lets_strangers_add_or_remove(&entry(all, "digest", "admin:x")), "an identity is not a stranger");
    }
}
