//! `gpushare-bench`: parse, run, print one error line, exit with its code. Signals are
//! handled here: the first SIGINT/SIGTERM/SIGHUP asks for a graceful stop (pods stopped,
//! node restored, finished cells kept), a second one forces it (no grace periods, but
//! children are still stopped).

use std::io::{IsTerminal, Write};
use std::process::ExitCode;

use clap::Parser;
use gpushare_bench::backend::k8s::manifests;
use gpushare_bench::config::cli::{CapacityArgs, Cli, Command, EqualLoadArgs, IsolationArgs, SweepArgs};
use gpushare_bench::config::options::ConfigFile;
use gpushare_bench::config::plan::SweepPlan;
use gpushare_bench::config::values::ListItemError;
use gpushare_bench::error::{BenchError, Result};
use gpushare_bench::process::supervisor;
use gpushare_bench::report::{self, RunData, compare, export};
use gpushare_bench::shutdown::Shutdown;
use gpushare_bench::sweep;
use gpushare_bench::tools::{doctor, overhead};
use gpushare_bench::{errln, outln};

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("GPUSHARE_LOG")
                // The Kubernetes client logs each failed request itself; the harness
                // reports them as its own errors (GPUSHARE_LOG=kube_client=debug shows them).
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,kube_client=off")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .init();
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => return clap_error(e),
    };
    if matches!(cli.command, Command::Reap) {
        // Single-threaded and small: it only waits for the harness to end.
        return ExitCode::from(supervisor::reap_main(std::io::stdin().lock()) as u8);
    }
    if matches!(
        cli.command,
        Command::Sweep(_) | Command::Isolation(_) | Command::Capacity(_) | Command::EqualLoad(_) | Command::Overhead(_)
    ) && let Err(e) = supervisor::start()
    {
        tracing::warn!("cannot start the process supervisor ({e}); children still die with the harness");
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            errln!("gpushare-bench: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let result = runtime.block_on(async {
        let shutdown = Shutdown::new();
        handle_signals(shutdown.clone());
        run(cli, &shutdown).await
    });
    // Everything was stopped on the way out: the supervisor has nothing to do.
    supervisor::done();
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            errln!("gpushare-bench: {e}");
            ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(1))
        }
    }
}

/// One line for a bad command line, in the same words as a bad config value:
/// "bad --pods `0`: pod counts go from 1 to 64".
fn clap_error(e: clap::Error) -> ExitCode {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        let _ = e.print();
        return ExitCode::SUCCESS;
    }
    // No subcommand: the help, and the exit code of a command line that does nothing.
    if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
        let _ = e.print();
        return ExitCode::from(2);
    }
    let text = |k| match e.get(k) {
        Some(ContextValue::String(s)) => Some(s.clone()),
        _ => None,
    };
    let line = match (e.kind(), text(ContextKind::InvalidArg), text(ContextKind::InvalidValue)) {
        (ErrorKind::ValueValidation, Some(arg), Some(value)) => {
            let flag = arg.split_whitespace().next().unwrap_or(&arg).to_string();
            let source = std::error::Error::source(&e);
            match source.and_then(|s| s.downcast_ref::<ListItemError>()) {
                Some(item) => format!("bad {flag} `{}`: {}", item.item, item.reason),
                None => format!(
                    "bad {flag} `{value}`: {}",
                    source.map_or("invalid value".into(), |s| s.to_string())
                ),
            }
        }
        (ErrorKind::MissingRequiredArgument, _, _) => match e.get(ContextKind::InvalidArg) {
            Some(ContextValue::Strings(args)) => format!("missing {}", args.join(", ")),
            _ => "a required argument is missing".to_string(),
        },
        _ => e
            .to_string()
            .lines()
            .next()
            .unwrap_or("bad arguments")
            .trim_start_matches("error: ")
            .to_string(),
    };
    // clap's own help for the mistake, in its words: a similar name ("tip: a similar
    // argument exists: '--strategies'") or the valid values.
    let rendered = e.to_string();
    let help: Vec<&str> = rendered
        .lines()
        .skip(1)
        .map(str::trim)
        .filter(|l| l.starts_with("tip:") || l.starts_with("[possible values:"))
        .collect();
    errln!("gpushare-bench: {line} (see --help)");
    for h in help {
        errln!("  {h}");
    }
    ExitCode::from(2)
}

