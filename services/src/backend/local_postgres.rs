//! Throwaway PostgreSQL servers on loopback ports, for
//! `slogate demo --backend postgres` and the tests: each is a fresh
//! `initdb` in a temporary directory, started with `pg_ctl`, password
//! authentication (SCRAM) for its superuser, and removed when dropped.
//! [`LocalPostgres::start_with_tls`] also serves TLS, with a certificate
//! for `127.0.0.1` signed by a throwaway CA (made with the `openssl`
//! command).
//!
//! The binaries come from `SLOGATE_PG_BIN`, else the `PATH`, else the
//! newest `/usr/lib/postgresql/<version>/bin` (Debian's `postgresql`
//! package). PostgreSQL refuses to run as root, so as root every server
//! command runs as the `postgres` user (`runuser`).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{Error, Result};

/// A running throwaway server. Dropping it stops the server and removes
/// its directory.
pub struct LocalPostgres {
    /// Its TCP port on 127.0.0.1.
    pub port: u16,
    /// The superuser (`postgres`).
    pub user: String,
    /// The file holding the superuser's password.
    pub password_file: PathBuf,
    /// The CA that signed its certificate, when it serves TLS.
    pub ca_file: Option<PathBuf>,
    root: PathBuf,
    bin: PathBuf,
    as_postgres: bool,
}

fn failed(what: &str, reason: impl std::fmt::Display) -> Error {
    Error::Node(format!("local PostgreSQL: {what}: {reason}"))
}

/// The directory of `initdb`, `pg_ctl` and `postgres`.
fn binaries() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("SLOGATE_PG_BIN") {
        return Ok(PathBuf::from(dir));
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            if dir.join("initdb").is_file() && dir.join("pg_ctl").is_file() {
                return Ok(dir);
            }
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path().join("bin"))))
        .filter(|(_, bin)| bin.join("initdb").is_file())
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin).ok_or_else(|| {
        failed("no initdb found", "install PostgreSQL (apt-get install -y postgresql) or set SLOGATE_PG_BIN to its bin directory")
    })
}

/// Whether this process is root (PostgreSQL then runs as `postgres`).
fn is_root() -> bool {
    Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.starts_with(b"0\n"))
}

/// A free TCP port on 127.0.0.1 (free when asked: the server binds it a
/// moment later).
fn free_port() -> Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| failed("cannot find a free port", e))?;
    Ok(listener.local_addr().map_err(|e| failed("cannot find a free port", e))?.port())
}

impl LocalPostgres {
    /// Initialises and starts a server under a new directory in `parent`.
    ///
    /// # Errors
    ///
    /// [`Error::Node`] when PostgreSQL is not installed, or `initdb` or
    /// `pg_ctl` fail (with their output).
    pub fn start(parent: &Path) -> Result<LocalPostgres> {
        Self::start_serving(parent, false)
    }

    /// As [`LocalPostgres::start`], serving TLS too (clients may still
    /// connect without).
    ///
    /// # Errors
    ///
    /// As [`LocalPostgres::start`], and when `openssl` cannot make the
    /// certificates.
    pub fn start_with_tls(parent: &Path) -> Result<LocalPostgres> {
        Self::start_serving(parent, true)
    }

    fn start_serving(parent: &Path, tls: bool) -> Result<LocalPostgres> {
        let bin = binaries()?;
        let as_postgres = is_root();
        // A counter, not a probed port, keeps two servers of one process
        // apart: the operating system may hand the same free port out twice.
        static SERVERS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let serial = SERVERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let root = parent.join(format!("pg-{}-{serial}", std::process::id()));
        std::fs::create_dir_all(&root).map_err(|e| failed(&format!("cannot create {}", root.display()), e))?;
        let password_file = root.join("password");
        let password = format!("slogate-{:x}", std::process::id() as u64 * 7_919 + u64::from(free_port()?));
        std::fs::write(&password_file, &password).map_err(|e| failed("cannot write the password file", e))?;
        let ca_file = if tls { Some(make_certificates(&root)?) } else { None };
        if as_postgres {
            // The server runs as `postgres`: it must own its directory.
            let status = Command::new("chown").args(["-R", "postgres:postgres"]).arg(&root).status();
            if !status.is_ok_and(|s| s.success()) {
                return Err(failed("cannot chown the data directory to postgres", root.display()));
            }
        }
        let server = LocalPostgres { port: 0, user: "postgres".into(), password_file, ca_file, root, bin, as_postgres };
        server.run(
            "initdb",
            &[
                "-D",
                &server.data().to_string_lossy(),
                "-U",
                "postgres",
                "-A",
                "scram-sha-256",
                "--pwfile",
                &server.password_file.to_string_lossy(),
                "--no-sync",
                "-E",
                "UTF8",
                "--locale",
                "C",
            ],
        )?;
        let mut server = server;
        server.port = free_port()?;
        server.start_server()?;
        Ok(server)
    }

