//! placeholder
pub fn selftest() -> f64 {
    let t = tch::Tensor::from_slice(&[1.0f32, 2.0]);
    t.sum(tch::Kind::Float).double_value(&[])
}
