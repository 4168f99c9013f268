//! Every CUDA kernel family compiles with NVRTC for Hopper (sm_90) and defines every
//! entry point the Rust side launches. Needs libnvrtc (`make test` installs the PyPI
//! wheel under .deps/ and puts it on LD_LIBRARY_PATH), not a GPU.

use gpushare_workload::cuda::kernels::{Family, Kernel, compile_family, nvrtc_version, target_arch};

#[test]
fn every_family_compiles_for_sm90_and_defines_its_entries() {
    let (major, minor) = nvrtc_version().expect("libnvrtc must be loadable: run `make deps` or set LD_LIBRARY_PATH");
    assert!(major >= 13, "NVRTC {major}.{minor}: the project pins CUDA 13");
    for family in Family::ALL {
        let compiled = compile_family(family, "sm_90", true).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            compiled.image.starts_with(b"\x7fELF"),
            "{} did not produce a CUBIN",
            family.file()
        );
        // ptxas reports spills as "N bytes spill stores"; any spill in these kernels is a
        // performance bug (an array indexed at run time, too many live values).
        for line in compiled.log.lines().filter(|l| l.contains("spill")) {
            assert!(
                line.contains(" 0 bytes spill stores") && line.contains(" 0 bytes spill loads"),
                "{}: {line}",
                family.file()
            );
        }
        for kernel in Kernel::all().into_iter().filter(|k| k.family() == family) {
            let name = kernel.entry();
            let found = compiled
                .image
                .windows(name.len() + 1)
                .any(|w| &w[..name.len()] == name.as_bytes() && w[name.len()] == 0);
            assert!(found, "{} defines no entry `{name}`", family.file());
        }
        println!("{}:\n{}", family.file(), compiled.log);
    }
}

/// Every kernel waits for the prior grid (programmatic dependent launch) with
/// `griddepcontrol.wait`, a PTX instruction of sm_90 on: on the GPUs before (A100, sm_80,
/// the oldest the mma.sync kernels target) it must compile away, or ptxas rejects it.
#[test]
fn the_prior_grid_wait_is_hopper_only() {
    for family in Family::ALL {
        let old = compile_family(family, "sm_80", true).unwrap_or_else(|e| panic!("sm_80: {e}"));
        assert!(old.image.starts_with(b"\x7fELF"), "{} for sm_80", family.file());
    }
}

#[test]
fn hopper_builds_add_the_wgmma_attention_without_spills() {
    assert_eq!(target_arch((9, 0)), "sm_90a", "H100 and H200 get the wgmma build");
    assert_eq!(target_arch((8, 9)), "sm_89");
    let compiled = compile_family(Family::Attention, "sm_90a", true).unwrap_or_else(|e| panic!("{e}"));
    let has = |name: &str| {
        compiled
            .image
            .windows(name.len() + 1)
            .any(|w| &w[..name.len()] == name.as_bytes() && w[name.len()] == 0)
    };
    for kernel in Kernel::all().into_iter().chain(Kernel::hopper()) {
        if kernel.family() == Family::Attention {
            assert!(has(&kernel.entry()), "sm_90a build lacks `{}`", kernel.entry());
        }
    }
    for line in compiled.log.lines().filter(|l| l.contains("spill")) {
        assert!(
            line.contains(" 0 bytes spill stores") && line.contains(" 0 bytes spill loads"),
            "{line}"
        );
    }
    // A block of each must fit on a multiprocessor, so that the yolos-small shape runs in
    // one wave on 132 SMs: one block of 512 threads per SM (108 blocks). Registers are
    // allocated per warp in steps of 8 per thread, from 65536; shared memory is the dynamic
    // size plus the 1 KiB the driver reserves per block, from Hopper's 228 KiB.
    for kernel in Kernel::hopper() {
        let (_, threads) = kernel.attention_block();
        let wgmma = kernel.entry();
        let section = compiled
            .log
            .split("Compiling entry function")
            .find(|s| s.starts_with(&format!(" '{wgmma}'")))
            .unwrap_or_else(|| panic!("no ptxas report for {wgmma} in:\n{}", compiled.log));
        let registers: u32 = section
            .split("Used ")
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no register count in:\n{section}"));
        println!(
            "{wgmma}: {}",
            section.lines().find(|l| l.contains("Used ")).unwrap_or_default().trim()
        );
        assert!(
            registers.div_ceil(8) * 8 * threads <= 65536,
            "{wgmma} uses {registers} registers: too many for a block of {threads} on an SM"
        );
        assert!(
            kernel.dynamic_smem() + 1024 <= 228 * 1024,
            "{wgmma}'s shared memory does not fit an SM"
        );
        // setmaxnreg moves registers between the block's warpgroups: the producer's
        // down to `dec`, the three consumers' up to `inc`. They come from what the block
        // got at launch (registers × 512), so it must cover them, or the consumers'
        // setmaxnreg.inc waits for ever.
        let source = Family::Attention.source();
        let body = source
            .split(&format!("{wgmma}("))
            .nth(1)
            .expect("the kernel's definition");
        let count = |op: &str| -> u32 {
            body.split(&format!("setmaxnreg.{op}.sync.aligned.u32 "))
                .nth(1)
                .and_then(|s| s.split(';').next())
                .and_then(|n| n.trim().parse().ok())
                .unwrap_or_else(|| panic!("no setmaxnreg.{op} with a literal count in {wgmma}"))
        };
        let (dec, inc) = (count("dec"), count("inc"));
        assert!(
            dec * 128 + inc * 3 * 128 <= registers * threads,
            "{wgmma}: setmaxnreg {dec}/{inc} needs more than the {registers} × {threads} registers it launches with"
        );
    }
    // An sm_90 build (GPUs other than Hopper's 9.0 get their own sm_XY) has no wgmma.
    let plain = compile_family(Family::Attention, "sm_90", false).unwrap_or_else(|e| panic!("{e}"));
    for kernel in Kernel::hopper() {
        let name = kernel.entry();
        assert!(
            !plain.image.windows(name.len()).any(|w| w == name.as_bytes()),
            "sm_90 build defines {name}"
        );
    }
}

