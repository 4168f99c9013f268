//! `gpushare-bench`: parse, run, print one error line, exit with its code.

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use gpushare_bench::backend::Backend;
use gpushare_bench::cli::{Cli, Command, ExportFormat, OverheadArgs, SweepArgs};
use gpushare_bench::error::{BenchError, Result};
use gpushare_bench::plan::{SweepOptions, SweepPlan, default_run_id, validate_run_id};
use gpushare_bench::{doctor, gpu, local, overhead, report, sweep};

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("GPUSHARE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .init();
    let cli = match Cli::try_parse() {
        Ok(c) => c,
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
            let text = e.to_string();
            let first = text
                .lines()
                .next()
                .unwrap_or("bad arguments")
                .trim_start_matches("error: ");
            eprintln!("gpushare-bench: {first} (see --help)");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("gpushare-bench: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let result = runtime.block_on(run(cli));
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("gpushare-bench: {e}");
            ExitCode::from(e.exit_code() as u8)
        }
    }
}

async fn run(cli: Cli) -> Result<u8> {
    match cli.command {
        Command::Sweep(args) => run_sweep(*args).await,
        Command::Doctor => {
            let checks = doctor::checks(&doctor::gather());
            for c in &checks {
                println!("{c}");
            }
            Ok(if checks.iter().any(|c| c.verdict == doctor::Verdict::Fail) {
                1
            } else {
                0
            })
        }
        Command::Overhead(args) => run_overhead(args).await,
        Command::Manifests(args) => {
            let n = gpushare_bench::k8s::manifests::write(&args.out, &args.image, args.check)?;
            println!(
                "{} {n} files in {}",
                if args.check { "checked" } else { "wrote" },
                args.out.display()
            );
            Ok(0)
        }
        Command::Report(args) => {
            let t = std::time::Instant::now();
            let index = report::write(&args.run_dir, &args.out)?;
            eprintln!("rendered in {:.0} ms", t.elapsed().as_secs_f64() * 1e3);
            println!("report: {}", index.display());
            Ok(0)
        }
        Command::Export(args) => {
            let data = report::RunData::load(&args.run_dir)?;
            let text = match args.format {
                ExportFormat::Csv => {
                    String::from_utf8(gpushare_bench::store::cells_csv(&data.cells)?).unwrap_or_default()
                }
                ExportFormat::Json => {
                    let v = serde_json::json!({ "run": data.run, "cells": data.cells });
                    serde_json::to_string_pretty(&v).unwrap_or_default() + "\n"
                }
                ExportFormat::Markdown => report::tables::markdown(&data, &report::tables::all(&data)),
            };
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            // A closed pipe (`| head`) is not an error worth a message.
            let _ = out.write_all(text.as_bytes());
            Ok(0)
        }
        Command::Compare(args) => {
            let threshold = report::compare::parse_threshold(&args.threshold)?;
            let base = report::RunData::load(&args.baseline)?;
            let cand = report::RunData::load(&args.candidate)?;
            let rows = report::compare::compare(&base, &cand, threshold);
            if rows.is_empty() {
                return Err(BenchError::Results {
                    path: args.candidate.clone(),
                    reason: format!("shares no cell with {}", args.baseline.display()),
                });
            }
            print!("{}", report::compare::render(&rows));
            let regressed = rows.iter().filter(|r| !r.regressions.is_empty()).count();
            if regressed > 0 {
                eprintln!("gpushare-bench: {regressed} of {} cells regressed", rows.len());
                Ok(1)
            } else {
                Ok(0)
            }
        }
    }
}

async fn run_sweep(args: SweepArgs) -> Result<u8> {
    let file = match &args.config {
        Some(path) => SweepOptions::from_file(path)?,
        None => SweepOptions::default(),
    };
    let plan = SweepPlan::from_options(file.overridden_by(args.options()))?;
    if args.dry_run {
        print!(
            "{}",
            match plan.backend {
                gpushare_bench::plan::BackendKind::Kubernetes => gpushare_bench::k8s::sweep::dry_run(&plan),
                gpushare_bench::plan::BackendKind::Local => sweep::dry_run_local(&plan),
            }
        );
        return Ok(0);
    }
    let outcome = sweep::run(plan, args.run_id.clone(), args.resume.clone(), args.quiet).await?;
    if let Some(label) = &outcome.label {
        eprintln!("*** {label} ***");
    }
    println!("results: {}", outcome.dir.display());
    Ok(0)
}

