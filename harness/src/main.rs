//! `gpushare-bench` command-line entry point.

fn main() {
    eprintln!("gpushare-bench: not built yet");
    std::process::exit(1);
}
