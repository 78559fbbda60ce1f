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

    /// Makes Lambda function `name` (2048 MB, code that never runs:
    /// moto's docker-less Lambda echoes each payload, or answers the
    /// results queued with [`Moto::queue_lambda_result`]), with the IAM role
    /// it needs.
    ///
    /// # Panics
    ///
    /// If moto refuses.
    pub fn lambda_function(&self, name: &str) {
        let configured = self.request("POST", "/moto-api/config", r#"{"lambda": {"use_docker": false}}"#).expect("moto answers");
        assert!(configured.starts_with("HTTP/1.1 20"), "{configured}");
        let policy = "%7B%22Version%22%3A%222012-10-17%22%2C%22Statement%22%3A%5B%5D%7D";
        let role = self.iam(&format!("Action=CreateRole&Version=2010-05-08&RoleName={name}-role&AssumeRolePolicyDocument={policy}")).expect("moto answers");
        assert!(role.starts_with("HTTP/1.1 200"), "{role}");
        // An empty zip archive, base64.
        let body = format!(
            r#"{{"FunctionName": "{name}", "Runtime": "python3.12", "Role": "arn:aws:iam::123456789012:role/{name}-role", "Handler": "offload.handler", "MemorySize": 2048, "Code": {{"ZipFile": "UEsFBgAAAAAAAAAAAAAAAAAAAAAAAA=="}}}}"#
        );
        let headers = "Content-Type: application/json\r\nAuthorization: AWS4-HMAC-SHA256 Credential=testing/20260101/us-east-1/lambda/aws4_request, SignedHeaders=host, Signature=0\r\n";
        let created = self.request_with("POST", "/2015-03-31/functions", headers, &body).expect("moto answers");
        assert!(created.starts_with("HTTP/1.1 20"), "{created}");
    }

    /// Queues `payload` as the answer of the next Lambda invocation.
    ///
    /// # Panics
    ///
    /// If moto refuses.
    pub fn queue_lambda_result(&self, payload: &serde_json::Value) {
        let body = serde_json::json!({ "results": [payload.to_string()], "region": "us-east-1" }).to_string();
        let queued = self.request("POST", "/moto-api/static/lambda-simple/response", &body).expect("moto answers");
        assert!(queued.starts_with("HTTP/1.1 20"), "{queued}");
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
