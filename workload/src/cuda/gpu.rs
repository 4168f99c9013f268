//! The device, its stream and its memory: the only place that turns CUDA driver errors
//! into [`WorkloadError`]s, and the owner of every device allocation.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use cudarc::driver::result::DriverError;
use cudarc::driver::sys::{CUdevice_attribute, CUdeviceptr, CUgraphInstantiate_flags, CUresult, CUstreamCaptureMode};
use cudarc::driver::{CudaContext, CudaEvent, CudaGraph, CudaStream, result};

use crate::error::{Result, WorkloadError};

/// What the harness and the metrics need to know about the GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuInfo {
    /// Marketing name, e.g. "NVIDIA H100 80GB HBM3".
    pub name: String,
    /// Streaming multiprocessors visible to this process (fewer inside a MIG instance).
    pub sm_count: u32,
    /// Device memory visible to this process, in bytes.
    pub memory_total_bytes: u64,
    /// Compute capability (major, minor).
    pub compute_capability: (i32, i32),
    /// The device's UUID as `cuDeviceGetUuid_v2` gives it, in 8-4-4-4-12 hex: the GPU's
    /// (nvidia-smi prints it after `GPU-`), or inside a MIG instance the instance's
    /// (after `MIG-`). Stable across processes and containers, unlike the ordinal.
    pub uuid: String,
}

/// A UUID's 16 bytes as 8-4-4-4-12 lower-case hex (pure).
pub fn format_uuid(bytes: &[u8; 16]) -> String {
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// An open GPU: primary context, one stream, allocation accounting.
#[derive(Debug)]
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    info: GpuInfo,
    allocated: Arc<AtomicUsize>,
}

/// Describes a driver error as "NAME: text".
pub fn describe(err: DriverError) -> String {
    let name = err
        .error_name()
        .map(|c| c.to_string_lossy().into_owned())
        .unwrap_or_default();
    let text = err
        .error_string()
        .map(|c| c.to_string_lossy().into_owned())
        .unwrap_or_default();
    if name.is_empty() {
        format!("{:?}", err.0)
    } else {
        format!("{name}: {text}")
    }
}

/// Whether a driver error means the context is lost (CUDA's "sticky" errors, which
/// every later call returns too, and the MPS client errors).
pub fn loses_context(err: &DriverError) -> bool {
    use cudarc::driver::sys::CUresult::*;
    matches!(
        err.0,
        CUDA_ERROR_ILLEGAL_ADDRESS
            | CUDA_ERROR_LAUNCH_FAILED
            | CUDA_ERROR_HARDWARE_STACK_ERROR
            | CUDA_ERROR_ILLEGAL_INSTRUCTION
            | CUDA_ERROR_MISALIGNED_ADDRESS
            | CUDA_ERROR_INVALID_ADDRESS_SPACE
            | CUDA_ERROR_INVALID_PC
            | CUDA_ERROR_CONTEXT_IS_DESTROYED
            | CUDA_ERROR_ECC_UNCORRECTABLE
            | CUDA_ERROR_MPS_CONNECTION_FAILED
            | CUDA_ERROR_MPS_RPC_FAILURE
            | CUDA_ERROR_MPS_SERVER_NOT_READY
            | CUDA_ERROR_MPS_CLIENT_TERMINATED
    )
}

/// Wraps a driver error with what the workload was doing: a [`WorkloadError::GpuFault`]
/// when the context is lost, else [`WorkloadError::Cuda`].
pub fn cuda_error(what: impl Into<String>) -> impl FnOnce(DriverError) -> WorkloadError {
    let what = what.into();
    move |err| {
        if loses_context(&err) {
            WorkloadError::GpuFault {
                what,
                detail: describe(err),
            }
        } else {
            WorkloadError::Cuda {
                what,
                detail: describe(err),
            }
        }
    }
}

