//! The CUDA backend: cudarc over the driver API, cuBLASLt for matrix products, NVRTC
//! for our kernels (`kernels/*.cu`).

pub mod decoder;
pub mod gemm;
pub mod gpu;
pub mod kernels;
pub mod model;
pub mod ops;

pub use gpu::{DeviceBuffer, Gpu, GpuInfo};
pub use model::{CudaModel, StepTiming};
pub use ops::{CudaRuntime, Step, StepKind};
