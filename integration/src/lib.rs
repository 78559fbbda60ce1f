//! # slogate-integration
//!
//! Helpers for end-to-end tests that run `slogate serve` as a separate
//! process on 127.0.0.1 ephemeral ports and talk to it only through its
//! public surfaces (gRPC and the admin API). Every wait is bounded.
//!
//! # Layout
//!
//! - [`NodeProcess`]: start, find the bound addresses, signal, restart.
//! - [`http_get`]: a minimal blocking HTTP/1.1 GET for the admin API.
//! - [`EtcdProcess`]: a throwaway etcd server (Debian's `etcd-server`).
//! - [`CuttableProxy`]: a loopback TCP proxy a test can cut and heal, to
//!   partition one node from etcd.
//! - [`free_port`]: a loopback port nobody listens on now.
//! - [`serverless_stand_in`]: a test double for Redshift Serverless (moto
//!   does not serve it), speaking its JSON 1.1 wire protocol, with fault
//!   injection.
//! - [`moto`]: moto's server (EC2, STS, provisioned Redshift, Lambda).
//! - [`canned_http`]: a server that answers every request the same way,
//!   or never: throttles, 5xx and timeouts moto cannot produce.
//! - [`browser`]: headless Chromium, for the console's DOM and screenshots.
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub mod browser;
pub mod canned_http;
pub mod moto;
pub mod serverless_stand_in;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// The `slogate` binary next to this test executable, built on demand.
///
/// # Panics
///
/// If it cannot be found or built.
pub fn slogate_binary() -> PathBuf {
    workspace_binary("slogate", "slogate")
}

/// A workspace binary next to this test executable (`cargo test
/// --workspace` builds them for their packages' own tests), built on demand
/// otherwise.
///
/// # Panics
///
/// If it cannot be found or built.
pub fn workspace_binary(package: &str, name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test> → target/<profile>/<name>
    let profile_dir = exe.parent().and_then(Path::parent).expect("target/<profile>");
    let binary = profile_dir.join(name);
    if !binary.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        // The node binary with its AWS providers, as `cargo test
        // --workspace` builds it.
        let features: &[&str] = if package == "slogate" { &["--features", "aws"] } else { &[] };
        let status = Command::new(cargo).args(["build", "-p", package, "--bin", name]).args(features).status().expect("cargo runs");
        assert!(status.success(), "building {name} failed");
    }
    binary
}

/// A `slogate serve` process.
pub struct NodeProcess {
    child: Child,
    /// Its gRPC address.
    pub grpc_addr: SocketAddr,
    /// Its admin API address.
    pub admin_addr: SocketAddr,
    log: mpsc::Receiver<String>,
    logged_at_start: Vec<String>,
}

impl NodeProcess {
    /// Starts `slogate serve --config <config>` and waits (at most 60 s)
    /// for it to log its bound addresses.
    ///
    /// # Panics
    ///
    /// If it does not start in time.
    pub fn start(config: &Path) -> NodeProcess {
        NodeProcess::start_with(config, &[])
    }

    /// [`NodeProcess::start`] with more `slogate serve` flags.
    ///
    /// # Panics
    ///
    /// If it does not start in time.
    pub fn start_with(config: &Path, flags: &[&str]) -> NodeProcess {
        NodeProcess::start_with_env(config, flags, &[])
    }

    /// [`NodeProcess::start_with`] with more environment variables.
    ///
    /// # Panics
    ///
    /// If it does not start in time.
    pub fn start_with_env(config: &Path, flags: &[&str], env: &[(&str, &str)]) -> NodeProcess {
        let mut child = Command::new(slogate_binary())
            .args(["serve", "--config"])
            .arg(config)
            .args(flags)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("slogate serve starts");
        let stderr = child.stderr.take().expect("piped stderr");
        let (sender, log) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        let mut logged = Vec::new();
        let line = loop {
            let line = log.recv_timeout(Duration::from_secs(60)).unwrap_or_else(|_| panic!("the node logs its addresses within 60 s; it logged {logged:?}"));
            if line.contains("grpc_addr=") && line.contains("admin_addr=") {
                break line;
            }
            logged.push(line);
        };
        let field = |name: &str| -> SocketAddr {
            let start = line.find(name).expect("address field") + name.len();
            line[start..].split_whitespace().next().expect("address").parse().expect("socket address")
        };
        let (grpc_addr, admin_addr) = (field("grpc_addr="), field("admin_addr="));
        NodeProcess { child, grpc_addr, admin_addr, log, logged_at_start: logged }
    }

