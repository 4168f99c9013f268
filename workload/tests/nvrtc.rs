//! Every CUDA kernel family compiles with NVRTC for Hopper (sm_90) and defines every
//! entry point the Rust side launches. Needs libnvrtc (`make test` installs the PyPI
//! wheel under .deps/ and puts it on LD_LIBRARY_PATH), not a GPU.

use gpushare_workload::cuda::kernels::{Family, Kernel, compile_family, nvrtc_version};

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
