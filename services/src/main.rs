//! The `slogate` binary. See `slogate --help`.
#![forbid(unsafe_code)]

/// mimalloc: the node allocates per query on the routing and gRPC threads,
/// where glibc's malloc took about a third of the routing thread.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    disable_transparent_huge_pages();
    std::process::exit(slogate::cli::main(std::env::args_os()));
}

/// Turns transparent huge pages off for this process (`PR_SET_THP_DISABLE`;
/// `THP_enabled: 0` in `/proc/PID/status`). Under load a node takes fresh
/// memory often, and the first touch of a huge page zeroes 2 MiB in the
/// page fault: on this project's virtual machines that held the routing
/// thread for 10–40 ms at a time, 4% of the event-loop lag probes waited
/// longer than 10 ms, and least-loaded's p99 at 128 clients was 3.4–3.8×
/// the bare server's; without huge pages, none over 10 ms and 0.9–1.2×
/// (README, "Benchmarks"). The workspace also builds mimalloc with
/// `no_thp`, so it never asks for huge pages; this covers hosts whose THP
/// setting is `always`. A kernel without the call keeps them.
#[cfg(target_os = "linux")]
fn disable_transparent_huge_pages() {
    let _ = nix::sys::prctl::set_thp_disable(true);
}

#[cfg(not(target_os = "linux"))]
fn disable_transparent_huge_pages() {}