async fn run_overhead(args: OverheadArgs) -> Result<u8> {
    let dur = |flag: &str, v: &str| humantime::parse_duration(v).map_err(|e| BenchError::flag(flag, v, e.to_string()));
    let (phase, interval, warmup) = (
        dur("--phase", &args.phase)?,
        dur("--interval", &args.interval)?,
        dur("--warmup", &args.warmup)?,
    );
    if args.repeats == 0 || phase < interval * 2 {
        return Err(BenchError::flag(
            "--phase",
            &args.phase,
            "each phase needs at least two scrape intervals, and --repeats ≥ 1",
        ));
    }
    let inventory = gpu::probe();
    let choice = match args.device.as_str() {
        "auto" => gpushare_bench::plan::DeviceChoice::Auto,
        "cuda" => gpushare_bench::plan::DeviceChoice::Cuda,
        "cpu" => gpushare_bench::plan::DeviceChoice::Cpu,
        other => return Err(BenchError::flag("--device", other, "expected auto, cuda or cpu")),
    };
    let device = sweep::resolve_device(choice, &inventory, sweep::libcuda_present())?;
    let precision = match (device, args.precision.clone()) {
        (gpushare_bench::domain::DeviceKind::Cpu, _) => "fp32".to_string(),
        (_, Some(p)) => p,
        (_, None) => "bf16".into(),
    };
    let gpu_name = inventory
        .gpus
        .first()
        .map(|g| g.name.clone())
        .filter(|_| device == gpushare_bench::domain::DeviceKind::Cuda);
    let short = gpu_name
        .as_ref()
        .and(inventory.gpus.first())
        .map_or("cpu".into(), |g| g.short_name());
    let id = args.run_id.clone().unwrap_or_else(|| {
        format!(
            "overhead-{}",
            default_run_id(&gpushare_bench::record::now_rfc3339(), &short)
        )
    });
    validate_run_id(&id)?;
    let dir = args.out.join(&id);
    std::fs::create_dir_all(dir.join("logs")).map_err(BenchError::io(format!("creating {}", dir.display())))?;
    let workload = local::find_workload(args.workload_bin.as_deref())?;
    let command = local::WorkloadCommand {
        binary: workload,
        args: vec![
            "--model".into(),
            args.model.clone(),
            "--device".into(),
            device.name().into(),
            "--precision".into(),
            precision.clone(),
        ],
    };
    let mut backend = local::LocalBackend::new(command, device, inventory, &dir, None);
    let cancel = tokio_util::sync::CancellationToken::new();
    sweep::cancel_on_signals(cancel.clone());
    backend.launch(overhead::STRATEGY, 1).await?;
    eprintln!(
        "overhead: {} phases of {} s each, alternating no scraping / scraping every {} s",
        args.repeats * 2,
        phase.as_secs(),
        interval.as_secs_f64()
    );
    let result = overhead::measure(
        &mut backend,
        (&args.model, device, &precision, gpu_name),
        warmup,
        phase,
        args.repeats,
        interval,
        &cancel,
    )
    .await;
    backend.restore().await?;
    let result = result?;
    for p in &result.phases {
        println!(
            "{:<14} {:>7.1} s {:>9} inferences {:>9.2} inf/s",
            if p.scraping { "scraping 1/s" } else { "no scraping" },
            p.seconds,
            p.inferences,
            p.throughput_per_s
        );
    }
    println!(
        "without scraping {:.2} inf/s (spread {:.2}%), with {:.2} inf/s (spread {:.2}%): difference {:+.2}%",
        result.throughput_without,
        result.spread_without_pct,
        result.throughput_with,
        result.spread_with_pct,
        result.difference_pct
    );
    let json = serde_json::to_vec_pretty(&result).map_err(|e| BenchError::Results {
        path: dir.join("overhead.json"),
        reason: e.to_string(),
    })?;
    gpushare_bench::store::write_atomic(&dir.join("overhead.json"), &json)?;
    println!("results: {}", dir.join("overhead.json").display());
    Ok(0)
}
