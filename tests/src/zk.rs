//! A real ZooKeeper for the tests and benchmarks: a standalone server or a 3-node ensemble on
//! free loopback ports (or one node per host of a test network, `Options::hosts`), each node
//! in its own directory of a temp dir, started as a plain
//! `java` process, ready once the `srvr` four-letter command answers with a `Mode:` line,
//! stopped by pid (and killed on drop). Without the server installed this fails, saying how
//! to install it: the lock tests are never skipped. `Options::secure` adds what a protected
//! deployment has: a digest identity for the pipeline, and a TLS client port (certificates made
//! with openssl for the test) next to the plain one.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::netns::Host;
use crate::wait_until;

/// Where Debian's `zookeeper` package puts the server.
pub const ZOOKEEPER_JAR: &str = "/usr/share/java/zookeeper.jar";
/// The TLS port needs the Netty connection factory; Debian's libnetty-java has its jars.
const NETTY_JARS: [&str; 6] = ["buffer", "codec", "common", "handler", "resolver", "transport"];
/// The pipeline's identity on a secure server (`Options::secure`), as its auth file holds it.
pub const PIPELINE_USER: &str = "autocomp";
const PIPELINE_PASSWORD: &str = "zk-test-secret-9f3a";
/// Without an slf4j binding the server logs nothing.
const SLF4J_SIMPLE: &str = "/usr/share/java/slf4j-simple.jar";
/// Starting a node (a JVM) and, for an ensemble, electing a leader.
const START_LIMIT: Duration = Duration::from_secs(60);

/// Fails the calling test unless the ZooKeeper server and Java are installed.
pub fn require_installed() {
    assert!(
        std::path::Path::new(ZOOKEEPER_JAR).exists(),
        "ZooKeeper is not installed ({ZOOKEEPER_JAR} is missing): the lock tests need a real server. \
         Install it with `apt-get update && apt-get install -y zookeeper` (.ci/run does this)."
    );
    let java = Command::new("java").arg("-version").stdout(Stdio::null()).stderr(Stdio::null()).status();
    assert!(
        java.is_ok_and(|s| s.success()),
        "`java` does not run: ZooKeeper needs a JRE. Install it with `apt-get install -y zookeeper` \
         (which pulls one in) or `apt-get install -y default-jre-headless`."
    );
}

/// How to start the servers.
#[derive(Debug, Clone)]
pub struct Options {
    /// 1 = standalone, 3 = an ensemble.
    pub nodes: usize,
    /// `znode.container.checkIntervalMs`: how often the server deletes empty containers
    /// (ZooKeeper's default is a minute; tests want to see them go).
    pub container_check: Duration,
    /// One host per node, from a test network: each node listens on its host's address
    /// (standard ports) and runs in its namespace. Empty: every node on loopback.
    pub hosts: Vec<Host>,
    /// The digest auth provider named, an auth file for the pipeline's identity
    /// (`ZooKeeper::auth_file`), and a TLS client port (`secureClientPort`, Netty, PEM keys)
    /// that wants a client certificate signed by the test's CA.
    pub secure: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self { nodes: 1, container_check: Duration::from_secs(60), hosts: Vec::new(), secure: false }
    }
}

impl Options {
    /// The same servers, secured (see `Options::secure`).
    pub fn secured(self) -> Self {
        Self { secure: true, ..self }
    }
}

struct Node {
    addr: Ipv4Addr,
    host: Option<Host>,
    client_port: u16,
    /// The TLS port of a secure server.
    secure_port: Option<u16>,
    config: PathBuf,
    log: PathBuf,
    process: Option<Child>,
}

/// Running ZooKeeper servers; killed when dropped.
pub struct ZooKeeper {
    nodes: Vec<Node>,
    options: Options,
    dir: tempfile::TempDir,
}

impl ZooKeeper {
    /// A standalone server that deletes empty containers every 500 ms.
    pub fn standalone() -> Self {
        Self::start(Self::standalone_options())
    }

    /// What `standalone` starts, to change before starting (e.g. `.secured()`).
    pub fn standalone_options() -> Options {
        Options { nodes: 1, container_check: Duration::from_millis(500), ..Options::default() }
    }

