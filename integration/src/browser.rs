//! Headless Chromium (Debian's `chromium`; `SLOGATE_CHROMIUM` names
//! another) for the console's tests: the DOM after the page's scripts ran,
//! and screenshots. Every connection but loopback is off (no background
//! networking, component updates or sync), and each run has a profile of
//! its own.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The browser.
///
/// # Panics
///
/// If it is not installed, saying how to install it.
pub fn chromium_binary() -> PathBuf {
    let path = std::env::var_os("SLOGATE_CHROMIUM").map_or_else(|| PathBuf::from("/usr/bin/chromium"), PathBuf::from);
    assert!(path.exists(), "{} is missing: install Debian's chromium (apt-get install chromium; .ci/run does) or set SLOGATE_CHROMIUM", path.display());
    path
}

/// Runs the browser headless on `url`, the page getting
/// `virtual_time_budget_ms` of virtual time (its timers run that long;
/// time stands still while a request is out), with `args`; returns its
/// standard output. Blocks: call it off an async runtime's threads.
///
/// # Panics
///
/// If the browser is missing or fails.
pub fn headless(url: &str, virtual_time_budget_ms: u32, args: &[&str]) -> String {
    let profile = std::env::temp_dir().join(format!("slogate-chromium-{}-{}", std::process::id(), unique()));
    let output = Command::new(chromium_binary())
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run"])
        .args(["--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars"])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("--virtual-time-budget={virtual_time_budget_ms}"))
        .args(args)
        .arg(url)
        .output()
        .expect("chromium runs");
    std::fs::remove_dir_all(&profile).ok();
    assert!(output.status.success(), "chromium failed: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).expect("the DOM is UTF-8")
}

/// The page's DOM once its scripts have had `virtual_time_budget_ms`.
pub fn dom(url: &str, virtual_time_budget_ms: u32) -> String {
    headless(url, virtual_time_budget_ms, &["--dump-dom"])
}

/// Saves a `width`×`height` screenshot of the page to `path` (PNG).
///
/// # Panics
///
/// If the browser fails or writes no PNG of that size.
pub fn screenshot(url: &str, virtual_time_budget_ms: u32, (width, height): (u32, u32), path: &Path) {
    std::fs::remove_file(path).ok();
    headless(url, virtual_time_budget_ms, &[&format!("--window-size={width},{height}"), &format!("--screenshot={}", path.display())]);
    let bytes = std::fs::read(path).expect("the screenshot is written");
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "a PNG");
    let size = |at: usize| u32::from_be_bytes(bytes[at..at + 4].try_into().expect("four bytes"));
    assert_eq!((size(16), size(20)), (width, height), "the screenshot's size");
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}
