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
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

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
        let status = Command::new(cargo).args(["build", "-p", package, "--bin", name]).status().expect("cargo runs");
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
        let mut child = Command::new(slogate_binary())
            .args(["serve", "--config"])
            .arg(config)
            .args(flags)
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