    /// A 3-node ensemble on loopback.
    pub fn ensemble() -> Self {
        Self::start(Options { nodes: 3, container_check: Duration::from_millis(500), ..Options::default() })
    }

    /// One node on each of `hosts` (1: standalone, 3: an ensemble).
    pub fn on_hosts(hosts: &[&Host]) -> Self {
        Self::start(Self::on_hosts_options(hosts))
    }

    /// What `on_hosts` starts, to change before starting (e.g. `.secured()`).
    pub fn on_hosts_options(hosts: &[&Host]) -> Options {
        let hosts: Vec<Host> = hosts.iter().map(|h| (*h).clone()).collect();
        Options { nodes: hosts.len(), container_check: Duration::from_millis(500), hosts, ..Options::default() }
    }

    /// Starts the servers and waits until every node serves (an ensemble: has a leader).
    pub fn start(options: Options) -> Self {
        require_installed();
        let dir = tempfile::tempdir().expect("temp dir for ZooKeeper");
        let count = options.nodes;
        assert!(options.hosts.is_empty() || options.hosts.len() == count, "one host per node");
        // On hosts of their own every node has the standard ports; on loopback, free ones.
        let ports = if options.hosts.is_empty() {
            free_ports(count * 4)
        } else {
            [vec![2181; count], [2888, 3888].repeat(count), vec![2281; count]].concat()
        };
        let addr = |n: usize| options.hosts.get(n).map_or(Ipv4Addr::LOCALHOST, |host| host.addr);
        if options.secure {
            let addrs: Vec<Ipv4Addr> = (0..count).map(addr).collect();
            make_certificates(dir.path(), &addrs);
            write_secret(&dir.path().join("zk-auth"), &format!("{PIPELINE_USER}:{PIPELINE_PASSWORD}\n"));
        }
        let mut nodes = Vec::new();
        for n in 0..count {
            let node_dir = dir.path().join(format!("zk{}", n + 1));
            std::fs::create_dir_all(node_dir.join("data")).expect("ZooKeeper data dir");
            // Every test client connects from one address (loopback): no cap on connections
            // per address (ZooKeeper's default is 60; the capacity bench opens hundreds).
            let mut config = format!(
                "tickTime=2000\ndataDir={}\nclientPort={}\nclientPortAddress={}\n\
                 minSessionTimeout=2000\nmaxSessionTimeout=60000\nadmin.enableServer=false\n\
                 4lw.commands.whitelist=*\nmaxClientCnxns=0\n",
                node_dir.join("data").display(),
                ports[n],
                addr(n),
            );
            let secure_port = options.secure.then(|| ports[count * 3 + n]);
            if let Some(port) = secure_port {
                let certs = dir.path().join("tls");
                config.push_str(&format!(
                    "secureClientPort={port}\nsecureClientPortAddress={}\n\
                     serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory\n\
                     ssl.keyStore.location={}\nssl.keyStore.type=PEM\n\
                     ssl.trustStore.location={}\nssl.trustStore.type=PEM\nssl.clientAuth=need\n\
                     ssl.clientHostnameVerification=false\n\
                     authProvider.1=org.apache.zookeeper.server.auth.DigestAuthenticationProvider\n",
                    addr(n),
                    certs.join("server-keystore.pem").display(),
                    certs.join("ca.pem").display(),
                ));
            }
            if count > 1 {
                std::fs::write(node_dir.join("data/myid"), format!("{}\n", n + 1)).expect("myid");
                config.push_str("initLimit=10\nsyncLimit=5\n");
                for m in 0..count {
                    config.push_str(&format!(
                        "server.{}={}:{}:{}\n",
                        m + 1,
                        addr(m),
                        ports[count + 2 * m],
                        ports[count + 2 * m + 1]
                    ));
                }
            }
            let config_path = node_dir.join("zoo.cfg");
            std::fs::write(&config_path, config).expect("zoo.cfg");
            nodes.push(Node {
                addr: addr(n),
                host: options.hosts.get(n).cloned(),
                client_port: ports[n],
                secure_port,
                config: config_path,
                log: node_dir.join("server.log"),
                process: None,
            });
        }
        let mut zookeeper = Self { nodes, options, dir };
        for n in 0..count {
            zookeeper.spawn(n);
        }
        zookeeper.wait_serving(&(0..count).collect::<Vec<_>>());
        if zookeeper.options.secure {
            // As SECURITY.md has a protected deployment do: nobody without an identity
            // creates or deletes at the top (autocomp refuses a lock tree there otherwise).
            zookeeper.open_the_root(false);
        }
        zookeeper
    }

