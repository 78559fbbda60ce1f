//! The Reservoir actor: [`slogate_core::reservoir::Reservoir`] persisted in
//! sled, plus the execution log the predictor trains on.
//!
//! Storage sits behind [`ReservoirStore`] so sled can be swapped (redb is
//! the maintained alternative). The sled layout:
//!
//! | tree | key | value |
//! | --- | --- | --- |
//! | `counts` | day (i32 BE, sign-flipped), hour (u8), template (u32 BE) | count (u64 BE) |
//! | `totals` | day, hour | arrivals in the hour (u64 BE) |
//! | `samples` | day, hour, slot (u32 BE) | offset in seconds (u16 BE) |
//! | `executions` | sequence number (u64 BE) | JSON [`ExecutionRecord`] |
//!
//! Writes are applied as they come and flushed to disk every
//! `flush_every` updates, at least once a second while anything is
//! unflushed, and on [`Flush`]; what was flushed survives a crash, so a
//! `kill -9` loses at most the last second.

use std::path::Path;

use actix::prelude::*;
use serde::Serialize;
use slogate_core::model::TemplateId;
use slogate_core::reservoir::{CalendarHour, ExecutionRecord, Reservoir, ReservoirConfig, ReservoirUpdate};

use crate::idempotency::IdempotencyRecord;
use crate::{Error, Result};

/// Rows loaded back from storage.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StoredTables {
    /// Count table rows.
    pub counts: Vec<((CalendarHour, TemplateId), u64)>,
    /// Arrival totals per hour.
    pub totals: Vec<(CalendarHour, u64)>,
    /// Arrival sample slots.
    pub samples: Vec<((CalendarHour, u32), u16)>,
    /// Executions logged.
    pub executions: u64,
}

/// Where the reservoir lives.
pub trait ReservoirStore: Send {
    /// Persists one arrival's changes.
    fn apply(&mut self, update: &ReservoirUpdate) -> Result<()>;
    /// Appends an execution to the log; returns its sequence number.
    fn append_execution(&mut self, record: &ExecutionRecord) -> Result<u64>;
    /// Reads every stored row.
    fn load(&self) -> Result<StoredTables>;
    /// Reads the last `limit` logged executions, oldest first (by
    /// sequence number, which only grows but may skip).
    fn recent_executions(&self, limit: usize) -> Result<Vec<ExecutionRecord>>;
    /// Writes an idempotency record, replacing one with its key.
    fn put_idempotency(&mut self, record: &IdempotencyRecord) -> Result<()>;
    /// Reads every idempotency record finished at or after
    /// `since_unix_s`, oldest first, and deletes the older ones.
    fn idempotency_records(&mut self, since_unix_s: f64) -> Result<Vec<IdempotencyRecord>>;
    /// Makes everything written so far durable.
    fn flush(&self) -> Result<()>;
}

/// The sled-backed store.
pub struct SledStore {
    db: sled::Db,
    counts: sled::Tree,
    totals: sled::Tree,
    samples: sled::Tree,
    executions: sled::Tree,
    idempotency: sled::Tree,
}

fn hour_key(hour: CalendarHour) -> [u8; 5] {
    // Flip the sign bit so negative days sort before positive ones.
    let day = (hour.day as u32 ^ 0x8000_0000).to_be_bytes();
    [day[0], day[1], day[2], day[3], hour.hour]
}

fn parse_hour(key: &[u8]) -> Result<CalendarHour> {
    let bytes: [u8; 4] = key.get(0..4).and_then(|b| b.try_into().ok()).ok_or(Error::CorruptStore("short hour key"))?;
    let hour = *key.get(4).ok_or(Error::CorruptStore("short hour key"))?;
    Ok(CalendarHour { day: (u32::from_be_bytes(bytes) ^ 0x8000_0000) as i32, hour })
}

fn u64_value(bytes: &[u8]) -> Result<u64> {
    Ok(u64::from_be_bytes(bytes.try_into().map_err(|_| Error::CorruptStore("u64 value"))?))
}

/// How long [`SledStore::open`] waits for a previous owner (this process's
/// last node, or one that just died) to release the store's file lock.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

