//! A loopback HTTP server that answers every request the same way, or
//! never: failure injection for the AWS providers' tests (a 429 throttle,
//! a 5xx, a call that times out), where moto cannot produce the failure.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// How it answers.
#[derive(Clone, Debug)]
pub enum Answer {
    /// This status, these headers and this body, to every request.
    With {
        /// The status code.
        status: u16,
        /// Extra headers.
        headers: Vec<(String, String)>,
        /// The body.
        body: String,
    },
    /// Reads the request and never answers (the connection stays open for
    /// a minute).
    Never,
}

/// A running server; its threads end with the test process.
pub struct CannedHttp {
    addr: SocketAddr,
    requests: Arc<AtomicU32>,
}

impl CannedHttp {
    /// Starts one on a free loopback port.
    pub fn start(answer: Answer) -> CannedHttp {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let requests = Arc::new(AtomicU32::new(0));
        let counted = requests.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let (answer, counted) = (answer.clone(), counted.clone());
                std::thread::spawn(move || {
                    let _ = stream.set_read_timeout(Some(Duration::from_secs(60)));
                    let mut buffer = [0u8; 65_536];
                    // One request per connection: read its head and body.
                    let mut seen = Vec::new();
                    while let Ok(n) = stream.read(&mut buffer) {
                        if n == 0 {
                            return;
                        }
                        seen.extend_from_slice(&buffer[..n]);
                        let text = String::from_utf8_lossy(&seen);
                        if let Some(end) = text.find("\r\n\r\n") {
                            let length = text[..end]
                                .lines()
                                .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse::<usize>().unwrap_or(0)))
                                .unwrap_or(0);
                            if seen.len() >= end + 4 + length {
                                break;
                            }
                        }
                    }
                    counted.fetch_add(1, Ordering::SeqCst);
                    match answer {
                        Answer::Never => std::thread::sleep(Duration::from_secs(60)),
                        Answer::With { status, headers, body } => {
                            let extra: String = headers.iter().map(|(k, v)| format!("{k}: {v}\r\n")).collect();
                            let response = format!(
                                "HTTP/1.1 {status} Canned\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n{extra}\r\n{body}",
                                body.len()
                            );
                            let _ = stream.write_all(response.as_bytes());
                        }
                    }
                });
            }
        });
        CannedHttp { addr, requests }
    }

    /// Its endpoint URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Requests it has read.
    pub fn requests(&self) -> u32 {
        self.requests.load(Ordering::SeqCst)
    }
}
