//! The PromQL path against a real Prometheus server (Debian's `prometheus`, which
//! `make test` installs): CPU workload pods scraped by a private server, the same cell
//! read through both sources (the production snapshot path, under load), Prometheus'
//! histogram_quantile against ours, the reference study's query unchanged, an existing
//! server by URL, and a server killed mid-cell.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use gpushare_bench::backend::local::{LocalBackend, WorkloadCommand};
use gpushare_bench::backend::{Backend, PodState};
use gpushare_bench::domain::{CellStatus, DeviceKind, Source, Strategy};
use gpushare_bench::metrics::prometheus::query::{self as promql, REFERENCE_STUDY_MEAN, Selector};
use gpushare_bench::metrics::prometheus::{PrometheusServer, PrometheusSource, instance_of};
use gpushare_bench::metrics::scrape::ScrapeSource;
use gpushare_bench::metrics::{MetricsSource, Target};
use gpushare_bench::results::store::{read_cells, read_run};
use gpushare_bench::shutdown::Shutdown;
use gpushare_bench::stats::Histogram;
use gpushare_bench::telemetry::GpuInventory;

mod common;
use common::{alive, children};

const BENCH: &str = env!("CARGO_BIN_EXE_gpushare-bench");

fn workload() -> WorkloadCommand {
    let binary = Path::new(BENCH).with_file_name("gpushare-workload");
    assert!(binary.is_file(), "build the workspace first (`make test` does)");
    WorkloadCommand::builtin(
        binary,
        ["--model", "tiny", "--device", "cpu", "--precision", "fp32"]
            .map(String::from)
            .to_vec(),
    )
}

fn epoch() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

async fn launch(dir: &Path, pods: u32) -> (LocalBackend, Vec<Target>) {
    std::fs::create_dir_all(dir.join("logs")).expect("logs");
    let mut b = LocalBackend::new(workload(), DeviceKind::Cpu, GpuInventory::default(), dir, None);
    b.launch(Strategy::TimeSlicing, pods, &[], &Shutdown::new())
        .await
        .expect("launch");
    let ready = b
        .wait_ready(Duration::from_secs(60), &Shutdown::new())
        .await
        .expect("ready");
    assert!(ready.iter().all(|p| p.state == PodState::Running), "{ready:?}");
    let targets = ready
        .iter()
        .map(|p| Target {
            pod: p.name.clone(),
            url: p.metrics_url.clone().expect("url"),
        })
        .collect();
    (b, targets)
}

/// The raw cumulative histogram of the selected series as Prometheus had it at `at`.
async fn histogram_at(prom: &PrometheusSource, sel: &Selector, at: f64) -> Histogram {
    let query = |metric: &'static str| async move {
        prom.client()
            .query(&promql::raw(metric, sel), Some(at))
            .await
            .expect(metric)
    };
    let mut buckets: Vec<(f64, f64)> = query("inference_time_seconds_bucket")
        .await
        .iter()
        .map(|s| {
            (
                gpushare_bench::metrics::exposition::parse_value(&s.metric["le"]).expect("le"),
                s.value,
            )
        })
        .collect();
    buckets.sort_by(|x, y| x.0.total_cmp(&y.0));
    let total = |v: Vec<gpushare_bench::metrics::prometheus::VectorSample>| v.iter().map(|s| s.value).sum();
    Histogram {
        buckets,
        sum: total(query("inference_time_seconds_sum").await),
        count: total(query("inference_time_seconds_count").await),
    }
}

/// One pod's snapshot through the production path ([`MetricsSource::snapshot`], which
/// reads every target at one evaluation time), with how long ago its sample was scraped.
async fn production(prom: &PrometheusSource, targets: &[Target], pod: &str) -> (Histogram, Duration) {
    let snaps = prom.snapshot(targets).await.expect("snapshot");
    let (_, snap) = snaps.into_iter().find(|(p, _)| p == pod).expect("the pod");
    let snap = snap.expect("its series");
    (snap.latency, tokio::time::Instant::now().duration_since(snap.at))
}

