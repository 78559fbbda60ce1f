//! An append-only log of checksummed frames in segment files: the
//! reservoir's execution log and idempotency records live here, not in
//! sled.
//!
//! A log that only grows at its end and shrinks at its front has the
//! shape of segment files: an append is one `write` to the newest file,
//! and dropping the oldest records deletes whole files (and rewrites at
//! most one, the file the cut falls in). In sled every insert and every
//! delete updated a tree page, and this log alone cost a fifth of a
//! least-loaded node's CPU per query (see the README's benchmarks).
//!
//! # Layout
//!
//! The directory holds `{id:016x}.seg` files, ids growing. A segment is a
//! run of frames:
//!
//! | bytes | field |
//! | --- | --- |
//! | 4 | payload length (u32 LE) |
//! | 4 | records in the frame (u32 LE) |
//! | 4 | CRC-32 of the record count's bytes and the payload (u32 LE) |
//! | length | payload: a time the caller stamps the frame with (f64 BE), then the caller's bytes |
//!
//! Appends go to the newest segment until it passes
//! [`SEGMENT_BYTES_MAX`]; the next append starts a new one. The log keeps
//! an index of every frame in memory (its place, its records, its
//! stamp), built when it opens by reading every segment and checking every
//! frame.
//!
//! # Properties
//!
//! - (A) What was appended reads back, in order, across reopenings.
//! - (B) A segment cut short anywhere (a torn write, a partial copy) opens
//!   with the frames before the cut intact, and reports the cut
//!   ([`SegmentLog::tails`]) rather than reading garbage: every frame is
//!   checked against its CRC.
//! - (C) [`SegmentLog::drop_front`] keeps exactly the frames after the ones
//!   it drops, in order, with the first one replaced as asked.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::{Error, Result};

/// A segment takes no more appends once it is this large.
pub const SEGMENT_BYTES_MAX: u64 = 1 << 20;

/// A frame's header: length, records and CRC.
const FRAME_HEADER: usize = 12;

/// One frame's place and summary.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Frame {
    /// Where its header starts in its segment.
    offset: u64,
    /// Its payload's length.
    len: u32,
    /// Records it holds.
    pub records: u32,
    /// The time the caller stamped it with (the payload's first eight
    /// bytes): pruning by age reads it without decoding the payload.
    pub stamp: f64,
}

#[derive(Debug)]
struct Segment {
    id: u64,
    bytes: u64,
    frames: Vec<Frame>,
}

/// A segment whose end did not hold whole, checked frames.
#[derive(Clone, Debug, PartialEq)]
pub struct Tail {
    /// The segment's file.
    pub path: PathBuf,
    /// Where its last good frame ends.
    pub good_bytes: u64,
    /// Its length.
    pub file_bytes: u64,
    /// Whether it is the newest segment (where a crash tears a write).
    pub newest: bool,
}

/// The log. See the module docs.
#[derive(Debug)]
pub struct SegmentLog {
    dir: PathBuf,
    segments: VecDeque<Segment>,
    /// The id the next segment takes (ids only grow, so a deleted
    /// segment's is never reused).
    next_id: u64,
    /// The newest segment, open for appends.
    active: Option<File>,
    /// A segment was created or renamed since the last sync: the
    /// directory needs syncing too.
    directory_dirty: std::cell::Cell<bool>,
    /// Appended to since the last sync.
    unsynced: std::cell::Cell<bool>,
    /// When it last synced.
    synced_at: std::cell::Cell<Option<std::time::Instant>>,
    tails: Vec<Tail>,
}

fn io(error: std::io::Error) -> Error {
    Error::Storage(sled::Error::Io(error))
}

fn checksum(records: u32, payload: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&records.to_le_bytes());
    hasher.update(payload);
    hasher.finalize()
}

/// The time a payload starts with (f64 BE); callers check it holds one.
fn stamp_of(payload: &[u8]) -> f64 {
    f64::from_bits(u64::from_be_bytes(payload[..8].try_into().expect("a payload starts with its time")))
}

