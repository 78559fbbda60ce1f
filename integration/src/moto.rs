//! moto's server (PyPI `moto[server]`), started by the tests on a free
//! loopback port and killed when dropped. It serves EC2, STS and
//! provisioned Redshift (and Lambda) in AWS's real wire protocols.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running moto server.
pub struct Moto {
    child: Child,
    port: u16,
}

/// Where `moto_server` is: beside `SLOGATE_PYTHON` (the venv `.ci/run`
/// makes), in `target/ci-venv`, or on `PATH`.
fn moto_server() -> PathBuf {
    let candidates = std::env::var("SLOGATE_PYTHON")
        .ok()
        .and_then(|python| PathBuf::from(python).parent().map(|bin| bin.join("moto_server")))
        .into_iter()
        .chain([PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/ci-venv/bin/moto_server")]);
    for candidate in candidates {
        if candidate.exists() {
            return candidate;
        }
    }
    PathBuf::from("moto_server")
}

impl Moto {
    /// Starts moto and waits until it answers (at most 30 s).
    pub fn start() -> Moto {
        let port = crate::free_port();
        let program = moto_server();
        let child = Command::new(&program)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {} ({e}): run .ci/run, which installs moto[server] into target/ci-venv", program.display()));
        let moto = Moto { child, port };
        let deadline = Instant::now() + Duration::from_secs(30);
        while moto.get("/moto-api/").is_none() {
            assert!(Instant::now() < deadline, "moto did not answer on port {port} within 30 s");
            std::thread::sleep(Duration::from_millis(100));
        }
        moto
    }

    /// Its endpoint URL.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// One plain HTTP request; the response's status line and body, or
    /// `None` when it did not answer.
    pub fn request(&self, method: &str, path: &str, body: &str) -> Option<String> {
        self.request_with(method, path, "Content-Type: application/json\r\n", body)
    }

    /// An IAM call (the query protocol), which moto routes by the
    /// credential scope of its (unchecked) signature.
    pub fn iam(&self, form: &str) -> Option<String> {
        let headers = "Content-Type: application/x-www-form-urlencoded\r\nAuthorization: AWS4-HMAC-SHA256 Credential=testing/20260101/us-east-1/iam/aws4_request, SignedHeaders=host, Signature=0\r\n";
        self.request_with("POST", "/", headers, form)
    }

    fn request_with(&self, method: &str, path: &str, headers: &str, body: &str) -> Option<String> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
        let request = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(request.as_bytes()).ok()?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).ok()?;
        answer.starts_with("HTTP/1.").then_some(answer)
    }

    /// A plain GET.
    pub fn get(&self, path: &str) -> Option<String> {
        self.request("GET", path, "")
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