/// Snapshots one pod from both sources at the same instant: the direct scrape is made
/// at the moment of one of Prometheus' scrapes of it (every second, at a phase read from
/// its sample timestamps), and the production snapshot is taken half a second later,
/// when that scrape is the pod's latest sample.
async fn aligned_production(
    prom: &PrometheusSource,
    scrape: &ScrapeSource,
    targets: &[Target],
    t: &Target,
) -> (Histogram, Histogram) {
    let sel = Selector {
        equal: vec![("instance".into(), instance_of(&t.url))],
        one_of: None,
    };
    let ts = prom
        .client()
        .value(&promql::sample_time("inference_time_seconds_count", &sel))
        .await
        .expect("timestamp");
    let next = ts + (epoch() - ts).ceil() + 1.0;
    tokio::time::sleep(Duration::from_secs_f64((next - epoch()).max(0.0))).await;
    let direct = scrape.scrape(t).await.expect("scrape").latency;
    tokio::time::sleep(Duration::from_secs_f64((next + 0.5 - epoch()).max(0.0))).await;
    let (via, age) = production(prom, targets, &t.pod).await;
    // About half a second: dated by its scrape, not by the query (a snapshot that lost the
    // scrape times reads about 0).
    assert!(
        age > Duration::from_millis(300) && age < Duration::from_millis(950),
        "{}: the latest sample is {age:?} old, not about 500 ms",
        t.pod
    );
    (direct, via)
}