    /// Sets the ACL of `/` on a secure server: `open`, ZooKeeper's default (the world may do
    /// anything); closed, what SECURITY.md says to set (`setAcl / world:anyone:r,auth::cdrwa`
    /// after `addauth digest` as the pipeline: the world reads, only the pipeline's identity
    /// creates or deletes top-level nodes).
    pub fn open_the_root(&self, open: bool) {
        use zookeeper_client::{Acl, AuthId, Permission};
        let acl = if open {
            vec![Acl::new(Permission::ALL, AuthId::anyone())]
        } else {
            vec![Acl::new(Permission::READ, AuthId::anyone()), Acl::new(Permission::ALL, AuthId::new("auth", ""))]
        };
        let hosts = self.hosts();
        let set = move || {
            let credential = format!("{PIPELINE_USER}:{PIPELINE_PASSWORD}");
            session(&hosts, Some(&credential), |client| async move {
                client.set_acl("/", &acl, None).await.unwrap_or_else(|e| panic!("cannot set the ACL of /: {e}"));
            })
        };
        // Servers on hosts of a test network are reached from inside one of them.
        match &self.nodes[0].host {
            Some(host) => host.within(set),
            None => set(),
        }
    }

    fn spawn(&mut self, n: usize) {
        let node = &mut self.nodes[n];
        assert!(node.process.is_none(), "node {n} already runs");
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&node.log).expect("server log");
        let mut classpath = format!("{ZOOKEEPER_JAR}:{SLF4J_SIMPLE}");
        if self.options.secure {
            for jar in NETTY_JARS {
                let path = format!("/usr/share/java/netty-{jar}.jar");
                assert!(
                    std::path::Path::new(&path).exists(),
                    "{path} is missing: ZooKeeper's TLS port needs Netty. Install it with \
                     `apt-get install -y libnetty-java`."
                );
                classpath.push_str(&format!(":{path}"));
            }
        }
        let mut java = Command::new("java");
        java.arg("-Xmx256m")
            .arg("-XX:+UseSerialGC")
            .arg(format!("-Dznode.container.checkIntervalMs={}", self.options.container_check.as_millis()))
            .arg("-cp")
            .arg(classpath)
            .arg("org.apache.zookeeper.server.quorum.QuorumPeerMain")
            .arg(&node.config)
            .current_dir(self.dir.path());
        let mut java = match &node.host {
            Some(host) => host.wrap(&java),
            None => java,
        };
        let child = java
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log handle"))
            .stderr(log)
            .spawn()
            .expect("java starts");
        node.process = Some(child);
    }

    /// Waits until each of `nodes` answers `srvr` with a `Mode:` line; panics (with the
    /// servers' logs) if that takes over a minute or a node exits.
    pub fn wait_serving(&mut self, nodes: &[usize]) {
        let deadline = Instant::now() + START_LIMIT;
        let serving = wait_until(deadline, || {
            for &n in nodes {
                if let Some(child) = self.nodes[n].process.as_mut() {
                    let exited = child.try_wait().expect("try_wait on ZooKeeper");
                    assert!(exited.is_none(), "ZooKeeper node {n} exited: {exited:?}\n{}", self.logs());
                }
            }
            nodes.iter().all(|&n| self.mode(n).is_some())
        });
        assert!(serving, "ZooKeeper nodes {nodes:?} not serving after {START_LIMIT:?}\n{}", self.logs());
    }

    /// `127.0.0.1:port[,127.0.0.1:port...]` (on hosts: their addresses).
    pub fn hosts(&self) -> String {
        self.nodes.iter().map(|n| format!("{}:{}", n.addr, n.client_port)).collect::<Vec<_>>().join(",")
    }

    /// The locks URL for a chroot, e.g. `url("autocomp", "3s")`: plain, no identity.
    pub fn url(&self, chroot: &str, session_timeout: &str) -> String {
        format!("zk://{}/{chroot}?session_timeout={session_timeout}", self.hosts())
    }

    /// A CA that signed nothing the servers present: a `ca_file=` that makes them impostors.
    pub fn other_ca(&self) -> PathBuf {
        assert!(self.options.secure, "only a secure server has certificates");
        self.dir.path().join("tls/other-ca.pem")
    }

    /// The pipeline's auth file on a secure server (`user:password`, mode 600).
    pub fn auth_file(&self) -> PathBuf {
        assert!(self.options.secure, "only a secure server has an identity for the pipeline");
        self.dir.path().join("zk-auth")
    }

    /// The test CA's certificate, and the client certificate and key it signed.
    pub fn tls_files(&self) -> [PathBuf; 3] {
        assert!(self.options.secure, "only a secure server has certificates");
        let certs = self.dir.path().join("tls");
        [certs.join("ca.pem"), certs.join("client.pem"), certs.join("client.key")]
    }

    /// The plain port with the pipeline's identity: `zk://.../chroot?...&auth_file=...`.
    pub fn auth_url(&self, chroot: &str, session_timeout: &str) -> String {
        format!("{}&auth_file={}", self.url(chroot, session_timeout), self.auth_file().display())
    }

    /// The TLS ports with the pipeline's identity and the client certificate:
    /// `zks://.../chroot?...&auth_file=...&ca_file=...&cert_file=...&key_file=...`.
    pub fn secure_url(&self, chroot: &str, session_timeout: &str) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("{}:{}", n.addr, n.secure_port.expect("a secure server has a TLS port")))
            .collect();
        let [ca, cert, key] = self.tls_files();
        format!(
            "zks://{}/{chroot}?session_timeout={session_timeout}&auth_file={}&ca_file={}&cert_file={}&key_file={}",
            hosts.join(","),
            self.auth_file().display(),
            ca.display(),
            cert.display(),
            key.display()
        )
    }

    pub fn client_port(&self, n: usize) -> u16 {
        self.nodes[n].client_port
    }

    /// The answer to `srvr`, if node `n` answers at all.
    pub fn srvr(&self, n: usize) -> Option<String> {
        let address = SocketAddr::new(IpAddr::V4(self.nodes[n].addr), self.nodes[n].client_port);
        match &self.nodes[n].host {
            Some(host) => host.within(move || four_letter_at(address, "srvr")),
            None => four_letter_at(address, "srvr"),
        }
    }

    /// `standalone`, `leader` or `follower` while node `n` serves clients.
    pub fn mode(&self, n: usize) -> Option<String> {
        let answer = self.srvr(n)?;
        answer.lines().find_map(|line| line.strip_prefix("Mode: ")).map(|mode| mode.trim().to_owned())
    }

    /// The last transaction id node `n` has applied (`Zxid:` in `srvr`): every write moves it.
    pub fn zxid(&self, n: usize) -> i64 {
        let answer = self.srvr(n).unwrap_or_else(|| panic!("ZooKeeper node {n} does not answer srvr"));
        let hex = answer.lines().find_map(|line| line.strip_prefix("Zxid: ")).expect("a Zxid line in srvr");
        i64::from_str_radix(hex.trim().trim_start_matches("0x"), 16).expect("a hex zxid")
    }

    /// The index of the ensemble's leader, once every running node serves again (after a
    /// node is killed, the others may still say `follower` before they notice and elect).
    pub fn leader(&self) -> usize {
        let running: Vec<usize> = (0..self.nodes.len()).filter(|&n| self.nodes[n].process.is_some()).collect();
        let mut leader = None;
        let elected = wait_until(Instant::now() + START_LIMIT, || {
            let modes: Vec<Option<String>> = running.iter().map(|&n| self.mode(n)).collect();
            let leaders: Vec<usize> =
                running.iter().zip(&modes).filter(|(_, m)| m.as_deref() == Some("leader")).map(|(n, _)| *n).collect();
            leader = leaders.first().copied();
            leaders.len() == 1 && modes.iter().all(Option::is_some)
        });
        match leader {
            Some(leader) if elected => leader,
            _ => panic!("no leader among nodes {running:?} after {START_LIMIT:?}\n{}", self.logs()),
        }
    }

    /// SIGKILLs node `n` (by its pid) and reaps it.
    pub fn kill(&mut self, n: usize) {
        if let Some(mut child) = self.nodes[n].process.take() {
            child.kill().ok();
            child.wait().ok();
        }
    }

    /// SIGSTOPs node `n`: its connections stay open but nothing answers, as a client cut off
    /// by a partition sees it. [`ZooKeeper::resume`] undoes it.
    pub fn pause(&mut self, n: usize) {
        self.signal(n, libc::SIGSTOP);
    }

    pub fn resume(&mut self, n: usize) {
        self.signal(n, libc::SIGCONT);
    }

    fn signal(&self, n: usize, signal: libc::c_int) {
        let child = self.nodes[n].process.as_ref().expect("node is running");
        // SAFETY: kill(2) on the pid of our own child, which has not been reaped.
        let sent = unsafe { libc::kill(child.id() as libc::pid_t, signal) };
        assert_eq!(sent, 0, "signal {signal} to ZooKeeper node {n}");
    }

    /// Starts node `n` again (same config and data) and waits until it serves.
    pub fn restart(&mut self, n: usize) {
        self.spawn(n);
        self.wait_serving(&[n]);
    }

    /// The tail of every node's log, for failure messages.
    pub fn logs(&self) -> String {
        let mut text = String::new();
        for (n, node) in self.nodes.iter().enumerate() {
            let log = std::fs::read_to_string(&node.log).unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            let tail = lines[lines.len().saturating_sub(30)..].join("\n");
            text.push_str(&format!("--- ZooKeeper node {n} log (last 30 lines)\n{tail}\n"));
        }
        text
    }

    /// Every znode under `root` (itself included, if it exists), parents first.
    pub fn tree(&self, root: &str) -> Vec<Znode> {
        self.with_client(|client| async move {
            let mut found = Vec::new();
            let mut pending = vec![root.to_owned()];
            while let Some(path) = pending.pop() {
                let (children, stat) = match client.get_children(&path).await {
                    Ok(answer) => answer,
                    Err(zookeeper_client::Error::NoNode) => continue,
                    Err(e) => panic!("cannot list {path}: {e}"),
                };
                for child in &children {
                    pending.push(format!("{path}/{child}"));
                }
                found.push(Znode { path, ephemeral_owner: stat.ephemeral_owner, children: children.len() });
            }
            found.sort_by(|a, b| a.path.cmp(&b.path));
            found
        })
    }

    /// Runs `f` with a fresh client session on a runtime of its own, then closes the session.
    pub fn with_client<T, F: Future<Output = T>>(&self, f: impl FnOnce(zookeeper_client::Client) -> F) -> T {
        self.client_session(None, f)
    }

    /// `with_client`, the session authenticated as the pipeline (a secure server's identity).
    pub fn with_pipeline_client<T, F: Future<Output = T>>(&self, f: impl FnOnce(zookeeper_client::Client) -> F) -> T {
        self.client_session(Some(format!("{PIPELINE_USER}:{PIPELINE_PASSWORD}")), f)
    }

    fn client_session<T, F: Future<Output = T>>(
        &self,
        credential: Option<String>,
        f: impl FnOnce(zookeeper_client::Client) -> F,
    ) -> T {
        session(&self.hosts(), credential.as_deref(), f)
    }
}

