//! `slogate-bare-gateway`: a tonic server that implements
//! `slogate.v1.Gateway` and answers every Submit at once. It is the
//! baseline of `slogate-loadgen bench-gateway`: what this machine's gRPC
//! stack does with no gateway behind it.
#![forbid(unsafe_code)]

use clap::Parser;

/// A Gateway server with nothing behind it, for benchmarks.
#[derive(Debug, Parser)]
#[command(name = "slogate-bare-gateway", version, about)]
struct Cli {
    /// Where to listen (port 0 picks a free one; the bound address is
    /// logged as `grpc_addr=HOST:PORT` on standard error).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: std::net::SocketAddr,
}

/// mimalloc: the bare server takes the node's allocator, so the two stacks compare like for like.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            std::process::exit(if e.use_stderr() { 2 } else { 0 });
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    let code = runtime.block_on(async {
        let listener = match tokio::net::TcpListener::bind(cli.listen).await {
            Ok(listener) => listener,
            Err(e) => {
                eprintln!("error: cannot listen on {}: {e}", cli.listen);
                return 1;
            }
        };
        match listener.local_addr() {
            Ok(address) => eprintln!("listening grpc_addr={address}"),
            Err(e) => {
                eprintln!("error: {e}");
                return 1;
            }
        }
        match slogate_loadgen::bench::serve_bare(listener).await {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("error: {e}");
                1
            }
        }
    });
    std::process::exit(code);
}
