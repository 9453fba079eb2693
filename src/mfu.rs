//! Model FLOPs utilisation: the model's training FLOP/s over the GPU's peak (pure arithmetic,
//! for the worker's summary and the cockpit's MFU display).
//!
//! FLOPs per token follow PaLM (appendix B) as nanoGPT does: 6·N for the matmuls of forward and
//! backward, plus 12·L·d·T for attention's score and value products (full, not halved for the
//! causal mask), where N excludes the position embeddings.
use crate::recipe::Model;

/// Parameters that take part in matmuls: all but the position embeddings. The embedding is tied
/// to the output head, so it counts once, as the head.
pub fn matmul_params(m: &Model) -> u64 {
    let (v, d, l) = (u64::from(m.vocab), u64::from(m.d_model), u64::from(m.n_layer));
    // Per block: 2 LayerNorms (4d), qkv (3d² + 3d), attention out (d² + d), MLP (8d² + 5d).
    let per_block = 12 * d * d + 13 * d;
    v * d + l * per_block + 2 * d
}

/// Every parameter, as the worker's `Gpt::num_params` counts them.
pub fn total_params(m: &Model) -> u64 {
    matmul_params(m) + u64::from(m.context) * u64::from(m.d_model)
}

/// Training FLOPs per token at sequence length `context`.
pub fn flops_per_token(m: &Model) -> f64 {
    let attention = 12.0 * f64::from(m.n_layer) * f64::from(m.d_model) * f64::from(m.context);
    6.0 * matmul_params(m) as f64 + attention
}

/// Dense bf16 tensor-core peaks (TFLOP/s, without sparsity) from NVIDIA's data sheets, by the
/// name CUDA or NVML reports. More specific names come first ("H100 PCIe" before "H100").
const BF16_PEAKS_TFLOPS: &[(&str, f64)] = &[
    ("GH200", 989.4),
    ("H200 NVL", 835.0),
    ("H200", 989.4),
    ("H100 NVL", 835.0),
    ("H100 PCIe", 756.0),
    ("H100", 989.4),
    ("H800", 989.4),
    ("B200", 2250.0),
    ("A100", 312.0),
    ("A800", 312.0),
    ("L40S", 362.05),
    ("L4", 121.0),
];

/// The GPU's known dense bf16 peak, by name; None for a GPU not in the table.
pub fn known_bf16_peak_tflops(gpu_name: &str) -> Option<f64> {
    BF16_PEAKS_TFLOPS.iter().find(|(key, _)| gpu_name.contains(key)).map(|(_, peak)| *peak)
}

/// `FLIGHTDECK_PEAK_TFLOPS`, read once: the peak a user sets for a GPU not in the table (or a
/// dtype other than bf16). None when unset or not a positive number.
pub fn configured_peak_tflops() -> Option<f64> {
    static PEAK: std::sync::OnceLock<Option<f64>> = std::sync::OnceLock::new();
    *PEAK.get_or_init(|| std::env::var("FLIGHTDECK_PEAK_TFLOPS").ok()?.trim().parse().ok().filter(|p: &f64| *p > 0.0))
}

/// The peak to divide by: the configured one when given, else the GPU's by name.
pub fn peak_tflops(configured: Option<f64>, gpu_name: &str) -> Option<f64> {
    configured.filter(|p| *p > 0.0).or_else(|| known_bf16_peak_tflops(gpu_name))
}

/// MFU as a fraction (0.42 = 42 %) for `tokens_per_s` on one GPU of `peak_tflops`.
pub fn mfu(m: &Model, tokens_per_s: f64, peak_tflops: f64) -> f64 {
    flops_per_token(m) * tokens_per_s / (peak_tflops * 1e12)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpt2_small() -> Model {
        Model { n_layer: 12, n_head: 12, d_model: 768, context: 1024, vocab: 50304 }
    }

    #[test]
    fn gpt2_small_counts_match_nanogpt() {
        let m = gpt2_small();
        // nanoGPT's GPT-2 small with vocab 50304: 124.47M parameters (123.69M without wpe).
        assert_eq!(total_params(&m), 124_475_904);
        assert_eq!(matmul_params(&m), 124_475_904 - 1024 * 768);
        // 6N + 12·L·d·T = 6·123,689,472 + 12·12·768·1024
        assert_eq!(flops_per_token(&m), 6.0 * 123_689_472.0 + 113_246_208.0);
    }

    #[test]
    fn mfu_is_model_flops_over_peak() {
        let m = gpt2_small();
        let per_token = flops_per_token(&m);
        // The tokens/s that would use exactly 40 % of an H200's 989.4 TFLOP/s.
        let tps = 0.4 * 989.4e12 / per_token;
        let got = mfu(&m, tps, peak_tflops(None, "NVIDIA H200").unwrap());
        assert!((got - 0.4).abs() < 1e-12, "{got}");
        // A configured peak wins over the table; a zero one does not count.
        assert_eq!(peak_tflops(Some(500.0), "NVIDIA H200"), Some(500.0));
        assert_eq!(peak_tflops(Some(0.0), "NVIDIA H100 80GB HBM3"), Some(989.4));
    }

    #[test]
    fn peaks_by_name_prefer_the_specific_variant() {
        assert_eq!(known_bf16_peak_tflops("NVIDIA H100 PCIe"), Some(756.0));
        assert_eq!(known_bf16_peak_tflops("NVIDIA H100 NVL"), Some(835.0));
        assert_eq!(known_bf16_peak_tflops("NVIDIA GH200 480GB"), Some(989.4));
        assert_eq!(known_bf16_peak_tflops("NVIDIA L40S"), Some(362.05));
        assert_eq!(known_bf16_peak_tflops("NVIDIA L4"), Some(121.0));
        assert_eq!(known_bf16_peak_tflops("Quadro P1000"), None);
        assert_eq!(peak_tflops(None, "cpu"), None);
    }
}