fn open_when_unlocked(dir: &Path) -> Result<sled::Db> {
    let deadline = std::time::Instant::now() + LOCK_WAIT;
    loop {
        match sled::Config::new().path(dir).flush_every_ms(None).open() {
            Err(sled::Error::Io(e)) if e.to_string().contains("could not acquire lock") && std::time::Instant::now() < deadline => {
                // sled's IO threads let go of a closed store shortly after
                // it is dropped.
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            result => return Ok(result?),
        }
    }
}

impl SledStore {
    /// Opens (or creates) the store in `dir`, waiting up to 5 s for a
    /// previous owner to release it.
    pub fn open(dir: &Path) -> Result<SledStore> {
        // No background flusher: the actor flushes (every N updates, at least
        // once a second, and on shutdown), and without the flusher thread
        // the file lock is released the moment the store is dropped.
        let db = open_when_unlocked(dir)?;
        Ok(SledStore {
            counts: db.open_tree("counts")?,
            totals: db.open_tree("totals")?,
            samples: db.open_tree("samples")?,
            executions: db.open_tree("executions")?,
            idempotency: db.open_tree("idempotency")?,
            db,
        })
    }
}

impl ReservoirStore for SledStore {
    fn apply(&mut self, update: &ReservoirUpdate) -> Result<()> {
        let hour = hour_key(update.hour);
        let mut count_key = hour.to_vec();
        count_key.extend_from_slice(&update.template.0.to_be_bytes());
        self.counts.insert(count_key, &update.count.to_be_bytes())?;
        self.totals.insert(hour, &update.arrivals_total.to_be_bytes())?;
        if let Some((slot, offset)) = update.sample {
            let mut sample_key = hour.to_vec();
            sample_key.extend_from_slice(&slot.to_be_bytes());
            self.samples.insert(sample_key, &offset.to_be_bytes())?;
        }
        Ok(())
    }

    fn append_execution(&mut self, record: &ExecutionRecord) -> Result<u64> {
        let sequence = self.db.generate_id()?;
        let value = serde_json::to_vec(record).expect("execution records serialise");
        self.executions.insert(sequence.to_be_bytes(), value)?;
        Ok(sequence)
    }

    fn load(&self) -> Result<StoredTables> {
        let mut tables = StoredTables::default();
        for row in self.counts.iter() {
            let (key, value) = row?;
            let template = u32::from_be_bytes(key.get(5..9).and_then(|b| b.try_into().ok()).ok_or(Error::CorruptStore("count key"))?);
            tables.counts.push(((parse_hour(&key)?, TemplateId(template)), u64_value(&value)?));
        }
        for row in self.totals.iter() {
            let (key, value) = row?;
            tables.totals.push((parse_hour(&key)?, u64_value(&value)?));
        }
        for row in self.samples.iter() {
            let (key, value) = row?;
            let slot = u32::from_be_bytes(key.get(5..9).and_then(|b| b.try_into().ok()).ok_or(Error::CorruptStore("sample key"))?);
            let offset = u16::from_be_bytes(value.as_ref().try_into().map_err(|_| Error::CorruptStore("sample value"))?);
            tables.samples.push(((parse_hour(&key)?, slot), offset));
        }
        tables.executions = self.executions.len() as u64;
        Ok(tables)
    }

    fn recent_executions(&self, limit: usize) -> Result<Vec<ExecutionRecord>> {
        let mut records = self
            .executions
            .iter()
            .rev()
            .take(limit)
            .map(|row| {
                let (_, value) = row?;
                serde_json::from_slice(&value).map_err(|_| Error::CorruptStore("execution record"))
            })
            .collect::<Result<Vec<ExecutionRecord>>>()?;
        records.reverse();
        Ok(records)
    }

    fn put_idempotency(&mut self, record: &IdempotencyRecord) -> Result<()> {
        let value = serde_json::to_vec(record).expect("idempotency records serialise");
        self.idempotency.insert(record.key(), value)?;
        Ok(())
    }

    fn idempotency_records(&mut self, since_unix_s: f64) -> Result<Vec<IdempotencyRecord>> {
        let mut kept = Vec::new();
        for row in self.idempotency.iter() {
            let (key, value) = row?;
            let record: IdempotencyRecord = serde_json::from_slice(&value).map_err(|_| Error::CorruptStore("idempotency record"))?;
            if record.finished_unix_s >= since_unix_s {
                kept.push(record);
            } else {
                self.idempotency.remove(key)?;
            }
        }
        kept.sort_by(|a, b| a.finished_unix_s.total_cmp(&b.finished_unix_s));
        Ok(kept)
    }

    fn flush(&self) -> Result<()> {
        self.db.flush()?;
        Ok(())
    }
}

/// Records an arrival (a notification; the reply only reports storage
/// errors).
#[derive(Message)]
#[rtype(result = "Result<()>")]
pub struct ArrivalUpdate {
    /// Wall-clock arrival, seconds since the Unix epoch (UTC).
    pub unix_secs: i64,
    /// The query's template or fingerprint.
    pub template: TemplateId,
}

/// Logs a finished execution.
#[derive(Message)]
#[rtype(result = "Result<u64>")]
pub struct ExecutionUpdate(pub ExecutionRecord);

/// Writes a finished query's idempotency record.
#[derive(Message)]
#[rtype(result = "Result<()>")]
pub struct IdempotencyUpdate(pub IdempotencyRecord);

/// Makes everything recorded so far durable.
#[derive(Message)]
#[rtype(result = "Result<()>")]
pub struct Flush;

/// Flushes, closes the store, and stops the actor. (Its flush timer would
/// otherwise keep it alive after the last address is dropped.) Once it
/// replies, the data directory can be reopened.
#[derive(Message)]
#[rtype(result = "Result<()>")]
pub struct Shutdown;

/// Reads the count table of one hour.
#[derive(Message)]
#[rtype(result = "Vec<(TemplateId, u64)>")]
pub struct GetCounts(pub CalendarHour);

/// A copy of the tables, for the policy tuner.
#[derive(Message)]
#[rtype(result = "Reservoir")]
pub struct GetSnapshot;

/// Reads the most recent `limit` executions of the log, oldest first.
#[derive(Message)]
#[rtype(result = "Result<Vec<ExecutionRecord>>")]
pub struct GetRecentExecutions {
    /// At most this many.
    pub limit: usize,
}

/// Reads the observable state.
#[derive(Message)]
#[rtype(result = "ReservoirState")]
pub struct GetState;

/// The Reservoir actor's observable state.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ReservoirState {
    /// Hours with arrivals.
    pub hours: usize,
    /// Arrivals recorded, all hours.
    pub arrivals: u64,
    /// Executions logged.
    pub executions: u64,
    /// Updates not yet flushed.
    pub unflushed: u64,
    /// Storage errors since start.
    pub storage_errors: u64,
}