/// A frame's bytes.
fn encode(records: u32, payload: &[u8]) -> Vec<u8> {
    let mut frame = Vec::with_capacity(FRAME_HEADER + payload.len());
    frame.extend_from_slice(&u32::try_from(payload.len()).expect("a frame is under 4 GiB").to_le_bytes());
    frame.extend_from_slice(&records.to_le_bytes());
    frame.extend_from_slice(&checksum(records, payload).to_le_bytes());
    frame.extend_from_slice(payload);
    frame
}

/// The whole, checked frames at the start of `bytes`, and where they end.
fn scan(bytes: &[u8]) -> (Vec<Frame>, u64) {
    let mut frames = Vec::new();
    let mut at = 0usize;
    while let Some(header) = bytes.get(at..at + FRAME_HEADER) {
        let word = |i: usize| u32::from_le_bytes(header[i..i + 4].try_into().expect("four bytes"));
        let (len, records, crc) = (word(0), word(4), word(8));
        let Some(payload) = bytes.get(at + FRAME_HEADER..at + FRAME_HEADER + len as usize) else { break };
        if payload.len() < 8 || checksum(records, payload) != crc {
            break;
        }
        frames.push(Frame { offset: at as u64, len, records, stamp: stamp_of(payload) });
        at += FRAME_HEADER + len as usize;
    }
    (frames, at as u64)
}

fn segment_path(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("{id:016x}.seg"))
}

fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(io)
}

impl SegmentLog {
    /// Opens (or creates) the log in `dir`, reading and checking every
    /// frame. Segments that end in anything but whole, checked frames are
    /// listed in [`SegmentLog::tails`] and left as they are until
    /// [`SegmentLog::cut_tails`].
    pub fn open(dir: &Path) -> Result<SegmentLog> {
        std::fs::create_dir_all(dir).map_err(io)?;
        let mut ids: Vec<u64> = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(io)? {
            let name = entry.map_err(io)?.file_name();
            let name = name.to_string_lossy();
            if let Some(id) = name.strip_suffix(".seg").and_then(|hex| u64::from_str_radix(hex, 16).ok()) {
                ids.push(id);
            } else if name.ends_with(".seg.tmp") {
                // A rewrite that did not finish: the segment it was to
                // replace is still there.
                std::fs::remove_file(dir.join(name.as_ref())).map_err(io)?;
            }
        }
        ids.sort_unstable();
        let mut segments = VecDeque::new();
        let mut tails = Vec::new();
        for (i, &id) in ids.iter().enumerate() {
            let path = segment_path(dir, id);
            let bytes = std::fs::read(&path).map_err(io)?;
            let (frames, good_bytes) = scan(&bytes);
            if good_bytes < bytes.len() as u64 {
                tails.push(Tail { path, good_bytes, file_bytes: bytes.len() as u64, newest: i + 1 == ids.len() });
            }
            segments.push_back(Segment { id, bytes: good_bytes, frames });
        }
        let next_id = ids.last().map_or(0, |id| id + 1);
        Ok(SegmentLog {
            dir: dir.to_path_buf(),
            segments,
            next_id,
            active: None,
            directory_dirty: std::cell::Cell::new(false),
            unsynced: std::cell::Cell::new(false),
            synced_at: std::cell::Cell::new(None),
            tails,
        })
    }

    /// The segments that did not end in whole, checked frames when the log
    /// opened.
    pub fn tails(&self) -> &[Tail] {
        &self.tails
    }

    /// Cuts every segment [`SegmentLog::tails`] lists back to its last
    /// good frame, so that appends follow checked frames.
    pub fn cut_tails(&mut self) -> Result<()> {
        for tail in std::mem::take(&mut self.tails) {
            let file = OpenOptions::new().write(true).open(&tail.path).map_err(io)?;
            file.set_len(tail.good_bytes).map_err(io)?;
            file.sync_all().map_err(io)?;
        }
        Ok(())
    }