/// The first SIGINT, SIGTERM or SIGHUP asks for a graceful stop; the next one forces it.
fn handle_signals(shutdown: Shutdown) {
    tokio::spawn(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let (Ok(mut int), Ok(mut term), Ok(mut hup)) = (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
            signal(SignalKind::hangup()),
        ) else {
            tracing::error!("cannot install signal handlers; Ctrl-C will not stop the run cleanly");
            return;
        };
        loop {
            let sig = tokio::select! {
                _ = int.recv() => libc::SIGINT,
                _ = term.recv() => libc::SIGTERM,
                _ = hup.recv() => libc::SIGHUP,
            };
            if shutdown.is_requested() {
                errln!("gpushare-bench: second signal: stopping now (children are killed, not waited for)");
                shutdown.force();
                return;
            }
            errln!(
                "gpushare-bench: stopping: pods and servers are being stopped; finished cells are kept (signal again to force)"
            );
            shutdown.request(sig);
        }
    });
}

/// Writes to stdout; a closed pipe (`| head`) is fine, any other failure is an error.
fn print_out(bytes: &[u8]) -> Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(BenchError::io("writing to stdout")(e)),
    }
}

async fn run(cli: Cli, shutdown: &Shutdown) -> Result<u8> {
    match cli.command {
        Command::Sweep(args) => run_sweep(*args, shutdown).await,
        Command::Isolation(args) => run_isolation(*args, shutdown).await,
        Command::Capacity(args) => run_capacity(*args, shutdown).await,
        Command::EqualLoad(args) => run_equal_load(*args, shutdown).await,
        Command::Reap => Ok(0),
        Command::Doctor(args) => {
            let checks = if args.kubernetes {
                gpushare_bench::tools::k8s_doctor::run(&args, shutdown).await?
            } else {
                doctor::checks(&doctor::gather())
            };
            print_out(doctor::render(&checks).as_bytes())?;
            Ok(u8::from(doctor::any_failed(&checks)))
        }
        Command::Overhead(args) => {
            let (result, path) = overhead::run(&args, shutdown).await?;
            print_out(overhead::render(&result).as_bytes())?;
            print_out(format!("results: {}\n", path.display()).as_bytes())?;
            Ok(0)
        }
        Command::Restore(args) => {
            let report = gpushare_bench::backend::k8s::session::restore_node(&args, shutdown).await?;
            print_out(report.render(&args.node).as_bytes())?;
            Ok(0)
        }
        Command::Manifests(args) => {
            gpushare_bench::config::plan::validate_image(&args.image)?;
            gpushare_bench::config::plan::validate_k8s_name("--node", &args.node, true)?;
            let n = manifests::write(&args.out, &args.image, &args.node, args.check)?;
            outln!(
                "{} {n} files in {}",
                if args.check { "checked" } else { "wrote" },
                args.out.display()
            );
            Ok(0)
        }
        Command::Report(args) => {
            let t = std::time::Instant::now();
            let index = report::write(&args.run_dir, args.out.as_deref())?;
            errln!("rendered in {:.0} ms", t.elapsed().as_secs_f64() * 1e3);
            outln!("report: {}", index.display());
            Ok(0)
        }
        Command::Export(args) => {
            let data = RunData::load(&args.run_dir)?;
            print_out(&export::for_format(args.format).export(&data)?)?;
            Ok(0)
        }
        Command::Verify(args) => {
            if args.rederive {
                for change in gpushare_bench::report::verify::rederive(&args.run_dir)? {
                    outln!("rederived {change}");
                }
            }
            let v = gpushare_bench::report::verify::verify_dir(&args.run_dir)?;
            for m in &v.mismatches {
                outln!("{m}");
            }
            if v.mismatches.is_empty() {
                outln!(
                    "verified {}: {} numbers of {} cells recomputed from their windows, all equal",
                    args.run_dir.display(),
                    v.numbers,
                    v.cells
                );
                Ok(0)
            } else {
                errln!(
                    "gpushare-bench: {} of {} numbers differ from the windows they came from",
                    v.mismatches.len(),
                    v.numbers
                );
                Ok(1)
            }
        }
        Command::HostNoise(args) => {
            let runs = args
                .run_dirs
                .iter()
                .map(|d| RunData::load(d))
                .collect::<gpushare_bench::error::Result<Vec<_>>>()?;
            // One plan on every host: what compare would accept against the first run.
            for r in runs.iter().skip(1) {
                compare::check_comparable(&runs[0], r)?;
            }
            let h = gpushare_bench::report::host_noise::measure(&runs)?;
            errln!(
                "between-host noise of {} over {} GPUs and {} cells: mean ±{:.2}%, p99 ±{:.2}%, throughput ±{:.2}%",
                h.gpu_name,
                h.runs.len(),
                h.cells,
                h.mean * 100.0,
                h.p99 * 100.0,
                h.throughput * 100.0
            );
            let line = serde_json::to_string(&h).map_err(|e| gpushare_bench::error::BenchError::Results {
                path: "host-noise".into(),
                reason: e.to_string(),
            })?;
            outln!("{line}");
            Ok(0)
        }
        Command::Compare(args) => {
            let cmp = compare::compare_dirs(
                &args.baseline,
                &args.candidate,
                &args.threshold,
                args.host_noise.as_deref(),
            )?;
            for notice in &cmp.notices {
                errln!("gpushare-bench: {notice}");
            }
            print_out(compare::render(&cmp.rows).as_bytes())?;
            match cmp.failure_summary() {
                Some(summary) => {
                    errln!("gpushare-bench: {summary}");
                    Ok(1)
                }
                None => Ok(0),
            }
        }
    }
}

