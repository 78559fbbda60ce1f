//! The `slogate` binary. See `slogate --help`.
#![forbid(unsafe_code)]

/// mimalloc: the node allocates per query on the routing and gRPC threads,
/// where glibc's malloc took about a third of the routing thread.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    std::process::exit(slogate::cli::main(std::env::args_os()));
}