/// Runs `f` with a fresh client session of `hosts` (authenticated with the digest
/// `credential` if given) on a runtime of its own, then closes the session.
fn session<T, F: Future<Output = T>>(
    hosts: &str,
    credential: Option<&str>,
    f: impl FnOnce(zookeeper_client::Client) -> F,
) -> T {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    runtime.block_on(async {
        // Connected within 30 s, tried again after each failed attempt: a suite starting
        // many servers at once keeps a JVM from answering for seconds at times.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let client = loop {
            let mut connector = zookeeper_client::Client::connector();
            if let Some(credential) = credential {
                connector = connector.with_auth("digest", credential.as_bytes());
            }
            let connecting = connector
                .with_session_timeout(Duration::from_secs(5))
                .with_connection_timeout(Duration::from_secs(5))
                .connect(hosts)
                .await;
            match connecting {
                Ok(client) => break client,
                Err(e) if tokio::time::Instant::now() >= deadline => {
                    panic!("the test cannot connect to ZooKeeper at {hosts} within 30 s: {e}")
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        };
        let mut state = client.state_watcher();
        let result = f(client).await;
        // The session closes once the last client clone is dropped (in `f`).
        let closed = async { while !state.changed().await.is_terminated() {} };
        tokio::time::timeout(Duration::from_secs(2), closed).await.ok();
        result
    })
}

impl Drop for ZooKeeper {
    fn drop(&mut self) {
        for n in 0..self.nodes.len() {
            self.kill(n);
        }
    }
}

/// One znode, as `ZooKeeper::tree` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Znode {
    pub path: String,
    /// The owning session of an ephemeral node, 0 for any other.
    pub ephemeral_owner: i64,
    pub children: usize,
}