impl Gpu {
    /// Opens device `ordinal` (after `CUDA_VISIBLE_DEVICES`, which may name a MIG
    /// instance). Fails with exit code 3 when there is no driver or no usable GPU.
    pub fn open(ordinal: usize) -> Result<Self> {
        // SAFETY: only tries to dlopen the driver library; cudarc would panic on the
        // first driver call without it, so this check must come first.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(WorkloadError::NoDriver(
                "libcuda.so could not be loaded (is the NVIDIA driver installed, and is this a GPU machine or container with the GPU exposed?)".into(),
            ));
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| match e.0 {
            CUresult::CUDA_ERROR_NO_DEVICE
            | CUresult::CUDA_ERROR_INVALID_DEVICE
            | CUresult::CUDA_ERROR_NOT_INITIALIZED
            | CUresult::CUDA_ERROR_STUB_LIBRARY
            | CUresult::CUDA_ERROR_DEVICE_UNAVAILABLE
            | CUresult::CUDA_ERROR_DEVICE_NOT_LICENSED
            | CUresult::CUDA_ERROR_SYSTEM_DRIVER_MISMATCH
            | CUresult::CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE => WorkloadError::NoGpu(format!(
                "device {ordinal}: {} (CUDA_VISIBLE_DEVICES={})",
                describe(e),
                std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_else(|_| "unset".into())
            )),
            CUresult::CUDA_ERROR_OUT_OF_MEMORY => WorkloadError::OutOfMemory {
                what: "the CUDA context".into(),
                requested: 0,
                free: 0,
                total: 0,
            },
            _ => cuda_error(format!("opening GPU {ordinal}"))(e),
        })?;
        // One stream, no cross-stream hazards: cudarc's event tracking would only add
        // an event record to every launch.
        // SAFETY: every buffer of this process is used on `stream` alone.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(cuda_error("creating a stream"))?;
        let attr = |a| ctx.attribute(a).map_err(cuda_error("reading device attributes"));
        let sm_count = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32;
        let info = GpuInfo {
            name: ctx.name().map_err(cuda_error("reading the device name"))?,
            sm_count,
            memory_total_bytes: ctx.total_mem().map_err(cuda_error("reading device memory"))? as u64,
            compute_capability: ctx
                .compute_capability()
                .map_err(cuda_error("reading the compute capability"))?,
            uuid: format_uuid(
                &ctx.uuid()
                    .map_err(cuda_error("reading the device UUID"))?
                    .bytes
                    .map(|b| b as u8),
            ),
        };
        Ok(Self {
            ctx,
            stream,
            info,
            allocated: Arc::new(AtomicUsize::new(0)),
        })
    }

    /// The device's description.
    pub fn info(&self) -> &GpuInfo {
        &self.info
    }

    /// The context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The stream every launch goes to.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Bytes currently allocated through [`Gpu::alloc`].
    pub fn allocated_bytes(&self) -> usize {
        self.allocated.load(Ordering::Relaxed)
    }

    /// Free and total device memory as the driver reports them.
    pub fn mem_info(&self) -> (usize, usize) {
        self.ctx.mem_get_info().unwrap_or((0, 0))
    }

    /// Allocates `bytes` of device memory (uninitialised). An out-of-memory answer is
    /// reported as such (exit code 4), naming `what`.
    pub fn alloc(&self, bytes: usize, what: &str) -> Result<DeviceBuffer> {
        self.ctx.bind_to_thread().map_err(cuda_error("binding the context"))?;
        // SAFETY: the context is current on this thread; the pointer is owned by the
        // returned buffer and freed exactly once in its Drop.
        let ptr = unsafe { result::malloc_sync(bytes.max(1)) }.map_err(|e| {
            if e.0 == CUresult::CUDA_ERROR_OUT_OF_MEMORY {
                let (free, total) = self.mem_info();
                WorkloadError::OutOfMemory {
                    what: what.to_string(),
                    requested: bytes,
                    free,
                    total,
                }
            } else {
                cuda_error(format!("allocating {bytes} bytes for {what}"))(e)
            }
        })?;
        self.allocated.fetch_add(bytes, Ordering::Relaxed);
        Ok(DeviceBuffer {
            ptr,
            bytes,
            ctx: self.ctx.clone(),
            allocated: self.allocated.clone(),
        })
    }

    /// Allocates and fills with zero bytes.
    pub fn alloc_zeroed(&self, bytes: usize, what: &str) -> Result<DeviceBuffer> {
        let buf = self.alloc(bytes, what)?;
        // SAFETY: `buf` holds `bytes` bytes on this context.
        unsafe { result::memset_d8_sync(buf.ptr, 0, bytes) }.map_err(cuda_error(format!("clearing {what}")))?;
        Ok(buf)
    }

    /// Sets every byte of a buffer (tests poison outputs with 0xFF: NaN in f32 and bf16).
    pub fn fill_bytes(&self, buf: &DeviceBuffer, byte: u8) -> Result<()> {
        // SAFETY: the whole buffer, on this context.
        unsafe { result::memset_d8_sync(buf.ptr, byte, buf.bytes) }.map_err(cuda_error("filling a buffer"))
    }

    /// Copies f32 values to a new device buffer.
    pub fn upload_f32(&self, data: &[f32], what: &str) -> Result<DeviceBuffer> {
        let buf = self.alloc(std::mem::size_of_val(data), what)?;
        // SAFETY: `buf` is exactly `data`'s size; the copy is synchronous.
        unsafe { result::memcpy_htod_sync(buf.ptr, data) }.map_err(cuda_error(format!("uploading {what}")))?;
        Ok(buf)
    }

    /// Copies f32 values to a new device buffer as bf16 (round to nearest even).
    pub fn upload_bf16(&self, data: &[f32], what: &str) -> Result<DeviceBuffer> {
        let bits: Vec<u16> = data.iter().map(|v| half::bf16::from_f32(*v).to_bits()).collect();
        let buf = self.alloc(bits.len() * 2, what)?;
        // SAFETY: as in upload_f32.
        unsafe { result::memcpy_htod_sync(buf.ptr, &bits) }.map_err(cuda_error(format!("uploading {what}")))?;
        Ok(buf)
    }

    /// Copies i32 values to a new device buffer.
    pub fn upload_i32(&self, data: &[i32], what: &str) -> Result<DeviceBuffer> {
        let buf = self.alloc(std::mem::size_of_val(data), what)?;
        // SAFETY: as in upload_f32.
        unsafe { result::memcpy_htod_sync(buf.ptr, data) }.map_err(cuda_error(format!("uploading {what}")))?;
        Ok(buf)
    }

    /// Waits for the stream, then copies the first `n` f32 values back.
    pub fn download_f32(&self, buf: &DeviceBuffer, n: usize) -> Result<Vec<f32>> {
        assert!(n * 4 <= buf.bytes, "read past the end of a device buffer");
        self.synchronize()?;
        let mut out = vec![0.0f32; n];
        // SAFETY: bounds checked above; the stream is idle.
        unsafe { result::memcpy_dtoh_sync(&mut out, buf.ptr) }.map_err(cuda_error("downloading results"))?;
        Ok(out)
    }

    /// Page-locked host memory for `len` f32 results, zeroed, freed on drop.
    pub fn alloc_pinned_f32(&self, len: usize, what: &str) -> Result<PinnedF32> {
        self.ctx.bind_to_thread().map_err(cuda_error(what))?;
        // SAFETY: plain page-locked memory (flags 0: not write-combined, which the host reads
        // slowly), at least one value's worth; zeroed below before anyone reads it.
        let ptr =
            unsafe { result::malloc_host(len.max(1) * std::mem::size_of::<f32>(), 0) }.map_err(cuda_error(what))?;
        let ptr = ptr.cast::<f32>();
        // SAFETY: `ptr` holds `len` f32s, just allocated.
        unsafe { std::ptr::write_bytes(ptr, 0, len) };
        Ok(PinnedF32 {
            ptr,
            len,
            ctx: self.ctx.clone(),
        })
    }

    /// Copies `out.len()` f32 values back once the stream's work is done: one DMA enqueued
    /// behind that work, then one wait. (A pageable destination costs a wait, then a copy the
    /// driver stages through its own pinned buffer.)
    pub fn download_f32_pinned(&self, buf: &DeviceBuffer, out: &mut PinnedF32) -> Result<()> {
        assert!(
            out.len * std::mem::size_of::<f32>() <= buf.bytes,
            "read past the end of a device buffer"
        );
        // Binding first surfaces any error cudarc holds back from an earlier drop, before a
        // copy is in flight.
        self.ctx.bind_to_thread().map_err(cuda_error("downloading results"))?;
        // SAFETY: bounds checked above; `out` is page-locked and not read until the wait below
        // returns; the copy is ordered after the stream's earlier work.
        unsafe { result::memcpy_dtoh_async(out.as_mut_slice(), buf.ptr, self.stream.cu_stream()) }
            .map_err(cuda_error("downloading results"))?;
        // The driver's own wait, not cudarc's (which may return a held-back error without
        // waiting): when it returns, the copy is done, or the context is lost and no copy
        // will run; either way `out` may be read or freed.
        // SAFETY: the stream is live for as long as `self`.
        unsafe { result::stream::synchronize(self.stream.cu_stream()) }.map_err(cuda_error("downloading results"))
    }

    /// Waits for the stream, then copies `n` bf16 values back as f32.
    pub fn download_bf16(&self, buf: &DeviceBuffer, n: usize) -> Result<Vec<f32>> {
        assert!(n * 2 <= buf.bytes, "read past the end of a device buffer");
        self.synchronize()?;
        let mut bits = vec![0u16; n];
        // SAFETY: bounds checked above; the stream is idle.
        unsafe { result::memcpy_dtoh_sync(&mut bits, buf.ptr) }.map_err(cuda_error("downloading results"))?;
        Ok(bits.into_iter().map(|b| half::bf16::from_bits(b).to_f32()).collect())
    }

    /// An event that records time (cudarc's default events have timing disabled).
    pub fn timing_event(&self) -> Result<cudarc::driver::CudaEvent> {
        self.ctx
            .new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(cuda_error("creating a timing event"))
    }

    /// Blocks until the stream is idle, reporting any asynchronous kernel fault.
    pub fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().map_err(cuda_error("waiting for the GPU"))
    }
}