/// Issue 13, item 3: the cell a sweep computes from Prometheus is the one it computes
/// from the pods, through the code a sweep runs, with every core busy (three CPU pods
/// in closed loops beside the server on this 2-core machine).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_production_snapshot_agrees_with_a_direct_scrape_under_load() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut backend, targets) = launch(dir.path(), 3).await;
    let prom = PrometheusSource::spawn(dir.path(), &Shutdown::new())
        .await
        .expect("spawn prometheus");
    prom.prepare(&targets, &Shutdown::new()).await.expect("targets up");

    // Snapshots at phases that drift against the 1 s scrapes: every series of a pod
    // comes from one scrape (its +Inf bucket is its count), and nothing goes backwards.
    let mut last: Vec<f64> = vec![0.0; targets.len()];
    for _ in 0..16 {
        let snaps = prom.snapshot(&targets).await.expect("snapshot");
        for (i, (pod, snap)) in snaps.into_iter().enumerate() {
            let h = snap.expect("series").latency;
            let inf = h.buckets.last().map(|b| (b.0, b.1)).expect("buckets");
            assert!(inf.0.is_infinite(), "{pod}: last bucket {inf:?}");
            assert_eq!(inf.1, h.count, "{pod}: +Inf bucket and count from two scrapes");
            assert!(h.count >= last[i], "{pod}: count went back {} → {}", last[i], h.count);
            last[i] = h.count;
        }
        tokio::time::sleep(Duration::from_millis(370)).await;
    }

    let scrape = ScrapeSource::default();
    let mut first = Vec::new();
    for t in &targets {
        first.push(aligned_production(&prom, &scrape, &targets, t).await);
    }
    tokio::time::sleep(Duration::from_secs(10)).await;
    let (mut total_direct, mut total_prom): (Option<Histogram>, Option<Histogram>) = (None, None);
    for (t, (d0, p0)) in targets.iter().zip(&first) {
        let (d1, p1) = aligned_production(&prom, &scrape, &targets, t).await;
        let (dd, pd) = (d1.delta(d0).expect("monotonic"), p1.delta(p0).expect("monotonic"));
        assert!(dd.count > 100.0, "{} inferences", dd.count);
        let rel = (dd.mean() / pd.mean() - 1.0).abs();
        let counts = (dd.count / pd.count - 1.0).abs();
        println!(
            "{}: mean {:.4} ms direct, {:.4} ms via Prometheus ({:.3}% apart); {} vs {} inferences",
            t.pod,
            dd.mean() * 1e3,
            pd.mean() * 1e3,
            rel * 100.0,
            dd.count,
            pd.count
        );
        assert!(rel < 0.01, "{}: means differ by {:.2}%", t.pod, rel * 100.0);
        assert!(counts < 0.02, "{}: counts differ by {:.2}%", t.pod, counts * 100.0);
        for h in [(&mut total_direct, dd), (&mut total_prom, pd)] {
            match h.0 {
                Some(x) => assert!(x.add(&h.1)),
                None => *h.0 = Some(h.1),
            }
        }
    }
    let (d, p) = (total_direct.expect("direct"), total_prom.expect("prometheus"));
    assert!((d.mean() / p.mean() - 1.0).abs() < 0.01);
    for q in [0.5, 0.9, 0.99] {
        let (a, b) = (d.quantile(q), p.quantile(q));
        // Within two of the histogram's buckets (2.2% apart each).
        let res = d.quantile_resolution().unwrap_or(0.03);
        assert!((a / b - 1.0).abs() <= 2.0 * res, "p{}: {a} vs {b}", q * 100.0);
    }
    let mut prom = prom;
    prom.stop(&Shutdown::new()).await;
    backend.restore(&Shutdown::new()).await.expect("stop pods");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn histogram_quantile_of_the_server_equals_ours_and_the_reference_query_works() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut backend, targets) = launch(dir.path(), 1).await;
    let prom = PrometheusSource::spawn(dir.path(), &Shutdown::new())
        .await
        .expect("spawn prometheus");
    prom.prepare(&targets, &Shutdown::new()).await.expect("targets up");
    // The direct mean over about the span Prometheus's rate() sees (from its first
    // scrapes on), not since the pod started: on a busy CI machine the CPU workload's
    // latency drifts, and a cumulative mean drifted past the 25% check.
    let before = ScrapeSource::default()
        .scrape(&targets[0])
        .await
        .expect("scrape")
        .latency;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let sel = Selector {
        equal: vec![("instance".into(), instance_of(&targets[0].url))],
        one_of: None,
    };
    let at = epoch() - 1.0;
    let ours = histogram_at(&prom, &sel, at).await;
    for q in [0.5, 0.9, 0.99] {
        let expr = format!(
            "histogram_quantile({q}, sum by (le) ({}))",
            promql::raw("inference_time_seconds_bucket", &sel)
        );
        let theirs = prom.client().query(&expr, Some(at)).await.expect("quantile")[0].value;
        let mine = ours.quantile(q);
        assert!(
            (mine - theirs).abs() <= 1e-12 * theirs.abs().max(1.0),
            "q={q}: ours {mine} vs Prometheus {theirs}"
        );
    }
    // The reference study's query, unchanged, against our workload's metrics.
    let mean = prom
        .client()
        .value(REFERENCE_STUDY_MEAN)
        .await
        .expect("reference query");
    let direct = ScrapeSource::default()
        .scrape(&targets[0])
        .await
        .expect("scrape")
        .latency
        .delta(&before)
        .expect("counters only grow");
    println!(
        "reference query: {:.4} ms; direct mean over the same seconds {:.4} ms",
        mean * 1e3,
        direct.mean() * 1e3
    );
    assert!(
        mean.is_finite() && (mean / direct.mean() - 1.0).abs() < 0.25,
        "{mean} vs {}",
        direct.mean()
    );
    // A range query: the pod's throughput over the last seconds, one point a second.
    let now = epoch();
    let series = prom
        .client()
        .query_range(
            &promql::throughput(&sel, "2s", promql::Grouping::Cell),
            now - 3.0,
            now,
            1.0,
        )
        .await
        .expect("range query");
    assert_eq!(series.len(), 1);
    assert!(
        series[0].points.len() >= 3 && series[0].points.iter().all(|(_, v)| *v > 0.0),
        "{series:?}"
    );
    // Bad PromQL is a clear error naming the server.
    let err = prom
        .client()
        .query("sum(", None)
        .await
        .expect_err("bad query")
        .to_string();
    assert!(
        err.starts_with("Prometheus http://127.0.0.1:") && err.contains("bad_data"),
        "{err}"
    );
    let mut prom = prom;
    prom.stop(&Shutdown::new()).await;
    backend.restore(&Shutdown::new()).await.expect("stop pods");
}

