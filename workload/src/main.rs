//! `gpushare-workload`: parse, run, print one error line, exit with the contract's code.

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use gpushare_workload::cli::{Cli, Command};
use gpushare_workload::error::exit;

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("GPUSHARE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .init();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(
                e.kind(),
                ErrorKind::DisplayHelp
                    | ErrorKind::DisplayVersion
                    | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            ) {
                let _ = e.print();
                return ExitCode::SUCCESS;
            }
            // One line: clap's first, without its usage block.
            let text = e.to_string();
            let first = text
                .lines()
                .next()
                .unwrap_or("bad arguments")
                .trim_start_matches("error: ");
            eprintln!("gpushare-workload: {first} (see --help)");
            return ExitCode::from(exit::BAD_ARGUMENTS as u8);
        }
    };
    let result = match &cli.command {
        None => gpushare_workload::serve::run(&cli.serve),
        Some(Command::Bench(args)) => gpushare_workload::bench::run(args),
        Some(Command::Llm(args)) => gpushare_workload::decoder::serve::run(args),
        Some(Command::ConvertWeights { src, dst }) => {
            gpushare_workload::weights::write_bf16_copy(src, dst).map(|out| {
                println!("wrote {}", out.display());
            })
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpushare-workload: {e}");
            ExitCode::from(e.exit_code() as u8)
        }
    }
}
