//! Tensors ↔ host buffers: the snapshot is a memcpy per tensor; the restore loads the same bytes
//! back, so a resumed model is bit for bit the saved one.
use crate::store::checkpoints::disk::TensorEntry;
use crate::worker::model::Param;
use tch::{Kind, TchError, Tensor};

/// Every tensor's values, concatenated in order into `out` (each must be contiguous fp32). `out`
/// is reused when it already has the size: its pages are touched, so the copy is a memcpy.
pub fn copy_all<'a>(
    tensors: impl Iterator<Item = &'a Tensor>,
    total: usize,
    mut out: Vec<f32>,
) -> Result<Vec<f32>, TchError> {
    out.resize(total, 0.0);
    let mut off = 0;
    for t in tensors {
        let n = t.numel();
        let end = off + n;
        if end > total {
            return Err(TchError::Shape(format!("tensors hold more than the {total} elements counted")));
        }
        t.f_copy_data(&mut out[off..end], n)?;
        off = end;
    }
    Ok(out)
}

/// The index of `model.bin`: each parameter's name, shape and byte offset.
pub fn index(params: &[Param]) -> Vec<TensorEntry> {
    let mut offset_bytes = 0u64;
    params
        .iter()
        .map(|p| {
            let numel = p.tensor.numel() as u64;
            let e = TensorEntry { name: p.name.clone(), shape: p.tensor.size(), offset_bytes, numel };
            offset_bytes += numel * 4;
            e
        })
        .collect()
}

/// Checks that the saved index describes exactly this model: same names and shapes, in order.
pub fn check_index(saved: &[TensorEntry], params: &[Param]) -> Result<(), String> {
    if saved.len() != params.len() {
        return Err(format!("it holds {} tensors, this model has {}", saved.len(), params.len()));
    }
    for (e, p) in saved.iter().zip(params) {
        if e.name != p.name || e.shape != p.tensor.size() {
            return Err(format!(
                "tensor {} has shape {:?}, this model's {} has {:?} (was a model.* key changed?)",
                e.name,
                e.shape,
                p.name,
                p.tensor.size()
            ));
        }
    }
    Ok(())
}

/// Overwrites `dst` with the fp32 values at `entry`'s place in `bytes` (shifted by `base`).
pub fn load_into(dst: &mut Tensor, bytes: &[u8], base: u64, entry: &TensorEntry) -> Result<(), String> {
    let start = (base + entry.offset_bytes) as usize;
    let end = start + entry.numel as usize * 4;
    let Some(slice) = bytes.get(start..end) else {
        return Err(format!("tensor {} lies past the end of the file ({} bytes)", entry.name, bytes.len()));
    };
    let _no_grad = tch::no_grad_guard();
    let src = Tensor::f_from_data_size(slice, &entry.shape, Kind::Float).map_err(|e| e.to_string())?;
    dst.f_copy_(&src).map_err(|e| e.to_string())
}
