//! CUDA failures and the GPU's own: out of memory, `CUDA error`, cuBLAS/cuDNN errors, device asserts, Xid lines.
//!
//! PyTorch's caching allocator out-of-memory, `CUDA error: …`,
//! cuBLAS/cuDNN status errors, device-side asserts, and the kernel driver's `NVRM: Xid` lines.
//!
//! - Out of memory (`c10/cuda/CUDACachingAllocator.cpp`), `cuda_oom`, sizes in MiB:
//!   1.0-1.4 `CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity;
//!   14.56 GiB already allocated; 4.75 MiB free; 14.71 GiB cached)`; 1.5-2.0 `… free; 14.71 GiB
//!   reserved in total by PyTorch)` (`; 15.00 GiB allowed` with a memory fraction); 2.1 `Tried to
//!   allocate 20.00 MiB. GPU 0 has a total capacty of 79.15 GiB of which 6.69 MiB is free. Process
//!   1234 has 79.14 GiB memory in use. Of the allocated memory 78.55 GiB is allocated by PyTorch, and
//!   102.51 MiB is reserved by PyTorch but unallocated.`; 2.2+ `capacity`, `Including non-PyTorch
//!   memory, this process has 79.14 GiB memory in use.` Also `CUDA error: out of memory` and the
//!   CPU allocator's `DefaultCPUAllocator: can't allocate memory: you tried to allocate N bytes`
//!   (`cpu_oom`).
//! - `cuda_error` with `reason`: `CUDA error: an illegal memory access was encountered` (1.5+,
//!   `c10/cuda/CUDAException.h`), `CUDA driver error: …`, `cuda runtime error (59) : device-side
//!   assert triggered at FILE:LINE` (0.4-1.4, also `code`, `file`, `src_line`), `THCudaCheck FAIL
//!   file=F line=L error=N : REASON`, `CUBLAS_STATUS_EXECUTION_FAILED when calling
//!   \`cublasSgemm(…)\`` (`reason` the status, `func`), `cuDNN error: CUDNN_STATUS_INTERNAL_ERROR`.
//! - `device_assert`: `FILE.cu:92: FUNC: block: [0,0,0], thread: [5,0,0] Assertion \`t >= 0 &&
//!   t < n_classes\` failed.` (`file`, `src_line`, `func`, `block`, `thread`, `reason` the assertion).
//! - `xid`: `NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.`
//!   (`pci`, `xid`, `pid`, `process`, `reason`; drivers before 450 print no pid and name).
use super::{after, between, event, lead_int, Bytes, Put};
use crate::adapters::value::size_mib;
use crate::adapters::value::Scan;
use crate::adapters::Record;

pub(super) fn parse(line: u64, t: &str, b: &Bytes) -> Option<Record> {
    if b.all(b"CU") {
        if let Some(r) = oom(line, t).or_else(|| error(line, t)) {
            return Some(r);
        }
    }
    if b.all(b"E(") && t.has("cuda runtime error (") || b.all(b"THC") && t.has("THCudaCheck FAIL") {
        if let Some(r) = old_error(line, t) {
            return Some(r);
        }
    }
    if b.all(b"X(") && t.has("Xid (") {
        if let Some(r) = xid(line, t) {
            return Some(r);
        }
    }
    if b.all(b"A`") && t.has("Assertion `") {
        if let Some(r) = device_assert(line, t) {
            return Some(r);
        }
    }
    if b.all(b"DA:") && t.has("memory: you tried to allocate ") {
        let (bytes, _) = after(t, "memory: you tried to allocate ").and_then(lead_int)?;
        let mut r = event(line, "cpu_oom");
        r.metric("tried_mib", bytes as f64 / (1024.0 * 1024.0));
        return Some(r);
    }
    None
}