    /// What it logged before it logged its addresses.
    pub fn logged_at_start(&self) -> &[String] {
        &self.logged_at_start
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its resident set size now, bytes (from `/proc`).
    ///
    /// # Panics
    ///
    /// If `/proc/<pid>/status` cannot be read.
    pub fn rss_bytes(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).expect("/proc/<pid>/status");
        let kib: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .expect("a VmRSS line");
        kib * 1_024
    }

    /// Sends SIGTERM and waits at most `limit` for the process to exit;
    /// returns how long it took, or `None` if it was still running (then it
    /// is killed).
    pub fn terminate_within(mut self, limit: Duration) -> Option<Duration> {
        let started = std::time::Instant::now();
        let status = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status().expect("kill runs");
        assert!(status.success());
        while started.elapsed() < limit {
            if self.child.try_wait().expect("waitpid works").is_some() {
                return Some(started.elapsed());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// Kills the process with SIGKILL (no chance to clean up).
    pub fn kill(mut self) {
        self.child.kill().expect("SIGKILL delivered");
        self.child.wait().expect("reaped");
    }

    /// Sends SIGTERM and waits (at most 60 s) for a clean exit; returns the
    /// lines it logged meanwhile.
    ///
    /// # Panics
    ///
    /// If it does not exit cleanly in time.
    pub fn terminate(mut self) -> Vec<String> {
        let status = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status().expect("kill runs");
        assert!(status.success());
        let mut lines = Vec::new();
        while let Ok(line) = self.log.recv_timeout(Duration::from_secs(60)) {
            lines.push(line);
        }
        let exit = self.child.wait().expect("reaped");
        assert!(exit.success(), "slogate serve exited with {exit}: {lines:?}");
        lines
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `GET path` on `addr`, with an optional bearer token; returns the status
/// and the body. Times out after 10 s.
///
/// # Panics
///
/// On connection errors or a malformed response.
pub fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    http(addr, "GET", path, None, "")
}

/// Any method with an optional bearer token and a body.
///
/// # Panics
///
/// On connection errors or a malformed response.
pub fn http(addr: SocketAddr, method: &str, path: &str, token: Option<&str>, body: &str) -> (u16, String) {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(10)).expect("admin API reachable");
    stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout set");
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).expect("request sent");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("response read");
    let status = response.get(9..12).and_then(|s| s.parse().ok()).expect("HTTP status line");
    let body = response.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    (status, body)
}

/// Parses a JSON body.
///
/// # Panics
///
/// If it is not JSON.
pub fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

/// A loopback port that was free a moment ago (bound, then released).
///
/// # Panics
///
/// If no port can be bound.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("a free port").local_addr().expect("its address").port()
}

/// The `etcd` binary, if installed (`apt-get install etcd-server`).
pub fn etcd_binary() -> Option<PathBuf> {
    ["/usr/bin/etcd", "/usr/local/bin/etcd"].iter().map(PathBuf::from).find(|p| p.exists())
}

/// A throwaway single-member etcd on loopback ports, its data in a
/// temporary directory; killed when dropped.
pub struct EtcdProcess {
    child: Child,
    /// Its client URL, `http://127.0.0.1:PORT`.
    pub client_url: String,
    /// Its client address.
    pub client_addr: SocketAddr,
    dir: PathBuf,
}

impl EtcdProcess {
    /// Starts etcd with its data under `dir` and waits (at most 30 s) until
    /// it accepts connections.
    ///
    /// # Panics
    ///
    /// If etcd is not installed or does not start in time.
    pub fn start(dir: &Path) -> EtcdProcess {
        EtcdProcess::start_with(dir, None)
    }

    /// [`EtcdProcess::start`] serving clients over TLS with `tls`'s
    /// certificate and key (its health is checked with `curl` and the CA).
    ///
    /// # Panics
    ///
    /// If etcd is not installed or does not start in time.
    pub fn start_tls(dir: &Path, tls: &EtcdTls) -> EtcdProcess {
        EtcdProcess::start_with(dir, Some(tls))
    }