/// The decode step's products issue their first weight loads before they wait for the
/// kernel ahead of them (the overlap the step is built on): in their PTX, 16-byte loads
/// of weights come before `griddepcontrol.wait` (eight chunks of each row of a unit).
#[test]
fn the_products_load_their_first_weights_before_they_wait() {
    let options = cudarc::nvrtc::CompileOptions {
        arch: Some("compute_90a"),
        options: vec!["--std=c++17".into(), "--fmad=true".into()],
        ..Default::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(Family::Decoder.source(), options)
        .expect("the decoder compiles to PTX")
        .to_src();
    for (entry, rows) in [("dec_gemv", 1), ("dec_gemv_swiglu", 2), ("dec_qkv_rope", 2)] {
        let at = ptx
            .find(&format!(".entry {entry}("))
            .unwrap_or_else(|| panic!("{entry} in the PTX"));
        let body = &ptx[at..at + ptx[at..].find("\n}\n").expect("the entry's end")];
        let wait = body
            .find("griddepcontrol.wait")
            .unwrap_or_else(|| panic!("{entry} waits"));
        let ahead = body[..wait].matches("ld.global.nc.L1::no_allocate.v4.u32").count();
        assert!(ahead >= 8 * rows, "{entry}: {ahead} weight loads before the wait");
    }
}

/// Every kernel is launched with programmatic stream serialization on Hopper, so every
/// entry point must wait for the prior grid before it touches memory: its body starts
/// with `wait_prior_grid();` (macro bodies included), or with local constants and one
/// statement that calls `weights_ahead` (loads of weights, which no kernel writes) and
/// then the wait. A kernel without it would race with the kernel before it.
#[test]
fn every_entry_point_waits_for_the_prior_grid_first() {
    let mut entries = 0;
    for family in Family::ALL {
        let src = family.source();
        for (at, _) in src.match_indices("extern \"C\" __global__") {
            let body = &src[at..][src[at..].find('{').expect("a body") + 1..];
            let squeezed: String = body.chars().filter(|c| !c.is_whitespace() && *c != '\\').collect();
            // Statements up to the one that calls `weights_ahead` may come first when
            // they only declare constants from the parameters: no call, no index, no
            // dereference (`=*`, `->`), so nothing is read from memory before the wait
            // but the weights.
            let reads_nothing =
                |st: &str| st.starts_with("const") && !["(", "[", "=*", "->"].iter().any(|x| st.contains(x));
            let rest = match squeezed.find("weights_ahead<") {
                Some(at) if squeezed[..at].split(';').all(reads_nothing) => {
                    let call = &squeezed[at..];
                    &call[call.find(';').map_or(0, |i| i + 1)..]
                }
                _ => &squeezed[..],
            };
            let first: String = rest.chars().take(18).collect();
            let head = &src[at..at + 120.min(src.len() - at)];
            assert_eq!(
                first,
                "wait_prior_grid();",
                "{}: `{head}…` does not wait first",
                family.file()
            );
            entries += 1;
        }
    }
    // 3 attention definitions (one a macro of six), 13 element-wise, 2 norms.
    assert!(entries >= 18, "found only {entries} entry points");
}