fn oom(line: u64, t: &str) -> Option<Record> {
    let rest = after(t, "CUDA out of memory.")?;
    let mut r = event(line, "cuda_oom");
    let mut sizes: Vec<(&str, f64)> = Vec::new();
    if let Some(tried) = after(rest, "Tried to allocate ").and_then(size_mib) {
        sizes.push(("tried_mib", tried));
    }
    if let Some(inner) = between(rest, " (GPU ", ")") {
        // 1.0-2.0: `(GPU 0; 15.78 GiB total capacity; 14.56 GiB already allocated; 4.75 MiB free;
        // 15.00 GiB allowed; 14.71 GiB reserved in total by PyTorch)` (`cached` to 1.4).
        let mut parts = inner.split("; ");
        r.int_of("gpu", parts.next().unwrap_or(""));
        for part in parts {
            let Some(size) = size_mib(part) else { continue };
            let name = if part.ends_with(" total capacity") {
                "total_mib"
            } else if part.ends_with(" already allocated") {
                "allocated_mib"
            } else if part.ends_with(" free") {
                "free_mib"
            } else if part.ends_with(" allowed") {
                "allowed_mib"
            } else if part.ends_with(" reserved in total by PyTorch") {
                "reserved_mib"
            } else if part.ends_with(" cached") {
                "cached_mib"
            } else {
                continue;
            };
            sizes.push((name, size));
        }
    } else {
        // 2.1+: sentences. `GPU 0 has a total capacity of X of which Y is free.`, `Including
        // non-PyTorch memory, this process has X memory in use.`, `Of the allocated memory X is
        // allocated by PyTorch, and Y is reserved by PyTorch but unallocated.`
        for sentence in rest.split(". ") {
            let sentence = sentence.trim_start();
            if let Some(gpu) = sentence.strip_prefix("GPU ") {
                if let Some((g, _)) = lead_int(gpu) {
                    r.int("gpu", g);
                }
                let total = after(gpu, "has a total capacity of ").or_else(|| after(gpu, "has a total capacty of "));
                if let Some(total) = total.and_then(size_mib) {
                    sizes.push(("total_mib", total));
                }
                if let Some(free) = after(gpu, " of which ").and_then(size_mib) {
                    sizes.push(("free_mib", free));
                }
            } else if let Some(used) = after(sentence, "this process has ").and_then(size_mib) {
                sizes.push(("in_use_mib", used));
            } else if let Some(alloc) = sentence.strip_prefix("Of the allocated memory ") {
                if let Some(a) = size_mib(alloc) {
                    sizes.push(("allocated_mib", a));
                }
                if let Some(u) = after(alloc, "PyTorch, and ").and_then(size_mib) {
                    sizes.push(("reserved_unallocated_mib", u));
                }
            }
        }
    }
    // The order the existing records use: tried, total, allocated, free, allowed, reserved, cached, in use, reserved-unallocated.
    const ORDER: [&str; 9] = [
        "tried_mib",
        "total_mib",
        "allocated_mib",
        "free_mib",
        "allowed_mib",
        "reserved_mib",
        "cached_mib",
        "in_use_mib",
        "reserved_unallocated_mib",
    ];
    for name in ORDER {
        if let Some((_, v)) = sizes.iter().find(|(n, _)| *n == name) {
            r.metric(name, *v);
        }
    }
    Some(r)
}

fn error(line: u64, t: &str) -> Option<Record> {
    if let Some(reason) = after(t, "CUDA error: ") {
        let reason = reason.trim();
        if reason.starts_with("out of memory") {
            let mut r = event(line, "cuda_oom");
            r.text("reason", "out of memory");
            return Some(r);
        }
        return Some(status(event(line, "cuda_error"), reason));
    }
    if let Some(reason) = after(t, "CUDA driver error: ") {
        let mut r = event(line, "cuda_error");
        r.text("reason", reason.trim());
        return Some(r);
    }
    if let Some(rest) = after(t, "cuDNN error: ") {
        let mut r = event(line, "cuda_error");
        let reason = rest.split(|c: char| c == '.' || c.is_whitespace()).next().unwrap_or(rest);
        r.text("reason", reason);
        return Some(r);
    }
    if let Some(i) = t.at("CUBLAS_STATUS_") {
        if t[i..].has(" when calling `") {
            return Some(status(event(line, "cuda_error"), &t[i..]));
        }
    }
    None
}