fn sweep(out: &Path, extra: &[&str]) -> Command {
    let mut c = Command::new(BENCH);
    c.args([
        "sweep",
        "--device",
        "cpu",
        "--strategies",
        "time-slicing",
        "--quiet",
        "--warmup",
        "1s",
        "--window",
        "1s",
    ])
    .arg("--out")
    .arg(out)
    .args(extra);
    c
}

/// A port P with P and P + 1 free now, below the kernel's ephemeral range (32768 up):
/// a port the kernel hands out for outgoing connections and `bind(0)` (other tests'
/// servers, Prometheus's scrapes) can be taken between the check and the sweep's use.
fn free_port_pair() -> u16 {
    let start = 20_000 + (std::process::id() % 6_000) as u16 * 2;
    (0..3_000u16)
        .map(|i| 20_000 + (start - 20_000 + i * 2) % 12_000)
        .find(|&p| {
            let a = std::net::TcpListener::bind(("127.0.0.1", p));
            let b = std::net::TcpListener::bind(("127.0.0.1", p + 1));
            a.is_ok() && b.is_ok()
        })
        .expect("two free ports below 32000")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_existing_server_by_url_measures_pods_on_fixed_ports() {
    let dir = tempfile::tempdir().expect("tempdir");
    let base = free_port_pair();
    let server = PrometheusServer::start(&dir.path().join("server"), &Shutdown::new())
        .await
        .expect("prometheus");
    server
        .set_targets(&[0, 1].map(|i| Target {
            pod: format!("pod-{i}"),
            url: format!("http://127.0.0.1:{}/metrics", base + i),
        }))
        .expect("targets");
    let out = dir.path().join("results");
    let st = sweep(
        &out,
        &[
            "--pods",
            "2",
            "--max-cell",
            "4s",
            "--run-id",
            "url",
            "--prometheus",
            &server.url,
            "--base-port",
            &base.to_string(),
        ],
    )
    .output()
    .expect("run");
    assert!(st.status.success(), "{}", String::from_utf8_lossy(&st.stderr));
    let cells = read_cells(&out.join("url/cells.jsonl")).expect("cells");
    let agg = cells.iter().find(|c| c.is_aggregate()).expect("aggregate");
    assert_eq!((agg.status, agg.source), (CellStatus::Ok, Source::Prometheus));
    assert!(agg.inferences.is_some_and(|n| n > 100));
    assert!(cells.iter().all(|c| c.source == Source::Prometheus));
    let mut server = server;
    server.stop(&Shutdown::new()).await;
}

#[test]
fn a_server_of_ones_own_is_read_through_a_private_prometheus_by_its_metric() {
    let dir = tempfile::tempdir().expect("tempdir");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fake_server.py");
    let cmd = format!("python3 {} {{port}} my_latency_seconds ok", script.display());
    let out = dir.path().join("results");
    let st = sweep(
        &out,
        &[
            "--pods",
            "1",
            "--max-cell",
            "4s",
            "--run-id",
            "own",
            "--prometheus",
            "spawn",
            "--workload-cmd",
            &cmd,
            "--metric",
            "my_latency_seconds",
            "--ready-path",
            "none",
        ],
    )
    .env("FAKE_ENV_DIR", dir.path())
    .output()
    .expect("run");
    assert!(st.status.success(), "{}", String::from_utf8_lossy(&st.stderr));
    let cells = read_cells(&out.join("own/cells.jsonl")).expect("cells");
    let agg = cells.iter().find(|c| c.is_aggregate()).expect("aggregate");
    assert_eq!(
        (agg.status, agg.source),
        (CellStatus::Ok, Source::Prometheus),
        "{}",
        agg.note
    );
    // fake_server.py observes exactly 4 ms, 200 times a second, into my_latency_seconds.
    assert!(agg.mean_s.is_some_and(|m| (m - 0.004).abs() < 1e-6), "{:?}", agg.mean_s);
    assert!(
        agg.throughput_per_s.is_some_and(|t| (150.0..250.0).contains(&t)),
        "{:?}",
        agg.throughput_per_s
    );
}

#[test]
fn a_server_killed_mid_cell_is_a_clear_error_and_the_pods_stop() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = sweep(
        dir.path(),
        &[
            "--pods",
            "2",
            "--max-cell",
            "30s",
            "--run-id",
            "kill",
            "--prometheus",
            "spawn",
        ],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .expect("spawn");
    let harness = child.id();
    let deadline = Instant::now() + Duration::from_secs(60);
    let prom = loop {
        let kids = children(harness);
        let workloads = kids.iter().filter(|c| c.name.starts_with("gpushare-worklo")).count();
        if let Some(p) = kids.iter().find(|c| c.name == "prometheus")
            && workloads == 2
        {
            break p.pid;
        }
        assert!(Instant::now() < deadline, "pods and server never came up: {kids:?}");
        std::thread::sleep(Duration::from_millis(100));
    };
    std::thread::sleep(Duration::from_secs(5));
    let pods: Vec<u32> = children(harness)
        .into_iter()
        .filter(|c| c.name.starts_with("gpushare-worklo"))
        .map(|c| c.pid)
        .collect();
    // SAFETY: kill(2) on a process of this test's tree.
    unsafe { libc::kill(prom as i32, libc::SIGKILL) };
    let t = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        assert!(
            t.elapsed() < Duration::from_secs(40),
            "the harness hangs after the server died"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut err).expect("read");
    assert_eq!(status.code(), Some(1), "{err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("gpushare-bench:"))
        .unwrap_or_default();
    assert!(
        line.contains("Prometheus http://127.0.0.1:") && line.contains("cannot reach the server"),
        "{err}"
    );
    for p in pods {
        assert!(!alive(p), "pod {p} left running");
    }
    assert_eq!(
        read_run(&dir.path().join("kill/run.json")).expect("run").state,
        "failed"
    );
}

/// dcgm-exporter's text for node `gpu-1` (three GPUs: two whole, one in MIG mode with two
/// instances) and one GPU of node `gpu-2`, as its `render_metrics.go` template prints it
/// at 4.4.2-4.7.0, the version the GPU operator v25.10.1 deploys: labels `gpu`, `UUID`,
/// `pci_bus_id`, `device`, `modelName`, (MIG) `GPU_I_PROFILE`, `GPU_I_ID`, `Hostname` (the
/// node's name, from `NODE_NAME`), then the driver-version label; a MIG instance's series
/// carry its parent's UUID and have no `DCGM_FI_DEV_GPU_UTIL`, and repeat the whole GPU's
/// power and energy (as users report of dcgm-exporter: NVIDIA/dcgm-exporter#257). Clocks
/// and temperature are in the operator's default collectors (`dcp-metrics-included.csv`),
/// the clock event reasons are not: only node `gpu-2`'s exporter here was given them.
fn dcgm_exposition() -> String {
    let gpu = |i: u32, uuid: &str, host: &str| {
        format!(
            "gpu=\"{i}\",UUID=\"{uuid}\",pci_bus_id=\"00000000:{:02X}:00.0\",device=\"nvidia{i}\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"{host}\",DCGM_FI_DRIVER_VERSION=\"580.95.05\"",
            0x18 + i
        )
    };
    let mig = |id: u32| {
        format!(
            "gpu=\"2\",UUID=\"GPU-cccc\",pci_bus_id=\"00000000:1A:00.0\",device=\"nvidia2\",modelName=\"NVIDIA H100 80GB HBM3\",GPU_I_PROFILE=\"1g.10gb\",GPU_I_ID=\"{id}\",Hostname=\"gpu-1\",DCGM_FI_DRIVER_VERSION=\"580.95.05\""
        )
    };
    let (a, b, z) = (
        gpu(0, "GPU-aaaa", "gpu-1"),
        gpu(1, "GPU-bbbb", "gpu-1"),
        gpu(0, "GPU-zzzz", "gpu-2"),
    );
    let (m7, m8) = (mig(7), mig(8));
    format!(
        "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).\n# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n\
         DCGM_FI_DEV_GPU_UTIL{{{a}}} 40\nDCGM_FI_DEV_GPU_UTIL{{{b}}} 90\nDCGM_FI_DEV_GPU_UTIL{{{z}}} 5\n\
         # HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).\n# TYPE DCGM_FI_DEV_FB_USED gauge\n\
         DCGM_FI_DEV_FB_USED{{{a}}} 1000\nDCGM_FI_DEV_FB_USED{{{b}}} 3000\nDCGM_FI_DEV_FB_USED{{{z}}} 9\n\
         DCGM_FI_DEV_FB_USED{{{m7}}} 500\nDCGM_FI_DEV_FB_USED{{{m8}}} 700\n\
         # HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).\n# TYPE DCGM_FI_DEV_POWER_USAGE gauge\n\
         DCGM_FI_DEV_POWER_USAGE{{{a}}} 100.000000\nDCGM_FI_DEV_POWER_USAGE{{{b}}} 300.000000\nDCGM_FI_DEV_POWER_USAGE{{{z}}} 70.000000\n\
         DCGM_FI_DEV_POWER_USAGE{{{m7}}} 200.000000\nDCGM_FI_DEV_POWER_USAGE{{{m8}}} 200.000000\n\
         # HELP DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION Total energy consumption since boot (in mJ).\n# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n\
         DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{a}}} 5000000\nDCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{b}}} 7000000\nDCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{z}}} 1\n\
         DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{m7}}} 9000000\nDCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{m8}}} 9000000\n\
         # HELP DCGM_FI_PROF_GR_ENGINE_ACTIVE Ratio of time the graphics engine is active.\n# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge\n\
         DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{a}}} 0.400000\nDCGM_FI_PROF_GR_ENGINE_ACTIVE{{{b}}} 0.900000\n\
         DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{m7}}} 0.250000\nDCGM_FI_PROF_GR_ENGINE_ACTIVE{{{m8}}} 0.750000\n\
         # HELP DCGM_FI_DEV_SM_CLOCK SM clock frequency (in MHz).\n# TYPE DCGM_FI_DEV_SM_CLOCK gauge\n\
         DCGM_FI_DEV_SM_CLOCK{{{a}}} 1980\nDCGM_FI_DEV_SM_CLOCK{{{b}}} 1755\nDCGM_FI_DEV_SM_CLOCK{{{z}}} 345\n\
         DCGM_FI_DEV_SM_CLOCK{{{m7}}} 1410\nDCGM_FI_DEV_SM_CLOCK{{{m8}}} 1410\n\
         # HELP DCGM_FI_DEV_MEM_CLOCK Memory clock frequency (in MHz).\n# TYPE DCGM_FI_DEV_MEM_CLOCK gauge\n\
         DCGM_FI_DEV_MEM_CLOCK{{{a}}} 2619\nDCGM_FI_DEV_MEM_CLOCK{{{b}}} 2619\nDCGM_FI_DEV_MEM_CLOCK{{{z}}} 2619\n\
         DCGM_FI_DEV_MEM_CLOCK{{{m7}}} 2619\nDCGM_FI_DEV_MEM_CLOCK{{{m8}}} 2619\n\
         # HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).\n# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n\
         DCGM_FI_DEV_GPU_TEMP{{{a}}} 41\nDCGM_FI_DEV_GPU_TEMP{{{b}}} 67\nDCGM_FI_DEV_GPU_TEMP{{{z}}} 30\n\
         DCGM_FI_DEV_GPU_TEMP{{{m7}}} 55\nDCGM_FI_DEV_GPU_TEMP{{{m8}}} 55\n\
         # HELP DCGM_FI_DEV_CLOCKS_EVENT_REASONS Current clock event reasons.\n# TYPE DCGM_FI_DEV_CLOCKS_EVENT_REASONS gauge\n\
         DCGM_FI_DEV_CLOCKS_EVENT_REASONS{{{z}}} 68\n"
    )
}

/// Serves `body` on a loopback port for at most `limit`, to at most 200 requests.
fn serve_text(body: String, limit: Duration) -> String {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}/metrics", listener.local_addr().expect("addr"));
    listener.set_nonblocking(true).expect("nonblocking");
    std::thread::spawn(move || {
        let (end, mut served) = (Instant::now() + limit, 0);
        while Instant::now() < end && served < 200 {
            match listener.accept() {
                Ok((mut s, _)) => {
                    let _ = s.set_nonblocking(false);
                    let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
                    let mut buf = [0u8; 4096];
                    let _ = s.read(&mut buf);
                    let _ = write!(
                        s,
                        "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    served += 1;
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    });
    url
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dcgm_telemetry_reads_the_nodes_gpus_or_only_a_cells_by_uuid() {
    use gpushare_bench::telemetry::Telemetry;
    use gpushare_bench::telemetry::dcgm::{DcgmTelemetry, GpuScope};
    let dir = tempfile::tempdir().expect("tempdir");
    let url = serve_text(dcgm_exposition(), Duration::from_secs(60));
    let prom = PrometheusSource::spawn(dir.path(), &Shutdown::new())
        .await
        .expect("spawn prometheus");
    let target = Target {
        pod: "dcgm-exporter".into(),
        url,
    };
    prom.prepare(&[target], &Shutdown::new()).await.expect("target up");
    let scope = GpuScope::node();
    let telemetry = std::sync::Arc::new(DcgmTelemetry::new(prom.client().clone(), "gpu-1", scope.clone()));
    let read = |uuids: Option<&[&str]>| {
        scope.set(uuids.map(|u| u.iter().map(|s| s.to_string()).collect()));
        let t = telemetry.clone();
        async move { tokio::task::spawn_blocking(move || t.sample()).await.expect("join") }
    };
    // Until the first scrape is stored, the node reads nothing.
    let deadline = Instant::now() + Duration::from_secs(30);
    while read(None).await.is_none() {
        assert!(Instant::now() < deadline, "no DCGM series in Prometheus after 30 s");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // The node (one GPU's run): its GPUs' mean utilisation (MIG instances have none),
    // summed memory (MiB), power and energy (a MIG GPU's once, not per instance); node
    // gpu-2's GPU not among them.
    let node = read(None).await.expect("node");
    assert_eq!(node.util_pct, 65.0);
    assert_eq!(node.mem_used_bytes, (1000 + 3000 + 500 + 700) << 20);
    assert_eq!((node.power_w, node.energy_mj), (600.0, Some(21_000_000)));
    // Clocks: the mean over the GPUs (a MIG GPU's once); temperature: the hottest. The
    // clock event reasons are not collected on gpu-1: not read, rather than "none".
    assert_eq!(
        (node.sm_clock_mhz, node.mem_clock_mhz, node.temp_c),
        (Some((1980.0 + 1755.0 + 1410.0) / 3.0), Some(2619.0), Some(67.0))
    );
    assert_eq!(node.clock_reasons, None);
    let other = DcgmTelemetry::new(prom.client().clone(), "gpu-2", GpuScope::node());
    let z = tokio::task::spawn_blocking(move || other.sample())
        .await
        .expect("join")
        .expect("gpu-2");
    assert_eq!((z.clock_reasons, z.sm_clock_mhz), (Some(0x44), Some(345.0)));
    // A cell on GPU-bbbb reads it alone.
    let b = read(Some(&["GPU-bbbb"])).await.expect("GPU-bbbb");
    assert_eq!(
        (b.util_pct, b.mem_used_bytes, b.power_w, b.energy_mj),
        (90.0, 3000 << 20, 300.0, Some(7_000_000))
    );
    assert_eq!((b.sm_clock_mhz, b.temp_c), (Some(1755.0), Some(67.0)));
    // Two GPUs: the mean of their utilisation, the sum of the rest.
    let ab = read(Some(&["GPU-aaaa", "GPU-bbbb"])).await.expect("both");
    assert_eq!((ab.util_pct, ab.mem_used_bytes), (65.0, 4000 << 20));
    // A MIG parent (its instances' series carry its UUID): no GPU_UTIL there, so the
    // graphics-engine activity × 100 stands in (E8); memory is its instances' sum, power
    // and energy the GPU's once.
    let mig = read(Some(&["GPU-cccc"])).await.expect("MIG parent");
    assert_eq!(
        (mig.util_pct, mig.mem_used_bytes, mig.power_w, mig.energy_mj),
        (50.0, 1200 << 20, 200.0, Some(9_000_000))
    );
    // An empty scope (a cell's devices not known) reads nothing, not the node.
    assert_eq!(read(Some(&[])).await, None);
    let mut prom = prom;
    prom.stop(&Shutdown::new()).await;
}