/// The longest unflushed writes wait.
const FLUSH_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// The actor. See the module docs.
pub struct ReservoirActor {
    reservoir: Reservoir,
    /// `None` once [`Shutdown`] has closed it.
    store: Option<Box<dyn ReservoirStore>>,
    flush_every: u64,
    mailbox_capacity: usize,
    unflushed: u64,
    executions: u64,
    storage_errors: u64,
}

impl ReservoirActor {
    /// Loads the tables from `store` and wraps them.
    pub fn new(config: ReservoirConfig, store: Box<dyn ReservoirStore>, flush_every: u64, mailbox_capacity: usize) -> Result<Self> {
        let stored = store.load()?;
        let mut reservoir = Reservoir::new(config);
        reservoir.restore(stored.counts, stored.totals, stored.samples);
        Ok(ReservoirActor {
            reservoir,
            store: Some(store),
            flush_every: flush_every.max(1),
            mailbox_capacity,
            unflushed: 0,
            executions: stored.executions,
            storage_errors: 0,
        })
    }

    fn store(&mut self) -> Result<&mut Box<dyn ReservoirStore>> {
        self.store.as_mut().ok_or(Error::ShuttingDown)
    }

    fn written(&mut self, result: Result<()>) -> Result<()> {
        if result.is_err() {
            self.storage_errors += 1;
            return result;
        }
        self.unflushed += 1;
        if self.unflushed >= self.flush_every {
            self.store()?.flush()?;
            self.unflushed = 0;
        }
        Ok(())
    }
}