    fn data(&self) -> PathBuf {
        self.root.join("data")
    }

    /// Runs one of the server's programs (as `postgres` when root).
    fn run(&self, program: &str, args: &[&str]) -> Result<()> {
        let path = self.bin.join(program);
        let output = if self.as_postgres {
            Command::new("runuser").args(["-u", "postgres", "--"]).arg(&path).args(args).output()
        } else {
            Command::new(&path).args(args).output()
        }
        .map_err(|e| failed(&format!("cannot run {}", path.display()), e))?;
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            let stdout = String::from_utf8_lossy(&output.stdout);
            return Err(failed(&format!("{program} failed"), format!("{}{}", stderr.trim(), stdout.trim())));
        }
        Ok(())
    }

    /// Starts the server (again, after [`LocalPostgres::kill`]) on its port.
    ///
    /// # Errors
    ///
    /// [`Error::Node`] with `pg_ctl`'s output.
    pub fn start_server(&self) -> Result<()> {
        let mut options = format!(
            "-c listen_addresses=127.0.0.1 -p {} -k {} -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=100",
            self.port,
            self.data().display()
        );
        if self.ca_file.is_some() {
            let (cert, key) = (self.root.join("server.crt"), self.root.join("server.key"));
            options.push_str(&format!(" -c ssl=on -c ssl_cert_file={} -c ssl_key_file={}", cert.display(), key.display()));
        }
        let log = self.root.join("server.log");
        self.run("pg_ctl", &["-D", &self.data().to_string_lossy(), "-w", "-t", "30", "-l", &log.to_string_lossy(), "-o", &options, "start"])
    }

    /// Stops the server at once, as a crash would (`pg_ctl -m immediate`):
    /// its clients' connections drop mid-query.
    ///
    /// # Errors
    ///
    /// [`Error::Node`] with `pg_ctl`'s output.
    pub fn kill(&self) -> Result<()> {
        self.run("pg_ctl", &["-D", &self.data().to_string_lossy(), "-w", "-m", "immediate", "stop"])
    }

    /// The superuser's password.
    pub fn password(&self) -> String {
        std::fs::read_to_string(&self.password_file).unwrap_or_default()
    }

    /// Runs `sql` (one or more statements) on `database` as the superuser.
    ///
    /// # Errors
    ///
    /// [`Error::Node`] with the server's message.
    pub async fn execute(&self, database: &str, sql: &str) -> Result<()> {
        let client = self.connect(database).await?;
        client.batch_execute(sql).await.map_err(|e| failed(&format!("{database}: {}", sql.chars().take(60).collect::<String>()), e))
    }

    /// A connection to `database` as the superuser; its driver runs on a
    /// spawned task.
    ///
    /// # Errors
    ///
    /// [`Error::Node`] when the server refuses.
    pub async fn connect(&self, database: &str) -> Result<tokio_postgres::Client> {
        let (client, connection) = tokio_postgres::Config::new()
            .host("127.0.0.1")
            .port(self.port)
            .user(&self.user)
            .password(self.password())
            .dbname(database)
            .connect(tokio_postgres::NoTls)
            .await
            .map_err(|e| failed(&format!("cannot connect to {database}"), e))?;
        tokio::spawn(connection);
        Ok(client)
    }
}

/// A throwaway CA and a certificate for `127.0.0.1` it signed, in `dir`
/// (`ca.crt`, `server.crt`, `server.key`); returns the CA's path. The TLS
/// tests of the node use it too.
pub fn make_certificates(dir: &Path) -> Result<PathBuf> {
    let openssl = |args: &[&str]| -> Result<()> {
        let output = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .map_err(|e| failed("cannot run openssl (apt-get install -y openssl)", e))?;
        if !output.status.success() {
            return Err(failed("openssl failed", String::from_utf8_lossy(&output.stderr).trim()));
        }
        Ok(())
    };
    std::fs::write(dir.join("server.ext"), "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n")
        .map_err(|e| failed("cannot write the certificate extensions", e))?;
    openssl(&["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=slogate test CA"])?;
    openssl(&["req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1"])?;
    openssl(&[
        "x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-out", "server.crt", "-days", "2", "-extfile",
        "server.ext",
    ])?;
    // PostgreSQL refuses a key others can read.
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(dir.join("server.key"), std::fs::Permissions::from_mode(0o600)).map_err(|e| failed("cannot protect server.key", e))?;
    Ok(dir.join("ca.crt"))
}

impl Drop for LocalPostgres {
    fn drop(&mut self) {
        let _ = self.run("pg_ctl", &["-D", &self.data().to_string_lossy(), "-m", "immediate", "stop"]);
        let _ = std::fs::remove_dir_all(&self.root);
    }
}