/// A CA, a server certificate for `addrs` (and localhost) and a client certificate, in
/// `<dir>/tls`, made by openssl; the server's key and certificate in one PEM keystore; and
/// another CA, which signed none of them.
fn make_certificates(dir: &std::path::Path, addrs: &[Ipv4Addr]) {
    let tls = dir.join("tls");
    std::fs::create_dir_all(&tls).expect("tls dir");
    let sans: Vec<String> =
        addrs.iter().map(|a| format!("IP:{a}")).chain(["IP:127.0.0.1".into(), "DNS:localhost".into()]).collect();
    std::fs::write(
        tls.join("server.ext"),
        format!("subjectAltName={}\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n", sans.join(",")),
    )
    .expect("server.ext");
    std::fs::write(tls.join("client.ext"), "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n")
        .expect("client.ext");
    let script = "set -e
        openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 -subj '/CN=autocomp test CA' \
            -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign
        for who in server client; do
            openssl req -newkey rsa:2048 -nodes -keyout $who.key -out $who.csr -subj /CN=$who
            openssl x509 -req -in $who.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out $who.pem -days 2 \
                -extfile $who.ext
        done
        cat server.key server.pem > server-keystore.pem
        openssl req -x509 -newkey rsa:2048 -nodes -keyout other-ca.key -out other-ca.pem -days 2 \
            -subj '/CN=another test CA' -addext basicConstraints=critical,CA:TRUE \
            -addext keyUsage=critical,keyCertSign,cRLSign";
    let made = Command::new("sh").arg("-c").arg(script).current_dir(&tls).output();
    let made =
        made.unwrap_or_else(|e| panic!("openssl does not run ({e}): install it with `apt-get install -y openssl`"));
    assert!(
        made.status.success(),
        "openssl failed to make the test certificates: {}",
        String::from_utf8_lossy(&made.stderr)
    );
}

/// Writes a secret file only its owner can read.
pub fn write_secret(path: &std::path::Path, text: &str) {
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .expect("secret file");
    file.write_all(text.as_bytes()).expect("secret written");
}

/// Sends a four-letter command and reads the whole answer (the server closes after it).
pub fn four_letter(port: u16, command: &str) -> Option<String> {
    four_letter_at(SocketAddr::from(([127, 0, 0, 1], port)), command)
}

fn four_letter_at(address: SocketAddr, command: &str) -> Option<String> {
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(1)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    stream.write_all(command.as_bytes()).ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    Some(answer)
}

/// `count` distinct loopback ports that were free a moment ago.
pub fn free_ports(count: usize) -> Vec<u16> {
    let listeners: Vec<TcpListener> =
        (0..count).map(|_| TcpListener::bind("127.0.0.1:0").expect("bind a free loopback port")).collect();
    listeners.iter().map(|l| l.local_addr().expect("a bound address").port()).collect()
}