impl Actor for ReservoirActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(self.mailbox_capacity);
        ctx.run_interval(FLUSH_INTERVAL, |actor, _ctx| {
            if actor.unflushed > 0 {
                match actor.store().and_then(|store| store.flush()) {
                    Ok(()) => actor.unflushed = 0,
                    Err(_) => actor.storage_errors += 1,
                }
            }
        });
    }

    fn stopped(&mut self, _ctx: &mut Self::Context) {
        // Best effort: a failed flush here has no caller to tell.
        if let Some(store) = &self.store {
            let _ = store.flush();
        }
    }
}

impl Handler<ArrivalUpdate> for ReservoirActor {
    type Result = Result<()>;

    fn handle(&mut self, message: ArrivalUpdate, _ctx: &mut Self::Context) -> Result<()> {
        let update = self.reservoir.handle_arrival(message.unix_secs, message.template);
        let result = self.store()?.apply(&update);
        self.written(result)
    }
}

impl Handler<ExecutionUpdate> for ReservoirActor {
    type Result = Result<u64>;

    fn handle(&mut self, message: ExecutionUpdate, _ctx: &mut Self::Context) -> Result<u64> {
        let sequence = self.store()?.append_execution(&message.0);
        let sequence = match sequence {
            Ok(sequence) => sequence,
            Err(e) => {
                self.storage_errors += 1;
                return Err(e);
            }
        };
        self.executions += 1;
        self.written(Ok(()))?;
        Ok(sequence)
    }
}

impl Handler<IdempotencyUpdate> for ReservoirActor {
    type Result = Result<()>;

    fn handle(&mut self, message: IdempotencyUpdate, _ctx: &mut Self::Context) -> Result<()> {
        let result = self.store()?.put_idempotency(&message.0);
        self.written(result)
    }
}

impl Handler<Flush> for ReservoirActor {
    type Result = Result<()>;

    fn handle(&mut self, _message: Flush, _ctx: &mut Self::Context) -> Result<()> {
        self.store()?.flush()?;
        self.unflushed = 0;
        Ok(())
    }
}

impl Handler<Shutdown> for ReservoirActor {
    type Result = Result<()>;

    fn handle(&mut self, _message: Shutdown, ctx: &mut Self::Context) -> Result<()> {
        ctx.stop();
        // Flush and close the store before replying, so the caller can
        // reopen the same directory at once (sled holds a file lock).
        if let Some(store) = self.store.take() {
            store.flush()?;
        }
        self.unflushed = 0;
        Ok(())
    }
}

impl Handler<GetCounts> for ReservoirActor {
    type Result = MessageResult<GetCounts>;

    fn handle(&mut self, message: GetCounts, _ctx: &mut Self::Context) -> Self::Result {
        MessageResult(self.reservoir.counts_in(message.0).collect())
    }
}

impl Handler<GetSnapshot> for ReservoirActor {
    type Result = MessageResult<GetSnapshot>;

    fn handle(&mut self, _message: GetSnapshot, _ctx: &mut Self::Context) -> Self::Result {
        MessageResult(self.reservoir.clone())
    }
}

impl Handler<GetRecentExecutions> for ReservoirActor {
    type Result = Result<Vec<ExecutionRecord>>;

    fn handle(&mut self, message: GetRecentExecutions, _ctx: &mut Self::Context) -> Self::Result {
        self.store.as_ref().ok_or(Error::ShuttingDown)?.recent_executions(message.limit)
    }
}

impl Handler<GetState> for ReservoirActor {
    type Result = MessageResult<GetState>;

    fn handle(&mut self, _message: GetState, _ctx: &mut Self::Context) -> Self::Result {
        let hours: Vec<CalendarHour> = self.reservoir.hours().collect();
        MessageResult(ReservoirState {
            hours: hours.len(),
            arrivals: hours.iter().map(|&h| self.reservoir.arrivals_in(h).0).sum(),
            executions: self.executions,
            unflushed: self.unflushed,
            storage_errors: self.storage_errors,
        })
    }
}
