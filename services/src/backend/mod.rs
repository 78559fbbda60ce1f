//! The backends and providers a node wires into its pools, beyond the
//! emulated ones `slogate-actors` carries (the embedded default).
//!
//! - [`postgres`]: the Postgres-wire executor (Amazon Redshift, Redshift
//!   Serverless endpoints, PostgreSQL).
//! - [`local_postgres`]: throwaway PostgreSQL servers on loopback ports
//!   (the demo's testbed and the tests').
//! - [`tpcds`]: the TPC-DS testbed: generated data and queries, loaded
//!   into local servers, and each template's isolated latency there.
//! - [`load_catalog`]: a pool's SQL catalog, the text of its named
//!   templates, from a directory.

pub mod local_postgres;
pub mod postgres;
pub mod tpcds;

use std::path::Path;

use slogate_core::fingerprint::{FINGERPRINT_BASE, SqlCatalog};
use slogate_core::model::TemplateId;

use crate::{Error, Result};

/// Reads a directory of SQL files, one per named template: `17.sql` or
/// `query17.sql` is template 17. Other files are ignored.
///
/// # Errors
///
/// [`Error::Config`] naming the directory or file that cannot be read, or
/// a template id outside 1..2^24.
pub fn load_catalog(dir: &Path) -> Result<SqlCatalog> {
    let unreadable = |what: &Path, e: std::io::Error| Error::Config(format!("SQL catalog {}: {e}", what.display()));
    let mut entries = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| unreadable(dir, e))? {
        let path = entry.map_err(|e| unreadable(dir, e))?.path();
        let Some(stem) = path.file_stem().and_then(|s| s.to_str()) else { continue };
        if path.extension().and_then(|e| e.to_str()) != Some("sql") {
            continue;
        }
        let Ok(id) = stem.trim_start_matches("query").parse::<u32>() else { continue };
        if id == 0 || id >= FINGERPRINT_BASE {
            return Err(Error::Config(format!("SQL catalog {}: template id {id} is outside 1..{FINGERPRINT_BASE}", path.display())));
        }
        let text = std::fs::read_to_string(&path).map_err(|e| unreadable(&path, e))?;
        entries.push((TemplateId(id), text));
    }
    if entries.is_empty() {
        return Err(Error::Config(format!("SQL catalog {}: no <N>.sql or query<N>.sql files", dir.display())));
    }
    Ok(SqlCatalog::new(entries))
}
