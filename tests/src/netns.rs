//! Hosts as Linux network namespaces, for tests about what crosses a network: each host a
//! namespace with one veth link to a bridge that lives in a namespace of its own (so nothing
//! in the machine's own namespace is touched), addresses on the harness's own subnet, a
//! partition as a host's link taken down and brought back up. Everything is deleted when the
//! `Network` is dropped, after a failed assertion too. Needs root and iproute2 (`ip netns`).

use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The subnet every test network uses. Each network is a bridge of its own in a namespace of
/// its own, so two tests' networks never meet even with the same addresses.
const SUBNET: [u8; 3] = [10, 99, 0];

static NETWORKS: AtomicUsize = AtomicUsize::new(0);

/// A host of a test network.
#[derive(Debug, Clone)]
pub struct Host {
    pub name: String,
    /// The namespace (`ip netns exec <netns> ...`).
    pub netns: String,
    pub addr: Ipv4Addr,
    /// Its link's end on the bridge, in the switch namespace.
    port: String,
}

impl Host {
    /// `command` run on this host: the same program, arguments, environment and working
    /// directory, under `ip netns exec`, with stdin closed and stdout and stderr piped (a
    /// `Command`'s stdio settings cannot be read back; set others on the result).
    pub fn wrap(&self, command: &Command) -> Command {
        let mut wrapped = Command::new("ip");
        wrapped.args(["netns", "exec", &self.netns]).arg(command.get_program()).args(command.get_args());
        for (key, value) in command.get_envs() {
            match value {
                Some(value) => wrapped.env(key, value),
                None => wrapped.env_remove(key),
            };
        }
        if let Some(dir) = command.get_current_dir() {
            wrapped.current_dir(dir);
        }
        wrapped.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        wrapped
    }

    /// Runs `f` on a thread that has entered this host's network namespace: sockets it opens
    /// are this host's (for a test that checks a server on the host).
    pub fn within<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        let path = format!("/var/run/netns/{}", self.netns);
        std::thread::spawn(move || {
            let ns = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
            // SAFETY: setns(2) on a valid namespace fd; it changes only this new thread.
            let entered = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(entered, 0, "setns {path}: {}", std::io::Error::last_os_error());
            f()
        })
        .join()
        .expect("the thread in the namespace")
    }
}

/// A test network: hosts on one bridge.
pub struct Network {
    switch: String,
    hosts: Vec<Host>,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let output = Command::new("ip").args(args).stdin(Stdio::null()).output().map_err(|e| {
        format!("cannot run `ip` ({e}): the network tests need iproute2 (apt-get install -y iproute2) and root")
    })?;
    if output.status.success() {
        return Ok(());
    }
    Err(format!(
        "`ip {}` failed: {} (the network tests need root and network namespaces)",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr).trim()
    ))
}

impl Network {
    /// Creates one namespace per name in `hosts` (addresses .1, .2, ... in order) and the
    /// bridge joining them. Panics saying why when it cannot (not root, no `ip netns`).
    pub fn create(hosts: &[&str]) -> Network {
        sweep_abandoned();
        let n = NETWORKS.fetch_add(1, Ordering::Relaxed);
        let prefix = format!("ac{}-{n}", std::process::id());
        let switch = format!("{prefix}-switch");
        let mut network = Network { switch: switch.clone(), hosts: Vec::new() };
        let created = (|| {
            ip(&["netns", "add", &switch])?;
            ip(&["-n", &switch, "link", "set", "lo", "up"])?;
            ip(&["-n", &switch, "link", "add", "br0", "type", "bridge"])?;
            ip(&["-n", &switch, "link", "set", "br0", "up"])?;
            for (i, name) in hosts.iter().enumerate() {
                let netns = format!("{prefix}-{name}");
                let addr = Ipv4Addr::new(SUBNET[0], SUBNET[1], SUBNET[2], i as u8 + 1);
                let port = format!("p{i}");
                ip(&["netns", "add", &netns])?;
                network.hosts.push(Host { name: name.to_string(), netns: netns.clone(), addr, port: port.clone() });
                ip(&["-n", &netns, "link", "set", "lo", "up"])?;
                ip(&["link", "add", "eth0", "netns", &netns, "type", "veth", "peer", "name", &port, "netns", &switch])?;
                ip(&["-n", &switch, "link", "set", &port, "master", "br0"])?;
                ip(&["-n", &switch, "link", "set", &port, "up"])?;
                ip(&["-n", &netns, "addr", "add", &format!("{addr}/24"), "dev", "eth0"])?;
                ip(&["-n", &netns, "link", "set", "eth0", "up"])?;
            }
            Ok::<_, String>(())
        })();
        if let Err(why) = created {
            drop(network);
            panic!("cannot create the test network: {why}");
        }
        network
    }

    pub fn host(&self, name: &str) -> &Host {
        self.hosts.iter().find(|h| h.name == name).unwrap_or_else(|| panic!("no host {name}"))
    }

    /// Cuts `host` off: its link to the bridge goes down. Its processes keep running and
    /// hear nothing, as across a real partition.
    pub fn partition(&self, host: &str) {
        let port = &self.host(host).port;
        ip(&["-n", &self.switch, "link", "set", port, "down"]).expect("take the link down");
    }

    /// Brings `host`'s link back up.
    pub fn heal(&self, host: &str) {
        let port = &self.host(host).port;
        ip(&["-n", &self.switch, "link", "set", port, "up"]).expect("bring the link up");
    }

    /// Cuts `a` and `b` off from each other only, each still reaching every other host: both
    /// their ports on the bridge become isolated, and a bridge forwards nothing between two
    /// isolated ports. Silent, as a partition: packets vanish, nothing answers. Every host
    /// cut this way is cut from every other one so cut, so keep to one pair at a time.
    pub fn cut_between(&self, a: &str, b: &str) {
        for host in [a, b] {
            self.isolate(host, "on");
        }
    }

    /// Undoes [`cut_between`](Self::cut_between).
    pub fn mend_between(&self, a: &str, b: &str) {
        for host in [a, b] {
            self.isolate(host, "off");
        }
    }

    fn isolate(&self, host: &str, on: &str) {
        let port = &self.host(host).port;
        ip(&["-n", &self.switch, "link", "set", "dev", port, "type", "bridge_slave", "isolated", on])
            .expect("set the bridge port's isolation");
    }
}

/// Deletes the namespaces of test processes that no longer run (killed before their drop
/// could): every name starts `ac<pid>-`.
fn sweep_abandoned() {
    let Ok(listed) = Command::new("ip").args(["netns", "list"]).output() else { return };
    for line in String::from_utf8_lossy(&listed.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or_default();
        let Some(pid) = name.strip_prefix("ac").and_then(|rest| rest.split('-').next()) else { continue };
        if pid.parse::<u32>().is_ok() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            ip(&["netns", "del", name]).ok();
        }
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        // Deleting a namespace deletes its end of each veth, and with it the other end.
        for host in &self.hosts {
            if let Err(why) = ip(&["netns", "del", &host.netns]) {
                eprintln!("test network teardown: {why}");
            }
        }
        if let Err(why) = ip(&["netns", "del", &self.switch]) {
            eprintln!("test network teardown: {why}");
        }
    }
}