/// Page-locked host memory holding f32 values (see [`Gpu::alloc_pinned_f32`]).
#[derive(Debug)]
pub struct PinnedF32 {
    ptr: *mut f32,
    len: usize,
    ctx: Arc<CudaContext>,
}

// SAFETY: the buffer is owned, not aliased, and freed once; moving it between threads or
// reading it from several is no different from a Vec<f32>.
unsafe impl Send for PinnedF32 {}
unsafe impl Sync for PinnedF32 {}

impl PinnedF32 {
    /// The values.
    pub fn as_slice(&self) -> &[f32] {
        // SAFETY: `ptr` holds `len` initialised f32s for the life of `self`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    fn as_mut_slice(&mut self) -> &mut [f32] {
        // SAFETY: as above, and `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for PinnedF32 {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: allocated by malloc_host, freed once; any copy into it has been waited for.
        let _ = unsafe { result::free_host(self.ptr.cast()) };
    }
}

/// Device memory owned by this process; freed on drop.
#[derive(Debug)]
pub struct DeviceBuffer {
    ptr: CUdeviceptr,
    bytes: usize,
    ctx: Arc<CudaContext>,
    allocated: Arc<AtomicUsize>,
}

impl DeviceBuffer {
    /// The device address.
    pub fn ptr(&self) -> CUdeviceptr {
        self.ptr
    }
    /// Size in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // Errors while freeing at exit cannot be acted on; the driver reclaims the
        // memory with the context anyway.
        let _ = self.ctx.bind_to_thread();
        // SAFETY: `ptr` came from malloc_sync on this context and is freed only here.
        let _ = unsafe { result::free_sync(self.ptr) };
        self.allocated.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

/// Captures what `enqueue` puts on `stream` as a CUDA graph, instantiated and uploaded.
/// (cudarc's `Option`: the driver gives a graph for every capture that ends without
/// error.) Serves the forward pass, the split's per-step timing and the product tuner's.
/// An error of `enqueue` is reported before one of ending the capture, which it may have
/// caused.
pub fn capture_graph(
    stream: &Arc<CudaStream>,
    what: &str,
    enqueue: impl FnOnce() -> Result<()>,
) -> Result<Option<CudaGraph>> {
    stream
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .map_err(cuda_error(what))?;
    let enqueued = enqueue();
    let ended = stream.end_capture(CUgraphInstantiate_flags(0));
    enqueued?;
    let graph = ended.map_err(cuda_error(what))?;
    if let Some(g) = &graph {
        g.upload().map_err(cuda_error(what))?;
    }
    Ok(graph)
}

/// The fastest of `rounds` timings, by the events `start` and `end` on `stream`, of one
/// launch of `graph` or, without one, of what `eager` enqueues: on the GPU alone, milliseconds.
/// Serves the split's per-step timing and the product tuner's.
pub fn time_min_ms(
    stream: &Arc<CudaStream>,
    (start, end): (&CudaEvent, &CudaEvent),
    what: &str,
    graph: Option<&CudaGraph>,
    mut eager: impl FnMut() -> Result<()>,
    rounds: usize,
) -> Result<f32> {
    let mut ms = f32::INFINITY;
    for _ in 0..rounds {
        start.record(stream).map_err(cuda_error(what))?;
        match graph {
            Some(g) => g.launch().map_err(cuda_error(what))?,
            None => eager()?,
        }
        end.record(stream).map_err(cuda_error(what))?;
        end.synchronize().map_err(cuda_error(what))?;
        ms = ms.min(start.elapsed_ms(end).map_err(cuda_error(what))?);
    }
    Ok(ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_uuid_reads_as_nvidia_smi_prints_it() {
        let bytes = [
            0x5c, 0x6f, 0x2a, 0x1e, 0x0b, 0x7d, 0x4c, 0x1a, 0x9e, 0x3f, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab,
        ];
        assert_eq!(format_uuid(&bytes), "5c6f2a1e-0b7d-4c1a-9e3f-0123456789ab");
    }
}
