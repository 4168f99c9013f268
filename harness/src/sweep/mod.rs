//! The sweep: dispatch to a backend's session (`backend::local::session`,
//! `backend::k8s::session`), then the generic [`runner`] over its cells. [`measure`]
//! measures one cell (I/O: waits and snapshots); [`cell`] turns what was measured into
//! the cell's rows (pure); [`progress`] is what the user sees meanwhile.

pub mod cell;
pub mod lanes;
pub mod measure;
pub mod progress;
pub mod runner;
#[cfg(test)]
mod runner_tests;

use std::path::PathBuf;

use crate::backend::{k8s, local};
use crate::config::plan::{BackendKind, BackendPlan, Sharing, SweepPlan};
use crate::domain::CellStatus;
use crate::error::{BenchError, Result};
use crate::results::record::CellRecord;
use crate::shutdown::Shutdown;
use crate::sweep::progress::{Bars, Lines, Progress, Quiet};

/// What a finished sweep reports.
#[derive(Debug, Clone)]
pub struct SweepOutcome {
    /// The run directory.
    pub dir: PathBuf,
    /// Cells saved in this invocation.
    pub cells_run: usize,
    /// The run's label when it is not a GPU measurement.
    pub label: Option<String>,
    /// Cells of the whole run (resumed ones included) that were measured (`ok`, `oom`,
    /// or `pending` with every pod waiting, as the exclusive baseline expects).
    pub measured: usize,
    /// Cells that failed (a pod crashed, never became ready, or the cell could not start).
    pub failed: usize,
    /// Cells whose strategy cannot run here.
    pub unavailable: usize,
}

impl SweepOutcome {
    /// The outcome of a run directory's cells, `ran` of them saved in this invocation.
    pub fn of(dir: &std::path::Path, label: Option<String>, cells: &[CellRecord], ran: usize) -> SweepOutcome {
        let count = |p: fn(CellStatus) -> bool| cells.iter().filter(|c| c.is_aggregate() && p(c.status)).count();
        SweepOutcome {
            dir: dir.to_path_buf(),
            cells_run: ran,
            label,
            measured: count(|s| matches!(s, CellStatus::Ok | CellStatus::Oom | CellStatus::Pending)),
            failed: count(|s| s == CellStatus::Failed),
            unavailable: count(|s| s == CellStatus::Unavailable),
        }
    }

    /// The exit code the command line documents: 0 every cell has a result, 3 some
    /// cells failed (partial), 1 no cell could be measured.
    pub fn exit_code(&self) -> u8 {
        match (self.measured, self.failed) {
            (0, _) => 1,
            (_, 0) => 0,
            _ => 3,
        }
    }
}

/// Progress on stderr: bars on a terminal, plain lines otherwise, nothing but messages
/// with `--quiet`.
pub fn progress_for(quiet: bool) -> Box<dyn Progress> {
    if quiet {
        Box::new(Quiet)
    } else if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        Box::new(Bars::new())
    } else {
        Box::new(Lines)
    }
}

/// Runs (or resumes) a sweep and returns its directory. `shutdown` is owned by the
/// caller (`main` wires it to the signals).
pub async fn run(
    plan: SweepPlan,
    resume: Option<String>,
    progress: &dyn Progress,
    shutdown: &Shutdown,
) -> Result<SweepOutcome> {
    if let Some(id) = &resume {
        check_resume(&plan, id)?;
    }
    match &plan.backend {
        BackendPlan::Local(l) => {
            let (session, first_gpu, more) = local::session::open_lanes(&plan, l, resume.as_deref())?;
            if more.is_empty() {
                return runner::run(session, progress, shutdown).await;
            }
            // `--gpus`: a lane of cells per GPU, in parallel.
            let settings = lanes::LaneSettings {
                measure: session.settings,
                source: |_: &local::LocalBackend, plan: &crate::results::record::PlanRecord| {
                    lanes::DirectSource::for_plan(plan)
                },
                paused: false,
            };
            lanes::run(session, first_gpu, more, settings, progress, shutdown).await
        }
        BackendPlan::Kubernetes(k) => match &k.sharing {
            Sharing::Dra(dra) => {
                let session = k8s::session::open_dra(&plan, k, dra, resume.as_deref(), shutdown).await?;
                runner::run(session, progress, shutdown).await
            }
            Sharing::DevicePlugin => {
                let session = k8s::session::open(&plan, k, resume.as_deref(), shutdown).await?;
                runner::run(session, progress, shutdown).await
            }
        },
    }
}