/// 0.4-1.4's `cuda runtime error (N) : …` and `THCudaCheck FAIL …`.
fn old_error(line: u64, t: &str) -> Option<Record> {
    if let Some(rest) = after(t, "cuda runtime error (") {
        // `cuda runtime error (59) : device-side assert triggered at /pytorch/…/THCTensorCopy.cu:204`
        let (code, rest) = lead_int(rest)?;
        let rest = rest.strip_prefix(") : ")?;
        let mut r = event(line, "cuda_error");
        r.int("code", code);
        match rest.rsplit_once(" at ") {
            Some((reason, place)) => {
                r.text("reason", reason.trim());
                place_of(&mut r, place);
            }
            None => r.text("reason", rest.trim()),
        }
        return Some(r);
    }
    if let Some(rest) = after(t, "THCudaCheck FAIL file=") {
        // `THCudaCheck FAIL file=/pytorch/aten/src/THC/THCGeneral.cpp line=383 error=710 : device-side assert triggered`
        let (file, rest) = rest.cut(" line=")?;
        let (src, rest) = lead_int(rest)?;
        let mut r = event(line, "cuda_error");
        r.text("file", file);
        r.int("src_line", src);
        if let Some((code, rest)) = rest.strip_prefix(" error=").and_then(lead_int) {
            r.int("code", code);
            r.text("reason", rest.trim_start_matches(" : ").trim());
        }
        return Some(r);
    }
    None
}

/// `CUBLAS_STATUS_EXECUTION_FAILED when calling \`cublasSgemm( handle, …)\`` → the status and the
/// function; any other reason as printed.
fn status(mut r: Record, reason: &str) -> Record {
    if reason.starts_with("CUBLAS_STATUS_") || reason.starts_with("CUDNN_STATUS_") {
        let (status, rest) = reason.split_once(' ').unwrap_or((reason, ""));
        r.text("reason", status.trim_end_matches('.'));
        if let Some(func) = after(rest, "when calling `") {
            let func = func.split(['(', '`']).next().unwrap_or("");
            r.text("func", func.trim());
        }
    } else {
        r.text("reason", reason);
    }
    r
}

/// `/pytorch/aten/src/THC/generic/THCTensorMath.cu:26`
fn place_of(r: &mut Record, place: &str) {
    if let Some((file, num)) = place.trim().rsplit_once(':') {
        if let Some(n) = super::whole(num) {
            r.text("file", file);
            r.int("src_line", n);
        }
    }
}

fn xid(line: u64, t: &str) -> Option<Record> {
    let rest = after(t, "NVRM: Xid (")?;
    let (pci, rest) = rest.cut("): ")?;
    let (code, rest) = lead_int(rest)?;
    let mut r = event(line, "xid");
    r.text("pci", pci.strip_prefix("PCI:").unwrap_or(pci));
    r.int("xid", code);
    let mut rest = rest.strip_prefix(", ").unwrap_or(rest).trim_start();
    loop {
        if let Some(v) = rest.strip_prefix("pid=") {
            let (pid, tail) = v.cut(", ").unwrap_or((v, ""));
            r.int_of("pid", pid);
            rest = tail;
        } else if let Some(v) = rest.strip_prefix("name=") {
            let (name, tail) = v.cut(", ").unwrap_or((v, ""));
            if !name.starts_with('<') {
                r.text("process", name);
            }
            rest = tail;
        } else {
            break;
        }
    }
    r.text("reason", rest.trim());
    Some(r)
}

fn device_assert(line: u64, t: &str) -> Option<Record> {
    let i = t.at(": block: [")?;
    let head = t[..i].trim_start();
    // `FILE:LINE: FUNC` — the first `:digits: ` ends the file.
    let mut split = None;
    for (c, _) in head.match_indices(':') {
        if let Some((n, tail)) = lead_int(&head[c + 1..]) {
            if n >= 0 && tail.starts_with(": ") {
                split = Some((c, n, tail));
                break;
            }
        }
    }
    let (c, src, tail) = split?;
    let rest = &t[i + 2..];
    let mut r = event(line, "device_assert");
    r.text("file", &head[..c]);
    r.int("src_line", src);
    r.text("func", tail[2..].trim());
    if let Some(b) = between(rest, "block: [", "]") {
        r.text("block", b);
    }
    if let Some(th) = between(rest, "thread: [", "]") {
        r.text("thread", th);
    }
    r.text("reason", between(rest, "Assertion `", "` failed")?);
    Some(r)
}