/// The end of a run on the terminal: the cells whose numbers need care (unsettled, a pod
/// that could not keep up), then the report, rendered into the run directory unless
/// `--no-report`. Neither changes the run's exit code: its records are on disk already.
fn closing(dir: &std::path::Path, render: bool) {
    let Ok(data) = RunData::load(dir) else {
        return;
    };
    let flagged: Vec<String> = data
        .cells
        .iter()
        .filter(|c| c.is_aggregate())
        .filter_map(|c| {
            let flags = c.flags();
            (!flags.is_empty()).then(|| {
                format!(
                    "{} × {} (pass {}): {}",
                    c.arm().title(),
                    c.pods,
                    c.repeat,
                    flags.join("; ")
                )
            })
        })
        .collect();
    if !flagged.is_empty() {
        errln!("gpushare-bench: {} cells to read with care:", flagged.len());
        for f in &flagged {
            errln!("  {f}");
        }
    }
    if render {
        match report::write(dir, None) {
            Ok(index) => outln!("report: {}", index.display()),
            Err(e) => errln!(
                "gpushare-bench: the report was not rendered ({e}); `gpushare-bench report {}` tries again",
                dir.display()
            ),
        }
    }
}

async fn run_sweep(args: SweepArgs, shutdown: &Shutdown) -> Result<u8> {
    let file = args.config.as_deref().map(ConfigFile::read).transpose()?;
    let plan = SweepPlan::from_file_and_flags(file.as_ref(), args.options)?;
    if args.dry_run {
        print_out(sweep::dry_run(&plan)?.as_bytes())?;
        return Ok(0);
    }
    let progress = sweep::progress_for(args.quiet);
    let outcome = sweep::run(plan, args.resume.clone(), &*progress, shutdown).await?;
    if let Some(label) = &outcome.label {
        errln!("*** {label} ***");
    }
    outln!("results: {}", outcome.dir.display());
    closing(&outcome.dir, !args.no_report);
    let code = outcome.exit_code();
    match code {
        1 => errln!(
            "gpushare-bench: no cell could be measured ({} failed, {} unavailable); see {}/cells.csv",
            outcome.failed,
            outcome.unavailable,
            outcome.dir.display()
        ),
        3 => errln!(
            "gpushare-bench: partial: {} of {} cells failed (their notes say why); the others are saved",
            outcome.failed,
            outcome.failed + outcome.measured + outcome.unavailable
        ),
        _ => {}
    }
    Ok(code)
}