    /// Frames held.
    pub fn frames(&self) -> u64 {
        self.segments.iter().map(|s| s.frames.len() as u64).sum()
    }

    /// Records held.
    pub fn records(&self) -> u64 {
        self.segments.iter().flat_map(|s| &s.frames).map(|f| u64::from(f.records)).sum()
    }

    /// Bytes of the segments.
    pub fn bytes(&self) -> u64 {
        self.segments.iter().map(|s| s.bytes).sum()
    }

    /// Every frame, oldest first.
    pub fn iter_frames(&self) -> impl DoubleEndedIterator<Item = &Frame> {
        self.segments.iter().flat_map(|s| &s.frames)
    }

    /// Appends one frame per `(records, payload)`, where each payload
    /// starts with its stamp (f64 BE), in one write.
    pub fn append(&mut self, frames: impl IntoIterator<Item = (u32, Vec<u8>)>) -> Result<()> {
        let frames = frames.into_iter();
        let mut bytes = Vec::with_capacity(frames.size_hint().0 * (FRAME_HEADER + 6 * 1024));
        let mut added = Vec::new();
        let full = self.segments.back().is_none_or(|s| s.bytes >= SEGMENT_BYTES_MAX);
        if full || self.active.is_none() {
            self.start_segment(full)?;
        }
        let segment = self.segments.back_mut().expect("started above");
        for (records, payload) in frames {
            added.push(Frame { offset: segment.bytes + bytes.len() as u64, len: payload.len() as u32, records, stamp: stamp_of(&payload) });
            bytes.extend_from_slice(&encode(records, &payload));
        }
        self.active.as_mut().expect("opened above").write_all(&bytes).map_err(io)?;
        self.unsynced.set(true);
        segment.bytes += bytes.len() as u64;
        segment.frames.extend(added);
        Ok(())
    }

    /// Opens the newest segment for appends, after a new one if `new`.
    fn start_segment(&mut self, new: bool) -> Result<()> {
        if new {
            // What the full segment holds unsynced goes down before appends
            // move on (a sync reaches only the newest segment).
            if let Some(full) = &self.active
                && self.unsynced.get()
            {
                full.sync_data().map_err(io)?;
            }
            let id = self.next_id;
            self.next_id += 1;
            self.segments.push_back(Segment { id, bytes: 0, frames: Vec::new() });
            self.directory_dirty.set(true);
        }
        let id = self.segments.back().expect("one segment at least").id;
        let file = OpenOptions::new().create(true).append(true).open(segment_path(&self.dir, id)).map_err(io)?;
        self.active = Some(file);
        Ok(())
    }

    /// Makes every append durable.
    pub fn sync(&self) -> Result<()> {
        if self.unsynced.get()
            && let Some(active) = &self.active
        {
            active.sync_data().map_err(io)?;
        }
        if self.directory_dirty.replace(false) {
            sync_dir(&self.dir)?;
        }
        self.unsynced.set(false);
        self.synced_at.set(Some(std::time::Instant::now()));
        Ok(())
    }

    /// [`SegmentLog::sync`], unless it synced less than `interval` ago.
    pub fn sync_unless_within(&self, interval: std::time::Duration) -> Result<()> {
        if self.synced_at.get().is_some_and(|at| at.elapsed() < interval) {
            return Ok(());
        }
        self.sync()
    }

    /// Whether it holds appends not yet synced.
    pub fn unsynced(&self) -> bool {
        self.unsynced.get() || self.directory_dirty.get()
    }

    /// The payload of the `index`th frame, oldest first (its stamp first).
    pub fn payload(&self, index: usize) -> Result<Vec<u8>> {
        self.payloads_where(|(i, _)| i == index)?.pop().ok_or(Error::CorruptStore("no such segment frame"))
    }

    /// Every frame's payload, oldest first, skipping frames stamped
    /// before `since`.
    pub fn payloads_since(&self, since: f64) -> Result<Vec<Vec<u8>>> {
        self.payloads_where(|(_, frame)| frame.stamp >= since)
    }