    fn start_with(dir: &Path, tls: Option<&EtcdTls>) -> EtcdProcess {
        let binary = etcd_binary().expect("etcd is installed (apt-get install -y etcd-server; .ci/run does it)");
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir).expect("etcd's directory");
        // A port found free may be taken by another process before etcd
        // binds it (tests start nodes on port 0 in parallel): then etcd
        // exits, and it is tried again on other ports.
        for attempt in 0..5 {
            let (client, peer) = (free_port(), free_port());
            let scheme = if tls.is_some() { "https" } else { "http" };
            let client_url = format!("{scheme}://127.0.0.1:{client}");
            let peer_url = format!("http://127.0.0.1:{peer}");
            let log = std::fs::File::create(dir.join(format!("etcd-{attempt}.log"))).expect("etcd's log file");
            let mut command = Command::new(&binary);
            command
                .args(["--name", "test", "--data-dir"])
                .arg(dir.join(format!("data-{attempt}")))
                .args(["--listen-client-urls", &client_url, "--advertise-client-urls", &client_url])
                .args(["--listen-peer-urls", &peer_url, "--initial-advertise-peer-urls", &peer_url])
                .args(["--initial-cluster", &format!("test={peer_url}")]);
            if let Some(tls) = tls {
                command.arg("--cert-file").arg(&tls.cert).arg("--key-file").arg(&tls.key);
            }
            let child = command.stdout(Stdio::null()).stderr(log).spawn().expect("etcd starts");
            let client_addr: SocketAddr = format!("127.0.0.1:{client}").parse().expect("address");
            let mut etcd = EtcdProcess { child, client_url, client_addr, dir: dir.to_owned() };
            let started = std::time::Instant::now();
            while started.elapsed() < Duration::from_secs(30) {
                if etcd.child.try_wait().expect("waitpid works").is_some() {
                    break;
                }
                if TcpStream::connect_timeout(&client_addr, Duration::from_millis(200)).is_ok() {
                    let healthy = match tls {
                        None => {
                            let (status, body) = http_get(client_addr, "/health");
                            status == 200 && body.contains("true")
                        }
                        Some(tls) => Command::new("curl")
                            .args(["-sS", "--max-time", "2", "--cacert"])
                            .arg(&tls.ca)
                            .arg(format!("https://{client_addr}/health"))
                            .output()
                            .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).contains("true")),
                    };
                    if healthy {
                        return etcd;
                    }
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = etcd.child.kill();
            let _ = etcd.child.wait();
            // Keep the directory (and its logs) for the next attempt.
            etcd.dir = PathBuf::new();
        }
        panic!("etcd did not become healthy in 5 attempts; see the logs in {}", dir.display());
    }
}

/// An etcd server's TLS files: its certificate and key, and the authority
/// that signed them.
pub struct EtcdTls {
    /// PEM certificate.
    pub cert: PathBuf,
    /// PEM key.
    pub key: PathBuf,
    /// PEM certificate of the signing authority.
    pub ca: PathBuf,
}

impl Drop for EtcdProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if !self.dir.as_os_str().is_empty() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// A TCP proxy from a loopback port to `target` that a test can cut (every
/// connection closed, new ones refused) and heal.
pub struct CuttableProxy {
    /// Where it listens.
    pub addr: SocketAddr,
    cut: std::sync::Arc<std::sync::atomic::AtomicBool>,
    open: std::sync::Arc<std::sync::Mutex<Vec<TcpStream>>>,
}

impl CuttableProxy {
    /// Listens on a free loopback port and relays to `target`.
    ///
    /// # Panics
    ///
    /// If it cannot listen.
    pub fn start(target: SocketAddr) -> CuttableProxy {
        use std::sync::atomic::Ordering;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("proxy listens");
        let addr = listener.local_addr().expect("proxy address");
        let cut = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let open: std::sync::Arc<std::sync::Mutex<Vec<TcpStream>>> = std::sync::Arc::default();
        let (cut_seen, open_kept) = (cut.clone(), open.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                if cut_seen.load(Ordering::SeqCst) {
                    drop(client);
                    continue;
                }
                let Ok(server) = TcpStream::connect_timeout(&target, Duration::from_secs(1)) else { continue };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let pairs = [(client.try_clone(), server.try_clone()), (server.try_clone(), client.try_clone())];
                {
                    let mut open = open_kept.lock().expect("proxy lock");
                    open.push(client);
                    open.push(server);
                }
                for pair in pairs {
                    if let (Ok(mut from), Ok(mut to)) = pair {
                        std::thread::spawn(move || {
                            let _ = std::io::copy(&mut from, &mut to);
                            let _ = to.shutdown(std::net::Shutdown::Both);
                        });
                    }
                }
            }
        });
        CuttableProxy { addr, cut, open }
    }

    /// Closes every relayed connection and refuses new ones.
    pub fn cut(&self) {
        self.cut.store(true, std::sync::atomic::Ordering::SeqCst);
        for stream in self.open.lock().expect("proxy lock").drain(..) {
            let _ = stream.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Relays again.
    pub fn heal(&self) {
        self.cut.store(false, std::sync::atomic::Ordering::SeqCst);
    }
}