/// Checks a resume against the run it continues, before anything is opened or changed:
/// the command that made it, on the backend it was made with, and its server of the
/// user's own only when given again.
pub(crate) fn check_resume(plan: &SweepPlan, id: &str) -> Result<()> {
    crate::config::plan::validate_run_id(id)?;
    let path = plan.out.join(id).join("run.json");
    if !path.is_file() {
        return Err(BenchError::RunDir {
            path: plan.out.join(id),
            reason: format!(
                "no run to resume here (no run.json; runs are looked for in --out {})",
                plan.out.display()
            ),
        });
    }
    let run = crate::results::store::read_run(&path)?;
    if run.kind.command() != plan.kind.command() {
        return Err(BenchError::flag("--resume", id, run.kind.resume_hint()));
    }
    let recorded = run.plan.backend;
    // A recorded command runs only when the user gives it again, on either backend: a
    // run directory never makes the harness execute a command on its own.
    if plan.workload_cmd != run.plan.workload_cmd {
        let image = if recorded == BackendKind::Kubernetes {
            " and its --image"
        } else {
            ""
        };
        return Err(match (&run.plan.workload_cmd, &plan.workload_cmd) {
            (Some(cmd), _) => BenchError::flag(
                "--resume",
                id,
                format!(
                    "this run measured a server of your own: resume it with the same --workload-cmd {cmd:?}{image}"
                ),
            ),
            (None, given) => BenchError::flag(
                "--workload-cmd",
                given.as_deref().unwrap_or_default(),
                "this run measured gpushare-workload: resume it without --workload-cmd",
            ),
        });
    }
    // The same for an image's entrypoint: its arguments run again only when given again.
    if plan.server_args() != run.plan.server_args.as_ref() {
        return Err(match &run.plan.server_args {
            Some(args) => BenchError::flag(
                "--resume",
                id,
                format!(
                    "this run measured your server's image as it runs: resume it with --server-image and the same --workload-arg values {args:?}"
                ),
            ),
            None => BenchError::flag(
                "--server-image",
                plan.kubernetes().map_or("", |k| k.image.as_str()),
                "this run did not measure a server's image as it runs: resume it without --server-image",
            ),
        });
    }
    // What is given again must be what the run recorded (which is what the resume uses):
    // a different value would be ignored without a word.
    if let Some(given) = &plan.request
        && run.plan.request.as_ref() != Some(given)
    {
        let recorded = run.plan.request.as_ref().map_or("no --request".to_string(), |r| {
            format!(
                "--request {:?}{}{}",
                r.url,
                r.body
                    .as_ref()
                    .map_or(String::new(), |b| format!(" --body {}", b.display())),
                r.stream.as_ref().map_or(String::new(), |st| match &st.lengths_file {
                    Some(file) => format!(
                        " --stream {} --served-model {:?} --lengths {file} ({} pairs)",
                        st.api,
                        st.model,
                        st.lengths.len()
                    ),
                    None => format!(
                        " --stream {} --served-model {:?} --prompt-tokens {} --output-tokens {}",
                        st.api, st.model, st.prompt_tokens, st.output_tokens
                    ),
                })
            )
        });
        return Err(BenchError::flag(
            "--request",
            &given.url,
            format!("this run was made with {recorded}: resume it with the same, or leave it out"),
        ));
    }
    for (flag, given, recorded, default) in [
        (
            "--metric",
            &plan.metric,
            &run.plan.metric,
            crate::config::plan::DEFAULT_METRIC,
        ),
        (
            "--ready-path",
            &plan.ready_path,
            &run.plan.ready_path,
            crate::config::plan::DEFAULT_READY_PATH,
        ),
    ] {
        if given != default && given != recorded {
            return Err(BenchError::flag(
                flag,
                given,
                format!("this run was made with {flag} {recorded}: resume it with the same, or leave it out"),
            ));
        }
    }
    // A sweep's pod counts and passes are the run's too: other values given again
    // would be dropped without a word (a value equal to the default cannot be told
    // from one left out). Capacity and isolation set their own.
    let sweep = matches!(plan.kind, crate::config::plan::RunKind::Sweep);
    let default_pods = crate::config::plan::DEFAULT_PODS.to_vec();
    if sweep && plan.pods != default_pods && plan.pods != run.plan.pods {
        let list = |p: &[u32]| p.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
        return Err(BenchError::flag(
            "--pods",
            &list(&plan.pods),
            format!(
                "this run was made with --pods {}: resume it with the same, or leave it out",
                list(&run.plan.pods)
            ),
        ));
    }
    let default_repeat = if plan.target.is_some() {
        crate::config::plan::DEFAULT_TARGET_PASSES
    } else {
        1
    };
    if sweep && plan.repeat != default_repeat && plan.repeat != run.plan.repeat {
        return Err(BenchError::flag(
            "--repeat",
            &plan.repeat.to_string(),
            format!(
                "this run was made with --repeat {}: resume it with the same, or leave it out",
                run.plan.repeat
            ),
        ));
    }
    // A precision target and its budget are the run's: a resume keeps them.
    if let Some(t) = plan.target
        && run.plan.target != Some(t)
    {
        return Err(BenchError::flag(
            "--target",
            &crate::sweep::runner::percent(t),
            match run.plan.target {
                Some(r) => format!(
                    "this run was made with --target {}: resume it with the same, or leave it out",
                    crate::sweep::runner::percent(r)
                ),
                None => "this run was made without a precision target (a fixed number of passes): resume it without --target".into(),
            },
        ));
    }
    if let Some(b) = plan.budget
        && run.plan.budget_s != Some(b.as_secs_f64())
    {
        return Err(BenchError::flag(
            "--budget",
            &format!("{}s", b.as_secs_f64()),
            match run.plan.budget_s {
                Some(r) => format!(
                    "this run was made with --budget {r}s (counted again from the resume): resume it with the same, or leave it out"
                ),
                None => "this run was made without a budget: resume it without --budget".into(),
            },
        ));
    }
    if plan.sharing_api() != run.plan.sharing_api {
        return Err(BenchError::flag(
            "--resume",
            id,
            format!(
                "this run shared the GPU through {}: resume it with --sharing-api {}",
                run.plan.sharing_api, run.plan.sharing_api
            ),
        ));
    }
    match (recorded, plan.backend_kind()) {
        (BackendKind::Kubernetes, BackendKind::Local) => Err(BenchError::flag(
            "--resume",
            id,
            "this run was made with the Kubernetes backend: resume it with --backend kubernetes --node NODE",
        )),
        (BackendKind::Local, BackendKind::Kubernetes) => Err(BenchError::flag(
            "--resume",
            id,
            "this run was made with the local backend: resume it without --backend kubernetes",
        )),
        _ => Ok(()),
    }
}