async fn run_isolation(args: IsolationArgs, shutdown: &Shutdown) -> Result<u8> {
    use gpushare_bench::isolation::command;
    let (resume, quiet, render) = (args.resume.clone(), args.quiet, !args.no_report);
    let plan = command::plan(args)?;
    let progress = sweep::progress_for(quiet);
    let outcome = command::run(plan, resume, &*progress, shutdown).await?;
    if let Some(label) = &outcome.label {
        errln!("*** {label} ***");
    }
    outln!("results: {}", outcome.dir.display());
    closing(&outcome.dir, render);
    let code = outcome.exit_code();
    match code {
        1 => errln!(
            "gpushare-bench: no victim could be measured; see {}/isolation.csv",
            outcome.dir.display()
        ),
        3 => errln!(
            "gpushare-bench: partial: the victim alone failed under {} (no baseline for its trials); the other records are saved",
            outcome.failed_baselines().join(", ")
        ),
        _ => {}
    }
    Ok(code)
}

async fn run_equal_load(args: EqualLoadArgs, shutdown: &Shutdown) -> Result<u8> {
    use gpushare_bench::equal_load::command;
    let (quiet, render) = (args.quiet, !args.no_report);
    let run = command::plan(args)?;
    let progress = sweep::progress_for(quiet);
    let outcome = command::run(run, &*progress, shutdown).await?;
    for (name, s) in &outcome.sweeps {
        if let Some(label) = &s.label {
            errln!("*** {name}: {label} ***");
        }
        // The cells to read with care, per sweep; each sweep's own report is the
        // run's report's business.
        closing(&s.dir, false);
    }
    outln!("results: {}", outcome.dir.display());
    if render {
        match report::write(&outcome.dir, None) {
            Ok(index) => outln!("report: {}", index.display()),
            Err(e) => errln!(
                "gpushare-bench: the report was not rendered ({e}); `gpushare-bench report {}` tries again",
                outcome.dir.display()
            ),
        }
    }
    let code = outcome.exit_code();
    match code {
        1 => errln!(
            "gpushare-bench: no cell could be measured; see each sweep's cells.csv under {}",
            outcome.dir.display()
        ),
        3 => errln!("gpushare-bench: partial: some cells failed (their notes say why); the others are saved"),
        _ => {}
    }
    Ok(code)
}

async fn run_capacity(args: CapacityArgs, shutdown: &Shutdown) -> Result<u8> {
    use gpushare_bench::capacity::command;
    let (resume, quiet, render) = (args.resume.clone(), args.quiet, !args.no_report);
    let plan = command::plan(args)?;
    let progress = sweep::progress_for(quiet);
    let outcome = command::run(plan, resume, &*progress, shutdown).await?;
    if let Some(label) = &outcome.sweep.label {
        errln!("*** {label} ***");
    }
    print_out(command::render(&outcome.records).as_bytes())?;
    outln!("results: {}", outcome.sweep.dir.display());
    closing(&outcome.sweep.dir, render);
    let code = outcome.sweep.exit_code();
    match code {
        1 => errln!(
            "gpushare-bench: no cell could be measured; see {}/cells.csv",
            outcome.sweep.dir.display()
        ),
        3 => errln!(
            "gpushare-bench: partial: {} cells failed (their notes say why); a failed count ends its strategy's search",
            outcome.sweep.failed
        ),
        _ => {}
    }
    Ok(code)
}
