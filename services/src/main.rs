//! The `slogate` binary. See `slogate --help`.
#![forbid(unsafe_code)]

fn main() {
    std::process::exit(slogate::cli::main(std::env::args_os()));
}
