//! The TPC-DS testbed on real PostgreSQL: data and the 99 query texts
//! generated offline by `deploy/tpcds/generate.py` (embedded here, run
//! with the Python that has PyPI `duckdb==1.4.4` and `duckdb-ext-tpcds`),
//! cached in a directory, loaded into [`LocalPostgres`] servers, and each
//! template's isolated latency measured on this machine.
//!
//! Template ids are TPC-DS's query numbers (1–99), the emulated
//! warehouse's ids, so the same workload generators and SLO rules
//! (`SLO = κ × baseline`) apply to both.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration as StdDuration;

use futures_util::SinkExt;
use serde::Serialize;

use crate::backend::local_postgres::LocalPostgres;
use crate::{Error, Result};

/// The generator, embedded so the binary needs no checkout.
const GENERATOR: &str = include_str!("../../../deploy/tpcds/generate.py");

/// The database the testbed loads into.
pub const DATABASE: &str = "tpcds";

/// Generated data and queries in a directory.
#[derive(Clone, Debug)]
pub struct TpcdsData {
    /// The directory (`schema.sql`, `data/`, `queries/`, `manifest.json`).
    pub dir: PathBuf,
}

fn failed(what: impl std::fmt::Display) -> Error {
    Error::Node(format!("TPC-DS testbed: {what}"))
}

/// The default cache: `$XDG_CACHE_HOME/slogate` or `~/.cache/slogate`,
/// one directory per scale factor.
pub fn default_cache_dir(scale_factor: f64) -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("slogate").join(format!("tpcds-sf{scale_factor}"))
}

impl TpcdsData {
    /// The data in `dir`, generated there first (with `python`) unless a
    /// complete set is already there.
    ///
    /// # Errors
    ///
    /// [`Error::Node`] when the generator cannot run (its message says
    /// which packages to install) or fails.
    pub fn prepare(dir: &Path, scale_factor: f64, python: &str) -> Result<TpcdsData> {
        if dir.join("manifest.json").is_file() {
            return Ok(TpcdsData { dir: dir.to_owned() });
        }
        std::fs::create_dir_all(dir).map_err(|e| failed(format!("cannot create {}: {e}", dir.display())))?;
        let script = dir.join("generate.py");
        std::fs::write(&script, GENERATOR).map_err(|e| failed(format!("cannot write {}: {e}", script.display())))?;
        eprintln!("slogate: generating TPC-DS SF {scale_factor} into {} (once; it is cached)", dir.display());
        let output = std::process::Command::new(python)
            .arg(&script)
            .args(["--sf", &scale_factor.to_string(), "--out"])
            .arg(dir)
            .output()
            .map_err(|e| failed(format!("cannot run `{python}` (set --python): {e}")))?;
        if !output.status.success() {
            return Err(failed(format!(
                "the generator failed: {}{}\n(it needs: pip install duckdb==1.4.4 duckdb-ext-tpcds)",
                String::from_utf8_lossy(&output.stderr).trim(),
                String::from_utf8_lossy(&output.stdout).trim()
            )));
        }
        Ok(TpcdsData { dir: dir.to_owned() })
    }

    /// The query texts by template id.
    ///
    /// # Errors
    ///
    /// [`Error::Node`] when the directory cannot be read.
    pub fn queries(&self) -> Result<BTreeMap<u32, String>> {
        let catalog = self.dir.join("queries");
        let mut queries = BTreeMap::new();
        for entry in std::fs::read_dir(&catalog).map_err(|e| failed(format!("{}: {e}", catalog.display())))? {
            let path = entry.map_err(failed)?.path();
            let Some(id) = path.file_stem().and_then(|s| s.to_str()).and_then(|s| s.parse::<u32>().ok()) else { continue };
            queries.insert(id, std::fs::read_to_string(&path).map_err(|e| failed(format!("{}: {e}", path.display())))?);
        }
        Ok(queries)
    }

    /// Creates the database on `server`, its tables, loads every table by
    /// `COPY`, and analyses them.
    ///
    /// # Errors
    ///
    /// [`Error::Node`] with the server's message.
    pub async fn load_into(&self, server: &LocalPostgres) -> Result<()> {
        server.execute("postgres", &format!("CREATE DATABASE {DATABASE}")).await?;
        let schema = std::fs::read_to_string(self.dir.join("schema.sql")).map_err(|e| failed(format!("schema.sql: {e}")))?;
        server.execute(DATABASE, &schema).await?;
        let client = server.connect(DATABASE).await?;
        let data = self.dir.join("data");
        let mut files: Vec<PathBuf> =
            std::fs::read_dir(&data).map_err(|e| failed(format!("{}: {e}", data.display())))?.flatten().map(|e| e.path()).collect();
        files.sort();
        for path in files.iter().filter(|p| p.extension().is_some_and(|e| e == "csv")) {
            let table = path.file_stem().and_then(|s| s.to_str()).ok_or_else(|| failed(format!("bad file name {}", path.display())))?;
            let bytes = std::fs::read(path).map_err(|e| failed(format!("{}: {e}", path.display())))?;
            let copy = format!("COPY {table} FROM STDIN (FORMAT csv, HEADER true)");
            let sink = client.copy_in::<_, bytes::Bytes>(&copy).await.map_err(|e| failed(format!("{table}: {e}")))?;
            futures_util::pin_mut!(sink);
            for chunk in bytes.chunks(1 << 20) {
                sink.send(bytes::Bytes::copy_from_slice(chunk)).await.map_err(|e| failed(format!("{table}: {e}")))?;
            }
            sink.finish().await.map_err(|e| failed(format!("{table}: {e}")))?;
        }
        client.batch_execute("ANALYZE").await.map_err(|e| failed(format!("ANALYZE: {e}")))?;
        Ok(())
    }
}

/// One template's isolated run on the testbed.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct IsolatedRun {
    /// Its latency, seconds, when it finished within the cap.
    pub latency_s: Option<f64>,
    /// Why it has none: slower than the cap, or its error.
    pub note: Option<String>,
}

/// Runs every query alone on `server`, one after another, each capped at
/// `cap` (the server ends it there), and returns what each took.
///
/// # Errors
///
/// [`Error::Node`] when the server cannot be reached.
pub async fn measure_isolated(server: &LocalPostgres, queries: &BTreeMap<u32, String>, cap: StdDuration) -> Result<BTreeMap<u32, IsolatedRun>> {
    let client = server.connect(DATABASE).await?;
    client.batch_execute(&format!("SET statement_timeout = {}", cap.as_millis())).await.map_err(failed)?;
    let mut runs = BTreeMap::new();
    for (&id, sql) in queries {
        let started = std::time::Instant::now();
        let run = match client.simple_query(sql).await {
            Ok(_) => IsolatedRun { latency_s: Some(started.elapsed().as_secs_f64()), note: None },
            Err(error) if error.code() == Some(&tokio_postgres::error::SqlState::QUERY_CANCELED) => {
                IsolatedRun { latency_s: None, note: Some(format!("slower than {:.0} s here", cap.as_secs_f64())) }
            }
            Err(error) => IsolatedRun { latency_s: None, note: Some(error.to_string()) },
        };
        runs.insert(id, run);
    }
    Ok(runs)
}
