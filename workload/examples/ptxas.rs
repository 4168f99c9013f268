//! Prints NVRTC's ptxas report (registers, shared memory, spills) for every kernel
//! family: `cargo run --example ptxas [sm_90]`. Needs libnvrtc, not a GPU.

fn main() {
    let arch = std::env::args().nth(1).unwrap_or_else(|| "sm_90".into());
    for family in gpushare_workload::cuda::kernels::Family::ALL {
        match gpushare_workload::cuda::kernels::compile_family(family, &arch, true) {
            Ok(c) => println!("== {} ({} bytes)\n{}", family.file(), c.image.len(), c.log),
            Err(e) => {
                eprintln!("{e}");
                std::process::exit(1);
            }
        }
    }
}