    /// The payloads of the frames from the `first`th on, oldest first.
    pub fn payloads_from(&self, first: usize) -> Result<Vec<Vec<u8>>> {
        self.payloads_where(|(i, _)| i >= first)
    }

    /// The payloads of the frames `keep` keeps (given each frame's index,
    /// oldest first), reading each segment they are in once.
    fn payloads_where(&self, keep: impl Fn((usize, &Frame)) -> bool) -> Result<Vec<Vec<u8>>> {
        let mut payloads = Vec::new();
        let mut index = 0;
        for segment in &self.segments {
            let kept: Vec<&Frame> = segment.frames.iter().enumerate().filter(|&(i, frame)| keep((index + i, frame))).map(|(_, frame)| frame).collect();
            index += segment.frames.len();
            if kept.is_empty() {
                continue;
            }
            let bytes = std::fs::read(segment_path(&self.dir, segment.id)).map_err(io)?;
            for frame in kept {
                let at = (frame.offset as usize + FRAME_HEADER)..(frame.offset as usize + FRAME_HEADER + frame.len as usize);
                payloads.push(bytes.get(at).ok_or(Error::CorruptStore("segment frame"))?.to_vec());
            }
        }
        Ok(payloads)
    }

    /// Drops the oldest `drop` frames and, if `replace_next` is given,
    /// replaces the frame after them with `(records, payload)`: segments
    /// left empty are deleted, and the one the cut falls in is rewritten
    /// (to a temporary, synced, renamed over it).
    pub fn drop_front(&mut self, mut drop: usize, replace_next: Option<(u32, Vec<u8>)>) -> Result<()> {
        while let Some(first) = self.segments.front()
            && drop >= first.frames.len()
            && (self.segments.len() > 1 || replace_next.is_none())
        {
            drop -= first.frames.len();
            let first = self.segments.pop_front().expect("looked at above");
            if self.segments.is_empty() {
                self.active = None;
            }
            match std::fs::remove_file(segment_path(&self.dir, first.id)) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(e)),
                _ => self.directory_dirty.set(true),
            }
        }
        if drop == 0 && replace_next.is_none() {
            return self.sync();
        }
        let Some(segment) = self.segments.front() else { return self.sync() };
        let path = segment_path(&self.dir, segment.id);
        let old = std::fs::read(&path).map_err(io)?;
        let mut kept = &segment.frames[drop.min(segment.frames.len())..];
        let mut bytes = Vec::with_capacity(old.len());
        let mut frames = Vec::with_capacity(kept.len());
        if let Some((records, payload)) = replace_next {
            kept = kept.split_first().ok_or(Error::CorruptStore("no frame to replace"))?.1;
            frames.push(Frame { offset: 0, len: payload.len() as u32, records, stamp: stamp_of(&payload) });
            bytes.extend_from_slice(&encode(records, &payload));
        }
        for &frame in kept {
            let start = frame.offset as usize;
            let end = start + FRAME_HEADER + frame.len as usize;
            frames.push(Frame { offset: bytes.len() as u64, ..frame });
            bytes.extend_from_slice(old.get(start..end).ok_or(Error::CorruptStore("segment frame"))?);
        }
        crate::replace_file_durably(&path, &bytes).map_err(io)?;
        let is_active = self.segments.len() == 1;
        let segment = self.segments.front_mut().expect("looked at above");
        segment.bytes = bytes.len() as u64;
        segment.frames = frames;
        if is_active && self.active.is_some() {
            // The renamed file is a new inode: appends go to it.
            self.start_segment(false)?;
        }
        // The rename synced the directory; a deleted segment's removal
        // is synced here.
        self.sync()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn payload(newest: f64, body: &[u8]) -> Vec<u8> {
        let mut payload = newest.to_bits().to_be_bytes().to_vec();
        payload.extend_from_slice(body);
        payload
    }

    fn bodies(log: &SegmentLog) -> Vec<Vec<u8>> {
        log.payloads_since(f64::NEG_INFINITY).unwrap().into_iter().map(|p| p[8..].to_vec()).collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        #[test]
        fn appends_read_back_in_order_across_reopenings_and_a_cut_anywhere_keeps_the_frames_before_it(
            sizes in proptest::collection::vec(0usize..40_000, 1..60),
            cut_at in 0.0f64..1.0,
        ) {
            let scratch = tempfile::tempdir().unwrap();
            let mut log = SegmentLog::open(scratch.path()).unwrap();
            let written: Vec<Vec<u8>> = sizes.iter().enumerate().map(|(i, &n)| vec![(i % 251) as u8; n]).collect();
            for (i, body) in written.iter().enumerate() {
                log.append([(i as u32, payload(i as f64, body))]).unwrap();
            }
            log.sync().unwrap();
            prop_assert_eq!(bodies(&log), written.clone());
            drop(log);
            let log = SegmentLog::open(scratch.path()).unwrap();
            prop_assert!(log.tails().is_empty());
            prop_assert_eq!(bodies(&log), written.clone());
            prop_assert_eq!(log.iter_frames().map(|f| f.records).collect::<Vec<_>>(), (0..written.len() as u32).collect::<Vec<_>>());
            // Cut the newest segment anywhere: the frames before the cut stay.
            let newest = log.segments.back().unwrap();
            let path = segment_path(scratch.path(), newest.id);
            let length = std::fs::metadata(&path).unwrap().len();
            let cut = (length as f64 * cut_at) as u64;
            let whole_before = newest.frames.iter().filter(|f| f.offset + (FRAME_HEADER as u64) + u64::from(f.len) <= cut).count();
            let lost = newest.frames.len() - whole_before;
            drop(log);
            OpenOptions::new().write(true).open(&path).unwrap().set_len(cut).unwrap();
            let mut log = SegmentLog::open(scratch.path()).unwrap();
            prop_assert_eq!(bodies(&log), written[..written.len() - lost].to_vec());
            prop_assert_eq!(log.tails().len(), usize::from(log.segments.back().unwrap().bytes < cut));
            log.cut_tails().unwrap();
            log.append([(7, payload(1e9, b"after"))]).unwrap();
            drop(log);
            let log = SegmentLog::open(scratch.path()).unwrap();
            prop_assert!(log.tails().is_empty(), "appends follow the cut");
            prop_assert_eq!(bodies(&log).last().cloned(), Some(b"after".to_vec()));
        }

        #[test]
        fn dropping_the_front_keeps_exactly_the_frames_after_it(
            sizes in proptest::collection::vec(0usize..100_000, 1..30),
            drop_share in 0.0f64..1.0,
            replace in any::<bool>(),
        ) {
            let scratch = tempfile::tempdir().unwrap();
            let mut log = SegmentLog::open(scratch.path()).unwrap();
            let written: Vec<Vec<u8>> = sizes.iter().enumerate().map(|(i, &n)| vec![(i % 251) as u8; n]).collect();
            for (i, body) in written.iter().enumerate() {
                log.append([(1, payload(i as f64, body))]).unwrap();
            }
            let drop_count = ((written.len() as f64) * drop_share) as usize;
            let replace = replace && drop_count < written.len();
            let mut expected = written[drop_count..].to_vec();
            if replace {
                expected[0] = b"replaced".to_vec();
            }
            log.drop_front(drop_count, replace.then(|| (9, payload(-1.0, b"replaced")))).unwrap();
            prop_assert_eq!(bodies(&log), expected.clone());
            prop_assert_eq!(log.frames() as usize, expected.len());
            log.append([(1, payload(1e9, b"next"))]).unwrap();
            expected.push(b"next".to_vec());
            drop(log);
            let log = SegmentLog::open(scratch.path()).unwrap();
            prop_assert!(log.tails().is_empty());
            prop_assert_eq!(bodies(&log), expected);
        }
    }
}