/// What a sweep would do, and changes nothing; what the sweep would refuse (a device
/// that is not there), it refuses.
pub fn dry_run(plan: &SweepPlan) -> Result<String> {
    match &plan.backend {
        BackendPlan::Kubernetes(k) => Ok(k8s::session::dry_run(plan, k)),
        BackendPlan::Local(l) if !l.gpus.is_empty() => {
            // Every arm costs its cells here; the sweep also counts what cannot run.
            let record = crate::results::record::PlanRecord::from_plan(
                plan,
                crate::domain::DeviceKind::Cuda,
                crate::domain::Source::Scrape,
            );
            let cells = (record.pods.len() as u64) * u64::from(record.repeat.max(1));
            let lanes = lanes::assign(&record.arms(), l.gpus.len(), |_| cells, |_| None);
            let mut out = String::from("cells spread over the GPUs (--gpus), one cell per GPU at a time:\n");
            for (gpu, arms) in l.gpus.iter().zip(lanes) {
                let names: Vec<String> = arms.iter().map(|a| a.title()).collect();
                out += &format!("  GPU {gpu}: {}\n", names.join(", "));
            }
            Ok(out
                + "each GPU's pods as the first GPU's below, with its own UUID:\n"
                + &local::session::dry_run(plan, l)?)
        }
        BackendPlan::Local(l) => local::session::dry_run(plan, l),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::options::SweepOptions;

    /// A recorded Kubernetes run of a server's image, in `out/img/run.json`.
    fn recorded_image_run(out: &std::path::Path) {
        let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/h100-run/run.json");
        let mut run: crate::results::record::RunRecord =
            serde_json::from_str(&std::fs::read_to_string(fixture).expect("fixture")).expect("run.json");
        run.run_id = "img".into();
        run.plan.backend = BackendKind::Kubernetes;
        run.plan.server_args = Some(vec!["--port={port}".into()]);
        std::fs::create_dir_all(out.join("img")).expect("mkdir");
        std::fs::write(out.join("img/run.json"), serde_json::to_vec(&run).expect("json")).expect("write");
    }

    #[test]
    fn an_images_entrypoint_runs_again_only_when_given_again() {
        let dir = tempfile::tempdir().expect("tmp");
        recorded_image_run(dir.path());
        let plan = |server_image: Option<&str>, args: &[&str]| {
            SweepPlan::from_options(SweepOptions {
                backend: Some(BackendKind::Kubernetes),
                node: Some("gpu-1".into()),
                out: Some(dir.path().to_path_buf()),
                server_image: server_image.map(String::from),
                workload_args: args.iter().map(|a| a.to_string()).collect(),
                ..SweepOptions::default()
            })
            .expect("plan")
        };
        let resume = |p: &SweepPlan| check_resume(p, "img").map_err(|e| e.to_string());
        assert_eq!(resume(&plan(Some("me/s:1"), &["--port={port}"])), Ok(()));
        for p in [plan(None, &[]), plan(Some("me/s:1"), &["--port=1"])] {
            let e = resume(&p).expect_err("refused");
            assert!(
                e.contains("resume it with --server-image and the same --workload-arg values [\"--port={port}\"]"),
                "{e}"
            );
        }
    }

    #[test]
    fn a_resume_keeps_the_recorded_precision_target_and_budget() {
        let dir = tempfile::tempdir().expect("tmp");
        recorded_image_run(dir.path());
        let path = dir.path().join("img/run.json");
        let mut run: crate::results::record::RunRecord =
            serde_json::from_str(&std::fs::read_to_string(&path).expect("run.json")).expect("parse");
        run.plan.target = Some(0.01);
        run.plan.budget_s = Some(600.0);
        std::fs::write(&path, serde_json::to_vec(&run).expect("json")).expect("write");
        let resume = |target: Option<&str>, budget: Option<&str>| {
            let o: SweepOptions = toml::from_str(&format!(
                "backend = \"kubernetes\"\nnode = \"gpu-1\"\nserver_image = \"me/s:1\"\nworkload_args = [\"--port={{port}}\"]\nout = {:?}\n{}{}",
                dir.path().display().to_string(),
                target.map_or(String::new(), |t| format!("target = \"{t}\"\n")),
                budget.map_or(String::new(), |b| format!("budget = \"{b}\"\n")),
            ))
            .expect("options");
            check_resume(&SweepPlan::from_options(o).expect("plan"), "img").map_err(|e| e.to_string())
        };
        assert_eq!(resume(None, None), Ok(()));
        assert_eq!(resume(Some("1%"), Some("10m")), Ok(()));
        let e = resume(Some("2%"), None).expect_err("another target");
        assert!(e.contains("--target") && e.contains("made with --target 1%"), "{e}");
        let e = resume(Some("1%"), Some("5m")).expect_err("another budget");
        assert!(e.contains("--budget") && e.contains("made with --budget 600s"), "{e}");
    }

    #[test]
    fn a_resume_refuses_other_pods_or_passes_than_the_runs() {
        let dir = tempfile::tempdir().expect("tmp");
        recorded_image_run(dir.path());
        let recorded: crate::results::record::RunRecord =
            serde_json::from_str(&std::fs::read_to_string(dir.path().join("img/run.json")).expect("read"))
                .expect("run");
        let resume = |extra: &str| {
            let o: SweepOptions = toml::from_str(&format!(
                "backend = \"kubernetes\"\nnode = \"gpu-1\"\nserver_image = \"me/s:1\"\nworkload_args = [\"--port={{port}}\"]\nout = {:?}\n{extra}",
                dir.path().display().to_string(),
            ))
            .expect("options");
            check_resume(&SweepPlan::from_options(o).expect("plan"), "img").map_err(|e| e.to_string())
        };
        let pods: Vec<String> = recorded.plan.pods.iter().map(u32::to_string).collect();
        assert_eq!(resume(&format!("pods = [{}]\n", pods.join(", "))), Ok(()));
        assert_eq!(resume(&format!("repeat = {}\n", recorded.plan.repeat)), Ok(()));
        let e = resume("pods = [2]\n").expect_err("other pods");
        assert!(
            e.contains("--pods") && e.contains(&format!("made with --pods {}", pods.join(","))),
            "{e}"
        );
        let e = resume(&format!("repeat = {}\n", recorded.plan.repeat + 2)).expect_err("other passes");
        assert!(e.contains("--repeat") && e.contains("made with --repeat"), "{e}");
    }
}
