//! The `nccl` backend: GPU buffers all-reduced in place by NCCL, timed with CUDA events.
//!
//! NCCL and the CUDA driver come through cudarc's bindings, loaded at run time: the binary
//! builds and starts with no CUDA installed, and a missing library is an error that names
//! what was searched, never cudarc's panic. Rank 0 makes the NCCL unique id and publishes it in
//! the rendezvous store; the others read it from there.
//!
//! Streams: PyTorch computes on the legacy default stream. Each collective waits for that
//! stream's work so far (an event), runs on our own stream between two timing events, and the
//! host waits for the end event, so the flight record's times are the device's, and a hung
//! NCCL call leaves its record `Started`.
use super::rendezvous::StoreClient;
use super::{Collective, CollectiveError, DeviceBuf, DeviceDtype};
use crate::ids::{unix_us, Rank};
use cudarc::driver::{result as cu, sys as cusys};
use cudarc::nccl::{result as nc, sys as ncsys};
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum NcclError {
    #[error("{lib} could not be loaded: searched {searched} on the loader path (LD_LIBRARY_PATH, the binary's run path, ld.so.cache){hint}")]
    Missing { lib: &'static str, searched: String, hint: String },
    #[error("CUDA driver: {call} failed: {reason}")]
    Driver { call: &'static str, reason: String },
    #[error("NCCL: {call} failed: {reason}")]
    Nccl { call: &'static str, reason: String },
    #[error("CUDA device {ordinal} (LOCAL_RANK) does not exist: {count} visible")]
    NoDevice { ordinal: u32, count: i32 },
    #[error("the NCCL unique id in the rendezvous store is {len} bytes, expected {want}")]
    BadUniqueId { len: usize, want: usize },
}

fn driver(call: &'static str) -> impl Fn(cu::DriverError) -> NcclError {
    move |e| NcclError::Driver { call, reason: format!("{e:?}") }
}

fn nccl(call: &'static str) -> impl Fn(nc::NcclError) -> NcclError {
    move |e| {
        // SAFETY: ncclGetErrorString returns a static string for any result code.
        let text = unsafe { std::ffi::CStr::from_ptr(ncsys::ncclGetErrorString(e.0)) };
        NcclError::Nccl { call, reason: format!("{:?}: {}", e.0, text.to_string_lossy()) }
    }
}

/// The CUDA driver library is loadable (no panic: cudarc's own loader panics when it is not).
pub fn check_driver() -> Result<(), NcclError> {
    // SAFETY: only tries dlopen on cudarc's candidate names.
    if unsafe { cusys::is_culib_present() } {
        return Ok(());
    }
    let searched = candidates("cuda");
    Err(NcclError::Missing { lib: "libcuda (the NVIDIA driver)", searched, hint: String::new() })
}

/// NCCL is loadable under a name cudarc looks for.
pub fn check_nccl() -> Result<(), NcclError> {
    // SAFETY: only tries dlopen on cudarc's candidate names.
    if unsafe { ncsys::is_culib_present() } {
        return Ok(());
    }
    let searched = candidates("nccl");
    // PyTorch's wheel ships only libnccl.so.2, a name cudarc does not try: the agent gives its
    // GPU ranks a link to it (agent/ranks.rs); a process of its own needs one made for it.
    let found = loadable_path("libnccl.so.2", "ncclGetVersion")
        .or_else(|| crate::tools::pytorch_nccl(&[]).map(|f| f.path.display().to_string()));
    let hint = match found {
        Some(path) => format!(
            "; {path} is there, under a name cudarc does not try: GPU ranks get a link to it from \
             their agent; anything else needs a directory holding a link libnccl.so -> {path} first \
             on LD_LIBRARY_PATH"
        ),
        None => String::new(),
    };
    Err(NcclError::Missing { lib: "libnccl (NCCL)", searched, hint })
}

/// The file names cudarc tries for `lib`, once each, in its order.
fn candidates(lib: &str) -> String {
    let mut names: Vec<String> = Vec::new();
    for n in cudarc::get_lib_name_candidates(lib) {
        if !names.contains(&n) {
            names.push(n);
        }
    }
    names.join(", ")
}

/// Where `name` loads from (symbolic links resolved), found through one of its symbols; None
/// when it does not load.
pub fn loadable_path(name: &str, symbol: &str) -> Option<String> {
    let name = std::ffi::CString::new(name).ok()?;
    let symbol = std::ffi::CString::new(symbol).ok()?;
    // SAFETY: dlopen/dlsym/dladdr with valid C strings; the handle is closed before returning
    // and the path is copied out before that.
    unsafe {
        let h = libc::dlopen(name.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL);
        if h.is_null() {
            return None;
        }
        let f = libc::dlsym(h, symbol.as_ptr());
        let mut info: libc::Dl_info = std::mem::zeroed();
        let path = (!f.is_null() && libc::dladdr(f, &mut info) != 0 && !info.dli_fname.is_null())
            .then(|| std::ffi::CStr::from_ptr(info.dli_fname).to_string_lossy().into_owned());
        libc::dlclose(h);
        path.map(|p| std::fs::canonicalize(&p).map_or(p, |c| c.display().to_string()))
    }
}

/// NCCL's version as `2.28.9`.
pub fn nccl_version() -> Result<String, NcclError> {
    check_nccl()?;
    let v = nc::get_nccl_version().map_err(nccl("ncclGetVersion"))?;
    // NCCL ≥ 2.9 encodes major·10000 + minor·100 + patch.
    Ok(format!("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100))
}

/// The CUDA driver's version (e.g. `13.0`) and its devices' names.
pub fn driver_info() -> Result<(String, Vec<String>), NcclError> {
    check_driver()?;
    cu::init().map_err(driver("cuInit"))?;
    let mut v = 0;
    // SAFETY: writes one int.
    unsafe { cusys::cuDriverGetVersion(&mut v) }.result().map_err(driver("cuDriverGetVersion"))?;
    let count = cu::device::get_count().map_err(driver("cuDeviceGetCount"))?;
    let names = (0..count)
        .map(|i| cu::device::get(i).and_then(cu::device::get_name).unwrap_or_else(|e| format!("device {i}: {e:?}")))
        .collect();
    Ok((format!("{}.{}", v / 1000, (v % 1000) / 10), names))
}

/// The name of CUDA device `ordinal` (for MFU's peak by name).
pub fn device_name(ordinal: u32) -> Result<String, NcclError> {
    check_driver()?;
    cu::init().map_err(driver("cuInit"))?;
    let dev = cu::device::get(ordinal as i32).map_err(driver("cuDeviceGet"))?;
    cu::device::get_name(dev).map_err(driver("cuDeviceGetName"))
}

/// One rank's NCCL communicator, its stream and its timing events.
pub struct Nccl {
    rank: Rank,
    world: u32,
    ctx: cusys::CUcontext,
    comm: ncsys::ncclComm_t,
    stream: cusys::CUstream,
    /// Recorded on PyTorch's stream: our stream waits for it.
    ready: cusys::CUevent,
    start: cusys::CUevent,
    end: cusys::CUevent,
    last_span: Option<(u64, u64)>,
}

// SAFETY: the handles are used by one thread at a time (the trait takes `&mut self`), and CUDA
// and NCCL handles may move between threads once the context is made current (`enter`).
unsafe impl Send for Nccl {}

const UNIQUE_ID_KEY: &str = "nccl/unique_id";

impl Nccl {
    /// Joins the NCCL communicator of `world` ranks on CUDA device `ordinal` (LOCAL_RANK); the
    /// unique id goes through the rendezvous store.
    pub fn connect(
        store: &mut StoreClient,
        rank: Rank,
        world: u32,
        ordinal: u32,
        timeout: Duration,
    ) -> Result<Nccl, CollectiveError> {
        check_driver()?;
        check_nccl()?;
        let want = std::mem::size_of::<ncsys::ncclUniqueId>();
        let id = if rank.0 == 0 {
            let id = nc::get_uniqueid().map_err(nccl("ncclGetUniqueId"))?;
            let bytes: Vec<u8> = id.internal.iter().map(|c| *c as u8).collect();
            store.set(UNIQUE_ID_KEY, &bytes)?;
            id
        } else {
            let bytes = store.get(UNIQUE_ID_KEY, timeout)?;
            if bytes.len() != want {
                return Err(NcclError::BadUniqueId { len: bytes.len(), want }.into());
            }
            let mut id = ncsys::ncclUniqueId { internal: [0; 128] };
            for (dst, src) in id.internal.iter_mut().zip(&bytes) {
                *dst = *src as std::ffi::c_char;
            }
            id
        };
        Ok(Nccl::join(id, rank, world, ordinal)?)
    }

    fn join(id: ncsys::ncclUniqueId, rank: Rank, world: u32, ordinal: u32) -> Result<Nccl, NcclError> {
        cu::init().map_err(driver("cuInit"))?;
        let count = cu::device::get_count().map_err(driver("cuDeviceGetCount"))?;
        if ordinal as i32 >= count {
            return Err(NcclError::NoDevice { ordinal, count });
        }
        let dev = cu::device::get(ordinal as i32).map_err(driver("cuDeviceGet"))?;
        // SAFETY: retains the device's primary context, the one PyTorch's runtime uses too.
        let ctx = unsafe { cu::primary_ctx::retain(dev) }.map_err(driver("cuDevicePrimaryCtxRetain"))?;
        // SAFETY: ctx is live (retained above). NCCL creates its communicator on the current device.
        unsafe { cu::ctx::set_current(ctx) }.map_err(driver("cuCtxSetCurrent"))?;
        let mut comm: ncsys::ncclComm_t = std::ptr::null_mut();
        // SAFETY: comm is written by NCCL; every rank passes the same id and world size.
        unsafe { nc::comm_init_rank(&mut comm, world as i32, id, rank.0 as i32) }.map_err(nccl("ncclCommInitRank"))?;
        let stream = cu::stream::create(cu::stream::StreamKind::NonBlocking).map_err(driver("cuStreamCreate"))?;
        let event = || cu::event::create(cusys::CUevent_flags::CU_EVENT_DEFAULT).map_err(driver("cuEventCreate"));
        Ok(Nccl { rank, world, ctx, comm, stream, ready: event()?, start: event()?, end: event()?, last_span: None })
    }

    fn enter(&self) -> Result<(), NcclError> {
        // SAFETY: the context is retained for our lifetime.
        unsafe { cu::ctx::set_current(self.ctx) }.map_err(driver("cuCtxSetCurrent"))
    }

    /// Enqueues and waits for one in-place all-reduce; records the device span.
    fn run(&mut self, buf: DeviceBuf) -> Result<(), NcclError> {
        self.enter()?;
        let dtype = match buf.dtype {
            DeviceDtype::F32 => ncsys::ncclDataType_t::ncclFloat32,
            DeviceDtype::Bf16 => ncsys::ncclDataType_t::ncclBfloat16,
        };
        let legacy: cusys::CUstream = std::ptr::null_mut();
        let ptr = buf.ptr as *mut std::ffi::c_void;
        // SAFETY: the events and stream are ours and live; `ptr` is a device buffer of
        // `elements` values that the caller keeps alive until we return (we wait for the end).
        unsafe {
            cu::event::record(self.ready, legacy).map_err(driver("cuEventRecord"))?;
            cu::stream::wait_event(self.stream, self.ready, cusys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT)
                .map_err(driver("cuStreamWaitEvent"))?;
            cu::event::record(self.start, self.stream).map_err(driver("cuEventRecord"))?;
            nc::all_reduce(ptr, ptr, buf.elements, dtype, ncsys::ncclRedOp_t::ncclSum, self.comm, self.stream.cast())
                .map_err(nccl("ncclAllReduce"))?;
            cu::event::record(self.end, self.stream).map_err(driver("cuEventRecord"))?;
            // The GPU synchronises here: the host waits for the collective to finish.
            cu::event::synchronize(self.end).map_err(driver("cuEventSynchronize"))?;
            let ms = cu::event::elapsed(self.start, self.end).map_err(driver("cuEventElapsedTime"))?;
            let end_us = unix_us();
            self.last_span = Some((end_us.saturating_sub((f64::from(ms) * 1e3) as u64), end_us));
        }
        Ok(())
    }

    /// Sums a host buffer through a device copy (for checks; training passes device buffers).
    fn host_all_reduce(&mut self, buf: &mut [f32]) -> Result<(), NcclError> {
        self.enter()?;
        let bytes = std::mem::size_of_val(buf);
        // SAFETY: a fresh device allocation of `bytes`, filled from and copied back into `buf`,
        // freed on every path.
        unsafe {
            let dev = cu::malloc_sync(bytes.max(4)).map_err(driver("cuMemAlloc"))?;
            let result = cu::memcpy_htod_sync(dev, buf)
                .map_err(driver("cuMemcpyHtoD"))
                .and_then(|_| self.run(DeviceBuf { ptr: dev, elements: buf.len(), dtype: DeviceDtype::F32 }))
                .and_then(|_| cu::memcpy_dtoh_sync(buf, dev).map_err(driver("cuMemcpyDtoH")));
            let _ = cu::free_sync(dev);
            result
        }
    }
}

impl Collective for Nccl {
    fn rank(&self) -> Rank {
        self.rank
    }

    fn world_size(&self) -> u32 {
        self.world
    }

    fn all_reduce_sum(&mut self, buf: &mut [f32]) -> Result<(), CollectiveError> {
        Ok(self.host_all_reduce(buf)?)
    }

    fn barrier(&mut self) -> Result<(), CollectiveError> {
        // A one-element all-reduce: NCCL has no barrier of its own.
        Ok(self.host_all_reduce(&mut [0.0])?)
    }

    fn all_reduce_sum_device(&mut self, buf: DeviceBuf) -> Result<(), CollectiveError> {
        Ok(self.run(buf)?)
    }

    fn last_device_span_us(&self) -> Option<(u64, u64)> {
        self.last_span
    }
}

impl Drop for Nccl {
    fn drop(&mut self) {
        // SAFETY: every handle was created in `connect` and is destroyed once, here.
        unsafe {
            let _ = cu::ctx::set_current(self.ctx);
            let _ = nc::comm_destroy(self.comm);
            for e in [self.ready, self.start, self.end] {
                let _ = cu::event::destroy(e);
            }
            let _ = cu::stream::destroy(self.stream);
        }
    }
}

/// A single-rank all-reduce of `elements` f32 through this backend, for `doctor` and
/// `scripts/gpu-check.sh`: (correct, device time in ms, bytes). One rank needs no rendezvous.
pub fn self_test(ordinal: u32, elements: usize) -> Result<(bool, f64, u64), CollectiveError> {
    check_driver()?;
    check_nccl()?;
    let id = nc::get_uniqueid().map_err(nccl("ncclGetUniqueId"))?;
    let mut comm = Nccl::join(id, Rank(0), 1, ordinal)?;
    let mut buf: Vec<f32> = (0..elements).map(|i| (i % 1000) as f32 * 0.5).collect();
    let want = buf.clone();
    // Once to warm up (NCCL sets up its channels on first use), once to time.
    comm.all_reduce_sum(&mut buf)?;
    comm.all_reduce_sum(&mut buf)?;
    let ms = comm.last_device_span_us().map_or(f64::NAN, |(s, e)| (e - s) as f64 / 1e3);
    Ok((buf == want, ms, (elements * 4) as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a machine without the NVIDIA driver, joining fails with the library and the names
    /// searched, and does not panic.
    #[test]
    fn a_missing_driver_is_a_clear_error() {
        if check_driver().is_ok() {
            println!("skipped: libcuda loads here, so the missing-driver path cannot be seen");
            return;
        }
        let server =
            super::super::rendezvous::StoreServer::bind("127.0.0.1:0", crate::collective::auth::Gate::open()).unwrap();
        let addr = server.local_addr().to_string();
        server.spawn();
        let mut store =
            StoreClient::connect(&addr, &crate::collective::auth::Gate::open(), Duration::from_secs(5)).unwrap();
        let err = match Nccl::connect(&mut store, Rank(0), 1, 0, Duration::from_secs(1)) {
            Ok(_) => panic!("connected without a driver"),
            Err(e) => e.to_string(),
        };
        assert!(err.contains("libcuda (the NVIDIA driver) could not be loaded"), "{err}");
        assert!(err.contains("searched libcuda.so,") && err.contains("libcuda.so.1"), "{err}");
        assert!(driver_info().unwrap_err().to_string().contains("libcuda"));
        assert!(self_test(0, 16).unwrap_err().to_string().contains("libcuda"));
    }

    #[test]
    fn a_missing_nccl_names_the_searched_names() {
        match check_nccl() {
            Ok(()) => println!("skipped: libnccl loads here under a name cudarc tries"),
            Err(e) => {
                let err = e.to_string();
                assert!(err.starts_with("libnccl (NCCL) could not be loaded: searched libnccl.so,"), "{err}");
                assert!(nccl_version().unwrap_err().to_string().contains("libnccl"));
            }
        }
    }

    #[test]
    fn loadable_path_finds_libc_and_not_a_missing_library() {
        let libc_path = loadable_path("libc.so.6", "printf").unwrap();
        assert!(libc_path.contains("libc"), "{libc_path}");
        assert_eq!(loadable_path("libflightdeck-nonexistent.so", "x"), None);
    }
}
